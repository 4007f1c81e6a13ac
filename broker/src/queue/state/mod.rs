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
pub(crate) mod capture;
pub(crate) mod delivery;
mod inspect_sub;
mod invariants;
mod ordered;
mod shared;
mod subscribe;
mod view;
mod window;

use super::config::{ConfigError, QueueConfig};
use super::dedupe::DedupeTable;
use super::fairness::PerClass;
use super::fresh::FreshBand;
use super::limits::{
    DEDUPE_ENTRY_BYTES_MAX, LEASE_LIFETIME_MS_MAX, MESSAGE_STATE_BYTES_MAX,
    SKIPPED_ENTRY_BYTES_MAX, STORED_RUN_BYTES_MAX,
};
use super::members::Members;
use super::stored::StoredByPrincipal;
use super::token::TokenKey;
use super::types::{
    Generation, LeaderEpoch, Millis, Offset, OrderKey, PartitionId, QuarantineCause, QueueId,
    ReleaseReason, SubscriptionId, WorkerId,
};
use capture::Capture;
use delivery::Delivery;

pub use view::{LaneCounters, MessagePhase, MessageView, QueueCounters, Totals};
pub use window::Loss;

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
    /// Behind its key's head in an ordered subscription (`ordered.rs`): in
    /// no claim index until the head finishes; then ready, or scheduled
    /// at `due_ms` if that is later (0: no delay).
    Waiting {
        due_ms: Millis,
        key: OrderKey,
    },
    Scheduled {
        due_ms: Millis,
    },
    Ready {
        since_ms: Millis,
    },
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

impl Warm {
    /// A message just enqueued into `band`, never claimed, in `phase`.
    pub(crate) fn arrived(
        enqueue_time_ms: Millis,
        expiry_ms: Millis,
        size_bytes: u32,
        band: usize,
        phase: WarmPhase,
    ) -> Self {
        Warm {
            enqueue_time_ms,
            expiry_ms,
            size_bytes,
            // Bands are at most PRIORITY_BANDS_MAX (a u8).
            priority: band as u8,
            attempts: 0,
            generation: Generation(0),
            last_reason: ReleaseReason::NONE,
            phase,
        }
    }
}

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

/// Messages and record bytes held by any subscription, each counted once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub messages: u64,
    pub bytes: u64,
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
    /// One delivery state per subscription (`delivery.rs`), by id; the
    /// default subscription's is always first.
    pub(crate) subs: Vec<Delivery>,
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
    /// Messages and record bytes held by any subscription, each counted
    /// once (`shared.rs` keeps it at enqueue and wherever a message leaves
    /// its last subscription).
    pub(crate) held: Held,
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
            subs: vec![Delivery::new(SubscriptionId::DEFAULT, Offset(0), bands, &weights)
                .ordered(ctx.config.ordered)],
            config: ctx.config,
            dedupe: DedupeTable::new(&ctx.secret, dedupe_window_ms),
            highest_enqueued: None,
            last_enqueue_time_ms: 0,
            stored: StoredByPrincipal::default(),
            key_map: None,
            members: None,
            held: Held::default(),
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

    /// Claims outstanding in either lane, every subscription (what the
    /// epoch fence ends at open).
    pub fn claims_outstanding(&self) -> usize {
        self.subs.iter().map(|d| d.claims.len()).sum()
    }

    /// Where subscription `sub`'s delivery state is in `subs`.
    pub(crate) fn sub_index(&self, sub: SubscriptionId) -> Option<usize> {
        self.subs.binary_search_by_key(&sub, |d| d.id).ok()
    }

    /// The subscriptions this partition has, the default first.
    pub fn subscriptions(&self) -> impl Iterator<Item = SubscriptionId> + '_ {
        self.subs.iter().map(|d| d.id)
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

    /// Live main-lane messages of the default subscription.
    pub fn live_messages(&self) -> u64 {
        self.live_messages_of(0)
    }

    /// Record bytes of the default subscription's live main-lane messages.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes_of(0)
    }

    /// Live main-lane messages of subscription index `s`: ready, scheduled
    /// and claimed (the work still to serve; dead letters are not in it).
    pub(crate) fn live_messages_of(&self, s: usize) -> u64 {
        let d = &self.subs[s];
        d.fresh_len.iter().sum::<u64>() + d.warm.len() as u64
    }

    /// Record bytes of subscription index `s`'s live main-lane messages.
    pub(crate) fn live_bytes_of(&self, s: usize) -> u64 {
        let d = &self.subs[s];
        d.fresh_bytes.iter().sum::<u64>() + d.warm_bytes
    }

    /// Every message the queue still holds, counted once however many
    /// subscriptions hold it: the main lane plus the dead-letter lane (the
    /// admission count). Quarantine and redrive move a message between
    /// lanes and leave this unchanged; only ack, expiry without
    /// dead-lettering and purge (by the last subscription holding it) lower
    /// it. Counting dead letters keeps a queue whose workers keep failing
    /// from growing its DLQ, and the log segments its evidence pins,
    /// without bound.
    pub fn held_messages(&self) -> u64 {
        self.held.messages
    }

    /// Record bytes of every message the queue still holds, both lanes,
    /// counted once (the admission bytes).
    pub fn held_bytes(&self) -> u64 {
        self.held.bytes
    }

    /// The bytes this state is charged against its shard's memory budget:
    /// every held message at the most any phase of it may cost
    /// ([`MESSAGE_STATE_BYTES_MAX`]), every dedupe entry held and every run
    /// of attributed offsets at theirs. An upper bound of what the state
    /// allocates, not a measurement (`tests/queue_memory.rs` checks it
    /// covers the measured heap); O(bands + dedupe generations).
    ///
    /// A message held by several subscriptions is charged once for its
    /// shared entry and again for every further subscription that holds it
    /// claimed, scheduled, retried or dead-lettered (its own `Warm` or dead
    /// letter); a subscription's skipped offsets at theirs.
    pub fn memory_charge(&self) -> u64 {
        let extra: u64 = self.subs[1..]
            .iter()
            .map(|d| {
                (d.warm.len() + d.dlq.len()) as u64 * MESSAGE_STATE_BYTES_MAX
                    + d.skipped.len() as u64 * SKIPPED_ENTRY_BYTES_MAX
            })
            .sum();
        self.held_messages() * MESSAGE_STATE_BYTES_MAX
            + extra
            + self.subs[0].skipped.len() as u64 * SKIPPED_ENTRY_BYTES_MAX
            + self.dedupe.held_entries() as u64 * DEDUPE_ENTRY_BYTES_MAX
            + self.stored.runs() as u64 * STORED_RUN_BYTES_MAX
    }

    /// The most [`memory_charge`](Self::memory_charge) can grow by per
    /// enqueued record (a message, its dedupe entry and, at worst, a run of
    /// its own).
    pub const fn memory_charge_per_enqueue() -> u64 {
        MESSAGE_STATE_BYTES_MAX + DEDUPE_ENTRY_BYTES_MAX + STORED_RUN_BYTES_MAX
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
