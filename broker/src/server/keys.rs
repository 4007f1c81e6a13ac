//! A queue's key map on the shard (`docs/design/replication.md`, "Resizing
//! a queue"): every partition the shard serves learns how many partitions
//! its queue's keys are placed over and whether a resize holds it
//! ([`ShardState::set_key_routes`]); and the **drain watch**: for every
//! older partition the shard serves (leads, in a cluster) while its queue
//! has it draining, the offset it had reached when it started refusing
//! moved keys (the barrier) is kept, and once every main-lane message below
//! it is finished, the partition's log names the key map's version
//! (`Partition::log_key_map`: a later leader that has not applied it does
//! not serve) and what finished them is durable (committed, in a
//! cluster), the shard reports the partition drained to the
//! coordinator (in a cluster, a controller proposal; a member that does not
//! lead the controller forwards it to the leader). Once every older
//! partition is reported, the table lifts the hold and the added
//! partitions start handing out their messages.
//!
//! A barrier belongs to the leader epoch it was taken under: a partition
//! whose epoch changed (a new leader, a reopen) takes it again, since a
//! leader that had not applied the resize may have taken moved keys
//! before it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use spool_wire::proto::{ResizeQueueResponse, Response};

use super::handler::{control_error, Answer, SpoolHandler};
use super::ShardState;
use crate::clock::{instant_now, Instant};
use crate::control::assignment::{AssignmentError, QueueName};
use crate::control::cluster::limits::{KEY_DRAIN_REPORT_RETRY, KEY_DRAIN_WATCH_INTERVAL};
use crate::limits::ADMIN_APPLY_TIMEOUT_MS;
use crate::partition::KeyRoute;
use crate::queue::{LeaderEpoch, Offset, PartitionId, QueueId};
use crate::shard::report::ResizeState;
use crate::shard::{CoordinatorError, KeyChange};

/// One older partition's drain, as this shard watches it.
#[derive(Debug, Clone, Copy)]
struct Barrier {
    key_version: u64,
    epoch: LeaderEpoch,
    offset: Offset,
    /// A report (or the key map's write before it) is under way, or was
    /// made: not before this again.
    next_report: Option<Instant>,
}

/// The shard's drain watch (module docs).
#[derive(Debug, Default)]
pub(super) struct Drains {
    watched: Cell<Option<Instant>>,
    barriers: RefCell<HashMap<(QueueId, PartitionId), Barrier>>,
}

impl ShardState {
    /// Where `partition` of `queue` stands in the queue's key map, by this
    /// shard's table.
    pub(super) fn key_route_of(
        &self,
        queue: &QueueName,
        partition: PartitionId,
    ) -> Option<KeyRoute> {
        let table = self.table.borrow();
        let entry = table.queue(queue)?;
        Some(KeyRoute {
            version: entry.keys.version,
            partitions: u32::try_from(entry.partitions.len()).unwrap_or(u32::MAX),
            held: entry.keys.holds(partition),
        })
    }

    /// Where `partition` of `queue` stands in the queue's last resize, by
    /// this shard's table (for its report).
    pub(super) fn resize_state(&self, queue: &str, partition: PartitionId) -> ResizeState {
        let Ok(name) = QueueName::new(queue) else { return ResizeState::None };
        let table = self.table.borrow();
        let Some(entry) = table.queue(&name) else { return ResizeState::None };
        if entry.keys.holds(partition) {
            ResizeState::Held
        } else if entry.keys.draining.contains(&partition) {
            ResizeState::Draining
        } else {
            ResizeState::None
        }
    }

    /// Sets the key route of every partition of `queue` this shard serves
    /// (after the queue's table entry changed): before anything else runs,
    /// so no enqueue after the change takes a moved key.
    pub(super) fn set_key_routes(&self, queue: &QueueName) {
        let served: Vec<_> = self
            .partitions
            .borrow()
            .values()
            .filter(|served| served.partition.name().queue == queue.as_str())
            .cloned()
            .collect();
        for served in served {
            if let Some(route) = self.key_route_of(queue, served.partition.name().partition) {
                served.partition.set_key_route(route);
            }
        }
    }
}

impl SpoolHandler {
    /// ResizeQueue: the coordinator grows the queue (in a cluster, the
    /// controller); answered once every shard applied it, with the key
    /// map's new version.
    pub(super) async fn resize(&self, queue: &str, partitions: u32) -> Answer {
        let queue = QueueName::new(queue)
            .map_err(|error| control_error(&CoordinatorError::Assignment(error)))?;
        let change = KeyChange::Grow { queue: queue.clone(), partitions };
        let version = self
            .state
            .coordinator
            .key_change_async(change, ADMIN_APPLY_TIMEOUT_MS)
            .await
            .map_err(|error| control_error(&error))?;
        let key_version =
            self.state.table.borrow().queue(&queue).map_or(0, |entry| entry.keys.version);
        Ok(Response::ResizeQueue(ResizeQueueResponse { assignment_version: version, key_version }))
    }
}

/// The drain watch's turn (module docs), at most every
/// [`KEY_DRAIN_WATCH_INTERVAL`].
pub(super) fn watch(state: &Rc<ShardState>) {
    let now = instant_now();
    let watched = state.drains.watched.get();
    if watched.is_some_and(|at| now.duration_since(at) < KEY_DRAIN_WATCH_INTERVAL) {
        return;
    }
    state.drains.watched.set(Some(now));
    // (queue, id, version, draining partitions) of every queue that drains.
    let draining: Vec<(QueueName, QueueId, u64, Vec<PartitionId>)> = state
        .table
        .borrow()
        .queues()
        .filter(|(_, entry)| !entry.keys.draining.is_empty())
        .map(|(name, entry)| {
            (
                name.clone(),
                entry.id,
                entry.keys.version,
                entry.keys.draining.iter().copied().collect(),
            )
        })
        .collect();
    let mut barriers = state.drains.barriers.borrow_mut();
    barriers.retain(|(queue_id, partition), barrier| {
        draining.iter().any(|(_, id, version, partitions)| {
            id == queue_id && *version == barrier.key_version && partitions.contains(partition)
        })
    });
    for (queue, queue_id, key_version, partitions) in draining {
        for partition in partitions {
            let Some(served) = state.served(queue.as_str(), partition) else { continue };
            let part = &served.partition;
            if !part.serving() || part.key_route().is_none() {
                continue;
            }
            let epoch = part.epoch();
            let barrier = barriers.entry((queue_id, partition)).or_insert(Barrier {
                key_version,
                epoch,
                offset: part.next_offset(),
                next_report: None,
            });
            if barrier.epoch != epoch {
                *barrier =
                    Barrier { key_version, epoch, offset: part.next_offset(), next_report: None };
            }
            if barrier.next_report.is_some_and(|at| now < at) || !part.drained_below(barrier.offset)
            {
                continue;
            }
            barrier.next_report = Some(now + KEY_DRAIN_REPORT_RETRY);
            tracing::info!(queue = %queue, partition = partition.0, key_version,
                barrier = barrier.offset.0, "older partition drained; reporting it");
            let coordinator = state.coordinator.clone();
            let partition_rc = part.clone();
            let name = queue.clone();
            let change = KeyChange::Drained { queue: queue.clone(), key_version, partition };
            glommio::spawn_local(async move {
                // The log names the key map's version first, so any later
                // leader (its log holds every committed entry) serves only
                // once it applied it: no moved key slips in after this
                // report.
                if let Err(error) = partition_rc.log_key_map().await {
                    tracing::debug!(queue = %name, partition = partition.0, %error,
                        "drain not reported: the key map is not in the log");
                    return;
                }
                // The acks that finished the last messages below the
                // barrier are durable (committed) before anyone is told.
                if let Err(error) = partition_rc.appended_durable().await {
                    tracing::debug!(queue = %name, partition = partition.0, %error,
                        "drain not reported: what finished it is not durable");
                    return;
                }
                match coordinator.key_change_async(change, ADMIN_APPLY_TIMEOUT_MS).await {
                    Ok(_)
                    | Err(CoordinatorError::Assignment(
                        AssignmentError::NotDraining { .. }
                        | AssignmentError::StaleKeyVersion { .. }
                        | AssignmentError::QueueNotFound(_),
                    )) => {}
                    // Forwarded to the controller's leader, or refused for
                    // now: the watch reports again while the table still
                    // has the partition draining.
                    Err(error) => {
                        tracing::debug!(queue = %name, partition = partition.0, %error,
                            "drain report not taken yet");
                    }
                }
            })
            .detach();
        }
    }
}
