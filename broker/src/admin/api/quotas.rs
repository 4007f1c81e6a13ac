//! `GET /v1/quotas`: each principal's configured quotas and what it uses
//! now, summed over the shards (`docs/operations.md`, "Quotas").
//!
//! Broker-wide, so with authentication on the caller needs `admin` on `*`
//! (a rule whose queue pattern is `*`) in the policy in force; the admin
//! port verified the caller's token before this runs. The figures come
//! from the shards' reports (the admin port's report path), never from
//! shared state.

use serde_json::{json, Value};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::{Call, Gateway};
use crate::auth::quota::QuotaKind;

impl Gateway {
    /// `GET /v1/quotas`: the caller needs `admin` on `*` (anyone while
    /// authentication is off), checked against the policy in force.
    pub(super) async fn quotas(&self, call: &Call) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "list quotas")?;
        let gathered = crate::admin::gather(&self.coordinator)
            .await
            .map_err(|error| ApiError::new(ErrorCode::ShuttingDown, error))?;
        let shards = self.coordinator.shard_count();
        let principals: Vec<Value> = crate::server::quota::merge(&gathered.reports)
            .into_iter()
            .map(|(principal, merged)| {
                let quotas: Vec<Value> = QuotaKind::ALL
                    .iter()
                    .filter(|kind| {
                        merged.config.get(**kind).is_some() || merged.rejections[kind.index()] > 0
                    })
                    .map(|kind| {
                        json!({
                            "quota": kind.as_str(),
                            "limit": merged.config.get(*kind),
                            "in_use": merged.in_use[kind.index()],
                            "rejections": merged.rejections[kind.index()],
                        })
                    })
                    .collect();
                json!({ "principal": principal, "quotas": quotas })
            })
            .collect();
        Ok(json!({
            "shards": shards,
            "missing_shards": gathered.missing,
            "principals": principals,
        }))
    }
}
