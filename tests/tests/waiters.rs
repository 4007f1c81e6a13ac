// Goal: waiting claims never outlive the reason they wait. A broker asked to
// stop answers every long-poll (empty) and exits 0 at once, whether the
// clients are still there or already gone; a client that closes its
// connection has its waits ended and its socket released at once; one
// greedy client cannot push a well-behaved consumer on the same partition to
// THROTTLED; a connection over the shard's limit is told
// TOO_MANY_CONNECTIONS before the close, and the refusals are counted in a
// rate-limited log line. Method: real spoold processes; long-poll claims
// sent as raw frames over plain TCP, so a test controls exactly when a
// connection goes away; the broker's open file descriptors read from
// /proc/PID/fd.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use spool_client::spool_wire::proto::{
    decode_frame, ClaimRequest, CorrelationId, PartitionId, Request, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::Admin;
use spool_tests::events::{
    metric_sum_now, wait_for_claims_waiting_blocking, wait_for_connections_blocking, CLAIMS_WAITING,
};
use spool_tests::{now, test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "waiters";
/// A wait far longer than any bound these tests accept.
const LONG_WAIT_MS: u32 = 60_000;
/// How long a broker may take to exit after SIGTERM (the goal is 2 s; the
/// bound leaves room for a loaded machine and still fails a broker that
/// waits for a long-poll to expire or for `shutdown_timeout_ms`).
const EXIT_BOUND: Duration = Duration::from_secs(5);
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn claim_frame(partition: u32, correlation: u64, wait_ms: u32) -> Vec<u8> {
    let request = Request::Claim(ClaimRequest {
        queue: QUEUE,
        partition: PartitionId(partition),
        worker: WorkerId(7),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: 10_000,
        wait_ms,
        subscription: "",
    });
    let mut out = Vec::new();
    request.encode(CorrelationId(correlation), &mut out).unwrap();
    out
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

/// One reply frame: its error code, api key, and the body as bytes.
struct Reply {
    error: ErrorCode,
    api_key: u16,
    body: Vec<u8>,
}

/// Reads one frame and its header fields as they are on the wire (a reply
/// about the connection carries api key 0, which `decode_frame` refuses).
fn read_reply(stream: &mut TcpStream) -> std::io::Result<Reply> {
    let frame = spool_tests::read_frame_bytes(stream)?;
    assert!(frame.len() >= 24, "frame length {}", frame.len());
    let error = u16::from_le_bytes([frame[18], frame[19]]);
    Ok(Reply {
        error: ErrorCode::from_u16(error).unwrap(),
        api_key: u16::from_le_bytes([frame[4], frame[5]]),
        body: frame[24..].to_vec(),
    })
}

fn assert_eof(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Ok(_) => panic!("expected the broker to close, got more bytes"),
        Err(error) => assert_ne!(error.kind(), std::io::ErrorKind::WouldBlock, "no close"),
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The broker's open fd count once it reads the same `STABLE_READS` times
/// in a row, 50 ms apart (polled for at most 10 s).
fn stable_fds(pid: u32) -> usize {
    const STABLE_READS: usize = 5;
    let mut reads = vec![open_fds(pid)];
    let settled = eventually(Duration::from_secs(10), || {
        reads.push(open_fds(pid));
        let last = &reads[reads.len().saturating_sub(STABLE_READS)..];
        last.len() == STABLE_READS && last.iter().all(|count| *count == last[0])
    });
    assert!(settled, "the broker's fd count never held still: {reads:?}");
    *reads.last().unwrap()
}

/// Polls `probe` every 50 ms for up to `wait`; true once it holds.
fn eventually(wait: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let deadline = now() + wait;
    while now() < deadline {
        if probe() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    probe()
}

async fn broker_with_queue(args: &[&str]) -> Spoold {
    let mut options = SpooldOptions::new(1);
    options.args = args.iter().map(|arg| (*arg).to_owned()).collect();
    let broker = Spoold::start_with(options);
    let client = broker.client().await;
    Admin::new(client).create_queue(QUEUE, test_queue_config(2, 10_000, 10)).await.unwrap();
    broker
}

/// `connections` connections, each with `claims` long-polls on partitions
/// 0 and 1 in turn.
fn long_polls(addr: &str, connections: usize, claims: usize) -> Vec<TcpStream> {
    (0..connections)
        .map(|_| {
            let mut stream = connect(addr);
            let mut bytes = Vec::new();
            for claim in 0..claims {
                bytes.extend(claim_frame((claim % 2) as u32, claim as u64 + 1, LONG_WAIT_MS));
            }
            stream.write_all(&bytes).unwrap();
            stream
        })
        .collect()
}

/// Appends what `stream` (non-blocking) has to read now to `bytes`.
fn read_available(stream: &mut TcpStream, bytes: &mut Vec<u8>) {
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => panic!("the broker closed a greedy connection"),
            Ok(read) => bytes.extend_from_slice(&chunk[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(error) => panic!("greedy connection: {error}"),
        }
    }
}

/// Whole frames at the start of `bytes`.
fn whole_frames(bytes: &[u8]) -> usize {
    let (mut at, mut frames) = (0, 0);
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len < 4 || at + len > bytes.len() {
            break;
        }
        at += len;
        frames += 1;
    }
    frames
}

/// Lines of the log that contain every one of `needles` (colour codes
/// removed first).
fn log_lines(broker: &Spoold, needles: &[&str]) -> Vec<String> {
    let mut plain = String::new();
    let mut in_escape = false;
    for character in broker.log().chars() {
        match (in_escape, character) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, other) => plain.push(other),
        }
    }
    plain
        .lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_long_polls_of_vanished_clients_exits_0_at_once() {
    // Goal: long-polls whose clients already left do not hold the drain:
    // SIGTERM exits 0 within EXIT_BOUND, not after shutdown_timeout_ms
    // (exit code 11) or the 60 s wait. Method: 8 connections × 4 claims
    // waiting 60 s on empty partitions (all 32 parked), drop every socket,
    // SIGTERM at once.
    let mut broker = broker_with_queue(&[]).await;
    let streams = long_polls(&broker.addr(), 8, 4);
    wait_for_claims_waiting_blocking(&broker, 32);
    drop(streams);
    let started = now();
    broker.signal(libc::SIGTERM);
    let status = broker.wait_exit(EXIT_BOUND).expect("spoold exits within the bound");
    assert_eq!(status.code(), Some(0), "exit status; log:\n{}", broker.log());
    eprintln!("exited in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_connected_long_poll_with_an_empty_claim() {
    // Goal: a client still waiting at SIGTERM gets its claim's answer
    // (empty, no error), not a reset, and the broker exits 0. Method: two
    // claims waiting 60 s (both parked), SIGTERM, read both answers, then
    // the close.
    let mut broker = broker_with_queue(&[]).await;
    let mut stream = long_polls(&broker.addr(), 1, 2).pop().unwrap();
    wait_for_claims_waiting_blocking(&broker, 2);
    broker.signal(libc::SIGTERM);
    for _ in 0..2 {
        let reply = read_reply(&mut stream).expect("an answer, not a reset");
        assert_eq!(reply.error, ErrorCode::None);
        assert_eq!(reply.api_key, 2, "a Claim response");
        // lease deadline (u64) + delivery count (u32) = 0 deliveries.
        assert_eq!(reply.body[8..12], [0, 0, 0, 0], "an empty claim");
    }
    assert_eof(&mut stream);
    let status = broker.wait_exit(EXIT_BOUND).expect("spoold exits within the bound");
    assert_eq!(status.code(), Some(0), "log:\n{}", broker.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_releases_its_waits_and_socket_at_once() {
    // Goal: a client that goes away mid-long-poll frees its waiter and its
    // file descriptor at once, not when its 60 s wait expires. Method: count
    // the broker's open fds once the count holds still, open 20 connections
    // with a 60 s long-poll each (all parked), drop them, and require the
    // waits ended, the connections closed and the count back within 5 s.
    let broker = broker_with_queue(&[]).await;
    let pid = broker.pid().unwrap();
    // Once the admin client's connections are closed (the gauge) and the
    // new partitions' first files written, the baseline: a count read the
    // same five times in a row (a bounded poll, not a guess at how long
    // that takes).
    wait_for_connections_blocking(&broker, 0);
    let baseline = stable_fds(pid);
    let streams = long_polls(&broker.addr(), 20, 1);
    wait_for_claims_waiting_blocking(&broker, 20);
    assert!(
        open_fds(pid) >= baseline + 20,
        "the broker holds a socket per waiting connection: {} against {baseline}",
        open_fds(pid)
    );
    drop(streams);
    let ended = eventually(Duration::from_secs(5), || {
        metric_sum_now(&broker, CLAIMS_WAITING) == Ok(0.0) && open_fds(pid) <= baseline + 2
    });
    assert!(
        ended,
        "waits of closed connections: {:?}; their sockets: {} open against {baseline}",
        metric_sum_now(&broker, CLAIMS_WAITING),
        open_fds(pid)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_client_cannot_push_a_good_consumer_to_throttled() {
    // Goal: one client with 72 connections × 120 long-polls on one
    // partition (the trial that filled the 4,096-waiter cap) gets its own
    // per-connection error, and a well-behaved consumer on the same
    // partition still long-polls without THROTTLED. Method: raw claims from
    // the greedy client, answers counted by error; then the good consumer's
    // claims (2 s waits) must all answer without error; the per-connection
    // refusals appear in a rate-limited log line.
    let broker = broker_with_queue(&[]).await;
    let addr = broker.addr();
    let mut greedy: Vec<TcpStream> = (0..72)
        .map(|_| {
            let mut stream = connect(&addr);
            let bytes: Vec<u8> =
                (0..120).flat_map(|claim| claim_frame(0, claim + 1, LONG_WAIT_MS)).collect();
            stream.write_all(&bytes).unwrap();
            stream
        })
        .collect();
    // Up to 64 of each connection's claims wait (the default bound); the
    // rest are answered at once: THROTTLED naming the connection's bound, or
    // (once the partition is full and this connection is the heaviest) an
    // empty claim for a waiter displaced by a lighter connection. Read
    // until every claim is accounted for: the answers read so far plus the
    // claims parked (scraped after the read) make all 72 × 120.
    const GREEDY_CLAIMS: usize = 72 * 120;
    let mut received: Vec<Vec<u8>> = vec![Vec::new(); greedy.len()];
    for stream in &mut greedy {
        stream.set_nonblocking(true).unwrap();
    }
    let started = now();
    loop {
        for (stream, bytes) in greedy.iter_mut().zip(&mut received) {
            read_available(stream, bytes);
        }
        let answered: usize = received.iter().map(|bytes| whole_frames(bytes)).sum();
        let parked = metric_sum_now(&broker, CLAIMS_WAITING);
        if parked.as_ref().is_ok_and(|parked| answered + *parked as usize == GREEDY_CLAIMS) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{answered} answers read and {parked:?} claims parked of {GREEDY_CLAIMS}"
        );
        // A bounded poll: both counts are read again each time.
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut per_connection_errors = 0;
    let mut other_replies = 0;
    for bytes in &received {
        let mut at = 0;
        while at + 4 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if at + len > bytes.len() {
                break;
            }
            let frame = decode_frame(&bytes[at..at + len]).unwrap();
            let text = String::from_utf8_lossy(frame.body).into_owned();
            match frame.header.error_code {
                ErrorCode::Throttled if text.contains("claim_waiters_per_connection_max") => {
                    per_connection_errors += 1
                }
                ErrorCode::Throttled | ErrorCode::None => other_replies += 1,
                other => panic!("greedy claim answered {other:?}: {text}"),
            }
            at += len;
        }
    }
    eprintln!("greedy: {per_connection_errors} per-connection refusals, {other_replies} others");
    assert!(per_connection_errors > 0, "the greedy client meets its own bound");
    // Every claim past a bound was answered at once, none left hanging.
    assert!(per_connection_errors + other_replies >= 72 * 56);

    let mut good = connect(&addr);
    for round in 0..5u64 {
        good.write_all(&claim_frame(0, round + 1, 2_000)).unwrap();
        let reply = read_reply(&mut good).unwrap();
        assert_eq!(reply.error, ErrorCode::None, "good consumer, round {round}");
    }
    let lines = log_lines(&broker, &["rejected", "claim_waiters_per_connection"]);
    assert!(!lines.is_empty(), "no rejection line in the log");
    // 4,032 rejections in a few seconds: rate-limited to one line a second.
    assert!(lines.len() <= 30, "{} lines for one reason", lines.len());
    drop(greedy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_limit_is_told_too_many_connections() {
    // Goal: a connection past connections_per_shard_max reads a
    // TOO_MANY_CONNECTIONS error frame before the close, and refusals are
    // counted in a rate-limited log line that reports the suppressed ones.
    // Method: limit 4; once the admin client's connections are closed
    // (the connections gauge), hold 4 connections, accepted (the gauge);
    // 20 more each read the error and EOF; after a second one more refusal
    // logs the running total.
    let broker = broker_with_queue(&["--connections-per-shard-max", "4"]).await;
    let addr = broker.addr();
    wait_for_connections_blocking(&broker, 0);
    let held: Vec<TcpStream> = (0..4).map(|_| connect(&addr)).collect();
    wait_for_connections_blocking(&broker, 4);
    for attempt in 0..20 {
        let mut extra = connect(&addr);
        let reply = read_reply(&mut extra).expect("an error frame before the close");
        assert_eq!(reply.error, ErrorCode::TooManyConnections, "attempt {attempt}");
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(text.contains("connections_per_shard_max"), "{text}");
        assert_eof(&mut extra);
    }
    // Time under test: the refusal line is rate-limited to one a second.
    std::thread::sleep(Duration::from_millis(1_100));
    let mut last = connect(&addr);
    assert_eq!(read_reply(&mut last).unwrap().error, ErrorCode::TooManyConnections);
    let running_total = |lines: &[String]| {
        lines
            .iter()
            .filter_map(|line| line.split("total=").nth(1))
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .filter_map(|digits| digits.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let found = eventually(Duration::from_secs(5), || {
        running_total(&log_lines(&broker, &["rejected", "too_many_connections"])) >= 21
    });
    let lines = log_lines(&broker, &["rejected", "too_many_connections"]);
    assert!(found, "no line with the running total; lines: {lines:#?}");
    assert!((lines.len() as u64) < running_total(&lines), "every refusal logged: {lines:#?}");
    assert!(lines.iter().any(|line| line.contains("suppressed_since_last=")), "{lines:#?}");
    drop(held);
}
