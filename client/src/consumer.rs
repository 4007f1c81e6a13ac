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
//! `ACK_TOKENS_MAX` tokens). At most
//! [`ACK_REQUESTS_IN_FLIGHT_MAX`](crate::limits::ACK_REQUESTS_IN_FLIGHT_MAX) Ack
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
//!
//! Where each part lives: this file holds the [`Consumer`] handle, the state
//! its tasks share, the credit and slot guards, and one delivery's task
//! (wait for a slot, run the handler, hand on the outcome, release on
//! error); `config` the settings and their checks, `stats` the counters,
//! `claims` the claim loop and where its claims go, `lease` the lease
//! extensions, `acks` the ack batching, `session` the consumer's session on
//! each shard connection (`docs/design/sessions.md`: opened before the
//! first claim there and after a reconnect, heartbeating every third of
//! its timeout; `ConsumerConfig::without_session` turns it off).

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_lite::FutureExt;
use spool_wire::proto::{DeliveryToken, Offset, PartitionId};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::delivery::Delivery;
use crate::error::ClientError;

mod acks;
mod claims;
mod config;
mod lease;
mod session;
mod stats;

use acks::AckItem;
use lease::LeaseKeeper;
use stats::Counters;

pub use config::{AckObserver, ClaimObserver, ConsumerConfig};
pub use stats::ConsumerStats;

/// Release reason for a delivery that arrives after shutdown began.
pub const SHUTDOWN_REASON: &str = "consumer shutting down";

/// Release reason for a handler that panicked.
pub const PANIC_REASON: &str = "handler panicked";

struct Shared {
    client: Client,
    config: ConsumerConfig,
    /// `config.subscription`, shared by every claim's options.
    subscription: Option<Arc<str>>,
    /// Room for deliveries (`slots + prefetch`): what claims ask for.
    credits: Arc<Semaphore>,
    /// Execution slots: a handler runs only with one.
    slots: Arc<Semaphore>,
    /// Room in the ack pipeline (`acks_pending_max`).
    acks_pending: Arc<Semaphore>,
    counters: Counters,
    /// The consumer's session on each shard connection (`session.rs`).
    sessions: session::SessionKeeper,
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
    /// Starts claiming from `config.queue` (for `config.subscription`, or
    /// the queue's default subscription) and running `handler` per
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
            subscription: config.subscription.as_deref().map(Arc::from),
            credits: Arc::new(Semaphore::new(config.window() as usize)),
            slots: Arc::new(Semaphore::new(config.slots as usize)),
            acks_pending: Arc::new(Semaphore::new(config.acks_pending_max as usize)),
            config,
            counters: Counters::default(),
            sessions: session::SessionKeeper::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let task =
            tokio::spawn(claims::claim_loop(Arc::clone(&shared), Arc::new(handler), stopped));
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
