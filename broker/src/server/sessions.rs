//! A shard's consumer sessions (`docs/design/sessions.md`): which sessions
//! are open, on which connection, for which (queue, subscription, member),
//! with which epoch and heartbeat deadline, and the claims each holds. Pure:
//! time is an argument, nothing here releases anything — an ended session
//! comes back as [`Ended`] with the tokens the caller releases
//! (`session_ops.rs`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};

use spool_wire::ErrorCode;
use thiserror::Error;

use super::limits::{
    SESSIONS_FENCED_REMEMBERED_MAX, SESSIONS_PER_CONNECTION_MAX, SESSIONS_PER_SHARD_MAX,
    SESSION_CLAIMS_MAX, SESSION_CLAIMS_PER_SHARD_MAX,
};
use crate::queue::{DeliveryToken, Lane, Millis, Offset, PartitionId, QueueId, SubscriptionId};
use crate::shard::report::SessionFigures;

/// Why a session ended; each is counted (`spool_sessions_ended_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// The consumer closed it.
    Closed,
    /// Its connection ended.
    Connection,
    /// No heartbeat within its timeout.
    Timeout,
    /// The member opened a newer session (or the connection opened another
    /// for the same queue and subscription).
    Replaced,
}

impl EndCause {
    /// Every cause, in the order of [`SessionCounters::ended`].
    pub const ALL: [EndCause; 4] =
        [EndCause::Closed, EndCause::Connection, EndCause::Timeout, EndCause::Replaced];

    /// The metric label (`SESSION_END_CAUSES`, in this order).
    pub fn label(self) -> &'static str {
        crate::shard::report::SESSION_END_CAUSES[self.index()]
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Refusals of the session requests.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SessionError {
    /// No open session of this id on this connection.
    #[error("no open session {session} on this connection (timed out or closed)")]
    NotFound { session: u64 },
    /// A newer session of the same member ended this one.
    #[error("session {session} was replaced by a newer session of its member")]
    Fenced { session: u64 },
    /// The shard holds `SESSIONS_PER_SHARD_MAX` sessions.
    #[error("this shard holds {max} sessions (SESSIONS_PER_SHARD_MAX)")]
    ShardFull { max: usize },
    /// The connection holds `SESSIONS_PER_CONNECTION_MAX` sessions.
    #[error("this connection holds {max} sessions (SESSIONS_PER_CONNECTION_MAX)")]
    ConnectionFull { max: usize },
    /// The session (or the shard's sessions) track their most claims.
    #[error("the session holds {max} claims (SESSION_CLAIMS_MAX or _PER_SHARD_MAX): ack some")]
    ClaimsFull { max: usize },
}

impl SessionError {
    /// The wire code of the refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            SessionError::NotFound { .. } => ErrorCode::SessionNotFound,
            SessionError::Fenced { .. } => ErrorCode::SessionFenced,
            SessionError::ShardFull { .. } | SessionError::ClaimsFull { .. } => {
                ErrorCode::Throttled
            }
            SessionError::ConnectionFull { .. } => ErrorCode::InvalidArgument,
        }
    }
}

/// The bounds of one table (the `limits.rs` values; smaller in tests).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub per_shard: usize,
    pub per_connection: usize,
    pub claims_per_session: usize,
    pub claims_per_shard: usize,
    pub fenced_remembered: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            per_shard: SESSIONS_PER_SHARD_MAX,
            per_connection: SESSIONS_PER_CONNECTION_MAX,
            claims_per_session: SESSION_CLAIMS_MAX,
            claims_per_shard: SESSION_CLAIMS_PER_SHARD_MAX,
            fenced_remembered: SESSIONS_FENCED_REMEMBERED_MAX,
        }
    }
}

/// One claim as a session knows it: the message, in its lane and
/// subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClaimKey {
    queue: QueueId,
    partition: PartitionId,
    sub: SubscriptionId,
    lane: Lane,
    offset: Offset,
}

impl ClaimKey {
    fn of(token: &DeliveryToken) -> Self {
        let claim = token.claim();
        Self {
            queue: claim.queue,
            partition: claim.partition,
            sub: claim.sub,
            lane: claim.lane,
            offset: claim.offset,
        }
    }
}

#[derive(Debug)]
struct Session {
    epoch: u64,
    connection: u64,
    queue: QueueId,
    sub: SubscriptionId,
    member: String,
    timeout_ms: Millis,
    deadline_ms: Millis,
    /// Claims held: the token to release with, and the lease deadline.
    claims: HashMap<ClaimKey, (DeliveryToken, Millis)>,
}

/// What an open, heartbeat or close answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub session: u64,
    pub epoch: u64,
    pub timeout_ms: Millis,
}

/// A session that ended, with the claims the caller must release.
#[derive(Debug)]
pub struct Ended {
    pub session: u64,
    pub cause: EndCause,
    pub tokens: Vec<DeliveryToken>,
}

/// What a shard counts of its sessions (reported as metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounters {
    /// Sessions opened.
    pub opened: u64,
    /// Sessions ended, by [`EndCause::ALL`] order.
    pub ended: [u64; 4],
    /// Claims released because their session ended.
    pub claims_released: u64,
}

type MemberKey = (QueueId, SubscriptionId, String);

/// A shard's sessions.
#[derive(Debug, Default)]
pub struct SessionTable {
    limits: SessionLimits,
    sessions: HashMap<u64, Session>,
    by_member: HashMap<MemberKey, u64>,
    by_connection: HashMap<(u64, QueueId, SubscriptionId), u64>,
    per_connection: HashMap<u64, usize>,
    /// Which session holds a claim (the newest to record it).
    owner: HashMap<ClaimKey, u64>,
    /// Sessions a rejoin replaced, with their connection, oldest first.
    fenced: HashMap<u64, u64>,
    fenced_order: VecDeque<u64>,
    next_session: u64,
    next_epoch: u64,
    counters: SessionCounters,
}

impl SessionTable {
    /// An empty table with `limits`.
    pub fn new(limits: SessionLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// Sessions open now.
    pub fn open_count(&self) -> usize {
        self.sessions.len()
    }

    /// Claims tracked now, over every session.
    pub fn claims_tracked(&self) -> usize {
        self.owner.len()
    }

    /// The counters.
    pub fn counters(&self) -> SessionCounters {
        self.counters
    }

    /// Counts `released` claims released by a session's end.
    pub fn count_released(&mut self, released: u64) {
        self.counters.claims_released += released;
    }

    /// Opens a session of `member` for (`queue`, `sub`) on `connection`.
    /// Ends, and returns, the member's older session on this shard and the
    /// connection's older session for the same queue and subscription.
    ///
    /// # Errors
    /// [`SessionError::ShardFull`], [`SessionError::ConnectionFull`].
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        now: Millis,
        connection: u64,
        queue: QueueId,
        sub: SubscriptionId,
        member: &str,
        timeout_ms: Millis,
    ) -> Result<(Opened, Vec<Ended>), SessionError> {
        let member_key = (queue, sub, member.to_owned());
        let older_member = self.by_member.get(&member_key).copied();
        let older_here = self.by_connection.get(&(connection, queue, sub)).copied();
        let replaced = usize::from(older_member.is_some())
            + usize::from(older_here.is_some() && older_here != older_member);
        if self.sessions.len() - replaced >= self.limits.per_shard {
            return Err(SessionError::ShardFull { max: self.limits.per_shard });
        }
        let here = self.per_connection.get(&connection).copied().unwrap_or(0);
        let replaced_here = usize::from(older_here.is_some())
            + usize::from(older_member.is_some_and(|old| {
                Some(old) != older_here && self.sessions[&old].connection == connection
            }));
        if here - replaced_here >= self.limits.per_connection {
            return Err(SessionError::ConnectionFull { max: self.limits.per_connection });
        }
        let mut ended = Vec::new();
        for old in [older_member, older_here].into_iter().flatten() {
            if let Some(end) = self.end(old, EndCause::Replaced) {
                self.remember_fenced(old, end.1);
                ended.push(end.0);
            }
        }
        self.next_session += 1;
        self.next_epoch += 1;
        let session = self.next_session;
        let epoch = self.next_epoch;
        self.sessions.insert(
            session,
            Session {
                epoch,
                connection,
                queue,
                sub,
                member: member.to_owned(),
                timeout_ms,
                deadline_ms: now.saturating_add(timeout_ms),
                claims: HashMap::new(),
            },
        );
        self.by_member.insert(member_key, session);
        self.by_connection.insert((connection, queue, sub), session);
        *self.per_connection.entry(connection).or_default() += 1;
        self.counters.opened += 1;
        Ok((Opened { session, epoch, timeout_ms }, ended))
    }

    fn found(&self, connection: u64, session: u64) -> Result<&Session, SessionError> {
        match self.sessions.get(&session) {
            Some(found) if found.connection == connection => Ok(found),
            _ if self.fenced.get(&session) == Some(&connection) => {
                Err(SessionError::Fenced { session })
            }
            _ => Err(SessionError::NotFound { session }),
        }
    }

    /// Pushes the session's deadline its timeout out from `now`.
    ///
    /// # Errors
    /// [`SessionError::NotFound`], [`SessionError::Fenced`].
    pub fn heartbeat(
        &mut self,
        now: Millis,
        connection: u64,
        session: u64,
    ) -> Result<Opened, SessionError> {
        self.found(connection, session)?;
        let found = self.sessions.get_mut(&session).ok_or(SessionError::NotFound { session })?;
        found.deadline_ms = now.saturating_add(found.timeout_ms);
        Ok(Opened { session, epoch: found.epoch, timeout_ms: found.timeout_ms })
    }

    /// Ends the session at its consumer's request.
    ///
    /// # Errors
    /// [`SessionError::NotFound`], [`SessionError::Fenced`].
    pub fn close(
        &mut self,
        connection: u64,
        session: u64,
    ) -> Result<(Opened, Ended), SessionError> {
        let found = self.found(connection, session)?;
        let opened = Opened { session, epoch: found.epoch, timeout_ms: found.timeout_ms };
        let (ended, _) =
            self.end(session, EndCause::Closed).ok_or(SessionError::NotFound { session })?;
        Ok((opened, ended))
    }

    /// Ends every session of `connection` (it ended) and forgets the
    /// replaced sessions it held.
    pub fn connection_ended(&mut self, connection: u64) -> Vec<Ended> {
        let ids: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, session)| session.connection == connection)
            .map(|(&id, _)| id)
            .collect();
        self.fenced.retain(|_, owner| *owner != connection);
        let fenced = &self.fenced;
        self.fenced_order.retain(|id| fenced.contains_key(id));
        ids.into_iter().filter_map(|id| self.end(id, EndCause::Connection)).map(|e| e.0).collect()
    }

    /// Ends every session whose heartbeat deadline is at or before `now`.
    pub fn expire(&mut self, now: Millis) -> Vec<Ended> {
        let due: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, session)| session.deadline_ms <= now)
            .map(|(&id, _)| id)
            .collect();
        due.into_iter().filter_map(|id| self.end(id, EndCause::Timeout)).map(|e| e.0).collect()
    }

    /// How many more claims a claim on `connection` in (`queue`, `sub`)
    /// may take: `None` when the connection has no session there (no
    /// bound); claims past their lease are forgotten first.
    ///
    /// # Errors
    /// [`SessionError::ClaimsFull`] when there is no room at all.
    pub fn room(
        &mut self,
        now: Millis,
        connection: u64,
        queue: QueueId,
        sub: SubscriptionId,
    ) -> Result<Option<usize>, SessionError> {
        let Some(&id) = self.by_connection.get(&(connection, queue, sub)) else {
            return Ok(None);
        };
        let held = self.sessions.get(&id).map_or(0, |session| session.claims.len());
        if held >= self.limits.claims_per_session
            || self.owner.len() >= self.limits.claims_per_shard
        {
            self.forget_lapsed(id, now);
        }
        let held = self.sessions.get(&id).map_or(0, |session| session.claims.len());
        let room = (self.limits.claims_per_session.saturating_sub(held))
            .min(self.limits.claims_per_shard.saturating_sub(self.owner.len()));
        if room == 0 {
            return Err(SessionError::ClaimsFull { max: self.limits.claims_per_session });
        }
        Ok(Some(room))
    }

    /// Forgets the claims of session `id` whose lease ran out.
    fn forget_lapsed(&mut self, id: u64, now: Millis) {
        let Some(session) = self.sessions.get_mut(&id) else { return };
        let owner = &mut self.owner;
        session.claims.retain(|key, (_, deadline_ms)| {
            let live = *deadline_ms > now;
            if !live && owner.get(key) == Some(&id) {
                owner.remove(key);
            }
            live
        });
    }

    /// Records a claim made on `connection`, if the connection has a
    /// session for the token's queue and subscription; false when it has
    /// none (or its session holds its most claims: the claim keeps its
    /// lease alone).
    pub fn record(&mut self, connection: u64, token: &DeliveryToken, deadline_ms: Millis) -> bool {
        let claim = token.claim();
        let Some(&id) = self.by_connection.get(&(connection, claim.queue, claim.sub)) else {
            return false;
        };
        if self.owner.len() >= self.limits.claims_per_shard {
            return false;
        }
        let full = self
            .sessions
            .get(&id)
            .is_none_or(|session| session.claims.len() >= self.limits.claims_per_session);
        if full {
            return false;
        }
        let key = ClaimKey::of(token);
        // A lapsed claim of the same message held by another session is
        // that session's no more.
        if let Some(previous) = self.owner.insert(key, id) {
            if previous != id {
                if let Some(other) = self.sessions.get_mut(&previous) {
                    other.claims.remove(&key);
                }
            }
        }
        if let Some(session) = self.sessions.get_mut(&id) {
            session.claims.insert(key, (*token, deadline_ms));
        }
        true
    }

    /// Forgets the claim `token` names (acked or released; or refused as
    /// stale), if a session holds it under this very token.
    pub fn forget(&mut self, token: &DeliveryToken) {
        let key = ClaimKey::of(token);
        let Some(&id) = self.owner.get(&key) else { return };
        let Some(session) = self.sessions.get_mut(&id) else { return };
        if session.claims.get(&key).is_some_and(|(held, _)| held == token) {
            session.claims.remove(&key);
            self.owner.remove(&key);
        }
    }

    /// The claim `token` names has a new lease deadline.
    pub fn extended(&mut self, token: &DeliveryToken, deadline_ms: Millis) {
        let key = ClaimKey::of(token);
        let Some(&id) = self.owner.get(&key) else { return };
        if let Some(session) = self.sessions.get_mut(&id) {
            if let Some((held, deadline)) = session.claims.get_mut(&key) {
                if held == token {
                    *deadline = deadline_ms;
                }
            }
        }
    }

    /// The earliest heartbeat deadline, if any session is open.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.sessions.values().map(|session| session.deadline_ms).min()
    }

    /// Removes session `id`: its claims come back to be released. Also
    /// returns its connection.
    fn end(&mut self, id: u64, cause: EndCause) -> Option<(Ended, u64)> {
        let session = self.sessions.remove(&id)?;
        let member_key = (session.queue, session.sub, session.member);
        if self.by_member.get(&member_key) == Some(&id) {
            self.by_member.remove(&member_key);
        }
        let connection_key = (session.connection, session.queue, session.sub);
        if self.by_connection.get(&connection_key) == Some(&id) {
            self.by_connection.remove(&connection_key);
        }
        if let Some(count) = self.per_connection.get_mut(&session.connection) {
            *count -= 1;
            if *count == 0 {
                self.per_connection.remove(&session.connection);
            }
        }
        let mut tokens = Vec::with_capacity(session.claims.len());
        for (key, (token, _)) in session.claims {
            if self.owner.get(&key) == Some(&id) {
                self.owner.remove(&key);
                tokens.push(token);
            }
        }
        // Offset order: the releases land in the log as a fence's would.
        tokens.sort_unstable_by_key(|token| {
            let claim = token.claim();
            (claim.partition, claim.lane as u8, claim.offset)
        });
        self.counters.ended[cause.index()] += 1;
        Some((Ended { session: id, cause, tokens }, session.connection))
    }

    fn remember_fenced(&mut self, session: u64, connection: u64) {
        if self.limits.fenced_remembered == 0 {
            return;
        }
        while self.fenced_order.len() >= self.limits.fenced_remembered {
            if let Some(oldest) = self.fenced_order.pop_front() {
                self.fenced.remove(&oldest);
            }
        }
        self.fenced.insert(session, connection);
        self.fenced_order.push_back(session);
    }
}

/// A shard's sessions and the tasks that end them.
#[derive(Debug, Default)]
pub struct Sessions {
    pub(super) table: RefCell<SessionTable>,
    /// Connections whose end a watcher task waits for.
    pub(super) watched: RefCell<HashSet<u64>>,
    /// The sweep task runs.
    pub(super) sweeping: Cell<bool>,
}

impl Sessions {
    /// An empty set with the `limits.rs` bounds.
    pub fn new() -> Self {
        Self { table: RefCell::new(SessionTable::new(SessionLimits::default())), ..Self::default() }
    }

    /// The shard's figures.
    pub fn report(&self) -> SessionFigures {
        let table = self.table.borrow();
        let counters = table.counters();
        SessionFigures {
            open: table.open_count() as u64,
            claims_tracked: table.claims_tracked() as u64,
            opened: counters.opened,
            ended: counters.ended,
            claims_released: counters.claims_released,
        }
    }

    /// An ack or release of `token` settled it (or found it stale).
    pub fn forget(&self, token: &DeliveryToken) {
        self.table.borrow_mut().forget(token);
    }

    /// An extend gave `token`'s claim a new deadline.
    pub fn extended(&self, token: &DeliveryToken, deadline_ms: Millis) {
        self.table.borrow_mut().extended(token, deadline_ms);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::queue::{Generation, LeaderEpoch, TokenClaim, TokenKey, WorkerId};

    const Q: QueueId = QueueId(1);
    const SUB: SubscriptionId = SubscriptionId::DEFAULT;

    fn token(offset: u64, generation: u32) -> DeliveryToken {
        TokenKey::from_secret(&[7; 32]).sign(&TokenClaim {
            queue: Q,
            partition: PartitionId(0),
            sub: SUB,
            lane: Lane::Main,
            offset: Offset(offset),
            generation: Generation(generation),
            epoch: LeaderEpoch(1),
            worker: WorkerId(1),
        })
    }

    fn small() -> SessionLimits {
        SessionLimits {
            per_shard: 3,
            per_connection: 2,
            claims_per_session: 2,
            claims_per_shard: 3,
            fenced_remembered: 1,
        }
    }

    // Goal: a session lives while heartbeats come and ends at its timeout
    // with every claim it recorded (and none it forgot). Method: open,
    // record, heartbeat, expire at the deadline's edges.
    #[test]
    fn expiry_releases_what_is_held() {
        let mut table = SessionTable::new(SessionLimits::default());
        let (opened, ended) = table.open(1_000, 10, Q, SUB, "w", 2_000).unwrap();
        assert!(ended.is_empty());
        assert!(table.record(10, &token(1, 1), 60_000));
        assert!(table.record(10, &token(2, 1), 60_000));
        assert!(!table.record(11, &token(3, 1), 60_000), "another connection has no session");
        table.forget(&token(2, 1));
        table.heartbeat(2_500, 10, opened.session).unwrap();
        assert!(table.expire(4_499).is_empty(), "the heartbeat moved the deadline");
        assert_eq!(table.next_deadline(), Some(4_500));
        let ended = table.expire(4_500);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].cause, EndCause::Timeout);
        assert_eq!(ended[0].tokens, vec![token(1, 1)]);
        assert_eq!(table.open_count(), 0);
        assert_eq!(table.claims_tracked(), 0);
        assert_eq!(
            table.heartbeat(4_600, 10, opened.session),
            Err(SessionError::NotFound { session: opened.session })
        );
        assert_eq!(table.counters().ended[EndCause::Timeout.index()], 1);
    }

    // Goal: a rejoin of the member (on another connection) gets a higher
    // epoch, ends the old session with its claims, and the old
    // connection's heartbeat is told it was fenced; a forget with an older
    // token of the same message does not drop the newer claim. Method:
    // two opens of one member.
    #[test]
    fn rejoin_fences_the_older_session() {
        let mut table = SessionTable::new(SessionLimits::default());
        let (first, _) = table.open(0, 10, Q, SUB, "w", 2_000).unwrap();
        assert!(table.record(10, &token(5, 1), 60_000));
        let (second, ended) = table.open(100, 20, Q, SUB, "w", 2_000).unwrap();
        assert!(second.epoch > first.epoch);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].cause, EndCause::Replaced);
        assert_eq!(ended[0].tokens, vec![token(5, 1)]);
        assert_eq!(
            table.heartbeat(200, 10, first.session),
            Err(SessionError::Fenced { session: first.session })
        );
        assert_eq!(
            table.heartbeat(200, 20, first.session),
            Err(SessionError::NotFound { session: first.session }),
            "only the old connection hears fenced"
        );
        assert!(table.record(20, &token(5, 2), 60_000));
        table.forget(&token(5, 1));
        assert_eq!(table.claims_tracked(), 1, "a stale token forgets nothing");
        let (_, closed) = table.close(20, second.session).unwrap();
        assert_eq!(closed.tokens, vec![token(5, 2)]);
        assert_eq!(closed.cause, EndCause::Closed);
        // The old connection ends: its fenced memory goes too.
        assert!(table.connection_ended(10).is_empty());
        assert_eq!(
            table.heartbeat(300, 10, first.session),
            Err(SessionError::NotFound { session: first.session })
        );
    }

    // Goal: a connection's end ends all its sessions; other connections'
    // stay. Method: two connections, end one.
    #[test]
    fn connection_end_ends_its_sessions() {
        let mut table = SessionTable::new(SessionLimits::default());
        table.open(0, 10, Q, SUB, "a", 2_000).unwrap();
        table.open(0, 10, QueueId(2), SUB, "a", 2_000).unwrap();
        table.open(0, 11, Q, SUB, "b", 2_000).unwrap();
        let ended = table.connection_ended(10);
        assert_eq!(ended.len(), 2);
        assert!(ended.iter().all(|end| end.cause == EndCause::Connection));
        assert_eq!(table.open_count(), 1);
    }

    // Goal: every bound is held with its named error, and a session's
    // claims room forgets lapsed leases before it refuses. Method: the
    // small limits.
    #[test]
    fn limits_are_held() {
        let mut table = SessionTable::new(small());
        let (a, _) = table.open(0, 10, Q, SUB, "a", 2_000).unwrap();
        table.open(0, 10, QueueId(2), SUB, "a", 2_000).unwrap();
        assert_eq!(
            table.open(0, 10, QueueId(3), SUB, "a", 2_000).unwrap_err(),
            SessionError::ConnectionFull { max: 2 }
        );
        // Reopening for the same queue on the same connection replaces.
        let (again, ended) = table.open(0, 10, Q, SUB, "a", 2_000).unwrap();
        assert_eq!(ended.len(), 1);
        assert_ne!(again.session, a.session);
        table.open(0, 11, Q, SUB, "b", 2_000).unwrap();
        assert_eq!(
            table.open(0, 12, Q, SUB, "c", 2_000).unwrap_err(),
            SessionError::ShardFull { max: 3 }
        );
        assert_eq!(SessionError::ShardFull { max: 3 }.code(), ErrorCode::Throttled);
        // Claims: two per session.
        assert_eq!(table.room(0, 10, Q, SUB).unwrap(), Some(2));
        assert!(table.record(10, &token(1, 1), 1_000));
        assert!(table.record(10, &token(2, 1), 5_000));
        assert!(!table.record(10, &token(3, 1), 5_000), "past the session's bound");
        assert_eq!(table.room(500, 10, Q, SUB).unwrap_err(), SessionError::ClaimsFull { max: 2 });
        assert_eq!(table.room(1_000, 10, Q, SUB).unwrap(), Some(1), "the lapsed lease went");
        assert_eq!(table.room(0, 99, Q, SUB).unwrap(), None, "no session: no bound");
    }
}
