//! [`Consumer`]: credit-based claiming and concurrent handlers.
//!
//! Owns a claim loop and one task per delivery. The consumer has `slots`
//! execution slots; it claims exactly its free slots as credits, so it never
//! holds more deliveries than slots (the broker never pushes more than the
//! credits). Each delivery runs the user's async handler in its own task while
//! the lease is extended every `extend_interval` (half the lease by default);
//! `Ok` acks, `Err` releases with the error text as the reason, a panic
//! releases with "handler panicked". The slot frees only after the ack or
//! release returned.
//!
//! Partitions are claimed in turn; a claim long-polls (`wait_ms`) only after a
//! full sweep found nothing, so a busy partition is not held up behind an
//! idle one. [`Consumer::shutdown`] stops claiming, waits for a claim already
//! in flight (its deliveries are released at once), and drains running
//! handlers (acking or releasing them).
//!
//! It does not batch acks (one Ack per delivery) or rebalance partitions
//! between consumers: every consumer claims from every partition.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_wire::proto::limits::{CLAIM_BYTES_MAX, CLAIM_WAIT_MS_MAX, LEASE_MS_MAX};
use spool_wire::proto::{PartitionId, WorkerId};
use spool_wire::ErrorCode;
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::client::{ClaimOptions, Client};
use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::limits::{
    CLAIM_BYTES_DEFAULT, CLAIM_ERROR_BACKOFF, CLAIM_WAIT_MS_DEFAULT, CONSUMER_SLOTS_MAX,
    LEASE_MS_DEFAULT,
};

/// Release reason for a delivery that arrives after shutdown began.
pub const SHUTDOWN_REASON: &str = "consumer shutting down";

/// Release reason for a handler that panicked.
pub const PANIC_REASON: &str = "handler panicked";

/// Settings of a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The queue to consume.
    pub queue: String,
    /// Execution slots: deliveries handled at once, `1..=CONSUMER_SLOTS_MAX`.
    pub slots: u32,
    /// Lease asked for per claim and per extension.
    pub lease_ms: u32,
    /// Long-poll wait of a claim after an empty sweep, `0..=CLAIM_WAIT_MS_MAX`.
    pub wait_ms: u32,
    /// Record bytes asked for per claim.
    pub max_bytes: u32,
    /// Bound into delivery tokens; random by default.
    pub worker: WorkerId,
    /// How often a running handler's lease is extended; half the lease when
    /// `None`.
    pub extend_interval: Option<Duration>,
    /// Release delay on handler failure (0 = the queue's backoff policy).
    pub release_delay_ms: u32,
}

impl ConsumerConfig {
    /// Defaults for `queue` with `slots` execution slots.
    pub fn new(queue: impl Into<String>, slots: u32) -> Self {
        Self {
            queue: queue.into(),
            slots,
            lease_ms: LEASE_MS_DEFAULT,
            wait_ms: CLAIM_WAIT_MS_DEFAULT,
            max_bytes: CLAIM_BYTES_DEFAULT,
            worker: WorkerId(rand::random()),
            extend_interval: None,
            release_delay_ms: 0,
        }
    }

    fn validate(&self) -> Result<(), ClientError> {
        spool_wire::proto::validate_queue_name(&self.queue)?;
        let check =
            |ok: bool, what: String| if ok { Ok(()) } else { Err(ClientError::Config(what)) };
        check(
            (1..=CONSUMER_SLOTS_MAX).contains(&self.slots),
            format!("slots {} outside 1..={CONSUMER_SLOTS_MAX}", self.slots),
        )?;
        check(
            (1..=LEASE_MS_MAX).contains(&self.lease_ms),
            format!("lease_ms {} outside 1..={LEASE_MS_MAX}", self.lease_ms),
        )?;
        check(
            self.wait_ms <= CLAIM_WAIT_MS_MAX,
            format!("wait_ms {} above {CLAIM_WAIT_MS_MAX}", self.wait_ms),
        )?;
        check(
            (1..=CLAIM_BYTES_MAX).contains(&self.max_bytes),
            format!("max_bytes {} outside 1..={CLAIM_BYTES_MAX}", self.max_bytes),
        )?;
        check(
            self.extend_interval.is_none_or(|interval| !interval.is_zero()),
            "extend_interval must be positive".to_owned(),
        )
    }

    fn extend_every(&self) -> Duration {
        self.extend_interval
            .unwrap_or_else(|| Duration::from_millis(u64::from(self.lease_ms.div_ceil(2))))
    }
}

/// Counters of a consumer's life, for tests and monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Deliveries received.
    pub claimed: u64,
    /// Acked after the handler succeeded.
    pub acked: u64,
    /// Released (handler error, panic, or shutdown).
    pub released: u64,
    /// Successful lease extensions.
    pub extended: u64,
    /// Extensions refused (the lease is lost or at its lifetime cap).
    pub extend_failed: u64,
    /// Acks or releases the broker refused or that failed in transit.
    pub settle_failed: u64,
    /// Claims that failed.
    pub claim_failed: u64,
    /// Most deliveries held at once; never above the slots.
    pub outstanding_max: u64,
}

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    acked: AtomicU64,
    released: AtomicU64,
    extended: AtomicU64,
    extend_failed: AtomicU64,
    settle_failed: AtomicU64,
    claim_failed: AtomicU64,
    outstanding: AtomicU64,
    outstanding_max: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ConsumerStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            claimed: load(&self.claimed),
            acked: load(&self.acked),
            released: load(&self.released),
            extended: load(&self.extended),
            extend_failed: load(&self.extend_failed),
            settle_failed: load(&self.settle_failed),
            claim_failed: load(&self.claim_failed),
            outstanding_max: load(&self.outstanding_max),
        }
    }
}

struct Shared {
    client: Client,
    config: ConsumerConfig,
    slots: Arc<Semaphore>,
    counters: Counters,
}

/// Frees one slot when a delivery is settled (or its task ends otherwise).
struct SlotGuard {
    shared: Arc<Shared>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.counters.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.shared.slots.add_permits(1);
    }
}

/// A running consumer; [`shutdown`](Self::shutdown) stops it.
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// use spool_client::{Client, Consumer, ConsumerConfig, Delivery, PayloadView};
///
/// let client = Client::connect("127.0.0.1:7400").await?;
/// let consumer = Consumer::start(client, ConsumerConfig::new("jobs", 16), |delivery: Delivery| async move {
///     match delivery.payload() {
///         PayloadView::Inline(bytes) => println!("job {} bytes", bytes.len()),
///         PayloadView::Reference { location, .. } => println!("job at {location}"),
///     }
///     Ok::<(), std::io::Error>(())
/// })?;
/// tokio::time::sleep(std::time::Duration::from_secs(10)).await;
/// let stats = consumer.shutdown().await;
/// println!("acked {}", stats.acked);
/// # Ok(()) }
/// ```
pub struct Consumer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Consumer")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Consumer {
    /// Starts claiming from `config.queue` and running `handler` per
    /// delivery, on the current tokio runtime.
    ///
    /// # Errors
    /// [`ClientError::Config`] or [`ClientError::Encode`] for a bad config.
    pub fn start<H, F, E>(
        client: Client,
        config: ConsumerConfig,
        handler: H,
    ) -> Result<Self, ClientError>
    where
        H: Fn(Delivery) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        config.validate()?;
        let shared = Arc::new(Shared {
            client,
            slots: Arc::new(Semaphore::new(config.slots as usize)),
            config,
            counters: Counters::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(claim_loop(Arc::clone(&shared), Arc::new(handler), stopped));
        Ok(Self { shared, stop, task })
    }

    /// Counters so far.
    pub fn stats(&self) -> ConsumerStats {
        self.shared.counters.snapshot()
    }

    /// Stops claiming and waits until every delivery is acked or released.
    pub async fn shutdown(self) -> ConsumerStats {
        // The loop may already have ended (it never does on its own); either
        // way the join below is what waits.
        let _ = self.stop.send(true);
        if let Err(error) = self.task.await {
            tracing::error!(%error, "consumer claim loop failed");
        }
        self.shared.counters.snapshot()
    }
}

async fn claim_loop<H, F, E>(
    shared: Arc<Shared>,
    handler: Arc<H>,
    mut stopped: watch::Receiver<bool>,
) where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let config = &shared.config;
    let mut tasks = JoinSet::new();
    let mut next_partition = 0u32;
    let mut empty_claims = 0usize;
    loop {
        if *stopped.borrow() {
            break;
        }
        // Wait for one free slot, then take every other free one too.
        let first = tokio::select! {
            slot = Arc::clone(&shared.slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = stopped.changed() => break,
        };
        first.forget();
        let mut credits = 1u32;
        while credits < config.slots {
            match shared.slots.try_acquire() {
                Ok(slot) => {
                    slot.forget();
                    credits += 1;
                }
                Err(_) => break,
            }
        }
        while tasks.try_join_next().is_some() {}
        let partitions = match shared.client.partitions(&config.queue).await {
            Ok(partitions) => partitions.len(),
            Err(error) => {
                tracing::warn!(queue = %config.queue, %error, "no metadata for the consumer's queue");
                shared.slots.add_permits(credits as usize);
                shared.counters.claim_failed.fetch_add(1, Ordering::Relaxed);
                pause(&mut stopped).await;
                continue;
            }
        };
        let partition = PartitionId(next_partition % u32::try_from(partitions).unwrap_or(u32::MAX));
        next_partition = next_partition.wrapping_add(1);
        let options = ClaimOptions {
            worker: config.worker,
            credits,
            max_bytes: config.max_bytes,
            lease_ms: config.lease_ms,
            wait_ms: if empty_claims >= partitions { config.wait_ms } else { 0 },
        };
        // A claim in flight is never abandoned: its deliveries would sit
        // leased to nobody until their leases expired.
        match shared.client.claim(&config.queue, partition, &options).await {
            Ok(batch) => {
                let received = batch.deliveries.len();
                shared.slots.add_permits(credits as usize - received);
                empty_claims = if received == 0 { empty_claims + 1 } else { 0 };
                let counters = &shared.counters;
                counters.claimed.fetch_add(received as u64, Ordering::Relaxed);
                let outstanding = counters.outstanding.fetch_add(received as u64, Ordering::AcqRel)
                    + received as u64;
                counters.outstanding_max.fetch_max(outstanding, Ordering::AcqRel);
                assert!(outstanding <= u64::from(config.slots));
                let stopping = *stopped.borrow();
                for delivery in batch.deliveries {
                    let guard = SlotGuard { shared: Arc::clone(&shared) };
                    if stopping {
                        let target = SettleTarget::of(&delivery);
                        tasks.spawn(settle(guard, target, Err(SHUTDOWN_REASON.to_owned())));
                    } else {
                        tasks.spawn(run_delivery(guard, Arc::clone(&handler), delivery));
                    }
                }
            }
            Err(error) => {
                tracing::warn!(queue = %config.queue, partition = partition.0, %error, "claim failed");
                shared.slots.add_permits(credits as usize);
                shared.counters.claim_failed.fetch_add(1, Ordering::Relaxed);
                pause(&mut stopped).await;
            }
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// Waits [`CLAIM_ERROR_BACKOFF`], or less if shutdown begins.
async fn pause(stopped: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(CLAIM_ERROR_BACKOFF) => {}
        _ = stopped.changed() => {}
    }
}

async fn run_delivery<H, F, E>(guard: SlotGuard, handler: Arc<H>, delivery: Delivery)
where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let shared = Arc::clone(&guard.shared);
    let config = &shared.config;
    let target = SettleTarget::of(&delivery);
    let (queue, partition, token) = (Arc::clone(&target.queue), target.partition, target.token);
    // The handler runs in its own task so extending never pauses it, and a
    // panic is caught as a join error instead of killing this task.
    let mut handle = tokio::spawn(handler(delivery));
    let mut extending = true;
    let outcome = loop {
        tokio::select! {
            joined = &mut handle => break match joined {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err(PANIC_REASON.to_owned()),
            },
            () = tokio::time::sleep(config.extend_every()), if extending => {
                match shared.client.extend(&queue, partition, token, config.lease_ms).await {
                    Ok(_) => {
                        shared.counters.extended.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        shared.counters.extend_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%queue, offset = target.offset.0, %error, "extend failed");
                        // A lost lease or a lifetime cap will not come back;
                        // a transient failure is tried again next interval.
                        extending = error.is_retriable();
                    }
                }
            }
        }
    };
    settle(guard, target, outcome).await;
}

/// What settling a delivery needs, so the handler can own the delivery.
struct SettleTarget {
    queue: Arc<str>,
    partition: PartitionId,
    offset: spool_wire::proto::Offset,
    token: spool_wire::proto::DeliveryToken,
}

impl SettleTarget {
    fn of(delivery: &Delivery) -> Self {
        Self {
            queue: Arc::clone(&delivery.queue),
            partition: delivery.partition,
            offset: delivery.offset,
            token: delivery.token,
        }
    }
}

/// Acks (`Ok`) or releases with the reason (`Err`), then frees the slot.
async fn settle(guard: SlotGuard, delivery: SettleTarget, outcome: Result<(), String>) {
    let shared = &guard.shared;
    let counters = &shared.counters;
    let (queue, partition, token) = (&*delivery.queue, delivery.partition, delivery.token);
    match outcome {
        Ok(()) => match shared.client.ack(queue, partition, &[token]).await {
            Ok(codes) if codes.first() == Some(&ErrorCode::None) => {
                counters.acked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(codes) => {
                tracing::warn!(%queue, offset = delivery.offset.0, ?codes, "ack refused");
                counters.settle_failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(%queue, offset = delivery.offset.0, %error, "ack failed");
                counters.settle_failed.fetch_add(1, Ordering::Relaxed);
            }
        },
        Err(reason) => {
            let delay_ms = shared.config.release_delay_ms;
            match shared.client.release(queue, partition, token, delay_ms, &reason).await {
                Ok(_) => {
                    counters.released.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::warn!(%queue, offset = delivery.offset.0, %error, "release failed");
                    counters.settle_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    drop(guard);
}
