//! The housekeeping side of a partition: the tick (lease expiry, scheduled →
//! ready, expiry, wakes of long-polls past their deadline), the next timer
//! deadline for the shard's alarm, and close.

use super::signal;
use super::{
    Partition, PartitionError, ReadyHook, TouchHook, WakeupHook, CONTROL_BATCH_EVENTS_MAX,
    DISK_FULL_RETRY_MS,
};
use crate::io::Storage;
use crate::log::journal::JournalError;
use crate::log::LogError;
use crate::queue::Millis;

impl<S: Storage + Clone> Partition<S> {
    /// Housekeeping: lease expiry, scheduled → ready, expiry. Appends the
    /// events without waiting for durability (no one is waiting for a
    /// reply); a later reply's durability covers them. Wakes the long-polling
    /// claims that have something to re-check (see [`signal`]). Never blocks.
    pub fn tick(&self) {
        let now = (self.clock)();
        if self.log.disk_full() && now >= self.disk_retry_at_ms.get() {
            self.disk_retry_at_ms.set(now + DISK_FULL_RETRY_MS);
            self.log.retry_prepare();
        }
        let due = self.state.borrow().next_wakeup().is_some_and(|wakeup| wakeup <= now);
        // Long-polls past their deadline answer. Others are woken when
        // something fell due (a lease expired, a delay ended), and a few at
        // a time, in turn, while messages are ready: a message that the
        // claims woken for it could not take (too large for their
        // max_bytes, the other lane) still finds a claim that can.
        self.claimable.expire(now);
        if self.claimable.claims_waiting() > 0 {
            let counters = self.state.borrow().counters(now);
            if counters.ready + counters.quarantined > counters.dead_letter_claimed {
                self.claimable.notify(signal::TICK_SWEEP_WAKES);
            }
        }
        // The ready ring's safety net, as the sweep above is the waiting
        // claims': messages whose wake was lost (an enqueue whose reply
        // future was dropped before its records were durable) are listed
        // again at the latest by the next full sweep.
        if !self.closed.get() && self.state.borrow().has_ready() {
            self.ready(0);
        }
        // A replicated partition that does not serve decides nothing: its
        // leader's expiries reach it committed.
        if due && !self.closed.get() && self.serving() {
            // Decided on durable records only (`PartitionState::tick`).
            let events = self.state.borrow().tick(now, self.durable_end());
            self.may_be_claimable(events.len().max(1));
            for chunk in events.chunks(CONTROL_BATCH_EVENTS_MAX) {
                match self.append_events_deferred(chunk, now) {
                    Ok(()) => {}
                    // Full log buffers: try again next tick.
                    Err(
                        PartitionError::Log(LogError::Backpressure { .. })
                        | PartitionError::Journal(JournalError::Backpressure { .. }),
                    ) => break,
                    Err(error) => {
                        tracing::warn!(partition = ?self.name, %error, "tick events not appended");
                        break;
                    }
                }
            }
        }
    }

    /// Tells the wake-up hook (if any) the state's next timer deadline,
    /// and the touch hook that the partition changed.
    pub(super) fn hint_wakeup(&self) {
        if let Some(hook) = self.wakeup_hook.borrow().as_ref() {
            if let Some(at) = self.state.borrow().next_wakeup() {
                hook(at);
            }
        }
        self.touched();
    }

    /// A claim started waiting until `deadline`: the tick must run by then
    /// to end its wait ([`Signal::expire`](signal::Signal::expire)).
    pub(super) fn hint_waiting(&self, deadline: Millis) {
        if let Some(hook) = self.wakeup_hook.borrow().as_ref() {
            hook(deadline);
        }
        self.touched();
    }

    /// Messages may have become claimable, `count` of them: wakes as many
    /// waiting claims of this partition ([`signal::Signal::notify`]) and
    /// tells the ready hook.
    pub(super) fn may_be_claimable(&self, count: usize) {
        self.claimable.notify(count);
        self.ready(count);
    }

    pub(super) fn ready(&self, count: usize) {
        // A replicated member that does not serve is claimed from nowhere:
        // it is listed once it takes the lead (`take_leadership`).
        // Nor is a partition a resize holds: listed when the hold ends.
        if !self.serving() || self.held_by_keys() {
            return;
        }
        if let Some(hook) = self.ready_hook.borrow().as_ref() {
            hook(count);
        }
    }

    /// Installs the hook told whenever main-lane messages may have become
    /// claimable (an enqueue made durable, a release, a lease ended or a
    /// delay passed, a redrive) with how many, and at every tick that finds
    /// messages ready (with 0); replaces any earlier one. The shard's ready
    /// ring lists the partition from it, for claims of any partition.
    pub fn set_ready_hook(&self, hook: ReadyHook) {
        *self.ready_hook.borrow_mut() = Some(hook);
    }

    fn touched(&self) {
        if let Some(hook) = self.touch_hook.borrow().as_ref() {
            hook();
        }
    }

    /// Installs the hook told whenever this partition changes (see
    /// [`Partition::next_visit`]); replaces any earlier one.
    pub fn set_touch_hook(&self, hook: TouchHook) {
        *self.touch_hook.borrow_mut() = Some(hook);
    }

    /// When the shard's tick must next visit this partition, if nothing
    /// touches it first: its timers ([`Partition::next_due`]), the wait
    /// deadline of its earliest waiting claim, and
    /// [`TICK_SWEEP_INTERVAL_MS`](crate::limits::TICK_SWEEP_INTERVAL_MS)
    /// from `now` while claims wait and messages are ready (the tick's
    /// sweep wakes a few at a time). `None`: a visit has nothing to do until the
    /// partition is touched (a request changes it). The tick of a
    /// partition with neither is skipped, so an idle partition costs no
    /// periodic work.
    pub fn next_visit(&self, now: Millis) -> Option<Millis> {
        let mut at = self.next_due();
        if let Some(deadline) = self.claimable.next_deadline() {
            at = Some(at.map_or(deadline, |at| at.min(deadline)));
        }
        if self.claimable.claims_waiting() > 0 {
            let counters = self.state.borrow().counters(now);
            if counters.ready + counters.quarantined > counters.dead_letter_claimed {
                let sweep = now.saturating_add(crate::limits::TICK_SWEEP_INTERVAL_MS);
                at = Some(at.map_or(sweep, |at| at.min(sweep)));
            }
        }
        at
    }

    /// Installs the hook told of every deadline applied events create (the
    /// shard's alarm); replaces any earlier one.
    pub fn set_wakeup_hook(&self, hook: WakeupHook) {
        *self.wakeup_hook.borrow_mut() = Some(hook);
    }

    /// When [`Partition::tick`] next has something to do: the state's
    /// earliest timer (lease end, scheduled or expiring message) and, while
    /// the disk is full, the next retry. `None`: nothing is scheduled.
    pub fn next_due(&self) -> Option<Millis> {
        if self.closed.get() {
            return None;
        }
        let timers = self.state.borrow().next_wakeup();
        let retry = self.log.disk_full().then(|| self.disk_retry_at_ms.get());
        timers.into_iter().chain(retry).min()
    }

    /// Stops serving: wakes waiting claims (they return empty), waits for a
    /// checkpoint already running (started by a tick, it would otherwise
    /// go on writing after `close` returned, into a directory a queue
    /// delete removes next), writes a final checkpoint, and closes the log
    /// (its background future then completes once everything gathered is
    /// durable). No checkpoint starts after this. A replicated partition
    /// writes no final checkpoint: its member stops first, and a running
    /// checkpoint that waits for its entries' commit gives up.
    ///
    /// # Errors
    /// The final checkpoint failed; the log is closed regardless.
    pub async fn close(&self) -> Result<(), PartitionError> {
        self.closed.set(true);
        self.claimable.notify_all();
        if self.replica.is_some() {
            // The member stops first: a checkpoint waiting for its entries'
            // commit gives up, and none is written at close.
            self.log.close();
            while self.checkpoint_running.get() {
                self.checkpoint_ended.wait().await;
            }
            return Ok(());
        }
        let result = self.final_checkpoint().await.map(|_| ());
        self.log.close();
        result
    }

    /// Stops serving a partition whose queue is deleted (its directory is
    /// removed next): as [`Partition::close`], but without the final
    /// checkpoint — nothing will open this partition again (queue ids are
    /// never reused), so that side file and its sync would be written only
    /// to be removed, once per partition of the deleted queue. A
    /// checkpoint already running is still waited for, so nothing writes
    /// into the directory once this returns.
    pub async fn close_for_delete(&self) {
        self.closed.set(true);
        self.claimable.notify_all();
        while self.checkpoint_running.get() {
            self.checkpoint_ended.wait().await;
        }
        self.log.close();
    }
}
