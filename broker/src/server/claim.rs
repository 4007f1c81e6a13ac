//! Claims on a shard: of one partition and of any partition (visiting
//! the partitions in the order their next messages lie in the journal),
//! long-polling on behalf of the connection until something is ready, the
//! connection ends, a CancelClaim names it or the wait runs out; and how a
//! failed claim is answered. Decoding, admission and the other requests
//! are `handler.rs`'s.

use std::rc::Rc;

use spool_wire::proto::{self, CorrelationId, ErrorResponse};
use spool_wire::ErrorCode;

use super::handler::{
    error, partition_error, SpoolHandler, Timed, DEAD_LETTER_SUFFIX,
    REJECT_CLAIM_WAITERS_PER_CONNECTION, REJECT_CLAIM_WAITERS_PER_PARTITION,
};
use super::ready::{
    plan_visit, ReadyRing, Take, CLAIM_ANY_PEEK_MESSAGES_MAX, CLAIM_ANY_VISIT_PARTITIONS_MAX,
};
use super::Served;
use crate::control::assignment::QueueName;
use crate::net::connection::{ClaimRegistration, Connection};
use crate::partition::signal::{ClaimCancel, WaitOwner, WaitRefused, CLAIM_WAITERS_MAX};
use crate::partition::PartitionError;
use crate::queue::{ClaimRequest, Lane, PartitionId, SubscriptionId};
use crate::shard::report::RequestOp;

impl SpoolHandler {
    /// A claim long-polls on behalf of its connection: its wait counts
    /// against the connection's bound (`claim_waiters_per_connection_max`)
    /// and ends, answered with what it found, when the connection ends (the
    /// peer closed, or the broker stops) or when a CancelClaim on the same
    /// connection names its correlation id before it decided anything.
    pub(super) async fn claim(
        &self,
        claim: &proto::ClaimRequest<'_>,
        correlation_id: CorrelationId,
        connection: &Connection,
        grants: &crate::auth::Grants,
        timed: &mut Timed,
    ) -> Result<Vec<crate::partition::Claimed>, ErrorResponse> {
        // Registered before the first await, so a CancelClaim the client
        // sends after this claim finds it.
        let registration = if claim.wait_ms > 0 {
            Some(connection.register_claim(correlation_id.0))
        } else {
            None
        };
        // `<queue>.dlq` names the dead-letter lane of `<queue>`'s partitions,
        // unless a queue by that very name exists (created before such
        // names were reserved).
        let (queue, lane) = match claim.queue.strip_suffix(DEAD_LETTER_SUFFIX) {
            Some(base) if !self.queue_exists(claim.queue) && self.queue_exists(base) => {
                (base, Lane::DeadLetter)
            }
            _ => (claim.queue, Lane::Main),
        };
        let sub = self.subscription_of(queue, claim.subscription)?;
        // A claim in the connection's session asks for at most its room,
        // and what it takes is recorded there (`session_ops.rs`).
        let (credits, in_session) = self.session_credits(connection, queue, sub, claim.credits)?;
        let clamped;
        let claim = if credits < claim.credits {
            clamped = super::session_ops::with_credits(claim, credits);
            &clamped
        } else {
            claim
        };
        if claim.partition == PartitionId::ANY {
            let claimed = self
                .claim_any(claim, queue, lane, sub, registration, connection, grants, timed)
                .await;
            if let Ok(claimed) = &claimed {
                self.session_claimed(connection, in_session, claimed);
            }
            return claimed;
        }
        let partition = self.route(queue, claim.partition)?;
        *timed = Some((partition.clone(), RequestOp::Claim));
        // The table names the subscription; this partition's log does not
        // start it yet (its leader appends the start): nothing to claim.
        if sub != SubscriptionId::DEFAULT && !partition.has_subscription(sub) {
            self.state.subscriptions_changed_by_name(queue);
            return Ok(Vec::new());
        }
        // A principal with `claims_in_flight_max` asks for at most what its
        // share leaves (the reservation is given back if this claim fails
        // or is dropped).
        let reservation = self.quotas.reserve_claim(grants, claim.credits, (self.state.clock)())?;
        let request = ClaimRequest {
            sub,
            worker: claim.worker,
            credits: reservation.as_ref().map_or(claim.credits, |held| held.granted()),
            max_bytes: u64::from(claim.max_bytes),
            lease_ms: (claim.lease_ms > 0).then_some(u64::from(claim.lease_ms)),
        };
        let owner = WaitOwner {
            id: connection.id(),
            waiting: &connection.waiting,
            waiting_max: connection.waiting_max,
        };
        let unregistered = ClaimCancel::default();
        let claimed = match &registration {
            Some(Err(waiting_max)) => {
                Err(PartitionError::TooManyWaitersOnConnection { waiting_max: *waiting_max })
            }
            Some(Ok(registered)) => {
                let cancel = registered.cancel();
                let wait_ms = u64::from(claim.wait_ms);
                let give_up = ended_or_deadline(connection, wait_ms);
                partition.claim_as(&request, lane, wait_ms, owner, give_up, cancel).await
            }
            None => {
                let wait_ms = u64::from(claim.wait_ms);
                let give_up = ended_or_deadline(connection, wait_ms);
                partition.claim_as(&request, lane, wait_ms, owner, give_up, &unregistered).await
            }
        };
        drop(registration);
        match &claimed {
            Ok(claimed) => partition.requests.claimed(claimed),
            Err(failure) => partition.requests.failed(failure),
        }
        settle(reservation, &claimed);
        if let Ok(claimed) = &claimed {
            self.session_claimed(connection, in_session, claimed);
        }
        claimed.map_err(|failure| claim_failed(connection, queue, claim.partition, &failure))
    }

    /// The id of subscription `name` of `queue` (`""` and `default`: the
    /// default), or SUBSCRIPTION_NOT_FOUND.
    pub(super) fn subscription_of(
        &self,
        queue: &str,
        name: &str,
    ) -> Result<SubscriptionId, ErrorResponse> {
        if name.is_empty() {
            return Ok(SubscriptionId::DEFAULT);
        }
        let table = self.state.table.borrow();
        let entry = QueueName::new(queue).ok().and_then(|queue| table.queue(&queue));
        let Some(entry) = entry else {
            return Err(error(ErrorCode::QueueNotFound, format!("queue {queue} does not exist")));
        };
        entry.subscriptions.id(name).ok_or_else(|| {
            error(
                ErrorCode::SubscriptionNotFound,
                format!("queue {queue} has no subscription {name}"),
            )
        })
    }

    /// A Claim of partition `ANY`: visits the queue's ready ring on this
    /// shard (`ready.rs`) and takes from each listed partition what is
    /// ready, in rotation, until the credits or bytes are spent or every
    /// listed partition was visited once; with nothing found, waits on the
    /// ring (bounded as a partition's waiters are, by
    /// `CLAIM_WAITERS_MAX` per queue and shard and by the connection's own
    /// bound) until a partition is listed, the wait ends, or the claim is
    /// cancelled. Main lane only. Each subscription has its own ring.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_any(
        &self,
        claim: &proto::ClaimRequest<'_>,
        queue: &str,
        lane: Lane,
        sub: SubscriptionId,
        registration: Option<Result<ClaimRegistration<'_>, usize>>,
        connection: &Connection,
        grants: &crate::auth::Grants,
        timed: &mut Timed,
    ) -> Result<Vec<crate::partition::Claimed>, ErrorResponse> {
        if lane == Lane::DeadLetter {
            return Err(error(
                ErrorCode::InvalidArgument,
                format!(
                    "claim of partition ANY serves the main lane; name a partition of {queue} \
                     to claim its dead letters"
                ),
            ));
        }
        // The default's ring is there from the queue's first partition;
        // another's is made now if need be, dropping those of subscriptions
        // the table no longer names.
        let ring = if sub == SubscriptionId::DEFAULT {
            self.state.partitions.borrow().ready(queue, sub, |_| true)
        } else {
            let table = self.state.table.borrow();
            let named = QueueName::new(queue).ok().and_then(|name| table.queue(&name));
            let live = |id: SubscriptionId| {
                named.is_some_and(|entry| entry.subscriptions.name(id).is_some())
            };
            self.state.partitions.borrow().ready(queue, sub, live)
        };
        let Some(ring) = ring else {
            if !self.queue_exists(queue) {
                return Err(error(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist"),
                ));
            }
            return Err(error(
                ErrorCode::NotOwner,
                format!(
                    "shard {} leads no partition of queue {queue}; claim ANY at a shard that \
                     leads one (Metadata names them)",
                    self.state.shard.0
                ),
            ));
        };
        let reservation = self.quotas.reserve_claim(grants, claim.credits, (self.state.clock)())?;
        let credits = reservation.as_ref().map_or(claim.credits, |held| held.granted());
        let owner = WaitOwner {
            id: connection.id(),
            waiting: &connection.waiting,
            waiting_max: connection.waiting_max,
        };
        let unregistered = ClaimCancel::default();
        let (cancel, refused) = match &registration {
            Some(Ok(registered)) => (registered.cancel(), None),
            Some(Err(waiting_max)) => (&unregistered, Some(*waiting_max)),
            None => (&unregistered, None),
        };
        if let Some(waiting_max) = refused {
            let failure = PartitionError::TooManyWaitersOnConnection { waiting_max };
            return Err(claim_failed(connection, queue, claim.partition, &failure));
        }
        let wait_ms = u64::from(claim.wait_ms);
        let deadline = (self.state.clock)().saturating_add(wait_ms);
        let mut give_up = std::pin::pin!(ended_or_deadline(connection, wait_ms));
        let mut slot = None;
        let claimed = loop {
            let found = self.visit_ready(&ring, queue, sub, claim, credits, cancel, timed).await;
            match found {
                Ok(found) if found.is_empty() => {}
                other => break other,
            }
            let evicted = slot.as_ref().is_some_and(crate::partition::signal::WaiterSlot::evicted);
            if cancel.is_cancelled() || evicted || (self.state.clock)() >= deadline {
                break Ok(Vec::new());
            }
            if slot.is_none() {
                match ring.waiters().register(owner, CLAIM_WAITERS_MAX, deadline) {
                    Ok(registered) => slot = Some(registered),
                    Err(refused) => {
                        let failure = match refused {
                            WaitRefused::OwnerFull { waiting_max } => {
                                PartitionError::TooManyWaitersOnConnection { waiting_max }
                            }
                            WaitRefused::PartitionFull { .. } => PartitionError::TooManyWaiters,
                        };
                        break Err(claim_failed(connection, queue, claim.partition, &failure));
                    }
                }
                // Listed between the visit and the registration: look again.
                if !ring.is_empty() {
                    continue;
                }
            }
            let Some(waiter) = slot.as_ref() else { continue };
            if waiter.wait_or_give_up(give_up.as_mut(), cancel).await {
                break Ok(Vec::new());
            }
        };
        drop(slot);
        drop(registration);
        settle(reservation, &claimed);
        claimed
    }

    /// One pass of a claim of any partition over `ring`: each partition
    /// listed when it starts is visited at most once. A partition's error
    /// ends the pass: with deliveries already taken they are answered (the
    /// failing partition stays listed), else the error is.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn visit_ready(
        &self,
        ring: &ReadyRing,
        queue: &str,
        sub: SubscriptionId,
        claim: &proto::ClaimRequest<'_>,
        credits: u32,
        cancel: &ClaimCancel,
        timed: &mut Timed,
    ) -> Result<Vec<crate::partition::Claimed>, ErrorResponse> {
        let mut out: Vec<crate::partition::Claimed> = Vec::new();
        let mut credits_left = credits;
        let mut bytes_left = u64::from(claim.max_bytes);
        let lease_ms = (claim.lease_ms > 0).then_some(u64::from(claim.lease_ms));
        let request = |credits: u32, max_bytes: u64| ClaimRequest {
            sub,
            worker: claim.worker,
            credits,
            max_bytes,
            lease_ms,
        };
        // The visit: the ring's first partitions, each with where the
        // messages it would deliver lie in the journal (`ready.rs`).
        let mut visit: Vec<(Vec<u64>, Visited)> = Vec::new();
        let peek = request(credits.min(CLAIM_ANY_PEEK_MESSAGES_MAX), bytes_left);
        for _ in 0..ring.len().min(CLAIM_ANY_VISIT_PARTITIONS_MAX) {
            let Some(partition) = ring.next() else { break };
            // Gone since it was listed (its queue deleted, reassigned).
            let Some(served) = self.state.served(queue, partition) else { continue };
            // A replicated member that stopped serving since it was listed:
            // listed again once it leads.
            if !served.partition.serving() {
                continue;
            }
            // The subscription not started in this partition's log yet:
            // listed again by the start (`Partition::log_subscriptions`).
            if sub != SubscriptionId::DEFAULT && !served.partition.has_subscription(sub) {
                self.state.subscriptions_changed_by_name(queue);
                continue;
            }
            let mut positions = Vec::new();
            match served.partition.ready_positions(&peek, &mut positions) {
                Ok(exhausted) if positions.is_empty() => {
                    if !exhausted {
                        ring.keep(partition);
                    }
                }
                Ok(_) => visit.push((positions, (partition, served))),
                Err(failure) => {
                    ring.keep(partition);
                    served.requests.failed(&failure);
                    for (_, (partition, _)) in &visit {
                        ring.keep(*partition);
                    }
                    return Err(partition_error(&failure));
                }
            }
        }
        let takes = plan_visit(&mut visit);
        let mut visiting = visit.into_iter().zip(takes);
        while let Some(((_, (partition, served)), take)) = visiting.next() {
            if credits_left == 0 || bytes_left == 0 || cancel.is_cancelled() {
                ring.keep(partition);
                continue;
            }
            let credits = match take {
                Take::AtMost(count) => count.min(credits_left),
                Take::All => credits_left,
            };
            match served.partition.claim_ready(&request(credits, bytes_left), cancel).await {
                Ok(ready) => {
                    if !ready.exhausted {
                        ring.keep(partition);
                    }
                    if ready.claimed.is_empty() {
                        continue;
                    }
                    served.requests.claimed(&ready.claimed);
                    if timed.is_none() {
                        *timed = Some((served.clone(), RequestOp::Claim));
                    }
                    credits_left -= ready.claimed.len() as u32;
                    let bytes: u64 =
                        ready.claimed.iter().map(|item| u64::from(item.delivery.size_bytes)).sum();
                    bytes_left = bytes_left.saturating_sub(bytes);
                    out.extend(ready.claimed);
                }
                Err(failure) => {
                    ring.keep(partition);
                    served.requests.failed(&failure);
                    for ((_, (partition, _)), _) in visiting.by_ref() {
                        ring.keep(partition);
                    }
                    if out.is_empty() {
                        return Err(partition_error(&failure));
                    }
                    tracing::warn!(%queue, partition = partition.0, %failure,
                        "claim of any partition: answering what other partitions gave");
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A partition a claim of any partition visits, and what serves it.
type Visited = (PartitionId, Rc<Served>);

/// A claim's failure as the client sees it; the waiter bounds are also
/// recorded in the connection's rejections.
/// Gives a claim's quota reservation back but for what it delivered (the
/// tokens and deadlines its leases hold).
pub(super) fn settle<E>(
    reservation: Option<super::quota::ClaimReservation>,
    claimed: &Result<Vec<crate::partition::Claimed>, E>,
) {
    if let (Some(held), Ok(claimed)) = (reservation, claimed) {
        held.settle(
            claimed.iter().map(|item| (item.delivery.token.to_bytes(), item.delivery.deadline_ms)),
        );
    }
}

pub(super) fn claim_failed(
    connection: &Connection,
    queue: &str,
    partition: PartitionId,
    failure: &PartitionError,
) -> ErrorResponse {
    let reason = match failure {
        PartitionError::TooManyWaitersOnConnection { .. } => {
            Some(REJECT_CLAIM_WAITERS_PER_CONNECTION)
        }
        PartitionError::TooManyWaiters => Some(REJECT_CLAIM_WAITERS_PER_PARTITION),
        _ => None,
    };
    if let Some(reason) = reason {
        let named =
            if partition == PartitionId::ANY { "ANY".to_owned() } else { partition.to_string() };
        let detail = format_args!("claim on {queue}/{named}: {failure}");
        connection.rejections().record(reason, &detail);
    }
    partition_error(failure)
}

/// Resolves when the connection ends or `wait_ms` has passed: a long-poll's
/// own timer, so its deadline is met to the millisecond however long the
/// shard's housekeeping sleeps.
async fn ended_or_deadline(connection: &Connection, wait_ms: u64) {
    futures_lite::future::or(connection.ended(), async {
        glommio::timer::Timer::new(std::time::Duration::from_millis(wait_ms)).await;
    })
    .await;
}
