//! Measurements of what decides the capacity model on this host.
//!
//! This module owns the probes `spool-plan host` runs by default: the
//! latency of a 4 KiB write + fdatasync alone and beside a writer streaming
//! at this node's share of the model's ingress ([`disk`]), and the broker's
//! CPU per message from a short run of a real `spoold` under `spool-bench`
//! ([`cpu`]). Every probe writes only inside one fresh directory under the
//! data dir, removed afterwards, and is bounded in time
//! ([`MEASURE_SECONDS_MAX`]).
//!
//! It does not judge: the figures go to [`crate::verdict`], a pure function
//! of measurements and plan. A probe that cannot run says why
//! ([`Probe::Skipped`], [`Probe::Failed`]) instead of failing the report, and
//! the verdict then counts that limit as unknown, never as passed.

pub mod cpu;
pub mod disk;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default length of each probe (s).
pub const MEASURE_SECONDS_DEFAULT: f64 = 3.0;
/// Shortest probe: below this a p99 rests on too few syncs to mean anything.
pub const MEASURE_SECONDS_MIN: f64 = 0.1;
/// Longest probe: `host` stays an interactive command.
pub const MEASURE_SECONDS_MAX: f64 = 60.0;
/// Bounds of the broker CPU probe's rate (`--probe-rate`; by default the
/// model's messages per node, clamped to these). The rate matters: much of
/// the broker's CPU is paid per wake-up, not per message, so its cost per
/// message falls as the rate rises (bench/README.md: 149.8 µs/msg at 5k/s,
/// 37.4 at 25k/s on the same host). A figure measured below the node's rate
/// errs high.
pub const PROBE_RATE_MSGS_PER_S_MIN: u64 = 100;
pub const PROBE_RATE_MSGS_PER_S_MAX: u64 = 1_000_000;
/// The writer runs this long before the sync probe beside it starts, so the
/// syncs meet a disk that is already busy.
pub const WRITER_RAMP: Duration = Duration::from_millis(200);

/// A probe's outcome: figures, or why there are none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Probe<T> {
    Measured {
        value: T,
    },
    /// Not run, by design (no binaries, not enough free space, `--no-measure` parts).
    Skipped {
        reason: String,
    },
    /// Tried and failed (an I/O error, a broker that did not start).
    Failed {
        reason: String,
    },
}

impl<T> Probe<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Probe::Measured { value } => Some(value),
            Probe::Skipped { .. } | Probe::Failed { .. } => None,
        }
    }

    /// Why there is no value (`None` when measured).
    pub fn reason(&self) -> Option<String> {
        match self {
            Probe::Measured { .. } => None,
            Probe::Skipped { reason } => Some(format!("skipped: {reason}")),
            Probe::Failed { reason } => Some(format!("failed: {reason}")),
        }
    }
}

/// p50, p99 and max of a set of latency samples (µs), nearest rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyUs {
    pub samples: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Summarizes `samples` (sorted in place). `None` when empty or when a
/// sample is not a finite, non-negative duration.
pub fn latency_summary(samples: &mut [f64]) -> Option<LatencyUs> {
    if samples.is_empty() || samples.iter().any(|sample| !sample.is_finite() || *sample < 0.0) {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let rank = |quantile: f64| {
        // Nearest rank: the smallest sample with at least `quantile` of all at or below it.
        let index = (quantile * samples.len() as f64).ceil() as usize;
        samples[index.clamp(1, samples.len()) - 1]
    };
    Some(LatencyUs {
        samples: samples.len() as u64,
        p50_us: rank(0.50),
        p99_us: rank(0.99),
        max_us: samples[samples.len() - 1],
    })
}

/// How the probe files were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// O_DIRECT, as the broker's journal writes.
    Direct,
    /// Through the page cache: the filesystem refused O_DIRECT (tmpfs, some
    /// FUSE or overlay setups). fdatasync then writes the page back itself.
    Buffered,
}

/// 4 KiB write + fdatasync, one after another, for a while.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncProbe {
    pub mode: WriteMode,
    /// Why the mode is not [`WriteMode::Direct`].
    pub note: Option<String>,
    pub write_bytes: u64,
    pub seconds: f64,
    /// Each sample is one write + fdatasync.
    pub latency: LatencyUs,
}

/// A paced sequential writer (O_DIRECT blocks, fdatasync every so often).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriterProbe {
    pub mode: WriteMode,
    pub note: Option<String>,
    pub target_bytes_per_s: f64,
    pub achieved_bytes_per_s: f64,
    pub bytes: u64,
    pub seconds: f64,
    pub block_bytes: u64,
    pub sync_every_bytes: u64,
}

/// The broker's CPU per message from a short throughput run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuMeasured {
    pub rate_msgs_per_s: u64,
    pub seconds: u64,
    pub shards: u16,
    pub partitions: u32,
    pub msg_bytes: u64,
    /// Sends that became durable, and acks, inside the run.
    pub enqueued: u64,
    pub acked: u64,
    /// enqueued ÷ seconds: below the rate asked, the host could not drive it.
    pub achieved_msgs_per_s: f64,
    /// spoold's user + system CPU over the run (all threads, /proc/<pid>/stat).
    pub broker_cpu_s: f64,
    /// broker CPU ÷ enqueued: one enqueue, one claim and one ack.
    pub broker_cpu_us_per_msg: f64,
    /// spool-bench's CPU ÷ enqueued (producers and consumers, same host).
    pub client_cpu_us_per_msg: f64,
    pub spoold: String,
    pub spool_bench: String,
}

/// What `spool-plan host` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// Where the probes wrote (removed afterwards).
    pub dir: String,
    pub seconds_per_probe: f64,
    pub sync_alone: Probe<SyncProbe>,
    pub sync_beside_writer: Probe<SyncProbe>,
    pub writer: Probe<WriterProbe>,
    pub cpu: Probe<CpuMeasured>,
}

/// How to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasureConfig {
    /// Length of each probe (s), within [`MEASURE_SECONDS_MIN`]..=[`MEASURE_SECONDS_MAX`].
    pub seconds: f64,
    /// The background writer's pace: this node's share of the model's ingress.
    pub writer_target_bytes_per_s: f64,
    /// Free bytes of the data dir's filesystem, when known: the writer is
    /// skipped rather than fill a disk.
    pub free_bytes: Option<u64>,
    /// Where `spoold` and `spool-bench` are; `None` skips the CPU probe.
    pub bin_dir: Option<PathBuf>,
    pub probe_rate_msgs_per_s: u64,
    /// Payload of the CPU probe's messages (the model's record size).
    pub msg_bytes: u64,
    /// Shards of the probe's broker (the host's CPUs).
    pub shards: u16,
}

/// Removes the probe directory however the probes end.
struct ProbeDir {
    path: PathBuf,
}

impl Drop for ProbeDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory is named after this process.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Runs every probe in a fresh directory under `dir` (the data dir, or its
/// nearest existing ancestor: the same filesystem) and removes it. Never
/// fails: a probe that cannot run is reported as such.
pub fn measure(dir: &Path, config: &MeasureConfig) -> Measurements {
    assert!(config.seconds.is_finite());
    assert!(config.seconds >= MEASURE_SECONDS_MIN);
    assert!(config.seconds <= MEASURE_SECONDS_MAX);
    let probe_dir = ProbeDir { path: dir.join(format!("spool-plan-probe-{}", std::process::id())) };
    let mut measurements = Measurements {
        dir: probe_dir.path.display().to_string(),
        seconds_per_probe: config.seconds,
        sync_alone: Probe::Skipped { reason: "not run".to_owned() },
        sync_beside_writer: Probe::Skipped { reason: "not run".to_owned() },
        writer: Probe::Skipped { reason: "not run".to_owned() },
        cpu: Probe::Skipped { reason: "not run".to_owned() },
    };
    if let Err(error) = fs::create_dir(&probe_dir.path) {
        let reason = format!("cannot create {}: {error}", probe_dir.path.display());
        measurements.sync_alone = Probe::Failed { reason: reason.clone() };
        measurements.sync_beside_writer = Probe::Failed { reason: reason.clone() };
        measurements.writer = Probe::Failed { reason: reason.clone() };
        measurements.cpu = Probe::Failed { reason };
        return measurements;
    }
    let duration = Duration::from_secs_f64(config.seconds);
    measurements.sync_alone = disk::sync_probe(&probe_dir.path.join("sync"), duration).into();
    let (beside, writer) = disk::sync_beside_writer(
        &probe_dir.path,
        duration,
        config.writer_target_bytes_per_s,
        config.free_bytes,
    );
    measurements.sync_beside_writer = beside;
    measurements.writer = writer;
    measurements.cpu = match &config.bin_dir {
        Some(bin_dir) => cpu::broker_cpu_probe(&cpu::CpuProbeConfig {
            bin_dir: bin_dir.clone(),
            dir: probe_dir.path.join("broker"),
            rate_msgs_per_s: config.probe_rate_msgs_per_s,
            // spool-bench runs whole seconds.
            seconds: config.seconds.ceil().max(1.0) as u64,
            msg_bytes: config.msg_bytes,
            shards: config.shards,
        }),
        None => Probe::Skipped { reason: "no --bin-dir with spoold and spool-bench".to_owned() },
    };
    measurements
}

impl<T> From<std::io::Result<T>> for Probe<T> {
    fn from(result: std::io::Result<T>) -> Self {
        match result {
            Ok(value) => Probe::Measured { value },
            Err(error) => Probe::Failed { reason: error.to_string() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Goal: nearest-rank percentiles on a known set. Method: 1..=100 µs.
    #[test]
    fn latency_summary_nearest_rank() {
        let mut samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let summary = latency_summary(&mut samples).unwrap();
        assert_eq!(summary.samples, 100);
        assert_eq!(summary.p50_us, 50.0);
        assert_eq!(summary.p99_us, 99.0);
        assert_eq!(summary.max_us, 100.0);
        assert_eq!(latency_summary(&mut [7.0]).unwrap().p99_us, 7.0);
        assert!(latency_summary(&mut []).is_none());
        assert!(latency_summary(&mut [1.0, f64::NAN]).is_none());
    }

    proptest! {
        // Goal: any set of samples summarizes to p50 <= p99 <= max, each one
        // of the samples. Method: random non-empty sets.
        #[test]
        fn latency_summary_is_ordered(mut samples in prop::collection::vec(0.0..1e7_f64, 1..500)) {
            let copy = samples.clone();
            let summary = latency_summary(&mut samples).unwrap();
            prop_assert!(summary.p50_us <= summary.p99_us);
            prop_assert!(summary.p99_us <= summary.max_us);
            prop_assert!(copy.contains(&summary.p50_us));
            prop_assert!(copy.contains(&summary.p99_us));
            prop_assert_eq!(summary.samples, copy.len() as u64);
        }
    }
}
