//! `PartitionLog`: what a partition needs of its log, behind one type.
//!
//! Today every partition sits on its own segment log ([`Log`],
//! `docs/design/segment-format.md`). The shard journal
//! (`docs/design/shard-journal.md`, §12) will be a second variant; the rest
//! of `partition/` speaks only to this type, so the variant is chosen in one
//! place. Each method delegates to the variant with a `match`.
//!
//! Two things differ between the variants beyond the calls themselves, and
//! are therefore abstracted here rather than left to the callers:
//!
//! - **Where replay starts.** In the segment log every batch, data or
//!   control, takes partition offsets, so "the log up to here" is an offset
//!   and a checkpoint records the next offset. In the journal control
//!   entries take no partition offsets (an ack written ahead of a queued data
//!   batch could otherwise not be numbered), so the same point is a journal
//!   position. A checkpoint records a [`LogCursor`] it got from
//!   [`PartitionLog::end`], and replay takes one back
//!   ([`PartitionLog::replay`]); nothing else reads it.
//! - **Retention.** A checkpoint lets go of what its state no longer needs:
//!   data records below the oldest live message and control records below the
//!   checkpoint ([`PartitionLog::delete_below`] takes both).

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::batch::BatchKind;

use super::{PartitionError, REPLAY_READ_BYTES};
use crate::io::Storage;
use crate::log::{
    Appended, FatalHandler, Log, LogConfig, LogError, LogStats, Offset, ReadBatch, RecoveryReport,
    SegmentInfo,
};

/// A point in a partition's log: "everything before here", as a checkpoint
/// records it and as replay resumes from it.
///
/// Opaque on purpose: in the segment log it is a partition offset (control
/// batches take offsets there), in the shard journal it will be a journal
/// position (control entries take no partition offsets), so arithmetic with
/// record offsets would be right for one layout and wrong for the other.
/// Cursors of one log compare in log order. The checkpoint side file stores
/// [`LogCursor::to_checkpoint`]; for the segment log that is the offset, as
/// it always was, so the file format does not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct LogCursor(u64);

impl LogCursor {
    /// The value the checkpoint side file stores for this cursor.
    pub fn to_checkpoint(self) -> u64 {
        self.0
    }

    /// The cursor a checkpoint side file recorded.
    pub fn from_checkpoint(value: u64) -> Self {
        Self(value)
    }
}

impl std::fmt::Display for LogCursor {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}", self.0)
    }
}

/// How much log was written after a cursor: what decides that a checkpoint
/// is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogGrowth {
    /// Offsets assigned after it.
    pub offsets: u64,
    /// Bytes of log held after it.
    pub bytes: u64,
}

/// A partition's log; see the module docs.
pub enum PartitionLog<S: Storage> {
    /// The per-partition segment log.
    Segments(Log<S>),
}

impl<S: Storage> PartitionLog<S> {
    /// Opens (recovering) the segment log in `dir` at `leader_epoch`.
    /// `scan_from`: what a usable checkpoint covers; sealed segments below
    /// it are not read ([`Log::open_from`]). `None`: a full scan.
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_segments(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        scan_from: Option<LogCursor>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        let (log, report) = match scan_from {
            Some(from) => {
                Log::open_from(storage, dir, config, leader_epoch, fatal, Offset(from.0)).await?
            }
            None => Log::open(storage, dir, config, leader_epoch, fatal).await?,
        };
        Ok((Self::Segments(log), report))
    }

    /// The future that makes appends durable; the owner spawns it (see
    /// [`Log::background`]). Call once.
    pub fn background(&self) -> impl Future<Output = ()> + 'static {
        match self {
            Self::Segments(log) => log.background(),
        }
    }

    /// Appends one batch (offsets assigned now, durable when its ticket
    /// resolves).
    ///
    /// # Errors
    /// As [`Log::append`].
    pub fn append(&self, batch: &[u8]) -> Result<Appended, LogError> {
        match self {
            Self::Segments(log) => log.append(batch),
        }
    }

    /// Waits until a batch of `kind` and `len` bytes would be taken.
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        match self {
            Self::Segments(log) => log.writable(kind, len).await,
        }
    }

    /// Batches from the one holding `from`, up to about `max_bytes`.
    ///
    /// # Errors
    /// As [`Log::read`].
    pub async fn read(&self, from: Offset, max_bytes: u64) -> Result<Vec<ReadBatch>, LogError> {
        match self {
            Self::Segments(log) => log.read(from, max_bytes).await,
        }
    }

    /// The offset the next appended record will get.
    pub fn next_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.next_offset(),
        }
    }

    /// Every record below this offset is durable (and readable).
    pub fn durable_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.durable_offset(),
        }
    }

    /// The oldest offset still held (after retention).
    pub fn start_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.start_offset(),
        }
    }

    /// Where the log ends now: a checkpoint of the state as it is now
    /// records this, and replay from it applies exactly what comes after.
    pub fn end(&self) -> LogCursor {
        match self {
            Self::Segments(log) => LogCursor(log.next_offset().0),
        }
    }

    /// Where the log starts (after retention): replay from an earlier cursor
    /// would miss records.
    pub fn start(&self) -> LogCursor {
        match self {
            Self::Segments(log) => LogCursor(log.start_offset().0),
        }
    }

    /// How much was written after `cursor`.
    pub fn growth_since(&self, cursor: LogCursor) -> LogGrowth {
        match self {
            Self::Segments(log) => LogGrowth {
                offsets: log.next_offset().0.saturating_sub(cursor.0),
                bytes: log
                    .segments()
                    .iter()
                    .filter(|segment| segment.next_offset.0 > cursor.0)
                    .map(|segment| segment.data_end)
                    .sum(),
            },
        }
    }

    /// Reads the log from `from` to its end, batch by batch, for replay.
    pub fn replay(&self, from: LogCursor) -> Replay<'_, S> {
        let end = self.next_offset().0;
        Replay { log: self, next: from.0, end, read: VecDeque::new() }
    }

    /// Lets go of what a checkpoint at `checkpoint` no longer needs: data
    /// records below `oldest_live` (the oldest message the state still
    /// holds; `None`: none) and control records before `checkpoint`. Returns
    /// how many files were deleted.
    ///
    /// # Errors
    /// As [`Log::delete_below`].
    pub async fn delete_below(
        &self,
        oldest_live: Option<Offset>,
        checkpoint: LogCursor,
    ) -> Result<usize, LogError> {
        match self {
            Self::Segments(log) => {
                // Control batches take offsets here: below both bounds.
                let covers = Offset(checkpoint.0);
                log.delete_below(oldest_live.unwrap_or(covers).min(covers)).await
            }
        }
    }

    /// Whether appends of data are refused for lack of disk space.
    pub fn disk_full(&self) -> bool {
        match self {
            Self::Segments(log) => log.disk_full(),
        }
    }

    /// Tries again to make room after [`PartitionLog::disk_full`].
    pub fn retry_prepare(&self) {
        match self {
            Self::Segments(log) => log.retry_prepare(),
        }
    }

    /// `Some(reason)` once a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        match self {
            Self::Segments(log) => log.failure(),
        }
    }

    /// Stops accepting appends; the background completes once everything
    /// gathered is durable.
    pub fn close(&self) {
        match self {
            Self::Segments(log) => log.close(),
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> LogStats {
        match self {
            Self::Segments(log) => log.stats(),
        }
    }

    /// Named segment files, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        match self {
            Self::Segments(log) => log.segments(),
        }
    }

    /// The directory the log's files are in.
    pub fn dir(&self) -> &Path {
        match self {
            Self::Segments(log) => log.dir(),
        }
    }
}

/// One batch replay hands out: the batch and the first offset in it to
/// apply (records below were applied before the cursor replay started at).
pub struct ReplayBatch {
    pub batch: ReadBatch,
    pub apply_from: Offset,
}

/// The batches after a cursor, in log order ([`PartitionLog::replay`]).
pub struct Replay<'a, S: Storage> {
    log: &'a PartitionLog<S>,
    /// The next offset to apply.
    next: u64,
    end: u64,
    read: VecDeque<ReadBatch>,
}

impl<S: Storage> Replay<'_, S> {
    /// The next batch, or `None` at the end of the log.
    ///
    /// # Errors
    /// A read that fails, or that finds nothing before the log's end.
    pub async fn next_batch(&mut self) -> Result<Option<ReplayBatch>, PartitionError> {
        loop {
            while let Some(batch) = self.read.pop_front() {
                // Batches wholly before the cursor were applied already.
                if batch.header.next_offset() <= self.next {
                    continue;
                }
                let apply_from = Offset(self.next);
                self.next = batch.header.next_offset();
                return Ok(Some(ReplayBatch { batch, apply_from }));
            }
            if self.next >= self.end {
                return Ok(None);
            }
            let read = self.log.read(Offset(self.next), REPLAY_READ_BYTES).await?;
            if read.is_empty() {
                return Err(PartitionError::Recovery {
                    dir: PathBuf::from(self.log.dir()),
                    reason: format!(
                        "log read at {} returned nothing before {}",
                        self.next, self.end
                    ),
                });
            }
            self.read.extend(read);
        }
    }
}
