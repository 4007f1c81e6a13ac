//! Subscription admin on a shard's port (`docs/design/subscriptions.md`):
//! CreateSubscription and DeleteSubscription (api keys 26 and 27) change
//! the table through the coordinator, as the admin API's routes do
//! (`admin/api/subscriptions.rs`), and answer once every shard of this node
//! applied the change; each partition's leader then starts or ends the
//! subscription in its log (`server/subscriptions.rs`). And the subscription
//! list of DescribeQueue v2: each subscription's counters summed over the
//! partitions the answering shard reports.
//!
//! Refusals: `QUEUE_NOT_FOUND`; `SUBSCRIPTION_NOT_FOUND` for a delete of a
//! name the queue does not have; `INVALID_ARGUMENT` for a name the table
//! refuses (`default`, the queue's subscriptions at their most) and for one
//! that exists already (as the admin API answers it); `NOT_LEADER` with the
//! leader's address from a cluster member that does not lead the
//! controller. The right needed is `admin` on the queue (`server/auth.rs`).

use spool_wire::proto::{
    CreateSubscriptionRequest, CreateSubscriptionResponse, DeleteSubscriptionRequest,
    DeleteSubscriptionResponse, ErrorResponse, Response, SubscriptionStart as WireStart,
    SubscriptionStats,
};
use spool_wire::ErrorCode;

use super::handler::{control_error, error, Answer, SpoolHandler};
use crate::control::assignment::{
    AssignmentError, QueueName, SubscriptionStart, Subscriptions, DEFAULT_SUBSCRIPTION,
};
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;
use crate::queue::{QueueCounters, SubscriptionId};
use crate::shard::CoordinatorError;

/// The answer to a refused change: [`control_error`]'s, but a subscription
/// the queue lacks is `SUBSCRIPTION_NOT_FOUND`.
fn change_error(failure: &CoordinatorError) -> ErrorResponse {
    match failure {
        CoordinatorError::Assignment(AssignmentError::SubscriptionNotFound { .. }) => {
            error(ErrorCode::SubscriptionNotFound, failure.to_string())
        }
        other => control_error(other),
    }
}

fn queue_name(queue: &str) -> Result<QueueName, ErrorResponse> {
    QueueName::new(queue).map_err(|failure| control_error(&CoordinatorError::Assignment(failure)))
}

impl SpoolHandler {
    pub(super) async fn create_subscription(&self, request: &CreateSubscriptionRequest) -> Answer {
        let queue = queue_name(&request.queue)?;
        let start = match request.start {
            WireStart::Latest => SubscriptionStart::Latest,
            WireStart::Earliest => SubscriptionStart::Earliest,
            WireStart::Time(time_ms) => SubscriptionStart::Time(time_ms),
            WireStart::Offset(offset) => SubscriptionStart::Offset(offset),
        };
        let version = self
            .state
            .coordinator
            .change_subscription_async(
                queue.clone(),
                request.name.clone(),
                Some(start),
                ADMIN_APPLY_TIMEOUT_MS,
            )
            .await
            .map_err(|failure| change_error(&failure))?;
        // Every shard of this node applied the change: this one's table
        // names the subscription (unless a later change already removed it).
        let id = self
            .state
            .table
            .borrow()
            .queue(&queue)
            .and_then(|entry| entry.subscriptions.id(&request.name))
            .map_or(0, |id| id.0);
        Ok(Response::CreateSubscription(CreateSubscriptionResponse {
            assignment_version: version,
            id,
        }))
    }

    pub(super) async fn delete_subscription(&self, request: &DeleteSubscriptionRequest) -> Answer {
        let queue = queue_name(&request.queue)?;
        let version = self
            .state
            .coordinator
            .change_subscription_async(queue, request.name.clone(), None, ADMIN_APPLY_TIMEOUT_MS)
            .await
            .map_err(|failure| change_error(&failure))?;
        Ok(Response::DeleteSubscription(DeleteSubscriptionResponse { assignment_version: version }))
    }
}

/// One subscription's row of DescribeQueue v2 over `counters` (one entry
/// per reported partition that has started it).
fn row(
    name: &str,
    id: SubscriptionId,
    start: WireStart,
    counters: &[QueueCounters],
) -> SubscriptionStats {
    let sum = |field: fn(&QueueCounters) -> u64| counters.iter().map(field).sum::<u64>();
    let max = |field: fn(&QueueCounters) -> Option<u64>| {
        counters.iter().filter_map(field).max().unwrap_or(0)
    };
    SubscriptionStats {
        name: name.to_owned(),
        id: id.0,
        start,
        partitions: counters.len() as u32,
        ready: sum(|c| c.ready),
        scheduled: sum(|c| c.scheduled),
        claimed: sum(|c| c.claimed),
        dead_letters: sum(|c| c.quarantined),
        oldest_ready_age_ms: max(|c| c.oldest_ready_age_ms),
        oldest_claim_age_ms: max(|c| c.oldest_claim_age_ms),
        acked: sum(|c| c.totals.acked),
        lost: sum(|c| c.totals.lost),
    }
}

/// The subscriptions of a queue as DescribeQueue v2 lists them, the default
/// first: `named` from the table, `defaults` the default's counters of the
/// partitions the answer reports, `of(sub)` another subscription's counters
/// on each of them (those that have started it).
pub(super) fn subscription_stats(
    named: &Subscriptions,
    defaults: &[QueueCounters],
    of: impl Fn(SubscriptionId) -> Vec<QueueCounters>,
) -> Vec<SubscriptionStats> {
    let mut stats = Vec::with_capacity(named.named.len() + 1);
    // The default holds every record from the queue's creation.
    stats.push(row(DEFAULT_SUBSCRIPTION, SubscriptionId::DEFAULT, WireStart::Earliest, defaults));
    for (name, entry) in &named.named {
        let start = match entry.start {
            SubscriptionStart::Latest => WireStart::Latest,
            SubscriptionStart::Earliest => WireStart::Earliest,
            SubscriptionStart::Time(time_ms) => WireStart::Time(time_ms),
            SubscriptionStart::Offset(offset) => WireStart::Offset(offset),
        };
        stats.push(row(name, entry.id, start, &of(entry.id)));
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::assignment::SubscriptionEntry;
    use crate::queue::Totals;

    fn counters(ready: u64, lost: u64) -> QueueCounters {
        QueueCounters { ready, totals: Totals { lost, ..Totals::default() }, ..Default::default() }
    }

    // Goal: each DescribeQueue v2 row sums its subscription's `lost` over
    // the partitions reported (the default's from the partitions' own
    // counters, another's from its own), as it sums `ready`. Method: two
    // partitions, a default and one named subscription.
    #[test]
    fn rows_sum_lost_over_partitions() {
        let mut named = Subscriptions::default();
        let late = SubscriptionEntry { id: SubscriptionId(1), start: SubscriptionStart::Earliest };
        named.named.insert("late".to_owned(), late);
        let defaults = [counters(2, 0), counters(3, 0)];
        let stats = subscription_stats(&named, &defaults, |sub| {
            assert_eq!(sub, SubscriptionId(1));
            vec![counters(1, 30), counters(0, 7)]
        });
        assert_eq!(stats.len(), 2);
        assert_eq!((stats[0].name.as_str(), stats[0].ready, stats[0].lost), ("default", 5, 0));
        assert_eq!((stats[1].name.as_str(), stats[1].partitions, stats[1].lost), ("late", 2, 37));
    }
}
