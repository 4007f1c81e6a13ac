//! Errors of the shard journal: one enum for every operation, plus what
//! recovery found wrong when it refuses a journal.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use super::config::JournalConfigError;
use super::entry::EntryError;
use super::{JournalPos, Lane};
use crate::io::IoError;

/// Why recovery refused the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalDamage {
    /// The entry at this byte is damaged although an intact entry recorded
    /// a durable watermark past it: acknowledged bytes were lost.
    BelowWatermark { error: EntryError, watermark: JournalPos },
    /// A journal file does not start where the previous one ends.
    FileGap { expected: u64, found: u64 },
    /// A journal file whose length is not a whole number of pages (or zero).
    BadFileLength { len_bytes: u64 },
    /// Damage at the end of a file too close to its end for a filler entry.
    NoRoomForFiller,
    /// An intact entry header (its crc holds) whose entry runs past the end
    /// of its file: every file is zero-filled to its whole length before it
    /// is named and a commit is placed only where it fits, so no torn write
    /// leaves this; the file was shortened.
    RunsPastFileEnd { entry_len: u64, file_len: u64 },
    /// An intact entry records a watermark inside the zero tail a file
    /// roll skipped (from this byte on): no commit ends there, so bytes it
    /// knew durable are gone.
    WatermarkInSkippedTail { watermark: JournalPos },
    /// A read found no intact entry at a durable position it was sent to.
    Unreadable(EntryError),
    /// A partition's index names an entry whose batch is not the one it
    /// expects (kind or first offset).
    IndexMismatch { expected_offset: u64, found_offset: u64 },
    /// A read by entry index found at the entry's position a batch of
    /// another length than the entry appended there.
    EntryMismatch { index: u64, expected_len: u32, found_len: u32 },
}

impl fmt::Display for JournalDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BelowWatermark { error, watermark } => write!(
                f,
                "{error}, below the durable watermark {watermark} an intact entry records"
            ),
            Self::FileGap { expected, found } => {
                write!(f, "journal file starts at position {found}, expected {expected}")
            }
            Self::BadFileLength { len_bytes } => {
                write!(f, "journal file of {len_bytes} bytes is not a whole number of pages")
            }
            Self::NoRoomForFiller => f.write_str("damaged entry too close to the file end"),
            Self::RunsPastFileEnd { entry_len, file_len } => write!(
                f,
                "an intact entry of {entry_len} bytes runs past the end of its file \
                 ({file_len} bytes): the file was shortened, not torn"
            ),
            Self::WatermarkInSkippedTail { watermark } => write!(
                f,
                "an intact entry records the durable watermark {watermark} inside the \
                 unwritten tail of this file"
            ),
            Self::Unreadable(error) => write!(f, "no intact entry where one was read: {error}"),
            Self::IndexMismatch { expected_offset, found_offset } => write!(
                f,
                "index expects a data batch at offset {expected_offset}, the entry holds \
                 offset {found_offset}"
            ),
            Self::EntryMismatch { index, expected_len, found_len } => write!(
                f,
                "entry {index} of {expected_len} batch bytes expected, the entry holds \
                 {found_len}"
            ),
        }
    }
}

/// Every way a journal operation can fail.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error("invalid journal config: {0}")]
    Config(#[from] JournalConfigError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// Media corruption (or a bug): the shard is refused, nothing is cut.
    #[error("corrupt journal {} at byte {pos}: {detail}", path.display())]
    Corrupt { path: PathBuf, pos: u64, detail: JournalDamage },
    #[error("the recovery start position {start} is not in the journal in {}", dir.display())]
    StartNotFound { dir: PathBuf, start: JournalPos },
    #[error("entry rejected: {0}")]
    InvalidEntry(EntryError),
    #[error("partition id {0} is reserved for filler entries")]
    ReservedPartition(u32),
    #[error("{lane} entry of {len_bytes} bytes exceeds its limit {max_bytes}")]
    EntryTooLarge { lane: Lane, len_bytes: u64, max_bytes: u64 },
    /// Queued bytes of this lane are at their limit; retry after
    /// `Journal::writable` resolves.
    #[error("backpressure on the {lane} lane: {pending_bytes} bytes queued, limit {limit_bytes}")]
    Backpressure { lane: Lane, pending_bytes: u64, limit_bytes: u64 },
    /// A write, sync or roll failed earlier; the journal accepts nothing more.
    #[error("journal failed: {0}")]
    Failed(String),
    /// The next journal file could not be prepared for lack of disk space:
    /// data is refused until a retry prepares it; control entries (acks,
    /// claims) still go into the room left in the current file.
    #[error(
        "disk full: the shard journal's next file ({file_bytes} bytes) cannot be prepared; \
         enqueues are refused until that much space returns"
    )]
    DiskFull { file_bytes: u64 },
    #[error("journal is closed")]
    Closed,
    /// A read of a position at or past the durable watermark: the entry is
    /// not durable (or not written) yet.
    #[error("journal position {pos} is not durable (durable below {durable})")]
    NotDurable { pos: JournalPos, durable: JournalPos },
    /// A read of a position below the oldest journal file still held.
    #[error("journal position {pos} is below the oldest journal file ({oldest})")]
    BelowOldestFile { pos: JournalPos, oldest: JournalPos },
    /// A partition read below the partition's start (retention).
    #[error("offset {offset} is below the partition start {start}")]
    OffsetOutOfRange { offset: u64, start: u64 },
    #[error("read of {max_bytes} bytes exceeds the limit {limit_bytes}")]
    ReadTooLarge { max_bytes: u64, limit_bytes: u64 },
    #[error("batch rejected: {0}")]
    InvalidBatch(spool_wire::WireError),
    #[error("batch cannot be appended: {0}")]
    NotAppendable(&'static str),
    /// A partition handle the shard's handles table does not hold.
    #[error("partition handle {0} is not in the handles table")]
    UnknownHandle(u32),
    /// The handles table is full, or the partition already has a handle.
    #[error("handles table: {0}")]
    Handles(String),
    /// The handles table on disk is damaged.
    #[error("handles table {} is damaged: {reason}", path.display())]
    HandlesCorrupt { path: PathBuf, reason: String },
    /// Recovered data entries of one partition do not number its offsets
    /// densely: the journal holds a gap no crash can leave.
    #[error(
        "partition handle {handle}: data entry at journal position {pos} starts at offset \
             {found}, expected {expected}"
    )]
    OffsetGap { handle: u32, pos: JournalPos, expected: u64, found: u64 },
    /// An append at an entry index that does not continue the partition's
    /// log (a follower never holds a hole), or a recovered log whose
    /// entries above the committed index are not dense.
    #[error("entry index {got} does not continue the partition's log (expected {expected})")]
    IndexGap { expected: u64, got: u64 },
    /// An append at a term below the last entry's: terms never go back
    /// along a log.
    #[error("term {got} is below the last entry's term {last_term}")]
    TermBehind { last_term: u64, got: u64 },
    /// A follower's data batch whose base offset is not the partition's
    /// next data offset: the leader's bytes are kept as sent, so they must
    /// continue this log's offsets exactly.
    #[error("data batch at offset {got} does not continue the partition at offset {expected}")]
    OffsetMismatch { expected: u64, got: u64 },
    /// A truncation at or below the committed index: what is committed is
    /// never cancelled.
    #[error("cannot truncate from entry {from}: the log is committed up to {committed}")]
    TruncateCommitted { from: u64, committed: u64 },
    /// A truncation of the partition's log is under way: appends wait.
    #[error("a truncation of this partition's log is under way")]
    Truncating,
    /// A commit index past the partition's last entry.
    #[error("commit index {index} is past the last entry {last_index}")]
    CommitPastLog { index: u64, last_index: u64 },
    /// A commit index given to a partition whose log commits by local
    /// durability.
    #[error("the partition's log commits by local durability, not by a given index")]
    NotReplicated,
    /// A replicated partition holds its limit of entries above the
    /// committed index: appends wait for commits.
    #[error("{limit} entries above the committed index: appends wait for the log to commit")]
    UncommittedFull { limit: usize },
    /// A read by index below the first entry the partition still holds
    /// (let go of by retention, or before what its recovery found): a
    /// follower that far behind needs a snapshot.
    #[error("entry {index} is compacted: the log holds entries from {first_index}")]
    Compacted { index: u64, first_index: u64 },
    /// A read by index past the partition's last entry.
    #[error("entry {index} is past the last entry {last_index}")]
    IndexPastLog { index: u64, last_index: u64 },
    /// A read by index of an entry not yet durable here (still queued, or
    /// written and not yet synced): retry once it is.
    #[error("entry {index} is not durable yet (durable up to {durable_index}): retry")]
    EntryNotDurable { index: u64, durable_index: u64 },
}
