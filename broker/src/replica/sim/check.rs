//! The simulation's checker: what must hold of every run, whatever the
//! faults (`docs/design/replication.md` §8).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use raft::eraftpb::Entry;

/// What the run has seen, checked as it goes.
#[derive(Debug, Default)]
pub(in crate::replica) struct Checker {
    /// The leader of each term seen.
    leaders: BTreeMap<u64, u64>,
    /// The entry applied at each index, by whichever node applied it first.
    history: BTreeMap<u64, (u64, Bytes)>,
    /// The last index each node's state machine holds.
    applied: BTreeMap<u64, u64>,
    /// Proposals answered to their client (applied on the node that took
    /// them, with their index and term).
    acknowledged: BTreeMap<u64, (u64, Bytes)>,
    pub(in crate::replica) crashes: usize,
    /// Times a node let go of its log up to a higher floor.
    pub(in crate::replica) compactions: usize,
    /// Read-backs of older entries served for lagging followers.
    pub(in crate::replica) fetches: usize,
    /// Membership changes proposed (replacement runs).
    pub(in crate::replica) membership_changes: usize,
}

impl Checker {
    /// Election safety: one leader per term.
    pub(super) fn role(&mut self, id: u64, term: u64, leader: bool) {
        if !leader {
            return;
        }
        let first = *self.leaders.entry(term).or_insert(id);
        assert_eq!(first, id, "two leaders in term {term}: {first} and {id}");
    }

    /// State machine safety: an index applied anywhere is one entry; a
    /// node applies in index order with no gap.
    pub(super) fn applied(&mut self, node: u64, entry: &Entry) {
        let last = self.applied.entry(node).or_insert(0);
        assert_eq!(entry.index, *last + 1, "node {node} applied {} after {last}", entry.index);
        *last = entry.index;
        let seen = self.history.entry(entry.index).or_insert((entry.term, entry.data.clone()));
        assert_eq!(
            (seen.0, &seen.1),
            (entry.term, &entry.data),
            "node {node} applied another entry at index {}",
            entry.index
        );
    }

    /// A node restarted with `prefix` as its committed log: the same
    /// history, and its state machine starts there.
    pub(super) fn restarted(&mut self, node: u64, prefix: &[Entry]) {
        self.applied.insert(node, 0);
        for entry in prefix {
            self.applied(node, entry);
        }
    }

    /// Node `node` let go of its log from `from + 1` to `to`: every node's
    /// durable log (`logs`: id and log) must hold those entries as applied,
    /// or a later leader could lack what a follower needs (no snapshot
    /// would bring it).
    pub(super) fn let_go(&mut self, node: u64, from: u64, to: u64, logs: &[(u64, &[Entry])]) {
        self.compactions += 1;
        for &(other, log) in logs {
            for index in from + 1..=to {
                let held = log.get(index as usize - 1).map(|entry| (entry.term, &entry.data));
                let applied = self.history.get(&index).map(|(term, bytes)| (*term, bytes));
                assert!(
                    held.is_some() && held == applied,
                    "node {node} let go of its log up to {to}, but node {other} holds {:?} at \
                     {index}, not the applied {:?}",
                    held.map(|held| held.0),
                    applied.map(|applied| applied.0)
                );
            }
        }
    }

    pub(super) fn crashed(&mut self, _node: u64) {
        self.crashes += 1;
    }

    /// A proposal answered to its client.
    pub(super) fn acknowledged(&mut self, entry: &Entry) {
        self.acknowledged.insert(entry.index, (entry.term, entry.data.clone()));
    }

    pub(in crate::replica) fn acknowledged_count(&self) -> usize {
        self.acknowledged.len()
    }

    pub(super) fn acknowledged_last(&self) -> Option<u64> {
        self.acknowledged.keys().next_back().copied()
    }

    pub(super) fn applied_to(&self, node: u64) -> u64 {
        self.applied.get(&node).copied().unwrap_or(0)
    }

    pub(in crate::replica) fn leaders_seen(&self) -> usize {
        self.leaders.len()
    }

    /// Durability: every acknowledged proposal is in `log` (a node's log
    /// after the run converged) at its index and term.
    pub(super) fn holds_acknowledged(&self, node: u64, log: &[Entry]) {
        for (&index, (term, bytes)) in &self.acknowledged {
            let held = log.get(index as usize - 1);
            assert!(
                held.is_some_and(|entry| entry.term == *term && entry.data == *bytes),
                "node {node} lost acknowledged entry {index} (term {term}): holds {:?}",
                held.map(|entry| (entry.index, entry.term))
            );
        }
    }

    /// A digest of what the run did, to compare two runs of one seed.
    pub(in crate::replica) fn fingerprint(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.leaders.hash(&mut hasher);
        self.history.hash(&mut hasher);
        self.acknowledged.hash(&mut hasher);
        self.crashes.hash(&mut hasher);
        hasher.finish()
    }
}
