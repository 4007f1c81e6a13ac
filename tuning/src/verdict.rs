//! Can this host carry the model? A pure function of measurements and plan.
//!
//! What it owns: the host's limits derived from [`Measurements`]
//! ([`HostLimits`], also what `spool-bench capacity --host` reads), the three
//! checks, and their sentences. What it does not do: measure
//! ([`crate::measure`]) or plan ([`crate::plan`]). No I/O, no clock.
//!
//! The host carries the model when all three hold:
//! 1. **sync**: the p99 of a 4 KiB write + fdatasync beside a writer at
//!    this node's ingress share is at most the plan's `sync_slow_ms` (the
//!    sync the commit sizing assumes);
//! 2. **disk bandwidth**: that writer reached at least
//!    [`REACHED_FRACTION`] of its target;
//! 3. **broker CPU**: broker CPU per message × this node's peak messages/s
//!    ([`Plan::node_msgs_per_s`]: max(peak produce, peak consume) × replicas
//!    ÷ nodes, a follower's copy counted as a whole message) is at most
//!    [`CPU_HEADROOM_FRACTION`] of the host's CPUs. The probe runs at the
//!    node's rate by default, because the cost per message falls as the
//!    rate rises; a probe at another rate is noted beside the figure.
//!
//! A check whose probe did not run is unknown, never passed: the verdict is
//! then "unknown" unless another check failed.

use serde::{Deserialize, Serialize};

use crate::measure::Measurements;
use crate::plan::{Plan, PlanInputs, MIB_BYTES};

/// Share of the host's CPUs the broker may use at the model's peak: the rest
/// is for the kernel's I/O and network work outside the broker's threads,
/// a burst above the mean, and the probe's own error.
pub const CPU_HEADROOM_FRACTION: f64 = 0.70;
/// A paced rate (the writer's bytes, the CPU probe's messages) counts as
/// reached at this fraction of its target: pacing over a few seconds is a
/// few blocks or batches off either way.
pub const REACHED_FRACTION: f64 = 0.95;

/// What the model asks of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelNeed {
    pub nodes: u32,
    pub replicas: u32,
    /// [`Plan::node_ingress_mib_per_s`] in bytes.
    pub node_ingress_bytes_per_s: f64,
    pub node_msgs_per_s: f64,
    pub sync_slow_ms: f64,
    pub cpu_headroom_fraction: f64,
}

impl ModelNeed {
    pub fn new(inputs: &PlanInputs, plan: &Plan) -> Self {
        Self {
            nodes: plan.nodes,
            replicas: inputs.replicas,
            node_ingress_bytes_per_s: plan.node_ingress_mib_per_s * MIB_BYTES,
            node_msgs_per_s: plan.node_msgs_per_s,
            sync_slow_ms: inputs.sync_slow_ms,
            cpu_headroom_fraction: CPU_HEADROOM_FRACTION,
        }
    }
}

/// What this host can do, from its measurements. `None` = not measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostLimits {
    pub cpus: Option<usize>,
    pub broker_cpu_us_per_msg: Option<f64>,
    /// The load generator's CPU per message, for runs that put it on this host.
    pub client_cpu_us_per_msg: Option<f64>,
    /// Messages/s (enqueue + claim + ack each) the broker would carry with
    /// every CPU busy: cpus × 10⁶ ÷ broker µs per message.
    pub broker_msgs_per_s_saturated: Option<f64>,
    /// The same at [`CPU_HEADROOM_FRACTION`]: what the verdict allows a node.
    pub broker_msgs_per_s_at_headroom: Option<f64>,
    pub writer_target_bytes_per_s: Option<f64>,
    pub writer_achieved_bytes_per_s: Option<f64>,
    /// The disk's bandwidth where the writer fell short of its target (then
    /// its achieved rate is the ceiling); `None` when it reached the target
    /// (the ceiling is above it, unmeasured) or did not run.
    pub disk_bytes_per_s_max: Option<f64>,
    pub sync_p99_ms_alone: Option<f64>,
    pub sync_p99_ms_beside_writer: Option<f64>,
}

impl HostLimits {
    pub fn new(measurements: &Measurements, cpus: Option<usize>) -> Self {
        let broker_us = measurements
            .cpu
            .value()
            .map(|cpu| cpu.broker_cpu_us_per_msg)
            .filter(|us| us.is_finite() && *us > 0.0);
        let saturated = match (cpus, broker_us) {
            (Some(cpus), Some(us)) => Some(cpus as f64 * 1e6 / us),
            _ => None,
        };
        let writer = measurements.writer.value();
        let reached = writer.map(|writer| {
            writer.achieved_bytes_per_s >= writer.target_bytes_per_s * REACHED_FRACTION
        });
        Self {
            cpus,
            broker_cpu_us_per_msg: broker_us,
            client_cpu_us_per_msg: measurements.cpu.value().map(|cpu| cpu.client_cpu_us_per_msg),
            broker_msgs_per_s_saturated: saturated,
            broker_msgs_per_s_at_headroom: saturated.map(|rate| rate * CPU_HEADROOM_FRACTION),
            writer_target_bytes_per_s: writer.map(|writer| writer.target_bytes_per_s),
            writer_achieved_bytes_per_s: writer.map(|writer| writer.achieved_bytes_per_s),
            disk_bytes_per_s_max: match (reached, writer) {
                (Some(false), Some(writer)) => Some(writer.achieved_bytes_per_s),
                _ => None,
            },
            sync_p99_ms_alone: measurements
                .sync_alone
                .value()
                .map(|sync| sync.latency.p99_us / 1000.0),
            sync_p99_ms_beside_writer: measurements
                .sync_beside_writer
                .value()
                .map(|sync| sync.latency.p99_us / 1000.0),
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    Unknown,
}

/// One limit, its measured figure beside the model's need, in a sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitCheck {
    /// "fdatasync", "disk bandwidth" or "broker CPU".
    pub limit: String,
    pub status: Status,
    /// The host's figure: p99 ms, MiB/s reached, or CPUs the broker would
    /// use at the model's rate.
    pub measured: Option<f64>,
    /// The model's figure in the same unit: the sync it sizes for, the
    /// ingress share, the CPUs it allows the broker.
    pub model: Option<f64>,
    pub unit: String,
    pub detail: String,
}

/// The answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Carries {
    /// Every check passed.
    Yes,
    /// At least one check failed (named in `checks`).
    No,
    /// None failed, but at least one could not be measured.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub carries: Carries,
    pub checks: Vec<LimitCheck>,
    /// One line: what carries or which limits fail.
    pub summary: String,
}

/// Everything `spool-plan host` says about the model on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCheck {
    pub need: ModelNeed,
    pub measurements: Measurements,
    pub limits: HostLimits,
    pub verdict: Verdict,
}

fn mib(bytes_per_s: f64) -> String {
    format!("{:.1} MiB/s", bytes_per_s / MIB_BYTES)
}

/// Judges `measurements` against `need` on a host with `cpus` CPUs. Pure.
pub fn judge(measurements: Measurements, cpus: Option<usize>, need: ModelNeed) -> ModelCheck {
    let limits = HostLimits::new(&measurements, cpus);
    let checks = vec![
        sync_check(&measurements, &limits, &need),
        writer_check(&measurements, &need),
        cpu_check(&measurements, &limits, &need),
    ];
    let failed: Vec<&LimitCheck> =
        checks.iter().filter(|check| check.status == Status::Fail).collect();
    let unknown: Vec<&LimitCheck> =
        checks.iter().filter(|check| check.status == Status::Unknown).collect();
    let (carries, summary) = if !failed.is_empty() {
        let named: Vec<&str> = failed.iter().map(|check| check.detail.as_str()).collect();
        (Carries::No, format!("this host cannot carry the model: {}", named.join("; ")))
    } else if !unknown.is_empty() {
        let named: Vec<&str> = unknown.iter().map(|check| check.limit.as_str()).collect();
        (
            Carries::Unknown,
            format!("no limit failed, but {} could not be measured", named.join(" and ")),
        )
    } else {
        (Carries::Yes, "this host carries the model: every limit measured is within it".to_owned())
    };
    ModelCheck { need, measurements, limits, verdict: Verdict { carries, checks, summary } }
}

fn sync_check(measurements: &Measurements, limits: &HostLimits, need: &ModelNeed) -> LimitCheck {
    let beside = match limits.writer_achieved_bytes_per_s {
        Some(achieved) => format!("beside {}", mib(achieved)),
        None => "beside the writer".to_owned(),
    };
    let (status, detail) =
        match (limits.sync_p99_ms_beside_writer, &measurements.sync_beside_writer) {
            (Some(p99_ms), _) if p99_ms <= need.sync_slow_ms => (
                Status::Pass,
                format!(
                    "fdatasync p99 {beside} is {p99_ms:.2} ms, within the {} ms the model sizes \
                 commits for",
                    need.sync_slow_ms
                ),
            ),
            (Some(p99_ms), _) => (
                Status::Fail,
                format!(
                    "fdatasync p99 {beside} is {p99_ms:.2} ms, the model sizes commits for {} ms",
                    need.sync_slow_ms
                ),
            ),
            (None, probe) => (
                Status::Unknown,
                format!(
                    "fdatasync beside the writer unknown ({})",
                    probe.reason().unwrap_or_default()
                ),
            ),
        };
    LimitCheck {
        limit: "fdatasync".to_owned(),
        status,
        measured: limits.sync_p99_ms_beside_writer,
        model: Some(need.sync_slow_ms),
        unit: "ms (p99)".to_owned(),
        detail,
    }
}

fn writer_check(measurements: &Measurements, need: &ModelNeed) -> LimitCheck {
    let (status, measured, detail) = match measurements.writer.value() {
        Some(writer) => {
            let achieved = writer.achieved_bytes_per_s;
            if achieved >= writer.target_bytes_per_s * REACHED_FRACTION {
                (
                    Status::Pass,
                    Some(achieved),
                    format!(
                        "the writer reached {} of the {} this node's share of ingress needs",
                        mib(achieved),
                        mib(writer.target_bytes_per_s)
                    ),
                )
            } else {
                (
                    Status::Fail,
                    Some(achieved),
                    format!(
                        "disk bandwidth below the model's ingress: the writer reached {} of the \
                         {} this node's share needs",
                        mib(achieved),
                        mib(writer.target_bytes_per_s)
                    ),
                )
            }
        }
        None => (
            Status::Unknown,
            None,
            format!(
                "disk bandwidth unknown ({})",
                measurements.writer.reason().unwrap_or_default()
            ),
        ),
    };
    LimitCheck {
        limit: "disk bandwidth".to_owned(),
        status,
        measured: measured.map(|bytes| bytes / MIB_BYTES),
        model: Some(need.node_ingress_bytes_per_s / MIB_BYTES),
        unit: "MiB/s".to_owned(),
        detail,
    }
}

/// Where the probe's rate differs from the node's, what that does to the figure.
fn rate_note(measurements: &Measurements, need: &ModelNeed) -> String {
    let Some(cpu) = measurements.cpu.value() else { return String::new() };
    let mut note = String::new();
    if (cpu.rate_msgs_per_s as f64) < need.node_msgs_per_s * REACHED_FRACTION {
        note.push_str(&format!(
            "; measured at {} msgs/s, below the node's {:.0}: the cost per message falls as the \
             rate rises, so this errs high",
            cpu.rate_msgs_per_s, need.node_msgs_per_s
        ));
    }
    if cpu.achieved_msgs_per_s < cpu.rate_msgs_per_s as f64 * REACHED_FRACTION {
        note.push_str(&format!(
            "; the probe reached {:.0} of {} msgs/s (the host could not drive its rate)",
            cpu.achieved_msgs_per_s, cpu.rate_msgs_per_s
        ));
    }
    note
}

fn cpu_check(measurements: &Measurements, limits: &HostLimits, need: &ModelNeed) -> LimitCheck {
    let (status, measured, detail) = match (limits.broker_cpu_us_per_msg, limits.cpus) {
        (Some(us), Some(cpus)) => {
            let cpus_needed = us * need.node_msgs_per_s / 1e6;
            let allowed = cpus as f64 * need.cpu_headroom_fraction;
            let sentence = format!(
                "broker CPU {us:.1} µs/msg × {:.0} msgs/s = {cpus_needed:.2} CPUs, {} {:.0} % \
                 of {cpus} CPUs ({allowed:.2})",
                need.node_msgs_per_s,
                if cpus_needed <= allowed { "within" } else { "above" },
                need.cpu_headroom_fraction * 100.0
            );
            let status = if cpus_needed <= allowed { Status::Pass } else { Status::Fail };
            (status, Some(cpus_needed), sentence + &rate_note(measurements, need))
        }
        (None, _) => (
            Status::Unknown,
            None,
            format!(
                "broker CPU per message unknown ({})",
                measurements.cpu.reason().unwrap_or_default()
            ),
        ),
        (Some(_), None) => {
            (Status::Unknown, None, "broker CPU: the host's CPU count is unknown".to_owned())
        }
    };
    LimitCheck {
        limit: "broker CPU".to_owned(),
        status,
        measured,
        model: limits.cpus.map(|cpus| cpus as f64 * need.cpu_headroom_fraction),
        unit: "CPUs".to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{CpuMeasured, LatencyUs, Probe, SyncProbe, WriteMode, WriterProbe};
    use crate::plan::plan;
    use proptest::prelude::*;

    const TARGET: f64 = 40_960_000.0; // the model's node share: 25,000 × 1,638.4 B

    fn sync(p99_ms: f64) -> Probe<SyncProbe> {
        Probe::Measured {
            value: SyncProbe {
                mode: WriteMode::Direct,
                note: None,
                write_bytes: 4096,
                seconds: 3.0,
                latency: LatencyUs {
                    samples: 1000,
                    p50_us: p99_ms * 500.0,
                    p99_us: p99_ms * 1000.0,
                    max_us: p99_ms * 2000.0,
                },
            },
        }
    }

    fn writer(achieved: f64) -> Probe<WriterProbe> {
        Probe::Measured {
            value: WriterProbe {
                mode: WriteMode::Direct,
                note: None,
                target_bytes_per_s: TARGET,
                achieved_bytes_per_s: achieved,
                bytes: (achieved * 3.2) as u64,
                seconds: 3.2,
                block_bytes: 262_144,
                sync_every_bytes: 1_048_576,
            },
        }
    }

    fn cpu(us_per_msg: f64) -> Probe<CpuMeasured> {
        Probe::Measured {
            value: CpuMeasured {
                rate_msgs_per_s: 25_000,
                seconds: 3,
                shards: 2,
                partitions: 4,
                msg_bytes: 1638,
                enqueued: 75_000,
                acked: 75_000,
                achieved_msgs_per_s: 25_000.0,
                broker_cpu_s: us_per_msg * 75_000.0 / 1e6,
                broker_cpu_us_per_msg: us_per_msg,
                client_cpu_us_per_msg: 20.0,
                spoold: "spoold".to_owned(),
                spool_bench: "spool-bench".to_owned(),
            },
        }
    }

    fn measurements(p99_ms: f64, achieved: f64, cpu_probe: Probe<CpuMeasured>) -> Measurements {
        Measurements {
            dir: "/data/spool-plan-probe-1".to_owned(),
            seconds_per_probe: 3.0,
            sync_alone: sync(p99_ms / 2.0),
            sync_beside_writer: sync(p99_ms),
            writer: writer(achieved),
            cpu: cpu_probe,
        }
    }

    fn model_need() -> ModelNeed {
        let inputs = PlanInputs::default();
        ModelNeed::new(&inputs, &plan(&inputs).unwrap())
    }

    // Goal: the model's need is the node's share: 39.06 MiB/s and 25,000
    // msgs/s with 3 replicas on 3 nodes, 5 ms sync. Method: default inputs.
    #[test]
    fn model_need_is_the_node_share() {
        let need = model_need();
        assert!((need.node_ingress_bytes_per_s - TARGET).abs() < 1e-3);
        assert_eq!(need.node_msgs_per_s, 25_000.0);
        assert_eq!(need.sync_slow_ms, 5.0);
        assert_eq!(need.nodes, 3);
    }

    // Goal: a host within every limit carries the model. Method: 2 ms p99,
    // the full target, 20 µs/msg on 2 CPUs (0.5 CPUs of the 1.4 allowed).
    #[test]
    fn a_host_within_every_limit_carries() {
        let check = judge(measurements(2.0, TARGET, cpu(20.0)), Some(2), model_need());
        assert_eq!(check.verdict.carries, Carries::Yes, "{:?}", check.verdict);
        assert!(check.verdict.checks.iter().all(|check| check.status == Status::Pass));
        assert_eq!(check.limits.broker_msgs_per_s_saturated, Some(100_000.0));
        assert_eq!(check.limits.disk_bytes_per_s_max, None);
    }

    // Goal: each failing limit is named with its figure and the model's.
    // Method: 9.1 ms p99, a writer at half the target, 61 µs/msg on 2 CPUs.
    #[test]
    fn each_failing_limit_is_named_with_its_figures() {
        let check = judge(measurements(9.1, TARGET / 2.0, cpu(61.0)), Some(2), model_need());
        assert_eq!(check.verdict.carries, Carries::No);
        let details: Vec<&str> = check.verdict.checks.iter().map(|c| c.detail.as_str()).collect();
        assert_eq!(
            details[0],
            "fdatasync p99 beside 19.5 MiB/s is 9.10 ms, the model sizes commits for 5 ms"
        );
        assert!(
            details[1].starts_with("disk bandwidth below the model's ingress"),
            "{}",
            details[1]
        );
        assert!(details[1].contains("19.5 MiB/s of the 39.1 MiB/s"), "{}", details[1]);
        assert_eq!(
            details[2],
            "broker CPU 61.0 µs/msg × 25000 msgs/s = 1.52 CPUs, above 70 % of 2 CPUs (1.40)"
        );
        assert!(check.verdict.summary.starts_with("this host cannot carry the model: fdatasync"));
        assert_eq!(check.limits.disk_bytes_per_s_max, Some(TARGET / 2.0));
    }

    // Goal: a skipped CPU probe is unknown, never passed, and its reason is
    // kept; a failure elsewhere still makes the answer "no". Method: skip it.
    #[test]
    fn a_skipped_probe_is_unknown_not_passed() {
        let skipped = || Probe::Skipped { reason: "spoold not found in /x".to_owned() };
        let check = judge(measurements(2.0, TARGET, skipped()), Some(2), model_need());
        assert_eq!(check.verdict.carries, Carries::Unknown);
        let cpu_check = &check.verdict.checks[2];
        assert_eq!(cpu_check.status, Status::Unknown);
        assert!(
            cpu_check.detail.contains("skipped: spoold not found in /x"),
            "{}",
            cpu_check.detail
        );
        assert!(check.verdict.summary.contains("broker CPU could not be measured"));
        let check = judge(measurements(9.0, TARGET, skipped()), Some(2), model_need());
        assert_eq!(check.verdict.carries, Carries::No);
    }

    // Goal: a probe below the node's rate, or one that fell short of its own,
    // says so beside the CPU figure. Method: a 5,000/s probe that reached 4,000.
    #[test]
    fn a_probe_off_the_node_rate_is_noted() {
        let mut probe = cpu(150.0);
        if let Probe::Measured { value } = &mut probe {
            value.rate_msgs_per_s = 5_000;
            value.achieved_msgs_per_s = 4_000.0;
        }
        let check = judge(measurements(2.0, TARGET, probe), Some(2), model_need());
        let detail = &check.verdict.checks[2].detail;
        assert!(detail.contains("measured at 5000 msgs/s, below the node's 25000"), "{detail}");
        assert!(detail.contains("reached 4000 of 5000 msgs/s"), "{detail}");
    }

    // Goal: a check sits exactly on its bound passes (the bounds are "at
    // most" / "at least"). Method: p99 = 5 ms, writer at 95 %, CPU at 70 %.
    #[test]
    fn bounds_are_inclusive() {
        let us = 2.0 * 0.7 * 1e6 / 25_000.0;
        let check =
            judge(measurements(5.0, TARGET * REACHED_FRACTION, cpu(us)), Some(2), model_need());
        assert_eq!(check.verdict.carries, Carries::Yes, "{:?}", check.verdict);
    }

    proptest! {
        // Goal: the verdict is "yes" exactly when all three checks pass, "no"
        // when any fails, and it reads back from JSON (what `spool-bench
        // capacity --host` does). Method: random figures.
        #[test]
        fn verdict_follows_its_checks(
            p99_ms in 0.01..50.0_f64,
            fraction in 0.1..1.2_f64,
            us in 1.0..500.0_f64,
            cpus in 1usize..64,
        ) {
            let check = judge(measurements(p99_ms, TARGET * fraction, cpu(us)), Some(cpus), model_need());
            let passes = [
                p99_ms <= 5.0,
                fraction >= REACHED_FRACTION,
                us * 25_000.0 / 1e6 <= cpus as f64 * CPU_HEADROOM_FRACTION,
            ];
            for (check, pass) in check.verdict.checks.iter().zip(passes) {
                prop_assert_eq!(check.status == Status::Pass, pass, "{:?}", check);
            }
            let expected = if passes.iter().all(|pass| *pass) { Carries::Yes } else { Carries::No };
            prop_assert_eq!(check.verdict.carries, expected);
            let json = serde_json::to_string(&check).unwrap();
            let back: ModelCheck = serde_json::from_str(&json).unwrap();
            // Figures may differ in the last bit (serde_json parses floats fast, not exactly).
            prop_assert_eq!(back.verdict.carries, check.verdict.carries);
            prop_assert_eq!(&back.verdict.summary, &check.verdict.summary);
            prop_assert_eq!(back.limits.cpus, check.limits.cpus);
        }
    }
}
