//! Operator requests on the lanes: redrive dead letters, purge, list dead
//! letters, each in one subscription. A subscription the table names but
//! this partition's log has not started yet (or has just ended) has
//! nothing here: nothing to redrive, purge or list, as a claim of it
//! finds nothing.

use spool_wire::batch::BatchKind;

use super::{Partition, PartitionError, CONTROL_BATCH_EVENTS_MAX};
use crate::io::Storage;
use crate::queue::{Lane, MessageView, Offset, QueueError, Redrive, SubscriptionId};

impl<S: Storage + Clone> Partition<S> {
    /// Moves dead letters of subscription `sub` back to its queue.
    ///
    /// # Errors
    /// The offset is not a redrivable dead letter.
    pub async fn redrive(
        &self,
        sub: SubscriptionId,
        which: Redrive,
    ) -> Result<usize, PartitionError> {
        let events_max = match which {
            Redrive::One(_) => 1,
            Redrive::Oldest(count) => count.min(CONTROL_BATCH_EVENTS_MAX),
        };
        let which = match which {
            Redrive::Oldest(count) => Redrive::Oldest(count.min(CONTROL_BATCH_EVENTS_MAX)),
            one => one,
        };
        self.log.writable(BatchKind::Control, Self::control_bytes(events_max, false)).await;
        let now = (self.clock)();
        let events = match self.state.borrow().redrive_sub(sub, now, which) {
            Err(QueueError::UnknownSubscription(_)) => return Ok(0),
            decided => decided?,
        };
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        self.may_be_claimable(count);
        Ok(count)
    }

    /// Removes up to `max` unclaimed messages of `lane` of subscription
    /// `sub` whose enqueue is durable (the records stay for every other
    /// subscription); a dry run removes nothing and counts every message that
    /// purges repeated while they take `max` would remove (not capped by
    /// `max`: the same rule, `PartitionState::purgeable`).
    ///
    /// # Errors
    /// Storage failure.
    pub async fn purge(
        &self,
        sub: SubscriptionId,
        lane: Lane,
        max: usize,
        dry_run: bool,
    ) -> Result<usize, PartitionError> {
        let max = max.min(CONTROL_BATCH_EVENTS_MAX);
        if dry_run {
            let count = self.state.borrow().purgeable_sub(sub, lane, self.durable_end());
            let count = count.unwrap_or(0);
            return Ok(usize::try_from(count).unwrap_or(usize::MAX));
        }
        self.log.writable(BatchKind::Control, Self::control_bytes(max, false)).await;
        let now = (self.clock)();
        let events = match self.state.borrow().purge_sub(sub, now, lane, max, self.durable_end()) {
            Err(QueueError::UnknownSubscription(_)) => return Ok(0),
            decided => decided?,
        };
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        Ok(count)
    }

    /// Dead letters of subscription `sub` after `after` (exclusive), up to
    /// `max`.
    pub fn dead_letters(
        &self,
        sub: SubscriptionId,
        after: Option<Offset>,
        max: usize,
    ) -> Vec<MessageView> {
        self.state.borrow().peek_dead_letters_sub(sub, after, max).unwrap_or_default()
    }
}
