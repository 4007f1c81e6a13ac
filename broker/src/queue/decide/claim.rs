//! Claim decisions: which ready messages a worker gets, main lane (by
//! weighted round-robin over the priority bands and the retry class, with
//! age promotion: the merge of each band's fresh backlog and ready warm
//! set) or dead-letter lane (oldest quarantine first), with their signed
//! delivery tokens; expired messages met on the way become expiry events.
//!
//! Changes nothing (the fairness credits are simulated on a copy; `apply`
//! of the `Claimed` events moves them). Must not hand out a record at or
//! past the durable watermark it is given.

use std::collections::BTreeSet;
use std::iter::Peekable;

use crate::queue::error::QueueError;
use crate::queue::event::Event;
use crate::queue::fairness::{ClassHead, PerClass};
use crate::queue::limits::{CLAIM_CREDITS_MAX, CLAIM_EXPIRED_SCAN_MAX};
use crate::queue::state::PartitionState;
use crate::queue::token::{DeliveryToken, TokenClaim};
use crate::queue::types::{Generation, Lane, Millis, Offset, SubscriptionId, WorkerId};

/// A claim request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The subscription to claim in ([`SubscriptionId::DEFAULT`]: the one
    /// every queue has).
    pub sub: SubscriptionId,
    pub worker: WorkerId,
    /// At most this many messages (the worker's free slots).
    pub credits: u32,
    /// At most this many record bytes in total. The claim stops at the first
    /// message that would not fit, so order is kept.
    pub max_bytes: u64,
    /// `None`: the queue's default lease.
    pub lease_ms: Option<Millis>,
}

/// One message handed to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub token: DeliveryToken,
    pub lane: Lane,
    pub offset: Offset,
    pub generation: Generation,
    /// 1 for the first delivery; failed attempts so far + 1.
    pub attempt: u16,
    pub deadline_ms: Millis,
    pub size_bytes: u32,
}

/// What a claim decided: the events to append (the `Claimed` events plus
/// any expiry found on the way), and the deliveries to send once they are
/// durable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimDecision {
    pub events: Vec<Event>,
    pub deliveries: Vec<Delivery>,
    /// The claim stopped because no message below `durable_end` was left
    /// to deliver (not because its credits or bytes ran out, nor at the
    /// expired-message scan bound): a claim now, with any credits, would
    /// find nothing more. Main lane only; a dead-letter claim leaves it
    /// false.
    pub exhausted: bool,
}

/// A ready message as the claim simulation sees it.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    offset: Offset,
    since_ms: Millis,
    size_bytes: u32,
    expiry_ms: Millis,
    generation: Generation,
    attempts: u16,
}

/// The ready messages of one class in serving order: the merge of a band's
/// fresh backlog and its ready warm set by (since, offset); the retry class
/// has only the warm set. Concrete iterators, not boxed ones: a claim
/// builds one cursor per class.
struct ClassCursor<F: Iterator<Item = Candidate>, W: Iterator<Item = Candidate>> {
    fresh: Option<Peekable<F>>,
    warm: Peekable<W>,
}

impl<F: Iterator<Item = Candidate>, W: Iterator<Item = Candidate>> ClassCursor<F, W> {
    /// Whether the warm head comes first (ties go to the fresh one).
    fn warm_first(fresh: Option<&Candidate>, warm: Option<&Candidate>) -> bool {
        match (fresh, warm) {
            (Some(fresh), Some(warm)) => {
                (warm.since_ms, warm.offset) < (fresh.since_ms, fresh.offset)
            }
            (None, Some(_)) => true,
            _ => false,
        }
    }

    fn peek(&mut self) -> Option<Candidate> {
        let fresh = self.fresh.as_mut().and_then(|source| source.peek().copied());
        let warm = self.warm.peek().copied();
        if Self::warm_first(fresh.as_ref(), warm.as_ref()) {
            warm
        } else {
            fresh
        }
    }

    fn advance(&mut self) {
        let fresh = self.fresh.as_mut().and_then(|source| source.peek().copied());
        let warm = self.warm.peek().copied();
        if Self::warm_first(fresh.as_ref(), warm.as_ref()) {
            self.warm.next();
        } else if let Some(source) = self.fresh.as_mut() {
            source.next();
        }
    }
}

impl PartitionState {
    fn check_credits(credits: u32) -> Result<(), QueueError> {
        if (1..=CLAIM_CREDITS_MAX).contains(&credits) {
            Ok(())
        } else {
            Err(QueueError::CreditsOutOfRange { credits, max: CLAIM_CREDITS_MAX })
        }
    }

    fn warm_source<'a>(
        &'a self,
        s: usize,
        set: &'a BTreeSet<(Millis, Offset)>,
    ) -> impl Iterator<Item = Candidate> + 'a {
        set.iter().map(move |&(since_ms, offset)| {
            let warm = self.subs[s].warm.get(&offset).expect("indexed messages are in warm");
            Candidate {
                offset,
                since_ms,
                size_bytes: warm.size_bytes,
                expiry_ms: warm.expiry_ms,
                generation: warm.generation,
                attempts: warm.attempts,
            }
        })
    }

    fn fresh_source(&self, s: usize, band: usize) -> impl Iterator<Item = Candidate> + '_ {
        self.fresh_iter(s, band).map(|v| Candidate {
            offset: v.offset,
            since_ms: v.enqueue_time_ms,
            size_bytes: v.size_bytes,
            expiry_ms: v.expiry_ms,
            generation: Generation(0),
            attempts: 0,
        })
    }

    #[allow(clippy::type_complexity)]
    fn class_cursors(
        &self,
        s: usize,
    ) -> Vec<ClassCursor<impl Iterator<Item = Candidate> + '_, impl Iterator<Item = Candidate> + '_>>
    {
        let d = &self.subs[s];
        let mut cursors = Vec::with_capacity(self.fresh.len() + 1);
        for (band, ready) in d.band_ready.iter().enumerate() {
            cursors.push(ClassCursor {
                fresh: Some(self.fresh_source(s, band).peekable()),
                warm: self.warm_source(s, ready).peekable(),
            });
        }
        cursors.push(ClassCursor { fresh: None, warm: self.warm_source(s, &d.retry).peekable() });
        cursors
    }

    fn sign(
        &self,
        sub: SubscriptionId,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        worker: WorkerId,
    ) -> DeliveryToken {
        self.key.sign(&TokenClaim {
            queue: self.queue,
            partition: self.partition,
            sub,
            lane,
            offset,
            generation,
            epoch: self.epoch,
            worker,
        })
    }

    /// Claims up to `credits` ready main-lane messages for a worker, chosen
    /// by weighted round-robin with age promotion. Expired messages met on
    /// the way are never delivered: their expiry events join the answer.
    ///
    /// `durable_end` is the log's contiguous durable watermark: every offset
    /// below it is on disk. A claim never hands out a message at or past it
    /// (its enqueue could still be lost), so claims may reply before their
    /// own events are durable. A class whose head is not yet durable counts
    /// as empty (nothing behind its head is looked at, and no expiry is
    /// decided for it), for the choice and for the round bookkeeping alike:
    /// the round rule ([`crate::queue::fairness::Credits::serve`]) reads
    /// only the credits and the claimed message, so `apply(Claimed)`
    /// reproduces the credits whichever undurable records the state holds
    /// when it runs.
    /// When no class has a durable ready head, the claim takes nothing more;
    /// the head becomes claimable once its commit is synced.
    ///
    /// # Errors
    /// [`QueueError::CreditsOutOfRange`], [`QueueError::LeaseOutOfRange`],
    /// [`QueueError::UnknownSubscription`] (the request names a subscription
    /// the partition does not have).
    pub fn claim(
        &self,
        now: Millis,
        request: &ClaimRequest,
        durable_end: Offset,
    ) -> Result<ClaimDecision, QueueError> {
        // Both vectors are bounded by the request: at most `credits`
        // deliveries, and their events plus the expiries met on the way.
        let credits = (request.credits as usize).min(CLAIM_CREDITS_MAX as usize);
        let mut decision = ClaimDecision {
            events: Vec::with_capacity(credits),
            deliveries: Vec::with_capacity(credits),
            exhausted: false,
        };
        self.claim_into(now, request, durable_end, &mut decision)?;
        Ok(decision)
    }

    /// [`PartitionState::claim`] into `decision` (emptied first, its
    /// vectors' capacity reused), so a caller that claims often allocates
    /// nothing for the answer's vectors.
    ///
    /// # Errors
    /// As [`PartitionState::claim`]; `decision` is then empty.
    pub fn claim_into(
        &self,
        now: Millis,
        request: &ClaimRequest,
        durable_end: Offset,
        decision: &mut ClaimDecision,
    ) -> Result<(), QueueError> {
        decision.events.clear();
        decision.deliveries.clear();
        let s = self.sub_at(request.sub)?;
        decision.exhausted = false;
        Self::check_credits(request.credits)?;
        let lease_ms = self.lease(request.lease_ms)?;
        let deadline_ms = now.saturating_add(lease_ms);
        let weights = self.weights();
        let sub = self.subs[s].id;
        let mut credits = self.subs[s].credits;
        let mut cursors = self.class_cursors(s);
        decision.events.reserve(request.credits as usize);
        decision.deliveries.reserve(request.credits as usize);
        let mut bytes = 0u64;
        let mut skipped = 0usize;
        'claims: while decision.deliveries.len() < request.credits as usize {
            // Drop expired heads first, exactly as their events will be
            // applied before the next `Claimed`.
            let mut heads: PerClass<Option<Candidate>> = PerClass::new();
            for cursor in &mut cursors {
                loop {
                    match cursor.peek() {
                        Some(head) if head.offset >= durable_end => {
                            heads.push(None);
                            break;
                        }
                        Some(head) if head.expiry_ms <= now => {
                            if skipped >= CLAIM_EXPIRED_SCAN_MAX {
                                break 'claims;
                            }
                            skipped += 1;
                            decision.events.push(self.expiry_event(
                                s,
                                head.offset,
                                head.generation,
                                now,
                            ));
                            cursor.advance();
                        }
                        head => {
                            heads.push(head);
                            break;
                        }
                    }
                }
            }
            if heads.iter().all(Option::is_none) {
                decision.exhausted = true;
                break;
            }
            let mut class_heads: PerClass<Option<ClassHead>> = PerClass::new();
            for head in heads.iter() {
                class_heads
                    .push(head.map(|c| ClassHead { since_ms: c.since_ms, offset: c.offset }));
            }
            let Some((class, promoted)) =
                credits.choose(&class_heads, now, self.config.age_promotion_ms)
            else {
                // A class with a head is always chosen; none chosen means
                // none had one.
                decision.exhausted = true;
                break;
            };
            let head = heads[class].expect("chosen classes have a head");
            if bytes + u64::from(head.size_bytes) > request.max_bytes {
                break;
            }
            bytes += u64::from(head.size_bytes);
            credits.serve(class, promoted, &weights);
            cursors[class].advance();
            let generation = Generation(head.generation.0.wrapping_add(1));
            decision.events.push(Event::Claimed {
                sub,
                lane: Lane::Main,
                offset: head.offset,
                generation,
                worker: request.worker,
                claimed_at_ms: now,
                deadline_ms,
            });
            decision.deliveries.push(Delivery {
                token: self.sign(sub, Lane::Main, head.offset, generation, request.worker),
                lane: Lane::Main,
                offset: head.offset,
                generation,
                attempt: head.attempts.saturating_add(1),
                deadline_ms,
                size_bytes: head.size_bytes,
            });
        }
        Ok(())
    }

    /// Claims dead letters, oldest quarantine first (to inspect or repair
    /// them). Dead letters do not expire and are not quarantined again.
    ///
    /// # Errors
    /// [`QueueError::CreditsOutOfRange`], [`QueueError::LeaseOutOfRange`].
    ///
    /// `durable_end` as for [`PartitionState::claim`]: the claim stops at the
    /// first dead letter at or past it (one quarantined by expiry before its
    /// enqueue was synced), keeping order.
    pub fn claim_dead_letters(
        &self,
        now: Millis,
        request: &ClaimRequest,
        durable_end: Offset,
    ) -> Result<ClaimDecision, QueueError> {
        let mut decision = ClaimDecision::default();
        self.claim_dead_letters_into(now, request, durable_end, &mut decision)?;
        Ok(decision)
    }

    /// [`PartitionState::claim_dead_letters`] into `decision` (emptied
    /// first, its capacity reused).
    ///
    /// # Errors
    /// As [`PartitionState::claim_dead_letters`]; `decision` is then empty.
    pub fn claim_dead_letters_into(
        &self,
        now: Millis,
        request: &ClaimRequest,
        durable_end: Offset,
        decision: &mut ClaimDecision,
    ) -> Result<(), QueueError> {
        decision.events.clear();
        decision.deliveries.clear();
        let s = self.sub_at(request.sub)?;
        decision.exhausted = false;
        Self::check_credits(request.credits)?;
        let lease_ms = self.lease(request.lease_ms)?;
        let deadline_ms = now.saturating_add(lease_ms);
        let mut bytes = 0u64;
        let d = &self.subs[s];
        for &(_, offset) in d.dlq_ready.iter().take(request.credits as usize) {
            if offset >= durable_end {
                break;
            }
            let dead = &d.dlq[&offset];
            if bytes + u64::from(dead.size_bytes) > request.max_bytes {
                break;
            }
            bytes += u64::from(dead.size_bytes);
            let generation = Generation(dead.generation.0.wrapping_add(1));
            decision.events.push(Event::Claimed {
                sub: d.id,
                lane: Lane::DeadLetter,
                offset,
                generation,
                worker: request.worker,
                claimed_at_ms: now,
                deadline_ms,
            });
            decision.deliveries.push(Delivery {
                token: self.sign(d.id, Lane::DeadLetter, offset, generation, request.worker),
                lane: Lane::DeadLetter,
                offset,
                generation,
                attempt: dead.attempts.saturating_add(1),
                deadline_ms,
                size_bytes: dead.size_bytes,
            });
        }
        Ok(())
    }
}
