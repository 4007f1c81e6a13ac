//! Decisions: read the state, return the events to append. Nothing here
//! changes state; the caller appends the events to the log and then feeds
//! each one to `PartitionState::apply`, in order, before the next decision.

use std::collections::{BTreeSet, HashMap};
use std::iter::Peekable;

use super::error::{InvalidToken, QueueError, StaleToken};
use super::event::Event;
use super::fairness::{ClassHead, PerClass};
use super::fresh::{FreshBand, NEVER};
use super::limits::{
    ADMIN_EVENTS_MAX, ADMISSION_BATCH_MAX, CLAIM_CREDITS_MAX, CLAIM_EXPIRED_SCAN_MAX, PEEK_MAX,
    RELEASE_DELAY_MS_MAX, TICK_EVENTS_MAX,
};
use super::state::{Claim, DeadPhase, MessageView, PartitionState, WarmPhase};
use super::token::{DeliveryToken, TokenClaim};
use super::types::{
    EnqueueRequest, Generation, Lane, MessageId, Millis, Offset, QuarantineCause, ReleaseReason,
    WorkerId,
};

/// Outcome of an admission check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnqueueDecision {
    /// Append it; then apply `Event::Enqueued` with the assigned offset.
    Accept,
    /// Seen within the dedupe window: reply with the original offset, append nothing.
    Duplicate { original: Offset },
    /// The same id appeared earlier in this admission batch (not yet
    /// appended): reply with that record's offset once it has one.
    DuplicateInBatch { index: usize },
    /// The queue's held messages (main lane plus dead letters) would pass
    /// `max_messages` or `max_bytes`: reply QUEUE_FULL, append nothing.
    QueueFull { limit: FullLimit },
}

/// Which admission limit refused an enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullLimit {
    Messages,
    Bytes,
}

impl std::fmt::Display for FullLimit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            FullLimit::Messages => "max_messages",
            FullLimit::Bytes => "max_bytes",
        })
    }
}

/// Ids accepted earlier in one admission batch, with their index in it. An
/// owner that checks many batches (a partition) keeps one and lends it to
/// each ([`PartitionState::admission_with`]), so a batch allocates nothing
/// for it. Ids are client-chosen: the map hashes them with std's keyed
/// SipHash (`RandomState`).
#[derive(Debug, Default)]
pub struct AdmissionIds {
    ids: HashMap<MessageId, usize>,
}

impl AdmissionIds {
    /// Forgets every id, keeping the allocation.
    pub fn clear(&mut self) {
        self.ids.clear();
    }

    /// Ids it has room for without allocating.
    pub fn capacity(&self) -> usize {
        self.ids.capacity()
    }
}

/// An admission's in-batch ids: its own, or lent by the caller.
#[derive(Debug)]
enum BatchIds<'a> {
    Own(AdmissionIds),
    Lent(&'a mut AdmissionIds),
}

impl BatchIds<'_> {
    fn ids(&mut self) -> &mut HashMap<MessageId, usize> {
        match self {
            BatchIds::Own(ids) => &mut ids.ids,
            BatchIds::Lent(ids) => &mut ids.ids,
        }
    }
}

/// Checks the enqueues of one data batch against dedupe and admission,
/// counting the ones it accepted so far (they are not applied yet).
#[derive(Debug)]
pub struct Admission<'a> {
    state: &'a PartitionState,
    now: Millis,
    checked: usize,
    accepted_messages: u64,
    accepted_bytes: u64,
    /// Ids accepted earlier in this batch, and their index in it.
    batch_ids: BatchIds<'a>,
}

impl Admission<'_> {
    /// Decides one enqueue of the batch.
    ///
    /// # Errors
    /// [`QueueError::PriorityOutOfRange`], [`QueueError::AdmissionBatchFull`].
    pub fn check(&mut self, request: &EnqueueRequest) -> Result<EnqueueDecision, QueueError> {
        let bands = self.state.config.bands();
        if usize::from(request.priority) >= bands {
            return Err(QueueError::PriorityOutOfRange { priority: request.priority, bands });
        }
        if self.checked >= ADMISSION_BATCH_MAX {
            return Err(QueueError::AdmissionBatchFull { max: ADMISSION_BATCH_MAX });
        }
        let index = self.checked;
        self.checked += 1;
        if let Some(original) = self.state.dedupe_hit(self.now, &request.message_id) {
            return Ok(EnqueueDecision::Duplicate { original });
        }
        if let Some(&first) = self.batch_ids.ids().get(&request.message_id) {
            return Ok(EnqueueDecision::DuplicateInBatch { index: first });
        }
        // Dead letters count: a quarantine is a move inside the queue, not a
        // departure, so failing workers cannot make room for more work.
        let config = &self.state.config;
        if self.state.held_messages() + self.accepted_messages + 1 > config.max_messages {
            return Ok(EnqueueDecision::QueueFull { limit: FullLimit::Messages });
        }
        let bytes = u64::from(request.size_bytes);
        if self.state.held_bytes() + self.accepted_bytes + bytes > config.max_bytes {
            return Ok(EnqueueDecision::QueueFull { limit: FullLimit::Bytes });
        }
        self.accepted_messages += 1;
        self.accepted_bytes += bytes;
        self.batch_ids.ids().insert(request.message_id, index);
        Ok(EnqueueDecision::Accept)
    }
}

/// A claim request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
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

/// Which dead letters to redrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redrive {
    /// This one (must be in the dead-letter queue and not claimed).
    One(Offset),
    /// Up to this many, oldest quarantine first (bounded by `ADMIN_EVENTS_MAX`).
    Oldest(usize),
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
    /// Starts checking one data batch's enqueues.
    pub fn admission(&self, now: Millis) -> Admission<'_> {
        self.dedupe.begin_admission();
        Admission {
            state: self,
            now,
            checked: 0,
            accepted_messages: 0,
            accepted_bytes: 0,
            batch_ids: BatchIds::Own(AdmissionIds::default()),
        }
    }

    /// [`PartitionState::admission`] with the in-batch ids kept in `ids`
    /// (cleared here), so checking a batch allocates nothing once `ids` has
    /// room for it.
    pub fn admission_with<'a>(&'a self, now: Millis, ids: &'a mut AdmissionIds) -> Admission<'a> {
        ids.clear();
        self.dedupe.begin_admission();
        Admission {
            state: self,
            now,
            checked: 0,
            accepted_messages: 0,
            accepted_bytes: 0,
            batch_ids: BatchIds::Lent(ids),
        }
    }

    /// Checks a single enqueue (an admission batch of one).
    ///
    /// # Errors
    /// As [`Admission::check`].
    pub fn enqueue_check(
        &self,
        now: Millis,
        request: &EnqueueRequest,
    ) -> Result<EnqueueDecision, QueueError> {
        self.admission(now).check(request)
    }

    /// The original offset if `id` was enqueued within the dedupe window.
    pub(crate) fn dedupe_hit(&self, now: Millis, id: &MessageId) -> Option<Offset> {
        self.dedupe.hit(now, id)
    }

    fn lease(&self, lease_ms: Option<Millis>) -> Result<Millis, QueueError> {
        let lease_ms = lease_ms.unwrap_or(self.config.lease_default_ms);
        let (min_ms, max_ms) = (self.config.lease_min_ms, self.config.lease_max_ms);
        if (min_ms..=max_ms).contains(&lease_ms) {
            Ok(lease_ms)
        } else {
            Err(QueueError::LeaseOutOfRange { lease_ms, min_ms, max_ms })
        }
    }

    fn check_credits(credits: u32) -> Result<(), QueueError> {
        if (1..=CLAIM_CREDITS_MAX).contains(&credits) {
            Ok(())
        } else {
            Err(QueueError::CreditsOutOfRange { credits, max: CLAIM_CREDITS_MAX })
        }
    }

    /// What happens to a main-lane message whose expiry has passed.
    fn expiry_event(&self, offset: Offset, generation: Generation, now: Millis) -> Event {
        if self.config.dead_letter_on_expiry {
            Event::Quarantined {
                offset,
                generation,
                cause: QuarantineCause::Expired,
                reason: ReleaseReason::EXPIRED,
                at_ms: now,
            }
        } else {
            Event::Expired { offset, generation, at_ms: now }
        }
    }

    fn warm_source<'a>(
        &'a self,
        set: &'a BTreeSet<(Millis, Offset)>,
    ) -> impl Iterator<Item = Candidate> + 'a {
        set.iter().map(move |&(since_ms, offset)| {
            let warm = self.warm.get(&offset).expect("indexed messages are in warm");
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

    fn fresh_source(band: &FreshBand) -> impl Iterator<Item = Candidate> + '_ {
        band.iter().map(|v| Candidate {
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
    ) -> Vec<ClassCursor<impl Iterator<Item = Candidate> + '_, impl Iterator<Item = Candidate> + '_>>
    {
        let mut cursors = Vec::with_capacity(self.fresh.len() + 1);
        for (fresh, ready) in self.fresh.iter().zip(&self.band_ready) {
            cursors.push(ClassCursor {
                fresh: Some(Self::fresh_source(fresh).peekable()),
                warm: self.warm_source(ready).peekable(),
            });
        }
        cursors.push(ClassCursor { fresh: None, warm: self.warm_source(&self.retry).peekable() });
        cursors
    }

    fn sign(
        &self,
        lane: Lane,
        offset: Offset,
        generation: Generation,
        worker: WorkerId,
    ) -> DeliveryToken {
        self.key.sign(&TokenClaim {
            queue: self.queue,
            partition: self.partition,
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
    /// the round rule ([`super::fairness::Credits::serve`]) reads only the
    /// credits and the claimed message, so `apply(Claimed)` reproduces the
    /// credits whichever undurable records the state holds when it runs.
    /// When no class has a durable ready head, the claim takes nothing more;
    /// the head becomes claimable once its commit is synced.
    ///
    /// # Errors
    /// [`QueueError::CreditsOutOfRange`], [`QueueError::LeaseOutOfRange`].
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
        decision.exhausted = false;
        Self::check_credits(request.credits)?;
        let lease_ms = self.lease(request.lease_ms)?;
        let deadline_ms = now.saturating_add(lease_ms);
        let weights = self.weights();
        let mut credits = self.credits;
        let mut cursors = self.class_cursors();
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
                lane: Lane::Main,
                offset: head.offset,
                generation,
                worker: request.worker,
                claimed_at_ms: now,
                deadline_ms,
            });
            decision.deliveries.push(Delivery {
                token: self.sign(Lane::Main, head.offset, generation, request.worker),
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
        decision.exhausted = false;
        Self::check_credits(request.credits)?;
        let lease_ms = self.lease(request.lease_ms)?;
        let deadline_ms = now.saturating_add(lease_ms);
        let mut bytes = 0u64;
        for &(_, offset) in self.dlq_ready.iter().take(request.credits as usize) {
            if offset >= durable_end {
                break;
            }
            let dead = &self.dlq[&offset];
            if bytes + u64::from(dead.size_bytes) > request.max_bytes {
                break;
            }
            bytes += u64::from(dead.size_bytes);
            let generation = Generation(dead.generation.0.wrapping_add(1));
            decision.events.push(Event::Claimed {
                lane: Lane::DeadLetter,
                offset,
                generation,
                worker: request.worker,
                claimed_at_ms: now,
                deadline_ms,
            });
            decision.deliveries.push(Delivery {
                token: self.sign(Lane::DeadLetter, offset, generation, request.worker),
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

    /// Checks a token: genuine, for this partition, this epoch, and naming
    /// the current unexpired claim. Returns the claim and the message's
    /// failed-attempt count and expiry.
    fn validate(
        &self,
        now: Millis,
        token: &DeliveryToken,
    ) -> Result<(Claim, u16, Millis), QueueError> {
        if !self.key.verify(token) {
            return Err(QueueError::InvalidToken(InvalidToken::BadMac));
        }
        let fields = token.claim();
        if fields.queue != self.queue {
            return Err(QueueError::InvalidToken(InvalidToken::WrongQueue));
        }
        if fields.partition != self.partition {
            return Err(QueueError::InvalidToken(InvalidToken::WrongPartition));
        }
        if fields.epoch != self.epoch {
            return Err(QueueError::StaleToken(StaleToken::Epoch {
                token: fields.epoch.0,
                current: self.epoch.0,
            }));
        }
        let offset = fields.offset;
        let in_main =
            self.warm.contains_key(&offset) || self.fresh.iter().any(|f| f.get(offset).is_some());
        let current_lane = if self.dlq.contains_key(&offset) {
            Lane::DeadLetter
        } else if in_main {
            Lane::Main
        } else {
            return Err(QueueError::StaleToken(StaleToken::NotClaimed));
        };
        if current_lane != fields.lane {
            return Err(QueueError::StaleToken(StaleToken::Lane {
                token: fields.lane,
                current: current_lane,
            }));
        }
        let (generation, claim, attempts, expiry_ms) = match current_lane {
            Lane::Main => match self.warm.get(&offset) {
                Some(warm) => {
                    let claim = match warm.phase {
                        WarmPhase::Claimed(claim) => Some(claim),
                        _ => None,
                    };
                    (warm.generation, claim, warm.attempts, warm.expiry_ms)
                }
                None => (Generation(0), None, 0, NEVER),
            },
            Lane::DeadLetter => {
                let dead = &self.dlq[&offset];
                let claim = match dead.phase {
                    DeadPhase::Claimed(claim) => Some(claim),
                    DeadPhase::Ready { .. } => None,
                };
                (dead.generation, claim, dead.attempts, NEVER)
            }
        };
        if fields.generation != generation {
            return Err(QueueError::StaleToken(StaleToken::Generation {
                token: fields.generation,
                current: generation,
            }));
        }
        let claim = claim.ok_or(QueueError::StaleToken(StaleToken::NotClaimed))?;
        if fields.worker != claim.worker {
            return Err(QueueError::StaleToken(StaleToken::Worker));
        }
        if now >= claim.deadline_ms() {
            return Err(QueueError::StaleToken(StaleToken::LeaseExpired {
                deadline_ms: claim.deadline_ms(),
                now_ms: now,
            }));
        }
        Ok((claim, attempts, expiry_ms))
    }

    /// Moves the current claim's deadline to `now + lease`, never past
    /// `claimed_at + max_lease_lifetime`. Returns the event and the new deadline.
    ///
    /// # Errors
    /// Token errors; [`QueueError::LeaseOutOfRange`];
    /// [`QueueError::LeaseLifetimeExhausted`] when the deadline already sits
    /// at the lifetime cap and the request asks for more.
    pub fn extend(
        &self,
        now: Millis,
        token: &DeliveryToken,
        lease_ms: Option<Millis>,
    ) -> Result<(Event, Millis), QueueError> {
        let (claim, _, _) = self.validate(now, token)?;
        let lease_ms = self.lease(lease_ms)?;
        let cap_ms = claim.claimed_at_ms.saturating_add(self.config.max_lease_lifetime_ms);
        let wanted_ms = now.saturating_add(lease_ms);
        if wanted_ms > cap_ms && claim.deadline_ms() >= cap_ms {
            return Err(QueueError::LeaseLifetimeExhausted { cap_ms });
        }
        let deadline_ms = wanted_ms.min(cap_ms);
        let fields = token.claim();
        let event = Event::Extended {
            lane: fields.lane,
            offset: fields.offset,
            generation: fields.generation,
            at_ms: now,
            deadline_ms,
        };
        Ok((event, deadline_ms))
    }

    /// Acknowledges the current claim: the message is done.
    ///
    /// # Errors
    /// Token errors.
    pub fn ack(&self, now: Millis, token: &DeliveryToken) -> Result<Event, QueueError> {
        self.validate(now, token)?;
        let fields = token.claim();
        Ok(Event::Acked {
            lane: fields.lane,
            offset: fields.offset,
            generation: fields.generation,
            at_ms: now,
        })
    }

    /// Gives the current claim back. The message becomes ready at
    /// `not_before_ms`, or after the queue's backoff when `None`; it is
    /// quarantined instead when this was its `max_deliveries`-th attempt, and
    /// expired (or quarantined, per config) when its expiry has passed.
    /// In the dead-letter lane the message is simply ready again.
    ///
    /// # Errors
    /// Token errors; [`QueueError::ReleaseDelayTooLong`].
    pub fn release(
        &self,
        now: Millis,
        token: &DeliveryToken,
        reason: ReleaseReason,
        not_before_ms: Option<Millis>,
    ) -> Result<Event, QueueError> {
        let (_, attempts, expiry_ms) = self.validate(now, token)?;
        let fields = token.claim();
        let (lane, offset, generation) = (fields.lane, fields.offset, fields.generation);
        if let Some(not_before_ms) = not_before_ms {
            if not_before_ms > now.saturating_add(RELEASE_DELAY_MS_MAX) {
                return Err(QueueError::ReleaseDelayTooLong {
                    not_before_ms,
                    max_ms: RELEASE_DELAY_MS_MAX,
                });
            }
        }
        if lane == Lane::DeadLetter {
            return Ok(Event::Released {
                lane,
                offset,
                generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            });
        }
        if expiry_ms <= now {
            return Ok(self.expiry_event(offset, generation, now));
        }
        let attempt = attempts.saturating_add(1);
        if attempt >= self.config.max_deliveries {
            return Ok(Event::Quarantined {
                offset,
                generation,
                cause: QuarantineCause::Deliveries,
                reason,
                at_ms: now,
            });
        }
        let not_before_ms = not_before_ms
            .unwrap_or_else(|| now.saturating_add(self.config.backoff.delay_ms(attempt)))
            .max(now);
        Ok(Event::Released { lane, offset, generation, reason, at_ms: now, not_before_ms })
    }

    /// The epoch fence: what opening the partition under a new leader
    /// epoch does to every claim still outstanding after replay. Those
    /// claims were made under an older epoch (open bumps the epoch before
    /// anything is issued), so no token can ack, extend or release them any
    /// more; each ends at once as a release with reason
    /// [`ReleaseReason::EPOCH_FENCED`] would at `now`: ready again now (no
    /// backoff), attempts + 1 (its `Claimed` event is durable, so the
    /// delivery happened), quarantined when that was attempt
    /// `max_deliveries`, expired (or quarantined, per config) when its
    /// expiry has passed; a dead letter is simply ready again. At most
    /// `limit` events, in offset order; the caller applies them and asks
    /// again while the answer is full.
    pub fn fence(&self, now: Millis, limit: usize) -> Vec<Event> {
        let mut offsets: Vec<Offset> = self.claims.iter().map(|&(_, offset)| offset).collect();
        offsets.sort_unstable();
        offsets.into_iter().take(limit).filter_map(|offset| self.fence_event(offset, now)).collect()
    }

    fn fence_event(&self, offset: Offset, now: Millis) -> Option<Event> {
        let reason = ReleaseReason::EPOCH_FENCED;
        if let Some(dead) = self.dlq.get(&offset) {
            return matches!(dead.phase, DeadPhase::Claimed(_)).then_some(Event::Released {
                lane: Lane::DeadLetter,
                offset,
                generation: dead.generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            });
        }
        let message = self.main_message(offset)?.warm;
        if !matches!(message.phase, WarmPhase::Claimed(_)) {
            return None;
        }
        let generation = message.generation;
        Some(if message.expiry_ms <= now {
            self.expiry_event(offset, generation, now)
        } else if message.attempts.saturating_add(1) >= self.config.max_deliveries {
            Event::Quarantined {
                offset,
                generation,
                cause: QuarantineCause::Deliveries,
                reason,
                at_ms: now,
            }
        } else {
            Event::Released {
                lane: Lane::Main,
                offset,
                generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            }
        })
    }

    /// What time does to one message at `now`, if anything.
    fn tick_event(&self, offset: Offset, now: Millis) -> Option<Event> {
        if let Some(dead) = self.dlq.get(&offset) {
            return match dead.phase {
                DeadPhase::Claimed(claim) if claim.deadline_ms() <= now => {
                    Some(Event::LeaseExpired {
                        lane: Lane::DeadLetter,
                        offset,
                        generation: dead.generation,
                        at_ms: now,
                    })
                }
                _ => None,
            };
        }
        let message = self.main_message(offset)?.warm;
        let expired = message.expiry_ms <= now;
        let generation = message.generation;
        match message.phase {
            WarmPhase::Claimed(claim) => {
                if claim.deadline_ms() > now {
                    None
                } else if expired {
                    Some(self.expiry_event(offset, generation, now))
                } else if message.attempts.saturating_add(1) >= self.config.max_deliveries {
                    Some(Event::Quarantined {
                        offset,
                        generation,
                        cause: QuarantineCause::Deliveries,
                        reason: ReleaseReason::LEASE_EXPIRED,
                        at_ms: now,
                    })
                } else {
                    Some(Event::LeaseExpired { lane: Lane::Main, offset, generation, at_ms: now })
                }
            }
            _ if expired => Some(self.expiry_event(offset, generation, now)),
            WarmPhase::Scheduled { due_ms } if due_ms <= now => {
                Some(Event::Readied { offset, generation, at_ms: now })
            }
            _ => None,
        }
    }

    /// Everything time has made due at `now`: lease expiries, scheduled
    /// messages becoming ready, message expiries. At most one event per
    /// message and at most `TICK_EVENTS_MAX`, in offset order; when more are
    /// due, each source contributes its earliest `TICK_EVENTS_MAX` and the
    /// caller ticks again (after applying) while the answer is full, so a
    /// mass expiry costs bounded work per call. Because readiness is derived
    /// from the log this way, a crash between "due" and "ready" loses
    /// nothing: the next tick after recovery finds the same message due.
    ///
    /// `durable_end` as for [`PartitionState::claim`]: a tick decides only on
    /// records below it. The expiry (or quarantine on expiry) or readiness of
    /// a message whose enqueue is not yet durable waits for its sync (the
    /// next tick after it finds it due), so every event a tick returns names
    /// a durable record and may be written ahead of data appended before it
    /// (the shard journal's control lane, `docs/design/shard-journal.md`
    /// §12). Claimed messages and dead letters are durable already.
    pub fn tick(&self, now: Millis, durable_end: Offset) -> Vec<Event> {
        let due = ..=(now, Offset(u64::MAX));
        let durable = |&(_, offset): &(Millis, Offset)| (offset < durable_end).then_some(offset);
        let mut candidates = BTreeSet::new();
        // Every candidate below yields an event: claims past their deadline,
        // scheduled messages past min(due, expiry), ready ones past expiry.
        // Records not yet durable are passed over before the bound, so they
        // never hide durable ones behind them; there are at most as many as
        // appended records awaiting their sync.
        candidates.extend(self.claims.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        candidates.extend(self.scheduled.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        candidates.extend(self.warm_expiry.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        let mut expired = Vec::new();
        for fresh in &self.fresh {
            fresh.expired(now, durable_end, TICK_EVENTS_MAX, &mut expired);
        }
        candidates.extend(expired.iter().map(|v| v.offset));
        candidates
            .into_iter()
            .filter_map(|offset| self.tick_event(offset, now))
            .take(TICK_EVENTS_MAX)
            .collect()
    }

    /// The earliest time at which `tick` will have something to do, for the
    /// shard's timer. `None`: nothing is pending on time.
    pub fn next_wakeup(&self) -> Option<Millis> {
        let claims = self.claims.first().map(|&(t, _)| t);
        let scheduled = self.scheduled.first().map(|&(t, _)| t);
        // Claimed messages' expiry only matters at their lease end, which
        // `claims` covers; a stale earlier wake-up is harmless.
        let warm = self.warm_expiry.first().map(|&(t, _)| t);
        let fresh = self.fresh.iter().map(|f| f.min_expiry_ms()).filter(|&t| t != NEVER);
        [claims, scheduled, warm].into_iter().flatten().chain(fresh).min()
    }

    /// Moves dead letters back to the main lane as new ready work (failed
    /// attempts reset; the generation keeps counting so old tokens stay stale).
    ///
    /// # Errors
    /// [`QueueError::NotRedrivable`] for `Redrive::One` of an offset that is
    /// not an unclaimed dead letter.
    pub fn redrive(&self, now: Millis, which: Redrive) -> Result<Vec<Event>, QueueError> {
        match which {
            Redrive::One(offset) => match self.dlq.get(&offset) {
                Some(dead) if matches!(dead.phase, DeadPhase::Ready { .. }) => {
                    Ok(vec![Event::Redriven { offset, generation: dead.generation, at_ms: now }])
                }
                _ => Err(QueueError::NotRedrivable(offset)),
            },
            Redrive::Oldest(count) => Ok(self
                .dlq_ready
                .iter()
                .take(count.min(ADMIN_EVENTS_MAX))
                .map(|&(_, offset)| Event::Redriven {
                    offset,
                    generation: self.dlq[&offset].generation,
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
        let max = max.min(ADMIN_EVENTS_MAX);
        match lane {
            Lane::Main => {
                let mut offsets: Vec<(Offset, Generation)> = self
                    .fresh
                    .iter()
                    .flat_map(|f| {
                        f.iter()
                            .take_while(|v| v.offset < durable_end)
                            .take(max)
                            .map(|v| (v.offset, Generation(0)))
                    })
                    .collect();
                offsets.extend(
                    self.warm
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
                        lane,
                        offset,
                        generation,
                        at_ms: now,
                    })
                    .collect()
            }
            Lane::DeadLetter => self
                .dlq
                .range(..durable_end)
                .filter(|(_, d)| matches!(d.phase, DeadPhase::Ready { .. }))
                .take(max)
                .map(|(&offset, d)| Event::Purged {
                    lane,
                    offset,
                    generation: d.generation,
                    at_ms: now,
                })
                .collect(),
        }
    }

    /// How many messages of `lane` a purge with this `durable_end` would
    /// remove if repeated until it takes nothing (a dry run): the unclaimed
    /// ones below `durable_end`. Costs O(bands + dead letters claimed +
    /// records at or past `durable_end`), not O(messages).
    pub fn purgeable(&self, lane: Lane, durable_end: Offset) -> u64 {
        match lane {
            Lane::Main => {
                let counters = self.counters(0);
                let unclaimed = counters.ready + counters.scheduled;
                let after = durable_end.0.checked_sub(1).map(Offset);
                let fresh_pending: u64 =
                    self.fresh.iter().map(|f| f.iter_after(after).count() as u64).sum();
                let warm_pending = self
                    .warm
                    .iter_after(after)
                    .filter(|(_, w)| !matches!(w.phase, WarmPhase::Claimed(_)))
                    .count() as u64;
                unclaimed - fresh_pending - warm_pending
            }
            Lane::DeadLetter => {
                let pending = self
                    .dlq
                    .range(durable_end..)
                    .filter(|(_, d)| matches!(d.phase, DeadPhase::Ready { .. }))
                    .count() as u64;
                self.dlq_ready.len() as u64 - pending
            }
        }
    }

    /// Dead letters in offset order after `after`, at most `max` (bounded by
    /// `PEEK_MAX`): original offset, attempts, last reason, cause, timestamps.
    /// The record bytes are at that offset in this partition's log.
    pub fn peek_dead_letters(&self, after: Option<Offset>, max: usize) -> Vec<MessageView> {
        let start = after.map_or(Offset(0), |o| Offset(o.0.saturating_add(1)));
        if after.is_some_and(|o| o.0 == u64::MAX) {
            return Vec::new();
        }
        self.dlq
            .range(start..)
            .take(max.min(PEEK_MAX))
            .map(|(&offset, dead)| self.dead_view(offset, dead))
            .collect()
    }
}
