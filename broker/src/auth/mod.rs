//! Authentication and authorization: who a connection acts as, and what
//! that principal may do to which queue.
//!
//! The policy comes from one TOML file (`auth_file`, see
//! `docs/operations.md`, "Authentication and ACLs"): principals, each with
//! an argon2 hash of its secret in PHC form (`spool auth hash-secret` makes
//! one), and ACL rules of principal × queues × operations. A broker with no
//! `auth_file` has authentication **off** (the embedded single-node
//! default; `spoold` says so loudly at start): every connection acts as
//! [`ANONYMOUS`] with every right.
//!
//! Queue patterns are an exact name, a prefix (`jobs*`) or `*` (every
//! queue). Rights only add up: a principal's rights on a queue are the
//! union of the operations of every rule whose pattern matches it. There is
//! no deny rule.
//!
//! This module is pure (no I/O but reading the file, no clock, no glommio):
//! the protocol glue lives in `server::auth` and the audit log in
//! [`audit`]. [`reload`]: the auth file read again without a restart;
//! [`limiter`]: failed logins per source address; [`describe`]: the
//! compiled rules as an operator sees them (never a hash).

pub mod audit;
pub mod describe;
pub mod limiter;
pub mod quota;
pub mod reload;
mod subscriptions;

pub use crate::limits::{ACL_RULES_MAX, PRINCIPALS_MAX, SALT_BYTES};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use serde::Deserialize;
use thiserror::Error;

/// The principal of every connection while authentication is off.
pub const ANONYMOUS: &str = "anonymous";

/// An operation an ACL grants. Extend, ack and release of a delivery come
/// with `claim` (on the token's queue); create, delete and configure with
/// `admin`; DeadLetters with `peek`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Enqueue,
    Claim,
    Peek,
    Describe,
    Admin,
    Purge,
    Redrive,
}

impl Operation {
    /// Every operation, in the order of [`Operation::index`].
    pub const ALL: [Operation; 7] = [
        Operation::Enqueue,
        Operation::Claim,
        Operation::Peek,
        Operation::Describe,
        Operation::Admin,
        Operation::Purge,
        Operation::Redrive,
    ];

    /// Position in [`Operation::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// This operation's bit in a rights mask.
    pub const fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The name used in auth files, metrics labels and the audit log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Enqueue => "enqueue",
            Operation::Claim => "claim",
            Operation::Peek => "peek",
            Operation::Describe => "describe",
            Operation::Admin => "admin",
            Operation::Purge => "purge",
            Operation::Redrive => "redrive",
        }
    }
}

/// Every right.
pub const ALL_RIGHTS: u8 = (1 << Operation::ALL.len()) - 1;

/// What is wrong with an auth file or a secret.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("cannot read auth file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("auth file {path} is not valid: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("auth file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("secret could not be hashed: {0}")]
    Hash(String),
}

/// The auth file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    principals: Vec<PrincipalEntry>,
    #[serde(default)]
    acl: Vec<AclEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    /// argon2 PHC string (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`).
    secret_hash: String,
    /// `[principals.quota]`: this principal's quotas (absent: unlimited).
    #[serde(default)]
    quota: Option<quota::QuotaConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclEntry {
    principal: String,
    queues: Vec<String>,
    operations: Vec<Operation>,
}

/// Which queues a rule covers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum QueuePattern {
    /// `*`: every queue.
    Any,
    /// `jobs*`: every queue whose name starts with `jobs`.
    Prefix(String),
    /// One queue by its exact name.
    Exact(String),
}

impl QueuePattern {
    fn parse(text: &str) -> Result<Self, String> {
        let (name, prefix) = match text.strip_suffix('*') {
            Some("") => return Ok(QueuePattern::Any),
            Some(stem) => (stem, true),
            None => (text, false),
        };
        spool_wire::proto::validate_queue_name(name)
            .map_err(|error| format!("queue pattern {text:?}: {error}"))?;
        Ok(if prefix {
            QueuePattern::Prefix(name.to_owned())
        } else {
            QueuePattern::Exact(name.to_owned())
        })
    }

    fn matches(&self, queue: &str) -> bool {
        match self {
            QueuePattern::Any => true,
            QueuePattern::Prefix(stem) => queue.starts_with(stem.as_str()),
            QueuePattern::Exact(name) => queue == name,
        }
    }
}

/// One principal's rules, compiled: patterns with their rights masks.
#[derive(Debug, PartialEq, Eq)]
pub struct Grants {
    name: String,
    rules: Vec<(QueuePattern, u8)>,
    /// Rules naming subscriptions (`queue/sub`, claim only): checked only
    /// when the queue-wide rights fall short ([`Grants::allows_in`]).
    sub_rules: Vec<subscriptions::SubscriptionRule>,
    /// Rights on every queue (from `*` rules): answered without a scan.
    everywhere: u8,
    /// The principal's quotas (unlimited when the file sets none).
    quota: quota::QuotaConfig,
    /// The stable id its enqueued records are attributed to
    /// (`queue::stored`); `UNKNOWN` with authentication off.
    id: crate::queue::stored::PrincipalId,
}

impl Grants {
    /// Every right on every queue (authentication off).
    pub fn everything(name: &str) -> Grants {
        Grants {
            name: name.to_owned(),
            rules: Vec::new(),
            sub_rules: Vec::new(),
            everywhere: ALL_RIGHTS,
            quota: quota::QuotaConfig::default(),
            id: crate::queue::stored::PrincipalId::UNKNOWN,
        }
    }

    /// The id the principal's enqueued records are attributed to (stored
    /// quotas): [`PrincipalId::UNKNOWN`](crate::queue::stored::PrincipalId)
    /// for every connection while authentication is off.
    pub fn principal_id(&self) -> crate::queue::stored::PrincipalId {
        self.id
    }

    /// The principal's quotas.
    pub fn quota(&self) -> &quota::QuotaConfig {
        &self.quota
    }

    /// The principal's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rights mask on `queue`: the union of every matching rule.
    pub fn mask(&self, queue: &str) -> u8 {
        self.rules
            .iter()
            .filter(|(pattern, _)| pattern.matches(queue))
            .fold(self.everywhere, |mask, (_, rights)| mask | rights)
    }

    /// Whether the principal may do `operation` on `queue`.
    pub fn allows(&self, queue: &str, operation: Operation) -> bool {
        self.mask(queue) & operation.bit() != 0
    }

    /// Whether the principal has any right on any queue (who may list).
    pub fn any(&self) -> bool {
        self.everywhere != 0 || self.rules.iter().any(|(_, rights)| *rights != 0)
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Principal {
    /// argon2 PHC string, checked to parse when the file was loaded.
    secret_hash: String,
    grants: Arc<Grants>,
}

#[derive(Debug, PartialEq, Eq)]
struct Policy {
    source: PathBuf,
    principals: BTreeMap<String, Principal>,
}

/// The broker's authentication policy: off, or the principals and rules of
/// one auth file. Cheap to clone (shared, read-only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthPolicy {
    policy: Option<Arc<Policy>>,
}

impl AuthPolicy {
    /// Authentication off.
    pub fn off() -> AuthPolicy {
        AuthPolicy { policy: None }
    }

    /// Reads and checks the auth file at `path`.
    ///
    /// # Errors
    /// The file cannot be read or parsed, a hash is not an argon2 PHC
    /// string, a name or pattern is invalid, a rule names an unknown
    /// principal, a principal is listed twice, or a bound is passed.
    pub fn load(path: &Path) -> Result<AuthPolicy, AuthError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| AuthError::Read { path: path.to_owned(), source })?;
        Self::from_toml(&text, path)
    }

    /// Parses an auth file's text; `path` only names it in errors.
    ///
    /// # Errors
    /// As [`AuthPolicy::load`].
    pub fn from_toml(text: &str, path: &Path) -> Result<AuthPolicy, AuthError> {
        let file: AuthFile = toml::from_str(text).map_err(|source| AuthError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let invalid = |reason: String| AuthError::Invalid { path: path.to_owned(), reason };
        if file.principals.is_empty() {
            return Err(invalid(
                "no [[principals]]: an auth file turns authentication on, \
                                so it must name at least one principal"
                    .to_owned(),
            ));
        }
        if file.principals.len() > PRINCIPALS_MAX {
            return Err(invalid(format!("more than {PRINCIPALS_MAX} principals")));
        }
        if file.acl.len() > ACL_RULES_MAX {
            return Err(invalid(format!("more than {ACL_RULES_MAX} [[acl]] rules")));
        }
        let mut rules: BTreeMap<String, Vec<(QueuePattern, u8)>> = BTreeMap::new();
        let mut sub_rules: BTreeMap<String, Vec<subscriptions::SubscriptionRule>> = BTreeMap::new();
        let mut hashes: BTreeMap<String, String> = BTreeMap::new();
        let mut quotas: BTreeMap<String, quota::QuotaConfig> = BTreeMap::new();
        for entry in &file.principals {
            spool_wire::proto::validate_principal(&entry.name)
                .map_err(|error| invalid(format!("principal {:?}: {error}", entry.name)))?;
            PasswordHash::new(&entry.secret_hash).map_err(|error| {
                // The hash is not secret, but say only what is wrong with it.
                invalid(format!(
                    "principal {}: secret_hash is not an argon2 PHC string ({error}); \
                     make one with `spool auth hash-secret`",
                    entry.name
                ))
            })?;
            if hashes.insert(entry.name.clone(), entry.secret_hash.clone()).is_some() {
                return Err(invalid(format!("principal {} is listed twice", entry.name)));
            }
            if let Some(config) = entry.quota {
                config
                    .validate()
                    .map_err(|reason| invalid(format!("principal {}: {reason}", entry.name)))?;
                quotas.insert(entry.name.clone(), config);
            }
            rules.insert(entry.name.clone(), Vec::new());
        }
        for (index, rule) in file.acl.iter().enumerate() {
            let Some(list) = rules.get_mut(&rule.principal) else {
                return Err(invalid(format!(
                    "acl rule {index} names principal {:?}, which is not in [[principals]]",
                    rule.principal
                )));
            };
            let mask = rule.operations.iter().fold(0u8, |mask, operation| mask | operation.bit());
            for queue in &rule.queues {
                if let Some(parsed) = subscriptions::SubscriptionRule::parse(queue, mask) {
                    let parsed =
                        parsed.map_err(|reason| invalid(format!("acl rule {index}: {reason}")))?;
                    sub_rules.entry(rule.principal.clone()).or_default().push(parsed);
                    continue;
                }
                let pattern = QueuePattern::parse(queue)
                    .map_err(|reason| invalid(format!("acl rule {index}: {reason}")))?;
                list.push((pattern, mask));
            }
        }
        let principals = rules
            .into_iter()
            .map(|(name, list)| {
                let everywhere = list
                    .iter()
                    .filter(|(pattern, _)| *pattern == QueuePattern::Any)
                    .fold(0u8, |mask, (_, rights)| mask | rights);
                let rules = list.into_iter().filter(|(pattern, _)| *pattern != QueuePattern::Any);
                let quota = quotas.get(&name).copied().unwrap_or_default();
                let grants = Arc::new(Grants {
                    id: crate::queue::stored::principal_id(&name),
                    name: name.clone(),
                    rules: rules.collect(),
                    sub_rules: sub_rules.remove(&name).unwrap_or_default(),
                    everywhere,
                    quota,
                });
                let secret_hash = hashes.remove(&name).unwrap_or_default();
                (name, Principal { secret_hash, grants })
            })
            .collect();
        Ok(AuthPolicy { policy: Some(Arc::new(Policy { source: path.to_owned(), principals })) })
    }

    /// Whether connections must authenticate.
    pub fn is_enabled(&self) -> bool {
        self.policy.is_some()
    }

    /// How many principals the policy names (0 when off).
    pub fn principal_count(&self) -> usize {
        self.policy.as_ref().map_or(0, |policy| policy.principals.len())
    }

    /// The file the policy came from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.policy.as_ref().map(|policy| policy.source.as_path())
    }

    /// A stored hash to verify a secret against when the principal is
    /// unknown, so that refusal costs as long as a wrong secret does.
    pub fn decoy_hash(&self) -> Option<&str> {
        let policy = self.policy.as_ref()?;
        policy.principals.values().next().map(|principal| principal.secret_hash.as_str())
    }

    /// Every principal with at least one quota, by name, and its quotas.
    pub fn quotas(&self) -> Vec<(String, quota::QuotaConfig)> {
        let Some(policy) = self.policy.as_ref() else { return Vec::new() };
        policy
            .principals
            .iter()
            .filter(|(_, principal)| !principal.grants.quota.is_unlimited())
            .map(|(name, principal)| (name.clone(), principal.grants.quota))
            .collect()
    }

    /// The stored hash and the grants of `name`, if the policy names it.
    pub fn principal(&self, name: &str) -> Option<(&str, Arc<Grants>)> {
        let principal = self.policy.as_ref()?.principals.get(name)?;
        Some((principal.secret_hash.as_str(), principal.grants.clone()))
    }
}

/// Whether `secret` matches the argon2 PHC string `secret_hash`. Costs one
/// argon2 computation with the hash's own parameters (tens of
/// milliseconds at the defaults): run it off the shard's executor.
pub fn verify_secret(secret_hash: &str, secret: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(secret_hash) else { return false };
    Argon2::default().verify_password(secret.as_bytes(), &parsed).is_ok()
}

/// An argon2id PHC string for `secret`, with a fresh random salt and the
/// crate's default parameters.
///
/// # Errors
/// [`AuthError::Hash`] if argon2 refuses the input.
pub fn hash_secret(secret: &str) -> Result<String, AuthError> {
    let salt_bytes: [u8; SALT_BYTES] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| AuthError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|error| AuthError::Hash(error.to_string()))
}

thread_local! {
    /// Requests this executor refused for lack of a right, per operation.
    static DENIALS: [Cell<u64>; 7] = const { [const { Cell::new(0) }; 7] };
}

/// Counts one refusal of `operation` on this executor.
pub fn count_denial(operation: Operation) {
    DENIALS.with(|denials| {
        let cell = &denials[operation.index()];
        cell.set(cell.get() + 1);
    });
}

/// This executor's refusals so far, indexed like [`Operation::ALL`].
pub fn denials() -> [u64; 7] {
    DENIALS.with(|denials| std::array::from_fn(|index| denials[index].get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<AuthPolicy, AuthError> {
        AuthPolicy::from_toml(text, Path::new("auth.toml"))
    }

    // Goal: the rules compile to the documented meaning: exact names,
    // prefixes and `*`, rights that add up, nothing granted by default.
    // Method: a small file and every (queue, operation) asked.
    #[test]
    fn rules_grant_exactly_what_they_name() {
        let hash = hash_secret("s3cret").unwrap();
        let text = format!(
            r#"
            [[principals]]
            name = "worker"
            secret_hash = "{hash}"
            [[principals]]
            name = "ops"
            secret_hash = "{hash}"
            [[acl]]
            principal = "worker"
            queues = ["jobs", "mail*"]
            operations = ["claim", "describe"]
            [[acl]]
            principal = "worker"
            queues = ["jobs"]
            operations = ["enqueue"]
            [[acl]]
            principal = "ops"
            queues = ["*"]
            operations = ["purge", "redrive", "admin", "describe", "peek"]
            "#
        );
        let policy = policy(&text).unwrap();
        assert!(policy.is_enabled());
        assert_eq!(policy.principal_count(), 2);
        let (_, worker) = policy.principal("worker").unwrap();
        assert!(worker.allows("jobs", Operation::Claim));
        assert!(worker.allows("jobs", Operation::Enqueue));
        assert!(worker.allows("mail-out", Operation::Claim));
        assert!(!worker.allows("mail-out", Operation::Enqueue));
        assert!(!worker.allows("jobs2", Operation::Claim), "exact means exact");
        assert!(!worker.allows("jobs", Operation::Purge), "a worker may not purge");
        assert!(!worker.allows("other", Operation::Describe));
        let (_, ops) = policy.principal("ops").unwrap();
        for queue in ["jobs", "anything"] {
            assert!(ops.allows(queue, Operation::Purge));
            assert!(!ops.allows(queue, Operation::Enqueue));
            assert!(!ops.allows(queue, Operation::Claim));
        }
        assert!(policy.principal("nobody").is_none());
        assert_eq!(Grants::everything(ANONYMOUS).mask("q"), ALL_RIGHTS);
    }

    // Goal: a bad file is refused with a reason, never half-loaded.
    // Method: one broken file per rule.
    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let hash = hash_secret("x").unwrap();
        let cases = [
            (String::new(), "no [[principals]]"),
            ("[[principals]]\nname = \"a\"\nsecret_hash = \"plain\"\n".to_owned(), "PHC"),
            (format!("[[principals]]\nname = \"a b\"\nsecret_hash = \"{hash}\"\n"), "principal"),
            (
                format!(
                    "[[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n\
                     [[acl]]\nprincipal = \"b\"\nqueues = [\"q\"]\noperations = [\"claim\"]\n"
                ),
                "not in [[principals]]",
            ),
            (
                format!(
                    "[[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n\
                     [[acl]]\nprincipal = \"a\"\nqueues = [\"q\"]\noperations = [\"fly\"]\n"
                ),
                "fly",
            ),
            (
                format!(
                    "[[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n\
                     [[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n"
                ),
                "twice",
            ),
        ];
        for (text, expected) in cases {
            let error = policy(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected:?} not in {error:?}");
        }
    }

    // Goal: `[principals.quota]` tables load onto their principal, absent
    // figures are unlimited, and a figure out of range or unknown is
    // refused naming it.
    #[test]
    fn quotas_load_per_principal_and_are_checked() {
        let hash = hash_secret("x").unwrap();
        let text = format!(
            "[[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n\
             [principals.quota]\nenqueue_messages_per_sec = 10\nclaims_in_flight_max = 4\n\
             [[principals]]\nname = \"b\"\nsecret_hash = \"{hash}\"\n"
        );
        let loaded = policy(&text).unwrap();
        let (_, a) = loaded.principal("a").unwrap();
        assert_eq!(a.quota().enqueue_messages_per_sec, Some(10));
        assert_eq!(a.quota().enqueue_bytes_per_sec, None);
        assert_eq!(a.quota().claims_in_flight_max, Some(4));
        let (_, b) = loaded.principal("b").unwrap();
        assert!(b.quota().is_unlimited());
        assert_ne!(a.principal_id(), b.principal_id());
        assert_eq!(a.principal_id(), crate::queue::stored::principal_id("a"));
        let stored = format!(
            "[[principals]]\nname = \"s\"\nsecret_hash = \"{hash}\"\n\
             [principals.quota]\nstored_messages_max = 5\nstored_bytes_max = 4096\n"
        );
        let stored = policy(&stored).unwrap();
        let (_, s) = stored.principal("s").unwrap();
        assert_eq!(
            (s.quota().stored_messages_max, s.quota().stored_bytes_max),
            (Some(5), Some(4096))
        );
        let listed: Vec<String> = loaded.quotas().into_iter().map(|(name, _)| name).collect();
        assert_eq!(listed, vec!["a".to_owned()]);
        for (bad, expected) in [
            ("enqueue_bytes_per_sec = 0", "enqueue_bytes_per_sec"),
            ("claims_in_flight_max = 99999999999", "claims_in_flight_max"),
            ("stored_bytes_max = 0", "stored_bytes_max"),
            ("stored_messages_max = 1099511627777", "stored_messages_max"),
            ("stored_records_max = 1", "stored_records_max"),
        ] {
            let text = format!(
                "[[principals]]\nname = \"a\"\nsecret_hash = \"{hash}\"\n\
                 [principals.quota]\n{bad}\n"
            );
            let error = policy(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected:?} not in {error:?}");
        }
    }

    // Goal: hashes verify their own secret only, and never contain it.
    #[test]
    fn hashes_verify_their_secret_only() {
        let hash = hash_secret("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(!hash.contains("correct horse"));
        assert!(verify_secret(&hash, "correct horse"));
        assert!(!verify_secret(&hash, "correct horsf"));
        assert!(!verify_secret("not a hash", "correct horse"));
        assert_ne!(hash, hash_secret("correct horse").unwrap(), "fresh salt per hash");
    }

    #[test]
    fn denials_count_per_operation() {
        let before = denials();
        count_denial(Operation::Purge);
        count_denial(Operation::Purge);
        let after = denials();
        assert_eq!(after[Operation::Purge.index()], before[Operation::Purge.index()] + 2);
        assert_eq!(after[Operation::Claim.index()], before[Operation::Claim.index()]);
    }
}
