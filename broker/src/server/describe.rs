//! Answers about queues rather than messages: DescribeQueue (the
//! partitions this shard owns; a client asks every shard and merges) and
//! Metadata (every partition's shard address and leader epoch, from the
//! shards' shared [`EpochBoard`](super::EpochBoard)). Read-only: this file
//! must not change a partition or the catalog.

use spool_wire::proto::{
    DescribeQueueResponse, MetadataResponse, PartitionMetadata, PartitionStats, QueueMetadata,
    Response,
};
use spool_wire::ErrorCode;

use super::convert::queue_config_to_wire;
use super::handler::{error, Answer, SpoolHandler};
use crate::control::assignment::QueueName;
use crate::queue::PartitionId;

impl SpoolHandler {
    pub(super) fn describe(&self, queue: &str) -> Answer {
        let name = QueueName::new(queue)
            .map_err(|failure| error(ErrorCode::InvalidArgument, failure.to_string()))?;
        let table = self.state.table.borrow();
        let Some(entry) = table.queue(&name) else {
            return Err(error(ErrorCode::QueueNotFound, format!("queue {queue} does not exist")));
        };
        let partition_count = entry.partitions.len() as u32;
        let config = queue_config_to_wire(&entry.config, partition_count);
        drop(table);
        let mut partitions = Vec::new();
        for partition in (0..partition_count).map(PartitionId) {
            let Some(served) = self.state.partition(queue, partition) else { continue };
            let counters = served.counters();
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
            });
        }
        Ok(Response::DescribeQueue(DescribeQueueResponse {
            name: queue.to_owned(),
            config,
            partitions,
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
                            .leader_addr(entry.id, partition, assignment.shard)
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
            queues.push(QueueMetadata { name: name.as_str().to_owned(), partitions });
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
