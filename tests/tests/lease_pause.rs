// Goal: a worker process frozen (SIGSTOP) across its lease expiry cannot
// act on the message when it wakes: its late extend and ack are
// STALE_TOKEN, the consumer that took over (generation + 1) acks
// successfully, and the two deliveries differ in (offset, generation) only
// by the generation. Method: the `lease_worker` binary claims with a 400 ms
// lease and prints the delivery; the test SIGSTOPs it at once, long-polls a
// claim from a second client (which gets the message when the lease runs
// out), SIGCONTs the worker, reads its late answers, then acks as the
// second consumer and checks the queue is empty.
//
// How it was shown able to fail: with the SIGSTOP/SIGCONT calls commented
// out, the worker extends and acks within its lease, the message never
// comes back, and the takeover assertion fails ("the message comes back
// after the worker's lease": 0 deliveries).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use spool_client::spool_wire::proto::PartitionId;
use spool_client::{Admin, Message, Producer, ProducerConfig};
use spool_tests::fault::{claim_options, message_id};
use spool_tests::{test_queue_config, Spoold};

const QUEUE: &str = "paused";
const LEASE_MS: u32 = 400;

fn signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own
    // unreaped child.
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(result, 0, "kill: {}", std::io::Error::last_os_error());
}

fn json_line(reader: &mut impl BufRead) -> serde_json::Value {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|error| panic!("worker line {line:?}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_worker_loses_its_lease_and_its_late_ack_is_stale() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, test_queue_config(1, 5_000, 10)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send(QUEUE, Message::new("job").id(message_id(4, 0))).await.unwrap();

    let mut worker = Command::new(env!("CARGO_BIN_EXE_lease_worker"))
        .args([&broker.addr(), QUEUE, "0", &LEASE_MS.to_string(), "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(worker.stdout.take().unwrap());
    let claimed = json_line(&mut stdout);
    signal(worker.id(), libc::SIGSTOP);
    assert_eq!(claimed["event"], "claimed");
    let worker_offset = claimed["offset"].as_u64().unwrap();
    let worker_generation = claimed["generation"].as_u64().unwrap();

    // The second consumer long-polls: the broker's lease timer hands the
    // message over while the worker is frozen.
    let taken =
        client.claim(QUEUE, PartitionId(0), &claim_options(0xb, 1, 5_000, 5_000)).await.unwrap();
    assert_eq!(taken.deliveries.len(), 1, "the message comes back after the worker's lease");
    let second = &taken.deliveries[0];
    assert_eq!(second.offset().0, worker_offset, "same message");
    assert_eq!(second.generation().0, worker_generation + 1, "a new claim generation");
    assert_eq!(second.message_id(), message_id(4, 0));

    signal(worker.id(), libc::SIGCONT);
    let late = json_line(&mut stdout);
    let status = tokio::task::spawn_blocking(move || worker.wait()).await.unwrap().unwrap();
    assert!(status.success(), "worker exit {status}");
    assert_eq!(late["event"], "late_calls");
    assert_eq!(late["extend"], "STALE_TOKEN", "late extend: {late}");
    assert_eq!(late["ack"], "STALE_TOKEN", "late ack: {late}");

    // The worker's refused calls changed nothing: the second consumer's ack
    // succeeds and the message is gone for good.
    client.ack(QUEUE, PartitionId(0), &[second.token()]).await.unwrap();
    let after =
        client.claim(QUEUE, PartitionId(0), &claim_options(0xc, 1, 5_000, 600)).await.unwrap();
    assert!(after.deliveries.is_empty(), "an acked message never comes back");
    let described = Admin::new(client.clone()).describe_queue(QUEUE).await.unwrap();
    let stats = &described.partitions[0];
    assert_eq!((stats.acked, stats.ready, stats.claimed), (1, 0, 0));
}
