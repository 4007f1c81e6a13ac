//! `PartitionState`: the fold of one partition's log, and the only place that
//! changes it (`apply`).
//!
//! Where a message lives, by state (exactly one place each):
//! - never-claimed and ready, no `not_before`: `fresh[band]` (24 bytes each);
//! - everything else in the main lane (scheduled, claimed, ready again after a
//!   failed claim or a schedule): `warm`, one map entry, plus the index of its
//!   phase (`band_ready`/`retry`, `scheduled`, `claims`) and `warm_expiry`;
//! - dead-lettered: `dlq`, keyed by the original offset, plus `dlq_ready` or
//!   `claims`.
//!
//! Acked, expired and purged messages leave the state entirely; only counters
//! and the dedupe window remember them.

mod apply;
pub(crate) mod delivery;
pub(crate) mod capture;
mod invariants;
mod view;

use super::config::{ConfigError, QueueConfig};
use super::dedupe::DedupeTable;
use super::fairness::PerClass;
use super::fresh::{FreshBand, FreshView, NEVER};
use super::limits::{
    DEDUPE_ENTRY_BYTES_MAX, LEASE_LIFETIME_MS_MAX, MESSAGE_STATE_BYTES_MAX, STORED_RUN_BYTES_MAX,
};
use super::members::Members;
use super::stored::StoredByPrincipal;
use super::token::TokenKey;
use super::types::{
    Generation, LeaderEpoch, Millis, Offset, PartitionId, QuarantineCause, QueueId, ReleaseReason,
    WorkerId,
};
use capture::Capture;
use delivery::Delivery;

pub use view::{MessagePhase, MessageView, QueueCounters, Totals};

/// What a partition is opened with. The secret and epoch are not part of the
/// fold: the broker keeps the secret in its data dir
/// (`control::data_dir`) and the partition raises the epoch at each open
/// (`partition::epoch`).
#[derive(Clone, Debug)]
pub struct PartitionContext {
    pub queue: QueueId,
    pub partition: PartitionId,
    pub epoch: LeaderEpoch,
    pub secret: [u8; 32],
    pub config: QueueConfig,
}

/// A live lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub worker: WorkerId,
    pub claimed_at_ms: Millis,
    /// Deadline minus claim time. A lease never outlives
    /// `max_lease_lifetime_ms` (at most `LEASE_LIFETIME_MS_MAX`, far inside 32 bits),
    /// and the 4 bytes saved keep a claimed message under its memory target.
    lease_total_ms: u32,
}

impl Claim {
    /// `None` when the deadline is before the claim or too far after it.
    pub fn new(worker: WorkerId, claimed_at_ms: Millis, deadline_ms: Millis) -> Option<Self> {
        let total = deadline_ms.checked_sub(claimed_at_ms)?;
        if total > LEASE_LIFETIME_MS_MAX {
            return None;
        }
        Some(Self { worker, claimed_at_ms, lease_total_ms: u32::try_from(total).ok()? })
    }

    pub fn deadline_ms(&self) -> Millis {
        self.claimed_at_ms + u64::from(self.lease_total_ms)
    }
}

/// State of a main-lane message that is not in `fresh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WarmPhase {
    Scheduled { due_ms: Millis },
    Ready { since_ms: Millis },
    Claimed(Claim),
}

/// A main-lane message that has been claimed or scheduled at least once.
/// Kept at 64 bytes: with its key that is 72 per `ChunkMap` slot, which with
/// the claim or schedule index keeps such a message near 108 bytes
/// (measured by `tests/queue_memory.rs`), under the 128-byte target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Warm {
    pub enqueue_time_ms: Millis,
    pub expiry_ms: Millis,
    pub size_bytes: u32,
    pub priority: u8,
    /// Claims that ended without an ack (reset by redrive).
    pub attempts: u16,
    pub generation: Generation,
    pub last_reason: ReleaseReason,
    pub phase: WarmPhase,
}

const _: () = assert!(std::mem::size_of::<Warm>() <= 64);

/// State of a dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadPhase {
    Ready { since_ms: Millis },
    Claimed(Claim),
}

/// A message in the dead-letter queue, keyed by its original offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    pub enqueue_time_ms: Millis,
    pub expiry_ms: Millis,
    pub size_bytes: u32,
    pub priority: u8,
    pub attempts: u16,
    pub generation: Generation,
    pub last_reason: ReleaseReason,
    pub cause: QuarantineCause,
    pub quarantined_at_ms: Millis,
    pub phase: DeadPhase,
}

/// A main-lane message taken out of whatever structure held it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MainMessage {
    pub warm: Warm,
}

/// A version of the queue's key map the partition's log names
/// (`Event::KeyMap`): its server took keys by it from there on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedKeyMap {
    pub version: u64,
    pub partitions: u32,
}

/// The queue state of one partition. See the module docs of `queue` for the
/// decide → append → apply protocol.
#[derive(Debug)]
pub struct PartitionState {
    pub(crate) queue: QueueId,
    pub(crate) partition: PartitionId,
    pub(crate) epoch: LeaderEpoch,
    pub(crate) key: TokenKey,
    pub(crate) config: QueueConfig,
    pub(crate) fresh: Vec<FreshBand>,
    /// The default subscription's delivery state (`delivery.rs`).
    pub(crate) sub: Delivery,
    /// Ids enqueued within the dedupe window (see `dedupe.rs`).
    pub(crate) dedupe: DedupeTable,
    pub(crate) highest_enqueued: Option<Offset>,
    /// Enqueue times are clamped to be non-decreasing in offset, so fresh
    /// FIFO order is also age order.
    pub(crate) last_enqueue_time_ms: Millis,
    /// Messages and record bytes held per producing principal, from the
    /// `Attributed` events (`stored.rs`); empty while nothing is attributed.
    pub(crate) stored: StoredByPrincipal,
    /// The newest key map the log names (`Event::KeyMap`): a server that
    /// has not applied that version of its queue's key map must not serve.
    pub(crate) key_map: Option<LoggedKeyMap>,
    /// A replicated partition's group members as its log reached them
    /// (`queue/members.rs`): seeded with the group's initial members before
    /// the first change, `None` on one node.
    pub(crate) members: Option<Members>,
    /// While a checkpoint is written in steps: what each message it covers
    /// held before its first change since (`snapshot/encode.rs`). Every
    /// change to `fresh`, `warm` or `dlq` goes through `note` first.
    pub(crate) capture: Option<Box<Capture>>,
}

impl PartitionState {
    /// An empty partition (the start of a full replay).
    ///
    /// # Errors
    /// The config's validation error.
    pub fn new(ctx: PartitionContext) -> Result<Self, ConfigError> {
        ctx.config.validate()?;
        let bands = ctx.config.bands();
        let dedupe_window_ms = ctx.config.dedupe_window_ms;
        let mut weights = ctx.config.band_weights.clone();
        weights.push(ctx.config.retry_weight);
        Ok(Self {
            queue: ctx.queue,
            partition: ctx.partition,
            epoch: ctx.epoch,
            key: TokenKey::from_secret(&ctx.secret),
            fresh: vec![FreshBand::default(); bands],
            sub: Delivery::new(bands, &weights),
            config: ctx.config,
            dedupe: DedupeTable::new(&ctx.secret, dedupe_window_ms),
            highest_enqueued: None,
            last_enqueue_time_ms: 0,
            stored: StoredByPrincipal::default(),
            key_map: None,
            members: None,
            capture: None,
        })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Messages and record bytes held per producing principal.
    pub fn stored(&self) -> &StoredByPrincipal {
        &self.stored
    }

    /// The group members the log reached (`Event::Membership` folded over
    /// the seed), `None` before a seed.
    pub fn members(&self) -> Option<&Members> {
        self.members.as_ref()
    }

    /// Seeds the members with the group's initial ones unless a checkpoint
    /// already named them (a replicated partition, before its replay).
    pub fn seed_members(&mut self, initial: Members) {
        if self.members.is_none() {
            self.members = Some(initial);
        }
    }

    /// The newest key map the log names (`Event::KeyMap`), if any.
    pub fn logged_key_map(&self) -> Option<LoggedKeyMap> {
        self.key_map
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.epoch
    }

    /// Sets the leader epoch new tokens carry and acks must match. Replay
    /// never reads it, so a state restored and replayed before its open
    /// knew the new epoch (the shard journal's ordered pass at start) takes
    /// it here, before the epoch fence and before anything is served.
    pub fn set_leader_epoch(&mut self, epoch: LeaderEpoch) {
        self.epoch = epoch;
    }

    /// Claims outstanding in either lane (what the epoch fence ends at open).
    pub fn claims_outstanding(&self) -> usize {
        self.sub.claims.len()
    }

    /// Class weights: bands then retry.
    pub(crate) fn weights(&self) -> PerClass<u32> {
        let mut weights = PerClass::from_slice(&self.config.band_weights);
        weights.push(self.config.retry_weight);
        weights
    }

    pub(crate) fn retry_class(&self) -> usize {
        self.fresh.len()
    }

    pub(crate) fn band_of(&self, priority: u8) -> usize {
        usize::from(priority).min(self.fresh.len() - 1)
    }

    /// Live main-lane messages: ready, scheduled and claimed (the work
    /// still to serve; dead letters are not in it).
    pub fn live_messages(&self) -> u64 {
        self.fresh.iter().map(FreshBand::len).sum::<u64>() + self.sub.warm.len() as u64
    }

    /// Record bytes of live main-lane messages.
    pub fn live_bytes(&self) -> u64 {
        self.fresh.iter().map(FreshBand::bytes).sum::<u64>() + self.sub.warm_bytes
    }

    /// Every message the queue still holds: the main lane plus the
    /// dead-letter lane (the admission count). Quarantine and redrive move
    /// a message between lanes and leave this unchanged; only ack, expiry
    /// without dead-lettering and purge lower it. Counting dead letters
    /// keeps a queue whose workers keep failing from growing its DLQ, and
    /// the log segments its evidence pins, without bound.
    pub fn held_messages(&self) -> u64 {
        self.live_messages() + self.sub.dlq.len() as u64
    }

    /// Record bytes of every message the queue still holds, both lanes (the
    /// admission bytes).
    pub fn held_bytes(&self) -> u64 {
        self.live_bytes() + self.sub.dlq_bytes
    }

    /// The bytes this state is charged against its shard's memory budget:
    /// every held message at the most any phase of it may cost
    /// ([`MESSAGE_STATE_BYTES_MAX`]), every dedupe entry held and every run
    /// of attributed offsets at theirs. An upper bound of what the state
    /// allocates, not a measurement (`tests/queue_memory.rs` checks it
    /// covers the measured heap); O(bands + dedupe generations).
    pub fn memory_charge(&self) -> u64 {
        self.held_messages() * MESSAGE_STATE_BYTES_MAX
            + self.dedupe.held_entries() as u64 * DEDUPE_ENTRY_BYTES_MAX
            + self.stored.runs() as u64 * STORED_RUN_BYTES_MAX
    }

    /// The most [`memory_charge`](Self::memory_charge) can grow by per
    /// enqueued record (a message, its dedupe entry and, at worst, a run of
    /// its own).
    pub const fn memory_charge_per_enqueue() -> u64 {
        MESSAGE_STATE_BYTES_MAX + DEDUPE_ENTRY_BYTES_MAX + STORED_RUN_BYTES_MAX
    }

    /// Finds a main-lane message without changing anything.
    pub(crate) fn main_message(&self, offset: Offset) -> Option<MainMessage> {
        if let Some(warm) = self.sub.warm.get(&offset) {
            return Some(MainMessage { warm: *warm });
        }
        self.fresh.iter().enumerate().find_map(|(band, fresh)| {
            fresh.get(offset).map(|view| MainMessage { warm: Self::warm_from_fresh(&view, band) })
        })
    }

    fn warm_from_fresh(view: &FreshView, band: usize) -> Warm {
        Warm {
            enqueue_time_ms: view.enqueue_time_ms,
            expiry_ms: view.expiry_ms,
            size_bytes: view.size_bytes,
            // Bands are at most PRIORITY_BANDS_MAX (a u8).
            priority: band as u8,
            attempts: 0,
            generation: Generation(0),
            last_reason: ReleaseReason::NONE,
            phase: WarmPhase::Ready { since_ms: view.enqueue_time_ms },
        }
    }

    /// Removes a main-lane message from every structure that holds it.
    fn take_main(&mut self, offset: Offset) -> Option<MainMessage> {
        self.note(offset);
        if let Some(warm) = self.sub.warm.remove(&offset) {
            self.sub.warm_bytes -= u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Scheduled { due_ms } => {
                    assert!(self.sub.scheduled.remove(&(due_ms.min(warm.expiry_ms), offset)));
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(self.sub.warm_expiry.remove(&(warm.expiry_ms, offset)));
                    }
                    let set = if warm.attempts == 0 {
                        &mut self.sub.band_ready[usize::from(warm.priority)]
                    } else {
                        &mut self.sub.retry
                    };
                    assert!(set.remove(&(since_ms, offset)));
                }
                WarmPhase::Claimed(claim) => {
                    assert!(self.sub.claims.remove(&(claim.deadline_ms(), offset)));
                    self.sub.claim_ages.remove(claim.claimed_at_ms);
                }
            }
            return Some(MainMessage { warm });
        }
        for band in 0..self.fresh.len() {
            if let Some(view) = self.fresh[band].remove(offset) {
                return Some(MainMessage { warm: Self::warm_from_fresh(&view, band) });
            }
        }
        None
    }

    /// Puts a main-lane message into `warm` and its phase index.
    fn insert_warm(&mut self, offset: Offset, warm: Warm) {
        self.note(offset);
        assert!(usize::from(warm.priority) < self.fresh.len());
        match warm.phase {
            WarmPhase::Scheduled { due_ms } => {
                assert!(self.sub.scheduled.insert((due_ms.min(warm.expiry_ms), offset)));
            }
            WarmPhase::Ready { since_ms } => {
                if warm.expiry_ms != NEVER {
                    assert!(self.sub.warm_expiry.insert((warm.expiry_ms, offset)));
                }
                let set = if warm.attempts == 0 {
                    &mut self.sub.band_ready[usize::from(warm.priority)]
                } else {
                    &mut self.sub.retry
                };
                assert!(set.insert((since_ms, offset)));
            }
            WarmPhase::Claimed(claim) => {
                assert!(self.sub.claims.insert((claim.deadline_ms(), offset)));
                self.sub.claim_ages.add(claim.claimed_at_ms);
            }
        }
        self.sub.warm_bytes += u64::from(warm.size_bytes);
        assert!(self.sub.warm.insert(offset, warm).is_none());
    }

    fn take_dead(&mut self, offset: Offset) -> Option<DeadLetter> {
        self.note(offset);
        let dead = self.sub.dlq.remove(&offset)?;
        self.sub.dlq_bytes -= u64::from(dead.size_bytes);
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(self.sub.dlq_ready.remove(&(since_ms, offset))),
            DeadPhase::Claimed(claim) => {
                assert!(self.sub.claims.remove(&(claim.deadline_ms(), offset)));
                self.sub.claim_ages.remove(claim.claimed_at_ms);
            }
        }
        Some(dead)
    }

    fn insert_dead(&mut self, offset: Offset, dead: DeadLetter) {
        self.note(offset);
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(self.sub.dlq_ready.insert((since_ms, offset))),
            DeadPhase::Claimed(claim) => {
                assert!(self.sub.claims.insert((claim.deadline_ms(), offset)));
                self.sub.claim_ages.add(claim.claimed_at_ms);
            }
        }
        self.sub.dlq_bytes += u64::from(dead.size_bytes);
        assert!(self.sub.dlq.insert(offset, dead).is_none());
    }

    /// Inserts a fresh (never claimed, ready) message; used by apply and restore.
    pub(crate) fn insert_fresh(&mut self, band: usize, view: FreshView) {
        self.note(view.offset);
        self.fresh[band].push(view);
    }

    /// Inserts a warm message; used by restore.
    pub(crate) fn restore_warm(&mut self, offset: Offset, warm: Warm) {
        self.insert_warm(offset, warm);
    }

    /// Inserts a dead letter; used by restore.
    pub(crate) fn restore_dead(&mut self, offset: Offset, dead: DeadLetter) {
        self.insert_dead(offset, dead);
    }

    /// The claim class a ready main-lane message is served from.
    pub(crate) fn class_of(&self, warm: &Warm) -> usize {
        if warm.attempts == 0 {
            usize::from(warm.priority)
        } else {
            self.retry_class()
        }
    }
}
