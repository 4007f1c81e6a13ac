//! The streaming frame decoder: reassembly at every split point, early
//! refusal of oversized frames, skipping of unknown apis, poisoning on
//! framing errors, and no panics on garbage or truncated input.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::proto::limits::{DECODER_BUFFER_BYTES_MAX, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use spool_wire::proto::{
    decode_frame, AckRequest, ApiKey, ClaimRequest, CorrelationId, DeliveryToken, EnqueueRequest,
    ErrorResponse, FrameDecoder, ListQueuesRequest, NodeAddress, PartitionId, ProtoError, Reply,
    Request, Response, WorkerId,
};
use spool_wire::ErrorCode;

/// Three frames of different shapes, back to back.
fn three_frames() -> Vec<u8> {
    let batch = vec![0xAB; 200];
    let mut bytes = Vec::new();
    Request::Enqueue(EnqueueRequest { queue: "orders", partition: PartitionId(3), batch: &batch })
        .encode(CorrelationId(1), &mut bytes)
        .unwrap();
    Request::Claim(ClaimRequest {
        queue: "orders",
        partition: PartitionId(3),
        worker: WorkerId(9),
        credits: 16,
        max_bytes: 65536,
        lease_ms: 30_000,
        wait_ms: 500,
        subscription: "",
    })
    .encode(CorrelationId(2), &mut bytes)
    .unwrap();
    Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(3), &mut bytes).unwrap();
    bytes
}

/// Decodes every frame the decoder holds, returning correlation ids and
/// checking each body decodes.
fn drain(decoder: &mut FrameDecoder, seen: &mut Vec<u64>) {
    while let Some(frame) = decoder.next_frame().unwrap() {
        Request::decode(&frame).unwrap();
        assert_eq!(frame.body.as_ptr() as usize % 8, 0, "frames stay 8-aligned");
        seen.push(frame.header.correlation_id.0);
    }
}

// Goal: frames split at any byte boundary reassemble; method: for every split
// point of a three-frame stream, feed two halves and drain after each.
#[test]
fn split_at_every_boundary() {
    let bytes = three_frames();
    for split in 0..=bytes.len() {
        let mut decoder = FrameDecoder::new();
        let mut seen = Vec::new();
        decoder.feed(&bytes[..split]).unwrap();
        drain(&mut decoder, &mut seen);
        decoder.feed(&bytes[split..]).unwrap();
        drain(&mut decoder, &mut seen);
        assert_eq!(seen, vec![1, 2, 3], "split at {split}");
        assert_eq!(decoder.buffered_bytes(), 0);
    }
}

// Goal: byte-at-a-time delivery through the read_buf/advance path works;
// method: copy one byte per "read" into read_buf.
#[test]
fn one_byte_reads_through_read_buf() {
    let bytes = three_frames();
    let mut decoder = FrameDecoder::new();
    let mut seen = Vec::new();
    for &byte in &bytes {
        let buf = decoder.read_buf().unwrap();
        assert!(!buf.is_empty());
        buf[0] = byte;
        decoder.advance(1);
        drain(&mut decoder, &mut seen);
    }
    assert_eq!(seen, vec![1, 2, 3]);
}

// Goal: an oversized length is refused from the 4-byte prefix alone, before
// any body exists, and the decoder then stays closed; method: feed only a
// length prefix of MAX_FRAME_BYTES + 8.
#[test]
fn oversized_rejected_before_body() {
    let mut decoder = FrameDecoder::new();
    decoder.feed(&((MAX_FRAME_BYTES + 8) as u32).to_le_bytes()).unwrap();
    let error = decoder.next_frame().unwrap_err();
    assert_eq!(
        error,
        ProtoError::FrameTooLarge {
            len_bytes: (MAX_FRAME_BYTES + 8) as u64,
            max_bytes: MAX_FRAME_BYTES as u64
        }
    );
    assert_eq!(error.code(), ErrorCode::FrameTooLarge);
    assert!(error.closes_connection());
    assert_eq!(decoder.buffered_bytes(), 4, "nothing beyond the prefix was needed");
    assert_eq!(decoder.next_frame().unwrap_err(), ProtoError::DecoderPoisoned);
    assert_eq!(decoder.feed(&[0; 8]).unwrap_err(), ProtoError::DecoderPoisoned);
    assert!(decoder.read_buf().is_err());
}

// Goal: a per-connection smaller limit applies too; method: a 4 KiB-limit
// decoder refuses an 8 KiB frame's prefix.
#[test]
fn custom_limit() {
    let mut decoder = FrameDecoder::with_max_frame_bytes(4096);
    decoder.feed(&8192u32.to_le_bytes()).unwrap();
    assert!(matches!(decoder.next_frame(), Err(ProtoError::FrameTooLarge { .. })));
}

// Goal: an unknown api key or unsupported version is reported with its
// correlation id, the frame is skipped, and the next frame still decodes;
// method: patch the first frame's api key / version, append a valid frame.
#[test]
fn unknown_api_and_version_are_skipped() {
    for (at, value, expected) in [
        (4usize, 999u16, ProtoError::UnknownApi { api_key: 999, correlation_id: 41 }),
        (
            6usize,
            7u16,
            ProtoError::UnsupportedVersion { api_key: 4, version: 7, correlation_id: 41 },
        ),
    ] {
        let mut bytes = Vec::new();
        Request::Ack(AckRequest { tokens: vec![DeliveryToken([1; 64])] })
            .encode(CorrelationId(41), &mut bytes)
            .unwrap();
        bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
        Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(42), &mut bytes).unwrap();
        let mut decoder = FrameDecoder::new();
        decoder.feed(&bytes).unwrap();
        let error = decoder.next_frame().unwrap_err();
        assert_eq!(error, expected);
        assert!(!error.closes_connection());
        let frame = decoder.next_frame().unwrap().unwrap();
        assert_eq!(frame.header.correlation_id, CorrelationId(42));
    }
}

// Goal: header corruption that desynchronises the stream poisons the
// decoder; method: reserved flag, error code in a request, bad body length,
// misaligned frame length, nonzero padding.
#[test]
fn framing_errors_poison() {
    let mut valid = Vec::new();
    Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(5), &mut valid).unwrap();
    let patches: Vec<(usize, Vec<u8>)> = vec![
        (16, 0x8000u16.to_le_bytes().to_vec()),
        (18, 5u16.to_le_bytes().to_vec()),
        (20, 999u32.to_le_bytes().to_vec()),
        (0, 25u32.to_le_bytes().to_vec()),
        (0, 8u32.to_le_bytes().to_vec()),
    ];
    for (at, patch) in patches {
        let mut bytes = valid.clone();
        bytes[at..at + patch.len()].copy_from_slice(&patch);
        let mut decoder = FrameDecoder::new();
        decoder.feed(&bytes).unwrap();
        let error = decoder.next_frame().unwrap_err();
        assert!(error.closes_connection(), "{error:?}");
        assert_eq!(error.code(), ErrorCode::MalformedFrame);
        assert_eq!(decoder.next_frame().unwrap_err(), ProtoError::DecoderPoisoned);
    }
    // Nonzero padding: ListQueues' empty table leaves padding in the frame.
    let body_bytes = u32::from_le_bytes(valid[20..24].try_into().unwrap()) as usize;
    assert!(FRAME_HEADER_BYTES + body_bytes < valid.len(), "this frame has padding");
    let mut bytes = valid.clone();
    *bytes.last_mut().unwrap() = 1;
    let mut decoder = FrameDecoder::new();
    decoder.feed(&bytes).unwrap();
    assert!(matches!(decoder.next_frame(), Err(ProtoError::NonzeroReserved { .. })));
}

// Goal: every strict prefix of a frame is "need more" for the stream decoder
// and Truncated for the one-shot decoder; method: all prefixes.
#[test]
fn truncated_frames() {
    let bytes = three_frames();
    let first_len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    for len in 0..first_len {
        let mut decoder = FrameDecoder::new();
        decoder.feed(&bytes[..len]).unwrap();
        assert!(decoder.next_frame().unwrap().is_none(), "prefix {len}");
        assert!(matches!(decode_frame(&bytes[..len]), Err(ProtoError::Truncated { .. })));
    }
    assert!(decode_frame(&bytes[..first_len]).is_ok());
    assert!(matches!(decode_frame(&bytes), Err(ProtoError::TrailingBytes { .. })));
}

// Goal: a caller that never drains frames cannot grow the buffer past its
// bound; method: feed until DecoderFull.
#[test]
fn buffer_is_bounded() {
    let mut decoder = FrameDecoder::new();
    let chunk = vec![0u8; 1 << 20];
    let mut fed = 0;
    loop {
        match decoder.feed(&chunk) {
            Ok(()) => fed += chunk.len(),
            Err(ProtoError::DecoderFull { .. }) => break,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(fed <= DECODER_BUFFER_BYTES_MAX);
    assert!(fed + chunk.len() > DECODER_BUFFER_BYTES_MAX);
}

// Goal: error responses (with and without an owner) round trip and can
// answer a key we do not know; method: encode, decode, compare.
#[test]
fn error_responses() {
    let not_owner = ErrorResponse {
        code: ErrorCode::NotOwner,
        message: "partition 3 lives elsewhere".into(),
        owner: Some(NodeAddress { host: "10.0.0.7".into(), port: 7102 }),
    };
    let mut bytes = Vec::new();
    not_owner.encode(CorrelationId(77), 2, 0, &mut bytes).unwrap();
    let frame = decode_frame(&bytes).unwrap();
    assert_eq!(frame.header.error_code, ErrorCode::NotOwner);
    let reply = Response::decode(&frame).unwrap();
    assert_eq!(reply.correlation_id, CorrelationId(77));
    assert_eq!(reply.reply, Reply::Err(not_owner));

    let long = ErrorResponse::new(ErrorCode::Internal, "é".repeat(2000));
    let mut bytes = Vec::new();
    long.encode(CorrelationId(1), 1, 0, &mut bytes).unwrap();
    let Reply::Err(decoded) = Response::decode(&decode_frame(&bytes).unwrap()).unwrap().reply
    else {
        panic!()
    };
    assert!(decoded.message.len() <= 1024 && decoded.message.starts_with('é'));

    // Unknown api key: the server can still answer; the encoder writes it raw.
    let mut bytes = Vec::new();
    ErrorResponse::from_proto_error(&ProtoError::UnknownApi { api_key: 999, correlation_id: 5 })
        .encode(CorrelationId(5), 999, 0, &mut bytes)
        .unwrap();
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 999);
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), ErrorCode::UnknownApi.as_u16());

    // Correlation id 0 is reserved for connection-level errors.
    let list = Request::ListQueues(ListQueuesRequest {});
    assert!(list.encode(CorrelationId::CONNECTION, &mut Vec::new()).is_err());

    let none = ErrorResponse::new(ErrorCode::None, "");
    assert!(none.encode(CorrelationId(1), 1, 0, &mut Vec::new()).is_err());
}

// Goal: a response is not accepted as a request and vice versa; method: swap.
#[test]
fn direction_is_checked() {
    let mut bytes = Vec::new();
    Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(1), &mut bytes).unwrap();
    assert!(matches!(
        Response::decode(&decode_frame(&bytes).unwrap()),
        Err(ProtoError::WrongDirection { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // Goal: random bytes in random chunks never panic the decoder or the body
    // decoders; method: feed, drain, decode every frame both ways.
    #[test]
    fn garbage_never_panics(chunks in vec(vec(any::<u8>(), 0..64), 0..16)) {
        let mut decoder = FrameDecoder::new();
        for chunk in &chunks {
            if decoder.feed(chunk).is_err() {
                break;
            }
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => {
                        let _ = Request::decode(&frame);
                        let _ = Response::decode(&frame);
                    }
                    Ok(None) => break,
                    Err(error) if error.closes_connection() => break,
                    Err(_) => continue,
                }
            }
        }
    }

    // Goal: valid headers over corrupted bodies never panic and never decode
    // to something that fails its own validation; method: take valid frames
    // of every data-path and control shape, flip random bytes in the body.
    #[test]
    fn corrupted_bodies_never_panic(flips in vec((any::<usize>(), any::<u8>()), 1..8),
                                    which in 0usize..3) {
        let stream = three_frames();
        let mut frames = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let len = u32::from_le_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
            frames.push(stream[at..at + len].to_vec());
            at += len;
        }
        let mut frame = frames[which].clone();
        let body_bytes = u32::from_le_bytes(frame[20..24].try_into().unwrap()) as usize;
        prop_assume!(body_bytes > 0);
        for (position, value) in flips {
            frame[FRAME_HEADER_BYTES + position % body_bytes] = value;
        }
        let decoded = decode_frame(&frame).unwrap();
        if let Ok(request) = Request::decode(&decoded) {
            prop_assert!(request.validate().is_ok());
        }
    }
}

// Goal: a frame's api key can be read from its first bytes, before the frame
// is whole, and only once they are there. Method: every prefix of an encoded
// ListQueues request.
#[test]
fn api_key_peeks_from_the_first_bytes() {
    let mut bytes = Vec::new();
    Request::ListQueues(ListQueuesRequest {}).encode(CorrelationId(7), &mut bytes).unwrap();
    let key = ApiKey::ListQueues.as_u16();
    for cut in 0..bytes.len() {
        let expected = if cut >= 6 { Some(key) } else { None };
        assert_eq!(spool_wire::proto::peek_api_key(&bytes[..cut]), expected, "cut {cut}");
    }
}
