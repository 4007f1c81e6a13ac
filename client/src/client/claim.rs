//! Claims of one partition or of one shard: what a claim asks for
//! ([`ClaimOptions`], this process's worker id), what it returns
//! ([`ClaimBatch`]), and [`Client::claim`] / [`Client::claim_shard`], which
//! send one Claim request through the client's routing and turn the answer
//! into [`Delivery`]s.
//!
//! It must not retry, wait beyond the claim's own long-poll, or settle a
//! delivery: a claim of every shard of a queue is `claim_any`'s, acks and
//! releases are the caller's.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use spool_wire::proto::{ClaimRequest, CorrelationId, PartitionId, Request, Response, WorkerId};

use super::Client;
use crate::connection::Connection;
use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::limits::{
    CLAIM_BYTES_DEFAULT, CLAIM_CREDITS_DEFAULT, CLAIM_WAIT_MS_DEFAULT, LEASE_MS_DEFAULT,
};

/// What a claim asks for: how many deliveries, how many record bytes, how
/// long a lease, how long to wait when nothing is ready, which worker the
/// tokens are bound to, and which subscription of the queue it claims for.
///
/// [`ClaimOptions::new`] fills in everything but the count: this process's
/// worker id ([`process_worker`]), [`CLAIM_BYTES_DEFAULT`],
/// [`LEASE_MS_DEFAULT`], [`CLAIM_WAIT_MS_DEFAULT`] and the queue's default
/// subscription; the builder methods change one field each. [`Default`]
/// asks for [`CLAIM_CREDITS_DEFAULT`].
///
/// ```
/// use spool_client::ClaimOptions;
///
/// let options = ClaimOptions::new(10).lease_ms(60_000).wait_ms(1_000);
/// assert_eq!((options.credits, options.lease_ms, options.wait_ms), (10, 60_000, 1_000));
/// assert_eq!(options.max_bytes, spool_client::limits::CLAIM_BYTES_DEFAULT);
/// assert_eq!(options.worker, ClaimOptions::default().worker, "one worker id per process");
/// assert_eq!(options.subscription, None, "the queue's default subscription");
/// let audit = options.subscription("audit");
/// assert_eq!(audit.subscription.as_deref(), Some("audit"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The subscription claimed for, by name (`[A-Za-z0-9._-]`, at most
    /// `SUBSCRIPTION_NAME_BYTES_MAX` bytes); `None`: the queue's default
    /// subscription. With a name the claim is sent as Claim v3
    /// ([`CLAIM_VERSION_SUBSCRIPTION`](spool_wire::proto::CLAIM_VERSION_SUBSCRIPTION)),
    /// which a broker from before
    /// subscriptions refuses (`UNSUPPORTED_VERSION`); without one, as
    /// before. A name the queue does not have is refused
    /// `SUBSCRIPTION_NOT_FOUND` ([`ClientError::Server`]).
    pub subscription: Option<Arc<str>>,
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
            subscription: None,
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

    /// Claims for the subscription named `name` instead of the queue's
    /// default one (see the `subscription` field).
    #[must_use]
    pub fn subscription(mut self, name: impl Into<Arc<str>>) -> Self {
        self.subscription = Some(name.into());
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

impl Client {
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
    pub(super) async fn claim_observed(
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
            subscription: options.subscription.as_deref().unwrap_or(""),
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
}
