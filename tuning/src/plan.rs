//! The capacity model as code: [`PlanInputs`] in, [`Plan`] out.
//!
//! This module owns the arithmetic of the capacity model (docs/capacity.md; the 25k/s model):
//! ingress, replication, unreclaimed bytes, burst backlog and drain time,
//! execution slots by Little's law, partition count, disk need, and the broker
//! settings derived from them ([`crate::settings`]). It is a pure function:
//! no I/O, no clock, no rounding except where a count must be whole. It does
//! not render anything ([`crate::report`]) and does not look at the host
//! ([`crate::host`]).
//!
//! Every input is validated before any arithmetic so an impossible plan is a
//! typed [`PlanError`], never NaN or infinity in the output.

use serde::{Deserialize, Serialize};

use crate::settings::{self, BrokerSettings};

/// Bytes in a MiB.
pub const MIB_BYTES: f64 = 1024.0 * 1024.0;
/// Bytes in a TiB.
pub const TIB_BYTES: f64 = 1024.0 * 1024.0 * 1024.0 * 1024.0;
/// Seconds in a day: the period of "unreclaimed bytes per day".
pub const DAY_S: f64 = 86_400.0;

/// Largest message rate the planner accepts (msgs/s). Far above one cluster's
/// reach; it only keeps every product finite and every count in range.
pub const RATE_MSGS_PER_S_MAX: f64 = 1e9;
/// Largest record the planner accepts: the wire format's record limit
/// (`spool_wire::limits::RECORD_BYTES_MAX`, 1 MiB), restated so this crate
/// stays a leaf; larger payloads travel by reference and are not ingress.
pub const RECORD_BYTES_MAX: f64 = (1 << 20) as f64;
/// Most replicas of a partition.
pub const REPLICAS_MAX: u32 = 15;
/// Most broker nodes a plan spreads its partitions over.
pub const NODES_MAX: u32 = 1_000;
/// Longest retention window or burst (a year, in seconds).
pub const DURATION_S_MAX: f64 = 365.0 * DAY_S;
/// Longest mean service time (an hour, in ms).
pub const SERVICE_MS_MAX: f64 = 3_600_000.0;
/// Largest service-time coefficient of variation; beyond this a log-normal
/// tail estimate from the mean alone says nothing useful.
pub const SERVICE_CV_MAX: f64 = 100.0;
/// Largest lease safety factor.
pub const LEASE_SAFETY_FACTOR_MAX: f64 = 100.0;
/// Slowest fdatasync the commit sizing plans for (ms).
pub const SYNC_SLOW_MS_MAX: f64 = 10_000.0;
/// Most partitions a plan may ask for. Partitions cost file handles,
/// metadata and recovery time (seed: "more partitions are not free").
pub const PARTITIONS_MAX: u64 = 65_536;

/// What the planner is told about the workload. Defaults are the seed's model
/// (docs/capacity.md); the fields the seed leaves open are marked as assumptions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanInputs {
    /// Peak steady enqueue rate.
    pub rate_msgs_per_s: f64,
    /// Mean encoded record size including metadata. The seed's "1.6 KiB" is
    /// 1.6 × 1024 = 1638.4 bytes: that is what gives its ≈39 MiB/s
    /// (1,600 bytes would give 38.1 MiB/s).
    pub record_bytes: f64,
    /// Copies of every record.
    pub replicas: u32,
    /// Broker nodes the partitions and their replicas are spread over, evenly.
    /// `None` (the default) = one node per replica (3 for the model): every
    /// node holds a copy of every partition. Each replica is on its own node,
    /// so a count below `replicas` is refused.
    pub nodes: Option<u32>,
    /// How long records stay on disk after ingress (replay/audit window).
    pub retention_s: f64,
    /// Producer rate during the burst.
    pub burst_rate_msgs_per_s: f64,
    /// Length of the burst.
    pub burst_s: f64,
    /// Consumer rate during the burst.
    pub burst_consumer_msgs_per_s: f64,
    /// Producer rate after the burst, while the backlog drains.
    pub drain_ingress_msgs_per_s: f64,
    /// Consumer rate after the burst (consumers scaled up to drain).
    pub drain_consumer_msgs_per_s: f64,
    /// Mean handler service time.
    pub service_ms_mean: f64,
    /// Coefficient of variation (stddev / mean) of the service time.
    /// Assumption: the seed says "measured" without a number; 1.0 is the
    /// exponential-like default until a measurement replaces it.
    pub service_cv: f64,
    /// Target worker utilization, in (0, 1].
    pub utilization_target: f64,
    /// What one partition sustains on the produce path. Assumption: 10,000/s,
    /// far under what one shard's journal appends (`spool-bench log-append`,
    /// bench/README.md), so one shard can carry many partitions.
    pub partition_produce_msgs_per_s: f64,
    /// What one partition sustains on the claim/ack path. Assumption: 5,000/s
    /// (every message costs a claim and an ack, each a durable state change).
    pub partition_consume_msgs_per_s: f64,
    /// Fraction of the disk kept free as the broker's reserve, in [0, 1).
    pub disk_reserve_fraction: f64,
    /// Lease = service-time p99.9 × this factor.
    pub lease_safety_factor: f64,
    /// A slow fdatasync, for commit sizing: 3–5 ms were measured under load.
    pub sync_slow_ms: f64,
}

impl Default for PlanInputs {
    fn default() -> Self {
        Self {
            rate_msgs_per_s: 25_000.0,
            record_bytes: 1.6 * 1024.0,
            replicas: 3,
            nodes: None,
            retention_s: DAY_S,
            burst_rate_msgs_per_s: 25_000.0,
            burst_s: 20.0 * 60.0,
            burst_consumer_msgs_per_s: 19_000.0,
            drain_ingress_msgs_per_s: 19_000.0,
            drain_consumer_msgs_per_s: 23_000.0,
            service_ms_mean: 18.0,
            service_cv: 1.0,
            utilization_target: 0.60,
            partition_produce_msgs_per_s: 10_000.0,
            partition_consume_msgs_per_s: 5_000.0,
            disk_reserve_fraction: 0.20,
            lease_safety_factor: 2.0,
            sync_slow_ms: 5.0,
        }
    }
}

/// Why a set of inputs cannot be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("{field} must be a finite number, got {value}")]
    NotFinite { field: &'static str, value: f64 },
    #[error("{field} must be greater than zero, got {value}")]
    NotPositive { field: &'static str, value: f64 },
    #[error("{field} must not be negative, got {value}")]
    Negative { field: &'static str, value: f64 },
    #[error("{field} = {value} exceeds the limit {limit}")]
    AboveLimit { field: &'static str, value: f64, limit: f64 },
    #[error("replicas must be between 1 and {REPLICAS_MAX}, got {0}")]
    Replicas(u32),
    #[error("nodes must be between replicas ({replicas}) and {NODES_MAX}, got {nodes}")]
    Nodes { nodes: u32, replicas: u32 },
    #[error("utilization_target must be in (0, 1], got {0}")]
    Utilization(f64),
    #[error("service_cv (coefficient of variation) must be >= 0, got {0}")]
    NegativeCv(f64),
    #[error("disk_reserve_fraction must be in [0, 1), got {0}")]
    DiskReserve(f64),
    #[error("lease_safety_factor must be >= 1, got {0}")]
    LeaseSafetyFactor(f64),
    #[error(
        "the backlog can never drain: consumers at {consumer_msgs_per_s} msgs/s do not exceed \
         ingress at {ingress_msgs_per_s} msgs/s after the burst"
    )]
    DrainImpossible { consumer_msgs_per_s: f64, ingress_msgs_per_s: f64 },
    #[error("the plan needs {needed} partitions, more than the limit {PARTITIONS_MAX}")]
    TooManyPartitions { needed: u64 },
}

/// Everything the model derives from [`PlanInputs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// rate × record size.
    pub ingress_logical_mib_per_s: f64,
    /// logical × replicas: what the disks of the cluster write, before log,
    /// index, checksum and compaction amplification.
    pub ingress_replicated_mib_per_s: f64,
    /// Nodes the plan spreads partitions over ([`PlanInputs::nodes`] resolved).
    pub nodes: u32,
    /// What one node's disk writes at the peak produce rate: max(rate, burst
    /// rate) × record size × replicas ÷ nodes. This node's share of the
    /// replicated ingress, what `spool-plan host` streams beside its sync probe.
    pub node_ingress_mib_per_s: f64,
    /// Messages one node carries at the peak: max(peak produce, peak consume
    /// rate) × replicas ÷ nodes. Each is an enqueue, a claim and an ack; a
    /// follower's copy is counted as a whole message (an upper bound: it
    /// applies the same entries, from one replication stream instead of
    /// client requests).
    pub node_msgs_per_s: f64,
    /// Replicated ingress kept for one day.
    pub unreclaimed_tib_per_day: f64,
    /// The same in bytes.
    pub unreclaimed_bytes_per_day: f64,
    /// Logical bytes inside the retention window (one replica).
    pub retained_bytes: f64,
    /// (burst rate − burst consumer rate) × burst length, never below 0.
    pub backlog_msgs: f64,
    /// backlog × record size (one replica).
    pub backlog_bytes: f64,
    /// backlog / (drain consumer rate − drain ingress rate).
    pub drain_s: f64,
    /// Busy execution slots: rate × mean service time (Little's law).
    pub slots_busy: f64,
    /// busy / target utilization.
    pub slots_planned: f64,
    /// Partitions the produce path needs.
    pub partitions_for_produce: u64,
    /// Partitions the consume path needs.
    pub partitions_for_consume: u64,
    /// max of the two.
    pub partitions: u64,
    /// Disk one replica needs: max(retained, backlog) / (1 − reserve).
    pub disk_bytes_per_replica: f64,
    /// disk per replica × replicas.
    pub disk_bytes_total: f64,
    /// Recommended broker settings.
    pub settings: BrokerSettings,
}

/// Plans capacity for `inputs`.
///
/// # Errors
/// A [`PlanError`] naming the first invalid input, or the backlog that cannot
/// drain, or a partition count above [`PARTITIONS_MAX`].
pub fn plan(inputs: &PlanInputs) -> Result<Plan, PlanError> {
    validate(inputs)?;
    let ingress_bytes_per_s = inputs.rate_msgs_per_s * inputs.record_bytes;
    let replicas = f64::from(inputs.replicas);
    let unreclaimed_bytes_per_day = ingress_bytes_per_s * replicas * DAY_S;

    let backlog_msgs = ((inputs.burst_rate_msgs_per_s - inputs.burst_consumer_msgs_per_s)
        * inputs.burst_s)
        .max(0.0);
    let backlog_bytes = backlog_msgs * inputs.record_bytes;
    let drain_surplus_msgs_per_s =
        inputs.drain_consumer_msgs_per_s - inputs.drain_ingress_msgs_per_s;
    // validate() rejected a surplus <= 0, so the division is finite.
    assert!(drain_surplus_msgs_per_s > 0.0);
    let drain_s = backlog_msgs / drain_surplus_msgs_per_s;

    let slots_busy = inputs.rate_msgs_per_s * inputs.service_ms_mean / 1000.0;
    let slots_planned = slots_busy / inputs.utilization_target;

    // Partitions must carry the fastest rate either side is ever asked for:
    // producers at peak or during the burst, consumers at peak or while draining.
    let produce_peak = inputs.rate_msgs_per_s.max(inputs.burst_rate_msgs_per_s);
    let consume_peak = inputs
        .rate_msgs_per_s
        .max(inputs.drain_consumer_msgs_per_s)
        .max(inputs.burst_consumer_msgs_per_s);
    let partitions_for_produce = whole_count(produce_peak / inputs.partition_produce_msgs_per_s)?;
    let partitions_for_consume = whole_count(consume_peak / inputs.partition_consume_msgs_per_s)?;
    let partitions = partitions_for_produce.max(partitions_for_consume);

    let nodes = inputs.nodes.unwrap_or(inputs.replicas);
    let node_share = replicas / f64::from(nodes);
    let node_ingress_mib_per_s = produce_peak * inputs.record_bytes * node_share / MIB_BYTES;
    let node_msgs_per_s = produce_peak.max(consume_peak) * node_share;

    // With `rate` taken as sustained for the whole window, the backlog's records
    // lie inside the retention window whenever it is longer than the backlog's
    // age, so the two are not added: the larger one is what must fit.
    let retained_bytes = ingress_bytes_per_s * inputs.retention_s;
    let disk_bytes_per_replica =
        retained_bytes.max(backlog_bytes) / (1.0 - inputs.disk_reserve_fraction);
    let disk_bytes_total = disk_bytes_per_replica * replicas;

    let settings = settings::recommend(&settings::SettingsInputs {
        ingress_bytes_per_s_per_partition: produce_peak * inputs.record_bytes / partitions as f64,
        record_bytes: inputs.record_bytes,
        sync_slow_ms: inputs.sync_slow_ms,
        backlog_msgs,
        rate_msgs_per_s: inputs.rate_msgs_per_s,
        disk_bytes_per_replica,
        disk_reserve_fraction: inputs.disk_reserve_fraction,
        service_ms_mean: inputs.service_ms_mean,
        service_cv: inputs.service_cv,
        lease_safety_factor: inputs.lease_safety_factor,
    });

    let plan = Plan {
        ingress_logical_mib_per_s: ingress_bytes_per_s / MIB_BYTES,
        ingress_replicated_mib_per_s: ingress_bytes_per_s * replicas / MIB_BYTES,
        nodes,
        node_ingress_mib_per_s,
        node_msgs_per_s,
        unreclaimed_tib_per_day: unreclaimed_bytes_per_day / TIB_BYTES,
        unreclaimed_bytes_per_day,
        retained_bytes,
        backlog_msgs,
        backlog_bytes,
        drain_s,
        slots_busy,
        slots_planned,
        partitions_for_produce,
        partitions_for_consume,
        partitions,
        disk_bytes_per_replica,
        disk_bytes_total,
        settings,
    };
    plan.assert_finite();
    Ok(plan)
}

impl Plan {
    /// Validation bounds every input, so a non-finite output is a bug here.
    fn assert_finite(&self) {
        for value in [
            self.ingress_logical_mib_per_s,
            self.ingress_replicated_mib_per_s,
            self.node_ingress_mib_per_s,
            self.node_msgs_per_s,
            self.unreclaimed_bytes_per_day,
            self.retained_bytes,
            self.backlog_msgs,
            self.backlog_bytes,
            self.drain_s,
            self.slots_busy,
            self.slots_planned,
            self.disk_bytes_per_replica,
            self.disk_bytes_total,
            self.settings.lease.service_p999_ms,
        ] {
            assert!(value.is_finite(), "plan produced a non-finite value: {self:?}");
        }
    }
}

/// Rounds a partition count up, at least 1, within [`PARTITIONS_MAX`].
fn whole_count(partitions: f64) -> Result<u64, PlanError> {
    let limit = PARTITIONS_MAX as f64;
    if partitions > limit {
        // Saturating float-to-int cast: only used for the message.
        return Err(PlanError::TooManyPartitions { needed: partitions.ceil() as u64 });
    }
    Ok((partitions.ceil() as u64).max(1))
}

fn validate(inputs: &PlanInputs) -> Result<(), PlanError> {
    let fields: [(&'static str, f64); 16] = [
        ("rate_msgs_per_s", inputs.rate_msgs_per_s),
        ("record_bytes", inputs.record_bytes),
        ("retention_s", inputs.retention_s),
        ("burst_rate_msgs_per_s", inputs.burst_rate_msgs_per_s),
        ("burst_s", inputs.burst_s),
        ("burst_consumer_msgs_per_s", inputs.burst_consumer_msgs_per_s),
        ("drain_ingress_msgs_per_s", inputs.drain_ingress_msgs_per_s),
        ("drain_consumer_msgs_per_s", inputs.drain_consumer_msgs_per_s),
        ("service_ms_mean", inputs.service_ms_mean),
        ("service_cv", inputs.service_cv),
        ("utilization_target", inputs.utilization_target),
        ("partition_produce_msgs_per_s", inputs.partition_produce_msgs_per_s),
        ("partition_consume_msgs_per_s", inputs.partition_consume_msgs_per_s),
        ("disk_reserve_fraction", inputs.disk_reserve_fraction),
        ("lease_safety_factor", inputs.lease_safety_factor),
        ("sync_slow_ms", inputs.sync_slow_ms),
    ];
    for (field, value) in fields {
        if !value.is_finite() {
            return Err(PlanError::NotFinite { field, value });
        }
    }
    // Rates a plan divides by or multiplies into every output must be > 0.
    positive("rate_msgs_per_s", inputs.rate_msgs_per_s, RATE_MSGS_PER_S_MAX)?;
    positive("record_bytes", inputs.record_bytes, RECORD_BYTES_MAX)?;
    positive("burst_rate_msgs_per_s", inputs.burst_rate_msgs_per_s, RATE_MSGS_PER_S_MAX)?;
    positive("burst_consumer_msgs_per_s", inputs.burst_consumer_msgs_per_s, RATE_MSGS_PER_S_MAX)?;
    positive("drain_consumer_msgs_per_s", inputs.drain_consumer_msgs_per_s, RATE_MSGS_PER_S_MAX)?;
    positive("service_ms_mean", inputs.service_ms_mean, SERVICE_MS_MAX)?;
    positive(
        "partition_produce_msgs_per_s",
        inputs.partition_produce_msgs_per_s,
        RATE_MSGS_PER_S_MAX,
    )?;
    positive(
        "partition_consume_msgs_per_s",
        inputs.partition_consume_msgs_per_s,
        RATE_MSGS_PER_S_MAX,
    )?;
    positive("sync_slow_ms", inputs.sync_slow_ms, SYNC_SLOW_MS_MAX)?;
    // Zero is meaningful here: no ingress while draining, no burst, or
    // delete-on-ack (no retention window).
    non_negative("drain_ingress_msgs_per_s", inputs.drain_ingress_msgs_per_s, RATE_MSGS_PER_S_MAX)?;
    non_negative("burst_s", inputs.burst_s, DURATION_S_MAX)?;
    non_negative("retention_s", inputs.retention_s, DURATION_S_MAX)?;

    if inputs.replicas == 0 || inputs.replicas > REPLICAS_MAX {
        return Err(PlanError::Replicas(inputs.replicas));
    }
    if let Some(nodes) = inputs.nodes {
        if nodes < inputs.replicas || nodes > NODES_MAX {
            return Err(PlanError::Nodes { nodes, replicas: inputs.replicas });
        }
    }
    if !(inputs.utilization_target > 0.0 && inputs.utilization_target <= 1.0) {
        return Err(PlanError::Utilization(inputs.utilization_target));
    }
    if inputs.service_cv < 0.0 {
        return Err(PlanError::NegativeCv(inputs.service_cv));
    }
    if inputs.service_cv > SERVICE_CV_MAX {
        return Err(PlanError::AboveLimit {
            field: "service_cv",
            value: inputs.service_cv,
            limit: SERVICE_CV_MAX,
        });
    }
    if !(0.0..1.0).contains(&inputs.disk_reserve_fraction) {
        return Err(PlanError::DiskReserve(inputs.disk_reserve_fraction));
    }
    if inputs.lease_safety_factor < 1.0 {
        return Err(PlanError::LeaseSafetyFactor(inputs.lease_safety_factor));
    }
    if inputs.lease_safety_factor > LEASE_SAFETY_FACTOR_MAX {
        return Err(PlanError::AboveLimit {
            field: "lease_safety_factor",
            value: inputs.lease_safety_factor,
            limit: LEASE_SAFETY_FACTOR_MAX,
        });
    }
    if inputs.drain_consumer_msgs_per_s <= inputs.drain_ingress_msgs_per_s {
        return Err(PlanError::DrainImpossible {
            consumer_msgs_per_s: inputs.drain_consumer_msgs_per_s,
            ingress_msgs_per_s: inputs.drain_ingress_msgs_per_s,
        });
    }
    Ok(())
}

fn positive(field: &'static str, value: f64, limit: f64) -> Result<(), PlanError> {
    if value <= 0.0 {
        return Err(PlanError::NotPositive { field, value });
    }
    below_limit(field, value, limit)
}

fn non_negative(field: &'static str, value: f64, limit: f64) -> Result<(), PlanError> {
    if value < 0.0 {
        return Err(PlanError::Negative { field, value });
    }
    below_limit(field, value, limit)
}

fn below_limit(field: &'static str, value: f64, limit: f64) -> Result<(), PlanError> {
    if value > limit {
        return Err(PlanError::AboveLimit { field, value, limit });
    }
    Ok(())
}
