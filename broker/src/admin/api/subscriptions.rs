//! `/v1/queues/{queue}/subscriptions[/{name}]`: a queue's subscriptions
//! (`docs/design/subscriptions.md`): create one (starting at the earliest
//! record the queue still has to deliver, or the latest), list them with
//! their counters, describe one, delete one. Made in the table through the
//! coordinator (the controller in a cluster: a member that does not lead
//! it answers `NOT_LEADER` with the leader's address); each partition's
//! leader then starts or ends it in its log.
//!
//! Counters are summed over the partitions this node serves (in a cluster,
//! the replicas it holds: each node reports its own, as its metrics do).
//! With authentication on, the caller needs `admin` on the queue to create
//! or delete and `describe` to read.

use serde::Deserialize;
use serde_json::{json, Value};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::limits::LOSSES_LISTED_MAX_HTTP;
use super::routes::Operation;
use super::{Call, Gateway};
use crate::auth::Operation as Right;
use crate::control::assignment::{
    AssignmentError, QueueName, SubscriptionStart, DEFAULT_SUBSCRIPTION,
};
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;
use crate::queue::{Loss, PartitionId, QueueCounters, SubscriptionId};
use crate::shard::CoordinatorError;
use hyper::StatusCode;

/// The body of `POST /v1/queues/{queue}/subscriptions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    pub name: String,
    /// `latest` (the default) or `earliest`.
    #[serde(default)]
    pub from: Option<String>,
}

/// `POST /v1/queues/{queue}/subscriptions/{name}/seek`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeekSubscription {
    /// Where it starts over: as a create's `from`.
    pub to: String,
}

/// The API error of a refused change.
fn change_error(error: &CoordinatorError) -> ApiError {
    let code = match error {
        CoordinatorError::Assignment(AssignmentError::QueueNotFound(_)) => ErrorCode::QueueNotFound,
        CoordinatorError::Assignment(AssignmentError::SubscriptionNotFound { .. }) => {
            ErrorCode::SubscriptionNotFound
        }
        CoordinatorError::Assignment(_) => ErrorCode::InvalidArgument,
        CoordinatorError::NotLeader { .. } => ErrorCode::NotLeader,
        CoordinatorError::Busy => ErrorCode::Throttled,
        CoordinatorError::Timeout { .. } | CoordinatorError::NoReply { .. } => ErrorCode::Timeout,
        CoordinatorError::Stopped => ErrorCode::ShuttingDown,
        _ => ErrorCode::Internal,
    };
    ApiError::new(code, error.to_string())
}

/// One partition's share of a subscription's row: its counters and loss
/// reports there.
struct Share<'a> {
    partition: PartitionId,
    counters: QueueCounters,
    losses: &'a [Loss],
}

/// The newest loss reports over `shares` (at most
/// [`LOSSES_LISTED_MAX_HTTP`]), oldest first, each naming its partition.
fn losses(shares: &[Share<'_>]) -> Vec<Value> {
    let mut all: Vec<(PartitionId, &Loss)> = shares
        .iter()
        .flat_map(|share| share.losses.iter().map(move |loss| (share.partition, loss)))
        .collect();
    all.sort_by_key(|(partition, loss)| (loss.at_ms, partition.0, loss.from));
    let skip = all.len().saturating_sub(LOSSES_LISTED_MAX_HTTP);
    all.into_iter()
        .skip(skip)
        .map(|(partition, loss)| {
            json!({
                "partition": partition.0,
                "from": loss.from.0,
                "to": loss.to.0,
                "count": loss.count,
                "at_ms": loss.at_ms,
            })
        })
        .collect()
}

/// A subscription's row: its counters summed over partitions, `lost` (the
/// records retention windows dropped before it delivered them) and its
/// newest loss reports.
fn row(name: &str, id: SubscriptionId, shares: &[Share<'_>]) -> Value {
    let counters: Vec<QueueCounters> = shares.iter().map(|share| share.counters).collect();
    let sum = |field: fn(&QueueCounters) -> u64| counters.iter().map(field).sum::<u64>();
    let max = |field: fn(&QueueCounters) -> Option<u64>| counters.iter().filter_map(field).max();
    json!({
        "name": name,
        "id": id.0,
        "partitions_reporting": counters.len(),
        "ready": sum(|c| c.ready),
        "scheduled": sum(|c| c.scheduled),
        "claimed": sum(|c| c.claimed),
        "dead_letters": sum(|c| c.quarantined),
        "backlog": sum(|c| c.live_messages),
        "oldest_ready_age_ms": max(|c| c.oldest_ready_age_ms),
        "oldest_claim_age_ms": max(|c| c.oldest_claim_age_ms),
        "acked": sum(|c| c.totals.acked),
        "enqueued": sum(|c| c.totals.enqueued),
        "lost": sum(|c| c.totals.lost),
        "losses": losses(shares),
    })
}

impl Gateway {
    /// The five subscription routes.
    pub(super) async fn subscription_call(
        &self,
        call: &Call,
        queue: &str,
    ) -> Result<(StatusCode, Value), ApiError> {
        match call.operation {
            Operation::CreateSubscription => {
                let body = super::parse(&call.body)?;
                Ok((StatusCode::CREATED, self.create_subscription(call, queue, body).await?))
            }
            Operation::DescribeSubscription => {
                Ok((StatusCode::OK, self.describe_subscription(call, queue).await?))
            }
            Operation::DeleteSubscription => {
                Ok((StatusCode::OK, self.delete_subscription(call, queue).await?))
            }
            Operation::SeekSubscription => {
                let body = super::parse(&call.body)?;
                Ok((StatusCode::OK, self.seek_subscription(call, queue, body).await?))
            }
            _ => Ok((StatusCode::OK, self.list_subscriptions(call, queue).await?)),
        }
    }

    fn require(call: &Call, queue: &str, right: Right, what: &str) -> Result<(), ApiError> {
        match &call.grants {
            Some(grants) if !grants.allows(queue, right) => {
                crate::auth::count_denial(right);
                Err(ApiError::new(
                    ErrorCode::PermissionDenied,
                    format!("principal {} may not {what} of queue {queue}", grants.name()),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The queue and subscription names a `{queue}/{name}` path segment
    /// pair carries (`routes.rs` joins them with `/`, which neither may
    /// hold).
    pub(super) fn split_subscription(segment: &str) -> (&str, &str) {
        segment.split_once('/').unwrap_or((segment, ""))
    }

    /// `POST /v1/queues/{queue}/subscriptions`.
    pub(super) async fn create_subscription(
        &self,
        call: &Call,
        queue: &str,
        body: CreateSubscription,
    ) -> Result<Value, ApiError> {
        Self::require(call, queue, Right::Admin, "create subscriptions")?;
        let start = match body.from.as_deref() {
            None => SubscriptionStart::Latest,
            Some(text) => SubscriptionStart::parse(text).ok_or_else(|| {
                ApiError::invalid(format!(
                    "from {text:?}: use \"latest\", \"earliest\", \"time:<unix ms>\" or \
                     \"offset:<n>\""
                ))
            })?,
        };
        let name = QueueName::new(queue).map_err(|error| ApiError::invalid(error.to_string()))?;
        let coordinator = self.coordinator.clone();
        let sub = body.name.clone();
        let version = tokio::task::spawn_blocking(move || {
            coordinator.change_subscription(name, sub, Some(start), ADMIN_APPLY_TIMEOUT_MS)
        })
        .await
        .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?
        .map_err(|error| change_error(&error))?;
        let table = self.coordinator.catalog_snapshot();
        let id = table
            .queue(&QueueName::new(queue).map_err(|error| ApiError::invalid(error.to_string()))?)
            .and_then(|entry| entry.subscriptions.id(&body.name))
            .map_or(0, |id| id.0);
        Ok(json!({
            "queue": queue,
            "name": body.name,
            "id": id,
            "from": start.text(),
            "assignment_version": version.0,
        }))
    }

    /// `POST /v1/queues/{queue}/subscriptions/{name}/seek`: the
    /// subscription starts over at `to` under a new id (its claims,
    /// retries and dead letters go; every token of it is refused from now).
    pub(super) async fn seek_subscription(
        &self,
        call: &Call,
        segment: &str,
        body: SeekSubscription,
    ) -> Result<Value, ApiError> {
        let (queue, sub) = Self::split_subscription(segment);
        Self::require(call, queue, Right::Admin, "rewind subscriptions")?;
        let start = SubscriptionStart::parse(&body.to).ok_or_else(|| {
            ApiError::invalid(format!(
                "to {:?}: use \"latest\", \"earliest\", \"time:<unix ms>\" or \"offset:<n>\"",
                body.to
            ))
        })?;
        let name = QueueName::new(queue).map_err(|error| ApiError::invalid(error.to_string()))?;
        let coordinator = self.coordinator.clone();
        let owned = sub.to_owned();
        let version = tokio::task::spawn_blocking(move || {
            coordinator.reseek_subscription(name, owned, start, ADMIN_APPLY_TIMEOUT_MS)
        })
        .await
        .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?
        .map_err(|error| change_error(&error))?;
        let table = self.coordinator.catalog_snapshot();
        let id = QueueName::new(queue)
            .ok()
            .and_then(|name| table.queue(&name).and_then(|entry| entry.subscriptions.id(sub)))
            .map_or(0, |id| id.0);
        Ok(json!({
            "queue": queue,
            "name": sub,
            "id": id,
            "from": start.text(),
            "assignment_version": version.0,
        }))
    }

    /// `DELETE /v1/queues/{queue}/subscriptions/{name}`.
    pub(super) async fn delete_subscription(
        &self,
        call: &Call,
        segment: &str,
    ) -> Result<Value, ApiError> {
        let (queue, sub) = Self::split_subscription(segment);
        Self::require(call, queue, Right::Admin, "delete subscriptions")?;
        let name = QueueName::new(queue).map_err(|error| ApiError::invalid(error.to_string()))?;
        let coordinator = self.coordinator.clone();
        let owned = sub.to_owned();
        let version = tokio::task::spawn_blocking(move || {
            coordinator.change_subscription(name, owned, None, ADMIN_APPLY_TIMEOUT_MS)
        })
        .await
        .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?
        .map_err(|error| change_error(&error))?;
        Ok(json!({ "queue": queue, "name": sub, "deleted": true, "assignment_version": version.0 }))
    }

    /// The rows of `queue`'s subscriptions (the default first), or only
    /// `only`'s.
    async fn subscription_rows(
        &self,
        queue: &str,
        only: Option<&str>,
    ) -> Result<Vec<Value>, ApiError> {
        let name = QueueName::new(queue).map_err(|error| ApiError::invalid(error.to_string()))?;
        let table = self.coordinator.catalog_snapshot();
        let entry = table.queue(&name).ok_or_else(|| {
            ApiError::new(ErrorCode::QueueNotFound, format!("queue {queue} does not exist"))
        })?;
        let mut subs: Vec<(String, SubscriptionId)> =
            vec![(DEFAULT_SUBSCRIPTION.to_owned(), SubscriptionId::DEFAULT)];
        subs.extend(entry.subscriptions.named.iter().map(|(name, sub)| (name.clone(), sub.id)));
        if let Some(only) = only {
            subs.retain(|(name, _)| name == only);
            if subs.is_empty() {
                return Err(ApiError::new(
                    ErrorCode::SubscriptionNotFound,
                    format!("queue {queue} has no subscription {only}"),
                ));
            }
        }
        let gathered = crate::admin::gather(&self.coordinator)
            .await
            .map_err(|error| ApiError::new(ErrorCode::Internal, error))?;
        let partitions: Vec<_> = gathered
            .reports
            .iter()
            .flat_map(|report| report.partitions.iter())
            .filter(|partition| partition.queue == queue)
            .collect();
        Ok(subs
            .into_iter()
            .map(|(name, id)| {
                let shares: Vec<Share<'_>> = partitions
                    .iter()
                    .filter_map(|partition| {
                        if id == SubscriptionId::DEFAULT {
                            return Some(Share {
                                partition: partition.partition,
                                counters: partition.counters,
                                losses: &partition.losses,
                            });
                        }
                        let sub = partition.subscriptions.iter().find(|sub| sub.id == id)?;
                        Some(Share {
                            partition: partition.partition,
                            counters: sub.counters,
                            losses: &sub.losses,
                        })
                    })
                    .collect();
                row(&name, id, &shares)
            })
            .collect())
    }

    /// `GET /v1/queues/{queue}/subscriptions`.
    pub(super) async fn list_subscriptions(
        &self,
        call: &Call,
        queue: &str,
    ) -> Result<Value, ApiError> {
        Self::require(call, queue, Right::Describe, "list the subscriptions")?;
        let rows = self.subscription_rows(queue, None).await?;
        Ok(json!({ "queue": queue, "subscriptions": rows }))
    }

    /// `GET /v1/queues/{queue}/subscriptions/{name}`.
    pub(super) async fn describe_subscription(
        &self,
        call: &Call,
        segment: &str,
    ) -> Result<Value, ApiError> {
        let (queue, sub) = Self::split_subscription(segment);
        Self::require(call, queue, Right::Describe, "describe the subscriptions")?;
        let mut rows = self.subscription_rows(queue, Some(sub)).await?;
        let mut row = rows.pop().unwrap_or(Value::Null);
        if let Some(object) = row.as_object_mut() {
            object.insert("queue".to_owned(), json!(queue));
        }
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{Offset, Totals};

    fn loss(from: u64, at_ms: u64) -> Loss {
        Loss { from: Offset(from), to: Offset(from + 9), count: 10, at_ms }
    }

    fn counters(lost: u64) -> QueueCounters {
        QueueCounters { totals: Totals { lost, ..Totals::default() }, ..QueueCounters::default() }
    }

    // Goal: a subscription's row sums `lost` over its partitions and lists
    // the newest loss reports (at most LOSSES_LISTED_MAX_HTTP, oldest
    // first), each naming its partition and offsets. Method: two
    // partitions whose reports together pass the bound.
    #[test]
    fn rows_carry_lost_and_the_newest_losses() {
        let first: Vec<Loss> =
            (0..LOSSES_LISTED_MAX_HTTP as u64).map(|n| loss(n * 10, n * 2)).collect();
        let second = vec![loss(500, 1), loss(600, 1_000)];
        let shares = [
            Share { partition: PartitionId(0), counters: counters(400), losses: &first },
            Share { partition: PartitionId(1), counters: counters(25), losses: &second },
        ];
        let row = row("audit", SubscriptionId(1), &shares);
        assert_eq!(row["lost"], 425);
        let listed = row["losses"].as_array().unwrap();
        assert_eq!(listed.len(), LOSSES_LISTED_MAX_HTTP);
        // The two oldest (at 0 and 1 ms) fell off; the newest is last.
        assert_eq!(
            listed[0],
            json!({"partition": 0, "from": 10, "to": 19, "count": 10, "at_ms": 2})
        );
        let last = &listed[LOSSES_LISTED_MAX_HTTP - 1];
        assert_eq!(
            *last,
            json!({"partition": 1, "from": 600, "to": 609, "count": 10, "at_ms": 1000})
        );
        // Without a window: none.
        let quiet = [Share { partition: PartitionId(0), counters: counters(0), losses: &[] }];
        let row = super::row("default", SubscriptionId::DEFAULT, &quiet);
        assert_eq!(
            (row["lost"].as_u64(), row["losses"].as_array().map(Vec::len)),
            (Some(0), Some(0))
        );
    }
}
