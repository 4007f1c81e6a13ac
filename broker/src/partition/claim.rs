//! Claims: decide deliveries below the durable watermark, append and apply
//! the claim events, and reply with the records; with nothing to deliver,
//! long-poll on the partition's waiter register (`signal.rs`) until woken,
//! past the deadline, evicted, cancelled or given up.

use std::cell::Cell;
use std::future::Future;

use spool_wire::batch::BatchKind;

use super::read::Claimed;
use super::signal::{self, ClaimCancel, WaitOwner, WaitRefused, CLAIM_WAITERS_MAX};
use super::{Partition, PartitionError};
use crate::io::Storage;
use crate::queue::{ClaimDecision, ClaimRequest, Lane, Millis};

impl<S: Storage + Clone> Partition<S> {
    /// Claims up to `request.credits` messages from `lane`, long-polling up
    /// to `wait_ms` when none is ready. Hands out only records below the
    /// log's durable watermark, and replies once the claim events are
    /// appended and applied, without waiting for them to be durable (the
    /// epoch fence makes that safe; see the module doc), with each record's
    /// bytes. The wait belongs to no connection
    /// and cannot be cut short; see [`Partition::claim_as`].
    ///
    /// # Errors
    /// Lease or credits out of range, too many waiters, storage failure.
    pub async fn claim(
        &self,
        request: &ClaimRequest,
        lane: Lane,
        wait_ms: Millis,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let waiting = Cell::new(0);
        let owner = WaitOwner { id: u64::MAX, waiting: &waiting, waiting_max: usize::MAX };
        let cancel = ClaimCancel::default();
        self.claim_as(request, lane, wait_ms, owner, std::future::pending(), &cancel).await
    }

    /// [`Partition::claim`] on behalf of `owner` (a connection), whose
    /// waiting claims count against its own bound as well as the
    /// partition's. The wait ends early, with what was found (nothing), when
    /// `give_up` resolves (the peer closed, the broker stops) or when the
    /// partition evicts this waiter in favour of a lighter owner. A claim
    /// gives up only while waiting, never between appending its events and
    /// replying. `cancel` withdraws it (the protocol's CancelClaim): once
    /// cancelled it decides nothing more and answers empty at once; once it
    /// has decided deliveries, `cancel` refuses (see [`ClaimCancel`]).
    ///
    /// # Errors
    /// Lease or credits out of range, too many waiters (on the partition or
    /// for the owner), storage failure.
    pub async fn claim_as(
        &self,
        request: &ClaimRequest,
        lane: Lane,
        wait_ms: Millis,
        owner: WaitOwner<'_>,
        give_up: impl Future<Output = ()>,
        cancel: &ClaimCancel,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let deadline = (self.clock)().saturating_add(wait_ms);
        let room = Self::control_bytes(request.credits as usize, true);
        let mut give_up = std::pin::pin!(give_up);
        let mut slot = None;
        // The decision's vectors are the partition's reused ones, given back
        // when this claim ends (see `scratch.rs`).
        let mut decision = ClaimScratch { partition: self, decision: self.scratch.take_claim() };
        loop {
            self.log.writable(BatchKind::Control, room).await;
            if cancel.is_cancelled() {
                return Ok(Vec::new());
            }
            let now = (self.clock)();
            let durable_end = self.durable_end();
            {
                let state = self.state.borrow();
                let decision = &mut decision.decision;
                match lane {
                    // A resize's hold: nothing until the older partitions
                    // drained; the hold's end wakes this wait.
                    Lane::Main if self.held_by_keys() => {
                        decision.events.clear();
                        decision.deliveries.clear();
                        decision.exhausted = true;
                    }
                    Lane::Main => state.claim_into(now, request, durable_end, decision)?,
                    Lane::DeadLetter => {
                        state.claim_dead_letters_into(now, request, durable_end, decision)?;
                    }
                }
            }
            let decision = &decision.decision;
            if !decision.deliveries.is_empty() {
                // No await since the check above: not cancelled, so this holds.
                let decided = cancel.decide();
                debug_assert!(decided);
                drop(slot);
                // No wait for durability (but in an ordered queue, see
                // `append_claim_events`): every record delivered is below
                // `durable_end`, and a claim lost before its sync is ended by
                // the epoch fence at the next open.
                self.append_claim_events(&decision.events, now, lane).await?;
                return self.with_records(&decision.deliveries).await;
            }
            let evicted = slot.as_ref().is_some_and(signal::WaiterSlot::evicted);
            if now >= deadline || self.closed.get() || evicted {
                return Ok(Vec::new());
            }
            if slot.is_none() {
                slot = Some(self.claimable.register(owner, CLAIM_WAITERS_MAX, deadline).map_err(
                    |refused| match refused {
                        WaitRefused::OwnerFull { waiting_max } => {
                            PartitionError::TooManyWaitersOnConnection { waiting_max }
                        }
                        WaitRefused::PartitionFull { .. } => PartitionError::TooManyWaiters,
                    },
                )?);
                self.hint_waiting(deadline);
            }
            let Some(waiter) = slot.as_ref() else { continue };
            if waiter.wait_or_give_up(give_up.as_mut(), cancel).await {
                return Ok(Vec::new());
            }
        }
    }

    /// Claims what is ready on the main lane now, without waiting: the
    /// step a claim of any partition of the shard takes at each partition
    /// its ready ring lists. Returns the deliveries and whether the
    /// partition is exhausted (nothing more claimable below its durable
    /// end, [`ClaimDecision::exhausted`]); a closed partition is. `cancel`
    /// as for [`Partition::claim_as`]: checked before deciding, decided
    /// once there are deliveries.
    ///
    /// [`ClaimDecision::exhausted`]: crate::queue::ClaimDecision::exhausted
    ///
    /// # Errors
    /// Lease or credits out of range, storage failure.
    pub async fn claim_ready(
        &self,
        request: &ClaimRequest,
        cancel: &ClaimCancel,
    ) -> Result<ClaimedReady, PartitionError> {
        let room = Self::control_bytes(request.credits as usize, true);
        let mut scratch = ClaimScratch { partition: self, decision: self.scratch.take_claim() };
        self.log.writable(BatchKind::Control, room).await;
        if self.closed.get() || cancel.is_cancelled() {
            return Ok(ClaimedReady { claimed: Vec::new(), exhausted: self.closed.get() });
        }
        // Held by a resize: listed again when the hold ends.
        if self.held_by_keys() {
            return Ok(ClaimedReady { claimed: Vec::new(), exhausted: true });
        }
        let now = (self.clock)();
        let durable_end = self.durable_end();
        let decision = &mut scratch.decision;
        self.state.borrow().claim_into(now, request, durable_end, decision)?;
        let exhausted = decision.exhausted;
        if decision.deliveries.is_empty() {
            return Ok(ClaimedReady { claimed: Vec::new(), exhausted });
        }
        // No await since the check above: not cancelled, so this holds.
        let decided = cancel.decide();
        debug_assert!(decided);
        self.append_claim_events(&decision.events, now, Lane::Main).await?;
        let claimed = self.with_records(&decision.deliveries).await?;
        Ok(ClaimedReady { claimed, exhausted })
    }

    /// Appends and applies a claim's events. Its reply does not wait for
    /// their durability — except a main-lane claim of an ordered queue,
    /// which waits for its own commit: it may deliver a key's next message
    /// only because the previous one's ack (dead letter, expiry) was
    /// applied, and until that event is durable a crash could undo it and
    /// deliver the earlier message again after the later one. The log is
    /// durable as a prefix, so the claim's commit covers every event
    /// before it (found by the kill loop's ordered mode).
    async fn append_claim_events(
        &self,
        events: &[crate::queue::Event],
        now: Millis,
        lane: Lane,
    ) -> Result<(), PartitionError> {
        let ordered = lane == Lane::Main && self.state.borrow().config.ordered;
        if !ordered {
            return self.append_events_deferred(events, now);
        }
        match self.append_events(events, now)? {
            Some(ticket) => ticket.durable().await,
            None => Ok(()),
        }
    }

    /// Where the messages a [`claim_ready`](Self::claim_ready) of
    /// `request` would deliver lie in the shard's journal, in the order it
    /// would deliver them (`u64::MAX` for one whose entry has no position
    /// yet), into `positions` (cleared first); and whether nothing more is
    /// claimable. Decides as the claim would, appends nothing: what a
    /// claim of any partition orders its visits by
    /// (`docs/design/shard-journal.md` §13).
    ///
    /// # Errors
    /// As [`claim_ready`](Self::claim_ready)'s decision (a lease out of
    /// range).
    pub fn ready_positions(
        &self,
        request: &ClaimRequest,
        positions: &mut Vec<u64>,
    ) -> Result<bool, PartitionError> {
        positions.clear();
        if self.closed.get() || self.held_by_keys() {
            return Ok(true);
        }
        let mut scratch = ClaimScratch { partition: self, decision: self.scratch.take_claim() };
        let decision = &mut scratch.decision;
        self.state.borrow().claim_into((self.clock)(), request, self.durable_end(), decision)?;
        let journal = self.log.journal();
        positions.extend(
            decision
                .deliveries
                .iter()
                .map(|delivery| journal.position_of(delivery.offset).map_or(u64::MAX, |p| p.0)),
        );
        Ok(decision.exhausted)
    }

    /// Claims waiting on this partition now (long-polls holding a slot).
    pub fn claims_waiting(&self) -> usize {
        self.claimable.claims_waiting()
    }
}

/// What [`Partition::claim_ready`] found.
#[derive(Debug)]
pub struct ClaimedReady {
    /// The deliveries, with their records.
    pub claimed: Vec<Claimed>,
    /// Nothing more was claimable when it decided.
    pub exhausted: bool,
}

/// A claim's decision on loan from its partition's scratch: given back
/// however the claim ends (answered, failed, or its future dropped).
struct ClaimScratch<'a, S: Storage + Clone> {
    partition: &'a Partition<S>,
    decision: ClaimDecision,
}

impl<S: Storage + Clone> Drop for ClaimScratch<'_, S> {
    fn drop(&mut self) {
        self.partition.scratch.give_claim(std::mem::take(&mut self.decision));
    }
}
