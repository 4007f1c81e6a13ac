//! Ordered lanes on the wire (`docs/design/ordered-lanes.md`): CreateQueue
//! v3 carries the queue's `ordered` flag, DescribeQueue reports it with each
//! partition's lanes (active and blocked keys, waiting messages, the oldest
//! waiting age and the routing key blocked longest). Round trips; the rule
//! that an unordered queue is created with the bytes version 1 always sent
//! (golden bytes from the codec before v2); that `ordered` never travels in
//! an older version (refused at encode, read as unordered at decode); the
//! bound on the reported key; and the merge of partitions' lanes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod create_queue;

use create_queue::{config, create, decode, encode, hex, with_version, CREATE_V1_GOLDEN};

use spool_wire::limits::ROUTING_KEY_BYTES_MAX;
use spool_wire::proto::limits::FRAME_HEADER_BYTES;
use spool_wire::proto::{
    decode_frame, ApiKey, CorrelationId, DescribeQueueResponse, KeyMapStats, LaneStats,
    PartitionId, PartitionStats, ProtoError, QueueConfig, Reply, Request, Response, RetainedStats,
    CREATE_QUEUE_VERSION_ORDERED, CREATE_QUEUE_VERSION_RETENTION,
    DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
};
use spool_wire::ErrorCode;

fn ordered() -> QueueConfig {
    QueueConfig { ordered: true, ..config() }
}

// Goal: CreateQueue speaks v3, newer than any broker from before ordered
// lanes (they stop at v2), and v4 is refused with UNSUPPORTED_VERSION (what
// such a broker answers a v3 with); method: the key table, a re-labelled
// frame.
#[test]
fn create_queue_version_3_carries_ordered() {
    assert_eq!(CREATE_QUEUE_VERSION_ORDERED, 3);
    assert_eq!(ApiKey::CreateQueue.max_version(), CREATE_QUEUE_VERSION_ORDERED);
    let v3 = encode(&create(ordered()), CREATE_QUEUE_VERSION_ORDERED).unwrap();
    let v4 = with_version(v3, CREATE_QUEUE_VERSION_ORDERED + 1);
    assert_eq!(decode_frame(&v4).unwrap_err().code(), ErrorCode::UnsupportedVersion);
}

// Goal: an ordered queue round trips at v3, with and without the other
// fields of newer versions; a plain encode writes v3; method: encode,
// decode through the frame decoder, compare.
#[test]
fn ordered_round_trips_at_version_3() {
    for config in [ordered(), QueueConfig { retention_ms: 60_000, ..ordered() }, config()] {
        let request = create(config.clone());
        let v3 = encode(&request, CREATE_QUEUE_VERSION_ORDERED).unwrap();
        assert_eq!(decode(&v3).unwrap(), request, "{config:?}");
        let mut plain = Vec::new();
        request.encode(CorrelationId(7), &mut plain).unwrap();
        assert_eq!(plain, v3, "a plain encode writes the newest version");
    }
}

// Goal: an unordered queue is still the body version 1 always sent, at
// v3 too; method: the golden bytes, the same body at v3.
#[test]
fn an_unordered_queue_keeps_the_old_bytes() {
    let request = create(config());
    let v1 = encode(&request, 1).unwrap();
    assert_eq!(hex(&v1), CREATE_V1_GOLDEN);
    let v3 = encode(&request, CREATE_QUEUE_VERSION_ORDERED).unwrap();
    assert_eq!(v3[FRAME_HEADER_BYTES..], v1[FRAME_HEADER_BYTES..]);
    assert_eq!(decode(&v3).unwrap(), request);
}

// Goal: `ordered` never travels in an older version: the encoder refuses it
// below v3 (the queue would be created unordered), and a v0..v2 frame whose
// body carries it (a v3 body under an old header) reads as unordered, as a
// broker of that version reads it; a window in the same body still reads
// at v2; method: both directions.
#[test]
fn older_versions_read_unordered() {
    let windowed = QueueConfig { retention_ms: 60_000, ..ordered() };
    let v3 = encode(&create(windowed.clone()), CREATE_QUEUE_VERSION_ORDERED).unwrap();
    for version in 0..CREATE_QUEUE_VERSION_ORDERED {
        let refused = encode(&create(ordered()), version).unwrap_err();
        assert!(matches!(refused, ProtoError::Inconsistent(_)), "{refused:?}");
        assert_eq!(refused.code(), ErrorCode::InvalidArgument);
        let bytes = with_version(v3.clone(), version);
        let Request::CreateQueue(old) = decode(&bytes).unwrap() else {
            panic!("not a CreateQueue")
        };
        assert!(!old.config.ordered, "v{version}");
        let window = if version >= CREATE_QUEUE_VERSION_RETENTION { 60_000 } else { 0 };
        assert_eq!(old.config.retention_ms, window, "v{version}");
    }
}

fn partition(index: u32, lanes: LaneStats) -> PartitionStats {
    PartitionStats {
        partition: PartitionId(index),
        ready: 5,
        scheduled: 0,
        claimed: 1,
        quarantined: 0,
        expired: 0,
        acked: 9,
        bytes: 512,
        oldest_ready_age_ms: 40,
        released: 0,
        lease_expired: 0,
        replication: None,
        retained: RetainedStats::default(),
        lanes,
    }
}

fn lanes(waiting: u64, age: u64, key: &[u8]) -> LaneStats {
    LaneStats {
        active_keys: 3,
        blocked_keys: u64::from(waiting > 0),
        waiting,
        oldest_waiting_age_ms: age,
        blocked_longest_key: key.to_vec(),
    }
}

fn described(key: &[u8]) -> DescribeQueueResponse {
    DescribeQueueResponse {
        name: "events".into(),
        config: ordered(),
        partitions: vec![partition(0, lanes(4, 1_500, key)), partition(1, LaneStats::default())],
        keys: KeyMapStats { version: 1, draining: vec![], held_from: 2 },
        subscriptions: vec![],
    }
}

// Goal: DescribeQueue reports `ordered` and each partition's lanes at every
// version (fields only appended), the blocked key up to the routing key
// limit; method: encode at each version, decode, compare.
#[test]
fn describe_reports_ordered_and_lanes() {
    for key in [&b"chair-4"[..], &[0xff; ROUTING_KEY_BYTES_MAX][..], b""] {
        let response = Response::DescribeQueue(described(key));
        for version in 0..=DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS {
            let mut bytes = Vec::new();
            response.encode_version(CorrelationId(7), version, &mut bytes).unwrap();
            let Reply::Ok(Response::DescribeQueue(decoded)) =
                Response::decode(&decode_frame(&bytes).unwrap()).unwrap().reply
            else {
                panic!("not a DescribeQueue answer")
            };
            assert_eq!(decoded, described(key), "v{version}");
        }
    }
}

// Goal: a blocked key over the routing key limit is refused at encode
// (INVALID_ARGUMENT); method: one byte over.
#[test]
fn a_blocked_key_over_the_limit_is_refused() {
    let response = Response::DescribeQueue(described(&[b'k'; ROUTING_KEY_BYTES_MAX + 1]));
    let error = response.encode_version(CorrelationId(7), 2, &mut Vec::new()).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error:?}");
}

// Goal: partitions' lanes merge with counts summed and the oldest waiting
// age kept with its key (an empty partition changes neither); method:
// merges in both orders.
#[test]
fn lanes_merge_keeping_the_oldest_key() {
    let mut merged = LaneStats::default();
    for other in
        [lanes(2, 300, b"a"), LaneStats::default(), lanes(5, 900, b"b"), lanes(1, 10, b"c")]
    {
        merged.merge(&other);
    }
    assert_eq!((merged.active_keys, merged.blocked_keys, merged.waiting), (9, 3, 8));
    assert_eq!(
        (merged.oldest_waiting_age_ms, merged.blocked_longest_key.as_slice()),
        (900, &b"b"[..])
    );
    let mut zero_age = LaneStats::default();
    zero_age.merge(&lanes(1, 0, b"now"));
    assert_eq!(zero_age.blocked_longest_key, b"now");
}
