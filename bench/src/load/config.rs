//! What a load run is asked to do: where the broker is, the queues, the
//! producers and workers, and the phases; with every bound checked before
//! anything starts ([`LoadConfig::validate`]) and the limits and defaults
//! those checks use.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use spool_client::limits::{CLAIMS_IN_FLIGHT_MAX, PRODUCER_PENDING_MESSAGES_MAX};
use spool_client::spool_wire::proto::limits::{LEASE_MS_MAX, PARTITIONS_MAX};
use spool_wire::limits::{BATCH_BYTES_MAX, PAYLOAD_INLINE_BYTES_MAX};

use super::LoadError;
use crate::dist::{self, Arrivals, ServiceTime};
use crate::sends::TIMESTAMP_BYTES;

/// Queues one run may create (OMB `topics`): the broker's own limit of
/// queues per node.
pub const QUEUES_MAX: u32 = spool_broker::control::assignment::QUEUES_MAX as u32;
/// Partitions over all of a run's queues: the broker's limit per node.
pub const PARTITIONS_TOTAL_MAX: u64 =
    spool_broker::control::assignment::PARTITIONS_PER_NODE_MAX as u64;
/// Producers over all queues (OMB's `topics × producersPerTopic`, e.g.
/// 1,000 × 4): each is a schedule, not a thread; they are multiplexed over
/// at most [`PACER_THREADS_MAX`] pacing threads.
pub const PRODUCERS_MAX: u32 = 65_536;
/// Pacing threads of a run, each with its own connection: producers beyond
/// this share them (a thread serves its producers round-robin at the sum of
/// their rates).
pub const PACER_THREADS_MAX: u32 = 16;
/// Consumers per queue at the start of a run.
pub const CONSUMERS_PER_QUEUE_MAX: u32 = 64;
/// Subscriptions per queue: the broker's limit.
pub const SUBSCRIPTIONS_MAX: u32 = spool_broker::queue::limits::SUBSCRIPTIONS_PER_QUEUE_MAX as u32;
/// Consumers over all queues (OMB's `topics × subscriptionsPerTopic ×
/// consumerPerSubscription`).
pub const CONSUMERS_MAX: u32 = 65_536;
/// Client connections the consumers open: one per consumer up to this, then
/// shared (a [`spool_client::Client`] multiplexes its requests). 256 keeps
/// 4,000 consumers × 2 claims in flight at ≈31 long-polling claims per
/// connection, under the broker's default of 64.
pub const CONSUMER_CONNECTIONS_MAX: u32 = 256;
/// Largest payload pool (bytes over all its payloads).
pub const PAYLOAD_POOL_BYTES_MAX: u64 = 256 << 20;
/// Phases of one run.
pub const PHASES_MAX: usize = 16;
/// Execution slots over all consumers of a run.
pub const SLOTS_MAX: u32 = 65_536;
/// Largest prefetch as a fraction of a consumer's slots.
pub const PREFETCH_FRACTION_MAX: f64 = 1.0;
/// Default consumer prefetch (fraction of its slots): covers a claim round
/// trip plus a claim share at the rates of the capacity model. At 19,000/s
/// over 342 slots, 0.5 measured 18.5k/s consumed against 17.0k at 0.25
/// (`spool-bench latency --rate 25000 --msg-bytes 1638 --slots 342
/// --service-ms 18 --prefetch-fraction F`); in `capacity --time-scale 0.05`
/// with 8 claims in flight, 1.0 drained the backlog in 203 s where 0.5 had
/// not drained in 360 s (one run each; docs/performance.md, "Capacity model: the
/// consumer side").
pub const PREFETCH_FRACTION_DEFAULT: f64 = 1.0;
/// Default ack linger of the simulated workers (µs): a slot no longer waits
/// for its Ack, so acks may gather longer and cost fewer requests. 10 ms
/// against 5 ms in `capacity --time-scale 0.05`: Ack requests 470k → 245k,
/// the run's system CPU 162 → 99 s, drain out 21.4k → 21.7k/s.
pub const ACK_LINGER_US_DEFAULT: u64 = 10_000;
/// Default claims outstanding per consumer. Fewer, larger claims: with the
/// prefetch covering the round trip, 8 in flight split the free room into
/// ≈6-delivery claims (4,000 claim requests/s at 25k/s); with 2, `capacity
/// --time-scale 0.05` consumed 18.6k/s in the burst against 15.7k at 8, and
/// drained in 132 s instead of 203 s (1 in flight: 18.3k/s, 131 s).
pub const CLAIMS_IN_FLIGHT_DEFAULT: u32 = 2;
/// Highest phase rate (msgs/s over all producers).
pub const RATE_MAX: f64 = 10_000_000.0;
/// Longest phase (s).
pub const PHASE_S_MAX: f64 = 86_400.0;
/// Samples kept: a day at one per second.
pub const SAMPLES_MAX: usize = 86_400;
/// Sends in flight per producer.
pub const WINDOW_MAX: u64 = PRODUCER_PENDING_MESSAGES_MAX as u64;
pub const CLIENT_THREADS_MAX: u64 = 64;
pub const LINGER_US_MAX: u64 = 1_000_000;

/// Where the broker is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerConfig {
    /// A running broker; `None` starts a `spoold`.
    pub addr: Option<String>,
    /// Parent of a started spoold's temporary data directory.
    pub dir: PathBuf,
    /// The `spoold` binary; `None` = next to this executable.
    pub spoold: Option<PathBuf>,
    /// Shards of a started spoold (and the default partition count's
    /// basis); `None` = CPUs available.
    pub shards: Option<u16>,
    /// Extra arguments of a started spoold (e.g. `--journal-retain-bytes 0`).
    pub spoold_args: Vec<String>,
}

/// How a phase ends.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseEnd {
    /// After its `seconds`.
    Elapsed,
    /// When the client's backlog (enqueued − acked) is at least
    /// `target_msgs` (OMB's backlog build), or after `seconds` at the latest.
    Backlog { target_msgs: u64 },
    /// When the client's ready backlog (enqueued − claimed) is at most
    /// `threshold_msgs`, or after `seconds` at the latest.
    Drained { threshold_msgs: u64 },
}

/// One stretch of constant ingress rate and worker slots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Phase {
    pub name: String,
    /// Length (for [`PhaseEnd::Drained`]: the longest it may last).
    pub seconds: f64,
    /// Ingress over all producers (msgs/s); 0 = no sends.
    pub rate_per_s: f64,
    /// Execution slots over all consumers of all queues; 0 pauses the
    /// consumers (they are shut down and started again by the next phase).
    pub slots: u32,
    pub end: PhaseEnd,
}

/// One run of the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadConfig {
    pub broker: BrokerConfig,
    /// Names the temp dir and the default queue (`<label>-<pid>`).
    pub label: &'static str,
    /// Queue name (with several queues: prefix, `-<i>` appended).
    pub queue: Option<String>,
    pub queues: u32,
    /// Partitions per queue; `None` = shards × 2.
    pub partitions: Option<u32>,
    /// Admission limits and dedupe window of created queues.
    pub queue_max_messages: u64,
    pub queue_max_bytes: u64,
    pub dedupe_window_ms: u64,
    pub msg_bytes: u64,
    /// Payloads the producers pick from at random (each of `msg_bytes`; its
    /// first [`TIMESTAMP_BYTES`] are overwritten by the send time); empty =
    /// zeros.
    pub payloads: Arc<Vec<Vec<u8>>>,
    pub producers_per_queue: u32,
    /// Consumers a queue's slots are spread over (per subscription).
    pub consumers_per_queue: u32,
    /// Subscriptions per queue (OMB's `subscriptionsPerTopic`): the
    /// default and `sub-1`, `sub-2`, ... made with the queue; each gets
    /// `consumers_per_queue` consumers and every enqueue once.
    pub subscriptions: u32,
    pub arrivals: Arrivals,
    pub service: ServiceTime,
    pub phases: Vec<Phase>,
    /// Sends in flight per producer.
    pub window: u64,
    pub linger_us: u64,
    pub batch_bytes: u64,
    /// Lease the consumers ask for.
    pub lease_ms: u32,
    /// Each consumer's prefetch as a fraction of its slots (rounded up).
    pub prefetch_fraction: f64,
    /// Claims each consumer keeps outstanding.
    pub claims_in_flight: u32,
    /// How long a finished delivery waits for company in an Ack (µs).
    pub ack_linger_us: u64,
    pub client_threads: u64,
    pub seed: u64,
    /// Draw a progress bar on stderr (only if stderr is a terminal).
    pub progress: bool,
    /// Seconds the progress bar expects the run to take.
    pub expected_s: f64,
}

impl LoadConfig {
    /// Checks every bound before anything starts.
    ///
    /// # Errors
    /// [`LoadError::OutOfRange`] naming the first bad field.
    pub fn validate(&self) -> Result<(), LoadError> {
        let check = |field: &str, value: f64, min: f64, max: f64| {
            if value.is_finite() && (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LoadError::OutOfRange { field: field.to_owned(), value, min, max })
            }
        };
        check("queues", self.queues.into(), 1.0, QUEUES_MAX.into())?;
        let msg_min = TIMESTAMP_BYTES as f64;
        check("msg_bytes", self.msg_bytes as f64, msg_min, PAYLOAD_INLINE_BYTES_MAX as f64)?;
        check("producers", self.producers() as f64, 1.0, PRODUCERS_MAX.into())?;
        check("consumers", self.consumers_per_queue.into(), 1.0, CONSUMERS_PER_QUEUE_MAX.into())?;
        check("subscriptions", self.subscriptions.into(), 1.0, SUBSCRIPTIONS_MAX.into())?;
        check("consumers_total", self.consumers() as f64, 1.0, CONSUMERS_MAX.into())?;
        let pool_bytes: usize = self.payloads.iter().map(Vec::len).sum();
        check("payload_pool_bytes", pool_bytes as f64, 0.0, PAYLOAD_POOL_BYTES_MAX as f64)?;
        if let Some(wrong) =
            self.payloads.iter().find(|payload| payload.len() as u64 != self.msg_bytes)
        {
            check(
                "payload_bytes",
                wrong.len() as f64,
                self.msg_bytes as f64,
                self.msg_bytes as f64,
            )?;
        }
        if let Some(partitions) = self.partitions {
            check("partitions", partitions.into(), 1.0, PARTITIONS_MAX.into())?;
        }
        if let Some(shards) = self.broker.shards {
            check("shards", shards.into(), 1.0, u16::MAX.into())?;
        }
        check("queue_max_messages", self.queue_max_messages as f64, 1.0, u64::MAX as f64)?;
        check("queue_max_bytes", self.queue_max_bytes as f64, 1.0, u64::MAX as f64)?;
        check("prefetch_fraction", self.prefetch_fraction, 0.0, PREFETCH_FRACTION_MAX)?;
        check("claims_in_flight", self.claims_in_flight.into(), 1.0, CLAIMS_IN_FLIGHT_MAX.into())?;
        check("ack_linger_us", self.ack_linger_us as f64, 0.0, LINGER_US_MAX as f64)?;
        check("service_ms", self.service.mean_ms, 0.0, dist::SERVICE_MS_MAX)?;
        check("service_cv", self.service.cv, 0.0, dist::SERVICE_CV_MAX)?;
        check("phases", self.phases.len() as f64, 1.0, PHASES_MAX as f64)?;
        for phase in &self.phases {
            let name = &phase.name;
            check(&format!("{name}.seconds"), phase.seconds, 0.001, PHASE_S_MAX)?;
            check(&format!("{name}.rate"), phase.rate_per_s, 0.0, RATE_MAX)?;
            // Every queue's subscription needs a slot (or none: paused), and no
            // consumer more than the protocol's credits.
            if phase.slots > 0 {
                check(
                    &format!("{name}.slots"),
                    phase.slots.into(),
                    self.queues.saturating_mul(self.subscriptions).into(),
                    SLOTS_MAX.into(),
                )?;
            }
        }
        check("window", self.window as f64, 1.0, WINDOW_MAX as f64)?;
        check("linger_us", self.linger_us as f64, 0.0, LINGER_US_MAX as f64)?;
        check("batch_bytes", self.batch_bytes as f64, 1.0, BATCH_BYTES_MAX as f64)?;
        check("lease_ms", self.lease_ms.into(), 1.0, LEASE_MS_MAX.into())?;
        check("client_threads", self.client_threads as f64, 1.0, CLIENT_THREADS_MAX as f64)
    }

    pub fn producers(&self) -> u32 {
        self.queues.saturating_mul(self.producers_per_queue)
    }

    pub fn consumers(&self) -> u32 {
        self.queues.saturating_mul(self.subscriptions).saturating_mul(self.consumers_per_queue)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn config() -> LoadConfig {
        LoadConfig {
            broker: BrokerConfig {
                addr: Some("127.0.0.1:1".to_owned()),
                dir: PathBuf::from("/tmp"),
                spoold: None,
                shards: Some(1),
                spoold_args: Vec::new(),
            },
            label: "test",
            queue: None,
            queues: 1,
            partitions: None,
            queue_max_messages: 1_000_000,
            queue_max_bytes: 1 << 30,
            dedupe_window_ms: 60_000,
            msg_bytes: 64,
            payloads: Arc::default(),
            producers_per_queue: 1,
            consumers_per_queue: 1,
            subscriptions: 1,
            arrivals: Arrivals::Fixed,
            service: ServiceTime { mean_ms: 18.0, cv: 1.0 },
            phases: vec![Phase {
                name: "only".to_owned(),
                seconds: 1.0,
                rate_per_s: 100.0,
                slots: 4,
                end: PhaseEnd::Elapsed,
            }],
            window: 64,
            linger_us: 1000,
            batch_bytes: 65_536,
            lease_ms: 30_000,
            prefetch_fraction: 0.25,
            claims_in_flight: 4,
            ack_linger_us: 1000,
            client_threads: 2,
            seed: 1,
            progress: false,
            expected_s: 1.0,
        }
    }

    #[test]
    fn validate_rejects_each_out_of_range_field() {
        // Goal: every bounded knob is checked before a broker starts; method: one bad field each.
        assert!(config().validate().is_ok());
        type Mutate = fn(&mut LoadConfig);
        let cases: Vec<(&str, Mutate)> = vec![
            ("queues", |c| c.queues = 0),
            ("msg_bytes", |c| c.msg_bytes = 7),
            ("producers", |c| c.producers_per_queue = 0),
            ("consumers", |c| c.consumers_per_queue = 0),
            ("subscriptions", |c| c.subscriptions = 0),
            ("subscriptions", |c| c.subscriptions = SUBSCRIPTIONS_MAX + 1),
            ("prefetch_fraction", |c| c.prefetch_fraction = 1.5),
            ("claims_in_flight", |c| c.claims_in_flight = 0),
            ("ack_linger_us", |c| c.ack_linger_us = LINGER_US_MAX + 1),
            ("service_cv", |c| c.service.cv = -1.0),
            ("phases", |c| c.phases.clear()),
            ("only.seconds", |c| c.phases[0].seconds = 0.0),
            ("only.rate", |c| c.phases[0].rate_per_s = f64::NAN),
            ("only.slots", |c| c.phases[0].slots = SLOTS_MAX + 1),
            ("producers", |c| c.producers_per_queue = PRODUCERS_MAX + 1),
            ("consumers_total", |c| {
                c.queues = QUEUES_MAX;
                c.consumers_per_queue = CONSUMERS_PER_QUEUE_MAX;
            }),
            ("payload_bytes", |c| c.payloads = Arc::new(vec![vec![0; 63]])),
            ("window", |c| c.window = 0),
            ("client_threads", |c| c.client_threads = 0),
        ];
        // A phase without slots pauses the consumers (OMB's backlog build).
        let mut paused = config();
        paused.phases[0].slots = 0;
        assert!(paused.validate().is_ok());
        for (field, mutate) in cases {
            let mut bad = config();
            mutate(&mut bad);
            match bad.validate() {
                Err(LoadError::OutOfRange { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: expected OutOfRange, got {other:?}"),
            }
        }
    }
}
