//! Enqueue: validate a producer's batch, check each record's clock stamp and
//! schedule, decide admission (dedupe, queue limits), append the accepted
//! records, apply them, and reply once they are durable. A batch from an
//! authenticated producer is followed, in the same synchronous step, by its
//! `Attributed` event (who wrote the records: the stored quotas,
//! `queue/stored.rs`), and the reply waits for that event's commit too.

use spool_wire::batch::{BatchKind, BatchView};
use spool_wire::limits::SCHEDULE_HORIZON_MS;

use super::scratch::EnqueueScratch;
use super::{LogTicket, Partition, PartitionError, QueuedSlot, ENQUEUE_CLOCK_SKEW_MS_MAX};
use crate::io::Storage;
use crate::queue::stored::PrincipalId;
use crate::queue::{
    EnqueueDecision, EnqueueMeta, EnqueueRequest, Event, MessageId, Millis, Offset, OrderKey,
};

/// What happened to one record of an enqueued batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    Appended {
        offset: Offset,
    },
    Duplicate {
        original: Offset,
    },
    /// Not appended: the queue was resized and the record's key now maps
    /// to another partition (`keys.rs`); its producer routes it again.
    Moved,
}

/// Extracts the admission request of one archived record.
pub(super) fn enqueue_request(view: &BatchView<'_>, index: usize) -> EnqueueRequest {
    let record = view.record(index);
    let expiry_ms = record.expiry_ms.to_native();
    EnqueueRequest {
        message_id: MessageId(record.message_id.0),
        priority: record.priority,
        not_before_ms: record.not_before_ms.to_native(),
        expiry_ms: (expiry_ms != 0).then_some(expiry_ms),
        // Bounded by RECORD_BYTES_MAX (validated), which fits u32.
        size_bytes: view.record_bytes(index).len() as u32,
    }
}

/// Refuses a record whose `not_before_ms` or `expiry_ms` lies beyond
/// [`SCHEDULE_HORIZON_MS`] from `now_ms`, or that would expire before it is
/// due (both set, expiry not after not_before).
fn check_schedule(
    view: &BatchView<'_>,
    index: usize,
    now_ms: Millis,
) -> Result<(), PartitionError> {
    let record = view.record(index);
    let not_before_ms = record.not_before_ms.to_native();
    let expiry_ms = record.expiry_ms.to_native();
    let horizon_ms = now_ms.saturating_add(SCHEDULE_HORIZON_MS);
    for (field, value_ms) in [("not_before_ms", not_before_ms), ("expiry_ms", expiry_ms)] {
        if value_ms > horizon_ms {
            return Err(PartitionError::BeyondHorizon { index, field, value_ms, now_ms });
        }
    }
    if not_before_ms != 0 && expiry_ms != 0 && expiry_ms <= not_before_ms {
        return Err(PartitionError::ExpiresBeforeDue { index, not_before_ms, expiry_ms });
    }
    Ok(())
}

/// The newest `Attributed` event, while the commit that will hold it is
/// still open and no other data batch was appended after the ones it names.
/// The next batch of the same principal is attributed by rewriting it in
/// place (`count` grows over the new records) instead of by an
/// event of its own. Forgotten when another producer's (or an anonymous)
/// batch is appended, when a checkpoint marks the log (the event must not
/// change once a checkpoint's state covers it), and when its commit was
/// taken (the rewrite is refused).
pub(super) struct OpenAttribution {
    principal: PrincipalId,
    /// The first record it names.
    offset: Offset,
    /// The offsets it names from `offset` on.
    count: u32,
    /// The event's time and its control record's stamp.
    at_ms: Millis,
    /// Where its control batch waits for a commit.
    slot: QueuedSlot,
    ticket: LogTicket,
}

impl<S: Storage + Clone> Partition<S> {
    /// Enqueues a data batch from a producer (untrusted bytes, 8-aligned).
    /// Returns one outcome per record, after the appended records are durable.
    ///
    /// # Errors
    /// Invalid batch, clock skew, QUEUE_FULL (nothing is appended then),
    /// storage failure.
    pub async fn enqueue(&self, batch: &[u8]) -> Result<Vec<EnqueueOutcome>, PartitionError> {
        self.enqueue_as(batch, PrincipalId::UNKNOWN).await
    }

    /// [`enqueue`](Self::enqueue) for `principal`: the appended records
    /// count against its stored quotas until they leave
    /// ([`PrincipalId::UNKNOWN`]: against no one, and no event is
    /// appended).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_as(
        &self,
        batch: &[u8],
        principal: PrincipalId,
    ) -> Result<Vec<EnqueueOutcome>, PartitionError> {
        let view = BatchView::validate(batch)?;
        if view.header().kind != BatchKind::Data {
            return Err(PartitionError::NotData);
        }
        if view.header().flags != 0 {
            return Err(PartitionError::Flags(view.header().flags));
        }
        if principal == PrincipalId::UNKNOWN {
            self.log.writable(BatchKind::Data, batch.len() as u64).await;
        } else {
            // Room for the batch and its attribution together: once the
            // data is appended, the attribution cannot be refused for room
            // (it would leave the records counted against no one).
            self.log.writable_pair(batch.len() as u64, Self::control_bytes(1, false)).await;
        }
        // From here to the append: no await, so no other request interleaves.
        let now = (self.clock)();
        // The bookkeeping lives in the partition's reused scratch, given
        // back before the wait for durability.
        let (outcomes, ticket, attributed) = {
            let mut scratch = self.scratch.enqueue.borrow_mut();
            let result = self.admit_and_append(batch, &view, now, principal, &mut scratch);
            scratch.recycle();
            result?
        };
        let appended = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, EnqueueOutcome::Appended { .. }))
            .count();
        // A duplicate reply promises the original is durable: without an
        // append of our own, wait for everything appended so far.
        match ticket {
            Some(ticket) => {
                ticket.durable().await?;
                if let Some(control) = attributed {
                    control.durable().await?;
                }
            }
            None => {
                let barrier = self.appends.borrow().barrier();
                barrier.durable().await?;
            }
        }
        // Claims hand out only durable records, so waiting claims are woken
        // now that these are (not at append, when they could not take them).
        // Should this future be dropped before, the next tick's sweep wakes
        // them (a few at a time while messages are ready).
        if appended > 0 {
            self.may_be_claimable(appended);
        }
        Ok(outcomes)
    }

    /// The part of [`Partition::enqueue`] with no await: check each record,
    /// decide admission, append the accepted records and apply them.
    /// Returns one outcome per record, the append's ticket (none when every
    /// record was a duplicate) and the ticket of the records' attribution to
    /// `principal` (none for [`PrincipalId::UNKNOWN`]).
    #[allow(clippy::type_complexity)]
    fn admit_and_append(
        &self,
        batch: &[u8],
        view: &BatchView<'_>,
        now: Millis,
        principal: PrincipalId,
        scratch: &mut EnqueueScratch,
    ) -> Result<(Vec<EnqueueOutcome>, Option<LogTicket>, Option<LogTicket>), PartitionError> {
        let EnqueueScratch { requests, decisions, accepted, ids } = scratch;
        requests.clear();
        decisions.clear();
        accepted.clear();
        // Keys matter to an ordered queue's lanes alone: hashed once here.
        let ordered = self.state.borrow().config.ordered;
        for index in 0..view.len() {
            let stamp = view.record(index).enqueue_time_ms.to_native();
            if stamp.abs_diff(now) > ENQUEUE_CLOCK_SKEW_MS_MAX {
                return Err(PartitionError::ClockSkew { index, stamp_ms: stamp, now_ms: now });
            }
            check_schedule(view, index, now)?;
            let key = if ordered {
                OrderKey::of(view.record(index).routing_key.as_slice())
            } else {
                None
            };
            requests.push((enqueue_request(view, index), stamp, key));
        }
        // What the batch may add to the state, against the shard's share:
        // refused whole, before anything is appended.
        let needed = (requests.len() as u64)
            .saturating_mul(crate::queue::PartitionState::memory_charge_per_enqueue());
        self.memory.borrow().meter().admit(needed).map_err(PartitionError::StateMemory)?;
        {
            let state = self.state.borrow();
            let mut admission = state.admission_with(now, ids);
            for (index, (request, _, key)) in requests.iter().enumerate() {
                let decision = admission.check_keyed(request, *key)?;
                match decision {
                    EnqueueDecision::QueueFull { limit } => {
                        return Err(PartitionError::QueueFull { limit });
                    }
                    EnqueueDecision::ActiveKeysFull { max } => {
                        return Err(PartitionError::ActiveKeysFull { index, max });
                    }
                    _ => {}
                }
                decisions.push(decision);
            }
        }
        // A record already here stays a duplicate; a new one whose key a
        // resize moved is refused, so its producer routes it again.
        let mut outcomes = vec![EnqueueOutcome::Duplicate { original: Offset(0) }; requests.len()];
        for (index, decision) in decisions.iter().enumerate() {
            if matches!(decision, EnqueueDecision::Accept)
                && self.key_moved(view.record(index).routing_key.as_slice())
            {
                outcomes[index] = EnqueueOutcome::Moved;
            }
        }
        accepted.extend(
            decisions
                .iter()
                .enumerate()
                .filter(|(index, decision)| {
                    matches!(decision, EnqueueDecision::Accept)
                        && outcomes[*index] != EnqueueOutcome::Moved
                })
                .map(|(index, _)| index as u32),
        );
        let mut ticket = None;
        let mut attributed = None;
        if !accepted.is_empty() {
            let reframed;
            let bytes: &[u8] = if accepted.len() == requests.len() {
                batch
            } else {
                reframed = view.reframe(accepted)?;
                &reframed
            };
            let appended = self.log_append(bytes, true)?;
            let mut state = self.state.borrow_mut();
            for (position, &index) in accepted.iter().enumerate() {
                let offset = Offset(appended.base_offset.0 + position as u64);
                let (request, stamp, key) = &requests[index as usize];
                let event =
                    Event::Enqueued(EnqueueMeta::new(request, offset, *stamp).with_key(*key));
                if let Err(error) = state.apply(&event) {
                    panic!(
                        "partition {:?}: enqueue at {offset:?} does not apply: {error}",
                        self.name
                    );
                }
                outcomes[index as usize] = EnqueueOutcome::Appended { offset };
            }
            drop(state);
            self.recharge();
            self.appends.borrow_mut().note(BatchKind::Data, &appended.ticket);
            self.hint_wakeup();
            ticket = Some(appended.ticket);
            // At most a batch's record count.
            let records = accepted.len() as u32;
            if principal == PrincipalId::UNKNOWN {
                // Records no one is named for now lie after the open
                // attribution: it cannot grow over them.
                self.attribution.borrow_mut().take();
            } else if let Some(control) =
                self.extend_attribution(principal, appended.base_offset, records)
            {
                attributed = Some(control);
            } else {
                // Still no await since the data append: nothing lies
                // between the batch and its attribution.
                let event = Event::Attributed {
                    offset: appended.base_offset,
                    count: records,
                    principal,
                    at_ms: now,
                };
                // Room for it was there with the data's (`writable_pair`),
                // and a log that failed or closed refused the data already
                // (nothing awaited between): what is left is a journal that
                // refuses the entry (too large, say). Then the enqueue is
                // answered with that
                // error rather than leave the records silently uncounted.
                match self.append_attribution(event, now) {
                    Ok(control) => attributed = Some(control),
                    Err(error) => {
                        tracing::error!(
                            partition = ?self.name,
                            %error,
                            "enqueue: attribution not appended; the batch is refused"
                        );
                        return Err(error);
                    }
                }
            }
        }
        for (index, decision) in decisions.iter().enumerate() {
            match decision {
                EnqueueDecision::Duplicate { original } => {
                    outcomes[index] = EnqueueOutcome::Duplicate { original: *original };
                }
                EnqueueDecision::DuplicateInBatch { index: first } => {
                    outcomes[index] = match outcomes[*first] {
                        EnqueueOutcome::Appended { offset } => {
                            EnqueueOutcome::Duplicate { original: offset }
                        }
                        EnqueueOutcome::Duplicate { original } => {
                            EnqueueOutcome::Duplicate { original }
                        }
                        EnqueueOutcome::Moved => EnqueueOutcome::Moved,
                    };
                }
                EnqueueDecision::Accept
                | EnqueueDecision::QueueFull { .. }
                | EnqueueDecision::ActiveKeysFull { .. } => {}
            }
        }
        Ok((outcomes, ticket, attributed))
    }

    /// Appends `event` (an `Attributed`) as a control batch of its own and
    /// keeps it open for the next batch of its principal to extend.
    fn append_attribution(&self, event: Event, now: Millis) -> Result<LogTicket, PartitionError> {
        let Event::Attributed { offset, count, principal, .. } = event else {
            unreachable!("only attributions are kept open");
        };
        let appended = self.append_events_at(&[event], now, true)?;
        let mut stats = self.attribution_stats.get();
        stats.events += 1;
        self.attribution_stats.set(stats);
        *self.attribution.borrow_mut() = Some(OpenAttribution {
            principal,
            offset,
            count,
            at_ms: now,
            slot: appended.slot,
            ticket: appended.ticket.clone(),
        });
        Ok(appended.ticket)
    }

    /// Attributes the `records` records appended from `base` on to
    /// `principal` by extending the open attribution, when it is the same
    /// principal's and its commit is still open: its control batch is
    /// rewritten in place to name everything from its first record to the
    /// last of these, and the state applies the attribution of these
    /// records alone (the run grows over them; what lies between holds no
    /// message). Returns the extended event's ticket, or `None` (the open
    /// attribution forgotten) when it cannot be extended: the caller
    /// appends an event of its own.
    fn extend_attribution(
        &self,
        principal: PrincipalId,
        base: Offset,
        records: u32,
    ) -> Option<LogTicket> {
        let mut slot = self.attribution.borrow_mut();
        let open = slot.as_mut()?;
        let grown = base
            .0
            .checked_add(u64::from(records))
            .and_then(|end| end.checked_sub(open.offset.0))
            .and_then(|count| u32::try_from(count).ok());
        let count = match grown {
            // The new records lie after those it names (no other data
            // batch was appended since: it would have been forgotten).
            Some(count)
                if open.principal == principal
                    && base.0 >= open.offset.0 + u64::from(open.count) =>
            {
                count
            }
            _ => {
                *slot = None;
                return None;
            }
        };
        let event = Event::Attributed { offset: open.offset, count, principal, at_ms: open.at_ms };
        let replaced = {
            let mut scratch = self.scratch.control.borrow_mut();
            let built = Self::build_control_batch(&mut scratch, &[event], open.at_ms)
                .is_ok_and(|()| self.log.replace_queued(&open.slot, &scratch.batch));
            scratch.recycle();
            built
        };
        if !replaced {
            *slot = None;
            return None;
        }
        open.count = count;
        let (ticket, at_ms) = (open.ticket.clone(), open.at_ms);
        drop(slot);
        let increment = Event::Attributed { offset: base, count: records, principal, at_ms };
        if let Err(error) = self.state.borrow_mut().apply(&increment) {
            panic!("partition {:?}: attribution at {base:?} does not apply: {error}", self.name);
        }
        self.recharge();
        let mut stats = self.attribution_stats.get();
        stats.extended += 1;
        self.attribution_stats.set(stats);
        Some(ticket)
    }
}
