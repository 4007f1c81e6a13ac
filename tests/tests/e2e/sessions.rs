//! Consumer sessions end to end (`docs/design/sessions.md`): a worker that
//! dies holding claims under a 60 s lease has them claimable again within
//! its session's timeout — a SIGKILLed `spool recv`, a `Consumer` whose
//! runtime is dropped, a session whose heartbeats stop on a live
//! connection — a clean close releases at once, a rejoin fences the older
//! session, and without a session the lease holds as before.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use spool_client::spool_wire::proto::Offset;
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClaimOptions, Client, Consumer, ConsumerConfig, Delivery, Message};
use spool_client::{Producer, ProducerConfig};
use spool_tests::{test_queue_config, Spoold};

use crate::common::metric_sum;

/// The lease every claim here asks for: far above any session timeout.
const LEASE_MS: u32 = 60_000;

async fn queue_with(broker: &Spoold, queue: &str, messages: usize, max_deliveries: u32) -> Client {
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(queue, test_queue_config(2, 5_000, max_deliveries)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for index in 0..messages {
        producer.send(queue, Message::new(format!("job-{index}"))).await.unwrap();
    }
    client
}

fn options(credits: u32, wait_ms: u32) -> ClaimOptions {
    ClaimOptions::new(credits).lease_ms(LEASE_MS).wait_ms(wait_ms)
}

/// Claims from a fresh client until `want` deliveries came or `within`
/// passed; returns them and how long it took.
async fn claim_back(
    broker: &Spoold,
    queue: &str,
    want: usize,
    within: Duration,
) -> (Vec<Delivery>, Duration) {
    let client = broker.client().await;
    let started = spool_tests::now();
    let mut got = Vec::new();
    while got.len() < want && started.elapsed() < within {
        let left = within.saturating_sub(started.elapsed()).as_millis().min(1_000) as u32;
        let more = (want - got.len()) as u32;
        got.extend(client.claim_any(queue, &options(more, left.max(1))).await.unwrap());
    }
    (got, started.elapsed())
}

/// `spool recv` holding `count` claims for 10 min, in a session of
/// `session_ms` when given; returns once it said it holds them.
fn holding_recv(broker: &Spoold, queue: &str, count: usize, session_ms: Option<u32>) -> Child {
    let mut command = Command::new(spool_tests::spool_bin());
    command.args(["--addr", &broker.addr(), "recv", queue, "-n", &count.to_string()]);
    command.args(["--lease-ms", &LEASE_MS.to_string(), "--wait-ms", "5000", "--hold-ms", "600000"]);
    if let Some(ms) = session_ms {
        command.args(["--session-timeout-ms", &ms.to_string()]);
    }
    let mut child =
        command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn spool recv");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "spool recv ended before holding");
        if line.starts_with("holding ") {
            assert_eq!(line.trim(), format!("holding {count} claims for 600000 ms"));
            break;
        }
    }
    // Keep the pipe drained so the child never blocks on it.
    std::thread::spawn(move || for _ in stderr.lines() {});
    child
}

// Goal: the case: a SIGKILLed worker with a 60 s lease and a 2 s
// session has its claims claimable again within the session timeout (here
// at once: the kernel closes its sockets and each shard sees its
// connection end), counted as an attempt, the session end counted in the
// metrics. Method: `spool recv --session-timeout-ms 2000 --hold-ms` holds
// 4 claims over 2 shards; nothing is claimable; SIGKILL; claim them back
// with another client and time it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_claims_return_within_the_session_timeout() {
    let broker = Spoold::start(2);
    let client = queue_with(&broker, "sess-kill", 4, 10).await;
    let mut worker = holding_recv(&broker, "sess-kill", 4, Some(2_000));
    let early = client.claim_any("sess-kill", &options(4, 0)).await.unwrap();
    assert!(early.is_empty(), "held claims are not claimable");
    assert!(metric_sum(&broker, "spool_session_claims_tracked") >= 4.0);

    worker.kill().unwrap();
    worker.wait().unwrap();
    let (back, took) = claim_back(&broker, "sess-kill", 4, Duration::from_secs(10)).await;
    assert_eq!(back.len(), 4, "every held claim came back");
    assert!(took < Duration::from_millis(2_000 + 1_000), "back after {took:?}, lease is 60 s");
    assert!(back.iter().all(|delivery| delivery.attempt() == 2), "the dead claim counted");
    assert_eq!(metric_sum(&broker, "spool_session_claims_released_total"), 4.0);
    assert!(metric_sum(&broker, "spool_sessions_ended_total") >= 1.0);
    assert_eq!(metric_sum(&broker, "spool_sessions_open"), 0.0);
}

// Goal: without a session the lease alone holds, as before sessions: a
// SIGKILLed worker's claim is not claimable for (at least) 3 s of its
// 60 s lease. Method: the same worker without --session-timeout-ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_the_lease_holds() {
    let broker = Spoold::start(2);
    queue_with(&broker, "sess-none", 1, 10).await;
    let mut worker = holding_recv(&broker, "sess-none", 1, None);
    worker.kill().unwrap();
    worker.wait().unwrap();
    // Time itself is under test: the claim must stay held this long.
    let (back, _) = claim_back(&broker, "sess-none", 1, Duration::from_secs(3)).await;
    assert!(back.is_empty(), "a lease-only claim outlives its worker");
    assert_eq!(metric_sum(&broker, "spool_session_claims_released_total"), 0.0);
}

// Goal: a live connection whose heartbeats stop loses its session at the
// timeout (the shard's sweep), its claims come back with the session
// reason, and its late ack is refused STALE_TOKEN; its heartbeat then
// hears SESSION_NOT_FOUND. Method: open a 1 s session, claim, do not
// heartbeat, claim back from another client, ack the old tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_heartbeats_times_out() {
    let broker = Spoold::start(1);
    let client = queue_with(&broker, "sess-quiet", 2, 10).await;
    let via = client.claim_targets("sess-quiet").await.unwrap()[0];
    let session = client.open_session("sess-quiet", via, None, "quiet", 1_000).await.unwrap();
    let held = client.claim_any("sess-quiet", &options(2, 2_000)).await.unwrap();
    assert_eq!(held.len(), 2);
    let (back, took) = claim_back(&broker, "sess-quiet", 2, Duration::from_secs(10)).await;
    assert_eq!(back.len(), 2);
    assert!(took < Duration::from_millis(1_000 + 1_000), "back after {took:?}");
    for delivery in &held {
        let late = client.ack("sess-quiet", delivery.partition(), &[delivery.token()]).await;
        let late = late.unwrap_err();
        assert_eq!(late.refused_codes(), vec![ErrorCode::StaleToken], "{late}");
    }
    let gone = session.heartbeat().await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::SessionNotFound), "{gone}");
    let timeouts = {
        let answer = tokio::task::block_in_place(|| {
            spool_tests::admin::http_get(&broker.admin_addr(), "/metrics")
        });
        answer.body.lines().any(|line| {
            line.starts_with("spool_sessions_ended_total{")
                && line.contains("reason=\"timeout\"")
                && !line.ends_with(" 0")
        })
    };
    assert!(timeouts, "the end is counted as a timeout");
}

// Goal: a clean close releases at once, and the release counts like a
// lease expiry: at max_deliveries 1 the message is dead-lettered, its last
// reason "session ended". Method: open, claim, close; the dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_releases_at_once_with_its_reason() {
    let broker = Spoold::start(1);
    let client = queue_with(&broker, "sess-close", 1, 1).await;
    let via = client.claim_targets("sess-close").await.unwrap()[0];
    let session = client.open_session("sess-close", via, None, "closer", 30_000).await.unwrap();
    let held = client.claim_any("sess-close", &options(1, 2_000)).await.unwrap();
    assert_eq!(held.len(), 1);
    let partition = held[0].partition();
    session.close().await.unwrap();
    let admin = Admin::new(client.clone());
    let mut dead = Vec::new();
    for _ in 0..100 {
        dead = admin.dead_letters("sess-close", partition, Offset(0), 10).await.unwrap();
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dead.len(), 1, "released at once: dead-lettered at its delivery limit");
    assert_eq!(dead[0].attempts, 1);
    assert!(dead[0].last_reason.contains("session ended"), "{}", dead[0].last_reason);
}

// Goal: a member that rejoins on another connection gets a higher epoch
// and fences the older session: its claims are released at once, its
// heartbeat hears SESSION_FENCED, its late ack STALE_TOKEN. Method: two
// clients open sessions under one member id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_fences_the_older_session() {
    let broker = Spoold::start(1);
    let old = queue_with(&broker, "sess-rejoin", 1, 10).await;
    let via = old.claim_targets("sess-rejoin").await.unwrap()[0];
    let first = old.open_session("sess-rejoin", via, None, "m", 30_000).await.unwrap();
    let held = old.claim_any("sess-rejoin", &options(1, 2_000)).await.unwrap();
    assert_eq!(held.len(), 1);
    let new = broker.client().await;
    let second = new.open_session("sess-rejoin", via, None, "m", 30_000).await.unwrap();
    assert!(second.epoch() > first.epoch());
    let back = new.claim_any("sess-rejoin", &options(1, 2_000)).await.unwrap();
    assert_eq!(back.len(), 1, "the older session's claim was released");
    assert_eq!(back[0].attempt(), 2);
    let fenced = first.heartbeat().await.unwrap_err();
    assert_eq!(fenced.code(), Some(ErrorCode::SessionFenced), "{fenced}");
    let late = old.ack("sess-rejoin", held[0].partition(), &[held[0].token()]).await.unwrap_err();
    assert_eq!(late.refused_codes(), vec![ErrorCode::StaleToken], "{late}");
    new.ack("sess-rejoin", back[0].partition(), &[back[0].token()]).await.unwrap();
}

// Goal: the `Consumer` opens a session by default: when its process's
// runtime goes (its sockets close, as in a crash), the deliveries its
// stuck handlers held come back at once, not after the 60 s lease.
// Method: a Consumer on its own runtime whose handler never returns;
// drop that runtime once it holds the messages; claim them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_consumer_releases_through_its_session() {
    let broker = Spoold::start(2);
    let client = queue_with(&broker, "sess-consumer", 3, 10).await;
    let addr = broker.addr();
    let worker = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let consumer = runtime.block_on(async move {
            let client = Client::connect(&addr).await.unwrap();
            let mut config = ConsumerConfig::new("sess-consumer", 3);
            config.lease_ms = LEASE_MS;
            config.wait_ms = 500;
            let held_tx = std::sync::Mutex::new(held_tx);
            let consumer = Consumer::start(client, config, move |_delivery| {
                let _ = held_tx.lock().unwrap().send(());
                std::future::pending::<Result<(), String>>()
            })
            .unwrap();
            for _ in 0..3 {
                held_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            }
            consumer
        });
        // Dropping the runtime drops its tasks and closes its sockets.
        drop(runtime);
        drop(consumer);
    });
    worker.await.unwrap();
    let (back, took) = claim_back(&broker, "sess-consumer", 3, Duration::from_secs(10)).await;
    assert_eq!(back.len(), 3);
    assert!(took < Duration::from_secs(5), "back after {took:?}, lease is 60 s");
    assert!(back.iter().all(|delivery| delivery.attempt() == 2));
    drop(client);
}
