//! The phased load engine under the `latency`, `capacity` and `omb`
//! scenarios: open-loop producers and simulated workers over the real
//! client, a one-second sampler, and the numbers every report shares.
//!
//! What it owns, for one run: the broker ([`Broker`]: started here unless an
//! address is given), the run's queues (created; deleted afterwards only on a
//! broker it did not start), one tokio runtime for every client, a pacing
//! thread per producer, the consumers, the sampler, and an optional progress
//! bar on stderr. What it does not do: decide phases or judge results (the
//! scenarios build [`Phase`]s and compare with the planner), or touch broker
//! internals (it speaks the protocol through `spool-client`; the broker's own
//! counts come from DescribeQueue).
//!
//! - **Arrivals** are open loop: each pacing thread gives message *i* an
//!   intended send time (fixed gaps, or exponential gaps for Poisson
//!   arrivals, at the current phase's rate), submits it at or after that time
//!   (waiting for a window slot if `window` sends are in flight), and the
//!   enqueue latency counts from the intended time. A stalled broker shows up
//!   as latency, never as fewer samples (no coordinated omission).
//! - **Workers** are `spool_client::Consumer`s: each holds N execution slots
//!   and claims its free room as credits, with `prefetch_fraction × N`
//!   deliveries claimed ahead so a slot that frees starts its next delivery
//!   without a claim round trip. A handler "works" for a log-normal service
//!   time (mean, CV) and returns `Ok`; its slot frees then and the ack goes
//!   out batched. A phase's consumer capacity is its slot count ÷ mean
//!   service time; at a phase boundary slots are added by starting
//!   consumers and removed by shutting the newest down (they finish what
//!   they hold).
//! - **Service time is held to its mean**: tokio's timers have 1 ms
//!   resolution and fire late (≈0.5–1 ms on an 18 ms sleep, 3–5 % fewer
//!   completions per slot than the model). Each sleep is shortened by the
//!   running mean of the observed lateness, so the measured mean service
//!   time — reported, the figure to check — equals the configured one.
//! - **Counts**: the client's backlog is `enqueued − acked` (sends whose
//!   offset came back, minus acks the broker confirmed); the broker's is
//!   DescribeQueue `ready + scheduled + claimed`. Both are sampled every
//!   second with the interval's rates and latency percentiles.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use spool_broker::clock::{instant_now, Instant};
use spool_client::limits::{
    CLAIMS_IN_FLIGHT_MAX, CONSUMER_SLOTS_MAX, PRODUCER_PENDING_MESSAGES_MAX,
};
use spool_client::spool_wire::proto::limits::{LEASE_MS_MAX, PARTITIONS_MAX};
use spool_client::spool_wire::proto::{Offset, QueueConfig};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    default_queue_config, Admin, Client, ClientError, Consumer, ConsumerConfig, ConsumerStats,
    Delivery, Message, PayloadView, Producer, ProducerConfig, SendFuture,
};
use spool_wire::limits::{BATCH_BYTES_MAX, PAYLOAD_INLINE_BYTES_MAX};
use thiserror::Error;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::dist::{self, Arrivals, ServiceTime};
use crate::harness::{default_shards, error_name, Broker, HarnessError};
use crate::latency::{Latency, LatencySummary};

use crate::throughput::payload;
/// Bytes of the intended-send-time prefix every payload carries (one
/// encoding for every scenario: `throughput` owns it).
pub use crate::throughput::TIMESTAMP_BYTES;
/// Queues one run may create (OMB `topics`): the broker's own limit of
/// queues per node.
pub const QUEUES_MAX: u32 = spool_broker::control::assignment::QUEUES_MAX as u32;
/// Partitions over all of a run's queues: the broker's limit per node.
pub const PARTITIONS_TOTAL_MAX: u64 =
    spool_broker::control::assignment::PARTITIONS_PER_NODE_MAX as u64;
/// Producers over all queues; each is one pacing thread.
pub const PRODUCERS_MAX: u32 = 128;
/// Consumers per queue at the start of a run.
pub const CONSUMERS_PER_QUEUE_MAX: u32 = 64;
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
/// not drained in 360 s (one run each; bench/README.md, "Measured:
/// capacity").
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
/// Weight of one observation in the running mean of timer lateness.
const OVERSHOOT_EWMA_SHIFT: u32 = 6;
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
/// How often the controller checks whether a draining phase is done.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// How long sends and handlers still in flight after the last phase may take.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);
/// Consumers' long-poll wait: short, so a consumer being retired or a run
/// ending does not wait long for an idle claim.
const CLAIM_WAIT_MS: u32 = 100;
/// How often a pacing thread blocked on its window re-checks for the stop.
const PACER_STOP_CHECK: Duration = Duration::from_millis(100);
/// Pause after a failed submit so a broken broker is not spun on.
const SUBMIT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Why a load run produced no result.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: String, value: f64, min: f64, max: f64 },
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("cannot build the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot spawn a pacing thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("histogram: {0}")]
    Histogram(String),
    #[error("{0} did not finish within {1:?} after the last phase")]
    Finish(&'static str, Duration),
}

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
}

/// How a phase ends.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseEnd {
    /// After its `seconds`.
    Elapsed,
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
    /// Execution slots over all consumers of all queues.
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
    pub producers_per_queue: u32,
    /// Consumers a queue's slots are spread over.
    pub consumers_per_queue: u32,
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
            // Every queue needs a slot, and no consumer more than the protocol's credits.
            check(
                &format!("{name}.slots"),
                phase.slots.into(),
                self.queues.into(),
                SLOTS_MAX.into(),
            )?;
        }
        check("window", self.window as f64, 1.0, WINDOW_MAX as f64)?;
        check("linger_us", self.linger_us as f64, 0.0, LINGER_US_MAX as f64)?;
        check("batch_bytes", self.batch_bytes as f64, 1.0, BATCH_BYTES_MAX as f64)?;
        check("lease_ms", self.lease_ms.into(), 1.0, LEASE_MS_MAX.into())?;
        check("client_threads", self.client_threads as f64, 1.0, CLIENT_THREADS_MAX as f64)
    }

    fn producers(&self) -> u32 {
        self.queues.saturating_mul(self.producers_per_queue)
    }
}

/// Percentiles of one interval or run, in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PercentilesMs {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl From<LatencySummary> for PercentilesMs {
    fn from(us: LatencySummary) -> Self {
        Self {
            count: us.count,
            p50: us.p50 / 1000.0,
            p99: us.p99 / 1000.0,
            p999: us.p999 / 1000.0,
            max: us.max / 1000.0,
            mean: us.mean / 1000.0,
        }
    }
}

/// The broker's counts, summed over a run's queues and partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BrokerCounts {
    pub ready: u64,
    pub scheduled: u64,
    pub claimed: u64,
    /// ready + scheduled + claimed: everything enqueued and not yet acked.
    pub backlog: u64,
    pub acked: u64,
    /// Oldest ready message over every partition.
    pub oldest_ready_age_ms: u64,
    /// Cumulative.
    pub released: u64,
    pub lease_expired: u64,
    pub quarantined: u64,
}

/// One sample (every second, and at each phase end).
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Since the first send was due.
    pub t_s: f64,
    pub phase: String,
    /// Sends confirmed in the interval ÷ its length.
    pub publish_rate: f64,
    /// Acks confirmed in the interval ÷ its length.
    pub consume_rate: f64,
    /// Client count: enqueued − acked.
    pub backlog_client: i64,
    /// Client count: enqueued − claimed (waiting in the broker, not held).
    pub ready_client: i64,
    /// DescribeQueue ready + scheduled + claimed.
    pub backlog_broker: u64,
    pub ready_broker: u64,
    pub claimed_broker: u64,
    pub oldest_ready_age_ms: u64,
    /// Handlers running their service time right now.
    pub busy_slots: u64,
    /// Deliveries held (claimed, not yet acked or released).
    pub held_slots: i64,
    /// Slots the phase runs with.
    pub slots: u32,
    /// The scenario's model, where it has one.
    pub predicted_backlog: Option<f64>,
    pub publish_latency_ms: PercentilesMs,
    pub e2e_latency_ms: PercentilesMs,
    /// Errors so far (cumulative).
    pub errors: u64,
}

/// The client's backlog and the broker's, read around one DescribeQueue.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BacklogCheck {
    /// enqueued − acked just before DescribeQueue was sent...
    pub client_before: i64,
    /// ...and just after it returned.
    pub client_after: i64,
    /// Their mean: the client's estimate at the moment the broker counted.
    pub client_estimate: f64,
    /// DescribeQueue ready + scheduled + claimed.
    pub broker: u64,
    /// |client_estimate − broker| ÷ broker (0 when both are 0).
    pub relative_error: f64,
}

/// How one phase went.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseOutcome {
    pub name: String,
    pub started_s: f64,
    pub ended_s: f64,
    /// For a draining phase: whether the threshold was reached (else it hit
    /// its `seconds`).
    pub drained: Option<bool>,
    pub rate_per_s: f64,
    pub slots: u32,
    /// Confirmed sends and acks in the phase ÷ its length.
    pub publish_rate: f64,
    pub consume_rate: f64,
    /// Largest client backlog (enqueued − acked) seen in the phase (checked
    /// every 50 ms while draining, else at each sample).
    pub backlog_client_max: i64,
    /// The counts when the phase ended.
    pub end_check: BacklogCheck,
    /// Mean busy slots over the phase's samples.
    pub busy_slots_mean: f64,
}

/// Totals of a run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadOutcome {
    pub duration_s: f64,
    pub phases: Vec<PhaseOutcome>,
    pub series: Vec<Sample>,
    pub submitted: u64,
    pub enqueued: u64,
    pub claimed: u64,
    pub acked: u64,
    pub released: u64,
    /// Deliveries with attempt > 1, seen by the handlers.
    pub redelivered: u64,
    pub extend_failed: u64,
    /// Claim and Ack requests the consumers sent (deliveries per request
    /// is what batching bought).
    pub claim_requests: u64,
    pub ack_requests: u64,
    /// Intended send → offset returned, whole run.
    pub publish_latency_ms: PercentilesMs,
    /// Intended send → handler start, whole run.
    pub e2e_latency_ms: PercentilesMs,
    /// Measured handler service time (sleep asked → woken), whole run.
    pub service_ms: PercentilesMs,
    /// Mean delivery → ack-confirmed time by Little's law: mean held slots
    /// ÷ mean ack rate over the samples with acks.
    pub claim_to_ack_mean_ms: f64,
    pub broker_final: BrokerCounts,
    pub errors: BTreeMap<String, u64>,
    pub addr: String,
    pub spoold_started: bool,
    pub shards: u16,
    pub queues: Vec<String>,
    pub queues_created: bool,
    pub partitions: u32,
}

/// Runs `config` and returns what happened.
///
/// # Errors
/// A bad config, a broker that does not start or stop, a refused queue, or
/// sends or handlers still outstanding [`FINISH_TIMEOUT`] after the last
/// phase.
pub fn run(config: &LoadConfig) -> Result<LoadOutcome, LoadError> {
    config.validate()?;
    let shards = config.broker.shards.unwrap_or_else(default_shards);
    let broker = Broker::start_or_connect(
        config.broker.addr.as_deref(),
        config.broker.spoold.as_deref(),
        &config.broker.dir,
        shards,
        config.label,
    )?;
    let threads = usize::try_from(config.client_threads).unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .map_err(LoadError::Runtime)?;
    let handle = runtime.handle().clone();
    let result = runtime.block_on(drive(config, broker.addr(), broker.started(), shards, handle));
    runtime.shutdown_timeout(Duration::from_secs(5));
    let stopped = broker.stop();
    let outcome = result?;
    stopped?;
    Ok(outcome)
}

/// Counters and histograms shared by pacers, collectors, handlers and the
/// sampler.
struct Recorder {
    base: Instant,
    stopping: AtomicBool,
    /// Index into the phases: the pacers' current rate.
    phase: AtomicUsize,
    submitted: AtomicU64,
    enqueued: AtomicU64,
    redelivered: AtomicU64,
    busy: AtomicU64,
    /// Running mean of how late a handler's sleep ends (ns).
    overshoot_ns: AtomicU64,
    error_count: AtomicU64,
    histograms: Mutex<Histograms>,
    errors: Mutex<BTreeMap<String, u64>>,
    service_rng: Mutex<ChaCha8Rng>,
}

struct Histograms {
    publish_interval: Latency,
    e2e_interval: Latency,
    publish: Latency,
    e2e: Latency,
    service: Latency,
}

impl Recorder {
    fn now_ns(&self) -> u64 {
        u64::try_from(instant_now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn histograms(&self) -> std::sync::MutexGuard<'_, Histograms> {
        self.histograms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count_error(&self, name: String) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        *self.errors.lock().unwrap_or_else(PoisonError::into_inner).entry(name).or_insert(0) += 1;
    }

    fn sent(&self, due_ns: u64, result: Result<Offset, ClientError>) {
        match result {
            Ok(_) => {
                let latency_ns = self.now_ns().saturating_sub(due_ns);
                self.enqueued.fetch_add(1, Ordering::AcqRel);
                let mut histograms = self.histograms();
                histograms.publish_interval.record_ns(latency_ns);
                histograms.publish.record_ns(latency_ns);
            }
            Err(error) => self.count_error(format!("enqueue.{}", error_name(&error))),
        }
    }

    fn delivered(&self, delivery: &Delivery) {
        if delivery.attempt() > 1 {
            self.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        let sent_ns = match delivery.payload() {
            PayloadView::Inline(bytes) => bytes
                .get(..TIMESTAMP_BYTES)
                .and_then(|prefix| <[u8; TIMESTAMP_BYTES]>::try_from(prefix).ok())
                .map(u64::from_le_bytes),
            PayloadView::Reference { .. } => None,
        };
        match sent_ns {
            Some(sent_ns) => {
                let latency_ns = self.now_ns().saturating_sub(sent_ns);
                let mut histograms = self.histograms();
                histograms.e2e_interval.record_ns(latency_ns);
                histograms.e2e.record_ns(latency_ns);
            }
            None => self.count_error("e2e.bad_payload".to_owned()),
        }
    }

    fn service_ns(&self, service: &ServiceTime) -> u64 {
        service.sample_ns(&mut self.service_rng.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How long to sleep for a service time of `service_ns`: shortened by
    /// the mean lateness so far (module doc).
    fn sleep_for_ns(&self, service_ns: u64) -> u64 {
        service_ns.saturating_sub(self.overshoot_ns.load(Ordering::Relaxed))
    }

    /// Folds one sleep's lateness into the running mean (a lost update
    /// between racing handlers only drops one observation).
    fn observe_overshoot(&self, asked_ns: u64, slept_ns: u64) {
        let late = i128::from(slept_ns) - i128::from(asked_ns);
        let mean = i128::from(self.overshoot_ns.load(Ordering::Relaxed));
        let next = mean + ((late - mean) >> OVERSHOOT_EWMA_SHIFT);
        self.overshoot_ns.store(u64::try_from(next.max(0)).unwrap_or(0), Ordering::Relaxed);
    }
}

/// One producer's pacing thread: message `i` is due at the previous due
/// time plus a gap drawn at the current phase's share of the rate; it is
/// submitted at or after that time and its latency counts from it.
struct Pacer {
    handle: Handle,
    producer: Producer,
    queue: String,
    recorder: Arc<Recorder>,
    /// Each phase's rate for this producer (msgs/s).
    rates: Vec<f64>,
    arrivals: Arrivals,
    rng: ChaCha8Rng,
    permits: Arc<Semaphore>,
    msg_bytes: usize,
    sends: mpsc::Sender<(u64, SendFuture, OwnedSemaphorePermit)>,
}

impl Pacer {
    fn run(mut self) {
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer
        // slack (default 50 µs) so its sleeps end close to the schedule.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut due_ns = self.recorder.now_ns();
        while !self.recorder.stopping() {
            let phase = self.recorder.phase.load(Ordering::Acquire);
            let rate = self.rates.get(phase).copied().unwrap_or(0.0);
            if rate <= 0.0 {
                // A phase without sends: idle, and restart the schedule when
                // sends resume rather than bursting to catch up.
                std::thread::sleep(PACER_STOP_CHECK);
                due_ns = self.recorder.now_ns();
                continue;
            }
            let now_ns = self.recorder.now_ns();
            if due_ns > now_ns {
                std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
            }
            let (permits, recorder) = (&self.permits, &self.recorder);
            // The window is rarely full: take a permit without entering the
            // runtime (and arming a stop-check timer) when one is free.
            let free = Arc::clone(permits).try_acquire_owned().ok();
            let permit = free.or_else(|| {
                self.handle.block_on(async {
                    loop {
                        tokio::select! {
                            permit = Arc::clone(permits).acquire_owned() => return permit.ok(),
                            () = tokio::time::sleep(PACER_STOP_CHECK) => {
                                if recorder.stopping() {
                                    return None;
                                }
                            }
                        }
                    }
                })
            });
            let Some(permit) = permit else { break };
            let message = Message::new(payload(due_ns, self.msg_bytes));
            self.recorder.submitted.fetch_add(1, Ordering::Relaxed);
            match self.handle.block_on(self.producer.submit(&self.queue, message)) {
                Ok(send) => {
                    if self.sends.blocking_send((due_ns, send, permit)).is_err() {
                        break;
                    }
                }
                Err(error) => {
                    self.recorder.count_error(format!("enqueue.{}", error_name(&error)));
                    std::thread::sleep(SUBMIT_ERROR_PAUSE);
                }
            }
            due_ns += self.arrivals.gap_ns(rate, &mut self.rng);
        }
    }
}

type Sent = (u64, Result<Offset, ClientError>);

async fn track(due_ns: u64, send: SendFuture, permit: OwnedSemaphorePermit) -> Sent {
    let result = send.await;
    drop(permit);
    (due_ns, result)
}

/// Awaits the sends a pacer hands over.
async fn collect(
    recorder: Arc<Recorder>,
    mut sends: mpsc::Receiver<(u64, SendFuture, OwnedSemaphorePermit)>,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            Some((due_ns, result)) = in_flight.next(), if !in_flight.is_empty() => {
                recorder.sent(due_ns, result);
            }
            send = sends.recv(), if open => match send {
                Some((due_ns, send, permit)) => in_flight.push(track(due_ns, send, permit)),
                None => open = false,
            },
            else => break,
        }
    }
}

/// The simulated workers of every queue: consumers with slots, grown and
/// shrunk at phase boundaries.
struct Workers {
    addr: String,
    queues: Vec<String>,
    consumers_per_queue: u32,
    lease_ms: u32,
    prefetch_fraction: f64,
    claims_in_flight: u32,
    ack_linger_us: u64,
    service: ServiceTime,
    recorder: Arc<Recorder>,
    /// Per queue: running consumers and their slots, oldest first.
    running: Vec<Vec<(Consumer, u32)>>,
    /// Stats of consumers already shut down.
    retired: Arc<Mutex<ConsumerStats>>,
    retiring: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    fn stats(&self) -> ConsumerStats {
        let retired = *self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        self.running
            .iter()
            .flatten()
            .map(|(consumer, _)| consumer.stats())
            .fold(retired, ConsumerStats::merged)
    }

    /// Spreads `total` slots over the queues (the first get one more when
    /// it does not divide) and makes each queue's consumers hold that many.
    async fn set_slots(&mut self, total: u32) -> Result<(), LoadError> {
        let queues = u32::try_from(self.queues.len()).unwrap_or(u32::MAX);
        for index in 0..self.queues.len() {
            let position = u32::try_from(index).unwrap_or(u32::MAX);
            let target = total / queues + u32::from(position < total % queues);
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
            let consumer = self.start(&self.queues[index], slots).await?;
            self.running[index].push((consumer, slots));
        }
        Ok(())
    }

    async fn start(&self, queue: &str, slots: u32) -> Result<Consumer, LoadError> {
        let client = Client::connect(&self.addr).await?;
        let mut consumer_config = ConsumerConfig::new(queue.to_owned(), slots);
        consumer_config.wait_ms = CLAIM_WAIT_MS;
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

    /// Shuts every consumer down and returns the run's consumer totals.
    async fn finish(mut self) -> ConsumerStats {
        for running in std::mem::take(&mut self.running) {
            for (consumer, _) in running {
                let stats = consumer.shutdown().await;
                let mut total = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
                *total = total.merged(stats);
            }
        }
        for task in std::mem::take(&mut self.retiring) {
            let _ = task.await;
        }
        *self.retired.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The broker's counts over `queues`.
async fn describe(admin: &Admin, queues: &[String]) -> Result<BrokerCounts, ClientError> {
    let mut counts = BrokerCounts::default();
    for queue in queues {
        for stats in admin.describe_queue(queue).await?.partitions {
            counts.ready += stats.ready;
            counts.scheduled += stats.scheduled;
            counts.claimed += stats.claimed;
            counts.acked += stats.acked;
            counts.oldest_ready_age_ms = counts.oldest_ready_age_ms.max(stats.oldest_ready_age_ms);
            counts.released += stats.released;
            counts.lease_expired += stats.lease_expired;
            counts.quarantined += stats.quarantined;
        }
    }
    counts.backlog = counts.ready + counts.scheduled + counts.claimed;
    Ok(counts)
}

/// Everything the controller and the sampler share.
struct Live {
    recorder: Arc<Recorder>,
    workers: tokio::sync::Mutex<Workers>,
    admin: Admin,
    queues: Vec<String>,
    /// Phase names, for samples.
    phase_names: Vec<String>,
    phase_slots: Vec<u32>,
    progress: ProgressBar,
}

/// Client counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct Snapshot {
    t_ns: u64,
    enqueued: u64,
    stats: ConsumerStats,
}

impl Snapshot {
    fn backlog(&self) -> i64 {
        self.enqueued as i64 - self.stats.acked as i64
    }

    fn ready(&self) -> i64 {
        self.enqueued as i64 - self.stats.claimed as i64
    }

    fn held(&self) -> i64 {
        self.stats.claimed as i64 - self.stats.acked as i64 - self.stats.released as i64
    }
}

impl Live {
    async fn snapshot(&self) -> Snapshot {
        let stats = self.workers.lock().await.stats();
        Snapshot {
            t_ns: self.recorder.now_ns(),
            enqueued: self.recorder.enqueued.load(Ordering::Acquire),
            stats,
        }
    }

    /// Client counts read around one DescribeQueue.
    async fn check(&self) -> Result<(BacklogCheck, BrokerCounts), ClientError> {
        let before = self.snapshot().await.backlog();
        let counts = describe(&self.admin, &self.queues).await?;
        let after = self.snapshot().await.backlog();
        let client_estimate = (before + after) as f64 / 2.0;
        let broker = counts.backlog as f64;
        let relative_error = if counts.backlog == 0 && before == 0 && after == 0 {
            0.0
        } else {
            (client_estimate - broker).abs() / broker.max(1.0)
        };
        let check = BacklogCheck {
            client_before: before,
            client_after: after,
            client_estimate,
            broker: counts.backlog,
            relative_error,
        };
        Ok((check, counts))
    }

    /// One sample since `previous`; takes the interval histograms.
    async fn sample(&self, previous: &Snapshot) -> Result<(Sample, Snapshot), ClientError> {
        let now = self.snapshot().await;
        let counts = describe(&self.admin, &self.queues).await?;
        let (publish, e2e) = {
            let mut histograms = self.recorder.histograms();
            let publish = histograms.publish_interval.summary();
            let e2e = histograms.e2e_interval.summary();
            histograms.publish_interval.reset();
            histograms.e2e_interval.reset();
            (publish, e2e)
        };
        let interval_s = (now.t_ns.saturating_sub(previous.t_ns)) as f64 / 1e9;
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / interval_s.max(1e-9);
        let phase = self.recorder.phase.load(Ordering::Acquire);
        let sample = Sample {
            t_s: now.t_ns as f64 / 1e9,
            phase: self.phase_names.get(phase).cloned().unwrap_or_default(),
            publish_rate: rate(now.enqueued, previous.enqueued),
            consume_rate: rate(now.stats.acked, previous.stats.acked),
            backlog_client: now.backlog(),
            ready_client: now.ready(),
            backlog_broker: counts.backlog,
            ready_broker: counts.ready,
            claimed_broker: counts.claimed,
            oldest_ready_age_ms: counts.oldest_ready_age_ms,
            busy_slots: self.recorder.busy.load(Ordering::Acquire),
            held_slots: now.held(),
            slots: self.phase_slots.get(phase).copied().unwrap_or(0),
            predicted_backlog: None,
            publish_latency_ms: publish.into(),
            e2e_latency_ms: e2e.into(),
            errors: self.recorder.error_count.load(Ordering::Acquire),
        };
        self.progress.set_position(sample.t_s as u64);
        self.progress.set_message(format!(
            "{} in {:.0}/s out {:.0}/s backlog {} p99 {:.1} ms",
            sample.phase,
            sample.publish_rate,
            sample.consume_rate,
            sample.backlog_client,
            sample.publish_latency_ms.p99,
        ));
        Ok((sample, now))
    }
}

/// Samples every second until told to stop.
async fn sampler(live: Arc<Live>, stop: Arc<AtomicBool>) -> Result<Vec<Sample>, ClientError> {
    let mut samples = Vec::new();
    let mut previous = live.snapshot().await;
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    while !stop.load(Ordering::Acquire) && samples.len() < SAMPLES_MAX {
        ticks.tick().await;
        let (sample, now) = live.sample(&previous).await?;
        samples.push(sample);
        previous = now;
    }
    Ok(samples)
}

fn progress_bar(config: &LoadConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(
        Some(config.expected_s.ceil().max(1.0) as u64),
        ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} s  {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

async fn create_queues(
    config: &LoadConfig,
    admin: &Admin,
    shards: u16,
) -> Result<(Vec<String>, bool, u32), ClientError> {
    let base =
        config.queue.clone().unwrap_or_else(|| format!("{}-{}", config.label, std::process::id()));
    let names: Vec<String> = if config.queues == 1 {
        vec![base]
    } else {
        (0..config.queues).map(|index| format!("{base}-{index}")).collect()
    };
    let wanted = config.partitions.unwrap_or(u32::from(shards) * 2).min(PARTITIONS_MAX);
    let mut created = false;
    for name in &names {
        let queue_config = QueueConfig {
            max_messages: config.queue_max_messages,
            max_bytes: config.queue_max_bytes,
            dedupe_window_ms: config.dedupe_window_ms,
            ..default_queue_config(wanted)
        };
        match admin.create_queue(name, queue_config).await {
            Ok(_) => created = true,
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => {}
            Err(error) => return Err(error),
        }
    }
    let partitions =
        u32::try_from(admin.client().partitions(&names[0]).await?.len()).unwrap_or(u32::MAX);
    Ok((names, created, partitions))
}

async fn drive(
    config: &LoadConfig,
    addr: &str,
    spoold_started: bool,
    shards: u16,
    handle: Handle,
) -> Result<LoadOutcome, LoadError> {
    let admin = Admin::new(Client::connect(addr).await?);
    let (queues, created, partitions) = create_queues(config, &admin, shards).await?;
    let histogram = || Latency::new().map_err(|error| LoadError::Histogram(error.to_string()));
    let recorder = Arc::new(Recorder {
        base: instant_now(),
        stopping: AtomicBool::new(false),
        phase: AtomicUsize::new(0),
        submitted: AtomicU64::new(0),
        enqueued: AtomicU64::new(0),
        redelivered: AtomicU64::new(0),
        busy: AtomicU64::new(0),
        overshoot_ns: AtomicU64::new(0),
        error_count: AtomicU64::new(0),
        histograms: Mutex::new(Histograms {
            publish_interval: histogram()?,
            e2e_interval: histogram()?,
            publish: histogram()?,
            e2e: histogram()?,
            service: histogram()?,
        }),
        errors: Mutex::new(BTreeMap::new()),
        service_rng: Mutex::new(dist::rng(config.seed, 0)),
    });
    let mut workers = Workers {
        addr: addr.to_owned(),
        queues: queues.clone(),
        consumers_per_queue: config.consumers_per_queue,
        lease_ms: config.lease_ms,
        prefetch_fraction: config.prefetch_fraction,
        claims_in_flight: config.claims_in_flight,
        ack_linger_us: config.ack_linger_us,
        service: config.service,
        recorder: Arc::clone(&recorder),
        running: queues.iter().map(|_| Vec::new()).collect(),
        retired: Arc::new(Mutex::new(ConsumerStats::default())),
        retiring: Vec::new(),
    };
    workers.set_slots(config.phases[0].slots).await?;

    // Producers: the pacing threads start as soon as they exist, so time 0 of
    // the recorder is reset just before the first is spawned.
    let producer_config = ProducerConfig {
        linger: Duration::from_micros(config.linger_us),
        max_batch_bytes: usize::try_from(config.batch_bytes).unwrap_or(BATCH_BYTES_MAX),
        ..ProducerConfig::default()
    };
    let producers_total = f64::from(config.producers());
    let mut pacer_parts = Vec::new();
    for queue in &queues {
        for _ in 0..config.producers_per_queue {
            let producer = Producer::new(Client::connect(addr).await?, producer_config.clone())?;
            pacer_parts.push((queue.clone(), producer));
        }
    }
    let live = Arc::new(Live {
        recorder: Arc::clone(&recorder),
        workers: tokio::sync::Mutex::new(workers),
        admin: admin.clone(),
        queues: queues.clone(),
        phase_names: config.phases.iter().map(|phase| phase.name.clone()).collect(),
        phase_slots: config.phases.iter().map(|phase| phase.slots).collect(),
        progress: progress_bar(config),
    });
    // Time zero: from here on the recorder's clock is the run's clock.
    let recorder_base_ns = recorder.now_ns();
    let zero_ns = |ns: u64| ns.saturating_sub(recorder_base_ns);
    let window = usize::try_from(config.window).unwrap_or(1);
    let msg_bytes = usize::try_from(config.msg_bytes).unwrap_or(TIMESTAMP_BYTES);
    let mut producers = Vec::new();
    let mut collectors = Vec::new();
    let mut pacers = Vec::new();
    for (stream, (queue, producer)) in pacer_parts.into_iter().enumerate() {
        producers.push(producer.clone());
        let (sender, receiver) = mpsc::channel(window);
        collectors.push(tokio::spawn(collect(Arc::clone(&recorder), receiver)));
        let pacer = Pacer {
            handle: handle.clone(),
            producer,
            queue,
            recorder: Arc::clone(&recorder),
            rates: config.phases.iter().map(|phase| phase.rate_per_s / producers_total).collect(),
            arrivals: config.arrivals,
            rng: dist::rng(config.seed, 1 + stream as u64),
            permits: Arc::new(Semaphore::new(window)),
            msg_bytes,
            sends: sender,
        };
        let thread = std::thread::Builder::new()
            .name(format!("bench-pacer-{stream}"))
            .spawn(move || pacer.run())
            .map_err(LoadError::Thread)?;
        pacers.push(thread);
    }
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = tokio::spawn(sampler(Arc::clone(&live), Arc::clone(&stop_sampling)));

    let mut phases = Vec::new();
    for (index, phase) in config.phases.iter().enumerate() {
        if index > 0 {
            live.workers.lock().await.set_slots(phase.slots).await?;
            recorder.phase.store(index, Ordering::Release);
        }
        let start = live.snapshot().await;
        let mut backlog_max = start.backlog();
        let length = Duration::from_secs_f64(phase.seconds);
        let drained = match phase.end {
            PhaseEnd::Elapsed => {
                tokio::time::sleep(length).await;
                None
            }
            PhaseEnd::Drained { threshold_msgs } => {
                let deadline = tokio::time::Instant::now() + length;
                loop {
                    let now = live.snapshot().await;
                    backlog_max = backlog_max.max(now.backlog());
                    if now.ready() <= threshold_msgs as i64 {
                        break Some(true);
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break Some(false);
                    }
                    tokio::time::sleep(DRAIN_POLL).await;
                }
            }
        };
        let end = live.snapshot().await;
        let (end_check, _) = live.check().await?;
        let length_s = (end.t_ns.saturating_sub(start.t_ns)) as f64 / 1e9;
        let per_s = |now: u64, before: u64| now.saturating_sub(before) as f64 / length_s.max(1e-9);
        phases.push(PhaseOutcome {
            name: phase.name.clone(),
            started_s: zero_ns(start.t_ns) as f64 / 1e9,
            ended_s: zero_ns(end.t_ns) as f64 / 1e9,
            drained,
            rate_per_s: phase.rate_per_s,
            slots: phase.slots,
            publish_rate: per_s(end.enqueued, start.enqueued),
            consume_rate: per_s(end.stats.acked, start.stats.acked),
            backlog_client_max: backlog_max.max(end.backlog()),
            end_check,
            busy_slots_mean: 0.0,
        });
    }

    // Stop sending, let the last sends land, stop the workers.
    recorder.stopping.store(true, Ordering::Release);
    stop_sampling.store(true, Ordering::Release);
    let finish_sends = async {
        for collector in collectors {
            let _ = collector.await;
        }
        for producer in &producers {
            producer.close().await;
        }
    };
    tokio::time::timeout(FINISH_TIMEOUT, finish_sends)
        .await
        .map_err(|_| LoadError::Finish("producers", FINISH_TIMEOUT))?;
    for pacer in pacers {
        // The pacer saw `stopping` or its channel closed with its collector.
        let _ = tokio::task::spawn_blocking(move || pacer.join()).await;
    }
    let mut series = match sampling.await {
        Ok(result) => result?,
        Err(_) => Vec::new(),
    };
    let duration_s = zero_ns(recorder.now_ns()) as f64 / 1e9;
    live.progress.finish_and_clear();
    // The sampler, the only other owner, has ended.
    let live = Arc::try_unwrap(live).map_err(|_| LoadError::Finish("sampler", FINISH_TIMEOUT))?;
    let workers = live.workers.into_inner();
    let stats = tokio::time::timeout(FINISH_TIMEOUT, workers.finish())
        .await
        .map_err(|_| LoadError::Finish("consumers", FINISH_TIMEOUT))?;
    let broker_final = describe(&admin, &queues).await?;
    if created && !spoold_started {
        for queue in &queues {
            admin.delete_queue(queue).await?;
        }
    }

    // Samples on the run's clock; busy slots per phase.
    for sample in &mut series {
        sample.t_s = zero_ns((sample.t_s * 1e9) as u64) as f64 / 1e9;
    }
    for phase in &mut phases {
        let busy: Vec<f64> = series
            .iter()
            .filter(|sample| sample.t_s > phase.started_s && sample.t_s <= phase.ended_s)
            .map(|sample| sample.busy_slots as f64)
            .collect();
        phase.busy_slots_mean =
            if busy.is_empty() { 0.0 } else { busy.iter().sum::<f64>() / busy.len() as f64 };
    }
    let claim_to_ack_mean_ms = {
        let with_acks: Vec<&Sample> =
            series.iter().filter(|sample| sample.consume_rate > 0.0).collect();
        let held: f64 = with_acks.iter().map(|sample| sample.held_slots as f64).sum();
        let rate: f64 = with_acks.iter().map(|sample| sample.consume_rate).sum();
        if rate > 0.0 {
            held / rate * 1000.0
        } else {
            0.0
        }
    };
    let mut errors = recorder.errors.lock().unwrap_or_else(PoisonError::into_inner).clone();
    for (name, count) in [
        ("consumer.claim_failed", stats.claim_failed),
        ("consumer.settle_failed", stats.settle_failed),
        ("consumer.extend_failed", stats.extend_failed),
    ] {
        if count > 0 {
            errors.insert(name.to_owned(), count);
        }
    }
    let histograms = recorder.histograms();
    Ok(LoadOutcome {
        duration_s,
        phases,
        series,
        submitted: recorder.submitted.load(Ordering::Acquire),
        enqueued: recorder.enqueued.load(Ordering::Acquire),
        claimed: stats.claimed,
        acked: stats.acked,
        released: stats.released,
        redelivered: recorder.redelivered.load(Ordering::Acquire),
        extend_failed: stats.extend_failed,
        claim_requests: stats.claim_requests,
        ack_requests: stats.ack_requests,
        publish_latency_ms: histograms.publish.summary().into(),
        e2e_latency_ms: histograms.e2e.summary().into(),
        service_ms: histograms.service.summary().into(),
        claim_to_ack_mean_ms,
        broker_final,
        errors,
        addr: addr.to_owned(),
        spoold_started,
        shards,
        queues,
        queues_created: created,
        partitions,
    })
}

/// The OpenMessaging Benchmark's result fields (its names, its units: ms
/// and msgs/s), aggregated over the whole run.
#[derive(Clone, Debug, Serialize)]
#[allow(non_snake_case)]
pub struct OmbResult {
    /// Confirmed sends ÷ run length.
    pub publishRate: f64,
    /// Confirmed acks ÷ run length.
    pub consumeRate: f64,
    /// Client backlog (enqueued − acked) at the last sample.
    pub backlog: i64,
    pub publishLatency50pct: f64,
    pub publishLatency99pct: f64,
    pub publishLatency999pct: f64,
    pub publishLatencyMax: f64,
    pub endToEndLatency50pct: f64,
    pub endToEndLatency99pct: f64,
    pub endToEndLatency999pct: f64,
    pub endToEndLatencyMax: f64,
}

/// The queue-specific figures every report carries.
#[derive(Clone, Debug, Serialize)]
pub struct QueueResult {
    /// Mean delivery → ack confirmed (Little's law over held slots).
    pub claim_to_ack_mean_ms: f64,
    /// The handlers' measured service times.
    pub service_ms: PercentilesMs,
    /// Deliveries with attempt > 1 seen by the handlers.
    pub redeliveries: u64,
    /// Broker: leases that ran out unacked (each makes a redelivery).
    pub lease_expiries: u64,
    /// Broker: deliveries given back with Release (shutdown releases count).
    pub released: u64,
    pub extend_failed: u64,
    /// Requests the consumers sent.
    pub claim_requests: u64,
    pub ack_requests: u64,
    /// Broker counts after the run.
    pub broker_final: BrokerCounts,
}

impl LoadOutcome {
    pub fn omb(&self) -> OmbResult {
        let per_s = |count: u64| count as f64 / self.duration_s.max(1e-9);
        OmbResult {
            publishRate: per_s(self.enqueued),
            consumeRate: per_s(self.acked),
            backlog: self.series.last().map_or(0, |sample| sample.backlog_client),
            publishLatency50pct: self.publish_latency_ms.p50,
            publishLatency99pct: self.publish_latency_ms.p99,
            publishLatency999pct: self.publish_latency_ms.p999,
            publishLatencyMax: self.publish_latency_ms.max,
            endToEndLatency50pct: self.e2e_latency_ms.p50,
            endToEndLatency99pct: self.e2e_latency_ms.p99,
            endToEndLatency999pct: self.e2e_latency_ms.p999,
            endToEndLatencyMax: self.e2e_latency_ms.max,
        }
    }

    pub fn queue(&self) -> QueueResult {
        QueueResult {
            claim_to_ack_mean_ms: self.claim_to_ack_mean_ms,
            service_ms: self.service_ms,
            redeliveries: self.redelivered,
            lease_expiries: self.broker_final.lease_expired,
            released: self.broker_final.released,
            extend_failed: self.extend_failed,
            claim_requests: self.claim_requests,
            ack_requests: self.ack_requests,
            broker_final: self.broker_final,
        }
    }

    /// Every error of the run, summed.
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
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
            },
            label: "test",
            queue: None,
            queues: 1,
            partitions: None,
            queue_max_messages: 1_000_000,
            queue_max_bytes: 1 << 30,
            dedupe_window_ms: 60_000,
            msg_bytes: 64,
            producers_per_queue: 1,
            consumers_per_queue: 1,
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
            ("prefetch_fraction", |c| c.prefetch_fraction = 1.5),
            ("claims_in_flight", |c| c.claims_in_flight = 0),
            ("ack_linger_us", |c| c.ack_linger_us = LINGER_US_MAX + 1),
            ("service_cv", |c| c.service.cv = -1.0),
            ("phases", |c| c.phases.clear()),
            ("only.seconds", |c| c.phases[0].seconds = 0.0),
            ("only.rate", |c| c.phases[0].rate_per_s = f64::NAN),
            ("only.slots", |c| c.phases[0].slots = 0),
            ("window", |c| c.window = 0),
            ("client_threads", |c| c.client_threads = 0),
        ];
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
