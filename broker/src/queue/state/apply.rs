//! `apply`: the only mutation of the state, on the live path and on replay
//! alike, with the checks that refuse an event that does not fit.

use super::{Claim, DeadLetter, DeadPhase, LoggedKeyMap, PartitionState, Warm, WarmPhase};
use crate::queue::error::ApplyError;
use crate::queue::event::Event;
use crate::queue::fairness;
use crate::queue::fresh::{FreshView, NEVER};
use crate::queue::types::{
    EnqueueMeta, Generation, Lane, Millis, Offset, QuarantineCause, ReleaseReason,
};

impl PartitionState {
    /// If applying `event` takes a held message out of the partition, its
    /// offset and record bytes (for the per-principal stored counts). Read
    /// **before** the event is applied (afterwards the message is gone). Ack
    /// of either lane, expiry (an expiry that dead-letters is a
    /// `Quarantined` event and stays held), purge of either lane; every
    /// other event keeps every message held. With several subscriptions a
    /// message leaves only with the last one holding it.
    pub fn leaving(&self, event: &Event) -> Option<(Offset, u32)> {
        let s = self.sub_index(event.subscription()?)?;
        let (lane, offset) = match *event {
            Event::Acked { lane, offset, .. } | Event::Purged { lane, offset, .. } => {
                (lane, offset)
            }
            Event::Expired { offset, .. } => (Lane::Main, offset),
            _ => return None,
        };
        let size = match lane {
            Lane::Main => self.main_message(s, offset)?.warm.size_bytes,
            Lane::DeadLetter => self.subs[s].dlq.get(&offset)?.size_bytes,
        };
        (!self.held_by_other(s, offset)).then_some((offset, size))
    }

    /// Applies one event: the only way the state changes, on the live path
    /// and on replay.
    ///
    /// # Errors
    /// [`ApplyError`] when the event does not fit the state (nothing changes).
    pub fn apply(&mut self, event: &Event) -> Result<(), ApplyError> {
        // A message that leaves (ack, expiry, purge) leaves its principal's
        // stored counts: read before the event takes it out. An event that
        // does not apply changes nothing, so the counts are lowered only
        // once it did.
        let leaving = if self.stored.is_empty() { None } else { self.leaving(event) };
        self.apply_event(event)?;
        if let Some((offset, size)) = leaving {
            let first = self.stored.in_first_run(offset);
            self.stored.leave(offset, size);
            if first {
                // With nothing held, only runs of records still to come (a
                // pending attribution in a journal's replay) stay.
                let oldest = self.retention_watermark().unwrap_or(self.next_data_offset());
                self.stored.trim_below(Some(oldest));
            }
        }
        if let Event::Enqueued(meta) = event {
            if !self.stored.is_empty() {
                self.stored.arrived(meta.offset, meta.size_bytes);
            }
        }
        Ok(())
    }

    /// One past the highest offset a record was applied at (0 before any).
    pub(crate) fn next_data_offset(&self) -> Offset {
        Offset(self.highest_enqueued.map_or(0, |highest| highest.0 + 1))
    }

    /// Drops the attributions of records not applied (yet): see
    /// [`StoredByPrincipal::drop_pending`]. Replay calls it when the
    /// leader epoch of the batches changes and when it ends; on the live
    /// path there are none (a batch's records are applied before its
    /// attribution). Returns how many attributed offsets were dropped.
    pub fn drop_pending_attributions(&mut self) -> u64 {
        let next = self.next_data_offset();
        self.stored.drop_pending(next)
    }

    fn apply_event(&mut self, event: &Event) -> Result<(), ApplyError> {
        // A delivery event acts for its subscription; every other event
        // for the log side (index 0 is unused by them).
        let s = match event.subscription() {
            Some(sub) => self.sub_index(sub).ok_or(ApplyError::UnknownSubscription(sub))?,
            None => 0,
        };
        match *event {
            Event::Enqueued(meta) => self.apply_enqueued(&meta),
            Event::Claimed {
                lane, offset, generation, worker, claimed_at_ms, deadline_ms, ..
            } => {
                let claim = Claim::new(worker, claimed_at_ms, deadline_ms).ok_or(
                    ApplyError::WrongState { offset, what: "Claimed: deadline out of range" },
                )?;
                self.apply_claimed(s, lane, offset, generation, claim)
            }
            Event::Extended { lane, offset, generation, deadline_ms, .. } => {
                let claim = self.current_claim(s, lane, offset, generation)?;
                let moved = Claim::new(claim.worker, claim.claimed_at_ms, deadline_ms).ok_or(
                    ApplyError::WrongState { offset, what: "Extended: deadline out of range" },
                )?;
                self.note(offset);
                assert!(self.subs[s].claims.remove(&(claim.deadline_ms(), offset)));
                assert!(self.subs[s].claims.insert((deadline_ms, offset)));
                match lane {
                    Lane::Main => {
                        let warm =
                            self.subs[s].warm.get_mut(&offset).expect("current_claim found it");
                        warm.phase = WarmPhase::Claimed(moved);
                    }
                    Lane::DeadLetter => {
                        let dead =
                            self.subs[s].dlq.get_mut(&offset).expect("current_claim found it");
                        dead.phase = DeadPhase::Claimed(moved);
                    }
                }
                Ok(())
            }
            Event::Acked { lane, offset, generation, at_ms, .. } => {
                self.current_claim(s, lane, offset, generation)?;
                match lane {
                    Lane::Main => {
                        let warm = self.take_main(s, offset).expect("current_claim found it").warm;
                        self.left(s, offset, warm.size_bytes);
                        self.lane_left(s, offset, warm.phase, at_ms);
                        self.subs[s].totals.acked += 1;
                    }
                    Lane::DeadLetter => {
                        let dead = self.take_dead(s, offset).expect("current_claim found it");
                        self.left(s, offset, dead.size_bytes);
                        self.subs[s].totals.dead_letter_acked += 1;
                    }
                }
                Ok(())
            }
            Event::Released { lane, offset, generation, reason, at_ms, not_before_ms, .. } => {
                self.current_claim(s, lane, offset, generation)?;
                self.end_claim(s, lane, offset, reason, at_ms, not_before_ms);
                self.subs[s].totals.released += 1;
                Ok(())
            }
            Event::LeaseExpired { lane, offset, generation, at_ms, .. } => {
                self.current_claim(s, lane, offset, generation)?;
                self.end_claim(s, lane, offset, ReleaseReason::LEASE_EXPIRED, at_ms, at_ms);
                self.subs[s].totals.lease_expired += 1;
                Ok(())
            }
            Event::Readied { offset, generation, at_ms, .. } => {
                let warm =
                    self.subs[s].warm.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, warm.generation)?;
                if !matches!(warm.phase, WarmPhase::Scheduled { .. }) {
                    return Err(ApplyError::WrongState { offset, what: "Readied: not scheduled" });
                }
                let mut warm = self.take_main(s, offset).expect("just found").warm;
                warm.phase = WarmPhase::Ready { since_ms: at_ms };
                self.insert_warm(s, offset, warm);
                Ok(())
            }
            Event::Quarantined { offset, generation, cause, reason, at_ms, .. } => {
                let found =
                    self.main_message(s, offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, found.warm.generation)?;
                let warm = self.take_main(s, offset).expect("just found").warm;
                let ended_claim = matches!(warm.phase, WarmPhase::Claimed(_));
                let dead = DeadLetter {
                    enqueue_time_ms: warm.enqueue_time_ms,
                    expiry_ms: warm.expiry_ms,
                    size_bytes: warm.size_bytes,
                    priority: warm.priority,
                    attempts: warm.attempts.saturating_add(u16::from(ended_claim)),
                    generation: warm.generation,
                    last_reason: reason,
                    cause,
                    quarantined_at_ms: at_ms,
                    phase: DeadPhase::Ready { since_ms: at_ms },
                };
                self.insert_dead(s, offset, dead);
                self.lane_left(s, offset, warm.phase, at_ms);
                self.subs[s].totals.quarantined += 1;
                match cause {
                    QuarantineCause::Deliveries => {
                        self.subs[s].totals.quarantined_by_deliveries += 1
                    }
                    QuarantineCause::Expired => self.subs[s].totals.quarantined_by_expiry += 1,
                }
                Ok(())
            }
            Event::Expired { offset, generation, at_ms, .. } => {
                let found =
                    self.main_message(s, offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, found.warm.generation)?;
                let warm = self.take_main(s, offset).expect("just found").warm;
                self.left(s, offset, warm.size_bytes);
                self.lane_left(s, offset, warm.phase, at_ms);
                self.subs[s].totals.expired += 1;
                Ok(())
            }
            Event::Redriven { offset, generation, at_ms, .. } => {
                let dead =
                    self.subs[s].dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                Self::check_generation(offset, generation, dead.generation)?;
                if !matches!(dead.phase, DeadPhase::Ready { .. }) {
                    return Err(ApplyError::WrongState { offset, what: "Redriven: claimed" });
                }
                let dead = self.take_dead(s, offset).expect("just found");
                let warm = Warm {
                    enqueue_time_ms: dead.enqueue_time_ms,
                    expiry_ms: dead.expiry_ms,
                    size_bytes: dead.size_bytes,
                    priority: self.band_of(dead.priority) as u8,
                    attempts: 0,
                    generation: dead.generation,
                    last_reason: dead.last_reason,
                    phase: WarmPhase::Ready { since_ms: at_ms },
                };
                self.insert_warm(s, offset, warm);
                self.subs[s].totals.redriven += 1;
                Ok(())
            }
            Event::Purged { lane, offset, generation, at_ms, .. } => {
                match lane {
                    Lane::Main => {
                        let found = self
                            .main_message(s, offset)
                            .ok_or(ApplyError::UnknownMessage(offset))?;
                        Self::check_generation(offset, generation, found.warm.generation)?;
                        if matches!(found.warm.phase, WarmPhase::Claimed(_)) {
                            return Err(ApplyError::WrongState { offset, what: "Purged: claimed" });
                        }
                        let warm = self.take_main(s, offset).expect("just found").warm;
                        self.left(s, offset, warm.size_bytes);
                        self.lane_left(s, offset, warm.phase, at_ms);
                    }
                    Lane::DeadLetter => {
                        let dead = self.subs[s]
                            .dlq
                            .get(&offset)
                            .ok_or(ApplyError::UnknownMessage(offset))?;
                        Self::check_generation(offset, generation, dead.generation)?;
                        if !matches!(dead.phase, DeadPhase::Ready { .. }) {
                            return Err(ApplyError::WrongState { offset, what: "Purged: claimed" });
                        }
                        let dead = self.take_dead(s, offset).expect("just found");
                        self.left(s, offset, dead.size_bytes);
                    }
                }
                self.subs[s].totals.purged += 1;
                Ok(())
            }
            Event::Attributed { offset, count, principal, .. } => {
                self.apply_attributed(offset, count, principal)
            }
            // Marks where a leader's term began in a replicated log; the
            // queue has nothing to change for it.
            Event::TermStarted { .. } => Ok(()),
            // The newest version named wins: a later leader may name an
            // older one it served under before applying the newer.
            Event::KeyMap { version, partitions, .. } => {
                if self.key_map.is_none_or(|logged| version > logged.version) {
                    self.key_map = Some(LoggedKeyMap { version, partitions });
                }
                Ok(())
            }
            // A change needs the members it changes: a replicated
            // partition seeds them before its replay.
            Event::Membership { change } => {
                let members = self.members.as_mut().ok_or(ApplyError::WrongState {
                    offset: Offset(0),
                    what: "Membership: no members seeded",
                })?;
                *members = members.changed(change);
                Ok(())
            }
            Event::SubscriptionStarted { sub, from, .. } => self.start_subscription(sub, from),
            Event::SubscriptionEnded { sub, .. } => self.end_subscription(sub),
            Event::WindowPassed { through, at_ms } => self.pass_window(through, at_ms),
        }
    }

    /// Counts the held records among the `count` from `offset` on against
    /// `principal`. On the live path they are all held (the event is appended right behind its batch, in the
    /// same step). In a journal (control lane ahead of data) the event may
    /// replay before its records: its run is kept, and each record counts
    /// when its `Enqueued` event arrives ([`StoredByPrincipal::arrived`]);
    /// an event that outlived records a crash lost is dropped at the next
    /// epoch or the end of replay ([`Self::drop_pending_attributions`])
    /// (`docs/operations.md`, "Stored quotas").
    fn apply_attributed(
        &mut self,
        offset: Offset,
        count: u32,
        principal: crate::queue::stored::PrincipalId,
    ) -> Result<(), ApplyError> {
        let highest_end = self.highest_enqueued.map_or(0, |highest| highest.0 + 1);
        let end = offset.0.saturating_add(u64::from(count)).min(highest_end);
        let (mut messages, mut bytes) = (0u64, 0u64);
        for at in offset.0..end.max(offset.0) {
            if let Some(size) = self.held_size(Offset(at)) {
                messages += 1;
                bytes += u64::from(size);
            }
        }
        // The last run may grow over the gap before this batch only if
        // the gap holds no message (another producer's, or an anonymous
        // one, would otherwise be taken for this principal's).
        // Offsets not applied yet (a journal's replay) may still receive
        // someone else's records: no merge over them.
        let merge = self.stored.last_end().is_none_or(|from| {
            from >= offset
                || (offset <= self.next_data_offset() && !self.holds_any_in(from, offset))
        });
        self.stored.attribute_run(offset, u64::from(count), principal, messages, bytes, merge);
        Ok(())
    }

    /// Whether any subscription holds a message (either lane) at an
    /// offset in `[from, to)`. O(subscriptions × (bands + log n)).
    pub(crate) fn holds_any_in(&self, from: Offset, to: Offset) -> bool {
        let after = from.0.checked_sub(1).map(Offset);
        let below = |offset: Offset| offset < to;
        self.fresh.iter().any(|band| band.iter_after(after).next().is_some_and(|v| below(v.offset)))
            || self.subs.iter().any(|d| {
                d.warm.iter_after(after).next().is_some_and(|(offset, _)| below(*offset))
                    || d.dlq.range(from..to).next().is_some()
            })
    }

    /// The record bytes of a message some subscription holds at `offset`.
    fn held_size(&self, offset: Offset) -> Option<u32> {
        if let Some(view) = self.fresh.iter().find_map(|band| band.get(offset)) {
            return Some(view.size_bytes);
        }
        self.subs.iter().find_map(|d| {
            d.warm
                .get(&offset)
                .map(|warm| warm.size_bytes)
                .or_else(|| d.dlq.get(&offset).map(|dead| dead.size_bytes))
        })
    }

    fn check_generation(
        offset: Offset,
        event: Generation,
        state: Generation,
    ) -> Result<(), ApplyError> {
        if event == state {
            Ok(())
        } else {
            Err(ApplyError::Generation { offset, event, state })
        }
    }

    fn apply_enqueued(&mut self, meta: &EnqueueMeta) -> Result<(), ApplyError> {
        if let Some(highest) = self.highest_enqueued {
            if meta.offset <= highest {
                return Err(ApplyError::OffsetNotIncreasing { offset: meta.offset, highest });
            }
        }
        if self.subs.iter().any(|d| d.dlq.contains_key(&meta.offset)) {
            return Err(ApplyError::DuplicateOffset(meta.offset));
        }
        // Never let a time reach the tombstone value, and keep enqueue times
        // non-decreasing so FIFO order is age order.
        let enqueue_time_ms =
            meta.enqueue_time_ms.clamp(self.last_enqueue_time_ms, Millis::MAX - 1);
        self.last_enqueue_time_ms = enqueue_time_ms;
        self.highest_enqueued = Some(meta.offset);
        self.dedupe.record(&meta.message_id, meta.offset, enqueue_time_ms);
        let band = self.band_of(meta.priority);
        // An expiry before the enqueue time is the enqueue time: expired at once.
        let expiry_ms = meta.expiry_ms.map_or(NEVER, |e| e.max(enqueue_time_ms));
        // Every subscription whose cursor of the band the record reaches
        // has it (a subscription started past it does not).
        let takes = |d: &super::Delivery| meta.offset >= d.cursors[band];
        for d in &mut self.subs {
            if takes(d) {
                d.totals.enqueued += 1;
            }
        }
        // An ordered queue has only its default subscription
        // (`ordered.rs`): a record waiting behind its key's head is its own.
        if takes(&self.subs[0]) && self.lane_arrive(0, meta, band, enqueue_time_ms, expiry_ms) {
            debug_assert_eq!(self.subs.len(), 1, "an ordered queue has one subscription");
            self.held.messages += 1;
            self.held.bytes += u64::from(meta.size_bytes);
            return Ok(());
        }
        if meta.not_before_ms > enqueue_time_ms {
            let due_ms = meta.not_before_ms;
            let phase = WarmPhase::Scheduled { due_ms };
            let warm = Warm::arrived(enqueue_time_ms, expiry_ms, meta.size_bytes, band, phase);
            let mut taken = false;
            for s in 0..self.subs.len() {
                if takes(&self.subs[s]) {
                    self.insert_warm(s, meta.offset, warm);
                    taken = true;
                }
            }
            if taken {
                self.held.messages += 1;
                self.held.bytes += u64::from(meta.size_bytes);
            }
        } else {
            let view = FreshView {
                offset: meta.offset,
                enqueue_time_ms,
                size_bytes: meta.size_bytes,
                expiry_ms,
            };
            self.insert_fresh(band, view);
        }
        Ok(())
    }

    fn apply_claimed(
        &mut self,
        s: usize,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        claim: Claim,
    ) -> Result<(), ApplyError> {
        match lane {
            Lane::Main => {
                let found =
                    self.main_message(s, offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let WarmPhase::Ready { since_ms } = found.warm.phase else {
                    return Err(ApplyError::WrongState { offset, what: "Claimed: not ready" });
                };
                let next = Generation(found.warm.generation.0.wrapping_add(1));
                Self::check_generation(offset, generation, next)?;
                // Fairness bookkeeping exactly as the claim decision simulated
                // it, from the credits and this message only (never from which
                // other classes hold messages: some may not have been durable
                // at the decision, and a replay in journal order may not hold
                // them yet).
                let class = self.class_of(&found.warm);
                let promoted =
                    fairness::promoted(since_ms, claim.claimed_at_ms, self.config.age_promotion_ms);
                let weights = self.weights();
                self.subs[s].credits.serve(class, promoted, &weights);
                let mut warm = self.take_main(s, offset).expect("just found").warm;
                warm.generation = generation;
                warm.phase = WarmPhase::Claimed(claim);
                self.insert_warm(s, offset, warm);
            }
            Lane::DeadLetter => {
                let dead =
                    self.subs[s].dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let DeadPhase::Ready { .. } = dead.phase else {
                    return Err(ApplyError::WrongState { offset, what: "Claimed: not ready" });
                };
                let next = Generation(dead.generation.0.wrapping_add(1));
                Self::check_generation(offset, generation, next)?;
                let mut dead = self.take_dead(s, offset).expect("just found");
                dead.generation = generation;
                dead.phase = DeadPhase::Claimed(claim);
                self.insert_dead(s, offset, dead);
            }
        }
        Ok(())
    }

    /// The live claim of `offset` in `lane` with this generation.
    fn current_claim(
        &self,
        s: usize,
        lane: Lane,
        offset: Offset,
        generation: Generation,
    ) -> Result<Claim, ApplyError> {
        let (state_generation, phase_claim) = match lane {
            Lane::Main => {
                let warm =
                    self.subs[s].warm.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let claim = match warm.phase {
                    WarmPhase::Claimed(claim) => Some(claim),
                    _ => None,
                };
                (warm.generation, claim)
            }
            Lane::DeadLetter => {
                let dead =
                    self.subs[s].dlq.get(&offset).ok_or(ApplyError::UnknownMessage(offset))?;
                let claim = match dead.phase {
                    DeadPhase::Claimed(claim) => Some(claim),
                    DeadPhase::Ready { .. } => None,
                };
                (dead.generation, claim)
            }
        };
        Self::check_generation(offset, generation, state_generation)?;
        phase_claim.ok_or(ApplyError::WrongState { offset, what: "not claimed" })
    }

    /// A claim ended without an ack: count the attempt and make the message
    /// ready (or scheduled until `not_before_ms`).
    fn end_claim(
        &mut self,
        s: usize,
        lane: Lane,
        offset: Offset,
        reason: ReleaseReason,
        at_ms: Millis,
        not_before_ms: Millis,
    ) {
        match lane {
            Lane::Main => {
                let mut warm = self.take_main(s, offset).expect("caller checked the claim").warm;
                warm.attempts = warm.attempts.saturating_add(1);
                warm.last_reason = reason;
                warm.phase = if not_before_ms > at_ms {
                    WarmPhase::Scheduled { due_ms: not_before_ms }
                } else {
                    WarmPhase::Ready { since_ms: at_ms }
                };
                self.insert_warm(s, offset, warm);
            }
            Lane::DeadLetter => {
                let mut dead = self.take_dead(s, offset).expect("caller checked the claim");
                dead.attempts = dead.attempts.saturating_add(1);
                dead.last_reason = reason;
                dead.phase = DeadPhase::Ready { since_ms: at_ms };
                self.insert_dead(s, offset, dead);
            }
        }
    }
}
