//! `spool quota list`: each principal's quotas and what it uses now, from
//! the broker's admin port (`GET /v1/quotas`, which needs `admin` on `*`
//! when authentication is on), through the CLI's admin-port client
//! (`http.rs`, as `spool acl`).

use std::time::Duration;

use serde_json::Value;
use spool_client::{Credentials, TlsConfig};

use crate::acl::{admin_call, AdminAddr};
use crate::render::{Output, Table};
use crate::Failure;

/// `spool quota list`.
pub async fn list(
    admin: &AdminAddr,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let value = admin_call(admin, tls, "GET", "/v1/quotas", credentials, timeout).await?;
    let mut table = Table::new(vec!["principal", "quota", "limit", "in_use", "rejections"]);
    let text = |value: &Value| match value {
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for principal in value["principals"].as_array().into_iter().flatten() {
        let name = principal["principal"].as_str().unwrap_or_default().to_owned();
        for quota in principal["quotas"].as_array().into_iter().flatten() {
            table.push(vec![
                name.clone(),
                quota["quota"].as_str().unwrap_or_default().to_owned(),
                text(&quota["limit"]),
                text(&quota["in_use"]),
                text(&quota["rejections"]),
            ]);
        }
    }
    Ok(Output::table(table, value))
}
