//! The retention window's families (`docs/design/subscriptions.md` §5):
//! for each partition of a queue with a retention window, the records it
//! keeps for replay (its shared index: what a subscription started at
//! `earliest` now would be given, those every subscription finished
//! included) and their bytes, labelled `queue` and `partition`. A queue
//! without a window has no series here: a record leaves it once every
//! subscription finished it, and what is still to deliver is counted by
//! the per-partition and per-subscription families.

use prometheus_client::registry::{Registry, Unit};

use super::{gauge_value, Gauges, PartitionLabels};
use crate::shard::report::ShardReport;

/// Registers `spool_queue_retained_messages` and
/// `spool_queue_retained_bytes` from `reports`.
pub(super) fn register_retention(registry: &mut Registry, reports: &[ShardReport]) {
    let messages = Gauges::<PartitionLabels>::default();
    let bytes = Gauges::<PartitionLabels>::default();
    for report in reports.iter().flat_map(|shard| &shard.partitions).filter(|p| p.window) {
        let labels = PartitionLabels::of(report);
        messages.get_or_create(&labels).set(gauge_value(report.counters.retained_messages));
        bytes.get_or_create(&labels).set(gauge_value(report.counters.retained_bytes));
    }
    registry.register(
        "spool_queue_retained_messages",
        "Records the partition keeps for replay under its queue's retention window (what a \
         subscription started at earliest would be given), those every subscription finished \
         included",
        messages,
    );
    registry.register_with_unit(
        "spool_queue_retained",
        "Record bytes the partition keeps for replay under its queue's retention window: what \
         retention_bytes bounds",
        Unit::Bytes,
        bytes,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::assignment::ShardId;
    use crate::queue::{PartitionId, QueueCounters, SubscriptionId, Totals};
    use crate::shard::report::{PartitionReport, SubscriptionCounters};

    fn counters(lost: u64, retained: u64) -> QueueCounters {
        QueueCounters {
            retained_messages: retained,
            retained_bytes: retained * 100,
            totals: Totals { lost, ..Totals::default() },
            ..QueueCounters::default()
        }
    }

    fn partition(queue: &str, window: bool, counters: QueueCounters) -> PartitionReport {
        PartitionReport {
            queue: queue.to_owned(),
            partition: PartitionId(0),
            counters,
            requests: Default::default(),
            ack_rate_per_sec: None,
            memory_bytes: 0,
            replica: None,
            resize: Default::default(),
            subscriptions: Vec::new(),
            window,
            losses: Vec::new(),
            ordered: false,
            oldest_waiting_age_ms: None,
        }
    }

    fn exposition(reports: &[ShardReport]) -> String {
        let mut registry = Registry::default();
        super::super::subscriptions::register_subscriptions(&mut registry, reports);
        register_retention(&mut registry, reports);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    // Goal: a queue with a window has the retained families and a lost
    // series for its default subscription even with no other subscription
    // (and no other spool_subscription_* series then); a queue with
    // subscriptions has a lost series for each; a plain queue has none of
    // these. Method: encode reports of three queues, read the lines.
    #[test]
    fn window_and_lost_families() {
        let mut shard = ShardReport::new(ShardId(0), Default::default());
        shard.partitions.push(partition("stream", true, counters(7, 12)));
        shard.partitions.push(partition("plain", false, counters(0, 3)));
        let mut fanned = partition("fanned", false, counters(0, 4));
        fanned.subscriptions.push(SubscriptionCounters {
            id: SubscriptionId(1),
            name: "audit".to_owned(),
            counters: counters(0, 4),
            losses: Vec::new(),
        });
        shard.partitions.push(fanned);
        let text = exposition(&[shard]);
        let line = |needle: &str| text.lines().any(|line| line == needle);
        assert!(
            line(
                "spool_subscription_lost_messages_total\
                 {queue=\"stream\",partition=\"0\",subscription=\"default\"} 7"
            ),
            "{text}"
        );
        assert!(
            line("spool_queue_retained_messages{queue=\"stream\",partition=\"0\"} 12"),
            "{text}"
        );
        assert!(
            line("spool_queue_retained_bytes{queue=\"stream\",partition=\"0\"} 1200"),
            "{text}"
        );
        assert!(
            line(
                "spool_subscription_lost_messages_total\
                 {queue=\"fanned\",partition=\"0\",subscription=\"audit\"} 0"
            ),
            "{text}"
        );
        assert!(!text.contains("queue=\"plain\""), "{text}");
        assert!(!text.contains("spool_queue_retained_messages{queue=\"fanned\""), "{text}");
        let live = "spool_subscription_live_messages{queue=\"stream\"";
        assert!(!text.contains(live), "only the lost family for a window alone: {text}");
        assert!(text.contains("# HELP spool_queue_retained_bytes "), "{text}");
    }
}
