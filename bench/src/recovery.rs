//! `recovery`: how long a partition takes to reopen after a large backlog,
//! with a checkpoint and without one.
//!
//! Builds a real partition on disk (one glommio shard, [`DmaStorage`], a
//! shard journal and [`Partition::open_journal`], as `spoold` opens a
//! partition) holding `messages` never-claimed messages of
//! `record_bytes` inline payload, enqueued in data batches of
//! `batch_records` by `enqueuers` concurrent tasks through
//! [`Partition::enqueue`], with a broker clock that advances as it would at
//! `rate_per_s` (so the dedupe window, and with it the checkpoint and its
//! sealed dedupe generation files, hold what production would). Then:
//! (a) `checkpoint()`, close, and time the reopen;
//! (b) close, delete the checkpoint file, and time the reopen again (the
//!     whole journal scanned and replayed through `apply`).
//!
//! Every reopen goes the way `spoold` starts a shard (`server::open_journal`
//! and `open_journal_partition`), through the broker's own functions only:
//! the journal's recovery scan from the partition's checkpoint scan start
//! (from the oldest journal file without one), the shard's ordered replay
//! ([`replay_journal_shard`]: the checkpoint restored with the dedupe
//! generation files it refers to, the entries after it folded in), the new
//! epoch made durable in the handles table, then [`Partition::open_journal`]
//! taking the replayed state and running the epoch fence. Nothing here
//! reads a checkpoint's contents itself, so a restore the broker would
//! refuse is refused here too. Each reopen is checked: the state must hold
//! exactly `messages` live messages. All reads are O_DIRECT, so (b) is not
//! helped by a page cache that (a) warmed.
//!
//! Disk: the journal is about `messages × batch_bytes / batch_records` plus
//! its prepared file; the run checks free space with statvfs first and
//! refuses with the figure it needs. The run directory is removed
//! afterwards unless `keep`. What this does not measure: the network path,
//! claims, or a crash (close is clean; crash recovery is the log tests').

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_broker::io::{create_dir_durable, DmaStorage};
use spool_broker::limits::{SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
use spool_broker::log::journal::{
    parse_journal_file_name, HandleTarget, JournalConfig, JournalError, JournalPos, ShardJournal,
    JOURNAL_DIR_NAME,
};
use spool_broker::log::{LogConfig, LogError, RecordFatal};
use spool_broker::partition::files::{self, CHECKPOINT_FILE, CHECKPOINT_MAGIC};
use spool_broker::partition::{
    replay_journal_shard, Clock, JournalOpen, OpenReport, Partition, PartitionError, PartitionName,
    ShardReplayReport, ShardReplayTarget,
};
use spool_broker::queue::limits::{QUEUE_BYTES_MAX, QUEUE_MESSAGES_MAX};
use spool_broker::queue::{
    LeaderEpoch, Millis, PartitionContext, PartitionId, QueueConfig, QueueId,
};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};
use spool_wire::limits::{BATCH_RECORDS_MAX, PAYLOAD_INLINE_BYTES_MAX};

use crate::error::BenchError;
use crate::pinned::PinnedRun;

/// Largest backlog a run may build.
pub const MESSAGES_MAX: u64 = 50_000_000;
/// Most concurrent enqueue tasks (each holds one batch).
pub const ENQUEUERS_MAX: u64 = 256;
/// Fastest simulated enqueue rate.
pub const RATE_PER_S_MAX: u64 = 10_000_000;
/// The capacity model's target for a reopen with a checkpoint.
pub const TARGET_RECOVERY_MS_WITH_CHECKPOINT: f64 = 10_000.0;
/// Free space kept beyond the estimate: side files, indexes, rounding.
const SPACE_SLACK_BYTES: u64 = 256 << 20;
/// Checkpoint bytes budgeted per message (fresh entry and dedupe entry,
/// serialized) in the space estimate; generous on purpose.
const CHECKPOINT_BYTES_PER_MESSAGE_ESTIMATE: u64 = 96;
/// Broker time of the first enqueue.
const START_MS: Millis = 1_700_000_000_000;
/// The partition's directory (side files) under the run directory.
const PARTITION_DIR: &str = "p0";
/// The shard journal's directory under the run directory.
const SHARD_DIR: &str = "shard";
/// The one partition: queue 1, partition 0.
const QUEUE_ID: QueueId = QueueId(1);
const PARTITION: PartitionId = PartitionId(0);
/// The broker secret the partition's tokens would be made with.
const SECRET: [u8; 32] = [0x5b; 32];
/// Prefix and suffix of a sealed dedupe generation's side file
/// (`partition::dedupe_files`).
const GENERATION_FILE_PREFIX: &str = "dedupe-";
const GENERATION_FILE_SUFFIX: &str = ".gen";

/// What to run: the `recovery` subcommand's flags (one definition, with
/// their defaults: the capacity model's backlog, 7.2 M records of 1.6 KiB in
/// batches of 100).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct RecoveryConfig {
    #[command(flatten)]
    pub pinned: PinnedRun,
    #[arg(long, default_value_t = 7_200_000)]
    pub messages: u64,
    /// Inline payload bytes per record (1.6 KiB by default).
    #[arg(long, default_value_t = 1_638)]
    pub record_bytes: u64,
    /// Records per data batch.
    #[arg(long, default_value_t = 100)]
    pub batch_records: u64,
    /// Concurrent enqueue tasks.
    #[arg(long, default_value_t = 8)]
    pub enqueuers: u64,
    /// Simulated enqueue rate: the broker clock advances 1/rate s per message.
    #[arg(long, default_value_t = 25_000)]
    pub rate_per_s: u64,
    /// spoold's `segment_bytes`: the size of each shard journal file.
    #[arg(long, default_value_t = SEGMENT_BYTES_DEFAULT)]
    pub segment_bytes: u64,
}

impl RecoveryConfig {
    fn validate(&self) -> Result<(), BenchError> {
        let check = BenchError::check_range;
        check("messages", self.messages, 1, MESSAGES_MAX)?;
        check("record_bytes", self.record_bytes, 0, PAYLOAD_INLINE_BYTES_MAX as u64)?;
        check("batch_records", self.batch_records, 1, u64::from(BATCH_RECORDS_MAX))?;
        check("enqueuers", self.enqueuers, 1, ENQUEUERS_MAX)?;
        check("rate_per_s", self.rate_per_s, 1, RATE_PER_S_MAX)?;
        check("segment_bytes", self.segment_bytes, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)?;
        Ok(())
    }

    fn batches(&self) -> u64 {
        self.messages.div_ceil(self.batch_records)
    }

    /// Broker time at which message `n` is enqueued.
    fn enqueue_time_ms(&self, n: u64) -> Millis {
        START_MS + n * 1000 / self.rate_per_s
    }

    fn log_config(&self) -> LogConfig {
        LogConfig { segment_bytes: self.segment_bytes, ..LogConfig::default() }
    }
}

/// One timed reopen.
#[derive(Clone, Debug, Serialize)]
pub struct Reopen {
    /// From the call to a serving partition: the shard journal's recovery
    /// scan, checkpoint load and restore (dedupe generation files
    /// included), the ordered replay, the epoch write, the epoch fence.
    pub recovery_ms: f64,
    /// `recovery_ms` in its parts.
    #[serde(flatten)]
    pub timings: OpenTimings,
    pub checkpoint_covers: Option<u64>,
    pub replayed_batches: u64,
    pub replayed_events: u64,
    /// Where the journal's recovery scan started (the checkpoint's scan
    /// start, or the oldest journal file).
    pub journal_scan_start: u64,
    /// Journal entries the shard's recovery scan found (its crc scan).
    pub journal_entries: u64,
    /// Journal files that scan read.
    pub journal_files_scanned: usize,
    /// The shard's ordered replay took the partition (its open only ran
    /// the epoch fence); false: the open replayed on its own.
    pub shard_replayed: bool,
    /// Journal entries the ordered replay read, and their bytes.
    pub shard_replay_entries: u64,
    pub shard_replay_entry_bytes: u64,
    /// Live messages after the reopen (must equal `messages`).
    pub live_messages: u64,
}

/// The one JSON object a run prints.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryReport {
    pub scenario: &'static str,
    pub messages: u64,
    pub record_bytes: u64,
    pub batch_records: u64,
    /// Bytes of one full data batch as the producer sends it.
    pub batch_bytes: u64,
    /// Sum of the sizes of every file in the partition directory and the
    /// shard journal after the build (journal files are pre-zeroed at full
    /// size, so the newest and the prepared one count whole).
    pub bytes_on_disk: u64,
    pub checkpoint_bytes: u64,
    /// Sealed dedupe generations the build's last checkpoint refers to, and
    /// the generation side files in the partition directory after it (the
    /// reopen with the checkpoint reads every one).
    pub dedupe_generations: usize,
    pub dedupe_generation_files: u64,
    pub dedupe_generation_bytes: u64,
    /// `ShardJournal::open` alone from the oldest journal file: the full
    /// recovery scan (every journal file, every entry crc-checked): what a
    /// reopen without a usable checkpoint pays before its replay.
    pub log_scan_ms: f64,
    /// `ShardJournal::open` alone from the checkpoint's scan start: files
    /// wholly below it are not read; what a reopen with a checkpoint pays.
    pub log_scan_from_checkpoint_ms: f64,
    /// Reading the checkpoint side file alone (`files::read_side_file`:
    /// serial 1 MiB O_DIRECT reads, crc check).
    pub checkpoint_read_ms: f64,
    /// `Partition::restore_checkpoint` alone: the snapshot and the dedupe
    /// generation files it refers to, decoded into the state as the open
    /// does it.
    pub checkpoint_restore_ms: f64,
    /// Building the backlog: enqueue calls to the last one durable.
    pub build_ms: f64,
    pub build_messages_per_s: f64,
    pub with_checkpoint: Reopen,
    pub without_checkpoint: Reopen,
    pub target_recovery_ms_with_checkpoint: f64,
    pub enqueuers: u64,
    pub rate_per_s: u64,
    pub segment_bytes: u64,
    /// The journal's file size (`JournalConfig::for_partitions`, as spoold
    /// derives it from `segment_bytes`).
    pub journal_file_bytes: u64,
}

/// Bytes free to an unprivileged writer on the filesystem holding `path`.
fn available_bytes(path: &Path) -> Result<u64, BenchError> {
    let io_error = |source| BenchError::Dir { action: "statvfs", path: path.to_path_buf(), source };
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|error| io_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, error)))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid NUL-terminated string and `stats` a valid
    // out-pointer for the duration of the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) };
    if rc != 0 {
        return Err(io_error(std::io::Error::last_os_error()));
    }
    // Both are u64 on 64-bit Linux but narrower elsewhere; keep the widening.
    #[allow(clippy::useless_conversion)]
    let (blocks, block_bytes) = (u64::from(stats.f_bavail), u64::from(stats.f_frsize));
    Ok(blocks.saturating_mul(block_bytes))
}

/// Sum of the file sizes under `dir` (not recursive: a partition is flat).
fn dir_bytes(dir: &Path) -> Result<u64, BenchError> {
    let io_error = |source| BenchError::Dir { action: "list", path: dir.to_path_buf(), source };
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let metadata = entry.and_then(|entry| entry.metadata()).map_err(io_error)?;
        if metadata.is_file() {
            total += metadata.len();
        }
    }
    Ok(total)
}

/// The sealed dedupe generation side files in the partition directory
/// `dir`: how many, and their bytes.
fn generation_files(dir: &Path) -> Result<(u64, u64), BenchError> {
    let io_error = |source| BenchError::Dir { action: "list", path: dir.to_path_buf(), source };
    let (mut count, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(GENERATION_FILE_PREFIX) && name.ends_with(GENERATION_FILE_SUFFIX) {
            count += 1;
            bytes += entry.metadata().map_err(io_error)?.len();
        }
    }
    Ok((count, bytes))
}

/// Data batch number `index`: records `index × batch_records ..`, each with
/// a distinct message id, stamped with the broker time of its first record.
fn build_batch(config: &RecoveryConfig, index: u64) -> Result<(BatchBytes, Millis), BenchError> {
    let first = index * config.batch_records;
    let last = (first + config.batch_records).min(config.messages);
    let stamp_ms = config.enqueue_time_ms(first);
    let mut builder =
        DataBatchBuilder::with_capacity(((last - first) * (config.record_bytes + 128)) as usize);
    for n in first..last {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&n.to_le_bytes());
        id[8..].copy_from_slice(b"recovery");
        builder.push(&Record {
            message_id: MessageId(id),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(vec![(n % 251) as u8; config.record_bytes as usize]),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: stamp_ms,
        })?;
    }
    Ok((builder.finish()?, stamp_ms))
}

fn queue_config() -> QueueConfig {
    QueueConfig {
        max_messages: QUEUE_MESSAGES_MAX,
        max_bytes: QUEUE_BYTES_MAX,
        ..QueueConfig::default()
    }
}

/// Runs the scenario on a new glommio executor pinned to `--core`, in a
/// fresh directory under `--dir` ([`PinnedRun`]).
///
/// # Errors
/// [`BenchError::OutOfRange`], [`BenchError::InsufficientSpace`] before
/// anything is written, [`BenchError::Executor`], [`BenchError::Dir`], any
/// partition error, and [`BenchError::Scenario`] when a reopen does not
/// recover every message.
pub fn run(config: &RecoveryConfig) -> Result<RecoveryReport, BenchError> {
    config.validate()?;
    let (sample, _) = build_batch(config, 0)?;
    let batch_bytes = sample.len() as u64;
    drop(sample);
    let per_message_bytes = batch_bytes.div_ceil(config.batch_records.min(config.messages));
    let needed_bytes = config.messages * per_message_bytes
        + config.messages * CHECKPOINT_BYTES_PER_MESSAGE_ESTIMATE
        + 2 * config.segment_bytes
        + SPACE_SLACK_BYTES;
    let available = available_bytes(&config.pinned.dir)?;
    if available < needed_bytes {
        return Err(BenchError::InsufficientSpace {
            dir: config.pinned.dir.clone(),
            needed_bytes,
            available_bytes: available,
        });
    }
    config.pinned.run("recovery", |dir| async move { measure(config, &dir, batch_bytes).await })
}

/// An open partition, its background task, its shard journal and that
/// journal's task, and what the open found on the way.
struct Opened {
    partition: Rc<Partition<DmaStorage>>,
    task: glommio::task::JoinHandle<()>,
    shard: Rc<ShardJournal<DmaStorage>>,
    journal_task: glommio::task::JoinHandle<()>,
    report: OpenReport,
    journal: spool_broker::log::journal::RecoveryReport,
    /// The shard's ordered replay (`None` on the first open: the handles
    /// table did not know the partition yet, so spoold would not run it).
    shard_replay: Option<ShardReplayReport>,
    timings: OpenTimings,
}

/// The parts of one open, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct OpenTimings {
    /// `ShardJournal::open`: the handles table and the journal's recovery
    /// scan from the scan start.
    pub journal_open_ms: f64,
    /// `replay_journal_shard`: checkpoint restore (with its dedupe
    /// generation files) and the ordered replay of the entries after it.
    pub shard_replay_ms: f64,
    /// The epoch write (`open_partitions`) and `Partition::open_journal`
    /// (the journal view, the epoch fence).
    pub partition_open_ms: f64,
}

fn journal_error(error: JournalError) -> BenchError {
    BenchError::Partition(Box::new(PartitionError::Journal(error)))
}

fn ms_since(start: spool_broker::clock::Instant) -> f64 {
    instant_now().duration_since(start).as_secs_f64() * 1000.0
}

/// The position of the oldest journal file in `journal_dir` (0 without
/// one), where spoold starts the scan for a partition without a checkpoint.
fn oldest_journal_file(journal_dir: &Path) -> Result<JournalPos, BenchError> {
    let io_error =
        |source| BenchError::Dir { action: "list", path: journal_dir.to_path_buf(), source };
    let names = match std::fs::read_dir(journal_dir) {
        Ok(names) => names,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(JournalPos(0)),
        Err(error) => return Err(io_error(error)),
    };
    let mut oldest = None::<u64>;
    for entry in names {
        let entry = entry.map_err(io_error)?;
        if let Some(base) = entry.file_name().to_str().and_then(parse_journal_file_name) {
            oldest = Some(oldest.map_or(base, |least| least.min(base)));
        }
    }
    Ok(JournalPos(oldest.unwrap_or(0)))
}

fn partition_name() -> PartitionName {
    PartitionName { queue: "bench".into(), queue_id: QUEUE_ID, partition: PARTITION }
}

/// Opens the partition as `spoold` starts a shard: the shard journal
/// recovered from the partition's checkpoint scan start (the oldest file
/// without one), the shard's ordered replay when the handles table knows
/// the partition, its new epoch made durable, then the partition's open
/// taking the replayed state (or replaying itself when the pass left it
/// out, meeting the same error).
async fn open(
    dir: &Path,
    config: &RecoveryConfig,
    clock: &Rc<Cell<Millis>>,
    fatal: &Rc<RecordFatal>,
) -> Result<Opened, BenchError> {
    let partition_dir = dir.join(PARTITION_DIR);
    let shard_dir = dir.join(SHARD_DIR);
    let began = instant_now();
    let scan_start = if partition_dir.is_dir() {
        Partition::<DmaStorage>::journal_scan_start(&DmaStorage, &partition_dir).await?
    } else {
        None
    };
    let start = match scan_start {
        Some(start) => start,
        None => oldest_journal_file(&shard_dir.join(JOURNAL_DIR_NAME))?,
    };
    create_dir_durable(&DmaStorage, &shard_dir).await.map_err(LogError::Io)?;
    let journal_config = JournalConfig::for_partitions(&config.log_config());
    let (shard, mut recovery) =
        ShardJournal::open(DmaStorage, &shard_dir, journal_config, start, fatal.clone())
            .await
            .map_err(journal_error)?;
    crate::log_append::as_spoold(shard.journal());
    let journal_task = glommio::spawn_local(shard.background()).detach();
    let journal_open_ms = ms_since(began);

    let began = instant_now();
    let target = HandleTarget { queue_id: QUEUE_ID.0, partition: PARTITION };
    let known = shard.handles().handle_of(target).filter(|_| partition_dir.is_dir());
    let (mut replayed, shard_replay) = match known {
        Some(handle) => {
            let targets = vec![ShardReplayTarget {
                handle,
                dir: partition_dir.clone(),
                queue: QUEUE_ID,
                partition: PARTITION,
                config: queue_config(),
            }];
            let (replayed, report) = replay_journal_shard(
                &DmaStorage,
                shard.journal(),
                &recovery.routed.partitions,
                targets,
                SECRET,
            )
            .await;
            (replayed, Some(report))
        }
        None => (HashMap::new(), None),
    };
    let shard_replay_ms = ms_since(began);

    let began = instant_now();
    create_dir_durable(&DmaStorage, &partition_dir).await.map_err(LogError::Io)?;
    // As spoold: the epoch side file is a floor only when the handles table
    // holds no epoch for the partition.
    let in_table =
        shard.handles().handle_of(target).and_then(|handle| shard.handles().epoch(handle));
    let floor = match in_table {
        Some(epoch) if epoch > 0 => 0,
        _ => Partition::<DmaStorage>::journal_epoch_floor(&DmaStorage, &partition_dir).await?,
    };
    let opened =
        shard.open_partitions(&[(QUEUE_ID.0, PARTITION, floor)]).await.map_err(journal_error)?;
    let (handle, epoch) = opened
        .first()
        .copied()
        .ok_or_else(|| journal_error(JournalError::Failed("no epoch was opened".into())))?;
    let routed = recovery.routed.partitions.remove(&handle).unwrap_or_default();
    let now = clock.clone();
    let partition_clock: Clock = Rc::new(move || now.get());
    let (partition, background, report) = Partition::open_journal(
        DmaStorage,
        &partition_dir,
        partition_name(),
        queue_config(),
        JournalOpen {
            shard: shard.clone(),
            handle,
            epoch,
            routed,
            replayed: replayed.remove(&handle),
        },
        SECRET,
        fatal.clone(),
        partition_clock,
    )
    .await?;
    let task = glommio::spawn_local(background).detach();
    let timings =
        OpenTimings { journal_open_ms, shard_replay_ms, partition_open_ms: ms_since(began) };
    Ok(Opened {
        partition,
        task,
        shard,
        journal_task,
        report,
        journal: recovery.report,
        shard_replay,
        timings,
    })
}

async fn close(opened: Opened, fatal: &RecordFatal) -> Result<(), BenchError> {
    opened.partition.close().await?;
    opened.task.await;
    opened.shard.close();
    opened.journal_task.await;
    if let Some(reason) = fatal.reasons().first() {
        return Err(BenchError::Log(LogError::Failed(reason.message.clone())));
    }
    Ok(())
}

/// Reopens, times it, checks every message came back, and closes again.
async fn reopen(
    dir: &Path,
    config: &RecoveryConfig,
    clock: &Rc<Cell<Millis>>,
    fatal: &Rc<RecordFatal>,
) -> Result<Reopen, BenchError> {
    let start = instant_now();
    let opened = open(dir, config, clock, fatal).await?;
    let recovery_ms = ms_since(start);
    let report = &opened.report;
    let live_messages = opened.partition.counters().live_messages;
    let shard_replay = opened.shard_replay.clone().unwrap_or_default();
    let reopen = Reopen {
        recovery_ms,
        timings: opened.timings,
        checkpoint_covers: report.checkpoint_covers.map(|offset| offset.0),
        replayed_batches: report.replayed_batches,
        replayed_events: report.replayed_events,
        journal_scan_start: opened.journal.start.0,
        journal_entries: opened.journal.entries,
        journal_files_scanned: opened.journal.files_scanned,
        shard_replayed: shard_replay.replayed == 1,
        shard_replay_entries: shard_replay.entries,
        shard_replay_entry_bytes: shard_replay.entry_bytes,
        live_messages,
    };
    close(opened, fatal).await?;
    if live_messages != config.messages {
        return Err(BenchError::Scenario(format!(
            "reopen recovered {live_messages} of {} messages",
            config.messages
        )));
    }
    Ok(reopen)
}

/// Times the shard journal's recovery alone from `start` (the full scan
/// from the oldest file, or from the checkpoint's scan start), then closes
/// it again.
async fn time_journal_open(
    dir: &Path,
    config: &RecoveryConfig,
    fatal: &Rc<RecordFatal>,
    start: JournalPos,
) -> Result<f64, BenchError> {
    let began = instant_now();
    let journal_config = JournalConfig::for_partitions(&config.log_config());
    let (shard, _recovery) =
        ShardJournal::open(DmaStorage, &dir.join(SHARD_DIR), journal_config, start, fatal.clone())
            .await
            .map_err(journal_error)?;
    let scan_ms = ms_since(began);
    let background = glommio::spawn_local(shard.background());
    shard.close();
    background.await;
    if let Some(reason) = fatal.reasons().first() {
        return Err(BenchError::Log(LogError::Failed(reason.message.clone())));
    }
    Ok(scan_ms)
}

/// Times reading the checkpoint file, and restoring the state from it as
/// the partition's open does (dedupe generation files included), each
/// alone. Returns both and the checkpoint's scan start.
async fn time_checkpoint_load(dir: &Path) -> Result<(f64, f64, JournalPos), BenchError> {
    let partition_dir = dir.join(PARTITION_DIR);
    let start = instant_now();
    let file =
        files::read_side_file(&DmaStorage, &partition_dir, CHECKPOINT_FILE, CHECKPOINT_MAGIC)
            .await
            .map_err(|error| BenchError::Partition(Box::new(error.into())))?
            .ok_or_else(|| BenchError::Scenario("the build left no checkpoint".to_owned()))?;
    let read_ms = ms_since(start);
    let ctx = PartitionContext {
        queue: QUEUE_ID,
        partition: PARTITION,
        epoch: LeaderEpoch(u64::MAX),
        secret: SECRET,
        config: queue_config(),
    };
    let start = instant_now();
    let (restored, covers) =
        Partition::<DmaStorage>::restore_checkpoint(&DmaStorage, &partition_dir, ctx).await?;
    let restore_ms = ms_since(start);
    if covers.is_none() {
        return Err(BenchError::Scenario("the checkpoint restored nothing".to_owned()));
    }
    drop(restored);
    Ok((read_ms, restore_ms, JournalPos(file.value)))
}

/// One enqueue task: takes the next batch number until none is left.
async fn enqueuer(
    partition: Rc<Partition<DmaStorage>>,
    config: Rc<RecoveryConfig>,
    next_batch: Rc<Cell<u64>>,
    clock: Rc<Cell<Millis>>,
) -> Result<(), BenchError> {
    loop {
        let index = next_batch.get();
        if index >= config.batches() {
            return Ok(());
        }
        next_batch.set(index + 1);
        let (batch, stamp_ms) = build_batch(&config, index)?;
        // Tasks finish out of order; the clock only moves forward.
        clock.set(clock.get().max(stamp_ms));
        partition.enqueue(&batch).await?;
    }
}

async fn measure(
    config: &RecoveryConfig,
    dir: &Path,
    batch_bytes: u64,
) -> Result<RecoveryReport, BenchError> {
    let clock = Rc::new(Cell::new(START_MS));
    let fatal = Rc::new(RecordFatal::default());

    let build_start = instant_now();
    let opened = open(dir, config, &clock, &fatal).await?;
    let shared = Rc::new(config.clone());
    let next_batch = Rc::new(Cell::new(0));
    let tasks: Vec<_> = (0..config.enqueuers)
        .map(|_| {
            glommio::spawn_local(enqueuer(
                opened.partition.clone(),
                shared.clone(),
                next_batch.clone(),
                clock.clone(),
            ))
        })
        .collect();
    let mut first_error = None;
    for task in tasks {
        if let Err(error) = task.await {
            first_error.get_or_insert(error);
        }
    }
    let build_ms = ms_since(build_start);
    if let Some(error) = first_error {
        // Best effort: the build already failed, report that error.
        let _ = close(opened, &fatal).await;
        return Err(error);
    }
    opened.partition.checkpoint().await?;
    let partition = opened.partition.clone();
    // Closing writes the final checkpoint, the one the reopen restores.
    close(opened, &fatal).await?;
    let dedupe_generations = partition.last_checkpoint().map_or(0, |stats| stats.generations);
    drop(partition);
    let partition_dir = dir.join(PARTITION_DIR);
    let journal_dir = dir.join(SHARD_DIR).join(JOURNAL_DIR_NAME);
    let bytes_on_disk = dir_bytes(&partition_dir)? + dir_bytes(&journal_dir)?;
    let (dedupe_generation_files, dedupe_generation_bytes) = generation_files(&partition_dir)?;
    let checkpoint_path = partition_dir.join(CHECKPOINT_FILE);
    let checkpoint_bytes = std::fs::metadata(&checkpoint_path)
        .map_err(|source| BenchError::Dir {
            action: "stat",
            path: checkpoint_path.clone(),
            source,
        })?
        .len();

    let oldest = oldest_journal_file(&journal_dir)?;
    let log_scan_ms = time_journal_open(dir, config, &fatal, oldest).await?;
    let (checkpoint_read_ms, checkpoint_restore_ms, scan_start) = time_checkpoint_load(dir).await?;
    let log_scan_from_checkpoint_ms = time_journal_open(dir, config, &fatal, scan_start).await?;
    let with_checkpoint = reopen(dir, config, &clock, &fatal).await?;
    // Closing wrote a fresh checkpoint; remove it so the next open replays all.
    std::fs::remove_file(&checkpoint_path).map_err(|source| BenchError::Dir {
        action: "remove",
        path: checkpoint_path.clone(),
        source,
    })?;
    let without_checkpoint = reopen(dir, config, &clock, &fatal).await?;

    Ok(RecoveryReport {
        scenario: "recovery",
        messages: config.messages,
        record_bytes: config.record_bytes,
        batch_records: config.batch_records,
        batch_bytes,
        bytes_on_disk,
        checkpoint_bytes,
        dedupe_generations,
        dedupe_generation_files,
        dedupe_generation_bytes,
        log_scan_ms,
        log_scan_from_checkpoint_ms,
        checkpoint_read_ms,
        checkpoint_restore_ms,
        build_ms,
        build_messages_per_s: config.messages as f64 / (build_ms / 1000.0).max(f64::MIN_POSITIVE),
        with_checkpoint,
        without_checkpoint,
        target_recovery_ms_with_checkpoint: TARGET_RECOVERY_MS_WITH_CHECKPOINT,
        enqueuers: config.enqueuers,
        rate_per_s: config.rate_per_s,
        segment_bytes: config.segment_bytes,
        journal_file_bytes: JournalConfig::for_partitions(&config.log_config()).file_bytes,
    })
}

impl From<PartitionError> for BenchError {
    fn from(error: PartitionError) -> Self {
        BenchError::Partition(Box::new(error))
    }
}
