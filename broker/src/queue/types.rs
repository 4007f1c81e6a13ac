//! Identities, positions and small value types of the queue state machine.
//!
//! Newtypes keep an offset from being passed where a generation is expected;
//! time stays a plain `Millis` with `_ms` names because arithmetic on it is
//! everywhere and a newtype there would only add noise. The identities the
//! wire carries too (offset, partition, worker, leader epoch, message id) are the wire's
//! own types, re-exported here: one definition each in the workspace.

/// Milliseconds on the broker clock (`crate::clock`'s one definition).
/// `queue/` never reads a clock: every decision takes `now: Millis` as an
/// argument.
pub use crate::clock::Millis;

/// Producer-chosen message id, the dedupe key (the record's own id).
pub use spool_wire::batch::MessageId;
pub use spool_wire::proto::{LeaderEpoch, Offset, PartitionId, WorkerId};

/// Claim generation of one message: incremented by every claim, never reset
/// (not even by redrive), so a token of an earlier claim can never match again.
///
/// 32 bits here, 64 on the wire ([`spool_wire::proto::Generation`]): the
/// queue keeps it in every claimed message's state, in its events and in
/// the 64-byte delivery token, where 4 bytes matter, and a message reaches
/// 2^32 claims only after billions of redrives (each claim is fenced by
/// the generation *and* the token's MAC, and the increment wraps). The
/// wire reserves 64 bits so the protocol outlives this choice; the one
/// conversion is the `From` below (widening, never lossy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u32);

impl From<Generation> for spool_wire::proto::Generation {
    fn from(generation: Generation) -> Self {
        Self(u64::from(generation.0))
    }
}

/// Identity of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub u32);

/// Identity of a subscription within its queue
/// (`docs/design/subscriptions.md`): allocated per queue, never reused;
/// 0 is the default subscription every queue has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubscriptionId(pub u16);

impl SubscriptionId {
    /// The subscription every queue has (`default`): the only one before
    /// subscriptions existed, so every older event and token names it.
    pub const DEFAULT: Self = Self(0);
}

/// Why a claim ended without an ack. Values below [`ReleaseReason::RESERVED_MIN`]
/// are application codes carried opaquely; the top of the range is reserved
/// for the broker's own causes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseReason(pub u16);

impl ReleaseReason {
    /// No reason recorded (never released).
    pub const NONE: Self = Self(0);
    /// First code the broker reserves for itself.
    pub const RESERVED_MIN: u16 = 0xFFF0;
    /// The lease ran out: the worker neither acked nor released in time.
    pub const LEASE_EXPIRED: Self = Self(0xFFFF);
    /// The message's expiry passed.
    pub const EXPIRED: Self = Self(0xFFFE);
    /// The partition reopened under a new leader epoch while the message
    /// was claimed: nobody can ack the old claim, so open released it
    /// (the epoch fence, `docs/design/queue-semantics.md`).
    pub const EPOCH_FENCED: Self = Self(0xFFFD);
    /// The consumer session the claim was made in ended (its heartbeat
    /// timed out, its connection ended, it was closed, or its member
    /// rejoined): released at once, counted like a lease expiry
    /// (`docs/design/sessions.md`).
    pub const SESSION_ENDED: Self = Self(0xFFFC);
}

/// Which of the partition's two queues a message or token belongs to: the
/// queue itself or its dead-letter queue. Both are kept by the same partition,
/// keyed by the original offset, so quarantine is one event and the record
/// bytes never move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Lane {
    /// The queue's normal serving state.
    Main = 0,
    /// The queue's dead-letter queue.
    DeadLetter = 1,
}

/// Plain numbers in messages (`offset 99`, not `Offset(99)`): errors and
/// logs print these values to users.
macro_rules! display_inner {
    ($($name:ident),*) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.0, formatter)
            }
        }
    )*};
}
display_inner!(Generation, QueueId, SubscriptionId);

impl std::fmt::Display for Lane {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Lane::Main => "main",
            Lane::DeadLetter => "dead-letter",
        })
    }
}

impl Lane {
    /// Decodes the lane byte of an event or token.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Main),
            1 => Some(Self::DeadLetter),
            _ => None,
        }
    }
}

/// Why a message was moved to the dead-letter queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum QuarantineCause {
    /// `max_deliveries` claims ended without an ack.
    Deliveries = 1,
    /// The expiry passed and the queue dead-letters expired messages.
    Expired = 2,
}

impl QuarantineCause {
    /// Decodes the cause byte of a `Quarantined` event.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::Deliveries),
            2 => Some(Self::Expired),
            _ => None,
        }
    }
}

/// What a producer asks to enqueue, as the partition extracts it from a data
/// record before the log has assigned an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnqueueRequest {
    pub message_id: MessageId,
    /// Priority band, 0 = highest.
    pub priority: u8,
    /// Not deliverable before this time; at or before the enqueue time means now.
    pub not_before_ms: Millis,
    /// Never delivered at or after this time. `None`: never expires.
    pub expiry_ms: Option<Millis>,
    /// Size of the record on disk, counted against `max_bytes`.
    pub size_bytes: u32,
}

/// What the partition extracts from an appended data record: the request plus
/// the offset and enqueue time the log assigned. Fed to
/// `PartitionState::apply(&Event::Enqueued(meta))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnqueueMeta {
    pub offset: Offset,
    pub message_id: MessageId,
    pub priority: u8,
    pub not_before_ms: Millis,
    pub expiry_ms: Option<Millis>,
    pub enqueue_time_ms: Millis,
    pub size_bytes: u32,
    /// The record's routing key as an ordered lane knows it; `None`
    /// without a key (or where no lane needs it: the partition sets it
    /// for every keyed record, see [`OrderKey::of`]).
    pub key: Option<OrderKey>,
}

impl EnqueueMeta {
    /// Joins a checked request with the position and time the log assigned.
    pub fn new(request: &EnqueueRequest, offset: Offset, enqueue_time_ms: Millis) -> Self {
        Self {
            offset,
            message_id: request.message_id,
            priority: request.priority,
            not_before_ms: request.not_before_ms,
            expiry_ms: request.expiry_ms,
            enqueue_time_ms,
            size_bytes: request.size_bytes,
            key: None,
        }
    }

    /// The same, with the record's routing key (`OrderKey::of`).
    #[must_use]
    pub fn with_key(mut self, key: Option<OrderKey>) -> Self {
        self.key = key;
        self
    }
}

/// A routing key as an ordered lane knows it (`state/lanes.rs`): 64 bits
/// of SipHash-1-3 under fixed keys, a function its specification fixes, so
/// every replay, replica and later version computes the same value from
/// the record's bytes. Two keys with one hash share a lane: their
/// messages are then ordered together (never less ordered than asked);
/// at 10 million active keys in a partition that happens with a
/// probability near 3·10⁻⁶.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderKey(pub u64);

impl OrderKey {
    /// Fixed SipHash keys: the hash must never change (it is recomputed
    /// from the log on every replay; snapshots store it).
    const SIP_K0: u64 = 0x7370_6f6f_6c2d_6c61; // "spool-la"
    const SIP_K1: u64 = 0x6e65_2d6b_6579_2d31; // "ne-key-1"

    /// The lane key of `routing_key`; `None` for an empty key (an
    /// unkeyed message is never ordered).
    pub fn of(routing_key: &[u8]) -> Option<Self> {
        use std::hash::Hasher;
        if routing_key.is_empty() {
            return None;
        }
        let mut hasher = siphasher::sip::SipHasher13::new_with_keys(Self::SIP_K0, Self::SIP_K1);
        hasher.write(routing_key);
        Some(Self(hasher.finish()))
    }
}

/// A stable id of a principal's name; 0 is "unknown".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrincipalId(pub u64);

impl PrincipalId {
    /// Not attributed: counted against no one.
    pub const UNKNOWN: PrincipalId = PrincipalId(0);
}
