// Goal: clients that ask for large answers and never read them cannot
// grow the shard's `responses` memory pool past what the code allows, are
// closed at `write_timeout` and counted as
// `spool_shard_connections_closed_total{reason="slow_reader"}`, and do not
// hold back a well-behaved client beside them; once they are gone the pool
// is empty again.
//
// Method: a real spoold with one shard, `--memory-bytes 40 MiB` (the admin
// port's 8 MiB pool off the top leaves the shard 32 MiB, a responses pool P
// of 10 %: 3.2 MiB; frames and journal caches lowered so the broker
// accepts so small a budget), `--write-timeout-ms 2000` and
// `--in-flight-per-connection-max 8`; a backlog queue of 256 messages of
// 4 KiB. 32 raw TCP connections (a 4 KiB receive buffer each, so the
// kernel takes little of what the broker writes) each send 64 Peeks of 32
// messages (answers R ≈ 133 KiB that consume nothing; 8.3 MiB asked per
// connection) and never read. Meanwhile a good client on another queue
// does enqueue + claim + ack round trips. Figures from /metrics.
//
// The bound on the pool's peak, from the code (`net/connection.rs`,
// `net/memory.rs`): while the pool is over P, a connection hands a request
// over only while it holds at most P over the connections holding; the
// answers of its requests already handed over (at most `in_flight`, of R
// each) still land. Connections that start holding one after another may
// each reach P/k (k-th to hold), so the pool holds at most P × H(n) + n ×
// in_flight × R (H the harmonic number, n = 33 connections with the good
// one): 3.2 MiB × 4.10 + 33 × 8 × 133 KiB = 49.6 MB. Without the pause a
// connection stops only when its permits and its writer's channel are full
// (≈ 3 × in_flight answers, under its own 4 MiB RESPONSE_QUEUE_BYTES_MAX).
//
// Measured (2026-12-05, debug build of spoold, 2-core VM, 10 runs): peak
// 13.2–15.5 MB against the bound of 49.6 MB; all 32 slow readers closed
// 2.10–2.25 s after the first connected (write_timeout 2 s); the good
// client's slowest round trip 48–203 ms (85–95 round trips per run).
//
// How it can fail (each seen failing): with a responses pool too large to
// bite (`--memory-bytes 4 GiB`: the pool never over its size, so no
// connection ever pauses) the peak was 91.6 and 92.7 MB, over the bound;
// with the write_timeout close gone (WRITE_TIMEOUT_MS at 600 000) the
// slow-reader count stayed 0 and the close wait failed; with a timed-out
// write counted as `write_failed` the same wait failed with 0; an answer
// leaked from the pool would fail the return to 0.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::proto::{CorrelationId, Offset, PartitionId, PeekRequest, Request};
use spool_client::{Admin, Message, Producer, ProducerConfig};
use spool_tests::admin::{http_get, Exposition};
use spool_tests::fault::{good_round_trip, message_id, payload_for, warmed_good_client};
use spool_tests::{now, test_queue_config, Spoold, SpooldOptions};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// The good client's queue (its round trips expect nothing else in it).
const QUEUE: &str = "steady";
/// The queue the slow readers peek at (never claimed).
const BACKLOG: &str = "backlog";
const MEMORY_BYTES: u64 = 40 << 20;
/// The admin port's pool, off the top of `MEMORY_BYTES`: its floor (two
/// 4 MiB API requests with their answers; 5 % is less).
const ADMIN_POOL_BYTES: u64 = 8 << 20;
/// Small enough that the requests pool (25 % of the shard's 32 MiB, 8 MiB)
/// holds two.
const FRAME_BYTES_MAX: u64 = 1 << 20;
/// Small enough that the two journal caches fit half the state share.
const TAIL_CACHE_BYTES: u64 = 4 << 20;
/// `MEMORY_RESPONSES_PERCENT` of the one shard's part.
const RESPONSES_POOL_BYTES: u64 = (MEMORY_BYTES - ADMIN_POOL_BYTES) / 100 * 10;
const WRITE_TIMEOUT_MS: u64 = 2_000;
const IN_FLIGHT_PER_CONNECTION: u64 = 8;
const BACKLOG_MESSAGES: u64 = 256;
const MESSAGE_BYTES: usize = 4 << 10;
/// Messages enqueued at once while filling the backlog (≈ 128 KiB).
const FILL_ROUND_MESSAGES: u64 = 32;
/// Messages one Peek asks for (its answer ≈ this × MESSAGE_BYTES).
const PEEK_MESSAGES: u32 = 32;
const PEEKS_PER_CONNECTION: u64 = 64;
const SLOW_CONNECTIONS: usize = 32;
/// The receive buffer a slow reader asks its kernel for.
const SLOW_RECEIVE_BUFFER_BYTES: u32 = 4 << 10;
/// Beyond `write_timeout`, how long the slow connections may take to be
/// closed and counted (a loaded 2-core machine; each closes
/// `write_timeout` after its first stalled write began).
const CLOSE_MARGIN: Duration = Duration::from_secs(10);
/// Slowest acceptable good round trip (enqueue + claim + ack).
const ROUND_TRIP_MAX: Duration = Duration::from_secs(2);
/// How long the good client's last round trip may take to end once asked
/// to stop (far above ROUND_TRIP_MAX: only a hang takes this long).
const GOOD_CLIENT_STOPS_WITHIN: Duration = Duration::from_secs(20);
/// How long the pool may take to empty once the slow readers are closed.
const EMPTY_WITHIN: Duration = Duration::from_secs(10);

fn scrape(broker: &Spoold) -> Exposition {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{}", page.body);
    Exposition::parse(&page.body).unwrap()
}

fn responses_pool(exposition: &Exposition, figure: &str) -> f64 {
    exposition
        .value(figure, &[("shard", "0"), ("pool", "responses")])
        .unwrap_or_else(|| panic!("{figure} of the responses pool not in /metrics"))
}

fn closed(exposition: &Exposition, reason: &str) -> f64 {
    exposition
        .value("spool_shard_connections_closed_total", &[("shard", "0"), ("reason", reason)])
        .unwrap_or_else(|| panic!("no spool_shard_connections_closed_total for {reason}"))
}

/// [`scrape`] off the runtime's worker threads.
async fn scrape_async(broker: &Spoold) -> Exposition {
    let addr = broker.admin_addr();
    let page = tokio::task::spawn_blocking(move || http_get(&addr, "/metrics")).await.unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    Exposition::parse(&page.body).unwrap()
}

/// `count` Peek frames of the backlog, correlation ids from `first`.
fn peek_frames(first: u64, count: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for correlation in first..first + count {
        let request = Request::Peek(PeekRequest {
            queue: BACKLOG.to_owned(),
            partition: PartitionId(0),
            from_offset: Offset(0),
            max: PEEK_MESSAGES,
            subscription: String::new(),
        });
        request.encode(CorrelationId(correlation), &mut out).unwrap();
    }
    out
}

/// The size of one Peek answer, read on a connection that does read.
async fn peek_answer_bytes(addr: &str) -> u64 {
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(&peek_frames(1, 1)).unwrap();
        spool_tests::read_frame_bytes(&mut stream).unwrap().len() as u64
    })
    .await
    .unwrap()
}

/// A connection with a small receive buffer that sends its Peeks and then
/// never reads (kept open by the caller until the broker closes it).
async fn slow_reader(addr: &str, slot: u64) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(SLOW_RECEIVE_BUFFER_BYTES).unwrap();
    let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
    let frames = peek_frames(slot * PEEKS_PER_CONNECTION + 1, PEEKS_PER_CONNECTION);
    stream.write_all(&frames).await.unwrap();
    stream
}

async fn fill_backlog(broker: &Spoold) {
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue(BACKLOG, test_queue_config(1, 10_000, 10))
        .await
        .unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    // In rounds of FILL_ROUND_MESSAGES, so no enqueue frame passes the
    // lowered FRAME_BYTES_MAX.
    for round in 0..BACKLOG_MESSAGES / FILL_ROUND_MESSAGES {
        let mut pending = Vec::new();
        for sequence in round * FILL_ROUND_MESSAGES..(round + 1) * FILL_ROUND_MESSAGES {
            let id = message_id(2, sequence);
            let message = Message::new(payload_for(id, MESSAGE_BYTES)).id(id);
            pending.push(producer.submit(BACKLOG, message).await.unwrap());
        }
        for sent in pending {
            sent.await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_readers_stay_inside_the_responses_pool_and_are_closed() {
    let mut options = SpooldOptions::new(1);
    options.args = vec![
        "--memory-bytes".into(),
        MEMORY_BYTES.to_string(),
        "--write-timeout-ms".into(),
        WRITE_TIMEOUT_MS.to_string(),
        "--in-flight-per-connection-max".into(),
        IN_FLIGHT_PER_CONNECTION.to_string(),
        "--frame-bytes-max".into(),
        FRAME_BYTES_MAX.to_string(),
        "--tail-cache-bytes".into(),
        TAIL_CACHE_BYTES.to_string(),
    ];
    let broker = Spoold::start_with(options);
    let before = scrape(&broker);
    let pool_bytes = responses_pool(&before, "spool_shard_memory_budget_bytes");
    assert_eq!(pool_bytes, RESPONSES_POOL_BYTES as f64);
    for reason in [
        "peer_closed",
        "idle",
        "stopped",
        "closed",
        "decode_error",
        "frame_too_large",
        "frame_timeout",
        "read_failed",
        "write_failed",
        "slow_reader",
        "tls",
    ] {
        // Every reason is listed from the start (the start-up probe of the
        // port already ended as peer_closed).
        let _ = closed(&before, reason);
    }
    assert_eq!(closed(&before, "slow_reader"), 0.0);

    let (client, producer) = warmed_good_client(&broker, QUEUE).await;
    fill_backlog(&broker).await;
    let answer_bytes = peek_answer_bytes(&broker.addr()).await;
    assert!(
        answer_bytes >= u64::from(PEEK_MESSAGES) * MESSAGE_BYTES as u64,
        "a peek answered {answer_bytes} bytes"
    );
    let connections = SLOW_CONNECTIONS as u64 + 1;
    let harmonic: f64 = (1..=connections).map(|k| 1.0 / k as f64).sum();
    let peak_bound = RESPONSES_POOL_BYTES as f64 * harmonic
        + (connections * IN_FLIGHT_PER_CONNECTION * answer_bytes) as f64;

    // The good client goes on beside the slow readers, timing each round.
    let running = Arc::new(AtomicBool::new(true));
    let good = {
        let running = running.clone();
        tokio::spawn(async move {
            let (mut slowest, mut rounds) = (Duration::ZERO, 0u64);
            while running.load(Ordering::Acquire) {
                let id = message_id(1, rounds);
                let took = good_round_trip(&client, &producer, QUEUE, id, rounds).await;
                slowest = slowest.max(took);
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (slowest, rounds)
        })
    };

    let started = now();
    let mut slow = Vec::with_capacity(SLOW_CONNECTIONS);
    for slot in 0..SLOW_CONNECTIONS {
        slow.push(slow_reader(&broker.addr(), slot as u64).await);
    }
    // Every slow reader is closed and counted (bounded: write_timeout
    // after its first stalled write, plus a margin).
    let deadline = started + Duration::from_millis(WRITE_TIMEOUT_MS) + CLOSE_MARGIN;
    let closed_after = loop {
        let exposition = scrape_async(&broker).await;
        let slow_readers = closed(&exposition, "slow_reader");
        if slow_readers >= SLOW_CONNECTIONS as f64 {
            break started.elapsed();
        }
        assert!(
            now() < deadline,
            "{slow_readers} of {SLOW_CONNECTIONS} slow readers closed after {:?}",
            started.elapsed()
        );
        // A bounded poll: the figure is read again each time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    running.store(false, Ordering::Release);
    // Bounded: a round trip that hangs fails here, not at nextest's limit.
    let (slowest, rounds) = tokio::time::timeout(GOOD_CLIENT_STOPS_WITHIN, good)
        .await
        .unwrap_or_else(|_| panic!("a good round trip still running {GOOD_CLIENT_STOPS_WITHIN:?}"))
        .unwrap();
    drop(slow);

    let after = scrape_async(&broker).await;
    let peak = responses_pool(&after, "spool_shard_memory_peak_bytes");
    let write_failed = closed(&after, "write_failed");
    eprintln!(
        "responses pool {RESPONSES_POOL_BYTES}: peak {peak} (bound {peak_bound:.0}, answer \
         {answer_bytes} bytes); {SLOW_CONNECTIONS} slow readers closed after {closed_after:?} \
         (write_timeout {WRITE_TIMEOUT_MS} ms); good client: {rounds} round trips, slowest \
         {slowest:?}; write_failed {write_failed}"
    );
    assert!(
        closed_after >= Duration::from_millis(WRITE_TIMEOUT_MS),
        "closed after {closed_after:?}, before write_timeout: not by it"
    );
    assert_eq!(closed(&after, "slow_reader"), SLOW_CONNECTIONS as f64, "only the slow readers");
    assert!(rounds >= 1, "no good round trip while the slow readers were open");
    assert!(slowest < ROUND_TRIP_MAX, "a good round trip took {slowest:?}");
    assert!(
        peak > RESPONSES_POOL_BYTES as f64,
        "the slow readers' answers never filled the pool (peak {peak}): the test did not load it"
    );
    assert!(
        peak <= peak_bound,
        "the responses pool held {peak} bytes, over its bound {peak_bound:.0}"
    );
    let log = broker.log();
    let logged = log
        .lines()
        .find(|line| line.contains("connection closed") && line.contains("slow_reader"))
        .unwrap_or_else(|| panic!("no slow_reader close in the broker's log"));
    eprintln!("logged: {logged}");

    // Every answer's memory comes back (bounded poll).
    let empty_by = now() + EMPTY_WITHIN;
    loop {
        let used = responses_pool(&scrape_async(&broker).await, "spool_shard_memory_used_bytes");
        if used == 0.0 {
            break;
        }
        assert!(now() < empty_by, "{used} bytes still in the responses pool");
        // A bounded poll: the figure is read again each time.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
