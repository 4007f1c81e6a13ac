//! [`PartitionError`]: why a partition operation failed, and the stable wire
//! code each failure is answered with.

use std::path::PathBuf;

use spool_wire::limits::SCHEDULE_HORIZON_MS;
use spool_wire::{ErrorCode, WireError};
use thiserror::Error;

use super::files::SideFileError;
use super::signal::CLAIM_WAITERS_MAX;
use super::ENQUEUE_CLOCK_SKEW_MS_MAX;
use crate::log::journal::JournalError;
use crate::log::LogError;
use crate::queue::{CodecError, Millis, Offset, QueueError};
use crate::replica::DriverError;

/// Milliseconds in a day, for messages.
pub(super) const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Why a partition operation failed. [`PartitionError::code`] maps it onto the
/// stable wire code.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PartitionError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("log: {0}")]
    Log(#[from] LogError),
    /// The shard journal (journal layout): the same classes as the segment
    /// log's errors, mapped onto the same codes.
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
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
    /// The shard's memory for queue state cannot take the batch
    /// (`memory.rs`).
    #[error("{0}")]
    StateMemory(super::memory::StateMemoryFull),
    #[error("queue is full (its {limit} limit)")]
    QueueFull { limit: crate::queue::FullLimit },
    /// An ordered partition has `max` active keys and a record's key is
    /// not one of them.
    #[error(
        "record {index}: the ordered partition has its most active keys ({max}); a new key is \
         accepted once one of them has no message left"
    )]
    ActiveKeysFull { index: usize, max: usize },
    #[error("delivery token: {0}")]
    Token(CodecError),
    #[error("side file: {0}")]
    SideFile(#[from] SideFileError),
    #[error("recovery of {dir}: {reason}")]
    Recovery { dir: PathBuf, reason: String },
    /// A snapshot of the partition in `dir` could not be offered, read or
    /// installed (`docs/design/replication.md` §6).
    #[error("snapshot of {dir}: {reason}")]
    Snapshot { dir: PathBuf, reason: String },
    /// A message the state holds as live has no data record at its offset in
    /// the log (or its batch left the read cache mid-request): the state and
    /// the log disagree, which is a broker bug, not a client's or the disk's
    /// (a failed or corrupt read is a [`LogError`]).
    #[error("read of {dir} at offset {offset}: {reason}")]
    ReadMiss { dir: PathBuf, offset: Offset, reason: &'static str },
    /// The leader epoch would pass the `u32` every batch header stores: the
    /// partition has been opened 2^32 times and cannot be opened again.
    #[error("{}: leader epoch {epoch} exceeds the log's u32 field", dir.display())]
    EpochExhausted { dir: PathBuf, epoch: u64 },
    /// A checkpoint's fdatasync or directory sync failed earlier (the fatal
    /// handler was told): this partition writes no checkpoint again.
    #[error("{}: a checkpoint sync failed earlier; no checkpoint is retried", dir.display())]
    CheckpointsStopped { dir: PathBuf },
    #[error("too many claims are waiting on this partition ({CLAIM_WAITERS_MAX})")]
    TooManyWaiters,
    #[error("this connection already has {waiting_max} claims waiting (claim_waiters_per_connection_max)")]
    TooManyWaitersOnConnection { waiting_max: usize },
    #[error("queue config: {0}")]
    Config(#[from] crate::queue::ConfigError),
    /// A replicated partition's member refused or lost the request: it
    /// does not lead (the client retries at the leader), its log is
    /// catching up, or the entry was superseded before it committed (it
    /// did not happen).
    #[error(transparent)]
    Replica(#[from] DriverError),
    /// A replicated partition that does not serve now: this member does
    /// not lead, or leads but has not yet folded every entry before its
    /// term (`leader`: the leader it knows of, 0 for none).
    #[error("partition {partition} is not served here: its leader is node {leader}")]
    NotLeader { partition: u32, leader: u64 },
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
                // Nothing on the wire names a subscription yet (the claim
                // version that does brings its own code).
                QueueError::UnknownSubscription(_) => ErrorCode::InvalidArgument,
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
            PartitionError::Journal(
                JournalError::Backpressure { .. }
                | JournalError::Truncating
                | JournalError::UncommittedFull { .. },
            ) => ErrorCode::Throttled,
            PartitionError::Journal(JournalError::Closed) => ErrorCode::ShuttingDown,
            PartitionError::Journal(JournalError::DiskFull { .. }) => ErrorCode::DiskFull,
            PartitionError::Journal(
                JournalError::InvalidBatch(_)
                | JournalError::NotAppendable(_)
                | JournalError::EntryTooLarge { .. },
            ) => ErrorCode::BatchInvalid,
            PartitionError::Journal(_) => ErrorCode::StorageFailed,
            PartitionError::Batch(WireError::RecordTooLarge { .. }) => ErrorCode::RecordTooLarge,
            PartitionError::Batch(_)
            | PartitionError::NotData
            | PartitionError::Flags(_)
            | PartitionError::ClockSkew { .. } => ErrorCode::BatchInvalid,
            PartitionError::BeyondHorizon { .. } | PartitionError::ExpiresBeforeDue { .. } => {
                ErrorCode::InvalidArgument
            }
            PartitionError::QueueFull { .. } => ErrorCode::QueueFull,
            // An older client gets QUEUE_FULL (`ApiKey::answerable`).
            PartitionError::ActiveKeysFull { .. } => ErrorCode::ActiveKeysFull,
            PartitionError::StateMemory(_) => ErrorCode::Throttled,
            PartitionError::Token(_) => ErrorCode::InvalidToken,
            PartitionError::TooManyWaiters | PartitionError::TooManyWaitersOnConnection { .. } => {
                ErrorCode::Throttled
            }
            PartitionError::SideFile(_)
            | PartitionError::Recovery { .. }
            | PartitionError::Snapshot { .. }
            | PartitionError::EpochExhausted { .. }
            | PartitionError::CheckpointsStopped { .. } => ErrorCode::StorageFailed,
            PartitionError::ReadMiss { .. } => ErrorCode::Internal,
            PartitionError::Config(_) => ErrorCode::InvalidArgument,
            // A client of an older version gets NOT_OWNER in its place
            // (`ApiKey::answerable`, at the encode).
            PartitionError::NotLeader { .. } => ErrorCode::NotLeader,
            PartitionError::Replica(error) => match error {
                DriverError::NotLeader { .. } | DriverError::Superseded { .. } => {
                    ErrorCode::NotLeader
                }
                DriverError::Busy => ErrorCode::Throttled,
                DriverError::InvalidBatch(_) => ErrorCode::BatchInvalid,
                DriverError::Journal(JournalError::Closed) => ErrorCode::ShuttingDown,
                DriverError::TermTooLarge { .. }
                | DriverError::Journal(_)
                | DriverError::Vote(_)
                | DriverError::Stopped(_) => ErrorCode::StorageFailed,
                DriverError::Replica(_) => ErrorCode::Internal,
            },
        }
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
        let full = PartitionError::StateMemory(super::super::memory::StateMemoryFull {
            shard: 1,
            needed_bytes: 296,
            used_bytes: 1_000,
            size_bytes: 1_100,
        });
        assert_eq!(full.code(), ErrorCode::Throttled, "memory for queue state is retriable");
        assert!(full.to_string().contains("memory_bytes"), "{full}");
        let miss = PartitionError::ReadMiss {
            dir: PathBuf::from("/data/q/0"),
            offset: crate::queue::Offset(7),
            reason: "no record there in the log",
        };
        assert_eq!(miss.code(), ErrorCode::Internal);
        let text = miss.to_string();
        assert!(text.contains("/data/q/0") && text.contains('7'), "{text}");
    }

    #[test]
    fn open_and_checkpoint_refusals_name_what_happened() {
        // Goal: an exhausted leader epoch is not reported as a recovery problem and a
        // stopped checkpoint is not reported as a failed log: each names the partition
        // directory and what happened, with the storage code the client saw before.
        // Method: the message and code of each variant.
        let dir = PathBuf::from("/data/q/1");
        let exhausted = PartitionError::EpochExhausted { dir: dir.clone(), epoch: 1 << 32 };
        let text = exhausted.to_string();
        assert!(text.contains("/data/q/1") && text.contains("4294967296"), "{text}");
        assert!(!matches!(exhausted, PartitionError::Recovery { .. }));
        assert_eq!(exhausted.code(), ErrorCode::StorageFailed);
        let stopped = PartitionError::CheckpointsStopped { dir };
        let text = stopped.to_string();
        assert!(text.contains("/data/q/1") && text.contains("checkpoint sync failed"), "{text}");
        assert!(!matches!(stopped, PartitionError::Log(_)));
        assert_eq!(stopped.code(), ErrorCode::StorageFailed);
    }
}
