//! Session (api key 9): round trips of open, heartbeat and close and their
//! answer, the bytes of each (golden), the bounds the decoder enforces, and
//! the two session codes reaching only Session requests.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use spool_wire::proto::limits::{
    SESSION_MEMBER_BYTES_MAX, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};
use spool_wire::proto::{
    ApiKey, CorrelationId, ErrorResponse, FrameDecoder, ProtoError, Reply, Request, Response,
    SessionRequest, SessionResponse,
};
use spool_wire::ErrorCode;

fn encode(request: &Request<'_>) -> Vec<u8> {
    let mut bytes = Vec::new();
    request.encode(CorrelationId(7), &mut bytes).unwrap();
    bytes
}

fn decode_request(bytes: &[u8]) -> Result<Request<'static>, ProtoError> {
    let mut decoder = FrameDecoder::new();
    decoder.feed(bytes).unwrap();
    let frame = decoder.next_frame().unwrap().expect("one whole frame");
    // Leak the frame's bytes so the borrowed request outlives the decoder.
    let body: &'static [u8] = Box::leak(frame.body.to_vec().into_boxed_slice());
    let frame = spool_wire::proto::Frame { header: frame.header, body };
    Request::decode(&frame)
}

fn open(member: &'static str, timeout_ms: u32) -> Request<'static> {
    Request::Session(SessionRequest::Open { queue: "jobs", subscription: "", member, timeout_ms })
}

// Goal: every session request and the answer survive encode → decode.
// Method: a round trip of each through the frame decoder.
#[test]
fn session_frames_round_trip() {
    let requests = [
        open("worker-1", 2_000),
        Request::Session(SessionRequest::Open {
            queue: "jobs",
            subscription: "audit",
            member: "m",
            timeout_ms: SESSION_TIMEOUT_MS_MAX,
        }),
        Request::Session(SessionRequest::Heartbeat { session_id: 42 }),
        Request::Session(SessionRequest::Close { session_id: u64::MAX }),
    ];
    for request in requests {
        assert_eq!(request.api_key(), ApiKey::Session);
        assert_eq!(decode_request(&encode(&request)).unwrap(), request);
    }
    let answer = Response::Session(SessionResponse { session_id: 3, epoch: 9, timeout_ms: 2_000 });
    let mut bytes = Vec::new();
    answer.encode(CorrelationId(7), &mut bytes).unwrap();
    assert_eq!(answer.encoded_len_hint(), bytes.len());
    let mut decoder = FrameDecoder::new();
    decoder.feed(&bytes).unwrap();
    let frame = decoder.next_frame().unwrap().unwrap();
    let reply = Response::decode(&frame).unwrap();
    assert_eq!(reply.reply, Reply::Ok(answer));
}

// Goal: the layouts are what docs/design/protocol.md says, byte for byte
// (a change breaks other languages' clients). Method: golden bytes.
#[test]
fn session_golden_bytes() {
    let bytes = encode(&open("w1", 2_000));
    // Header: length 56, key 9, version 0, id 7, flags 0, code 0, body 28.
    let mut golden = Vec::new();
    golden.extend_from_slice(&56u32.to_le_bytes());
    golden.extend_from_slice(&9u16.to_le_bytes());
    golden.extend_from_slice(&0u16.to_le_bytes());
    golden.extend_from_slice(&7u64.to_le_bytes());
    golden.extend_from_slice(&[0, 0, 0, 0]);
    golden.extend_from_slice(&28u32.to_le_bytes());
    golden.extend_from_slice(&[1, 0, 0, 0]);
    golden.extend_from_slice(&2_000u32.to_le_bytes());
    golden.extend_from_slice(&0u64.to_le_bytes());
    golden.extend_from_slice(&[4, 0, b'j', b'o', b'b', b's', 0, 0, 2, 0, b'w', b'1']);
    golden.extend_from_slice(&[0; 4]);
    assert_eq!(bytes, golden);

    let heartbeat = encode(&Request::Session(SessionRequest::Heartbeat { session_id: 5 }));
    assert_eq!(
        &heartbeat[24..],
        &[2, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    let close = encode(&Request::Session(SessionRequest::Close { session_id: 5 }));
    assert_eq!(close[24], 3);

    let mut answer = Vec::new();
    Response::Session(SessionResponse { session_id: 5, epoch: 6, timeout_ms: 700 })
        .encode(CorrelationId(7), &mut answer)
        .unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&5u64.to_le_bytes());
    body.extend_from_slice(&6u64.to_le_bytes());
    body.extend_from_slice(&700u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(&answer[24..], &body[..]);
    assert_eq!(answer.len(), 48);
}

// Goal: every bound is enforced by name on both sides. Method: encode
// refuses; patched bytes are refused by the decoder.
#[test]
fn session_bounds() {
    let long = "m".repeat(SESSION_MEMBER_BYTES_MAX + 1);
    let long: &'static str = Box::leak(long.into_boxed_str());
    let mut out = Vec::new();
    for bad in [
        open("", 2_000),
        open(long, 2_000),
        open("w", SESSION_TIMEOUT_MS_MIN - 1),
        open("w", SESSION_TIMEOUT_MS_MAX + 1),
        Request::Session(SessionRequest::Heartbeat { session_id: 0 }),
        Request::Session(SessionRequest::Open {
            queue: "bad name",
            subscription: "",
            member: "w",
            timeout_ms: 2_000,
        }),
    ] {
        let error = bad.encode(CorrelationId(7), &mut out).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{bad:?}: {error}");
    }
    assert!(out.is_empty());

    // An open whose timeout the decoder reads below the minimum.
    let mut bytes = encode(&open("w1", 2_000));
    bytes[28..32].copy_from_slice(&(SESSION_TIMEOUT_MS_MIN - 1).to_le_bytes());
    assert!(matches!(
        decode_request(&bytes),
        Err(ProtoError::OutOfRange { field: "timeout_ms", .. })
    ));
    // An unknown op; reserved bytes set; a heartbeat carrying a queue.
    let mut bytes = encode(&open("w1", 2_000));
    bytes[24] = 4;
    assert!(matches!(decode_request(&bytes), Err(ProtoError::UnknownEnumValue { .. })));
    let mut bytes = encode(&open("w1", 2_000));
    bytes[25] = 1;
    assert!(matches!(decode_request(&bytes), Err(ProtoError::NonzeroReserved { .. })));
    let mut bytes = encode(&open("w1", 2_000));
    bytes[24] = 2;
    assert!(matches!(decode_request(&bytes), Err(ProtoError::Inconsistent(_))));
}

// Goal: the two session codes reach Session answers only; every other key
// gets INVALID_ARGUMENT in their place (an older client never sees a code
// it cannot name). Method: `answerable` over every key, and an encoded
// error frame.
#[test]
fn session_codes_only_for_session() {
    for code in [ErrorCode::SessionNotFound, ErrorCode::SessionFenced] {
        for key in ApiKey::ALL {
            let sent = key.answerable(key.max_version(), code);
            if key == ApiKey::Session {
                assert_eq!(sent, code);
            } else {
                assert_eq!(sent, ErrorCode::InvalidArgument, "{key:?}");
            }
        }
        let mut bytes = Vec::new();
        ErrorResponse::new(code, "gone").encode(CorrelationId(3), 9, 0, &mut bytes).unwrap();
        let mut decoder = FrameDecoder::new();
        decoder.feed(&bytes).unwrap();
        let frame = decoder.next_frame().unwrap().unwrap();
        let Reply::Err(error) = Response::decode(&frame).unwrap().reply else { panic!() };
        assert_eq!(error.code, code);
    }
    assert!(ApiKey::Session.is_data_path());
    assert_eq!(ApiKey::from_u16(9), Some(ApiKey::Session));
    assert!(!ApiKey::Session.supports(1));
}
