//! A subscription's start and end on this partition
//! (`Event::SubscriptionStarted`/`SubscriptionEnded`,
//! `docs/design/subscriptions.md` §2): folded like every other event, so a
//! replica, a reopen and a replay rebuild the same subscriptions.

use super::delivery::Delivery;
use super::PartitionState;
use crate::queue::error::ApplyError;
use crate::queue::limits::SUBSCRIPTIONS_PER_QUEUE_MAX;
use crate::queue::types::{Offset, SubscriptionId};

impl PartitionState {
    /// Starts subscription `sub` at `from`: every record of the shared
    /// index from `from` on is its to deliver, and every record enqueued
    /// later. Records at or past `from` that no subscription has left to
    /// deliver (finished, or held claimed, scheduled or dead-lettered by
    /// others) are not in the index and are not its: a start replays what
    /// the partition still has, not the log.
    pub(crate) fn start_subscription(
        &mut self,
        sub: SubscriptionId,
        from: Offset,
    ) -> Result<(), ApplyError> {
        let refuse = |what| Err(ApplyError::Subscription { sub, what });
        if sub == SubscriptionId::DEFAULT {
            return refuse("the default subscription always exists");
        }
        self.refuse_ordered_start(sub)?;
        let Err(at) = self.subs.binary_search_by_key(&sub, |d| d.id) else {
            return refuse("already started");
        };
        if self.subs.len() >= SUBSCRIPTIONS_PER_QUEUE_MAX {
            return refuse("the queue has the most subscriptions it may");
        }
        let mut weights = self.config.band_weights.clone();
        weights.push(self.config.retry_weight);
        let mut delivery = Delivery::new(sub, from, self.fresh.len(), &weights);
        let after = from.0.checked_sub(1).map(Offset);
        for (band, fresh) in self.fresh.iter().enumerate() {
            for view in fresh.iter_after(after) {
                delivery.fresh_len[band] += 1;
                delivery.fresh_bytes[band] += u64::from(view.size_bytes);
            }
        }
        self.subs.insert(at, delivery);
        Ok(())
    }

    /// Ends subscription `sub`: its delivery state goes; a record only it
    /// held leaves the partition (the held counts, the per-principal
    /// stored counts), and a shared entry no other subscription has to
    /// deliver leaves the index.
    pub(crate) fn end_subscription(&mut self, sub: SubscriptionId) -> Result<(), ApplyError> {
        if sub == SubscriptionId::DEFAULT {
            return Err(ApplyError::Subscription {
                sub,
                what: "the default subscription always exists",
            });
        }
        let s = self.sub_index(sub).ok_or(ApplyError::UnknownSubscription(sub))?;
        let mut fresh = Vec::new();
        for band in 0..self.fresh.len() {
            fresh.extend(self.fresh_iter(s, band).map(|view| (band, view.offset, view.size_bytes)));
        }
        // A running checkpoint keeps what the ended subscription held.
        let held: Vec<Offset> = {
            let d = &self.subs[s];
            d.warm.iter().map(|(&offset, _)| offset).chain(d.dlq.keys().copied()).collect()
        };
        for offset in held {
            self.note(offset);
        }
        let ended = self.subs.remove(s);
        let warm = ended.warm.iter().map(|(&offset, warm)| (offset, warm.size_bytes));
        let dead = ended.dlq.iter().map(|(&offset, dead)| (offset, dead.size_bytes));
        let mut leaving: Vec<(Offset, u32)> = warm.chain(dead).collect();
        for (band, offset, size) in fresh {
            self.note(offset);
            // With a retention window the entry stays (the window drops it).
            let still = self.config.has_window()
                || (0..self.subs.len()).any(|t| self.fresh_for(t, band, offset));
            if !still {
                self.fresh[band].remove(offset).expect("a live shared entry");
                for d in &mut self.subs {
                    d.skipped[band].remove(&offset);
                }
            }
            leaving.push((offset, size));
        }
        for (offset, size) in leaving {
            // `usize::MAX`: no subscription is excluded, the ended one is gone.
            if !self.held_by_other(usize::MAX, offset) {
                self.held.messages -= 1;
                self.held.bytes -= u64::from(size);
                if !self.stored.is_empty() {
                    self.stored.leave(offset, size);
                }
            }
        }
        if !self.stored.is_empty() {
            let oldest = self.retention_watermark().unwrap_or(self.next_data_offset());
            self.stored.trim_below(Some(oldest));
        }
        Ok(())
    }
}
