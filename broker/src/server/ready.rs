//! The ready ring of one queue on one shard: the partitions the shard leads
//! that may have a claimable main-lane message, in the order a claim of
//! any partition (`Claim` v1, partition `ANY`) visits them, and the claims
//! of any partition waiting for one (`docs/design/shard-journal.md` §13).
//!
//! The ring is kept by the partitions' own wakes, the ones that already
//! wake a partition's long-polls (`Partition::set_ready_hook`): an enqueue
//! made durable, a release, a lease that ended or a delay that passed, a
//! redrive, and (the safety net) every housekeeping visit that finds
//! messages ready. A partition leaves the ring only when a visit found it
//! exhausted (nothing claimable below its durable end), so a partition with
//! a claimable message is always listed, or is listed again by the wake
//! that made it claimable. A visit that leaves messages behind (its credits
//! or bytes ran out) puts the partition at the back, so a busy partition
//! cannot starve the others: claims rotate over the listed partitions.
//!
//! Listing is O(1) (a flag per partition number and a queue), a partition
//! is listed at most once, and the ring holds at most the queue's
//! partitions (bounded by `PARTITIONS_MAX`). It names no runtime.

use std::cell::RefCell;
use std::collections::VecDeque;

use crate::partition::signal::Signal;
use crate::queue::PartitionId;

/// See the module doc.
#[derive(Debug, Default)]
pub struct ReadyRing {
    order: RefCell<VecDeque<PartitionId>>,
    /// By partition number: listed in `order`.
    listed: RefCell<Vec<bool>>,
    /// Claims of any partition waiting for one to be listed.
    waiters: Signal,
}

impl ReadyRing {
    /// `partition` may have `count` claimable messages (0: some, count
    /// unknown): lists it (at the back) unless it is listed, and wakes up
    /// to `count` waiting claims (one for 0, and only if it was not
    /// listed: the housekeeping's safety net wakes nobody for a partition
    /// already in line).
    pub fn mark(&self, partition: PartitionId, count: usize) {
        let newly = self.list(partition);
        if count > 0 {
            self.waiters.notify(count);
        } else if newly {
            self.waiters.notify(1);
        }
    }

    /// Puts `partition` back at the back of the line after a visit that
    /// left messages behind (no wake: the claim that visited it is about
    /// to answer, or visits it again).
    pub fn keep(&self, partition: PartitionId) {
        self.list(partition);
    }

    /// The next partition to visit, taken out of the ring.
    pub fn next(&self) -> Option<PartitionId> {
        let partition = self.order.borrow_mut().pop_front()?;
        if let Some(flag) = self.listed.borrow_mut().get_mut(partition.0 as usize) {
            *flag = false;
        }
        Some(partition)
    }

    /// Partitions listed now.
    pub fn len(&self) -> usize {
        self.order.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.borrow().is_empty()
    }

    /// Whether `partition` is listed.
    pub fn is_listed(&self, partition: PartitionId) -> bool {
        self.listed.borrow().get(partition.0 as usize).copied().unwrap_or(false)
    }

    /// The claims of any partition waiting on this ring.
    pub fn waiters(&self) -> &Signal {
        &self.waiters
    }

    /// The queue stops being served here (deleted, or the shard stops):
    /// every waiting claim wakes, finds nothing, and answers empty.
    pub fn close(&self) {
        self.order.borrow_mut().clear();
        self.listed.borrow_mut().clear();
        self.waiters.notify_all();
    }

    fn list(&self, partition: PartitionId) -> bool {
        let index = partition.0 as usize;
        let mut listed = self.listed.borrow_mut();
        if listed.len() <= index {
            listed.resize(index + 1, false);
        }
        if listed[index] {
            return false;
        }
        listed[index] = true;
        self.order.borrow_mut().push_back(partition);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a partition is listed once however often it is marked, visits
    // come out in listing order, and `keep` sends a partition to the back;
    // method: mark, visit and keep by hand.
    #[test]
    fn lists_each_partition_once_and_rotates_kept_ones() {
        let ring = ReadyRing::default();
        ring.mark(PartitionId(3), 2);
        ring.mark(PartitionId(1), 0);
        ring.mark(PartitionId(3), 5);
        assert_eq!(ring.len(), 2);
        assert!(ring.is_listed(PartitionId(3)) && ring.is_listed(PartitionId(1)));
        assert!(!ring.is_listed(PartitionId(0)) && !ring.is_listed(PartitionId(900)));
        assert_eq!(ring.next(), Some(PartitionId(3)));
        assert!(!ring.is_listed(PartitionId(3)));
        ring.keep(PartitionId(3));
        ring.mark(PartitionId(7), 1);
        assert_eq!(ring.next(), Some(PartitionId(1)));
        assert_eq!(ring.next(), Some(PartitionId(3)));
        assert_eq!(ring.next(), Some(PartitionId(7)));
        assert_eq!(ring.next(), None);
        assert!(ring.is_empty());
        ring.mark(PartitionId(2), 1);
        ring.close();
        assert!(ring.is_empty() && !ring.is_listed(PartitionId(2)));
    }
}
