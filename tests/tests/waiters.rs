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
    // waiting 60 s on empty partitions, drop every socket, SIGTERM at once.
    let mut broker = broker_with_queue(&[]).await;
    let streams = long_polls(&broker.addr(), 8, 4);
    std::thread::sleep(Duration::from_millis(300));
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
    // claims waiting 60 s, SIGTERM, read both answers, then the close.
    let mut broker = broker_with_queue(&[]).await;
    let mut stream = long_polls(&broker.addr(), 1, 2).pop().unwrap();
    std::thread::sleep(Duration::from_millis(300));
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
    // the broker's open fds, open 20 connections with a 60 s long-poll
    // each, drop them, and require the count back within 5 s.
    let broker = broker_with_queue(&[]).await;
    let pid = broker.pid().unwrap();
    // New partitions prepare segment files in the background: let that
    // settle, and take the smallest count seen as the baseline.
    std::thread::sleep(Duration::from_secs(1));
    let baseline = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            open_fds(pid)
        })
        .min()
        .unwrap();
    let streams = long_polls(&broker.addr(), 20, 1);
    assert!(
        eventually(Duration::from_secs(10), || open_fds(pid) >= baseline + 20),
        "the broker holds a socket per waiting connection: {} against {baseline}",
        open_fds(pid)
    );
    drop(streams);
    assert!(
        eventually(Duration::from_secs(5), || open_fds(pid) <= baseline + 2),
        "sockets of closed connections still open: {} against {baseline}",
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
    // empty claim for a waiter displaced by a lighter connection.
    std::thread::sleep(Duration::from_secs(3));
    let mut per_connection_errors = 0;
    let mut other_replies = 0;
    for stream in &mut greedy {
        stream.set_nonblocking(true).unwrap();
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match stream.read(&mut chunk) {
                Ok(0) => panic!("the broker closed a greedy connection"),
                Ok(read) => bytes.extend_from_slice(&chunk[..read]),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(error) => panic!("greedy connection: {error}"),
            }
        }
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
    // Method: limit 4; hold 4 connections; 20 more each read the error and
    // EOF; after a second one more refusal logs the running total.
    let broker = broker_with_queue(&["--connections-per-shard-max", "4"]).await;
    let addr = broker.addr();
    // The admin client's connections may still be closing: wait for room.
    std::thread::sleep(Duration::from_millis(300));
    let held: Vec<TcpStream> = (0..4).map(|_| connect(&addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    for attempt in 0..20 {
        let mut extra = connect(&addr);
        let reply = read_reply(&mut extra).expect("an error frame before the close");
        assert_eq!(reply.error, ErrorCode::TooManyConnections, "attempt {attempt}");
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(text.contains("connections_per_shard_max"), "{text}");
        assert_eof(&mut extra);
    }
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
