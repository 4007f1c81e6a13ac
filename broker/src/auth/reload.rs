//! Reloading the auth file without a restart (SIGHUP, `POST
//! /v1/auth/reload`, `spool auth reload`).
//!
//! A reload reads and checks the file on the caller's thread (the signal
//! thread or the admin port's blocking pool, never a shard); a file that
//! does not load keeps the policy in force and the error names the file and
//! the problem. A good one is compiled once, numbered with the next policy
//! *generation* and handed to every shard by the coordinator over the
//! shards' channels (`ShardMessage::Policy`, the path assignment changes
//! take): each shard swaps its own copy, so nothing on the data path reads
//! shared mutable state. A session remembers the generation its rights
//! came from; its next request after a change looks the principal up again
//! (`server::auth`): new rights, or `UNAUTHENTICATED` and the connection
//! closed when the principal is gone or its secret hash changed.
//!
//! What this module holds is the process-wide side: the policy in force and
//! its generation (read by the admin port to check bearer tokens and list
//! the rules), each shard's applied generation, and the reload counts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use thiserror::Error;

use super::{AuthError, AuthPolicy};

/// A compiled policy and the generation it was loaded as (0: the one read
/// at start).
#[derive(Debug, Clone)]
pub struct CurrentPolicy {
    pub generation: u64,
    pub policy: AuthPolicy,
}

/// What a successful reload put in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub generation: u64,
    pub principals: usize,
    pub rules: usize,
    pub path: PathBuf,
}

/// Why a reload did not put a new policy in force (or not everywhere yet).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReloadError {
    #[error(
        "authentication is off (no auth_file at start): there is no file to reload; \
         restart with --auth-file to turn it on"
    )]
    Off,
    /// The file does not load; the policy in force is kept.
    #[error("{0}; the policy in force is kept")]
    Invalid(AuthError),
    #[error("the new policy was not handed to the shards: {0}")]
    Coordinator(String),
    /// Sent, but not every shard took it in time (they will, in order).
    #[error("generation {generation} was sent, but shards {shards:?} had not taken it within {timeout_ms} ms")]
    Timeout { generation: u64, shards: Vec<u16>, timeout_ms: u64 },
}

impl ReloadError {
    /// The `outcome` label of `spool_auth_reloads_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            ReloadError::Off | ReloadError::Invalid(_) => "invalid",
            ReloadError::Coordinator(_) | ReloadError::Timeout { .. } => "failed",
        }
    }
}

/// The `outcome` labels of `spool_auth_reloads_total`, in the order of
/// [`AuthState::reload_counts`].
pub const RELOAD_OUTCOMES: [&str; 3] = ["ok", "invalid", "failed"];

/// The process-wide authentication state (off the data path).
#[derive(Debug)]
pub struct AuthState {
    /// The auth file given at start (`None`: authentication off).
    pub file: Option<PathBuf>,
    current: RwLock<Arc<CurrentPolicy>>,
    /// The newest generation each shard applied, by shard index.
    pub applied: Vec<AtomicU64>,
    /// One reload at a time, so generations go out in order.
    pub reloading: Mutex<()>,
    reloads: [AtomicU64; 3],
    /// Bearer tokens the admin port refused for a lockout.
    http_lockouts: AtomicU64,
}

impl AuthState {
    /// The state at start: `policy` as generation 0, for `shards` shards.
    pub fn new(file: Option<PathBuf>, policy: AuthPolicy, shards: usize) -> AuthState {
        AuthState {
            file,
            current: RwLock::new(Arc::new(CurrentPolicy { generation: 0, policy })),
            applied: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            reloading: Mutex::new(()),
            reloads: [const { AtomicU64::new(0) }; 3],
            http_lockouts: AtomicU64::new(0),
        }
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<CurrentPolicy> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Puts `update` in force (for the admin port; shards get their own
    /// copy by message).
    pub fn set_current(&self, update: Arc<CurrentPolicy>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = update;
    }

    /// Counts a reload by its outcome label.
    pub fn count_reload(&self, outcome: &str) {
        if let Some(index) = RELOAD_OUTCOMES.iter().position(|label| *label == outcome) {
            self.reloads[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reloads so far, indexed like [`RELOAD_OUTCOMES`].
    pub fn reload_counts(&self) -> [u64; 3] {
        std::array::from_fn(|index| self.reloads[index].load(Ordering::Relaxed))
    }

    /// Counts a bearer token refused for a lockout.
    pub fn count_http_lockout(&self) {
        self.http_lockouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Bearer tokens refused for a lockout so far.
    pub fn http_lockouts(&self) -> u64 {
        self.http_lockouts.load(Ordering::Relaxed)
    }

    /// Shards that have not applied `generation` yet.
    pub fn behind(&self, generation: u64) -> Vec<u16> {
        self.applied
            .iter()
            .enumerate()
            .filter(|(_, applied)| applied.load(Ordering::Acquire) < generation)
            .filter_map(|(shard, _)| u16::try_from(shard).ok())
            .collect()
    }
}

/// Reads and compiles the auth file for a reload.
///
/// # Errors
/// [`ReloadError::Off`] without a file; [`ReloadError::Invalid`] naming
/// the file and the problem.
pub fn load(state: &AuthState) -> Result<AuthPolicy, ReloadError> {
    let path = state.file.as_deref().ok_or(ReloadError::Off)?;
    AuthPolicy::load(path).map_err(ReloadError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a reload that cannot load names the file and the problem and
    // says the policy in force is kept; without a file it says auth is off.
    #[test]
    fn a_bad_file_is_named_and_the_old_policy_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        std::fs::write(&path, "[[principals]]\nname = \"a\"\nsecret_hash = \"plain\"\n").unwrap();
        let state = AuthState::new(Some(path.clone()), AuthPolicy::off(), 2);
        let error = load(&state).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("auth.toml"), "{message}");
        assert!(message.contains("PHC"), "{message}");
        assert!(message.contains("kept"), "{message}");
        assert_eq!(error.outcome(), "invalid");
        let off = AuthState::new(None, AuthPolicy::off(), 1);
        assert!(matches!(load(&off), Err(ReloadError::Off)));
        state.count_reload(error.outcome());
        state.count_reload("ok");
        assert_eq!(state.reload_counts(), [1, 1, 0]);
        assert_eq!(state.behind(1), vec![0, 1]);
        state.applied[1].store(1, Ordering::Release);
        assert_eq!(state.behind(1), vec![0]);
    }
}
