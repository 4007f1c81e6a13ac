//! Auth-file reload on the coordinator: read and compile the file on the
//! caller's thread, hand the policy to every shard through the control
//! executor (`CoordinatorCommand::Policy` → `ShardMessage::Policy`, the path of
//! assignment changes), and wait until each shard has taken it. See
//! `auth::reload` for what a shard and its sessions do with it.

use std::sync::mpsc;
use std::sync::{Arc, PoisonError};

use crate::auth::reload::{self, AuthState, CurrentPolicy, ReloadError, Reloaded};
use crate::limits::{AUTH_RELOAD_TIMEOUT, COORDINATOR_POLL_INTERVAL};
use crate::shard::{CoordinatorCommand, CoordinatorHandle};

impl CoordinatorHandle {
    /// The process-wide authentication state: the policy in force, the
    /// reload counts.
    pub fn auth(&self) -> &AuthState {
        &self.shared.auth
    }

    /// Reads the auth file again and puts it in force on every shard.
    /// Blocks (reads a file, waits up to [`AUTH_RELOAD_TIMEOUT`]): not for
    /// executors. Logged and counted (`spool_auth_reloads_total`) either
    /// way.
    ///
    /// # Errors
    /// [`ReloadError`]: authentication off, a file that does not load (the
    /// policy in force is kept), the coordinator stopped or busy, or
    /// shards that did not take it in time.
    pub fn reload_auth(&self) -> Result<Reloaded, ReloadError> {
        let outcome = self.reload_auth_now();
        let auth = &self.shared.auth;
        match &outcome {
            Ok(reloaded) => {
                auth.count_reload("ok");
                tracing::info!(
                    auth_file = %reloaded.path.display(),
                    generation = reloaded.generation,
                    principals = reloaded.principals,
                    rules = reloaded.rules,
                    "auth file reloaded: every shard applies the new policy"
                );
            }
            Err(error) => {
                auth.count_reload(error.outcome());
                tracing::error!(%error, "auth file reload refused");
            }
        }
        outcome
    }

    fn reload_auth_now(&self) -> Result<Reloaded, ReloadError> {
        let auth = &self.shared.auth;
        let _one_at_a_time = auth.reloading.lock().unwrap_or_else(PoisonError::into_inner);
        let policy = reload::load(auth)?;
        let path = auth.file.clone().unwrap_or_default();
        let generation = auth.current().generation + 1;
        let update = Arc::new(CurrentPolicy { generation, policy });
        let (reply, answer) = mpsc::sync_channel(1);
        let command = CoordinatorCommand::Policy { update: update.clone(), reply };
        match self.commands.try_send(command) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                return Err(ReloadError::Coordinator("the coordinator is busy; retry".to_owned()))
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                return Err(ReloadError::Coordinator("the broker is stopping".to_owned()))
            }
        }
        match answer.recv_timeout(AUTH_RELOAD_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => return Err(ReloadError::Coordinator(reason)),
            Err(_) => {
                return Err(ReloadError::Coordinator(
                    "no answer from the coordinator in time".to_owned(),
                ))
            }
        }
        // Every shard has it in its channel, in order: it is the policy now.
        auth.set_current(update.clone());
        let interval_ms = COORDINATOR_POLL_INTERVAL.as_millis().max(1);
        let polls = AUTH_RELOAD_TIMEOUT.as_millis() / interval_ms;
        for _ in 0..polls {
            if auth.behind(generation).is_empty() {
                break;
            }
            std::thread::sleep(COORDINATOR_POLL_INTERVAL);
        }
        let behind = auth.behind(generation);
        if !behind.is_empty() {
            return Err(ReloadError::Timeout {
                generation,
                shards: behind,
                timeout_ms: u64::try_from(AUTH_RELOAD_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
            });
        }
        Ok(Reloaded {
            generation,
            principals: update.policy.principal_count(),
            rules: update.policy.rule_count(),
            path,
        })
    }
}
