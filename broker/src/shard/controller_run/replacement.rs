//! Re-placement on the controller's leader (`docs/design/replication.md`
//! §9, "Re-placement"): each health round, a controller voter that is down
//! is replaced by a learner that is up (the group's own members), then up
//! to [`REPLACEMENTS_PER_ROUND`] partitions whose replica set names a node
//! that is down are re-placed in the table; and the replica set an
//! operator's move asks for.

use crate::control::assignment::{AssignmentError, QueueName};
use crate::control::cluster::limits::REPLACEMENTS_PER_ROUND;
use crate::queue::{MembershipChange, PartitionId};
use crate::shard::CoordinatorError;

use super::ClusterCatalog;

impl ClusterCatalog {
    /// On the controller's leader, one step toward a controller group
    /// whose voters are all up: while a voter is down, a caught-up learner
    /// that is up is made a voter (the group then has one voter more than
    /// `controller_voters`), then the voter that is down is made a learner
    /// (it follows the catalog again when it is back). Both are raft-rs
    /// simple changes, so consecutive configurations share a majority; no
    /// learner up: nothing (the group keeps running on the voters left).
    pub(super) async fn replace_down_voter(&self, down: &[u64]) {
        let driver = self.controller.driver();
        if driver.membership_pending() {
            return;
        }
        let members = driver.membership();
        let Some(&gone) = members.voters.iter().find(|voter| down.contains(voter)) else {
            return;
        };
        let change = if members.voters.len() > self.node.config().controller_voters {
            MembershipChange::AddLearner(gone)
        } else {
            let mut learners = members.learners.iter().copied();
            let Some(learner) =
                learners.find(|learner| !down.contains(learner) && driver.caught_up(*learner))
            else {
                return;
            };
            MembershipChange::AddVoter(learner)
        };
        match self.controller.change_membership(change).await {
            Ok(()) => tracing::warn!(?change, down = gone, voters = ?driver.membership().voters,
                "controller voter that is down being replaced"),
            Err(error) => {
                tracing::info!(?change, %error, "controller voter change not made; tried again")
            }
        }
    }

    /// On the controller's leader, re-places up to
    /// [`REPLACEMENTS_PER_ROUND`] replicas held by the nodes `down`: each
    /// partition whose set names one gets, in its place, the node
    /// [`ClusterNode::replacement`] picks (none up and free: it stays),
    /// one committed table change each. The groups' leaders then move
    /// their members (`server/replace.rs`).
    pub(super) async fn replace_down(&self, down: &[u64]) {
        let plans: Vec<(QueueName, PartitionId, u64, u64)> = {
            let state = self.controller.state();
            let mut plans = Vec::new();
            'queues: for (name, entry) in state.table.queues() {
                for index in 0..entry.partitions.len() {
                    let partition = PartitionId(u32::try_from(index).unwrap_or(u32::MAX));
                    let current = match entry.replicas.get(&partition) {
                        Some(set) => set.nodes.clone(),
                        None => self.node.replicas(entry.id.0, partition.0),
                    };
                    let Some(&gone) = current.iter().find(|node| down.contains(node)) else {
                        continue;
                    };
                    let keep: Vec<u64> =
                        current.iter().copied().filter(|node| *node != gone).collect();
                    let Some(to) = self.node.replacement(entry.id.0, partition.0, &keep, down)
                    else {
                        continue;
                    };
                    plans.push((name.clone(), partition, gone, to));
                    if plans.len() >= REPLACEMENTS_PER_ROUND {
                        break 'queues;
                    }
                }
            }
            plans
        };
        for (queue, partition, from, to) in plans {
            let outcome = match self.moved_set(&queue, partition, from, to) {
                Ok((current, next)) => {
                    self.controller.set_replicas(queue.clone(), partition, current, next).await
                }
                Err(error) => {
                    tracing::debug!(queue = %queue, partition = partition.0, %error,
                        "re-placement not planned");
                    continue;
                }
            };
            match outcome {
                Ok(update) => tracing::warn!(queue = %queue, partition = partition.0, from, to,
                    version = update.version.0, "replica of a node that is down re-placed"),
                Err(error) => {
                    tracing::info!(queue = %queue, partition = partition.0, %error,
                        "re-placement not made; tried again next round");
                    return;
                }
            }
        }
    }

    /// The replica set `partition` of `queue` has by the table (else the
    /// placer's), and the set with node `from` replaced by node `to` (at
    /// the end: a new member is not the preferred leader before it caught
    /// up).
    ///
    /// # Errors
    /// `QueueNotFound`, `NoSuchPartition`; `InvalidReplicas` when `from`
    /// is not in the set, `to` is in it or is not a node of the cluster.
    pub(super) fn moved_set(
        &self,
        queue: &QueueName,
        partition: PartitionId,
        from: u64,
        to: u64,
    ) -> Result<(Vec<u64>, Vec<u64>), CoordinatorError> {
        let state = self.controller.state();
        let entry = state
            .table
            .queue(queue)
            .ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        if partition.0 as usize >= entry.partitions.len() {
            return Err(AssignmentError::NoSuchPartition { queue: queue.clone(), partition }.into());
        }
        let current = match entry.replicas.get(&partition) {
            Some(set) => set.nodes.clone(),
            None => self.node.replicas(entry.id.0, partition.0),
        };
        let invalid = |reason: String| AssignmentError::InvalidReplicas {
            queue: queue.clone(),
            partition,
            to: current.clone(),
            reason,
        };
        if !current.contains(&from) {
            return Err(invalid(format!("node {from} holds no replica of it")).into());
        }
        if current.contains(&to) {
            return Err(invalid(format!("node {to} holds a replica of it already")).into());
        }
        if self.node.config().node(to).is_none() {
            return Err(invalid(format!("node {to} is not a node of the cluster")).into());
        }
        let mut next: Vec<u64> = current.iter().copied().filter(|node| *node != from).collect();
        next.push(to);
        Ok((current, next))
    }
}
