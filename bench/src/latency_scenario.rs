//! `latency`: a fixed open-loop rate for a fixed time, with percentiles
//! over time.
//!
//! What it owns: one [`Phase`] for the load engine and its report. It is
//! `throughput --rate` as its own scenario: the same open-loop pacing, but
//! sampled every second (rates, backlog, enqueue and end-to-end
//! percentiles per interval), with simulated workers (slots, log-normal
//! service time; default 0 ms: ack at once) and the OMB-shaped summary.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::dist::ServiceTime;
use crate::load::{
    self, LoadConfig, LoadError, OmbResult, PercentilesMs, Phase, PhaseEnd, QueueResult, RunEcho,
    Sample,
};

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyConfig {
    /// Engine settings; `phases`, `service`, `msg_bytes` and `expected_s`
    /// are replaced from the fields below.
    pub load: LoadConfig,
    pub rate_per_s: f64,
    pub seconds: f64,
    /// Slots over all consumers.
    pub slots: u32,
    pub msg_bytes: u64,
    pub service: ServiceTime,
}

/// The configuration as run.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyEcho {
    pub rate_per_s: f64,
    pub seconds: f64,
    pub slots: u32,
    pub msg_bytes: u64,
    pub service: ServiceTime,
    /// The run's setup (flattened: the same keys as ever).
    #[serde(flatten)]
    pub run: RunEcho,
}

/// One latency run, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyReport {
    pub scenario: &'static str,
    /// Intended send → offset returned, whole run.
    pub enqueue_latency_ms: PercentilesMs,
    /// Intended send → handler start, whole run.
    pub e2e_latency_ms: PercentilesMs,
    /// Worst one-second interval's enqueue p99.
    pub enqueue_p99_ms_worst_interval: f64,
    pub omb: OmbResult,
    pub queue: QueueResult,
    pub errors: BTreeMap<String, u64>,
    pub duration_s: f64,
    pub config: LatencyEcho,
    pub series: Vec<Sample>,
}

/// Runs the fixed rate.
///
/// # Errors
/// A bad config or a failed load run.
pub fn run(config: &LatencyConfig) -> Result<LatencyReport, LoadError> {
    let mut load = config.load.clone();
    load.msg_bytes = config.msg_bytes;
    load.service = config.service;
    load.expected_s = config.seconds;
    load.phases = vec![Phase {
        name: "steady".to_owned(),
        seconds: config.seconds,
        rate_per_s: config.rate_per_s,
        slots: config.slots,
        end: PhaseEnd::Elapsed,
    }];
    let outcome = load::run(&load)?;
    let worst_p99 =
        outcome.series.iter().map(|sample| sample.publish_latency_ms.p99).fold(0.0, f64::max);
    Ok(LatencyReport {
        scenario: "latency",
        enqueue_latency_ms: outcome.publish_latency_ms,
        e2e_latency_ms: outcome.e2e_latency_ms,
        enqueue_p99_ms_worst_interval: worst_p99,
        omb: outcome.omb(),
        queue: outcome.queue(),
        errors: outcome.errors.clone(),
        duration_s: outcome.duration_s,
        config: LatencyEcho {
            rate_per_s: config.rate_per_s,
            seconds: config.seconds,
            slots: config.slots,
            msg_bytes: config.msg_bytes,
            service: config.service,
            run: outcome.echo(&load),
        },
        series: outcome.series,
    })
}
