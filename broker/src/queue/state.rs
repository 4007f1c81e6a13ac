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

use std::collections::{BTreeMap, BTreeSet};

use super::chunk_map::ChunkMap;
use super::config::{ConfigError, QueueConfig};
use super::dedupe::DedupeTable;
use super::error::ApplyError;
use super::event::Event;
use super::fairness::Credits;
use super::fresh::{FreshBand, FreshView, NEVER};
use super::limits::LEASE_MS_MAX;
use super::snapshot::Capture;
use super::token::TokenKey;
use super::types::{
    EnqueueMeta, Generation, Lane, LeaderEpoch, Millis, Offset, PartitionId, QuarantineCause,
    QueueId, ReleaseReason, WorkerId,
};

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
    /// `max_lease_lifetime_ms` (at most `LEASE_MS_MAX`, far inside 32 bits),
    /// and the 4 bytes saved keep a claimed message under its memory target.
    lease_total_ms: u32,
}

impl Claim {
    /// `None` when the deadline is before the claim or too far after it.
    pub fn new(worker: WorkerId, claimed_at_ms: Millis, deadline_ms: Millis) -> Option<Self> {
        let total = deadline_ms.checked_sub(claimed_at_ms)?;
        if total > LEASE_MS_MAX {
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

/// Cumulative counts, part of the fold (and of snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub enqueued: u64,
    pub acked: u64,
    pub expired: u64,
    pub quarantined: u64,
    pub redriven: u64,
    pub purged: u64,
    pub released: u64,
    pub lease_expired: u64,
    pub dead_letter_acked: u64,
}

/// Counters for `describe`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Main-lane messages ready to claim (new and retried).
    pub ready: u64,
    /// Main-lane messages waiting for their `not_before`.
    pub scheduled: u64,
    /// Main-lane messages under a lease.
    pub claimed: u64,
    /// Messages in the dead-letter queue (claimed there or not).
    pub quarantined: u64,
    /// Dead letters under a lease.
    pub dead_letter_claimed: u64,
    /// Main-lane live messages (ready + scheduled + claimed) and their
    /// record bytes: the work still to serve.
    pub live_messages: u64,
    pub live_bytes: u64,
    /// Every message the queue still holds, main lane plus dead letters,
    /// and their record bytes: the admission figures (`max_messages`,
    /// `max_bytes`).
    pub held_messages: u64,
    pub held_bytes: u64,
    /// Age of the oldest ready main-lane message.
    pub oldest_ready_age_ms: Option<Millis>,
    pub totals: Totals,
}

/// Where a message is, for tests and describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessagePhase {
    Ready { since_ms: Millis },
    Scheduled { due_ms: Millis },
    Claimed { worker: WorkerId, claimed_at_ms: Millis, deadline_ms: Millis },
}

/// One live message (either lane), for tests, peeks and describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageView {
    pub offset: Offset,
    pub lane: Lane,
    pub phase: MessagePhase,
    pub priority: u8,
    pub size_bytes: u32,
    pub enqueue_time_ms: Millis,
    /// `None`: never expires.
    pub expiry_ms: Option<Millis>,
    pub attempts: u16,
    pub generation: Generation,
    pub last_reason: ReleaseReason,
    /// Dead letters only: why and when they were quarantined.
    pub quarantine: Option<(QuarantineCause, Millis)>,
}

/// A main-lane message taken out of whatever structure held it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MainMessage {
    pub warm: Warm,
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
    pub(crate) warm: ChunkMap<Warm>,
    /// Warm ready messages with no failed attempt, per band: (since, offset).
    pub(crate) band_ready: Vec<BTreeSet<(Millis, Offset)>>,
    /// Warm ready messages with at least one failed attempt: (since, offset).
    pub(crate) retry: BTreeSet<(Millis, Offset)>,
    /// Scheduled messages by min(due, expiry): when tick must look at them.
    pub(crate) scheduled: BTreeSet<(Millis, Offset)>,
    /// Warm ready messages that expire: (expiry, offset). Scheduled ones are
    /// due at min(not_before, expiry) in `scheduled`; claimed ones are looked
    /// at when their lease ends.
    pub(crate) warm_expiry: BTreeSet<(Millis, Offset)>,
    pub(crate) warm_bytes: u64,
    /// Live leases of both lanes: (deadline, offset).
    pub(crate) claims: BTreeSet<(Millis, Offset)>,
    pub(crate) dlq: BTreeMap<Offset, DeadLetter>,
    pub(crate) dlq_ready: BTreeSet<(Millis, Offset)>,
    /// Record bytes of every dead letter, kept beside `dlq` by
    /// `insert_dead`/`take_dead` (restore goes through them too) so that
    /// admission reads it without a scan.
    pub(crate) dlq_bytes: u64,
    /// Ids enqueued within the dedupe window (see `dedupe.rs`).
    pub(crate) dedupe: DedupeTable,
    pub(crate) credits: Credits,
    pub(crate) highest_enqueued: Option<Offset>,
    /// Enqueue times are clamped to be non-decreasing in offset, so fresh
    /// FIFO order is also age order.
    pub(crate) last_enqueue_time_ms: Millis,
    pub(crate) totals: Totals,
    /// While a checkpoint is written in steps: what each message it covers
    /// held before its first change since (`snapshot.rs`). Every change to
    /// `fresh`, `warm` or `dlq` goes through `note` first.
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
            band_ready: vec![BTreeSet::new(); bands],
            credits: Credits::new(&weights),
            config: ctx.config,
            warm: ChunkMap::default(),
            retry: BTreeSet::new(),
            scheduled: BTreeSet::new(),
            warm_expiry: BTreeSet::new(),
            warm_bytes: 0,
            claims: BTreeSet::new(),
            dlq: BTreeMap::new(),
            dlq_ready: BTreeSet::new(),
            dlq_bytes: 0,
            dedupe: DedupeTable::new(&ctx.secret, dedupe_window_ms),
            highest_enqueued: None,
            last_enqueue_time_ms: 0,
            totals: Totals::default(),
            capture: None,
        })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.epoch
    }

    /// Claims outstanding in either lane (what the epoch fence ends at open).
    pub fn claims_outstanding(&self) -> usize {
        self.claims.len()
    }

    /// Class weights: bands then retry.
    pub(crate) fn weights(&self) -> Vec<u32> {
        let mut weights = self.config.band_weights.clone();
        weights.push(self.config.retry_weight);
        weights
    }

    pub(crate) fn retry_class(&self) -> usize {
        self.fresh.len()
    }

    /// Which classes have a ready message, in class order.
    pub(crate) fn nonempty_classes(&self) -> Vec<bool> {
        let mut nonempty: Vec<bool> = self
            .fresh
            .iter()
            .zip(&self.band_ready)
            .map(|(fresh, ready)| !fresh.is_empty() || !ready.is_empty())
            .collect();
        nonempty.push(!self.retry.is_empty());
        nonempty
    }

    pub(crate) fn band_of(&self, priority: u8) -> usize {
        usize::from(priority).min(self.fresh.len() - 1)
    }

    /// Live main-lane messages: ready, scheduled and claimed (the work
    /// still to serve; dead letters are not in it).
    pub fn live_messages(&self) -> u64 {
        self.fresh.iter().map(FreshBand::len).sum::<u64>() + self.warm.len() as u64
    }

    /// Record bytes of live main-lane messages.
    pub fn live_bytes(&self) -> u64 {
        self.fresh.iter().map(FreshBand::bytes).sum::<u64>() + self.warm_bytes
    }

    /// Every message the queue still holds: the main lane plus the
    /// dead-letter lane (the admission count). Quarantine and redrive move
    /// a message between lanes and leave this unchanged; only ack, expiry
    /// without dead-lettering and purge lower it. Counting dead letters
    /// keeps a queue whose workers keep failing from growing its DLQ, and
    /// the log segments its evidence pins, without bound.
    pub fn held_messages(&self) -> u64 {
        self.live_messages() + self.dlq.len() as u64
    }

    /// Record bytes of every message the queue still holds, both lanes (the
    /// admission bytes).
    pub fn held_bytes(&self) -> u64 {
        self.live_bytes() + self.dlq_bytes
    }

    /// Finds a main-lane message without changing anything.
    pub(crate) fn main_message(&self, offset: Offset) -> Option<MainMessage> {
        if let Some(warm) = self.warm.get(&offset) {
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
        if let Some(warm) = self.warm.remove(&offset) {
            self.warm_bytes -= u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Scheduled { due_ms } => {
                    assert!(self.scheduled.remove(&(due_ms.min(warm.expiry_ms), offset)));
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(self.warm_expiry.remove(&(warm.expiry_ms, offset)));
                    }
                    let set = if warm.attempts == 0 {
                        &mut self.band_ready[usize::from(warm.priority)]
                    } else {
                        &mut self.retry
                    };
                    assert!(set.remove(&(since_ms, offset)));
                }
                WarmPhase::Claimed(claim) => {
                    assert!(self.claims.remove(&(claim.deadline_ms(), offset)))
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
                assert!(self.scheduled.insert((due_ms.min(warm.expiry_ms), offset)));
            }
            WarmPhase::Ready { since_ms } => {
                if warm.expiry_ms != NEVER {
                    assert!(self.warm_expiry.insert((warm.expiry_ms, offset)));
                }
                let set = if warm.attempts == 0 {
                    &mut self.band_ready[usize::from(warm.priority)]
                } else {
                    &mut self.retry
                };
                assert!(set.insert((since_ms, offset)));
            }
            WarmPhase::Claimed(claim) => assert!(self.claims.insert((claim.deadline_ms(), offset))),
        }
        self.warm_bytes += u64::from(warm.size_bytes);
        assert!(self.warm.insert(offset, warm).is_none());
    }

    fn take_dead(&mut self, offset: Offset) -> Option<DeadLetter> {
        self.note(offset);
        let dead = self.dlq.remove(&offset)?;
        self.dlq_bytes -= u64::from(dead.size_bytes);
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(self.dlq_ready.remove(&(since_ms, offset))),
            DeadPhase::Claimed(claim) => {
                assert!(self.claims.remove(&(claim.deadline_ms(), offset)))
            }
        }
        Some(dead)
    }

    fn insert_dead(&mut self, offset: Offset, dead: DeadLetter) {
        self.note(offset);
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(self.dlq_ready.insert((since_ms, offset))),
            DeadPhase::Claimed(claim) => assert!(self.claims.insert((claim.deadline_ms(), offset))),
        }
        self.dlq_bytes += u64::from(dead.size_bytes);
        assert!(self.dlq.insert(offset, dead).is_none());
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

    /// Applies one event: the only way the state changes, on the live path
    /// and on replay.
    ///
    /// # Errors
    /// [`ApplyError`] when the event does not fit the state (nothing changes).
    pub fn apply(&mut self, event: &Event) -> Result<(), ApplyError> {
        match *event {
            Event::Enqueued(meta) => self.apply_enqueued(&meta),
            Event::Claimed { lane, offset, generation, worker, claimed_at_ms, deadline_ms } => {
                let claim = Claim::new(worker, claimed_at_ms, deadline_ms).ok_or(
                    ApplyError::WrongState { offset, what: "Claimed: deadline out of range" },
                )?;
                self.apply_claimed(lane, offset, generation, claim)
            }
            Event::Extended { lane, offset, generation, deadline_ms, .. } => {
                let claim = self.current_claim(lane, offset, generation)?;
                let moved = Claim::new(claim.worker, claim.claimed_at_ms, deadline_ms).ok_or(
                    ApplyError::WrongState { offset, what: "Extended: deadline out of range" },
                )?;
                self.note(offset);
                assert!(self.claims.remove(&(claim.deadline_ms(), offset)));
                assert!(self.claims.insert((deadline_ms, offset)));
                match lane {
                    Lane::Main => {
                        let warm = self.warm.get_mut(&offset).expect("current_claim found it");
                        warm.phase = WarmPhase::Claimed(moved);
                    }
                    Lane::DeadLetter => {
                        let dead = self.dlq.get_mut(&offset).expect("current_claim found it");
                        dead.phase = DeadPhase::Claimed(moved);
                    }
                }
                Ok(())
            }
            Event::Acked { lane, offset, generation, .. } => {
                self.current_claim(lane, offset, generation)?;
                match lane {
                    Lane::Main => {
                        self.take_main(offset).expect("current_claim found it");
                        self.totals.acked += 1;
                    }
                    Lane::DeadLetter => {
                        self.take_dead(offset).expect("current_claim found it");
                        self.totals.dead_letter_acked += 1;
                    }
                }
                Ok(())
            }
            Event::Released { lane, offset, generation, reason, at_ms, not_before_ms } => {
                self.current_claim(lane, offset, generation)?;
                self.end_claim(lane, offset, reason, at_ms, not_before_ms);
                self.totals.released += 1;
                Ok(())
            }
            Event::LeaseExpired { lane, offset, generation, at_ms } => {
                self.current_claim(lane, offset, generation)?;
                self.end_claim(lane, offset, ReleaseReason::LEASE_EXPIRED, at_ms, at_ms);
                self.totals.lease_expired += 1;
                Ok(())
            }
            Event::Readied { offset, generation, at_ms } => {
                let warm = self.warm.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, warm.generation)?;
                if !matches!(warm.phase, WarmPhase::Scheduled { .. }) {
                    return Err(ApplyError::WrongState { offset, what: "Readied: not scheduled" });
                }
                let mut warm = self.take_main(offset).expect("just found").warm;
                warm.phase = WarmPhase::Ready { since_ms: at_ms };
                self.insert_warm(offset, warm);
                Ok(())
            }
            Event::Quarantined { offset, generation, cause, reason, at_ms } => {
                let found = self.main_message(offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, found.warm.generation)?;
                let warm = self.take_main(offset).expect("just found").warm;
                let ended_claim = matches!(warm.phase, WarmPhase::Claimed(_));
                let dead = DeadLetter {
                    enqueue_time_ms: warm.enqueue_time_ms,
                    expiry_ms: warm.expiry_ms,
                    size_bytes: warm.size_bytes,
                    priority: warm.priority,
                    attempts: warm.attempts.saturating_add(u16::from(ended_claim)),
                    generation: warm.generation,
                    last_reason: reason,
                    cause,
                    quarantined_at_ms: at_ms,
                    phase: DeadPhase::Ready { since_ms: at_ms },
                };
                self.insert_dead(offset, dead);
                self.totals.quarantined += 1;
                Ok(())
            }
            Event::Expired { offset, generation, .. } => {
                let found = self.main_message(offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, found.warm.generation)?;
                self.take_main(offset).expect("just found");
                self.totals.expired += 1;
                Ok(())
            }
            Event::Redriven { offset, generation, at_ms } => {
                let dead = self.dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, dead.generation)?;
                if !matches!(dead.phase, DeadPhase::Ready { .. }) {
                    return Err(ApplyError::WrongState { offset, what: "Redriven: claimed" });
                }
                let dead = self.take_dead(offset).expect("just found");
                let warm = Warm {
                    enqueue_time_ms: dead.enqueue_time_ms,
                    expiry_ms: dead.expiry_ms,
                    size_bytes: dead.size_bytes,
                    priority: self.band_of(dead.priority) as u8,
                    attempts: 0,
                    generation: dead.generation,
                    last_reason: dead.last_reason,
                    phase: WarmPhase::Ready { since_ms: at_ms },
                };
                self.insert_warm(offset, warm);
                self.totals.redriven += 1;
                Ok(())
            }
            Event::Purged { lane, offset, generation, .. } => {
                match lane {
                    Lane::Main => {
                        let found =
                            self.main_message(offset).ok_or(ApplyError::UnknownMessage(offset))?;
                        Self::check_generation(offset, generation, found.warm.generation)?;
                        if matches!(found.warm.phase, WarmPhase::Claimed(_)) {
                            return Err(ApplyError::WrongState { offset, what: "Purged: claimed" });
                        }
                        self.take_main(offset).expect("just found");
                    }
                    Lane::DeadLetter => {
                        let dead =
                            self.dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                        Self::check_generation(offset, generation, dead.generation)?;
                        if !matches!(dead.phase, DeadPhase::Ready { .. }) {
                            return Err(ApplyError::WrongState { offset, what: "Purged: claimed" });
                        }
                        self.take_dead(offset).expect("just found");
                    }
                }
                self.totals.purged += 1;
                Ok(())
            }
        }
    }

    fn check_generation(
        offset: Offset,
        event: Generation,
        state: Generation,
    ) -> Result<(), ApplyError> {
        if event == state {
            Ok(())
        } else {
            Err(ApplyError::Generation { offset, event, state })
        }
    }

    fn apply_enqueued(&mut self, meta: &EnqueueMeta) -> Result<(), ApplyError> {
        if let Some(highest) = self.highest_enqueued {
            if meta.offset <= highest {
                return Err(ApplyError::OffsetNotIncreasing { offset: meta.offset, highest });
            }
        }
        if self.dlq.contains_key(&meta.offset) {
            return Err(ApplyError::DuplicateOffset(meta.offset));
        }
        // Never let a time reach the tombstone value, and keep enqueue times
        // non-decreasing so FIFO order is age order.
        let enqueue_time_ms =
            meta.enqueue_time_ms.clamp(self.last_enqueue_time_ms, Millis::MAX - 1);
        self.last_enqueue_time_ms = enqueue_time_ms;
        self.highest_enqueued = Some(meta.offset);
        self.dedupe.record(&meta.message_id, meta.offset, enqueue_time_ms);
        let band = self.band_of(meta.priority);
        // An expiry before the enqueue time is the enqueue time: expired at once.
        let expiry_ms = meta.expiry_ms.map_or(NEVER, |e| e.max(enqueue_time_ms));
        self.totals.enqueued += 1;
        if meta.not_before_ms > enqueue_time_ms {
            let warm = Warm {
                enqueue_time_ms,
                expiry_ms,
                size_bytes: meta.size_bytes,
                priority: band as u8,
                attempts: 0,
                generation: Generation(0),
                last_reason: ReleaseReason::NONE,
                phase: WarmPhase::Scheduled { due_ms: meta.not_before_ms },
            };
            self.insert_warm(meta.offset, warm);
        } else {
            let view = FreshView {
                offset: meta.offset,
                enqueue_time_ms,
                size_bytes: meta.size_bytes,
                expiry_ms,
            };
            self.insert_fresh(band, view);
        }
        Ok(())
    }

    /// The claim class a ready main-lane message is served from.
    pub(crate) fn class_of(&self, warm: &Warm) -> usize {
        if warm.attempts == 0 {
            usize::from(warm.priority)
        } else {
            self.retry_class()
        }
    }

    fn apply_claimed(
        &mut self,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        claim: Claim,
    ) -> Result<(), ApplyError> {
        match lane {
            Lane::Main => {
                let found = self.main_message(offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let WarmPhase::Ready { .. } = found.warm.phase else {
                    return Err(ApplyError::WrongState { offset, what: "Claimed: not ready" });
                };
                let next = Generation(found.warm.generation.0.wrapping_add(1));
                Self::check_generation(offset, generation, next)?;
                // Fairness bookkeeping exactly as the claim decision simulated it.
                let class = self.class_of(&found.warm);
                let nonempty = self.nonempty_classes();
                let weights = self.weights();
                self.credits.begin_pick(&weights, &nonempty);
                self.credits.charge(class);
                let mut warm = self.take_main(offset).expect("just found").warm;
                warm.generation = generation;
                warm.phase = WarmPhase::Claimed(claim);
                self.insert_warm(offset, warm);
            }
            Lane::DeadLetter => {
                let dead = self.dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let DeadPhase::Ready { .. } = dead.phase else {
                    return Err(ApplyError::WrongState { offset, what: "Claimed: not ready" });
                };
                let next = Generation(dead.generation.0.wrapping_add(1));
                Self::check_generation(offset, generation, next)?;
                let mut dead = self.take_dead(offset).expect("just found");
                dead.generation = generation;
                dead.phase = DeadPhase::Claimed(claim);
                self.insert_dead(offset, dead);
            }
        }
        Ok(())
    }

    /// The live claim of `offset` in `lane` with this generation.
    fn current_claim(
        &self,
        lane: Lane,
        offset: Offset,
        generation: Generation,
    ) -> Result<Claim, ApplyError> {
        let (state_generation, phase_claim) = match lane {
            Lane::Main => {
                let warm = self.warm.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let claim = match warm.phase {
                    WarmPhase::Claimed(claim) => Some(claim),
                    _ => None,
                };
                (warm.generation, claim)
            }
            Lane::DeadLetter => {
                let dead = self.dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let claim = match dead.phase {
                    DeadPhase::Claimed(claim) => Some(claim),
                    DeadPhase::Ready { .. } => None,
                };
                (dead.generation, claim)
            }
        };
        Self::check_generation(offset, generation, state_generation)?;
        phase_claim.ok_or(ApplyError::WrongState { offset, what: "not claimed" })
    }

    /// A claim ended without an ack: count the attempt and make the message
    /// ready (or scheduled until `not_before_ms`).
    fn end_claim(
        &mut self,
        lane: Lane,
        offset: Offset,
        reason: ReleaseReason,
        at_ms: Millis,
        not_before_ms: Millis,
    ) {
        match lane {
            Lane::Main => {
                let mut warm = self.take_main(offset).expect("caller checked the claim").warm;
                warm.attempts = warm.attempts.saturating_add(1);
                warm.last_reason = reason;
                warm.phase = if not_before_ms > at_ms {
                    WarmPhase::Scheduled { due_ms: not_before_ms }
                } else {
                    WarmPhase::Ready { since_ms: at_ms }
                };
                self.insert_warm(offset, warm);
            }
            Lane::DeadLetter => {
                let mut dead = self.take_dead(offset).expect("caller checked the claim");
                dead.attempts = dead.attempts.saturating_add(1);
                dead.last_reason = reason;
                dead.phase = DeadPhase::Ready { since_ms: at_ms };
                self.insert_dead(offset, dead);
            }
        }
    }

    /// Lowest offset the state still needs the record of: the oldest live
    /// main-lane message or dead letter (quarantine evidence). `None` when the
    /// state needs no record. The log may delete below the minimum of this,
    /// the newest checkpoint's offset and the configured audit window.
    pub fn retention_watermark(&self) -> Option<Offset> {
        let fresh = self.fresh.iter().filter_map(FreshBand::front).map(|v| v.offset);
        let warm = self.warm.first_key();
        let dead = self.dlq.keys().next().copied();
        fresh.chain(warm).chain(dead).min()
    }

    /// Counters for describe.
    pub fn counters(&self, now: Millis) -> QueueCounters {
        let fresh_ready: u64 = self.fresh.iter().map(FreshBand::len).sum();
        let warm_ready: u64 =
            self.band_ready.iter().map(|s| s.len() as u64).sum::<u64>() + self.retry.len() as u64;
        let main_claimed = self.claims.len() as u64 - self.dead_letter_claimed();
        let oldest_fresh =
            self.fresh.iter().filter_map(FreshBand::front).map(|v| v.enqueue_time_ms);
        let oldest_warm = self
            .band_ready
            .iter()
            .chain(std::iter::once(&self.retry))
            .filter_map(|s| s.first())
            .map(|&(since, _)| since);
        let oldest = oldest_fresh.chain(oldest_warm).min();
        QueueCounters {
            ready: fresh_ready + warm_ready,
            scheduled: self.scheduled.len() as u64,
            claimed: main_claimed,
            quarantined: self.dlq.len() as u64,
            dead_letter_claimed: self.dead_letter_claimed(),
            live_messages: self.live_messages(),
            live_bytes: self.live_bytes(),
            held_messages: self.held_messages(),
            held_bytes: self.held_bytes(),
            oldest_ready_age_ms: oldest.map(|since| now.saturating_sub(since)),
            totals: self.totals,
        }
    }

    fn dead_letter_claimed(&self) -> u64 {
        self.dlq.len() as u64 - self.dlq_ready.len() as u64
    }

    /// Every live message of both lanes in offset order. O(n): for tests,
    /// debugging and small describes, never the data path.
    pub fn messages(&self) -> Vec<MessageView> {
        let mut out = Vec::new();
        for (band, fresh) in self.fresh.iter().enumerate() {
            for view in fresh.iter() {
                out.push(Self::main_view(view.offset, &Self::warm_from_fresh(&view, band)));
            }
        }
        for (&offset, warm) in self.warm.iter() {
            out.push(Self::main_view(offset, warm));
        }
        for (&offset, dead) in &self.dlq {
            out.push(self.dead_view(offset, dead));
        }
        out.sort_by_key(|v| v.offset);
        out
    }

    fn main_view(offset: Offset, warm: &Warm) -> MessageView {
        let phase = match warm.phase {
            WarmPhase::Scheduled { due_ms } => MessagePhase::Scheduled { due_ms },
            WarmPhase::Ready { since_ms } => MessagePhase::Ready { since_ms },
            WarmPhase::Claimed(c) => MessagePhase::Claimed {
                worker: c.worker,
                claimed_at_ms: c.claimed_at_ms,
                deadline_ms: c.deadline_ms(),
            },
        };
        MessageView {
            offset,
            lane: Lane::Main,
            phase,
            priority: warm.priority,
            size_bytes: warm.size_bytes,
            enqueue_time_ms: warm.enqueue_time_ms,
            expiry_ms: (warm.expiry_ms != NEVER).then_some(warm.expiry_ms),
            attempts: warm.attempts,
            generation: warm.generation,
            last_reason: warm.last_reason,
            quarantine: None,
        }
    }

    pub(crate) fn dead_view(&self, offset: Offset, dead: &DeadLetter) -> MessageView {
        let phase = match dead.phase {
            DeadPhase::Ready { since_ms } => MessagePhase::Ready { since_ms },
            DeadPhase::Claimed(c) => MessagePhase::Claimed {
                worker: c.worker,
                claimed_at_ms: c.claimed_at_ms,
                deadline_ms: c.deadline_ms(),
            },
        };
        MessageView {
            offset,
            lane: Lane::DeadLetter,
            phase,
            priority: dead.priority,
            size_bytes: dead.size_bytes,
            enqueue_time_ms: dead.enqueue_time_ms,
            expiry_ms: (dead.expiry_ms != NEVER).then_some(dead.expiry_ms),
            attempts: dead.attempts,
            generation: dead.generation,
            last_reason: dead.last_reason,
            quarantine: Some((dead.cause, dead.quarantined_at_ms)),
        }
    }

    /// Read-only consistency check of every structure against the others.
    /// Called after every step in tests; cheap enough for debug assertions.
    pub fn assert_invariants(&self) {
        assert!(self.fresh.len() == self.config.bands());
        self.warm.assert_invariants();
        assert!(self.band_ready.len() == self.fresh.len());
        assert!(self.credits.raw().len() == self.fresh.len() + 1);
        for fresh in &self.fresh {
            fresh.assert_invariants();
        }
        // Every fresh offset is in exactly one band, never in warm or dlq.
        let mut seen = BTreeSet::new();
        for fresh in &self.fresh {
            for view in fresh.iter() {
                assert!(seen.insert(view.offset));
                assert!(!self.warm.contains_key(&view.offset));
                assert!(!self.dlq.contains_key(&view.offset));
                assert!(self.highest_enqueued.is_some_and(|h| view.offset <= h));
                assert!(view.expiry_ms >= view.enqueue_time_ms);
            }
        }
        let (mut ready, mut retry, mut scheduled, mut claims, mut expiry) = (0, 0, 0, 0, 0);
        let mut bytes = 0u64;
        for (&offset, warm) in self.warm.iter() {
            assert!(!self.dlq.contains_key(&offset));
            assert!(usize::from(warm.priority) < self.fresh.len());
            bytes += u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Scheduled { due_ms } => {
                    assert!(self.scheduled.contains(&(due_ms.min(warm.expiry_ms), offset)));
                    scheduled += 1;
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(self.warm_expiry.contains(&(warm.expiry_ms, offset)));
                        expiry += 1;
                    }
                    if warm.attempts == 0 {
                        assert!(self.band_ready[usize::from(warm.priority)]
                            .contains(&(since_ms, offset)));
                        ready += 1;
                    } else {
                        assert!(self.retry.contains(&(since_ms, offset)));
                        retry += 1;
                    }
                }
                WarmPhase::Claimed(claim) => {
                    assert!(warm.generation.0 > 0);
                    assert!(self.claims.contains(&(claim.deadline_ms(), offset)));
                    // The config's lifetime cap may shrink across restarts; the
                    // absolute limit may not.
                    assert!(claim.deadline_ms() - claim.claimed_at_ms <= LEASE_MS_MAX);
                    claims += 1;
                }
            }
        }
        assert!(bytes == self.warm_bytes);
        assert!(ready == self.band_ready.iter().map(BTreeSet::len).sum::<usize>());
        assert!(retry == self.retry.len());
        assert!(scheduled == self.scheduled.len());
        assert!(expiry == self.warm_expiry.len());
        let mut dead_ready = 0;
        let mut dead_bytes = 0u64;
        for (&offset, dead) in &self.dlq {
            dead_bytes += u64::from(dead.size_bytes);
            match dead.phase {
                DeadPhase::Ready { since_ms } => {
                    assert!(self.dlq_ready.contains(&(since_ms, offset)));
                    dead_ready += 1;
                }
                DeadPhase::Claimed(claim) => {
                    assert!(self.claims.contains(&(claim.deadline_ms(), offset)));
                    claims += 1;
                }
            }
        }
        assert!(dead_ready == self.dlq_ready.len());
        assert!(dead_bytes == self.dlq_bytes);
        assert!(claims == self.claims.len());
        self.dedupe.assert_invariants();
    }
}
