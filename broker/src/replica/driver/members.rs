//! The driver's side of membership changes (`replica/membership.rs`):
//! the members its replica applied, whether a change is pending, whether a
//! learner caught up, and bringing a reopened member's configuration to
//! the members its replay folded.

use super::ReplicaDriver;
use crate::io::Storage;
use crate::queue::{Members, MembershipChange};
use crate::replica::membership::change_entry;
use crate::replica::DriverError;

impl<S: Storage> ReplicaDriver<S> {
    /// The group's members as this member applied them.
    pub fn membership(&self) -> Members {
        self.inner.borrow().replica.membership()
    }

    /// Whether a change is proposed and not yet applied here.
    pub fn membership_pending(&self) -> bool {
        self.inner.borrow().replica.membership_pending()
    }

    /// On the leader, whether `node` holds every entry committed so far.
    pub fn caught_up(&self, node: u64) -> bool {
        self.inner.borrow().replica.caught_up(node)
    }

    /// On the leader, hands the lead to voter `to`
    /// ([`Replica::transfer_leader`](crate::replica::Replica::transfer_leader)).
    pub fn transfer_leader(&self, to: u64) {
        if self.stopped() {
            return;
        }
        self.inner.borrow_mut().replica.transfer_leader(to);
        self.drain();
    }

    /// Brings the configuration to `target` (the members a reopened
    /// partition's replay folded from its committed entries, which raft-rs
    /// counts applied), one simple change at a time, adds before removes.
    /// Call after the open and before the member is stepped or ticked.
    ///
    /// # Errors
    /// raft-rs refuses a change ([`DriverError::Replica`]).
    pub fn restore_members(&self, target: &Members) -> Result<(), DriverError> {
        let current = self.membership();
        if &current == target {
            return Ok(());
        }
        let mut changes = Vec::new();
        for voter in &target.voters {
            if !current.voters.contains(voter) {
                changes.push(MembershipChange::AddVoter(*voter));
            }
        }
        for learner in &target.learners {
            if !current.learners.contains(learner) {
                changes.push(MembershipChange::AddLearner(*learner));
            }
        }
        for member in current.all() {
            if !target.all().any(|id| id == member) {
                changes.push(MembershipChange::Remove(member));
            }
        }
        let mut inner = self.inner.borrow_mut();
        for change in changes {
            inner.replica.apply_membership(&change_entry(0, 0, change))?;
        }
        Ok(())
    }
}
