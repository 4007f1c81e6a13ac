//! What a load run reports: the per-second [`Sample`]s, each phase's
//! [`PhaseOutcome`], the run's [`LoadOutcome`], and the two views every
//! scenario's report carries (OMB's own result fields and the queue's).

use std::collections::BTreeMap;

use serde::Serialize;

use super::config::LoadConfig;
use crate::dist::Arrivals;
use crate::latency::LatencySummary;

/// Percentiles of one interval or run, in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PercentilesMs {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl From<LatencySummary> for PercentilesMs {
    fn from(us: LatencySummary) -> Self {
        Self {
            count: us.count,
            p50: us.p50 / 1000.0,
            p99: us.p99 / 1000.0,
            p999: us.p999 / 1000.0,
            max: us.max / 1000.0,
            mean: us.mean / 1000.0,
        }
    }
}

/// The broker's counts, summed over a run's queues and partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BrokerCounts {
    pub ready: u64,
    pub scheduled: u64,
    pub claimed: u64,
    /// ready + scheduled + claimed: everything enqueued and not yet acked.
    pub backlog: u64,
    pub acked: u64,
    /// Oldest ready message over every partition.
    pub oldest_ready_age_ms: u64,
    /// Cumulative.
    pub released: u64,
    pub lease_expired: u64,
    pub quarantined: u64,
}

/// One sample (every second, and at each phase end).
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Since the first send was due.
    pub t_s: f64,
    pub phase: String,
    /// Sends confirmed in the interval ÷ its length.
    pub publish_rate: f64,
    /// Acks confirmed in the interval ÷ its length.
    pub consume_rate: f64,
    /// Client count: enqueued − acked.
    pub backlog_client: i64,
    /// Client count: enqueued − claimed (waiting in the broker, not held).
    pub ready_client: i64,
    /// DescribeQueue ready + scheduled + claimed.
    pub backlog_broker: u64,
    pub ready_broker: u64,
    pub claimed_broker: u64,
    pub oldest_ready_age_ms: u64,
    /// Handlers running their service time right now.
    pub busy_slots: u64,
    /// Deliveries held (claimed, not yet acked or released).
    pub held_slots: i64,
    /// Slots the phase runs with.
    pub slots: u32,
    /// The scenario's model, where it has one.
    pub predicted_backlog: Option<f64>,
    pub publish_latency_ms: PercentilesMs,
    pub e2e_latency_ms: PercentilesMs,
    /// Errors so far (cumulative).
    pub errors: u64,
}

/// The client's backlog and the broker's, read around one DescribeQueue.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BacklogCheck {
    /// enqueued − acked just before DescribeQueue was sent...
    pub client_before: i64,
    /// ...and just after it returned.
    pub client_after: i64,
    /// Their mean: the client's estimate at the moment the broker counted.
    pub client_estimate: f64,
    /// DescribeQueue ready + scheduled + claimed.
    pub broker: u64,
    /// |client_estimate − broker| ÷ broker (0 when both are 0).
    pub relative_error: f64,
}

/// How one phase went.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseOutcome {
    pub name: String,
    pub started_s: f64,
    pub ended_s: f64,
    /// For a draining or backlog-building phase: whether its threshold was
    /// reached (else it hit its `seconds`).
    pub drained: Option<bool>,
    pub rate_per_s: f64,
    pub slots: u32,
    /// Confirmed sends and acks in the phase ÷ its length.
    pub publish_rate: f64,
    pub consume_rate: f64,
    /// Largest client backlog (enqueued − acked) seen in the phase (checked
    /// every 50 ms while draining, else at each sample).
    pub backlog_client_max: i64,
    /// The counts when the phase ended.
    pub end_check: BacklogCheck,
    /// Mean busy slots over the phase's samples.
    pub busy_slots_mean: f64,
}

/// Totals of a run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadOutcome {
    pub duration_s: f64,
    pub phases: Vec<PhaseOutcome>,
    pub series: Vec<Sample>,
    pub submitted: u64,
    pub enqueued: u64,
    pub claimed: u64,
    pub acked: u64,
    pub released: u64,
    /// Deliveries with attempt > 1, seen by the handlers.
    pub redelivered: u64,
    pub extend_failed: u64,
    /// Claim and Ack requests the consumers sent (deliveries per request
    /// is what batching bought).
    pub claim_requests: u64,
    pub ack_requests: u64,
    /// Intended send → offset returned, whole run.
    pub publish_latency_ms: PercentilesMs,
    /// Intended send → handler start, whole run.
    pub e2e_latency_ms: PercentilesMs,
    /// Measured handler service time (sleep asked → woken), whole run.
    pub service_ms: PercentilesMs,
    /// Mean delivery → ack-confirmed time by Little's law: mean held slots
    /// ÷ mean ack rate over the samples with acks.
    pub claim_to_ack_mean_ms: f64,
    pub broker_final: BrokerCounts,
    pub errors: BTreeMap<String, u64>,
    pub addr: String,
    pub spoold_started: bool,
    pub shards: u16,
    pub queues: Vec<String>,
    pub queues_created: bool,
    pub partitions: u32,
}

/// The OpenMessaging Benchmark's result fields (its names, its units: ms
/// and msgs/s), aggregated over the whole run.
#[derive(Clone, Debug, Serialize)]
#[allow(non_snake_case)]
pub struct OmbResult {
    /// Confirmed sends ÷ run length.
    pub publishRate: f64,
    /// Confirmed acks ÷ run length.
    pub consumeRate: f64,
    /// Client backlog (enqueued − acked) at the last sample.
    pub backlog: i64,
    pub publishLatency50pct: f64,
    pub publishLatency99pct: f64,
    pub publishLatency999pct: f64,
    pub publishLatencyMax: f64,
    pub endToEndLatency50pct: f64,
    pub endToEndLatency99pct: f64,
    pub endToEndLatency999pct: f64,
    pub endToEndLatencyMax: f64,
}

/// The queue-specific figures every report carries.
#[derive(Clone, Debug, Serialize)]
pub struct QueueResult {
    /// Mean delivery → ack confirmed (Little's law over held slots).
    pub claim_to_ack_mean_ms: f64,
    /// The handlers' measured service times.
    pub service_ms: PercentilesMs,
    /// Deliveries with attempt > 1 seen by the handlers.
    pub redeliveries: u64,
    /// Broker: leases that ran out unacked (each makes a redelivery).
    pub lease_expiries: u64,
    /// Broker: deliveries given back with Release (shutdown releases count).
    pub released: u64,
    pub extend_failed: u64,
    /// Requests the consumers sent.
    pub claim_requests: u64,
    pub ack_requests: u64,
    /// Broker counts after the run.
    pub broker_final: BrokerCounts,
}

/// How a run was set up, as every phased scenario's report echoes it
/// (flattened at the end of the scenario's own `config` object).
#[derive(Clone, Debug, Serialize)]
pub struct RunEcho {
    pub arrivals: Arrivals,
    pub producers: u32,
    pub consumers: u32,
    pub addr: String,
    pub spoold_started: bool,
    pub shards: u16,
    /// The first of the run's queues.
    pub queue: String,
    pub partitions: u32,
    pub seed: u64,
}

impl LoadOutcome {
    pub fn omb(&self) -> OmbResult {
        let per_s = |count: u64| count as f64 / self.duration_s.max(1e-9);
        OmbResult {
            publishRate: per_s(self.enqueued),
            consumeRate: per_s(self.acked),
            backlog: self.series.last().map_or(0, |sample| sample.backlog_client),
            publishLatency50pct: self.publish_latency_ms.p50,
            publishLatency99pct: self.publish_latency_ms.p99,
            publishLatency999pct: self.publish_latency_ms.p999,
            publishLatencyMax: self.publish_latency_ms.max,
            endToEndLatency50pct: self.e2e_latency_ms.p50,
            endToEndLatency99pct: self.e2e_latency_ms.p99,
            endToEndLatency999pct: self.e2e_latency_ms.p999,
            endToEndLatencyMax: self.e2e_latency_ms.max,
        }
    }

    pub fn queue(&self) -> QueueResult {
        QueueResult {
            claim_to_ack_mean_ms: self.claim_to_ack_mean_ms,
            service_ms: self.service_ms,
            redeliveries: self.redelivered,
            lease_expiries: self.broker_final.lease_expired,
            released: self.broker_final.released,
            extend_failed: self.extend_failed,
            claim_requests: self.claim_requests,
            ack_requests: self.ack_requests,
            broker_final: self.broker_final,
        }
    }

    /// The setup of this run of `load`, for the report.
    pub fn echo(&self, load: &LoadConfig) -> RunEcho {
        RunEcho {
            arrivals: load.arrivals,
            producers: load.producers_per_queue,
            consumers: load.consumers_per_queue,
            addr: self.addr.clone(),
            spoold_started: self.spoold_started,
            shards: self.shards,
            queue: self.queues.first().cloned().unwrap_or_default(),
            partitions: self.partitions,
            seed: load.seed,
        }
    }

    /// Every error of the run, summed.
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }
}
