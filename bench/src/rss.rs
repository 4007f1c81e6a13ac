//! `rss`: the broker's resident memory against its backlog.
//!
//! What it owns: a `spoold` child it starts (so it can read the child's
//! `/proc/PID/status`), one queue on it, producers that enqueue up to each
//! target backlog in turn, and consumers that drain it all at the end. At
//! every step (idle after start, each backlog, right after the drain, and
//! again after a settle period) it samples the broker's `VmRSS`, `RssAnon`,
//! `RssFile` and peak `VmHWM`. What it does not do: pace (producers and
//! consumers run closed-loop, as fast as their windows allow) or look inside
//! the broker — the figures are what the kernel charges the process.
//!
//! Memory that scales with the backlog (queue state, dedupe ids) should show
//! as a slope; memory that does not (caches, allocator retention) as the
//! intercept and as what remains after the drain.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    default_queue_config, Admin, Client, ClientError, Consumer, ConsumerConfig, Delivery, Message,
    Producer, ProducerConfig,
};
use thiserror::Error;

use crate::harness::{default_shards, error_name, sibling_spoold, HarnessError, SpooldProcess};

/// How often the drain checks its progress.
const DRAIN_POLL: Duration = Duration::from_millis(100);
/// Consumers' long-poll wait (ms).
const CLAIM_WAIT_MS: u32 = 200;
/// Pause after a refused submit before the next one.
const SUBMIT_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What one run does.
#[derive(Debug, Clone)]
pub struct RssConfig {
    /// spoold binary [default: next to this executable].
    pub spoold: Option<PathBuf>,
    /// Parent of the broker's temporary data directory.
    pub dir: PathBuf,
    pub shards: Option<u16>,
    /// Partitions of the queue [default: shards × 2].
    pub partitions: Option<u32>,
    pub msg_bytes: u64,
    /// Backlogs to sample at, ascending (messages).
    pub steps: Vec<u64>,
    pub producers: u32,
    /// Sends in flight per producer.
    pub window: u64,
    pub linger_us: u64,
    pub batch_bytes: u64,
    pub consumers: u32,
    /// Execution slots per consumer.
    pub slots: u32,
    /// Dedupe window of the queue (ms): the broker keeps every message id
    /// enqueued within it.
    pub dedupe_window_ms: u64,
    /// Wait before each sample, so in-flight work settles (ms).
    pub settle_ms: u64,
    /// Wait after the drain before the last sample (ms): the allocator's
    /// time to give freed memory back.
    pub after_drain_ms: u64,
    /// Drain the backlog after the last step (false: stop after the last
    /// backlog sample, for a run that measures only the build-up).
    pub drain: bool,
    pub client_threads: u64,
}

/// One sample of the broker process.
#[derive(Debug, Clone, Serialize)]
pub struct RssSample {
    pub label: String,
    /// Messages enqueued and not yet acked.
    pub backlog: u64,
    /// Seconds since the broker was started.
    pub at_s: f64,
    pub rss_bytes: u64,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Peak RSS so far.
    pub hwm_bytes: u64,
    /// 1-minute load average of the machine.
    pub load_avg_1m: f64,
}

/// The report of one run.
#[derive(Debug, Serialize)]
pub struct RssReport {
    pub shards: u16,
    pub partitions: u32,
    pub msg_bytes: u64,
    pub dedupe_window_ms: u64,
    pub samples: Vec<RssSample>,
    pub enqueue_msgs_per_s: f64,
    pub drain_msgs_per_s: f64,
    /// Submits the broker refused (retried), by error name.
    pub enqueue_errors: u64,
}

/// Why a run produced no report.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RssError {
    #[error("{0}")]
    Harness(#[from] HarnessError),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("cannot read /proc/{pid}/status: {source}")]
    Proc {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
    #[error("steps must be ascending and non-zero: {0:?}")]
    Steps(Vec<u64>),
    #[error("the started spoold is not running")]
    NotRunning,
    #[error("the drain stopped at {acked} of {enqueued} acked")]
    Drain { acked: u64, enqueued: u64 },
}

/// `/proc/PID/status` figures in bytes: (VmRSS, RssAnon, RssFile, VmHWM).
fn proc_status(pid: u32) -> Result<(u64, u64, u64, u64), RssError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|source| RssError::Proc { pid, source })?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    Ok((field("VmRSS:"), field("RssAnon:"), field("RssFile:"), field("VmHWM:")))
}

fn load_avg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|first| first.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Runs the scenario: starts a spoold, builds each backlog, drains.
///
/// # Errors
/// [`RssError`] when the broker cannot be started, a client call fails, or
/// the drain does not finish.
pub fn run(config: &RssConfig) -> Result<RssReport, RssError> {
    if config.steps.is_empty()
        || config.steps[0] == 0
        || config.steps.windows(2).any(|pair| pair[0] >= pair[1])
    {
        return Err(RssError::Steps(config.steps.clone()));
    }
    let binary = match &config.spoold {
        Some(path) => path.clone(),
        None => sibling_spoold()?,
    };
    let shards = config.shards.unwrap_or_else(default_shards);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::try_from(config.client_threads).unwrap_or(1).max(1))
        .enable_all()
        .build()
        .map_err(RssError::Runtime)?;
    let spoold = SpooldProcess::start(&binary, &config.dir, shards, "rss", 0)?;
    let result = runtime.block_on(drive(config, &spoold, shards));
    let stopped = spoold.stop();
    let report = result?;
    stopped?;
    Ok(report)
}

async fn drive(
    config: &RssConfig,
    spoold: &SpooldProcess,
    shards: u16,
) -> Result<RssReport, RssError> {
    let pid = spoold.pid().ok_or(RssError::NotRunning)?;
    let started = instant_now();
    let settle = Duration::from_millis(config.settle_ms);
    let mut samples = Vec::new();
    let sample = |label: String, backlog: u64| -> Result<RssSample, RssError> {
        let (rss_bytes, rss_anon_bytes, rss_file_bytes, hwm_bytes) = proc_status(pid)?;
        let at_s = instant_now().duration_since(started).as_secs_f64();
        let sample = RssSample {
            label,
            backlog,
            at_s,
            rss_bytes,
            rss_anon_bytes,
            rss_file_bytes,
            hwm_bytes,
            load_avg_1m: load_avg_1m(),
        };
        eprintln!(
            "spool-bench rss: {:<14} backlog {:>9}  rss {:>7.1} MiB  anon {:>7.1} MiB  peak {:>7.1} MiB",
            sample.label,
            sample.backlog,
            mib(sample.rss_bytes),
            mib(sample.rss_anon_bytes),
            mib(sample.hwm_bytes)
        );
        Ok(sample)
    };
    tokio::time::sleep(settle).await;
    samples.push(sample("idle".to_owned(), 0)?);

    let addr = spoold.addr().to_owned();
    let admin = Admin::new(Client::connect(&addr).await?);
    let queue = format!("rss-{}", std::process::id());
    let wanted = config.partitions.unwrap_or(u32::from(shards) * 2);
    let mut queue_config = default_queue_config(wanted);
    queue_config.dedupe_window_ms = config.dedupe_window_ms;
    let last_step = config.steps.last().copied().unwrap_or(0);
    queue_config.max_messages = queue_config.max_messages.max(last_step);
    queue_config.max_bytes = queue_config.max_bytes.max(last_step * (config.msg_bytes + 256));
    match admin.create_queue(&queue, queue_config).await {
        Ok(_) => {}
        Err(error) if error.code() == Some(ErrorCode::QueueExists) => {}
        Err(error) => return Err(error.into()),
    }
    let partitions = u32::try_from(admin.client().partitions(&queue).await?.len()).unwrap_or(0);
    tokio::time::sleep(settle).await;
    samples.push(sample("queue created".to_owned(), 0)?);

    let producer_config = ProducerConfig {
        linger: Duration::from_micros(config.linger_us),
        max_batch_bytes: usize::try_from(config.batch_bytes).unwrap_or(usize::MAX),
        ..ProducerConfig::default()
    };
    let mut producers = Vec::new();
    for _ in 0..config.producers.max(1) {
        producers.push(Producer::new(Client::connect(&addr).await?, producer_config.clone())?);
    }
    let errors = Arc::new(AtomicU64::new(0));
    let payload = vec![0x5Au8; usize::try_from(config.msg_bytes).unwrap_or(0)];
    let mut enqueued = 0u64;
    let mut enqueue_s = 0.0;
    for &step in &config.steps {
        let step_start = instant_now();
        let count = step - enqueued;
        let share = count / producers.len() as u64;
        let mut tasks = Vec::new();
        for (index, producer) in producers.iter().enumerate() {
            let mine = share + u64::from((index as u64) < count % producers.len() as u64);
            tasks.push(tokio::spawn(enqueue(
                producer.clone(),
                queue.clone(),
                payload.clone(),
                mine,
                usize::try_from(config.window).unwrap_or(1).max(1),
                Arc::clone(&errors),
            )));
        }
        for task in tasks {
            if let Ok(Err(error)) = task.await {
                return Err(error.into());
            }
        }
        enqueued = step;
        enqueue_s += instant_now().duration_since(step_start).as_secs_f64();
        tokio::time::sleep(settle).await;
        samples.push(sample(format!("backlog {step}"), step)?);
    }
    for producer in &producers {
        producer.close().await;
    }
    drop(producers);
    if !config.drain {
        return Ok(RssReport {
            shards,
            partitions,
            msg_bytes: config.msg_bytes,
            dedupe_window_ms: config.dedupe_window_ms,
            samples,
            enqueue_msgs_per_s: enqueued as f64 / enqueue_s.max(f64::MIN_POSITIVE),
            drain_msgs_per_s: 0.0,
            enqueue_errors: errors.load(Ordering::Acquire),
        });
    }

    let drain_start = instant_now();
    let mut consumers = Vec::new();
    for _ in 0..config.consumers.max(1) {
        let mut consumer_config = ConsumerConfig::new(queue.clone(), config.slots.max(1));
        consumer_config.wait_ms = CLAIM_WAIT_MS;
        consumer_config.ack_linger = Duration::ZERO;
        let consumer = Consumer::start(
            Client::connect(&addr).await?,
            consumer_config,
            |_delivery: Delivery| async { Ok::<(), std::convert::Infallible>(()) },
        )?;
        consumers.push(consumer);
    }
    let acked = |consumers: &[Consumer]| consumers.iter().map(|c| c.stats().acked).sum::<u64>();
    let mut last_progress = (instant_now(), 0u64);
    loop {
        let done = acked(&consumers);
        if done >= enqueued {
            break;
        }
        if done > last_progress.1 {
            last_progress = (instant_now(), done);
        } else if instant_now().duration_since(last_progress.0) > Duration::from_secs(60) {
            return Err(RssError::Drain { acked: done, enqueued });
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let drain_s = instant_now().duration_since(drain_start).as_secs_f64();
    samples.push(sample("drained".to_owned(), 0)?);
    for consumer in consumers {
        consumer.shutdown().await;
    }
    tokio::time::sleep(Duration::from_millis(config.after_drain_ms)).await;
    samples.push(sample(format!("drained +{} s", config.after_drain_ms / 1000), 0)?);
    Ok(RssReport {
        shards,
        partitions,
        msg_bytes: config.msg_bytes,
        dedupe_window_ms: config.dedupe_window_ms,
        samples,
        enqueue_msgs_per_s: enqueued as f64 / enqueue_s.max(f64::MIN_POSITIVE),
        drain_msgs_per_s: enqueued as f64 / drain_s.max(f64::MIN_POSITIVE),
        enqueue_errors: errors.load(Ordering::Acquire),
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// Enqueues `count` copies of `payload` with at most `window` in flight;
/// a refused send is counted and sent again.
async fn enqueue(
    producer: Producer,
    queue: String,
    payload: Vec<u8>,
    count: u64,
    window: usize,
    errors: Arc<AtomicU64>,
) -> Result<(), ClientError> {
    let mut in_flight = FuturesUnordered::new();
    let mut submitted = 0u64;
    let mut failed = 0u64;
    while submitted < count || !in_flight.is_empty() || failed > 0 {
        if (submitted < count || failed > 0) && in_flight.len() < window {
            match producer.submit(&queue, Message::new(payload.clone())).await {
                Ok(send) => {
                    in_flight.push(send);
                    if failed > 0 {
                        failed -= 1;
                    } else {
                        submitted += 1;
                    }
                }
                Err(error) => {
                    eprintln!("spool-bench rss: submit refused: {}", error_name(&error));
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(SUBMIT_ERROR_PAUSE).await;
                }
            }
            continue;
        }
        if let Some(Err(error)) = in_flight.next().await {
            if error.code().is_none() {
                return Err(error);
            }
            errors.fetch_add(1, Ordering::Relaxed);
            failed += 1;
        }
    }
    Ok(())
}
