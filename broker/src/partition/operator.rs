//! Operator requests on the lanes: redrive dead letters, purge, list dead
//! letters.

use spool_wire::batch::BatchKind;

use super::{Partition, PartitionError, CONTROL_BATCH_EVENTS_MAX};
use crate::io::Storage;
use crate::queue::{Lane, MessageView, Offset, Redrive};

impl<S: Storage + Clone> Partition<S> {
    /// Moves dead letters back to the queue.
    ///
    /// # Errors
    /// The offset is not a redrivable dead letter.
    pub async fn redrive(&self, which: Redrive) -> Result<usize, PartitionError> {
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
        let events = self.state.borrow().redrive(now, which)?;
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        self.may_be_claimable(count);
        Ok(count)
    }

    /// Removes up to `max` unclaimed messages of `lane` whose enqueue is
    /// durable; a dry run removes nothing and counts every message that
    /// purges repeated while they take `max` would remove (not capped by
    /// `max`: the same rule, `PartitionState::purgeable`).
    ///
    /// # Errors
    /// Storage failure.
    pub async fn purge(
        &self,
        lane: Lane,
        max: usize,
        dry_run: bool,
    ) -> Result<usize, PartitionError> {
        let max = max.min(CONTROL_BATCH_EVENTS_MAX);
        if dry_run {
            let count = self.state.borrow().purgeable(lane, self.durable_end());
            return Ok(usize::try_from(count).unwrap_or(usize::MAX));
        }
        self.log.writable(BatchKind::Control, Self::control_bytes(max, false)).await;
        let now = (self.clock)();
        let events = self.state.borrow().purge(now, lane, max, self.durable_end());
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        Ok(count)
    }

    /// Dead letters after `after` (exclusive), up to `max`.
    pub fn dead_letters(&self, after: Option<Offset>, max: usize) -> Vec<MessageView> {
        self.state.borrow().peek_dead_letters(after, max)
    }
}
