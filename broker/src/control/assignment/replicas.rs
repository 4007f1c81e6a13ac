//! A partition's replica set in the table (`docs/design/replication.md`
//! §9, "Re-placement"): the checks and plans of its two changes,
//! [`AssignmentChange::SetReplicas`] (named by the set it changes, one
//! member each way) and [`AssignmentChange::ReplicasSettled`] (once, for
//! the set the table holds). Pure, as the rest of the table.

use std::collections::BTreeSet;

use super::{
    AssignmentChange, AssignmentError, AssignmentTable, AssignmentUpdate, PartitionId, QueueName,
    ReplicaSets,
};
use crate::control::cluster::limits::REPLICA_SET_MAX;

impl AssignmentTable {
    /// The update that re-places `partition` of `queue` from `from` (its
    /// current replica set: the table's, else the placer's) to `to`.
    ///
    /// # Errors
    /// `QueueNotFound`, `NoSuchPartition`, `StaleReplicas`,
    /// `InvalidReplicas`.
    pub fn plan_set_replicas(
        &self,
        queue: QueueName,
        partition: PartitionId,
        from: Vec<u64>,
        to: Vec<u64>,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        self.check_set_replicas(&queue, partition, &from, &to)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::SetReplicas { queue, partition, from, to },
        })
    }

    pub(super) fn check_set_replicas(
        &self,
        queue: &QueueName,
        partition: PartitionId,
        from: &[u64],
        to: &[u64],
    ) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        if partition.0 as usize >= entry.partitions.len() {
            return Err(AssignmentError::NoSuchPartition { queue: queue.clone(), partition });
        }
        if let Some(current) = entry.replicas.get(&partition) {
            if current.nodes.as_slice() != from {
                return Err(AssignmentError::StaleReplicas {
                    queue: queue.clone(),
                    partition,
                    from: from.to_vec(),
                    current: current.nodes.clone(),
                });
            }
        }
        let invalid = |reason: String| AssignmentError::InvalidReplicas {
            queue: queue.clone(),
            partition,
            to: to.to_vec(),
            reason,
        };
        check_replica_set(from).map_err(|reason| invalid(format!("the current set: {reason}")))?;
        check_replica_set(to).map_err(invalid)?;
        let added = to.iter().filter(|node| !from.contains(node)).count();
        let removed = from.iter().filter(|node| !to.contains(node)).count();
        if added + removed == 0 {
            return Err(invalid(format!("it is the current set {from:?}")));
        }
        if added > 1 || removed > 1 {
            return Err(invalid(format!(
                "it differs from {from:?} by more than one member each way"
            )));
        }
        Ok(())
    }

    /// The update recording that the group of `partition` of `queue` has
    /// exactly the voters `nodes`.
    ///
    /// # Errors
    /// `QueueNotFound`, `NoSuchPartition`, `StaleReplicas` (the table
    /// re-placed it elsewhere since, or holds no re-placement of it, or it
    /// is settled already).
    pub fn plan_replicas_settled(
        &self,
        queue: QueueName,
        partition: PartitionId,
        nodes: Vec<u64>,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        self.check_settled(&queue, partition, &nodes)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::ReplicasSettled { queue, partition, nodes },
        })
    }

    pub(super) fn check_settled(
        &self,
        queue: &QueueName,
        partition: PartitionId,
        nodes: &[u64],
    ) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        if partition.0 as usize >= entry.partitions.len() {
            return Err(AssignmentError::NoSuchPartition { queue: queue.clone(), partition });
        }
        match entry.replicas.get(&partition) {
            Some(current) if current.nodes.as_slice() == nodes && !current.settled => Ok(()),
            current => Err(AssignmentError::StaleReplicas {
                queue: queue.clone(),
                partition,
                from: nodes.to_vec(),
                current: current.map(|set| set.nodes.clone()).unwrap_or_default(),
            }),
        }
    }
}

/// A replica set: 1..=[`REPLICA_SET_MAX`] distinct nodes, none 0.
fn check_replica_set(nodes: &[u64]) -> Result<(), String> {
    if nodes.is_empty() || nodes.len() > REPLICA_SET_MAX {
        return Err(format!("{} nodes, not 1..={REPLICA_SET_MAX}", nodes.len()));
    }
    if nodes.contains(&0) {
        return Err("node id 0 is not a node".to_owned());
    }
    let distinct: BTreeSet<u64> = nodes.iter().copied().collect();
    if distinct.len() != nodes.len() {
        return Err("a node appears twice".to_owned());
    }
    Ok(())
}

/// A created queue's re-placed sets (a catalog's replay): each names one of
/// its `count` partitions and is a replica set.
pub(super) fn check_replica_sets(
    queue: &QueueName,
    count: usize,
    replicas: &ReplicaSets,
) -> Result<(), AssignmentError> {
    for (&partition, set) in replicas {
        if partition.0 as usize >= count {
            return Err(AssignmentError::NoSuchPartition { queue: queue.clone(), partition });
        }
        check_replica_set(&set.nodes).map_err(|reason| AssignmentError::InvalidReplicas {
            queue: queue.clone(),
            partition,
            to: set.nodes.clone(),
            reason,
        })?;
    }
    Ok(())
}
