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
//! or bytes ran out) puts the partition at the back, so a ring longer than
//! one visit is still covered by the claims that follow, and inside a
//! visit the oldest messages go first: a busy partition cannot starve the
//! others (a quiet partition's message waits at most for the shard's
//! older ones).
//!
//! A claim visits the ring's first partitions
//! ([`CLAIM_ANY_VISIT_PARTITIONS_MAX`]) in the order their next messages
//! lie in the shard's journal, oldest first, and takes from each only the
//! messages that lie before the next one's ([`plan_visit`]): a consumer
//! behind the commit cache then walks the journal forward, and one chunk
//! read from a file serves every partition with entries in it, instead of
//! each partition's claim reading the whole stretch its messages span
//! (`docs/design/shard-journal.md` §13).
//!
//! Listing is O(1) (a flag per partition number and a queue), a partition
//! is listed at most once, and the ring holds at most the queue's
//! partitions (bounded by `PARTITIONS_MAX`). It names no runtime.
//!
//! Each subscription of the queue has its own ring ([`ReadyRings`]): the
//! default's is made with the queue's first partition, another's with the
//! first claim of any partition in it, listing every partition the shard
//! serves. A partition's wake does not say which subscription it is for,
//! so it lists the partition in every ring of the queue (at most
//! `SUBSCRIPTIONS_PER_QUEUE_MAX`): a ring may list a partition with
//! nothing for its subscription, which the next visit finds exhausted and
//! drops, but never misses one with something claimable.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

pub use crate::limits::{CLAIM_ANY_PEEK_MESSAGES_MAX, CLAIM_ANY_VISIT_PARTITIONS_MAX};
use crate::partition::signal::Signal;
use crate::queue::{PartitionId, SubscriptionId};

/// How much one partition of a visit takes: the messages before the next
/// partition's first (at least one), or, for the last, all it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    AtMost(u32),
    All,
}

/// Orders a visit's partitions — each with the journal positions of the
/// messages a claim would deliver from it, in delivery order (none empty)
/// — by their first message's position, and says what each takes: the
/// messages whose positions lie before the next partition's first message
/// (at least one, so every visit moves), the last one all it can. Ties keep
/// the ring's order.
pub fn plan_visit<T>(candidates: &mut [(Vec<u64>, T)]) -> Vec<Take> {
    candidates.sort_by_key(|(positions, _)| positions.first().copied().unwrap_or(u64::MAX));
    (0..candidates.len())
        .map(|at| match candidates.get(at + 1).and_then(|(next, _)| next.first()) {
            None => Take::All,
            Some(&bound) => {
                let before = candidates[at].0.iter().take_while(|p| **p < bound).count();
                Take::AtMost(u32::try_from(before.max(1)).unwrap_or(u32::MAX))
            }
        })
        .collect()
}

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

/// The ready rings of one queue on one shard, one per subscription a claim
/// of any partition has asked for (see the module doc).
#[derive(Debug, Default)]
pub struct ReadyRings {
    default: Rc<ReadyRing>,
    others: RefCell<BTreeMap<SubscriptionId, Rc<ReadyRing>>>,
}

impl ReadyRings {
    /// The ring of `sub`. A subscription other than the default gets its
    /// ring on first use, with `partitions` (every partition of the queue
    /// the shard serves) listed; rings of subscriptions not in `live` (the
    /// ones the table names now) are closed and dropped then, so the map
    /// holds at most the queue's live subscriptions.
    pub fn ring(
        &self,
        sub: SubscriptionId,
        partitions: impl Iterator<Item = PartitionId>,
        live: impl Fn(SubscriptionId) -> bool,
    ) -> Rc<ReadyRing> {
        if sub == SubscriptionId::DEFAULT {
            return Rc::clone(&self.default);
        }
        if let Some(ring) = self.others.borrow().get(&sub) {
            return Rc::clone(ring);
        }
        let mut others = self.others.borrow_mut();
        others.retain(|id, ring| {
            let keep = live(*id);
            if !keep {
                ring.close();
            }
            keep
        });
        let ring = Rc::new(ReadyRing::default());
        for partition in partitions {
            ring.keep(partition);
        }
        others.insert(sub, Rc::clone(&ring));
        ring
    }

    /// `partition` may have `count` claimable messages in some
    /// subscription: [`ReadyRing::mark`] on every ring.
    pub fn mark(&self, partition: PartitionId, count: usize) {
        self.default.mark(partition, count);
        for ring in self.others.borrow().values() {
            ring.mark(partition, count);
        }
    }

    /// Claims waiting on any of the rings.
    pub fn claims_waiting(&self) -> usize {
        let others: usize =
            self.others.borrow().values().map(|ring| ring.waiters().claims_waiting()).sum();
        self.default.waiters().claims_waiting() + others
    }

    /// [`ReadyRing::close`] on every ring.
    pub fn close(&self) {
        self.default.close();
        for ring in std::mem::take(&mut *self.others.borrow_mut()).into_values() {
            ring.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a visit walks the journal forward — partitions in the order of
    // their first message's position, each taking only what lies before the
    // next one's first message (at least one), the last taking all; a lone
    // partition takes all; method: hand-made positions.
    #[test]
    fn a_visit_takes_in_journal_order() {
        let mut interleaved = vec![
            (vec![300, 1_300, 2_300], 'c'),
            (vec![100, 1_100, 2_100], 'a'),
            (vec![200, 1_200], 'b'),
        ];
        let takes = plan_visit(&mut interleaved);
        let order: Vec<char> = interleaved.iter().map(|(_, name)| *name).collect();
        assert_eq!(order, vec!['a', 'b', 'c']);
        assert_eq!(takes, vec![Take::AtMost(1), Take::AtMost(1), Take::All]);
        // One partition far behind the others: it takes everything before them.
        let mut behind = vec![(vec![5_000, 5_100], 'x'), (vec![10, 20, 30, 6_000], 'y')];
        assert_eq!(plan_visit(&mut behind), vec![Take::AtMost(3), Take::All]);
        assert_eq!(behind[0].1, 'y');
        // Unplaced messages (u64::MAX) sort last; a lone partition takes all.
        let mut unplaced = vec![(vec![u64::MAX], 'u'), (vec![7, 8], 'p')];
        assert_eq!(plan_visit(&mut unplaced), vec![Take::AtMost(2), Take::All]);
        let mut lone = vec![(vec![1, 2, 3], 'l')];
        assert_eq!(plan_visit(&mut lone), vec![Take::All]);
    }

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

    // Goal: a subscription's ring starts with every served partition listed,
    // a wake lists its partition in every subscription's ring, and a ring
    // of a subscription the table no longer names is dropped when another
    // is made; method: rings by hand.
    #[test]
    fn every_subscription_ring_hears_every_wake() {
        let rings = ReadyRings::default();
        let (one, two) = (SubscriptionId(1), SubscriptionId(2));
        let default = rings.ring(SubscriptionId::DEFAULT, std::iter::empty(), |_| true);
        assert!(default.is_empty(), "the default's ring is listed by wakes only");
        let first = rings.ring(one, [PartitionId(0), PartitionId(2)].into_iter(), |_| true);
        assert_eq!(first.len(), 2, "a new ring lists every served partition");
        assert!(first.is_listed(PartitionId(0)) && first.is_listed(PartitionId(2)));
        rings.mark(PartitionId(5), 1);
        assert!(default.is_listed(PartitionId(5)) && first.is_listed(PartitionId(5)));
        assert!(Rc::ptr_eq(&first, &rings.ring(one, std::iter::empty(), |_| true)));
        // Subscription 1 ended: making 2's ring drops and closes 1's.
        let second = rings.ring(two, [PartitionId(5)].into_iter(), |sub| sub != one);
        assert!(first.is_empty(), "closed");
        rings.mark(PartitionId(7), 1);
        assert!(second.is_listed(PartitionId(7)) && !first.is_listed(PartitionId(7)));
        let fresh = rings.ring(one, std::iter::empty(), |_| true);
        assert!(!Rc::ptr_eq(&first, &fresh));
        rings.close();
        assert!(default.is_empty() && second.is_empty() && fresh.is_empty());
    }
}
