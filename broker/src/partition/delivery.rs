//! What a worker does with a delivery: extend its lease, ack it, release it.
//! Acks reply once durable; extends and releases once appended and applied
//! (the epoch fence covers their loss).

use spool_wire::batch::BatchKind;
use spool_wire::ErrorCode;

use super::{scratch, Partition, PartitionError, CONTROL_BATCH_EVENTS_MAX};
use crate::io::Storage;
use crate::log::LogError;
use crate::queue::{DeliveryToken, Event, Millis, PartitionState, QueueError, ReleaseReason};

impl<S: Storage + Clone> Partition<S> {
    /// Mutates the state with one event decided by `decide` and appends it.
    /// Extends and releases reply at once (a lost one ends, after a crash,
    /// in the epoch fence's release of its claim); nothing else uses this.
    async fn mutate<T>(
        &self,
        decide: impl FnOnce(&PartitionState, Millis) -> Result<(Event, T), QueueError>,
    ) -> Result<T, PartitionError> {
        self.log.writable(BatchKind::Control, Self::control_bytes(1, false)).await;
        let now = (self.clock)();
        let (event, value) = {
            let state = self.state.borrow();
            decide(&state, now)?
        };
        self.append_events_deferred(std::slice::from_ref(&event), now)?;
        Ok(value)
    }

    /// Extends the lease of `token` by `lease_ms` (queue default when None).
    /// Replies once the event is appended and applied, before it is durable.
    ///
    /// # Errors
    /// Stale or invalid token, lease out of range, lifetime cap reached.
    pub async fn extend(
        &self,
        token: &DeliveryToken,
        lease_ms: Option<Millis>,
    ) -> Result<Millis, PartitionError> {
        self.mutate(|state, now| state.extend(now, token, lease_ms)).await
    }

    /// Acks each token; one result per token, in order. All accepted acks are
    /// appended as one control batch and are durable when this returns.
    pub async fn ack(&self, tokens: &[DeliveryToken]) -> Vec<Result<(), PartitionError>> {
        let events_max = tokens.len().min(CONTROL_BATCH_EVENTS_MAX);
        self.log.writable(BatchKind::Control, Self::control_bytes(events_max, false)).await;
        // From here to the append: no await, so no other request interleaves.
        let now = (self.clock)();
        let mut results: Vec<Result<(), PartitionError>> = Vec::with_capacity(tokens.len());
        // The events and the tokens seen live in the partition's reused
        // scratch, given back before the wait for durability.
        let appended = {
            let mut scratch = self.scratch.ack.borrow_mut();
            let scratch::AckScratch { events, seen } = &mut *scratch;
            events.reserve(events_max);
            {
                let state = self.state.borrow();
                // Decisions are made on the unchanged state; a token repeated in
                // this request would be accepted twice, so the second is stale.
                for token in tokens.iter().take(CONTROL_BATCH_EVENTS_MAX) {
                    let claim = token.claim();
                    if !seen.insert(scratch::seen_key(claim.lane, claim.offset)) {
                        results.push(Err(PartitionError::Queue(QueueError::StaleToken(
                            crate::queue::StaleToken::NotClaimed,
                        ))));
                        continue;
                    }
                    match state.ack(now, token) {
                        Ok(event) => {
                            events.push(event);
                            results.push(Ok(()));
                        }
                        Err(error) => results.push(Err(error.into())),
                    }
                }
            }
            for _ in results.len()..tokens.len() {
                results.push(Err(PartitionError::Queue(QueueError::AdmissionBatchFull {
                    max: CONTROL_BATCH_EVENTS_MAX,
                })));
            }
            // Append first, then apply: a refused append changes nothing.
            let appended = self.append_events(events, now);
            scratch.recycle();
            appended
        };
        let outcome = match appended {
            Ok(Some(ticket)) => ticket.durable().await,
            Ok(None) => Ok(()),
            Err(error) => Err(error),
        };
        if let Err(error) = outcome {
            let closed = error.code() == ErrorCode::ShuttingDown;
            let message = error.to_string();
            for result in results.iter_mut().filter(|result| result.is_ok()) {
                *result = Err(if closed {
                    PartitionError::Log(LogError::Closed)
                } else {
                    PartitionError::Log(LogError::Failed(message.clone()))
                });
            }
        }
        results
    }

    /// Releases `token`: the message is scheduled at `not_before_ms` (or
    /// after the queue's backoff when None). Returns when it becomes ready.
    /// Replies once the event is appended and applied, before it is durable
    /// (the released message is older than the watermark; a release lost in
    /// a crash leaves its claim to the epoch fence).
    ///
    /// # Errors
    /// Stale or invalid token, delay too long.
    pub async fn release(
        &self,
        token: &DeliveryToken,
        reason: ReleaseReason,
        not_before_ms: Option<Millis>,
    ) -> Result<Millis, PartitionError> {
        let result = self
            .mutate(|state, now| {
                let event = state.release(now, token, reason, not_before_ms)?;
                let due = match &event {
                    Event::Released { not_before_ms, .. } => *not_before_ms,
                    _ => now,
                };
                Ok((event, due))
            })
            .await;
        self.may_be_claimable(1);
        result
    }
}
