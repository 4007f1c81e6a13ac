//! Commands served by the broker's admin port rather than its shard ports:
//! `spool auth reload` (`POST /v1/auth/reload`), `spool acl list` and
//! `spool acl check` (`GET /v1/acl`). They authenticate with a bearer token
//! from the same credentials as every command (`--principal`, `SPOOL_SECRET`)
//! and need the `admin` right on every queue. Nothing here prints a secret
//! or a hash: the broker never sends one.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use spool_client::limits::ADMIN_ADDR_DEFAULT;
use spool_client::{Credentials, TlsConfig};

use crate::http::{call, Answer};
use crate::render::{Output, Table};
use crate::{Failure, EXIT_REFUSED, EXIT_TRANSPORT};

/// Where the admin port is.
#[derive(Debug, Args)]
pub struct AdminAddr {
    /// The broker's admin port (its `admin_listen`).
    #[arg(long = "admin", value_name = "ADDR", default_value = ADMIN_ADDR_DEFAULT)]
    pub admin: String,
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// The compiled ACL rules the broker has in force, per principal.
    List(AdminAddr),
    /// The operations a principal may do on a queue, as the broker decides
    /// them (its own pattern matching).
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The queue.
    #[arg(long)]
    pub queue: String,
    /// The principal to check (default: the one this command authenticates
    /// as, `--principal`/`SPOOL_PRINCIPAL`).
    #[arg(long = "of", value_name = "PRINCIPAL")]
    pub of: Option<String>,
    #[command(flatten)]
    pub admin: AdminAddr,
}

/// A refusal or trouble on the admin port, as a command failure.
fn failed(answer: &Answer) -> Failure {
    let exit = if answer.status >= 500 { EXIT_TRANSPORT } else { EXIT_REFUSED };
    Failure::Admin(answer.refusal(), exit)
}

pub(crate) async fn admin_call(
    admin: &AdminAddr,
    tls: Option<&TlsConfig>,
    method: &str,
    path: &str,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Value, Failure> {
    admin_send(admin, tls, method, path, credentials, None, timeout).await
}

/// [`admin_call`] with a JSON `body`; a creation's 201 is a success too.
pub(crate) async fn admin_send(
    admin: &AdminAddr,
    tls: Option<&TlsConfig>,
    method: &str,
    path: &str,
    credentials: Option<&Credentials>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Value, Failure> {
    let answer = call(&admin.admin, tls, method, path, credentials, body, timeout)
        .await
        .map_err(|error| Failure::Admin(error, EXIT_TRANSPORT))?;
    if !matches!(answer.status, 200 | 201) {
        return Err(failed(&answer));
    }
    answer
        .json()
        .ok_or_else(|| Failure::Admin("the admin port sent no JSON".to_owned(), EXIT_TRANSPORT))
}

/// `spool auth reload`.
pub async fn reload(
    admin: &AdminAddr,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let body = admin_call(admin, tls, "POST", "/v1/auth/reload", credentials, timeout).await?;
    let message = format!(
        "auth file {} reloaded: generation {}, {} principals, {} rules",
        body["auth_file"].as_str().unwrap_or("?"),
        body["generation"],
        body["principals"],
        body["rules"]
    );
    Ok(Output::message(message, body))
}

/// `spool acl list` and `spool acl check`.
pub async fn run(
    command: &AclCommand,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    match command {
        AclCommand::List(admin) => {
            let body = admin_call(admin, tls, "GET", "/v1/acl", credentials, timeout).await?;
            Ok(render_list(&body))
        }
        AclCommand::Check(check) => {
            let principal = match (&check.of, credentials) {
                (Some(principal), _) => principal.clone(),
                (None, Some(credentials)) => credentials.principal.clone(),
                (None, None) => {
                    return Err(Failure::Input(
                        "which principal? --of NAME (or authenticate with --principal)".to_owned(),
                    ))
                }
            };
            let path = format!(
                "/v1/acl?principal={}&queue={}",
                query_escape(&principal),
                query_escape(&check.queue)
            );
            let body = admin_call(&check.admin, tls, "GET", &path, credentials, timeout).await?;
            let operations: Vec<&str> = body["operations"]
                .as_array()
                .map(|list| list.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let shown =
                if operations.is_empty() { "(none)".to_owned() } else { operations.join(", ") };
            let message = format!("principal {principal} on queue {}: {shown}", check.queue);
            Ok(Output::message(message, body))
        }
    }
}

/// Percent-escapes what a query value must not hold as is.
fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'@' | b'*' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// One row per compiled rule.
fn render_list(body: &Value) -> Output {
    let mut table = Table::new(vec!["principal", "queues", "operations"]);
    if let Some(principals) = body["principals"].as_array() {
        for principal in principals {
            let name = principal["name"].as_str().unwrap_or("?").to_owned();
            let rules = principal["rules"].as_array().cloned().unwrap_or_default();
            if rules.is_empty() {
                table.push(vec![name.clone(), "-".to_owned(), "(no rights)".to_owned()]);
            }
            for rule in rules {
                let operations: Vec<&str> = rule["operations"]
                    .as_array()
                    .map(|list| list.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                table.push(vec![
                    name.clone(),
                    rule["queues"].as_str().unwrap_or("?").to_owned(),
                    operations.join(","),
                ]);
            }
        }
    }
    if body["enabled"] == json!(false) {
        return Output::message(
            "authentication is off: every connection may do everything".to_owned(),
            body.clone(),
        );
    }
    Output::table(table, body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_shows_one_row_per_rule() {
        let body = json!({"enabled": true, "generation": 2, "principals": [
            {"name": "ops", "rules": [{"queues": "*", "operations": ["admin", "purge"]}]},
            {"name": "idle", "rules": []}
        ]});
        let shown = render_list(&body).render(false);
        assert!(shown.contains("ops"), "{shown}");
        assert!(shown.contains("admin,purge"), "{shown}");
        assert!(shown.contains("(no rights)"), "{shown}");
        assert_eq!(query_escape("a b&c"), "a%20b%26c");
    }
}
