//! Per-subscription families (`docs/design/subscriptions.md` §6): for each
//! partition of a queue with a subscription besides the default, every
//! subscription's backlog, its parts, its dead letters, the ages of its
//! oldest ready message and oldest claim, and its acks, labelled `queue`,
//! `partition` and `subscription` (the default's rows repeat the
//! unlabelled per-partition families, so `sum by (subscription)` covers
//! every one). A queue with only the default subscription has no series
//! here (its figures are the per-partition families), but for
//! `spool_subscription_lost_messages_total` when it has a retention window:
//! the records the window dropped before the default delivered them have no
//! per-partition family of their own.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::{Registry, Unit};

use super::{gauge_value, Counters, FloatGauges, Gauges};
use crate::control::assignment::DEFAULT_SUBSCRIPTION;
use crate::queue::QueueCounters;
use crate::shard::report::ShardReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SubscriptionLabels {
    queue: String,
    partition: String,
    subscription: String,
}

/// Registers the `spool_subscription_*` families from `reports`.
pub(super) fn register_subscriptions(registry: &mut Registry, reports: &[ShardReport]) {
    // Every (labels, counters) row: the default first, then the others;
    // and the default's of partitions whose queue has a retention window
    // but no other subscription (the lost family's alone).
    let mut rows: Vec<(SubscriptionLabels, &QueueCounters)> = Vec::new();
    let mut window_only: Vec<(SubscriptionLabels, &QueueCounters)> = Vec::new();
    for report in reports.iter().flat_map(|shard| &shard.partitions) {
        let labels = |subscription: &str| SubscriptionLabels {
            queue: report.queue.clone(),
            partition: report.partition.to_string(),
            subscription: subscription.to_owned(),
        };
        if report.subscriptions.is_empty() {
            if report.window {
                window_only.push((labels(DEFAULT_SUBSCRIPTION), &report.counters));
            }
            continue;
        }
        rows.push((labels(DEFAULT_SUBSCRIPTION), &report.counters));
        for sub in &report.subscriptions {
            // An ended subscription the partition's log still has for a
            // moment: named by its id until it goes.
            let name =
                if sub.name.is_empty() { format!("#{}", sub.id.0) } else { sub.name.clone() };
            rows.push((labels(&name), &sub.counters));
        }
    }
    let gauge =
        |registry: &mut Registry, name: &str, help: &str, value: fn(&QueueCounters) -> u64| {
            let family = Gauges::<SubscriptionLabels>::default();
            for (labels, counters) in &rows {
                family.get_or_create(labels).set(gauge_value(value(counters)));
            }
            registry.register(name, help, family);
        };
    gauge(
        registry,
        "spool_subscription_live_messages",
        "The subscription's backlog in the partition: main-lane messages it still has to serve (ready + scheduled + claimed)",
        |c| c.live_messages,
    );
    gauge(
        registry,
        "spool_subscription_ready_messages",
        "Main-lane messages ready to claim in the subscription",
        |c| c.ready,
    );
    gauge(
        registry,
        "spool_subscription_scheduled_messages",
        "Main-lane messages the subscription holds until their not-before time",
        |c| c.scheduled,
    );
    gauge(
        registry,
        "spool_subscription_claimed_messages",
        "Main-lane messages under a lease in the subscription",
        |c| c.claimed,
    );
    gauge(
        registry,
        "spool_subscription_dead_letter_messages",
        "Messages in the subscription's dead-letter lane",
        |c| c.quarantined,
    );
    let age = |registry: &mut Registry,
               name: &str,
               help: &str,
               value: fn(&QueueCounters) -> Option<u64>| {
        let family = FloatGauges::<SubscriptionLabels>::default();
        for (labels, counters) in &rows {
            family.get_or_create(labels).set(value(counters).unwrap_or(0) as f64 / 1000.0);
        }
        registry.register_with_unit(name, help, Unit::Seconds, family);
    };
    age(
        registry,
        "spool_subscription_oldest_ready_age",
        "Age of the subscription's oldest ready main-lane message (0 when none): how far its consumers lag",
        |c| c.oldest_ready_age_ms,
    );
    age(
        registry,
        "spool_subscription_oldest_claim_age",
        "Age of the subscription's oldest claim still held (0 when none)",
        |c| c.oldest_claim_age_ms,
    );
    let acked = Counters::<SubscriptionLabels>::default();
    for (labels, counters) in &rows {
        acked.get_or_create(labels).inc_by(counters.totals.acked);
    }
    registry.register(
        "spool_subscription_acked_messages",
        "Messages acked in the subscription (either lane)",
        acked,
    );
    let lost = Counters::<SubscriptionLabels>::default();
    for (labels, counters) in rows.iter().chain(&window_only) {
        lost.get_or_create(labels).inc_by(counters.totals.lost);
    }
    registry.register(
        "spool_subscription_lost_messages",
        "Records the queue's retention window dropped before the subscription delivered them \
         (their offsets: the subscription's loss reports, GET /v1/queues/{q}/subscriptions)",
        lost,
    );
}
