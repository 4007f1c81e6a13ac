//! `memory`: the broker's resident memory against hostile connections that
//! hold unfinished frames, with its memory budget and with one too large to
//! bite.
//!
//! What it owns: a matrix of cells (connections × frame size × budget), one
//! fresh `spoold` child per cell (its admin port on, so its `/metrics` can
//! be read), the attack (raw TCP connections that each write an Enqueue
//! frame header announcing `frame_bytes`, then all of the frame but its last
//! 64 bytes, and then neither finish it nor read), and the figures: the
//! child's `VmRSS` before the attack, its peak sampled every
//! [`SAMPLE_INTERVAL`] while the attack sets up and holds, `VmHWM`, the
//! requests pool's used / peak bytes from `/metrics`, and after the
//! connections close how long until the pool is empty and `VmRSS` is back
//! within a margin of its start. What it does not do: send anything
//! well-formed, or judge the figures (no thresholds).
//!
//! Bounded: the connection count and frame sizes come from the command
//! line and are range-checked (and their product against the machine's
//! available memory), the set-up, the hold and the wait after closing are
//! time-boxed, and every spoold is stopped (SIGTERM, then killed) before
//! the next cell starts.

use std::io::{Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_wire::proto::limits::FRAME_HEADER_BYTES;
use spool_wire::proto::ApiKey;
use spool_wire::ErrorCode;
use thiserror::Error;
use tokio::io::AsyncWriteExt;

use crate::harness::{sibling_spoold, HarnessError, SpooldProcess};
use crate::BenchError;

/// The budget of the "none" cells: far above anything the attack can
/// hold, so it never bites (the broker accepts up to 16 TiB).
pub const NO_BUDGET_MEMORY_BYTES: u64 = 64 << 30;
/// Most shards of a started spoold.
pub const SHARDS_MAX: u64 = 64;
/// Most connections one cell opens.
pub const CONNECTIONS_MAX: u64 = 4_096;
/// Smallest and largest frame a cell announces (a multiple of 8).
pub const FRAME_BYTES_MIN: u64 = 4_096;
pub const FRAME_BYTES_MAX: u64 = 16 << 20;
/// Longest hold phase (s).
pub const HOLD_S_MAX: u64 = 300;
/// Longest wait for resident memory to come back, after the frame timeout (s).
pub const RETURN_WAIT_S_MAX: u64 = 300;
/// A cell may announce at most this share (%) of the machine's available
/// memory (connections × frame bytes): without the budget the broker
/// holds all of it.
pub const ATTACK_MEMORY_PERCENT_MAX: u64 = 50;
/// Bytes of its frame each connection leaves unsent.
const UNSENT_TAIL_BYTES: u64 = 64;
/// `--frame-bytes-max` is the largest frame plus this.
const FRAME_BYTES_MAX_SLACK: u64 = 4_096;
/// `--connections-per-shard-max` is the cell's connections plus this.
const CONNECTIONS_SLACK: u64 = 64;
/// How often the broker's `VmRSS` is read (and the attack's progress).
const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// Pause after the broker listens, before the starting figure.
const SETTLE: Duration = Duration::from_secs(1);
/// The attack is in place when every connection is open and for this long
/// no byte has left the attackers and the broker's `VmRSS` has moved less
/// than [`QUIET_RSS_BYTES`]: the broker has read what it will read.
const SETUP_QUIET: Duration = Duration::from_secs(1);
const QUIET_RSS_BYTES: u64 = 1 << 20;
/// Longest the attack may take to be in place before the hold starts anyway.
const SETUP_S_MAX: u64 = 30;
/// The frame timeout is the set-up bound plus the hold plus this: no frame
/// times out before the hold ends.
const FRAME_TIMEOUT_SLACK_S: u64 = 5;
/// Longest the admin port may take to answer after the shard ports listen.
const ADMIN_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read and write timeout of one `/metrics` request.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest `/metrics` page read.
const METRICS_PAGE_BYTES_MAX: u64 = 8 << 20;
/// Tries at a free admin port (one may be taken by the time spoold binds it).
const START_ATTEMPTS: u32 = 3;
/// Each connection writes its frame in pieces of this many bytes.
const WRITE_PIECE_BYTES: usize = 64 << 10;

/// What to run: the matrix and its bounds.
#[derive(Clone, Debug, clap::Args)]
pub struct MemoryAttackConfig {
    /// Parent of each started spoold's temporary data directory.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// spoold binary to start [default: spoold next to this executable].
    #[arg(long)]
    pub spoold: Option<PathBuf>,
    /// Broker shards (its --cores); connections go round-robin over their ports.
    #[arg(long, default_value_t = 2)]
    pub shards: u16,
    /// Hostile connections per cell, comma-separated (each 1..=4096).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub connections: Vec<u32>,
    /// Frame sizes each connection announces, comma-separated (multiples of
    /// 8, 4 KiB..=16 MiB).
    #[arg(long, value_delimiter = ',', default_value = "65536,1048576,4194304")]
    pub frame_bytes: Vec<u32>,
    /// The budget of the "budget" cells (--memory-bytes; the "none" cells get 64 GiB).
    #[arg(long, default_value_t = 256 << 20)]
    pub memory_bytes: u64,
    /// Length of the hold phase after the attack is in place (s, 1..=300).
    #[arg(long, default_value_t = 5.0)]
    pub hold_s: f64,
    /// Resident memory counts as back within this of its start (MiB).
    #[arg(long, default_value_t = 16)]
    pub return_margin_mib: u64,
    /// How long to wait for it after the frame timeout has passed (s, 1..=300).
    #[arg(long, default_value_t = 15)]
    pub return_wait_s: u64,
    /// Also write the JSON lines to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Which budget a cell's broker had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// `--memory-bytes` as given.
    Budget,
    /// [`NO_BUDGET_MEMORY_BYTES`]: a budget that does not bite.
    None,
}

/// The requests pools, summed over the shards, from `/metrics`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PoolFigures {
    pub size_bytes: u64,
    pub used_bytes: u64,
    /// Sum of each shard's peak since it started.
    pub peak_bytes: u64,
    /// Takes that waited for memory.
    pub waits: u64,
}

/// One cell, as one JSON line.
#[derive(Clone, Debug, Serialize)]
pub struct CellReport {
    pub scenario: &'static str,
    pub connections: u32,
    pub frame_bytes: u32,
    pub budget: Budget,
    pub memory_bytes: u64,
    pub shards: u16,
    pub frame_timeout_ms: u64,
    /// Connections that opened, and that wrote all their frame but its tail.
    pub connected: u64,
    pub frames_written: u64,
    pub sent_bytes: u64,
    /// From the first connect until the attack was in place (s).
    pub setup_s: f64,
    pub hold_s: f64,
    pub rss_start_bytes: u64,
    /// Highest `VmRSS` sampled during set-up and hold.
    pub rss_peak_bytes: u64,
    pub rss_end_of_hold_bytes: u64,
    /// `VmHWM` at the end of the hold.
    pub hwm_bytes: u64,
    pub growth_bytes: u64,
    /// Growth over the requests pools' size (summed over the shards).
    pub growth_over_pool: f64,
    /// At the end of the hold.
    pub pool: PoolFigures,
    /// Seconds from closing the connections until every pool was empty.
    pub pool_empty_after_close_s: Option<f64>,
    /// Seconds from closing until `VmRSS` was within the margin of its start
    /// (and the pools empty); `None`: not within the bound.
    pub rss_back_after_close_s: Option<f64>,
    /// `VmRSS` then, or at the bound.
    pub rss_after_bytes: u64,
    pub return_margin_bytes: u64,
    /// How long it waited after closing at most (s).
    pub after_bound_s: f64,
    pub load_avg_1m: f64,
    /// spoold's stop, when it was not clean.
    pub stop_error: Option<String>,
}

/// Why the matrix stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MemoryAttackError {
    #[error("{0}")]
    Bench(#[from] BenchError),
    #[error("{0}")]
    Harness(#[from] HarnessError),
    #[error("cannot read /proc/{pid}/status: {source}")]
    Proc {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("/metrics: {0}")]
    Metrics(String),
    #[error("cannot start the attack runtime: {0}")]
    Runtime(std::io::Error),
    #[error("frame_bytes {0} is not a multiple of 8")]
    FrameAlign(u32),
    #[error(
        "{connections} connections × {frame_bytes} bytes is over {ATTACK_MEMORY_PERCENT_MAX} % \
         of the {available} bytes available: the broker without its budget would hold it all"
    )]
    TooMuch { connections: u32, frame_bytes: u32, available: u64 },
    #[error("cannot encode a report: {0}")]
    Report(#[from] serde_json::Error),
    #[error("cannot write {}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The 24-byte header of an Enqueue request frame of `frame_bytes` (a
/// multiple of 8, so no padding): the layout `spool_wire::proto::frame`
/// documents, from the wire crate's own key, code and header size.
pub fn enqueue_frame_header(frame_bytes: u32, correlation: u64) -> Vec<u8> {
    let body_bytes = frame_bytes.saturating_sub(FRAME_HEADER_BYTES as u32);
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES);
    out.extend_from_slice(&frame_bytes.to_le_bytes());
    out.extend_from_slice(&ApiKey::Enqueue.as_u16().to_le_bytes());
    out.extend_from_slice(&ApiKey::Enqueue.min_version().to_le_bytes());
    out.extend_from_slice(&correlation.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // flags: a request
    out.extend_from_slice(&ErrorCode::None.as_u16().to_le_bytes());
    out.extend_from_slice(&body_bytes.to_le_bytes());
    out
}

/// `/proc/PID/status` figures in bytes: (VmRSS, VmHWM).
fn proc_rss(pid: u32) -> Result<(u64, u64), MemoryAttackError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|source| MemoryAttackError::Proc { pid, source })?;
    Ok((kib_field(&text, "VmRSS:"), kib_field(&text, "VmHWM:")))
}

/// A `NAME: N kB` line of a /proc file, in bytes (0 when absent).
fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// `MemAvailable` of `/proc/meminfo` (bytes), if it can be read.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some(kib_field(&text, "MemAvailable:")).filter(|bytes| *bytes > 0)
}

/// 1-minute load average of the machine.
pub fn load_avg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|first| first.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The body of `GET /metrics` from `admin` (HTTP/1.0, de-chunked).
fn metrics_page(admin: &str) -> Result<String, MemoryAttackError> {
    let failed = |what: &str, error: std::io::Error| {
        MemoryAttackError::Metrics(format!("{what} {admin}: {error}"))
    };
    let mut stream = StdTcpStream::connect(admin).map_err(|error| failed("connect", error))?;
    stream.set_read_timeout(Some(METRICS_TIMEOUT)).map_err(|error| failed("timeout", error))?;
    stream.set_write_timeout(Some(METRICS_TIMEOUT)).map_err(|error| failed("timeout", error))?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|error| failed("send to", error))?;
    let mut raw = Vec::new();
    stream
        .take(METRICS_PAGE_BYTES_MAX)
        .read_to_end(&mut raw)
        .map_err(|error| failed("read from", error))?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(MemoryAttackError::Metrics(format!("no HTTP head from {admin}")));
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(MemoryAttackError::Metrics(format!("{admin} answered {status:?}")));
    }
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    Ok(if chunked { dechunk(body) } else { body.to_owned() })
}

/// The data of a chunked HTTP body (what is whole of it).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(rest.get(..size).unwrap_or_default());
        body = rest.get(size..).unwrap_or_default().trim_start_matches("\r\n");
    }
    out
}

/// The sum over shards of `name{…pool="requests"…}` in an exposition.
fn requests_figure(page: &str, name: &str) -> u64 {
    page.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with('{') && rest.contains("pool=\"requests\""))
        .filter_map(|rest| rest.rsplit_once('}'))
        .filter_map(|(_, value)| value.split_whitespace().next()?.parse::<f64>().ok())
        .map(|value| value.max(0.0) as u64)
        .sum()
}

fn pool_figures(admin: &str) -> Result<PoolFigures, MemoryAttackError> {
    let page = metrics_page(admin)?;
    let figures = PoolFigures {
        size_bytes: requests_figure(&page, "spool_shard_memory_budget_bytes"),
        used_bytes: requests_figure(&page, "spool_shard_memory_used_bytes"),
        peak_bytes: requests_figure(&page, "spool_shard_memory_peak_bytes"),
        waits: requests_figure(&page, "spool_shard_memory_waits_total"),
    };
    if figures.size_bytes == 0 {
        return Err(MemoryAttackError::Metrics(format!(
            "no spool_shard_memory_budget_bytes{{pool=\"requests\"}} on {admin}"
        )));
    }
    Ok(figures)
}

/// What the attack's connections have done so far.
#[derive(Default)]
struct Progress {
    connected: AtomicU64,
    failed: AtomicU64,
    frames_written: AtomicU64,
    sent_bytes: AtomicU64,
}

/// One hostile connection: the header, then the frame's body less its
/// last [`UNSENT_TAIL_BYTES`] from the shared `body`, then nothing until
/// it is aborted (which closes it).
async fn hold_unfinished_frame(
    addr: String,
    frame_bytes: u32,
    correlation: u64,
    body: Arc<Vec<u8>>,
    progress: Arc<Progress>,
) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else {
        progress.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    progress.connected.fetch_add(1, Ordering::Relaxed);
    let header = enqueue_frame_header(frame_bytes, correlation);
    if stream.write_all(&header).await.is_err() {
        return;
    }
    progress.sent_bytes.fetch_add(header.len() as u64, Ordering::Relaxed);
    let body_bytes =
        usize::try_from(u64::from(frame_bytes) - FRAME_HEADER_BYTES as u64 - UNSENT_TAIL_BYTES)
            .unwrap_or(0)
            .min(body.len());
    for piece in body[..body_bytes].chunks(WRITE_PIECE_BYTES) {
        // Blocks once the broker stops reading: that is the attack.
        if stream.write_all(piece).await.is_err() {
            return;
        }
        progress.sent_bytes.fetch_add(piece.len() as u64, Ordering::Relaxed);
    }
    progress.frames_written.fetch_add(1, Ordering::Relaxed);
    std::future::pending::<()>().await;
}

/// One cell's settings.
#[derive(Clone, Copy, Debug)]
struct Cell {
    connections: u32,
    frame_bytes: u32,
    budget: Budget,
    memory_bytes: u64,
}

/// A free loopback port right now.
fn free_port() -> Result<u16, MemoryAttackError> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|error| MemoryAttackError::Metrics(format!("no free admin port: {error}")))?;
    Ok(probe.port())
}

/// Starts a spoold for `cell` with its admin port on; returns it and the
/// admin address once `/metrics` answers.
fn start_broker(
    config: &MemoryAttackConfig,
    binary: &Path,
    cell: Cell,
    frame_bytes_max: u64,
    frame_timeout_ms: u64,
) -> Result<(SpooldProcess, String), MemoryAttackError> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let admin = format!("127.0.0.1:{}", free_port()?);
        let args: Vec<String> = vec![
            "--admin-listen".into(),
            admin.clone(),
            "--memory-bytes".into(),
            cell.memory_bytes.to_string(),
            "--frame-bytes-max".into(),
            (frame_bytes_max + FRAME_BYTES_MAX_SLACK).to_string(),
            "--frame-timeout-ms".into(),
            frame_timeout_ms.to_string(),
            "--connections-per-shard-max".into(),
            (u64::from(cell.connections) + CONNECTIONS_SLACK).to_string(),
        ];
        match SpooldProcess::start_with_args(binary, &config.dir, config.shards, "memory", 0, &args)
        {
            Ok(spoold) => {
                let started = instant_now();
                loop {
                    match pool_figures(&admin) {
                        Ok(_) => return Ok((spoold, admin)),
                        Err(error) if started.elapsed() > ADMIN_START_TIMEOUT => {
                            let _ = spoold.stop();
                            return Err(error);
                        }
                        Err(_) => std::thread::sleep(SAMPLE_INTERVAL),
                    }
                }
            }
            Err(error) => last = Some(error),
        }
    }
    Err(last.map_or_else(
        || MemoryAttackError::Metrics("spoold did not start".to_owned()),
        MemoryAttackError::from,
    ))
}

fn check(config: &MemoryAttackConfig) -> Result<(), MemoryAttackError> {
    let bounded = BenchError::check_range;
    bounded("shards", u64::from(config.shards), 1, SHARDS_MAX)?;
    bounded("hold_s", config.hold_s as u64, 1, HOLD_S_MAX)?;
    bounded("return_wait_s", config.return_wait_s, 1, RETURN_WAIT_S_MAX)?;
    bounded("memory_bytes", config.memory_bytes, 1, NO_BUDGET_MEMORY_BYTES - 1)?;
    let available = mem_available().unwrap_or(u64::MAX);
    for &connections in &config.connections {
        bounded("connections", u64::from(connections), 1, CONNECTIONS_MAX)?;
        for &frame_bytes in &config.frame_bytes {
            bounded("frame_bytes", u64::from(frame_bytes), FRAME_BYTES_MIN, FRAME_BYTES_MAX)?;
            if !frame_bytes.is_multiple_of(8) {
                return Err(MemoryAttackError::FrameAlign(frame_bytes));
            }
            let exposed = u64::from(connections) * u64::from(frame_bytes);
            if exposed > available / 100 * ATTACK_MEMORY_PERCENT_MAX {
                return Err(MemoryAttackError::TooMuch { connections, frame_bytes, available });
            }
        }
    }
    if config.connections.is_empty() || config.frame_bytes.is_empty() {
        return Err(
            BenchError::Scenario("--connections and --frame-bytes need values".into()).into()
        );
    }
    Ok(())
}

/// Runs the matrix: for each connection count, each frame size, the budget
/// and then none. `on_cell` sees each cell's report as it is done.
///
/// # Errors
/// [`MemoryAttackError`]: a bound broken, a broker that does not start or
/// whose process or `/metrics` cannot be read.
pub fn run(
    config: &MemoryAttackConfig,
    on_cell: &mut dyn FnMut(&CellReport) -> Result<(), MemoryAttackError>,
) -> Result<Vec<CellReport>, MemoryAttackError> {
    check(config)?;
    let binary = match &config.spoold {
        Some(path) => path.clone(),
        None => sibling_spoold()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("memory-attack")
        .enable_all()
        .build()
        .map_err(MemoryAttackError::Runtime)?;
    let frame_bytes_max = config.frame_bytes.iter().copied().max().map_or(0, u64::from);
    let body = Arc::new(vec![0x5Au8; usize::try_from(frame_bytes_max).unwrap_or(0)]);
    let mut reports = Vec::new();
    for &connections in &config.connections {
        for &frame_bytes in &config.frame_bytes {
            for (budget, memory_bytes) in
                [(Budget::Budget, config.memory_bytes), (Budget::None, NO_BUDGET_MEMORY_BYTES)]
            {
                let cell = Cell { connections, frame_bytes, budget, memory_bytes };
                let report = run_cell(config, &binary, cell, frame_bytes_max, &runtime, &body)?;
                on_cell(&report)?;
                reports.push(report);
            }
        }
    }
    Ok(reports)
}

fn run_cell(
    config: &MemoryAttackConfig,
    binary: &Path,
    cell: Cell,
    frame_bytes_max: u64,
    runtime: &tokio::runtime::Runtime,
    body: &Arc<Vec<u8>>,
) -> Result<CellReport, MemoryAttackError> {
    let frame_timeout_ms =
        (SETUP_S_MAX + FRAME_TIMEOUT_SLACK_S) * 1000 + (config.hold_s * 1000.0).ceil() as u64;
    let load_avg = load_avg_1m();
    let (spoold, admin) = start_broker(config, binary, cell, frame_bytes_max, frame_timeout_ms)?;
    let result = attack(config, &spoold, &admin, cell, runtime, body, frame_timeout_ms);
    let stop_error = spoold.stop().err().map(|error| error.to_string());
    let mut report = result?;
    report.stop_error = stop_error;
    report.load_avg_1m = load_avg;
    Ok(report)
}

/// The attack on one started broker: start figure, set-up, hold, close,
/// the wait for memory to come back.
fn attack(
    config: &MemoryAttackConfig,
    spoold: &SpooldProcess,
    admin: &str,
    cell: Cell,
    runtime: &tokio::runtime::Runtime,
    body: &Arc<Vec<u8>>,
    frame_timeout_ms: u64,
) -> Result<CellReport, MemoryAttackError> {
    let pid =
        spoold.pid().ok_or_else(|| MemoryAttackError::Metrics("spoold not running".into()))?;
    let base_port: u16 = spoold
        .addr()
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .ok_or_else(|| MemoryAttackError::Metrics(format!("address {}", spoold.addr())))?;
    std::thread::sleep(SETTLE);
    let pool_start = pool_figures(admin)?;
    let (rss_start, _) = proc_rss(pid)?;
    eprintln!(
        "spool-bench memory: {} × {} B, budget {:?} ({} B, requests pools {} B): start {:.1} MiB",
        cell.connections,
        cell.frame_bytes,
        cell.budget,
        cell.memory_bytes,
        pool_start.size_bytes,
        mib(rss_start)
    );

    let progress = Arc::new(Progress::default());
    let attack_start = instant_now();
    let tasks: Vec<_> = (0..cell.connections)
        .map(|index| {
            let port = base_port + u16::try_from(index % u32::from(config.shards)).unwrap_or(0);
            runtime.spawn(hold_unfinished_frame(
                format!("127.0.0.1:{port}"),
                cell.frame_bytes,
                u64::from(index) + 1,
                Arc::clone(body),
                Arc::clone(&progress),
            ))
        })
        .collect();
    let mut rss_peak = rss_start;
    // Set-up: until every connection is open and bytes and RSS stop moving.
    let mut last = (0u64, rss_start, instant_now());
    loop {
        std::thread::sleep(SAMPLE_INTERVAL);
        let rss = proc_rss(pid)?.0;
        rss_peak = rss_peak.max(rss);
        let opened = progress.connected.load(Ordering::Relaxed);
        let all_open =
            opened + progress.failed.load(Ordering::Relaxed) >= u64::from(cell.connections);
        let sent = progress.sent_bytes.load(Ordering::Relaxed);
        if sent != last.0 || rss.abs_diff(last.1) > QUIET_RSS_BYTES {
            last = (sent, rss, instant_now());
        }
        if all_open && last.2.elapsed() >= SETUP_QUIET {
            break;
        }
        if attack_start.elapsed() >= Duration::from_secs(SETUP_S_MAX) {
            eprintln!("spool-bench memory: set-up not quiet after {SETUP_S_MAX} s; holding anyway");
            break;
        }
    }
    let setup_s = attack_start.elapsed().as_secs_f64();
    let hold_start = instant_now();
    while hold_start.elapsed().as_secs_f64() < config.hold_s {
        std::thread::sleep(SAMPLE_INTERVAL);
        rss_peak = rss_peak.max(proc_rss(pid)?.0);
    }
    let (rss_end_of_hold, hwm) = proc_rss(pid)?;
    rss_peak = rss_peak.max(rss_end_of_hold);
    let pool = pool_figures(admin)?;

    // Close every connection (aborting a task drops its socket).
    for task in &tasks {
        task.abort();
    }
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
    let closed = instant_now();
    let margin = config.return_margin_mib << 20;
    let remaining_timeout =
        Duration::from_millis(frame_timeout_ms).saturating_sub(attack_start.elapsed());
    let bound = remaining_timeout + Duration::from_secs(config.return_wait_s);
    let mut pool_empty_s = None;
    let mut rss_back_s = None;
    let mut rss_after;
    loop {
        rss_after = proc_rss(pid)?.0;
        let used = pool_figures(admin)?.used_bytes;
        let since = closed.elapsed().as_secs_f64();
        if used == 0 && pool_empty_s.is_none() {
            pool_empty_s = Some(since);
        }
        if used == 0 && rss_after <= rss_start + margin {
            rss_back_s = Some(since);
            break;
        }
        if closed.elapsed() >= bound {
            break;
        }
        std::thread::sleep(SAMPLE_INTERVAL);
    }
    let growth = rss_peak.saturating_sub(rss_start);
    let report = CellReport {
        scenario: "memory",
        connections: cell.connections,
        frame_bytes: cell.frame_bytes,
        budget: cell.budget,
        memory_bytes: cell.memory_bytes,
        shards: config.shards,
        frame_timeout_ms,
        connected: progress.connected.load(Ordering::Relaxed),
        frames_written: progress.frames_written.load(Ordering::Relaxed),
        sent_bytes: progress.sent_bytes.load(Ordering::Relaxed),
        setup_s,
        hold_s: config.hold_s,
        rss_start_bytes: rss_start,
        rss_peak_bytes: rss_peak,
        rss_end_of_hold_bytes: rss_end_of_hold,
        hwm_bytes: hwm,
        growth_bytes: growth,
        growth_over_pool: growth as f64 / pool.size_bytes.max(1) as f64,
        pool,
        pool_empty_after_close_s: pool_empty_s,
        rss_back_after_close_s: rss_back_s,
        rss_after_bytes: rss_after,
        return_margin_bytes: margin,
        after_bound_s: bound.as_secs_f64(),
        load_avg_1m: 0.0,
        stop_error: None,
    };
    eprintln!(
        "spool-bench memory:   peak {:.1} MiB (+{:.1}), pool peak {:.1} MiB, {} of {} frames \
         written; after close {:.1} MiB {}",
        mib(report.rss_peak_bytes),
        mib(growth),
        mib(pool.peak_bytes),
        report.frames_written,
        report.connected,
        mib(rss_after),
        rss_back_s.map_or_else(|| "(not back)".to_owned(), |s| format!("back at {s:.1} s")),
    );
    Ok(report)
}

/// Writes the reports as JSON lines to `path`.
///
/// # Errors
/// [`MemoryAttackError::Json`] when the file cannot be written.
pub fn write_json(path: &Path, reports: &[CellReport]) -> Result<(), MemoryAttackError> {
    let mut text = String::new();
    for report in reports {
        text.push_str(&serde_json::to_string(report)?);
        text.push('\n');
    }
    std::fs::write(path, text)
        .map_err(|source| MemoryAttackError::Json { path: path.to_owned(), source })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// A size as the table shows it: `64 KiB`, `4 MiB`, `1.5 GiB`.
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, scale) in UNITS {
        if bytes >= scale {
            let value = bytes as f64 / scale as f64;
            return if bytes.is_multiple_of(scale) {
                format!("{} {unit}", bytes / scale)
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// The matrix as a Markdown table.
pub fn markdown_table(reports: &[CellReport]) -> String {
    let mut out = String::from(
        "| connections | frame | budget (requests pools) | RSS start | peak (VmHWM) | growth | \
         growth ÷ pool | pool peak | after close |\n|---:|---:|---|---:|---:|---:|---:|---:|---|\n",
    );
    for report in reports {
        let budget = match report.budget {
            Budget::Budget => {
                format!("{} ({})", size(report.memory_bytes), size(report.pool.size_bytes))
            }
            Budget::None => format!("none ({})", size(report.memory_bytes)),
        };
        let ratio = match report.budget {
            Budget::Budget => format!("{:.2}", report.growth_over_pool),
            Budget::None => "—".to_owned(),
        };
        let after = match report.rss_back_after_close_s {
            Some(seconds) => format!("{:.1} MiB at {seconds:.1} s", mib(report.rss_after_bytes)),
            None => format!(
                "{:.1} MiB, not back in {:.0} s",
                mib(report.rss_after_bytes),
                report.after_bound_s
            ),
        };
        out.push_str(&format!(
            "| {} | {} | {budget} | {:.1} MiB | {:.1} MiB ({:.1}) | {:.1} MiB | {ratio} | {:.1} MiB | {after} |\n",
            report.connections,
            size(u64::from(report.frame_bytes)),
            mib(report.rss_start_bytes),
            mib(report.rss_peak_bytes),
            mib(report.hwm_bytes),
            mib(report.growth_bytes),
            mib(report.pool.peak_bytes),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_wire::proto::decode_frame;

    #[test]
    fn the_header_frames_an_enqueue_the_wire_decoder_reads() {
        let frame_bytes = 4096u32;
        let mut frame = enqueue_frame_header(frame_bytes, 7);
        assert_eq!(frame.len(), FRAME_HEADER_BYTES);
        frame.resize(frame_bytes as usize, 0x5A);
        let decoded = decode_frame(&frame).map(|frame| frame.header);
        let header = decoded.expect("a whole frame decodes");
        assert_eq!(header.api_key, ApiKey::Enqueue);
        assert_eq!(header.frame_bytes, frame_bytes);
        assert_eq!(header.body_bytes, frame_bytes - FRAME_HEADER_BYTES as u32);
        assert_eq!(header.correlation_id.0, 7);
        assert!(!header.is_response);
    }

    #[test]
    fn requests_figures_sum_over_shards_and_skip_other_pools() {
        let page = "# TYPE spool_shard_memory_used_bytes gauge\n\
            spool_shard_memory_used_bytes{shard=\"0\",pool=\"requests\"} 100\n\
            spool_shard_memory_used_bytes{shard=\"1\",pool=\"requests\"} 20\n\
            spool_shard_memory_used_bytes{shard=\"0\",pool=\"responses\"} 5\n\
            spool_shard_memory_used_bytes_other{pool=\"requests\"} 9\n";
        assert_eq!(requests_figure(page, "spool_shard_memory_used_bytes"), 120);
        assert_eq!(dechunk("5\r\nhello\r\n3\r\n ok\r\n0\r\n\r\n"), "hello ok");
        assert_eq!(size(64 << 10), "64 KiB");
        assert_eq!(size(256 << 20), "256 MiB");
    }
}
