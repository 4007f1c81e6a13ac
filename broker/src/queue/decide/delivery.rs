//! Decisions on a delivered message, asked with its token: extend the
//! lease, ack, release (which may instead quarantine or expire it). Each
//! first checks the token: genuine, for this partition and epoch, naming
//! the current claim, its lease not yet over.
//!
//! Changes nothing; must not accept a token that names anything but the
//! current unexpired claim (a stale one gets a `StaleToken` answer).

use crate::queue::error::{InvalidToken, QueueError, StaleToken};
use crate::queue::event::Event;
use crate::queue::fresh::NEVER;
use crate::queue::limits::RELEASE_DELAY_MS_MAX;
use crate::queue::state::{Claim, DeadPhase, PartitionState, WarmPhase};
use crate::queue::token::DeliveryToken;
use crate::queue::types::{Generation, Lane, Millis, QuarantineCause, ReleaseReason};

impl PartitionState {
    /// The subscription a token's claim was made in (the token names it):
    /// a genuine token of a subscription that has ended names no claim.
    /// Checks the MAC, queue and partition first: the one place a token is
    /// verified, before any field of it is trusted.
    fn token_sub(&self, token: &DeliveryToken) -> Result<usize, QueueError> {
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
        self.sub_index(fields.sub).ok_or(QueueError::StaleToken(StaleToken::SubscriptionEnded))
    }

    /// Checks a token already verified by `token_sub`: this epoch, and
    /// naming the current unexpired claim of subscription index `s`. Returns the claim and the message's
    /// failed-attempt count and expiry.
    fn validate(
        &self,
        s: usize,
        now: Millis,
        token: &DeliveryToken,
    ) -> Result<(Claim, u16, Millis), QueueError> {
        let fields = token.claim();
        if fields.epoch != self.epoch {
            return Err(QueueError::StaleToken(StaleToken::Epoch {
                token: fields.epoch.0,
                current: self.epoch.0,
            }));
        }
        let offset = fields.offset;
        let d = &self.subs[s];
        let in_main = d.warm.contains_key(&offset) || self.fresh_get(s, offset).is_some();
        let current_lane = if d.dlq.contains_key(&offset) {
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
            Lane::Main => match d.warm.get(&offset) {
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
                let dead = &d.dlq[&offset];
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
        self.extend_at(self.token_sub(token)?, now, token, lease_ms)
    }

    fn extend_at(
        &self,
        s: usize,
        now: Millis,
        token: &DeliveryToken,
        lease_ms: Option<Millis>,
    ) -> Result<(Event, Millis), QueueError> {
        let (claim, _, _) = self.validate(s, now, token)?;
        let lease_ms = self.lease(lease_ms)?;
        let cap_ms = claim.claimed_at_ms.saturating_add(self.config.max_lease_lifetime_ms);
        let wanted_ms = now.saturating_add(lease_ms);
        if wanted_ms > cap_ms && claim.deadline_ms() >= cap_ms {
            return Err(QueueError::LeaseLifetimeExhausted { cap_ms });
        }
        let deadline_ms = wanted_ms.min(cap_ms);
        let fields = token.claim();
        let event = Event::Extended {
            sub: self.subs[s].id,
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
        self.ack_at(self.token_sub(token)?, now, token)
    }

    fn ack_at(&self, s: usize, now: Millis, token: &DeliveryToken) -> Result<Event, QueueError> {
        self.validate(s, now, token)?;
        let fields = token.claim();
        Ok(Event::Acked {
            sub: self.subs[s].id,
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
        self.release_at(self.token_sub(token)?, now, token, reason, not_before_ms)
    }

    fn release_at(
        &self,
        s: usize,
        now: Millis,
        token: &DeliveryToken,
        reason: ReleaseReason,
        not_before_ms: Option<Millis>,
    ) -> Result<Event, QueueError> {
        let (_, attempts, expiry_ms) = self.validate(s, now, token)?;
        let sub = self.subs[s].id;
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
                sub,
                lane,
                offset,
                generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            });
        }
        if expiry_ms <= now {
            return Ok(self.expiry_event(s, offset, generation, now));
        }
        let attempt = attempts.saturating_add(1);
        if attempt >= self.config.max_deliveries {
            return Ok(Event::Quarantined {
                sub,
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
        Ok(Event::Released { sub, lane, offset, generation, reason, at_ms: now, not_before_ms })
    }
}
