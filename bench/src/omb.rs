//! `omb`: runs an OpenMessaging Benchmark workload file against Spool.
//!
//! What it owns: reading an OMB workload YAML, mapping it onto the load
//! engine (a topic is a queue, a subscription's consumers are workers), the
//! payloads (OMB's `payloadFile`, or its randomized pool), OMB's backlog
//! phase, and the list of fields it does not support. What it does not do:
//! OMB's driver files, warm-up phase or max-rate discovery
//! (`producerRate: 0`); every field it does not map is **reported** (stderr
//! and the JSON's `unsupported`), never silently dropped.
//!
//! Mapping: `topics` queues of `partitionsPerTopic` partitions;
//! `producersPerTopic` open-loop producers per queue sharing `producerRate`
//! (msgs/s over all topics, as in OMB) at `messageSize` bytes;
//! `consumerPerSubscription` consumers per queue, each with `--slots` slots
//! and the given service time (default 0: ack at once, as OMB consumers
//! do); `testDurationMinutes` of load. `subscriptionsPerTopic: N` gives
//! each queue N subscriptions (the default and `sub-1` ... `sub-{N-1}`,
//! `docs/design/subscriptions.md`), each with `consumerPerSubscription`
//! consumers and every message once: the consume rate counts every
//! subscription's acks, as OMB's does (N × the publish rate when they keep
//! up). At most the broker's subscriptions per queue (16).
//! `consumerBacklogSizeGB > 0` runs OMB's backlog phase first: consumers
//! paused until the client's backlog is that size, then resumed until it is
//! drained to `max(1000, (1 − backlogDrainRatio) × backlog)` messages, then
//! the test duration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::load::{
    self, LoadConfig, LoadError, OmbResult, PercentilesMs, Phase, PhaseEnd, QueueResult, Sample,
};

/// Largest workload file read.
pub const WORKLOAD_BYTES_MAX: u64 = 1 << 20;
/// Longest test duration accepted (minutes).
pub const DURATION_MINUTES_MAX: f64 = 24.0 * 60.0;
/// Largest `randomizedPayloadPoolSize`.
pub const PAYLOAD_POOL_SIZE_MAX: u32 = 100_000;
/// Free space a backlog build leaves on the data directory's file system,
/// beyond the backlog's payload bytes (record headers, indexes, the
/// journal, other users of the disk).
pub const BACKLOG_FREE_MARGIN_BYTES: u64 = 4 << 30;
/// OMB's least backlog counted as drained (messages).
pub const BACKLOG_DRAINED_MIN_MSGS: u64 = 1_000;
/// Longest a backlog build or drain may take before the run goes on (s).
pub const BACKLOG_PHASE_S_MAX: f64 = 6.0 * 3_600.0;
/// The fields this runner maps (OMB's names).
pub const SUPPORTED_FIELDS: [&str; 15] = [
    "name",
    "topics",
    "partitionsPerTopic",
    "messageSize",
    "producersPerTopic",
    "consumerPerSubscription",
    "producerRate",
    "testDurationMinutes",
    "subscriptionsPerTopic",
    "payloadFile",
    "useRandomizedPayloads",
    "randomBytesRatio",
    "randomizedPayloadPoolSize",
    "consumerBacklogSizeGB",
    "backlogDrainRatio",
];

/// Why a workload cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OmbError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is {len_bytes} bytes, more than {WORKLOAD_BYTES_MAX}", path.display())]
    TooLarge { path: PathBuf, len_bytes: u64 },
    #[error("not an OMB workload (YAML mapping): {0}")]
    Yaml(String),
    #[error("workload field {field}: {problem}")]
    Field { field: &'static str, problem: String },
    #[error("payloadFile {file:?} not found; tried {}", tried.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(", "))]
    PayloadMissing { file: String, tried: Vec<PathBuf> },
    #[error("payloadFile {} is {len_bytes} bytes, but messageSize is {message_size} (OMB requires them equal)", path.display())]
    PayloadSize { path: PathBuf, len_bytes: u64, message_size: u64 },
    #[error(
        "consumerBacklogSizeGB {backlog_gb}: {backlog_bytes} bytes of backlog, but {} has {free_bytes} bytes free, less a margin of {BACKLOG_FREE_MARGIN_BYTES} bytes",
        dir.display()
    )]
    BacklogTooLarge { backlog_gb: u64, backlog_bytes: u64, dir: PathBuf, free_bytes: u64 },
    #[error("cannot statvfs {}: {source}", dir.display())]
    FreeSpace {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// The supported part of an OMB workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    pub name: Option<String>,
    pub topics: u32,
    pub partitions_per_topic: u32,
    pub message_size: u64,
    pub producers_per_topic: u32,
    pub consumer_per_subscription: u32,
    /// msgs/s over all topics.
    pub producer_rate: f64,
    pub test_duration_minutes: f64,
    /// Subscriptions of each queue (1: the default alone).
    pub subscriptions_per_topic: u32,
    pub payload: PayloadSource,
    /// OMB's backlog phase when > 0 (GiB: OMB multiplies by 1024³).
    #[serde(rename = "consumerBacklogSizeGB")]
    pub consumer_backlog_size_gb: u64,
    /// Share of the backlog that must be drained before the test duration
    /// starts (OMB's default 1.0).
    pub backlog_drain_ratio: f64,
}

/// Where the payloads come from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PayloadSource {
    /// No `payloadFile` and no randomized payloads: zeros.
    Zeros,
    /// `payloadFile` as written in the workload.
    File(String),
    /// `useRandomizedPayloads`: `pool_size` payloads, each
    /// `floor(messageSize × random_bytes_ratio)` random bytes then zeros.
    Randomized { random_bytes_ratio: f64, pool_size: u32 },
}

impl Workload {
    /// The backlog OMB builds, in messages (`consumerBacklogSizeGB × 1024³
    /// ÷ messageSize`); 0 = none.
    pub fn backlog_msgs(&self) -> u64 {
        self.backlog_bytes() / self.message_size.max(1)
    }

    /// The backlog OMB builds, in payload bytes.
    pub fn backlog_bytes(&self) -> u64 {
        self.consumer_backlog_size_gb.saturating_mul(1 << 30)
    }

    /// The backlog left when OMB counts it as drained (messages).
    pub fn backlog_drained_msgs(&self) -> u64 {
        let left = ((1.0 - self.backlog_drain_ratio) * self.backlog_msgs() as f64) as u64;
        left.max(BACKLOG_DRAINED_MIN_MSGS)
    }
}

/// A parsed file: what runs, and what does not.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedWorkload {
    pub workload: Workload,
    /// Every other top-level field with its value.
    pub unsupported: BTreeMap<String, Value>,
}

fn field_error(field: &'static str, problem: impl Into<String>) -> OmbError {
    OmbError::Field { field, problem: problem.into() }
}

/// The file as written: the supported fields typed (absent is `None`), every
/// other top-level field kept with its value. Ranges, defaults and the
/// relations between fields are checked by [`parse`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawWorkload {
    #[serde(default, deserialize_with = "scalar_as_string")]
    name: Option<String>,
    topics: Option<u64>,
    partitions_per_topic: Option<u64>,
    message_size: Option<u64>,
    producers_per_topic: Option<u64>,
    consumer_per_subscription: Option<u64>,
    producer_rate: Option<f64>,
    test_duration_minutes: Option<f64>,
    subscriptions_per_topic: Option<u64>,
    payload_file: Option<String>,
    use_randomized_payloads: Option<bool>,
    random_bytes_ratio: Option<f64>,
    randomized_payload_pool_size: Option<u64>,
    #[serde(rename = "consumerBacklogSizeGB")]
    consumer_backlog_size_gb: Option<u64>,
    backlog_drain_ratio: Option<f64>,
    #[serde(flatten)]
    unsupported: BTreeMap<String, Value>,
}

/// A `name` of any scalar (`name: 100` is a number in YAML) as its text.
fn scalar_as_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::Null => None,
        Value::String(name) => Some(name),
        other => Some(other.to_string()),
    })
}

fn required<T>(value: Option<T>, field: &'static str) -> Result<T, OmbError> {
    value.ok_or_else(|| field_error(field, "missing"))
}

fn in_range(value: u64, field: &'static str, max: u32) -> Result<u32, OmbError> {
    match u32::try_from(value) {
        Ok(value) if (1..=max).contains(&value) => Ok(value),
        _ => Err(field_error(field, format!("{value} is outside 1..={max}"))),
    }
}

/// Parses workload YAML.
///
/// # Errors
/// Not a YAML mapping, a supported field missing, of the wrong type or out of
/// range (each names the field), or `producerRate: 0` (OMB's max-rate
/// discovery, which this runner lacks).
pub fn parse(text: &str) -> Result<ParsedWorkload, OmbError> {
    let deserializer = serde_norway::Deserializer::from_str(text);
    let raw: RawWorkload = serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match SUPPORTED_FIELDS.iter().find(|field| **field == path) {
            Some(field) => field_error(field, inner.to_string()),
            None => OmbError::Yaml(inner.to_string()),
        }
    })?;
    let producer_rate = required(raw.producer_rate, "producerRate")?;
    if !(producer_rate > 0.0 && producer_rate <= load::RATE_MAX) {
        return Err(field_error(
            "producerRate",
            format!(
                "{producer_rate}: must be in (0, {}]; OMB's 0 (find the max rate) is not \
                 supported, use `spool-bench throughput` for that",
                load::RATE_MAX
            ),
        ));
    }
    let test_duration_minutes = required(raw.test_duration_minutes, "testDurationMinutes")?;
    if !(test_duration_minutes > 0.0 && test_duration_minutes <= DURATION_MINUTES_MAX) {
        return Err(field_error(
            "testDurationMinutes",
            format!("{test_duration_minutes} is outside (0, {DURATION_MINUTES_MAX}]"),
        ));
    }
    let workload = Workload {
        name: raw.name,
        topics: in_range(required(raw.topics, "topics")?, "topics", load::QUEUES_MAX)?,
        partitions_per_topic: in_range(
            required(raw.partitions_per_topic, "partitionsPerTopic")?,
            "partitionsPerTopic",
            spool_client::spool_wire::proto::limits::PARTITIONS_MAX,
        )?,
        message_size: required(raw.message_size, "messageSize")?,
        producers_per_topic: in_range(
            raw.producers_per_topic.unwrap_or(1),
            "producersPerTopic",
            load::PRODUCERS_MAX,
        )?,
        consumer_per_subscription: in_range(
            raw.consumer_per_subscription.unwrap_or(1),
            "consumerPerSubscription",
            load::CONSUMERS_PER_QUEUE_MAX,
        )?,
        producer_rate,
        test_duration_minutes,
        subscriptions_per_topic: subscriptions(raw.subscriptions_per_topic)?,
        payload: payload_source(
            raw.payload_file,
            raw.use_randomized_payloads,
            raw.random_bytes_ratio,
            raw.randomized_payload_pool_size,
        )?,
        consumer_backlog_size_gb: raw.consumer_backlog_size_gb.unwrap_or(0),
        backlog_drain_ratio: match raw.backlog_drain_ratio {
            None => 1.0,
            Some(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
            Some(ratio) => {
                return Err(field_error("backlogDrainRatio", format!("{ratio} is outside [0, 1]")))
            }
        },
    };
    let total = u64::from(workload.topics) * u64::from(workload.partitions_per_topic);
    if total > load::PARTITIONS_TOTAL_MAX {
        return Err(field_error(
            "partitionsPerTopic",
            format!(
                "{} topics × {} partitions = {total} partitions, over the broker's {} per node",
                workload.topics,
                workload.partitions_per_topic,
                load::PARTITIONS_TOTAL_MAX
            ),
        ));
    }
    Ok(ParsedWorkload { workload, unsupported: raw.unsupported })
}

/// `subscriptionsPerTopic`: absent (1) up to the broker's subscriptions
/// per queue.
fn subscriptions(value: Option<u64>) -> Result<u32, OmbError> {
    match value.unwrap_or(1) {
        count @ 1.. if count <= u64::from(load::SUBSCRIPTIONS_MAX) => {
            Ok(u32::try_from(count).unwrap_or(load::SUBSCRIPTIONS_MAX))
        }
        other => Err(field_error(
            "subscriptionsPerTopic",
            format!(
                "{other}: a queue has from 1 (the default subscription alone) to {} \
                 subscriptions",
                load::SUBSCRIPTIONS_MAX
            ),
        )),
    }
}

/// OMB's choice: randomized payloads when `useRandomizedPayloads`, else
/// `payloadFile` (absent: zeros).
fn payload_source(
    file: Option<String>,
    randomized: Option<bool>,
    ratio: Option<f64>,
    pool_size: Option<u64>,
) -> Result<PayloadSource, OmbError> {
    if randomized != Some(true) {
        return Ok(file.map_or(PayloadSource::Zeros, PayloadSource::File));
    }
    let ratio = ratio.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(field_error("randomBytesRatio", format!("{ratio} is outside [0, 1]")));
    }
    let pool_size = in_range(
        required(pool_size, "randomizedPayloadPoolSize")?,
        "randomizedPayloadPoolSize",
        PAYLOAD_POOL_SIZE_MAX,
    )?;
    Ok(PayloadSource::Randomized { random_bytes_ratio: ratio, pool_size })
}

/// OMB's randomized pool: `pool_size` payloads of `message_size` bytes,
/// each `floor(message_size × ratio)` random bytes followed by zeros
/// (OMB's `WorkloadGenerator`; random from `seed` here).
pub fn random_pool(message_size: usize, ratio: f64, pool_size: u32, seed: u64) -> Vec<Vec<u8>> {
    let random_bytes = ((message_size as f64 * ratio) as usize).min(message_size);
    let mut rng = crate::dist::rng(seed, u64::MAX);
    (0..pool_size)
        .map(|_| {
            let mut payload = vec![0u8; message_size];
            rand::RngCore::fill_bytes(&mut rng, &mut payload[..random_bytes]);
            payload
        })
        .collect()
}

/// Where a relative `payloadFile` is looked for, in order: under
/// `payload_dir` (as written, then by its file name), then relative to the
/// workload file's directory and that directory's parent (OMB's files say
/// `payload/…` from the repository root, next to `workloads/`).
pub fn payload_candidates(
    file: &str,
    workload_file: &Path,
    payload_dir: Option<&Path>,
) -> Vec<PathBuf> {
    let written = Path::new(file);
    if written.is_absolute() {
        return vec![written.to_owned()];
    }
    let mut candidates = Vec::new();
    if let Some(dir) = payload_dir {
        candidates.push(dir.join(written));
        if let Some(name) = written.file_name() {
            candidates.push(dir.join(name));
        }
    }
    let workload_dir = match workload_file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    candidates.push(workload_dir.join(written));
    if let Some(parent) = workload_dir.parent() {
        let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
        candidates.push(parent.join(written));
    } else {
        candidates.push(workload_dir.join("..").join(written));
    }
    candidates.dedup();
    candidates
}

/// The payloads a run sends (empty = zeros).
///
/// # Errors
/// A `payloadFile` found under none of [`payload_candidates`] (naming every
/// path tried), unreadable, or not exactly `messageSize` bytes (as OMB).
pub fn payloads(
    workload: &Workload,
    workload_file: &Path,
    payload_dir: Option<&Path>,
    seed: u64,
) -> Result<Vec<Vec<u8>>, OmbError> {
    let message_size = workload.message_size;
    match &workload.payload {
        PayloadSource::Zeros => Ok(Vec::new()),
        PayloadSource::Randomized { random_bytes_ratio, pool_size } => {
            let size = usize::try_from(message_size)
                .map_err(|_| field_error("messageSize", format!("{message_size} is too large")))?;
            let pool_bytes = message_size.saturating_mul(u64::from(*pool_size));
            if pool_bytes > load::PAYLOAD_POOL_BYTES_MAX {
                return Err(field_error(
                    "randomizedPayloadPoolSize",
                    format!(
                        "{pool_size} × {message_size} bytes = {pool_bytes} bytes, over {}",
                        load::PAYLOAD_POOL_BYTES_MAX
                    ),
                ));
            }
            Ok(random_pool(size, *random_bytes_ratio, *pool_size, seed))
        }
        PayloadSource::File(file) => {
            let tried = payload_candidates(file, workload_file, payload_dir);
            let Some(path) = tried.iter().find(|path| path.is_file()) else {
                return Err(OmbError::PayloadMissing { file: file.clone(), tried });
            };
            let read_error = |source| OmbError::Read { path: path.clone(), source };
            let len_bytes = std::fs::metadata(path).map_err(read_error)?.len();
            if len_bytes != message_size {
                return Err(OmbError::PayloadSize { path: path.clone(), len_bytes, message_size });
            }
            Ok(vec![std::fs::read(path).map_err(read_error)?])
        }
    }
}

/// Refuses a backlog that does not fit the free space of `dir`'s file
/// system less [`BACKLOG_FREE_MARGIN_BYTES`].
///
/// # Errors
/// [`OmbError::BacklogTooLarge`] with the figures, or a failed statvfs.
pub fn check_backlog_space(workload: &Workload, dir: &Path) -> Result<(), OmbError> {
    if workload.consumer_backlog_size_gb == 0 {
        return Ok(());
    }
    let free_bytes = free_bytes(dir)?;
    backlog_fits(workload, dir, free_bytes)
}

/// The comparison of [`check_backlog_space`], with the free space given.
fn backlog_fits(workload: &Workload, dir: &Path, free_bytes: u64) -> Result<(), OmbError> {
    let backlog_bytes = workload.backlog_bytes();
    if backlog_bytes > free_bytes.saturating_sub(BACKLOG_FREE_MARGIN_BYTES) {
        return Err(OmbError::BacklogTooLarge {
            backlog_gb: workload.consumer_backlog_size_gb,
            backlog_bytes,
            dir: dir.to_owned(),
            free_bytes,
        });
    }
    Ok(())
}

/// Bytes available to an unprivileged user on `dir`'s file system. A `dir`
/// not created yet (the run creates it) is measured at its nearest existing
/// ancestor, the file system it will be created on.
fn free_bytes(dir: &Path) -> Result<u64, OmbError> {
    use std::os::unix::ffi::OsStrExt;
    let error = |source| OmbError::FreeSpace { dir: dir.to_owned(), source };
    let existing = dir
        .ancestors()
        .map(|ancestor| if ancestor.as_os_str().is_empty() { Path::new(".") } else { ancestor })
        .find(|ancestor| ancestor.exists())
        .unwrap_or(dir);
    let path = std::ffi::CString::new(existing.as_os_str().as_bytes())
        .map_err(|_| error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: statvfs(3) writes into the zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above: a NUL-terminated path and a struct we own.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(error(std::io::Error::last_os_error()));
    }
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Reads and parses a workload file.
///
/// # Errors
/// See [`parse`]; also an unreadable or oversized file.
pub fn read(path: &Path) -> Result<ParsedWorkload, OmbError> {
    let read_error = |source| OmbError::Read { path: path.to_owned(), source };
    let len_bytes = std::fs::metadata(path).map_err(read_error)?.len();
    if len_bytes > WORKLOAD_BYTES_MAX {
        return Err(OmbError::TooLarge { path: path.to_owned(), len_bytes });
    }
    parse(&std::fs::read_to_string(path).map_err(read_error)?)
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct OmbConfig {
    /// Engine settings; queues, partitions, producers, consumers, message
    /// size and phases come from the workload.
    pub load: LoadConfig,
    pub workload_file: PathBuf,
    pub parsed: ParsedWorkload,
    /// Slots per consumer.
    pub slots_per_consumer: u32,
    /// Replaces `testDurationMinutes` (e.g. for a short check).
    pub duration_s: Option<f64>,
    /// Where a relative `payloadFile` is looked for first.
    pub payload_dir: Option<PathBuf>,
}

/// One OMB run, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct OmbReport {
    pub scenario: &'static str,
    pub workload_file: PathBuf,
    pub workload: Workload,
    /// Fields of the file this runner does not map, with their values.
    pub unsupported: BTreeMap<String, Value>,
    pub duration_s: f64,
    /// OMB's result fields (ms, msgs/s).
    #[serde(flatten)]
    pub omb: OmbResult,
    pub publish_latency_ms: PercentilesMs,
    pub e2e_latency_ms: PercentilesMs,
    pub queue: QueueResult,
    pub errors: BTreeMap<String, u64>,
    pub queues: Vec<String>,
    pub slots_per_consumer: u32,
    /// Slots over all consumers as run (capped at the engine's limit).
    pub slots_total: u32,
    /// Payloads the producers picked from (0 = zeros).
    pub payload_pool: usize,
    /// The backlog build, drain and test phases as run.
    pub phases: Vec<load::PhaseOutcome>,
    pub addr: String,
    pub spoold_started: bool,
    pub series: Vec<Sample>,
}

/// Runs the workload.
///
/// # Errors
/// A workload the engine cannot run (e.g. `messageSize` below 8 bytes: the
/// send-time prefix) or a failed load run.
pub fn run(config: &OmbConfig) -> Result<OmbReport, OmbError> {
    let workload = &config.parsed.workload;
    let mut load = plan(config)?;
    load.payloads = std::sync::Arc::new(payloads(
        workload,
        &config.workload_file,
        config.payload_dir.as_deref(),
        load.seed,
    )?);
    if load.broker.addr.is_none() {
        check_backlog_space(workload, &load.broker.dir)?;
    }
    let outcome = load::run(&load)?;
    let slots_total = load.phases.iter().map(|phase| phase.slots).max().unwrap_or(0);
    Ok(OmbReport {
        scenario: "omb",
        workload_file: config.workload_file.clone(),
        workload: workload.clone(),
        unsupported: config.parsed.unsupported.clone(),
        duration_s: outcome.duration_s,
        omb: outcome.omb(),
        publish_latency_ms: outcome.publish_latency_ms,
        e2e_latency_ms: outcome.e2e_latency_ms,
        queue: outcome.queue(),
        errors: outcome.errors.clone(),
        queues: outcome.queues.clone(),
        slots_per_consumer: config.slots_per_consumer,
        slots_total,
        payload_pool: load.payloads.len(),
        phases: outcome.phases.clone(),
        addr: outcome.addr.clone(),
        spoold_started: outcome.spoold_started,
        series: outcome.series,
    })
}

/// The engine run a workload maps to: queues, producers, consumers and
/// phases (a backlog build with the consumers paused and its drain, when
/// asked, then the test).
///
/// # Errors
/// None today beyond the engine's own checks, which [`load::run`] makes.
pub fn plan(config: &OmbConfig) -> Result<LoadConfig, OmbError> {
    let workload = &config.parsed.workload;
    let seconds = config.duration_s.unwrap_or(workload.test_duration_minutes * 60.0);
    let mut load = config.load.clone();
    load.queues = workload.topics;
    load.partitions = Some(workload.partitions_per_topic);
    load.msg_bytes = workload.message_size;
    load.producers_per_queue = workload.producers_per_topic;
    load.consumers_per_queue = workload.consumer_per_subscription;
    load.subscriptions = workload.subscriptions_per_topic;
    let slots = u64::from(workload.topics)
        .saturating_mul(u64::from(workload.subscriptions_per_topic))
        .saturating_mul(u64::from(workload.consumer_per_subscription))
        .saturating_mul(u64::from(config.slots_per_consumer))
        .min(u64::from(load::SLOTS_MAX));
    let slots = u32::try_from(slots).unwrap_or(load::SLOTS_MAX);
    let rate = workload.producer_rate;
    let mut phases = Vec::new();
    let backlog_msgs = workload.backlog_msgs();
    let mut expected_s = seconds;
    if backlog_msgs > 0 {
        // The queues must admit the whole backlog.
        load.queue_max_messages = load.queue_max_messages.max(backlog_msgs.saturating_mul(2));
        load.queue_max_bytes = load.queue_max_bytes.max(workload.backlog_bytes().saturating_mul(2));
        let build_s = (backlog_msgs as f64 / rate * 2.0 + 60.0).min(BACKLOG_PHASE_S_MAX);
        phases.push(Phase {
            name: "backlog-build".to_owned(),
            seconds: build_s,
            rate_per_s: rate,
            slots: 0,
            end: PhaseEnd::Backlog { target_msgs: backlog_msgs },
        });
        phases.push(Phase {
            name: "backlog-drain".to_owned(),
            seconds: BACKLOG_PHASE_S_MAX,
            rate_per_s: rate,
            slots,
            end: PhaseEnd::Drained { threshold_msgs: workload.backlog_drained_msgs() },
        });
        expected_s += backlog_msgs as f64 / rate * 2.0;
    }
    phases.push(Phase {
        name: "omb".to_owned(),
        seconds,
        rate_per_s: rate,
        slots,
        end: PhaseEnd::Elapsed,
    });
    load.phases = phases;
    load.expected_s = expected_s;
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "\
name: 1 topic / 4 partitions / 1kb
topics: 1
partitionsPerTopic: 4
messageSize: 1024
payloadFile: payload/payload-1Kb.data
subscriptionsPerTopic: 1
consumerPerSubscription: 2
producersPerTopic: 2
producerRate: 5000
consumerBacklogSizeGB: 0
testDurationMinutes: 5
keyDistributor: NO_KEY
";

    /// OMB's `1k-topic-1kb-4p-4c-100k.yaml`, without its licence header.
    const THOUSAND_TOPICS: &str = "\
name: 100k rate 4 producers and 4 consumers on 1k topic
topics: 1000
partitionsPerTopic: 1
messageSize: 1024
useRandomizedPayloads: true
randomBytesRatio: 0.5
randomizedPayloadPoolSize: 1000
subscriptionsPerTopic: 1
consumerPerSubscription: 4
producersPerTopic: 4
producerRate: 100000
consumerBacklogSizeGB: 0
testDurationMinutes: 5
";

    fn omb_config(text: &str) -> OmbConfig {
        OmbConfig {
            load: crate::load::tests::config(),
            workload_file: PathBuf::from("/nowhere/workloads/w.yaml"),
            parsed: parse(text).unwrap(),
            slots_per_consumer: 64,
            duration_s: Some(30.0),
            payload_dir: None,
        }
    }

    #[test]
    fn supported_fields_map_and_the_rest_are_listed() {
        // Goal: the seven OMB fields (plus name) are read with their values and every other
        // field is kept, with its value, in `unsupported`. Method: a file like OMB's own.
        let parsed = parse(FULL).unwrap();
        let workload = &parsed.workload;
        assert_eq!(workload.name.as_deref(), Some("1 topic / 4 partitions / 1kb"));
        assert_eq!(workload.topics, 1);
        assert_eq!(workload.partitions_per_topic, 4);
        assert_eq!(workload.message_size, 1024);
        assert_eq!(workload.producers_per_topic, 2);
        assert_eq!(workload.consumer_per_subscription, 2);
        assert_eq!(workload.producer_rate, 5000.0);
        assert_eq!(workload.test_duration_minutes, 5.0);
        assert_eq!(workload.subscriptions_per_topic, 1);
        assert_eq!(workload.payload, PayloadSource::File("payload/payload-1Kb.data".to_owned()));
        assert_eq!(workload.consumer_backlog_size_gb, 0);
        assert_eq!(workload.backlog_drain_ratio, 1.0);
        let unsupported: Vec<&str> = parsed.unsupported.keys().map(String::as_str).collect();
        assert_eq!(unsupported, ["keyDistributor"]);
        assert_eq!(parsed.unsupported["keyDistributor"], "NO_KEY");
    }

    #[test]
    fn randomized_payloads_and_backlog_fields_map() {
        // Goal: OMB's randomized-payload and backlog fields are read (they were listed as
        // unsupported and not applied). Method: OMB's 1k-topic file, then a backlog variant.
        let workload = parse(THOUSAND_TOPICS).unwrap().workload;
        assert_eq!(
            workload.payload,
            PayloadSource::Randomized { random_bytes_ratio: 0.5, pool_size: 1000 }
        );
        let backlog = format!(
            "{}consumerBacklogSizeGB: 2\nbacklogDrainRatio: 0.5\n",
            THOUSAND_TOPICS.replace("consumerBacklogSizeGB: 0\n", "")
        );
        let workload = parse(&backlog).unwrap().workload;
        assert_eq!(workload.consumer_backlog_size_gb, 2);
        assert_eq!(workload.backlog_msgs(), 2 * 1024 * 1024);
        assert_eq!(workload.backlog_drained_msgs(), 1024 * 1024);
        let no_pool = THOUSAND_TOPICS.replace("randomizedPayloadPoolSize: 1000\n", "");
        assert!(matches!(
            parse(&no_pool),
            Err(OmbError::Field { field: "randomizedPayloadPoolSize", .. })
        ));
        let bad_ratio = THOUSAND_TOPICS.replace("randomBytesRatio: 0.5", "randomBytesRatio: 1.5");
        assert!(matches!(
            parse(&bad_ratio),
            Err(OmbError::Field { field: "randomBytesRatio", .. })
        ));
    }

    #[test]
    fn subscriptions_per_topic_map_to_subscriptions_and_their_consumers() {
        // Goal: subscriptionsPerTopic N gives each queue N subscriptions, each with
        // consumerPerSubscription consumers and its share of the slots; 0 and more than the
        // broker allows are refused naming the field. Method: parse and plan FULL with 3.
        let three = FULL.replace("subscriptionsPerTopic: 1", "subscriptionsPerTopic: 3");
        let parsed = parse(&three).unwrap();
        assert_eq!(parsed.workload.subscriptions_per_topic, 3);
        let one = omb_config(FULL);
        let config = omb_config(&three);
        let (single, fanned) = (plan(&one).unwrap(), plan(&config).unwrap());
        assert_eq!((single.subscriptions, fanned.subscriptions), (1, 3));
        assert_eq!(fanned.consumers(), single.consumers() * 3);
        let slots = |load: &LoadConfig| load.phases.last().unwrap().slots;
        assert_eq!(slots(&fanned), slots(&single) * 3);
        assert!(fanned.validate().is_ok());
        for bad in [0, load::SUBSCRIPTIONS_MAX + 1] {
            let text =
                FULL.replace("subscriptionsPerTopic: 1", &format!("subscriptionsPerTopic: {bad}"));
            match parse(&text) {
                Err(OmbError::Field { field: "subscriptionsPerTopic", problem }) => {
                    assert!(problem.contains("from 1"), "{problem}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn random_pool_has_the_ratio_of_random_bytes_then_zeros() {
        // Goal: OMB's pool: N payloads of messageSize, the first floor(size × ratio) bytes
        // random, the rest zeros, payloads distinct. Method: count bytes of a 1,000 × 1 KiB pool.
        let pool = random_pool(1024, 0.5, 1000, 7);
        assert_eq!(pool.len(), 1000);
        assert!(pool.iter().all(|payload| payload.len() == 1024));
        assert!(pool.iter().all(|payload| payload[512..].iter().all(|byte| *byte == 0)));
        let nonzero: usize =
            pool.iter().map(|payload| payload[..512].iter().filter(|b| **b != 0).count()).sum();
        // Uniform random bytes are zero 1/256 of the time.
        let expected = 1000.0 * 512.0 * 255.0 / 256.0;
        assert!((nonzero as f64 - expected).abs() < expected * 0.01, "{nonzero} vs {expected}");
        assert_ne!(pool[0], pool[1]);
        assert_eq!(random_pool(1024, 0.0, 3, 7), vec![vec![0u8; 1024]; 3]);
        let odd = random_pool(100, 0.333, 1, 7);
        assert!(odd[0][33..].iter().all(|byte| *byte == 0));
        assert_eq!(random_pool(100, 1.0, 2, 7), random_pool(100, 1.0, 2, 7), "seeded");
    }

    #[test]
    fn payload_file_is_found_beside_or_above_the_workload_or_named_missing() {
        // Goal: OMB's relative `payload/…` resolves from the workload's directory or its
        // parent (or --payload-dir); a missing file names every path tried; a file whose
        // size differs from messageSize is refused as OMB does.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("workloads")).unwrap();
        std::fs::create_dir_all(root.path().join("payload")).unwrap();
        let workload_file = root.path().join("workloads/w.yaml");
        let mut workload = parse(FULL).unwrap().workload;
        let missing = payloads(&workload, &workload_file, None, 1).unwrap_err();
        match &missing {
            OmbError::PayloadMissing { tried, .. } => assert_eq!(
                tried,
                &[
                    root.path().join("workloads/payload/payload-1Kb.data"),
                    root.path().join("payload/payload-1Kb.data"),
                ]
            ),
            other => panic!("{other:?}"),
        }
        assert!(missing.to_string().contains("workloads/payload/payload-1Kb.data"), "{missing}");
        let bytes: Vec<u8> = (0..1024).map(|index| (index % 251) as u8).collect();
        std::fs::write(root.path().join("payload/payload-1Kb.data"), &bytes).unwrap();
        assert_eq!(payloads(&workload, &workload_file, None, 1).unwrap(), vec![bytes.clone()]);
        // --payload-dir: as written, or by file name.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("payload-1Kb.data"), &bytes).unwrap();
        let far = Path::new("/nowhere/w.yaml");
        assert_eq!(payloads(&workload, far, Some(elsewhere.path()), 1).unwrap(), vec![bytes]);
        workload.message_size = 1000;
        assert!(matches!(
            payloads(&workload, &workload_file, None, 1),
            Err(OmbError::PayloadSize { len_bytes: 1024, message_size: 1000, .. })
        ));
    }

    #[test]
    fn a_backlog_bigger_than_the_free_space_is_refused_with_the_figures() {
        // Goal: consumerBacklogSizeGB beyond free space − margin fails before anything
        // starts, saying how much is asked and how much is free.
        let text = FULL.replace("consumerBacklogSizeGB: 0", "consumerBacklogSizeGB: 100");
        let workload = parse(&text).unwrap().workload;
        let dir = Path::new("/data");
        let error = backlog_fits(&workload, dir, 50 << 30).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, OmbError::BacklogTooLarge { backlog_gb: 100, .. }), "{message}");
        assert!(message.contains(&(100u64 << 30).to_string()), "{message}");
        assert!(message.contains(&(50u64 << 30).to_string()), "{message}");
        assert!(backlog_fits(&workload, dir, (100 << 30) + BACKLOG_FREE_MARGIN_BYTES).is_ok());
        assert!(backlog_fits(&workload, dir, (100 << 30) + BACKLOG_FREE_MARGIN_BYTES - 1).is_err());
        // The real statvfs answers for an existing directory, and for one
        // not created yet (as `--dir` is before the run), at the file system
        // it will be created on; the check then refuses with the figures
        // instead of failing to find the directory.
        assert!(free_bytes(Path::new("/tmp")).unwrap() > 0);
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("not").join("yet");
        assert!(free_bytes(&fresh).unwrap() > 0);
        assert!(free_bytes(Path::new("relative-dir-not-yet-made")).unwrap() > 0);
        let huge = FULL.replace("consumerBacklogSizeGB: 0", "consumerBacklogSizeGB: 1000000");
        let huge = parse(&huge).unwrap().workload;
        assert!(matches!(
            check_backlog_space(&huge, &fresh),
            Err(OmbError::BacklogTooLarge { backlog_gb: 1_000_000, .. })
        ));
    }

    #[test]
    fn backlog_workload_plans_a_paused_build_a_drain_then_the_test() {
        // Goal: OMB's backlog phase: consumers paused (0 slots) until the backlog is built,
        // then resumed until drained to OMB's threshold, then the test duration; queues admit
        // the backlog. Without a backlog there is one phase.
        let text = FULL.replace("consumerBacklogSizeGB: 0", "consumerBacklogSizeGB: 1");
        let load = plan(&omb_config(&text)).unwrap();
        let names: Vec<&str> = load.phases.iter().map(|phase| phase.name.as_str()).collect();
        assert_eq!(names, ["backlog-build", "backlog-drain", "omb"]);
        assert_eq!(load.phases[0].slots, 0);
        assert_eq!(load.phases[0].end, PhaseEnd::Backlog { target_msgs: 1 << 20 });
        assert_eq!(load.phases[1].end, PhaseEnd::Drained { threshold_msgs: 1000 });
        assert_eq!(load.phases[2].seconds, 30.0);
        assert!(load.phases.iter().all(|phase| phase.rate_per_s == 5000.0));
        assert!(load.queue_max_messages >= 1 << 20 && load.queue_max_bytes >= 1 << 30);
        assert!(load.validate().is_ok());
        assert_eq!(plan(&omb_config(FULL)).unwrap().phases.len(), 1);
    }

    #[test]
    fn thousand_topics_of_four_producers_and_consumers_fit_the_engine() {
        // Goal: OMB's 1k-topic workload (4,000 producers, 4,000 consumers) passes the
        // engine's checks (it was refused: at most 128 producers, one thread each), with
        // slots capped at the engine's limit.
        let load = plan(&omb_config(THOUSAND_TOPICS)).unwrap();
        assert_eq!(load.producers(), 4000);
        assert_eq!(load.consumers(), 4000);
        assert_eq!(load.phases[0].slots, load::SLOTS_MAX);
        assert!(load.validate().is_ok(), "{:?}", load.validate());
    }

    #[test]
    fn missing_zero_and_malformed_fields_are_errors() {
        // Goal: a workload that cannot be run as written fails with the field's name.
        let without = |field: &str| {
            FULL.lines().filter(|line| !line.starts_with(field)).collect::<Vec<_>>().join("\n")
        };
        for field in ["topics", "partitionsPerTopic", "messageSize", "producerRate"] {
            match parse(&without(field)) {
                Err(OmbError::Field { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Defaults where OMB has them.
        let parsed = parse(&without("producersPerTopic")).unwrap();
        assert_eq!(parsed.workload.producers_per_topic, 1);
        let zero_rate = FULL.replace("producerRate: 5000", "producerRate: 0");
        assert!(matches!(parse(&zero_rate), Err(OmbError::Field { field: "producerRate", .. })));
        let bad = FULL.replace("topics: 1", "topics: many");
        assert!(matches!(parse(&bad), Err(OmbError::Field { field: "topics", .. })));
        assert!(matches!(parse("- a\n- b\n"), Err(OmbError::Yaml(_))));
    }

    #[test]
    fn type_errors_name_the_field_and_what_was_found() {
        // Goal: a wrongly typed field fails with its name and the parser's description of
        // the value (and where it is), a numeric `name` is kept as text, and a nested
        // unsupported field keeps its structure. Method: FULL with one field changed.
        let bad = FULL.replace("producerRate: 5000", "producerRate: fast");
        let error = parse(&bad).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, OmbError::Field { field: "producerRate", .. }), "{message}");
        assert!(message.contains("invalid type") && message.contains("fast"), "{message}");
        assert!(message.contains("line 9"), "{message}");
        let numeric_name = FULL.replace("name: 1 topic / 4 partitions / 1kb", "name: 100");
        assert_eq!(parse(&numeric_name).unwrap().workload.name.as_deref(), Some("100"));
        let nested = format!("{FULL}extra:\n  a: [1, 2]\n");
        assert_eq!(parse(&nested).unwrap().unsupported["extra"], serde_json::json!({"a": [1, 2]}));
        match parse("topics: [1]\n") {
            Err(OmbError::Field { field: "topics", problem }) => {
                assert!(problem.contains("invalid type"), "{problem}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn topic_counts_up_to_the_broker_limits_are_accepted() {
        // Goal: OMB's 100- and 1k-topic workloads parse (`topics: 100` was refused as outside
        // 1..=64), and counts past the broker's queues-per-node or partitions-per-node limits
        // are refused naming the field. Method: FULL with its topic and partition counts changed.
        for topics in [100, 1_000] {
            let text = FULL
                .replace("topics: 1\n", &format!("topics: {topics}\n"))
                .replace("partitionsPerTopic: 4", "partitionsPerTopic: 1");
            assert_eq!(parse(&text).unwrap().workload.topics, topics);
        }
        let over_queues =
            FULL.replace("topics: 1\n", &format!("topics: {}\n", load::QUEUES_MAX + 1));
        assert!(matches!(parse(&over_queues), Err(OmbError::Field { field: "topics", .. })));
        let over_partitions = FULL.replace("topics: 1\n", "topics: 2501\n");
        assert!(matches!(
            parse(&over_partitions),
            Err(OmbError::Field { field: "partitionsPerTopic", .. })
        ));
    }

    #[test]
    fn committed_sample_workloads_parse() {
        // Goal: every file under bench/workloads/ is a runnable workload; method: parse each.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|ext| ext.to_str()) != Some("yaml") {
                continue;
            }
            let parsed = read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            assert!(parsed.workload.message_size >= load::TIMESTAMP_BYTES as u64);
            count += 1;
        }
        assert!(count >= 2, "expected the sample workloads in {}", dir.display());
    }
}
