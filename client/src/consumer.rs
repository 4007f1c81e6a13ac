//! [`Consumer`]: credit-based claiming, concurrent handlers, batched acks.
//!
//! Owns a claim loop, one task per delivery and an acker task. The consumer
//! has `slots` execution slots and may hold `prefetch` more deliveries
//! waiting for one: every claim asks for free room (`slots + prefetch` minus
//! the deliveries held) as credits, and the broker never pushes more than
//! the credits (docs/design/protocol.md). A delivery is held from its claim until its
//! handler returned and its outcome is handed on: an `Ok` joins the ack
//! pipeline, so the slot (and the credit) frees while the Ack is still on
//! its way, and a handler's slot time is its own work, not a claim or an
//! ack round trip; an `Err` holds its slot until the release is answered.
//! The ack pipeline is bounded on its own (`acks_pending_max`): a handler
//! that finished while it is full keeps its slot until there is room.
//!
//! **Prefetch** hides the claim round trip: with `prefetch` > 0 a few
//! deliveries wait, their leases extended like running ones, so a slot that
//! frees starts its next delivery at once instead of after a claim. Their
//! lease runs while they wait, so keep it small: about the deliveries the
//! slots finish during one claim round trip.
//!
//! **Claims are pipelined and go to shards, not partitions**: each is a
//! claim of any partition (`Claim` v1, partition `ANY`) sent to the next
//! shard in turn that leads partitions of the queue
//! ([`Client::claim_targets`]); the broker answers it from whichever of
//! that shard's partitions have messages ready, in rotation. So a queue of
//! 10,000 partitions on 2 shards costs one claim per shard, not one per
//! partition. Up to `claims_in_flight` claims are outstanding at once, each
//! asking for at most a share of the slots (`slots / claims_in_flight`).
//! The first claim goes out as soon as one slot is free; further ones wait
//! until a share is free, so slots that come back one at a time are
//! claimed in useful batches rather than one per request. A claim
//! long-polls (`wait_ms`) only after a full sweep of the shards found
//! nothing; since it holds only a share, one idle shard cannot hold every
//! slot while another has work.
//!
//! **Caught-up shards** get one claim at a time: a shard whose last claim
//! came back with fewer deliveries than it asked for has been drained to
//! what is durable there, so its next claim long-polls (it is answered as
//! soon as messages arrive) and no second one goes there until it answered;
//! the other claims go, in turn, to the shards that still fill them. A
//! claim that comes back full makes its shard busy again. Without this a
//! consumer whose backlog sits on one shard sent every other claim to an
//! idle one and got half of its answers empty.
//!
//! **Acks are batched**: a handler that returned `Ok` hands its delivery to
//! the acker, which sends one Ack request per shard for everything that
//! completed within `ack_linger` of the first waiting delivery, or as soon as
//! `ack_batch_max` are waiting (the protocol's Ack carries up to
//! `ACK_TOKENS_MAX` tokens). At most [`ACK_REQUESTS_IN_FLIGHT_MAX`] Ack
//! requests are outstanding; completions meanwhile join the next batch.
//! Releases (handler error, panic, shutdown) go out one per delivery at once:
//! they carry their own reason and delay, and are rare.
//!
//! Each delivery runs the user's async handler in its own task while the
//! lease is extended every `extend_interval` (half the lease by default);
//! `Ok` acks, `Err` releases with the error text as the reason, a panic
//! releases with "handler panicked". [`Consumer::shutdown`] stops claiming,
//! waits for the claims in flight (their deliveries are released at once),
//! drains running handlers, and flushes every pending ack before it returns.
//!
//! It does not rebalance partitions between consumers: every consumer claims
//! from every shard, and so from every partition.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_lite::FutureExt;
use spool_wire::proto::limits::{
    ACK_TOKENS_MAX, CLAIM_BYTES_MAX, CLAIM_CREDITS_MAX, CLAIM_WAIT_MS_MAX, LEASE_MS_MAX,
};
use spool_wire::proto::{DeliveryToken, Offset, PartitionId, WorkerId};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::client::{ClaimBatch, ClaimOptions, Client};
use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::limits::{
    ACK_LINGER_DEFAULT, ACK_REQUESTS_IN_FLIGHT_MAX, CLAIMS_IN_FLIGHT_DEFAULT, CLAIMS_IN_FLIGHT_MAX,
    CLAIM_BYTES_DEFAULT, CLAIM_ERROR_BACKOFF, CLAIM_WAIT_MS_DEFAULT, CONSUMER_ACKS_PENDING_DEFAULT,
    CONSUMER_ACKS_PENDING_MAX, CONSUMER_PREFETCH_MAX, CONSUMER_SLOTS_MAX, LEASE_MS_DEFAULT,
};

/// Release reason for a delivery that arrives after shutdown began.
pub const SHUTDOWN_REASON: &str = "consumer shutting down";

/// Release reason for a handler that panicked.
pub const PANIC_REASON: &str = "handler panicked";

/// Called once per answered Ack request with its round trip (request sent
/// → broker's answer) and the number of tokens it carried; for latency
/// figures of the ack path (benchmarks, a user's own metrics). It runs on
/// the consumer's ack task: keep it short.
pub type AckObserver = Arc<dyn Fn(Duration, usize) + Send + Sync>;

/// Called once per answered Claim request with its round trip (request
/// sent → broker's answer), the credits it asked for and the deliveries it
/// brought; for figures of the claim path (benchmarks, a user's own
/// metrics). It runs on the claim's task: keep it short.
pub type ClaimObserver = Arc<dyn Fn(Duration, u32, usize) + Send + Sync>;

/// Settings of a [`Consumer`].
#[derive(Clone)]
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
    /// Claims outstanding at once, `1..=CLAIMS_IN_FLIGHT_MAX`.
    pub claims_in_flight: u32,
    /// Most tokens in one Ack request, `1..=ACK_TOKENS_MAX`.
    pub ack_batch_max: u32,
    /// How long a completed delivery may wait for company before its Ack is
    /// sent (zero: send with whatever else already completed).
    pub ack_linger: Duration,
    /// Deliveries claimed ahead of a free slot, `0..=CONSUMER_PREFETCH_MAX`.
    pub prefetch: u32,
    /// Completed deliveries whose Ack is not answered yet, at most
    /// `1..=CONSUMER_ACKS_PENDING_MAX`; a handler finishing past it keeps its
    /// slot until an Ack answer makes room.
    pub acks_pending_max: u32,
    /// Sees every answered Ack request ([`AckObserver`]); none by default.
    pub ack_observer: Option<AckObserver>,
    /// Sees every answered Claim request ([`ClaimObserver`]); none by default.
    pub claim_observer: Option<ClaimObserver>,
}

impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("queue", &self.queue)
            .field("slots", &self.slots)
            .field("lease_ms", &self.lease_ms)
            .field("wait_ms", &self.wait_ms)
            .field("max_bytes", &self.max_bytes)
            .field("worker", &self.worker)
            .field("extend_interval", &self.extend_interval)
            .field("release_delay_ms", &self.release_delay_ms)
            .field("claims_in_flight", &self.claims_in_flight)
            .field("ack_batch_max", &self.ack_batch_max)
            .field("ack_linger", &self.ack_linger)
            .field("prefetch", &self.prefetch)
            .field("acks_pending_max", &self.acks_pending_max)
            .field("ack_observer", &self.ack_observer.as_ref().map(|_| "set"))
            .field("claim_observer", &self.claim_observer.as_ref().map(|_| "set"))
            .finish()
    }
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
            claims_in_flight: CLAIMS_IN_FLIGHT_DEFAULT,
            ack_batch_max: ACK_TOKENS_MAX,
            ack_linger: ACK_LINGER_DEFAULT,
            prefetch: 0,
            acks_pending_max: CONSUMER_ACKS_PENDING_DEFAULT,
            ack_observer: None,
            claim_observer: None,
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
            (1..=CLAIMS_IN_FLIGHT_MAX).contains(&self.claims_in_flight),
            format!(
                "claims_in_flight {} outside 1..={CLAIMS_IN_FLIGHT_MAX}",
                self.claims_in_flight
            ),
        )?;
        check(
            (1..=ACK_TOKENS_MAX).contains(&self.ack_batch_max),
            format!("ack_batch_max {} outside 1..={ACK_TOKENS_MAX}", self.ack_batch_max),
        )?;
        check(
            self.prefetch <= CONSUMER_PREFETCH_MAX,
            format!("prefetch {} above {CONSUMER_PREFETCH_MAX}", self.prefetch),
        )?;
        check(
            (1..=CONSUMER_ACKS_PENDING_MAX).contains(&self.acks_pending_max),
            format!(
                "acks_pending_max {} outside 1..={CONSUMER_ACKS_PENDING_MAX}",
                self.acks_pending_max
            ),
        )?;
        check(
            self.extend_interval.is_none_or(|interval| !interval.is_zero()),
            "extend_interval must be positive".to_owned(),
        )
    }

    /// Deliveries held at once: running or waiting for a slot.
    fn window(&self) -> u32 {
        self.slots + self.prefetch
    }

    /// Free room a claim waits for while another claim is outstanding.
    fn claim_share(&self) -> u32 {
        (self.window() / self.claims_in_flight).max(1)
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
    /// Most deliveries held at once (running or waiting for a slot); never
    /// above `slots + prefetch`.
    pub outstanding_max: u64,
    /// Most handlers running at once; never above the slots.
    pub running_max: u64,
    /// Claim requests sent.
    pub claim_requests: u64,
    /// Ack requests sent (each carries one or more tokens).
    pub ack_requests: u64,
}

impl ConsumerStats {
    /// The totals of two consumers: counts add, maxima take the larger.
    #[must_use]
    pub fn merged(self, other: Self) -> Self {
        Self {
            claimed: self.claimed + other.claimed,
            acked: self.acked + other.acked,
            released: self.released + other.released,
            extended: self.extended + other.extended,
            extend_failed: self.extend_failed + other.extend_failed,
            settle_failed: self.settle_failed + other.settle_failed,
            claim_failed: self.claim_failed + other.claim_failed,
            outstanding_max: self.outstanding_max.max(other.outstanding_max),
            running_max: self.running_max.max(other.running_max),
            claim_requests: self.claim_requests + other.claim_requests,
            ack_requests: self.ack_requests + other.ack_requests,
        }
    }
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
    running: AtomicU64,
    running_max: AtomicU64,
    claim_requests: AtomicU64,
    ack_requests: AtomicU64,
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
            running_max: load(&self.running_max),
            claim_requests: load(&self.claim_requests),
            ack_requests: load(&self.ack_requests),
        }
    }
}

struct Shared {
    client: Client,
    config: ConsumerConfig,
    /// Room for deliveries (`slots + prefetch`): what claims ask for.
    credits: Arc<Semaphore>,
    /// Execution slots: a handler runs only with one.
    slots: Arc<Semaphore>,
    /// Room in the ack pipeline (`acks_pending_max`).
    acks_pending: Arc<Semaphore>,
    counters: Counters,
}

/// Frees one credit when a delivery is no longer held (its handler's
/// outcome was handed on, or its task ended otherwise).
struct CreditGuard {
    shared: Arc<Shared>,
}

impl Drop for CreditGuard {
    fn drop(&mut self) {
        self.shared.counters.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.shared.credits.add_permits(1);
    }
}

/// One running handler's execution slot.
struct SlotGuard {
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
}

impl SlotGuard {
    fn new(shared: &Arc<Shared>, permit: OwnedSemaphorePermit) -> Self {
        let counters = &shared.counters;
        let running = counters.running.fetch_add(1, Ordering::AcqRel) + 1;
        counters.running_max.fetch_max(running, Ordering::AcqRel);
        assert!(running <= u64::from(shared.config.slots));
        Self { shared: Arc::clone(shared), _permit: permit }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.counters.running.fetch_sub(1, Ordering::AcqRel);
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
            credits: Arc::new(Semaphore::new(config.window() as usize)),
            slots: Arc::new(Semaphore::new(config.slots as usize)),
            acks_pending: Arc::new(Semaphore::new(config.acks_pending_max as usize)),
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

    /// Acks of finished handlers waiting in the ack pipeline (for their
    /// batch, or for the broker's answer); at most `acks_pending_max`.
    pub fn acks_pending(&self) -> usize {
        let room = self.shared.config.acks_pending_max as usize;
        room - self.shared.acks_pending.available_permits()
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

/// What a finished claim task reports back to the loop.
struct ClaimOutcome {
    /// The claim target it went to (`None`: no target was known).
    target: Option<PartitionId>,
    /// Credits the claim asked for (taken from the free room).
    credits: u32,
    result: Result<ClaimBatch, ClientError>,
}

/// One claim of any partition of the shard leading `partition` (one of the
/// queue's claim targets), with `credits` slots already taken.
/// A failed claim pauses [`CLAIM_ERROR_BACKOFF`] (less if shutdown begins)
/// before it reports, so a broker that is down sees at most
/// `claims_in_flight` attempts per backoff.
async fn claim_once(
    shared: Arc<Shared>,
    partition: Option<PartitionId>,
    options: ClaimOptions,
    mut stopped: watch::Receiver<bool>,
) -> ClaimOutcome {
    let config = &shared.config;
    let credits = options.credits;
    let result = match partition {
        Some(partition) => {
            shared.counters.claim_requests.fetch_add(1, Ordering::Relaxed);
            let sent = tokio::time::Instant::now();
            let result = shared.client.claim_shard(&config.queue, partition, &options).await;
            if let (Some(observer), Ok(batch)) = (&config.claim_observer, &result) {
                observer(sent.elapsed(), credits, batch.deliveries.len());
            }
            if let Err(error) = &result {
                tracing::warn!(queue = %config.queue, partition = partition.0, %error, "claim failed");
            }
            result
        }
        None => Err(ClientError::UnknownQueue(config.queue.clone())),
    };
    if result.is_err() {
        // The credits are free while this claim waits out its backoff.
        shared.credits.add_permits(credits as usize);
        shared.counters.claim_failed.fetch_add(1, Ordering::Relaxed);
        pause(&mut stopped).await;
        return ClaimOutcome { target: partition, credits: 0, result };
    }
    ClaimOutcome { target: partition, credits, result }
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
    // Every item holds an `acks_pending` permit, so a send never waits.
    let (acks, ack_queue) = mpsc::channel(config.acks_pending_max as usize);
    let acker = tokio::spawn(ack_loop(Arc::clone(&shared), ack_queue));
    let mut tasks = JoinSet::new();
    let mut claims: JoinSet<ClaimOutcome> = JoinSet::new();
    let mut next_target = 0usize;
    // Claims in a row that came back empty: a full sweep of the shards
    // turns on the long-poll.
    let mut empty_claims = 0usize;
    // Where claims go (module doc, "caught-up shards"): the last targets
    // known, and which of them are caught up and how many claims each has.
    let mut targets: Arc<[PartitionId]> = Arc::from(Vec::new());
    let mut spread = ClaimSpread::default();
    let share = config.claim_share();
    let credits_max = config.window().min(CLAIM_CREDITS_MAX);
    loop {
        if *stopped.borrow() {
            break;
        }
        // The first claim goes out for one free credit; while others are
        // out, wait for a share, so credits coming back one by one are
        // batched. None goes out while every known shard is caught up and
        // has its claim: one of those answers first.
        let wanted = match claims.len() {
            _ if !claims.is_empty() && !spread.any_open(&targets) => 0,
            0 => 1,
            outstanding if outstanding < config.claims_in_flight as usize => share,
            _ => 0,
        };
        tokio::select! {
            // Answered claims first: their deliveries run rather than being
            // released because shutdown began in the same instant.
            biased;
            Some(joined) = claims.join_next(), if !claims.is_empty() => {
                let Ok(outcome) = joined else {
                    // A claim task cannot panic short of a bug in this crate;
                    // its slots are lost, which only lowers concurrency.
                    tracing::error!(queue = %config.queue, "claim task failed");
                    continue;
                };
                spread.answered(outcome.target);
                let Ok(batch) = outcome.result else { continue };
                let received = batch.deliveries.len();
                if let Some(target) = outcome.target {
                    spread.set_caught_up(target, received < outcome.credits as usize);
                }
                shared.credits.add_permits(outcome.credits as usize - received);
                empty_claims = if received == 0 { empty_claims + 1 } else { 0 };
                let stopping = *stopped.borrow();
                spawn_deliveries(&shared, &handler, &acks, &mut tasks, batch, stopping, &stopped);
            }
            credit = Arc::clone(&shared.credits).acquire_many_owned(wanted), if wanted > 0 => {
                let Ok(credit) = credit else { break };
                credit.forget();
                targets = match shared.client.claim_targets(&config.queue).await {
                    Ok(known) => {
                        if !Arc::ptr_eq(&known, &targets) {
                            spread.keep_only(&known);
                        }
                        known
                    }
                    Err(error) => {
                        tracing::warn!(queue = %config.queue, %error, "no metadata for the consumer's queue");
                        Arc::from(Vec::new())
                    }
                };
                // Each claim asks for at most a share, so the credits are
                // spread over `claims_in_flight` claims (and partitions).
                let limit = share.min(credits_max).max(wanted);
                let mut credits = wanted;
                while credits < limit {
                    match shared.credits.try_acquire() {
                        Ok(credit) => {
                            credit.forget();
                            credits += 1;
                        }
                        Err(_) => break,
                    }
                }
                // The next shard in turn that is open: not caught up, or
                // caught up without a claim.
                let pick = (0..targets.len())
                    .map(|step| next_target.wrapping_add(step))
                    .find(|at| spread.open(targets[at % targets.len()]))
                    .unwrap_or(next_target);
                let partition = (!targets.is_empty()).then(|| targets[pick % targets.len()]);
                next_target = pick.wrapping_add(1);
                // A caught-up shard's claim waits there for messages; so
                // does any claim after a full sweep of empty answers.
                let long_poll = !targets.is_empty()
                    && (empty_claims >= targets.len()
                        || partition.is_some_and(|target| spread.is_caught_up(target)));
                spread.sent(partition);
                let options = ClaimOptions {
                    worker: config.worker,
                    credits,
                    max_bytes: config.max_bytes,
                    lease_ms: config.lease_ms,
                    wait_ms: if long_poll { config.wait_ms } else { 0 },
                };
                claims.spawn(claim_once(Arc::clone(&shared), partition, options, stopped.clone()));
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = stopped.changed() => break,
        }
    }
    // A claim in flight is never abandoned: its deliveries would sit leased
    // to nobody until their leases expired. They are released at once.
    while let Some(joined) = claims.join_next().await {
        let Ok(outcome) = joined else { continue };
        let Ok(batch) = outcome.result else { continue };
        shared.credits.add_permits(outcome.credits as usize - batch.deliveries.len());
        spawn_deliveries(&shared, &handler, &acks, &mut tasks, batch, true, &stopped);
    }
    while tasks.join_next().await.is_some() {}
    // Every delivery task has ended, so this was the last sender: the acker
    // flushes what is pending and returns once every Ack has an answer.
    drop(acks);
    if let Err(error) = acker.await {
        tracing::error!(%error, "consumer acker failed");
    }
}

/// Where a consumer's claims go: which claim targets (shards) are caught
/// up, their last claim having come back with fewer deliveries than it had
/// credits (they were drained to what is durable there), and how many
/// claims each target has outstanding. A caught-up target gets one claim
/// at a time, and that claim long-polls; the rest of the claims go to the
/// targets that still fill them (module doc). At most one entry per claim
/// target, and the targets are the queue's shards.
#[derive(Debug, Default)]
struct ClaimSpread {
    /// (target, caught up, claims outstanding).
    targets: Vec<(PartitionId, bool, usize)>,
}

impl ClaimSpread {
    fn entry(&mut self, target: PartitionId) -> &mut (PartitionId, bool, usize) {
        let at = match self.targets.iter().position(|(known, _, _)| *known == target) {
            Some(at) => at,
            None => {
                self.targets.push((target, false, 0));
                self.targets.len() - 1
            }
        };
        &mut self.targets[at]
    }

    fn is_caught_up(&self, target: PartitionId) -> bool {
        self.targets.iter().any(|(known, caught_up, _)| *known == target && *caught_up)
    }

    /// Whether `target` may get a claim now: not caught up, or caught up
    /// with no claim outstanding.
    fn open(&self, target: PartitionId) -> bool {
        self.targets
            .iter()
            .find(|(known, _, _)| *known == target)
            .is_none_or(|(_, caught_up, outstanding)| !*caught_up || *outstanding == 0)
    }

    /// Whether any of `targets` may get a claim now (true when none is
    /// known yet: the claim fetches them).
    fn any_open(&self, targets: &[PartitionId]) -> bool {
        targets.is_empty() || targets.iter().any(|target| self.open(*target))
    }

    fn sent(&mut self, target: Option<PartitionId>) {
        if let Some(target) = target {
            self.entry(target).2 += 1;
        }
    }

    fn answered(&mut self, target: Option<PartitionId>) {
        if let Some(target) = target {
            let entry = self.entry(target);
            entry.2 = entry.2.saturating_sub(1);
        }
    }

    fn set_caught_up(&mut self, target: PartitionId, caught_up: bool) {
        self.entry(target).1 = caught_up;
    }

    /// The targets changed (metadata refreshed): forgets the ones gone that
    /// have no claim outstanding.
    fn keep_only(&mut self, targets: &[PartitionId]) {
        self.targets.retain(|(known, _, outstanding)| *outstanding > 0 || targets.contains(known));
    }
}

/// Starts one task per delivery of `batch`: the handler, or (when
/// `stopping`) an immediate release.
fn spawn_deliveries<H, F, E>(
    shared: &Arc<Shared>,
    handler: &Arc<H>,
    acks: &mpsc::Sender<AckItem>,
    tasks: &mut JoinSet<()>,
    batch: ClaimBatch,
    stopping: bool,
    stopped: &watch::Receiver<bool>,
) where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let received = batch.deliveries.len() as u64;
    let counters = &shared.counters;
    counters.claimed.fetch_add(received, Ordering::Relaxed);
    let outstanding = counters.outstanding.fetch_add(received, Ordering::AcqRel) + received;
    counters.outstanding_max.fetch_max(outstanding, Ordering::AcqRel);
    assert!(outstanding <= u64::from(shared.config.window()));
    for delivery in batch.deliveries {
        let held = CreditGuard { shared: Arc::clone(shared) };
        if stopping {
            let target = SettleTarget::of(&delivery);
            tasks.spawn(release(held, None, target, SHUTDOWN_REASON.to_owned()));
        } else {
            let (handler, acks, stopped) = (Arc::clone(handler), acks.clone(), stopped.clone());
            tasks.spawn(run_delivery(held, handler, delivery, acks, stopped));
        }
    }
}

/// Waits [`CLAIM_ERROR_BACKOFF`], or less if shutdown begins.
async fn pause(stopped: &mut watch::Receiver<bool>) {
    if *stopped.borrow() {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(CLAIM_ERROR_BACKOFF) => {}
        _ = stopped.changed() => {}
    }
}

async fn run_delivery<H, F, E>(
    held: CreditGuard,
    handler: Arc<H>,
    delivery: Delivery,
    acks: mpsc::Sender<AckItem>,
    mut stopped: watch::Receiver<bool>,
) where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let shared = Arc::clone(&held.shared);
    let target = SettleTarget::of(&delivery);
    let mut lease = LeaseKeeper::new(&shared, &target);
    // A prefetched delivery waits for a slot with its lease kept alive; if
    // shutdown begins first it is released unstarted.
    let slot = match Arc::clone(&shared.slots).try_acquire_owned() {
        Ok(permit) => Some(permit),
        Err(_) => {
            lease
                .keep_while(async {
                    tokio::select! {
                        permit = Arc::clone(&shared.slots).acquire_owned() => permit.ok(),
                        _ = stopped.wait_for(|stopping| *stopping) => None,
                    }
                })
                .await
        }
    };
    let Some(permit) = slot else {
        release(held, None, target, SHUTDOWN_REASON.to_owned()).await;
        return;
    };
    let slot = SlotGuard::new(&shared, permit);
    // The handler is polled in this task beside the lease keeper (no task
    // of its own per delivery); a panic is caught here and becomes a
    // release, never the end of this task.
    let work = AssertUnwindSafe(handler(delivery)).catch_unwind();
    let outcome = match lease.keep_while(work).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(PANIC_REASON.to_owned()),
    };
    match outcome {
        Ok(()) => {
            // Room in the ack pipeline first (the slot stays busy while it
            // is full), then the slot and the credit free at once.
            let Ok(pending) = Arc::clone(&shared.acks_pending).acquire_owned().await else {
                unreachable!("the acks-pending semaphore is never closed");
            };
            // The acker outlives every delivery task (the claim loop drops
            // the last sender only after they all ended), so this cannot
            // fail; if it did, the delivery would stay unacked.
            if acks.send(AckItem { target, _pending: pending }).await.is_err() {
                shared.counters.settle_failed.fetch_add(1, Ordering::Relaxed);
            }
            drop(slot);
            drop(held);
        }
        Err(reason) => release(held, Some(slot), target, reason).await,
    }
}

/// Extends one delivery's lease every `extend_interval` while it waits for a
/// slot and while its handler runs.
struct LeaseKeeper<'a> {
    shared: &'a Shared,
    target: &'a SettleTarget,
    /// Cleared once an extension failed for good (lost lease, lifetime cap).
    extending: bool,
    /// When the next extension is due; kept across the wait for a slot and
    /// the handler, so the interval counts from the claim.
    next: tokio::time::Instant,
}

impl<'a> LeaseKeeper<'a> {
    fn new(shared: &'a Shared, target: &'a SettleTarget) -> Self {
        let next = tokio::time::Instant::now() + shared.config.extend_every();
        Self { shared, target, extending: true, next }
    }

    /// Drives `work` to completion, extending the lease meanwhile. The work
    /// is polled first, so work that is done at once never arms a timer.
    async fn keep_while<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                biased;
                output = &mut work => return output,
                () = tokio::time::sleep_until(self.next), if self.extending => {
                    self.extend_once().await;
                    self.next = tokio::time::Instant::now() + self.shared.config.extend_every();
                }
            }
        }
    }

    async fn extend_once(&mut self) {
        let (shared, target) = (self.shared, self.target);
        let counters = &shared.counters;
        let lease_ms = shared.config.lease_ms;
        match shared.client.extend(&target.queue, target.partition, target.token, lease_ms).await {
            Ok(_) => {
                counters.extended.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.extend_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(queue = %target.queue, offset = target.offset.0, %error, "extend failed");
                // A lost lease or a lifetime cap will not come back; a
                // transient failure is tried again next interval.
                self.extending = error.is_retriable();
            }
        }
    }
}

/// What settling a delivery needs, so the handler can own the delivery.
struct SettleTarget {
    queue: Arc<str>,
    partition: PartitionId,
    offset: Offset,
    token: DeliveryToken,
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

/// A delivery whose handler succeeded, waiting for its Ack.
struct AckItem {
    target: SettleTarget,
    /// Dropped with the item once the Ack is answered: room in the pipeline.
    _pending: OwnedSemaphorePermit,
}

/// Releases a delivery with `reason`; its credit (and slot, if it ran) free
/// once the broker answered.
async fn release(
    held: CreditGuard,
    slot: Option<SlotGuard>,
    delivery: SettleTarget,
    reason: String,
) {
    let shared = Arc::clone(&held.shared);
    let counters = &shared.counters;
    let (queue, partition, token) = (&*delivery.queue, delivery.partition, delivery.token);
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
    drop(slot);
    drop(held);
}

/// Collects completed deliveries and acks them in batches (module doc).
/// Returns when the queue closed and every Ack request has an answer.
async fn ack_loop(shared: Arc<Shared>, mut queue: mpsc::Receiver<AckItem>) {
    let config = &shared.config;
    let batch_max = config.ack_batch_max as usize;
    let requests_in_flight = Arc::new(Semaphore::new(ACK_REQUESTS_IN_FLIGHT_MAX));
    let mut requests = JoinSet::new();
    let mut pending: Vec<AckItem> = Vec::with_capacity(batch_max);
    // Armed when the first item of a batch arrives.
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            item = queue.recv() => {
                let Some(item) = item else { break };
                pending.push(item);
                // Take whatever else is already waiting without a wake-up each.
                while pending.len() < batch_max {
                    match queue.try_recv() {
                        Ok(item) => pending.push(item),
                        Err(_) => break,
                    }
                }
                if pending.len() >= batch_max || config.ack_linger.is_zero() {
                    linger = None;
                    flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
                } else if linger.is_none() {
                    linger = Some(Box::pin(tokio::time::sleep(config.ack_linger)));
                }
            }
            () = async { if let Some(timer) = linger.as_mut() { timer.await } }, if linger.is_some() => {
                linger = None;
                flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
        }
    }
    flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
    while requests.join_next().await.is_some() {}
}

/// Sends `pending` as Ack requests: one per shard (the broker acks the
/// tokens of each partition of a request together), each at most
/// `ack_batch_max` tokens, each waiting for a request slot first.
async fn flush_acks(
    shared: &Arc<Shared>,
    pending: &mut Vec<AckItem>,
    requests_in_flight: &Arc<Semaphore>,
    requests: &mut JoinSet<()>,
) {
    let batch_max = shared.config.ack_batch_max as usize;
    let mut items = std::mem::take(pending);
    while !items.is_empty() {
        // Split off the first item's shard (order within it kept); a
        // partition whose shard the cache does not know goes alone.
        let (queue, partition) = (Arc::clone(&items[0].target.queue), items[0].target.partition);
        let shard = shared.client.cached_owner(&queue, partition);
        let (mut group, rest): (Vec<AckItem>, Vec<AckItem>) = items.into_iter().partition(|item| {
            item.target.queue == queue
                && (item.target.partition == partition
                    || shard.is_some()
                        && shared.client.cached_owner(&queue, item.target.partition) == shard)
        });
        items = rest;
        while !group.is_empty() {
            let tail = group.split_off(group.len().min(batch_max));
            let chunk = std::mem::replace(&mut group, tail);
            // Never closed, so this only waits.
            let Ok(permit) = Arc::clone(requests_in_flight).acquire_owned().await else {
                unreachable!("the ack request semaphore is never closed");
            };
            requests.spawn(ack_request(Arc::clone(shared), chunk, permit));
        }
    }
}

/// One Ack request for `items` (all of one shard), sent to the shard of the
/// first; frees their room in the pipeline when the broker answered.
async fn ack_request(shared: Arc<Shared>, items: Vec<AckItem>, _permit: OwnedSemaphorePermit) {
    let counters = &shared.counters;
    let Some(first) = items.first() else { return };
    let (queue, partition) = (Arc::clone(&first.target.queue), first.target.partition);
    let tokens: Vec<DeliveryToken> = items.iter().map(|item| item.target.token).collect();
    counters.ack_requests.fetch_add(1, Ordering::Relaxed);
    let sent = tokio::time::Instant::now();
    let answer = shared.client.ack(&queue, partition, &tokens).await;
    if let Some(observer) = &shared.config.ack_observer {
        observer(sent.elapsed(), tokens.len());
    }
    match answer {
        Ok(()) => {
            counters.acked.fetch_add(items.len() as u64, Ordering::Relaxed);
        }
        Err(ClientError::AckRefused { refused, tokens }) => {
            counters.acked.fetch_add((tokens - refused.len()) as u64, Ordering::Relaxed);
            for refused in &refused {
                let offset = items.get(refused.index).map_or(0, |item| item.target.offset.0);
                tracing::warn!(%queue, offset, code = %refused.code, "ack refused");
            }
            counters.settle_failed.fetch_add(refused.len() as u64, Ordering::Relaxed);
        }
        Err(error) => {
            tracing::warn!(%queue, partition = partition.0, count = items.len(), %error, "ack failed");
            counters.settle_failed.fetch_add(items.len() as u64, Ordering::Relaxed);
        }
    }
    // Dropping the items drops their permits: room in the pipeline.
    drop(items);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_up_target_gets_one_claim_at_a_time() {
        // Goal: a target is open while it is not caught up whatever its claims,
        // and once caught up only while it has no claim outstanding; a full answer
        // opens it again; the spread forgets targets gone that have no claim.
        // Method: the bookkeeping alone, driven as the claim loop drives it.
        let (a, b) = (PartitionId(0), PartitionId(5));
        let mut spread = ClaimSpread::default();
        assert!(spread.open(a) && spread.any_open(&[a, b]) && spread.any_open(&[]));
        spread.sent(Some(a));
        spread.sent(Some(a));
        assert!(spread.open(a), "a busy target takes any number of claims");
        spread.answered(Some(a));
        spread.set_caught_up(a, true);
        assert!(spread.is_caught_up(a) && !spread.open(a), "one claim still out");
        spread.answered(Some(a));
        assert!(spread.open(a), "caught up, no claim out");
        spread.sent(Some(a));
        spread.sent(Some(b));
        spread.answered(Some(b));
        spread.set_caught_up(b, true);
        spread.sent(Some(b));
        assert!(!spread.any_open(&[a, b]), "both caught up, each with its claim");
        spread.answered(Some(a));
        spread.set_caught_up(a, false);
        assert!(spread.open(a) && !spread.is_caught_up(a), "a full answer opens it again");
        spread.keep_only(&[a]);
        assert!(!spread.open(b), "b keeps its entry while its claim is out");
        spread.answered(Some(b));
        spread.keep_only(&[a]);
        assert!(spread.open(b) && !spread.is_caught_up(b), "b forgotten");
        assert_eq!(spread.targets.len(), 1);
    }
}
