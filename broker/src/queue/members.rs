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

/// What a group's leader does next to bring its members to a target
/// replica set ([`Members::step_toward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberStep {
    /// Propose this change.
    Change(MembershipChange),
    /// The leader is to leave the group: hand the lead to this voter of
    /// the target first (the new leader removes the old one).
    Transfer(u64),
    /// A learner of the target is still catching up (or no voter of the
    /// target is caught up to take the lead): nothing yet.
    Wait,
    /// The voters are the target and no learner is left.
    Settled,
}

impl Members {
    /// The next step from these members toward the voters `target`, on
    /// leader `leader`; `caught_up(node)`: whether `node` holds every
    /// committed entry. One raft-rs simple change at a time, so two
    /// consecutive configurations share a majority: first every node of
    /// the target joins as a learner, then each is made a voter once
    /// caught up, then the voters outside the target leave (the leader
    /// last, after handing the lead to a caught-up voter of the target),
    /// then the learners outside it. Adding before removing keeps the
    /// group's fault tolerance while it moves.
    pub fn step_toward(
        &self,
        target: &[u64],
        leader: u64,
        caught_up: impl Fn(u64) -> bool,
    ) -> MemberStep {
        let member = |node: &u64| self.voters.contains(node) || self.learners.contains(node);
        if let Some(&node) = target.iter().find(|node| !member(node)) {
            return MemberStep::Change(MembershipChange::AddLearner(node));
        }
        let joining: Vec<u64> =
            target.iter().copied().filter(|node| self.learners.contains(node)).collect();
        if !joining.is_empty() {
            return match joining.iter().find(|node| caught_up(**node)) {
                Some(&node) => MemberStep::Change(MembershipChange::AddVoter(node)),
                None => MemberStep::Wait,
            };
        }
        let leaving = self.voters.iter().copied().filter(|node| !target.contains(node));
        let mut leader_leaves = false;
        for node in leaving {
            if node == leader {
                leader_leaves = true;
            } else {
                return MemberStep::Change(MembershipChange::Remove(node));
            }
        }
        if leader_leaves {
            return match target.iter().find(|node| **node != leader && caught_up(**node)) {
                Some(&node) => MemberStep::Transfer(node),
                None => MemberStep::Wait,
            };
        }
        match self.learners.iter().find(|node| !target.contains(node)) {
            Some(&node) => MemberStep::Change(MembershipChange::Remove(node)),
            None => MemberStep::Settled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the steps from any group to a target end with exactly the
    // target's voters, one simple change at a time, never dropping below
    // the smaller of the two sets' voter counts, and the leader never
    // removes itself. Method: walk the steps for a replacement of a
    // follower, of the leader, and of two nodes at once, applying each
    // change and moving the lead on a transfer.
    #[test]
    fn steps_reach_the_target_one_change_at_a_time() {
        let cases: [(&[u64], &[u64], u64); 4] = [
            (&[1, 2, 3], &[1, 2, 4], 1),
            (&[1, 2, 3], &[2, 3, 4], 1),
            (&[1, 2, 3], &[1, 4, 5], 2),
            (&[1, 2, 3], &[1, 2, 3], 3),
        ];
        for (start, target, first_leader) in cases {
            let mut members = Members::voters(start);
            let mut leader = first_leader;
            let mut steps = 0;
            loop {
                steps += 1;
                assert!(steps < 20, "{start:?} -> {target:?} does not end");
                match members.step_toward(target, leader, |_| true) {
                    MemberStep::Change(change) => {
                        assert_ne!(change, MembershipChange::Remove(leader));
                        let next = members.changed(change);
                        assert!(next.voters.len() >= start.len().min(target.len()));
                        members = next;
                    }
                    MemberStep::Transfer(to) => {
                        assert!(target.contains(&to) && members.voters.contains(&to));
                        leader = to;
                    }
                    MemberStep::Wait => panic!("every node is caught up"),
                    MemberStep::Settled => break,
                }
            }
            let mut want = target.to_vec();
            want.sort_unstable();
            assert_eq!(members, Members { voters: want, learners: vec![] });
        }
    }

    // Goal: a learner that has not caught up is not promoted, and a leader
    // to be removed waits for a caught-up voter of the target to hand the
    // lead to. Method: the steps with `caught_up` false.
    #[test]
    fn nothing_moves_on_until_the_new_member_caught_up() {
        let joining = Members { voters: vec![1, 2, 3], learners: vec![4] };
        assert_eq!(joining.step_toward(&[1, 2, 4], 1, |_| false), MemberStep::Wait);
        assert_eq!(
            joining.step_toward(&[1, 2, 4], 1, |node| node == 4),
            MemberStep::Change(MembershipChange::AddVoter(4))
        );
        let leaving = Members::voters(&[1, 2, 3, 4]);
        assert_eq!(leaving.step_toward(&[2, 3, 4], 1, |_| false), MemberStep::Wait);
        assert_eq!(leaving.step_toward(&[2, 3, 4], 1, |node| node == 3), MemberStep::Transfer(3));
        assert_eq!(
            leaving.step_toward(&[2, 3, 4], 3, |_| false),
            MemberStep::Change(MembershipChange::Remove(1))
        );
    }
}
