//! Membership changes of a group (`docs/design/replication.md` §9,
//! "Re-placement"): replacing a dead member is three raft-rs simple
//! changes, one at a time, each committed and applied before the next is
//! proposed — the new node joins as a learner (it gets every entry and
//! neither votes nor counts), is promoted to voter once it has caught up,
//! and the dead member is removed. A simple change moves the voters by at
//! most one, so any two consecutive configurations share a majority: no
//! joint consensus is needed, and a group of three keeps a quorum of the
//! two live members and the caught-up new one (three of four) during the
//! swap.
//!
//! raft-rs applies a change when its entry is applied, not when it is
//! appended, so a group's members are its initial members with every
//! change in its *committed* log folded in ([`Members::after`]): what a
//! member restarted with its committed prefix passes to
//! [`Replica::start`](super::Replica::start). A node that joins starts with
//! the group's initial members (which do not name it) and folds the
//! changes as the leader's entries reach it, from the group's first entry
//! (or from a snapshot, which names the members at its index).
//!
//! The owner calls [`Replica::apply_membership`] for each entry it applies, as
//! it applies it, in order with the other entries; nothing else of the
//! state machine changes for it.

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState, Entry, EntryType};

use super::node::{Members, Replica, ReplicaError};

pub use crate::queue::MembershipChange;

/// The raft-rs change of a [`MembershipChange`].
pub(super) fn conf_change(change: MembershipChange) -> ConfChange {
    let (change_type, node) = match change {
        MembershipChange::AddLearner(node) => (ConfChangeType::AddLearnerNode, node),
        MembershipChange::AddVoter(node) => (ConfChangeType::AddNode, node),
        MembershipChange::Remove(node) => (ConfChangeType::RemoveNode, node),
    };
    let mut change = ConfChange::default();
    change.set_change_type(change_type);
    change.node_id = node;
    change
}

/// The change an entry carries: `None` for a normal entry.
///
/// # Errors
/// [`ReplicaError::Membership`] for a change entry that does not decode or
/// is not a simple change of one node (joint changes are never proposed).
pub fn change_of_entry(entry: &Entry) -> Result<Option<MembershipChange>, ReplicaError> {
    let refused = |reason: String| ReplicaError::Membership { index: entry.index, reason };
    match entry.get_entry_type() {
        EntryType::EntryNormal => Ok(None),
        EntryType::EntryConfChangeV2 => Err(refused("a joint change".to_owned())),
        EntryType::EntryConfChange => {
            let mut change = ConfChange::default();
            change.merge_from_bytes(&entry.data).map_err(|error| refused(error.to_string()))?;
            let node = change.node_id;
            if node == 0 {
                return Err(refused("node id 0".to_owned()));
            }
            Ok(Some(match change.get_change_type() {
                ConfChangeType::AddLearnerNode => MembershipChange::AddLearner(node),
                ConfChangeType::AddNode => MembershipChange::AddVoter(node),
                ConfChangeType::RemoveNode => MembershipChange::Remove(node),
            }))
        }
    }
}

/// The raft-rs entry of `change` at (`index`, `term`).
pub(super) fn change_entry(index: u64, term: u64, change: MembershipChange) -> Entry {
    let mut entry = Entry { index, term, ..Entry::default() };
    entry.set_entry_type(EntryType::EntryConfChange);
    entry.data = conf_change(change).write_to_bytes().unwrap_or_default().into();
    entry
}

impl Members {
    /// The members after every change among `entries` (in index order),
    /// from these.
    ///
    /// # Errors
    /// A change entry that does not decode ([`MembershipChange::of_entry`]).
    pub fn after(&self, entries: &[Entry]) -> Result<Members, ReplicaError> {
        let mut members = self.clone();
        for entry in entries {
            if let Some(change) = change_of_entry(entry)? {
                members = members.changed(change);
            }
        }
        Ok(members)
    }

    fn of_conf_state(conf: &ConfState) -> Members {
        let mut members = Members { voters: conf.voters.clone(), learners: conf.learners.clone() };
        members.voters.sort_unstable();
        members.learners.sort_unstable();
        members
    }
}

impl Replica {
    /// The group's members as this member applied them.
    pub fn membership(&self) -> Members {
        Members::of_conf_state(&self.raw.raft.prs().conf().to_conf_state())
    }

    /// On a leader, whether `node` holds every entry committed so far (a
    /// learner ready to be promoted).
    pub fn caught_up(&self, node: u64) -> bool {
        let committed = self.raw.raft.raft_log.committed;
        self.raw.raft.prs().get(node).is_some_and(|progress| progress.matched >= committed)
    }

    /// On a leader, hands the lead to voter `to` (raft-rs sends it what it
    /// lacks, then tells it to campaign at once): how a leader leaves a
    /// group it is to be removed from without an election timeout.
    pub fn transfer_leader(&mut self, to: u64) {
        self.raw.transfer_leader(to);
    }

    /// Whether a change is proposed and not yet applied here (raft-rs takes
    /// one at a time).
    pub fn membership_pending(&self) -> bool {
        self.raw.raft.pending_conf_index > self.raw.raft.raft_log.applied
    }

    /// On a leader with no change pending, proposes `change`; returns the
    /// (index, term) its entry will have if it commits.
    ///
    /// # Errors
    /// [`ReplicaError::NotLeader`]; [`ReplicaError::Membership`] when a
    /// change is pending, `change` changes nothing, or it would leave the
    /// group without a voter; [`ReplicaError::Raft`] if raft-rs drops it.
    pub fn propose_membership(
        &mut self,
        change: MembershipChange,
    ) -> Result<(u64, u64), ReplicaError> {
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader { id: self.id(), leader: self.leader() });
        }
        let refused = |reason: &str| ReplicaError::Membership {
            index: 0,
            reason: format!("{change:?}: {reason}"),
        };
        if self.membership_pending() {
            return Err(refused("another change is pending"));
        }
        let members = self.membership();
        let after = members.changed(change);
        if after == members {
            return Err(refused("changes nothing"));
        }
        if after.voters.is_empty() {
            return Err(refused("would leave no voter"));
        }
        let before = self.last_index();
        self.raw
            .propose_conf_change(Vec::new(), conf_change(change))
            .map_err(|source| ReplicaError::Raft { id: self.id(), source })?;
        let index = self.last_index();
        if index != before + 1 {
            return Err(refused("raft-rs did not append it"));
        }
        Ok((index, self.term()))
    }

    /// Applies the change `entry` carries (call for every entry of
    /// [`Work::apply`](super::Work::apply), in order); returns the change,
    /// `None` for a normal entry (which costs only a look at its type).
    ///
    /// # Errors
    /// The entry does not decode, or raft-rs refuses the change.
    pub fn apply_membership(
        &mut self,
        entry: &Entry,
    ) -> Result<Option<MembershipChange>, ReplicaError> {
        let Some(change) = change_of_entry(entry)? else { return Ok(None) };
        let conf = self
            .raw
            .apply_conf_change(&conf_change(change))
            .map_err(|source| ReplicaError::Raft { id: self.id(), source })?;
        self.raw.mut_store().set_conf_state(conf);
        Ok(Some(change))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, change: Option<MembershipChange>) -> Entry {
        match change {
            Some(change) => change_entry(index, 1, change),
            None => Entry { index, term: 1, ..Entry::default() },
        }
    }

    // Goal: a replacement's three steps fold to the new set, and a change
    // entry round-trips; a damaged one is refused.
    #[test]
    fn a_replacement_folds_from_its_committed_entries() {
        let initial = Members::voters(&[1, 2, 3]);
        let entries = [
            entry(1, None),
            entry(2, Some(MembershipChange::AddLearner(4))),
            entry(3, None),
            entry(4, Some(MembershipChange::AddVoter(4))),
            entry(5, Some(MembershipChange::Remove(3))),
        ];
        let after = initial.after(&entries).unwrap_or_default();
        assert_eq!(after, Members::voters(&[1, 2, 4]));
        let learner = initial.after(&entries[..3]).unwrap_or_default();
        assert_eq!(learner, Members { voters: vec![1, 2, 3], learners: vec![4] });
        assert_eq!(change_of_entry(&entries[4]).ok().flatten(), Some(MembershipChange::Remove(3)));
        let mut damaged = entries[1].clone();
        damaged.data = vec![0xFF; 3].into();
        assert!(change_of_entry(&damaged).is_err());
        assert!(initial.after(&[damaged]).is_err());
    }
}
