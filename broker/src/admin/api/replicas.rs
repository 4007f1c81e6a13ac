//! `GET /v1/cluster/partitions` and `POST /v1/cluster/move`: every
//! partition's replica set as the committed table holds it (re-placed or
//! the placer's, settled or still moving; `docs/operations.md`,
//! "Re-placement"), and an operator's move of one replica to another node,
//! made by the controller (this node's member answers `NOT_LEADER` with
//! the leader's address when it does not lead it). A single node answers
//! that it is not in a cluster.
//!
//! Broker-wide, so with authentication on the caller needs `admin` on `*`,
//! as for `GET /v1/cluster/nodes`.

use serde::Deserialize;
use serde_json::{json, Value};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::{Call, Gateway};
use crate::control::assignment::{AssignmentError, QueueName};
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;
use crate::queue::PartitionId;
use crate::shard::CoordinatorError;

/// The body of `POST /v1/cluster/move`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Move {
    pub queue: String,
    pub partition: u32,
    /// The node whose replica moves.
    pub from: u64,
    /// The node that takes it.
    pub to: u64,
}

fn not_clustered() -> ApiError {
    ApiError::new(ErrorCode::InvalidArgument, "this broker is not a cluster member")
}

/// The API error of a refused move.
fn move_error(error: &CoordinatorError) -> ApiError {
    let code = match error {
        CoordinatorError::Assignment(AssignmentError::QueueNotFound(_)) => ErrorCode::QueueNotFound,
        CoordinatorError::Assignment(AssignmentError::NoSuchPartition { .. }) => {
            ErrorCode::PartitionNotFound
        }
        CoordinatorError::Assignment(_) | CoordinatorError::NotClustered => {
            ErrorCode::InvalidArgument
        }
        CoordinatorError::NotLeader { .. } => ErrorCode::NotLeader,
        CoordinatorError::Busy => ErrorCode::Throttled,
        CoordinatorError::Timeout { .. } | CoordinatorError::NoReply { .. } => ErrorCode::Timeout,
        CoordinatorError::Stopped => ErrorCode::ShuttingDown,
        _ => ErrorCode::Internal,
    };
    ApiError::new(code, error.to_string())
}

impl Gateway {
    /// `GET /v1/cluster/partitions`.
    pub(super) fn cluster_partitions(&self, call: &Call) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "read the cluster's replica sets")?;
        let rows = self.coordinator.replica_sets().ok_or_else(not_clustered)?;
        let version = self.coordinator.catalog_snapshot().version().0;
        Ok(json!({ "assignment_version": version, "partitions": rows }))
    }

    /// `POST /v1/cluster/move`.
    pub(super) async fn cluster_move(&self, call: &Call, body: Move) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "move a partition's replica")?;
        if self.coordinator.replica_sets().is_none() {
            return Err(not_clustered());
        }
        let queue =
            QueueName::new(&body.queue).map_err(|error| ApiError::invalid(error.to_string()))?;
        let coordinator = self.coordinator.clone();
        let (partition, from, to) = (PartitionId(body.partition), body.from, body.to);
        let version = tokio::task::spawn_blocking(move || {
            coordinator.move_replica(queue, partition, from, to, ADMIN_APPLY_TIMEOUT_MS)
        })
        .await
        .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?
        .map_err(|error| move_error(&error))?;
        Ok(json!({
            "queue": body.queue,
            "partition": body.partition,
            "from": body.from,
            "to": body.to,
            "assignment_version": version.0,
        }))
    }
}
