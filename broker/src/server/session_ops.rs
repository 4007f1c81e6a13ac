//! Consumer sessions on a shard's port (`docs/design/sessions.md`): the
//! Session request (open, heartbeat, close), a claim's bound and record in
//! its connection's session, and the end of a session — its connection
//! ended (one watcher task per connection with a session), its heartbeat
//! timed out (the shard's sweep task, every `SESSION_SWEEP_INTERVAL`
//! while any session is open), closed, or replaced — each releasing what
//! it held through the partitions' ordinary release with
//! `ReleaseReason::SESSION_ENDED`, now, on this shard alone.

use std::rc::Rc;

use spool_wire::proto::{self, ErrorResponse, Response, SessionRequest, SessionResponse};
use spool_wire::ErrorCode;

use super::handler::{error, Answer, SpoolHandler, DEAD_LETTER_SUFFIX};
use super::limits::SESSION_SWEEP_INTERVAL;
use super::quota::ShardQuotas;
use super::sessions::{Ended, SessionError, Sessions};
use super::ShardState;
use crate::control::assignment::QueueName;
use crate::net::connection::Connection;
use crate::queue::{QueueId, ReleaseReason, SubscriptionId};

fn session_error(failure: &SessionError) -> ErrorResponse {
    error(failure.code(), failure.to_string())
}

impl SpoolHandler {
    /// Answers a Session request on `connection`.
    pub(super) fn session(
        &self,
        request: &SessionRequest<'_>,
        connection: &Rc<Connection>,
    ) -> Answer {
        let now = (self.state.clock)();
        let answer = |opened: super::sessions::Opened| {
            Response::Session(SessionResponse {
                session_id: opened.session,
                epoch: opened.epoch,
                timeout_ms: u32::try_from(opened.timeout_ms).unwrap_or(u32::MAX),
            })
        };
        match *request {
            SessionRequest::Open { queue, subscription, member, timeout_ms } => {
                let queue = match queue.strip_suffix(DEAD_LETTER_SUFFIX) {
                    Some(base) if !self.queue_exists(queue) && self.queue_exists(base) => base,
                    _ => queue,
                };
                let queue_id = self.queue_id(queue)?;
                let sub = self.subscription_of(queue, subscription)?;
                let opened = self.sessions.table.borrow_mut().open(
                    now,
                    connection.id(),
                    queue_id,
                    sub,
                    member,
                    u64::from(timeout_ms),
                );
                let (opened, ended) = opened.map_err(|failure| session_error(&failure))?;
                self.release_ended(ended);
                self.watch(connection);
                self.sweep();
                Ok(answer(opened))
            }
            SessionRequest::Heartbeat { session_id } => {
                let mut table = self.sessions.table.borrow_mut();
                let opened = table.heartbeat(now, connection.id(), session_id);
                opened.map(answer).map_err(|failure| session_error(&failure))
            }
            SessionRequest::Close { session_id } => {
                let closed = self.sessions.table.borrow_mut().close(connection.id(), session_id);
                let (opened, ended) = closed.map_err(|failure| session_error(&failure))?;
                self.release_ended(vec![ended]);
                Ok(answer(opened))
            }
        }
    }

    fn queue_id(&self, queue: &str) -> Result<QueueId, ErrorResponse> {
        let name = QueueName::new(queue)
            .map_err(|failure| error(ErrorCode::InvalidArgument, failure.to_string()))?;
        let table = self.state.table.borrow();
        table
            .queue(&name)
            .map(|entry| entry.id)
            .ok_or_else(|| error(ErrorCode::QueueNotFound, format!("queue {queue} does not exist")))
    }

    /// The credits a claim on `connection` in `queue`/`sub` may ask for:
    /// `credits` without a session there, at most the room its session
    /// has left with one (`Some`: the claim is in a session).
    ///
    /// # Errors
    /// `THROTTLED` when the session holds its most claims.
    pub(super) fn session_credits(
        &self,
        connection: &Connection,
        queue: &str,
        sub: SubscriptionId,
        credits: u32,
    ) -> Result<(u32, bool), ErrorResponse> {
        if self.sessions.table.borrow().open_count() == 0 {
            return Ok((credits, false));
        }
        let Ok(queue_id) = self.queue_id(queue) else { return Ok((credits, false)) };
        let now = (self.state.clock)();
        let room = self.sessions.table.borrow_mut().room(now, connection.id(), queue_id, sub);
        match room.map_err(|failure| session_error(&failure))? {
            None => Ok((credits, false)),
            Some(room) => Ok((credits.min(u32::try_from(room).unwrap_or(u32::MAX)), true)),
        }
    }

    /// Records the claims a claim in a session made; a claim whose session
    /// ended while it ran (its connection ended, or it was closed) is
    /// released at once instead, as the session's would have been.
    pub(super) fn session_claimed(
        &self,
        connection: &Connection,
        in_session: bool,
        claimed: &[crate::partition::Claimed],
    ) {
        if !in_session || claimed.is_empty() {
            return;
        }
        let mut orphans = Vec::new();
        {
            let mut table = self.sessions.table.borrow_mut();
            for item in claimed {
                let token = &item.delivery.token;
                if !table.record(connection.id(), token, item.delivery.deadline_ms) {
                    orphans.push(*token);
                }
            }
        }
        if !orphans.is_empty() {
            let session_gone = connection.has_ended()
                || orphans.iter().all(|token| {
                    let claim = token.claim();
                    let now = (self.state.clock)();
                    let room = self.sessions.table.borrow_mut().room(
                        now,
                        connection.id(),
                        claim.queue,
                        claim.sub,
                    );
                    matches!(room, Ok(None))
                });
            if session_gone {
                self.release_ended(vec![Ended {
                    session: 0,
                    cause: super::sessions::EndCause::Connection,
                    tokens: orphans,
                }]);
            }
        }
    }

    /// Ends every session of `connection` when it ends (one watcher per
    /// connection).
    fn watch(&self, connection: &Rc<Connection>) {
        if !self.sessions.watched.borrow_mut().insert(connection.id()) {
            return;
        }
        let connection = connection.clone();
        let sessions = self.sessions.clone();
        let (state, quotas) = (self.state.clone(), self.quotas.clone());
        glommio::spawn_local(async move {
            connection.ended().await;
            sessions.watched.borrow_mut().remove(&connection.id());
            let ended = sessions.table.borrow_mut().connection_ended(connection.id());
            drop(connection);
            release(state, quotas, sessions, ended).await;
        })
        .detach();
    }

    /// Starts the shard's sweep for sessions past their timeout, unless it
    /// runs; it stops when no session is open.
    fn sweep(&self) {
        if self.sessions.sweeping.replace(true) {
            return;
        }
        let sessions = self.sessions.clone();
        let (state, quotas) = (self.state.clone(), self.quotas.clone());
        glommio::spawn_local(async move {
            loop {
                glommio::timer::Timer::new(SESSION_SWEEP_INTERVAL).await;
                let now = (state.clock)();
                let ended = sessions.table.borrow_mut().expire(now);
                if !ended.is_empty() {
                    let (state, quotas, sessions) =
                        (state.clone(), quotas.clone(), sessions.clone());
                    glommio::spawn_local(release(state, quotas, sessions, ended)).detach();
                }
                if sessions.table.borrow().open_count() == 0 {
                    sessions.sweeping.set(false);
                    break;
                }
            }
        })
        .detach();
    }

    fn release_ended(&self, ended: Vec<Ended>) {
        if ended.iter().all(|end| end.tokens.is_empty()) {
            return;
        }
        let (state, quotas, sessions) =
            (self.state.clone(), self.quotas.clone(), self.sessions.clone());
        glommio::spawn_local(release(state, quotas, sessions, ended)).detach();
    }
}

/// Releases the claims of ended sessions, now, with
/// [`ReleaseReason::SESSION_ENDED`]: each through its partition's ordinary
/// release (a logged `Released`, or `Quarantined` at the delivery limit).
/// A claim acked, released or expired meanwhile is refused stale and
/// skipped.
async fn release(
    state: Rc<ShardState>,
    quotas: Rc<ShardQuotas>,
    sessions: Rc<Sessions>,
    ended: Vec<Ended>,
) {
    for end in ended {
        let mut released = 0u64;
        for token in &end.tokens {
            let claim = token.claim();
            let Some(served) = state.served_by_id(claim.queue, claim.partition) else {
                continue;
            };
            let now = (state.clock)();
            match served.partition.release(token, ReleaseReason::SESSION_ENDED, Some(now)).await {
                Ok(_) => {
                    released += 1;
                    quotas.forget(&token.to_bytes());
                }
                Err(failure) if failure.code() == ErrorCode::StaleToken => {
                    quotas.forget(&token.to_bytes());
                }
                Err(failure) => {
                    tracing::debug!(session = end.session, %failure, "session release refused");
                }
            }
        }
        tracing::debug!(
            session = end.session,
            cause = end.cause.label(),
            released,
            "session ended"
        );
        sessions.table.borrow_mut().count_released(released);
    }
}

/// The claim `claim` clamped to `credits` (a session's room).
pub(super) fn with_credits<'a>(
    claim: &proto::ClaimRequest<'a>,
    credits: u32,
) -> proto::ClaimRequest<'a> {
    proto::ClaimRequest { credits, ..claim.clone() }
}
