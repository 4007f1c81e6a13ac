//! Broker-wide operations of the API: `POST /v1/auth/reload` (read the
//! auth file again, `auth::reload`) and `GET /v1/acl` (the compiled rules
//! in force, or one principal's rights on one queue). Both need the
//! `admin` right on every queue (a rule with `queues = ["*"]`) while
//! authentication is on. They run on the admin thread (the reload's file
//! read and wait on tokio's blocking pool) and never show a secret or hash.

use serde_json::{json, Value};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::{Call, Gateway};
use crate::auth::reload::ReloadError;
use crate::auth::Operation;

/// The query of `GET /v1/acl`: both or neither.
#[derive(Debug, Default, PartialEq, Eq)]
struct AclQuery {
    principal: Option<String>,
    queue: Option<String>,
}

impl AclQuery {
    fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut parsed = AclQuery::default();
        for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if value.is_empty() {
                return Err(ApiError::invalid(format!("query parameter {name} has no value")));
            }
            match name {
                "principal" => parsed.principal = Some(value.to_owned()),
                "queue" => parsed.queue = Some(value.to_owned()),
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter '{other}' (principal, queue)"
                    )))
                }
            }
        }
        if parsed.principal.is_some() != parsed.queue.is_some() {
            return Err(ApiError::invalid("principal and queue go together"));
        }
        Ok(parsed)
    }
}

fn reload_error(error: ReloadError) -> ApiError {
    let code = match &error {
        ReloadError::Off | ReloadError::Invalid(_) => ErrorCode::InvalidArgument,
        ReloadError::Timeout { .. } => ErrorCode::Timeout,
        ReloadError::Coordinator(_) => ErrorCode::Internal,
        #[allow(unreachable_patterns)]
        _ => ErrorCode::Internal,
    };
    ApiError::new(code, error.to_string())
}

impl Gateway {
    /// Refuses a caller without the `admin` right on every queue.
    pub(super) fn require_admin_everywhere(call: &Call, what: &str) -> Result<(), ApiError> {
        match &call.grants {
            None => Ok(()),
            Some(grants) if grants.allows_everywhere(Operation::Admin) => Ok(()),
            Some(grants) => {
                crate::auth::count_denial(Operation::Admin);
                Err(ApiError::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "principal {} may not {what}: it needs the admin right on every queue \
                         (an acl rule with queues = [\"*\"])",
                        grants.name()
                    ),
                ))
            }
        }
    }

    /// `POST /v1/auth/reload`.
    pub(super) async fn reload_auth(&self, call: &Call) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "reload the auth file")?;
        let coordinator = self.coordinator.clone();
        let outcome = tokio::task::spawn_blocking(move || coordinator.reload_auth())
            .await
            .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?;
        let reloaded = outcome.map_err(reload_error)?;
        Ok(json!({
            "auth_file": reloaded.path.display().to_string(),
            "generation": reloaded.generation,
            "principals": reloaded.principals,
            "rules": reloaded.rules,
        }))
    }

    /// `GET /v1/acl`, `GET /v1/acl?principal=P&queue=Q`.
    pub(super) fn acl(&self, call: &Call) -> Result<Value, ApiError> {
        Self::require_admin_everywhere(call, "read the ACL")?;
        let query = AclQuery::parse(call.query.as_deref())?;
        let current = self.coordinator.auth().current();
        let policy = &current.policy;
        if let (Some(principal), Some(queue)) = (query.principal, query.queue) {
            let operations = policy.rights_of(&principal, &queue).ok_or_else(|| {
                ApiError::invalid(format!("principal {principal} is not in the auth file"))
            })?;
            return Ok(json!({
                "principal": principal,
                "queue": queue,
                "operations": operations,
                "generation": current.generation,
            }));
        }
        let file = self.coordinator.auth().file.as_ref().map(|path| path.display().to_string());
        Ok(json!({
            "enabled": policy.is_enabled(),
            "auth_file": file,
            "generation": current.generation,
            "principals": policy.describe(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_query_takes_both_or_neither() {
        assert_eq!(AclQuery::parse(None).unwrap(), AclQuery::default());
        let both = AclQuery::parse(Some("principal=ops&queue=jobs")).unwrap();
        assert_eq!(both.principal.as_deref(), Some("ops"));
        assert_eq!(both.queue.as_deref(), Some("jobs"));
        assert!(AclQuery::parse(Some("principal=ops")).is_err());
        assert!(AclQuery::parse(Some("queue=")).is_err());
        assert!(AclQuery::parse(Some("secret=x")).is_err());
    }
}
