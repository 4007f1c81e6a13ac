//! The HTTP API (`/v1/...`): JSON for an operator or a curl user, served on
//! the admin port.
//!
//! The admin thread is a **gateway**: it serves each request with the
//! project's own client library (`spool-client`) over loopback TCP to the
//! broker's own shard ports (shard 0's listen address is its bootstrap), so
//! the data path stays where it is — on the shard that owns the partition,
//! reached through its port like any client's — and every rule (validation,
//! limits, admission, codes) is the binary protocol's own. The gateway
//! keeps one [`Client`] (one connection per shard, opened on first use)
//! and one [`Producer`] (linger 0, no retries: an HTTP caller retries with
//! the same `id`, which the broker deduplicates).
//!
//! Delivery tokens travel as strings ([`token`]) that carry their queue and
//! partition, so `POST /v1/acks`, `/v1/extends` and `/v1/releases` need no
//! queue in the path. Errors are [`ApiError`]s: the stable wire codes with
//! an HTTP status per code.
//!
//! Bounds ([`limits`]): body size (413 `FRAME_TOO_LARGE` naming the limit),
//! body read time, requests in flight (429 `THROTTLED`), claim credits,
//! bytes and wait, tokens per ack, dead letters per listing; the admin
//! port's own connection bound holds too. Each request's body takes its
//! bytes from the admin port's memory pool before it is read, waiting up to
//! `MEMORY_WAIT_TIMEOUT` (then 503 `THROTTLED`: `super::memory`).

pub mod caller;
pub mod error;
mod inspect;
pub mod json;
pub mod limits;
mod nodes;
mod ops;
pub mod quotas;
mod replicas;
mod resize;
pub mod routes;
mod subscriptions;
pub mod token;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use spool_client::spool_wire::proto::PartitionId;
use spool_client::{
    Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig, Credentials, Message,
    Producer, ProducerConfig,
};
use spool_wire::batch::MessageId;
use spool_wire::ErrorCode;
use tokio::sync::{Mutex, Semaphore};

use self::error::ApiError;
use self::limits::{
    ACK_TOKENS_MAX_HTTP, BODY_BYTES_MAX, BODY_READ_TIMEOUT, CLAIM_BYTES_MAX_HTTP,
    CLAIM_CREDITS_MAX_HTTP, CLAIM_WAIT_MS_MAX_HTTP, GATEWAY_CALLERS_MAX, MEMORY_WAIT_TIMEOUT,
    REQUESTS_IN_FLIGHT_MAX, SHARD_REQUEST_TIMEOUT,
};
use self::routes::Operation;
use super::memory::AdminMemory;
use crate::shard::CoordinatorHandle;

const JSON: &str = "application/json";

/// A JSON answer.
pub fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    response
}

/// The gateway's connections to the shards, opened on first use.
struct Connected {
    client: Client,
    producer: Producer,
}

tokio::task_local! {
    /// The credentials of the HTTP request being served (from its bearer
    /// token), read by [`Gateway::connected`] so each request reaches the
    /// shards as its own caller.
    static CALLER: Option<Credentials>;
}

/// Which connections a request uses: one set per caller (principal and a
/// MAC of its secret), `None` for requests without a token.
type CallerKey = Option<(String, [u8; 32])>;

/// The API's state: where the shards are, the connections to them (one
/// set per caller), and the in-flight bound.
pub struct Gateway {
    bootstrap: String,
    coordinator: CoordinatorHandle,
    connected: Mutex<HashMap<CallerKey, Connected>>,
    in_flight: Arc<Semaphore>,
    /// The admin port's memory pool: each request's body takes from it.
    memory: Arc<AdminMemory>,
    /// Whether the broker has authentication on: then a request without a
    /// bearer token is refused here (401) before any connection is made.
    auth_required: bool,
    /// Key of the MAC that tells callers' secrets apart in `connected`.
    mac_key: [u8; 32],
    /// Bearer tokens verified here first, with the failed-login limiter.
    callers: caller::CallerAuth,
    /// TLS towards the shard ports, when they speak it.
    shard_tls: Option<spool_client::TlsConfig>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Gateway").field("bootstrap", &self.bootstrap).finish()
    }
}

/// Where the gateway connects for `listen` (shard 0's listen address): an
/// unspecified address (`0.0.0.0`, `::`) is reached on loopback.
pub fn bootstrap_address(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port()).to_string()
}

/// The request's parsed parts a handler needs.
struct Call {
    operation: Operation,
    queue: Option<String>,
    query: Option<String>,
    body: Bytes,
    /// The caller's rights as the admin port verified its token (`None`:
    /// authentication off).
    grants: Option<Arc<crate::auth::Grants>>,
}

impl Gateway {
    /// A gateway to the shards whose first port is `shard_listen`.
    /// With `auth_required`, every API request needs
    /// `Authorization: Bearer <principal>:<secret>` and is served with that
    /// principal's rights (the shards check them, as for any client).
    /// Request bodies take their bytes from `memory`.
    pub fn new(
        shard_listen: SocketAddr,
        coordinator: CoordinatorHandle,
        policy: crate::auth::AuthPolicy,
        memory: Arc<AdminMemory>,
    ) -> Self {
        let auth_required = policy.is_enabled();
        Self {
            bootstrap: bootstrap_address(shard_listen),
            callers: caller::CallerAuth::new(coordinator.clone()),
            coordinator,
            connected: Mutex::new(HashMap::new()),
            in_flight: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            memory,
            auth_required,
            mac_key: rand::random(),
            shard_tls: None,
        }
    }

    /// The admin port's memory pool.
    pub fn memory(&self) -> &Arc<AdminMemory> {
        &self.memory
    }

    /// The same gateway, reaching the shards over TLS.
    #[must_use]
    pub fn with_shard_tls(mut self, tls: spool_client::TlsConfig) -> Self {
        self.shard_tls = Some(tls);
        self
    }

    /// Serves one API request (`operation` already resolved from the route
    /// table).
    pub async fn serve(
        &self,
        operation: Operation,
        queue: Option<String>,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        let Ok(_slot) = self.in_flight.try_acquire() else {
            return ApiError::new(
                ErrorCode::Throttled,
                format!("more than {REQUESTS_IN_FLIGHT_MAX} API requests in flight"),
            )
            .with_detail("limit", REQUESTS_IN_FLIGHT_MAX)
            .into_response();
        };
        let credentials = match bearer_credentials(&request) {
            Ok(credentials) => credentials,
            Err(error) => return challenge(error.into_response()),
        };
        if self.auth_required && credentials.is_none() {
            let error = ApiError::new(
                ErrorCode::Unauthenticated,
                "authentication is on: send Authorization: Bearer <principal>:<secret>",
            );
            return challenge(error.into_response());
        }
        let peer = request.extensions().get::<caller::PeerIp>().map(|peer| peer.0);
        let grants = match self.callers.verify(credentials.as_ref(), peer).await {
            Ok(grants) => grants,
            Err(error) => return challenge(error.into_response()),
        };
        let query = request.uri().query().map(str::to_owned);
        // Held until the answer is built (it is charged then, by the caller).
        let _memory = match body_bytes(&request) {
            Ok(asked) => match self.memory.take_within(asked, MEMORY_WAIT_TIMEOUT).await {
                Ok(grant) => grant,
                Err(refused) => return ApiError::from(refused).into_response(),
            },
            Err(error) => return error.into_response(),
        };
        let body = match read_body(request).await {
            Ok(body) => body,
            Err(error) => return error.into_response(),
        };
        let call = Call { operation, queue, query, body, grants };
        match CALLER.scope(credentials, self.dispatch(&call)).await {
            Ok((status, body)) => json_response(status, &body),
            Err(error) => challenge(error.into_response()),
        }
    }

    async fn dispatch(&self, call: &Call) -> Result<(StatusCode, Value), ApiError> {
        if self.coordinator.stop_requested() {
            return Err(ApiError::new(ErrorCode::ShuttingDown, "the broker is stopping"));
        }
        let queue = call.queue.as_deref().unwrap_or_default();
        let ok = |body| Ok((StatusCode::OK, body));
        match call.operation {
            Operation::ListQueues => ok(self.list_queues().await?),
            Operation::CreateQueue => {
                Ok((StatusCode::CREATED, self.create_queue(parse(&call.body)?).await?))
            }
            Operation::DescribeQueue => ok(self.describe_queue(queue).await?),
            Operation::DeleteQueue => ok(self.delete_queue(queue).await?),
            Operation::Send => ok(self.send(queue, parse(&call.body)?).await?),
            Operation::Claim => ok(self.claim(queue, parse(&call.body)?).await?),
            Operation::Ack => ok(self.ack(parse(&call.body)?).await?),
            Operation::Extend => ok(self.extend(parse(&call.body)?).await?),
            Operation::Release => ok(self.release(parse(&call.body)?).await?),
            Operation::DeadLetters => ok(self.dead_letters(queue, call.query.as_deref()).await?),
            Operation::Redrive => ok(self.redrive(queue, parse(&call.body)?).await?),
            Operation::Purge => ok(self.purge(queue, parse(&call.body)?).await?),
            Operation::ResizeQueue => ok(self.resize_queue(queue, parse(&call.body)?).await?),
            Operation::ReloadAuth => ok(self.reload_auth(call).await?),
            Operation::Acl => ok(self.acl(call)?),
            Operation::Quotas => ok(self.quotas(call).await?),
            Operation::ClusterNodes => ok(self.cluster_nodes(call)?),
            Operation::ClusterPartitions => ok(self.cluster_partitions(call)?),
            Operation::ClusterMove => ok(self.cluster_move(call, parse(&call.body)?).await?),
            Operation::ListSubscriptions
            | Operation::CreateSubscription
            | Operation::DescribeSubscription
            | Operation::DeleteSubscription
            | Operation::SeekSubscription => self.subscription_call(call, queue).await,
            Operation::Metrics | Operation::Live | Operation::Ready => {
                Err(ApiError::new(ErrorCode::Internal, "not an API route"))
            }
        }
    }

    /// The caller's client and producer, connecting on first use (and
    /// again after a failed connect). A caller with a bearer token gets
    /// connections that authenticated as its principal, so the shards
    /// apply its rights; the gateway has none of its own. At most
    /// [`GATEWAY_CALLERS_MAX`] callers keep connections; past it one is
    /// dropped (its next request connects again).
    async fn connected(&self) -> Result<(Client, Producer), ApiError> {
        let credentials = CALLER.try_with(Clone::clone).ok().flatten();
        let key: CallerKey = credentials.as_ref().map(|credentials| {
            let mac = blake3::keyed_hash(&self.mac_key, credentials.secret.as_bytes());
            (credentials.principal.clone(), *mac.as_bytes())
        });
        let mut connected = self.connected.lock().await;
        if let Some(connected) = connected.get(&key) {
            return Ok((connected.client.clone(), connected.producer.clone()));
        }
        let config = ClientConfig {
            connection: ConnectionConfig {
                request_timeout: SHARD_REQUEST_TIMEOUT,
                credentials,
                tls: self.shard_tls.clone(),
                ..ConnectionConfig::default()
            },
        };
        let client = Client::connect_with(&self.bootstrap, config)
            .await
            .map_err(|error| self.fail(error))?;
        let producer_config = ProducerConfig { retries: 0, ..ProducerConfig::default() };
        let producer =
            Producer::new(client.clone(), producer_config).map_err(|error| self.fail(error))?;
        if connected.len() >= GATEWAY_CALLERS_MAX {
            if let Some(evicted) = connected.keys().next().cloned() {
                connected.remove(&evicted);
            }
        }
        connected.insert(key, Connected { client: client.clone(), producer: producer.clone() });
        Ok((client, producer))
    }

    async fn client(&self) -> Result<Client, ApiError> {
        Ok(self.connected().await?.0)
    }

    fn fail(&self, error: ClientError) -> ApiError {
        ApiError::from_client(error, self.coordinator.stop_requested())
    }

    /// Maps `error` about `queue`, and forgets the queue's cached layout
    /// when the broker no longer knows it (deleted, or recreated elsewhere).
    fn fail_on(&self, client: &Client, queue: &str, error: ClientError) -> ApiError {
        if matches!(
            error.code(),
            Some(
                ErrorCode::QueueNotFound
                    | ErrorCode::PartitionNotFound
                    | ErrorCode::NotOwner
                    | ErrorCode::NotLeader
            )
        ) {
            client.forget_queue(queue);
        }
        self.fail(error)
    }

    /// The lease a claim or extend of `queue` uses when it names none: the
    /// queue's `lease_default_ms` from the committed catalog (a local read),
    /// else the client library's default (the broker then answers for an
    /// unknown queue).
    fn lease_default_ms(&self, queue: &str) -> u32 {
        let table = self.coordinator.catalog_snapshot();
        crate::control::assignment::QueueName::new(queue)
            .ok()
            .and_then(|name| table.queue(&name).map(|entry| entry.config.lease_default_ms))
            .and_then(|lease_ms| u32::try_from(lease_ms).ok())
            .unwrap_or(spool_client::limits::LEASE_MS_DEFAULT)
    }

    async fn list_queues(&self) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let queues = Admin::new(client).list_queues().await.map_err(|error| self.fail(error))?;
        let queues: Vec<Value> = queues
            .iter()
            .map(|queue| json!({ "name": queue.name, "partitions": queue.partitions }))
            .collect();
        Ok(json!({ "queues": queues }))
    }

    async fn create_queue(&self, body: json::CreateQueue) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let config = body.config();
        let version = Admin::new(client)
            .create_queue(&body.name, config.clone())
            .await
            .map_err(|error| self.fail(error))?;
        Ok(json!({
            "name": body.name,
            "config": json::config(&config),
            "assignment_version": version.0,
        }))
    }

    async fn describe_queue(&self, queue: &str) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let described = Admin::new(client.clone())
            .describe_queue(queue)
            .await
            .map_err(|error| self.fail_on(&client, queue, error))?;
        let partitions: Vec<Value> =
            described.partitions.iter().map(json::partition_stats).collect();
        let (retained_messages, retained_bytes, oldest_retained_age_ms) =
            json::retained(&described.partitions);
        Ok(json!({
            "name": described.name,
            "config": json::config(&described.config),
            "partitions": partitions,
            "keys": json::key_map(&described.keys),
            "retained_messages": retained_messages,
            "retained_bytes": retained_bytes,
            "oldest_retained_age_ms": oldest_retained_age_ms,
            "lanes": json::merged_lanes(&described.partitions),
        }))
    }

    async fn delete_queue(&self, queue: &str) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let version = Admin::new(client.clone())
            .delete_queue(queue)
            .await
            .map_err(|error| self.fail_on(&client, queue, error))?;
        Ok(json!({ "name": queue, "deleted": true, "assignment_version": version.0 }))
    }

    async fn send(&self, queue: &str, body: json::SendMessage) -> Result<Value, ApiError> {
        let mut message = Message::new(body.payload_bytes()?);
        if let Some(key) = &body.key {
            message = message.key(key.as_bytes().to_vec());
        }
        if let Some(id) = body.message_id()? {
            message = message.id(MessageId(id));
        }
        message.priority = body.priority.unwrap_or(0);
        for (key, value) in body.headers.iter().flatten() {
            message = message.header(key.as_bytes().to_vec(), value.as_bytes().to_vec());
        }
        let now = crate::clock::now_ms();
        message.delay_ms = match (body.delay_ms, body.not_before_ms) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give at most one of delay_ms and not_before_ms"))
            }
            (Some(delay), None) => delay,
            (None, Some(at)) => at.saturating_sub(now),
            (None, None) => 0,
        };
        message.expiry_ms = match (body.expiry_ms, body.ttl_ms) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give at most one of expiry_ms and ttl_ms"))
            }
            (Some(at), None) => at,
            (None, Some(ttl)) => now.saturating_add(ttl),
            (None, None) => 0,
        };
        let id = message.message_id.unwrap_or_else(|| MessageId(rand::random()));
        message.message_id = Some(id);
        let (client, producer) = self.connected().await?;
        let fail = |error| self.fail_on(&client, queue, error);
        let pending = producer.submit(queue, message).await.map_err(fail)?;
        let partition = pending.partition();
        let offset = pending.await.map_err(fail)?;
        Ok(json!({
            "queue": queue,
            "partition": partition.0,
            "offset": offset.0,
            "message_id": json::hex(&id.0),
        }))
    }

    async fn claim(&self, queue: &str, body: json::Claim) -> Result<Value, ApiError> {
        let credits = body.credits.unwrap_or(1);
        if !(1..=CLAIM_CREDITS_MAX_HTTP).contains(&credits) {
            return Err(ApiError::invalid(format!(
                "credits {credits} outside 1..={CLAIM_CREDITS_MAX_HTTP}"
            ))
            .with_detail("limit", CLAIM_CREDITS_MAX_HTTP));
        }
        let wait_ms = body.wait_ms.unwrap_or(0);
        if wait_ms > CLAIM_WAIT_MS_MAX_HTTP {
            return Err(ApiError::invalid(format!(
                "wait_ms {wait_ms} over the limit of {CLAIM_WAIT_MS_MAX_HTTP}"
            ))
            .with_detail("limit", CLAIM_WAIT_MS_MAX_HTTP));
        }
        let max_bytes = body.max_bytes.unwrap_or(CLAIM_BYTES_MAX_HTTP);
        if !(1..=CLAIM_BYTES_MAX_HTTP).contains(&max_bytes) {
            return Err(ApiError::invalid(format!(
                "max_bytes {max_bytes} outside 1..={CLAIM_BYTES_MAX_HTTP}"
            ))
            .with_detail("limit", CLAIM_BYTES_MAX_HTTP));
        }
        let lease_ms = body.lease_ms.unwrap_or_else(|| self.lease_default_ms(queue));
        let mut options =
            ClaimOptions::new(credits).lease_ms(lease_ms).wait_ms(wait_ms).max_bytes(max_bytes);
        if let Some(name) = body.subscription.filter(|name| !name.is_empty()) {
            spool_client::spool_wire::proto::validate_subscription_name(&name)
                .map_err(|error| ApiError::invalid(format!("subscription: {error}")))?;
            options = options.subscription(name);
        }
        let client = self.client().await?;
        let fail = |error| self.fail_on(&client, queue, error);
        let deliveries = match body.partition {
            Some(partition) => {
                client
                    .claim(queue, PartitionId(partition), &options)
                    .await
                    .map_err(fail)?
                    .deliveries
            }
            None => client.claim_any(queue, &options).await.map_err(fail)?,
        };
        let messages: Vec<Value> = deliveries
            .iter()
            .map(|delivery| {
                let text = token::encode(queue, delivery.partition(), &delivery.token());
                json::delivery(delivery, text)
            })
            .collect();
        Ok(json!({ "queue": queue, "messages": messages }))
    }

    async fn ack(&self, body: json::Ack) -> Result<Value, ApiError> {
        if body.tokens.is_empty() || body.tokens.len() > ACK_TOKENS_MAX_HTTP {
            return Err(ApiError::invalid(format!(
                "{} tokens; give 1..={ACK_TOKENS_MAX_HTTP}",
                body.tokens.len()
            ))
            .with_detail("limit", ACK_TOKENS_MAX_HTTP));
        }
        let routed =
            body.tokens.iter().map(|text| token::decode(text)).collect::<Result<Vec<_>, _>>()?;
        // One Ack request per partition, tokens in request order.
        let mut groups: Vec<((String, PartitionId), Vec<usize>)> = Vec::new();
        for (index, token) in routed.iter().enumerate() {
            let key = (token.queue.clone(), token.partition);
            match groups.iter_mut().find(|(group, _)| *group == key) {
                Some((_, indices)) => indices.push(index),
                None => groups.push((key, vec![index])),
            }
        }
        let client = self.client().await?;
        let mut refused: Vec<(usize, ApiError)> = Vec::new();
        for ((queue, partition), indices) in &groups {
            let tokens: Vec<_> = indices.iter().map(|&index| routed[index].token).collect();
            match client.ack(queue, *partition, &tokens).await {
                Ok(()) => {}
                Err(ClientError::AckRefused { refused: tokens, .. }) => {
                    for token in tokens {
                        let message = format!("token {} was not acked", indices[token.index]);
                        refused.push((indices[token.index], ApiError::new(token.code, message)));
                    }
                }
                Err(error) => {
                    let error = self.fail_on(&client, queue, error);
                    refused.extend(indices.iter().map(|&index| (index, error.clone())));
                }
            }
        }
        let acked = routed.len() - refused.len();
        if refused.is_empty() {
            return Ok(json!({ "acked": acked }));
        }
        refused.sort_by_key(|(index, _)| *index);
        let listed: Vec<Value> = refused
            .iter()
            .map(|(index, error)| {
                json!({ "index": index, "code": error.code.as_u16(), "name": error.code.name(),
                        "message": error.message })
            })
            .collect();
        let (first_index, first) = &refused[0];
        Err(ApiError::new(
            first.code,
            format!(
                "{} of {} tokens refused; token {first_index}: {}",
                refused.len(),
                routed.len(),
                first.message
            ),
        )
        .with_status(first.status)
        .with_detail("acked", acked)
        .with_detail("refused", listed))
    }

    async fn extend(&self, body: json::Extend) -> Result<Value, ApiError> {
        let routed = token::decode(&body.token)?;
        let lease_ms = body.lease_ms.unwrap_or_else(|| self.lease_default_ms(&routed.queue));
        let client = self.client().await?;
        let deadline = client
            .extend(&routed.queue, routed.partition, routed.token, lease_ms)
            .await
            .map_err(|error| self.fail_on(&client, &routed.queue, error))?;
        Ok(json!({ "lease_deadline_ms": deadline }))
    }

    async fn release(&self, body: json::Release) -> Result<Value, ApiError> {
        let routed = token::decode(&body.token)?;
        let limit = spool_wire::proto::limits::RELEASE_REASON_BYTES_MAX;
        if body.reason.len() > limit {
            return Err(
                ApiError::invalid(format!("reason over {limit} bytes")).with_detail("limit", limit)
            );
        }
        let client = self.client().await?;
        let not_before = client
            .release(&routed.queue, routed.partition, routed.token, body.delay_ms, &body.reason)
            .await
            .map_err(|error| self.fail_on(&client, &routed.queue, error))?;
        Ok(json!({ "not_before_ms": not_before }))
    }

    /// The partitions a queue-wide operation covers: `only`, or every
    /// partition of fresh metadata.
    async fn partitions_of(
        &self,
        client: &Client,
        queue: &str,
        only: Option<u32>,
    ) -> Result<Vec<PartitionId>, ApiError> {
        client.forget_queue(queue);
        let count = client
            .partition_count(queue)
            .await
            .map_err(|error| self.fail_on(client, queue, error))?;
        match only {
            Some(partition) if partition >= count => Err(ApiError::new(
                ErrorCode::PartitionNotFound,
                format!("queue '{queue}' has {count} partitions"),
            )),
            Some(partition) => Ok(vec![PartitionId(partition)]),
            None => Ok((0..count).map(PartitionId).collect()),
        }
    }
}

/// The credentials of an `Authorization: Bearer <principal>:<secret>`
/// header; none without the header.
///
/// # Errors
/// `UNAUTHENTICATED` for another scheme or a token not in that form.
fn bearer_credentials(request: &Request<Incoming>) -> Result<Option<Credentials>, ApiError> {
    let Some(value) = request.headers().get(AUTHORIZATION) else { return Ok(None) };
    let malformed = || {
        ApiError::new(
            ErrorCode::Unauthenticated,
            "Authorization must be `Bearer <principal>:<secret>`",
        )
    };
    let text = value.to_str().map_err(|_| malformed())?;
    let token = text.strip_prefix("Bearer ").ok_or_else(malformed)?;
    Credentials::from_token(token.trim()).map(Some).ok_or_else(malformed)
}

/// Adds the `WWW-Authenticate` challenge to a 401 answer.
fn challenge(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    if response.status() == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"spool\""));
    }
    response
}

fn too_large() -> ApiError {
    ApiError::new(
        ErrorCode::FrameTooLarge,
        format!("request body over the limit of {BODY_BYTES_MAX} bytes"),
    )
    .with_detail("limit_bytes", BODY_BYTES_MAX)
}

/// What a request's body takes from the admin pool: its declared length
/// (0 without a body), or [`BODY_BYTES_MAX`] when it is chunked.
///
/// # Errors
/// 413 `FRAME_TOO_LARGE` for a declared length over the limit, before
/// anything is taken or read.
fn body_bytes(request: &Request<Incoming>) -> Result<u64, ApiError> {
    match request.body().size_hint().exact() {
        Some(length) if length > BODY_BYTES_MAX as u64 => Err(too_large()),
        Some(length) => Ok(length),
        None => Ok(BODY_BYTES_MAX as u64),
    }
}

/// Reads the body up to [`BODY_BYTES_MAX`] within [`BODY_READ_TIMEOUT`].
async fn read_body(request: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limited = Limited::new(request.into_body(), BODY_BYTES_MAX);
    match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Err(_) => Err(ApiError::new(
            ErrorCode::Timeout,
            format!("request body not received within {} s", BODY_READ_TIMEOUT.as_secs()),
        )
        .with_status(StatusCode::REQUEST_TIMEOUT)),
        Ok(Err(error)) if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(too_large())
        }
        Ok(Err(error)) => Err(ApiError::new(
            ErrorCode::MalformedFrame,
            format!("request body could not be read: {error}"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// Parses a JSON body; an empty body reads as `{}` (every field defaulted,
/// or the missing field named). Bad JSON is `MALFORMED_FRAME`, a wrong or
/// unknown field `INVALID_ARGUMENT`; both 400 with serde's message.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|error| {
        let code = match error.classify() {
            serde_json::error::Category::Data => ErrorCode::InvalidArgument,
            _ => ErrorCode::MalformedFrame,
        };
        ApiError::new(code, format!("request body: {error}")).with_status(StatusCode::BAD_REQUEST)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: bad JSON and wrong fields are told apart, both 400 with
    // serde's words; an empty body is `{}`. Method: parse samples.
    #[test]
    fn parse_tells_malformed_from_invalid() {
        let malformed = parse::<json::Purge>(b"{\"confirm\": tru").unwrap_err();
        assert_eq!(malformed.code, ErrorCode::MalformedFrame);
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
        let unknown = parse::<json::Purge>(b"{\"confirmed\": true}").unwrap_err();
        assert_eq!(unknown.code, ErrorCode::InvalidArgument);
        assert!(unknown.message.contains("confirmed"), "{}", unknown.message);
        let missing = parse::<json::Ack>(b"").unwrap_err();
        assert!(missing.message.contains("tokens"), "{}", missing.message);
        assert!(!parse::<json::Purge>(b" ").unwrap().confirm);
    }

    // Goal: `POST /v1/queues` takes a retention window and the answer's
    // config shows it; without one the queue has none. Method: parse
    // bodies, render their configs.
    #[test]
    fn create_takes_a_retention_window() {
        let body = br#"{"name": "events", "retention_ms": 60000, "retention_bytes": 1048576}"#;
        let config = parse::<json::CreateQueue>(body).unwrap().config();
        assert_eq!((config.retention_ms, config.retention_bytes), (60_000, 1 << 20));
        let shown = json::config(&config);
        assert_eq!(
            (shown["retention_ms"].as_u64(), shown["retention_bytes"].as_u64()),
            (Some(60_000), Some(1 << 20))
        );
        let plain = parse::<json::CreateQueue>(br#"{"name": "jobs"}"#).unwrap().config();
        assert!(!plain.has_window());
        assert_eq!(json::config(&plain)["retention_ms"], 0);
    }

    // Goal: `POST /v1/queues` takes `ordered` and the answer's config
    // shows it; without it the queue is unordered. Method: parse bodies,
    // render their configs.
    #[test]
    fn create_takes_ordered() {
        let body = br#"{"name": "jobs", "partitions": 2, "ordered": true}"#;
        let config = parse::<json::CreateQueue>(body).unwrap().config();
        assert!(config.ordered);
        assert_eq!(json::config(&config)["ordered"], true);
        let plain = parse::<json::CreateQueue>(br#"{"name": "jobs"}"#).unwrap().config();
        assert!(!plain.ordered);
        assert_eq!(json::config(&plain)["ordered"], false);
    }

    // Goal: an unspecified listen address is reached on loopback.
    #[test]
    fn bootstrap_maps_unspecified_to_loopback() {
        assert_eq!(bootstrap_address("0.0.0.0:7400".parse().unwrap()), "127.0.0.1:7400");
        assert_eq!(bootstrap_address("[::]:7400".parse().unwrap()), "[::1]:7400");
        assert_eq!(bootstrap_address("10.0.0.5:7400".parse().unwrap()), "10.0.0.5:7400");
    }
}
