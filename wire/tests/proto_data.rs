//! Round trips of the data-path messages (Enqueue, Claim, Extend, Ack,
//! Release, CancelClaim, Ping) through encode → FrameDecoder → decode, with proptest, plus the
//! bounds each decoder enforces.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::proto::limits::{
    ACK_TOKENS_MAX, CLAIM_BYTES_MAX, CLAIM_CREDITS_MAX, CLAIM_WAIT_MS_MAX, LEASE_MS_MAX,
    RELEASE_DELAY_MS_MAX, RELEASE_REASON_BYTES_MAX,
};
use spool_wire::proto::{
    AckRequest, AckResponse, ApiKey, CancelClaimRequest, CancelClaimResponse, CancelOutcome,
    ClaimRequest, ClaimResponse, CorrelationId, Delivery, DeliveryToken, EnqueueRequest,
    EnqueueResponse, ExtendRequest, ExtendResponse, Frame, FrameDecoder, Generation, Offset,
    PartitionId, PingRequest, PingResponse, ProtoError, RecordOutcome, ReleaseRequest,
    ReleaseResponse, Reply, Request, Response, WorkerId,
};
use spool_wire::ErrorCode;

/// Encodes `request`, pushes it through a decoder, and hands the frame to `check`.
fn through_decoder(bytes: &[u8], check: impl FnOnce(&Frame<'_>)) {
    let mut decoder = FrameDecoder::new();
    decoder.feed(bytes).unwrap();
    let frame = decoder.next_frame().unwrap().expect("one whole frame");
    check(&frame);
}

fn request_round_trip(request: &Request<'_>, correlation: u64) {
    let mut bytes = Vec::new();
    request.encode(CorrelationId(correlation), &mut bytes).unwrap();
    assert_eq!(bytes.len() % 8, 0);
    through_decoder(&bytes, |frame| {
        assert_eq!(frame.header.correlation_id, CorrelationId(correlation));
        assert!(!frame.header.is_response);
        assert_eq!(&Request::decode(frame).unwrap(), request);
    });
}

fn response_round_trip(response: &Response<'_>, correlation: u64) {
    let mut bytes = Vec::new();
    response.encode(CorrelationId(correlation), &mut bytes).unwrap();
    through_decoder(&bytes, |frame| {
        let reply = Response::decode(frame).unwrap();
        assert_eq!(reply.correlation_id, CorrelationId(correlation));
        assert_eq!(reply.api_key, response.api_key());
        assert_eq!(reply.reply, Reply::Ok(response.clone()));
    });
}

fn queue_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,128}"
}

fn token() -> impl Strategy<Value = DeliveryToken> {
    vec(any::<u8>(), 64).prop_map(|bytes| {
        let mut token = [0u8; 64];
        token.copy_from_slice(&bytes);
        DeliveryToken(token)
    })
}

fn outcome() -> impl Strategy<Value = RecordOutcome> {
    prop_oneof![
        any::<u64>().prop_map(|offset| RecordOutcome::Appended { offset: Offset(offset) }),
        any::<u64>()
            .prop_map(|offset| RecordOutcome::Duplicate { original_offset: Offset(offset) }),
        (1u16..24)
            .prop_map(|code| RecordOutcome::Rejected { code: ErrorCode::from_u16(code).unwrap() }),
    ]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    (0u16..24).prop_map(|code| ErrorCode::from_u16(code).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Goal: Enqueue requests survive the round trip and the batch is borrowed
    // 8-aligned from the decoder's buffer; method: random names, partitions, batches.
    #[test]
    fn enqueue_request(queue in queue_name(), partition: u32, batch in vec(any::<u8>(), 64..4096),
                       correlation in 1..u64::MAX) {
        let request = Request::Enqueue(EnqueueRequest {
            queue: &queue, partition: PartitionId(partition), batch: &batch,
        });
        request_round_trip(&request, correlation);
        let mut bytes = Vec::new();
        request.encode(CorrelationId(correlation), &mut bytes).unwrap();
        through_decoder(&bytes, |frame| {
            let Request::Enqueue(decoded) = Request::decode(frame).unwrap() else { panic!() };
            assert_eq!(decoded.batch.as_ptr() as usize % 8, 0);
            // Zero-copy: the slice points into the frame body, not a copy.
            let body = frame.body.as_ptr_range();
            assert!(body.contains(&decoded.batch.as_ptr()));
        });
    }

    // Goal: Enqueue responses with every outcome kind round trip; method: random outcomes.
    #[test]
    fn enqueue_response(base: u64, records in vec(outcome(), 0..200), correlation: u64) {
        response_round_trip(
            &Response::Enqueue(EnqueueResponse { base_offset: Offset(base), records }),
            correlation,
        );
    }

    // Goal: Claim requests round trip across their whole valid range; method: random fields.
    #[test]
    fn claim_request(queue in queue_name(), partition: u32, worker: u64,
                     credits in 1..=CLAIM_CREDITS_MAX, max_bytes in 1..=CLAIM_BYTES_MAX,
                     lease_ms in 1..=LEASE_MS_MAX, wait_ms in 0..=CLAIM_WAIT_MS_MAX,
                     subscription in "([A-Za-z0-9._-]{1,128})?") {
        request_round_trip(&Request::Claim(ClaimRequest {
            queue: &queue, partition: PartitionId(partition), worker: WorkerId(worker),
            credits, max_bytes, lease_ms, wait_ms, subscription: &subscription,
        }), 7);
    }

    // Goal: Claim responses round trip and every record is borrowed 8-aligned;
    // method: random deliveries with odd-sized records.
    #[test]
    fn claim_response(deadline: u64,
                      parts in vec((token(), any::<u32>(), any::<u64>(), any::<u32>(), any::<u64>(),
                                    vec(any::<u8>(), 0..300)), 0..40)) {
        let deliveries: Vec<Delivery<'_>> = parts.iter().map(|(token, partition, offset, attempt, generation, record)| Delivery {
            token: *token, partition: PartitionId(*partition), offset: Offset(*offset), attempt: *attempt,
            generation: Generation(*generation), record,
        }).collect();
        let response = Response::Claim(ClaimResponse { lease_deadline_ms: deadline, deliveries });
        response_round_trip(&response, 9);
        let mut bytes = Vec::new();
        response.encode(CorrelationId(9), &mut bytes).unwrap();
        through_decoder(&bytes, |frame| {
            let Reply::Ok(Response::Claim(decoded)) = Response::decode(frame).unwrap().reply
                else { panic!() };
            for delivery in &decoded.deliveries {
                assert_eq!(delivery.record.as_ptr() as usize % 8, 0);
            }
        });
    }

    // Goal: Extend request/response round trip; method: random tokens and leases.
    #[test]
    fn extend(token in token(), lease_ms in 1..=LEASE_MS_MAX, deadline: u64) {
        request_round_trip(&Request::Extend(ExtendRequest { token, lease_ms }), 1);
        response_round_trip(&Response::Extend(ExtendResponse { lease_deadline_ms: deadline }), 1);
    }

    // Goal: Ack request/response round trip; method: random token lists and result codes.
    #[test]
    fn ack(tokens in vec(token(), 1..100), results in vec(error_code(), 0..100)) {
        request_round_trip(&Request::Ack(AckRequest { tokens }), 2);
        response_round_trip(&Response::Ack(AckResponse { results }), 2);
    }

    // Goal: `Request::check` (the broker's first pass, which builds no token
    // list) accepts and refuses exactly what `Request::decode` does, with
    // the same error. Method: an encoded Ack's body cut short, extended or
    // with a byte changed at random, checked both ways.
    #[test]
    fn ack_check_agrees_with_decode(
        tokens in vec(token(), 1..20),
        cut in 0usize..2_000,
        extra in 0usize..24,
        flip in (0usize..2_000, any::<u8>()),
    ) {
        let mut bytes = Vec::new();
        Request::Ack(AckRequest { tokens }).encode(CorrelationId(3), &mut bytes).unwrap();
        through_decoder(&bytes, |frame| {
            let mut body = frame.body.to_vec();
            let at = flip.0 % body.len();
            body[at] ^= flip.1;
            body.truncate(body.len().min(cut.max(1)));
            body.resize(body.len() + extra, 0);
            let changed = Frame { header: frame.header, body: &body };
            let decoded = Request::decode(&changed).map(drop);
            assert_eq!(Request::check(&changed), decoded);
            assert_eq!(Request::check(frame), Ok(()));
        });
    }

    // Goal: Release request/response round trip, including multi-byte UTF-8
    // reasons; method: random reasons cut to the byte limit.
    #[test]
    fn release(token in token(), delay_ms in 0..=RELEASE_DELAY_MS_MAX, reason in ".{0,100}",
               not_before: u64) {
        prop_assume!(reason.len() <= RELEASE_REASON_BYTES_MAX);
        request_round_trip(&Request::Release(ReleaseRequest { token, delay_ms, reason: &reason }), 3);
        response_round_trip(&Response::Release(ReleaseResponse { not_before_ms: not_before }), 3);
    }

    // Goal: CancelClaim request/response round trip under key 6; method:
    // random claim ids (never 0) and both outcomes.
    #[test]
    fn cancel_claim(claim in 1u64.., cancelled: bool, correlation in 1u64..) {
        let request = Request::CancelClaim(CancelClaimRequest { claim: CorrelationId(claim) });
        assert_eq!(request.api_key(), ApiKey::CancelClaim);
        request_round_trip(&request, correlation);
        let outcome = if cancelled { CancelOutcome::Cancelled } else { CancelOutcome::NotPending };
        response_round_trip(&Response::CancelClaim(CancelClaimResponse { outcome }), correlation);
    }
}

fn claim(credits: u32, lease_ms: u32, wait_ms: u32, max_bytes: u32) -> Request<'static> {
    Request::Claim(ClaimRequest {
        queue: "jobs",
        partition: PartitionId(0),
        worker: WorkerId(1),
        credits,
        max_bytes,
        lease_ms,
        wait_ms,
        subscription: "",
    })
}

// Goal: out-of-range claim fields are refused at encode time with a typed,
// INVALID_ARGUMENT error; method: one field at each edge.
#[test]
fn claim_bounds() {
    let mut out = Vec::new();
    for request in [
        claim(0, 1000, 0, 1),
        claim(CLAIM_CREDITS_MAX + 1, 1000, 0, 1),
        claim(1, 0, 0, 1),
        claim(1, LEASE_MS_MAX + 1, 0, 1),
        claim(1, 1000, CLAIM_WAIT_MS_MAX + 1, 1),
        claim(1, 1000, 0, 0),
        claim(1, 1000, 0, CLAIM_BYTES_MAX + 1),
    ] {
        let error = request.encode(CorrelationId(1), &mut out).unwrap_err();
        assert!(matches!(error, ProtoError::OutOfRange { .. }), "{error:?}");
        assert_eq!(error.code(), ErrorCode::InvalidArgument);
        assert!(!error.closes_connection());
        assert!(out.is_empty(), "a refused encode appends nothing");
    }
    claim(CLAIM_CREDITS_MAX, LEASE_MS_MAX, CLAIM_WAIT_MS_MAX, CLAIM_BYTES_MAX)
        .encode(CorrelationId(1), &mut out)
        .unwrap();
}

// Goal: the decoder enforces the same bounds as the encoder even when a peer
// bypasses our encoder; method: encode a valid claim, patch credits to 0 in
// the bytes, decode.
#[test]
fn claim_bounds_enforced_on_decode() {
    let mut bytes = Vec::new();
    claim(5, 1000, 0, 1).encode(CorrelationId(1), &mut bytes).unwrap();
    // Body: u16 len, "jobs", pad to 8, u32 partition, u32 credits.
    let credits_at = 24 + 8 + 4;
    assert_eq!(&bytes[credits_at..credits_at + 4], &5u32.to_le_bytes());
    bytes[credits_at..credits_at + 4].copy_from_slice(&0u32.to_le_bytes());
    through_decoder(&bytes, |frame| {
        let error = Request::decode(frame).unwrap_err();
        assert_eq!(error, ProtoError::OutOfRange { field: "credits", value: 0, min: 1, max: 1024 });
    });
}

// Goal: queue names are checked for charset and length on both sides;
// method: bad names at encode, a patched name at decode.
#[test]
fn queue_name_rules() {
    let batch = [0u8; 64];
    let mut out = Vec::new();
    let long = "q".repeat(129);
    for name in ["", "has space", "ünï", "a/b", long.as_str()] {
        let request = Request::Enqueue(EnqueueRequest {
            queue: name,
            partition: PartitionId(0),
            batch: &batch,
        });
        let error = request.encode(CorrelationId(1), &mut out).unwrap_err();
        assert!(matches!(error, ProtoError::InvalidQueueName { .. }), "{name}: {error:?}");
    }
    let mut bytes = Vec::new();
    Request::Enqueue(EnqueueRequest { queue: "abc", partition: PartitionId(0), batch: &batch })
        .encode(CorrelationId(1), &mut bytes)
        .unwrap();
    bytes[24 + 2] = b' ';
    through_decoder(&bytes, |frame| {
        assert!(matches!(Request::decode(frame), Err(ProtoError::InvalidQueueName { .. })));
    });
}

// Goal: batch size bounds; method: a too-short batch and a too-large one at
// encode, and a batch length field above the limit at decode.
#[test]
fn batch_bounds() {
    let mut out = Vec::new();
    let short = [0u8; 63];
    let error =
        Request::Enqueue(EnqueueRequest { queue: "q", partition: PartitionId(0), batch: &short })
            .encode(CorrelationId(1), &mut out)
            .unwrap_err();
    assert_eq!(error.code(), ErrorCode::BatchInvalid);
    let huge = vec![0u8; spool_wire::limits::BATCH_BYTES_MAX + 1];
    let error =
        Request::Enqueue(EnqueueRequest { queue: "q", partition: PartitionId(0), batch: &huge })
            .encode(CorrelationId(1), &mut out)
            .unwrap_err();
    assert!(matches!(error, ProtoError::BatchSize { .. }));

    let batch = [0u8; 64];
    let mut bytes = Vec::new();
    Request::Enqueue(EnqueueRequest { queue: "q", partition: PartitionId(0), batch: &batch })
        .encode(CorrelationId(1), &mut bytes)
        .unwrap();
    // Body: u16 len, "q", pad to 8, u32 partition, u32 batch_len.
    let len_at = 24 + 8 + 4;
    assert_eq!(&bytes[len_at..len_at + 4], &64u32.to_le_bytes());
    bytes[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    through_decoder(&bytes, |frame| {
        assert!(matches!(Request::decode(frame), Err(ProtoError::BatchSize { .. })));
    });
}

// Goal: ack token counts and release reasons are bounded; method: edges.
#[test]
fn ack_and_release_bounds() {
    let mut out = Vec::new();
    let token = DeliveryToken([7; 64]);
    assert!(Request::Ack(AckRequest { tokens: vec![] })
        .encode(CorrelationId(1), &mut out)
        .is_err());
    let too_many = vec![token; ACK_TOKENS_MAX as usize + 1];
    assert!(Request::Ack(AckRequest { tokens: too_many })
        .encode(CorrelationId(1), &mut out)
        .is_err());
    let most = vec![token; ACK_TOKENS_MAX as usize];
    request_round_trip(&Request::Ack(AckRequest { tokens: most }), 4);

    let long = "r".repeat(RELEASE_REASON_BYTES_MAX + 1);
    let error = Request::Release(ReleaseRequest { token, delay_ms: 0, reason: &long })
        .encode(CorrelationId(1), &mut out)
        .unwrap_err();
    assert!(matches!(error, ProtoError::TooLong { field: "reason", .. }));
    let error =
        Request::Release(ReleaseRequest { token, delay_ms: RELEASE_DELAY_MS_MAX + 1, reason: "" })
            .encode(CorrelationId(1), &mut out)
            .unwrap_err();
    assert!(matches!(error, ProtoError::OutOfRange { field: "delay_ms", .. }));
    let error = Request::Extend(ExtendRequest { token, lease_ms: 0 })
        .encode(CorrelationId(1), &mut out)
        .unwrap_err();
    assert!(matches!(error, ProtoError::OutOfRange { field: "lease_ms", .. }));
}

// Goal: a rejected enqueue outcome cannot claim success (NONE) and written
// outcomes cannot carry an error; method: encode-side check, then a patched
// response on decode.
#[test]
fn enqueue_outcome_consistency() {
    let mut out = Vec::new();
    let bad = Response::Enqueue(EnqueueResponse {
        base_offset: Offset(0),
        records: vec![RecordOutcome::Rejected { code: ErrorCode::None }],
    });
    assert!(matches!(bad.encode(CorrelationId(1), &mut out), Err(ProtoError::Inconsistent(_))));

    let mut bytes = Vec::new();
    Response::Enqueue(EnqueueResponse {
        base_offset: Offset(10),
        records: vec![RecordOutcome::Appended { offset: Offset(10) }],
    })
    .encode(CorrelationId(1), &mut bytes)
    .unwrap();
    // Body: u64 base, u32 count, u32 reserved, then u16 kind, u16 code.
    let code_at = 24 + 16 + 2;
    bytes[code_at..code_at + 2].copy_from_slice(&ErrorCode::QueueFull.as_u16().to_le_bytes());
    through_decoder(&bytes, |frame| {
        assert!(matches!(Response::decode(frame), Err(ProtoError::Inconsistent(_))));
    });
}

// Goal: the CancelClaim layout is the documented one (key 6, a u64 claim id
// as the whole request body; u32 outcome + u32 reserved as the response) and
// every malformed body is refused: claim id 0, a short or long body, an
// unknown outcome, a nonzero reserved field. Method: encode, check bytes,
// patch them, decode.
#[test]
fn cancel_claim_layout_and_validation() {
    assert_eq!(ApiKey::from_u16(6), Some(ApiKey::CancelClaim));
    assert!(ApiKey::CancelClaim.is_data_path());

    let mut out = Vec::new();
    let error = Request::CancelClaim(CancelClaimRequest { claim: CorrelationId(0) })
        .encode(CorrelationId(1), &mut out)
        .unwrap_err();
    assert!(matches!(error, ProtoError::OutOfRange { .. }), "{error:?}");
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert!(out.is_empty());

    let mut bytes = Vec::new();
    Request::CancelClaim(CancelClaimRequest { claim: CorrelationId(0x0102_0304_0506_0708) })
        .encode(CorrelationId(9), &mut bytes)
        .unwrap();
    assert_eq!(bytes.len(), 32, "24-byte header + 8-byte body");
    assert_eq!(&bytes[4..6], &6u16.to_le_bytes());
    assert_eq!(&bytes[20..24], &8u32.to_le_bytes());
    assert_eq!(&bytes[24..32], &0x0102_0304_0506_0708u64.to_le_bytes());

    // A peer that bypasses the encoder: id 0 is refused on decode too.
    let mut zero = bytes.clone();
    zero[24..32].copy_from_slice(&0u64.to_le_bytes());
    through_decoder(&zero, |frame| {
        let error = Request::decode(frame).unwrap_err();
        assert!(matches!(error, ProtoError::OutOfRange { field: "claim correlation id", .. }));
    });
    // A body of 16 bytes (trailing bytes) is refused.
    let mut long = bytes[..24].to_vec();
    long[0..4].copy_from_slice(&40u32.to_le_bytes());
    long[20..24].copy_from_slice(&16u32.to_le_bytes());
    long.extend_from_slice(&7u64.to_le_bytes());
    long.extend_from_slice(&0u64.to_le_bytes());
    through_decoder(&long, |frame| {
        assert!(Request::decode(frame).is_err(), "a 16-byte cancel body must not decode");
    });
    // A 4-byte body is truncated.
    let mut short = bytes[..24].to_vec();
    short[20..24].copy_from_slice(&4u32.to_le_bytes());
    short.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    short[28..32].copy_from_slice(&[0; 4]);
    through_decoder(&short, |frame| {
        assert!(matches!(Request::decode(frame), Err(ProtoError::Truncated { .. })));
    });

    let mut response = Vec::new();
    Response::CancelClaim(CancelClaimResponse { outcome: CancelOutcome::NotPending })
        .encode(CorrelationId(9), &mut response)
        .unwrap();
    assert_eq!(&response[24..32], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let mut unknown = response.clone();
    unknown[24..28].copy_from_slice(&2u32.to_le_bytes());
    through_decoder(&unknown, |frame| {
        let error = Response::decode(frame).unwrap_err();
        assert!(matches!(error, ProtoError::UnknownEnumValue { field: "cancel outcome", .. }));
    });
    let mut reserved = response;
    reserved[28..32].copy_from_slice(&1u32.to_le_bytes());
    through_decoder(&reserved, |frame| {
        assert!(matches!(Response::decode(frame), Err(ProtoError::NonzeroReserved { .. })));
    });
}

// Goal: Ping is key 8, version 0 only, with an empty body both ways; a
// body is refused (trailing bytes: MALFORMED_FRAME, which closes); the
// answer a broker that predates the key sends (UNKNOWN_API echoing key 8
// and the id) decodes as an error reply to that id. Method: encode, check
// the bytes, patch in a body, decode.
#[test]
fn ping_layout_and_validation() {
    assert_eq!(ApiKey::from_u16(8), Some(ApiKey::Ping));
    assert!(ApiKey::Ping.is_data_path());
    assert!(ApiKey::Ping.supports(0));
    assert!(!ApiKey::Ping.supports(1));
    assert_eq!(ApiKey::Ping.not_leader_version(), None);

    let ping = Request::Ping(PingRequest {});
    assert_eq!(ping.api_key(), ApiKey::Ping);
    request_round_trip(&ping, 11);
    response_round_trip(&Response::Ping(PingResponse {}), 11);
    let mut bytes = Vec::new();
    ping.encode(CorrelationId(11), &mut bytes).unwrap();
    assert_eq!(bytes.len(), 24, "a header and no body");
    assert_eq!(&bytes[4..6], &8u16.to_le_bytes());
    assert_eq!(&bytes[20..24], &0u32.to_le_bytes());
    let mut answer = Vec::new();
    let pong = Response::Ping(PingResponse {});
    pong.encode(CorrelationId(11), &mut answer).unwrap();
    assert_eq!(answer.len(), 24);
    assert_eq!(pong.encoded_len_hint(), answer.len());

    // An 8-byte body, in a request and in a response.
    for frame in [&bytes, &answer] {
        let mut long = frame.clone();
        long[0..4].copy_from_slice(&32u32.to_le_bytes());
        long[20..24].copy_from_slice(&8u32.to_le_bytes());
        long.extend_from_slice(&[0; 8]);
        through_decoder(&long, |frame| {
            let error = if frame.header.is_response {
                Response::decode(frame).unwrap_err()
            } else {
                Request::decode(frame).unwrap_err()
            };
            assert!(matches!(error, ProtoError::TrailingBytes { extra: 8 }), "{error:?}");
            assert!(error.closes_connection());
        });
    }

    let mut old_broker = Vec::new();
    let unknown = ProtoError::UnknownApi { api_key: 8, correlation_id: 11 };
    spool_wire::proto::ErrorResponse::from_proto_error(&unknown)
        .encode(CorrelationId(11), 8, 0, &mut old_broker)
        .unwrap();
    through_decoder(&old_broker, |frame| {
        let reply = Response::decode(frame).unwrap();
        assert_eq!(reply.correlation_id, CorrelationId(11));
        assert_eq!(reply.api_key, ApiKey::Ping);
        let Reply::Err(error) = reply.reply else { panic!("not an error: {reply:?}") };
        assert_eq!(error.code, ErrorCode::UnknownApi);
    });
}

/// A Claim of one partition and its answer, as Claim v0 (before partition
/// `ANY`) and v1 carry them.
fn claim_of(partition: PartitionId) -> Request<'static> {
    Request::Claim(ClaimRequest {
        queue: "jobs",
        partition,
        worker: WorkerId(5),
        credits: 4,
        max_bytes: 1 << 20,
        lease_ms: 30_000,
        wait_ms: 0,
        subscription: "",
    })
}

// Goal: Claim v1 carries partition ANY and v0 refuses it (INVALID_ARGUMENT,
// the connection kept) on both sides of the wire, while a v0 Claim of one
// partition still means what it did. Method: encode ANY and a plain claim in
// each version, and a hand-made v0 frame naming ANY through the decoder.
#[test]
fn claim_any_needs_version_1() {
    assert_eq!(ApiKey::Claim.max_version(), 3);
    assert_eq!(ApiKey::Ack.max_version(), 1);
    let mut bytes = Vec::new();
    claim_of(PartitionId::ANY).encode_version(CorrelationId(3), 1, &mut bytes).unwrap();
    through_decoder(&bytes, |frame| {
        assert_eq!(frame.header.api_version, 1);
        assert_eq!(Request::decode(frame).unwrap(), claim_of(PartitionId::ANY));
    });
    let refused = claim_of(PartitionId::ANY).encode_version(CorrelationId(3), 0, &mut Vec::new());
    assert!(matches!(refused, Err(ProtoError::Inconsistent(_))), "{refused:?}");
    // A v0 frame naming ANY, as an old client could send it: the version
    // field rewritten after encoding as v1 (the bodies are the same).
    bytes[6..8].copy_from_slice(&0u16.to_le_bytes());
    through_decoder(&bytes, |frame| {
        let failure = Request::decode(frame).unwrap_err();
        assert_eq!(failure.code(), ErrorCode::InvalidArgument);
        assert!(!failure.closes_connection());
    });
    let mut v0 = Vec::new();
    claim_of(PartitionId(2)).encode_version(CorrelationId(4), 0, &mut v0).unwrap();
    through_decoder(&v0, |frame| {
        assert_eq!(frame.header.api_version, 0);
        assert_eq!(Request::decode(frame).unwrap(), claim_of(PartitionId(2)));
    });
    // A version this codec does not speak is refused before anything is written.
    let mut none = Vec::new();
    assert!(claim_of(PartitionId(2)).encode_version(CorrelationId(4), 4, &mut none).is_err());
    assert!(none.is_empty());
}

/// [`claim_of`] partition 0 for `subscription`.
fn claim_for(subscription: &str) -> Request<'_> {
    let Request::Claim(claim) = claim_of(PartitionId(0)) else { unreachable!() };
    Request::Claim(ClaimRequest { subscription, ..claim })
}

/// `request` encoded as Claim `version`: the frame's version and body.
fn claim_body(request: &Request<'_>, version: u16) -> (u16, Vec<u8>) {
    let mut bytes = Vec::new();
    request.encode_version(CorrelationId(6), version, &mut bytes).unwrap();
    let mut found = None;
    through_decoder(&bytes, |frame| {
        assert_eq!(&Request::decode(frame).unwrap(), request);
        found = Some((frame.header.api_version, frame.body.to_vec()));
    });
    found.unwrap()
}

// Goal: Claim v3 carries the subscription's name after the fixed fields
// (u16 length, the bytes), "" being the default subscription; v2 keeps
// its layout and reads as the default; a name is refused before v3 and
// when it breaks the queue names' rule, on both sides of the wire (a
// refusal the connection survives). Method: exact bodies of v3 with a name
// and with none and of v2; encodes that must fail; hand-made frames (a v3
// body sent as v2, a v3 name patched to a bad character) through the
// decoder.
#[test]
fn claim_names_a_subscription_from_version_3() {
    assert_eq!(spool_wire::proto::CLAIM_VERSION_SUBSCRIPTION, 3);
    // queue: u16 length, 4 bytes, 2 of padding; 32 bytes of fixed fields.
    let (version, v2) = claim_body(&claim_for(""), 2);
    assert_eq!((version, v2.len()), (2, 40));
    let (version, v3) = claim_body(&claim_for("audit"), 3);
    assert_eq!((version, v3.len()), (3, 47));
    assert_eq!(v3[..40], v2[..], "v3 keeps v2's fields");
    assert_eq!(&v3[40..], b"\x05\x00audit");
    let (_, v3_default) = claim_body(&claim_for(""), 3);
    assert_eq!(v3_default, [&v2[..], &[0, 0]].concat());
    // The newest version is what `encode` writes.
    let mut newest = Vec::new();
    claim_for("audit").encode(CorrelationId(6), &mut newest).unwrap();
    through_decoder(&newest, |frame| assert_eq!(frame.header.api_version, 3));

    let mut out = Vec::new();
    for version in 0..3 {
        let refused = claim_for("audit").encode_version(CorrelationId(6), version, &mut out);
        assert_eq!(
            refused,
            Err(ProtoError::Inconsistent("claim subscription needs claim version 3")),
            "v{version}"
        );
    }
    let long = "s".repeat(129);
    for bad in ["bad name", "sub/one", "é", &long] {
        let refused = claim_for(bad).encode_version(CorrelationId(6), 3, &mut out).unwrap_err();
        assert!(matches!(refused, ProtoError::InvalidSubscriptionName { .. }), "{bad}: {refused}");
        assert_eq!(refused.code(), ErrorCode::InvalidArgument);
    }
    assert!(out.is_empty(), "nothing written for a refused claim");
    assert!(claim_for(&"s".repeat(128)).validate().is_ok());

    // A v3 body sent as v2: v2 does not read the name, so it is trailing.
    let mut bytes = Vec::new();
    claim_for("audit").encode_version(CorrelationId(6), 3, &mut bytes).unwrap();
    let mut as_v2 = bytes.clone();
    as_v2[6..8].copy_from_slice(&2u16.to_le_bytes());
    through_decoder(&as_v2, |frame| {
        let failure = Request::decode(frame).unwrap_err();
        assert_eq!(failure, ProtoError::TrailingBytes { extra: 7 });
    });
    // A name with a character outside the rule, as a peer could send it.
    let last = 24 + 47 - 1;
    assert_eq!(bytes[last], b't');
    bytes[last] = b' ';
    through_decoder(&bytes, |frame| {
        let failure = Request::decode(frame).unwrap_err();
        assert!(matches!(failure, ProtoError::InvalidSubscriptionName { .. }), "{failure}");
        assert_eq!(failure.code(), ErrorCode::InvalidArgument);
        assert!(!failure.closes_connection());
    });
}

// Goal: SUBSCRIPTION_NOT_FOUND reaches only a Claim of the version that
// can name a subscription, a Peek, Purge, DeadLetters or Redrive of v2
// (which name one too) and the subscription keys, newer than the code
// (codes.rs's rule); anything older, and every other key, gets
// INVALID_ARGUMENT. Method: an error reply encoded for each version of
// each key, decoded back.
#[test]
fn subscription_not_found_only_from_claim_version_3() {
    let missing = ErrorCode::SubscriptionNotFound;
    for key in ApiKey::ALL {
        for version in key.min_version()..=key.max_version() {
            let names_one = matches!(key, ApiKey::CreateSubscription | ApiKey::DeleteSubscription);
            let inspects =
                matches!(key, ApiKey::Peek | ApiKey::Purge | ApiKey::DeadLetters | ApiKey::Redrive);
            let expected = if (key == ApiKey::Claim && version >= 3)
                || (inspects && version >= 2)
                || names_one
            {
                missing
            } else {
                ErrorCode::InvalidArgument
            };
            assert_eq!(error_code_at(key, version, missing), expected, "{key:?} v{version}");
        }
    }
    assert_eq!(missing.as_u16(), 29);
    assert_eq!(missing.name(), "SUBSCRIPTION_NOT_FOUND");
    assert!(!missing.is_retriable());
}

// Goal: a v1 Claim response names each delivery's partition and a v0 one
// keeps the v0 layout (8 bytes less per delivery, read back as ANY: not
// said); the length hint is exact in both. Method: one response encoded in
// each version, sizes compared and decoded.
#[test]
fn claim_response_names_partitions_from_version_1() {
    let record = [7u8; 13];
    let delivery = |partition: u32, offset: u64| Delivery {
        token: DeliveryToken([offset as u8; 64]),
        partition: PartitionId(partition),
        offset: Offset(offset),
        attempt: 1,
        generation: Generation(2),
        record: &record,
    };
    let response = Response::Claim(ClaimResponse {
        lease_deadline_ms: 77,
        deliveries: vec![delivery(3, 10), delivery(9, 11)],
    });
    let (mut v1, mut v0) = (Vec::new(), Vec::new());
    response.encode_version(CorrelationId(8), 1, &mut v1).unwrap();
    response.encode_version(CorrelationId(8), 0, &mut v0).unwrap();
    assert_eq!(v1.len(), v0.len() + 2 * 8);
    assert_eq!(v1.len(), response.encoded_len_hint_version(1));
    assert_eq!(v0.len(), response.encoded_len_hint_version(0));
    through_decoder(&v1, |frame| {
        let Reply::Ok(Response::Claim(decoded)) = Response::decode(frame).unwrap().reply else {
            panic!("not a claim response")
        };
        let partitions: Vec<u32> = decoded.deliveries.iter().map(|d| d.partition.0).collect();
        assert_eq!(partitions, [3, 9]);
        assert_eq!(decoded.deliveries[1].record, &record);
    });
    through_decoder(&v0, |frame| {
        let Reply::Ok(Response::Claim(decoded)) = Response::decode(frame).unwrap().reply else {
            panic!("not a claim response")
        };
        assert!(decoded.deliveries.iter().all(|d| d.partition == PartitionId::ANY));
        assert_eq!(decoded.deliveries[0].offset, Offset(10));
        assert_eq!(decoded.deliveries[1].record, &record);
    });
}

/// The code a reply encoded for `key` at `version` carries once decoded:
/// the header's for an error reply.
fn error_code_at(key: ApiKey, version: u16, code: ErrorCode) -> ErrorCode {
    let mut bytes = Vec::new();
    let reply = spool_wire::proto::ErrorResponse::new(code, "led elsewhere");
    reply.encode(CorrelationId(9), key.as_u16(), version, &mut bytes).unwrap();
    let mut found = None;
    through_decoder(&bytes, |frame| match Response::decode(frame).unwrap().reply {
        Reply::Err(error) => found = Some(error.code),
        other => panic!("not an error reply: {other:?}"),
    });
    found.unwrap()
}

// Goal: NOT_LEADER reaches only requests of a version that postdates it
// (codes.rs's rule); an older request gets NOT_OWNER, which it knows and
// redirects on alike. Method: an error reply and an Ack's per-token
// results encoded at each version of each key, decoded back.
#[test]
fn not_leader_only_from_the_version_that_added_it() {
    for key in ApiKey::ALL {
        for version in key.min_version()..=key.max_version() {
            let expected = match key.not_leader_version() {
                Some(since) if version >= since => ErrorCode::NotLeader,
                _ => ErrorCode::NotOwner,
            };
            assert_eq!(
                error_code_at(key, version, ErrorCode::NotLeader),
                expected,
                "{key:?} v{version}"
            );
            // Other codes pass unchanged.
            assert_eq!(error_code_at(key, version, ErrorCode::StaleToken), ErrorCode::StaleToken);
        }
    }
    assert_eq!(ApiKey::Claim.not_leader_version(), Some(2));
    assert_eq!(ApiKey::Metadata.not_leader_version(), None);
    let response = Response::Ack(AckResponse {
        results: vec![ErrorCode::None, ErrorCode::NotLeader, ErrorCode::StaleToken],
    });
    for (version, middle) in [(0, ErrorCode::NotOwner), (1, ErrorCode::NotLeader)] {
        let mut bytes = Vec::new();
        response.encode_version(CorrelationId(5), version, &mut bytes).unwrap();
        through_decoder(&bytes, |frame| match Response::decode(frame).unwrap().reply {
            Reply::Ok(Response::Ack(AckResponse { results })) => assert_eq!(
                results,
                vec![ErrorCode::None, middle, ErrorCode::StaleToken],
                "Ack v{version}"
            ),
            other => panic!("not an Ack: {other:?}"),
        });
    }
}
