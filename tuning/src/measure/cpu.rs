//! The broker's CPU per message, from a short run of the real thing.
//!
//! What it owns: finding `spoold` and `spool-bench`, starting `spoold` on a
//! temporary data dir and free loopback ports, running `spool-bench
//! throughput` against it at a moderate open-loop rate, and reading the
//! broker's CPU ticks from `/proc/<pid>/stat` before and after. The broker
//! is killed by its PID when the probe ends, however it ends ([`Spoold`]'s
//! drop). What it does not do: judge the figure ([`crate::verdict`]).
//!
//! The client's CPU is read the same way, from this process's reaped
//! children's ticks (`/proc/self/stat` cutime + cstime) around the bench,
//! so a host that runs its load generator beside the broker knows both.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{CpuMeasured, Probe};
use crate::clock::instant_now;

/// Partitions of the probe's queue (as `bench/scripts/references.sh`).
pub const PROBE_PARTITIONS: u32 = 4;
/// Longest wait for a started spoold to listen on every shard port.
pub const SPOOLD_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The bench may run this much longer than its `--seconds` (start-up,
/// queue creation, shutdown) before it is killed.
pub const BENCH_GRACE: Duration = Duration::from_secs(30);
/// Free-port search attempts.
const PORT_ATTEMPTS: u32 = 100;
/// Poll interval while waiting for a child.
const POLL: Duration = Duration::from_millis(20);

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuProbeConfig {
    pub bin_dir: PathBuf,
    /// Created for the broker's data and logs; the caller removes it.
    pub dir: PathBuf,
    pub rate_msgs_per_s: u64,
    pub seconds: u64,
    pub msg_bytes: u64,
    pub shards: u16,
}

/// A started spoold, killed (SIGKILL, by its PID) and reaped on drop.
struct Spoold {
    child: Child,
}

impl Drop for Spoold {
    fn drop(&mut self) {
        // Child::kill signals this child's own PID; its data dir goes with the probe dir.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the probe; never fails: missing binaries are a skip, anything else a failure.
pub fn broker_cpu_probe(config: &CpuProbeConfig) -> Probe<CpuMeasured> {
    let spoold = config.bin_dir.join("spoold");
    let bench = config.bin_dir.join("spool-bench");
    let missing: Vec<&str> = [(&spoold, "spoold"), (&bench, "spool-bench")]
        .into_iter()
        .filter(|(path, _)| !path.is_file())
        .map(|(_, name)| name)
        .collect();
    if !missing.is_empty() {
        return Probe::Skipped {
            reason: format!(
                "{} not found in {} (build them with `cargo build --release --bin spoold --bin \
                 spool-bench`, or pass --bin-dir)",
                missing.join(" and "),
                config.bin_dir.display()
            ),
        };
    }
    match run(config, &spoold, &bench) {
        Ok(measured) => Probe::Measured { value: measured },
        Err(reason) => Probe::Failed { reason },
    }
}

fn run(
    config: &CpuProbeConfig,
    spoold_path: &Path,
    bench_path: &Path,
) -> Result<CpuMeasured, String> {
    let ticks_per_s = clock_ticks_per_s()?;
    fs::create_dir_all(&config.dir)
        .map_err(|error| format!("cannot create {}: {error}", config.dir.display()))?;
    let base_port = free_base_port(config.shards)?;
    let addr = format!("127.0.0.1:{base_port}");
    let log_path = config.dir.join("spoold.log");
    let log = fs::File::create(&log_path)
        .map_err(|error| format!("cannot create {}: {error}", log_path.display()))?;
    let child = Command::new(spoold_path)
        .arg("--data-dir")
        .arg(config.dir.join("data"))
        .arg("--listen")
        .arg(&addr)
        .arg("--admin-listen")
        .arg("off")
        .arg("--cores")
        .arg(config.shards.to_string())
        .env_remove("SPOOL_CONFIG")
        .env("SPOOL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|error| format!("cannot run {}: {error}", spoold_path.display()))?;
    let mut spoold = Spoold { child };
    wait_listening(&mut spoold, base_port, config.shards, &log_path)?;
    let pid = spoold.child.id();
    let broker_before = process_ticks(pid)?;
    let client_before = children_ticks()?;

    let out_path = config.dir.join("bench.json");
    let err_path = config.dir.join("bench.err");
    let create = |path: &Path| {
        fs::File::create(path).map_err(|error| format!("cannot create {}: {error}", path.display()))
    };
    let mut bench = Command::new(bench_path)
        .arg("throughput")
        .arg("--addr")
        .arg(&addr)
        .arg("--partitions")
        .arg(PROBE_PARTITIONS.to_string())
        .arg("--rate")
        .arg(config.rate_msgs_per_s.to_string())
        .arg("--seconds")
        .arg(config.seconds.to_string())
        .arg("--warmup-ms")
        .arg("0")
        .arg("--msg-bytes")
        .arg(config.msg_bytes.to_string())
        .stdin(Stdio::null())
        .stdout(create(&out_path)?)
        .stderr(create(&err_path)?)
        .spawn()
        .map_err(|error| format!("cannot run {}: {error}", bench_path.display()))?;
    let deadline = Duration::from_secs(config.seconds) + BENCH_GRACE;
    let started = instant_now();
    let status = loop {
        match bench.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > deadline => {
                let _ = bench.kill();
                let _ = bench.wait();
                return Err(format!("spool-bench still running after {deadline:?}; killed"));
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(error) => return Err(format!("waiting for spool-bench: {error}")),
        }
    };
    let broker_after = process_ticks(pid)?;
    let client_after = children_ticks()?;
    drop(spoold);
    if !status.success() {
        let stderr = fs::read_to_string(&err_path).unwrap_or_default();
        return Err(format!("spool-bench exited with {status}: {}", tail(&stderr)));
    }
    let report = fs::read_to_string(&out_path)
        .map_err(|error| format!("cannot read {}: {error}", out_path.display()))?;
    let (enqueued, acked) = parse_bench_counts(&report)?;
    if enqueued == 0 {
        return Err("spool-bench enqueued no message".to_owned());
    }
    let broker_cpu_s = broker_after.saturating_sub(broker_before) as f64 / ticks_per_s;
    let client_cpu_s = client_after.saturating_sub(client_before) as f64 / ticks_per_s;
    Ok(CpuMeasured {
        rate_msgs_per_s: config.rate_msgs_per_s,
        seconds: config.seconds,
        shards: config.shards,
        partitions: PROBE_PARTITIONS,
        msg_bytes: config.msg_bytes,
        enqueued,
        acked,
        achieved_msgs_per_s: enqueued as f64 / config.seconds as f64,
        broker_cpu_s,
        broker_cpu_us_per_msg: broker_cpu_s * 1e6 / enqueued as f64,
        client_cpu_us_per_msg: client_cpu_s * 1e6 / enqueued as f64,
        spoold: spoold_path.display().to_string(),
        spool_bench: bench_path.display().to_string(),
    })
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

fn wait_listening(
    spoold: &mut Spoold,
    base_port: u16,
    shards: u16,
    log_path: &Path,
) -> Result<(), String> {
    let started = instant_now();
    for port in base_port..base_port + shards {
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = spoold.child.try_wait() {
                let log = fs::read_to_string(log_path).unwrap_or_default();
                return Err(format!("spoold exited with {status} while starting: {}", tail(&log)));
            }
            if started.elapsed() > SPOOLD_START_TIMEOUT {
                return Err(format!(
                    "spoold not listening on {port} after {SPOOLD_START_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(())
}

/// A run of `count` consecutive free loopback ports (spoold listens on
/// base + shard index).
fn free_base_port(count: u16) -> Result<u16, String> {
    for _ in 0..PORT_ATTEMPTS {
        let Ok(probe) = TcpListener::bind("127.0.0.1:0") else { continue };
        let Ok(local) = probe.local_addr() else { continue };
        drop(probe);
        let base = local.port();
        if u32::from(base) + u32::from(count) > u32::from(u16::MAX) {
            continue;
        }
        if (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return Ok(base);
        }
    }
    Err(format!("no {count} consecutive free loopback ports in {PORT_ATTEMPTS} tries"))
}

fn clock_ticks_per_s() -> Result<f64, String> {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return Err("sysconf(_SC_CLK_TCK) gave no clock tick rate".to_owned());
    }
    Ok(ticks as f64)
}

fn read_stat(path: &str) -> Result<String, String> {
    fs::read_to_string(path).map_err(|error| format!("{path}: {error}"))
}

/// utime + stime of `pid` (all its threads), in clock ticks.
fn process_ticks(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = read_stat(&path)?;
    stat_ticks(&text, StatTicks::Own).ok_or_else(|| format!("{path}: unreadable: {text:?}"))
}

/// cutime + cstime of this process: CPU of the children it has reaped.
fn children_ticks() -> Result<u64, String> {
    let text = read_stat("/proc/self/stat")?;
    stat_ticks(&text, StatTicks::ReapedChildren)
        .ok_or_else(|| format!("/proc/self/stat: unreadable: {text:?}"))
}

/// Which pair of `/proc/<pid>/stat` CPU fields to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatTicks {
    /// utime + stime (fields 14 and 15).
    Own,
    /// cutime + cstime (fields 16 and 17).
    ReapedChildren,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses
/// and may hold spaces or parentheses itself, so fields are counted after
/// the last `)`.
pub fn stat_ticks(text: &str, which: StatTicks) -> Option<u64> {
    let after_name = &text[text.rfind(')')? + 1..];
    // after_name starts at field 3 (state).
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let (first, second) = match which {
        StatTicks::Own => (14, 15),
        StatTicks::ReapedChildren => (16, 17),
    };
    let field = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
    field(first)?.checked_add(field(second)?)
}

/// (enqueued, acked) from `spool-bench throughput`'s JSON report.
pub fn parse_bench_counts(report: &str) -> Result<(u64, u64), String> {
    let value: serde_json::Value = serde_json::from_str(report)
        .map_err(|error| format!("spool-bench output is not JSON: {error}"))?;
    let count = |pointer: &str| {
        value
            .pointer(pointer)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("spool-bench output has no {pointer}"))
    };
    Ok((count("/enqueue/count")?, count("/claim_ack/acked")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: CPU ticks are read from the right fields even when the command
    // name holds spaces and parentheses. Method: a fabricated stat line.
    #[test]
    fn stat_ticks_counts_fields_after_the_name() {
        let line = "4242 (spo (ol) d) S 1 2 3 4 5 6 7 8 9 10 111 222 333 444 20 0 9 0 100 \
                    200 300";
        assert_eq!(stat_ticks(line, StatTicks::Own), Some(333));
        assert_eq!(stat_ticks(line, StatTicks::ReapedChildren), Some(777));
        assert_eq!(stat_ticks("no name here", StatTicks::Own), None);
        assert_eq!(stat_ticks("1 (x) S 1 2", StatTicks::Own), None);
        let own = read_stat("/proc/self/stat").unwrap();
        assert!(stat_ticks(&own, StatTicks::Own).is_some(), "{own}");
    }

    // Goal: the counts come from the throughput report's fields.
    // Method: a minimal report, and one without them.
    #[test]
    fn bench_counts_parse() {
        let report = r#"{"enqueue": {"count": 15000}, "claim_ack": {"acked": 14990}}"#;
        assert_eq!(parse_bench_counts(report), Ok((15_000, 14_990)));
        assert!(parse_bench_counts(r#"{"enqueue": {}}"#).unwrap_err().contains("/enqueue/count"));
        assert!(parse_bench_counts("not json").is_err());
    }

    // Goal: without the binaries the probe is a clean skip naming what is
    // missing and where, and starts nothing. Method: an empty bin dir.
    #[test]
    fn skipped_without_binaries() {
        let dir = tempfile::tempdir().unwrap();
        let probe = broker_cpu_probe(&CpuProbeConfig {
            bin_dir: dir.path().to_path_buf(),
            dir: dir.path().join("broker"),
            rate_msgs_per_s: 5_000,
            seconds: 1,
            msg_bytes: 1638,
            shards: 1,
        });
        let Probe::Skipped { reason } = probe else { panic!("{probe:?}") };
        assert!(reason.contains("spoold and spool-bench not found"), "{reason}");
        assert!(reason.contains(&dir.path().display().to_string()), "{reason}");
        assert!(!dir.path().join("broker").exists());
    }
}
