//! Answers about queues rather than messages: DescribeQueue (the
//! partitions this shard owns — of a replicated one, only its leader
//! answers, with the partition's term, committed index and the lag of its
//! member furthest behind; a client asks every shard and merges; from v2
//! also the queue's subscriptions with their counters over those
//! partitions, dropped by the encoder for older versions) and
//! Metadata (every partition's shard address and leader epoch, from the
//! shards' shared [`EpochBoard`](super::EpochBoard)). An ordered queue's
//! partitions report their lanes, with the routing key blocked longest
//! read from the record of the head that holds it up. Read-only: this file
//! must not change a partition or the catalog.

use spool_wire::batch::{validate_record, BatchBytes};
use spool_wire::proto::{
    DescribeQueueResponse, KeyMapStats, LaneStats, MetadataResponse, PartitionMetadata,
    PartitionReplication, PartitionStats, QueueMetadata, Response, RetainedStats,
};
use spool_wire::ErrorCode;

use super::convert::queue_config_to_wire;
use super::handler::{error, Answer, SpoolHandler};
use super::sub_admin::subscription_stats;
use super::ShardPartition;
use crate::control::assignment::QueueName;
use crate::queue::{LaneCounters, Millis, PartitionId};

/// A partition's lanes as DescribeQueue reports them: the counters, the
/// age of the oldest waiting message at `now`, and the routing key of the
/// head that holds its key up (read from its record; empty when it cannot
/// be read, or is longer than the routing key limit, which a validated
/// record never is).
pub(super) async fn lane_stats(
    partition: &ShardPartition,
    lanes: &LaneCounters,
    now: Millis,
) -> LaneStats {
    let blocked_longest_key = match lanes.blocking_head {
        Some(head) => partition.record(head).await.ok().map_or_else(Vec::new, |bytes| {
            let mut aligned = BatchBytes::with_capacity(bytes.len());
            aligned.extend_from_slice(&bytes);
            validate_record(&aligned)
                .ok()
                .map(|record| record.routing_key.to_vec())
                .filter(|key| key.len() <= spool_wire::limits::ROUTING_KEY_BYTES_MAX)
                .unwrap_or_default()
        }),
        None => Vec::new(),
    };
    LaneStats {
        active_keys: lanes.active_keys,
        blocked_keys: lanes.blocked_keys,
        waiting: lanes.waiting,
        oldest_waiting_age_ms: lanes.oldest_waiting.map_or(0, |(_, at)| now.saturating_sub(at)),
        blocked_longest_key,
    }
}

impl SpoolHandler {
    pub(super) async fn describe(&self, queue: &str) -> Answer {
        let name = QueueName::new(queue)
            .map_err(|failure| error(ErrorCode::InvalidArgument, failure.to_string()))?;
        let (partition_count, config, keys, named) = {
            let table = self.state.table.borrow();
            let Some(entry) = table.queue(&name) else {
                return Err(error(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist"),
                ));
            };
            let partition_count = entry.partitions.len() as u32;
            let config = queue_config_to_wire(&entry.config, partition_count);
            let keys = KeyMapStats {
                version: entry.keys.version,
                draining: entry.keys.draining.iter().copied().collect(),
                held_from: entry.keys.held_from,
            };
            (partition_count, config, keys, entry.subscriptions.clone())
        };
        let mut partitions = Vec::new();
        // The reported partitions and their default counters, for the
        // subscriptions' rows (DescribeQueue v2).
        let mut reported = Vec::new();
        let mut defaults = Vec::new();
        for partition in (0..partition_count).map(PartitionId) {
            let Some(served) = self.state.partition(queue, partition) else { continue };
            // A replicated partition is described by its leader only: a
            // follower's counts trail it (the client asks the leader).
            let replication = match served.log().driver() {
                Some(_) if !served.serving() => continue,
                Some(driver) => {
                    let (_, term, leader) = driver.role();
                    let committed_index = driver.log().committed_index();
                    let lowest = driver.lowest_matched().unwrap_or(committed_index);
                    Some(PartitionReplication {
                        leader_node: leader,
                        term,
                        committed_index,
                        lag_entries: committed_index.saturating_sub(lowest),
                    })
                }
                None => None,
            };
            let counters = served.counters();
            let lanes = lane_stats(&served, &counters.lanes, (self.state.clock)()).await;
            partitions.push(PartitionStats {
                partition,
                ready: counters.ready,
                scheduled: counters.scheduled,
                claimed: counters.claimed,
                quarantined: counters.quarantined,
                expired: counters.totals.expired,
                acked: counters.totals.acked,
                bytes: counters.live_bytes,
                oldest_ready_age_ms: counters.oldest_ready_age_ms.unwrap_or(0),
                released: counters.totals.released,
                lease_expired: counters.totals.lease_expired,
                replication,
                retained: RetainedStats {
                    messages: counters.retained_messages,
                    bytes: counters.retained_bytes,
                    oldest_age_ms: counters.oldest_retained_age_ms.unwrap_or(0),
                },
                lanes,
            });
            defaults.push(counters);
            reported.push(served);
        }
        let subscriptions = subscription_stats(&named, &defaults, |sub| {
            reported.iter().filter_map(|served| served.counters_of(sub)).collect()
        });
        Ok(Response::DescribeQueue(DescribeQueueResponse {
            name: queue.to_owned(),
            config,
            partitions,
            keys,
            subscriptions,
        }))
    }

    pub(super) fn metadata(&self, wanted: &[String]) -> Answer {
        let table = self.state.table.borrow();
        let mut queues = Vec::new();
        for (name, entry) in table.queues() {
            if !wanted.is_empty() && !wanted.iter().any(|queue| queue == name.as_str()) {
                continue;
            }
            let partitions = entry
                .partitions
                .iter()
                .enumerate()
                .map(|(index, assignment)| {
                    let partition = PartitionId(index as u32);
                    let addr = match &self.state.cluster {
                        Some(cluster) => cluster
                            .leader_addr(entry, partition, assignment.shard)
                            .unwrap_or_else(|| self.state.shard_addr(assignment.shard)),
                        None => self.state.shard_addr(assignment.shard),
                    };
                    // 0 only while no shard has the partition open.
                    let epoch = self.state.epochs.epoch(entry.id, partition).unwrap_or_default();
                    PartitionMetadata {
                        partition,
                        host: addr.ip().to_string(),
                        shard_port: addr.port(),
                        leader_epoch: epoch,
                    }
                })
                .collect();
            queues.push(QueueMetadata {
                name: name.as_str().to_owned(),
                partitions,
                key_version: entry.keys.version,
            });
        }
        for queue in wanted {
            if !queues.iter().any(|found| &found.name == queue) {
                return Err(error(
                    ErrorCode::QueueNotFound,
                    format!("queue {queue} does not exist"),
                ));
            }
        }
        Ok(Response::Metadata(MetadataResponse { assignment_version: table.version(), queues }))
    }
}
