//! Re-placement on the shard (`docs/design/replication.md` §9,
//! "Re-placement"): what a shard does when the table changes a partition's
//! replica set, and the **membership watch** of the groups it leads.
//!
//! - **The table names this node** for a partition it does not host: an
//!   empty member opens (its group's initial members are the placer's set,
//!   which may not name it: it waits, joining, until the group's leader
//!   adds it and sends it the log or a snapshot).
//! - **The table no longer names this node** and the group is settled
//!   (its leader reported its voters are the new set): the member closes
//!   and its partition's directory is removed. Not before: until the group
//!   left it, it may still be needed for a majority; until then it keeps
//!   (and at a start opens) its copy (`ShardState::holds_replica`). At
//!   start, the directory of a partition re-placed off this node and
//!   settled is removed (a removal a crash cut short).
//! - **The watch**: every [`REPLICA_WATCH_INTERVAL`], for each partition
//!   whose table set is not settled and whose group this shard leads, the
//!   next step ([`Members::step_toward`]: add the new node as a learner,
//!   promote it once caught up, remove the old voter, the leader handing
//!   the lead over first if it is the one leaving); once the voters are the
//!   set, the leader reports it settled to the coordinator (in a cluster a
//!   controller proposal, forwarded to the controller's leader).
//!
//! [`Members::step_toward`]: crate::queue::Members::step_toward

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use super::{ServerError, ShardState};
use crate::clock::{instant_now, Instant};
use crate::control::assignment::QueueName;
use crate::control::cluster::limits::{REPLICA_STEP_RETRY, REPLICA_WATCH_INTERVAL};
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;
use crate::queue::{MemberStep, PartitionId, QueueId};
use crate::shard::KeyChange;

/// The shard's membership watch (module docs).
#[derive(Debug, Default)]
pub(super) struct Replacing {
    watched: Cell<Option<Instant>>,
    /// Groups with a step under way, or tried: not before this again.
    next_try: RefCell<HashMap<(QueueId, PartitionId), Instant>>,
}

impl ShardState {
    /// The table changed the replica set of `partition` of `queue` (or
    /// recorded it settled): open the member this node now holds, or
    /// remove the one it no longer does (module docs).
    ///
    /// # Errors
    /// The open's or the removal's.
    pub(super) async fn replicas_changed(
        self: &Rc<Self>,
        queue: &QueueName,
        partition: PartitionId,
        live: bool,
    ) -> Result<(), ServerError> {
        let Some(cluster) = &self.cluster else { return Ok(()) };
        let found = {
            let table = self.table.borrow();
            table.queue(queue).and_then(|entry| {
                let assignment = entry.partitions.get(partition.0 as usize)?;
                let settled = entry.replicas.get(&partition).is_some_and(|set| set.settled);
                let named = cluster.hosts(entry, partition);
                Some((entry.id, entry.config.clone(), assignment.shard, named, settled))
            })
        };
        let Some((queue_id, config, shard, named, settled)) = found else { return Ok(()) };
        if shard != self.shard {
            return Ok(());
        }
        let open = self.served(queue.as_str(), partition).is_some();
        let refused =
            self.unavailable.borrow().contains_key(&(queue.as_str().to_owned(), partition));
        if named && !open && !refused {
            tracing::info!(queue = %queue, partition = partition.0, shard = self.shard.0,
                "the table places a replica here: opening an empty member to catch up");
            return self.open_owned(queue, queue_id, &config, &[partition], live).await;
        }
        if !named && open && settled {
            return self.remove_replica(queue, partition).await;
        }
        Ok(())
    }

    /// At start (the catalog's replay of `queue`): removes the directory of
    /// every partition of `queue` on this shard that this node no longer
    /// holds (its group settled on a set without it) but whose directory
    /// is still here: the table changed and the removal did not happen (a
    /// crash between the catalog's write and it, or a node down through
    /// both). A failure is logged, not fatal: the copy is only unused.
    pub(super) fn remove_stale_copies(&self, queue: &QueueName) {
        if self.cluster.is_none() {
            return;
        }
        let stale: Vec<std::path::PathBuf> = {
            let table = self.table.borrow();
            let Some(entry) = table.queue(queue) else { return };
            (0..entry.partitions.len())
                .filter(|index| entry.partitions[*index].shard == self.shard)
                .map(|index| PartitionId(u32::try_from(index).unwrap_or(u32::MAX)))
                .filter(|partition| !self.holds_replica(entry, *partition))
                .map(|partition| super::partition_dir(&self.config.data_dir, entry.id, partition))
                .filter(|dir| dir.is_dir())
                .collect()
        };
        for dir in stale {
            // Off the data path, at start: a blocking remove is acceptable.
            let removed = std::fs::remove_dir_all(&dir).and_then(|()| match dir.parent() {
                Some(parent) => std::fs::File::open(parent)?.sync_all(),
                None => Ok(()),
            });
            match removed {
                Ok(()) => tracing::warn!(queue = %queue, dir = %dir.display(),
                    "stale copy removed: its partition was re-placed off this node and settled"),
                Err(error) => tracing::warn!(queue = %queue, dir = %dir.display(), %error,
                    "stale copy of a partition re-placed off this node not removed"),
            }
        }
    }

    /// Closes this node's member of `partition` of `queue` and removes its
    /// directory: the group settled on a set without this node.
    async fn remove_replica(
        &self,
        queue: &QueueName,
        partition: PartitionId,
    ) -> Result<(), ServerError> {
        let served = self.partitions.borrow_mut().remove(queue.as_str(), partition);
        let Some(served) = served else { return Ok(()) };
        let queue_id = served.partition.name().queue_id;
        self.epochs.forget(queue_id, partition);
        if let Some(cluster) = &self.cluster {
            cluster.forget(queue_id, partition);
        }
        self.replacing.next_try.borrow_mut().remove(&(queue_id, partition));
        let dir = served.partition.dir().to_path_buf();
        // No final checkpoint: the directory goes next.
        ShardState::discard_served(&served).await;
        self.tick_plan.forget(&served);
        // Off the data path and rare: a blocking remove is acceptable here.
        std::fs::remove_dir_all(&dir)
            .map_err(|error| ServerError::Remove { path: dir.clone(), error })?;
        if let Some(parent) = dir.parent() {
            std::fs::File::open(parent)
                .and_then(|parent| parent.sync_all())
                .map_err(|error| ServerError::Remove { path: parent.to_path_buf(), error })?;
        }
        tracing::info!(queue = %queue, partition = partition.0, shard = self.shard.0,
            "replica removed: its group settled on a replica set without this node");
        Ok(())
    }
}

/// The membership watch's turn (module docs), at most every
/// [`REPLICA_WATCH_INTERVAL`].
pub(super) fn watch(state: &Rc<ShardState>) {
    let Some(cluster) = &state.cluster else { return };
    let now = instant_now();
    let watched = state.replacing.watched.get();
    if watched.is_some_and(|at| now.duration_since(at) < REPLICA_WATCH_INTERVAL) {
        return;
    }
    state.replacing.watched.set(Some(now));
    // (queue, id, partition, target) of every unsettled set on this shard.
    let moving: Vec<(QueueName, QueueId, PartitionId, Vec<u64>)> = {
        let table = state.table.borrow();
        table
            .queues()
            .flat_map(|(name, entry)| {
                entry
                    .replicas
                    .iter()
                    .filter(|(partition, set)| {
                        !set.settled
                            && entry
                                .partitions
                                .get(partition.0 as usize)
                                .is_some_and(|assignment| assignment.shard == state.shard)
                    })
                    .map(|(partition, set)| (name.clone(), entry.id, *partition, set.nodes.clone()))
            })
            .collect()
    };
    let mut next_try = state.replacing.next_try.borrow_mut();
    next_try.retain(|key, _| moving.iter().any(|(_, id, partition, _)| (*id, *partition) == *key));
    let me = cluster.node.node_id();
    for (queue, queue_id, partition, target) in moving {
        let Some(served) = state.served(queue.as_str(), partition) else { continue };
        let part = served.partition.clone();
        if !part.serving() || part.membership_pending() {
            continue;
        }
        if next_try.get(&(queue_id, partition)).is_some_and(|at| now < *at) {
            continue;
        }
        let Some(members) = part.membership() else { continue };
        let step = members.step_toward(&target, me, |node| part.caught_up(node));
        if step == MemberStep::Wait {
            continue;
        }
        next_try.insert((queue_id, partition), now + REPLICA_STEP_RETRY);
        tracing::info!(queue = %queue, partition = partition.0, ?members, ?target, ?step,
            "re-placing a replica");
        let coordinator = state.coordinator.clone();
        let weak = Rc::downgrade(state);
        glommio::spawn_local(async move {
            match step {
                MemberStep::Change(change) => match part.change_membership(change).await {
                    // Committed and applied: the next step at the next turn,
                    // not after the retry wait.
                    Ok(()) => {
                        if let Some(state) = weak.upgrade() {
                            state.replacing.next_try.borrow_mut().remove(&(queue_id, partition));
                        }
                    }
                    Err(error) => {
                        tracing::debug!(queue = %queue, partition = partition.0, %error,
                            "membership step not taken yet");
                    }
                },
                MemberStep::Transfer(to) => part.transfer_leadership(to),
                MemberStep::Settled => {
                    let change =
                        KeyChange::Settled { queue: queue.clone(), partition, nodes: target };
                    if let Err(error) =
                        coordinator.key_change_async(change, ADMIN_APPLY_TIMEOUT_MS).await
                    {
                        tracing::debug!(queue = %queue, partition = partition.0, %error,
                            "settled replica set not reported yet");
                    }
                }
                MemberStep::Wait => {}
            }
        })
        .detach();
    }
}
