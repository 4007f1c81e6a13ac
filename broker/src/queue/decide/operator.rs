//! An operator's decisions on a queue's messages: redrive dead letters to
//! the main lane, purge either lane (with a dry-run count), and peek at
//! dead letters.
//!
//! Changes nothing; must leave claimed messages to their workers, take only
//! records below the durable watermark it is given, and bound each answer
//! (`ADMIN_EVENTS_MAX`, `PEEK_MAX`).

use crate::queue::error::QueueError;
use crate::queue::event::Event;
use crate::queue::limits::{ADMIN_EVENTS_MAX, PEEK_MAX};
use crate::queue::state::{DeadPhase, MessageView, PartitionState, WarmPhase};
use crate::queue::types::{Generation, Lane, Millis, Offset, SubscriptionId};

/// Which dead letters to redrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redrive {
    /// This one (must be in the dead-letter queue and not claimed).
    One(Offset),
    /// Up to this many, oldest quarantine first (bounded by `ADMIN_EVENTS_MAX`).
    Oldest(usize),
}

impl PartitionState {
    /// Moves dead letters back to the main lane as new ready work (failed
    /// attempts reset; the generation keeps counting so old tokens stay stale).
    ///
    /// # Errors
    /// [`QueueError::NotRedrivable`] for `Redrive::One` of an offset that is
    /// not an unclaimed dead letter.
    pub fn redrive(&self, now: Millis, which: Redrive) -> Result<Vec<Event>, QueueError> {
        self.redrive_at(0, now, which)
    }

    /// [`PartitionState::redrive`] of subscription `sub`'s dead letters.
    ///
    /// # Errors
    /// As [`PartitionState::redrive`], and
    /// [`QueueError::UnknownSubscription`].
    pub fn redrive_sub(
        &self,
        sub: SubscriptionId,
        now: Millis,
        which: Redrive,
    ) -> Result<Vec<Event>, QueueError> {
        self.redrive_at(self.sub_at(sub)?, now, which)
    }

    fn redrive_at(&self, s: usize, now: Millis, which: Redrive) -> Result<Vec<Event>, QueueError> {
        let d = &self.subs[s];
        let sub = d.id;
        match which {
            Redrive::One(offset) => match d.dlq.get(&offset) {
                Some(dead) if matches!(dead.phase, DeadPhase::Ready { .. }) => {
                    Ok(vec![Event::Redriven {
                        sub,
                        offset,
                        generation: dead.generation,
                        at_ms: now,
                    }])
                }
                _ => Err(QueueError::NotRedrivable(offset)),
            },
            Redrive::Oldest(count) => Ok(d
                .dlq_ready
                .iter()
                .take(count.min(ADMIN_EVENTS_MAX))
                .map(|&(_, offset)| Event::Redriven {
                    sub,
                    offset,
                    generation: d.dlq[&offset].generation,
                    at_ms: now,
                })
                .collect()),
        }
    }

    /// Removes up to `max` unclaimed messages of `lane`, lowest offset first
    /// (bounded by `ADMIN_EVENTS_MAX`). Claimed messages are left to their
    /// workers. `durable_end` as for [`PartitionState::tick`]: a purge takes
    /// only records below it (a message whose enqueue is not yet durable is
    /// left; a purge after its sync takes it), so every event names a
    /// durable record. [`PartitionState::purgeable`] counts what repeated
    /// purges would take.
    pub fn purge(&self, now: Millis, lane: Lane, max: usize, durable_end: Offset) -> Vec<Event> {
        self.purge_at(0, now, lane, max, durable_end)
    }

    /// [`PartitionState::purge`] of subscription `sub`'s messages: the
    /// records stay for every other subscription.
    ///
    /// # Errors
    /// [`QueueError::UnknownSubscription`].
    pub fn purge_sub(
        &self,
        sub: SubscriptionId,
        now: Millis,
        lane: Lane,
        max: usize,
        durable_end: Offset,
    ) -> Result<Vec<Event>, QueueError> {
        Ok(self.purge_at(self.sub_at(sub)?, now, lane, max, durable_end))
    }

    fn purge_at(
        &self,
        s: usize,
        now: Millis,
        lane: Lane,
        max: usize,
        durable_end: Offset,
    ) -> Vec<Event> {
        let max = max.min(ADMIN_EVENTS_MAX);
        let d = &self.subs[s];
        let sub = d.id;
        match lane {
            Lane::Main => {
                let mut offsets: Vec<(Offset, Generation)> = (0..self.fresh.len())
                    .flat_map(|band| {
                        self.fresh_iter(s, band)
                            .take_while(|v| v.offset < durable_end)
                            .take(max)
                            .map(|v| (v.offset, Generation(0)))
                    })
                    .collect();
                offsets.extend(
                    d.warm
                        .iter()
                        .take_while(|(&offset, _)| offset < durable_end)
                        .filter(|(_, w)| !matches!(w.phase, WarmPhase::Claimed(_)))
                        .take(max)
                        .map(|(&offset, w)| (offset, w.generation)),
                );
                offsets.sort();
                offsets
                    .into_iter()
                    .take(max)
                    .map(|(offset, generation)| Event::Purged {
                        sub,
                        lane,
                        offset,
                        generation,
                        at_ms: now,
                    })
                    .collect()
            }
            Lane::DeadLetter => d
                .dlq
                .range(..durable_end)
                .filter(|(_, dead)| matches!(dead.phase, DeadPhase::Ready { .. }))
                .take(max)
                .map(|(&offset, dead)| Event::Purged {
                    sub,
                    lane,
                    offset,
                    generation: dead.generation,
                    at_ms: now,
                })
                .collect(),
        }
    }

    /// How many messages of `lane` a purge with this `durable_end` would
    /// remove if repeated until it takes nothing (a dry run): the unclaimed
    /// ones below `durable_end`. Costs O(bands + dead letters claimed +
    /// records at or past `durable_end`), not O(messages).
    /// The default subscription's.
    pub fn purgeable(&self, lane: Lane, durable_end: Offset) -> u64 {
        self.purgeable_at(0, lane, durable_end)
    }

    /// [`PartitionState::purgeable`] of subscription index `s`.
    pub(crate) fn purgeable_at(&self, s: usize, lane: Lane, durable_end: Offset) -> u64 {
        let d = &self.subs[s];
        match lane {
            Lane::Main => {
                let unclaimed = self
                    .counters_of(d.id, 0)
                    .map_or(0, |counters| counters.ready + counters.scheduled);
                let after = durable_end.0.checked_sub(1).map(Offset);
                let fresh_pending: u64 = (0..self.fresh.len())
                    .map(|band| {
                        self.fresh[band]
                            .iter_after(after)
                            .filter(|v| self.fresh_for(s, band, v.offset))
                            .count() as u64
                    })
                    .sum();
                let warm_pending = d
                    .warm
                    .iter_after(after)
                    .filter(|(_, w)| !matches!(w.phase, WarmPhase::Claimed(_)))
                    .count() as u64;
                unclaimed - fresh_pending - warm_pending
            }
            Lane::DeadLetter => {
                let pending = d
                    .dlq
                    .range(durable_end..)
                    .filter(|(_, dead)| matches!(dead.phase, DeadPhase::Ready { .. }))
                    .count() as u64;
                d.dlq_ready.len() as u64 - pending
            }
        }
    }

    /// Dead letters in offset order after `after`, at most `max` (bounded by
    /// `PEEK_MAX`): original offset, attempts, last reason, cause, timestamps.
    /// The record bytes are at that offset in this partition's log. The
    /// default subscription's.
    pub fn peek_dead_letters(&self, after: Option<Offset>, max: usize) -> Vec<MessageView> {
        self.peek_dead_letters_at(0, after, max)
    }

    /// [`PartitionState::peek_dead_letters`] of subscription index `s`.
    pub(crate) fn peek_dead_letters_at(
        &self,
        s: usize,
        after: Option<Offset>,
        max: usize,
    ) -> Vec<MessageView> {
        let start = after.map_or(Offset(0), |o| Offset(o.0.saturating_add(1)));
        if after.is_some_and(|o| o.0 == u64::MAX) {
            return Vec::new();
        }
        self.subs[s]
            .dlq
            .range(start..)
            .take(max.min(PEEK_MAX))
            .map(|(&offset, dead)| self.dead_view(offset, dead))
            .collect()
    }
}
