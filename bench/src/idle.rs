//! `idle`: what an idle broker costs — CPU and wake-ups per second.
//!
//! What it owns: a `spoold` child it starts, one queue of `partitions`
//! partitions on it, and nothing else: no client traffic during the
//! measurement. It reads the child's CPU time (`/proc/PID/stat` utime +
//! stime) and the context switches of every thread (`/proc/PID/task/*/status`,
//! voluntary + involuntary) before and after `seconds`, so the figures are
//! what the kernel charges the process. Wake-ups per second are the
//! load-independent figure (a timer that fires is a switch whatever else the
//! machine does); CPU % of a core is what an operator sees in `top`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_client::spool_wire::ErrorCode;
use spool_client::{default_queue_config, Admin, Client, ClientError};
use thiserror::Error;

use crate::harness::{default_shards, sibling_spoold, HarnessError, SpooldProcess};

/// Longest measurement accepted (s).
pub const IDLE_SECONDS_MAX: f64 = 3_600.0;

/// What one run does.
#[derive(Debug, Clone)]
pub struct IdleConfig {
    /// spoold binary [default: next to this executable].
    pub spoold: Option<PathBuf>,
    /// Parent of the broker's temporary data directory.
    pub dir: PathBuf,
    pub shards: Option<u16>,
    pub partitions: u32,
    /// Pause after the queue is created, before measuring (ms).
    pub settle_ms: u64,
    /// Length of the measurement (s).
    pub seconds: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub shards: u16,
    pub partitions: u32,
    pub seconds: f64,
    /// CPU time the broker used during the measurement (s).
    pub cpu_s: f64,
    /// `cpu_s / seconds` in % of one core.
    pub core_pct: f64,
    /// Context switches of all the broker's threads per second.
    pub wakeups_per_s: f64,
    pub threads: usize,
    pub load_avg_1m: Option<f64>,
}

/// Why a run failed.
#[derive(Debug, Error)]
pub enum IdleError {
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot read {path}: {source}")]
    Proc { path: String, source: std::io::Error },
    #[error("{path}: unexpected format")]
    ProcFormat { path: String },
    #[error("--seconds {0} is outside (0, {IDLE_SECONDS_MAX}]")]
    Seconds(f64),
    #[error("spoold is not running")]
    NotRunning,
}

/// Runs one measurement.
///
/// # Errors
/// [`IdleError`] when the broker cannot be started, the queue cannot be
/// created, or `/proc` cannot be read.
pub fn run(config: &IdleConfig) -> Result<IdleReport, IdleError> {
    if !(config.seconds > 0.0 && config.seconds <= IDLE_SECONDS_MAX) {
        return Err(IdleError::Seconds(config.seconds));
    }
    let binary = match &config.spoold {
        Some(path) => path.clone(),
        None => sibling_spoold()?,
    };
    let shards = config.shards.unwrap_or_else(default_shards);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(IdleError::Runtime)?;
    let spoold = SpooldProcess::start(&binary, &config.dir, shards, "idle", 0)?;
    let result = measure(config, &spoold, shards, &runtime);
    let stopped = spoold.stop();
    let report = result?;
    stopped?;
    Ok(report)
}

fn measure(
    config: &IdleConfig,
    spoold: &SpooldProcess,
    shards: u16,
    runtime: &tokio::runtime::Runtime,
) -> Result<IdleReport, IdleError> {
    let pid = spoold.pid().ok_or(IdleError::NotRunning)?;
    let addr = spoold.addr().to_owned();
    let queue = format!("idle-{}", std::process::id());
    runtime.block_on(async {
        // The client connection is closed before the measurement starts.
        let admin = Admin::new(Client::connect(&addr).await?);
        match admin.create_queue(&queue, default_queue_config(config.partitions)).await {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => Ok(()),
            Err(error) => Err(IdleError::from(error)),
        }
    })?;
    std::thread::sleep(Duration::from_millis(config.settle_ms));
    let before = sample(pid)?;
    let started = instant_now();
    std::thread::sleep(Duration::from_secs_f64(config.seconds));
    let after = sample(pid)?;
    let seconds = instant_now().duration_since(started).as_secs_f64();
    let cpu_s = (after.cpu_ticks.saturating_sub(before.cpu_ticks)) as f64 / clock_ticks_per_s();
    Ok(IdleReport {
        shards,
        partitions: config.partitions,
        seconds,
        cpu_s,
        core_pct: 100.0 * cpu_s / seconds,
        wakeups_per_s: after.switches.saturating_sub(before.switches) as f64 / seconds,
        threads: after.threads,
        load_avg_1m: load_avg_1m(),
    })
}

struct ProcSample {
    cpu_ticks: u64,
    switches: u64,
    threads: usize,
}

fn read(path: &str) -> Result<String, IdleError> {
    std::fs::read_to_string(path)
        .map_err(|source| IdleError::Proc { path: path.to_owned(), source })
}

fn sample(pid: u32) -> Result<ProcSample, IdleError> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat = read(&stat_path)?;
    // Fields after the parenthesised command name (which may hold spaces):
    // state is field 3, utime 14 and stime 15 (1-based).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or(IdleError::ProcFormat { path: stat_path.clone() })?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |index: usize| -> Result<u64, IdleError> {
        fields
            .get(index - 3)
            .and_then(|value| value.parse().ok())
            .ok_or(IdleError::ProcFormat { path: stat_path.clone() })
    };
    let cpu_ticks = field(14)? + field(15)?;
    let task_dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&task_dir)
        .map_err(|source| IdleError::Proc { path: task_dir.clone(), source })?;
    let mut switches = 0u64;
    let mut threads = 0usize;
    for task in tasks.flatten() {
        let path = task.path().join("status");
        // A thread that exited between the listing and the read is skipped.
        let Ok(status) = std::fs::read_to_string(&path) else { continue };
        threads += 1;
        switches += status
            .lines()
            .filter(|line| line.contains("ctxt_switches:"))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(ProcSample { cpu_ticks, switches, threads })
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf with a valid name has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn load_avg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_this_process_reads_cpu_and_switches() {
        // Goal: the /proc parsing finds this process's CPU time, threads and
        // switches (a broken field index would read a constant or fail).
        // Method: sample our own pid, spin until its CPU time grows, sleep
        // five times, and check both counters moved.
        let first = sample(std::process::id()).unwrap();
        // Spin until the kernel charges at least one more clock tick (10 ms
        // at the usual 100 Hz), bounded so a broken parser cannot hang.
        let started = instant_now();
        let mut spun = 0u64;
        let burnt = loop {
            for i in 0..100_000u64 {
                spun = std::hint::black_box(spun.wrapping_mul(31).wrapping_add(i));
            }
            let now = sample(std::process::id()).unwrap();
            if now.cpu_ticks > first.cpu_ticks
                || instant_now().duration_since(started) > Duration::from_secs(10)
            {
                break now;
            }
        };
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let after = sample(std::process::id()).unwrap();
        assert!(after.threads >= 1);
        assert!(
            after.switches >= first.switches + 5,
            "slept 5 times: {} then {} switches",
            first.switches,
            after.switches
        );
        assert!(
            burnt.cpu_ticks > first.cpu_ticks,
            "spun: {} then {} ticks",
            first.cpu_ticks,
            burnt.cpu_ticks
        );
    }
}
