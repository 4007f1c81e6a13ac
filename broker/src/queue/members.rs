//! A replicated partition's group members as its log names them
//! (`docs/design/replication.md` §9, "Re-placement"): the voters and the
//! learners, and the one-node changes (`Event::Membership`) that move them.
//! The partition's state keeps them (`PartitionState::members`, in
//! checkpoints) so a reopened or installed member starts its Raft group
//! with the configuration its log reached; `replica/membership.rs` turns a
//! change into raft-rs's and back.

/// A group's members: the voters, and the learners that receive every
/// entry but neither vote nor count for a commit (a node outside the
/// controller's voters follows the catalog as one). Kept sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

impl Members {
    /// A group of `voters` alone.
    pub fn voters(voters: &[u64]) -> Members {
        let mut voters = voters.to_vec();
        voters.sort_unstable();
        Members { voters, learners: Vec::new() }
    }

    /// Every member's id, voters first.
    pub fn all(&self) -> impl Iterator<Item = u64> + '_ {
        self.voters.iter().chain(&self.learners).copied()
    }

    /// The members after `change`, as raft-rs's apply of a simple change
    /// makes them (a voter made a learner or a learner a voter moves).
    #[must_use]
    pub fn changed(&self, change: MembershipChange) -> Members {
        let mut members = self.clone();
        match change {
            MembershipChange::AddLearner(node) => {
                members.voters.retain(|id| *id != node);
                if !members.learners.contains(&node) {
                    members.learners.push(node);
                }
            }
            MembershipChange::AddVoter(node) => {
                members.learners.retain(|id| *id != node);
                if !members.voters.contains(&node) {
                    members.voters.push(node);
                }
            }
            MembershipChange::Remove(node) => {
                members.voters.retain(|id| *id != node);
                members.learners.retain(|id| *id != node);
            }
        }
        members.voters.sort_unstable();
        members.learners.sort_unstable();
        members
    }
}

/// One step of a group's membership: a raft-rs simple change of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A node joins as a learner.
    AddLearner(u64),
    /// A node (a learner, or a new one) becomes a voter.
    AddVoter(u64),
    /// A node leaves the group.
    Remove(u64),
}

impl MembershipChange {
    /// The node it changes.
    pub fn node(self) -> u64 {
        match self {
            MembershipChange::AddLearner(node)
            | MembershipChange::AddVoter(node)
            | MembershipChange::Remove(node) => node,
        }
    }

    /// Its code in a control record (1 learner, 2 voter, 3 remove).
    pub fn code(self) -> u16 {
        match self {
            MembershipChange::AddLearner(_) => 1,
            MembershipChange::AddVoter(_) => 2,
            MembershipChange::Remove(_) => 3,
        }
    }

    /// The change of `code` for `node` (never node 0).
    pub fn from_code(code: u16, node: u64) -> Option<MembershipChange> {
        if node == 0 {
            return None;
        }
        match code {
            1 => Some(MembershipChange::AddLearner(node)),
            2 => Some(MembershipChange::AddVoter(node)),
            3 => Some(MembershipChange::Remove(node)),
            _ => None,
        }
    }
}
