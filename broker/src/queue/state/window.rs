//! The retention window (`docs/design/subscriptions.md` §5): a queue with
//! `retention_ms` and/or `retention_bytes` keeps every record it indexed
//! in the shared index until the window passes it, whether or not every
//! subscription finished it (a subscription started later replays them),
//! and drops it then even if one had not: that subscription *lost* it,
//! and is told (its `lost` total and a [`Loss`] report with the offsets).
//!
//! The window moves only through the logged `WindowPassed` event, decided
//! by the tick on durable records ([`PartitionState::window_event`]), so
//! a replay drops exactly what the live state dropped, whatever the clock
//! says then. Entries a subscription holds claimed, scheduled, retried or
//! dead-lettered are its own (`Delivery::warm`, `dlq`) and are never
//! dropped by the window: a lease in flight finishes.

use super::PartitionState;
use crate::queue::error::ApplyError;
use crate::queue::event::Event;
use crate::queue::fresh::{FreshView, NEVER};
use crate::queue::limits::{LOSS_REPORTS_MAX, WINDOW_DROP_MAX};
use crate::queue::types::{Millis, Offset, SubscriptionId};

/// Records a retention window dropped before a subscription delivered
/// them, at one `WindowPassed`: `count` records with offsets in
/// `[from, to]` (every record of that span the subscription still had to
/// deliver; records of the span it had delivered, or held claimed,
/// scheduled or dead-lettered, are not counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    pub from: Offset,
    pub to: Offset,
    pub count: u64,
    pub at_ms: Millis,
}

impl PartitionState {
    /// Whether the shared entry of `band` at `offset` is fresh for any
    /// subscription. O(subscriptions).
    pub(crate) fn fresh_for_any(&self, band: usize, offset: Offset) -> bool {
        (0..self.subs.len()).any(|s| self.fresh_for(s, band, offset))
    }

    /// The records in the shared index (what a subscription started at
    /// `earliest` now would be given) and their bytes. O(bands).
    pub fn retained(&self) -> (u64, u64) {
        let messages = self.fresh.iter().map(|band| band.len()).sum();
        let bytes = self.fresh.iter().map(|band| band.bytes()).sum();
        (messages, bytes)
    }

    /// Enqueue time of the oldest record in the shared index.
    pub fn oldest_retained_ms(&self) -> Option<Millis> {
        self.fresh.iter().filter_map(|band| band.front()).map(|view| view.enqueue_time_ms).min()
    }

    /// The loss reports of subscription `sub`, oldest first (at most
    /// `LOSS_REPORTS_MAX`, the newest); `None` without such a subscription.
    pub fn losses_of(&self, sub: SubscriptionId) -> Option<impl Iterator<Item = &Loss> + '_> {
        self.sub_index(sub).map(|s| self.subs[s].losses.iter())
    }

    /// The first offset a window passing at `now` keeps: every shared
    /// entry below it was enqueued before `now - retention_ms`, or is
    /// among the oldest whose bytes exceed `retention_bytes`. Bounded to
    /// `WINDOW_DROP_MAX` entries below it and to `durable_end` (records
    /// awaiting their sync are not decided on). `None`: nothing to drop.
    fn window_through(&self, now: Millis, durable_end: Offset) -> Option<Offset> {
        let cutoff = match self.config.retention_ms {
            0 => None,
            window => Some(now.saturating_sub(window)),
        };
        let (_, mut bytes) = self.retained();
        let over =
            |bytes: u64| self.config.retention_bytes > 0 && bytes > self.config.retention_bytes;
        let mut bands: Vec<_> = self.fresh.iter().map(|band| band.iter().peekable()).collect();
        let mut through = None;
        for _ in 0..WINDOW_DROP_MAX {
            // The oldest entry left over every band (offset order is age
            // order: enqueue times are non-decreasing in offset).
            let next = bands
                .iter_mut()
                .enumerate()
                .filter_map(|(band, entries)| entries.peek().map(|view| (view.offset, band)))
                .min();
            let Some((offset, band)) = next else { break };
            let view = *bands[band].peek().expect("just peeked");
            let aged = cutoff.is_some_and(|cutoff| view.enqueue_time_ms < cutoff);
            if offset >= durable_end || !(aged || over(bytes)) {
                break;
            }
            bytes -= u64::from(view.size_bytes);
            bands[band].next();
            through = Some(Offset(offset.0 + 1));
        }
        through
    }

    /// What the retention window does at `now`, if anything: a
    /// `WindowPassed` naming the first offset it keeps, when an entry
    /// below it is to go or when an entry of `expired` (the shared
    /// entries past their expiry the tick found) is one no subscription
    /// has left to deliver (a retained record whose expiry passed: no
    /// later start may be given it). Read-only; `None` for a queue with
    /// no window.
    pub(crate) fn window_event(
        &self,
        now: Millis,
        durable_end: Offset,
        expired: &[FreshView],
    ) -> Option<Event> {
        if !self.config.has_window() {
            return None;
        }
        let through = self.window_through(now, durable_end);
        let retained_expired = expired.iter().any(|view| {
            let band = (0..self.fresh.len()).find(|&b| self.fresh[b].get(view.offset).is_some());
            band.is_some_and(|band| !self.fresh_for_any(band, view.offset))
        });
        if through.is_none() && !retained_expired {
            return None;
        }
        let lowest = self.fresh.iter().filter_map(|band| band.front()).map(|v| v.offset).min();
        // Without entries to drop by age or size, the bound is the
        // lowest entry (nothing below it): only expired retained ones go.
        let through = through.or(lowest).unwrap_or(Offset(0));
        Some(Event::WindowPassed { through, at_ms: now })
    }

    /// When the window next has something to do: the oldest shared
    /// entry's enqueue time plus `retention_ms`, and at once while the
    /// shared records exceed `retention_bytes`. `None` for a queue with
    /// no window or an empty index. (Expired retained entries are
    /// covered by the index's expiries, `next_wakeup`.)
    pub(crate) fn window_wakeup(&self) -> Option<Millis> {
        let by_time = match self.config.retention_ms {
            0 => None,
            window => self.oldest_retained_ms().map(|at| at.saturating_add(window)),
        };
        let by_size = (self.config.retention_bytes > 0
            && self.retained().1 > self.config.retention_bytes)
            .then_some(0);
        by_time.into_iter().chain(by_size).min()
    }

    /// Applies `WindowPassed { through, at_ms }`: every shared entry below
    /// `through` leaves the index, and so does every one (up to
    /// `WINDOW_DROP_MAX` per band) no subscription has left to deliver
    /// whose expiry is at or before `at_ms`. A subscription that still had
    /// a dropped entry to deliver lost it (`Totals::lost`, a [`Loss`]);
    /// a record no subscription holds otherwise leaves the held and
    /// stored counts. Cursors below `through` move up to it.
    pub(crate) fn pass_window(&mut self, through: Offset, at_ms: Millis) -> Result<(), ApplyError> {
        if !self.config.has_window() {
            return Err(ApplyError::WrongState {
                offset: through,
                what: "WindowPassed: the queue has no retention window",
            });
        }
        let mut dropped: Vec<(usize, FreshView)> = Vec::new();
        for band in 0..self.fresh.len() {
            let fresh = &self.fresh[band];
            dropped.extend(fresh.iter().take_while(|v| v.offset < through).map(|v| (band, v)));
            let mut expired = Vec::new();
            fresh.expired(at_ms, Offset(u64::MAX), WINDOW_DROP_MAX, &mut expired);
            dropped.extend(
                expired
                    .into_iter()
                    .filter(|v| v.offset >= through && v.expiry_ms != NEVER)
                    .filter(|v| !self.fresh_for_any(band, v.offset))
                    .map(|v| (band, v)),
            );
        }
        // Per subscription: (count, lowest, highest) of what it lost.
        let mut lost = vec![(0u64, Offset(u64::MAX), Offset(0)); self.subs.len()];
        let mut leaving = Vec::new();
        for (band, view) in dropped {
            let offset = view.offset;
            self.note(offset);
            for (s, lost) in lost.iter_mut().enumerate() {
                if self.fresh_for(s, band, offset) {
                    let d = &mut self.subs[s];
                    d.fresh_len[band] -= 1;
                    d.fresh_bytes[band] -= u64::from(view.size_bytes);
                    *lost = (lost.0 + 1, lost.1.min(offset), lost.2.max(offset));
                }
            }
            self.fresh[band].remove(offset).expect("listed above");
            for d in &mut self.subs {
                if !d.skipped[band].is_empty() {
                    d.skipped[band].remove(&offset);
                }
            }
            let held = self
                .subs
                .iter()
                .any(|d| d.warm.contains_key(&offset) || d.dlq.contains_key(&offset));
            if !held {
                self.held.messages -= 1;
                self.held.bytes -= u64::from(view.size_bytes);
                leaving.push((offset, view.size_bytes));
            }
        }
        for (d, (count, from, to)) in self.subs.iter_mut().zip(lost) {
            for band in 0..d.cursors.len() {
                if d.cursors[band] < through {
                    d.cursors[band] = through;
                    d.skipped[band] = d.skipped[band].split_off(&through);
                }
            }
            if count > 0 {
                d.totals.lost += count;
                if d.losses.len() == LOSS_REPORTS_MAX {
                    d.losses.pop_front();
                }
                d.losses.push_back(Loss { from, to, count, at_ms });
            }
        }
        if !self.stored.is_empty() && !leaving.is_empty() {
            for (offset, size) in leaving {
                self.stored.leave(offset, size);
            }
            let oldest = self.retention_watermark().unwrap_or(self.next_data_offset());
            self.stored.trim_below(Some(oldest));
        }
        Ok(())
    }
}
