//! Auth-file fixtures shared by the tests that turn authentication on:
//! principals with their secrets, the ACL rule and quota of each, the file
//! text the broker reads (`--auth-file`), and the `spool` CLI run as one of
//! them.
//!
//! The secrets are distinctive strings so a test can assert that none of
//! them ever reaches a broker's log.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use spool_client::{Client, ClientConfig, ClientError, ConnectionConfig, Credentials};

use crate::{spool_bin, Spoold};

/// A worker: the principal that enqueues and claims.
pub const WORKER: &str = "worker";
pub const WORKER_SECRET: &str = "w0rker-secret-never-logged";
/// An operator: administers, peeks, purges and redrives.
pub const OPS: &str = "ops";
pub const OPS_SECRET: &str = "0ps-secret-never-logged";
/// A read-only principal: describe only.
pub const VIEWER: &str = "viewer";
pub const VIEWER_SECRET: &str = "v1ewer-secret-never-logged";
/// A secret that belongs to nobody.
pub const WRONG_SECRET: &str = "wr0ng-secret-never-logged";

/// One principal of an auth file: its secret, its one ACL rule (no rule
/// when `operations` is empty) and its quota settings (`[principals.quota]`
/// keys and values; none when empty).
#[derive(Clone, Copy, Debug)]
pub struct Principal<'a> {
    pub name: &'a str,
    pub secret: &'a str,
    pub queues: &'a [&'a str],
    pub operations: &'a [&'a str],
    pub quota: &'a [(&'a str, u64)],
}

impl<'a> Principal<'a> {
    /// A principal with the ACL rule `operations` on `queues` and no quota.
    pub const fn new(
        name: &'a str,
        secret: &'a str,
        queues: &'a [&'a str],
        operations: &'a [&'a str],
    ) -> Self {
        Self { name, secret, queues, operations, quota: &[] }
    }

    /// The same principal with the quota settings `quota`.
    pub const fn with_quota(self, quota: &'a [(&'a str, u64)]) -> Self {
        Self { quota, ..self }
    }
}

/// The argon2 hash of `secret`, made once per secret and test process: a
/// rewritten file keeps the hashes it had (a changed hash ends the
/// principal's sessions on reload), and hashing is slow on purpose.
pub fn hash_of(secret: &str) -> String {
    static HASHES: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let mut hashes = HASHES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    hashes
        .entry(secret.to_owned())
        .or_insert_with(|| spool_client::auth::hash_secret(secret).expect("hash a secret"))
        .clone()
}

/// The auth file's text for `principals`; `rehash` names a principal whose
/// secret gets a fresh hash (same secret, new salt) instead of the cached
/// one.
pub fn auth_file_text(principals: &[Principal<'_>], rehash: Option<&str>) -> String {
    let mut text = String::new();
    for principal in principals {
        let hash = if rehash == Some(principal.name) {
            spool_client::auth::hash_secret(principal.secret).expect("hash a secret")
        } else {
            hash_of(principal.secret)
        };
        text.push_str(&format!(
            "[[principals]]\nname = \"{}\"\nsecret_hash = \"{hash}\"\n",
            principal.name
        ));
        if !principal.quota.is_empty() {
            text.push_str("[principals.quota]\n");
            for (key, value) in principal.quota {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        text.push('\n');
    }
    for principal in principals.iter().filter(|principal| !principal.operations.is_empty()) {
        text.push_str(&format!(
            "[[acl]]\nprincipal = \"{}\"\nqueues = {:?}\noperations = {:?}\n\n",
            principal.name, principal.queues, principal.operations
        ));
    }
    text
}

/// Writes the auth file of `principals` to `path`.
pub fn write_auth_file(path: &Path, principals: &[Principal<'_>]) {
    write_auth_file_rehashing(path, principals, None);
}

/// As [`write_auth_file`], with a fresh hash for principal `rehash`.
pub fn write_auth_file_rehashing(path: &Path, principals: &[Principal<'_>], rehash: Option<&str>) {
    std::fs::write(path, auth_file_text(principals, rehash)).expect("write the auth file");
}

/// Request timeout of [`client_as`]'s connections.
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A client of `broker` authenticated as `principal` with `secret`.
pub async fn client_as(
    broker: &Spoold,
    principal: &str,
    secret: &str,
) -> Result<Client, ClientError> {
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: CLIENT_REQUEST_TIMEOUT,
            ..ConnectionConfig::default()
        },
    }
    .with_credentials(Credentials::new(principal, secret));
    Client::connect_with(&broker.addr(), config).await
}

/// Runs the `spool` CLI against `broker` with `args`, as `principal`
/// (name by flag, secret by `SPOOL_SECRET`, the recommended way) or
/// anonymously; any credentials in the test's own environment are removed.
pub fn spool_as(broker: &Spoold, principal: Option<(&str, &str)>, args: &[&str]) -> Output {
    let mut command = Command::new(spool_bin());
    command.arg("--addr").arg(broker.addr()).args(args);
    command.env_remove("SPOOL_PRINCIPAL").env_remove("SPOOL_SECRET");
    if let Some((name, secret)) = principal {
        command.arg("--principal").arg(name).env("SPOOL_SECRET", secret);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command.output().expect("run spool")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the text puts each quota table right under its principal and
    // leaves out the ACL rule of a principal without operations, so the
    // broker reads what the test meant.
    #[test]
    fn text_places_quotas_under_their_principal_and_skips_empty_rules() {
        let principals = [
            Principal::new("a", "sa", &["*"], &["enqueue"])
                .with_quota(&[("enqueue_messages_per_sec", 1)]),
            Principal::new("b", "sb", &[], &[]),
        ];
        let text = auth_file_text(&principals, None);
        let a = text.find("name = \"a\"").unwrap();
        let quota = text.find("[principals.quota]\nenqueue_messages_per_sec = 1\n").unwrap();
        let b = text.find("name = \"b\"").unwrap();
        assert!(a < quota && quota < b, "{text}");
        assert_eq!(text.matches("[[acl]]").count(), 1, "{text}");
        assert!(text.contains("principal = \"a\"\nqueues = [\"*\"]\noperations = [\"enqueue\"]"));
    }
}
