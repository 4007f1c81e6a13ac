//! The broker side of the client benchmarks: a `spoold` child process on a
//! temporary directory and free loopback ports; and what every client
//! scenario shares on its own side: the runtime its clients run on and the
//! names the reports give client and consumer errors.
//!
//! What it owns: [`SpooldProcess`] (start, wait until every shard listens,
//! SIGTERM and a bounded wait, directory removal; killed and removed on drop
//! if a run fails first) and [`Broker`] (that process, or an address the
//! user gave). What it does not do: create queues or generate load — the
//! scenarios do that through `spool-client`. Factored out of `throughput`
//! so every scenario starts and stops brokers the same way.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use spool_broker::clock::instant_now;
use spool_client::{ClientError, ConsumerStats};
use thiserror::Error;

/// Segment size of a spoold this benchmark starts (bytes).
pub const SPOOLD_SEGMENT_BYTES: u64 = 64 << 20;
/// How long a started spoold may take to listen on every shard port.
pub const SPOOLD_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long spoold may take to drain after SIGTERM before it is killed.
pub const SPOOLD_STOP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// Characters of spoold's log quoted in a start failure.
const LOG_TAIL_BYTES: usize = 4_000;

/// Why a broker could not be started or stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HarnessError {
    #[error("{action} {}: {source}", path.display())]
    Dir {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spoold: {0}")]
    Spoold(String),
}

/// The CPUs this process may use, as a shard count.
pub fn default_shards() -> u16 {
    std::thread::available_parallelism()
        .map_or(1, |count| u16::try_from(count.get()).unwrap_or(u16::MAX))
}

/// The broker a run talks to: one it started, or one at a given address.
pub struct Broker {
    spoold: Option<SpooldProcess>,
    addr: String,
}

impl Broker {
    /// `addr` if given; otherwise a `spoold` (`binary`, or the one next to
    /// this executable) started under `dir` with `shards` shards and
    /// `--spin-before-park-us` `spin_before_park_us`.
    ///
    /// # Errors
    /// See [`SpooldProcess::start`] and [`sibling_spoold`].
    pub fn start_or_connect(
        addr: Option<&str>,
        binary: Option<&Path>,
        dir: &Path,
        shards: u16,
        label: &str,
        spin_before_park_us: u64,
    ) -> Result<Self, HarnessError> {
        Self::start_or_connect_with_args(addr, binary, dir, shards, label, spin_before_park_us, &[])
    }

    /// [`start_or_connect`](Self::start_or_connect), a started spoold
    /// getting `extra_args` after its own (e.g. `--journal-retain-bytes 0`).
    ///
    /// # Errors
    /// See [`SpooldProcess::start`] and [`sibling_spoold`].
    pub fn start_or_connect_with_args(
        addr: Option<&str>,
        binary: Option<&Path>,
        dir: &Path,
        shards: u16,
        label: &str,
        spin_before_park_us: u64,
        extra_args: &[String],
    ) -> Result<Self, HarnessError> {
        if let Some(addr) = addr {
            return Ok(Self { spoold: None, addr: addr.to_owned() });
        }
        let binary = match binary {
            Some(path) => path.to_owned(),
            None => sibling_spoold()?,
        };
        let process = SpooldProcess::start_with_args(
            &binary,
            dir,
            shards,
            label,
            spin_before_park_us,
            extra_args,
        )?;
        let addr = process.addr().to_owned();
        Ok(Self { spoold: Some(process), addr })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether this run started the broker (and will stop it).
    pub fn started(&self) -> bool {
        self.spoold.is_some()
    }

    /// Stops a started broker; nothing for a given address.
    ///
    /// # Errors
    /// See [`SpooldProcess::stop`].
    pub fn stop(self) -> Result<(), HarnessError> {
        self.spoold.map(SpooldProcess::stop).transpose().map(|_| ())
    }
}

pub fn sibling_spoold() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(|source| HarnessError::Dir {
        action: "cannot locate",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let path = exe.with_file_name("spoold");
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Spoold(format!(
            "{} not found (build it: cargo build --release -p spool-broker --bin spoold, or pass \
             --spoold PATH or --addr)",
            path.display()
        )))
    }
}

/// A `spoold` child on a temporary data dir; stopped (SIGTERM) and its dir
/// removed by [`stop`](Self::stop), or killed and removed on drop.
pub struct SpooldProcess {
    child: Option<Child>,
    dir: PathBuf,
    addr: String,
}

impl SpooldProcess {
    /// Starts `binary` on `parent/spool-bench-<label>-<pid>/` with `shards`
    /// shards (glommio `spin_before_park` of `spin_before_park_us`, 0 = off)
    /// on free loopback ports and waits until every shard listens.
    ///
    /// # Errors
    /// The directory cannot be made, no free ports, or spoold exits or does
    /// not listen within [`SPOOLD_START_TIMEOUT`].
    pub fn start(
        binary: &Path,
        parent: &Path,
        shards: u16,
        label: &str,
        spin_before_park_us: u64,
    ) -> Result<Self, HarnessError> {
        Self::start_with_args(binary, parent, shards, label, spin_before_park_us, &[])
    }

    /// [`start`](Self::start) with `extra_args` after spoold's own.
    ///
    /// # Errors
    /// See [`start`](Self::start).
    pub fn start_with_args(
        binary: &Path,
        parent: &Path,
        shards: u16,
        label: &str,
        spin_before_park_us: u64,
        extra_args: &[String],
    ) -> Result<Self, HarnessError> {
        let dir = parent.join(format!("spool-bench-{label}-{}", std::process::id()));
        let dir_error = |action, source| HarnessError::Dir { action, path: dir.clone(), source };
        std::fs::create_dir_all(&dir).map_err(|source| dir_error("cannot create", source))?;
        let log_path = dir.join("spoold.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|source| dir_error("cannot create the log in", source))?;
        let base_port = free_base_port(shards)?;
        let addr = format!("127.0.0.1:{base_port}");
        let child = Command::new(binary)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--listen")
            .arg(&addr)
            .arg("--cores")
            .arg(shards.to_string())
            .arg("--segment-bytes")
            .arg(SPOOLD_SEGMENT_BYTES.to_string())
            .arg("--spin-before-park-us")
            .arg(spin_before_park_us.to_string())
            .args(extra_args)
            .env_remove("SPOOL_CONFIG")
            .env("SPOOL_LOG", "warn")
            // Benchmarks run several brokers side by side; none needs metrics.
            .env("SPOOL_ADMIN_LISTEN", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| {
                HarnessError::Spoold(format!("cannot run {}: {error}", binary.display()))
            })?;
        let mut process = Self { child: Some(child), dir, addr };
        process.wait_listening(base_port, shards)?;
        Ok(process)
    }

    /// Polls every shard port until it accepts; fails if spoold exits.
    fn wait_listening(&mut self, base_port: u16, shards: u16) -> Result<(), HarnessError> {
        let start = instant_now();
        for port in base_port..base_port + shards {
            loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break;
                }
                if let Some(child) = self.child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(HarnessError::Spoold(format!(
                            "exited with {status} while starting: {}",
                            self.log_tail()
                        )));
                    }
                }
                if instant_now().duration_since(start) > SPOOLD_START_TIMEOUT {
                    return Err(HarnessError::Spoold(format!(
                        "port {port} not listening after {SPOOLD_START_TIMEOUT:?}: {}",
                        self.log_tail()
                    )));
                }
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("spoold.log")) {
            let _ = file.read_to_string(&mut text);
        }
        let mut start = text.len().saturating_sub(LOG_TAIL_BYTES);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].trim().to_owned()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The bootstrap address (`127.0.0.1:<base port>`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// SIGTERM, wait for a clean exit (bounded), remove the dir.
    ///
    /// # Errors
    /// A non-zero exit, no exit within [`SPOOLD_STOP_TIMEOUT`] (then it is
    /// killed), or a directory that cannot be removed.
    pub fn stop(mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| HarnessError::Spoold("pid out of range".to_owned()))?;
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = instant_now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if instant_now().duration_since(start) < SPOOLD_STOP_TIMEOUT => {
                    std::thread::sleep(POLL);
                }
                _ => break None,
            }
        };
        let outcome = match status {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(HarnessError::Spoold(format!(
                "exited with {status} after SIGTERM: {}",
                self.log_tail()
            ))),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(HarnessError::Spoold(format!(
                    "still running {SPOOLD_STOP_TIMEOUT:?} after SIGTERM; killed"
                )))
            }
        };
        std::fs::remove_dir_all(&self.dir).map_err(|source| HarnessError::Dir {
            action: "cannot remove",
            path: self.dir.clone(),
            source,
        })?;
        outcome
    }
}

impl Drop for SpooldProcess {
    fn drop(&mut self) {
        // Only on an error path: `stop` took the child already.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A base port whose next `count` ports are free right now (spoold refuses
/// port 0: shard i listens on base + i).
fn free_base_port(count: u16) -> Result<u16, HarnessError> {
    const ATTEMPTS: u32 = 100;
    for _ in 0..ATTEMPTS {
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
    Err(HarnessError::Spoold(format!("no {count} consecutive free ports in {ATTEMPTS} tries")))
}

/// A stable name for an error: the wire code when there is one.
pub fn error_name(error: &ClientError) -> &'static str {
    if let Some(code) = error.code() {
        return code.name();
    }
    match error {
        ClientError::Io { .. } => "IO",
        ClientError::ConnectionClosed { .. } => "CONNECTION_CLOSED",
        ClientError::Protocol(_) => "PROTOCOL",
        ClientError::Record(_) => "RECORD",
        ClientError::Config(_) => "CONFIG",
        ClientError::Shutdown => "SHUTDOWN",
        _ => "OTHER",
    }
}

/// Adds the consumers' failure counts to a report's `errors` under the names
/// every report uses (`consumer.claim_failed`, `consumer.settle_failed`,
/// `consumer.extend_failed`), leaving out the zeros.
pub fn add_consumer_errors(errors: &mut BTreeMap<String, u64>, stats: &ConsumerStats) {
    for (name, count) in [
        ("consumer.claim_failed", stats.claim_failed),
        ("consumer.settle_failed", stats.settle_failed),
        ("consumer.extend_failed", stats.extend_failed),
    ] {
        if count > 0 {
            errors.insert(name.to_owned(), count);
        }
    }
}

/// The tokio runtime every client of a run shares: `threads` workers (at
/// least one) named `bench-client`.
///
/// # Errors
/// The runtime's own, when its threads cannot be started.
pub fn client_runtime(threads: u64) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::try_from(threads).unwrap_or(1).max(1))
        .thread_name("bench-client")
        .enable_all()
        .build()
}
