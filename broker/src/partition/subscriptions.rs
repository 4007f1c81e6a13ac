//! A partition's subscriptions in its log (`docs/design/subscriptions.md`
//! §2): the leader appends `Event::SubscriptionStarted` for each
//! subscription the table names that its state lacks, and
//! `Event::SubscriptionEnded` for each it holds that the table no longer
//! names. The start's offset is fixed when it is appended (the latest
//! start is the partition's next offset then), so every replay, replica
//! and checkpoint agrees on it.

use spool_wire::batch::BatchKind;

use super::{Partition, PartitionError};
use crate::io::Storage;
use crate::queue::{Event, Loss, Millis, Offset, QueueCounters, SubscriptionId};

/// Where a subscription the table names starts on this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Every record the partition still has to deliver (offset 0 on).
    Earliest,
    /// Records enqueued after the start is appended.
    Latest,
    /// Records enqueued at or after this time (Unix ms) that the partition
    /// still has (`PartitionState::first_offset_at`); none that recent: as
    /// `Latest`.
    Time(Millis),
    /// Records at or above this offset that the partition still has; past
    /// its next offset: as `Latest`.
    Offset(Offset),
}

impl<S: Storage + Clone> Partition<S> {
    /// The subscriptions this partition's state has, the default first.
    pub fn subscriptions(&self) -> Vec<SubscriptionId> {
        self.state.borrow().subscriptions().collect()
    }

    /// Whether the state has subscription `sub` (no allocation: the claim
    /// path asks it).
    pub fn has_subscription(&self, sub: SubscriptionId) -> bool {
        self.state.borrow().sub_index(sub).is_some()
    }

    /// Counters of subscription `sub`, `None` when the partition does not
    /// have it (yet).
    pub fn counters_of(&self, sub: SubscriptionId) -> Option<QueueCounters> {
        self.state.borrow().counters_of(sub, (self.clock)())
    }

    /// The counters and loss reports of every subscription besides the
    /// default.
    pub fn subscription_counters(&self) -> Vec<(SubscriptionId, QueueCounters, Vec<Loss>)> {
        let state = self.state.borrow();
        let now = (self.clock)();
        state
            .subscriptions()
            .filter(|&sub| sub != SubscriptionId::DEFAULT)
            .filter_map(|sub| {
                let counters = state.counters_of(sub, now)?;
                let losses = state.losses_of(sub).map(|losses| losses.copied().collect());
                Some((sub, counters, losses.unwrap_or_default()))
            })
            .collect()
    }

    /// The loss reports of subscription `sub`: what the queue's retention
    /// window dropped before it delivered them, oldest first (the newest
    /// `LOSS_REPORTS_MAX`); empty without a window, or when the partition
    /// does not have `sub`.
    pub fn losses_of(&self, sub: SubscriptionId) -> Vec<Loss> {
        let state = self.state.borrow();
        state.losses_of(sub).map(|losses| losses.copied().collect()).unwrap_or_default()
    }

    /// Whether the partition's queue has a retention window.
    pub fn has_window(&self) -> bool {
        self.state.borrow().config().has_window()
    }

    /// Whether the partition's queue is ordered (per-key lanes).
    pub fn ordered(&self) -> bool {
        self.state.borrow().config().ordered
    }

    /// Whether the state's subscriptions besides the default are exactly
    /// `wanted`'s.
    pub fn subscriptions_match(&self, wanted: &[(SubscriptionId, StartAt)]) -> bool {
        // The common case, asked every watch turn of every partition:
        // nothing but the default on either side, nothing to build.
        if wanted.is_empty() && self.state.borrow().subscriptions().nth(1).is_none() {
            return true;
        }
        self.subscription_events(wanted, 0).is_empty()
    }

    /// The starts and ends that bring the state to `wanted`.
    fn subscription_events(&self, wanted: &[(SubscriptionId, StartAt)], now: Millis) -> Vec<Event> {
        let have: Vec<SubscriptionId> = self
            .state
            .borrow()
            .subscriptions()
            .filter(|&sub| sub != SubscriptionId::DEFAULT)
            .collect();
        let mut events = Vec::new();
        for &(sub, start) in wanted {
            if sub != SubscriptionId::DEFAULT && !have.contains(&sub) {
                let from = match start {
                    StartAt::Earliest => Offset(0),
                    StartAt::Latest => self.log.next_offset(),
                    StartAt::Time(time_ms) => {
                        let first = self.state.borrow().first_offset_at(time_ms);
                        first.unwrap_or_else(|| self.log.next_offset())
                    }
                    StartAt::Offset(offset) => offset.min(self.log.next_offset()),
                };
                events.push(Event::SubscriptionStarted { sub, from, at_ms: now });
            }
        }
        for sub in have {
            if !wanted.iter().any(|&(named, _)| named == sub) {
                events.push(Event::SubscriptionEnded { sub, at_ms: now });
            }
        }
        events
    }

    /// Starts and ends subscriptions in the log until the state has
    /// exactly `wanted` besides the default; returns once the events are
    /// durable (committed, when replicated).
    ///
    /// # Errors
    /// The log's append or its durability; [`PartitionError::NotLeader`]
    /// (replicated) when this member does not lead.
    pub async fn log_subscriptions(
        &self,
        wanted: &[(SubscriptionId, StartAt)],
    ) -> Result<(), PartitionError> {
        if self.subscriptions_match(wanted) {
            return Ok(());
        }
        let room = Self::control_bytes(wanted.len() + self.subscriptions().len(), false);
        self.log.writable(BatchKind::Control, room).await;
        let now = (self.clock)();
        let events = self.subscription_events(wanted, now);
        if events.is_empty() {
            return Ok(());
        }
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        // A new subscription may have a backlog at once.
        self.claimable.notify_all();
        self.ready(0);
        Ok(())
    }
}
