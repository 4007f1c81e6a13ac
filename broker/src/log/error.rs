//! Errors of the segment log: one enum for every operation, plus the
//! corruption detail that names what recovery or a read found wrong.

use std::fmt;
use std::path::PathBuf;

use spool_wire::WireError;
use thiserror::Error;

use crate::io::IoError;
use crate::log::config::ConfigError;

/// What is wrong with bytes found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptDetail {
    /// The batch at this position does not parse or fails its crc.
    Batch(WireError),
    /// A valid batch whose base offset is not the next expected one.
    OffsetGap { expected: u64, found: u64 },
    /// A batch claims to extend past the end of its segment.
    PastSegmentEnd { batch_len: u32, capacity: u64 },
    /// Non-zero bytes after the clean end of a segment where none may be.
    DataAfterEnd { nonzero_until: u64 },
    /// A segment file's base offset does not continue the previous segment.
    SegmentGap { expected: u64, found: u64 },
    /// The log stops at `offset` (damaged, or zeros where a batch was), but
    /// an intact later commit recorded that everything below `watermark`
    /// was durable when it was built: acknowledged data is damaged, not a
    /// torn tail. `damage` is what stopped the scan (`None`: zeros).
    BelowWatermark { offset: u64, watermark: u64, damage: Option<Box<CorruptDetail>> },
}

impl fmt::Display for CorruptDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Batch(error) => write!(f, "invalid batch: {error}"),
            Self::OffsetGap { expected, found } => {
                write!(f, "batch base offset {found}, expected {expected}")
            }
            Self::PastSegmentEnd { batch_len, capacity } => {
                write!(f, "batch of {batch_len} bytes runs past the segment end {capacity}")
            }
            Self::DataAfterEnd { nonzero_until } => {
                write!(f, "non-zero bytes after the end of the log, up to byte {nonzero_until}")
            }
            Self::SegmentGap { expected, found } => {
                write!(f, "segment starts at offset {found}, expected {expected}")
            }
            Self::BelowWatermark { offset, watermark, damage } => {
                match damage {
                    Some(damage) => write!(f, "{damage} at offset {offset}")?,
                    None => write!(f, "zeros where offset {offset} was written")?,
                }
                write!(
                    f,
                    ", below the durable watermark {watermark} recorded by a later intact \
                     commit: acknowledged data is damaged (not a torn tail)"
                )
            }
        }
    }
}

/// Every way a log operation can fail.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("invalid log config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// Media corruption (or a bug): the log refuses to guess.
    #[error("corrupt log {} at byte {pos}: {detail}", path.display())]
    Corrupt { path: PathBuf, pos: u64, detail: CorruptDetail },
    #[error("batch rejected: {0}")]
    InvalidBatch(WireError),
    #[error("batch of {len_bytes} bytes exceeds batch_bytes_max {max_bytes}")]
    BatchTooLarge { len_bytes: u64, max_bytes: u64 },
    #[error("batch_len field says {declared} bytes but {given} were handed in")]
    BatchLengthMismatch { declared: u32, given: usize },
    #[error("batch cannot be appended: {0}")]
    NotAppendable(&'static str),
    /// Gathered-but-unwritten bytes are at their limit; retry after
    /// `Log::writable` resolves (or after an earlier ticket completes).
    #[error("backpressure: {pending_bytes} bytes pending, limit {limit_bytes}")]
    Backpressure { pending_bytes: u64, limit_bytes: u64 },
    /// A write or sync failed earlier; the log accepts nothing more.
    #[error("log failed: {0}")]
    Failed(String),
    #[error("log is closed")]
    Closed,
    #[error("offset {offset} is below the log start {start}")]
    OffsetOutOfRange { offset: u64, start: u64 },
    #[error("read of {max_bytes} bytes exceeds the limit {limit_bytes}")]
    ReadTooLarge { max_bytes: u64, limit_bytes: u64 },
    /// The next segment could not be created for lack of disk space: data
    /// appends are refused until space returns (control batches still use
    /// the room left in the active segment).
    #[error("disk full: the next segment cannot be prepared")]
    DiskFull,
    #[error("partition holds {count} segments, the limit")]
    TooManySegments { count: usize },
    /// Recovery handed `open` no segment to append to, or one without an
    /// open file: recovery always creates or reopens one, so this is a bug.
    #[error("log {} opened without an active segment: {why}", dir.display())]
    NoActiveSegment { dir: PathBuf, why: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_without_an_active_segment_names_the_directory() {
        // Goal: `Log::open`'s "no active segment" cases say what happened and where, not
        // "0 segments, the limit" or "closed". Method: the message of the variant it returns.
        let error = LogError::NoActiveSegment {
            dir: PathBuf::from("/data/q/3"),
            why: "recovery found none",
        };
        let text = error.to_string();
        assert!(text.contains("/data/q/3"), "{text}");
        assert!(text.contains("without an active segment: recovery found none"), "{text}");
        assert!(!matches!(error, LogError::TooManySegments { .. } | LogError::Closed));
    }
}
