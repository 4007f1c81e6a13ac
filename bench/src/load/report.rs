//! What a load run reports: the per-second [`Sample`]s, each phase's
//! [`PhaseOutcome`], the run's [`LoadOutcome`], and the two views every
//! scenario's report carries (OMB's own result fields and the queue's).

use std::collections::BTreeMap;

use serde::Serialize;

use super::config::LoadConfig;
use crate::dist::Arrivals;
use crate::histogram::LatencySummary;

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

/// Confirmed sends − confirmed acks, saturating at the ends of `i64`.
fn end_backlog(enqueued: u64, acked: u64) -> i64 {
    if enqueued >= acked {
        i64::try_from(enqueued - acked).unwrap_or(i64::MAX)
    } else {
        i64::try_from(acked - enqueued).map_or(i64::MIN, |over| -over)
    }
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
    /// Subscriptions per queue (each consumes every enqueue once).
    pub subscriptions: u32,
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
    /// Client backlog at the end of the run: confirmed sends (once per
    /// subscription) − confirmed acks, both final. (A sample's figure can dip below zero while the
    /// run goes: a consumer may ack a message before its producer has
    /// processed the enqueue's answer. The last sample of a run whose
    /// samples are far apart was one of those.)
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
            backlog: end_backlog(
                self.enqueued.saturating_mul(u64::from(self.subscriptions.max(1))),
                self.acked,
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(backlog: i64) -> Sample {
        Sample {
            t_s: 1.0,
            phase: "test".to_owned(),
            publish_rate: 100.0,
            consume_rate: 100.0,
            backlog_client: backlog,
            ready_client: backlog,
            backlog_broker: 0,
            ready_broker: 0,
            claimed_broker: 0,
            oldest_ready_age_ms: 0,
            busy_slots: 1,
            held_slots: 1,
            slots: 2,
            predicted_backlog: None,
            publish_latency_ms: PercentilesMs::default(),
            e2e_latency_ms: PercentilesMs::default(),
            errors: 0,
        }
    }

    fn outcome(enqueued: u64, acked: u64, last_sample_backlog: i64) -> LoadOutcome {
        LoadOutcome {
            duration_s: 10.0,
            subscriptions: 1,
            phases: Vec::new(),
            series: vec![sample(last_sample_backlog)],
            submitted: enqueued,
            enqueued,
            claimed: acked,
            acked,
            released: 0,
            redelivered: 0,
            extend_failed: 0,
            claim_requests: 1,
            ack_requests: 1,
            publish_latency_ms: PercentilesMs::default(),
            e2e_latency_ms: PercentilesMs::default(),
            service_ms: PercentilesMs::default(),
            claim_to_ack_mean_ms: 0.0,
            broker_final: BrokerCounts::default(),
            errors: BTreeMap::new(),
            addr: "127.0.0.1:1".to_owned(),
            spoold_started: false,
            shards: 1,
            queues: vec!["q".to_owned()],
            queues_created: true,
            partitions: 1,
        }
    }

    // Goal: the OMB backlog is the end-of-run difference of the final
    // counts — a drained run reports 0 and a run that left messages
    // reports them — not the last sample's figure, which a consumer acking
    // before its producer saw the enqueue's answer can push below zero
    // (the 1k-topic run reported -57,281 with nothing left). Method: omb()
    // over outcomes whose last sample disagrees with the final counts; the
    // difference itself at the extremes of the types.
    #[test]
    fn the_omb_backlog_is_the_difference_of_the_final_counts() {
        assert_eq!(outcome(3_555_837, 3_555_837, -57_281).omb().backlog, 0);
        assert_eq!(outcome(5_958_896, 683_276, 5_100_000).omb().backlog, 5_275_620);
        // Three subscriptions owe every enqueue three times.
        let fanned = LoadOutcome { subscriptions: 3, ..outcome(1_000, 2_500, 0) };
        assert_eq!(fanned.omb().backlog, 500);
        assert_eq!(end_backlog(10, 12), -2);
        assert_eq!(end_backlog(u64::MAX, 0), i64::MAX);
        assert_eq!(end_backlog(0, u64::MAX), i64::MIN);
    }
}
