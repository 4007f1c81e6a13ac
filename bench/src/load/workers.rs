//! The simulated workers: `spool_client::Consumer`s whose handlers "work"
//! for a drawn service time, grown and shrunk to each phase's slots.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spool_broker::clock::instant_now;
use spool_client::limits::CONSUMER_SLOTS_MAX;
use spool_client::{Client, Consumer, ConsumerConfig, ConsumerStats, Delivery};

use super::config::{LoadConfig, CONSUMER_CONNECTIONS_MAX};
use super::recorder::Recorder;
use super::LoadError;
use crate::dist::ServiceTime;

/// Consumers' long-poll wait: short, so a consumer being retired or a run
/// ending does not wait long for an idle claim.
const CLAIM_WAIT_MS: u32 = 100;
/// The long-poll wait when a run has more consumers than
/// [`CONSUMER_CONNECTIONS_MAX`]: thousands of idle consumers re-claiming
/// every 100 ms would be the broker's main load.
const CLAIM_WAIT_MANY_MS: u32 = 1_000;

/// The simulated workers of every queue (and each of its subscriptions):
/// consumers with slots, grown and shrunk at phase boundaries.
pub(super) struct Workers {
    addr: String,
    /// What the consumers claim from: each queue with each subscription
    /// (`None`: the default).
    targets: Vec<(String, Option<String>)>,
    consumers_per_queue: u32,
    lease_ms: u32,
    prefetch_fraction: f64,
    claims_in_flight: u32,
    ack_linger_us: u64,
    service: ServiceTime,
    recorder: Arc<Recorder>,
    /// Long-poll wait of every claim.
    claim_wait_ms: u32,
    /// Connections opened so far; the consumer started `n`-th uses
    /// connection `n mod CONSUMER_CONNECTIONS_MAX`.
    clients: Vec<Client>,
    started: usize,
    /// Per target: running consumers and their slots, oldest first.
    running: Vec<Vec<(Consumer, u32)>>,
    /// Stats of consumers already shut down.
    retired: Arc<Mutex<ConsumerStats>>,
    retiring: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    /// No consumers yet, for `queues` of a run of `config` at `addr`.
    pub(super) fn new(
        config: &LoadConfig,
        addr: &str,
        queues: &[String],
        recorder: Arc<Recorder>,
    ) -> Self {
        let targets: Vec<(String, Option<String>)> = queues
            .iter()
            .flat_map(|queue| {
                (0..config.subscriptions.max(1))
                    .map(move |index| (queue.clone(), super::driver::subscription_name(index)))
            })
            .collect();
        Self {
            addr: addr.to_owned(),
            running: targets.iter().map(|_| Vec::new()).collect(),
            targets,
            consumers_per_queue: config.consumers_per_queue,
            lease_ms: config.lease_ms,
            prefetch_fraction: config.prefetch_fraction,
            claims_in_flight: config.claims_in_flight,
            ack_linger_us: config.ack_linger_us,
            service: config.service,
            recorder,
            claim_wait_ms: if config.consumers() > CONSUMER_CONNECTIONS_MAX {
                CLAIM_WAIT_MANY_MS
            } else {
                CLAIM_WAIT_MS
            },
            clients: Vec::new(),
            started: 0,
            retired: Arc::new(Mutex::new(ConsumerStats::default())),
            retiring: Vec::new(),
        }
    }

    pub(super) fn stats(&self) -> ConsumerStats {
        let retired = *self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        self.running
            .iter()
            .flatten()
            .map(|(consumer, _)| consumer.stats())
            .fold(retired, ConsumerStats::merged)
    }

    /// Spreads `total` slots over the queues' subscriptions (the first get
    /// one more when it does not divide) and makes each one's consumers
    /// hold that many.
    pub(super) async fn set_slots(&mut self, total: u32) -> Result<(), LoadError> {
        let targets = u32::try_from(self.targets.len()).unwrap_or(u32::MAX);
        for index in 0..self.targets.len() {
            let position = u32::try_from(index).unwrap_or(u32::MAX);
            let target = total / targets + u32::from(position < total % targets);
            self.set_queue_slots(index, target).await?;
        }
        Ok(())
    }

    async fn set_queue_slots(&mut self, index: usize, target: u32) -> Result<(), LoadError> {
        let held =
            |running: &Vec<(Consumer, u32)>| running.iter().map(|(_, slots)| *slots).sum::<u32>();
        // Shrink: retire the newest consumers until at most `target` remain;
        // they stop claiming now and finish what they hold in the background.
        while held(&self.running[index]) > target {
            let Some((consumer, _)) = self.running[index].pop() else { break };
            let retired = Arc::clone(&self.retired);
            self.retiring.push(tokio::spawn(async move {
                let stats = consumer.shutdown().await;
                let mut total = retired.lock().unwrap_or_else(PoisonError::into_inner);
                *total = total.merged(stats);
            }));
        }
        // Grow: the missing slots, over `consumers_per_queue` new consumers
        // (or fewer, when there are fewer slots than that).
        let missing: u32 = target - held(&self.running[index]);
        if missing == 0 {
            return Ok(());
        }
        let count = self.consumers_per_queue.min(missing).max(missing.div_ceil(CONSUMER_SLOTS_MAX));
        for position in 0..count {
            let slots = missing / count + u32::from(position < missing % count);
            let (queue, subscription) = self.targets[index].clone();
            let consumer = self.start(&queue, subscription, slots).await?;
            self.running[index].push((consumer, slots));
        }
        Ok(())
    }

    /// The next consumer's connection: a new one up to
    /// [`CONSUMER_CONNECTIONS_MAX`], then the opened ones in turn.
    async fn client(&mut self) -> Result<Client, LoadError> {
        let index = self.started % CONSUMER_CONNECTIONS_MAX as usize;
        self.started += 1;
        if let Some(client) = self.clients.get(index) {
            return Ok(client.clone());
        }
        let client = Client::connect(&self.addr).await?;
        self.clients.push(client.clone());
        Ok(client)
    }

    async fn start(
        &mut self,
        queue: &str,
        subscription: Option<String>,
        slots: u32,
    ) -> Result<Consumer, LoadError> {
        let client = self.client().await?;
        let mut consumer_config = ConsumerConfig::new(queue.to_owned(), slots);
        consumer_config.subscription = subscription;
        consumer_config.wait_ms = self.claim_wait_ms;
        consumer_config.lease_ms = self.lease_ms;
        consumer_config.claims_in_flight = self.claims_in_flight;
        consumer_config.ack_linger = Duration::from_micros(self.ack_linger_us);
        // Validated to [0, 1] × slots ≤ CONSUMER_SLOTS_MAX.
        consumer_config.prefetch = (f64::from(slots) * self.prefetch_fraction).ceil() as u32;
        let recorder = Arc::clone(&self.recorder);
        let service = self.service;
        let consumer = Consumer::start(client, consumer_config, move |delivery: Delivery| {
            recorder.delivered(&delivery);
            let service_ns = recorder.service_ns(&service);
            let recorder = Arc::clone(&recorder);
            async move {
                if service_ns > 0 {
                    recorder.busy.fetch_add(1, Ordering::AcqRel);
                    let start = instant_now();
                    let asked_ns = recorder.sleep_for_ns(service_ns);
                    tokio::time::sleep(Duration::from_nanos(asked_ns)).await;
                    let slept_ns = u64::try_from(instant_now().duration_since(start).as_nanos())
                        .unwrap_or(u64::MAX);
                    recorder.observe_overshoot(asked_ns, slept_ns);
                    recorder.histograms().service.record_ns(slept_ns);
                    recorder.busy.fetch_sub(1, Ordering::AcqRel);
                }
                Ok::<(), std::convert::Infallible>(())
            }
        })?;
        Ok(consumer)
    }

    /// Shuts every consumer down, all at once (each may wait for a long
    /// poll: one after the other, 4,000 consumers would take an hour), and
    /// returns the run's consumer totals.
    pub(super) async fn finish(mut self) -> ConsumerStats {
        let shutdowns = std::mem::take(&mut self.running)
            .into_iter()
            .flatten()
            .map(|(consumer, _)| consumer.shutdown());
        for stats in futures_util::future::join_all(shutdowns).await {
            let mut total = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            *total = total.merged(stats);
        }
        for task in std::mem::take(&mut self.retiring) {
            let _ = task.await;
        }
        *self.retired.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
