//! [`Client`]: metadata, shard connections and routing.
//!
//! Owns the cached `Metadata` (per queue partition: host, shard port, leader
//! epoch) fetched from the bootstrap address, and one lazily opened
//! [`Connection`] per shard address. Every data request goes straight to the
//! shard that owns its partition; a `NOT_OWNER` answer refreshes the queue's
//! metadata and retries at the owner it names (or the refreshed owner), at
//! most [`ROUTE_ATTEMPTS_MAX`] times. When it names none and the refreshed
//! metadata names the shard that just refused (a cluster electing the
//! partition's leader), the call waits as a catalog change does (`control`)
//! and asks again, at most [`LEADER_WAIT_ATTEMPTS_MAX`] times. The broker
//! never forwards, so this is the only place routing happens. Control-plane requests go to the
//! bootstrap shard; catalog changes follow `NOT_OWNER` to the cluster's
//! controller leader (`control`). A data call that fails on the way to its
//! owner (the node is unreachable, the connection broke, no answer came)
//! drops the queue's cached metadata, so the caller's retry asks where the
//! partition lives now.
//!
//! Here: the handle, its connections, the metadata cache, routing, and the
//! one-partition calls enqueue, extend, ack and release. Claims are in
//! `claim` (what a claim asks for, a claim of one partition or of one
//! shard) and `claim_any` (a claim over every shard of a queue, and the
//! withdrawal of the long-polls it no longer needs).
//!
//! It does not batch, retry on other errors, or run handlers: see
//! [`Producer`](crate::Producer) and [`Consumer`](crate::Consumer).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use spool_wire::proto::{
    AckRequest, CorrelationId, DeliveryToken, EnqueueRequest, EnqueueResponse, ExtendRequest,
    MetadataRequest, PartitionId, PartitionMetadata, ReleaseRequest, Request, Response,
    DEAD_LETTER_SUFFIX,
};
use spool_wire::ErrorCode;

use crate::connection::{Connection, ConnectionConfig, ResponseBytes};
use crate::error::{ClientError, RefusedAck};
use crate::limits::{
    CONNECTIONS_MAX, LEADER_WAIT_ATTEMPTS_MAX, LEADER_WAIT_BACKOFF, METADATA_MAX_AGE,
    ROUTE_ATTEMPTS_MAX,
};

mod claim;
mod claim_any;
mod control;
mod session;
#[cfg(test)]
mod tests;

pub use claim::{process_worker, ClaimBatch, ClaimOptions};
pub use session::Session;

/// Settings of a [`Client`].
#[derive(Debug, Clone, Default)]
pub struct ClientConfig {
    /// Settings of every shard connection.
    pub connection: ConnectionConfig,
}

impl ClientConfig {
    /// The same settings, every connection authenticating as `credentials`.
    #[must_use]
    pub fn with_credentials(mut self, credentials: crate::auth::Credentials) -> Self {
        self.connection.credentials = Some(credentials);
        self
    }

    /// The same settings, every connection speaking TLS as `tls` says.
    #[must_use]
    pub fn with_tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.connection.tls = Some(tls);
        self
    }
}

struct Inner {
    bootstrap: String,
    config: ClientConfig,
    /// Queue name → its partitions, indexed by partition number.
    metadata: RwLock<HashMap<String, Vec<PartitionMetadata>>>,
    /// Queue name → one partition per shard that leads some of its
    /// partitions (the lowest-numbered), where a claim of any partition is
    /// sent; kept with `metadata`, written under its lock.
    claim_targets: RwLock<HashMap<String, Arc<[PartitionId]>>>,
    /// Queue name → when its metadata was fetched; a cached entry older
    /// than [`METADATA_MAX_AGE`] is fetched again in the background, so a
    /// resize's added partitions and new leaders are found without an
    /// error first.
    fetched: RwLock<HashMap<String, tokio::time::Instant>>,
    /// Queues whose background fetch is under way (one at a time each).
    refreshing: std::sync::Mutex<HashSet<String>>,
    /// `host:port` → connection. An async lock: opening a connection awaits.
    connections: tokio::sync::Mutex<HashMap<String, Connection>>,
    /// Where the next [`Client::claim_any`] sweep starts, so every
    /// partition gets its turn to be asked first.
    next_sweep: AtomicU32,
}

/// A handle on a Spool broker: cheap to clone, shared by producers,
/// consumers and admin.
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// let client = spool_client::Client::connect("127.0.0.1:7400").await?;
/// let partitions = client.partitions("jobs").await?;
/// println!("jobs has {} partitions", partitions.len());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Client").field("bootstrap", &self.inner.bootstrap).finish()
    }
}

/// The `host:port` address of the shard that serves `partition` (from
/// [`Client::partitions`]), for [`Client::connection`].
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// let client = spool_client::Client::connect("127.0.0.1:7400").await?;
/// for partition in client.partitions("jobs").await? {
///     let addr = spool_client::shard_address(&partition);
///     println!("partition {} lives on {addr}", partition.partition.0);
///     let _connection = client.connection(&addr).await?;
/// }
/// # Ok(()) }
/// ```
pub fn shard_address(partition: &PartitionMetadata) -> String {
    address(&partition.host, partition.shard_port)
}

/// `host:port`, with brackets around an IPv6 host.
/// Whether a per-item `code` sends the item elsewhere: the node is not the
/// partition's leader (`NOT_LEADER`), or not its owner (`NOT_OWNER`, also
/// what an older broker answers in place of `NOT_LEADER`).
pub(crate) fn is_redirect(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::NotOwner | ErrorCode::NotLeader)
}

pub(crate) fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Client {
    /// Connects to `bootstrap` (`host:port`) with default settings and
    /// fetches metadata for every queue.
    ///
    /// # Errors
    /// Connection or metadata failure.
    pub async fn connect(bootstrap: &str) -> Result<Self, ClientError> {
        Self::connect_with(bootstrap, ClientConfig::default()).await
    }

    /// [`connect`](Self::connect) with explicit settings.
    ///
    /// # Errors
    /// Connection or metadata failure.
    pub async fn connect_with(bootstrap: &str, config: ClientConfig) -> Result<Self, ClientError> {
        let client = Self {
            inner: Arc::new(Inner {
                bootstrap: bootstrap.to_owned(),
                config,
                metadata: RwLock::new(HashMap::new()),
                claim_targets: RwLock::new(HashMap::new()),
                fetched: RwLock::new(HashMap::new()),
                refreshing: std::sync::Mutex::new(HashSet::new()),
                connections: tokio::sync::Mutex::new(HashMap::new()),
                next_sweep: AtomicU32::new(0),
            }),
        };
        client.refresh_metadata(&[]).await?;
        Ok(client)
    }

    /// The bootstrap address.
    pub fn bootstrap(&self) -> &str {
        &self.inner.bootstrap
    }

    /// The connection settings in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The connection to `addr`, opened on first use and reopened if it
    /// closed.
    ///
    /// # Errors
    /// Connect failure, or [`CONNECTIONS_MAX`] connections already open.
    pub async fn connection(&self, addr: &str) -> Result<Connection, ClientError> {
        let mut connections = self.inner.connections.lock().await;
        if let Some(connection) = connections.get(addr) {
            if !connection.is_closed() {
                return Ok(connection.clone());
            }
            connections.remove(addr);
        }
        if connections.len() >= CONNECTIONS_MAX {
            connections.retain(|_, connection| !connection.is_closed());
            if connections.len() >= CONNECTIONS_MAX {
                return Err(ClientError::Config(format!(
                    "more than {CONNECTIONS_MAX} shard connections"
                )));
            }
        }
        let connection = Connection::connect(addr, self.inner.config.connection.clone()).await?;
        connections.insert(addr.to_owned(), connection.clone());
        Ok(connection)
    }

    /// Sends a control-plane request to the bootstrap shard.
    ///
    /// # Errors
    /// As [`Connection::call`].
    pub async fn control(&self, request: &Request<'_>) -> Result<ResponseBytes, ClientError> {
        let connection = self.connection(&self.inner.bootstrap).await?;
        connection.call(request).await
    }

    /// Fetches metadata for `queues` (every queue when empty) and replaces
    /// the cached entries; a named queue the broker does not list is dropped
    /// from the cache.
    ///
    /// # Errors
    /// As [`Connection::call`].
    pub async fn refresh_metadata(&self, queues: &[&str]) -> Result<(), ClientError> {
        let request =
            MetadataRequest { queues: queues.iter().map(|&name| name.to_owned()).collect() };
        let bytes = self.control(&Request::Metadata(request)).await?;
        let Response::Metadata(response) = bytes.response()? else {
            return Err(ClientError::Protocol("metadata answered with another response".into()));
        };
        let mut metadata = self.inner.metadata.write().unwrap_or_else(PoisonError::into_inner);
        let mut targets = self.inner.claim_targets.write().unwrap_or_else(PoisonError::into_inner);
        let mut fetched = self.inner.fetched.write().unwrap_or_else(PoisonError::into_inner);
        if queues.is_empty() {
            metadata.clear();
            targets.clear();
        }
        for &queue in queues {
            metadata.remove(queue);
            targets.remove(queue);
        }
        for mut queue in response.queues {
            queue.partitions.sort_by_key(|partition| partition.partition);
            let dense = queue
                .partitions
                .iter()
                .enumerate()
                .all(|(index, partition)| partition.partition.0 as usize == index);
            if !dense {
                return Err(ClientError::Protocol(format!(
                    "metadata for '{}' does not list partitions 0..n",
                    queue.name
                )));
            }
            let mut shards = HashSet::new();
            let firsts: Arc<[PartitionId]> = queue
                .partitions
                .iter()
                .filter(|partition| shards.insert((partition.host.clone(), partition.shard_port)))
                .map(|partition| partition.partition)
                .collect();
            targets.insert(queue.name.clone(), firsts);
            fetched.insert(queue.name.clone(), tokio::time::Instant::now());
            metadata.insert(queue.name, queue.partitions);
        }
        Ok(())
    }

    /// Fetches `queue`'s metadata again in the background when the cached
    /// copy is older than [`METADATA_MAX_AGE`]; the caller goes on with the
    /// cached copy.
    fn refresh_if_old(&self, queue: &str) {
        let old = {
            let fetched = self.inner.fetched.read().unwrap_or_else(PoisonError::into_inner);
            fetched.get(queue).is_some_and(|at| at.elapsed() > METADATA_MAX_AGE)
        };
        if !old {
            return;
        }
        let mut refreshing = self.inner.refreshing.lock().unwrap_or_else(PoisonError::into_inner);
        if !refreshing.insert(queue.to_owned()) {
            return;
        }
        drop(refreshing);
        let (client, queue) = (self.clone(), queue.to_owned());
        tokio::spawn(async move {
            if let Err(error) = client.refresh_metadata(&[queue.as_str()]).await {
                tracing::debug!(%queue, %error, "background metadata refresh failed");
            }
            let mut refreshing =
                client.inner.refreshing.lock().unwrap_or_else(PoisonError::into_inner);
            refreshing.remove(&queue);
        });
    }

    /// Where claims of any partition of `queue` go: one partition per shard
    /// that leads some of its partitions (the lowest-numbered of that
    /// shard), from the cache or fetched. [`claim_shard`](Self::claim_shard)
    /// sends a claim of any partition to the shard leading each.
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`] when the broker does not know it.
    pub async fn claim_targets(&self, queue: &str) -> Result<Arc<[PartitionId]>, ClientError> {
        if let Some(targets) = self.cached_claim_targets(queue) {
            self.refresh_if_old(queue);
            return Ok(targets);
        }
        self.refresh_metadata(&[queue]).await?;
        self.cached_claim_targets(queue).ok_or_else(|| ClientError::UnknownQueue(queue.to_owned()))
    }

    /// The cached `host:port` of the shard leading `partition` of `queue`
    /// (no fetch, no copy of the metadata).
    pub(crate) fn cached_owner(&self, queue: &str, partition: PartitionId) -> Option<String> {
        let metadata = self.inner.metadata.read().unwrap_or_else(PoisonError::into_inner);
        metadata.get(queue)?.get(partition.0 as usize).map(shard_address)
    }

    fn cached_claim_targets(&self, queue: &str) -> Option<Arc<[PartitionId]>> {
        let targets = self.inner.claim_targets.read().unwrap_or_else(PoisonError::into_inner);
        targets.get(queue).filter(|targets| !targets.is_empty()).cloned()
    }

    /// Forgets the cached metadata of `queue` (after it was deleted or
    /// recreated).
    pub fn forget_queue(&self, queue: &str) {
        let mut metadata = self.inner.metadata.write().unwrap_or_else(PoisonError::into_inner);
        metadata.remove(queue);
        self.inner.claim_targets.write().unwrap_or_else(PoisonError::into_inner).remove(queue);
    }

    /// The partitions of `queue`, from the cache or fetched.
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`] when the broker does not know it.
    pub async fn partitions(&self, queue: &str) -> Result<Vec<PartitionMetadata>, ClientError> {
        if let Some(partitions) = self.cached_partitions(queue) {
            return Ok(partitions);
        }
        self.refresh_metadata(&[queue]).await?;
        self.cached_partitions(queue).ok_or_else(|| ClientError::UnknownQueue(queue.to_owned()))
    }

    /// How many partitions `queue` has, from the cache or fetched; unlike
    /// [`partitions`](Self::partitions) it copies nothing, so the producer
    /// and consumer call it per message and per claim.
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`] when the broker does not know it.
    pub async fn partition_count(&self, queue: &str) -> Result<u32, ClientError> {
        if let Some(count) = self.cached_partition_count(queue) {
            self.refresh_if_old(queue);
            return Ok(count);
        }
        self.refresh_metadata(&[queue]).await?;
        self.cached_partition_count(queue)
            .ok_or_else(|| ClientError::UnknownQueue(queue.to_owned()))
    }

    fn cached_partition_count(&self, queue: &str) -> Option<u32> {
        let metadata = self.inner.metadata.read().unwrap_or_else(PoisonError::into_inner);
        let count = metadata.get(queue).map_or(0, Vec::len);
        // The broker bounds partitions by PARTITIONS_MAX, far below u32::MAX.
        u32::try_from(count).ok().filter(|&count| count > 0)
    }

    fn cached_partitions(&self, queue: &str) -> Option<Vec<PartitionMetadata>> {
        let metadata = self.inner.metadata.read().unwrap_or_else(PoisonError::into_inner);
        metadata.get(queue).filter(|partitions| !partitions.is_empty()).cloned()
    }

    /// The `host:port` of the shard that owns `partition` of `queue`, as
    /// the cached (or fetched) metadata says; see also [`shard_address`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::spool_wire::proto::PartitionId;
    /// let client = spool_client::Client::connect("127.0.0.1:7400").await?;
    /// println!("jobs/0 is served by {}", client.owner_address("jobs", PartitionId(0)).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`]; `PARTITION_NOT_FOUND` past the
    /// queue's partitions.
    pub async fn owner_address(
        &self,
        queue: &str,
        partition: PartitionId,
    ) -> Result<String, ClientError> {
        // Every request about a partition asks this: from the cache it
        // looks at that one partition (copying the queue's whole partition
        // list each time cost O(partitions) per request — most of a
        // producer's CPU at 10,000 partitions).
        if let Some(addr) = self.cached_owner(queue, partition) {
            return Ok(addr);
        }
        // `<queue>.dlq` names the dead-letter lane of `<queue>`'s
        // partitions (a claim, and the acks of what it delivered): the same
        // shards, unless a queue by that very name exists (made before such
        // names were reserved).
        let lane_of = queue.strip_suffix(DEAD_LETTER_SUFFIX).filter(|base| !base.is_empty());
        if let Some(addr) = lane_of.and_then(|base| self.cached_owner(base, partition)) {
            return Ok(addr);
        }
        let partitions = match (self.partitions(queue).await, lane_of) {
            (Err(ClientError::UnknownQueue(_)), Some(base)) => self.partitions(base).await?,
            (found, _) => found?,
        };
        let meta = partitions.get(partition.0 as usize).ok_or_else(|| ClientError::Server {
            code: ErrorCode::PartitionNotFound,
            message: format!("queue '{queue}' has {} partitions", partitions.len()),
        })?;
        Ok(shard_address(meta))
    }

    /// Sends a request about one partition to the shard that owns it,
    /// following `NOT_OWNER` (see the module doc).
    ///
    /// # Errors
    /// The request's own error, or [`ClientError::RouteExhausted`].
    pub async fn partition_call(
        &self,
        queue: &str,
        partition: PartitionId,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<ResponseBytes, ClientError> {
        self.partition_call_observed(queue, partition, request, timeout, |_, _| {}).await
    }

    /// [`partition_call`](Self::partition_call) that tells `on_sent` the
    /// connection and correlation id of each attempt once it is sent.
    async fn partition_call_observed(
        &self,
        queue: &str,
        partition: PartitionId,
        request: &Request<'_>,
        timeout: Duration,
        mut on_sent: impl FnMut(&Connection, CorrelationId),
    ) -> Result<ResponseBytes, ClientError> {
        let mut hint: Option<String> = None;
        let (mut hops, mut waits, mut sent) = (0u32, 0u32, 0u32);
        loop {
            let addr = match hint.take() {
                Some(addr) => addr,
                None => self.owner_address(queue, partition).await?,
            };
            let connection = match self.connection(&addr).await {
                Ok(connection) => connection,
                Err(error) => {
                    let error = self.forget_on_transport_error(queue, error);
                    // Nothing was sent: the owner may have died and another
                    // replica lead now (a failover). Ask where the partition
                    // lives and go there once it is elsewhere; the same
                    // address again is the error.
                    hops += 1;
                    if hops >= ROUTE_ATTEMPTS_MAX {
                        return Err(error);
                    }
                    match self.owner_address(queue, partition).await {
                        Ok(owner) if owner != addr => {
                            tracing::debug!(%queue, partition = partition.0, %addr, %owner, %error,
                                "owner unreachable; going to the owner metadata names now");
                            hint = Some(owner);
                            continue;
                        }
                        _ => return Err(error),
                    }
                }
            };
            sent += 1;
            let on_sent = |id| on_sent(&connection, id);
            match connection.call_observed(request, timeout, on_sent).await {
                Err(
                    ClientError::NotOwner { owner, message }
                    | ClientError::NotLeader { leader: owner, message },
                ) => {
                    tracing::debug!(%queue, partition = partition.0, %addr, %message, "not owner; rerouting");
                    self.refresh_metadata(&[queue]).await?;
                    // The shard's own answer beats metadata a bootstrap node
                    // may not have caught up on yet.
                    hint = owner.map(|owner| address(&owner.host, owner.port));
                    let nowhere_else = hint.is_none()
                        && self.cached_owner(queue, partition).as_deref() == Some(addr.as_str());
                    if nowhere_else {
                        // Nobody knows a leader: one is being elected.
                        waits += 1;
                        if waits >= LEADER_WAIT_ATTEMPTS_MAX {
                            break;
                        }
                        // Time is what is waited for here: an election.
                        tokio::time::sleep(control::leader_wait(LEADER_WAIT_BACKOFF, waits)).await;
                    } else {
                        hops += 1;
                        if hops >= ROUTE_ATTEMPTS_MAX {
                            break;
                        }
                    }
                }
                Err(error) => return Err(self.forget_on_transport_error(queue, error)),
                answer => return answer,
            }
        }
        Err(ClientError::RouteExhausted {
            queue: queue.to_owned(),
            partition: partition.0,
            attempts: sent,
        })
    }

    /// Passes `error` on; first, when the way to the partition's owner
    /// failed (unreachable, broken, silent), drops `queue`'s cached
    /// metadata so the next call asks where it lives now: in a cluster the
    /// owner may have died and another replica leads.
    fn forget_on_transport_error(&self, queue: &str, error: ClientError) -> ClientError {
        if matches!(
            error,
            ClientError::Io { .. }
                | ClientError::ConnectionClosed { .. }
                | ClientError::Timeout { .. }
        ) {
            self.forget_queue(queue);
        }
        error
    }

    fn request_timeout(&self) -> Duration {
        self.inner.config.connection.request_timeout
    }

    /// Appends one record batch (built with `DataBatchBuilder`) to a partition.
    ///
    /// # Errors
    /// As [`partition_call`](Self::partition_call).
    pub async fn enqueue(
        &self,
        queue: &str,
        partition: PartitionId,
        batch: &[u8],
    ) -> Result<EnqueueResponse, ClientError> {
        let request = Request::Enqueue(EnqueueRequest { queue, partition, batch });
        let bytes = self.partition_call(queue, partition, &request, self.request_timeout()).await?;
        match bytes.response()? {
            Response::Enqueue(response) => Ok(response),
            _ => Err(ClientError::Protocol("enqueue answered with another response".into())),
        }
    }

    /// Pushes a lease's deadline to now + `lease_ms`; returns the new deadline.
    ///
    /// # Errors
    /// `STALE_TOKEN` once the lease was lost; as
    /// [`partition_call`](Self::partition_call).
    pub async fn extend(
        &self,
        queue: &str,
        partition: PartitionId,
        token: DeliveryToken,
        lease_ms: u32,
    ) -> Result<u64, ClientError> {
        let request = Request::Extend(ExtendRequest { token, lease_ms });
        let bytes = self.partition_call(queue, partition, &request, self.request_timeout()).await?;
        match bytes.response()? {
            Response::Extend(response) => Ok(response.lease_deadline_ms),
            _ => Err(ClientError::Protocol("extend answered with another response".into())),
        }
    }

    /// Acks deliveries of one partition: `Ok(())` only when the broker
    /// acked every token (durably).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::{ClaimOptions, Client, ClientError, Delivery};
    /// let client = Client::connect("127.0.0.1:7400").await?;
    /// for delivery in client.claim_any("jobs", &ClaimOptions::new(10)).await? {
    ///     // ... do the work ...
    ///     match client.ack("jobs", delivery.partition(), &[delivery.token()]).await {
    ///         Ok(()) => {}
    ///         // The lease ran out before the ack: another worker may have it now.
    ///         Err(error @ ClientError::AckRefused { .. }) => eprintln!("not acked: {error}"),
    ///         Err(error) => return Err(error),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::AckRefused`] naming each refused token (by its index
    /// in `tokens`) with its code (`STALE_TOKEN`, `INVALID_TOKEN`, ...);
    /// the tokens it does not name were acked. A token a cluster member
    /// that does not lead refused (`NOT_OWNER`) is sent again to the
    /// leader after a metadata refresh, up to `ROUTE_ATTEMPTS_MAX` times in
    /// all, and named only if it is still refused. Otherwise as
    /// [`partition_call`](Self::partition_call), when no token was acked.
    pub async fn ack(
        &self,
        queue: &str,
        partition: PartitionId,
        tokens: &[DeliveryToken],
    ) -> Result<(), ClientError> {
        let mut results = self.ack_once(queue, partition, tokens).await?;
        // Tokens a cluster member that does not lead refused (NOT_LEADER,
        // or NOT_OWNER from an older broker: the metadata that sent them
        // there is stale) are asked again of
        // the leader the refreshed metadata names, a bounded number of
        // times; the others' answers stand.
        let mut attempts = 1;
        loop {
            let moved: Vec<usize> =
                (0..results.len()).filter(|&index| is_redirect(results[index])).collect();
            if moved.is_empty() || attempts >= ROUTE_ATTEMPTS_MAX {
                break;
            }
            attempts += 1;
            if self.refresh_metadata(&[queue]).await.is_err() {
                break;
            }
            let retry: Vec<DeliveryToken> = moved.iter().map(|&index| tokens[index]).collect();
            match self.ack_once(queue, partition, &retry).await {
                Ok(again) => {
                    for (&index, code) in moved.iter().zip(again) {
                        results[index] = code;
                    }
                }
                // Those tokens stay refused as NOT_LEADER / NOT_OWNER.
                Err(_) => break,
            }
        }
        let refused: Vec<RefusedAck> = results
            .iter()
            .zip(tokens)
            .enumerate()
            .filter(|(_, (code, _))| **code != ErrorCode::None)
            .map(|(index, (&code, &token))| RefusedAck { index, token, code })
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(ClientError::AckRefused { refused, tokens: tokens.len() })
        }
    }

    /// One Ack request for `tokens` through `partition`'s owner: each
    /// token's code.
    async fn ack_once(
        &self,
        queue: &str,
        partition: PartitionId,
        tokens: &[DeliveryToken],
    ) -> Result<Vec<ErrorCode>, ClientError> {
        let request = Request::Ack(AckRequest { tokens: tokens.to_vec() });
        let bytes = self.partition_call(queue, partition, &request, self.request_timeout()).await?;
        match bytes.response()? {
            Response::Ack(response) if response.results.len() == tokens.len() => {
                Ok(response.results)
            }
            _ => Err(ClientError::Protocol("ack answered with a wrong response".into())),
        }
    }

    /// Gives a delivery back: ready again after `delay_ms` (0 = the queue's
    /// backoff). Returns when it becomes ready (broker clock, Unix ms).
    ///
    /// # Errors
    /// As [`partition_call`](Self::partition_call).
    pub async fn release(
        &self,
        queue: &str,
        partition: PartitionId,
        token: DeliveryToken,
        delay_ms: u32,
        reason: &str,
    ) -> Result<u64, ClientError> {
        let reason = truncate_utf8(reason, spool_wire::proto::limits::RELEASE_REASON_BYTES_MAX);
        let request = Request::Release(ReleaseRequest { token, delay_ms, reason });
        let bytes = self.partition_call(queue, partition, &request, self.request_timeout()).await?;
        match bytes.response()? {
            Response::Release(response) => Ok(response.not_before_ms),
            _ => Err(ClientError::Protocol("release answered with another response".into())),
        }
    }
}

/// Cuts `text` to at most `max_bytes` at a character boundary.
pub(crate) fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
