//! The consumer's sessions (`docs/design/sessions.md`): one per shard
//! connection it claims from, opened before the first claim there and
//! again whenever that connection was replaced or the session ended,
//! heartbeating on the client's runtime, closed at shutdown. A broker that
//! predates sessions (`UNKNOWN_API`) is claimed from without one.
//!
//! It must never hold a claim back: a session that cannot be opened is
//! logged and the claim goes out with its lease alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use spool_wire::proto::PartitionId;
use spool_wire::ErrorCode;
use tokio::task::JoinHandle;

use super::Shared;
use crate::client::Session;

struct Kept {
    session: Session,
    /// The heartbeat task still finds the session open.
    alive: Arc<AtomicBool>,
    heartbeat: JoinHandle<()>,
}

/// The sessions of one consumer, by shard address.
#[derive(Default)]
pub(super) struct SessionKeeper {
    kept: tokio::sync::Mutex<HashMap<String, Kept>>,
    /// Some broker answered `UNKNOWN_API`: no more tries there.
    unsupported: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl SessionKeeper {
    /// Makes sure the connection that a claim via `partition` will use has
    /// an open session of this consumer (no-op without sessions).
    pub(super) async fn ensure(&self, shared: &Shared, partition: PartitionId) {
        let config = &shared.config;
        let Some(timeout_ms) = config.session_timeout_ms else { return };
        let client = &shared.client;
        let Ok(addr) = client.owner_address(&config.queue, partition).await else { return };
        if self.unsupported.lock().is_ok_and(|set| set.contains(&addr)) {
            return;
        }
        let Ok(connection) = client.connection(&addr).await else { return };
        let mut kept = self.kept.lock().await;
        if let Some(entry) = kept.get(&addr) {
            if entry.alive.load(Ordering::Acquire) && entry.session.is_on(&connection) {
                return;
            }
            entry.heartbeat.abort();
            kept.remove(&addr);
        }
        let member = config.member_id();
        let opened = client
            .open_session(
                &config.queue,
                partition,
                config.subscription.as_deref(),
                &member,
                timeout_ms,
            )
            .await;
        match opened {
            Ok(session) => {
                tracing::debug!(%addr, session = session.id(), epoch = session.epoch(), "session opened");
                let alive = Arc::new(AtomicBool::new(true));
                let heartbeat = tokio::spawn(heartbeat(
                    session.clone(),
                    Arc::clone(&alive),
                    config.heartbeat_every(),
                ));
                kept.insert(addr, Kept { session, alive, heartbeat });
            }
            Err(error)
                if matches!(
                    error.code(),
                    Some(ErrorCode::UnknownApi | ErrorCode::UnsupportedVersion)
                ) =>
            {
                tracing::warn!(%addr, "the broker predates sessions: claims live by their leases");
                if let Ok(mut set) = self.unsupported.lock() {
                    set.insert(addr);
                }
            }
            Err(error) => {
                tracing::warn!(%addr, %error, "session not opened: claims live by their leases");
            }
        }
    }

    /// Closes every session (shutdown: nothing is held any more).
    pub(super) async fn close_all(&self) {
        let kept = std::mem::take(&mut *self.kept.lock().await);
        for (addr, entry) in kept {
            entry.heartbeat.abort();
            if entry.alive.load(Ordering::Acquire) {
                if let Err(error) = entry.session.close().await {
                    tracing::debug!(%addr, %error, "session close failed");
                }
            }
        }
    }
}

/// Heartbeats `session` every `every` until it is refused (ended, fenced,
/// or its connection closed); then marks it dead so the next claim there
/// opens a new one.
async fn heartbeat(session: Session, alive: Arc<AtomicBool>, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(error) = session.heartbeat().await {
            if error.code() == Some(ErrorCode::SessionFenced) {
                tracing::warn!(
                    session = session.id(),
                    "session replaced by a newer one of its member"
                );
            } else {
                tracing::debug!(session = session.id(), %error, "session ended");
            }
            alive.store(false, Ordering::Release);
            return;
        }
    }
}
