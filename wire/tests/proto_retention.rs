//! Retention windows on the wire (`docs/design/subscriptions.md` §5):
//! CreateQueue v2 carries the queue's `retention_ms` and `retention_bytes`,
//! DescribeQueue reports them with each partition's retained records and
//! each subscription's `lost` count. Round trips; the rule that a queue
//! without a window is created with the bytes version 1 always sent
//! (golden bytes from the codec before v2); that a window never travels in
//! an older version (refused at encode, read as none at decode); the
//! ranges refused at both ends; and that the merge of shards' rows sums
//! `lost`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod create_queue;

use create_queue::{config, create, decode, encode, hex, with_version, CREATE_V1_GOLDEN};

use spool_wire::proto::limits::{
    FRAME_HEADER_BYTES, RETENTION_BYTES_MIN, RETENTION_MS_MAX, RETENTION_MS_MIN,
};
use spool_wire::proto::{
    decode_frame, ApiKey, CorrelationId, DescribeQueueResponse, ErrorResponse, KeyMapStats,
    LaneStats, PartitionId, PartitionStats, ProtoError, QueueConfig, Reply, Response,
    RetainedStats, SubscriptionStart, SubscriptionStats, CREATE_QUEUE_VERSION_ORDERED,
    CREATE_QUEUE_VERSION_RETENTION, DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
};
use spool_wire::ErrorCode;

fn windowed(retention_ms: u64, retention_bytes: u64) -> QueueConfig {
    QueueConfig { retention_ms, retention_bytes, ..config() }
}

// Goal: CreateQueue speaks v2, newer than any broker from before windows
// speaks (they stop at v1, which a client without a window keeps using),
// and v3 (ordered lanes, `proto_ordered.rs`); its codes are unchanged
// (NOT_LEADER from v1); method: the key table.
#[test]
fn create_queue_version_2_carries_the_window() {
    assert_eq!(CREATE_QUEUE_VERSION_RETENTION, 2);
    let key = ApiKey::CreateQueue;
    assert_eq!(key.max_version(), CREATE_QUEUE_VERSION_ORDERED);
    assert!(key.supports(0) && key.supports(1) && key.supports(2) && key.supports(3));
    assert!(!key.supports(4));
    assert_eq!(key.not_leader_version(), Some(1));
    assert_eq!(key.answerable(2, ErrorCode::NotLeader), ErrorCode::NotLeader);
    assert_eq!(key.answerable(0, ErrorCode::NotLeader), ErrorCode::NotOwner);
    // A version this codec does not speak is refused by the frame decoder
    // with UNSUPPORTED_VERSION (what an old broker answers a v2 with).
    let v4 = with_version(encode(&create(windowed(60_000, 0)), 2).unwrap(), 4);
    assert_eq!(decode_frame(&v4).unwrap_err().code(), ErrorCode::UnsupportedVersion);
    assert!(!config().has_window());
    assert!(windowed(60_000, 0).has_window() && windowed(0, RETENTION_BYTES_MIN).has_window());
}

// Goal: a queue with a window round trips at v2 (by time, by size, both);
// method: encode, decode through the frame decoder, compare.
#[test]
fn windows_round_trip_at_version_2() {
    for (ms, bytes) in [
        (RETENTION_MS_MIN, 0),
        (RETENTION_MS_MAX, 0),
        (0, RETENTION_BYTES_MIN),
        (3_600_000, 1 << 30),
        (0, 0),
    ] {
        let request = create(windowed(ms, bytes));
        let v2 = encode(&request, CREATE_QUEUE_VERSION_RETENTION).unwrap();
        assert_eq!(decode(&v2).unwrap(), request, "{ms} ms, {bytes} B");
        let mut plain = Vec::new();
        request.encode(CorrelationId(7), &mut plain).unwrap();
        // A plain encode writes the newest version (v3, ordered lanes):
        // the same body for a queue that is not ordered.
        assert_eq!(plain[FRAME_HEADER_BYTES..], v2[FRAME_HEADER_BYTES..]);
    }
}

// Goal: a queue without a window is the body version 1 always sent, at
// every version, and decodes unchanged; method: golden bytes from the codec
// before v2, the same body at v0 and v2.
#[test]
fn a_queue_without_a_window_keeps_the_old_bytes() {
    let request = create(config());
    let v1 = encode(&request, 1).unwrap();
    assert_eq!(hex(&v1), CREATE_V1_GOLDEN);
    for version in [0, 2] {
        let other = encode(&request, version).unwrap();
        assert_eq!(other[FRAME_HEADER_BYTES..], v1[FRAME_HEADER_BYTES..], "v{version}");
        assert_eq!(decode(&other).unwrap(), request);
    }
}

// Goal: a window never travels in an older version: the encoder refuses to
// write one below v2 (it would create a queue without it), and a v0/v1
// frame whose body carries one (a v2 body under an old header) reads as a
// queue without a window, as a broker of that version reads it; method:
// both directions, each window kind.
#[test]
fn older_versions_carry_no_window() {
    for window in [windowed(60_000, 0), windowed(0, RETENTION_BYTES_MIN), windowed(5_000, 1 << 30)]
    {
        let request = create(window);
        let v2 = encode(&request, CREATE_QUEUE_VERSION_RETENTION).unwrap();
        for version in [0, 1] {
            let refused = encode(&request, version).unwrap_err();
            assert!(matches!(refused, ProtoError::Inconsistent(_)), "{refused:?}");
            assert_eq!(refused.code(), ErrorCode::InvalidArgument);
            let old = with_version(v2.clone(), version);
            assert_eq!(decode(&old).unwrap(), create(config()), "v{version}");
        }
    }
}

// Goal: windows outside their ranges are refused at encode and at decode
// with INVALID_ARGUMENT (the connection kept): under the shortest, over the
// longest, a size under the smallest; the bounds themselves pass; method:
// encode each, and decode a v2 body whose window a foreign encoder wrote
// (the good bytes with the value patched in place).
#[test]
fn windows_out_of_range_are_refused() {
    for (ms, bytes, field) in [
        (10, 0, "retention_ms"),
        (RETENTION_MS_MIN - 1, 0, "retention_ms"),
        (RETENTION_MS_MAX + 1, 0, "retention_ms"),
        (0, 1, "retention_bytes"),
        (0, RETENTION_BYTES_MIN - 1, "retention_bytes"),
        (60_000, 4096, "retention_bytes"),
    ] {
        let error = encode(&create(windowed(ms, bytes)), 2).unwrap_err();
        assert!(
            matches!(error, ProtoError::OutOfRange { field: f, .. } if f == field),
            "{ms} ms, {bytes} B: {error:?}"
        );
        assert_eq!(error.code(), ErrorCode::InvalidArgument);
        assert!(!error.closes_connection());
    }
    let message = encode(&create(windowed(10, 0)), 2).unwrap_err().to_string();
    assert_eq!(
        message,
        format!("retention_ms = 10 outside {RETENTION_MS_MIN}..={RETENTION_MS_MAX}")
    );
    // A decoder meets a 10 ms window: the bytes of a 1001 ms one with the
    // value replaced (1001 = 0x3e9 appears once, as the window).
    let good = encode(&create(windowed(1001, 0)), 2).unwrap();
    let needle = 1001u64.to_le_bytes();
    let at = good.windows(8).position(|window| window == needle).unwrap();
    assert_eq!(good.windows(8).filter(|window| *window == needle).count(), 1);
    let mut broken = good.clone();
    broken[at..at + 8].copy_from_slice(&10u64.to_le_bytes());
    let error = decode(&broken).unwrap_err();
    assert!(matches!(error, ProtoError::OutOfRange { field: "retention_ms", .. }), "{error:?}");
    assert!(!error.closes_connection());
}

fn partition(index: u32, retained: RetainedStats) -> PartitionStats {
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
        retained,
        lanes: LaneStats::default(),
    }
}

fn row(name: &str, id: u16, lost: u64) -> SubscriptionStats {
    SubscriptionStats {
        name: name.into(),
        id,
        start: SubscriptionStart::Earliest,
        partitions: 1,
        ready: 3,
        scheduled: 0,
        claimed: 0,
        dead_letters: 0,
        oldest_ready_age_ms: 10,
        oldest_claim_age_ms: 0,
        acked: 2,
        lost,
    }
}

fn described() -> DescribeQueueResponse {
    DescribeQueueResponse {
        name: "events".into(),
        config: windowed(60_000, 1 << 30),
        partitions: vec![
            partition(0, RetainedStats { messages: 120, bytes: 61_440, oldest_age_ms: 59_000 }),
            partition(1, RetainedStats::default()),
        ],
        keys: KeyMapStats { version: 1, draining: vec![], held_from: 2 },
        subscriptions: vec![row("default", 0, 0), row("late", 1, 37)],
    }
}

// Goal: DescribeQueue reports the window, each partition's retained
// records and each subscription's `lost`; v0 and v1 carry the window and
// the retained records too (fields only appended), and, as before, no
// subscription rows; method: encode at each version, decode, compare.
#[test]
fn describe_reports_the_window_retained_and_lost() {
    let response = Response::DescribeQueue(described());
    for version in 0..=DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS {
        let mut bytes = Vec::new();
        response.encode_version(CorrelationId(7), version, &mut bytes).unwrap();
        let Reply::Ok(Response::DescribeQueue(decoded)) =
            Response::decode(&decode_frame(&bytes).unwrap()).unwrap().reply
        else {
            panic!("not a DescribeQueue answer")
        };
        let mut want = described();
        if version < DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS {
            want.subscriptions.clear();
        }
        assert_eq!(decoded, want, "v{version}");
    }
}

// Goal: a shard's rows merge into another's with `lost` summed (two
// shards' partitions of the same subscription); method: merge two rows.
#[test]
fn merged_rows_sum_lost() {
    let mut merged = row("late", 1, 37);
    merged.merge(&row("late", 1, 5));
    assert_eq!((merged.lost, merged.partitions, merged.ready), (42, 2, 6));
}

// Goal: the refusal an old broker answers a v2 CreateQueue with reaches
// the client as UNSUPPORTED_VERSION; method: the error reply encoded as a
// broker writes it for key 16 v2, decoded.
#[test]
fn unsupported_version_reaches_the_client() {
    let mut bytes = Vec::new();
    ErrorResponse::new(ErrorCode::UnsupportedVersion, "api key 16 version 2 unsupported")
        .encode(CorrelationId(2), ApiKey::CreateQueue.as_u16(), 2, &mut bytes)
        .unwrap();
    let Reply::Err(error) = Response::decode(&decode_frame(&bytes).unwrap()).unwrap().reply else {
        panic!("not an error")
    };
    assert_eq!(error.code, ErrorCode::UnsupportedVersion);
}
