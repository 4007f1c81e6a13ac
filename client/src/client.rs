//! [`Client`]: metadata, shard connections and routing.
//!
//! Owns the cached `Metadata` (per queue partition: host, shard port, leader
//! epoch) fetched from the bootstrap address, and one lazily opened
//! [`Connection`] per shard address. Every data request goes straight to the
//! shard that owns its partition; a `NOT_OWNER` answer refreshes the queue's
//! metadata and retries at the owner it names (or the refreshed owner), at
//! most [`ROUTE_ATTEMPTS_MAX`] times. The broker never forwards, so this is
//! the only place routing happens. Control-plane requests go to the
//! bootstrap shard.
//!
//! It does not batch, retry on other errors, or run handlers: see
//! [`Producer`](crate::Producer) and [`Consumer`](crate::Consumer).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use spool_wire::proto::{
    AckRequest, CancelClaimRequest, CancelOutcome, ClaimRequest, CorrelationId, DeliveryToken,
    EnqueueRequest, EnqueueResponse, ExtendRequest, MetadataRequest, PartitionId,
    PartitionMetadata, ReleaseRequest, Request, Response, WorkerId,
};
use spool_wire::ErrorCode;

use crate::connection::{Connection, ConnectionConfig, ResponseBytes};
use crate::delivery::Delivery;
use crate::error::{ClientError, RefusedAck};
use crate::limits::{
    CLAIM_BYTES_DEFAULT, CLAIM_CREDITS_DEFAULT, CLAIM_EXTRA_RELEASE_DELAY_MS,
    CLAIM_EXTRA_RELEASE_REASON, CLAIM_WAIT_MS_DEFAULT, CONNECTIONS_MAX, LEASE_MS_DEFAULT,
    ROUTE_ATTEMPTS_MAX,
};

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

/// What a claim asks for: how many deliveries, how many record bytes, how
/// long a lease, how long to wait when nothing is ready, and which worker
/// the tokens are bound to.
///
/// [`ClaimOptions::new`] fills in everything but the count: this process's
/// worker id ([`process_worker`]), [`CLAIM_BYTES_DEFAULT`],
/// [`LEASE_MS_DEFAULT`] and [`CLAIM_WAIT_MS_DEFAULT`]; the builder methods
/// change one field each. [`Default`] asks for [`CLAIM_CREDITS_DEFAULT`].
///
/// ```
/// use spool_client::ClaimOptions;
///
/// let options = ClaimOptions::new(10).lease_ms(60_000).wait_ms(1_000);
/// assert_eq!((options.credits, options.lease_ms, options.wait_ms), (10, 60_000, 1_000));
/// assert_eq!(options.max_bytes, spool_client::limits::CLAIM_BYTES_DEFAULT);
/// assert_eq!(options.worker, ClaimOptions::default().worker, "one worker id per process");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOptions {
    /// The claiming worker, bound into the tokens.
    pub worker: WorkerId,
    /// Most deliveries (`1..=CLAIM_CREDITS_MAX`).
    pub credits: u32,
    /// Most record bytes.
    pub max_bytes: u32,
    /// Lease length.
    pub lease_ms: u32,
    /// Long-poll wait when nothing is ready.
    pub wait_ms: u32,
}

impl ClaimOptions {
    /// At most `credits` deliveries, every other field defaulted (see the
    /// type's doc).
    pub fn new(credits: u32) -> Self {
        Self {
            worker: process_worker(),
            credits,
            max_bytes: CLAIM_BYTES_DEFAULT,
            lease_ms: LEASE_MS_DEFAULT,
            wait_ms: CLAIM_WAIT_MS_DEFAULT,
        }
    }

    /// Sets the worker id the tokens are bound to.
    #[must_use]
    pub fn worker(mut self, worker: WorkerId) -> Self {
        self.worker = worker;
        self
    }

    /// Sets the most record bytes.
    #[must_use]
    pub fn max_bytes(mut self, max_bytes: u32) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Sets the lease length.
    #[must_use]
    pub fn lease_ms(mut self, lease_ms: u32) -> Self {
        self.lease_ms = lease_ms;
        self
    }

    /// Sets the long-poll wait (0: answer at once).
    #[must_use]
    pub fn wait_ms(mut self, wait_ms: u32) -> Self {
        self.wait_ms = wait_ms;
        self
    }
}

impl Default for ClaimOptions {
    fn default() -> Self {
        Self::new(CLAIM_CREDITS_DEFAULT)
    }
}

/// This process's worker id: random, chosen once per process, the same for
/// every [`ClaimOptions::new`].
pub fn process_worker() -> WorkerId {
    static WORKER: OnceLock<WorkerId> = OnceLock::new();
    *WORKER.get_or_init(|| WorkerId(rand::random()))
}

/// The deliveries of one claim.
#[derive(Debug)]
pub struct ClaimBatch {
    /// When their leases end unless extended (broker clock, Unix ms).
    pub lease_deadline_ms: u64,
    /// At most the claim's credits.
    pub deliveries: Vec<Delivery>,
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
            metadata.insert(queue.name, queue.partitions);
        }
        Ok(())
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
        let partitions = self.partitions(queue).await?;
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
        for _ in 0..ROUTE_ATTEMPTS_MAX {
            let addr = match hint.take() {
                Some(addr) => addr,
                None => self.owner_address(queue, partition).await?,
            };
            let connection = self.connection(&addr).await?;
            let sent = |id| on_sent(&connection, id);
            match connection.call_observed(request, timeout, sent).await {
                Err(ClientError::NotOwner { owner, message }) => {
                    tracing::debug!(%queue, partition = partition.0, %addr, %message, "not owner; rerouting");
                    self.refresh_metadata(&[queue]).await?;
                    // The shard's own answer beats metadata a bootstrap node
                    // may not have caught up on yet.
                    hint = owner.map(|owner| address(&owner.host, owner.port));
                }
                other => return other,
            }
        }
        Err(ClientError::RouteExhausted {
            queue: queue.to_owned(),
            partition: partition.0,
            attempts: ROUTE_ATTEMPTS_MAX,
        })
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

    /// Leases up to `options.credits` messages from one partition, waiting
    /// up to `options.wait_ms` when none is ready there. To claim from
    /// whichever partition of a queue has messages, use
    /// [`claim_any`](Self::claim_any).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::spool_wire::proto::PartitionId;
    /// use spool_client::{ClaimOptions, Client};
    /// let client = Client::connect("127.0.0.1:7400").await?;
    /// let batch = client.claim("jobs", PartitionId(0), &ClaimOptions::new(10).wait_ms(0)).await?;
    /// println!("{} deliveries from partition 0", batch.deliveries.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`partition_call`](Self::partition_call); [`ClientError::Protocol`]
    /// if the broker delivers more than the credits.
    pub async fn claim(
        &self,
        queue: &str,
        partition: PartitionId,
        options: &ClaimOptions,
    ) -> Result<ClaimBatch, ClientError> {
        self.claim_observed(queue, partition, partition, options, |_, _| {}).await
    }

    /// Leases up to `options.credits` messages from any partitions of
    /// `queue` led by the shard that leads `via` (one of
    /// [`claim_targets`](Self::claim_targets)), waiting up to
    /// `options.wait_ms` when none is ready there: one request, however
    /// many partitions that shard leads; the broker visits the partitions
    /// with messages ready in turn. Each delivery names its partition
    /// ([`Delivery::partition`]); an Ack may carry tokens of several
    /// partitions of one shard.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::{ClaimOptions, Client};
    /// let client = Client::connect("127.0.0.1:7400").await?;
    /// for &via in client.claim_targets("jobs").await?.iter() {
    ///     let batch = client.claim_shard("jobs", via, &ClaimOptions::new(10).wait_ms(0)).await?;
    ///     for delivery in &batch.deliveries {
    ///         println!("{}/{}", delivery.partition().0, delivery.offset().0);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    pub async fn claim_shard(
        &self,
        queue: &str,
        via: PartitionId,
        options: &ClaimOptions,
    ) -> Result<ClaimBatch, ClientError> {
        self.claim_observed(queue, via, PartitionId::ANY, options, |_, _| {}).await
    }

    /// A claim of `partition` (or of [`PartitionId::ANY`]) sent to the
    /// shard that leads `via`, telling `on_sent` where it went (connection
    /// and correlation id), so it can be withdrawn.
    async fn claim_observed(
        &self,
        queue: &str,
        via: PartitionId,
        partition: PartitionId,
        options: &ClaimOptions,
        on_sent: impl FnMut(&Connection, CorrelationId),
    ) -> Result<ClaimBatch, ClientError> {
        let request = Request::Claim(ClaimRequest {
            queue,
            partition,
            worker: options.worker,
            credits: options.credits,
            max_bytes: options.max_bytes,
            lease_ms: options.lease_ms,
            wait_ms: options.wait_ms,
        });
        let timeout = self.request_timeout() + Duration::from_millis(options.wait_ms.into());
        let bytes = self.partition_call_observed(queue, via, &request, timeout, on_sent).await?;
        let Response::Claim(response) = bytes.response()? else {
            return Err(ClientError::Protocol("claim answered with another response".into()));
        };
        if response.deliveries.len() > options.credits as usize {
            return Err(ClientError::Protocol(format!(
                "claim for {} credits returned {} deliveries",
                options.credits,
                response.deliveries.len()
            )));
        }
        let queue: Arc<str> = Arc::from(queue);
        let deliveries = response
            .deliveries
            .iter()
            .map(|wire| {
                // A claim of one partition gets that partition's messages;
                // one of any partition gets each delivery's own.
                let named = wire.partition;
                let ok = if partition == PartitionId::ANY {
                    named != PartitionId::ANY
                } else {
                    named == partition || named == PartitionId::ANY
                };
                if !ok {
                    return Err(ClientError::Protocol(format!(
                        "claim of partition {partition} answered with a delivery of partition \
                         {named}"
                    )));
                }
                let from = if partition == PartitionId::ANY { named } else { partition };
                Delivery::new(Arc::clone(&queue), from, response.lease_deadline_ms, wire)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClaimBatch { lease_deadline_ms: response.lease_deadline_ms, deliveries })
    }

    /// Leases up to `options.credits` messages from whichever partitions of
    /// `queue` have them, waiting at most `options.wait_ms` **in total**.
    ///
    /// It sends claims of any partition ([`claim_shard`](Self::claim_shard)),
    /// one per shard that leads partitions of the queue, not one per
    /// partition. First it asks the shards in turn without waiting
    /// (starting at a different shard each call, so none is always asked
    /// first) and returns what it found. When every shard had nothing it
    /// long-polls all of them at once, each claim with the time left of the
    /// one deadline, and returns as soon as one of them answers with
    /// deliveries, so a message arriving on any partition wakes it.
    ///
    /// The long-polls still outstanding are then withdrawn (the protocol's
    /// CancelClaim) before it returns: a withdrawn claim has claimed
    /// nothing, so a message arriving on its partition afterwards is left
    /// for the next claim, its delivery attempts untouched. Only a claim
    /// that the broker had already decided when the cancel arrived (the
    /// message came in within that round trip) still delivers; its
    /// deliveries are kept up to the credits, like those of answers that
    /// arrive together, and the ones beyond the credits are released, ready
    /// again after
    /// [`CLAIM_EXTRA_RELEASE_DELAY_MS`](crate::limits::CLAIM_EXTRA_RELEASE_DELAY_MS).
    /// Such a released message has used one delivery attempt (it counts
    /// towards the queue's `max_deliveries`). When a cancel cannot be
    /// delivered (the connection broke, or a broker without CancelClaim), or
    /// the returned future is dropped while it waits, a background task
    /// withdraws what it can and releases whatever the claims still bring.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::{ClaimOptions, Client, PayloadView};
    /// let client = Client::connect("127.0.0.1:7400").await?;
    /// // Up to 10 messages from any partition of "jobs", waiting at most 2 s in all.
    /// let deliveries = client.claim_any("jobs", &ClaimOptions::new(10).wait_ms(2_000)).await?;
    /// for delivery in &deliveries {
    ///     if let PayloadView::Inline(body) = delivery.payload() {
    ///         println!("{}/{}: {}", delivery.partition().0, delivery.offset().0, String::from_utf8_lossy(body));
    ///     }
    ///     client.ack("jobs", delivery.partition(), &[delivery.token()]).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`]; a partition's claim error when no
    /// partition delivered anything (with deliveries from another
    /// partition, the error is logged and the deliveries are returned).
    pub async fn claim_any(
        &self,
        queue: &str,
        options: &ClaimOptions,
    ) -> Result<Vec<Delivery>, ClientError> {
        let targets = self.claim_targets(queue).await?;
        let count = targets.len();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(options.wait_ms.into());
        let first = self.inner.next_sweep.fetch_add(1, Ordering::Relaxed) as usize % count;
        let mut received: Vec<Delivery> = Vec::new();
        let mut failed: Option<ClientError> = None;
        let mut waitable = Vec::new();
        for partition in (0..count).map(|n| targets[(first + n) % count]) {
            let remaining = options.credits.saturating_sub(received.len() as u32);
            if remaining == 0 {
                break;
            }
            let sweep = ClaimOptions { credits: remaining, wait_ms: 0, ..*options };
            match self.claim_shard(queue, partition, &sweep).await {
                Ok(batch) => {
                    received.extend(batch.deliveries);
                    waitable.push(partition);
                }
                Err(error) => {
                    tracing::warn!(%queue, partition = partition.0, %error, "claim failed");
                    failed.get_or_insert(error);
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let wait_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
        if !received.is_empty() || wait_ms == 0 || waitable.is_empty() {
            return match failed {
                Some(error) if received.is_empty() => Err(error),
                _ => Ok(received),
            };
        }
        let mut waits = PendingClaims::new(self.clone(), queue);
        let long_poll = ClaimOptions { wait_ms, ..*options };
        for partition in waitable {
            let (client, queue) = (self.clone(), Arc::clone(&waits.queue));
            let sent = Arc::clone(&waits.sent);
            waits.outstanding.insert(partition);
            waits.claims.spawn(async move {
                let on_sent = |connection: &Connection, id| sent.record(partition, connection, id);
                let any = PartitionId::ANY;
                let result =
                    client.claim_observed(&queue, partition, any, &long_poll, on_sent).await;
                (partition, result)
            });
        }
        let credits = options.credits as usize;
        let mut take = |joined: Result<ClaimAnswer, tokio::task::JoinError>,
                        received: &mut Vec<Delivery>,
                        waits: &mut PendingClaims| {
            match joined {
                Ok((partition, Ok(batch))) => {
                    waits.outstanding.remove(&partition);
                    for delivery in batch.deliveries {
                        if received.len() < credits {
                            received.push(delivery);
                        } else {
                            waits.extras.push(delivery);
                        }
                    }
                }
                Ok((partition, Err(error))) => {
                    waits.outstanding.remove(&partition);
                    tracing::warn!(%queue, partition = partition.0, %error, "claim failed");
                    failed.get_or_insert(error);
                }
                // A claim task ends only by answering, or by being
                // cancelled when the runtime shuts down.
                Err(_) => {
                    failed.get_or_insert(ClientError::Shutdown);
                }
            }
        };
        while received.is_empty() {
            let Some(joined) = waits.claims.join_next().await else { break };
            take(joined, &mut received, &mut waits);
        }
        // Answers that arrived in the same instant join up to the credits.
        while let Some(joined) = waits.claims.try_join_next() {
            take(joined, &mut received, &mut waits);
        }
        // Withdraw the long-polls still waiting. Once every cancel is
        // answered, each outstanding claim answers promptly: empty if the
        // cancel withdrew it, with deliveries if it had already claimed
        // (those join up to the credits too).
        if waits.withdraw().await {
            while let Some(joined) = waits.claims.join_next().await {
                take(joined, &mut received, &mut waits);
            }
        }
        // Dropping `waits` hands what is still outstanding to the release task.
        drop(waits);
        match failed {
            Some(error) if received.is_empty() => Err(error),
            _ => Ok(received),
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
    /// the tokens it does not name were acked. Otherwise as
    /// [`partition_call`](Self::partition_call), when no token was acked.
    pub async fn ack(
        &self,
        queue: &str,
        partition: PartitionId,
        tokens: &[DeliveryToken],
    ) -> Result<(), ClientError> {
        let request = Request::Ack(AckRequest { tokens: tokens.to_vec() });
        let bytes = self.partition_call(queue, partition, &request, self.request_timeout()).await?;
        let results = match bytes.response()? {
            Response::Ack(response) if response.results.len() == tokens.len() => response.results,
            _ => return Err(ClientError::Protocol("ack answered with a wrong response".into())),
        };
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

/// Where each long-poll of a [`Client::claim_any`] was sent, so it can be
/// withdrawn with a CancelClaim on the same connection.
#[derive(Default)]
struct SentClaims(Mutex<HashMap<PartitionId, SentClaim>>);

enum SentClaim {
    /// On this connection, under this correlation id.
    Sent(Connection, CorrelationId),
    /// Withdrawn before it was sent: cancel it as soon as it is.
    Withdrawn,
}

impl SentClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, SentClaim>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A long-poll was sent; if it is already withdrawn, cancels it now.
    fn record(&self, partition: PartitionId, connection: &Connection, id: CorrelationId) {
        let mut sent = self.lock();
        if let Some(SentClaim::Withdrawn) = sent.get(&partition) {
            let (connection, timeout) = (connection.clone(), connection.request_timeout());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = cancel_claim(&connection, id, timeout).await;
                });
            }
            return;
        }
        sent.insert(partition, SentClaim::Sent(connection.clone(), id));
    }

    /// Marks the long-polls of `partitions` withdrawn and returns those
    /// already sent, to cancel.
    fn withdraw(
        &self,
        partitions: &HashSet<PartitionId>,
    ) -> Vec<(PartitionId, Connection, CorrelationId)> {
        let mut sent = self.lock();
        let mut to_cancel = Vec::new();
        for &partition in partitions {
            if let Some(SentClaim::Sent(connection, id)) =
                sent.insert(partition, SentClaim::Withdrawn)
            {
                to_cancel.push((partition, connection, id));
            }
        }
        to_cancel
    }
}

/// Sends a CancelClaim for the claim `claim` sent earlier on `connection`.
async fn cancel_claim(
    connection: &Connection,
    claim: CorrelationId,
    timeout: Duration,
) -> Result<CancelOutcome, ClientError> {
    let request = Request::CancelClaim(CancelClaimRequest { claim });
    let bytes = connection.call_with_timeout(&request, timeout).await?;
    match bytes.response()? {
        Response::CancelClaim(response) => Ok(response.outcome),
        _ => Err(ClientError::Protocol("cancel claim answered with another response".into())),
    }
}

/// Sends a CancelClaim for each of `to_cancel`, all at once; true when
/// every one was answered (whatever the outcome).
async fn cancel_claims(
    to_cancel: Vec<(PartitionId, Connection, CorrelationId)>,
    timeout: Duration,
    queue: &str,
) -> bool {
    let mut cancels = tokio::task::JoinSet::new();
    for (partition, connection, id) in to_cancel {
        cancels.spawn(async move { (partition, cancel_claim(&connection, id, timeout).await) });
    }
    let mut all_answered = true;
    while let Some(joined) = cancels.join_next().await {
        match joined {
            Ok((_, Ok(_))) => {}
            Ok((partition, Err(error))) => {
                tracing::warn!(%queue, partition = partition.0, %error, "cancel of a long-poll claim failed");
                all_answered = false;
            }
            Err(_) => all_answered = false,
        }
    }
    all_answered
}

/// A partition's answer to one of [`Client::claim_any`]'s long-polls.
type ClaimAnswer = (PartitionId, Result<ClaimBatch, ClientError>);

/// The long-polls of a [`Client::claim_any`] and the deliveries it received
/// beyond its credits. Whatever is left when it is dropped (on return, or
/// when the caller drops the claim's future) goes to a task that withdraws
/// the outstanding claims, waits for them and releases every delivery they
/// bring, so no message stays leased to a caller that never sees it.
struct PendingClaims {
    client: Client,
    queue: Arc<str>,
    claims: tokio::task::JoinSet<ClaimAnswer>,
    /// Partitions whose long-poll has not answered yet.
    outstanding: HashSet<PartitionId>,
    sent: Arc<SentClaims>,
    extras: Vec<Delivery>,
}

impl PendingClaims {
    fn new(client: Client, queue: &str) -> Self {
        Self {
            client,
            queue: Arc::from(queue),
            claims: tokio::task::JoinSet::new(),
            outstanding: HashSet::new(),
            sent: Arc::default(),
            extras: Vec::new(),
        }
    }

    /// Withdraws every outstanding long-poll; true when each was sent and
    /// its cancel answered, so each will answer promptly.
    async fn withdraw(&mut self) -> bool {
        if self.outstanding.is_empty() {
            return true;
        }
        let to_cancel = self.sent.withdraw(&self.outstanding);
        let all_sent = to_cancel.len() == self.outstanding.len();
        let timeout = self.client.request_timeout();
        cancel_claims(to_cancel, timeout, &self.queue).await && all_sent
    }
}

impl Drop for PendingClaims {
    fn drop(&mut self) {
        if self.claims.is_empty() && self.extras.is_empty() {
            return;
        }
        let claims = std::mem::take(&mut self.claims);
        let extras = std::mem::take(&mut self.extras);
        let to_cancel = self.sent.withdraw(&self.outstanding);
        let (client, queue) = (self.client.clone(), Arc::clone(&self.queue));
        // Without a runtime (it is shutting down) the claims are aborted with
        // the set; their leases run out on the broker.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release_unwanted(client, queue, claims, to_cancel, extras));
        }
    }
}

/// Withdraws `to_cancel`, then releases `extras` and every delivery the
/// outstanding `claims` still bring.
async fn release_unwanted(
    client: Client,
    queue: Arc<str>,
    mut claims: tokio::task::JoinSet<ClaimAnswer>,
    to_cancel: Vec<(PartitionId, Connection, CorrelationId)>,
    extras: Vec<Delivery>,
) {
    cancel_claims(to_cancel, client.request_timeout(), &queue).await;
    let release = |delivery: Delivery| {
        let client = client.clone();
        let queue = Arc::clone(&queue);
        async move {
            let released = client
                .release(
                    &queue,
                    delivery.partition(),
                    delivery.token(),
                    CLAIM_EXTRA_RELEASE_DELAY_MS,
                    CLAIM_EXTRA_RELEASE_REASON,
                )
                .await;
            if let Err(error) = released {
                tracing::warn!(%queue, offset = delivery.offset().0, %error, "release of an unwanted delivery failed");
            }
        }
    };
    for delivery in extras {
        release(delivery).await;
    }
    while let Some(joined) = claims.join_next().await {
        if let Ok((_, Ok(batch))) = joined {
            for delivery in batch.deliveries {
                release(delivery).await;
            }
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
