//! Faults at the process and connection edges: malformed, truncated and
//! oversized frames close only the connection that sent them; a second
//! broker on the same data directory refuses to start.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use spool_client::spool_wire::proto::{
    CorrelationId, FrameDecoder, ListQueuesRequest, Reply, Request, Response,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Connection, ConnectionConfig};
use spool_tests::{test_queue_config, Spoold};

/// A bad connection: name, bytes to send, whether to half-close after them,
/// and the one error reply expected as (correlation id, echoed key, code).
type BadCase = (&'static str, Vec<u8>, bool, Option<(u64, u16, ErrorCode)>);

/// How long a bad connection may take to be closed by the broker.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads until the broker closes the connection (or `CLOSE_TIMEOUT`, which
/// fails the test); returns every byte received.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(CLOSE_TIMEOUT)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return received,
            Ok(count) => received.extend_from_slice(&buffer[..count]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(error) => panic!("broker did not close the bad connection: {error}"),
        }
    }
}

/// The replies in `bytes`: `(correlation id, api key, code)` read from
/// each response header by hand, so a reply the codec would skip (an unknown
/// echoed key) still shows. The body must be a decodable error response.
fn error_replies(bytes: &[u8]) -> Vec<(u64, u16, ErrorCode)> {
    let mut replies = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 24 {
        let frame_bytes = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        assert!(frame_bytes >= 24 && frame_bytes <= rest.len(), "cut reply: {bytes:?}");
        let api_key = u16::from_le_bytes(rest[4..6].try_into().unwrap());
        let id = u64::from_le_bytes(rest[8..16].try_into().unwrap());
        let flags = u16::from_le_bytes(rest[16..18].try_into().unwrap());
        assert_eq!(flags & 1, 1, "a response frame");
        let code = ErrorCode::from_u16(u16::from_le_bytes(rest[18..20].try_into().unwrap()));
        let code = code.expect("a known error code");
        replies.push((id, api_key, code));
        rest = &rest[frame_bytes..];
    }
    assert!(rest.is_empty(), "trailing bytes after the replies");
    replies
}

/// How many whole frames `bytes` holds.
fn frames_in(bytes: &[u8]) -> usize {
    let mut count = 0;
    let mut rest = bytes;
    while rest.len() >= 4 {
        let frame_bytes = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        if frame_bytes < 24 || frame_bytes > rest.len() {
            break;
        }
        count += 1;
        rest = &rest[frame_bytes..];
    }
    count
}

fn list_queues_frame(id: u64) -> Vec<u8> {
    let mut frame = Vec::new();
    Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(id), &mut frame).unwrap();
    frame
}

/// A frame header: length, api key, version, correlation id, flags, error,
/// body length.
fn header(frame_bytes: u32, api_key: u16, correlation_id: u64, body_bytes: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&frame_bytes.to_le_bytes());
    bytes.extend_from_slice(&api_key.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&correlation_id.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&body_bytes.to_le_bytes());
    bytes
}

async fn assert_good_connection_answers(good: &Connection, round: &str) {
    let bytes = good.call(&Request::ListQueues(ListQueuesRequest {})).await;
    let bytes = bytes.unwrap_or_else(|error| panic!("good connection after {round}: {error}"));
    let Response::ListQueues(list) = bytes.response().unwrap() else { panic!("not a list") };
    assert_eq!(list.queues.len(), 1, "after {round}");
}

// Goal: garbage, a malformed body, a truncated frame and an oversized frame
// each close the connection that sent them (after an error reply where the
// protocol promises one) while another connection keeps getting answers.
// Method: one good pipelined connection; four raw sockets with bad bytes, a
// valid request queued behind the bad frame (it must never be answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_connection() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client).create_queue("steady", test_queue_config(1, 5_000, 5)).await.unwrap();
    let good = Connection::connect(&broker.addr(), ConnectionConfig::default()).await.unwrap();
    assert_good_connection_answers(&good, "start").await;

    // 1. Garbage: a plausible length, then a header with reserved flags and
    //    an error code set. MALFORMED_FRAME, closed.
    let mut garbage = header(32, 18, 77, 8);
    garbage[16] = 0xee;
    garbage[18] = 0x33;
    garbage.extend_from_slice(&[0xab; 8]);
    garbage.extend_from_slice(&list_queues_frame(78));
    // 2. A well-framed Enqueue whose body stops after the queue name (body
    //    malformed: truncated). MALFORMED_FRAME, closed.
    let mut short_body = header(32, 1, 91, 8);
    short_body.extend_from_slice(&[0x05, 0x00, b's', b't', b'e', b'a', b'd', 0x00]);
    short_body.extend_from_slice(&list_queues_frame(92));
    // 3. Truncated: a header announcing 4 KiB, 100 bytes, then our side
    //    closes. The broker must not wait for the rest forever.
    let mut truncated = header(4096, 18, 93, 4096 - 24);
    truncated.extend_from_slice(&[0u8; 76]);
    // 4. Oversized: 64 MiB announced. FRAME_TOO_LARGE on id 0, closed, and
    //    the broker must not try to buffer it.
    let mut oversized = header(64 << 20, 1, 94, (64 << 20) - 24);
    oversized.extend_from_slice(&[0u8; 1000]);
    oversized.extend_from_slice(&list_queues_frame(95));

    // Expected: the one error reply as (correlation id, echoed key, code).
    let cases: [BadCase; 4] = [
        ("garbage", garbage, false, Some((77, 18, ErrorCode::MalformedFrame))),
        ("short body", short_body, false, Some((91, 1, ErrorCode::MalformedFrame))),
        ("truncated", truncated, true, None),
        ("oversized", oversized, false, Some((0, 1, ErrorCode::FrameTooLarge))),
    ];
    for (name, bytes, half_close, expected) in cases {
        let mut bad = TcpStream::connect(broker.addr()).unwrap();
        bad.write_all(&bytes).unwrap();
        if half_close {
            bad.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let received = read_until_closed(&mut bad);
        let replies = error_replies(&received);
        match expected {
            Some((id, key, code)) => {
                assert_eq!(replies, vec![(id, key, code)], "{name}: only the error reply");
                // A client's codec can read it (the echoed key is a real one).
                let mut decoder = FrameDecoder::new();
                decoder.feed(&received).unwrap();
                let frame = decoder.next_frame().unwrap().expect("a whole reply");
                let reply = Response::decode(&frame).unwrap();
                assert!(matches!(reply.reply, Reply::Err(ref e) if e.code == code), "{name}");
            }
            None => assert!(replies.is_empty(), "{name}: {replies:?}"),
        }
        assert_good_connection_answers(&good, name).await;
    }

    // An unknown api key is answered and the connection stays open.
    let mut unknown = header(24, 999, 55, 0);
    unknown.extend_from_slice(&list_queues_frame(56));
    let mut open = TcpStream::connect(broker.addr()).unwrap();
    open.write_all(&unknown).unwrap();
    open.set_read_timeout(Some(CLOSE_TIMEOUT)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    // The unknown key's reply (24 + error body) and the list's reply.
    while frames_in(&received) < 2 {
        let count = open.read(&mut buffer).unwrap();
        assert!(count > 0, "connection closed after an unknown api key");
        received.extend_from_slice(&buffer[..count]);
    }
    let mut replies = error_replies(&received);
    replies.sort_by_key(|(id, _, _)| *id);
    assert_eq!(replies, vec![(55, 999, ErrorCode::UnknownApi), (56, 18, ErrorCode::None)]);
}

// Goal: two brokers never share a data directory; the second says why and
// who holds it, and the first keeps serving. Method: start a second spoold
// on the first one's directory (other ports) and read its exit and log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_broker_on_the_same_data_dir_fails_clearly() {
    let broker = Spoold::start(1);
    let (status, log) = broker.run_second_on_same_dir(Duration::from_secs(20));
    let status = status.unwrap_or_else(|| panic!("second spoold kept running:\n{log}"));
    assert!(!status.success(), "second spoold exited 0:\n{log}");
    assert!(log.contains("locked by another spoold"), "unclear message:\n{log}");
    let pid = broker.pid().unwrap().to_string();
    assert!(log.contains(&pid), "the message names the holder's pid {pid}:\n{log}");
    let client = broker.client().await;
    assert!(Admin::new(client).list_queues().await.unwrap().is_empty());
}
