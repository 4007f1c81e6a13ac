//! `GET /v1/cluster/nodes`: the nodes' health as this node's controller
//! member last published it (`control/cluster/health.rs`;
//! `docs/operations.md`, "Node health"). On the controller's leader it is
//! the cluster's view (`leads: true`, every node up or down); elsewhere it
//! names the leader this node knows of and lists no node. A single node
//! answers that it is not in a cluster.
//!
//! Broker-wide, so with authentication on the caller needs `admin` on `*`,
//! as for `GET /v1/quotas`.

use serde_json::Value;
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::{Call, Gateway};

impl Gateway {
    /// `GET /v1/cluster/nodes`.
    pub(super) fn cluster_nodes(&self, call: &Call) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "read the cluster's node health")?;
        let health = self.coordinator.cluster_health().ok_or_else(|| {
            ApiError::new(ErrorCode::InvalidArgument, "this broker is not a cluster member")
        })?;
        serde_json::to_value(&health)
            .map_err(|error| ApiError::new(ErrorCode::Internal, format!("health: {error}")))
    }
}
