//! [`LogError`]: the errors a partition meets at its log besides the shard
//! journal's own ([`super::journal::JournalError`]): its settings, I/O of
//! its side files, and the refusals a partition answers with.

use spool_wire::WireError;
use thiserror::Error;

use crate::io::IoError;
use crate::log::config::ConfigError;

/// Every way a log operation of a partition can fail outside the journal.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("invalid log config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("batch rejected: {0}")]
    InvalidBatch(WireError),
    #[error("batch of {len_bytes} bytes exceeds batch_bytes_max {max_bytes}")]
    BatchTooLarge { len_bytes: u64, max_bytes: u64 },
    /// Queued-but-unwritten bytes are at their limit; retry once the log is
    /// writable again.
    #[error("backpressure: {pending_bytes} bytes pending, limit {limit_bytes}")]
    Backpressure { pending_bytes: u64, limit_bytes: u64 },
    /// A write or sync failed earlier; the log accepts nothing more.
    #[error("log failed: {0}")]
    Failed(String),
    #[error("log is closed")]
    Closed,
    /// Data is refused for lack of disk space (the journal's own refusal is
    /// [`super::journal::JournalError::DiskFull`]).
    #[error("disk full: enqueues are refused until space returns")]
    DiskFull,
}
