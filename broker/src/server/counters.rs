//! Per-partition request counters the handler keeps beside each served
//! partition: what the queue state does not count because it folds events,
//! not requests (claims answered, redeliveries handed out, extends granted,
//! stale tokens, refusals by cause).
//!
//! Plain `Cell`s on the shard that owns the partition: one increment per
//! answered request, no atomics, nothing shared. The admin port reads them
//! through the shard's report ([`crate::shard::report`]).

use std::cell::Cell;

use spool_wire::ErrorCode;

use crate::log::LogError;
use crate::partition::{Claimed, PartitionError};
use crate::queue::FullLimit;
use crate::shard::report::{AdmissionCause, RequestCounts};

/// Counters of one served partition, since it opened.
#[derive(Debug, Default)]
pub struct RequestCounters {
    claims: Cell<u64>,
    deliveries: Cell<u64>,
    redeliveries: Cell<u64>,
    extends: Cell<u64>,
    stale_tokens: Cell<u64>,
    rejections: [Cell<u64>; AdmissionCause::ALL.len()],
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get().wrapping_add(by));
}

impl RequestCounters {
    /// A claim answered with `claimed` (possibly none).
    pub fn claimed(&self, claimed: &[Claimed]) {
        bump(&self.claims, 1);
        bump(&self.deliveries, claimed.len() as u64);
        let again = claimed.iter().filter(|item| item.delivery.attempt > 1).count();
        bump(&self.redeliveries, again as u64);
    }

    /// A lease extension granted.
    pub fn extended(&self) {
        bump(&self.extends, 1);
    }

    /// A token refused with `code` (acks report codes, not errors).
    pub fn token_refused(&self, code: ErrorCode) {
        if code == ErrorCode::StaleToken {
            bump(&self.stale_tokens, 1);
        }
    }

    /// A request of this partition failed with `error`: counted if it is a
    /// stale token or an admission refusal, ignored otherwise.
    pub fn failed(&self, error: &PartitionError) {
        let cause = match error {
            PartitionError::QueueFull { limit: FullLimit::Messages } => AdmissionCause::MaxMessages,
            PartitionError::QueueFull { limit: FullLimit::Bytes } => AdmissionCause::MaxBytes,
            PartitionError::Log(LogError::DiskFull) => AdmissionCause::DiskFull,
            PartitionError::TooManyWaiters => AdmissionCause::ClaimWaitersPerPartition,
            PartitionError::TooManyWaitersOnConnection { .. } => {
                AdmissionCause::ClaimWaitersPerConnection
            }
            other => return self.token_refused(other.code()),
        };
        bump(&self.rejections[cause.index()], 1);
    }

    /// The counts now.
    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            claims: self.claims.get(),
            deliveries: self.deliveries.get(),
            redeliveries: self.redeliveries.get(),
            extends: self.extends.get(),
            stale_tokens: self.stale_tokens.get(),
            rejections: std::array::from_fn(|index| self.rejections[index].get()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueueError, StaleToken};

    // Goal: each refusal lands under its own cause and stale tokens are told
    // apart from other failures. Method: feed one error of each kind.
    #[test]
    fn refusals_are_counted_by_cause() {
        let counters = RequestCounters::default();
        counters.failed(&PartitionError::QueueFull { limit: FullLimit::Bytes });
        counters.failed(&PartitionError::QueueFull { limit: FullLimit::Bytes });
        counters.failed(&PartitionError::TooManyWaiters);
        counters.failed(&PartitionError::Queue(QueueError::StaleToken(StaleToken::NotClaimed)));
        counters.failed(&PartitionError::NotData);
        counters.token_refused(ErrorCode::StaleToken);
        counters.token_refused(ErrorCode::InvalidToken);
        counters.extended();
        let counts = counters.snapshot();
        assert_eq!(counts.rejections[AdmissionCause::MaxBytes.index()], 2);
        assert_eq!(counts.rejections[AdmissionCause::ClaimWaitersPerPartition.index()], 1);
        assert_eq!(counts.rejections[AdmissionCause::MaxMessages.index()], 0);
        assert_eq!(counts.stale_tokens, 2);
        assert_eq!(counts.extends, 1);
    }
}
