//! [`Admin`]: the control plane — create, delete, list and describe queues;
//! peek, purge, list dead letters and redrive. Queue-wide operations go to the
//! bootstrap shard (creates and deletes on to a cluster's controller leader
//! when the bootstrap names it); partition-scoped ones (peek, purge, dead
//! letters, redrive) go to the partition's owner through
//! [`Client::partition_call`], like data.
//!
//! It owns no state beyond the [`Client`]; after a create or delete it drops
//! the queue's cached metadata so the next send sees the new layout.

use spool_wire::proto::{
    AssignmentVersion, Backoff, BackoffKind, CreateQueueRequest, DeadLetter, DeadLettersRequest,
    DeleteQueueRequest, DescribeQueueRequest, DescribeQueueResponse, ListQueuesRequest, Offset,
    PartitionId, PeekRequest, PeekedMessage, PurgeRequest, QueueConfig, QueueSummary,
    RedriveRequest, RedriveTarget, Request, ResizeQueueRequest, Response,
};

use crate::client::Client;
use crate::error::ClientError;
use crate::limits::{DEDUPE_WINDOW_MS_DEFAULT, LEASE_MS_DEFAULT};

/// Defaults for a new queue: one lease range of 1 s..15 min (30 s default),
/// 1 h lifetime, 10 deliveries, exponential backoff 1 s..5 min, 5 min dedupe
/// window (the broker's own default, and the interval peer brokers dedupe
/// over: it covers a producer's retries, and every id in it is held in
/// memory and rewritten by every checkpoint — see
/// `docs/design/queue-semantics.md`, "Dedupe"), 10 M messages / 10 GiB,
/// 4 priority bands.
pub fn default_queue_config(partitions: u32) -> QueueConfig {
    QueueConfig {
        partitions,
        priority_bands: 4,
        lease_default_ms: LEASE_MS_DEFAULT,
        lease_min_ms: 1_000,
        lease_max_ms: 15 * 60 * 1000,
        max_lease_lifetime_ms: 60 * 60 * 1000,
        max_deliveries: 10,
        backoff: Backoff { kind: BackoffKind::Exponential, base_ms: 1_000, cap_ms: 5 * 60 * 1000 },
        dedupe_window_ms: DEDUPE_WINDOW_MS_DEFAULT,
        max_messages: 10_000_000,
        max_bytes: 10 << 30,
        dead_letter_on_expiry: true,
    }
}

/// Control-plane operations.
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// use spool_client::{default_queue_config, Admin, Client};
///
/// let admin = Admin::new(Client::connect("127.0.0.1:7400").await?);
/// admin.create_queue("jobs", default_queue_config(4)).await?;
/// for queue in admin.list_queues().await? {
///     println!("{} ({} partitions)", queue.name, queue.partitions);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Admin {
    client: Client,
}

/// The answer of a partition request: the `field` of a `Response::Variant`,
/// or `None` for a response of another kind ([`Admin::on_partition`]).
macro_rules! answer {
    ($variant:ident . $field:ident) => {
        |response| match response {
            Response::$variant(response) => Some(response.$field),
            _ => None,
        }
    };
}

fn unexpected(operation: &str) -> ClientError {
    ClientError::Protocol(format!("{operation} answered with another response"))
}

impl Admin {
    /// Admin over `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn control(&self, request: Request<'_>) -> Result<crate::ResponseBytes, ClientError> {
        self.client.control(&request).await
    }

    async fn partition(
        &self,
        queue: &str,
        partition: PartitionId,
        request: Request<'_>,
    ) -> Result<crate::ResponseBytes, ClientError> {
        let timeout = self.client.config().connection.request_timeout;
        self.client.partition_call(queue, partition, &request, timeout).await
    }

    /// Sends `request` for a partition of `queue` to the shard that owns it
    /// and takes what the caller wants out of the response with `answer`;
    /// a response of another kind is a protocol error naming `operation`.
    async fn on_partition<T>(
        &self,
        operation: &str,
        queue: &str,
        partition: PartitionId,
        request: Request<'_>,
        answer: impl FnOnce(Response<'_>) -> Option<T>,
    ) -> Result<T, ClientError> {
        let bytes = self.partition(queue, partition, request).await?;
        answer(bytes.response()?).ok_or_else(|| unexpected(operation))
    }

    /// Creates a queue. In a cluster the request follows `NOT_OWNER` to
    /// the controller's leader, waiting (bounded) while none is known.
    ///
    /// # Errors
    /// `QUEUE_EXISTS`, `INVALID_ARGUMENT`,
    /// [`ClientError::ControlRouteExhausted`], or a transport error.
    pub async fn create_queue(
        &self,
        name: &str,
        config: QueueConfig,
    ) -> Result<AssignmentVersion, ClientError> {
        let request = CreateQueueRequest { name: name.to_owned(), config };
        let bytes =
            self.client.catalog_call("create queue", &Request::CreateQueue(request)).await?;
        self.client.forget_queue(name);
        match bytes.response()? {
            Response::CreateQueue(response) => Ok(response.assignment_version),
            _ => Err(unexpected("create queue")),
        }
    }

    /// Deletes a queue and everything in it; routed as
    /// [`create_queue`](Self::create_queue).
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, [`ClientError::ControlRouteExhausted`], or a
    /// transport error.
    pub async fn delete_queue(&self, name: &str) -> Result<AssignmentVersion, ClientError> {
        let request = Request::DeleteQueue(DeleteQueueRequest { name: name.to_owned() });
        let bytes = self.client.catalog_call("delete queue", &request).await?;
        self.client.forget_queue(name);
        match bytes.response()? {
            Response::DeleteQueue(response) => Ok(response.assignment_version),
            _ => Err(unexpected("delete queue")),
        }
    }

    /// Grows `name` to `partitions` partitions; routed as
    /// [`create_queue`](Self::create_queue). Keys move only into the added
    /// partitions (about `added / partitions` of them), whose messages go
    /// out once the older partitions finished what they held before the
    /// resize (`docs/design/protocol.md`, "Key routing"). Returns the
    /// queue's new key map version.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`; `INVALID_ARGUMENT` when `partitions` is not more
    /// than the queue has, past the limits, or while the previous resize
    /// still drains; [`ClientError::ControlRouteExhausted`], or a
    /// transport error.
    pub async fn resize_queue(&self, name: &str, partitions: u32) -> Result<u64, ClientError> {
        let request =
            Request::ResizeQueue(ResizeQueueRequest { name: name.to_owned(), partitions });
        let bytes = self.client.catalog_call("resize queue", &request).await?;
        self.client.forget_queue(name);
        match bytes.response()? {
            Response::ResizeQueue(response) => Ok(response.key_version),
            _ => Err(unexpected("resize queue")),
        }
    }

    /// Every queue with its partition count.
    ///
    /// # Errors
    /// A transport error.
    pub async fn list_queues(&self) -> Result<Vec<QueueSummary>, ClientError> {
        match self.control(Request::ListQueues(ListQueuesRequest {})).await?.response()? {
            Response::ListQueues(response) => Ok(response.queues),
            _ => Err(unexpected("list queues")),
        }
    }

    /// A queue's configuration and per-partition counts, sorted by
    /// partition.
    ///
    /// A shard reports only the partitions it owns (shards share no state),
    /// so this asks the bootstrap shard first, then the owner of every
    /// partition still missing (per fresh metadata), and merges. A partition
    /// its owner does not serve (not open) is absent from the result.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, or a transport error.
    pub async fn describe_queue(&self, name: &str) -> Result<DescribeQueueResponse, ClientError> {
        let request = DescribeQueueRequest { name: name.to_owned() };
        let mut merged =
            match self.control(Request::DescribeQueue(request.clone())).await?.response()? {
                Response::DescribeQueue(response) => response,
                _ => return Err(unexpected("describe queue")),
            };
        self.client.refresh_metadata(&[name]).await?;
        let partitions = self.client.partitions(name).await?;
        let mut asked: Vec<String> = Vec::new();
        for meta in &partitions {
            let reported = |merged: &DescribeQueueResponse| {
                merged.partitions.iter().any(|stats| stats.partition == meta.partition)
            };
            let addr = crate::client::address(&meta.host, meta.shard_port);
            if reported(&merged) || asked.contains(&addr) {
                continue;
            }
            let connection = self.client.connection(&addr).await?;
            let bytes = connection.call(&Request::DescribeQueue(request.clone())).await?;
            let Response::DescribeQueue(response) = bytes.response()? else {
                return Err(unexpected("describe queue"));
            };
            for stats in response.partitions {
                if !merged.partitions.iter().any(|known| known.partition == stats.partition) {
                    merged.partitions.push(stats);
                }
            }
            asked.push(addr);
        }
        merged.partitions.sort_by_key(|stats| stats.partition);
        Ok(merged)
    }

    /// Up to `max` messages of a partition from `from_offset`, without
    /// claiming them.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn peek(
        &self,
        queue: &str,
        partition: PartitionId,
        from_offset: Offset,
        max: u32,
    ) -> Result<Vec<PeekedMessage>, ClientError> {
        let request = PeekRequest { queue: queue.to_owned(), partition, from_offset, max };
        self.on_partition("peek", queue, partition, Request::Peek(request), answer!(Peek.messages))
            .await
    }

    /// Up to `max` dead letters of a partition from `from_offset`.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn dead_letters(
        &self,
        queue: &str,
        partition: PartitionId,
        from_offset: Offset,
        max: u32,
    ) -> Result<Vec<DeadLetter>, ClientError> {
        let request = DeadLettersRequest { queue: queue.to_owned(), partition, from_offset, max };
        self.on_partition(
            "dead letters",
            queue,
            partition,
            Request::DeadLetters(request),
            answer!(DeadLetters.entries),
        )
        .await
    }

    /// Drops a partition's messages; with `dry_run` only counts them.
    /// Returns the count.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn purge(
        &self,
        queue: &str,
        partition: PartitionId,
        dry_run: bool,
    ) -> Result<u64, ClientError> {
        let request = PurgeRequest { queue: queue.to_owned(), partition, dry_run };
        self.on_partition("purge", queue, partition, Request::Purge(request), answer!(Purge.count))
            .await
    }

    /// Moves dead letters of a partition back to ready; returns how many.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn redrive(
        &self,
        queue: &str,
        partition: PartitionId,
        target: RedriveTarget,
    ) -> Result<u64, ClientError> {
        let request = RedriveRequest { queue: queue.to_owned(), partition, target };
        self.on_partition(
            "redrive",
            queue,
            partition,
            Request::Redrive(request),
            answer!(Redrive.count),
        )
        .await
    }
}
