//! `capacity`: the capacity model (docs/capacity.md) run for real — a burst
//! phase, then a drain phase — with the planner's predictions beside the
//! measurement.
//!
//! What it owns: turning the model's inputs into two [`Phase`]s for the load
//! engine, asking `spool-tuning`'s [`plan`] (as a library) what the same
//! inputs predict, and the comparison. What it does not do: generate load
//! (that is [`crate::load`]) or judge (the report carries both numbers and
//! their relative difference; targets live in the README).
//!
//! - **Burst**: `burst_s × time_scale` seconds of ingress at the burst rate
//!   while the workers have `burst consumer rate × mean service time` slots
//!   (Little's law: 19,000/s × 18 ms = 342 slots).
//! - **Drain**: ingress at the drain rate, slots raised to `drain consumer
//!   rate × service` (23,000/s × 18 ms = 414), until the client's ready
//!   backlog (enqueued − claimed) is at most [`DRAIN_THRESHOLD_FRACTION`] of
//!   the predicted peak — the model's "drained" — or `drain_max_factor` ×
//!   the predicted drain time has passed (then `drained` is false).
//! - `--time-scale` shortens both phases and keeps every rate: at 0.05 the
//!   1,200 s burst is 60 s and the model predicts a 360,000-message backlog
//!   drained in 90 s.
//! - `--host FILE` (the output of `spool-plan host --json`): beside the
//!   nominal prediction, the prediction at the host's measured limits
//!   ([`predict_at_host`]): rates capped where its CPU or disk cannot carry
//!   them, the planner re-run, and which limit binds.

use serde::{Deserialize, Serialize};
use spool_tuning::plan::{plan, Plan, PlanError, PlanInputs};
use spool_tuning::verdict::{Carries, HostLimits, Verdict};

use crate::dist::ServiceTime;
use crate::load::{
    self, BacklogCheck, LoadConfig, LoadError, OmbResult, PercentilesMs, Phase, PhaseEnd,
    PhaseOutcome, QueueResult, RunEcho, Sample,
};

// The planner (`spool-tuning`) builds without the broker, so it writes two
// of the broker's limits again; this crate sees both and ties them, so a
// change to either fails the build here instead of drifting.
const _: () = assert!(spool_tuning::settings::PAGE_BYTES == spool_broker::limits::PAGE_BYTES);
const _: () = assert!(
    spool_tuning::settings::SEGMENT_BYTES_RECOMMENDED_MAX
        == spool_broker::limits::SEGMENT_BYTES_MAX
);
const _: () = assert!(
    spool_tuning::settings::SEGMENT_BYTES_RECOMMENDED_MIN
        >= spool_broker::limits::SEGMENT_BYTES_MIN
);
const _: () = assert!(
    spool_tuning::settings::COMMIT_BYTES_RECOMMENDED_MAX <= spool_broker::limits::COMMIT_BYTES_MAX
);
const _: () = assert!(
    spool_tuning::settings::LEASE_MS_RECOMMENDED_MIN
        >= spool_wire::proto::limits::LEASE_MS_MIN as u64
);

/// A drain is complete when the ready backlog falls to this fraction of the
/// predicted peak: the steady-state queue at the drain rate is near zero,
/// so this detects the end without waiting for an exact 0 that a
/// continuously fed queue never holds. It ends the drain at most this
/// fraction of the drain time early.
pub const DRAIN_THRESHOLD_FRACTION: f64 = 0.01;
/// Smallest and largest time scale.
pub const TIME_SCALE_MIN: f64 = 0.0001;
pub const TIME_SCALE_MAX: f64 = 1.0;
/// Largest `drain_max_factor`.
pub const DRAIN_MAX_FACTOR_MAX: f64 = 100.0;
/// The drain phase may run at least this long past its predicted end.
const DRAIN_GRACE_S: f64 = 30.0;
/// Share of a message's broker CPU (enqueue + claim + ack) paid on the
/// enqueue side, for phases where producers and consumers run at different
/// rates. An assumption, not a measurement: the host probe times the whole
/// cycle at equal rates. At equal rates the share does not matter.
pub const ENQUEUE_SHARE_OF_MESSAGE_CPU: f64 = 0.5;

/// Why a capacity run produced no report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    #[error("the model's inputs have no plan: {0}")]
    Plan(#[from] PlanError),
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: &'static str, value: f64, min: f64, max: f64 },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the host file is not `spool-plan host --json` output with measurements: {0}")]
    HostFile(String),
}

/// The model's inputs (defaults: docs/capacity.md) and how to run it.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityConfig {
    /// Engine settings; its `phases`, `service`, `msg_bytes`, queue limits
    /// and `expected_s` are replaced from the fields below.
    pub load: LoadConfig,
    pub time_scale: f64,
    /// Unscaled burst length (s).
    pub burst_s: f64,
    pub burst_rate: f64,
    pub burst_consumer_rate: f64,
    pub drain_ingress_rate: f64,
    pub drain_consumer_rate: f64,
    /// Record payload bytes (the model's 1.6 KiB = 1,638 B).
    pub record_bytes: u64,
    pub service: ServiceTime,
    /// Override the Little's-law slot counts (e.g. to calibrate for
    /// per-delivery overhead).
    pub slots_burst: Option<u32>,
    pub slots_drain: Option<u32>,
    /// The drain phase ends at the latest after this × the predicted drain
    /// time (at least 30 s more than predicted).
    pub drain_max_factor: f64,
    /// The host's measured limits (`--host`), for a prediction at them.
    pub host: Option<HostModel>,
}

/// What `spool-plan host --json` said about the host, as the bench uses it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostModel {
    pub limits: HostLimits,
    pub verdict: Verdict,
    /// The load generator runs on the measured host (a started spoold): its
    /// CPU per message counts against the same CPUs.
    pub clients_on_host: bool,
}

impl HostModel {
    /// Reads the `model` object of `spool-plan host --json` output.
    ///
    /// # Errors
    /// [`CapacityError::HostFile`] when the text is not that JSON, or was
    /// made with `--no-measure`.
    pub fn from_host_json(text: &str, clients_on_host: bool) -> Result<Self, CapacityError> {
        let bad = |why: String| CapacityError::HostFile(why);
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| bad(error.to_string()))?;
        let model = value.get("model").filter(|model| !model.is_null()).ok_or_else(|| {
            bad("no \"model\" object (was it made with --no-measure?)".to_owned())
        })?;
        let field = |name: &str| model.get(name).cloned().unwrap_or(serde_json::Value::Null);
        Ok(Self {
            limits: serde_json::from_value(field("limits"))
                .map_err(|error| bad(format!("model.limits: {error}")))?,
            verdict: serde_json::from_value(field("verdict"))
                .map_err(|error| bad(format!("model.verdict: {error}")))?,
            clients_on_host,
        })
    }
}

/// The model's rates in one run's two phases.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PhaseRates {
    pub burst_rate: f64,
    pub burst_consumer_rate: f64,
    pub drain_ingress_rate: f64,
    pub drain_consumer_rate: f64,
}

/// The prediction at the host's measured limits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AtHost {
    /// What `spool-plan host` concluded, and why.
    pub host_carries: Carries,
    pub host_summary: String,
    /// CPU per message counted against the host: the broker's, plus the
    /// client's when it runs there.
    pub cpu_us_per_msg: Option<f64>,
    /// Whole messages/s (enqueue + claim + ack) the host's CPUs carry:
    /// CPUs × 10⁶ ÷ `cpu_us_per_msg`.
    pub msgs_per_s_max: Option<f64>,
    /// Producer rate the disk carries: its measured bandwidth (known only
    /// where the host's writer fell short) ÷ record bytes.
    pub ingress_msgs_per_s_max: Option<f64>,
    pub rates: PhaseRates,
    /// Each limit that lowered a rate, in a sentence; empty = none binds.
    pub binding: Vec<String>,
    pub peak_backlog: f64,
    pub drain_s: f64,
}

/// Caps the model's rates at the host's limits and re-runs the planner. Pure.
///
/// - **disk**: producers at most `disk_bytes_per_s_max ÷ record_bytes`.
/// - **CPU**: a phase's demand, in whole messages/s, is
///   `share × producer + (1 − share) × consumer`
///   ([`ENQUEUE_SHARE_OF_MESSAGE_CPU`]); above the host's
///   `msgs_per_s_max` both sides are scaled down by the same factor (the
///   broker serves both and favours neither).
///
/// # Errors
/// Inputs the planner rejects (as it would the nominal ones).
pub fn predict_at_host(config: &CapacityConfig, host: &HostModel) -> Result<AtHost, CapacityError> {
    let limits = &host.limits;
    let cpu_us_per_msg = limits.broker_cpu_us_per_msg.map(|broker| {
        let client =
            if host.clients_on_host { limits.client_cpu_us_per_msg.unwrap_or(0.0) } else { 0.0 };
        broker + client
    });
    let msgs_per_s_max = match (limits.cpus, cpu_us_per_msg) {
        (Some(cpus), Some(us)) if us > 0.0 => Some(cpus as f64 * 1e6 / us),
        _ => None,
    };
    let ingress_msgs_per_s_max = limits
        .disk_bytes_per_s_max
        .filter(|_| config.record_bytes > 0)
        .map(|bytes| bytes / config.record_bytes as f64);
    let mut binding = Vec::new();
    let mut phase = |name: &str, producer: f64, consumer: f64| {
        let mut producer_capped = producer;
        if let Some(max) = ingress_msgs_per_s_max.filter(|max| producer > *max) {
            binding.push(format!(
                "disk: {name} producers {producer:.0} -> {max:.0} msgs/s (the disk's measured \
                 bandwidth)"
            ));
            producer_capped = max;
        }
        let mut consumer_capped = consumer;
        if let Some(max) = msgs_per_s_max {
            let share = ENQUEUE_SHARE_OF_MESSAGE_CPU;
            let demand = share * producer_capped + (1.0 - share) * consumer;
            if demand > max {
                let factor = max / demand;
                binding.push(format!(
                    "cpu: {name} demand {demand:.0} > {max:.0} whole msgs/s the CPUs carry: \
                     producers {producer_capped:.0} -> {:.0}, consumers {consumer:.0} -> {:.0}",
                    producer_capped * factor,
                    consumer * factor
                ));
                producer_capped *= factor;
                consumer_capped *= factor;
            }
        }
        (producer_capped, consumer_capped)
    };
    let (burst_rate, burst_consumer_rate) =
        phase("burst", config.burst_rate, config.burst_consumer_rate);
    let (drain_ingress_rate, drain_consumer_rate) =
        phase("drain", config.drain_ingress_rate, config.drain_consumer_rate);
    let rates =
        PhaseRates { burst_rate, burst_consumer_rate, drain_ingress_rate, drain_consumer_rate };
    let capped = CapacityConfig {
        burst_rate,
        burst_consumer_rate,
        drain_ingress_rate,
        drain_consumer_rate,
        ..config.clone()
    };
    // Scaling both sides of a phase by one factor keeps the drain's consumers
    // above its ingress, and the disk cap only lowers ingress, so capped
    // rates drain whenever the nominal ones do.
    let planned = plan(&capped.plan_inputs())?;
    let (peak_backlog, drain_s) = (planned.backlog_msgs, planned.drain_s);
    Ok(AtHost {
        host_carries: host.verdict.carries,
        host_summary: host.verdict.summary.clone(),
        cpu_us_per_msg,
        msgs_per_s_max,
        ingress_msgs_per_s_max,
        rates,
        binding,
        peak_backlog,
        drain_s,
    })
}

/// What the planner predicts for the scaled model.
#[derive(Clone, Debug, Serialize)]
pub struct Predicted {
    /// Messages: (burst rate − burst consumer rate) × scaled burst.
    pub peak_backlog: f64,
    pub peak_backlog_bytes: f64,
    /// peak backlog ÷ (drain consumer rate − drain ingress rate).
    pub drain_s: f64,
    pub burst_s: f64,
    /// Oldest ready message at the peak: peak backlog ÷ burst consumer rate
    /// (FIFO: the head waited for everything ahead of it).
    pub oldest_ready_age_s: f64,
    /// Little's law at the consumer rates: the slots each phase runs with.
    pub busy_slots_burst: f64,
    pub busy_slots_drain: f64,
    /// The planner's peak figures: rate × service, and ÷ utilization.
    pub slots_busy_at_peak_rate: f64,
    pub slots_planned: f64,
    /// The same model fed the measured phase rates instead of the nominal
    /// ones. The peak is then the burst's net growth by construction; the
    /// drain time says whether the achieved rates drain at all (−1: never).
    pub peak_backlog_at_measured_rates: f64,
    pub drain_s_at_measured_rates: f64,
}

/// What the run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// Largest client backlog (enqueued − acked) over both phases.
    pub peak_backlog: f64,
    /// Largest DescribeQueue backlog (ready + scheduled + claimed) sampled.
    pub peak_backlog_broker: u64,
    /// Burst end → ready backlog at the threshold (if `drained`).
    pub drain_s: f64,
    pub drained: bool,
    pub drain_threshold_msgs: u64,
    pub oldest_ready_age_s_max: f64,
    pub busy_slots_burst_mean: f64,
    pub busy_slots_drain_mean: f64,
    pub burst_publish_rate: f64,
    pub burst_consume_rate: f64,
    pub drain_publish_rate: f64,
    pub drain_consume_rate: f64,
    /// Intended send → offset, whole run.
    pub enqueue_latency_ms: PercentilesMs,
    /// Worst one-second interval's enqueue p99.
    pub enqueue_p99_ms_worst_interval: f64,
    pub errors_total: u64,
}

/// measured ÷ predicted − 1.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Deviation {
    pub peak_backlog: f64,
    pub drain_s: f64,
}

/// The configuration as run.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityEcho {
    pub time_scale: f64,
    pub burst_s_unscaled: f64,
    pub burst_rate: f64,
    pub burst_consumer_rate: f64,
    pub drain_ingress_rate: f64,
    pub drain_consumer_rate: f64,
    pub record_bytes: u64,
    pub service: ServiceTime,
    pub slots_burst: u32,
    pub slots_drain: u32,
    pub drain_max_s: f64,
    /// The run's setup (flattened: the same keys as ever).
    #[serde(flatten)]
    pub run: RunEcho,
}

/// One capacity run, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityReport {
    pub scenario: &'static str,
    pub predicted: Predicted,
    pub measured: Measured,
    pub deviation: Deviation,
    /// Client backlog vs the broker's count at the end of the burst.
    pub backlog_check: BacklogCheck,
    pub omb: OmbResult,
    pub queue: QueueResult,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub phases: Vec<PhaseOutcome>,
    pub config: CapacityEcho,
    /// The planner's full output for the scaled model.
    pub plan: Plan,
    /// The prediction at the host's measured limits (`--host`).
    pub predicted_at_host: Option<AtHost>,
    pub series: Vec<Sample>,
}

impl CapacityConfig {
    fn validate(&self) -> Result<(), CapacityError> {
        let check = |field, value: f64, min: f64, max: f64| {
            if value.is_finite() && (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(CapacityError::OutOfRange { field, value, min, max })
            }
        };
        check("time_scale", self.time_scale, TIME_SCALE_MIN, TIME_SCALE_MAX)?;
        check("drain_max_factor", self.drain_max_factor, 1.0, DRAIN_MAX_FACTOR_MAX)
    }

    /// The planner's inputs for this (scaled) run.
    pub fn plan_inputs(&self) -> PlanInputs {
        PlanInputs {
            rate_msgs_per_s: self.burst_rate,
            record_bytes: self.record_bytes as f64,
            burst_rate_msgs_per_s: self.burst_rate,
            burst_s: self.burst_s * self.time_scale,
            burst_consumer_msgs_per_s: self.burst_consumer_rate,
            drain_ingress_msgs_per_s: self.drain_ingress_rate,
            drain_consumer_msgs_per_s: self.drain_consumer_rate,
            service_ms_mean: self.service.mean_ms,
            service_cv: self.service.cv,
            ..PlanInputs::default()
        }
    }
}

/// One line for the run's title: the prediction at the host's limits and what binds.
pub fn at_host_line(at_host: &AtHost) -> String {
    let drain = format!("drain {:.1} s", at_host.drain_s);
    let binds = if at_host.binding.is_empty() {
        "no limit binds".to_owned()
    } else {
        format!("binds: {}", at_host.binding.join("; "))
    };
    format!(
        "; at this host's limits: peak {:.0}, {drain} ({binds}; host carries the model: {})",
        at_host.peak_backlog,
        match at_host.host_carries {
            Carries::Yes => "yes",
            Carries::No => "no",
            Carries::Unknown => "unknown",
        }
    )
}

/// Slots for `rate` at `service` (Little's law), at least 1.
pub fn slots_for(rate_per_s: f64, service: &ServiceTime) -> u32 {
    // Saturating cast of a validated, bounded product.
    ((rate_per_s * service.mean_ms / 1000.0).round() as u32).max(1)
}

/// The model's backlog at `t_s` after the burst began: linear growth at the
/// burst surplus, then linear decline at the drain surplus, never below 0.
pub fn predicted_backlog(config: &CapacityConfig, t_s: f64) -> f64 {
    let burst_s = config.burst_s * config.time_scale;
    let growth = (config.burst_rate - config.burst_consumer_rate).max(0.0);
    if t_s <= burst_s {
        return growth * t_s.max(0.0);
    }
    let surplus = config.drain_consumer_rate - config.drain_ingress_rate;
    (growth * burst_s - surplus * (t_s - burst_s)).max(0.0)
}

/// Runs the model and compares it with the planner.
///
/// # Errors
/// Inputs the planner rejects, a bad config, or a failed load run.
pub fn run(config: &CapacityConfig) -> Result<CapacityReport, CapacityError> {
    config.validate()?;
    let plan = plan(&config.plan_inputs())?;
    let predicted_at_host =
        config.host.as_ref().map(|host| predict_at_host(config, host)).transpose()?;
    let slots_burst = config
        .slots_burst
        .unwrap_or_else(|| slots_for(config.burst_consumer_rate, &config.service));
    let slots_drain = config
        .slots_drain
        .unwrap_or_else(|| slots_for(config.drain_consumer_rate, &config.service));
    let burst_s = config.burst_s * config.time_scale;
    let drain_max_s = (plan.drain_s * config.drain_max_factor).max(plan.drain_s + DRAIN_GRACE_S);
    // Saturating cast: a threshold past u64 would be a nonsense plan anyway.
    let threshold_msgs = (plan.backlog_msgs * DRAIN_THRESHOLD_FRACTION).ceil() as u64;
    let mut load = config.load.clone();
    load.msg_bytes = config.record_bytes;
    load.service = config.service;
    load.queue_max_messages = plan.settings.queue_max_messages.max(load.queue_max_messages);
    load.queue_max_bytes = plan.settings.queue_max_bytes.max(load.queue_max_bytes);
    load.expected_s = burst_s + plan.drain_s;
    load.phases = vec![
        Phase {
            name: "burst".to_owned(),
            seconds: burst_s,
            rate_per_s: config.burst_rate,
            slots: slots_burst,
            end: PhaseEnd::Elapsed,
        },
        Phase {
            name: "drain".to_owned(),
            seconds: drain_max_s,
            rate_per_s: config.drain_ingress_rate,
            slots: slots_drain,
            end: PhaseEnd::Drained { threshold_msgs },
        },
    ];
    let mut outcome = load::run(&load)?;
    for sample in &mut outcome.series {
        sample.predicted_backlog = Some(predicted_backlog(config, sample.t_s));
    }
    let burst = outcome.phases.first().cloned();
    let drain = outcome.phases.get(1).cloned();
    let (Some(burst), Some(drain)) = (burst, drain) else {
        return Err(LoadError::Finish("phases", std::time::Duration::ZERO).into());
    };

    let peak_backlog = burst.backlog_client_max.max(drain.backlog_client_max) as f64;
    let drained = drain.drained == Some(true);
    let measured_drain_s = drain.ended_s - drain.started_s;
    let series = &outcome.series;
    let max_of = |value: fn(&Sample) -> f64| series.iter().map(value).fold(0.0, f64::max);
    let measured = Measured {
        peak_backlog,
        peak_backlog_broker: series.iter().map(|sample| sample.backlog_broker).max().unwrap_or(0),
        drain_s: measured_drain_s,
        drained,
        drain_threshold_msgs: threshold_msgs,
        oldest_ready_age_s_max: max_of(|sample| sample.oldest_ready_age_ms as f64) / 1000.0,
        busy_slots_burst_mean: burst.busy_slots_mean,
        busy_slots_drain_mean: drain.busy_slots_mean,
        burst_publish_rate: burst.publish_rate,
        burst_consume_rate: burst.consume_rate,
        drain_publish_rate: drain.publish_rate,
        drain_consume_rate: drain.consume_rate,
        enqueue_latency_ms: outcome.publish_latency_ms,
        enqueue_p99_ms_worst_interval: max_of(|sample| sample.publish_latency_ms.p99),
        errors_total: outcome.error_total(),
    };
    // The same arithmetic with the rates the run actually achieved.
    let measured_growth = (burst.publish_rate - burst.consume_rate).max(0.0);
    let peak_at_measured = measured_growth * (burst.ended_s - burst.started_s);
    let measured_surplus = drain.consume_rate - drain.publish_rate;
    let drain_at_measured =
        if measured_surplus > 0.0 { peak_at_measured / measured_surplus } else { f64::INFINITY };
    let predicted = Predicted {
        peak_backlog: plan.backlog_msgs,
        peak_backlog_bytes: plan.backlog_bytes,
        drain_s: plan.drain_s,
        burst_s,
        oldest_ready_age_s: plan.backlog_msgs / config.burst_consumer_rate,
        busy_slots_burst: config.burst_consumer_rate * config.service.mean_ms / 1000.0,
        busy_slots_drain: config.drain_consumer_rate * config.service.mean_ms / 1000.0,
        slots_busy_at_peak_rate: plan.slots_busy,
        slots_planned: plan.slots_planned,
        peak_backlog_at_measured_rates: peak_at_measured,
        // JSON has no infinity: a drain that cannot finish reports -1.
        drain_s_at_measured_rates: if drain_at_measured.is_finite() {
            drain_at_measured
        } else {
            -1.0
        },
    };
    let relative = |measured: f64, predicted: f64| {
        if predicted > 0.0 {
            measured / predicted - 1.0
        } else {
            0.0
        }
    };
    let deviation = Deviation {
        peak_backlog: relative(measured.peak_backlog, predicted.peak_backlog),
        drain_s: relative(measured.drain_s, predicted.drain_s),
    };
    Ok(CapacityReport {
        scenario: "capacity",
        deviation,
        backlog_check: burst.end_check,
        omb: outcome.omb(),
        queue: outcome.queue(),
        errors: outcome.errors.clone(),
        config: CapacityEcho {
            time_scale: config.time_scale,
            burst_s_unscaled: config.burst_s,
            burst_rate: config.burst_rate,
            burst_consumer_rate: config.burst_consumer_rate,
            drain_ingress_rate: config.drain_ingress_rate,
            drain_consumer_rate: config.drain_consumer_rate,
            record_bytes: config.record_bytes,
            service: config.service,
            slots_burst,
            slots_drain,
            drain_max_s,
            run: outcome.echo(&load),
        },
        predicted,
        measured,
        phases: outcome.phases,
        plan,
        predicted_at_host,
        series: outcome.series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(time_scale: f64) -> CapacityConfig {
        CapacityConfig {
            load: crate::load::tests::config(),
            time_scale,
            burst_s: 1200.0,
            burst_rate: 25_000.0,
            burst_consumer_rate: 19_000.0,
            drain_ingress_rate: 19_000.0,
            drain_consumer_rate: 23_000.0,
            record_bytes: 1638,
            service: ServiceTime { mean_ms: 18.0, cv: 1.0 },
            slots_burst: None,
            slots_drain: None,
            drain_max_factor: 3.0,
            host: None,
        }
    }

    #[test]
    fn the_seed_model_gives_the_design_numbers_and_scales_linearly() {
        // Goal: the inputs handed to the planner reproduce docs/capacity.md's model (7.2 M, 1,800 s, 342 and
        // 414 slots) and --time-scale scales backlog and drain time, not rates.
        let full = model(1.0);
        let planned = plan(&full.plan_inputs()).unwrap();
        assert!((planned.backlog_msgs - 7_200_000.0).abs() < 1e-6);
        assert!((planned.drain_s - 1800.0).abs() < 1e-9);
        assert_eq!(slots_for(full.burst_consumer_rate, &full.service), 342);
        assert_eq!(slots_for(full.drain_consumer_rate, &full.service), 414);
        let scaled = plan(&model(0.05).plan_inputs()).unwrap();
        assert!((scaled.backlog_msgs - 360_000.0).abs() < 1e-6);
        assert!((scaled.drain_s - 90.0).abs() < 1e-9);
    }

    #[test]
    fn predicted_curve_rises_peaks_and_drains_to_zero() {
        // Goal: the plotted model curve is the planner's arithmetic: peak at the burst end,
        // zero at burst + drain time, never negative. Method: evaluate at the corners.
        let config = model(0.05);
        assert_eq!(predicted_backlog(&config, 0.0), 0.0);
        assert!((predicted_backlog(&config, 30.0) - 180_000.0).abs() < 1e-6);
        assert!((predicted_backlog(&config, 60.0) - 360_000.0).abs() < 1e-6);
        assert!((predicted_backlog(&config, 105.0) - 180_000.0).abs() < 1e-6);
        assert_eq!(predicted_backlog(&config, 150.0), 0.0);
        assert_eq!(predicted_backlog(&config, 400.0), 0.0);
    }

    fn host(broker_us: Option<f64>, client_us: f64, disk_bytes_per_s: Option<f64>) -> HostModel {
        let saturated = broker_us.map(|us| 2.0 * 1e6 / us);
        HostModel {
            limits: HostLimits {
                cpus: Some(2),
                broker_cpu_us_per_msg: broker_us,
                client_cpu_us_per_msg: Some(client_us),
                broker_msgs_per_s_saturated: saturated,
                broker_msgs_per_s_at_headroom: saturated.map(|rate| rate * 0.7),
                writer_target_bytes_per_s: Some(40_960_000.0),
                writer_achieved_bytes_per_s: Some(disk_bytes_per_s.unwrap_or(40_960_000.0)),
                disk_bytes_per_s_max: disk_bytes_per_s,
                sync_p99_ms_alone: Some(1.0),
                sync_p99_ms_beside_writer: Some(2.0),
            },
            verdict: Verdict {
                carries: Carries::Yes,
                checks: Vec::new(),
                summary: "this host carries the model".to_owned(),
            },
            clients_on_host: false,
        }
    }

    #[test]
    fn a_host_with_room_predicts_the_nominal_model() {
        // Goal: limits above every rate change nothing and name no binding limit.
        // Method: 10 µs/msg on 2 CPUs (200k msgs/s), the disk's ceiling unknown.
        let config = model(0.05);
        let at_host = predict_at_host(&config, &host(Some(10.0), 5.0, None)).unwrap();
        assert!(at_host.binding.is_empty(), "{:?}", at_host.binding);
        assert!((at_host.peak_backlog - 360_000.0).abs() < 1e-6);
        assert!((at_host.drain_s - 90.0).abs() < 1e-9);
        assert_eq!(at_host.msgs_per_s_max, Some(200_000.0));
        assert_eq!(at_host.rates.drain_consumer_rate, 23_000.0);
        assert!(at_host_line(&at_host).contains("no limit binds"));
    }

    #[test]
    fn cpu_scales_both_sides_of_each_phase() {
        // Goal: a CPU-bound host scales producers and consumers of a phase by
        // demand ÷ capacity, and the planner's arithmetic follows. Method:
        // 100 µs/msg on 2 CPUs = 20,000 whole msgs/s; the burst asks
        // 0.5 × 25,000 + 0.5 × 19,000 = 22,000, the drain 21,000.
        let config = model(0.05);
        let at_host = predict_at_host(&config, &host(Some(100.0), 50.0, None)).unwrap();
        let burst = 20_000.0 / 22_000.0;
        let drain = 20_000.0 / 21_000.0;
        assert!((at_host.rates.burst_rate - 25_000.0 * burst).abs() < 1e-6);
        assert!((at_host.rates.burst_consumer_rate - 19_000.0 * burst).abs() < 1e-6);
        assert!((at_host.rates.drain_consumer_rate - 23_000.0 * drain).abs() < 1e-6);
        let peak = 6_000.0 * burst * 60.0;
        assert!((at_host.peak_backlog - peak).abs() < 1e-6);
        assert!((at_host.drain_s - peak / (4_000.0 * drain)).abs() < 1e-9);
        assert_eq!(at_host.binding.len(), 2);
        assert!(
            at_host.binding.iter().all(|line| line.starts_with("cpu: ")),
            "{:?}",
            at_host.binding
        );

        // Clients on the host add their CPU: 100 + 50 µs = 13,333 msgs/s.
        let mut shared = host(Some(100.0), 50.0, None);
        shared.clients_on_host = true;
        let at_host = predict_at_host(&config, &shared).unwrap();
        assert!((at_host.msgs_per_s_max.unwrap() - 2e6 / 150.0).abs() < 1e-6);
        assert!(at_host.rates.burst_rate < 25_000.0 * burst);
    }

    #[test]
    fn a_slow_disk_caps_producers_and_says_so() {
        // Goal: a disk below the burst's ingress caps producers only.
        // Method: 10 MiB/s at 1,638 B/record = 6,401 msgs/s, below every
        // consumer rate: no backlog grows.
        let config = model(0.05);
        let at_host = predict_at_host(&config, &host(Some(10.0), 5.0, Some(10_485_760.0))).unwrap();
        let max = 10_485_760.0 / 1638.0;
        assert_eq!(at_host.ingress_msgs_per_s_max, Some(max));
        assert_eq!(at_host.rates.burst_rate, max);
        assert_eq!(at_host.rates.drain_ingress_rate, max);
        assert_eq!(at_host.rates.burst_consumer_rate, 19_000.0);
        assert_eq!(at_host.peak_backlog, 0.0);
        assert!(at_host.binding.iter().all(|line| line.starts_with("disk: ")));
    }

    #[test]
    fn host_file_is_read_from_spool_plan_output() {
        // Goal: the bench reads what `spool-plan host --json` writes (the same
        // types), and refuses a file made with --no-measure. Method: judge
        // fabricated measurements with spool-tuning, wrap as the CLI does.
        use spool_tuning::measure::{CpuMeasured, Measurements, Probe};
        use spool_tuning::verdict::{judge, ModelNeed};
        fn skipped<T>() -> Probe<T> {
            Probe::Skipped { reason: "test".to_owned() }
        }
        let measurements = Measurements {
            dir: "/tmp/x".to_owned(),
            seconds_per_probe: 3.0,
            sync_alone: skipped(),
            sync_beside_writer: skipped(),
            writer: skipped(),
            cpu: Probe::Measured {
                value: CpuMeasured {
                    rate_msgs_per_s: 25_000,
                    seconds: 3,
                    shards: 2,
                    partitions: 4,
                    msg_bytes: 1638,
                    enqueued: 75_000,
                    acked: 75_000,
                    achieved_msgs_per_s: 25_000.0,
                    broker_cpu_s: 2.5,
                    broker_cpu_us_per_msg: 40.0,
                    client_cpu_us_per_msg: 30.0,
                    spoold: "spoold".to_owned(),
                    spool_bench: "spool-bench".to_owned(),
                },
            },
        };
        let inputs = PlanInputs::default();
        let need = ModelNeed::new(&inputs, &plan(&inputs).unwrap());
        let check = judge(measurements, Some(2), need);
        let text = serde_json::json!({ "host": {}, "applied": null, "model": check }).to_string();
        let host = HostModel::from_host_json(&text, true).unwrap();
        assert_eq!(host.limits.broker_cpu_us_per_msg, Some(40.0));
        assert_eq!(host.verdict.carries, Carries::Unknown);
        let at_host = predict_at_host(&model(0.05), &host).unwrap();
        assert!((at_host.msgs_per_s_max.unwrap() - 2e6 / 70.0).abs() < 1e-6);

        let no_measure = r#"{"host": {}, "applied": null, "model": null}"#;
        let error = HostModel::from_host_json(no_measure, true).unwrap_err();
        assert!(error.to_string().contains("--no-measure"), "{error}");
        assert!(HostModel::from_host_json("[]", true).is_err());
    }

    #[test]
    fn a_model_that_cannot_drain_is_refused_before_any_load() {
        // Goal: impossible inputs fail with the planner's error, without starting a broker
        // (the test config points at an unroutable address, so a started run would fail
        // differently).
        let mut config = model(0.01);
        config.drain_consumer_rate = 19_000.0;
        assert!(matches!(
            run(&config),
            Err(CapacityError::Plan(PlanError::DrainImpossible { .. }))
        ));
        config = model(0.0);
        assert!(matches!(run(&config), Err(CapacityError::OutOfRange { field: "time_scale", .. })));
    }
}
