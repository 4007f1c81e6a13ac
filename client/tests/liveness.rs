//! The connection's liveness probe against fake brokers on real loopback
//! sockets: a broker that answers nothing at all fails the requests on it
//! with `ConnectionClosed` within idle + timeout (far below the request
//! timeout) and gets exactly one Ping; a broker that answers Pings (or,
//! predating them, answers them `UNKNOWN_API`) keeps a connection whose
//! other request it holds for longer; an idle connection is never pinged;
//! `liveness: None` waits out the request timeout; a producer whose
//! partition's owner goes silent resends the same message ids to the new
//! owner, and a consumer claims and acks there. Real time throughout (a paused tokio clock would run past the
//! sockets), with durations short enough that each test takes a few
//! seconds and bounds loose enough for a loaded machine.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{err, ok, start_broker, FakeServer, Handler};
use spool_client::spool_wire::batch::{BatchView, MessageId};
use spool_client::spool_wire::proto::{
    ApiKey, CorrelationId, PartitionId, PingResponse, PurgeRequest, PurgeResponse, Request,
    Response,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Client, ClientConfig, ClientError, Connection, ConnectionConfig, Consumer, ConsumerConfig,
    Delivery, Liveness, Message, Producer, ProducerConfig,
};
use tokio::time::Instant;

/// The probe's durations in these tests: short, so each test is quick.
const LIVENESS: Liveness =
    Liveness { idle: Duration::from_millis(300), timeout: Duration::from_millis(700) };

/// Room for a loaded machine on top of idle + timeout (still far below the
/// request timeout, which is what the probe must beat).
const SLACK: Duration = Duration::from_secs(2);

/// How far apart the fake may see two frames sent a given time apart (its
/// reads run when the runtime gets to them).
const JITTER: Duration = Duration::from_millis(100);

/// Every test's outer bound.
const TEST_LIMIT: Duration = Duration::from_secs(20);

async fn bounded<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_LIMIT, future).await.expect("test exceeded its time limit")
}

fn purge() -> Request<'static> {
    Request::Purge(PurgeRequest {
        queue: "q".into(),
        partition: PartitionId(0),
        dry_run: true,
        subscription: String::new(),
    })
}

fn config(liveness: Option<Liveness>) -> ConnectionConfig {
    // The default request timeout (30 s): the probe, not it, must end things.
    ConnectionConfig { liveness, ..ConnectionConfig::default() }
}

/// What a fake broker saw: when each Ping and each other request came
/// (since the fake started).
#[derive(Default)]
struct Seen {
    pings: Vec<Duration>,
    requests: Vec<Duration>,
}

/// A fake that records every request in `seen` and answers as `answer`
/// says (`None`: not at all).
fn recording(
    seen: Arc<Mutex<Seen>>,
    answer: impl Fn(&Request<'_>, CorrelationId) -> Option<(Duration, Vec<u8>)> + Send + Sync + 'static,
) -> Handler {
    let started = Instant::now();
    Arc::new(move |request, id, outbox| {
        {
            let mut seen = seen.lock().unwrap();
            match request {
                Request::Ping(_) => seen.pings.push(started.elapsed()),
                _ => seen.requests.push(started.elapsed()),
            }
        }
        if let Some((delay, bytes)) = answer(request, id) {
            if delay.is_zero() {
                outbox.send(bytes);
            } else {
                outbox.send_after(delay, bytes);
            }
        }
    })
}

// Goal: a broker that keeps the socket open and answers nothing (a hung
// process) fails the request in flight with ConnectionClosed, saying so,
// after idle + timeout and far below the 30 s request timeout; exactly one
// Ping was sent, after `idle`; the connection is closed for later calls.
// Method: a fake that records and answers nothing, not even Pings.
#[tokio::test]
async fn a_silent_broker_fails_requests_within_idle_plus_timeout() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = FakeServer::start_seeing_pings(recording(Arc::clone(&seen), |_, _| None)).await;
    let connection = Connection::connect(&server.addr, config(Some(LIVENESS))).await.unwrap();
    let started = Instant::now();
    let error = bounded(connection.call(&purge())).await.unwrap_err();
    let elapsed = started.elapsed();
    let ClientError::ConnectionClosed { reason, .. } = &error else {
        panic!("expected ConnectionClosed, got {error:?}");
    };
    assert!(reason.contains("not even an answer to a Ping"), "{reason}");
    assert!(reason.contains("unresponsive"), "{reason}");
    assert!(error.is_retriable());
    assert!(elapsed >= LIVENESS.idle + LIVENESS.timeout, "closed after {elapsed:?}");
    assert!(elapsed < LIVENESS.idle + LIVENESS.timeout + SLACK, "closed after {elapsed:?}");
    assert!(connection.is_closed());
    assert_eq!(connection.in_flight(), 0);
    let again = connection.call(&purge()).await.unwrap_err();
    assert!(matches!(again, ClientError::ConnectionClosed { .. }), "{again:?}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 1);
    assert_eq!(seen.pings.len(), 1, "one probe outstanding at most: {:?}", seen.pings);
    // Seen by the fake, so within its reads' jitter of when it was sent.
    let after = seen.pings[0].saturating_sub(seen.requests[0]);
    assert!(after >= LIVENESS.idle - JITTER, "Ping {after:?} after the request");
}

/// Holds one request for well over idle + timeout while `ping_answer`
/// answers each Ping; the held request must complete on an open connection
/// and Pings must have been sent, one per idle at most.
async fn held_request_survives(ping_answer: fn(CorrelationId) -> Vec<u8>) {
    let hold = (LIVENESS.idle + LIVENESS.timeout) * 3;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handler = recording(Arc::clone(&seen), move |request, id| match request {
        Request::Ping(_) => Some((Duration::ZERO, ping_answer(id))),
        _ => Some((hold, ok(id, &Response::Purge(PurgeResponse { count: 5 })))),
    });
    let server = FakeServer::start_seeing_pings(handler).await;
    let connection = Connection::connect(&server.addr, config(Some(LIVENESS))).await.unwrap();
    let started = Instant::now();
    let bytes = bounded(connection.call(&purge())).await.unwrap();
    assert!(started.elapsed() >= hold);
    let Response::Purge(answer) = bytes.response().unwrap() else { panic!("not a purge answer") };
    assert_eq!(answer.count, 5);
    assert!(!connection.is_closed());
    let seen = seen.lock().unwrap();
    assert!(seen.pings.len() >= 2, "the silence must have been probed: {:?}", seen.pings);
    // At most one probe per idle: each Ping is answered at once, and the
    // next waits a whole idle after that answer.
    for pair in seen.pings.windows(2) {
        let apart = pair[1].saturating_sub(pair[0]);
        assert!(apart >= LIVENESS.idle - JITTER, "Pings {apart:?} apart: {:?}", seen.pings);
    }
}

// Goal: a broker that holds a request (a long-polling Claim, a slow
// commit) for longer than idle + timeout but answers Pings keeps the
// connection, and the held request completes. Method: the fake answers
// each Ping at once and the request after 3 × (idle + timeout).
#[tokio::test]
async fn a_broker_answering_pings_keeps_a_held_request() {
    held_request_survives(|id| ok(id, &Response::Ping(PingResponse {}))).await;
}

// Goal: a broker that predates Ping answers it UNKNOWN_API, and that error
// frame proves life as well as a Ping answer does. Method: as above, each
// Ping answered with the error frame a broker without key 8 sends.
#[tokio::test]
async fn an_older_brokers_unknown_api_answer_also_proves_life() {
    held_request_survives(|id| err(id, ApiKey::Ping, ErrorCode::UnknownApi, "unknown api", None))
        .await;
}

// Goal: a connection with nothing outstanding is never probed, however
// long it stays quiet, and its next request starts the clock afresh (it is
// answered, not closed for the silence before it). Method: one request
// answered at once, then 3 × (idle + timeout) with nothing outstanding,
// then another request answered after 1.5 × idle (so it is probed once,
// and the Ping is answered).
#[tokio::test]
async fn an_idle_connection_sends_no_ping() {
    let quiet = (LIVENESS.idle + LIVENESS.timeout) * 3;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let late = Arc::new(Mutex::new(false));
    let handler = {
        let late = Arc::clone(&late);
        recording(Arc::clone(&seen), move |request, id| match request {
            Request::Ping(_) => Some((Duration::ZERO, ok(id, &Response::Ping(PingResponse {})))),
            _ => {
                let delay =
                    if *late.lock().unwrap() { LIVENESS.idle * 3 / 2 } else { Duration::ZERO };
                Some((delay, ok(id, &Response::Purge(PurgeResponse { count: 1 }))))
            }
        })
    };
    let server = FakeServer::start_seeing_pings(handler).await;
    let connection = Connection::connect(&server.addr, config(Some(LIVENESS))).await.unwrap();
    bounded(connection.call(&purge())).await.unwrap();
    // Time under test: the connection sits idle.
    tokio::time::sleep(quiet).await;
    assert!(seen.lock().unwrap().pings.is_empty(), "an idle connection was pinged");
    assert!(!connection.is_closed());
    *late.lock().unwrap() = true;
    bounded(connection.call(&purge())).await.unwrap();
    assert!(!connection.is_closed());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 2);
    assert_eq!(seen.pings.len(), 1, "{:?}", seen.pings);
    let after = seen.pings[0].saturating_sub(seen.requests[1]);
    assert!(after >= LIVENESS.idle - JITTER, "Ping {after:?} after the request");
}

// Goal: `liveness: None` turns the probe off: no Ping, and a silent broker
// holds the request until its request timeout. Method: a request timeout
// of 2 × (idle + timeout) against a fake that answers nothing.
#[tokio::test]
async fn without_liveness_a_silent_broker_costs_the_request_timeout() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = FakeServer::start_seeing_pings(recording(Arc::clone(&seen), |_, _| None)).await;
    let request_timeout = (LIVENESS.idle + LIVENESS.timeout) * 2;
    let config =
        ConnectionConfig { request_timeout, liveness: None, ..ConnectionConfig::default() };
    let connection = Connection::connect(&server.addr, config).await.unwrap();
    let error = bounded(connection.call(&purge())).await.unwrap_err();
    assert!(matches!(error, ClientError::Timeout { .. }), "{error:?}");
    assert!(!connection.is_closed());
    assert!(seen.lock().unwrap().pings.is_empty());
}

// Goal: the durations are validated when connecting.
#[tokio::test]
async fn liveness_durations_are_validated() {
    let server = FakeServer::start(Arc::new(|_, _, _| {})).await;
    let zero = Liveness { idle: Duration::ZERO, ..Liveness::default() };
    let error = Connection::connect(&server.addr, config(Some(zero))).await.unwrap_err();
    assert!(matches!(error, ClientError::Config(_)), "{error:?}");
}

/// What the silent owner saw: the message ids of every Enqueue.
type SilentEnqueues = Arc<Mutex<Vec<Vec<MessageId>>>>;

// Goal: a producer whose partition's owner goes silent (a hung leader)
// gets its send acknowledged by the new owner within idle + timeout plus
// the retry, far below the request timeout, and the retry carries the same
// message ids (so an enqueue that landed on the hung owner is
// deduplicated wherever the log continues). Method: the bootstrap (a
// MiniBroker) names a silent fake as partition 0's owner; the fake, when
// its first Enqueue arrives, records its ids, moves the partition to the
// bootstrap (an election elsewhere) and answers nothing.
#[tokio::test]
async fn a_producer_moves_off_a_silent_owner_with_the_same_ids() {
    let (bootstrap, state) = start_broker("q", 1).await;
    let silent_ids: SilentEnqueues = Arc::default();
    let handler: Handler = {
        let (state, silent_ids, port) =
            (Arc::clone(&state), Arc::clone(&silent_ids), bootstrap.port);
        Arc::new(move |request, _, _| {
            if let Request::Enqueue(enqueue) = request {
                let view = BatchView::validate(enqueue.batch).unwrap();
                let ids = view.records().map(|record| MessageId(record.message_id.0)).collect();
                silent_ids.lock().unwrap().push(ids);
                state.lock().unwrap().owners[0].1 = port;
            }
        })
    };
    let silent = FakeServer::start_seeing_pings(handler).await;
    state.lock().unwrap().owners[0].1 = silent.port;
    let client_config = ClientConfig { connection: config(Some(LIVENESS)) };
    let client = Client::connect_with(&bootstrap.addr, client_config).await.unwrap();
    let producer_config =
        ProducerConfig { retry_backoff: Duration::from_millis(20), ..ProducerConfig::default() };
    let producer = Producer::new(client, producer_config).unwrap();
    let started = Instant::now();
    let offset = bounded(producer.send("q", Message::new("hello").key("k"))).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(offset.0, 0);
    assert!(elapsed >= LIVENESS.idle + LIVENESS.timeout, "acknowledged after {elapsed:?}");
    assert!(elapsed < LIVENESS.idle + LIVENESS.timeout + SLACK, "acknowledged after {elapsed:?}");
    let silent_ids = silent_ids.lock().unwrap();
    let state = state.lock().unwrap();
    assert_eq!(silent_ids.len(), 1, "one attempt at the silent owner");
    assert_eq!(state.enqueue_attempts, *silent_ids, "the retry must carry the same ids");
    assert_eq!(state.stored(), 1);
}

// Goal: a consumer whose partition's owner goes silent gets its claim
// failed by the probe, finds the new owner through refreshed metadata,
// and claims and acks the message there, within idle + timeout plus its
// claim backoff. Method: the bootstrap (a MiniBroker holding one message)
// names a silent fake as the owner; the fake, when a Claim arrives, moves
// the partition back to the bootstrap and answers nothing.
#[tokio::test]
async fn a_consumer_moves_off_a_silent_owner() {
    let (bootstrap, state) = start_broker("q", 1).await;
    let producer =
        Producer::new(Client::connect(&bootstrap.addr).await.unwrap(), ProducerConfig::default())
            .unwrap();
    bounded(producer.send("q", Message::new("work"))).await.unwrap();
    let silent_claims = Arc::new(Mutex::new(0usize));
    let handler: Handler = {
        let (state, silent_claims, port) =
            (Arc::clone(&state), Arc::clone(&silent_claims), bootstrap.port);
        Arc::new(move |request, _, _| {
            if let Request::Claim(_) = request {
                *silent_claims.lock().unwrap() += 1;
                state.lock().unwrap().owners[0].1 = port;
            }
        })
    };
    let silent = FakeServer::start_seeing_pings(handler).await;
    state.lock().unwrap().owners[0].1 = silent.port;
    let client_config = ClientConfig { connection: config(Some(LIVENESS)) };
    let client = Client::connect_with(&bootstrap.addr, client_config).await.unwrap();
    let mut consumer_config = ConsumerConfig::new("q", 1);
    consumer_config.wait_ms = 20;
    let started = Instant::now();
    let consumer = Consumer::start(client, consumer_config, |_delivery: Delivery| async {
        Ok::<(), String>(())
    })
    .unwrap();
    let acked = common::wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() == 1).await;
    let elapsed = started.elapsed();
    let stats = bounded(consumer.shutdown()).await;
    assert!(acked, "the message was never acked at the new owner");
    assert!(elapsed >= LIVENESS.idle + LIVENESS.timeout, "acked after {elapsed:?}");
    assert!(elapsed < LIVENESS.idle + LIVENESS.timeout + SLACK, "acked after {elapsed:?}");
    assert!(*silent_claims.lock().unwrap() >= 1);
    assert!(stats.claim_failed >= 1, "the claim at the silent owner failed: {stats:?}");
    assert_eq!(stats.acked, 1);
    assert_eq!(stats.settle_failed, 0);
}
