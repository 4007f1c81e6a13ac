//! [`Admin`]: the control plane — create, delete, list and describe queues;
//! create and delete a queue's subscriptions; peek, purge, list dead letters
//! and redrive. Queue-wide operations go to the bootstrap shard (creates and
//! deletes, of queues and of subscriptions, on to a cluster's controller
//! leader when the bootstrap names it); partition-scoped ones (peek, purge,
//! dead letters, redrive) go to the partition's owner through
//! [`Client::partition_call`], like data.
//!
//! It owns no state beyond the [`Client`]; after a create or delete it drops
//! the queue's cached metadata so the next send sees the new layout.

use spool_wire::proto::{
    AssignmentVersion, Backoff, BackoffKind, CreateQueueRequest, CreateSubscriptionRequest,
    CreateSubscriptionResponse, DeadLetter, DeadLettersRequest, DeleteQueueRequest,
    DeleteSubscriptionRequest, DescribeQueueRequest, DescribeQueueResponse, ListQueuesRequest,
    Offset, PartitionId, PeekRequest, PeekedMessage, PurgeRequest, QueueConfig, QueueSummary,
    RedriveRequest, RedriveTarget, Request, ResizeQueueRequest, Response, SubscriptionStart,
    SubscriptionStats, DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
};
use spool_wire::ErrorCode;

use crate::client::Client;
use crate::connection::Connection;
use crate::error::ClientError;
use crate::limits::{DEDUPE_WINDOW_MS_DEFAULT, LEASE_MS_DEFAULT};

/// Defaults for a new queue: one lease range of 1 s..15 min (30 s default),
/// 1 h lifetime, 10 deliveries, exponential backoff 1 s..5 min, 5 min dedupe
/// window (the broker's own default, and the interval peer brokers dedupe
/// over: it covers a producer's retries, and every id in it is held in
/// memory and rewritten by every checkpoint — see
/// `docs/design/queue-semantics.md`, "Dedupe"), 10 M messages / 10 GiB,
/// 4 priority bands, no retention window (a record leaves once every
/// subscription finished it), unordered.
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
        retention_ms: 0,
        retention_bytes: 0,
        ordered: false,
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

/// A broker from before retention windows refused the CreateQueue v2 that
/// asked for one: say so, rather than only that a version is unsupported.
fn create_unsupported(name: &str, config: &QueueConfig, error: &ClientError) -> ClientError {
    let said = match error {
        ClientError::Server { message, .. } => message.clone(),
        other => other.to_string(),
    };
    let message = if config.ordered {
        format!(
            "the broker does not know ordered queues (CreateQueue v3: {said}); upgrade it, \
             or create queue {name} unordered"
        )
    } else {
        format!(
            "the broker does not know retention windows (CreateQueue v2: {said}); upgrade it, \
             or create queue {name} without retention_ms and retention_bytes"
        )
    };
    ClientError::Server { code: ErrorCode::UnsupportedVersion, message }
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
    /// A queue with a retention window ([`QueueConfig::has_window`]) is
    /// asked as CreateQueue v2
    /// ([`CREATE_QUEUE_VERSION_RETENTION`](spool_wire::proto::CREATE_QUEUE_VERSION_RETENTION)),
    /// one without as v1: a broker from before windows refuses the v2
    /// (`UNSUPPORTED_VERSION`, with a message saying so) rather than
    /// create the queue without its window. An ordered queue
    /// ([`QueueConfig::ordered`]) is asked as v3
    /// ([`CREATE_QUEUE_VERSION_ORDERED`](spool_wire::proto::CREATE_QUEUE_VERSION_ORDERED))
    /// for the same reason: a broker from before ordered lanes refuses it
    /// rather than create the queue unordered.
    ///
    /// # Errors
    /// `QUEUE_EXISTS`, `INVALID_ARGUMENT` (a window outside its range is
    /// refused before anything is sent; the broker refuses an ordered
    /// queue with a window), `UNSUPPORTED_VERSION` (a window or ordering
    /// asked of a broker that predates them),
    /// [`ClientError::ControlRouteExhausted`], or a transport error.
    pub async fn create_queue(
        &self,
        name: &str,
        config: QueueConfig,
    ) -> Result<AssignmentVersion, ClientError> {
        let newer = config.has_window() || config.ordered;
        let asked = config.clone();
        let request = Request::CreateQueue(CreateQueueRequest { name: name.to_owned(), config });
        let bytes = match self.client.catalog_call("create queue", &request).await {
            Err(error) if newer && error.code() == Some(ErrorCode::UnsupportedVersion) => {
                return Err(create_unsupported(name, &asked, &error));
            }
            answer => answer?,
        };
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

    /// A queue's configuration, per-partition counts sorted by partition,
    /// and its subscriptions (the default first) with their counters.
    ///
    /// A shard reports only the partitions it owns (shards share no state),
    /// so this asks the bootstrap shard first, then the owner of every
    /// partition still missing (per fresh metadata), and merges: each
    /// subscription's counters are summed over the shards' answers (the
    /// ages: the largest). A partition its owner does not serve (not open)
    /// is absent from the result, and so are its counters from the
    /// subscriptions'.
    ///
    /// Each shard is asked DescribeQueue v2
    /// ([`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`]); a broker from before it
    /// answers `UNSUPPORTED_VERSION` and is asked v1 instead, whose answer
    /// names no subscription: against such a broker
    /// [`subscriptions`](DescribeQueueResponse::subscriptions) is empty
    /// (not even the default is listed; its counts are the partitions').
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, or a transport error.
    pub async fn describe_queue(&self, name: &str) -> Result<DescribeQueueResponse, ClientError> {
        let request = DescribeQueueRequest { name: name.to_owned() };
        let bootstrap = self.client.connection(self.client.bootstrap()).await?;
        let mut merged = describe_at(&bootstrap, &request).await?;
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
            let response = describe_at(&connection, &request).await?;
            let mut added = false;
            for stats in response.partitions {
                if !merged.partitions.iter().any(|known| known.partition == stats.partition) {
                    merged.partitions.push(stats);
                    added = true;
                }
            }
            // A shard's subscription counters cover the partitions it
            // reported: added only when it brought partitions not yet
            // counted.
            if added {
                merge_subscriptions(&mut merged.subscriptions, response.subscriptions);
            }
            asked.push(addr);
        }
        merged.partitions.sort_by_key(|stats| stats.partition);
        Ok(merged)
    }

    /// Adds subscription `name` to `queue`, starting at `start` on each
    /// partition (`Latest`: only what is enqueued after; `Earliest`: every
    /// record a partition still has to deliver). Routed as
    /// [`create_queue`](Self::create_queue). Answered once the table holds
    /// it and every shard of the answering node applied it; each
    /// partition's leader then starts it in its log, within a turn of its
    /// subscription watch (a claim for it until then is answered
    /// `SUBSCRIPTION_NOT_FOUND` on that partition, or waits, as the
    /// consumer's long-poll does). Returns the table version and the
    /// subscription's id.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`; `INVALID_ARGUMENT` for a name the queue has
    /// already, `default`, a bad name, or a queue with the most
    /// subscriptions it may have; `UNKNOWN_API` from a broker that
    /// predates subscription admin over the wire;
    /// [`ClientError::ControlRouteExhausted`], or a transport error.
    pub async fn create_subscription(
        &self,
        queue: &str,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<CreateSubscriptionResponse, ClientError> {
        let request = Request::CreateSubscription(CreateSubscriptionRequest {
            queue: queue.to_owned(),
            name: name.to_owned(),
            start,
        });
        let bytes = self.client.catalog_call("create subscription", &request).await?;
        match bytes.response()? {
            Response::CreateSubscription(response) => Ok(response),
            _ => Err(unexpected("create subscription")),
        }
    }

    /// Deletes subscription `name` of `queue`: its claims, leases and dead
    /// letters go; records only it still held become releasable. Routed as
    /// [`create_queue`](Self::create_queue); returns the table version
    /// without it.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`; `SUBSCRIPTION_NOT_FOUND` for a name the queue
    /// does not have; `INVALID_ARGUMENT` for `default` (it is never
    /// deleted) or a bad name; `UNKNOWN_API` from a broker that predates
    /// subscription admin over the wire;
    /// [`ClientError::ControlRouteExhausted`], or a transport error.
    pub async fn delete_subscription(
        &self,
        queue: &str,
        name: &str,
    ) -> Result<AssignmentVersion, ClientError> {
        let request = Request::DeleteSubscription(DeleteSubscriptionRequest {
            queue: queue.to_owned(),
            name: name.to_owned(),
        });
        let bytes = self.client.catalog_call("delete subscription", &request).await?;
        match bytes.response()? {
            Response::DeleteSubscription(response) => Ok(response.assignment_version),
            _ => Err(unexpected("delete subscription")),
        }
    }

    /// Up to `max` messages of a partition from `from_offset`, without
    /// claiming them, as the queue's default subscription holds them.
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
        self.peek_in(queue, "", partition, from_offset, max).await
    }

    /// [`Admin::peek`] of subscription `sub` (`""`: the default): the
    /// messages it has yet to finish, in the state it holds them. A named
    /// subscription goes as Peek v2
    /// ([`INSPECT_VERSION_SUBSCRIPTION`](spool_wire::proto::INSPECT_VERSION_SUBSCRIPTION)).
    ///
    /// # Errors
    /// As [`Admin::peek`]; `SUBSCRIPTION_NOT_FOUND`; `UNSUPPORTED_VERSION`
    /// from a broker older than subscriptions.
    pub async fn peek_in(
        &self,
        queue: &str,
        sub: &str,
        partition: PartitionId,
        from_offset: Offset,
        max: u32,
    ) -> Result<Vec<PeekedMessage>, ClientError> {
        let request = PeekRequest {
            queue: queue.to_owned(),
            partition,
            from_offset,
            max,
            subscription: sub.to_owned(),
        };
        self.on_partition("peek", queue, partition, Request::Peek(request), answer!(Peek.messages))
            .await
    }

    /// Up to `max` dead letters of a partition from `from_offset`, of the
    /// queue's default subscription.
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
        self.dead_letters_in(queue, "", partition, from_offset, max).await
    }

    /// [`Admin::dead_letters`] of subscription `sub` (`""`: the default).
    ///
    /// # Errors
    /// As [`Admin::dead_letters`]; `SUBSCRIPTION_NOT_FOUND`.
    pub async fn dead_letters_in(
        &self,
        queue: &str,
        sub: &str,
        partition: PartitionId,
        from_offset: Offset,
        max: u32,
    ) -> Result<Vec<DeadLetter>, ClientError> {
        let request = DeadLettersRequest {
            queue: queue.to_owned(),
            partition,
            from_offset,
            max,
            subscription: sub.to_owned(),
        };
        self.on_partition(
            "dead letters",
            queue,
            partition,
            Request::DeadLetters(request),
            answer!(DeadLetters.entries),
        )
        .await
    }

    /// Drops a partition's messages (of the default subscription); with
    /// `dry_run` only counts them. Returns the count.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn purge(
        &self,
        queue: &str,
        partition: PartitionId,
        dry_run: bool,
    ) -> Result<u64, ClientError> {
        self.purge_in(queue, "", partition, dry_run).await
    }

    /// [`Admin::purge`] of subscription `sub` (`""`: the default): its
    /// unclaimed messages leave it; the records stay for every other
    /// subscription.
    ///
    /// # Errors
    /// As [`Admin::purge`]; `SUBSCRIPTION_NOT_FOUND`.
    pub async fn purge_in(
        &self,
        queue: &str,
        sub: &str,
        partition: PartitionId,
        dry_run: bool,
    ) -> Result<u64, ClientError> {
        let request = PurgeRequest {
            queue: queue.to_owned(),
            partition,
            dry_run,
            subscription: sub.to_owned(),
        };
        self.on_partition("purge", queue, partition, Request::Purge(request), answer!(Purge.count))
            .await
    }

    /// Moves dead letters of a partition (of the default subscription) back
    /// to ready; returns how many.
    ///
    /// # Errors
    /// `QUEUE_NOT_FOUND`, `PARTITION_NOT_FOUND`, or a transport error.
    pub async fn redrive(
        &self,
        queue: &str,
        partition: PartitionId,
        target: RedriveTarget,
    ) -> Result<u64, ClientError> {
        self.redrive_in(queue, "", partition, target).await
    }

    /// [`Admin::redrive`] of subscription `sub`'s dead letters (`""`: the
    /// default's): they are ready again in that subscription alone.
    ///
    /// # Errors
    /// As [`Admin::redrive`]; `SUBSCRIPTION_NOT_FOUND`.
    pub async fn redrive_in(
        &self,
        queue: &str,
        sub: &str,
        partition: PartitionId,
        target: RedriveTarget,
    ) -> Result<u64, ClientError> {
        let request = RedriveRequest {
            queue: queue.to_owned(),
            partition,
            target,
            subscription: sub.to_owned(),
        };
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

/// DescribeQueue at one shard: v2, with the subscriptions, or v1 from a
/// broker that does not speak v2 (its answer lists none).
async fn describe_at(
    connection: &Connection,
    request: &DescribeQueueRequest,
) -> Result<DescribeQueueResponse, ClientError> {
    let request = Request::DescribeQueue(request.clone());
    let bytes = match connection.call_version(&request, DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS).await
    {
        Err(error) if error.code() == Some(ErrorCode::UnsupportedVersion) => {
            connection.call(&request).await?
        }
        answer => answer?,
    };
    match bytes.response()? {
        Response::DescribeQueue(response) => Ok(response),
        _ => Err(unexpected("describe queue")),
    }
}

/// Adds another shard's subscription rows to `merged`: a subscription
/// both list (by id and name) is merged ([`SubscriptionStats::merge`]), one
/// only `more` lists (made between the two answers) is appended.
fn merge_subscriptions(merged: &mut Vec<SubscriptionStats>, more: Vec<SubscriptionStats>) {
    for stats in more {
        match merged.iter_mut().find(|known| known.id == stats.id && known.name == stats.name) {
            Some(known) => known.merge(&stats),
            None => merged.push(stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use spool_wire::proto::{SubscriptionStart, SubscriptionStats};

    use super::merge_subscriptions;

    fn row(name: &str, id: u16, ready: u64, age: u64) -> SubscriptionStats {
        SubscriptionStats {
            name: name.into(),
            id,
            start: SubscriptionStart::Earliest,
            partitions: 1,
            ready,
            scheduled: 1,
            claimed: 2,
            dead_letters: 0,
            oldest_ready_age_ms: age,
            oldest_claim_age_ms: age * 2,
            acked: 5,
            lost: ready * 10,
        }
    }

    // Goal: two shards' rows of one subscription add up (ages: the larger),
    // and a subscription only the later answer lists is kept; method: two
    // hand-made lists merged.
    #[test]
    fn subscription_rows_merge_across_shards() {
        let mut merged = vec![row("default", 0, 3, 10), row("audit", 1, 4, 50)];
        merge_subscriptions(
            &mut merged,
            vec![row("default", 0, 7, 30), row("audit", 1, 1, 20), row("late", 2, 9, 1)],
        );
        let summary: Vec<_> = merged
            .iter()
            .map(|s| {
                (s.name.as_str(), s.partitions, s.ready, s.oldest_ready_age_ms, s.acked, s.lost)
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("default", 2, 10, 30, 10, 100),
                ("audit", 2, 5, 50, 10, 50),
                ("late", 1, 9, 1, 5, 90)
            ]
        );
        assert_eq!(merged[0].oldest_claim_age_ms, 60);
    }
}
