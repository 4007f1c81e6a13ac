//! `GET /v1/quotas`: each principal's configured quotas and what it uses
//! now, summed over the shards (`docs/operations.md`, "Quotas").
//!
//! Broker-wide, so with authentication on the caller needs `admin` on `*`
//! (a rule whose queue pattern is `*`). The caller's secret is checked by
//! the shards, as for every API request: the gateway connects as the
//! caller before it answers. The figures come from the shards' reports
//! (the admin port's report path), never from shared state.

use serde_json::{json, Value};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::{Gateway, CALLER};
use crate::auth::quota::QuotaKind;
use crate::auth::Operation;

impl Gateway {
    /// Checks that the caller may read broker-wide figures: `admin` on `*`
    /// (anyone while authentication is off).
    async fn require_admin_everywhere(&self) -> Result<(), ApiError> {
        if !self.policy.is_enabled() {
            return Ok(());
        }
        let principal = CALLER
            .try_with(|caller| caller.as_ref().map(|credentials| credentials.principal.clone()))
            .ok()
            .flatten()
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthenticated, "no bearer token"))?;
        // Connecting as the caller makes the shards verify its secret.
        self.client().await?;
        let allowed = self
            .policy
            .principal(&principal)
            .is_some_and(|(_, grants)| grants.allows_everywhere(Operation::Admin));
        if allowed {
            Ok(())
        } else {
            crate::auth::count_denial(Operation::Admin);
            Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("principal {principal} may not admin on queue * (needed to list quotas)"),
            ))
        }
    }

    pub(super) async fn quotas(&self) -> Result<Value, ApiError> {
        self.require_admin_everywhere().await?;
        let gathered = crate::admin::gather(&self.control)
            .await
            .map_err(|error| ApiError::new(ErrorCode::ShuttingDown, error))?;
        let shards = self.control.shard_count();
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
