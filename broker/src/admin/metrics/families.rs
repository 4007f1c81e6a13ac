//! The metric families built from more than one field of the reports: the
//! journal's files and release passes, latency histograms per shard, the
//! age of the oldest ready message, quotas per principal, queue-wide
//! figures and the predicted drain time; and the admin port's memory pool.
//! `mod.rs` registers the rest and encodes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::histogram::{HistogramSeries, Histograms};
use super::{
    gauge_value, Counters, FloatGauges, Gauges, PartitionLabels, QueueLabels, QueueOpLabels,
    QuotaLabels, ShardLabels,
};
use crate::io::stats::SYNC_LATENCY_BUCKETS_US;
use crate::net::memory::PoolStats;
use crate::shard::report::{
    LatencyCounts, PartitionReport, RequestOp, ShardReport, REQUEST_LATENCY_BUCKETS_US,
};

/// The admin port's memory pool (`admin/memory.rs`): one series each,
/// without labels (one pool per node).
pub(super) fn register_admin_memory(registry: &mut Registry, stats: &PoolStats) {
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(gauge_value(value));
        gauge
    };
    let counter = |value: u64| {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        counter
    };
    registry.register_with_unit(
        "spool_admin_memory_budget",
        "Size of the admin port's memory pool (carved off the top of memory_bytes)",
        Unit::Bytes,
        gauge(stats.size_bytes),
    );
    registry.register_with_unit(
        "spool_admin_memory_used",
        "Bytes held now from the admin port's pool: API request bodies and answers not yet written",
        Unit::Bytes,
        gauge(stats.used_bytes),
    );
    registry.register_with_unit(
        "spool_admin_memory_peak",
        "Most bytes held at once from the admin port's pool since the broker started",
        Unit::Bytes,
        gauge(stats.peak_bytes),
    );
    registry.register(
        "spool_admin_memory_waits",
        "API requests that waited in line for the admin port's pool before their body was read",
        counter(stats.waits),
    );
    registry.register(
        "spool_admin_memory_refusals",
        "API requests answered 503 THROTTLED because the admin port's pool had no room for \
         their body within MEMORY_WAIT_TIMEOUT",
        counter(stats.refusals),
    );
}

/// The shard journals' figures.
pub(super) fn register_journal_figures(registry: &mut Registry, reports: &[ShardReport]) {
    let files = Gauges::<ShardLabels>::default();
    let idle_files = Gauges::<ShardLabels>::default();
    let file_bytes = Gauges::<ShardLabels>::default();
    let live_bytes = Gauges::<ShardLabels>::default();
    let released_files = Counters::<ShardLabels>::default();
    let released_bytes = Counters::<ShardLabels>::default();
    let witnesses = Counters::<ShardLabels>::default();
    let release_checkpoints = Counters::<ShardLabels>::default();
    let relocated_entries = Counters::<ShardLabels>::default();
    let relocated_bytes = Counters::<ShardLabels>::default();
    let dropped_entries = Counters::<ShardLabels>::default();
    let relocation_passes = Counters::<ShardLabels>::default();
    let garbage_ratio = FloatGauges::<ShardLabels>::default();
    for shard in reports {
        let Some(journal) = &shard.journal else { continue };
        let labels = ShardLabels { shard: shard.shard.0.to_string() };
        files.get_or_create(&labels).set(gauge_value(journal.files));
        idle_files.get_or_create(&labels).set(gauge_value(journal.files_without_live_bytes));
        file_bytes.get_or_create(&labels).set(gauge_value(journal.file_bytes));
        live_bytes.get_or_create(&labels).set(gauge_value(journal.live_bytes));
        released_files.get_or_create(&labels).inc_by(journal.released_files);
        released_bytes.get_or_create(&labels).inc_by(journal.released_bytes);
        witnesses.get_or_create(&labels).inc_by(journal.witnesses);
        release_checkpoints.get_or_create(&labels).inc_by(journal.release_checkpoints);
        relocated_entries.get_or_create(&labels).inc_by(journal.relocated_entries);
        relocated_bytes.get_or_create(&labels).inc_by(journal.relocated_bytes);
        dropped_entries.get_or_create(&labels).inc_by(journal.relocation_dropped_entries);
        relocation_passes.get_or_create(&labels).inc_by(journal.relocation_passes);
        #[allow(clippy::cast_precision_loss)] // millionths of a ratio: exact in f64
        garbage_ratio.get_or_create(&labels).set(journal.garbage_ratio_millionths as f64 / 1e6);
    }
    registry.register("spool_journal_files", "Journal files the shard holds", files);
    registry.register(
        "spool_journal_files_without_live",
        "Journal files (the newest aside) holding no live record's batch, still held because \
         a partition's checkpoint scan start lies in or below them",
        idle_files,
    );
    registry.register_with_unit(
        "spool_journal_file",
        "Bytes of the journal files the shard holds",
        Unit::Bytes,
        file_bytes,
    );
    registry.register_with_unit(
        "spool_journal_live",
        "Entry bytes of the batches the shard's open partitions still read from its journal \
         (a batch counts whole while any of its records is live)",
        Unit::Bytes,
        live_bytes,
    );
    registry.register(
        "spool_journal_released_files",
        "Journal files released since the shard started",
        released_files,
    );
    registry.register_with_unit(
        "spool_journal_released",
        "Bytes of the journal files released since the shard started",
        Unit::Bytes,
        released_bytes,
    );
    registry.register(
        "spool_journal_witnesses",
        "Witness entries the journal made durable since the shard started (one page and one \
         sync each time its committers went idle after a commit)",
        witnesses,
    );
    registry.register(
        "spool_journal_release_checkpoints",
        "Checkpoints the journal release passes asked of partitions pinning an old file, since \
         the shard started (only while it held more than journal_retain_bytes)",
        release_checkpoints,
    );
    registry.register(
        "spool_journal_relocated_entries",
        "Live data entries relocated to the journal's head since the shard started",
        relocated_entries,
    );
    registry.register_with_unit(
        "spool_journal_relocated",
        "Entry bytes relocated to the journal's head since the shard started",
        Unit::Bytes,
        relocated_bytes,
    );
    registry.register(
        "spool_journal_relocation_dropped_entries",
        "Index entries a relocation pass dropped because none of their records was held",
        dropped_entries,
    );
    registry.register(
        "spool_journal_relocation_passes",
        "Relocation passes run since the shard started",
        relocation_passes,
    );
    registry.register(
        "spool_journal_garbage_ratio",
        "Share of the held journal files (the newest aside) holding no live record, at the \
         last relocation pass (run when nothing could be released)",
        garbage_ratio,
    );
}

/// `spool_quota_rejections_total` and `spool_quota_in_use`, summed over the
/// shards, per principal with a quota (bounded by `PRINCIPALS_MAX`) and per
/// quota it has set (or was refused under).
/// A per-shard latency histogram in seconds over `SYNC_LATENCY_BUCKETS_US`:
/// `series` gives a shard's bucket counts and its sum in microseconds.
pub(super) fn register_shard_latency(
    registry: &mut Registry,
    reports: &[ShardReport],
    name: &str,
    help: &str,
    series: impl Fn(&ShardReport) -> (&[u64], u64),
) {
    let mut histograms = Histograms::<ShardLabels>::default();
    for shard in reports {
        let (counts, sum_us) = series(shard);
        histograms.series.push(HistogramSeries::new(
            ShardLabels { shard: shard.shard.0.to_string() },
            &SYNC_LATENCY_BUCKETS_US,
            counts,
            sum_us,
            1e6,
        ));
    }
    registry.register_with_unit(name, help, Unit::Seconds, histograms);
}

/// A per-partition age gauge in seconds (0 when `age_ms` is `None`).
pub(super) fn register_partition_age(
    registry: &mut Registry,
    reports: &[ShardReport],
    name: &str,
    help: &str,
    age_ms: impl Fn(&PartitionReport) -> Option<u64>,
) {
    let family = FloatGauges::<PartitionLabels>::default();
    for shard in reports {
        for report in &shard.partitions {
            let labels = PartitionLabels::of(report);
            family.get_or_create(&labels).set(age_ms(report).unwrap_or(0) as f64 / 1000.0);
        }
    }
    registry.register_with_unit(name, help, Unit::Seconds, family);
}

pub(super) fn register_quotas(registry: &mut Registry, reports: &[ShardReport]) {
    let rejections = Counters::<QuotaLabels>::default();
    let in_use = Gauges::<QuotaLabels>::default();
    for (principal, merged) in crate::server::quota::merge(reports) {
        for kind in crate::auth::quota::QuotaKind::ALL {
            let refused = merged.rejections[kind.index()];
            if merged.config.get(kind).is_none() && refused == 0 {
                continue;
            }
            let labels =
                QuotaLabels { principal: principal.clone(), quota: kind.as_str().to_owned() };
            rejections.get_or_create(&labels).inc_by(refused);
            in_use.get_or_create(&labels).set(gauge_value(merged.in_use[kind.index()]));
        }
    }
    registry.register(
        "spool_quota_rejections",
        "Requests refused QUOTA_EXCEEDED, by principal and quota",
        rejections,
    );
    registry.register(
        "spool_quota_in_use",
        "Quota in use, summed over the shards: claims in flight (plus credits of waiting claims), the part of each shard's one-second enqueue burst that is spent (messages or bytes), or the messages or record bytes a principal's records hold (stored quotas)",
        in_use,
    );
}

/// `spool_request_duration_seconds{queue,op}` (each queue's partitions on
/// every shard added up) and `spool_drain_time_seconds{queue}`.
pub(super) fn register_queue_figures(registry: &mut Registry, reports: &[ShardReport]) {
    use std::collections::BTreeMap;
    /// Per queue: latency per op, backlog, ack rate (None: not measured yet
    /// on some partition).
    #[derive(Default)]
    struct PerQueue {
        latency: [LatencyCounts; RequestOp::ALL.len()],
        backlog: u64,
        ack_rate: Option<f64>,
        rate_unknown: bool,
    }
    let mut queues: BTreeMap<&str, PerQueue> = BTreeMap::new();
    for shard in reports {
        for report in &shard.partitions {
            let entry = queues.entry(report.queue.as_str()).or_default();
            for (sum, partition) in entry.latency.iter_mut().zip(&report.requests.latency) {
                sum.add(partition);
            }
            entry.backlog += report.counters.live_messages;
            match report.ack_rate_per_sec {
                Some(rate) => *entry.ack_rate.get_or_insert(0.0) += rate,
                None => entry.rate_unknown = true,
            }
        }
    }
    let mut histograms = Histograms::<QueueOpLabels>::default();
    let drain = FloatGauges::<QueueLabels>::default();
    for (queue, figures) in &queues {
        for op in RequestOp::ALL {
            let counts = &figures.latency[op.index()];
            histograms.series.push(HistogramSeries::new(
                QueueOpLabels { queue: (*queue).to_owned(), op: op.as_str().to_owned() },
                &REQUEST_LATENCY_BUCKETS_US,
                &counts.buckets,
                counts.sum_us,
                1e6,
            ));
        }
        if let Some(seconds) =
            drain_time_seconds(figures.backlog, figures.ack_rate, figures.rate_unknown)
        {
            drain.get_or_create(&QueueLabels { queue: (*queue).to_owned() }).set(seconds);
        }
    }
    registry.register_with_unit(
        "spool_request_duration",
        "Broker-side time of a data request, from decoded to reply built, by queue and op \
         (a claim's includes its long-poll wait)",
        Unit::Seconds,
        histograms,
    );
    registry.register_with_unit(
        "spool_drain_time",
        "Predicted time to drain the queue: live main-lane messages / acks per second \
         (moving average); absent while the ack rate is 0 or not measured yet",
        Unit::Seconds,
        drain,
    );
}

/// The predicted drain time: 0 with no backlog; `backlog / rate` with a
/// positive rate; `None` (no series) when the rate is 0 or some partition
/// has not measured one yet.
pub(super) fn drain_time_seconds(
    backlog: u64,
    ack_rate: Option<f64>,
    rate_unknown: bool,
) -> Option<f64> {
    if backlog == 0 {
        return Some(0.0);
    }
    match ack_rate {
        Some(rate) if !rate_unknown && rate > 0.0 => Some(backlog as f64 / rate),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::drain_time_seconds;

    // Goal: the drain time is 0 with nothing left, backlog / rate with a
    // positive rate, and absent when the rate is 0 or not known for every
    // partition. Method: each case once.
    #[test]
    fn drain_time_is_backlog_over_rate_or_absent() {
        assert_eq!(drain_time_seconds(0, None, true), Some(0.0));
        assert_eq!(drain_time_seconds(100, Some(20.0), false), Some(5.0));
        assert_eq!(drain_time_seconds(100, Some(0.0), false), None);
        assert_eq!(drain_time_seconds(100, Some(20.0), true), None);
        assert_eq!(drain_time_seconds(100, None, false), None);
    }
}
