//! State-machine events and their control-record encoding.
//!
//! An `Event` is the only thing that changes a `PartitionState`
//! (`PartitionState::apply`), on the live path and on replay. Every event but
//! `Enqueued` is written to the log as one fixed-size little-endian control
//! record (padded to a multiple of 8 bytes so records stay 8-aligned);
//! `Enqueued` is derived from data records, so it has no control encoding.
//!
//! Common layout (byte offsets; all integers little-endian):
//!
//! ```text
//!  0  u8   kind            1..=17, see EventKind
//!  1  u8   lane            0 main, 1 dead-letter (Quarantined: cause 1 deliveries, 2 expired)
//!  2  u16  reason          Released, Quarantined; Membership: the change (1 learner,
//!                          2 voter, 3 remove); else 0
//!  4  u32  generation      the claim generation the event acts on (Claimed: the new one;
//!                          Attributed: the record count)
//!  8  u64  offset          the message's data-record offset (Attributed: the first one)
//! 16  u64  at_ms           when the decision was made (Claimed: claimed_at_ms)
//! 24  u64  time_ms         Claimed, Extended: deadline_ms; Released: not_before_ms;
//!                          Attributed: the principal id (never 0);
//!                          TermStarted: the term; KeyMap: the key map's version;
//!                          Membership: the node; else 0
//! 32  u64  worker          Claimed only
//! ```
//!
//! `Claimed` is 40 bytes, every other kind 32. Unused fields must be zero.
//!
//! A delivery event (kinds 1..=10) of a subscription other than the
//! default sets bit 0x80 of the kind byte and ends with 8 more bytes: the
//! `u16` subscription id, then zeros (`docs/design/subscriptions.md` §4).
//! The default subscription's events are written without them, so a
//! queue with only the default writes exactly the bytes it always did.
//! `SubscriptionStarted` (15) and `SubscriptionEnded` (16) carry the
//! subscription in `reason` (never 0) and, for a start, its first offset
//! in `offset`. `WindowPassed` (17) carries the first offset the queue's
//! retention window keeps in `offset`.
//!
//! `Attributed` (kind 11) names who wrote a data batch: the enqueue path
//! appends it right behind the batch, in the same synchronous step, for an
//! authenticated producer (`queue/stored.rs`), and while its commit is
//! still open extends it over the same producer's next batches (then it
//! names the control records between them too, which hold no message;
//! `docs/design/queue-semantics.md`, "Attributed: one event per open
//! commit"). It changes no message; a log
//! without it (written before it existed, or by anonymous producers) folds
//! exactly as before, its records counted against no one.

use super::error::CodecError;
use super::members::MembershipChange;
use super::types::PrincipalId;
use super::types::{
    EnqueueMeta, Generation, Lane, Millis, Offset, QuarantineCause, ReleaseReason, SubscriptionId,
    WorkerId,
};

/// Encoded size of every control event except `Claimed`.
pub const EVENT_BYTES: usize = 32;
/// Encoded size of `Claimed` (it also carries the worker).
pub const CLAIMED_EVENT_BYTES: usize = 40;
/// Set in the kind byte of a delivery event of a subscription other than
/// the default: the record ends with this many more bytes (`u16`
/// subscription id, then zeros).
const SUBSCRIPTION_FLAG: u8 = 0x80;
const SUBSCRIPTION_TAIL_LEN: usize = 8;

const _: () = assert!(EVENT_BYTES.is_multiple_of(8));
const _: () = assert!(CLAIMED_EVENT_BYTES.is_multiple_of(8));

/// Kind byte of each control event. 0 is never valid, so zeroed bytes do not
/// decode as an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    Claimed = 1,
    Extended = 2,
    Acked = 3,
    Released = 4,
    LeaseExpired = 5,
    Readied = 6,
    Quarantined = 7,
    Expired = 8,
    Redriven = 9,
    Purged = 10,
    Attributed = 11,
    TermStarted = 12,
    KeyMap = 13,
    Membership = 14,
    SubscriptionStarted = 15,
    SubscriptionEnded = 16,
    WindowPassed = 17,
}

/// One state transition. See `docs/design/queue-semantics.md` for what each
/// does to a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A data record was appended: a new message (main lane).
    Enqueued(EnqueueMeta),
    /// A ready message was leased to `worker` until `deadline_ms`.
    Claimed {
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        worker: WorkerId,
        claimed_at_ms: Millis,
        deadline_ms: Millis,
    },
    /// The current claim's deadline moved to `deadline_ms`.
    Extended {
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        at_ms: Millis,
        deadline_ms: Millis,
    },
    /// The current claim was acknowledged: the message is done.
    Acked { sub: SubscriptionId, lane: Lane, offset: Offset, generation: Generation, at_ms: Millis },
    /// The current claim was given back; ready again at `not_before_ms` (now
    /// if not later than `at_ms`). In the dead-letter lane always ready now.
    Released {
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        reason: ReleaseReason,
        at_ms: Millis,
        not_before_ms: Millis,
    },
    /// The current claim's deadline passed: the message is ready again.
    LeaseExpired {
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        at_ms: Millis,
    },
    /// A scheduled message's time came: it is ready.
    Readied { sub: SubscriptionId, offset: Offset, generation: Generation, at_ms: Millis },
    /// The message moved to the dead-letter queue (from claimed, ready or scheduled).
    Quarantined {
        sub: SubscriptionId,
        offset: Offset,
        generation: Generation,
        cause: QuarantineCause,
        reason: ReleaseReason,
        at_ms: Millis,
    },
    /// The message's expiry passed; it leaves serving state and is counted.
    Expired { sub: SubscriptionId, offset: Offset, generation: Generation, at_ms: Millis },
    /// A dead letter moved back to the main lane as ready, attempts reset.
    Redriven { sub: SubscriptionId, offset: Offset, generation: Generation, at_ms: Millis },
    /// An operator removed an unclaimed message from `lane`.
    Purged {
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        at_ms: Millis,
    },
    /// The `count` data records from `offset` on were appended by
    /// `principal` (never [`PrincipalId::UNKNOWN`]); only the per-principal
    /// stored counts change (`stored.rs`).
    Attributed { offset: Offset, count: u32, principal: PrincipalId, at_ms: Millis },
    /// A replicated partition's leader of `term` began it: raft's first
    /// entry of each term (`docs/design/replication.md` §2). Every member
    /// stores the same bytes for it (nothing but the term), and it changes
    /// no message.
    TermStarted { term: u64 },
    /// The partition's server took keys by version `version` of its
    /// queue's key map (`partitions` partitions) from here on
    /// (`docs/design/replication.md`, "Resizing a queue"): a later leader
    /// that has not applied that version yet does not serve. It changes no
    /// message.
    KeyMap { version: u64, partitions: u32, at_ms: Millis },
    /// The partition's Raft group changed by one node
    /// (`docs/design/replication.md` §9): its entry is raft-rs's change
    /// entry, stored as this record, the same bytes on every member. Only
    /// the members change (`PartitionState::members`).
    Membership { change: MembershipChange },
    /// Subscription `sub` of the queue begins on this partition: every
    /// record from `from` on that the partition still holds is its to
    /// deliver (`docs/design/subscriptions.md` §2). Never the default one.
    SubscriptionStarted { sub: SubscriptionId, from: Offset, at_ms: Millis },
    /// Subscription `sub` ends on this partition: its delivery state goes,
    /// and records only it held leave. Never the default one.
    SubscriptionEnded { sub: SubscriptionId, at_ms: Millis },
    /// The queue's retention window passed at `at_ms`
    /// (`docs/design/subscriptions.md` §5): every record of the shared
    /// index below `through` leaves it, and so does every one no
    /// subscription has left to deliver whose expiry passed. A
    /// subscription that still had one to deliver lost it (counted and
    /// reported, `queue/state/window.rs`). Only a queue with a window.
    WindowPassed { through: Offset, at_ms: Millis },
}

/// The common fields every control record has, before kind-specific meaning.
#[derive(Default)]
struct Fields {
    kind: u8,
    lane: u8,
    reason: u16,
    generation: u32,
    offset: u64,
    at_ms: u64,
    time_ms: u64,
    worker: Option<u64>,
    /// A subscription other than the default: the record gains its tail.
    sub: u16,
}

impl Event {
    /// The message this event acts on.
    pub fn offset(&self) -> Offset {
        match *self {
            Self::Enqueued(meta) => meta.offset,
            Self::Claimed { offset, .. }
            | Self::Extended { offset, .. }
            | Self::Acked { offset, .. }
            | Self::Released { offset, .. }
            | Self::LeaseExpired { offset, .. }
            | Self::Readied { offset, .. }
            | Self::Quarantined { offset, .. }
            | Self::Expired { offset, .. }
            | Self::Redriven { offset, .. }
            | Self::Purged { offset, .. }
            | Self::Attributed { offset, .. } => offset,
            Self::SubscriptionStarted { from, .. } => from,
            Self::WindowPassed { through, .. } => through,
            Self::TermStarted { .. }
            | Self::KeyMap { .. }
            | Self::Membership { .. }
            | Self::SubscriptionEnded { .. } => Offset(0),
        }
    }

    /// The subscription whose delivery state this event changes, `None`
    /// for the log side's events (enqueue, attribution, term, key map,
    /// membership) and for a subscription's start and end.
    pub fn subscription(&self) -> Option<SubscriptionId> {
        match *self {
            Self::Claimed { sub, .. }
            | Self::Extended { sub, .. }
            | Self::Acked { sub, .. }
            | Self::Released { sub, .. }
            | Self::LeaseExpired { sub, .. }
            | Self::Readied { sub, .. }
            | Self::Quarantined { sub, .. }
            | Self::Expired { sub, .. }
            | Self::Redriven { sub, .. }
            | Self::Purged { sub, .. } => Some(sub),
            _ => None,
        }
    }

    /// Size of this event's control record, `None` for `Enqueued`.
    pub fn encoded_len(&self) -> Option<usize> {
        let tail = match self.subscription() {
            Some(sub) if sub != SubscriptionId::DEFAULT => SUBSCRIPTION_TAIL_LEN,
            _ => 0,
        };
        match self {
            Self::Enqueued(_) => None,
            Self::Claimed { .. } => Some(CLAIMED_EVENT_BYTES + tail),
            _ => Some(EVENT_BYTES + tail),
        }
    }

    fn fields(&self) -> Option<Fields> {
        let f = match *self {
            Self::Enqueued(_) => return None,
            Self::Claimed { sub, lane, offset, generation, worker, claimed_at_ms, deadline_ms } => {
                Fields {
                    kind: EventKind::Claimed as u8,
                    sub: sub.0,
                    lane: lane as u8,
                    generation: generation.0,
                    offset: offset.0,
                    at_ms: claimed_at_ms,
                    time_ms: deadline_ms,
                    worker: Some(worker.0),
                    ..Fields::default()
                }
            }
            Self::Extended { sub, lane, offset, generation, at_ms, deadline_ms } => Fields {
                kind: EventKind::Extended as u8,
                sub: sub.0,
                lane: lane as u8,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                time_ms: deadline_ms,
                ..Fields::default()
            },
            Self::Acked { sub, lane, offset, generation, at_ms } => Fields {
                kind: EventKind::Acked as u8,
                sub: sub.0,
                lane: lane as u8,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Released { sub, lane, offset, generation, reason, at_ms, not_before_ms } => {
                Fields {
                    kind: EventKind::Released as u8,
                    sub: sub.0,
                    lane: lane as u8,
                    reason: reason.0,
                    generation: generation.0,
                    offset: offset.0,
                    at_ms,
                    time_ms: not_before_ms,
                    ..Fields::default()
                }
            }
            Self::LeaseExpired { sub, lane, offset, generation, at_ms } => Fields {
                kind: EventKind::LeaseExpired as u8,
                sub: sub.0,
                lane: lane as u8,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Readied { sub, offset, generation, at_ms } => Fields {
                kind: EventKind::Readied as u8,
                sub: sub.0,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Quarantined { sub, offset, generation, cause, reason, at_ms } => Fields {
                kind: EventKind::Quarantined as u8,
                sub: sub.0,
                lane: cause as u8,
                reason: reason.0,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Expired { sub, offset, generation, at_ms } => Fields {
                kind: EventKind::Expired as u8,
                sub: sub.0,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Redriven { sub, offset, generation, at_ms } => Fields {
                kind: EventKind::Redriven as u8,
                sub: sub.0,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Purged { sub, lane, offset, generation, at_ms } => Fields {
                kind: EventKind::Purged as u8,
                sub: sub.0,
                lane: lane as u8,
                generation: generation.0,
                offset: offset.0,
                at_ms,
                ..Fields::default()
            },
            Self::Attributed { offset, count, principal, at_ms } => Fields {
                kind: EventKind::Attributed as u8,
                generation: count,
                offset: offset.0,
                at_ms,
                time_ms: principal.0,
                ..Fields::default()
            },
            Self::TermStarted { term } => {
                Fields { kind: EventKind::TermStarted as u8, time_ms: term, ..Fields::default() }
            }
            Self::KeyMap { version, partitions, at_ms } => Fields {
                kind: EventKind::KeyMap as u8,
                generation: partitions,
                at_ms,
                time_ms: version,
                ..Fields::default()
            },
            Self::Membership { change } => Fields {
                kind: EventKind::Membership as u8,
                reason: change.code(),
                time_ms: change.node(),
                ..Fields::default()
            },
            Self::SubscriptionStarted { sub, from, at_ms } => Fields {
                kind: EventKind::SubscriptionStarted as u8,
                reason: sub.0,
                offset: from.0,
                at_ms,
                ..Fields::default()
            },
            Self::SubscriptionEnded { sub, at_ms } => Fields {
                kind: EventKind::SubscriptionEnded as u8,
                reason: sub.0,
                at_ms,
                ..Fields::default()
            },
            Self::WindowPassed { through, at_ms } => Fields {
                kind: EventKind::WindowPassed as u8,
                offset: through.0,
                at_ms,
                ..Fields::default()
            },
        };
        Some(f)
    }

    /// Appends this event's control record to `out`.
    ///
    /// # Errors
    /// [`CodecError::NotControl`] for `Enqueued` (nothing is written).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<usize, CodecError> {
        let f = self.fields().ok_or(CodecError::NotControl)?;
        let start = out.len();
        out.push(if f.sub == 0 { f.kind } else { f.kind | SUBSCRIPTION_FLAG });
        out.push(f.lane);
        out.extend_from_slice(&f.reason.to_le_bytes());
        out.extend_from_slice(&f.generation.to_le_bytes());
        out.extend_from_slice(&f.offset.to_le_bytes());
        out.extend_from_slice(&f.at_ms.to_le_bytes());
        out.extend_from_slice(&f.time_ms.to_le_bytes());
        if let Some(worker) = f.worker {
            out.extend_from_slice(&worker.to_le_bytes());
        }
        if f.sub != 0 {
            out.extend_from_slice(&f.sub.to_le_bytes());
            out.extend_from_slice(&[0; SUBSCRIPTION_TAIL_LEN - 2]);
        }
        let written = out.len() - start;
        assert!(written.is_multiple_of(8));
        assert!(Some(written) == self.encoded_len());
        Ok(written)
    }

    /// Decodes exactly one control record.
    ///
    /// # Errors
    /// [`CodecError`] when the length does not match the kind, the kind or a
    /// field value is unknown, or an unused field is not zero.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let first = *bytes.first().ok_or(CodecError::Length { expected: EVENT_BYTES, got: 0 })?;
        let named = first & SUBSCRIPTION_FLAG != 0;
        let kind = first & !SUBSCRIPTION_FLAG;
        if !(EventKind::Claimed as u8..=EventKind::WindowPassed as u8).contains(&kind)
            || (named && kind > EventKind::Purged as u8)
        {
            return Err(CodecError::UnknownKind(first));
        }
        let base = if kind == EventKind::Claimed as u8 { CLAIMED_EVENT_BYTES } else { EVENT_BYTES };
        let expected = if named { base + SUBSCRIPTION_TAIL_LEN } else { base };
        if bytes.len() != expected {
            return Err(CodecError::Length { expected, got: bytes.len() });
        }
        let sub = if named {
            let tail = &bytes[base..];
            let sub = u16::from_le_bytes([tail[0], tail[1]]);
            // The default subscription is written without the tail, so
            // each event has one encoding.
            if sub == 0 || tail[2..].iter().any(|&b| b != 0) {
                return Err(CodecError::BadField("subscription"));
            }
            SubscriptionId(sub)
        } else {
            SubscriptionId::DEFAULT
        };
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        let lane_byte = bytes[1];
        let reason = u16_at(2);
        let generation = Generation(u32_at(4));
        let offset = Offset(u64_at(8));
        let at_ms = u64_at(16);
        let time_ms = u64_at(24);
        let lane = || Lane::from_u8(lane_byte).ok_or(CodecError::BadField("lane"));
        let zero = |ok: bool| if ok { Ok(()) } else { Err(CodecError::Reserved) };
        let event = match kind {
            1 => {
                zero(reason == 0)?;
                Self::Claimed {
                    sub,
                    lane: lane()?,
                    offset,
                    generation,
                    worker: WorkerId(u64_at(32)),
                    claimed_at_ms: at_ms,
                    deadline_ms: time_ms,
                }
            }
            2 => {
                zero(reason == 0)?;
                Self::Extended {
                    sub,
                    lane: lane()?,
                    offset,
                    generation,
                    at_ms,
                    deadline_ms: time_ms,
                }
            }
            3 => {
                zero(reason == 0 && time_ms == 0)?;
                Self::Acked { sub, lane: lane()?, offset, generation, at_ms }
            }
            4 => Self::Released {
                sub,
                lane: lane()?,
                offset,
                generation,
                reason: ReleaseReason(reason),
                at_ms,
                not_before_ms: time_ms,
            },
            5 => {
                zero(reason == 0 && time_ms == 0)?;
                Self::LeaseExpired { sub, lane: lane()?, offset, generation, at_ms }
            }
            6 => {
                zero(lane_byte == 0 && reason == 0 && time_ms == 0)?;
                Self::Readied { sub, offset, generation, at_ms }
            }
            7 => {
                zero(time_ms == 0)?;
                let cause =
                    QuarantineCause::from_u8(lane_byte).ok_or(CodecError::BadField("cause"))?;
                Self::Quarantined {
                    sub,
                    offset,
                    generation,
                    cause,
                    reason: ReleaseReason(reason),
                    at_ms,
                }
            }
            8 => {
                zero(lane_byte == 0 && reason == 0 && time_ms == 0)?;
                Self::Expired { sub, offset, generation, at_ms }
            }
            9 => {
                zero(lane_byte == 0 && reason == 0 && time_ms == 0)?;
                Self::Redriven { sub, offset, generation, at_ms }
            }
            10 => {
                zero(reason == 0 && time_ms == 0)?;
                Self::Purged { sub, lane: lane()?, offset, generation, at_ms }
            }
            11 => {
                zero(lane_byte == 0 && reason == 0)?;
                if generation.0 == 0 {
                    return Err(CodecError::BadField("record count"));
                }
                if time_ms == PrincipalId::UNKNOWN.0 {
                    return Err(CodecError::BadField("principal"));
                }
                Self::Attributed {
                    offset,
                    count: generation.0,
                    principal: PrincipalId(time_ms),
                    at_ms,
                }
            }
            12 => {
                zero(lane_byte == 0 && reason == 0 && generation.0 == 0)?;
                zero(offset.0 == 0 && at_ms == 0)?;
                Self::TermStarted { term: time_ms }
            }
            13 => {
                zero(lane_byte == 0 && reason == 0 && offset.0 == 0)?;
                if generation.0 == 0 || time_ms == 0 {
                    return Err(CodecError::BadField("key map"));
                }
                Self::KeyMap { version: time_ms, partitions: generation.0, at_ms }
            }
            14 => {
                zero(lane_byte == 0 && generation.0 == 0 && offset.0 == 0 && at_ms == 0)?;
                let change = MembershipChange::from_code(reason, time_ms)
                    .ok_or(CodecError::BadField("membership change"))?;
                Self::Membership { change }
            }
            15 | 16 => {
                zero(lane_byte == 0 && generation.0 == 0 && time_ms == 0)?;
                if reason == 0 {
                    return Err(CodecError::BadField("subscription"));
                }
                let sub = SubscriptionId(reason);
                if kind == 15 {
                    Self::SubscriptionStarted { sub, from: offset, at_ms }
                } else {
                    zero(offset.0 == 0)?;
                    Self::SubscriptionEnded { sub, at_ms }
                }
            }
            17 => {
                zero(lane_byte == 0 && reason == 0 && generation.0 == 0 && time_ms == 0)?;
                Self::WindowPassed { through: offset, at_ms }
            }
            other => return Err(CodecError::UnknownKind(other)),
        };
        Ok(event)
    }
}
