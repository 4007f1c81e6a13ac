//! Harness for end-to-end tests: real `spoold` processes on loopback.
//!
//! Owns the life of the brokers a test starts ([`Spoold`]): a temporary data
//! directory, a run of free consecutive ports (shard `i` listens on
//! `base + i`), the child process, and its log file (stdout and stderr,
//! appended across restarts, printed when a test fails). A broker is stopped
//! with SIGTERM ([`Spoold::terminate`]) or SIGKILL ([`Spoold::kill`]) and
//! restarted on the same directory and ports ([`Spoold::restart`]). Dropping
//! a [`Spoold`] kills its process, and only it; the child also gets
//! `PR_SET_PDEATHSIG`, so a test process killed by nextest's timeout does not
//! leave a broker behind (every broker is forked by one lasting thread, since
//! that signal follows the forking thread, not the process).
//!
//! It also finds the binaries under test ([`spoold_bin`], [`spool_bin`]):
//! the workspace's `target/<profile>/` next to the test executable, built once
//! per test process with `cargo build` so a test never runs a stale broker.
//!
//! It does not assert anything about the broker; the tests in `tests/e2e/`
//! do. Everything binds 127.0.0.1 only.

pub mod admin;
pub mod auth;
pub mod cluster;
pub mod events;
pub mod fault;
pub mod killloop;
pub mod netcut;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use spool_client::spool_wire::proto::{Backoff, BackoffKind, QueueConfig};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Client, ClientConfig, ClientError, ConnectionConfig};
use tempfile::TempDir;

/// Segment size the tests run with: the smallest the broker accepts, so
/// pre-zeroing a partition's segment costs little.
pub const SEGMENT_BYTES_TEST: u64 = 8 << 20;

/// The start-up timeout every test broker is given (`--startup-timeout-ms`):
/// the broker's own default (`STARTUP_TIMEOUT_MS_DEFAULT`), so a test
/// broker recovers under the budget a production one has.
pub const BROKER_STARTUP_TIMEOUT_MS: u64 = 120_000;

/// How much longer than [`BROKER_STARTUP_TIMEOUT_MS`] the harness waits
/// for a broker to accept: a broker that cannot start in its budget exits
/// on its own (exit 9) and is reported as such, never cut short by a
/// harness that gave up first.
pub const START_MARGIN: Duration = Duration::from_secs(5);

/// How long a broker may take to accept on every shard port: its own
/// start-up timeout plus [`START_MARGIN`].
pub const START_TIMEOUT: Duration =
    Duration::from_millis(BROKER_STARTUP_TIMEOUT_MS + START_MARGIN.as_millis() as u64);

/// How long a SIGTERMed broker may take to drain and exit.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stopped broker's ports may stay busy before a restart gives up.
pub const PORTS_RELEASE_TIMEOUT: Duration = Duration::from_secs(15);

/// How many times a first start is retried when the reserved ports were
/// taken by someone else between the probe and the bind.
const START_ATTEMPTS_MAX: u32 = 3;

/// How many random port runs are probed before giving up.
const PORT_PROBES_MAX: u32 = 200;

/// Most bytes of a broker log printed when a test fails (the tail).
const LOG_PRINT_BYTES_MAX: usize = 64 * 1024;

/// Environment variable naming a prebuilt `spoold` (skips the build).
pub const SPOOLD_BIN_ENV: &str = "SPOOL_E2E_SPOOLD";

/// Environment variable naming a prebuilt `spool` CLI (skips the build).
pub const SPOOL_BIN_ENV: &str = "SPOOL_E2E_SPOOL";

/// Wall-clock now. Tests measure real time (leases, timeouts); the broker's
/// own clock rule (one `clock.rs`) is about the broker, not this harness.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// The workspace's `target/<profile>` directory holding this test executable.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/e2e-<hash>: two levels up is target/<profile>.
    let deps = exe.parent().expect("test executable has a directory");
    let profile = if deps.file_name().is_some_and(|name| name == "deps") {
        deps.parent().expect("deps has a parent")
    } else {
        deps
    };
    profile.to_path_buf()
}

/// Runs `cargo build --quiet` of this workspace with `args`, into the
/// target directory that holds `profile_dir` and with its profile (`debug`,
/// `release`, or a custom one); `what` names the binaries in the error,
/// which carries cargo's stderr.
fn cargo_build(what: &str, profile_dir: &Path, args: &[&str]) -> Result<(), String> {
    let target_dir = profile_dir.parent().expect("profile dir has a parent");
    let profile = profile_dir.file_name().and_then(|name| name.to_str()).unwrap_or("debug");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.current_dir(workspace).args(["build", "--quiet"]).args(args);
    command.arg("--target-dir").arg(target_dir);
    match profile {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    let output = command.output().map_err(|error| format!("running cargo: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build ({profile}) of {what} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `profile_dir/name` once `built` succeeded; panics with the build's error
/// or when the binary is missing after it.
fn built_binary(built: &Result<(), String>, profile_dir: &Path, name: &str) -> PathBuf {
    if let Err(error) = built {
        panic!("{error}");
    }
    let path = profile_dir.join(name);
    assert!(path.is_file(), "{} is missing after the build", path.display());
    path
}

/// Builds `spoold` and `spool` once per test process with the same profile
/// and target directory as the tests, so the binaries match the sources.
fn build_binaries() -> &'static Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        if std::env::var_os(SPOOLD_BIN_ENV).is_some() && std::env::var_os(SPOOL_BIN_ENV).is_some() {
            return Ok(());
        }
        let args =
            ["-p", "spool-broker", "--bin", "spoold", "-p", "spool-client", "--bin", "spool"];
        cargo_build("spoold/spool", &profile_dir(), &args)
    })
}

fn binary(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    built_binary(build_binaries(), &profile_dir(), name)
}

/// Environment variable naming a directory that holds prebuilt release
/// `spoold` and `spool` (skips the release build; `scripts/test.sh` sets it
/// after building them, so no test runs cargo itself).
pub const RELEASE_DIR_ENV: &str = "SPOOL_E2E_RELEASE_DIR";

/// Path of a release binary (`spoold` or `spool`) as the README's `cargo
/// run --release` commands build it: `target/release/NAME` of this
/// workspace, built once per test process (a no-op when `scripts/test.sh`
/// built it already, as it does before the tests).
pub fn release_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Some(dir) = std::env::var_os(RELEASE_DIR_ENV) {
        let path = PathBuf::from(dir).join(name);
        assert!(path.is_file(), "{} (from {RELEASE_DIR_ENV}) is missing", path.display());
        return path;
    }
    let release_dir = profile_dir().parent().expect("profile dir has a parent").join("release");
    let built = BUILT.get_or_init(|| {
        let args = [
            "--locked",
            "-p",
            "spool-broker",
            "--bin",
            "spoold",
            "-p",
            "spool-client",
            "--bin",
            "spool",
        ];
        cargo_build("spoold/spool", &release_dir, &args)
    });
    built_binary(built, &release_dir, name)
}

/// Environment variable naming a prebuilt `spoold-failpoints`.
pub const SPOOLD_FAILPOINTS_BIN_ENV: &str = "SPOOL_E2E_SPOOLD_FAILPOINTS";

/// Environment variable a failpoint build of `spoold` reads its armed
/// points from (`spool_broker::failpoint`).
pub const FAILPOINTS_ENV: &str = "SPOOL_FAILPOINTS";

/// Path of `spoold-failpoints` (spoold with the `failpoints` feature),
/// built once per test process with the tests' profile and target dir. A
/// separate binary, so the ordinary `spoold` other tests run never carries
/// the hooks.
pub fn spoold_failpoints_bin() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Some(path) = std::env::var_os(SPOOLD_FAILPOINTS_BIN_ENV) {
        return PathBuf::from(path);
    }
    let built = BUILT.get_or_init(|| {
        let args = ["-p", "spool-broker", "--features", "failpoints", "--bin", "spoold-failpoints"];
        cargo_build("spoold-failpoints", &profile_dir(), &args)
    });
    built_binary(built, &profile_dir(), "spoold-failpoints")
}

/// Reads one whole frame (its 4-byte length prefix included) from a
/// blocking stream, for tests that speak the wire protocol by hand.
///
/// # Errors
/// The stream's read error (a timeout, a closed connection).
pub fn read_frame_bytes(stream: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix)?;
    let len = u32::from_le_bytes(prefix) as usize;
    let mut bytes = prefix.to_vec();
    bytes.resize(len.max(4), 0);
    stream.read_exact(&mut bytes[4..])?;
    Ok(bytes)
}

/// [`read_frame_bytes`] into an 8-aligned buffer, so the frame decodes
/// in place (`decode_frame`, then `Response::decode`).
pub fn read_frame_aligned(
    stream: &mut impl Read,
) -> std::io::Result<spool_client::spool_wire::batch::BatchBytes> {
    let bytes = read_frame_bytes(stream)?;
    let mut aligned = spool_client::spool_wire::batch::BatchBytes::with_capacity(bytes.len());
    aligned.extend_from_slice(&bytes);
    Ok(aligned)
}

/// Path of the `spoold` binary under test.
pub fn spoold_bin() -> PathBuf {
    binary("spoold", SPOOLD_BIN_ENV)
}

/// Path of the `spool` CLI under test.
pub fn spool_bin() -> PathBuf {
    binary("spool", SPOOL_BIN_ENV)
}

/// A base port such that `base..base + count` are all free on 127.0.0.1
/// right now. The kernel picks the base (bind to port 0), so parallel test
/// processes rarely collide; the caller retries if the broker's bind fails.
pub fn reserve_ports(count: u16) -> u16 {
    assert!(count > 0);
    for _ in 0..PORT_PROBES_MAX {
        let Ok(probe) = TcpListener::bind("127.0.0.1:0") else { continue };
        let Ok(local) = probe.local_addr() else { continue };
        let base = local.port();
        if u32::from(base) + u32::from(count) > u32::from(u16::MAX) {
            continue;
        }
        let mut held = vec![probe];
        let all_free = (1..count).all(|offset| {
            TcpListener::bind(("127.0.0.1", base + offset))
                .map(|listener| held.push(listener))
                .is_ok()
        });
        drop(held);
        if all_free {
            return base;
        }
    }
    panic!("no run of {count} free ports on 127.0.0.1 after {PORT_PROBES_MAX} probes");
}

pub(crate) fn send_signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own
    // child, not yet waited for, so it cannot have been reused.
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
}

/// Waits for `child` to exit, up to `timeout`.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let started = now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if started.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How a [`Spoold`] is started: everything a fault test may vary. The
/// defaults are the e2e settings ([`SpooldOptions::new`]).
#[derive(Debug, Clone)]
pub struct SpooldOptions {
    /// Shards (`--cores`).
    pub cores: u16,
    /// `--segment-bytes`.
    pub segment_bytes: u64,
    /// More `spoold` flags, appended after the test settings (a later flag
    /// wins).
    pub args: Vec<String>,
    /// Environment of the process (every other `SPOOL_*` variable of the
    /// test environment is removed).
    pub env: Vec<(String, String)>,
    /// A `spoold` binary other than [`spoold_bin`] (a failpoint build).
    pub bin: Option<PathBuf>,
    /// A data directory outside the broker's temporary root (a loop-mounted
    /// file system); it must exist and outlive the broker.
    pub data_dir: Option<PathBuf>,
    /// The soft RLIMIT_NOFILE the process starts with (its hard limit
    /// unchanged); `None`: the test process's own.
    pub nofile_soft: Option<u64>,
}

impl SpooldOptions {
    /// The e2e settings with `cores` shards.
    pub fn new(cores: u16) -> Self {
        Self {
            cores,
            segment_bytes: SEGMENT_BYTES_TEST,
            args: Vec::new(),
            env: Vec::new(),
            bin: None,
            data_dir: None,
            nofile_soft: None,
        }
    }

    /// Sets (or replaces) one environment variable of the next start.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.env.retain(|(existing, _)| existing != name);
        self.env.push((name.to_owned(), value.to_owned()));
    }

    /// Removes one environment variable from the next start.
    pub fn remove_env(&mut self, name: &str) {
        self.env.retain(|(existing, _)| existing != name);
    }
}

/// Spawns `command` from a thread that lives as long as the test process.
///
/// The broker's command sets `PR_SET_PDEATHSIG`, which fires when the
/// *thread* that forked the child exits, not the process. A start made on a
/// pooled thread (tokio's `spawn_blocking`, whose idle threads exit after
/// 10 s) would have its broker SIGKILLed some seconds later, in the middle
/// of a test: the kill loop's final drain over a 256-partition queue found
/// both shard ports refusing that way. One lasting spawner thread forks
/// every broker instead.
pub(crate) fn spawn_lasting(command: Command) -> std::io::Result<Child> {
    type Request = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = std::sync::mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("spoold-spawner".to_owned())
            .spawn(move || {
                for (mut command, answer) in incoming {
                    // The asker may have given up (a panicking test).
                    let _ = answer.send(command.spawn());
                }
            })
            .expect("start the spawner thread");
        std::sync::Mutex::new(requests)
    });
    let (answer, answered) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, answer))
        .expect("the spawner thread lives as long as the process");
    answered.recv().expect("the spawner thread answers every request")
}

/// The command that runs `spoold` with the test settings.
fn spoold_command(data_dir: &Path, base_port: u16, options: &SpooldOptions, log: &File) -> Command {
    let bin = options.bin.clone().unwrap_or_else(spoold_bin);
    let mut command = Command::new(bin);
    command
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{base_port}"))
        .arg("--cores")
        .arg(options.cores.to_string())
        .arg("--segment-bytes")
        .arg(options.segment_bytes.to_string())
        .arg("--startup-timeout-ms")
        .arg(BROKER_STARTUP_TIMEOUT_MS.to_string())
        .arg("--admin-listen")
        .arg(format!("127.0.0.1:{}", base_port + options.cores))
        .args(["--log-format", "human"])
        .args(&options.args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone log file"))
        .stderr(log.try_clone().expect("clone log file"));
    // The test environment must not configure the broker behind our back.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|name| name.starts_with("SPOOL_")) {
            command.env_remove(name);
        }
    }
    for (name, value) in &options.env {
        command.env(name, value);
    }
    let nofile_soft = options.nofile_soft;
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only prctl(2), getrlimit(2) and setrlimit(2), which are
    // async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(soft) = nofile_soft {
                let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                limit.rlim_cur = soft as libc::rlim_t;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command
}

/// One `spoold` process under test and the directory it owns.
pub struct Spoold {
    root: TempDir,
    base_port: u16,
    options: SpooldOptions,
    child: Option<Child>,
    starts: u32,
}

impl std::fmt::Debug for Spoold {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Spoold")
            .field("dir", &self.root.path())
            .field("base_port", &self.base_port)
            .field("cores", &self.options.cores)
            .field("pid", &self.pid())
            .finish()
    }
}

/// `spoold`'s exit code when a port is taken (`FatalReason::PortInUse`).
pub(crate) const EXIT_PORT_IN_USE: i32 = 5;

/// A broker that did not come up: how it ended and its log.
#[derive(Debug)]
pub struct StartFailed {
    /// Exit status, or `None` when it did not accept within
    /// [`START_TIMEOUT`] (it was killed).
    pub status: Option<ExitStatus>,
    /// Its log (stdout and stderr).
    pub log: String,
}

impl std::fmt::Display for StartFailed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => {
                write!(formatter, "spoold exited during start ({status}):\n{}", self.log)
            }
            None => {
                write!(formatter, "spoold did not accept within {START_TIMEOUT:?}:\n{}", self.log)
            }
        }
    }
}

/// Why a start did not come up.
enum StartFailure {
    /// The process exited before it accepted.
    Exited(ExitStatus),
    /// It did not accept within [`START_TIMEOUT`].
    Timeout,
}

impl Spoold {
    /// Starts a broker with `cores` shards on a fresh directory and free
    /// ports, and waits until every shard accepts.
    pub fn start(cores: u16) -> Self {
        Self::start_with(SpooldOptions::new(cores))
    }

    /// [`start`](Self::start) with other settings.
    pub fn start_with(options: SpooldOptions) -> Self {
        match Self::try_start_with(options) {
            Ok(broker) => broker,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// Starts a broker that may refuse to start (a fault test expects it
    /// to exit). A broker that exits during its start is reported with its
    /// status and log instead of a panic; a port taken by someone else
    /// between probe and bind (exit code 5) is retried on other ports.
    ///
    /// # Errors
    /// The exit status (or `None` for a start timeout) and the log.
    pub fn try_start_with(options: SpooldOptions) -> Result<Self, StartFailed> {
        let root = tempfile::Builder::new().prefix("spool-e2e-").tempdir().expect("tempdir");
        let cores = options.cores;
        let mut broker = Self { root, base_port: 0, options, child: None, starts: 0 };
        for attempt in 1..=START_ATTEMPTS_MAX {
            // One more port after the shards' for the admin port.
            broker.base_port = reserve_ports(cores + 1);
            match broker.spawn_and_wait() {
                Ok(()) => return Ok(broker),
                Err(StartFailure::Exited(status))
                    if attempt < START_ATTEMPTS_MAX && status.code() == Some(EXIT_PORT_IN_USE) =>
                {
                    eprintln!(
                        "spoold exited during start ({status}); retrying on other ports\n{}",
                        broker.log_tail()
                    );
                }
                Err(StartFailure::Exited(status)) => {
                    return Err(StartFailed { status: Some(status), log: broker.log() })
                }
                Err(StartFailure::Timeout) => {
                    return Err(StartFailed { status: None, log: broker.log() })
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// The settings of the next (re)start; change them between a stop and
    /// [`restart`](Self::restart).
    pub fn options_mut(&mut self) -> &mut SpooldOptions {
        &mut self.options
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.options.data_dir.clone().unwrap_or_else(|| self.root.path().join("data"))
    }

    /// Resident memory of the running process (`VmRSS` of
    /// `/proc/PID/status`), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Waits up to `timeout` for the running process to exit on its own
    /// (an aborting failpoint, a fatal error); returns its status, or
    /// `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("spoold is not running");
        let status = wait_timeout(child, timeout)?;
        self.child = None;
        Some(status)
    }

    /// Sends `signal` to the running process without waiting.
    pub fn signal(&self, signal: libc::c_int) {
        send_signal(self.child.as_ref().expect("spoold is not running"), signal);
    }

    /// The log file (stdout and stderr of every start).
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("spoold.log")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        read_log(&self.log_path())
    }

    fn log_tail(&self) -> String {
        tail(&self.log(), LOG_PRINT_BYTES_MAX)
    }

    /// Shard count.
    pub fn cores(&self) -> u16 {
        self.options.cores
    }

    /// Port of shard `shard`.
    pub fn port(&self, shard: u16) -> u16 {
        assert!(shard < self.options.cores);
        self.base_port + shard
    }

    /// `127.0.0.1:port` of shard `shard`.
    pub fn shard_addr(&self, shard: u16) -> String {
        format!("127.0.0.1:{}", self.port(shard))
    }

    /// `127.0.0.1:port` of the admin port (HTTP: metrics and health): the
    /// port after the last shard's, unless `args` moved or turned it off.
    pub fn admin_addr(&self) -> String {
        format!("127.0.0.1:{}", self.base_port + self.options.cores)
    }

    /// The bootstrap address (shard 0).
    pub fn addr(&self) -> String {
        self.shard_addr(0)
    }

    /// The running process id, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many times the process was started (1 after [`start`](Self::start)).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    fn open_log(&self) -> File {
        OpenOptions::new().create(true).append(true).open(self.log_path()).expect("open log file")
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        assert!(self.child.is_none(), "spoold already running");
        let log = self.open_log();
        let command = spoold_command(&self.data_dir(), self.base_port, &self.options, &log);
        let child = spawn_lasting(command).expect("spawn spoold");
        self.starts += 1;
        self.child = Some(child);
        let started = now();
        loop {
            let child = self.child.as_mut().expect("child just spawned");
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Err(StartFailure::Exited(status));
            }
            let accepting = (0..self.options.cores).all(|shard| {
                let addr: SocketAddr = self.shard_addr(shard).parse().expect("socket address");
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            });
            if accepting {
                return Ok(());
            }
            if started.elapsed() >= START_TIMEOUT {
                return Err(StartFailure::Timeout);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every shard port can be bound again, as spoold's own
    /// port check does. The kernel tears down a dead process's io_uring (and
    /// the listening sockets registered with it) asynchronously, so the
    /// ports stay busy for a moment after the process is gone.
    fn wait_ports_free(&self) {
        let started = now();
        loop {
            // The shard ports and the admin port after them.
            let free = (0..=self.options.cores)
                .all(|port| TcpListener::bind(("127.0.0.1", self.base_port + port)).is_ok());
            if free {
                let waited = started.elapsed();
                if waited > Duration::from_millis(100) {
                    eprintln!("ports of the stopped spoold were busy for {waited:?}");
                }
                return;
            }
            assert!(
                started.elapsed() < PORTS_RELEASE_TIMEOUT,
                "ports {}..{} still busy {PORTS_RELEASE_TIMEOUT:?} after spoold exited",
                self.base_port,
                self.base_port + self.options.cores
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the broker again on the same directory and ports (once the
    /// old process's ports are free).
    pub fn restart(&mut self) {
        if let Err(failure) = self.try_restart() {
            panic!("restart: {failure}");
        }
    }

    /// [`restart`](Self::restart) for a broker that may exit during its
    /// start (a failpoint armed for recovery).
    ///
    /// # Errors
    /// The exit status (or `None` for a start timeout, after which the
    /// process is killed) and the log tail.
    pub fn try_restart(&mut self) -> Result<(), StartFailed> {
        self.wait_ports_free();
        match self.spawn_and_wait() {
            Ok(()) => Ok(()),
            Err(StartFailure::Exited(status)) => {
                Err(StartFailed { status: Some(status), log: self.log_tail() })
            }
            Err(StartFailure::Timeout) => {
                self.kill();
                Err(StartFailed { status: None, log: self.log_tail() })
            }
        }
    }

    /// SIGTERM, then waits for the drain; returns the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("spoold is not running");
        send_signal(&child, libc::SIGTERM);
        match wait_timeout(&mut child, STOP_TIMEOUT) {
            Some(status) => status,
            None => {
                send_signal(&child, libc::SIGKILL);
                let _ = child.wait();
                panic!(
                    "spoold did not exit within {STOP_TIMEOUT:?} of SIGTERM:\n{}",
                    self.log_tail()
                )
            }
        }
    }

    /// SIGKILL: the process dies with whatever is in flight.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("spoold is not running");
        send_signal(&child, libc::SIGKILL);
        let _ = child.wait();
    }

    /// Runs a second `spoold` on this broker's data directory (on other
    /// ports) and returns how it ended, killing it if it is still running
    /// after `timeout`.
    pub fn run_second_on_same_dir(&self, timeout: Duration) -> (Option<ExitStatus>, String) {
        let log_path = self.root.path().join("second.log");
        let log = File::create(&log_path).expect("create second log");
        // The shard ports and the admin port after them (as `start`).
        let base = reserve_ports(self.options.cores + 1);
        let mut child = spoold_command(&self.data_dir(), base, &self.options, &log)
            .spawn()
            .expect("spawn second spoold");
        let status = wait_timeout(&mut child, timeout);
        if status.is_none() {
            send_signal(&child, libc::SIGKILL);
            let _ = child.wait();
        }
        (status, std::fs::read_to_string(&log_path).unwrap_or_default())
    }

    /// A client bootstrapped on shard 0 with short timeouts.
    pub async fn client(&self) -> Client {
        let config = ClientConfig {
            connection: ConnectionConfig {
                request_timeout: Duration::from_secs(15),
                connect_timeout: Duration::from_secs(5),
                ..ConnectionConfig::default()
            },
        };
        Client::connect_with(&self.addr(), config).await.expect("client connects")
    }

    /// Runs the `spool` CLI against this broker with `--addr` set.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_stdin(args, None)
    }

    /// [`cli`](Self::cli) feeding `stdin` to the command.
    pub fn cli_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut command = Command::new(spool_bin());
        command.arg("--addr").arg(self.addr()).args(args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = command.spawn().expect("spawn spool");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().expect("stdin pipe");
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("spool output")
    }
}

impl Drop for Spoold {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(&child, libc::SIGKILL);
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- spoold log ({}, {} starts) ----\n{}\n---- end of spoold log ----",
                self.log_path().display(),
                self.starts,
                self.log_tail()
            );
        }
    }
}

/// A queue config for tests: short leases allowed (50 ms..60 s, default
/// `lease_default_ms`), `max_deliveries`, linear 100 ms backoff, the default
/// 5 min dedupe window (a resend after a kill comes within seconds) and
/// generous admission limits.
pub fn test_queue_config(
    partitions: u32,
    lease_default_ms: u32,
    max_deliveries: u32,
) -> QueueConfig {
    QueueConfig {
        partitions,
        priority_bands: 4,
        lease_default_ms,
        lease_min_ms: 50,
        lease_max_ms: 60_000,
        max_lease_lifetime_ms: 10 * 60_000,
        max_deliveries,
        backoff: Backoff { kind: BackoffKind::Linear, base_ms: 100, cap_ms: 100 },
        dedupe_window_ms: spool_client::limits::DEDUPE_WINDOW_MS_DEFAULT,
        max_messages: 10_000_000,
        max_bytes: 1 << 30,
        dead_letter_on_expiry: true,
        retention_ms: 0,
        retention_bytes: 0,
        ordered: false,
    }
}

/// One code per token of an Ack answer (`NONE` = acked), for tests that
/// check which tokens the broker refused: [`Client::ack`] answers `Ok(())`
/// only when all were acked and names the refused ones in
/// [`ClientError::AckRefused`].
///
/// # Errors
/// Any other error of the Ack.
pub fn ack_codes(
    answer: Result<(), ClientError>,
    tokens: usize,
) -> Result<Vec<ErrorCode>, ClientError> {
    match answer {
        Ok(()) => Ok(vec![ErrorCode::None; tokens]),
        Err(ClientError::AckRefused { refused, tokens }) => {
            let mut codes = vec![ErrorCode::None; tokens];
            for refused in refused {
                if let Some(code) = codes.get_mut(refused.index) {
                    *code = refused.code;
                }
            }
            Ok(codes)
        }
        Err(error) => Err(error),
    }
}

/// Stdout of a CLI run that must have succeeded.
pub fn success_stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "spool failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Parses the stdout of a successful `--json` run of a streaming command
/// (`send`, `recv`): JSON Lines, one object per message.
pub fn json_lines_stdout(output: &Output) -> Vec<serde_json::Value> {
    let text = success_stdout(output);
    text.lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}\n{text}"))
        })
        .collect()
}

/// Parses the stdout of a successful `--json` CLI run.
pub fn json_stdout(output: &Output) -> serde_json::Value {
    let text = success_stdout(output);
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// A process's log file as text ("" when it cannot be read yet).
pub fn read_log(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    text
}

/// The last `bytes` of `text` at most, cut on a character boundary.
pub fn tail(text: &str, bytes: usize) -> String {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}
