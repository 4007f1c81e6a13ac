//! `log-append`: group-commit throughput and append → durable latency of
//! one shard journal on one glommio shard, shared by `--partitions`
//! partitions.
//!
//! N appender tasks (spread over the partitions in turn) append through
//! their partition's [`JournalPartition`] on real O_DIRECT files. Each
//! builds a one-record data batch once and then loops: `append` (the
//! journal stamps the offsets into its own copy) → await the ticket →
//! record the latency from the append call to durability. `Backpressure` is
//! answered by awaiting `JournalPartition::writable`, and the wait counts
//! toward that append's latency.
//!
//! The journal runs with spoold's witness and commit delays
//! ([`as_spoold`]): a closed loop of appenders leaves the committers idle
//! between cycles, and without the delay every commit would be followed by
//! a witness entry's write and sync that spoold does not pay.
//!
//! Measurement: after a warm-up, the controller snapshots the journal's
//! `JournalStats` and the storage timings, lets the run go for `seconds`,
//! and snapshots again. An append counts when it becomes durable inside the
//! window (whenever it started), so throughput, commit counts and latency
//! describe the same completions. What this does not measure: the network
//! or the queue state machine.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::{instant_now, Instant};
use spool_broker::io::{DmaStorage, Storage};
use spool_broker::limits::{
    COMMIT_BYTES_DEFAULT, COMMIT_BYTES_MAX, COMMIT_DELAY_MS, INFLIGHT_COMMITS_DEFAULT,
    INFLIGHT_COMMITS_MAX, SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
    WITNESS_DELAY_MS,
};
use spool_broker::log::journal::{
    Journal, JournalConfig, JournalError, JournalPartition, JournalPos, JournalStats, ShardJournal,
};
use spool_broker::log::{FatalHandler, FatalReason, LogConfig, LogError, WitnessDelay};
use spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
use spool_wire::limits::PAYLOAD_INLINE_BYTES_MAX;
use spool_wire::proto::{Offset, PartitionId};

use crate::error::BenchError;
use crate::histogram::{Latency, LatencySummary};
use crate::pinned::PinnedRun;
use crate::timed::{IoSummary, IoTimings, TimedStorage};

/// Most concurrent appenders: each is a task with one batch buffer.
pub const APPENDERS_MAX: u64 = 65_536;
/// Most partitions sharing the journal.
pub const PARTITIONS_MAX: u64 = 10_000;
/// Longest measured window and warm-up.
pub const SECONDS_MAX: u64 = 3_600;
pub const WARMUP_MS_MAX: u64 = 600_000;
/// Bytes per MB in `mb_per_s` (decimal, as fio's "MB/s").
const BYTES_PER_MB: f64 = 1_000_000.0;

/// What to run: the `log-append` subcommand's flags (one definition, with
/// their defaults).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct LogAppendConfig {
    #[command(flatten)]
    pub pinned: PinnedRun,
    /// Inline payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: u64,
    /// Concurrent appender tasks, each with one append in flight.
    #[arg(long, default_value_t = 256)]
    pub appenders: u64,
    /// Partitions sharing the shard journal (appenders spread over them).
    #[arg(long, default_value_t = 1)]
    pub partitions: u64,
    /// Length of the measured window.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Warm-up before the window (not measured).
    #[arg(long, default_value_t = 1000)]
    pub warmup_ms: u64,
    /// spoold's `segment_bytes`: the size of each shard journal file.
    #[arg(long, default_value_t = SEGMENT_BYTES_DEFAULT)]
    pub segment_bytes: u64,
    /// Group-commit target size (page multiple).
    #[arg(long, default_value_t = COMMIT_BYTES_DEFAULT)]
    pub commit_bytes: u64,
    /// Commits written but not yet synced at once.
    #[arg(long, default_value_t = INFLIGHT_COMMITS_DEFAULT as u64)]
    pub inflight_commits: u64,
}

impl LogAppendConfig {
    fn validate(&self) -> Result<(), BenchError> {
        let check = BenchError::check_range;
        check("record_bytes", self.record_bytes, 0, PAYLOAD_INLINE_BYTES_MAX as u64)?;
        check("appenders", self.appenders, 1, APPENDERS_MAX)?;
        check("partitions", self.partitions, 1, PARTITIONS_MAX.min(self.appenders))?;
        check("seconds", self.seconds, 1, SECONDS_MAX)?;
        check("warmup_ms", self.warmup_ms, 0, WARMUP_MS_MAX)?;
        check("segment_bytes", self.segment_bytes, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)?;
        check("commit_bytes", self.commit_bytes, 1, COMMIT_BYTES_MAX)?;
        check("inflight_commits", self.inflight_commits, 1, INFLIGHT_COMMITS_MAX as u64)?;
        Ok(())
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.segment_bytes,
            commit_bytes: self.commit_bytes,
            inflight_commits_max: self.inflight_commits as usize,
            ..LogConfig::default()
        }
    }
}

/// The one JSON object a run prints.
#[derive(Clone, Debug, Serialize)]
pub struct LogAppendReport {
    pub scenario: &'static str,
    /// Records made durable per second in the window.
    pub records_per_s: f64,
    /// Batch bytes made durable per second, 10^6 bytes per MB: each record's
    /// payload plus its framing (rkyv record, 8 B position entry, 64 B batch
    /// header). Fillers and page padding are not counted (see `disk_mb_per_s`).
    pub mb_per_s: f64,
    pub mb_per_s_basis: &'static str,
    /// Commit pages written per second (fillers and padding included).
    pub disk_mb_per_s: f64,
    pub commits_per_s: f64,
    pub records_per_commit_mean: f64,
    /// append call → ticket durable, for appends durable in the window.
    pub latency_us: LatencySummary,
    /// Every write and fdatasync the log issued in the window (commits and
    /// the zero-fill of the next journal file), timed at the storage seam.
    pub io: IoSummary,
    pub records: u64,
    pub commits: u64,
    /// Journal files named by a roll in the window.
    pub files_rolled: u64,
    /// Witness entries made durable in the window: one page, one write and
    /// one sync each, not counted in `commits` (in `io` they are).
    pub witnesses: u64,
    pub backpressure_waits: u64,
    pub measured_s: f64,
    pub appenders: u64,
    pub partitions: u64,
    pub record_bytes: u64,
    pub batch_bytes: u64,
    pub seconds: u64,
    pub warmup_ms: u64,
    pub segment_bytes: u64,
    pub commit_bytes: u64,
    pub inflight_commits: u64,
    /// The journal's file size and commit target as
    /// `JournalConfig::for_partitions` derives them from `segment_bytes` and
    /// `commit_bytes` (as spoold does).
    pub journal_file_bytes: u64,
    pub journal_commit_bytes: u64,
    /// spoold's witness and commit delays, which the journal runs with.
    pub witness_delay_ms: u64,
    pub commit_delay_ms: u64,
}

/// A glommio timer of `ms`, as a journal delay.
fn timer_of(ms: u64) -> WitnessDelay {
    Rc::new(move || {
        Box::pin(async move {
            glommio::timer::Timer::new(Duration::from_millis(ms)).await;
        })
    })
}

/// Gives `journal` the witness and commit delays spoold gives every shard
/// journal it opens (`WITNESS_DELAY_MS`, `COMMIT_DELAY_MS`).
pub(crate) fn as_spoold<S: Storage>(journal: &Journal<S>) {
    journal.set_witness_delay(timer_of(WITNESS_DELAY_MS));
    journal.set_commit_delay(timer_of(COMMIT_DELAY_MS));
}

/// Records the first fatal log error so the run can report it; appenders
/// see `LogError::Failed` from their tickets and stop.
#[derive(Default)]
struct FatalSlot {
    reason: RefCell<Option<FatalReason>>,
}

impl FatalHandler for FatalSlot {
    fn fatal(&self, reason: &FatalReason) {
        self.reason.borrow_mut().get_or_insert_with(|| reason.clone());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
    Stop,
}

/// State the appenders and the controller share (one thread).
struct Run {
    phase: Cell<Phase>,
    latency: RefCell<Latency>,
    records: Cell<u64>,
    backpressure_waits: Cell<u64>,
}

/// Builds the one-record batch every appender reuses; distinct message ids
/// per appender keep the bytes realistic (the log does not dedupe).
fn build_batch(appender: u64, record_bytes: u64) -> Result<Vec<u8>, BenchError> {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&appender.to_le_bytes());
    let mut builder = DataBatchBuilder::new();
    builder.push(&Record {
        message_id: MessageId(id),
        routing_key: format!("bench-{appender}").into_bytes(),
        headers: Vec::new(),
        payload: Payload::Inline(vec![(appender % 251) as u8; record_bytes as usize]),
        priority: 0,
        not_before_ms: 0,
        expiry_ms: 0,
        enqueue_time_ms: spool_broker::clock::now_ms(),
    })?;
    Ok(builder.finish()?.to_vec())
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(instant_now().duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

async fn appender(
    log: Rc<JournalPartition<TimedStorage<DmaStorage>>>,
    run: Rc<Run>,
    batch: Vec<u8>,
) -> Result<(), JournalError> {
    let len_bytes = batch.len() as u64;
    while run.phase.get() != Phase::Stop {
        let start = instant_now();
        let appended = loop {
            match log.append(&batch) {
                Ok(appended) => break appended,
                Err(JournalError::Backpressure { .. }) => {
                    run.backpressure_waits.set(run.backpressure_waits.get() + 1);
                    log.writable(spool_wire::batch::BatchKind::Data, len_bytes).await;
                }
                Err(error) => return Err(error),
            }
        };
        appended.ticket.durable().await?;
        if run.phase.get() == Phase::Measure {
            run.latency.borrow_mut().record_ns(elapsed_ns(start));
            run.records.set(run.records.get() + 1);
        }
    }
    Ok(())
}

/// Runs the scenario on a new glommio executor pinned to `--core`, in a
/// fresh directory under `--dir` ([`PinnedRun`]).
///
/// # Errors
/// [`BenchError::OutOfRange`] for a bad config, [`BenchError::Executor`],
/// [`BenchError::Dir`], and any journal error from opening or appending.
pub fn run(config: &LogAppendConfig) -> Result<LogAppendReport, BenchError> {
    config.validate()?;
    config.log_config().validate().map_err(LogError::from)?;
    config.pinned.run("log", |dir| async move { measure(config, &dir).await })
}

async fn measure(config: &LogAppendConfig, dir: &Path) -> Result<LogAppendReport, BenchError> {
    let timings = Rc::new(RefCell::new(IoTimings::new()?));
    let fatal = Rc::new(FatalSlot::default());
    let storage = TimedStorage::new(DmaStorage, timings.clone());
    let journal_config = JournalConfig::for_partitions(&config.log_config());
    let (journal_file_bytes, journal_commit_bytes) =
        (journal_config.file_bytes, journal_config.commit_bytes);
    let journal_error = |error: JournalError| BenchError::Scenario(format!("journal: {error}"));
    let (shard, _recovery) =
        ShardJournal::open(storage, dir, journal_config, JournalPos(0), fatal.clone())
            .await
            .map_err(journal_error)?;
    as_spoold(shard.journal());
    let background = glommio::spawn_local(shard.background());
    let opening: Vec<(u32, PartitionId, u64)> = (0..config.partitions)
        .map(|partition| (1, PartitionId(u32::try_from(partition).unwrap_or(u32::MAX)), 0))
        .collect();
    let handles = shard.open_partitions(&opening).await.map_err(journal_error)?;
    let mut partitions = Vec::with_capacity(handles.len());
    for (handle, epoch) in handles {
        let view =
            shard.partition(handle, Vec::new(), Offset(0), epoch, 0).map_err(journal_error)?;
        view.finish_replay();
        partitions.push(Rc::new(view));
    }
    let run = Rc::new(Run {
        phase: Cell::new(Phase::Warmup),
        latency: RefCell::new(Latency::new()?),
        records: Cell::new(0),
        backpressure_waits: Cell::new(0),
    });
    let mut batch_bytes = 0;
    let mut tasks = Vec::with_capacity(config.appenders as usize);
    for index in 0..config.appenders {
        let batch = build_batch(index, config.record_bytes)?;
        batch_bytes = batch.len() as u64;
        let log = partitions[(index % config.partitions) as usize].clone();
        tasks.push(glommio::spawn_local(appender(log, run.clone(), batch)));
    }

    glommio::timer::sleep(Duration::from_millis(config.warmup_ms)).await;
    let before: JournalStats = shard.journal().stats();
    timings.borrow_mut().reset();
    run.phase.set(Phase::Measure);
    let window_start = instant_now();
    glommio::timer::sleep(Duration::from_secs(config.seconds)).await;
    run.phase.set(Phase::Stop);
    let measured_s = instant_now().duration_since(window_start).as_secs_f64();
    let after = shard.journal().stats();
    let io = timings.borrow().summary();

    let mut first_error = None;
    for task in tasks {
        if let Err(error) = task.await {
            first_error.get_or_insert(error);
        }
    }
    for partition in &partitions {
        partition.close();
    }
    shard.close();
    background.await;
    if let Some(reason) = fatal.reason.borrow().as_ref() {
        return Err(BenchError::Log(LogError::Failed(reason.message.clone())));
    }
    if let Some(error) = first_error {
        return Err(journal_error(error));
    }

    let records = run.records.get();
    let latency_us = run.latency.borrow().summary();
    let commits = after.commits - before.commits;
    // One record per data entry: the entries are the records.
    let records_in_commits = after.data_entries - before.data_entries;
    let per_s = |count: f64| count / measured_s;
    Ok(LogAppendReport {
        scenario: "log-append",
        records_per_s: per_s(records as f64),
        mb_per_s: per_s((records * batch_bytes) as f64) / BYTES_PER_MB,
        mb_per_s_basis: "batch bytes (payload + rkyv record + 8 B position entry + 64 B header) \
                         durable per second, 1 MB = 10^6 B",
        disk_mb_per_s: per_s((after.commit_bytes - before.commit_bytes) as f64) / BYTES_PER_MB,
        commits_per_s: per_s(commits as f64),
        records_per_commit_mean: if commits == 0 {
            0.0
        } else {
            records_in_commits as f64 / commits as f64
        },
        latency_us,
        io,
        records,
        commits,
        files_rolled: after.files_rolled - before.files_rolled,
        witnesses: after.witnesses - before.witnesses,
        backpressure_waits: run.backpressure_waits.get(),
        measured_s,
        appenders: config.appenders,
        partitions: config.partitions,
        record_bytes: config.record_bytes,
        batch_bytes,
        seconds: config.seconds,
        warmup_ms: config.warmup_ms,
        segment_bytes: config.segment_bytes,
        commit_bytes: config.commit_bytes,
        inflight_commits: config.inflight_commits,
        journal_file_bytes,
        journal_commit_bytes,
        witness_delay_ms: WITNESS_DELAY_MS,
        commit_delay_ms: COMMIT_DELAY_MS,
    })
}
