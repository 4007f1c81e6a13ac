//! Ordered mode's consumers: claims under consumer sessions
//! (`docs/design/sessions.md`), and connections dropped while holding
//! claims.
//!
//! Owns a consumer's *lives*: each life is a fresh [`Client`] whose
//! consumer opens a session on every shard connection before claiming
//! there (again whenever a kill replaced that connection), heartbeats them,
//! and claims and handles deliveries as the plain consumers do
//! ([`workers::claim_once`], [`workers::handle`]). After a random time the
//! life ends abruptly: handlers that are holding a delivery stop where they
//! are (no ack, no release), and the client, its connections and sessions
//! are dropped at once, so the broker ends the sessions with their
//! connections and releases what they held (`SESSION_ENDED`), for another
//! life or consumer to claim. The ledger checks the same contract plus the
//! key order across those releases.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{Client, ClientConfig, Session};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::rng::Rng;
use super::workers::{self, bump, Shared, RETRY_PAUSE};
use super::{now, KillLoopError};

/// A session's timeout: its claims are released this long after its last
/// heartbeat even if its connection stays open.
const SESSION_TIMEOUT_MS: u32 = 2_000;

/// Heartbeat period of a consumer's sessions.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);

/// Shortest life of a consumer's client before it is dropped.
const LIFE_MS_MIN: u64 = 300;

/// Longest life of a consumer's client before it is dropped.
const LIFE_MS_MAX: u64 = 2_000;

/// The open sessions of one consumer life, by shard address.
pub(super) struct Sessions {
    member: String,
    by_addr: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    fn new(member: String) -> Self {
        Self { member, by_addr: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        self.by_addr.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes sure the connection a claim via `via` goes on has a session of
    /// this consumer open, opening one if not (first use, or a kill
    /// replaced the connection). A session that cannot be opened (the
    /// broker is down) leaves the claim to its lease.
    pub(super) async fn ensure(&self, shared: &Shared, client: &Client, via: PartitionId) {
        let Ok(addr) = client.owner_address(&shared.queue, via).await else { return };
        let Ok(connection) = client.connection(&addr).await else { return };
        if self.lock().get(&addr).is_some_and(|session| session.is_on(&connection)) {
            return;
        }
        let opened =
            client.open_session(&shared.queue, via, None, &self.member, SESSION_TIMEOUT_MS).await;
        if let Ok(session) = opened {
            bump(&shared.counters.sessions_opened);
            self.lock().insert(addr, session);
        }
    }

    /// Heartbeats every open session each [`HEARTBEAT_EVERY`]; forgets one
    /// whose heartbeat fails (ended, or its connection closed), so the next
    /// claim there opens a new one.
    async fn heartbeat(&self) {
        loop {
            // Time under test: the heartbeat period.
            tokio::time::sleep(HEARTBEAT_EVERY).await;
            let open: Vec<(String, Session)> =
                self.lock().iter().map(|(addr, session)| (addr.clone(), session.clone())).collect();
            for (addr, session) in open {
                if session.heartbeat().await.is_err() {
                    let mut by_addr = self.lock();
                    if by_addr.get(&addr).is_some_and(|kept| kept.id() == session.id()) {
                        by_addr.remove(&addr);
                    }
                }
            }
        }
    }
}

/// One consumer of ordered mode: lives one after another until the stop.
///
/// # Errors
/// None today; the signature matches [`workers::producer`] so both are
/// joined alike.
pub(super) async fn consumer(
    shared: Arc<Shared>,
    bootstrap: String,
    client_config: ClientConfig,
    index: u32,
    mut rng: Rng,
) -> Result<(), KillLoopError> {
    let worker = WorkerId(0xC0_0000 + u64::from(index));
    let member = format!("killloop-{index}");
    while !shared.stopping() {
        let connected = {
            let _gate = shared.gate.read().await;
            Client::connect_with(&bootstrap, client_config.clone()).await
        };
        let Ok(client) = connected else {
            // A retry pause (the broker is usually down).
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        let life = Duration::from_millis(rng.range(LIFE_MS_MIN, LIFE_MS_MAX));
        live(&shared, client, worker, &member, &mut rng, life).await;
    }
    Ok(())
}

/// One life of a consumer (see the module doc): claims under sessions for
/// `life`, then drops everything while holding claims; or, at the stop,
/// finishes its handlers and drops the client.
async fn live(
    shared: &Arc<Shared>,
    client: Client,
    worker: WorkerId,
    member: &str,
    rng: &mut Rng,
    life: Duration,
) {
    let sessions = Arc::new(Sessions::new(member.to_owned()));
    let heartbeat = {
        let sessions = Arc::clone(&sessions);
        tokio::spawn(async move { sessions.heartbeat().await })
    };
    let (dead_sender, dead) = watch::channel(false);
    let born = now();
    let mut handlers = JoinSet::new();
    while !shared.stopping() {
        if born.elapsed() >= life {
            // Handlers in a hold stop at once and keep their deliveries.
            let _ = dead_sender.send(true);
            bump(&shared.counters.connections_dropped);
            break;
        }
        let claimed = workers::claim_once(
            shared,
            &client,
            worker,
            rng,
            &mut handlers,
            false,
            Some(&sessions),
        )
        .await;
        let Some((deliveries, token_instance)) = claimed else {
            bump(&shared.counters.claim_errors);
            // A retry pause (the broker is usually down).
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        for delivery in deliveries {
            let plan = workers::plan(rng, &shared.config);
            let (shared, client, dead) = (Arc::clone(shared), client.clone(), dead.clone());
            handlers.spawn(async move {
                let dead = Some(dead);
                workers::handle(&shared, &client, delivery, token_instance, plan, false, dead).await
            });
        }
    }
    // Requests in flight are answered and recorded; holds end at once.
    while handlers.join_next().await.is_some() {}
    heartbeat.abort();
    let _ = heartbeat.await;
    // The last handles on the connections: dropping them closes the sockets
    // and the broker ends the sessions, releasing what they hold.
    drop(sessions);
    drop(client);
    drop(dead_sender);
}
