//! Ping (api key 8) and the client's liveness probe (`client/src/liveness.rs`)
//! against real `spoold` processes:
//!
//! - the broker answers a Ping at once while a long-polling Claim waits on
//!   the same connection (responses complete in any order);
//! - with authentication on, a Ping is a request like any other: first on
//!   a connection it is refused `UNAUTHENTICATED` and the connection
//!   closed; after the handshake it is answered;
//! - a three-node cluster whose partition leader is SIGSTOPped (its
//!   sockets open, nothing answered) while a producer sends to it: the
//!   producer, on the default 30 s request timeout, has a send submitted
//!   after the stop acknowledged by the new leader within
//!   [`RESUME_BOUND`], and nothing acknowledged is lost.
//!
//! Every wait is bounded; the tests run the binaries `scripts/test.sh`
//! built (`SPOOL_E2E_SPOOLD`), or build `spoold` themselves.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool_client::limits::{LIVENESS_IDLE, LIVENESS_TIMEOUT, REQUEST_TIMEOUT_DEFAULT};
use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{
    decode_frame, AuthenticateRequest, ClaimRequest, CorrelationId, PartitionId, PingRequest,
    Reply, Request, Response, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Client, ClientConfig, ConnectionConfig, Message, Producer};
use spool_tests::auth::{write_auth_file, Principal, WORKER, WORKER_SECRET};
use spool_tests::cluster::{
    assert_all_sent, bounded, check_delivered, drain, key_for, millis_since, producer_on,
    start_with_queue, wait_for_queue, ClusterOptions,
};
use spool_tests::fault::message_id;
use spool_tests::{now, test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "jobs";
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How soon a Ping must be answered beside a waiting Claim: far below the
/// Claim's wait.
const PING_BOUND: Duration = Duration::from_secs(2);
/// The Claim's long-poll wait.
const CLAIM_WAIT_MS: u32 = 20_000;

/// How soon after a leader's SIGSTOP a send submitted after it must be
/// acknowledged: the probe's 2 + 5 s, the retry's backoff and metadata
/// refresh, with room for a loaded 2-core machine; half the request
/// timeout that bounded it before the probe.
const RESUME_BOUND: Duration = Duration::from_secs(15);
const LEAD_TIMEOUT: Duration = Duration::from_secs(30);
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(30);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);
/// Sends acknowledged before the stop: the producer is in full flow.
const WARM_UP_ACKS: usize = 40;
/// Producer tasks, each sending one message at a time.
const SENDERS: u32 = 4;

fn frame(request: &Request<'_>, correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(CorrelationId(correlation), &mut out).unwrap();
    out
}

/// Reads one response: its correlation id, api key and error code.
fn read_reply(stream: &mut TcpStream) -> (u64, Option<Response<'static>>, ErrorCode) {
    let aligned = spool_tests::read_frame_aligned(stream).unwrap();
    let decoded = decode_frame(&aligned).unwrap();
    let reply = Response::decode(&decoded).unwrap();
    match reply.reply {
        Reply::Ok(Response::Ping(pong)) => {
            (reply.correlation_id.0, Some(Response::Ping(pong)), ErrorCode::None)
        }
        Reply::Ok(other) => panic!("unexpected answer {other:?}"),
        Reply::Err(error) => (reply.correlation_id.0, None, error.code),
    }
}

// Goal: the broker answers a Ping at once while a long-polling Claim of
// the same connection waits (the reason a waiting Claim never trips the
// client's probe). Method: a raw connection sends a Claim waiting 20 s on
// an empty queue and a Ping behind it in one write; the first answer must
// be the Ping's, within PING_BOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_is_answered_at_once_beside_a_waiting_claim() {
    let broker = Spoold::start(1);
    let admin = Admin::new(broker.client().await);
    admin.create_queue(QUEUE, test_queue_config(1, 10_000, 10)).await.unwrap();

    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let claim = Request::Claim(ClaimRequest {
        queue: QUEUE,
        partition: PartitionId(0),
        worker: WorkerId(7),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: 10_000,
        wait_ms: CLAIM_WAIT_MS,
        subscription: "",
    });
    let mut pipelined = frame(&claim, 1);
    pipelined.extend(frame(&Request::Ping(PingRequest {}), 2));
    let sent = now();
    stream.write_all(&pipelined).unwrap();
    let (id, response, code) = read_reply(&mut stream);
    let took = sent.elapsed();
    assert_eq!((id, code), (2, ErrorCode::None), "the Ping must answer first");
    assert!(matches!(response, Some(Response::Ping(_))));
    assert!(took < PING_BOUND, "the Ping took {took:?} beside a waiting Claim");
    eprintln!("Ping answered in {} µs beside a waiting Claim", took.as_micros());
}

// Goal: with authentication on, a Ping gets no exemption: as the first
// request it is refused UNAUTHENTICATED and the connection closed, like
// any other; pipelined behind an Authenticate it waits for the handshake
// and is answered, and the connection stays open. Method: raw frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_follows_the_authentication_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    write_auth_file(&path, &[Principal::new(WORKER, WORKER_SECRET, &[QUEUE], &["enqueue"])]);
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);

    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream.write_all(&frame(&Request::Ping(PingRequest {}), 1)).unwrap();
    let (id, _, code) = read_reply(&mut stream);
    assert_eq!((id, code), (1, ErrorCode::Unauthenticated));
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).expect("the broker closes the connection");
    assert!(rest.is_empty(), "nothing after the refusal: {} bytes", rest.len());

    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let handshake =
        Request::Authenticate(AuthenticateRequest { principal: WORKER, secret: WORKER_SECRET });
    let mut pipelined = frame(&handshake, 1);
    pipelined.extend(frame(&Request::Ping(PingRequest {}), 2));
    stream.write_all(&pipelined).unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let aligned = spool_tests::read_frame_aligned(&mut stream).unwrap();
        let reply = Response::decode(&decode_frame(&aligned).unwrap()).unwrap();
        let kind = match reply.reply {
            Reply::Ok(Response::Authenticate(_)) => "authenticated",
            Reply::Ok(Response::Ping(_)) => "ping",
            other => panic!("unexpected answer {other:?}"),
        };
        answers.push((reply.correlation_id.0, kind));
    }
    answers.sort_unstable();
    assert_eq!(answers, [(1, "authenticated"), (2, "ping")]);
    stream.write_all(&frame(&Request::Ping(PingRequest {}), 3)).unwrap();
    let (id, response, code) = read_reply(&mut stream);
    assert_eq!((id, code), (3, ErrorCode::None));
    assert!(matches!(response, Some(Response::Ping(_))), "the connection stays open");
}

/// One send of the producer tasks: its id, when it was submitted, and
/// when it was acknowledged (`None`: it failed, with this text).
struct Sent {
    id: MessageId,
    submitted: Instant,
    acked: Result<Instant, String>,
}

/// A client on `addr` with the defaults that matter here: the 30 s
/// request timeout and the liveness probe on (a 3 s connect timeout, and
/// the bootstrap retried while the node comes up).
async fn default_client(addr: &str) -> Client {
    let config = ClientConfig {
        connection: ConnectionConfig {
            connect_timeout: Duration::from_secs(3),
            ..ConnectionConfig::default()
        },
    };
    assert_eq!(config.connection.request_timeout, REQUEST_TIMEOUT_DEFAULT);
    assert!(config.connection.liveness.is_some());
    let started = now();
    loop {
        match Client::connect_with(addr, config.clone()).await {
            Ok(client) => return client,
            Err(error) if started.elapsed() < LEAD_TIMEOUT => {
                eprintln!("connect {addr}: {error}; again");
                // A bounded poll: the node may still be joining.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("connect {addr}: {error}"),
        }
    }
}

/// Sends messages of `source` one at a time to partition 0 until `stop`,
/// recording each in `ledger`.
async fn send_until(
    producer: Producer,
    source: u32,
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Vec<Sent>>>,
) {
    let key = key_for(0, 1);
    let mut sequence = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let id = message_id(source, sequence);
        sequence += 1;
        let message = Message::new(format!("message {source}/{sequence}")).key(key.clone()).id(id);
        let submitted = now();
        let acked = match producer.send(QUEUE, message).await {
            Ok(_) => Ok(now()),
            Err(error) => Err(error.to_string()),
        };
        ledger.lock().unwrap().push(Sent { id, submitted, acked });
    }
}

/// The first acknowledgement of a send submitted after `after`, if any.
fn first_ack_after(ledger: &Mutex<Vec<Sent>>, after: Instant) -> Option<Instant> {
    let ledger = ledger.lock().unwrap();
    ledger
        .iter()
        .filter(|sent| sent.submitted > after)
        .filter_map(|sent| sent.acked.as_ref().ok().copied())
        .min()
}

// Goal: a hung leader (SIGSTOP: sockets open, nothing answered) costs a
// producer seconds, not its request timeout: a send submitted after the
// stop is acknowledged by the new leader within RESUME_BOUND (the probe:
// a Ping after 2 s of silence, the close 5 s later, then the producer's
// retry with the same ids through refreshed metadata), and nothing
// acknowledged is lost. Without the probe the sends held by the stopped
// node wait out the 30 s request timeout, and the senders with them.
// Method: three nodes, one partition; a client bootstrapped on a follower
// (default request timeout, liveness on); four tasks each sending one
// message at a time; after 40 acknowledgements the leader is paused; the
// first acknowledgement of a send submitted after the pause is timed; the
// senders stop, the node is resumed, and every acknowledged message must
// drain through the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_leader_costs_a_producer_seconds_not_its_request_timeout() {
    const PARTITIONS: u32 = 1;
    let (mut cluster, leaders) =
        start_with_queue(ClusterOptions::new(3, 1), QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let victim = leaders[0];
    let bootstrap = (0..3).find(|&index| index != victim).unwrap();
    let client = default_client(&cluster.node(bootstrap).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let producer = producer_on(client.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let ledger: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let senders: Vec<_> = (0..SENDERS)
        .map(|source| {
            let task = send_until(producer.clone(), source, Arc::clone(&stop), Arc::clone(&ledger));
            tokio::spawn(task)
        })
        .collect();
    let warm = now();
    while ledger.lock().unwrap().iter().filter(|sent| sent.acked.is_ok()).count() < WARM_UP_ACKS {
        assert!(warm.elapsed() < WARM_UP_TIMEOUT, "{WARM_UP_ACKS} sends not acknowledged in time");
        // A bounded poll of the senders' ledger.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    eprintln!("pausing node {} (leads partition 0)", victim + 1);
    tokio::task::block_in_place(|| cluster.pause(victim));
    let paused = now();
    let resumed_at = loop {
        if let Some(at) = first_ack_after(&ledger, paused) {
            break at;
        }
        assert!(
            paused.elapsed() < RESUME_BOUND,
            "no send submitted after the pause acknowledged within {RESUME_BOUND:?} \
             (the probe: idle {LIVENESS_IDLE:?}, timeout {LIVENESS_TIMEOUT:?})"
        );
        // A bounded poll of the senders' ledger.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = resumed_at.duration_since(paused);
    eprintln!(
        "first acknowledged enqueue submitted after the pause: {} ms after it \
         (request timeout {REQUEST_TIMEOUT_DEFAULT:?})",
        took.as_millis()
    );
    assert!(took < RESUME_BOUND, "sends resumed only after {took:?}");
    assert!(took >= LIVENESS_IDLE, "resumed before the probe could act: {took:?}");

    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        bounded("a sender's last send", RESUME_BOUND, sender).await.unwrap();
    }
    tokio::task::block_in_place(|| cluster.resume(victim));
    eprintln!("node {} resumed {} ms after its pause", victim + 1, millis_since(paused));
    producer.close().await;

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let failed: Vec<String> =
        ledger.iter().filter_map(|sent| sent.acked.as_ref().err().cloned()).collect();
    assert_all_sent("sends across the pause", &failed);
    let owed: HashSet<MessageId> =
        ledger.iter().filter(|sent| sent.acked.is_ok()).map(|sent| sent.id).collect();
    eprintln!("{} sends acknowledged, none failed", owed.len());
    let (delivered, _) = drain(&client, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
    check_delivered("a leader paused under a producer", &owed, &delivered);
}
