//! An ordered queue's lanes (`docs/design/ordered-lanes.md`): for each
//! partition of an ordered queue, its active keys, its blocked keys, the
//! messages waiting behind their key's head, and the age of the oldest of
//! them, labelled `queue` and `partition` like every per-partition family.
//! The routing keys themselves are never a label (unbounded): the key
//! blocked longest is in `GET /v1/queues/{q}` and `spool queue describe`.
//! An unordered queue has no series here.

use prometheus_client::registry::{Registry, Unit};

use super::{gauge_value, FloatGauges, Gauges, PartitionLabels};
use crate::shard::report::ShardReport;

/// Registers the `spool_queue_ordered_*` families from `reports`.
pub(super) fn register_ordered(registry: &mut Registry, reports: &[ShardReport]) {
    let active = Gauges::<PartitionLabels>::default();
    let blocked = Gauges::<PartitionLabels>::default();
    let waiting = Gauges::<PartitionLabels>::default();
    let oldest = FloatGauges::<PartitionLabels>::default();
    for report in reports.iter().flat_map(|shard| &shard.partitions).filter(|p| p.ordered) {
        let labels = PartitionLabels::of(report);
        let lanes = &report.counters.lanes;
        active.get_or_create(&labels).set(gauge_value(lanes.active_keys));
        blocked.get_or_create(&labels).set(gauge_value(lanes.blocked_keys));
        waiting.get_or_create(&labels).set(gauge_value(lanes.waiting));
        oldest
            .get_or_create(&labels)
            .set(report.oldest_waiting_age_ms.unwrap_or(0) as f64 / 1000.0);
    }
    registry.register(
        "spool_queue_ordered_active_keys",
        "Routing keys of an ordered queue with a message in the partition (each heads a lane)",
        active,
    );
    registry.register(
        "spool_queue_ordered_blocked_keys",
        "Routing keys of an ordered queue with a message waiting behind their lane's head",
        blocked,
    );
    registry.register(
        "spool_queue_ordered_waiting_messages",
        "Messages of an ordered queue waiting behind an earlier message of their routing key \
         (live, in none of ready, scheduled or claimed)",
        waiting,
    );
    registry.register_with_unit(
        "spool_queue_ordered_oldest_blocked_age",
        "Age of the oldest message waiting behind its key's head: how long the key blocked \
         longest has waited (0 when none waits)",
        Unit::Seconds,
        oldest,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::assignment::ShardId;
    use crate::queue::{LaneCounters, Offset, PartitionId, QueueCounters};
    use crate::shard::report::PartitionReport;

    fn partition(queue: &str, ordered: bool, lanes: LaneCounters) -> PartitionReport {
        PartitionReport {
            queue: queue.to_owned(),
            partition: PartitionId(1),
            counters: QueueCounters { lanes, ..QueueCounters::default() },
            requests: Default::default(),
            ack_rate_per_sec: None,
            memory_bytes: 0,
            replica: None,
            resize: Default::default(),
            subscriptions: Vec::new(),
            window: false,
            losses: Vec::new(),
            ordered,
            oldest_waiting_age_ms: ordered.then_some(2_500),
        }
    }

    // Goal: an ordered queue's partitions have the four families with the
    // lanes' figures (an idle ordered queue too, at 0); an unordered queue
    // has none. Method: encode reports of three queues, read the lines.
    #[test]
    fn ordered_families() {
        let mut shard = ShardReport::new(ShardId(0), Default::default());
        let lanes = LaneCounters {
            active_keys: 3,
            blocked_keys: 2,
            waiting: 5,
            oldest_waiting: Some((Offset(4), 100)),
            blocking_head: Some(Offset(1)),
        };
        shard.partitions.push(partition("orders", true, lanes));
        shard.partitions.push(partition("plain", false, LaneCounters::default()));
        let mut idle = partition("idle", true, LaneCounters::default());
        idle.oldest_waiting_age_ms = None;
        shard.partitions.push(idle);
        let mut registry = Registry::default();
        register_ordered(&mut registry, &[shard]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = |needle: &str| text.lines().any(|line| line == needle);
        let labels = "{queue=\"orders\",partition=\"1\"}";
        assert!(line(&format!("spool_queue_ordered_active_keys{labels} 3")), "{text}");
        assert!(line(&format!("spool_queue_ordered_blocked_keys{labels} 2")), "{text}");
        assert!(line(&format!("spool_queue_ordered_waiting_messages{labels} 5")), "{text}");
        assert!(
            line(&format!("spool_queue_ordered_oldest_blocked_age_seconds{labels} 2.5")),
            "{text}"
        );
        let idle = "{queue=\"idle\",partition=\"1\"}";
        assert!(line(&format!("spool_queue_ordered_active_keys{idle} 0")), "{text}");
        assert!(
            line(&format!("spool_queue_ordered_oldest_blocked_age_seconds{idle} 0.0")),
            "{text}"
        );
        assert!(!text.contains("queue=\"plain\""), "{text}");
    }
}
