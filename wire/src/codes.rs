//! Stable numeric error codes: the only error vocabulary that crosses the wire.
//!
//! This module owns the table of codes a broker may put in a response header or
//! in a per-item result (per ack token, per enqueued record). It does not decide
//! *when* a code is sent — the broker does — and it is not the Rust error type of
//! any crate: crates keep their own `thiserror` enums and map them onto a code at
//! the edge.
//!
//! # The stability rule
//!
//! A code's number is forever. Codes are only ever appended; a code that stops
//! being used is retired (kept in the table, commented as retired) and its number
//! is never given to anything else. Clients in other languages switch on these
//! numbers, so renumbering would silently change their behaviour. A test pins
//! every value.
//!
//! A new code may be sent only in a response to a request whose api version
//! postdates the code, so a decoder may treat an unknown code as a malformed
//! frame: an old client never sees a code it cannot name.

/// A stable wire error code (`u16`). See the module doc for the stability rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Success.
    None = 0,
    /// The frame could not be parsed (bad header, bad body layout, trailing bytes).
    MalformedFrame = 1,
    /// The api version in the header is not supported for that api key.
    UnsupportedVersion = 2,
    /// The api key in the header names no operation.
    UnknownApi = 3,
    /// The frame's declared length exceeds the receiver's frame limit.
    FrameTooLarge = 4,
    /// A field is outside its allowed range or charset.
    InvalidArgument = 5,
    /// The named queue does not exist.
    QueueNotFound = 6,
    /// A queue with that name already exists.
    QueueExists = 7,
    /// The queue exists but has no such partition.
    PartitionNotFound = 8,
    /// This shard does not own the partition; the reply names the owner.
    NotOwner = 9,
    /// The queue is at its `max_messages` or `max_bytes`, counting every
    /// message it holds: main lane and dead letters alike.
    QueueFull = 10,
    /// The broker's disk reserve is reached.
    DiskFull = 11,
    /// The token's claim generation or leader epoch is no longer current.
    StaleToken = 12,
    /// The token failed authentication or names another queue/partition.
    InvalidToken = 13,
    /// The requested lease is outside the queue's lease range.
    LeaseOutOfRange = 14,
    /// Extending would exceed the queue's `max_lease_lifetime`.
    LeaseLifetimeExceeded = 15,
    /// The record batch failed validation (crc, layout, record checks).
    BatchInvalid = 16,
    /// A record exceeds the record size limit.
    RecordTooLarge = 17,
    /// The broker refuses new connections past its connection limit.
    TooManyConnections = 18,
    /// The broker asks the client to slow down.
    Throttled = 19,
    /// The operation did not complete in time; its outcome is unknown.
    Timeout = 20,
    /// The broker is shutting down and accepts no new work.
    ShuttingDown = 21,
    /// The broker's storage failed; the outcome of this request is unknown.
    StorageFailed = 22,
    /// A broker bug; the outcome of this request is unknown.
    Internal = 23,
    /// The connection has not authenticated (authentication is on and the
    /// first request was not Authenticate), or its credentials were
    /// refused. The connection is closed after this answer.
    Unauthenticated = 24,
    /// The authenticated principal may not do this operation on this queue.
    PermissionDenied = 25,
    /// The principal's quota (a rate of enqueue, or claims in flight) is
    /// used up on this shard; the message names the quota and says after
    /// how many milliseconds to retry.
    QuotaExceeded = 26,
    /// This node holds a replica of the partition (or of the cluster's
    /// catalog) but does not lead it; the reply names the leader when one
    /// is known. Sent only at the versions
    /// [`ApiKey::not_leader_version`](crate::proto::ApiKey::not_leader_version)
    /// names: an older request gets [`ErrorCode::NotOwner`] in its place.
    NotLeader = 27,
    /// The record's routing key belongs to another partition of the queue
    /// since the queue was resized: refresh the queue's metadata and send
    /// the record to the partition its key maps to under the new partition
    /// count. Sent only for Enqueue at
    /// [`ENQUEUE_VERSION_KEY_MOVED`](crate::proto::ENQUEUE_VERSION_KEY_MOVED)
    /// and later: an older request gets [`ErrorCode::NotOwner`] in its place.
    KeyMoved = 28,
    /// The queue has no subscription of the name the request gave. Sent
    /// only to a Claim of
    /// [`CLAIM_VERSION_SUBSCRIPTION`](crate::proto::CLAIM_VERSION_SUBSCRIPTION)
    /// or later, the first version that names a subscription, to Peek,
    /// Purge, DeadLetters and Redrive of
    /// [`INSPECT_VERSION_SUBSCRIPTION`](crate::proto::INSPECT_VERSION_SUBSCRIPTION)
    /// or later, and to CreateSubscription and DeleteSubscription (keys
    /// newer than the code); anything else gets
    /// [`ErrorCode::InvalidArgument`] in its place
    /// ([`ApiKey::answerable`](crate::proto::ApiKey::answerable)).
    SubscriptionNotFound = 29,
    /// The connection holds no open session of the id a Session heartbeat
    /// or close named: it timed out, was closed, or was never opened on
    /// this connection; its claims were released. Open a new one. Sent
    /// only to Session (api key 9, newer than the code); anything else
    /// gets [`ErrorCode::InvalidArgument`] in its place.
    SessionNotFound = 30,
    /// A newer session of the same member (same queue and subscription)
    /// was opened on this shard and ended this one, releasing its claims:
    /// this consumer was replaced. Sent only to Session, like
    /// [`ErrorCode::SessionNotFound`].
    SessionFenced = 31,
    /// The ordered queue's partition has its most active routing keys
    /// (keys with a message held in the partition): a message whose key
    /// has none there is refused until one of them finishes; messages of
    /// active keys and unkeyed messages are still accepted. Sent only to
    /// Enqueue at
    /// [`ENQUEUE_VERSION_KEYS_FULL`](crate::proto::ENQUEUE_VERSION_KEYS_FULL)
    /// and later: an older request gets [`ErrorCode::QueueFull`] in its
    /// place.
    ActiveKeysFull = 32,
}

/// Static facts about one code: its stable name, a one-line description and
/// whether a client may retry the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCodeInfo {
    /// The code.
    pub code: ErrorCode,
    /// SCREAMING_SNAKE name, as used in docs and other languages' bindings.
    pub name: &'static str,
    /// One line for operators.
    pub description: &'static str,
    /// Whether sending the same request again may succeed. Retrying is always
    /// safe for enqueue (message ids dedupe) and for ack/extend/release (tokens
    /// are idempotent or rejected as stale); this flag says whether it is useful.
    pub retriable: bool,
}

/// Every code, in numeric order. Index `i` holds code `i`.
pub const ERROR_CODES: &[ErrorCodeInfo] = &[
    info(ErrorCode::None, "NONE", "success", false),
    info(ErrorCode::MalformedFrame, "MALFORMED_FRAME", "the frame could not be parsed", false),
    info(
        ErrorCode::UnsupportedVersion,
        "UNSUPPORTED_VERSION",
        "api version not supported for this api key",
        false,
    ),
    info(ErrorCode::UnknownApi, "UNKNOWN_API", "the api key names no operation", false),
    info(ErrorCode::FrameTooLarge, "FRAME_TOO_LARGE", "frame longer than the frame limit", false),
    info(ErrorCode::InvalidArgument, "INVALID_ARGUMENT", "a field is out of range", false),
    info(ErrorCode::QueueNotFound, "QUEUE_NOT_FOUND", "no such queue", false),
    info(ErrorCode::QueueExists, "QUEUE_EXISTS", "a queue with that name exists", false),
    info(ErrorCode::PartitionNotFound, "PARTITION_NOT_FOUND", "no such partition", false),
    info(
        ErrorCode::NotOwner,
        "NOT_OWNER",
        "this shard does not own the partition; refresh metadata and retry at the owner",
        true,
    ),
    info(
        ErrorCode::QueueFull,
        "QUEUE_FULL",
        "queue at max_messages or max_bytes (dead letters count)",
        true,
    ),
    info(ErrorCode::DiskFull, "DISK_FULL", "broker disk reserve reached", true),
    info(ErrorCode::StaleToken, "STALE_TOKEN", "claim generation or epoch superseded", false),
    info(ErrorCode::InvalidToken, "INVALID_TOKEN", "token not authentic or out of scope", false),
    info(
        ErrorCode::LeaseOutOfRange,
        "LEASE_OUT_OF_RANGE",
        "lease outside the queue's lease range",
        false,
    ),
    info(
        ErrorCode::LeaseLifetimeExceeded,
        "LEASE_LIFETIME_EXCEEDED",
        "extension would pass max_lease_lifetime",
        false,
    ),
    info(ErrorCode::BatchInvalid, "BATCH_INVALID", "record batch failed validation", false),
    info(ErrorCode::RecordTooLarge, "RECORD_TOO_LARGE", "a record exceeds the size limit", false),
    info(ErrorCode::TooManyConnections, "TOO_MANY_CONNECTIONS", "connection limit reached", true),
    info(ErrorCode::Throttled, "THROTTLED", "slow down and retry", true),
    info(ErrorCode::Timeout, "TIMEOUT", "did not complete in time; outcome unknown", true),
    info(ErrorCode::ShuttingDown, "SHUTTING_DOWN", "broker shutting down", true),
    info(ErrorCode::StorageFailed, "STORAGE_FAILED", "storage failed; outcome unknown", true),
    info(ErrorCode::Internal, "INTERNAL", "broker bug; outcome unknown", false),
    info(
        ErrorCode::Unauthenticated,
        "UNAUTHENTICATED",
        "authenticate first, with a known principal and its secret; the connection closes",
        false,
    ),
    info(
        ErrorCode::PermissionDenied,
        "PERMISSION_DENIED",
        "the principal may not do this operation on this queue",
        false,
    ),
    info(
        ErrorCode::QuotaExceeded,
        "QUOTA_EXCEEDED",
        "the principal's quota is used up; retry after the time the message names",
        true,
    ),
    info(
        ErrorCode::NotLeader,
        "NOT_LEADER",
        "this node holds a replica but does not lead it; the reply names the leader",
        true,
    ),
    info(
        ErrorCode::KeyMoved,
        "KEY_MOVED",
        "the queue was resized and the record's key now maps to another partition; \
         refresh metadata and route it again",
        true,
    ),
    info(ErrorCode::SubscriptionNotFound, "SUBSCRIPTION_NOT_FOUND", "no such subscription", false),
    info(
        ErrorCode::SessionNotFound,
        "SESSION_NOT_FOUND",
        "no open session of that id on this connection (timed out or closed); open a new one",
        false,
    ),
    info(
        ErrorCode::SessionFenced,
        "SESSION_FENCED",
        "a newer session of the same member replaced this one; its claims were released",
        false,
    ),
    info(
        ErrorCode::ActiveKeysFull,
        "ACTIVE_KEYS_FULL",
        "the ordered partition has its most active keys; a new key waits until one finishes",
        true,
    ),
];

const fn info(
    code: ErrorCode,
    name: &'static str,
    description: &'static str,
    retriable: bool,
) -> ErrorCodeInfo {
    ErrorCodeInfo { code, name, description, retriable }
}

// The table is indexed by code: a gap or a misordered row is a build error.
const _: () = {
    let mut index = 0;
    while index < ERROR_CODES.len() {
        assert!(ERROR_CODES[index].code as usize == index);
        index += 1;
    }
};

impl ErrorCode {
    /// The stable number on the wire.
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// The code with this number, or `None` for a number no code has.
    pub fn from_u16(value: u16) -> Option<Self> {
        ERROR_CODES.get(usize::from(value)).map(|row| row.code)
    }

    /// The table row of this code.
    pub fn info(self) -> &'static ErrorCodeInfo {
        // The const block above proves row `i` holds code `i`.
        &ERROR_CODES[usize::from(self.as_u16())]
    }

    /// The stable SCREAMING_SNAKE name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// One-line description.
    pub fn description(self) -> &'static str {
        self.info().description
    }

    /// Whether a client may usefully retry the same request.
    pub fn is_retriable(self) -> bool {
        self.info().retriable
    }
}

/// What precedes the wait in a `QUOTA_EXCEEDED` message: `...; retry after
/// 250 ms`. Clients read the hint with [`parse_retry_after_ms`].
pub const RETRY_AFTER_MARK: &str = "retry after ";

/// The wait a `QUOTA_EXCEEDED` message names (`retry after N ms`), if any.
pub fn parse_retry_after_ms(message: &str) -> Option<u64> {
    let (_, rest) = message.rsplit_once(RETRY_AFTER_MARK)?;
    let digits = rest.strip_suffix(" ms")?;
    digits.parse().ok()
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}({})", self.name(), self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: pin every code's number and name forever; method: an explicit table
    // that must be edited (append-only) whenever a code is added.
    #[test]
    fn codes_are_pinned() {
        let pinned: &[(u16, &str)] = &[
            (0, "NONE"),
            (1, "MALFORMED_FRAME"),
            (2, "UNSUPPORTED_VERSION"),
            (3, "UNKNOWN_API"),
            (4, "FRAME_TOO_LARGE"),
            (5, "INVALID_ARGUMENT"),
            (6, "QUEUE_NOT_FOUND"),
            (7, "QUEUE_EXISTS"),
            (8, "PARTITION_NOT_FOUND"),
            (9, "NOT_OWNER"),
            (10, "QUEUE_FULL"),
            (11, "DISK_FULL"),
            (12, "STALE_TOKEN"),
            (13, "INVALID_TOKEN"),
            (14, "LEASE_OUT_OF_RANGE"),
            (15, "LEASE_LIFETIME_EXCEEDED"),
            (16, "BATCH_INVALID"),
            (17, "RECORD_TOO_LARGE"),
            (18, "TOO_MANY_CONNECTIONS"),
            (19, "THROTTLED"),
            (20, "TIMEOUT"),
            (21, "SHUTTING_DOWN"),
            (22, "STORAGE_FAILED"),
            (23, "INTERNAL"),
            (24, "UNAUTHENTICATED"),
            (25, "PERMISSION_DENIED"),
            (26, "QUOTA_EXCEEDED"),
            (27, "NOT_LEADER"),
            (28, "KEY_MOVED"),
            (29, "SUBSCRIPTION_NOT_FOUND"),
            (30, "SESSION_NOT_FOUND"),
            (31, "SESSION_FENCED"),
            (32, "ACTIVE_KEYS_FULL"),
        ];
        assert_eq!(pinned.len(), ERROR_CODES.len());
        for &(number, name) in pinned {
            let code = ErrorCode::from_u16(number).unwrap();
            assert_eq!(code.as_u16(), number);
            assert_eq!(code.name(), name);
        }
        assert_eq!(ErrorCode::NotOwner as u16, 9);
        assert_eq!(ErrorCode::Internal as u16, 23);
        assert_eq!(ErrorCode::Unauthenticated as u16, 24);
        assert_eq!(ErrorCode::PermissionDenied as u16, 25);
        assert_eq!(ErrorCode::QuotaExceeded as u16, 26);
        assert_eq!(ErrorCode::NotLeader as u16, 27);
        assert_eq!(ErrorCode::KeyMoved as u16, 28);
        assert_eq!(ErrorCode::SubscriptionNotFound as u16, 29);
        assert_eq!(ErrorCode::SessionNotFound as u16, 30);
        assert_eq!(ErrorCode::SessionFenced as u16, 31);
        assert_eq!(ErrorCode::ActiveKeysFull as u16, 32);
    }

    // Goal: the retry hint of a quota refusal reads back; anything else is
    // no hint.
    #[test]
    fn retry_hints_parse() {
        assert_eq!(parse_retry_after_ms("quota x used up; retry after 250 ms"), Some(250));
        assert_eq!(parse_retry_after_ms("retry after soon"), None);
        assert_eq!(parse_retry_after_ms("no hint"), None);
    }

    // Goal: numbers and names are unique; method: collect both into sets.
    #[test]
    fn codes_and_names_are_unique() {
        let numbers: std::collections::BTreeSet<u16> =
            ERROR_CODES.iter().map(|row| row.code.as_u16()).collect();
        let names: std::collections::BTreeSet<&str> =
            ERROR_CODES.iter().map(|row| row.name).collect();
        assert_eq!(numbers.len(), ERROR_CODES.len());
        assert_eq!(names.len(), ERROR_CODES.len());
        assert!(ErrorCode::from_u16(ERROR_CODES.len() as u16).is_none());
        assert!(ErrorCode::from_u16(u16::MAX).is_none());
    }

    // Goal: the retry column says what the clients rely on; method: spot checks.
    #[test]
    fn retry_flags() {
        assert!(ErrorCode::QueueFull.is_retriable());
        assert!(ErrorCode::NotOwner.is_retriable());
        assert!(ErrorCode::NotLeader.is_retriable());
        assert!(ErrorCode::KeyMoved.is_retriable());
        assert!(ErrorCode::ActiveKeysFull.is_retriable());
        assert!(!ErrorCode::StaleToken.is_retriable());
        assert!(!ErrorCode::SubscriptionNotFound.is_retriable());
        assert!(!ErrorCode::MalformedFrame.is_retriable());
        assert!(ERROR_CODES.iter().all(|row| !row.description.is_empty()));
    }
}
