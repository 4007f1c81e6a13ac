//! What the state shows without changing: counters, the message views of
//! peeks and describe, the retention watermark.

use super::{DeadLetter, DeadPhase, PartitionState, Warm, WarmPhase};
use crate::queue::fresh::{FreshBand, NEVER};
use crate::queue::types::{
    Generation, Lane, Millis, Offset, QuarantineCause, ReleaseReason, SubscriptionId, WorkerId,
};

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
    /// Of `quarantined`: moved after `max_deliveries` claims.
    pub quarantined_by_deliveries: u64,
    /// Of `quarantined`: moved when their expiry passed. The rest of
    /// `quarantined` (neither) were folded into a checkpoint written before
    /// the causes were counted.
    pub quarantined_by_expiry: u64,
    /// Records the queue's retention window dropped before this
    /// subscription delivered them (`state/window.rs`); 0 without a window.
    pub lost: u64,
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
    /// Age of the oldest claim still held (either lane): claimed, not yet
    /// acked, released or expired.
    pub oldest_claim_age_ms: Option<Millis>,
    /// Records in the shared index, the partition's (what a subscription
    /// started at `earliest` now would be given: with a retention window
    /// also those every subscription finished), their bytes and the age
    /// of the oldest.
    pub retained_messages: u64,
    pub retained_bytes: u64,
    pub oldest_retained_age_ms: Option<Millis>,
    /// An ordered queue's lanes (`ordered.rs`); all zero when unordered.
    pub lanes: LaneCounters,
    pub totals: Totals,
}

/// An ordered subscription's lanes, for describe and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneCounters {
    /// Routing keys with a message here (each heads a lane).
    pub active_keys: u64,
    /// Keys with a message waiting behind their head.
    pub blocked_keys: u64,
    /// Messages waiting behind a head (live, counted in
    /// `live_messages`, in none of ready/scheduled/claimed).
    pub waiting: u64,
    /// The oldest waiting message, its offset and enqueue time: its key
    /// is the one blocked longest.
    pub oldest_waiting: Option<(Offset, Millis)>,
    /// The head holding that key up.
    pub blocking_head: Option<Offset>,
}

/// Where a message is, for tests and describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessagePhase {
    /// Behind an earlier message of its routing key (an ordered queue,
    /// `ordered.rs`); `key` is the key's lane hash.
    Waiting {
        key: u64,
    },
    Ready {
        since_ms: Millis,
    },
    Scheduled {
        due_ms: Millis,
    },
    Claimed {
        worker: WorkerId,
        claimed_at_ms: Millis,
        deadline_ms: Millis,
    },
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

impl PartitionState {
    /// Lowest offset the state still needs the record of: the oldest live
    /// main-lane message or dead letter (quarantine evidence). `None` when the
    /// state needs no record. The log may delete below the minimum of this,
    /// the newest checkpoint's offset and the configured audit window.
    pub fn retention_watermark(&self) -> Option<Offset> {
        let fresh = self.fresh.iter().filter_map(FreshBand::front).map(|v| v.offset);
        let warm = self.subs.iter().filter_map(|d| d.warm.first_key());
        let dead = self.subs.iter().filter_map(|d| d.dlq.keys().next().copied());
        fresh.chain(warm).chain(dead).min()
    }

    /// The oldest main-lane message still live (ready, scheduled or
    /// claimed) in any subscription, if any: every main-lane message below
    /// it is finished by every subscription.
    pub fn oldest_live_main(&self) -> Option<Offset> {
        let fresh = self.fresh.iter().filter_map(FreshBand::front).map(|v| v.offset);
        fresh.chain(self.subs.iter().filter_map(|d| d.warm.first_key())).min()
    }

    /// The first offset of the shared index enqueued at or after `time_ms`
    /// (a subscription's start by time): the least over the bands of each
    /// band's first such entry. Every record of any band below it was
    /// enqueued before `time_ms`, every one at or above it at or after
    /// (enqueue times are non-decreasing in offset). `None` when the index
    /// holds none that recent.
    pub fn first_offset_at(&self, time_ms: Millis) -> Option<Offset> {
        self.fresh.iter().filter_map(|band| band.first_at_or_after(time_ms)).map(|v| v.offset).min()
    }

    /// Whether any subscription still holds any message (either lane, any
    /// phase) at an offset in `[first, end)`: whether a stored batch of
    /// those offsets is still needed. O(end - first) lookups.
    pub fn holds_any(&self, first: Offset, end: Offset) -> bool {
        (first.0..end.0).map(Offset).any(|offset| {
            self.fresh.iter().any(|band| band.get(offset).is_some())
                || self
                    .subs
                    .iter()
                    .any(|d| d.warm.contains_key(&offset) || d.dlq.contains_key(&offset))
        })
    }

    /// Whether a main-lane message is ready in any subscription (claimable
    /// once its enqueue is durable and its record is not past its expiry):
    /// O(subscriptions × priority bands).
    pub fn has_ready(&self) -> bool {
        self.subs.iter().any(|d| {
            d.fresh_len.iter().any(|&len| len > 0)
                || d.band_ready.iter().any(|ready| !ready.is_empty())
                || !d.retry.is_empty()
        })
    }

    /// Counters of the default subscription for describe.
    pub fn counters(&self, now: Millis) -> QueueCounters {
        self.counters_at(0, now)
    }

    /// Counters of subscription `sub`, `None` when the partition has no
    /// such subscription. `held_*` are the partition's (every message
    /// counted once, whichever subscriptions hold it): what admission reads.
    pub fn counters_of(&self, sub: SubscriptionId, now: Millis) -> Option<QueueCounters> {
        self.sub_index(sub).map(|s| self.counters_at(s, now))
    }

    fn counters_at(&self, s: usize, now: Millis) -> QueueCounters {
        let d = &self.subs[s];
        let fresh_ready: u64 = d.fresh_len.iter().sum();
        let warm_ready: u64 =
            d.band_ready.iter().map(|set| set.len() as u64).sum::<u64>() + d.retry.len() as u64;
        let dead_letter_claimed = d.dlq.len() as u64 - d.dlq_ready.len() as u64;
        let main_claimed = d.claims.len() as u64 - dead_letter_claimed;
        let oldest_fresh = (0..self.fresh.len())
            .filter_map(|band| self.fresh_iter(s, band).next())
            .map(|v| v.enqueue_time_ms);
        let oldest_warm = d
            .band_ready
            .iter()
            .chain(std::iter::once(&d.retry))
            .filter_map(|set| set.first())
            .map(|&(since, _)| since);
        let oldest = oldest_fresh.chain(oldest_warm).min();
        QueueCounters {
            ready: fresh_ready + warm_ready,
            scheduled: d.scheduled.len() as u64,
            claimed: main_claimed,
            quarantined: d.dlq.len() as u64,
            dead_letter_claimed,
            live_messages: self.live_messages_of(s),
            live_bytes: self.live_bytes_of(s),
            held_messages: self.held_messages(),
            held_bytes: self.held_bytes(),
            oldest_ready_age_ms: oldest.map(|since| now.saturating_sub(since)),
            oldest_claim_age_ms: d.claim_ages.oldest().map(|at| now.saturating_sub(at)),
            retained_messages: self.retained().0,
            retained_bytes: self.retained().1,
            oldest_retained_age_ms: self.oldest_retained_ms().map(|at| now.saturating_sub(at)),
            lanes: self.lane_counters(s),
            totals: d.totals,
        }
    }

    /// Every live message of both lanes of the default subscription in
    /// offset order. O(n): for tests, debugging and small describes, never
    /// the data path.
    pub fn messages(&self) -> Vec<MessageView> {
        self.messages_at(0)
    }

    /// [`messages`](Self::messages) of subscription `sub`.
    pub fn messages_of(&self, sub: SubscriptionId) -> Option<Vec<MessageView>> {
        self.sub_index(sub).map(|s| self.messages_at(s))
    }

    fn messages_at(&self, s: usize) -> Vec<MessageView> {
        let d = &self.subs[s];
        let mut out = Vec::new();
        for band in 0..self.fresh.len() {
            for view in self.fresh_iter(s, band) {
                out.push(Self::main_view(view.offset, &Self::warm_from_fresh(&view, band)));
            }
        }
        for (&offset, warm) in d.warm.iter() {
            out.push(Self::main_view(offset, warm));
        }
        for (&offset, dead) in &d.dlq {
            out.push(self.dead_view(offset, dead));
        }
        out.sort_by_key(|v| v.offset);
        out
    }

    fn main_view(offset: Offset, warm: &Warm) -> MessageView {
        let phase = match warm.phase {
            WarmPhase::Waiting { key, .. } => MessagePhase::Waiting { key: key.0 },
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
}
