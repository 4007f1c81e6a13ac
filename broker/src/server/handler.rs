//! The Spool protocol on a shard's port: decode a frame, route it to the
//! partition this shard owns (or answer `NOT_OWNER`), reply.
//!
//! Each whole frame is copied once into an 8-aligned buffer, so the record
//! batch inside an Enqueue is aligned for rkyv and decoding can borrow from
//! it for the life of the request. Framing errors (bad length, padding,
//! reserved bits, an oversized frame) and a body that does not parse close
//! the connection after an error reply that echoes the request's id, key and
//! version; an unknown api key or version, or a field out of range, is
//! answered with an error and the connection carries on.
//!
//! Admin requests that are about one partition (Peek, Purge, DeadLetters,
//! Redrive) go to the owning shard like data (`server/inspect.rs`).
//! DescribeQueue reports the partitions this shard owns; a client asks
//! every shard and merges.
//! Metadata reports every partition's leader epoch, whichever shard owns it,
//! from the shards' shared [`EpochBoard`](super::EpochBoard) (0 only while
//! no shard has the partition open).

use std::rc::Rc;

use spool_wire::proto::{
    self, AckResponse, CancelClaimResponse, CancelOutcome, ClaimResponse, CorrelationId,
    CreateQueueResponse, DeleteQueueResponse, ErrorResponse, ExtendResponse, ListQueuesResponse,
    NodeAddress, PingResponse, QueueSummary, RecordOutcome, ReleaseResponse, Request, Response,
};
use spool_wire::ErrorCode;

use super::auth::ShardAuth;
use super::convert::{queue_config_from_wire, token_from_wire, token_to_wire};
use super::frame::raw_ids;
pub use super::frame::{FrameError, OwnedFrame};
use super::quota::{QuotaReport, ShardQuotas};
use super::{Served, ShardState};
use crate::clock::Instant;
use crate::control::assignment::QueueName;
use crate::net::connection::Connection;
use crate::partition::{EnqueueOutcome, PartitionError};
use crate::queue::stored::{PrincipalId, Stored};
use crate::queue::{PartitionId, ReleaseReason};
use crate::shard::report::RequestOp;
use crate::shard::CoordinatorError;
use std::collections::HashMap;

/// Reason code recorded when a worker releases a message. The worker's text
/// is logged; the state machine keeps a code.
pub const RELEASE_REASON_WORKER: ReleaseReason = ReleaseReason(1);

pub use crate::control::assignment::DEAD_LETTER_SUFFIX;
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;

/// Rejection reason: a claim would wait past its connection's bound.
pub const REJECT_CLAIM_WAITERS_PER_CONNECTION: &str = "claim_waiters_per_connection";
/// Rejection reason: a claim would wait past its partition's bound.
pub const REJECT_CLAIM_WAITERS_PER_PARTITION: &str = "claim_waiters_per_partition";

/// The protocol handler of one shard.
#[derive(Debug)]
pub struct SpoolHandler {
    pub(super) state: Rc<ShardState>,
    pub(super) auth: ShardAuth,
    pub(super) quotas: Rc<ShardQuotas>,
    /// The shard's consumer sessions (`session_ops.rs`).
    pub(super) sessions: Rc<super::sessions::Sessions>,
}

pub(super) type Answer = Result<Response<'static>, ErrorResponse>;

/// The partition a data request was routed to and its operation: the
/// request's latency is counted there once its reply is built.
pub(super) type Timed = Option<(Rc<Served>, RequestOp)>;

/// The tokens of one Ack that name the same partition, and their positions
/// in the request (two parallel vectors, so the tokens go to the partition
/// as they are).
struct TokenGroup {
    partition: Rc<Served>,
    positions: Vec<usize>,
    tokens: Vec<crate::queue::DeliveryToken>,
}

/// Cuts a message to what an error response may carry
/// (`ERROR_MESSAGE_BYTES_MAX`), at a character boundary.
fn clip_message(mut message: String) -> String {
    let max = spool_wire::proto::limits::ERROR_MESSAGE_BYTES_MAX;
    if message.len() > max {
        let mut end = max;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

pub(super) fn error(code: ErrorCode, message: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(code, message)
}

pub(super) fn partition_error(error: &PartitionError) -> ErrorResponse {
    error_from(error.code(), error.to_string())
}

fn error_from(code: ErrorCode, message: String) -> ErrorResponse {
    ErrorResponse::new(code, clip_message(message))
}

pub(super) fn control_error(failure: &CoordinatorError) -> ErrorResponse {
    use crate::control::assignment::AssignmentError;
    let code = match failure {
        CoordinatorError::Assignment(AssignmentError::QueueExists(_)) => ErrorCode::QueueExists,
        CoordinatorError::Assignment(AssignmentError::QueueNotFound(_)) => ErrorCode::QueueNotFound,
        CoordinatorError::Assignment(_) => ErrorCode::InvalidArgument,
        CoordinatorError::Busy => ErrorCode::Throttled,
        CoordinatorError::Timeout { .. } => ErrorCode::Timeout,
        CoordinatorError::Stopped => ErrorCode::ShuttingDown,
        CoordinatorError::CreateFailed { .. } => ErrorCode::StorageFailed,
        CoordinatorError::CreateRefused { .. } => ErrorCode::InvalidArgument,
        CoordinatorError::ResizeIncomplete { .. } => ErrorCode::StorageFailed,
        CoordinatorError::NotClustered => ErrorCode::InvalidArgument,
        // Another node leads the controller: its address, as `route` does
        // (NOT_OWNER to an older client).
        CoordinatorError::NotLeader { client, .. } => {
            let mut reply = error_from(ErrorCode::NotLeader, failure.to_string());
            reply.owner =
                client.map(|addr| NodeAddress { host: addr.ip().to_string(), port: addr.port() });
            return reply;
        }
        #[allow(unreachable_patterns)]
        _ => ErrorCode::Internal,
    };
    error_from(code, failure.to_string())
}

impl SpoolHandler {
    pub fn new(state: Rc<ShardState>) -> Self {
        let auth =
            ShardAuth::new(state.config.auth.clone(), &state.config.data_dir, state.clock.clone());
        let quotas = ShardQuotas::new(state.shard.0, state.config.shards);
        let sessions = Rc::new(super::sessions::Sessions::new());
        Self { state, auth, quotas, sessions }
    }

    /// The housekeeping tick's share of quota work (leases past their
    /// deadline stop being tracked; the stored quotas recomputed from the
    /// partitions when some principal has one).
    pub fn quota_tick(&self) {
        self.quotas.tick((self.state.clock)());
        let policy = self.auth.policy();
        if policy.quotas().iter().any(|(_, config)| config.limits_stored()) {
            let mut totals: HashMap<PrincipalId, Stored> = HashMap::new();
            let partitions = self.state.partitions.borrow();
            for served in partitions.values() {
                served.partition.with_state(|state| {
                    for (principal, stored) in state.stored().iter() {
                        let total = totals.entry(principal).or_default();
                        total.messages += stored.messages;
                        total.bytes += stored.bytes;
                    }
                });
            }
            self.quotas.recompute_stored(&policy, partitions.len(), &totals);
        }
    }

    /// What `principal`'s records hold on this shard's partitions.
    fn stored_here(&self, principal: PrincipalId) -> Stored {
        let mut total = Stored::default();
        for served in self.state.partitions.borrow().values() {
            let stored = served.partition.with_state(|state| state.stored().stored(principal));
            total.messages += stored.messages;
            total.bytes += stored.bytes;
        }
        total
    }

    /// This shard's quota figures, per principal with a quota.
    pub fn quota_report(&self) -> Vec<QuotaReport> {
        self.quotas.report(&self.auth.policy(), (self.state.clock)())
    }

    /// Puts a reloaded auth policy in force on this shard (`auth::reload`).
    pub fn replace_policy(&self, update: &crate::auth::reload::CurrentPolicy) {
        self.auth.replace_policy(update.policy.clone(), update.generation);
    }

    pub(super) fn queue_exists(&self, queue: &str) -> bool {
        QueueName::new(queue).is_ok_and(|name| self.state.table.borrow().queue(&name).is_some())
    }

    /// The local partition, or the error a client should see: NOT_OWNER (or
    /// NOT_LEADER from a replica that does not lead)
    /// with the owner's address, QUEUE_NOT_FOUND or PARTITION_NOT_FOUND.
    pub(super) fn route(
        &self,
        queue: &str,
        partition: PartitionId,
    ) -> Result<Rc<Served>, ErrorResponse> {
        if let Some(found) = self.state.served(queue, partition) {
            if let Some(cluster) = &self.state.cluster {
                if !found.partition.serving() {
                    return Err(cluster.not_leader(found.partition.name()));
                }
            }
            return Ok(found);
        }
        let name = QueueName::new(queue)
            .map_err(|failure| error(ErrorCode::InvalidArgument, failure.to_string()))?;
        let table = self.state.table.borrow();
        let Some(entry) = table.queue(&name) else {
            return Err(error(ErrorCode::QueueNotFound, format!("queue {queue} does not exist")));
        };
        let Some(assignment) = entry.partitions.get(partition.0 as usize) else {
            return Err(error(
                ErrorCode::PartitionNotFound,
                format!("queue {queue} has {} partitions", entry.partitions.len()),
            ));
        };
        let hosted =
            self.state.cluster.as_ref().is_none_or(|cluster| cluster.hosts(entry, partition));
        if assignment.shard == self.state.shard && hosted {
            // Owned here but not open: open failed (say why), or still opening.
            let reason =
                self.state.unavailable.borrow().get(&(queue.to_owned(), partition)).cloned();
            let message = match reason {
                Some(reason) => format!("partition {queue}/{partition} refused to open: {reason}"),
                None => format!("partition {queue}/{partition} is not open on this shard"),
            };
            return Err(error(ErrorCode::StorageFailed, clip_message(message)));
        }
        let owner = match &self.state.cluster {
            Some(cluster) => cluster
                .leader_addr(entry, partition, assignment.shard)
                .unwrap_or_else(|| self.state.shard_addr(assignment.shard)),
            None => self.state.shard_addr(assignment.shard),
        };
        let mut reply = error(
            ErrorCode::NotOwner,
            format!("partition {queue}/{partition} is served at {owner}"),
        );
        reply.owner = Some(NodeAddress { host: owner.ip().to_string(), port: owner.port() });
        Err(reply)
    }

    /// Answers `request`; a data request names in `timed` the partition it
    /// was routed to, whose latency histogram counts it once the reply is
    /// built.
    async fn dispatch(
        &self,
        request: Request<'_>,
        principal: PrincipalId,
        started: Instant,
        timed: &mut Timed,
    ) -> Result<Response<'static>, ErrorResponse> {
        match request {
            Request::Enqueue(enqueue) => {
                let partition = self.route(enqueue.queue, enqueue.partition)?;
                *timed = Some((partition.clone(), RequestOp::Enqueue));
                let outcomes =
                    partition.enqueue_as(enqueue.batch, principal).await.map_err(|e| {
                        partition.requests.failed(&e);
                        partition_error(&e)
                    })?;
                let base_offset = outcomes
                    .iter()
                    .find_map(|outcome| match outcome {
                        EnqueueOutcome::Appended { offset } => Some(*offset),
                        EnqueueOutcome::Duplicate { .. } | EnqueueOutcome::Moved => None,
                    })
                    .unwrap_or_default();
                let records = outcomes
                    .iter()
                    .map(|outcome| match outcome {
                        EnqueueOutcome::Appended { offset } => {
                            RecordOutcome::Appended { offset: *offset }
                        }
                        EnqueueOutcome::Duplicate { original } => {
                            RecordOutcome::Duplicate { original_offset: *original }
                        }
                        // NOT_OWNER to an Enqueue older than v2 (the
                        // response's writer maps it).
                        EnqueueOutcome::Moved => {
                            RecordOutcome::Rejected { code: ErrorCode::KeyMoved }
                        }
                    })
                    .collect();
                Ok(Response::Enqueue(proto::EnqueueResponse { base_offset, records }))
            }
            Request::Extend(extend) => {
                let token = token_from_wire(&extend.token)
                    .map_err(|e| error(ErrorCode::InvalidToken, e.to_string()))?;
                let claim = *token.claim();
                let partition = self.route_token(claim.queue, claim.partition)?;
                *timed = Some((partition.clone(), RequestOp::Extend));
                let lease = (extend.lease_ms > 0).then_some(u64::from(extend.lease_ms));
                let deadline = partition.extend(&token, lease).await.map_err(|e| {
                    partition.requests.failed(&e);
                    if e.code() == ErrorCode::StaleToken {
                        self.quotas.forget(&token.to_bytes());
                        self.sessions.forget(&token);
                    }
                    partition_error(&e)
                })?;
                self.quotas.extended(&token.to_bytes(), deadline);
                self.sessions.extended(&token, deadline);
                partition.requests.extended();
                Ok(Response::Extend(ExtendResponse { lease_deadline_ms: deadline }))
            }
            Request::Ack(ack) => Ok(Response::Ack(self.ack(&ack.tokens, started).await)),
            Request::Release(release) => {
                let token = token_from_wire(&release.token)
                    .map_err(|e| error(ErrorCode::InvalidToken, e.to_string()))?;
                let claim = *token.claim();
                let partition = self.route_token(claim.queue, claim.partition)?;
                *timed = Some((partition.clone(), RequestOp::Release));
                let not_before = (release.delay_ms > 0)
                    .then(|| (self.state.clock)().saturating_add(u64::from(release.delay_ms)));
                tracing::debug!(offset = claim.offset.0, reason = release.reason, "release");
                let due = partition
                    .release(&token, RELEASE_REASON_WORKER, not_before)
                    .await
                    .map_err(|e| {
                        partition.requests.failed(&e);
                        if e.code() == ErrorCode::StaleToken {
                            self.quotas.forget(&token.to_bytes());
                            self.sessions.forget(&token);
                        }
                        partition_error(&e)
                    })?;
                self.quotas.forget(&token.to_bytes());
                self.sessions.forget(&token);
                Ok(Response::Release(ReleaseResponse { not_before_ms: due }))
            }
            Request::CreateQueue(create) => {
                let config = queue_config_from_wire(&create.config);
                let created = self
                    .state
                    .coordinator
                    .create_queue_async(
                        &create.name,
                        create.config.partitions,
                        config,
                        ADMIN_APPLY_TIMEOUT_MS,
                    )
                    .await
                    .map_err(|e| control_error(&e))?;
                Ok(Response::CreateQueue(CreateQueueResponse {
                    assignment_version: created.version,
                }))
            }
            Request::DeleteQueue(delete) => {
                let version = self
                    .state
                    .coordinator
                    .delete_queue_async(&delete.name, ADMIN_APPLY_TIMEOUT_MS)
                    .await
                    .map_err(|e| control_error(&e))?;
                Ok(Response::DeleteQueue(DeleteQueueResponse { assignment_version: version }))
            }
            Request::ResizeQueue(resize) => self.resize(&resize.name, resize.partitions).await,
            Request::CreateSubscription(create) => self.create_subscription(&create).await,
            Request::DeleteSubscription(delete) => self.delete_subscription(&delete).await,
            Request::ListQueues(_) => {
                let table = self.state.table.borrow();
                let queues = table
                    .queues()
                    .map(|(name, entry)| QueueSummary {
                        name: name.as_str().to_owned(),
                        partitions: entry.partitions.len() as u32,
                    })
                    .collect();
                Ok(Response::ListQueues(ListQueuesResponse { queues }))
            }
            Request::DescribeQueue(describe) => self.describe(&describe.name).await,
            Request::Metadata(metadata) => self.metadata(&metadata.queues),
            Request::Peek(peek) => self.peek(&peek).await,
            Request::Purge(purge) => self.purge(&purge).await,
            Request::DeadLetters(list) => self.dead_letters(&list).await,
            Request::Redrive(redrive) => self.redrive(&redrive).await,
            // The client's liveness probe (protocol.md, "Ping"): answered
            // here, after the handshake gate like any request, with no
            // partition, disk or other core involved.
            Request::Ping(_) => Ok(Response::Ping(PingResponse {})),
            Request::Claim(_) => unreachable!("claims are answered by claim()"),
            Request::Session(_) => unreachable!("sessions are answered by session()"),
            Request::CancelClaim(_) => unreachable!("cancels are answered by answer()"),
            Request::Authenticate(_) => unreachable!("handshakes are answered by answer()"),
        }
    }

    /// The partition named inside a token, if served here.
    fn route_token(
        &self,
        queue_id: crate::queue::QueueId,
        partition: PartitionId,
    ) -> Result<Rc<Served>, ErrorResponse> {
        if let Some(found) = self.state.served_by_id(queue_id, partition) {
            // A cluster member that does not lead answers NOT_LEADER with the
            // leader, as `route` does: its state is a follower's, and a
            // token it took would be refused as stale (or worse, settled on
            // a copy that does not serve).
            if let Some(cluster) = &self.state.cluster {
                if !found.partition.serving() {
                    return Err(cluster.not_leader(found.partition.name()));
                }
            }
            return Ok(found);
        }
        let table = self.state.table.borrow();
        let Some((name, _)) = table.queue_by_id(queue_id) else {
            return Err(error(ErrorCode::StaleToken, "the token's queue no longer exists"));
        };
        let name = name.as_str().to_owned();
        drop(table);
        self.route(&name, partition)
    }

    /// Acks `tokens`, grouped by partition; each partition the request
    /// touched counts it once in its ack latency histogram.
    async fn ack(&self, tokens: &[proto::DeliveryToken], started: Instant) -> AckResponse {
        let mut results = vec![ErrorCode::None; tokens.len()];
        // Group by partition, keeping each token's position. Usually one
        // partition: one group, its vectors sized for every token left.
        let mut groups: Vec<TokenGroup> = Vec::with_capacity(1);
        for (index, raw) in tokens.iter().enumerate() {
            let token = match token_from_wire(raw) {
                Ok(token) => token,
                Err(_) => {
                    results[index] = ErrorCode::InvalidToken;
                    continue;
                }
            };
            let claim = *token.claim();
            match self.route_token(claim.queue, claim.partition) {
                Ok(partition) => {
                    match groups.iter_mut().find(|group| Rc::ptr_eq(&group.partition, &partition)) {
                        Some(group) => {
                            group.positions.push(index);
                            group.tokens.push(token);
                        }
                        None => {
                            let left = tokens.len() - index;
                            let mut group = TokenGroup {
                                partition,
                                positions: Vec::with_capacity(left),
                                tokens: Vec::with_capacity(left),
                            };
                            group.positions.push(index);
                            group.tokens.push(token);
                            groups.push(group);
                        }
                    }
                }
                Err(reply) => results[index] = reply.code,
            }
        }
        // The partitions' acks run at once: each waits for its own commit
        // to be durable, and on the shard journal those commits share a
        // sync (an Ack for deliveries of a claim of any partition names
        // many partitions).
        let answered = match groups.as_slice() {
            [only] => vec![only.partition.ack(&only.tokens).await],
            many => {
                futures_util::future::join_all(
                    many.iter().map(|group| group.partition.ack(&group.tokens)),
                )
                .await
            }
        };
        for (TokenGroup { partition, positions, tokens }, outcomes) in groups.iter().zip(answered) {
            for ((index, token), outcome) in positions.iter().zip(tokens).zip(outcomes) {
                results[*index] = match outcome {
                    Ok(()) => ErrorCode::None,
                    Err(failure) => {
                        partition.requests.token_refused(failure.code());
                        failure.code()
                    }
                };
                if matches!(results[*index], ErrorCode::None | ErrorCode::StaleToken) {
                    self.quotas.forget(&token.to_bytes());
                    self.sessions.forget(token);
                }
            }
        }
        for group in &groups {
            group.partition.requests.observe(RequestOp::Ack, started);
        }
        AckResponse { results }
    }

    pub(super) fn encode_error(
        reply: &ErrorResponse,
        correlation_id: CorrelationId,
        api_key: u16,
        api_version: u16,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        if reply.encode(correlation_id, api_key, api_version, &mut out).is_err() {
            out.clear();
            let fallback = error(ErrorCode::Internal, "error reply could not be encoded");
            // Cannot fail: a fixed code and a short message.
            let _ = fallback.encode(correlation_id, api_key, api_version, &mut out);
        }
        out
    }

    pub(super) async fn answer(&self, owned: &OwnedFrame, connection: &Rc<Connection>) -> Vec<u8> {
        let frame = match &owned.header {
            Ok(header) => owned.frame(*header),
            Err(failure) => {
                // Unknown api or version: answer and carry on.
                let (correlation_id, api_key, api_version) = raw_ids(&owned.bytes);
                return Self::encode_error(
                    &ErrorResponse::from_proto_error(failure),
                    correlation_id,
                    api_key,
                    api_version,
                );
            }
        };
        let correlation_id = frame.header.correlation_id;
        let api_key = frame.header.api_key.as_u16();
        let api_version = frame.header.api_version;
        let request = match Request::decode(&frame) {
            Ok(request) => request,
            Err(failure) => {
                return Self::encode_error(
                    &ErrorResponse::from_proto_error(&failure),
                    correlation_id,
                    api_key,
                    api_version,
                )
            }
        };
        // Latency counts from here (the request decoded) to the reply built.
        let started = crate::clock::instant_now();
        if let Request::Authenticate(handshake) = &request {
            let mut out = Vec::new();
            let encoded = match self.auth.authenticate(handshake, connection).await {
                Ok(response) => Response::Authenticate(response)
                    .encode_version(correlation_id, api_version, &mut out)
                    .map_err(|e| error(ErrorCode::Internal, e.to_string())),
                Err(reply) => Err(reply),
            };
            return match encoded {
                Ok(()) => out,
                Err(reply) => Self::encode_error(&reply, correlation_id, api_key, api_version),
            };
        }
        let grants = match self.auth.grants(connection).await {
            Ok(grants) => grants,
            Err(reply) => {
                return Self::encode_error(&reply, correlation_id, api_key, api_version);
            }
        };
        let audit = ShardAuth::audit_target(&request, &self.state);
        if let Err(reply) = self.auth.authorize(&request, &grants, connection, &self.state) {
            if let Some(target) = audit {
                let now = (self.state.clock)();
                self.auth.audit(target, grants.name(), Err(&reply), now).await;
            }
            return Self::encode_error(&reply, correlation_id, api_key, api_version);
        }
        let mut stored_charge = None;
        let pace_percent = self.state.config.consumer_pace_percent;
        // An enqueue counts as the shard's intake while it is handled, and
        // spends the consumer pace's credit while paced (`net/pace.rs`).
        let _intake = match &request {
            Request::Enqueue(enqueue) if pace_percent > 0 => {
                let messages = spool_wire::batch::BatchHeader::parse(enqueue.batch)
                    .map_or(0, |header| header.record_count as usize);
                Some(connection.pace().intake(started, owned.bytes.len(), messages, pace_percent))
            }
            _ => None,
        };
        if let Request::Enqueue(enqueue) = &request {
            // Charged only where the partition is served: a request answered
            // NOT_OWNER costs nothing. Without an enqueue quota (and with
            // authentication off) this is one check.
            if grants.quota().limits_enqueue()
                && self.state.served(enqueue.queue, enqueue.partition).is_some()
            {
                let now = (self.state.clock)();
                if let Err(reply) = self.quotas.charge_enqueue(&grants, enqueue.batch, now) {
                    return Self::encode_error(&reply, correlation_id, api_key, api_version);
                }
            }
            // The stored quotas: held while the enqueue runs (`StoredCharge`).
            if grants.quota().limits_stored()
                && self.state.served(enqueue.queue, enqueue.partition).is_some()
            {
                let waiting = self.state.partitions_waiting_to_open();
                if let Err(reply) = self.quotas.check_stored_known(&grants, waiting) {
                    return Self::encode_error(&reply, correlation_id, api_key, api_version);
                }
                let id = grants.principal_id();
                let partitions = self.state.partitions.borrow().len();
                let here = || self.stored_here(id);
                match self.quotas.charge_stored(&grants, enqueue.batch, partitions, here) {
                    Ok(charge) => stored_charge = charge,
                    Err(reply) => {
                        return Self::encode_error(&reply, correlation_id, api_key, api_version)
                    }
                }
            }
        }
        let mut out = Vec::new();
        let mut timed: Timed = None;
        let encoded = if let Request::Claim(claim) = &request {
            // Claims borrow record bytes from the partition's reply.
            match self.claim(claim, correlation_id, connection, &grants, &mut timed).await {
                Ok(claimed) => {
                    connection.note_claim();
                    if pace_percent > 0 {
                        let now = crate::clock::instant_now();
                        connection.pace().claimed(now, claim.credits, claimed.len(), pace_percent);
                    }
                    let deliveries = claimed
                        .iter()
                        .map(|item| proto::Delivery {
                            token: token_to_wire(&item.delivery.token),
                            partition: item.delivery.token.claim().partition,
                            offset: item.delivery.offset,
                            attempt: u32::from(item.delivery.attempt),
                            generation: item.delivery.generation.into(),
                            record: &item.record,
                        })
                        .collect();
                    let deadline =
                        claimed.iter().map(|item| item.delivery.deadline_ms).max().unwrap_or(0);
                    // In the version asked: a v0 client reads no partitions.
                    Response::Claim(ClaimResponse { lease_deadline_ms: deadline, deliveries })
                        .encode_version(correlation_id, api_version, &mut out)
                        .map_err(|e| error(ErrorCode::Internal, e.to_string()))
                }
                Err(reply) => Err(reply),
            }
        } else if let Request::Session(session) = &request {
            match self.session(session, connection) {
                Ok(response) => response
                    .encode_version(correlation_id, api_version, &mut out)
                    .map_err(|e| error(ErrorCode::Internal, e.to_string())),
                Err(reply) => Err(reply),
            }
        } else if let Request::CancelClaim(cancel) = &request {
            // Only this connection's claims are in its map: another
            // connection's id is simply not found.
            let outcome = if connection.cancel_claim(cancel.claim.0) {
                CancelOutcome::Cancelled
            } else {
                CancelOutcome::NotPending
            };
            Response::CancelClaim(CancelClaimResponse { outcome })
                .encode_version(correlation_id, api_version, &mut out)
                .map_err(|e| error(ErrorCode::Internal, e.to_string()))
        } else {
            // Records are attributed (an `Attributed` event per batch) only
            // for a principal with a stored quota: other producers pay
            // nothing for it.
            let principal = if grants.quota().limits_stored() {
                grants.principal_id()
            } else {
                PrincipalId::UNKNOWN
            };
            let mut answered = self.dispatch(request, principal, started, &mut timed).await;
            if let Ok(response) = answered.as_mut() {
                self.auth.filter_listing(response, &grants);
            }
            if let Some(target) = audit.filter(|target| !target.dry_run) {
                let now = (self.state.clock)();
                self.auth.audit(target, grants.name(), answered.as_ref(), now).await;
            }
            match answered {
                Ok(response) => response
                    .encode_version(correlation_id, api_version, &mut out)
                    .map_err(|e| error(ErrorCode::Internal, e.to_string())),
                Err(reply) => Err(reply),
            }
        };
        let out = match encoded {
            Ok(()) => out,
            Err(reply) => Self::encode_error(&reply, correlation_id, api_key, api_version),
        };
        if let Some((partition, op)) = timed {
            partition.requests.observe(op, started);
        }
        drop(stored_charge);
        out
    }
}
