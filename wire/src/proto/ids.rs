//! Newtypes for the identities and positions the protocol carries, so a
//! partition number is never passed where an offset belongs.
//!
//! These are the only definitions of these types in the workspace: the
//! broker's log, queue state machine, assignment table and server use them
//! as they are (re-exported from `spool_broker::log` and
//! `spool_broker::queue`), so a value read from a frame reaches the state
//! machine without a conversion. `Display` prints the plain number
//! (`offset 99`, not `Offset(99)`): errors and logs show these to users.
//!
//! The queue's claim `Generation` is not one of them: the state machine
//! counts it in 32 bits (it is bound into the delivery token), the wire
//! carries 64.

/// A partition of a queue (0-based).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(pub u32);

impl PartitionId {
    /// In a Claim (version 1 and later): any partition of the queue that the
    /// shard the request reaches leads. Never a partition's own number
    /// (partitions per queue stay far below it).
    pub const ANY: Self = Self(u32::MAX);
}

/// A position in a partition log. Assigned by the log at append time; a
/// message is identified inside its partition by the offset of its data
/// record, for its whole life (including in the dead-letter queue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Offset(pub u64);

/// A consumer's identity, chosen by the client; bound into delivery tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

/// A message's claim generation as the wire carries it: incremented by every
/// claim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u64);

/// A partition's leader epoch: incremented every time the partition opens.
/// Tokens issued under another epoch are stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaderEpoch(pub u64);

/// Version of the partition → shard assignment table; increases by one with
/// every update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AssignmentVersion(pub u64);

/// Plain numbers in messages and logs.
macro_rules! display_inner {
    ($($name:ident),*) => {$(
        impl core::fmt::Display for $name {
            fn fmt(&self, formatter: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                core::fmt::Display::fmt(&self.0, formatter)
            }
        }
    )*};
}
display_inner!(PartitionId, Offset, WorkerId, Generation, LeaderEpoch, AssignmentVersion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_the_plain_number() {
        // Goal: errors print `offset 99`, not `Offset(99)`.
        assert_eq!(Offset(99).to_string(), "99");
        assert_eq!(PartitionId(7).to_string(), "7");
        assert_eq!(LeaderEpoch(3).to_string(), "3");
    }
}
