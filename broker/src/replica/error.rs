//! The replica driver's error (`driver.rs`, `entries.rs`).

use thiserror::Error;

use super::node::ReplicaError;
use crate::log::journal::JournalError;
use crate::log::vote::VoteError;

/// Why a driver refused a call or stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DriverError {
    /// This member does not lead (`leader`: the one it knows of, 0: none).
    #[error("not the leader (leader: {leader})")]
    NotLeader { leader: u64 },
    /// The log is catching up (a truncation, or appends waiting for room):
    /// retry once [`ReplicaDriver::progress`](super::ReplicaDriver::progress) fires.
    #[error("the log is busy catching up; retry")]
    Busy,
    /// The term does not fit the batch header's leader epoch.
    #[error("term {term} does not fit a leader epoch (u32)")]
    TermTooLarge { term: u64 },
    /// The proposal's entry was replaced by another leader's before it
    /// committed: its outcome is that it did not happen.
    #[error("entry {index} of term {term} was superseded before it committed")]
    Superseded { index: u64, term: u64 },
    /// The batch to propose is not one.
    #[error("not a batch: {0}")]
    InvalidBatch(String),
    /// raft-rs refused (a leadership transfer under way, a snapshot).
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// The log refused an operation; the driver stopped.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The vote log failed; the driver stopped.
    #[error(transparent)]
    Vote(#[from] VoteError),
    /// The driver stopped earlier for this reason: the member serves
    /// nothing until it is opened again.
    #[error("replica stopped: {0}")]
    Stopped(String),
}
