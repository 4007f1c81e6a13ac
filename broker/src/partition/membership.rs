//! A replicated partition's group membership (`docs/design/replication.md`
//! §9, "Re-placement"): its leader proposes one change at a time
//! (`Event::Membership`, raft-rs's change entry, stored as that control
//! record on every member); every member's state folds the members its
//! log reached (`PartitionState::members`, kept in checkpoints), and a
//! reopened member starts its group with them (`Partition::open_replicated`).

use spool_wire::batch::BatchKind;

use super::{Partition, PartitionError};
use crate::io::Storage;
use crate::queue::{Event, Members, MembershipChange};

impl<S: Storage + Clone> Partition<S> {
    /// The group's members as this member's Raft group applied them
    /// (`None` on one node).
    pub fn membership(&self) -> Option<Members> {
        self.log.driver().map(|driver| driver.membership())
    }

    /// The members the state folded from the log (what a checkpoint keeps
    /// and a reopen starts with; `None` on one node).
    pub fn logged_members(&self) -> Option<Members> {
        self.state.borrow().members().cloned()
    }

    /// On the serving leader, whether `node` holds every committed entry
    /// (a learner ready to be made a voter).
    pub fn caught_up(&self, node: u64) -> bool {
        self.serving() && self.log.driver().is_some_and(|driver| driver.caught_up(node))
    }

    /// On the serving leader, hands the lead to voter `to` (a leader the
    /// group is to lose leaves it this way first). Whether it took is seen
    /// in the role.
    pub fn transfer_leadership(&self, to: u64) {
        if let Some(driver) = self.log.driver() {
            if self.serving() {
                driver.transfer_leader(to);
            }
        }
    }

    /// Whether a change is proposed and not yet applied here.
    pub fn membership_pending(&self) -> bool {
        self.log.driver().is_some_and(|driver| driver.membership_pending())
    }

    /// On the serving leader, proposes `change` to the group and returns
    /// once it is committed (applied on this member as it is handed out).
    /// One change at a time: a second while one is pending is refused.
    ///
    /// # Errors
    /// [`PartitionError::NotLeader`] off the serving leader (or on one
    /// node); the change refused (pending, changing nothing, leaving no
    /// voter) or superseded, as the log's errors.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), PartitionError> {
        let Some(driver) = self.log.driver() else {
            return Err(PartitionError::NotLeader { partition: self.name.partition.0, leader: 0 });
        };
        if !self.serving() {
            let (_, _, leader) = driver.role();
            return Err(PartitionError::NotLeader { partition: self.name.partition.0, leader });
        }
        self.log.writable(BatchKind::Control, Self::control_bytes(1, false)).await;
        let now = (self.clock)();
        if let Some(ticket) = self.append_events(&[Event::Membership { change }], now)? {
            ticket.durable().await?;
        }
        tracing::info!(partition = ?self.name, ?change, members = ?driver.membership(),
            "group membership changed");
        Ok(())
    }
}
