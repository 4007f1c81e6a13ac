//! Authentication, authorization and audit on a shard's port: the glue
//! between the protocol handler and [`crate::auth`].
//!
//! With authentication on (an `auth_file` is configured):
//!
//! - **Handshake.** The first request on a connection must be Authenticate.
//!   [`ShardAuth::admit`] runs, in frame order, before a frame becomes a
//!   task: any other first request is refused there, which answers it
//!   `UNAUTHENTICATED` and closes the connection. Requests pipelined behind
//!   the handshake wait (in their tasks) until it is settled.
//! - **Verification** runs argon2 on glommio's blocking pool, never on the
//!   executor. A secret that verified is remembered for the shard as a
//!   keyed BLAKE3 MAC (key random per process), so the next connection of
//!   the same principal with the same secret costs one MAC. A refused
//!   handshake is answered `UNAUTHENTICATED`, the connection is closed, and
//!   a `rejected: authentication failed …` line naming the principal (never
//!   the secret) is logged at most once a second with the suppressed count.
//! - **Authorization** per request: the operation and queue the request
//!   names ([`ShardAuth::authorize`]) against the principal's rights mask
//!   for that queue, cached per connection by queue name and by queue id
//!   (tokens carry the id), so a request costs a hash-map lookup. A refusal
//!   is `PERMISSION_DENIED`, counted per operation
//!   (`spool_auth_denials_total`), and the connection stays open.
//!
//! - **Reload.** A reloaded auth file reaches the shard by message
//!   ([`ShardAuth::replace_policy`], `auth::reload`): the shard's policy and
//!   generation change, its verified-secrets cache is emptied, and each
//!   session, on its next request, takes its principal's new rights (its
//!   rights caches emptied) — or, when the principal is gone or its secret
//!   hash changed, is answered `UNAUTHENTICATED` and its connection closed.
//! - **Lockout.** After `AUTH_FAILURES_MAX` refused handshakes from one
//!   source IP within `AUTH_FAILURE_WINDOW`, that address's handshakes are
//!   refused at once, without argon2, until the window passes
//!   (`auth::limiter`; one table per shard), counted as
//!   `spool_auth_lockouts_total`.
//!
//! With it off, every connection acts as `anonymous` with every right, and
//! an Authenticate is accepted as is (`enforced = false`).
//!
//! Purge (confirmed), Redrive, DeleteQueue, ResizeQueue, CreateSubscription
//! and DeleteSubscription, allowed or refused, append an
//! [`AuditEntry`] to the data directory's audit log before they are
//! answered (the append and its fdatasync run on the blocking pool).

pub use crate::limits::SESSION_RIGHTS_CACHE_MAX;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use spool_wire::proto::{
    ApiKey, AuthenticateRequest, AuthenticateResponse, ErrorResponse, Request, Response,
};
use spool_wire::ErrorCode;

use super::ShardState;
use crate::auth::audit::{AuditEntry, AuditLog};
use crate::auth::limiter::FailureLimiter;
use crate::auth::{count_denial, verify_secret, AuthPolicy, Grants, Operation, ANONYMOUS};
use crate::control::assignment::QueueName;
use crate::net::connection::Connection;
use crate::net::stop::StopSignal;
use crate::partition::Clock;
use crate::queue::QueueId;

/// Rejection reason of a refused handshake (counted and logged once a
/// second at most, by [`crate::net::rejections`]).
pub const REJECT_AUTHENTICATION_FAILED: &str = "authentication_failed";
/// Rejection reason of a request sent before the handshake.
pub const REJECT_UNAUTHENTICATED: &str = "unauthenticated_request";
/// Rejection reason of a handshake refused because its address is locked
/// out after too many failures.
pub const REJECT_LOCKED_OUT: &str = "authentication_locked_out";
/// Rejection reason of a request whose principal a reload removed (or whose
/// secret it changed).
pub const REJECT_REVOKED: &str = "principal_revoked";

#[derive(Debug, Clone)]
enum State {
    /// Nothing received yet.
    Fresh,
    /// The handshake is being verified.
    Verifying,
    Authenticated(Rights),
    /// The handshake was refused; the connection is closing.
    Refused,
}

/// A principal's rights as a request holds them: an `Rc`, so taking them
/// per request is a plain (non-atomic) count on the shard.
pub type Rights = Rc<Arc<Grants>>;

/// What one connection knows about itself: its handshake and its rights.
#[derive(Debug)]
pub struct Session {
    state: RefCell<State>,
    /// Trips when the handshake is settled (accepted or refused).
    settled: StopSignal,
    /// Whether an Authenticate already started on this connection.
    handshake_started: Cell<bool>,
    by_name: RefCell<HashMap<Box<str>, u8>>,
    by_id: RefCell<HashMap<u32, u8>>,
    /// The policy generation its rights came from.
    generation: Cell<u64>,
    /// The secret hash its handshake verified against (a reload that
    /// changes it ends the session).
    secret_hash: RefCell<Box<str>>,
    /// Authenticated by a verified client certificate (no secret): a
    /// reload keeps it while its principal is still listed.
    by_certificate: Cell<bool>,
}

impl Session {
    fn new() -> Session {
        Session {
            state: RefCell::new(State::Fresh),
            settled: StopSignal::new(),
            handshake_started: Cell::new(false),
            by_name: RefCell::default(),
            by_id: RefCell::default(),
            generation: Cell::new(0),
            secret_hash: RefCell::default(),
            by_certificate: Cell::new(false),
        }
    }

    fn settle(&self, state: State) {
        *self.state.borrow_mut() = state;
        self.settled.stop();
    }

    fn mask_by_name(&self, grants: &Grants, queue: &str) -> u8 {
        if let Some(mask) = self.by_name.borrow().get(queue) {
            return *mask;
        }
        let mask = grants.mask(queue);
        let mut cache = self.by_name.borrow_mut();
        if cache.len() >= SESSION_RIGHTS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(queue.into(), mask);
        mask
    }

    fn mask_by_id(
        &self,
        grants: &Grants,
        id: QueueId,
        name: impl FnOnce() -> Option<String>,
    ) -> u8 {
        if let Some(mask) = self.by_id.borrow().get(&id.0) {
            return *mask;
        }
        // A queue that no longer exists: no rights (its tokens are stale
        // anyway); not cached, so a reused id is looked up afresh.
        let Some(name) = name() else { return 0 };
        let mask = grants.mask(&name);
        let mut cache = self.by_id.borrow_mut();
        if cache.len() >= SESSION_RIGHTS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(id.0, mask);
        mask
    }
}

/// What an audited request is about, taken before it is served.
#[derive(Debug)]
pub struct AuditTarget {
    operation: &'static str,
    queue: String,
    /// The subscription named (empty: the default, or the whole queue).
    subscription: String,
    partition: Option<u32>,
    /// For a deletion: the partitions the queue had.
    partitions: u64,
    /// A dry-run purge: audited only when refused (an attempt without the
    /// privilege), since an allowed one changes nothing.
    pub dry_run: bool,
}

/// The authentication state of one shard.
pub struct ShardAuth {
    /// The policy in force on this shard (replaced by a reload).
    policy: RefCell<AuthPolicy>,
    /// Its generation (0: the one read at start).
    generation: Cell<u64>,
    /// Failed handshakes per source address.
    failures: RefCell<FailureLimiter>,
    clock: Clock,
    anonymous: Rights,
    /// Key of the verified-secrets MAC; random per process start.
    mac_key: [u8; 32],
    /// Principal → MAC of the secret that last verified for it here.
    verified: RefCell<HashMap<String, blake3::Hash>>,
    audit: Arc<AuditLog>,
}

impl std::fmt::Debug for ShardAuth {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ShardAuth")
            .field("enabled", &self.is_enabled())
            .field("generation", &self.generation.get())
            .finish_non_exhaustive()
    }
}

fn unauthenticated(message: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(ErrorCode::Unauthenticated, message)
}

impl ShardAuth {
    /// The shard's view of `policy`; audits go to `data_dir`'s audit log;
    /// `clock` times the failed-login windows.
    pub fn new(policy: AuthPolicy, data_dir: &std::path::Path, clock: Clock) -> ShardAuth {
        ShardAuth {
            policy: RefCell::new(policy),
            generation: Cell::new(0),
            failures: RefCell::new(FailureLimiter::default()),
            clock,
            anonymous: Rc::new(Arc::new(Grants::everything(ANONYMOUS))),
            mac_key: rand::random(),
            verified: RefCell::default(),
            audit: Arc::new(AuditLog::new(data_dir)),
        }
    }

    /// Whether connections must authenticate.
    pub fn is_enabled(&self) -> bool {
        self.policy.borrow().is_enabled()
    }

    /// Puts a reloaded policy in force on this shard: sessions take it on
    /// their next request; secrets verified under the old one are verified
    /// again.
    pub fn replace_policy(&self, policy: AuthPolicy, generation: u64) {
        if generation <= self.generation.get() {
            return;
        }
        *self.policy.borrow_mut() = policy;
        self.generation.set(generation);
        self.verified.borrow_mut().clear();
    }

    /// This shard's policy generation.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// The policy this shard applies now (a reload replaces it).
    pub fn policy(&self) -> std::cell::Ref<'_, AuthPolicy> {
        self.policy.borrow()
    }

    fn session(connection: &Connection) -> Rc<Session> {
        let mut slot = connection.session.borrow_mut();
        if let Some(existing) = slot.as_ref() {
            if let Ok(session) = Rc::clone(existing).downcast::<Session>() {
                return session;
            }
        }
        let session = Rc::new(Session::new());
        *slot = Some(session.clone() as Rc<dyn Any>);
        session
    }

    /// Called in frame order before a frame becomes a task. `api_key` is
    /// `None` for a frame whose key this broker does not know.
    ///
    /// # Errors
    /// The frame must not be served and the connection must close: it is
    /// not the handshake and none came before it, or the handshake was
    /// refused.
    pub fn admit(
        &self,
        api_key: Option<ApiKey>,
        connection: &Connection,
    ) -> Result<(), ErrorResponse> {
        if !self.is_enabled() {
            return Ok(());
        }
        let session = Self::session(connection);
        let state = session.state.borrow().clone();
        match state {
            State::Fresh if api_key == Some(ApiKey::Authenticate) => {
                *session.state.borrow_mut() = State::Verifying;
                Ok(())
            }
            State::Fresh => {
                connection.rejections().record(
                    REJECT_UNAUTHENTICATED,
                    &format_args!(
                        "a request before Authenticate on connection {}",
                        connection.id()
                    ),
                );
                Err(unauthenticated(
                    "authentication is on: the first request on a connection must be \
                     Authenticate (principal and secret)",
                ))
            }
            State::Verifying | State::Authenticated(_) => Ok(()),
            State::Refused => Err(unauthenticated("the handshake was refused")),
        }
    }

    /// Authenticates `connection` as `principal`, named by the subject CN of
    /// its TLS client certificate (verified against `tls_client_ca_file`),
    /// before its first frame: no Authenticate is needed then, and one sent
    /// anyway is refused like a second handshake. With authentication off
    /// the name changes nothing (the connection is `anonymous`).
    ///
    /// # Errors
    /// `UNAUTHENTICATED` when the auth file has no such principal; the
    /// connection must close.
    pub fn accept_certificate(
        &self,
        principal: &str,
        connection: &Connection,
    ) -> Result<(), ErrorResponse> {
        if !self.is_enabled() {
            return Ok(());
        }
        let session = Self::session(connection);
        session.handshake_started.set(true);
        let found = self.policy.borrow().principal(principal).map(|(_, grants)| grants);
        match found {
            Some(grants) => {
                session.generation.set(self.generation.get());
                session.by_certificate.set(true);
                session.settle(State::Authenticated(Rc::new(grants)));
                Ok(())
            }
            None => {
                session.settle(State::Refused);
                Err(unauthenticated(format!(
                    "the client certificate names principal {principal:?}, which the auth file \
                     does not list"
                )))
            }
        }
    }

    /// Answers an Authenticate.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` (and the connection closes) for an unknown
    /// principal or a wrong secret; `INVALID_ARGUMENT` for a second
    /// Authenticate on the connection.
    pub async fn authenticate(
        &self,
        request: &AuthenticateRequest<'_>,
        connection: &Connection,
    ) -> Result<AuthenticateResponse, ErrorResponse> {
        if !self.is_enabled() {
            return Ok(AuthenticateResponse { enforced: false });
        }
        let session = Self::session(connection);
        if session.handshake_started.replace(true) {
            return Err(ErrorResponse::new(
                ErrorCode::InvalidArgument,
                "this connection already authenticated; open a new one to change principal",
            ));
        }
        let peer = connection.peer_ip();
        if let Some(ip) = peer {
            let locked = self.failures.borrow().check(ip, (self.clock)());
            if let Err(locked) = locked {
                crate::auth::limiter::count_lockout();
                session.settle(State::Refused);
                connection.rejections().record(
                    REJECT_LOCKED_OUT,
                    &format_args!(
                        "handshake for principal {:?} from {ip} refused unverified: \
                         too many failed attempts",
                        request.principal
                    ),
                );
                connection.close();
                return Err(unauthenticated(locked.message()));
            }
        }
        let generation = self.generation.get();
        let (found, decoy) = {
            let policy = self.policy.borrow();
            let found = policy
                .principal(request.principal)
                .map(|(hash, grants)| (Box::<str>::from(hash), grants));
            (found, policy.decoy_hash().map(str::to_owned))
        };
        let mac = {
            let mut hasher = blake3::Hasher::new_keyed(&self.mac_key);
            hasher.update(request.principal.as_bytes());
            hasher.update(&[0]);
            hasher.update(request.secret.as_bytes());
            hasher.finalize()
        };
        let accepted = match found {
            None => {
                // An unknown principal costs the same argon2 run as a wrong
                // secret (against another principal's hash, the result
                // ignored), so the time of a refusal does not tell which
                // principal names exist.
                if let Some(decoy) = decoy {
                    let secret = request.secret.to_owned();
                    let _ = glommio::executor()
                        .spawn_blocking(move || verify_secret(&decoy, &secret))
                        .await;
                }
                None
            }
            Some((hash, grants)) => {
                // blake3::Hash compares in constant time.
                let known = self.verified.borrow().get(request.principal) == Some(&mac);
                let verified = known || {
                    let hash = hash.to_string();
                    let secret = request.secret.to_owned();
                    glommio::executor().spawn_blocking(move || verify_secret(&hash, &secret)).await
                };
                verified.then_some((hash, grants))
            }
        };
        match accepted {
            Some((hash, grants)) => {
                // Cached only if no reload came during the verification.
                if self.generation.get() == generation {
                    self.verified.borrow_mut().insert(request.principal.to_owned(), mac);
                }
                session.generation.set(generation);
                *session.secret_hash.borrow_mut() = hash;
                session.settle(State::Authenticated(Rc::new(grants)));
                Ok(AuthenticateResponse { enforced: true })
            }
            None => {
                if let Some(ip) = peer {
                    self.failures.borrow_mut().record_failure(ip, (self.clock)());
                }
                session.settle(State::Refused);
                connection.rejections().record(
                    REJECT_AUTHENTICATION_FAILED,
                    &format_args!(
                        "authentication failed for principal {:?} on connection {}",
                        request.principal,
                        connection.id()
                    ),
                );
                connection.close();
                Err(unauthenticated("principal unknown or secret wrong"))
            }
        }
    }

    /// The rights this connection acts with, once its handshake settled.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` when the handshake was refused.
    pub async fn grants(&self, connection: &Connection) -> Result<Rights, ErrorResponse> {
        if !self.is_enabled() {
            return Ok(self.anonymous.clone());
        }
        let session = Self::session(connection);
        loop {
            let state = session.state.borrow().clone();
            match state {
                State::Authenticated(grants)
                    if session.generation.get() == self.generation.get() =>
                {
                    return Ok(grants)
                }
                State::Authenticated(grants) => {
                    return self.revalidate(&session, &grants, connection);
                }
                State::Verifying => session.settled.wait().await,
                State::Fresh | State::Refused => {
                    return Err(unauthenticated("this connection is not authenticated"))
                }
            }
        }
    }

    /// A session whose rights come from an older policy: its principal's
    /// rights under the policy in force, or `UNAUTHENTICATED` (and the
    /// connection closed) when the principal is gone or its secret hash
    /// changed.
    fn revalidate(
        &self,
        session: &Session,
        grants: &Grants,
        connection: &Connection,
    ) -> Result<Rights, ErrorResponse> {
        let name = grants.name().to_owned();
        let found = self.policy.borrow().principal(&name).map(|(hash, grants)| {
            let same = session.by_certificate.get() || &**session.secret_hash.borrow() == hash;
            (same, grants)
        });
        let reason = match found {
            Some((true, grants)) => {
                session.by_name.borrow_mut().clear();
                session.by_id.borrow_mut().clear();
                session.generation.set(self.generation.get());
                let rights: Rights = Rc::new(grants);
                *session.state.borrow_mut() = State::Authenticated(rights.clone());
                return Ok(rights);
            }
            Some((false, _)) => format!("the secret of principal {name} changed"),
            None => format!("principal {name} is no longer in the auth file"),
        };
        session.settle(State::Refused);
        connection.rejections().record(
            REJECT_REVOKED,
            &format_args!("{reason}: connection {} closed", connection.id()),
        );
        connection.close();
        Err(unauthenticated(format!("{reason} (auth file reloaded); the connection is closed")))
    }

    fn deny(grants: &Grants, operation: Operation, queue: &str) -> ErrorResponse {
        count_denial(operation);
        ErrorResponse::new(
            ErrorCode::PermissionDenied,
            format!("principal {} may not {} on queue {queue}", grants.name(), operation.as_str()),
        )
    }

    /// Checks `request` against `grants`.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` naming the principal, operation and queue.
    pub fn authorize(
        &self,
        request: &Request<'_>,
        grants: &Grants,
        connection: &Connection,
        state: &ShardState,
    ) -> Result<(), ErrorResponse> {
        if !self.is_enabled() {
            return Ok(());
        }
        let session = Self::session(connection);
        let by_name = |queue: &str, operation: Operation| {
            if session.mask_by_name(grants, queue) & operation.bit() != 0 {
                Ok(())
            } else {
                Err(Self::deny(grants, operation, queue))
            }
        };
        let by_token = |token: &spool_wire::proto::DeliveryToken| {
            // A token that does not parse is refused by the handler itself.
            let Ok(token) = super::convert::token_from_wire(token) else { return Ok(()) };
            let id = token.claim().queue;
            let name =
                || state.table.borrow().queue_by_id(id).map(|(name, _)| name.as_str().to_owned());
            if session.mask_by_id(grants, id, name) & Operation::Claim.bit() != 0 {
                return Ok(());
            }
            // No right on the whole queue: a rule naming the token's
            // subscription may still grant it.
            if grants.names_subscriptions() {
                let table = state.table.borrow();
                if let Some((queue, entry)) = table.queue_by_id(id) {
                    let sub = entry.subscriptions.name(token.claim().sub).unwrap_or_default();
                    if !sub.is_empty()
                        && grants.allows_only_in(queue.as_str(), sub, Operation::Claim)
                    {
                        return Ok(());
                    }
                }
            }
            {
                let queue = state
                    .table
                    .borrow()
                    .queue_by_id(id)
                    .map_or_else(|| format!("#{}", id.0), |(name, _)| name.as_str().to_owned());
                Err(Self::deny(grants, Operation::Claim, &queue))
            }
        };
        match request {
            Request::Enqueue(enqueue) => by_name(enqueue.queue, Operation::Enqueue),
            Request::Claim(claim) => by_name(claim.queue, Operation::Claim).or_else(|denied| {
                // A rule naming the claim's subscription (`queue/sub`); the
                // dead-letter lane `<queue>.dlq` is the queue's.
                let queue = claim
                    .queue
                    .strip_suffix(spool_wire::proto::DEAD_LETTER_SUFFIX)
                    .unwrap_or(claim.queue);
                if grants.names_subscriptions()
                    && grants.allows_only_in(queue, claim.subscription, Operation::Claim)
                {
                    Ok(())
                } else {
                    Err(denied)
                }
            }),
            Request::Extend(extend) => by_token(&extend.token),
            Request::Release(release) => by_token(&release.token),
            Request::Ack(ack) => ack.tokens.iter().try_for_each(by_token),
            // A session is opened for claiming: the claim right on its
            // queue (or its subscription); heartbeats and closes name only
            // the connection's own sessions.
            Request::Session(spool_wire::proto::SessionRequest::Open {
                queue,
                subscription,
                ..
            }) => by_name(queue, Operation::Claim).or_else(|denied| {
                let queue =
                    queue.strip_suffix(spool_wire::proto::DEAD_LETTER_SUFFIX).unwrap_or(queue);
                if grants.names_subscriptions()
                    && grants.allows_only_in(queue, subscription, Operation::Claim)
                {
                    Ok(())
                } else {
                    Err(denied)
                }
            }),
            Request::CreateQueue(create) => by_name(&create.name, Operation::Admin),
            Request::DeleteQueue(delete) => by_name(&delete.name, Operation::Admin),
            Request::ResizeQueue(resize) => by_name(&resize.name, Operation::Admin),
            Request::CreateSubscription(create) => by_name(&create.queue, Operation::Admin),
            Request::DeleteSubscription(delete) => by_name(&delete.queue, Operation::Admin),
            Request::DescribeQueue(describe) => by_name(&describe.name, Operation::Describe),
            Request::Peek(peek) => by_name(&peek.queue, Operation::Peek),
            Request::DeadLetters(list) => by_name(&list.queue, Operation::Peek),
            Request::Purge(purge) => by_name(&purge.queue, Operation::Purge),
            Request::Redrive(redrive) => by_name(&redrive.queue, Operation::Redrive),
            // Where partitions live, the connection's own claims, a proof
            // of life, and the list (filtered to the queues the principal
            // has a right on).
            Request::Metadata(_)
            | Request::ListQueues(_)
            | Request::CancelClaim(_)
            | Request::Ping(_)
            | Request::Session(_)
            | Request::Authenticate(_) => Ok(()),
        }
    }

    /// Keeps only the queues `grants` has some right on in a ListQueues
    /// answer (authentication on).
    pub fn filter_listing(&self, response: &mut Response<'static>, grants: &Grants) {
        if !self.is_enabled() {
            return;
        }
        if let Response::ListQueues(list) = response {
            list.queues.retain(|queue| grants.mask(&queue.name) != 0);
        }
    }

    /// What an audited request is about; `None` for requests never
    /// audited. A dry-run purge is audited only if refused (see
    /// [`AuditTarget::dry_run`]).
    pub fn audit_target(request: &Request<'_>, state: &ShardState) -> Option<AuditTarget> {
        let target = |operation, queue: &str, partition| AuditTarget {
            operation,
            queue: queue.to_owned(),
            subscription: String::new(),
            partition,
            partitions: 0,
            dry_run: false,
        };
        match request {
            Request::Purge(purge) => Some(AuditTarget {
                dry_run: purge.dry_run,
                subscription: purge.subscription.clone(),
                ..target("purge", &purge.queue, Some(purge.partition.0))
            }),
            Request::Redrive(redrive) => Some(AuditTarget {
                subscription: redrive.subscription.clone(),
                ..target("redrive", &redrive.queue, Some(redrive.partition.0))
            }),
            Request::CreateSubscription(create) => Some(AuditTarget {
                subscription: create.name.clone(),
                ..target("create_subscription", &create.queue, None)
            }),
            Request::DeleteSubscription(delete) => Some(AuditTarget {
                subscription: delete.name.clone(),
                ..target("delete_subscription", &delete.queue, None)
            }),
            Request::DeleteQueue(delete) => {
                let partitions = QueueName::new(&delete.name).ok().and_then(|name| {
                    state.table.borrow().queue(&name).map(|entry| entry.partitions.len() as u64)
                });
                Some(AuditTarget {
                    partitions: partitions.unwrap_or(0),
                    ..target("delete_queue", &delete.name, None)
                })
            }
            Request::ResizeQueue(resize) => Some(AuditTarget {
                partitions: u64::from(resize.partitions),
                ..target("resize_queue", &resize.name, None)
            }),
            _ => None,
        }
    }

    /// Appends the outcome of an audited request to the audit log (on the
    /// blocking pool) and waits until it is durable. A failed append is
    /// logged at ERROR; the request's own answer stands.
    pub async fn audit(
        &self,
        target: AuditTarget,
        principal: &str,
        outcome: Result<&Response<'static>, &ErrorResponse>,
        now_ms: u64,
    ) {
        let (count, outcome) = match outcome {
            Ok(Response::Purge(purge)) => (purge.count, "ok".to_owned()),
            Ok(Response::Redrive(redrive)) => (redrive.count, "ok".to_owned()),
            Ok(_) => (target.partitions, "ok".to_owned()),
            Err(reply) => (0, reply.code.name().to_owned()),
        };
        let entry = AuditEntry {
            time_ms: now_ms,
            principal: principal.to_owned(),
            operation: target.operation.to_owned(),
            queue: target.queue,
            subscription: target.subscription,
            partition: target.partition,
            count,
            dry_run: target.dry_run,
            outcome,
        };
        let log = self.audit.clone();
        let operation = entry.operation.clone();
        let queue = entry.queue.clone();
        let written = glommio::executor().spawn_blocking(move || log.append(&entry)).await;
        if let Err(error) = written {
            tracing::error!(
                path = %self.audit.path().display(),
                %operation,
                %queue,
                %error,
                "audit entry not written"
            );
        }
    }
}
