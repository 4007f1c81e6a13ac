//! A Claim of partition `ANY` in a subscription other than the default
//! (`docs/design/subscriptions.md`): the shard's ready ring lists
//! partitions by what the default subscription has ready, so this claim
//! visits every partition of the queue the shard serves instead, in
//! rotation, and takes from each what the subscription has ready; with
//! nothing found it looks again every [`SUBSCRIPTION_CLAIM_POLL`] until
//! the wait runs out, the connection ends or a CancelClaim names it. A
//! per-subscription ring (woken, not polled) is the next step.

use std::rc::Rc;

use spool_wire::proto::{self, ErrorResponse};
use spool_wire::ErrorCode;

use super::claim::{claim_failed, settle};
use super::handler::{error, partition_error, SpoolHandler, Timed};
use super::limits::SUBSCRIPTION_CLAIM_POLL;
use super::Served;
use crate::net::connection::{ClaimRegistration, Connection};
use crate::partition::signal::ClaimCancel;
use crate::partition::PartitionError;
use crate::queue::{ClaimRequest, SubscriptionId};
use crate::shard::report::RequestOp;

impl SpoolHandler {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_any_sub(
        &self,
        claim: &proto::ClaimRequest<'_>,
        queue: &str,
        sub: SubscriptionId,
        registration: Option<Result<ClaimRegistration<'_>, usize>>,
        connection: &Connection,
        grants: &crate::auth::Grants,
        timed: &mut Timed,
    ) -> Result<Vec<crate::partition::Claimed>, ErrorResponse> {
        let unregistered = ClaimCancel::default();
        let cancel = match &registration {
            Some(Ok(registered)) => registered.cancel(),
            Some(Err(waiting_max)) => {
                let failure =
                    PartitionError::TooManyWaitersOnConnection { waiting_max: *waiting_max };
                return Err(claim_failed(connection, queue, claim.partition, &failure));
            }
            None => &unregistered,
        };
        let reservation = self.quotas.reserve_claim(grants, claim.credits, (self.state.clock)())?;
        let credits = reservation.as_ref().map_or(claim.credits, |held| held.granted());
        let deadline = (self.state.clock)().saturating_add(u64::from(claim.wait_ms));
        let lease_ms = (claim.lease_ms > 0).then_some(u64::from(claim.lease_ms));
        let request = |credits: u32, max_bytes: u64| ClaimRequest {
            sub,
            worker: claim.worker,
            credits,
            max_bytes,
            lease_ms,
        };
        let mut rotation = 0usize;
        let claimed = loop {
            let served: Vec<Rc<Served>> = {
                let partitions = self.state.partitions.borrow();
                partitions
                    .iter()
                    .filter(|(name, _, served)| {
                        *name == queue
                            && served.partition.serving()
                            && served.partition.has_subscription(sub)
                    })
                    .map(|(_, _, served)| served.clone())
                    .collect()
            };
            if served.is_empty() && !self.queue_exists(queue) {
                break Err(error(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist"),
                ));
            }
            let mut out: Vec<crate::partition::Claimed> = Vec::new();
            let (mut credits_left, mut bytes_left) = (credits, u64::from(claim.max_bytes));
            let count = served.len();
            let mut failure = None;
            for index in 0..count {
                if credits_left == 0 || bytes_left == 0 || cancel.is_cancelled() {
                    break;
                }
                let part = &served[(rotation + index) % count];
                match part.partition.claim_ready(&request(credits_left, bytes_left), cancel).await {
                    Ok(ready) if ready.claimed.is_empty() => {}
                    Ok(ready) => {
                        part.requests.claimed(&ready.claimed);
                        if timed.is_none() {
                            *timed = Some((part.clone(), RequestOp::Claim));
                        }
                        credits_left -= ready.claimed.len() as u32;
                        let bytes: u64 = ready
                            .claimed
                            .iter()
                            .map(|item| u64::from(item.delivery.size_bytes))
                            .sum();
                        bytes_left = bytes_left.saturating_sub(bytes);
                        out.extend(ready.claimed);
                    }
                    Err(failed) => {
                        part.requests.failed(&failed);
                        failure = Some(partition_error(&failed));
                        break;
                    }
                }
            }
            rotation = rotation.wrapping_add(1);
            if !out.is_empty() {
                break Ok(out);
            }
            if let Some(failure) = failure {
                break Err(failure);
            }
            if cancel.is_cancelled() || (self.state.clock)() >= deadline {
                break Ok(Vec::new());
            }
            let ended = futures_lite::future::or(
                async {
                    connection.ended().await;
                    true
                },
                async {
                    glommio::timer::Timer::new(SUBSCRIPTION_CLAIM_POLL).await;
                    false
                },
            )
            .await;
            if ended {
                break Ok(Vec::new());
            }
        };
        drop(registration);
        settle(reservation, &claimed);
        claimed
    }
}
