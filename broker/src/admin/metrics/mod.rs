//! `GET /metrics`: the shards' reports as Prometheus metrics, encoded by
//! `prometheus-client` (OpenMetrics text).
//!
//! A scrape builds a fresh registry from the reports it gathered (the
//! shards keep the counts; this thread keeps none between scrapes), so a
//! deleted queue's series disappear with it. Labels are the queue name, the
//! partition number, the shard number and a fixed set of causes: bounded by
//! queues × partitions, and never a payload or a routing key. Every name is
//! listed in `docs/metrics.md`.

mod disk;
mod families;
mod histogram;
mod ordered;
mod replication;
mod retention;
mod sessions;
mod subscriptions;

use std::fmt;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::io::stats::COMMIT_SIZE_BUCKETS_BYTES;
use crate::net::connection::ConnectionEnd;
use crate::shard::report::{AdmissionCause, PartitionReport, ShardReport};
use disk::register_disk;
pub use disk::{disk_space, DiskSpace};
use families::{
    register_admin_memory, register_journal_figures, register_partition_age,
    register_queue_figures, register_quotas, register_shard_latency,
};
use histogram::{HistogramSeries, Histograms};

/// `reason` of `spool_dead_letter_moves_total`: `max_deliveries` claims
/// ended without an ack.
pub const DEAD_LETTER_REASON_MAX_DELIVERIES: &str = "max_deliveries";
/// `reason`: the message's expiry passed (`dead_letter_on_expiry`).
pub const DEAD_LETTER_REASON_EXPIRED: &str = "expired";
/// `reason`: moves folded into a checkpoint written before the broker
/// counted them by cause (shown only while nonzero).
pub const DEAD_LETTER_REASON_UNKNOWN: &str = "unknown";

/// `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    queue: String,
    partition: String,
}

impl PartitionLabels {
    /// The labels of `report`'s partition.
    fn of(report: &PartitionReport) -> Self {
        Self { queue: report.queue.clone(), partition: report.partition.0.to_string() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    queue: String,
    partition: String,
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardLabels {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardReasonLabels {
    shard: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    shard: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueOpLabels {
    queue: String,
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    queue: String,
    partition: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirLabels {
    dir: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

type Counters<L> = Family<L, Counter>;
type FloatCounters<L> = Family<L, Counter<f64, std::sync::atomic::AtomicU64>>;
type Gauges<L> = Family<L, Gauge>;
type FloatGauges<L> = Family<L, Gauge<f64, std::sync::atomic::AtomicU64>>;

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Encodes `reports` (every shard that answered) and marks `missing` shards
/// as not reporting; `auth` gives the process-wide authentication figures
/// (reloads, the admin port's lockouts, the policy generation), `disk` the
/// data directory's file system (none if statvfs failed), `admin_memory`
/// the admin port's memory pool, `health` the controller member's view of
/// the nodes (none on a single node).
///
/// # Errors
/// Only a formatting failure of the encoder (writing to a `String`).
pub fn encode(
    reports: &[ShardReport],
    missing: &[u16],
    auth: &crate::auth::reload::AuthState,
    disk: Option<&DiskSpace>,
    admin_memory: &crate::net::memory::PoolStats,
    health: Option<&crate::control::cluster::ClusterHealth>,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    macro_rules! partition_counter {
        ($name:literal, $help:literal, |$report:ident| $value:expr) => {{
            let family = Counters::<PartitionLabels>::default();
            for shard in reports {
                for $report in &shard.partitions {
                    let labels = PartitionLabels::of($report);
                    family.get_or_create(&labels).inc_by($value);
                }
            }
            registry.register($name, $help, family);
        }};
    }
    macro_rules! partition_gauge_family {
        (|$report:ident| $value:expr) => {{
            let family = Gauges::<PartitionLabels>::default();
            for shard in reports {
                for $report in &shard.partitions {
                    let labels = PartitionLabels::of($report);
                    family.get_or_create(&labels).set(gauge_value($value));
                }
            }
            family
        }};
    }
    macro_rules! partition_gauge {
        ($name:literal, $help:literal, |$report:ident| $value:expr) => {{
            registry.register($name, $help, partition_gauge_family!(|$report| $value));
        }};
        ($name:literal, $help:literal, unit $unit:expr, |$report:ident| $value:expr) => {{
            let family = partition_gauge_family!(|$report| $value);
            registry.register_with_unit($name, $help, $unit, family);
        }};
    }
    macro_rules! shard_gauge {
        ($name:literal, $help:literal, |$shard:ident| $value:expr) => {{
            let family = Gauges::<ShardLabels>::default();
            for $shard in reports {
                let labels = ShardLabels { shard: $shard.shard.0.to_string() };
                family.get_or_create(&labels).set(gauge_value($value));
            }
            registry.register($name, $help, family);
        }};
    }
    macro_rules! shard_counter {
        ($name:literal, $help:literal, |$shard:ident| $value:expr) => {{
            let family = Counters::<ShardLabels>::default();
            for $shard in reports {
                let labels = ShardLabels { shard: $shard.shard.0.to_string() };
                family.get_or_create(&labels).inc_by($value);
            }
            registry.register($name, $help, family);
        }};
    }

    partition_counter!(
        "spool_enqueued_messages",
        "Messages appended by enqueues (duplicates not counted)",
        |p| p.counters.totals.enqueued
    );
    partition_counter!(
        "spool_claims",
        "Claim requests answered, with or without deliveries",
        |p| p.requests.claims
    );
    partition_counter!(
        "spool_delivered_messages",
        "Messages handed out by claims (first deliveries and redeliveries)",
        |p| p.requests.deliveries
    );
    partition_counter!(
        "spool_redeliveries",
        "Deliveries of a message delivered before (attempt > 1)",
        |p| p.requests.redeliveries
    );
    partition_counter!(
        "spool_acked_messages",
        "Messages acked (main lane and dead-letter lane)",
        |p| p.counters.totals.acked + p.counters.totals.dead_letter_acked
    );
    partition_counter!(
        "spool_released_messages",
        "Messages released back to the queue (by workers and by the epoch fence)",
        |p| p.counters.totals.released
    );
    partition_counter!("spool_extends", "Lease extensions granted", |p| p.requests.extends);
    partition_counter!(
        "spool_lease_expirations",
        "Leases that ran out before an ack, extend or release",
        |p| p.counters.totals.lease_expired
    );
    partition_counter!(
        "spool_stale_token_rejections",
        "Acks, extends and releases refused with STALE_TOKEN",
        |p| p.requests.stale_tokens
    );
    {
        let family = Counters::<ReasonLabels>::default();
        for shard in reports {
            for report in &shard.partitions {
                let totals = &report.counters.totals;
                let by_cause = totals.quarantined_by_deliveries + totals.quarantined_by_expiry;
                for (reason, count) in [
                    (DEAD_LETTER_REASON_MAX_DELIVERIES, totals.quarantined_by_deliveries),
                    (DEAD_LETTER_REASON_EXPIRED, totals.quarantined_by_expiry),
                    (DEAD_LETTER_REASON_UNKNOWN, totals.quarantined.saturating_sub(by_cause)),
                ] {
                    if reason == DEAD_LETTER_REASON_UNKNOWN && count == 0 {
                        continue;
                    }
                    let labels = ReasonLabels {
                        queue: report.queue.clone(),
                        partition: report.partition.to_string(),
                        reason: reason.to_owned(),
                    };
                    family.get_or_create(&labels).inc_by(count);
                }
            }
        }
        registry.register(
            "spool_dead_letter_moves",
            "Messages moved to the dead-letter lane, by reason: max_deliveries, expired \
             (dead_letter_on_expiry), unknown (moved before an upgrade; only while nonzero)",
            family,
        );
    }
    partition_counter!(
        "spool_expired_messages",
        "Messages whose expiry passed before they were acked",
        |p| p.counters.totals.expired
    );
    partition_counter!("spool_redriven_messages", "Dead letters moved back to the queue", |p| p
        .counters
        .totals
        .redriven);
    partition_counter!("spool_purged_messages", "Messages removed by purges", |p| p
        .counters
        .totals
        .purged);
    {
        let family = Counters::<CauseLabels>::default();
        for shard in reports {
            for report in &shard.partitions {
                for cause in AdmissionCause::ALL {
                    let labels = CauseLabels {
                        queue: report.queue.clone(),
                        partition: report.partition.to_string(),
                        cause: cause.as_str().to_owned(),
                    };
                    family.get_or_create(&labels).inc_by(report.requests.rejections[cause.index()]);
                }
            }
        }
        registry.register(
            "spool_admission_rejections",
            "Requests refused before they changed anything, by cause",
            family,
        );
    }
    partition_gauge!(
        "spool_partition_resize_state",
        "The partition's part in its queue's last resize: 0 none (or over), 1 draining (an \
         older partition still finishing what it held before the resize), 2 held (an added \
         partition handing out nothing until the older ones drained)",
        |p| p.resize.gauge()
    );
    partition_gauge!("spool_ready_messages", "Main-lane messages ready to claim", |p| p
        .counters
        .ready);
    partition_gauge!(
        "spool_scheduled_messages",
        "Main-lane messages waiting for their not-before time",
        |p| p.counters.scheduled
    );
    partition_gauge!("spool_claimed_messages", "Main-lane messages under a lease", |p| p
        .counters
        .claimed);
    partition_gauge!(
        "spool_dead_letter_messages",
        "Messages in the dead-letter lane (claimed there or not)",
        |p| p.counters.quarantined
    );
    partition_gauge!(
        "spool_stored_messages",
        "Messages the partition holds (both lanes): what max_messages bounds",
        |p| p.counters.held_messages
    );
    partition_gauge!(
        "spool_stored",
        "Record bytes the partition holds (both lanes): what max_bytes bounds",
        unit Unit::Bytes,
        |p| p.counters.held_bytes
    );
    partition_gauge!(
        "spool_live_messages",
        "Main-lane messages still to serve (ready + scheduled + claimed)",
        |p| p.counters.live_messages
    );
    partition_gauge!("spool_dead_letter_claimed_messages", "Dead letters under a lease", |p| p
        .counters
        .dead_letter_claimed);
    partition_counter!(
        "spool_dead_letter_acked_messages",
        "Dead letters claimed from the dead-letter lane and acked",
        |p| p.counters.totals.dead_letter_acked
    );
    partition_gauge!(
        "spool_live",
        "Record bytes of the main-lane messages still to serve (ready + scheduled + claimed)",
        unit Unit::Bytes,
        |p| p.counters.live_bytes
    );
    register_partition_age(
        &mut registry,
        reports,
        "spool_oldest_ready_age",
        "Age of the oldest ready main-lane message (0 when none is ready)",
        |report| report.counters.oldest_ready_age_ms,
    );
    register_partition_age(
        &mut registry,
        reports,
        "spool_oldest_claim_age",
        "Age of the oldest claim still held, either lane: claimed and not yet acked, \
         released or expired (0 when none is held)",
        |report| report.counters.oldest_claim_age_ms,
    );
    register_queue_figures(&mut registry, reports);
    subscriptions::register_subscriptions(&mut registry, reports);
    sessions::register_sessions(&mut registry, reports);
    retention::register_retention(&mut registry, reports);
    ordered::register_ordered(&mut registry, reports);

    shard_counter!(
        "spool_shard_commits",
        "Log commits made durable by the shard's partitions",
        |s| s.log.commits
    );
    {
        let family = Counters::<ShardLabels>::default();
        for shard in reports {
            let labels = ShardLabels { shard: shard.shard.0.to_string() };
            family.get_or_create(&labels).inc_by(shard.log.commit_bytes);
        }
        registry.register_with_unit(
            "spool_shard_commit",
            "Bytes of log commits made durable (whole pages, fillers included)",
            Unit::Bytes,
            family,
        );
    }
    {
        let family = Counters::<ShardLabels>::default();
        for shard in reports {
            let labels = ShardLabels { shard: shard.shard.0.to_string() };
            family.get_or_create(&labels).inc_by(shard.io.written_bytes);
        }
        registry.register_with_unit(
            "spool_shard_written",
            "Bytes the shard wrote to disk (journal commits, journal file zeroing, side files)",
            Unit::Bytes,
            family,
        );
    }
    register_shard_latency(
        &mut registry,
        reports,
        "spool_shard_fdatasync_duration",
        "Time one fdatasync of a data file took",
        |shard| (&shard.io.sync_buckets[..], shard.io.sync_sum_us),
    );
    register_shard_latency(
        &mut registry,
        reports,
        "spool_shard_commit_duration",
        "Time from a group commit's write being submitted to the commit being durable \
         (write, fdatasync, and any wait for earlier commits)",
        |shard| (&shard.io.commit_duration_buckets[..], shard.io.commit_duration_sum_us),
    );
    {
        let mut histograms = Histograms::<ShardLabels>::default();
        for shard in reports {
            histograms.series.push(HistogramSeries::new(
                ShardLabels { shard: shard.shard.0.to_string() },
                &COMMIT_SIZE_BUCKETS_BYTES,
                &shard.io.commit_buckets,
                shard.io.commit_sum_bytes,
                1.0,
            ));
        }
        registry.register_with_unit(
            "spool_shard_commit_size",
            "Bytes of one group commit made durable (whole pages, fillers included)",
            Unit::Bytes,
            histograms,
        );
    }
    shard_counter!(
        "spool_shard_read_cache_hits",
        "Log reads served from memory (the tail cache of recent commits, or the read-back of the last file read)",
        |s| s.io.reads_from_cache
    );
    shard_counter!(
        "spool_shard_read_cache_misses",
        "Log reads that went to the journal files (neither the commit cache nor the read-ahead held the offset)",
        |s| s.io.reads_from_files
    );
    shard_counter!(
        "spool_shard_read_bytes",
        "Bytes the shard read from its disk files (log, journal and side files)",
        |s| s.io.read_bytes
    );
    {
        let family = FloatCounters::<ShardLabels>::default();
        for shard in reports {
            let labels = ShardLabels { shard: shard.shard.0.to_string() };
            family.get_or_create(&labels).inc_by(shard.executor.busy_us as f64 / 1e6);
        }
        registry.register_with_unit(
            "spool_shard_busy",
            "Time the shard's executor spent running tasks (rate() of it is the shard's utilisation, 0 to 1)",
            Unit::Seconds,
            family,
        );
    }
    shard_counter!("spool_shard_tasks", "Tasks the shard's executor ran", |s| s.executor.tasks);
    shard_counter!(
        "spool_pace_holds",
        "Enqueue frames the consumer pace held while consumers were behind",
        |s| s.pace.holds
    );
    {
        let family = FloatCounters::<ShardLabels>::default();
        for shard in reports {
            let labels = ShardLabels { shard: shard.shard.0.to_string() };
            family.get_or_create(&labels).inc_by(shard.pace.held_us as f64 / 1e6);
        }
        registry.register_with_unit(
            "spool_pace_held",
            "Time enqueue frames were held by the consumer pace",
            Unit::Seconds,
            family,
        );
    }
    shard_counter!(
        "spool_pace_hold_timeouts",
        "Held enqueue frames let go at the hold's bound (PACE_HOLD_MAX) rather than by consumer progress",
        |s| s.pace.hold_timeouts
    );
    shard_counter!(
        "spool_pace_paced_messages",
        "Enqueued messages charged to the consumer pace's credit (enqueued while paced)",
        |s| s.pace.paced_messages
    );
    shard_counter!(
        "spool_pace_full_claims",
        "Claims answered with as many deliveries as credits (consumers hungry)",
        |s| s.pace.full_claims
    );
    shard_counter!(
        "spool_shard_tick_visits",
        "Partition visits of the shard's housekeeping ticks (touched, due, or swept)",
        |s| s.tick_visits
    );
    shard_counter!(
        "spool_shard_connections_accepted",
        "Client connections the shard accepted (refused ones included)",
        |s| s.connections.accepted
    );
    shard_counter!(
        "spool_shard_connections_refused",
        "Client connections refused over connections_per_shard_max (TOO_MANY_CONNECTIONS)",
        |s| s.connections.refused_over_limit
    );
    shard_counter!(
        "spool_shard_tls_handshake_failures",
        "TLS handshakes on the shard's port that failed or timed out (a plain client on a TLS port, a refused certificate)",
        |s| s.connections.tls_handshake_failures
    );
    {
        // Every reason of every shard, 0 included: a rate() over a series
        // that appears only at its first close misses that close.
        let family = Counters::<ShardReasonLabels>::default();
        for shard in reports {
            for (reason, count) in ConnectionEnd::REASONS.iter().zip(shard.connections.ended) {
                let labels = ShardReasonLabels {
                    shard: shard.shard.0.to_string(),
                    reason: (*reason).to_owned(),
                };
                family.get_or_create(&labels).inc_by(count);
            }
        }
        registry.register(
            "spool_shard_connections_closed",
            "Client connections the shard served that ended, by reason (slow_reader: a response \
             not written within write_timeout)",
            family,
        );
    }
    shard_gauge!("spool_shard_connections", "Client connections open on the shard", |s| s
        .connections
        .active);
    shard_gauge!(
        "spool_shard_claims_waiting",
        "Claims long-polling on the shard now (on one partition or on partition ANY)",
        |s| s.claims_waiting
    );
    {
        let size = Gauges::<PoolLabels>::default();
        let used = Gauges::<PoolLabels>::default();
        let peak = Gauges::<PoolLabels>::default();
        let waits = Counters::<PoolLabels>::default();
        let refusals = Counters::<PoolLabels>::default();
        for shard in reports {
            for (pool, stats) in &shard.memory {
                let labels =
                    PoolLabels { shard: shard.shard.0.to_string(), pool: (*pool).to_owned() };
                size.get_or_create(&labels).set(gauge_value(stats.size_bytes));
                used.get_or_create(&labels).set(gauge_value(stats.used_bytes));
                peak.get_or_create(&labels).set(gauge_value(stats.peak_bytes));
                waits.get_or_create(&labels).inc_by(stats.waits);
                refusals.get_or_create(&labels).inc_by(stats.refusals);
            }
        }
        registry.register_with_unit(
            "spool_shard_memory_budget",
            "Size of the shard's memory pool (its share of memory_bytes)",
            Unit::Bytes,
            size,
        );
        registry.register_with_unit(
            "spool_shard_memory_used",
            "Bytes held now from the shard's memory pool",
            Unit::Bytes,
            used,
        );
        registry.register_with_unit(
            "spool_shard_memory_peak",
            "Most bytes held at once from the shard's memory pool since it started",
            Unit::Bytes,
            peak,
        );
        registry.register(
            "spool_shard_memory_waits",
            "Takes from the shard's memory pool that waited for memory (a connection stopped reading)",
            waits,
        );
        registry.register(
            "spool_shard_memory_refusals",
            "Requests refused for memory (pool state: enqueues answered THROTTLED and queue \
             creates refused because the shard's memory for queue state was spent)",
            refusals,
        );
    }
    register_journal_figures(&mut registry, reports);
    replication::register_replication(&mut registry, reports);
    replication::register_health(&mut registry, health);
    register_admin_memory(&mut registry, admin_memory);
    {
        let open = Gauges::<ShardLabels>::default();
        let refused = Gauges::<ShardLabels>::default();
        let reporting = Gauges::<ShardLabels>::default();
        for shard in reports {
            let labels = ShardLabels { shard: shard.shard.0.to_string() };
            open.get_or_create(&labels).set(gauge_value(shard.partitions.len() as u64));
            refused.get_or_create(&labels).set(gauge_value(shard.refused.len() as u64));
            reporting.get_or_create(&labels).set(1);
        }
        for shard in missing {
            reporting.get_or_create(&ShardLabels { shard: shard.to_string() }).set(0);
        }
        registry.register("spool_shard_partitions_open", "Partitions open on the shard", open);
        registry.register(
            "spool_shard_partitions_refused",
            "Partitions the shard owns that refused to open (see /health/ready)",
            refused,
        );
        registry.register(
            "spool_shard_reporting",
            "1 if the shard answered this scrape in time, 0 if not (its series are missing)",
            reporting,
        );
    }

    {
        let family = Counters::<OperationLabels>::default();
        for operation in crate::auth::Operation::ALL {
            let labels = OperationLabels { operation: operation.as_str().to_owned() };
            let total: u64 =
                reports.iter().map(|shard| shard.auth_denials[operation.index()]).sum();
            family.get_or_create(&labels).inc_by(total);
        }
        registry.register(
            "spool_auth_denials",
            "Requests refused PERMISSION_DENIED (the principal lacks the right), by operation",
            family,
        );
    }
    {
        let family = Counters::<OutcomeLabels>::default();
        let counts = auth.reload_counts();
        for (outcome, count) in crate::auth::reload::RELOAD_OUTCOMES.iter().zip(counts) {
            family.get_or_create(&OutcomeLabels { outcome: (*outcome).to_owned() }).inc_by(count);
        }
        registry.register(
            "spool_auth_reloads",
            "Auth file reloads (SIGHUP, POST /v1/auth/reload), by outcome: ok, invalid (the \
             file did not load; the policy in force was kept), failed (not handed to every shard)",
            family,
        );
        let lockouts = Counter::<u64>::default();
        let shards: u64 = reports.iter().map(|shard| shard.auth_lockouts).sum();
        lockouts.inc_by(shards + auth.http_lockouts());
        registry.register(
            "spool_auth_lockouts",
            "Logins refused unverified because their source address had too many recent \
             failures (handshakes on the shard ports and bearer tokens on the admin port)",
            lockouts,
        );
        let generation = Gauge::<i64>::default();
        generation.set(gauge_value(auth.current().generation));
        registry.register(
            "spool_auth_policy_generation",
            "Generation of the auth policy in force (0: read at start; +1 per reload)",
            generation,
        );
    }
    {
        // Process-wide: what the allocator has handed out and not had back,
        // against what the kernel charges the process.
        if let Some(live) = crate::alloc::live_heap_bytes() {
            let gauge = Gauge::<i64>::default();
            gauge.set(gauge_value(live));
            registry.register_with_unit(
                "spool_heap_live",
                "Heap bytes allocated and not yet freed (the allocator's overhead is the resident set minus this)",
                Unit::Bytes,
                gauge,
            );
        }
        if let Some(resident) = crate::alloc::resident_bytes() {
            let gauge = Gauge::<i64>::default();
            gauge.set(gauge_value(resident));
            registry.register_with_unit(
                "spool_process_resident",
                "Resident set of the broker process",
                Unit::Bytes,
                gauge,
            );
        }
    }

    register_quotas(&mut registry, reports);
    if let Some(disk) = disk {
        register_disk(&mut registry, disk);
    }

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    principal: String,
    quota: String,
}
