//! Subscription admin on the wire: CreateSubscription and DeleteSubscription
//! (keys 26 and 27) and DescribeQueue v2's subscription list. Round trips,
//! refusals at encode and decode, the versions and codes each key may be
//! answered with, and the rule that an older DescribeQueue gets exactly the
//! bytes it always got.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use flatbuffers::FlatBufferBuilder;
use spool_wire::proto::limits::{
    FRAME_HEADER_BYTES, SUBSCRIPTIONS_PER_QUEUE_MAX, SUBSCRIPTION_NAME_BYTES_MAX,
};
use spool_wire::proto::{
    decode_frame, ApiKey, AssignmentVersion, Backoff, BackoffKind, CorrelationId,
    CreateSubscriptionRequest, CreateSubscriptionResponse, DeleteSubscriptionRequest,
    DeleteSubscriptionResponse, DescribeQueueRequest, DescribeQueueResponse, ErrorResponse,
    KeyMapStats, LaneStats, PartitionId, PartitionStats, ProtoError, QueueConfig, Reply, Request,
    Response, RetainedStats, SubscriptionStart, SubscriptionStats,
    DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
};
use spool_wire::ErrorCode;

fn config() -> QueueConfig {
    QueueConfig {
        partitions: 8,
        priority_bands: 3,
        lease_default_ms: 30_000,
        lease_min_ms: 1_000,
        lease_max_ms: 600_000,
        max_lease_lifetime_ms: 3_600_000,
        max_deliveries: 5,
        backoff: Backoff { kind: BackoffKind::Exponential, base_ms: 500, cap_ms: 60_000 },
        dedupe_window_ms: 300_000,
        max_messages: 10_000_000,
        max_bytes: 1 << 34,
        dead_letter_on_expiry: true,
        retention_ms: 0,
        retention_bytes: 0,
        ordered: false,
    }
}

fn stats(name: &str, id: u16, start: SubscriptionStart) -> SubscriptionStats {
    SubscriptionStats {
        name: name.into(),
        id,
        start,
        partitions: 2,
        ready: 10 + u64::from(id),
        scheduled: 1,
        claimed: 3,
        dead_letters: 4,
        oldest_ready_age_ms: 250,
        oldest_claim_age_ms: 900,
        acked: 77,
        lost: 5 + u64::from(id),
    }
}

/// The DescribeQueue answer the golden bytes below were taken from.
fn describe(subscriptions: Vec<SubscriptionStats>) -> DescribeQueueResponse {
    let partition = PartitionStats {
        partition: PartitionId(1),
        ready: 5,
        scheduled: 2,
        claimed: 3,
        quarantined: 1,
        expired: 0,
        acked: 9,
        bytes: 512,
        oldest_ready_age_ms: 40,
        released: 2,
        lease_expired: 1,
        replication: None,
        retained: RetainedStats::default(),
        lanes: LaneStats::default(),
    };
    DescribeQueueResponse {
        name: "jobs".into(),
        config: config(),
        partitions: vec![partition],
        keys: KeyMapStats { version: 2, draining: vec![PartitionId(0)], held_from: 1 },
        subscriptions,
    }
}

fn decode_request(bytes: &[u8]) -> Result<Request<'_>, ProtoError> {
    Request::decode(&decode_frame(bytes).unwrap())
}

fn decode_reply(bytes: &[u8]) -> Reply<'_> {
    Response::decode(&decode_frame(bytes).unwrap()).unwrap().reply
}

/// A request frame for `api_key` (version 0) around `body`.
fn frame_with_body(api_key: ApiKey, version: u16, is_response: bool, body: &[u8]) -> Vec<u8> {
    let padded = (FRAME_HEADER_BYTES + body.len()).div_ceil(8) * 8;
    let mut frame = vec![0u8; padded];
    frame[0..4].copy_from_slice(&(padded as u32).to_le_bytes());
    frame[4..6].copy_from_slice(&api_key.as_u16().to_le_bytes());
    frame[6..8].copy_from_slice(&version.to_le_bytes());
    frame[8..16].copy_from_slice(&5u64.to_le_bytes());
    frame[16..18].copy_from_slice(&u16::from(is_response).to_le_bytes());
    frame[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
    frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + body.len()].copy_from_slice(body);
    frame
}

// Goal: the two new keys are numbered, versioned and answered as the
// protocol says (key 26 and 27, version 0 only, NOT_LEADER and
// SUBSCRIPTION_NOT_FOUND from v0, DescribeQueue's newest v2); method: the
// key table's own answers.
#[test]
fn keys_and_versions() {
    assert_eq!(ApiKey::CreateSubscription.as_u16(), 26);
    assert_eq!(ApiKey::DeleteSubscription.as_u16(), 27);
    assert_eq!(ApiKey::from_u16(26), Some(ApiKey::CreateSubscription));
    assert_eq!(ApiKey::from_u16(27), Some(ApiKey::DeleteSubscription));
    for key in [ApiKey::CreateSubscription, ApiKey::DeleteSubscription] {
        assert_eq!(key.max_version(), 0);
        assert!(!key.supports(1));
        assert!(!key.is_data_path());
        assert_eq!(key.not_leader_version(), Some(0));
        assert_eq!(key.answerable(0, ErrorCode::NotLeader), ErrorCode::NotLeader);
        let missing = ErrorCode::SubscriptionNotFound;
        assert_eq!(key.answerable(0, missing), missing);
    }
    assert_eq!(DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS, 2);
    assert_eq!(ApiKey::DescribeQueue.max_version(), DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS);
    // DescribeQueue v2 changes no code: it is still NOT_LEADER from v1.
    assert_eq!(ApiKey::DescribeQueue.not_leader_version(), Some(1));
    assert_eq!(
        ApiKey::DescribeQueue.answerable(2, ErrorCode::SubscriptionNotFound),
        ErrorCode::InvalidArgument
    );
}

// Goal: both requests and both responses round trip, each start included;
// method: encode, decode through the frame decoder, compare.
#[test]
fn requests_and_responses_round_trip() {
    for start in [
        SubscriptionStart::Latest,
        SubscriptionStart::Earliest,
        SubscriptionStart::Time(1_700_000_000_123),
        SubscriptionStart::Offset(42),
        SubscriptionStart::Offset(0),
    ] {
        let request = Request::CreateSubscription(CreateSubscriptionRequest {
            queue: "orders".into(),
            name: "audit.v2".into(),
            start,
        });
        let mut bytes = Vec::new();
        request.encode(CorrelationId(3), &mut bytes).unwrap();
        assert_eq!(decode_request(&bytes).unwrap(), request);
    }
    let request = Request::DeleteSubscription(DeleteSubscriptionRequest {
        queue: "orders".into(),
        name: "audit.v2".into(),
    });
    let mut bytes = Vec::new();
    request.encode(CorrelationId(4), &mut bytes).unwrap();
    assert_eq!(decode_request(&bytes).unwrap(), request);

    for response in [
        Response::CreateSubscription(CreateSubscriptionResponse {
            assignment_version: AssignmentVersion(41),
            id: 3,
        }),
        Response::DeleteSubscription(DeleteSubscriptionResponse {
            assignment_version: AssignmentVersion(42),
        }),
    ] {
        let mut bytes = Vec::new();
        response.encode(CorrelationId(6), &mut bytes).unwrap();
        assert_eq!(decode_reply(&bytes), Reply::Ok(response.clone()));
    }
}

// Goal: DescribeQueue v2 carries every subscription with its counters, in
// order; method: a default and two named ones encoded as v2 and decoded.
#[test]
fn describe_v2_lists_subscriptions() {
    let listed = vec![
        stats("default", 0, SubscriptionStart::Earliest),
        stats("audit", 1, SubscriptionStart::Earliest),
        stats("mirror", 3, SubscriptionStart::Latest),
        stats("since", 4, SubscriptionStart::Time(1_700_000_000_123)),
        stats("tail", 5, SubscriptionStart::Offset(7)),
    ];
    let response = Response::DescribeQueue(describe(listed.clone()));
    let mut bytes = Vec::new();
    response.encode_version(CorrelationId(7), 2, &mut bytes).unwrap();
    let Reply::Ok(Response::DescribeQueue(decoded)) = decode_reply(&bytes) else {
        panic!("not a DescribeQueue answer")
    };
    assert_eq!(decoded.subscriptions, listed);
    assert_eq!(decoded, describe(listed));
    // The request is the same in every version.
    let request = Request::DescribeQueue(DescribeQueueRequest { name: "jobs".into() });
    for version in 0..=2 {
        let mut bytes = Vec::new();
        request.encode_version(CorrelationId(1), version, &mut bytes).unwrap();
        assert_eq!(decode_request(&bytes).unwrap(), request, "v{version}");
    }
}

/// DescribeQueue v1's answer to `describe(..)` as the codec wrote it before
/// subscriptions existed (taken from that codec, correlation id 7).
const DESCRIBE_V1_GOLDEN: &str = "\
580100001300010007000000000000000100000040010000180000000000000010002400040008000c00180010001400\
1000000018010000b80000002000000014000000010000000200000000000000000000000100000000000000010000\
002000000000001a005400040008001000180020000000280030003800400048001a000000010000000500000000\
000000020000000000000003000000000000000100000000000000090000000000000000020000000000002800000000\
0000000200000000000000010000000000000000000000\
1c004200080006000c0010001400200018001c0028003000380007001c000000000003010800000030750000e8030000\
c0270900050000003000000080ee360000000000e0930400000000008096980000000000000000000400000000000a00\
1000070008000c000a00000000000001f401000060ea0000040000006a6f627300000000";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

// Goal: a client of DescribeQueue v0 or v1 gets exactly the answer it got
// before subscriptions (none of their bytes), and reads no subscriptions;
// method: the v1 answer with three subscriptions compared with golden bytes
// from the old codec, v0's body with v1's, and both decoded.
#[test]
fn older_describe_versions_get_the_old_bytes() {
    let listed = vec![
        stats("default", 0, SubscriptionStart::Earliest),
        stats("audit", 1, SubscriptionStart::Earliest),
    ];
    let response = Response::DescribeQueue(describe(listed));
    let mut v1 = Vec::new();
    response.encode_version(CorrelationId(7), 1, &mut v1).unwrap();
    assert_eq!(hex(&v1), DESCRIBE_V1_GOLDEN);
    let mut v0 = Vec::new();
    response.encode_version(CorrelationId(7), 0, &mut v0).unwrap();
    assert_eq!(v0[FRAME_HEADER_BYTES..], v1[FRAME_HEADER_BYTES..]);
    for bytes in [&v0, &v1] {
        let Reply::Ok(Response::DescribeQueue(decoded)) = decode_reply(bytes) else {
            panic!("not a DescribeQueue answer")
        };
        assert_eq!(decoded, describe(vec![]));
    }
    // And a v2 answer is longer by the list alone.
    let mut v2 = Vec::new();
    response.encode_version(CorrelationId(7), 2, &mut v2).unwrap();
    assert!(v2.len() > v1.len());
}

// Goal: names and list lengths are refused on the encoding side with
// INVALID_ARGUMENT (the connection kept); method: one broken field each.
#[test]
fn bad_names_and_long_lists_are_refused_at_encode() {
    let long = "s".repeat(SUBSCRIPTION_NAME_BYTES_MAX + 1);
    for (queue, name) in
        [("orders", ""), ("orders", "a/b"), ("orders", long.as_str()), ("", "audit"), ("a b", "x")]
    {
        for request in [
            Request::CreateSubscription(CreateSubscriptionRequest {
                queue: queue.into(),
                name: name.into(),
                start: SubscriptionStart::Latest,
            }),
            Request::DeleteSubscription(DeleteSubscriptionRequest {
                queue: queue.into(),
                name: name.into(),
            }),
        ] {
            let error = request.encode(CorrelationId(1), &mut Vec::new()).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{queue:?}/{name:?}: {error}");
            assert!(!error.closes_connection());
        }
    }
    let too_many: Vec<_> = (0..=SUBSCRIPTIONS_PER_QUEUE_MAX as u16)
        .map(|id| stats(&format!("s{id}"), id, SubscriptionStart::Latest))
        .collect();
    let response = Response::DescribeQueue(describe(too_many));
    let error = response.encode(CorrelationId(1), &mut Vec::new()).unwrap_err();
    assert!(matches!(error, ProtoError::TooLong { .. }), "{error:?}");
    let bad_name = Response::DescribeQueue(describe(vec![stats("x y", 1, Default::default())]));
    assert!(bad_name.encode(CorrelationId(1), &mut Vec::new()).is_err());
}

/// A CreateSubscriptionRequest body built slot by slot (slots from
/// control.fbs: queue 4, name 6, start 8).
fn create_body(queue: Option<&str>, name: Option<&str>, start: u8) -> Vec<u8> {
    let mut builder = FlatBufferBuilder::new();
    let queue = queue.map(|queue| builder.create_string(queue));
    let name = name.map(|name| builder.create_string(name));
    let table = builder.start_table();
    if let Some(queue) = queue {
        builder.push_slot_always(4, queue);
    }
    if let Some(name) = name {
        builder.push_slot_always(6, name);
    }
    builder.push_slot::<u8>(8, start, 0);
    let root = builder.end_table(table);
    builder.finish_minimal(root);
    builder.finished_data().to_vec()
}

// Goal: the decoder refuses what a hostile peer can send: a start outside
// the enum and a missing field close the connection (MALFORMED_FRAME), a
// bad name does not (INVALID_ARGUMENT), a good body decodes; method:
// hand-built bodies through `Request::decode`.
#[test]
fn decoder_refusals() {
    let good = frame_with_body(
        ApiKey::CreateSubscription,
        0,
        false,
        &create_body(Some("orders"), Some("audit"), 1),
    );
    let Request::CreateSubscription(request) = decode_request(&good).unwrap() else {
        panic!("not a CreateSubscription")
    };
    assert_eq!(request.start, SubscriptionStart::Earliest);

    let bad_start = frame_with_body(
        ApiKey::CreateSubscription,
        0,
        false,
        &create_body(Some("q"), Some("s"), 4),
    );
    let error = decode_request(&bad_start).unwrap_err();
    assert!(matches!(error, ProtoError::UnknownEnumValue { field: "start", value: 4 }), "{error}");
    // A Time start without its `start_at` is the epoch: every record.
    let epoch = frame_with_body(
        ApiKey::CreateSubscription,
        0,
        false,
        &create_body(Some("q"), Some("s"), 2),
    );
    let Request::CreateSubscription(request) = decode_request(&epoch).unwrap() else {
        panic!("not a CreateSubscription")
    };
    assert_eq!(request.start, SubscriptionStart::Time(0));
    assert!(error.closes_connection());

    let no_name =
        frame_with_body(ApiKey::CreateSubscription, 0, false, &create_body(Some("q"), None, 0));
    assert_eq!(decode_request(&no_name).unwrap_err(), ProtoError::MissingField("name"));

    let bad_name = frame_with_body(
        ApiKey::CreateSubscription,
        0,
        false,
        &create_body(Some("q"), Some("a b"), 0),
    );
    let error = decode_request(&bad_name).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert!(!error.closes_connection());

    // DeleteSubscription shares the first two slots.
    let delete =
        frame_with_body(ApiKey::DeleteSubscription, 0, false, &create_body(None, Some("s"), 0));
    assert_eq!(decode_request(&delete).unwrap_err(), ProtoError::MissingField("queue"));

    // Version 1 of either key does not exist: the frame decoder refuses it.
    let v1 = frame_with_body(
        ApiKey::DeleteSubscription,
        1,
        false,
        &create_body(Some("q"), Some("s"), 0),
    );
    assert_eq!(decode_frame(&v1).unwrap_err().code(), ErrorCode::UnsupportedVersion);
}

/// A DescribeQueueResponse body with a minimal config and `listed`
/// subscription tables (all the same one), built slot by slot (slots from
/// control.fbs: name 4, config 6, subscriptions 16; QueueConfig's backoff 18).
fn describe_body(listed: usize, start: u8) -> Vec<u8> {
    let mut builder = FlatBufferBuilder::new();
    let name = builder.create_string("jobs");
    let backoff = {
        let table = builder.start_table();
        builder.end_table(table)
    };
    let config = {
        let table = builder.start_table();
        builder.push_slot_always(18, backoff);
        builder.end_table(table)
    };
    let sub_name = builder.create_string("audit");
    let sub = {
        let table = builder.start_table();
        builder.push_slot_always(4, sub_name);
        builder.push_slot::<u8>(8, start, 0);
        builder.end_table(table)
    };
    let subs = builder.create_vector(&vec![sub; listed]);
    let table = builder.start_table();
    builder.push_slot_always(4, name);
    builder.push_slot_always(6, config);
    builder.push_slot_always(16, subs);
    let root = builder.end_table(table);
    builder.finish_minimal(root);
    builder.finished_data().to_vec()
}

// Goal: a v2 answer listing more subscriptions than a queue may have, or a
// start outside the enum, is refused before it is copied; a v1 answer
// ignores the list; method: hand-built answers through `Response::decode`.
#[test]
fn describe_decoder_refusals() {
    let past = describe_body(SUBSCRIPTIONS_PER_QUEUE_MAX + 1, 0);
    let frame = frame_with_body(ApiKey::DescribeQueue, 2, true, &past);
    let error = Response::decode(&decode_frame(&frame).unwrap()).unwrap_err();
    assert!(matches!(error, ProtoError::TooLong { field: "subscriptions", .. }), "{error:?}");

    let bad_start = describe_body(1, 9);
    let frame = frame_with_body(ApiKey::DescribeQueue, 2, true, &bad_start);
    let error = Response::decode(&decode_frame(&frame).unwrap()).unwrap_err();
    assert!(matches!(error, ProtoError::UnknownEnumValue { .. }), "{error:?}");

    // Read as v1 the list is not looked at (the config's ranges still are:
    // this minimal one fails them, after the list would have).
    let frame = frame_with_body(ApiKey::DescribeQueue, 1, true, &past);
    let error = Response::decode(&decode_frame(&frame).unwrap()).unwrap_err();
    assert!(!matches!(error, ProtoError::TooLong { .. }), "{error:?}");
}

// Goal: an error reply to the new keys keeps the codes they may receive;
// method: SUBSCRIPTION_NOT_FOUND and INVALID_ARGUMENT encoded and decoded.
#[test]
fn error_replies_keep_their_codes() {
    for key in [ApiKey::CreateSubscription, ApiKey::DeleteSubscription] {
        for code in [
            ErrorCode::SubscriptionNotFound,
            ErrorCode::InvalidArgument,
            ErrorCode::QueueNotFound,
            ErrorCode::NotLeader,
        ] {
            let mut bytes = Vec::new();
            ErrorResponse::new(code, "no")
                .encode(CorrelationId(2), key.as_u16(), 0, &mut bytes)
                .unwrap();
            let Reply::Err(error) = decode_reply(&bytes) else { panic!("not an error") };
            assert_eq!(error.code, code, "{key:?}");
        }
    }
}
