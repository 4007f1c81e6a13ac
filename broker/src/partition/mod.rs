//! A partition: one segment log plus the queue state folded from it.
//!
//! Owns the order of every state change: **decide → append → apply → sync →
//! reply**. The pure state machine (`queue/`) decides which events a request
//! produces; the log assigns their offsets synchronously at append; the state
//! applies them at once (so the next decision sees them); the reply waits for
//! the commit that holds them to be durable. Because the log's durable
//! watermark is contiguous, a reply that waited for its own events has also
//! waited for every event it depended on.
//!
//! Claims, extends and releases are the exception: **decide → append →
//! apply → reply**, without waiting for their commit. That is safe because
//! (1) a claim hands out only records below the log's durable watermark
//! (the decision takes it as an argument), so a reply never names a record
//! a crash could lose, and (2) the epoch fence at open: every claim still
//! outstanding after replay was made under an older epoch, whose tokens are
//! refused, and is ended at once (`PartitionState::fence`) with events made
//! durable before the partition serves. A claim (or extend, or release)
//! lost before its sync is therefore the same as one the fence ended. Acks,
//! enqueues, redrives and purges still reply only once durable.
//! `docs/design/queue-semantics.md` ("Claims before their sync") has the
//! argument.
//!
//! Recovery is the same fold: load the newest checkpoint (a snapshot of the
//! state at offset X), replay the log from X, then the epoch fence. The
//! leader epoch is kept in a side file and incremented every time the
//! partition is opened, before any token can be issued, so tokens of an
//! earlier open are stale.
//!
//! Does not own: sockets or frames (`net/`, `server/`), timers (the shard's
//! housekeeping tick calls [`Partition::tick`]), the clock (a [`Clock`] is
//! passed in), or glommio (the log's background future is handed to the
//! caller to spawn).
//!
//! Enqueue time: a record's `enqueue_time_ms` is stamped by the producer and
//! is inside the batch crc, so replay sees the same value the live path did.
//! The broker refuses records whose stamp is further than
//! [`ENQUEUE_CLOCK_SKEW_MS_MAX`] from its own clock, and records whose
//! `not_before_ms` or `expiry_ms` lies beyond `SCHEDULE_HORIZON_MS` (365
//! days) from it, or that would expire before they are due
//! (`INVALID_ARGUMENT`, nothing of the batch stored).

mod epoch;
pub mod files;
pub mod signal;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::batch::{BatchBytes, BatchHeader, BatchKind, BatchView, ControlBatchBuilder};
use spool_wire::limits::SCHEDULE_HORIZON_MS;
use spool_wire::{ErrorCode, WireError};
use thiserror::Error;

use crate::io::{IoOp, Storage};
use crate::log::{
    FatalCode, FatalHandler, FatalReason, Log, LogConfig, LogError, Offset as LogOffset,
    SharedBytes, Ticket,
};
use crate::queue::{
    ApplyError, ClaimRequest, CodecError, Delivery, DeliveryToken, EnqueueDecision, EnqueueMeta,
    EnqueueRequest, Event, Lane, LeaderEpoch, MessageId, MessageView, Millis, Offset,
    PartitionContext, PartitionId, PartitionState, QueueConfig, QueueCounters, QueueError, QueueId,
    Redrive, ReleaseReason, CLAIMED_EVENT_BYTES, EVENT_BYTES,
};
use files::{SideFileError, CHECKPOINT_FILE, CHECKPOINT_MAGIC};
use signal::{ClaimCancel, Signal, WaitOwner, WaitRefused, CLAIM_WAITERS_MAX};

/// Furthest a producer's `enqueue_time_ms` may be from the broker clock.
pub const ENQUEUE_CLOCK_SKEW_MS_MAX: Millis = 5 * 60 * 1000;
/// Bytes read from the log per step of recovery replay.
pub const REPLAY_READ_BYTES: u64 = 8 << 20;
/// Most one claim or peek reads ahead of a record it needs (one
/// segment-file read of at most this much; see `read_ahead_bytes`).
pub const READ_AHEAD_BYTES_MAX: u64 = crate::limits::SCAN_CHUNK_BYTES;
/// Framing counted per record when sizing a read-ahead: its position-table
/// entry, archive fields and alignment.
const READ_AHEAD_RECORD_SLACK_BYTES: u64 = 96;
/// Table entries one checkpoint step visits before it yields the shard. An
/// entry costs ≈ 70 ns to encode (the whole-state snapshot took ≈ 70 ms
/// per million messages), so a step holds the executor well under 1 ms.
pub const CHECKPOINT_STEP_ENTRIES: usize = 8192;
/// Most bytes one checkpoint step produces (its largest entry is a dead
/// letter's 72 bytes; a band count or the header adds a few): the encode
/// buffer a checkpoint holds besides the file's one write chunk.
pub const CHECKPOINT_STEP_BYTES_MAX: usize = CHECKPOINT_STEP_ENTRIES * 72 + 4096;
/// Log bytes appended since the last checkpoint that make the next
/// housekeeping pass write a new one.
pub const CHECKPOINT_INTERVAL_BYTES: u64 = 256 << 20;
/// Log offsets (records and events) appended since the last checkpoint that
/// also make the next housekeeping pass write one. Replay cost follows the
/// number of events, not their bytes: a small-message workload would
/// otherwise replay millions of events (256 MiB of 100-byte records) on
/// every restart. The kill loop found restart times growing without bound
/// under the byte trigger alone.
pub const CHECKPOINT_INTERVAL_OFFSETS: u64 = 1 << 16;
/// How often a partition whose log is out of disk space asks it to try
/// preparing the next segment again (each try writes zeros until the disk
/// is full again, so not every tick).
pub const DISK_FULL_RETRY_MS: Millis = 1_000;
/// Most events one control batch carries.
pub const CONTROL_BATCH_EVENTS_MAX: usize = 4096;
/// Bytes of batch header and position-table slack reserved per control batch
/// when asking the log for room.
const CONTROL_BATCH_OVERHEAD_BYTES: u64 = 64 + 8;

/// Reads the broker clock. Injected so tests can drive time.
pub type Clock = Rc<dyn Fn() -> Millis>;

/// Names one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionName {
    pub queue: String,
    pub queue_id: QueueId,
    pub partition: PartitionId,
}

/// Why a partition operation failed. [`PartitionError::code`] maps it onto the
/// stable wire code.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PartitionError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("batch rejected: {0}")]
    Batch(#[from] WireError),
    #[error("batch kind must be data for an enqueue")]
    NotData,
    #[error("batch flags {0:#x} are not allowed on enqueue")]
    Flags(u32),
    #[error("record {index}: enqueue_time_ms {stamp_ms} is more than {ENQUEUE_CLOCK_SKEW_MS_MAX} ms from the broker clock {now_ms}")]
    ClockSkew { index: usize, stamp_ms: Millis, now_ms: Millis },
    #[error(
        "record {index}: {field} {value_ms} is {} days past the broker clock {now_ms}; the \
         horizon is {} days ({SCHEDULE_HORIZON_MS} ms)",
        value_ms.saturating_sub(*now_ms) / DAY_MS,
        SCHEDULE_HORIZON_MS / DAY_MS
    )]
    BeyondHorizon { index: usize, field: &'static str, value_ms: Millis, now_ms: Millis },
    #[error(
        "record {index}: expiry_ms {expiry_ms} is not after not_before_ms {not_before_ms}: it \
         would expire before it could be delivered"
    )]
    ExpiresBeforeDue { index: usize, not_before_ms: Millis, expiry_ms: Millis },
    #[error("queue is full (its {limit} limit)")]
    QueueFull { limit: crate::queue::FullLimit },
    #[error("delivery token: {0}")]
    Token(CodecError),
    #[error("side file: {0}")]
    SideFile(#[from] SideFileError),
    #[error("recovery of {dir}: {reason}")]
    Recovery { dir: PathBuf, reason: String },
    /// A message the state holds as live has no data record at its offset in
    /// the log (or its batch left the read cache mid-request): the state and
    /// the log disagree, which is a broker bug, not a client's or the disk's
    /// (a failed or corrupt read is a [`LogError`]).
    #[error("read of {dir} at offset {offset}: {reason}")]
    ReadMiss { dir: PathBuf, offset: Offset, reason: &'static str },
    #[error("too many claims are waiting on this partition ({CLAIM_WAITERS_MAX})")]
    TooManyWaiters,
    #[error("this connection already has {waiting_max} claims waiting (claim_waiters_per_connection_max)")]
    TooManyWaitersOnConnection { waiting_max: usize },
    #[error("queue config: {0}")]
    Config(#[from] crate::queue::ConfigError),
}

impl PartitionError {
    /// The wire error code a client sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            // Every variant by name (no wildcard): a new queue error must
            // choose its code here.
            PartitionError::Queue(error) => match error {
                QueueError::InvalidToken(_) => ErrorCode::InvalidToken,
                QueueError::StaleToken(_) => ErrorCode::StaleToken,
                QueueError::LeaseOutOfRange { .. } => ErrorCode::LeaseOutOfRange,
                QueueError::LeaseLifetimeExhausted { .. } => ErrorCode::LeaseLifetimeExceeded,
                QueueError::CreditsOutOfRange { .. }
                | QueueError::ReleaseDelayTooLong { .. }
                | QueueError::PriorityOutOfRange { .. }
                | QueueError::NotRedrivable(_) => ErrorCode::InvalidArgument,
                // The request held more than one control batch of tokens: the
                // rest succeed when sent again.
                QueueError::AdmissionBatchFull { .. } => ErrorCode::Throttled,
            },
            PartitionError::Log(LogError::Backpressure { .. }) => ErrorCode::Throttled,
            PartitionError::Log(LogError::Closed) => ErrorCode::ShuttingDown,
            PartitionError::Log(LogError::DiskFull) => ErrorCode::DiskFull,
            PartitionError::Log(LogError::InvalidBatch(_))
            | PartitionError::Log(LogError::BatchTooLarge { .. }) => ErrorCode::BatchInvalid,
            PartitionError::Log(_) => ErrorCode::StorageFailed,
            PartitionError::Batch(WireError::RecordTooLarge { .. }) => ErrorCode::RecordTooLarge,
            PartitionError::Batch(_)
            | PartitionError::NotData
            | PartitionError::Flags(_)
            | PartitionError::ClockSkew { .. } => ErrorCode::BatchInvalid,
            PartitionError::BeyondHorizon { .. } | PartitionError::ExpiresBeforeDue { .. } => {
                ErrorCode::InvalidArgument
            }
            PartitionError::QueueFull { .. } => ErrorCode::QueueFull,
            PartitionError::Token(_) => ErrorCode::InvalidToken,
            PartitionError::TooManyWaiters | PartitionError::TooManyWaitersOnConnection { .. } => {
                ErrorCode::Throttled
            }
            PartitionError::SideFile(_) | PartitionError::Recovery { .. } => {
                ErrorCode::StorageFailed
            }
            PartitionError::ReadMiss { .. } => ErrorCode::Internal,
            PartitionError::Config(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// What happened to one record of an enqueued batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    Appended { offset: Offset },
    Duplicate { original: Offset },
}

/// One claimed message and its record bytes (exactly as the producer sent
/// them, 8-aligned rkyv archive).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery: Delivery,
    /// The record, as a range of the batch the log holds it in (no copy).
    pub record: SharedBytes,
}

/// A live message and its record bytes, for peeks.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub view: MessageView,
    pub record: Vec<u8>,
}

/// What [`Partition::open`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    pub epoch: LeaderEpoch,
    pub checkpoint_covers: Option<Offset>,
    pub replayed_batches: u64,
    pub replayed_events: u64,
    /// Claims of an older epoch ended by the epoch fence (released, or
    /// quarantined / expired as a release would have).
    pub fenced_claims: u64,
    pub next_offset: Offset,
    pub log: crate::log::RecoveryReport,
}

/// What one checkpoint cost: it was written in `steps` steps of at most
/// `max_step_entries` table entries each, yielding the shard between them;
/// `touched` messages changed while it was written (their before-images
/// were held until it ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStats {
    pub covers: Offset,
    pub steps: u64,
    pub max_step_entries: usize,
    pub bytes: u64,
    pub touched: usize,
}

/// Ends the state's snapshot capture however a checkpoint ends (done,
/// failed, or its future dropped), so before-images are never held on.
struct CaptureGuard<'a>(&'a RefCell<PartitionState>);

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.try_borrow_mut() {
            state.end_snapshot();
        }
    }
}

/// One partition: its log, its state, its waiters.
pub struct Partition<S: Storage + Clone> {
    name: PartitionName,
    dir: PathBuf,
    storage: S,
    log: Log<S>,
    state: RefCell<PartitionState>,
    clock: Clock,
    epoch: LeaderEpoch,
    /// Waiting claims, woken when messages may have become claimable (see
    /// [`signal`]).
    claimable: Signal,
    /// Ticket of the newest append, so a checkpoint can wait for durability.
    last_ticket: RefCell<Option<Ticket>>,
    checkpoint_covers: Cell<u64>,
    checkpoint_running: Cell<bool>,
    last_checkpoint: Cell<Option<CheckpointStats>>,
    /// Told when a sync of this partition's files fails (production: exit).
    fatal: Rc<dyn FatalHandler>,
    /// A checkpoint's fdatasync or directory sync failed: no checkpoint is
    /// tried again (see [`Partition::checkpoint`]).
    sync_failed: Cell<bool>,
    closed: Cell<bool>,
    /// When the next disk-full retry may run ([`DISK_FULL_RETRY_MS`]).
    disk_retry_at_ms: Cell<Millis>,
    /// Told the state's next timer deadline after events are applied, so
    /// the shard's housekeeping can sleep until then (`shard/alarm.rs`).
    wakeup_hook: RefCell<Option<WakeupHook>>,
}

/// Receives a partition's next timer deadline (lease end, scheduled or
/// expiring message) whenever applied events may have brought it forward.
pub type WakeupHook = Rc<dyn Fn(Millis)>;

impl<S: Storage + Clone> std::fmt::Debug for Partition<S> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Partition")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

fn to_log(offset: Offset) -> LogOffset {
    LogOffset(offset.0)
}

/// Extracts the admission request of one archived record.
fn enqueue_request(view: &BatchView<'_>, index: usize) -> EnqueueRequest {
    let record = view.record(index);
    let expiry_ms = record.expiry_ms.to_native();
    EnqueueRequest {
        message_id: MessageId(record.message_id.0),
        priority: record.priority,
        not_before_ms: record.not_before_ms.to_native(),
        expiry_ms: (expiry_ms != 0).then_some(expiry_ms),
        // Bounded by RECORD_BYTES_MAX (validated), which fits u32.
        size_bytes: view.record_bytes(index).len() as u32,
    }
}

/// Milliseconds in a day, for messages.
const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Refuses a record whose `not_before_ms` or `expiry_ms` lies beyond
/// [`SCHEDULE_HORIZON_MS`] from `now_ms`, or that would expire before it is
/// due (both set, expiry not after not_before).
fn check_schedule(
    view: &BatchView<'_>,
    index: usize,
    now_ms: Millis,
) -> Result<(), PartitionError> {
    let record = view.record(index);
    let not_before_ms = record.not_before_ms.to_native();
    let expiry_ms = record.expiry_ms.to_native();
    let horizon_ms = now_ms.saturating_add(SCHEDULE_HORIZON_MS);
    for (field, value_ms) in [("not_before_ms", not_before_ms), ("expiry_ms", expiry_ms)] {
        if value_ms > horizon_ms {
            return Err(PartitionError::BeyondHorizon { index, field, value_ms, now_ms });
        }
    }
    if not_before_ms != 0 && expiry_ms != 0 && expiry_ms <= not_before_ms {
        return Err(PartitionError::ExpiresBeforeDue { index, not_before_ms, expiry_ms });
    }
    Ok(())
}

/// Bytes that are 8-aligned in memory (rkyv's archived types need it):
/// borrowed when they already are, copied into an aligned buffer otherwise.
enum Aligned<'a> {
    Borrowed(&'a [u8]),
    Owned(BatchBytes),
}

impl std::ops::Deref for Aligned<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Aligned::Borrowed(bytes) => bytes,
            Aligned::Owned(bytes) => bytes,
        }
    }
}

fn aligned(bytes: &[u8]) -> Aligned<'_> {
    if (bytes.as_ptr() as usize).is_multiple_of(8) {
        Aligned::Borrowed(bytes)
    } else {
        let mut copy = BatchBytes::with_capacity(bytes.len());
        copy.extend_from_slice(bytes);
        Aligned::Owned(copy)
    }
}

/// Data batches read back for one request, each with the byte range of
/// every record, so serving a record copies only that record.
#[derive(Default)]
struct BatchCache {
    /// Base offset → batch.
    batches: BTreeMap<u64, CachedBatch>,
}

/// Bytes one log read of a request may cover: the records (offset, size)
/// it still serves at or past `from`, plus their framing and the control
/// batches interleaved with them, at most `READ_AHEAD_BYTES_MAX`. Never
/// below 1 (the log returns at least the batch holding `from`).
fn read_ahead_bytes(from: Offset, remaining: impl Iterator<Item = (Offset, u32)>) -> u64 {
    let records: u64 = remaining
        .filter(|(offset, _)| *offset >= from)
        .map(|(_, size_bytes)| u64::from(size_bytes) + READ_AHEAD_RECORD_SLACK_BYTES)
        .sum();
    (records + records / 4).clamp(1, READ_AHEAD_BYTES_MAX)
}

struct CachedBatch {
    next_offset: u64,
    bytes: SharedBytes,
    /// (start, len) of each record inside `bytes`.
    records: Vec<(usize, usize)>,
}

impl CachedBatch {
    /// Indexes a batch the log read back and crc-checked (`header` is what
    /// its check returned), without checking the crcs a second time.
    fn new(bytes: SharedBytes, header: &BatchHeader) -> Result<Option<Self>, WireError> {
        if header.kind != BatchKind::Data {
            return Ok(None);
        }
        let records = {
            let view_bytes = aligned(&bytes);
            let view = verified_view(&view_bytes, header)?;
            let start = view_bytes.as_ptr() as usize;
            view.record_slices()
                .map(|slice| (slice.as_ptr() as usize - start, slice.len()))
                .collect()
        };
        Ok(Some(Self { next_offset: header.next_offset(), bytes, records }))
    }
}

/// A view of a batch this broker wrote and the log has just read back and
/// crc-checked: `header` is the log's verified header of exactly these bytes
/// (a `ReadBatch`), so the crcs are not computed a second time.
fn verified_view<'a>(bytes: &'a [u8], header: &BatchHeader) -> Result<BatchView<'a>, WireError> {
    // SAFETY: the bytes come from this partition's own log. Data batches
    // passed `BatchView::validate` (checked rkyv access of every record)
    // before they were appended, control batches were built by this broker,
    // and `Log::read` returns each batch's bytes with the header that
    // `BatchHeader::verify` (both crcs) produced for those very bytes, so
    // they are the bytes that were validated.
    unsafe { BatchView::trusted_verified(bytes, header) }
}

impl<S: Storage + Clone> Partition<S> {
    /// Opens (recovering) or creates the partition in `dir`: bumps and
    /// persists the leader epoch, opens the log, loads the checkpoint and
    /// replays the log after it. Returns the partition and the log's
    /// background future, which the caller must spawn on this executor.
    ///
    /// # Errors
    /// Log corruption outside the torn-write window, a damaged epoch file, a
    /// checkpoint that cannot be used while the log no longer holds what it
    /// covers, an event that does not fit the state during replay.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        storage: S,
        dir: &Path,
        name: PartitionName,
        config: QueueConfig,
        log_config: LogConfig,
        secret: [u8; 32],
        fatal: Rc<dyn FatalHandler>,
        clock: Clock,
    ) -> Result<(Rc<Self>, impl Future<Output = ()> + 'static, OpenReport), PartitionError> {
        config.validate()?;
        crate::io::create_dir_durable(&storage, dir).await.map_err(LogError::Io)?;
        // The checkpoint is read first: the offset it covers bounds the log's
        // recovery scan (sealed segments below it are not read; their
        // batches are crc-checked when read). No usable checkpoint: full scan.
        let checkpoint = match files::read_side_file(
            &storage,
            dir,
            CHECKPOINT_FILE,
            CHECKPOINT_MAGIC,
        )
        .await
        {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "checkpoint unusable; replaying the whole log");
                None
            }
        };
        // The epoch: past the epoch file and every epoch in the log.
        let scan_from = checkpoint.as_ref().map(|file| file.value);
        let opened = epoch::open_log(&storage, dir, log_config, fatal.clone(), scan_from).await?;
        let (log, log_report) = (opened.log, opened.report);
        let epoch = LeaderEpoch(opened.epoch);
        let context = PartitionContext {
            queue: name.queue_id,
            partition: name.partition,
            epoch,
            secret,
            config: config.clone(),
        };
        let start = log.start_offset().0;
        let log_end = log.next_offset().0;
        // A checkpoint is written only after everything it covers is
        // durable, so a log that now ends before it lost acknowledged
        // batches: recovery cut as a torn tail what was media damage (or a
        // truncated file). Replaying would reuse offsets the checkpoint's
        // state already names; refuse instead, naming where the log ends.
        if let Some(file) = &checkpoint {
            if file.value > log_end {
                let cut = match &log_report.truncated_at {
                    Some((path, pos)) => format!(
                        "{} at byte {pos} ({} bytes after it discarded as a torn tail)",
                        path.display(),
                        log_report.truncated_bytes
                    ),
                    None => format!("the last segment in {}", dir.display()),
                };
                return Err(PartitionError::Recovery {
                    dir: dir.to_path_buf(),
                    reason: format!(
                        "the checkpoint covers offset {} but the log ends at offset {log_end}: \
                         acknowledged batches are damaged or missing; the log ends at {cut}",
                        file.value
                    ),
                });
            }
        }
        let (state, covers) = match checkpoint {
            Some(file) => match PartitionState::restore(&file.payload, context.clone()) {
                Ok(restored) if restored.covers.0 >= start => {
                    (restored.state, Some(restored.covers))
                }
                Ok(restored) => {
                    return Err(PartitionError::Recovery {
                        dir: dir.to_path_buf(),
                        reason: format!(
                            "checkpoint covers offset {} but the log starts at {start}",
                            restored.covers.0
                        ),
                    })
                }
                Err(error) if start == 0 => {
                    tracing::warn!(dir = %dir.display(), %error, "checkpoint does not decode; replaying the whole log");
                    (PartitionState::new(context.clone())?, None)
                }
                Err(error) => {
                    return Err(PartitionError::Recovery {
                        dir: dir.join(CHECKPOINT_FILE),
                        reason: format!(
                            "checkpoint does not decode ({error}) and the log no longer starts at 0"
                        ),
                    })
                }
            },
            None if start == 0 => (PartitionState::new(context.clone())?, None),
            None => {
                return Err(PartitionError::Recovery {
                    dir: dir.to_path_buf(),
                    reason: format!("no checkpoint, but the log starts at offset {start}"),
                })
            }
        };
        let mut background = Box::pin(log.background());
        let partition = Rc::new(Self {
            name,
            dir: dir.to_path_buf(),
            storage,
            log,
            state: RefCell::new(state),
            clock,
            epoch,
            claimable: Signal::default(),
            last_ticket: RefCell::new(None),
            checkpoint_covers: Cell::new(covers.map_or(0, |offset| offset.0)),
            checkpoint_running: Cell::new(false),
            last_checkpoint: Cell::new(None),
            fatal,
            sync_failed: Cell::new(false),
            closed: Cell::new(false),
            disk_retry_at_ms: Cell::new(0),
            wakeup_hook: RefCell::new(None),
        });
        let (replayed_batches, replayed_events) =
            partition.replay(covers.map_or(start, |offset| offset.0)).await?;
        // The fence's events must be durable before anything is served, and
        // durability needs the log's background future: drive it here until
        // the fence is done, then hand it (still running) to the caller.
        let fenced_claims = {
            let fence = std::pin::pin!(partition.fence());
            let mut fence = fence;
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(result) = fence.as_mut().poll(cx) {
                    return std::task::Poll::Ready(result);
                }
                if background.as_mut().poll(cx).is_ready() {
                    let reason = partition.log.failure().unwrap_or_else(|| "log closed".into());
                    return std::task::Poll::Ready(Err(PartitionError::Log(LogError::Failed(
                        reason,
                    ))));
                }
                std::task::Poll::Pending
            })
            .await?
        };
        let report = OpenReport {
            epoch,
            checkpoint_covers: covers,
            replayed_batches,
            replayed_events,
            fenced_claims,
            next_offset: Offset(partition.log.next_offset().0),
            log: log_report,
        };
        Ok((partition, background, report))
    }

    /// Folds every batch from `from` to the log's end into the state.
    async fn replay(&self, from: u64) -> Result<(u64, u64), PartitionError> {
        let end = self.log.next_offset().0;
        let mut next = from;
        let mut batches = 0u64;
        let mut events = 0u64;
        let recovery = |reason: String| PartitionError::Recovery { dir: self.dir.clone(), reason };
        while next < end {
            let read = self.log.read(LogOffset(next), REPLAY_READ_BYTES).await?;
            if read.is_empty() {
                return Err(recovery(format!("log read at {next} returned nothing before {end}")));
            }
            for batch in read {
                if batch.header.next_offset() <= next {
                    continue;
                }
                let bytes = aligned(&batch.bytes);
                let view = verified_view(&bytes, &batch.header)?;
                let base = view.header().base_offset;
                let mut state = self.state.borrow_mut();
                for index in 0..view.len() {
                    let offset = base + index as u64;
                    if offset < next {
                        continue;
                    }
                    let event = match view.header().kind {
                        BatchKind::Data => {
                            let request = enqueue_request(&view, index);
                            let stamp = view.record(index).enqueue_time_ms.to_native();
                            Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), stamp))
                        }
                        BatchKind::Control => {
                            Event::decode(view.control_record(index)).map_err(|error| {
                                recovery(format!("event at offset {offset}: {error}"))
                            })?
                        }
                        BatchKind::Filler => continue,
                    };
                    state.apply(&event).map_err(|error: ApplyError| {
                        recovery(format!("event at offset {offset} does not apply: {error}"))
                    })?;
                    events += 1;
                }
                next = view.header().next_offset();
                batches += 1;
            }
        }
        Ok((batches, events))
    }

    /// The epoch fence: ends every claim outstanding after replay (all of
    /// them were made under an older epoch, since open bumped it) with the
    /// events `PartitionState::fence` decides, appended and applied like any
    /// other, and waits until they are durable. A crash before that repeats
    /// the fence at the next open on the same claims. Returns how many
    /// claims it ended.
    async fn fence(&self) -> Result<u64, PartitionError> {
        let mut fenced = 0u64;
        let mut last = None;
        loop {
            if self.state.borrow().claims_outstanding() == 0 {
                break;
            }
            self.log
                .writable(BatchKind::Control, Self::control_bytes(CONTROL_BATCH_EVENTS_MAX, false))
                .await;
            let now = (self.clock)();
            let events = self.state.borrow().fence(now, CONTROL_BATCH_EVENTS_MAX);
            if events.is_empty() {
                break;
            }
            fenced += events.len() as u64;
            if let Some(ticket) = self.append_events(&events, now)? {
                last = Some(ticket);
            }
        }
        if let Some(ticket) = last {
            ticket.durable().await?;
            tracing::info!(partition = ?self.name, epoch = self.epoch.0, fenced, "claims of an older epoch released");
        }
        Ok(fenced)
    }

    /// The log's contiguous durable watermark as a queue offset: every
    /// record below it is on disk, so a claim may hand it out.
    fn durable_end(&self) -> Offset {
        Offset(self.log.durable_offset().0)
    }

    pub fn name(&self) -> &PartitionName {
        &self.name
    }

    pub fn epoch(&self) -> LeaderEpoch {
        self.epoch
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log, for stats and tests.
    pub fn log(&self) -> &Log<S> {
        &self.log
    }

    /// Counters for DescribeQueue.
    pub fn counters(&self) -> QueueCounters {
        self.state.borrow().counters((self.clock)())
    }

    /// Runs `check` on the state for tests (read-only).
    pub fn with_state<R>(&self, check: impl FnOnce(&PartitionState) -> R) -> R {
        check(&self.state.borrow())
    }

    /// Appends `events` as one control batch and applies them. Called inside
    /// a section with no await between the decision and this call, after
    /// the caller made room with [`Log::writable`].
    fn append_events(
        &self,
        events: &[Event],
        now: Millis,
    ) -> Result<Option<Ticket>, PartitionError> {
        if events.is_empty() {
            return Ok(None);
        }
        let mut builder = ControlBatchBuilder::new();
        let mut encoded = Vec::with_capacity(CLAIMED_EVENT_BYTES);
        for event in events {
            encoded.clear();
            event.encode(&mut encoded).map_err(PartitionError::Token)?;
            builder.push(now, &encoded)?;
        }
        let batch = builder.finish()?;
        let appended = self.log.append(&batch)?;
        let mut state = self.state.borrow_mut();
        for event in events {
            if let Err(error) = state.apply(event) {
                // A decision and its apply were interleaved: a bug, and the
                // log now holds an event the state refused. Stop rather than
                // serve a state that diverges from its log.
                panic!("partition {:?}: event {event:?} does not apply: {error}", self.name);
            }
        }
        drop(state);
        *self.last_ticket.borrow_mut() = Some(appended.ticket.clone());
        self.hint_wakeup();
        Ok(Some(appended.ticket))
    }

    /// Tells the wake-up hook (if any) the state's next timer deadline.
    fn hint_wakeup(&self) {
        if let Some(hook) = self.wakeup_hook.borrow().as_ref() {
            if let Some(at) = self.state.borrow().next_wakeup() {
                hook(at);
            }
        }
    }

    /// Installs the hook told of every deadline applied events create (the
    /// shard's alarm); replaces any earlier one.
    pub fn set_wakeup_hook(&self, hook: WakeupHook) {
        *self.wakeup_hook.borrow_mut() = Some(hook);
    }

    /// When [`Partition::tick`] next has something to do: the state's
    /// earliest timer (lease end, scheduled or expiring message) and, while
    /// the disk is full, the next retry. `None`: nothing is scheduled.
    pub fn next_due(&self) -> Option<Millis> {
        if self.closed.get() {
            return None;
        }
        let timers = self.state.borrow().next_wakeup();
        let retry = self.log.disk_full().then(|| self.disk_retry_at_ms.get());
        timers.into_iter().chain(retry).min()
    }

    fn control_bytes(events: usize, claimed: bool) -> u64 {
        let per = if claimed { CLAIMED_EVENT_BYTES } else { EVENT_BYTES } as u64 + 8;
        CONTROL_BATCH_OVERHEAD_BYTES + per * events as u64
    }

    /// Enqueues a data batch from a producer (untrusted bytes, 8-aligned).
    /// Returns one outcome per record, after the appended records are durable.
    ///
    /// # Errors
    /// Invalid batch, clock skew, QUEUE_FULL (nothing is appended then),
    /// storage failure.
    pub async fn enqueue(&self, batch: &[u8]) -> Result<Vec<EnqueueOutcome>, PartitionError> {
        let view = BatchView::validate(batch)?;
        if view.header().kind != BatchKind::Data {
            return Err(PartitionError::NotData);
        }
        if view.header().flags != 0 {
            return Err(PartitionError::Flags(view.header().flags));
        }
        self.log.writable(BatchKind::Data, batch.len() as u64).await;
        // From here to the append: no await, so no other request interleaves.
        let now = (self.clock)();
        let mut requests = Vec::with_capacity(view.len());
        for index in 0..view.len() {
            let stamp = view.record(index).enqueue_time_ms.to_native();
            if stamp.abs_diff(now) > ENQUEUE_CLOCK_SKEW_MS_MAX {
                return Err(PartitionError::ClockSkew { index, stamp_ms: stamp, now_ms: now });
            }
            check_schedule(&view, index, now)?;
            requests.push((enqueue_request(&view, index), stamp));
        }
        let mut decisions = Vec::with_capacity(requests.len());
        {
            let state = self.state.borrow();
            let mut admission = state.admission(now);
            for (request, _) in &requests {
                let decision = admission.check(request)?;
                if let EnqueueDecision::QueueFull { limit } = decision {
                    return Err(PartitionError::QueueFull { limit });
                }
                decisions.push(decision);
            }
        }
        let accepted: Vec<u32> = decisions
            .iter()
            .enumerate()
            .filter(|(_, decision)| matches!(decision, EnqueueDecision::Accept))
            .map(|(index, _)| index as u32)
            .collect();
        let mut outcomes = vec![EnqueueOutcome::Duplicate { original: Offset(0) }; requests.len()];
        let mut ticket = None;
        if !accepted.is_empty() {
            let reframed;
            let bytes: &[u8] = if accepted.len() == requests.len() {
                batch
            } else {
                reframed = view.reframe(&accepted)?;
                &reframed
            };
            let appended = self.log.append(bytes)?;
            let mut state = self.state.borrow_mut();
            for (position, &index) in accepted.iter().enumerate() {
                let offset = Offset(appended.base_offset.0 + position as u64);
                let (request, stamp) = &requests[index as usize];
                let event = Event::Enqueued(EnqueueMeta::new(request, offset, *stamp));
                if let Err(error) = state.apply(&event) {
                    panic!(
                        "partition {:?}: enqueue at {offset:?} does not apply: {error}",
                        self.name
                    );
                }
                outcomes[index as usize] = EnqueueOutcome::Appended { offset };
            }
            drop(state);
            *self.last_ticket.borrow_mut() = Some(appended.ticket.clone());
            self.hint_wakeup();
            ticket = Some(appended.ticket);
        }
        for (index, decision) in decisions.iter().enumerate() {
            match decision {
                EnqueueDecision::Duplicate { original } => {
                    outcomes[index] = EnqueueOutcome::Duplicate { original: *original };
                }
                EnqueueDecision::DuplicateInBatch { index: first } => {
                    let original = match outcomes[*first] {
                        EnqueueOutcome::Appended { offset } => offset,
                        EnqueueOutcome::Duplicate { original } => original,
                    };
                    outcomes[index] = EnqueueOutcome::Duplicate { original };
                }
                EnqueueDecision::Accept | EnqueueDecision::QueueFull { .. } => {}
            }
        }
        let appended = accepted.len();
        // A duplicate reply promises the original is durable: without an
        // append of our own, wait for everything appended so far.
        let wait = ticket.or_else(|| self.last_ticket.borrow().clone());
        if let Some(wait) = wait {
            wait.durable().await?;
        }
        // Claims hand out only durable records, so waiting claims are woken
        // now that these are (not at append, when they could not take them).
        // Should this future be dropped before, the next tick's sweep wakes
        // them (a few at a time while messages are ready).
        if appended > 0 {
            self.claimable.notify(appended);
        }
        Ok(outcomes)
    }

    /// Claims up to `request.credits` messages from `lane`, long-polling up
    /// to `wait_ms` when none is ready. Hands out only records below the
    /// log's durable watermark, and replies once the claim events are
    /// appended and applied, without waiting for them to be durable (the
    /// epoch fence makes that safe; see the module doc), with each record's
    /// bytes. The wait belongs to no connection
    /// and cannot be cut short; see [`Partition::claim_as`].
    ///
    /// # Errors
    /// Lease or credits out of range, too many waiters, storage failure.
    pub async fn claim(
        &self,
        request: &ClaimRequest,
        lane: Lane,
        wait_ms: Millis,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let waiting = Cell::new(0);
        let owner = WaitOwner { id: u64::MAX, waiting: &waiting, waiting_max: usize::MAX };
        let cancel = ClaimCancel::default();
        self.claim_as(request, lane, wait_ms, owner, std::future::pending(), &cancel).await
    }

    /// [`Partition::claim`] on behalf of `owner` (a connection), whose
    /// waiting claims count against its own bound as well as the
    /// partition's. The wait ends early, with what was found (nothing), when
    /// `give_up` resolves (the peer closed, the broker stops) or when the
    /// partition evicts this waiter in favour of a lighter owner. A claim
    /// gives up only while waiting, never between appending its events and
    /// replying. `cancel` withdraws it (the protocol's CancelClaim): once
    /// cancelled it decides nothing more and answers empty at once; once it
    /// has decided deliveries, `cancel` refuses (see [`ClaimCancel`]).
    ///
    /// # Errors
    /// Lease or credits out of range, too many waiters (on the partition or
    /// for the owner), storage failure.
    pub async fn claim_as(
        &self,
        request: &ClaimRequest,
        lane: Lane,
        wait_ms: Millis,
        owner: WaitOwner<'_>,
        give_up: impl Future<Output = ()>,
        cancel: &ClaimCancel,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let deadline = (self.clock)().saturating_add(wait_ms);
        let room = Self::control_bytes(request.credits as usize, true);
        let mut give_up = std::pin::pin!(give_up);
        let mut slot = None;
        loop {
            self.log.writable(BatchKind::Control, room).await;
            if cancel.is_cancelled() {
                return Ok(Vec::new());
            }
            let now = (self.clock)();
            let durable_end = self.durable_end();
            let decision = {
                let state = self.state.borrow();
                match lane {
                    Lane::Main => state.claim(now, request, durable_end)?,
                    Lane::DeadLetter => state.claim_dead_letters(now, request, durable_end)?,
                }
            };
            if !decision.deliveries.is_empty() {
                // No await since the check above: not cancelled, so this holds.
                let decided = cancel.decide();
                debug_assert!(decided);
                drop(slot);
                // No wait for durability: every record delivered is below
                // `durable_end`, and a claim lost before its sync is ended by
                // the epoch fence at the next open.
                self.append_events(&decision.events, now)?;
                return self.with_records(decision.deliveries).await;
            }
            let evicted = slot.as_ref().is_some_and(signal::WaiterSlot::evicted);
            if now >= deadline || self.closed.get() || evicted {
                return Ok(Vec::new());
            }
            if slot.is_none() {
                slot = Some(self.claimable.register(owner, CLAIM_WAITERS_MAX, deadline).map_err(
                    |refused| match refused {
                        WaitRefused::OwnerFull { waiting_max } => {
                            PartitionError::TooManyWaitersOnConnection { waiting_max }
                        }
                        WaitRefused::PartitionFull { .. } => PartitionError::TooManyWaiters,
                    },
                )?);
            }
            let Some(waiter) = slot.as_ref() else { continue };
            let wait = async {
                waiter.wait().await;
                false
            };
            let gave_up = async {
                futures_lite::future::or(give_up.as_mut(), cancel.cancelled()).await;
                true
            };
            if futures_lite::future::or(wait, gave_up).await {
                return Ok(Vec::new());
            }
        }
    }

    /// Claims waiting on this partition now (long-polls holding a slot).
    pub fn claims_waiting(&self) -> usize {
        self.claimable.claims_waiting()
    }

    /// Reads the record bytes of each delivery from the log.
    async fn with_records(
        &self,
        deliveries: Vec<Delivery>,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let records =
            self.records_of(&deliveries, |delivery| (delivery.offset, delivery.size_bytes)).await?;
        Ok(deliveries
            .into_iter()
            .zip(records)
            .map(|(delivery, record)| Claimed { delivery, record })
            .collect())
    }

    /// The record bytes of each item, `locate` giving its (offset, size).
    ///
    /// An item whose batch is not yet in this request's cache reads ahead:
    /// one log read sized to the records still to serve at or past its
    /// offset (`read_ahead_bytes`, computed on a miss only), so a claim of a
    /// few hundred consecutive messages from the backlog is one or two reads
    /// of the segment file instead of one per batch, each of which scanned
    /// forward from the sparse index again.
    async fn records_of<T>(
        &self,
        items: &[T],
        locate: impl Fn(&T) -> (Offset, u32),
    ) -> Result<Vec<SharedBytes>, PartitionError> {
        let mut cache = BatchCache::default();
        let mut out = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let (offset, _) = locate(item);
            let ahead = || read_ahead_bytes(offset, items[index..].iter().map(&locate));
            out.push(self.record_bytes(offset, ahead, &mut cache).await?);
        }
        Ok(out)
    }

    /// The bytes of the data record at `offset`, reading its batch into
    /// `cache` unless an earlier lookup of this request did.
    async fn record_bytes(
        &self,
        offset: Offset,
        read_ahead: impl FnOnce() -> u64,
        cache: &mut BatchCache,
    ) -> Result<SharedBytes, PartitionError> {
        let missing = |reason: &'static str| PartitionError::ReadMiss {
            dir: self.dir.clone(),
            offset,
            reason,
        };
        let hit = cache
            .batches
            .range(..=offset.0)
            .next_back()
            .filter(|(_, batch)| batch.next_offset > offset.0)
            .map(|(base, _)| *base);
        let base = match hit {
            Some(base) => base,
            None => {
                let read = self.log.read(to_log(offset), read_ahead()).await?;
                let mut found = None;
                for batch in read {
                    let base = batch.header.base_offset;
                    let holds_offset = base <= offset.0 && batch.header.next_offset() > offset.0;
                    // Control batches read on the way are skipped; the one
                    // holding `offset` must be data.
                    match CachedBatch::new(batch.bytes, &batch.header)? {
                        Some(cached) => {
                            cache.batches.insert(base, cached);
                            if holds_offset {
                                found = Some(base);
                            }
                        }
                        None if holds_offset => {
                            return Err(missing("not a data record"));
                        }
                        None => {}
                    }
                }
                found.ok_or_else(|| missing("no record there in the log"))?
            }
        };
        let batch =
            cache.batches.get(&base).ok_or_else(|| missing("its batch left the read cache"))?;
        let index = (offset.0 - base) as usize;
        let (start, len) =
            *batch.records.get(index).ok_or_else(|| missing("past the end of its batch"))?;
        Ok(batch.bytes.slice(start..start + len))
    }

    /// Mutates the state with one event decided by `decide` and appends it.
    /// Extends and releases reply at once (a lost one ends, after a crash,
    /// in the epoch fence's release of its claim); nothing else uses this.
    async fn mutate<T>(
        &self,
        decide: impl FnOnce(&PartitionState, Millis) -> Result<(Vec<Event>, T), QueueError>,
    ) -> Result<T, PartitionError> {
        self.log.writable(BatchKind::Control, Self::control_bytes(1, false)).await;
        let now = (self.clock)();
        let (events, value) = {
            let state = self.state.borrow();
            decide(&state, now)?
        };
        self.append_events(&events, now)?;
        Ok(value)
    }

    /// Extends the lease of `token` by `lease_ms` (queue default when None).
    /// Replies once the event is appended and applied, before it is durable.
    ///
    /// # Errors
    /// Stale or invalid token, lease out of range, lifetime cap reached.
    pub async fn extend(
        &self,
        token: &DeliveryToken,
        lease_ms: Option<Millis>,
    ) -> Result<Millis, PartitionError> {
        self.mutate(|state, now| {
            let (event, deadline) = state.extend(now, token, lease_ms)?;
            Ok((vec![event], deadline))
        })
        .await
    }

    /// Acks each token; one result per token, in order. All accepted acks are
    /// appended as one control batch and are durable when this returns.
    pub async fn ack(&self, tokens: &[DeliveryToken]) -> Vec<Result<(), PartitionError>> {
        let events_max = tokens.len().min(CONTROL_BATCH_EVENTS_MAX);
        self.log.writable(BatchKind::Control, Self::control_bytes(events_max, false)).await;
        // From here to the append: no await, so no other request interleaves.
        let now = (self.clock)();
        let mut results: Vec<Result<(), PartitionError>> = Vec::with_capacity(tokens.len());
        let mut events = Vec::with_capacity(events_max);
        {
            let state = self.state.borrow();
            // Decisions are made on the unchanged state; a token repeated in
            // this request would be accepted twice, so the second is stale.
            let mut seen = std::collections::BTreeSet::new();
            for token in tokens.iter().take(CONTROL_BATCH_EVENTS_MAX) {
                let claim = token.claim();
                if !seen.insert((claim.lane as u8, claim.offset)) {
                    results.push(Err(PartitionError::Queue(QueueError::StaleToken(
                        crate::queue::StaleToken::NotClaimed,
                    ))));
                    continue;
                }
                match state.ack(now, token) {
                    Ok(event) => {
                        events.push(event);
                        results.push(Ok(()));
                    }
                    Err(error) => results.push(Err(error.into())),
                }
            }
        }
        for _ in results.len()..tokens.len() {
            results.push(Err(PartitionError::Queue(QueueError::AdmissionBatchFull {
                max: CONTROL_BATCH_EVENTS_MAX,
            })));
        }
        // Append first, then apply: a refused append changes nothing.
        let outcome = match self.append_events(&events, now) {
            Ok(Some(ticket)) => ticket.durable().await.map_err(PartitionError::from),
            Ok(None) => Ok(()),
            Err(error) => Err(error),
        };
        if let Err(error) = outcome {
            let closed = error.code() == ErrorCode::ShuttingDown;
            let message = error.to_string();
            for result in results.iter_mut().filter(|result| result.is_ok()) {
                *result = Err(if closed {
                    PartitionError::Log(LogError::Closed)
                } else {
                    PartitionError::Log(LogError::Failed(message.clone()))
                });
            }
        }
        results
    }

    /// Releases `token`: the message is scheduled at `not_before_ms` (or
    /// after the queue's backoff when None). Returns when it becomes ready.
    /// Replies once the event is appended and applied, before it is durable
    /// (the released message is older than the watermark; a release lost in
    /// a crash leaves its claim to the epoch fence).
    ///
    /// # Errors
    /// Stale or invalid token, delay too long.
    pub async fn release(
        &self,
        token: &DeliveryToken,
        reason: ReleaseReason,
        not_before_ms: Option<Millis>,
    ) -> Result<Millis, PartitionError> {
        let result = self
            .mutate(|state, now| {
                let event = state.release(now, token, reason, not_before_ms)?;
                let due = match &event {
                    Event::Released { not_before_ms, .. } => *not_before_ms,
                    _ => now,
                };
                Ok((vec![event], due))
            })
            .await;
        self.claimable.notify(1);
        result
    }

    /// Moves dead letters back to the queue.
    ///
    /// # Errors
    /// The offset is not a redrivable dead letter.
    pub async fn redrive(&self, which: Redrive) -> Result<usize, PartitionError> {
        let events_max = match which {
            Redrive::One(_) => 1,
            Redrive::Oldest(count) => count.min(CONTROL_BATCH_EVENTS_MAX),
        };
        let which = match which {
            Redrive::Oldest(count) => Redrive::Oldest(count.min(CONTROL_BATCH_EVENTS_MAX)),
            one => one,
        };
        self.log.writable(BatchKind::Control, Self::control_bytes(events_max, false)).await;
        let now = (self.clock)();
        let events = self.state.borrow().redrive(now, which)?;
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        self.claimable.notify(count);
        Ok(count)
    }

    /// Counts (dry run) or removes up to `max` live messages of `lane`.
    ///
    /// # Errors
    /// Storage failure.
    pub async fn purge(
        &self,
        lane: Lane,
        max: usize,
        dry_run: bool,
    ) -> Result<usize, PartitionError> {
        let max = max.min(CONTROL_BATCH_EVENTS_MAX);
        if dry_run {
            let now = (self.clock)();
            return Ok(self.state.borrow().purge(now, lane, max).len());
        }
        self.log.writable(BatchKind::Control, Self::control_bytes(max, false)).await;
        let now = (self.clock)();
        let events = self.state.borrow().purge(now, lane, max);
        let count = events.len();
        if let Some(ticket) = self.append_events(&events, now)? {
            ticket.durable().await?;
        }
        Ok(count)
    }

    /// Dead letters after `after` (exclusive), up to `max`.
    pub fn dead_letters(&self, after: Option<Offset>, max: usize) -> Vec<MessageView> {
        self.state.borrow().peek_dead_letters(after, max)
    }

    /// The record bytes of the live message at `offset` (either lane).
    ///
    /// # Errors
    /// Storage failure, or no data record at `offset`.
    pub async fn record(&self, offset: Offset) -> Result<Vec<u8>, PartitionError> {
        let ticket = self.last_ticket.borrow().clone();
        if let Some(ticket) = ticket {
            ticket.durable().await?;
        }
        let record = self.record_bytes(offset, || 1, &mut BatchCache::default()).await?;
        Ok(record.to_vec())
    }

    /// Live messages of the main lane from `from`, up to `max`, with their
    /// record bytes. Changes nothing.
    ///
    /// # Errors
    /// Storage failure reading a record.
    pub async fn peek(&self, from: Offset, max: usize) -> Result<Vec<Peeked>, PartitionError> {
        let views: Vec<MessageView> = self
            .state
            .borrow()
            .messages()
            .into_iter()
            .filter(|view| view.lane == Lane::Main && view.offset >= from)
            .take(max)
            .collect();
        // Records are readable once durable; wait for everything appended.
        let ticket = self.last_ticket.borrow().clone();
        if let Some(ticket) = ticket {
            ticket.durable().await?;
        }
        let records = self.records_of(&views, |view| (view.offset, view.size_bytes)).await?;
        Ok(views
            .into_iter()
            .zip(records)
            .map(|(view, record)| Peeked { view, record: record.to_vec() })
            .collect())
    }

    /// Housekeeping: lease expiry, scheduled → ready, expiry. Appends the
    /// events without waiting for durability (no one is waiting for a
    /// reply); a later reply's durability covers them. Wakes the long-polling
    /// claims that have something to re-check (see [`signal`]). Never blocks.
    pub fn tick(&self) {
        let now = (self.clock)();
        if self.log.disk_full() && now >= self.disk_retry_at_ms.get() {
            self.disk_retry_at_ms.set(now + DISK_FULL_RETRY_MS);
            self.log.retry_prepare();
        }
        let due = self.state.borrow().next_wakeup().is_some_and(|wakeup| wakeup <= now);
        // Long-polls past their deadline answer. Others are woken when
        // something fell due (a lease expired, a delay ended), and a few at
        // a time, in turn, while messages are ready: a message that the
        // claims woken for it could not take (too large for their
        // max_bytes, the other lane) still finds a claim that can.
        self.claimable.expire(now);
        if self.claimable.claims_waiting() > 0 {
            let counters = self.state.borrow().counters(now);
            if counters.ready + counters.quarantined > counters.dead_letter_claimed {
                self.claimable.notify(signal::TICK_SWEEP_WAKES);
            }
        }
        if due && !self.closed.get() {
            let events = self.state.borrow().tick(now);
            self.claimable.notify(events.len().max(1));
            for chunk in events.chunks(CONTROL_BATCH_EVENTS_MAX) {
                match self.append_events(chunk, now) {
                    Ok(_) => {}
                    // Full log buffers: try again next tick.
                    Err(PartitionError::Log(LogError::Backpressure { .. })) => break,
                    Err(error) => {
                        tracing::warn!(partition = ?self.name, %error, "tick events not appended");
                        break;
                    }
                }
            }
        }
    }

    /// Whether enough log has been written since the last checkpoint: either
    /// [`CHECKPOINT_INTERVAL_OFFSETS`] offsets or
    /// [`CHECKPOINT_INTERVAL_BYTES`] bytes.
    pub fn checkpoint_due(&self) -> bool {
        !self.checkpoint_running.get()
            && !self.sync_failed.get()
            && self.log.next_offset().0 > self.checkpoint_covers.get()
            && (self.log.next_offset().0 - self.checkpoint_covers.get()
                >= CHECKPOINT_INTERVAL_OFFSETS
                || self.log_bytes_since_checkpoint() >= CHECKPOINT_INTERVAL_BYTES)
    }

    fn log_bytes_since_checkpoint(&self) -> u64 {
        let covers = self.checkpoint_covers.get();
        self.log
            .segments()
            .iter()
            .filter(|segment| segment.next_offset.0 > covers)
            .map(|segment| segment.data_end)
            .sum()
    }

    /// Writes a checkpoint of the current state once everything it covers is
    /// durable, then deletes log segments below the retention watermark.
    ///
    /// A failed write (a full disk) leaves the previous checkpoint in place
    /// and its temporary file unnamed (the next checkpoint starts a new one).
    /// A failed fdatasync or directory sync is never retried: what reached
    /// the disk is unknown, so the fatal handler is told
    /// ([`FatalCode::SideFileSyncFailed`]; production exits) and this
    /// partition writes no checkpoint again.
    ///
    /// # Errors
    /// Storage failure (the previous checkpoint is then intact, unless a
    /// sync failed after the rename).
    pub async fn checkpoint(&self) -> Result<Option<Offset>, PartitionError> {
        if self.sync_failed.get() {
            return Err(PartitionError::Log(LogError::Failed(
                "a checkpoint sync failed earlier; no checkpoint is retried".into(),
            )));
        }
        if self.checkpoint_running.replace(true) {
            return Ok(None);
        }
        let result = self.checkpoint_inner().await;
        self.checkpoint_running.set(false);
        if let Err(PartitionError::Log(LogError::Io(error))) = &result {
            if matches!(error.op, IoOp::Sync | IoOp::SyncDir) {
                self.sync_failed.set(true);
                self.fatal.fatal(&FatalReason {
                    code: FatalCode::SideFileSyncFailed,
                    message: format!("checkpoint of {}: {error}", self.dir.display()),
                });
            }
        }
        result
    }

    async fn checkpoint_inner(&self) -> Result<Option<Offset>, PartitionError> {
        // Every event below `covers` is applied and none above it (appends
        // assign offsets and apply without an await between), so the state
        // now is the fold of the log through `covers`. From here the state
        // records what each message held before its first change, and the
        // steps below write the state as it is now while requests go on.
        let covers = Offset(self.log.next_offset().0);
        let mut encoder = self.state.borrow_mut().begin_snapshot(covers);
        let _capture = CaptureGuard(&self.state);
        let ticket = self.last_ticket.borrow().clone();
        let mut writer = files::SideFileWriter::create(&self.storage, &self.dir, CHECKPOINT_FILE)
            .await
            .map_err(LogError::Io)?;
        let mut out = Vec::with_capacity(CHECKPOINT_STEP_BYTES_MAX);
        loop {
            out.clear();
            let done = self
                .state
                .borrow()
                .snapshot_step(&mut encoder, CHECKPOINT_STEP_ENTRIES, &mut out)
                .map_err(|error| SideFileError::Invalid {
                    path: self.dir.join(CHECKPOINT_FILE),
                    reason: format!("snapshot not written: {error}"),
                })?;
            writer.write(&out).await.map_err(LogError::Io)?;
            if done {
                break;
            }
            // Let the shard serve between steps.
            futures_lite::future::yield_now().await;
        }
        drop(out);
        let touched = self.state.borrow().snapshot_touched();
        self.state.borrow_mut().end_snapshot();
        if let Some(ticket) = ticket {
            ticket.durable().await?;
        }
        writer.finish(&self.storage, CHECKPOINT_MAGIC, covers.0).await.map_err(LogError::Io)?;
        self.checkpoint_covers.set(covers.0);
        self.last_checkpoint.set(Some(CheckpointStats {
            covers,
            steps: encoder.steps(),
            max_step_entries: encoder.max_step_entries(),
            bytes: encoder.bytes(),
            touched,
        }));
        let watermark = self.state.borrow().retention_watermark().unwrap_or(covers);
        let below = watermark.min(covers);
        let deleted = self.log.delete_below(to_log(below)).await?;
        tracing::debug!(
            partition = ?self.name,
            covers = covers.0,
            steps = encoder.steps(),
            bytes = encoder.bytes(),
            touched,
            deleted,
            "checkpoint written"
        );
        Ok(Some(covers))
    }

    /// What the newest checkpoint written by this process cost.
    pub fn last_checkpoint(&self) -> Option<CheckpointStats> {
        self.last_checkpoint.get()
    }

    /// Stops serving: wakes waiting claims (they return empty), writes a
    /// final checkpoint, and closes the log (its background future then
    /// completes once everything gathered is durable).
    ///
    /// # Errors
    /// The final checkpoint failed; the log is closed regardless.
    pub async fn close(&self) -> Result<(), PartitionError> {
        self.closed.set(true);
        self.claimable.notify_all();
        let result = self.checkpoint().await.map(|_| ());
        self.log.close();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{InvalidToken, StaleToken};

    #[test]
    fn each_queue_error_and_the_read_miss_have_their_wire_code() {
        // Goal: no queue error falls through to a catch-all code, and a claim-time read miss
        // is reported as a broker bug, not as recovery or a bad argument. Method: one value
        // of every variant and its expected stable code (the match in `code` has no
        // wildcard, so a new variant fails to compile until it is mapped and added here).
        let cases = [
            (QueueError::InvalidToken(InvalidToken::BadMac), ErrorCode::InvalidToken),
            (QueueError::StaleToken(StaleToken::NotClaimed), ErrorCode::StaleToken),
            (
                QueueError::StaleToken(StaleToken::LeaseExpired { deadline_ms: 1, now_ms: 2 }),
                ErrorCode::StaleToken,
            ),
            (
                QueueError::LeaseOutOfRange { lease_ms: 1, min_ms: 10, max_ms: 20 },
                ErrorCode::LeaseOutOfRange,
            ),
            (QueueError::LeaseLifetimeExhausted { cap_ms: 5 }, ErrorCode::LeaseLifetimeExceeded),
            (QueueError::CreditsOutOfRange { credits: 0, max: 8 }, ErrorCode::InvalidArgument),
            (
                QueueError::ReleaseDelayTooLong { not_before_ms: 9, max_ms: 1 },
                ErrorCode::InvalidArgument,
            ),
            (QueueError::PriorityOutOfRange { priority: 9, bands: 2 }, ErrorCode::InvalidArgument),
            (QueueError::AdmissionBatchFull { max: 4 }, ErrorCode::Throttled),
            (QueueError::NotRedrivable(crate::queue::Offset(3)), ErrorCode::InvalidArgument),
        ];
        for (error, code) in cases {
            assert_eq!(PartitionError::Queue(error).code(), code, "{error:?}");
        }
        let miss = PartitionError::ReadMiss {
            dir: PathBuf::from("/data/q/0"),
            offset: crate::queue::Offset(7),
            reason: "no record there in the log",
        };
        assert_eq!(miss.code(), ErrorCode::Internal);
        let text = miss.to_string();
        assert!(text.contains("/data/q/0") && text.contains('7'), "{text}");
    }
}
