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
    /// An intact entry records a watermark inside the zero tail a file
    /// roll skipped (from this byte on): no commit ends there, so bytes it
    /// knew durable are gone.
    WatermarkInSkippedTail { watermark: JournalPos },
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
            Self::WatermarkInSkippedTail { watermark } => write!(
                f,
                "an intact entry records the durable watermark {watermark} inside the \
                 unwritten tail of this file"
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
    #[error("journal is closed")]
    Closed,
}
