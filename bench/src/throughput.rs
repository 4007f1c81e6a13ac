//! `throughput`: the whole broker over the real client — producers enqueue,
//! consumers claim and ack — measured end to end.
//!
//! What it owns: an optional `spoold` child process (started on a temporary
//! data dir and free ports, stopped with SIGTERM, its dir removed), one
//! tokio multi-thread runtime with a few workers for every client, the
//! benchmark queue (created unless it exists; deleted afterwards only if this
//! run created it on a broker it did not start), and the counters and
//! histograms of the run. What it does not do: touch broker internals (it
//! speaks only the protocol, through `spool-client`), judge results, or pin
//! anything (the broker pins its shards; the client threads float).
//!
//! Producers run closed-loop (as fast as a bounded window of sends in flight
//! allows) or, with a rate, open-loop: a pacing thread per producer gives
//! every message an intended send time on a fixed schedule and latency is
//! measured from that intended time, so a stalled broker shows up as latency
//! instead of as fewer samples (no coordinated omission). Every payload starts
//! with the nanosecond send (or intended) time on a monotonic clock shared by
//! the process, so consumers measure end-to-end latency at ns precision
//! rather than from the record's millisecond `enqueue_time_ms`.
//!
//! A sample counts when it completes inside the measured window (after the
//! warm-up), whenever it started; error counts cover the whole run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use spool_broker::clock::{instant_now, Instant};
use spool_broker::control::config::SPIN_BEFORE_PARK_US_MAX;
use spool_client::limits::{
    CLAIMS_IN_FLIGHT_MAX, CONSUMER_ACKS_PENDING_DEFAULT, CONSUMER_ACKS_PENDING_MAX,
    CONSUMER_SLOTS_MAX, PRODUCER_PENDING_MESSAGES_MAX,
};
use spool_client::spool_wire::proto::limits::PARTITIONS_MAX;
use spool_client::spool_wire::proto::{MetadataRequest, Request};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    default_queue_config, Admin, Client, ClientConfig, ClientError, Connection, Consumer,
    ConsumerConfig, ConsumerStats, Delivery, Message, Producer, ProducerConfig,
};
use spool_wire::limits::{BATCH_BYTES_MAX, PAYLOAD_INLINE_BYTES_MAX};
use thiserror::Error;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::harness::{
    add_consumer_errors, client_runtime, default_shards, error_name, Broker, HarnessError,
};
use crate::histogram::{Latency, LatencySummary};
use crate::sends::{
    self, payload, track, window_slot, Pending, Sent, SUBMIT_ERROR_PAUSE, TIMESTAMP_BYTES,
};

pub const PRODUCERS_MAX: u32 = 256;
pub const CONSUMERS_MAX: u32 = 256;
/// Sends in flight per producer: the client refuses more pending messages.
pub const WINDOW_MAX: u32 = PRODUCER_PENDING_MESSAGES_MAX as u32;
/// Highest `--rate` (msgs/s over all producers).
pub const RATE_MAX: u64 = 10_000_000;
pub const SECONDS_MAX: u64 = 3_600;
pub const WARMUP_MS_MAX: u64 = 600_000;
pub const CLIENT_THREADS_MAX: u64 = 64;
pub const LINGER_US_MAX: u64 = 1_000_000;
/// Sequential Metadata requests timed for `metadata_rtt_us`.
pub const METADATA_REQUESTS: u32 = 1_000;
/// How long sends and handlers still in flight after the window may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Consumers' long-poll wait: short, so shutdown does not wait long for an
/// idle claim.
const CLAIM_WAIT_MS: u32 = 100;
const BYTES_PER_MB: f64 = 1_000_000.0;

/// Why a throughput run produced no report.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ThroughputError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("cannot build the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot spawn a pacing thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("histogram: {0}")]
    Histogram(String),
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("{0} did not finish within {1:?} after the window")]
    Drain(&'static str, Duration),
}

/// What to run: where the broker and the queue are, and the load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThroughputConfig {
    /// Broker to use; `None` starts a `spoold`.
    pub addr: Option<String>,
    /// Parent of a started spoold's temporary data directory.
    pub dir: PathBuf,
    /// The `spoold` binary; `None` = `spoold` next to this executable.
    pub spoold: Option<PathBuf>,
    /// Broker shards (started spoold's `--cores`; sizes the default
    /// partition count). `None` = the CPUs this process may use.
    pub shards: Option<u16>,
    /// Queue name; `None` = `bench-<pid>`.
    pub queue: Option<String>,
    /// Partitions of a created queue; `None` = shards × 2.
    pub partitions: Option<u32>,
    pub load: ThroughputLoad,
    /// Credentials and TLS of every client connection.
    pub security: crate::security::ClientSecurity,
}

/// The load of a run: sizes, counts, rates and client settings. One
/// definition for the subcommand's flags (with their defaults) and the
/// report's echo of them ([`ConfigEcho`] flattens it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, clap::Args)]
pub struct ThroughputLoad {
    /// Payload bytes per message (the first 8 carry the send time).
    #[arg(long, default_value_t = 1024)]
    pub msg_bytes: u64,
    /// Producers; 0 only drains what an earlier run left in `--queue`.
    #[arg(long, default_value_t = 2)]
    pub producers: u64,
    #[arg(long, default_value_t = 2)]
    pub consumers: u64,
    /// Execution slots (claim credits) per consumer.
    #[arg(long, default_value_t = 256)]
    pub slots: u64,
    /// Sends in flight per producer.
    #[arg(long, default_value_t = 8192)]
    pub window: u64,
    /// Open loop: total msgs/s on a fixed schedule, latency from the intended send time.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Producer linger in µs (0: send at once, batch while a partition's
    /// batches are in flight).
    #[arg(long, default_value_t = 0)]
    pub linger_us: u64,
    /// Producer batch target in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    pub batch_bytes: u64,
    /// Length of the measured window.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Warm-up before the window (not measured).
    #[arg(long, default_value_t = 2000)]
    pub warmup_ms: u64,
    /// tokio worker threads for all clients.
    #[arg(long, default_value_t = 2)]
    pub client_threads: u64,
    /// Claims each consumer keeps outstanding.
    #[arg(long, default_value_t = 4)]
    pub claims_in_flight: u64,
    /// How long a finished delivery waits for others to share its Ack (µs).
    #[arg(long, default_value_t = 1000)]
    pub ack_linger_us: u64,
    /// Finished deliveries per consumer whose Ack is not answered yet
    /// (`ConsumerConfig::acks_pending_max`); the client's default unless
    /// set; 0 = the same as `--slots` (how runs before 2026-12-03 measured:
    /// a slot then stayed held for its Ack's round trip).
    #[arg(long, default_value_t = u64::from(CONSUMER_ACKS_PENDING_DEFAULT))]
    pub acks_pending: u64,
    /// A started spoold's --spin-before-park-us (0 = park at once).
    #[arg(long, default_value_t = 0)]
    pub spin_before_park_us: u64,
}

/// Enqueue side of the report.
#[derive(Clone, Debug, Serialize)]
pub struct EnqueueReport {
    /// Sends that became durable inside the window ÷ window length.
    pub msgs_per_s: f64,
    /// Payload bytes of those sends per second (1 MB = 10^6 B).
    pub mb_per_s: f64,
    pub count: u64,
    /// Send (or intended send) → durable offset.
    pub latency_us: LatencySummary,
}

/// Consumer side of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ClaimAckReport {
    /// Acks the broker confirmed inside the window ÷ window length.
    pub msgs_per_s: f64,
    pub acked: u64,
    pub claimed: u64,
    /// Deliveries given back over the whole run; only a claim that was in
    /// flight at shutdown should land here (released with the shutdown reason).
    pub released_total: u64,
    /// Claim and Ack requests the consumers sent inside the window: with
    /// `acked`, how many deliveries one request carried.
    pub claim_requests: u64,
    pub ack_requests: u64,
    /// Ack request sent → broker's answer (durable), one sample per request
    /// answered inside the window.
    pub ack_rtt_us: LatencySummary,
    /// Claim request sent → broker's answer, one sample per claim answered
    /// inside the window (empty answers included).
    pub claim_rtt_us: LatencySummary,
    /// Credits the claims answered inside the window asked for, and the
    /// deliveries they brought: how full a claim came back.
    pub claim_credits_asked: u64,
    pub claim_deliveries: u64,
}

/// Send (or intended send) → handler start.
#[derive(Clone, Debug, Serialize)]
pub struct E2eReport {
    pub latency_us: LatencySummary,
}

/// The configuration as run (defaults resolved).
#[derive(Clone, Debug, Serialize)]
pub struct ConfigEcho {
    pub addr: String,
    pub spoold_started: bool,
    pub shards: u16,
    pub queue: String,
    pub queue_created: bool,
    pub partitions: u32,
    #[serde(flatten)]
    pub load: ThroughputLoad,
    /// Connections spoke TLS.
    pub tls: bool,
    /// Connections authenticated with a secret.
    pub authenticated: bool,
}

/// One run's result, printed as one JSON object.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputReport {
    pub enqueue: EnqueueReport,
    pub claim_ack: ClaimAckReport,
    pub e2e: E2eReport,
    /// [`METADATA_REQUESTS`] sequential Metadata round trips on one idle
    /// connection before the load: the per-request floor (no disk).
    pub metadata_rtt_us: LatencySummary,
    /// Failures over the whole run: `enqueue.<CODE>`,
    /// `consumer.{claim,settle,extend}_failed`, `e2e.bad_payload`.
    pub errors: BTreeMap<String, u64>,
    pub measured_s: f64,
    pub config: ConfigEcho,
}

impl ThroughputConfig {
    fn validate(&self) -> Result<(), ThroughputError> {
        let check = |field, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(ThroughputError::OutOfRange { field, value, min, max })
            }
        };
        check(
            "msg_bytes",
            self.load.msg_bytes,
            TIMESTAMP_BYTES as u64,
            PAYLOAD_INLINE_BYTES_MAX as u64,
        )?;
        check("producers", self.load.producers, 0, PRODUCERS_MAX.into())?;
        check("consumers", self.load.consumers, 0, CONSUMERS_MAX.into())?;
        // No producers drains a backlog an earlier run left in `--queue`.
        check("producers + consumers", self.load.producers + self.load.consumers, 1, u64::MAX)?;
        check("slots", self.load.slots, 1, CONSUMER_SLOTS_MAX.into())?;
        check("window", self.load.window, 1, WINDOW_MAX.into())?;
        if let Some(rate) = self.load.rate {
            check("producers (with --rate)", self.load.producers, 1, PRODUCERS_MAX.into())?;
            check("rate", rate, self.load.producers, RATE_MAX)?;
        }
        if let Some(partitions) = self.partitions {
            check("partitions", partitions.into(), 1, PARTITIONS_MAX.into())?;
        }
        if let Some(shards) = self.shards {
            check("shards", shards.into(), 1, u16::MAX.into())?;
        }
        check("linger_us", self.load.linger_us, 0, LINGER_US_MAX)?;
        check("batch_bytes", self.load.batch_bytes, 1, BATCH_BYTES_MAX as u64)?;
        check("seconds", self.load.seconds, 1, SECONDS_MAX)?;
        check("warmup_ms", self.load.warmup_ms, 0, WARMUP_MS_MAX)?;
        check("client_threads", self.load.client_threads, 1, CLIENT_THREADS_MAX)?;
        check("claims_in_flight", self.load.claims_in_flight, 1, CLAIMS_IN_FLIGHT_MAX.into())?;
        check("ack_linger_us", self.load.ack_linger_us, 0, LINGER_US_MAX)?;
        check("acks_pending", self.load.acks_pending, 0, CONSUMER_ACKS_PENDING_MAX.into())?;
        check("spin_before_park_us", self.load.spin_before_park_us, 0, SPIN_BEFORE_PARK_US_MAX)
    }
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A bad config, a spoold that does not start or stop, a broker that
/// refuses the queue, or sends still outstanding [`DRAIN_TIMEOUT`] after the
/// window.
pub fn run(config: &ThroughputConfig) -> Result<ThroughputReport, ThroughputError> {
    config.validate()?;
    tune_malloc();
    let shards = config.shards.unwrap_or_else(default_shards);
    let broker = Broker::start_or_connect(
        config.addr.as_deref(),
        config.spoold.as_deref(),
        &config.dir,
        shards,
        "tput",
        config.load.spin_before_park_us,
    )?;
    let runtime = client_runtime(config.load.client_threads).map_err(ThroughputError::Runtime)?;
    let handle = runtime.handle().clone();
    let run = Run { config, addr: broker.addr(), shards, spoold_started: broker.started(), handle };
    let result = runtime.block_on(run.drive());
    runtime.shutdown_timeout(Duration::from_secs(5));
    let stopped = broker.stop();
    let report = result?;
    stopped?;
    Ok(report)
}

/// The same glibc malloc setting `spoold` makes (see its `tune_malloc`):
/// without it, freeing each batch-sized buffer returns the memory to the
/// kernel and the next one faults it back in, on the client side too.
fn tune_malloc() {
    const TRIM_THRESHOLD_BYTES: i32 = 256 << 20;
    const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
    // SAFETY: mallopt only changes allocator parameters; called before the
    // client threads start. A refusal leaves the defaults.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// Counters and histograms shared by every producer and consumer.
struct Recorder {
    /// Zero of the payload timestamps.
    base: Instant,
    /// Whether deliveries carry this process's send times (it has
    /// producers); a backlog another run left gives no end-to-end samples.
    timed: bool,
    /// Samples count only while set (the window).
    measuring: AtomicBool,
    /// Producers stop submitting once set.
    stopping: AtomicBool,
    enqueued: AtomicU64,
    enqueue_latency: Mutex<Latency>,
    e2e_latency: Mutex<Latency>,
    ack_rtt: Mutex<Latency>,
    claim_rtt: Mutex<Latency>,
    claim_credits_asked: AtomicU64,
    claim_deliveries: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Recorder {
    fn new(timed: bool) -> Result<Self, ThroughputError> {
        let latency =
            || Latency::new().map_err(|error| ThroughputError::Histogram(error.to_string()));
        Ok(Self {
            base: instant_now(),
            timed,
            measuring: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            enqueued: AtomicU64::new(0),
            enqueue_latency: Mutex::new(latency()?),
            e2e_latency: Mutex::new(latency()?),
            ack_rtt: Mutex::new(latency()?),
            claim_rtt: Mutex::new(latency()?),
            claim_credits_asked: AtomicU64::new(0),
            claim_deliveries: AtomicU64::new(0),
            errors: Mutex::new(BTreeMap::new()),
        })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(instant_now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn count_error(&self, name: String) {
        *self.errors.lock().unwrap_or_else(PoisonError::into_inner).entry(name).or_insert(0) += 1;
    }

    /// One send resolved; `start_ns` is its send (or intended) time.
    fn sent(&self, (start_ns, result): Sent) {
        match result {
            Ok(_) => {
                if self.measuring.load(Ordering::Acquire) {
                    let latency_ns = self.now_ns().saturating_sub(start_ns);
                    self.enqueued.fetch_add(1, Ordering::Relaxed);
                    self.enqueue_latency
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record_ns(latency_ns);
                }
            }
            Err(error) => self.count_error(format!("enqueue.{}", error_name(&error))),
        }
    }

    /// An Ack request was answered after `rtt`.
    fn ack_answered(&self, rtt: Duration) {
        if self.measuring.load(Ordering::Acquire) {
            let rtt_ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
            self.ack_rtt.lock().unwrap_or_else(PoisonError::into_inner).record_ns(rtt_ns);
        }
    }

    /// A Claim request asking for `credits` was answered after `rtt` with
    /// `received` deliveries.
    fn claim_answered(&self, rtt: Duration, credits: u32, received: usize) {
        if self.measuring.load(Ordering::Acquire) {
            let rtt_ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
            self.claim_rtt.lock().unwrap_or_else(PoisonError::into_inner).record_ns(rtt_ns);
            self.claim_credits_asked.fetch_add(u64::from(credits), Ordering::Relaxed);
            self.claim_deliveries.fetch_add(received as u64, Ordering::Relaxed);
        }
    }

    /// A handler started on `delivery`.
    fn delivered(&self, delivery: &Delivery) {
        if !self.timed {
            return;
        }
        match sends::sent_ns(delivery) {
            Some(sent_ns) => {
                if self.measuring.load(Ordering::Acquire) {
                    let latency_ns = self.now_ns().saturating_sub(sent_ns);
                    self.e2e_latency
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record_ns(latency_ns);
                }
            }
            None => self.count_error("e2e.bad_payload".to_owned()),
        }
    }
}

/// Closed loop: keep `window` sends in flight as long as not stopping.
async fn closed_loop(
    producer: Producer,
    queue: String,
    recorder: Arc<Recorder>,
    window: Arc<Semaphore>,
    msg_bytes: usize,
) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        if recorder.stopping() && in_flight.is_empty() {
            break;
        }
        let permit = if recorder.stopping() {
            None
        } else {
            tokio::select! {
                biased;
                Some((start_ns, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    recorder.sent((start_ns, result));
                    continue;
                }
                permit = Arc::clone(&window).acquire_owned() => permit.ok(),
            }
        };
        let Some(permit) = permit else {
            if let Some(resolved) = in_flight.next().await {
                recorder.sent(resolved);
            }
            continue;
        };
        let start_ns = recorder.now_ns();
        match producer.submit(&queue, Message::new(payload(start_ns, msg_bytes))).await {
            Ok(send) => in_flight.push(track(start_ns, send, permit)),
            Err(error) => {
                recorder.count_error(format!("enqueue.{}", error_name(&error)));
                tokio::time::sleep(SUBMIT_ERROR_PAUSE).await;
            }
        }
    }
}

/// Open loop, pacing side (its own OS thread, so sends leave on schedule at
/// sub-millisecond precision; tokio's timer ticks in whole milliseconds):
/// message `i` is due at `start + i × interval`; it is submitted at or after
/// that time, and its latency counts from it.
struct Pacer {
    handle: Handle,
    producer: Producer,
    queue: String,
    recorder: Arc<Recorder>,
    /// Sends in flight; a pacer waiting here falls behind its schedule, and
    /// the delay counts as latency.
    permits: Arc<Semaphore>,
    interval_ns: u64,
    msg_bytes: usize,
    sends: mpsc::Sender<Pending>,
}

impl Pacer {
    fn run(self) {
        let Self { handle, producer, queue, recorder, permits, interval_ns, msg_bytes, sends } =
            self;
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack
        // (default 50 µs) so its sleeps end close to the schedule.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut due_ns = recorder.now_ns();
        while !recorder.stopping() {
            let now_ns = recorder.now_ns();
            if due_ns > now_ns {
                std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
            }
            let Some(permit) = window_slot(&handle, &permits, || recorder.stopping()) else {
                break;
            };
            let message = Message::new(payload(due_ns, msg_bytes));
            match handle.block_on(producer.submit(&queue, message)) {
                Ok(send) => {
                    if sends.blocking_send((due_ns, send, permit)).is_err() {
                        break;
                    }
                }
                Err(error) => recorder.count_error(format!("enqueue.{}", error_name(&error))),
            }
            due_ns += interval_ns;
        }
    }
}

/// One run against a broker at `addr`.
struct Run<'a> {
    config: &'a ThroughputConfig,
    addr: &'a str,
    shards: u16,
    spoold_started: bool,
    handle: Handle,
}

fn sum_stats(consumers: &[Consumer]) -> ConsumerStats {
    consumers.iter().map(Consumer::stats).fold(ConsumerStats::default(), ConsumerStats::merged)
}

impl Run<'_> {
    /// The client settings: defaults, with the run's credentials and TLS.
    fn client_config(&self) -> Result<ClientConfig, ThroughputError> {
        Ok(self.config.security.apply(ClientConfig::default())?)
    }

    async fn connect(&self) -> Result<Client, ThroughputError> {
        Ok(Client::connect_with(self.addr, self.client_config()?).await?)
    }

    async fn drive(self) -> Result<ThroughputReport, ThroughputError> {
        let config = self.config;
        let msg_bytes = usize::try_from(config.load.msg_bytes).unwrap_or(TIMESTAMP_BYTES);
        let queue = config.queue.clone().unwrap_or_else(|| format!("bench-{}", std::process::id()));
        let admin = Admin::new(self.connect().await?);
        let wanted = config.partitions.unwrap_or(u32::from(self.shards) * 2).min(PARTITIONS_MAX);
        let created = match admin.create_queue(&queue, default_queue_config(wanted)).await {
            Ok(_) => true,
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => false,
            Err(error) => return Err(error.into()),
        };
        let partitions =
            u32::try_from(admin.client().partitions(&queue).await?.len()).unwrap_or(u32::MAX);
        let metadata_rtt_us = self.metadata_rtt(&queue).await?;

        let recorder = Arc::new(Recorder::new(config.load.producers > 0)?);
        let mut consumers = Vec::new();
        for _ in 0..config.load.consumers {
            let client = self.connect().await?;
            let mut consumer_config =
                ConsumerConfig::new(queue.clone(), u32::try_from(config.load.slots).unwrap_or(1));
            consumer_config.wait_ms = CLAIM_WAIT_MS;
            consumer_config.claims_in_flight =
                u32::try_from(config.load.claims_in_flight).unwrap_or(1);
            consumer_config.ack_linger = Duration::from_micros(config.load.ack_linger_us);
            // Deliveries awaiting their Ack are bounded (the client's
            // default, 4,096, unless set): at most slots + that many per
            // consumer straddle the window's start (claimed before it,
            // acked inside it), as many as straddle its end the other way.
            consumer_config.acks_pending_max = match config.load.acks_pending {
                0 => consumer_config.slots,
                n => u32::try_from(n).unwrap_or(u32::MAX),
            };
            let observed = Arc::clone(&recorder);
            consumer_config.ack_observer =
                Some(Arc::new(move |rtt: Duration, _tokens: usize| observed.ack_answered(rtt)));
            let observed = Arc::clone(&recorder);
            consumer_config.claim_observer =
                Some(Arc::new(move |rtt: Duration, credits: u32, received: usize| {
                    observed.claim_answered(rtt, credits, received);
                }));
            let recorder = Arc::clone(&recorder);
            let consumer = Consumer::start(client, consumer_config, move |delivery: Delivery| {
                recorder.delivered(&delivery);
                async { Ok::<(), std::convert::Infallible>(()) }
            })?;
            consumers.push(consumer);
        }

        let producer_config = ProducerConfig {
            linger: Duration::from_micros(config.load.linger_us),
            max_batch_bytes: usize::try_from(config.load.batch_bytes).unwrap_or(BATCH_BYTES_MAX),
            ..ProducerConfig::default()
        };
        let window = usize::try_from(config.load.window).unwrap_or(1);
        let mut producers = Vec::new();
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        let mut pacers = Vec::new();
        for index in 0..config.load.producers {
            let producer = Producer::new(self.connect().await?, producer_config.clone())?;
            producers.push(producer.clone());
            let permits = Arc::new(Semaphore::new(window));
            let recorder = Arc::clone(&recorder);
            let queue = queue.clone();
            match config.load.rate {
                None => {
                    tasks.push(tokio::spawn(closed_loop(
                        producer, queue, recorder, permits, msg_bytes,
                    )));
                }
                Some(rate) => {
                    // Spread the rate: the first `rate % producers` get one more per second.
                    let share = rate / config.load.producers
                        + u64::from(index < rate % config.load.producers);
                    let interval_ns = 1_000_000_000 / share.max(1);
                    let (sender, receiver) = mpsc::channel(window);
                    let collector = Arc::clone(&recorder);
                    tasks.push(tokio::spawn(sends::collect(receiver, move |sent| {
                        collector.sent(sent);
                    })));
                    let handle = self.handle.clone();
                    let pacer = std::thread::Builder::new()
                        .name(format!("bench-pacer-{index}"))
                        .spawn(move || {
                            Pacer {
                                handle,
                                producer,
                                queue,
                                recorder,
                                permits,
                                interval_ns,
                                msg_bytes,
                                sends: sender,
                            }
                            .run();
                        })
                        .map_err(ThroughputError::Thread)?;
                    pacers.push(pacer);
                }
            }
        }

        tokio::time::sleep(Duration::from_millis(config.load.warmup_ms)).await;
        let start_stats = sum_stats(&consumers);
        recorder.measuring.store(true, Ordering::Release);
        let window_start = instant_now();
        tokio::time::sleep(Duration::from_secs(config.load.seconds)).await;
        recorder.measuring.store(false, Ordering::Release);
        let measured_s = instant_now().duration_since(window_start).as_secs_f64();
        let end_stats = sum_stats(&consumers);

        recorder.stopping.store(true, Ordering::Release);
        sends::finish(tasks, &producers, pacers, DRAIN_TIMEOUT)
            .await
            .map_err(|_| ThroughputError::Drain("producers", DRAIN_TIMEOUT))?;
        let mut final_stats = ConsumerStats::default();
        for consumer in consumers {
            let stats = tokio::time::timeout(DRAIN_TIMEOUT, consumer.shutdown())
                .await
                .map_err(|_| ThroughputError::Drain("consumers", DRAIN_TIMEOUT))?;
            final_stats = final_stats.merged(stats);
        }
        if created && !self.spoold_started {
            admin.delete_queue(&queue).await?;
        }

        let mut errors = recorder.errors.lock().unwrap_or_else(PoisonError::into_inner).clone();
        add_consumer_errors(&mut errors, &final_stats);
        let enqueued = recorder.enqueued.load(Ordering::Acquire);
        let acked = end_stats.acked - start_stats.acked;
        let per_s = |count: u64| count as f64 / measured_s;
        let enqueue_latency =
            recorder.enqueue_latency.lock().unwrap_or_else(PoisonError::into_inner).summary();
        let e2e_latency =
            recorder.e2e_latency.lock().unwrap_or_else(PoisonError::into_inner).summary();
        let ack_rtt = recorder.ack_rtt.lock().unwrap_or_else(PoisonError::into_inner).summary();
        let claim_rtt = recorder.claim_rtt.lock().unwrap_or_else(PoisonError::into_inner).summary();
        Ok(ThroughputReport {
            enqueue: EnqueueReport {
                msgs_per_s: per_s(enqueued),
                mb_per_s: per_s(enqueued) * config.load.msg_bytes as f64 / BYTES_PER_MB,
                count: enqueued,
                latency_us: enqueue_latency,
            },
            claim_ack: ClaimAckReport {
                msgs_per_s: per_s(acked),
                acked,
                claimed: end_stats.claimed - start_stats.claimed,
                released_total: final_stats.released,
                claim_requests: end_stats.claim_requests - start_stats.claim_requests,
                ack_requests: end_stats.ack_requests - start_stats.ack_requests,
                ack_rtt_us: ack_rtt,
                claim_rtt_us: claim_rtt,
                claim_credits_asked: recorder.claim_credits_asked.load(Ordering::Acquire),
                claim_deliveries: recorder.claim_deliveries.load(Ordering::Acquire),
            },
            e2e: E2eReport { latency_us: e2e_latency },
            metadata_rtt_us,
            errors,
            measured_s,
            config: ConfigEcho {
                addr: self.addr.to_owned(),
                spoold_started: self.spoold_started,
                shards: self.shards,
                queue,
                queue_created: created,
                partitions,
                load: config.load.clone(),
                tls: config.security.tls(),
                authenticated: config.security.authenticates(),
            },
        })
    }

    /// [`METADATA_REQUESTS`] Metadata round trips, one at a time, on a
    /// fresh connection.
    async fn metadata_rtt(&self, queue: &str) -> Result<LatencySummary, ThroughputError> {
        let connection = Connection::connect(self.addr, self.client_config()?.connection).await?;
        let request = Request::Metadata(MetadataRequest { queues: vec![queue.to_owned()] });
        let mut latency =
            Latency::new().map_err(|error| ThroughputError::Histogram(error.to_string()))?;
        for _ in 0..METADATA_REQUESTS {
            let start = instant_now();
            connection.call(&request).await?;
            let elapsed_ns =
                u64::try_from(instant_now().duration_since(start).as_nanos()).unwrap_or(u64::MAX);
            latency.record_ns(elapsed_ns);
        }
        Ok(latency.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ThroughputConfig {
        ThroughputConfig {
            addr: Some("127.0.0.1:1".to_owned()),
            dir: PathBuf::from("/tmp"),
            spoold: None,
            shards: Some(1),
            queue: None,
            partitions: None,
            security: Default::default(),
            load: ThroughputLoad {
                msg_bytes: 1024,
                producers: 2,
                consumers: 2,
                slots: 256,
                window: 4096,
                rate: None,
                linger_us: 5000,
                batch_bytes: 256 * 1024,
                seconds: 1,
                warmup_ms: 0,
                client_threads: 2,
                claims_in_flight: 4,
                ack_linger_us: 1000,
                acks_pending: 0,
                spin_before_park_us: 0,
            },
        }
    }

    #[test]
    fn validate_rejects_each_out_of_range_field() {
        // Goal: every bounded knob is checked before anything starts; method: one bad field each.
        assert!(config().validate().is_ok());
        type Mutate = fn(&mut ThroughputConfig);
        let cases: Vec<(&str, Mutate)> = vec![
            ("msg_bytes", |c| c.load.msg_bytes = 7),
            ("producers", |c| c.load.producers = u64::from(PRODUCERS_MAX) + 1),
            ("producers + consumers", |c| {
                c.load.producers = 0;
                c.load.consumers = 0;
            }),
            ("producers (with --rate)", |c| {
                c.load.producers = 0;
                c.load.rate = Some(5_000);
            }),
            ("slots", |c| c.load.slots = u64::from(CONSUMER_SLOTS_MAX) + 1),
            ("window", |c| c.load.window = 0),
            ("rate", |c| c.load.rate = Some(1)),
            ("partitions", |c| c.partitions = Some(0)),
            ("seconds", |c| c.load.seconds = 0),
            ("client_threads", |c| c.load.client_threads = 0),
            ("claims_in_flight", |c| c.load.claims_in_flight = 0),
            ("ack_linger_us", |c| c.load.ack_linger_us = LINGER_US_MAX + 1),
            ("spin_before_park_us", |c| c.load.spin_before_park_us = SPIN_BEFORE_PARK_US_MAX + 1),
        ];
        for (field, mutate) in cases {
            let mut bad = config();
            mutate(&mut bad);
            match bad.validate() {
                Err(ThroughputError::OutOfRange { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: expected OutOfRange, got {other:?}"),
            }
        }
    }

    #[test]
    fn config_echo_is_one_flat_object_with_its_keys_in_order() {
        // Goal: the report's `config` keeps the flat keys, in the order it
        // always printed them, now that the load settings are one struct
        // flattened into it; method: serialize an echo, find each key after
        // the one before.
        let echo = ConfigEcho {
            addr: "127.0.0.1:7400".to_owned(),
            spoold_started: true,
            shards: 1,
            queue: "bench-1".to_owned(),
            queue_created: true,
            partitions: 2,
            load: config().load,
            tls: false,
            authenticated: false,
        };
        let text = serde_json::to_string(&echo).unwrap();
        assert!(!text.contains("\"load\""), "{text}");
        let keys = [
            "addr",
            "spoold_started",
            "shards",
            "queue",
            "queue_created",
            "partitions",
            "msg_bytes",
            "producers",
            "consumers",
            "slots",
            "window",
            "rate",
            "linger_us",
            "batch_bytes",
            "seconds",
            "warmup_ms",
            "client_threads",
            "claims_in_flight",
            "ack_linger_us",
            "acks_pending",
            "spin_before_park_us",
            "tls",
            "authenticated",
        ];
        let mut from = 0;
        for key in keys {
            let quoted = format!("\"{key}\":");
            let at = text[from..].find(&quoted).unwrap_or_else(|| panic!("{key} in {text}"));
            from += at + quoted.len();
        }
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value.as_object().map(serde_json::Map::len), Some(keys.len()));
    }
}
