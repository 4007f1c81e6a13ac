//! Peek, Purge, DeadLetters and Redrive v2: the request names a
//! subscription. Round trips, the rule that a request for the default is
//! the bytes version 1 always sent (golden bytes from the codec before v2),
//! that an older version decodes as the default whatever its bytes hold,
//! refusals at encode and decode, and the codes each version may receive.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use spool_wire::proto::limits::FRAME_HEADER_BYTES;
use spool_wire::proto::{
    decode_frame, ApiKey, CorrelationId, DeadLettersRequest, ErrorResponse, Offset, PartitionId,
    PeekRequest, ProtoError, PurgeRequest, RedriveRequest, RedriveTarget, Reply, Request, Response,
    INSPECT_VERSION_SUBSCRIPTION,
};
use spool_wire::ErrorCode;

const KEYS: [ApiKey; 4] = [ApiKey::Peek, ApiKey::Purge, ApiKey::DeadLetters, ApiKey::Redrive];

/// One request of each key, naming `sub` (`""`: the default); the values
/// the golden bytes below were taken from.
fn requests(sub: &str) -> Vec<Request<'static>> {
    vec![
        Request::Peek(PeekRequest {
            queue: "jobs".into(),
            partition: PartitionId(2),
            from_offset: Offset(1234),
            max: 100,
            subscription: sub.into(),
        }),
        Request::Purge(PurgeRequest {
            queue: "jobs".into(),
            partition: PartitionId(1),
            dry_run: true,
            subscription: sub.into(),
        }),
        Request::DeadLetters(DeadLettersRequest {
            queue: "jobs".into(),
            partition: PartitionId(0),
            from_offset: Offset(7),
            max: 1000,
            subscription: sub.into(),
        }),
        Request::Redrive(RedriveRequest {
            queue: "jobs".into(),
            partition: PartitionId(3),
            target: RedriveTarget::Offsets(vec![Offset(3), Offset(99)]),
            subscription: sub.into(),
        }),
    ]
}

/// Version-1 frames (correlation id 7) of `requests("")` written by the
/// codec before version 2 existed.
const V1_GOLDEN: [&str; 4] = [
    "500000001500010007000000000000000000000038000000100000000c001c000400080010000c000c0000001800\
     00000200000064000000d20400000000000000000000040000006a6f627300000000",
    "48000000160001000700000000000000000000002c0000001000000000000a00100008000c0007000a0000000000\
     00010800000001000000040000006a6f62730000000000000000",
    "50000000170001000700000000000000000000003800000014000000000000000c001800040000000c0008000c00\
     000014000000e8030000070000000000000000000000040000006a6f627300000000",
    "60000000180001000700000000000000000000004800000014000000000000000c0010000400080000000c000c00\
     0000240000000300000004000000020000000300000000000000630000000000000000000000040000006a6f6273\
     00000000",
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn encode(request: &Request<'_>, version: u16) -> Result<Vec<u8>, ProtoError> {
    let mut bytes = Vec::new();
    request.encode_version(CorrelationId(7), version, &mut bytes)?;
    Ok(bytes)
}

fn decode(bytes: &[u8]) -> Request<'_> {
    Request::decode(&decode_frame(bytes).unwrap()).unwrap()
}

/// `bytes` with the header's api version replaced.
fn with_version(mut bytes: Vec<u8>, version: u16) -> Vec<u8> {
    bytes[6..8].copy_from_slice(&version.to_le_bytes());
    bytes
}

// Goal: the four keys speak v2, which alone may be answered
// SUBSCRIPTION_NOT_FOUND; NOT_LEADER is still theirs from v1; method: the
// key table's own answers.
#[test]
fn keys_and_versions() {
    assert_eq!(INSPECT_VERSION_SUBSCRIPTION, 2);
    let missing = ErrorCode::SubscriptionNotFound;
    for key in KEYS {
        assert_eq!(key.max_version(), INSPECT_VERSION_SUBSCRIPTION, "{key:?}");
        assert!(key.supports(0) && key.supports(1) && key.supports(2) && !key.supports(3));
        assert_eq!(key.not_leader_version(), Some(1));
        assert_eq!(key.answerable(2, missing), missing, "{key:?}");
        assert_eq!(key.answerable(1, missing), ErrorCode::InvalidArgument, "{key:?}");
        assert_eq!(key.answerable(0, missing), ErrorCode::InvalidArgument, "{key:?}");
        assert_eq!(key.answerable(2, ErrorCode::NotLeader), ErrorCode::NotLeader);
        assert_eq!(key.answerable(0, ErrorCode::NotLeader), ErrorCode::NotOwner);
    }
}

// Goal: a request naming a subscription round trips at v2, each key;
// method: encode, decode through the frame decoder, compare.
#[test]
fn named_requests_round_trip() {
    for sub in ["audit", "default", "a.b-c_9"] {
        for request in requests(sub) {
            let bytes = encode(&request, INSPECT_VERSION_SUBSCRIPTION).unwrap();
            assert_eq!(decode(&bytes), request, "{sub}");
            // The newest version is what a plain encode writes.
            let mut plain = Vec::new();
            request.encode(CorrelationId(7), &mut plain).unwrap();
            assert_eq!(plain, bytes);
        }
    }
}

// Goal: a request for the default is, at v0, v1 and v2, the body version 1
// always sent, and decodes as the default; method: golden bytes from the
// codec before v2, the same body at each version.
#[test]
fn default_requests_keep_the_old_bytes() {
    for (request, golden) in requests("").iter().zip(V1_GOLDEN) {
        let golden = golden.replace(' ', "");
        let v1 = encode(request, 1).unwrap();
        assert_eq!(hex(&v1), golden, "{:?}", request.api_key());
        for version in [0, 2] {
            let other = encode(request, version).unwrap();
            assert_eq!(other[FRAME_HEADER_BYTES..], v1[FRAME_HEADER_BYTES..]);
            assert_eq!(&decode(&other), request);
        }
        assert_eq!(&decode(&v1), request);
    }
}

// Goal: an older version never acts in a named subscription: the encoder
// refuses to write one below v2, and a v0/v1 frame whose body carries the
// field (a v2 body under an old header) decodes as the default; method:
// each key, both directions.
#[test]
fn older_versions_act_in_the_default() {
    for (named, default) in requests("audit").iter().zip(requests("")) {
        for version in [0, 1] {
            let refused = encode(named, version).unwrap_err();
            assert!(matches!(refused, ProtoError::Inconsistent(_)), "{refused:?}");
            let v2 = encode(named, INSPECT_VERSION_SUBSCRIPTION).unwrap();
            assert_eq!(decode(&with_version(v2, version)), default, "v{version}");
        }
    }
}

// Goal: a bad subscription name is refused at encode (INVALID_ARGUMENT)
// and at decode; method: names outside the character set and too long.
#[test]
fn bad_subscription_names_are_refused() {
    for bad in ["no spaces", "ü", &"x".repeat(129)] {
        for request in requests(bad) {
            let error = encode(&request, INSPECT_VERSION_SUBSCRIPTION).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{bad}: {error:?}");
        }
    }
    // A decoder meets the bad name a foreign encoder wrote: the good
    // request's bytes with the name's bytes replaced in place.
    for request in requests("audit") {
        let bytes = encode(&request, INSPECT_VERSION_SUBSCRIPTION).unwrap();
        let at = bytes.windows(5).position(|window| window == b"audit").unwrap();
        let mut broken = bytes.clone();
        broken[at..at + 5].copy_from_slice(b"au it");
        let error = Request::decode(&decode_frame(&broken).unwrap()).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error:?}");
    }
}

// Goal: SUBSCRIPTION_NOT_FOUND reaches a v2 request as itself and a v1
// request as INVALID_ARGUMENT; method: error replies encoded as the
// broker writes them, decoded.
#[test]
fn error_replies_keep_the_code_their_version_knows() {
    for key in KEYS {
        for (version, want) in [
            (2, ErrorCode::SubscriptionNotFound),
            (1, ErrorCode::InvalidArgument),
            (0, ErrorCode::InvalidArgument),
        ] {
            let mut bytes = Vec::new();
            ErrorResponse::new(ErrorCode::SubscriptionNotFound, "no")
                .encode(CorrelationId(2), key.as_u16(), version, &mut bytes)
                .unwrap();
            let decoded = Response::decode(&decode_frame(&bytes).unwrap()).unwrap();
            let Reply::Err(error) = decoded.reply else { panic!("not an error") };
            assert_eq!(error.code, want, "{key:?} v{version}");
        }
    }
}
