//! Broker configuration: one validated [`BrokerConfig`] built from layers.
//!
//! Owns the list of runtime knobs and the precedence between sources (their
//! defaults and allowed ranges are named in `crate::limits`, with the
//! relations between them checked at compile time): command-line flags win over `SPOOL_*`
//! environment variables, which win over the TOML file (`--config FILE` or
//! `SPOOL_CONFIG`), which wins over the defaults. Every source is parsed into
//! a [`PartialConfig`](super::layers::PartialConfig) (all fields optional); the layers are overlaid and the
//! result is validated once, at start, into a [`BrokerConfig`] whose values are
//! all inside their ranges. It does not read the data directory or bind ports:
//! those checks need the environment and live with the code that uses it.
//!
//! Defaults work on a fresh machine: `./spool-data`, `127.0.0.1:7400` (shard
//! `i` listens on port `7400 + i`), one shard per allowed CPU.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The longest `spin_before_park` (defined in [`crate::limits`] with the
/// other ranges; re-exported for the load generator's existing path).
pub use crate::limits::SPIN_BEFORE_PARK_US_MAX;
use crate::limits::{
    CLAIM_WAITERS_PER_CONNECTION_LIMIT, CONNECTIONS_PER_SHARD_LIMIT, CONSUMER_PACE_PERCENT_MAX,
    CONSUMER_PACE_PERCENT_MIN, FRAME_BYTES_MAX_LOWER, FRAME_BYTES_MAX_UPPER, FRAME_TIMEOUT_MS_MAX,
    FRAME_TIMEOUT_MS_MIN, HOUSEKEEPING_TICK_MS_MAX, HOUSEKEEPING_TICK_MS_MIN, IDLE_TIMEOUT_MS_MAX,
    IDLE_TIMEOUT_MS_MIN, IN_FLIGHT_PER_CONNECTION_LIMIT, IO_POLL_INTERVAL_US_MAX,
    IO_POLL_INTERVAL_US_MIN, MEMORY_ADMIN_PERCENT, MEMORY_ADMIN_REQUESTS_MAX,
    MEMORY_ADMIN_REQUESTS_MIN, MEMORY_ADMIN_REQUEST_BYTES, MEMORY_REQUESTS_FRAMES_MIN,
    MEMORY_REQUESTS_PERCENT, MEMORY_RESPONSES_PERCENT, PARTITIONS_PER_NODE_MAX, SHARDS_MAX,
    SHUTDOWN_TIMEOUT_MS_MAX, SHUTDOWN_TIMEOUT_MS_MIN, STARTUP_TIMEOUT_MS_MAX,
    STARTUP_TIMEOUT_MS_MIN, TAIL_CACHE_BYTES_MAX, WRITE_TIMEOUT_MS_MAX, WRITE_TIMEOUT_MS_MIN,
};
use clap::ValueEnum;
use serde::Deserialize;
use thiserror::Error;

/// Default data directory, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "./spool-data";
/// Default listen address of shard 0; shard `i` uses port + `i`.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7400);
/// Default address of the admin port (HTTP: metrics and health).
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7480);

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line, for log shippers.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("expected `human` or `json`, got `{other}`")),
        }
    }
}

/// A share between 0 and 1 (finite): `journal_garbage_ratio_max`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Deserialize)]
#[serde(try_from = "f64")]
pub struct Ratio(pub(super) f64);

// Never NaN (checked on construction), so equality is an equivalence.
impl Eq for Ratio {}

impl Ratio {
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for Ratio {
    type Error = String;
    fn try_from(value: f64) -> Result<Self, Self::Error> {
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(format!("expected a ratio between 0 and 1, got {value}"))
        }
    }
}

impl std::str::FromStr for Ratio {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let value: f64 = text.parse().map_err(|error| format!("`{text}`: {error}"))?;
        Self::try_from(value)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where the admin port listens: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum AdminListen {
    /// No admin port.
    Off,
    /// Listen here (port 0: the kernel picks one; spoold logs it).
    At(SocketAddr),
}

impl std::str::FromStr for AdminListen {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "off" => Ok(AdminListen::Off),
            other => other.parse::<SocketAddr>().map(AdminListen::At).map_err(|error| {
                format!("expected an address like 127.0.0.1:7480 or `off`: {error}")
            }),
        }
    }
}

impl TryFrom<String> for AdminListen {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

/// The validated broker configuration. Built by [`BrokerConfig::load`] or
/// [`PartialConfig::resolve`](super::layers::PartialConfig::resolve); every value is inside its documented range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Directory holding `LOCK`, `secret` and the partition directories.
    pub data_dir: PathBuf,
    /// Address of shard 0; shard `i` listens on the same IP, port + `i`.
    pub listen: SocketAddr,
    /// Number of shards (one glommio executor pinned to one CPU each).
    pub shards: u16,
    /// The admin port (HTTP/1.1: `/metrics`, `/health/live`,
    /// `/health/ready`), served on its own thread; `None` turns it off.
    pub admin_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
    /// `tracing-subscriber` env-filter directives, e.g. `info,spool_broker=debug`.
    pub log_filter: String,
    /// How long an idle executor spins before parking (0 = park at once).
    pub spin_before_park_us: u64,
    /// Longest a busy shard's connections run before the executor polls
    /// for completed I/O.
    pub io_poll_interval_us: u64,
    /// While the shard's consumers are behind its producers (full claims
    /// and saturated intake), enqueued messages at most this % of the
    /// delivered ones; 0 turns the pace off (`net/pace.rs`).
    pub consumer_pace_percent: u32,
    /// Period of every executor's permanent housekeeping timer.
    pub housekeeping_tick_ms: u64,
    /// Size of each shard journal's segment files (pre-zeroed before use).
    pub segment_bytes: u64,
    /// The node's memory budget: the admin port's pool is carved off the
    /// top (none with `admin_listen` off), the rest split evenly over the
    /// shards and in each into named pools (`docs/design/memory-budget.md`).
    pub memory_bytes: u64,
    /// Memory each shard journal keeps of its newest commits to serve
    /// claims without a disk read, and as much again for chunks read from
    /// its files (counted at the buffers' allocated size).
    pub tail_cache_bytes: u64,
    /// The share of the held journal files that may carry
    /// no live record before the shard relocates the live entries of its
    /// oldest file (0..=1; 1 never relocates).
    pub journal_garbage_ratio_max: Ratio,
    /// Bytes of journal files a shard may hold before it
    /// asks the partitions pinning its oldest files for checkpoints (and
    /// relocates): below it only files nobody needs are released, so a
    /// shard of many partitions pays a checkpoint per partition once per
    /// this many bytes written instead of once per file
    /// (`0..=JOURNAL_RETAIN_BYTES_MAX`; 0 releases as soon as it can).
    pub journal_retain_bytes: u64,
    /// Most partitions this node hosts over all queues
    /// (`1..=PARTITIONS_PER_NODE_MAX`); a create past it is refused with
    /// `AssignmentError::TooManyPartitions`.
    pub partitions_max: u32,
    /// Connections one shard serves at once; extra ones are closed on accept.
    pub connections_per_shard_max: u32,
    /// Requests one connection may have in flight; reading pauses beyond it.
    pub in_flight_per_connection_max: u32,
    /// Claims one connection may have long-polling at once (over every
    /// partition of its shard); one more is answered THROTTLED.
    pub claim_waiters_per_connection_max: u32,
    /// Largest frame a peer may send; also the connection read-buffer bound.
    pub frame_bytes_max: u32,
    /// A connection with nothing buffered and nothing in flight is closed
    /// after this long.
    pub idle_timeout_ms: u64,
    /// A frame must arrive completely within this long of its first byte (or
    /// of the previous frame), so a byte-at-a-time peer cannot hold a slot.
    pub frame_timeout_ms: u64,
    /// A response not written within this long closes the connection (a
    /// peer that stops reading).
    pub write_timeout_ms: u64,
    /// Every shard must be up (channels connected, port bound, its
    /// partitions recovered) within this. Recovery replays each partition's
    /// log after its checkpoint, so the default leaves room for large ones.
    pub startup_timeout_ms: u64,
    /// In-flight work must drain within this after SIGTERM/SIGINT.
    pub shutdown_timeout_ms: u64,
    /// The auth file (principals and ACLs); `None`: authentication off.
    pub auth_file: Option<PathBuf>,
    /// The policy read from `auth_file` when the config was resolved.
    pub auth: crate::auth::AuthPolicy,
    /// TLS on every shard port and the admin port, loaded from
    /// `tls_cert_file`, `tls_key_file` and `tls_client_ca_file` when the
    /// config was resolved; `None`: plain TCP.
    pub tls: Option<crate::net::tls::TlsServer>,
    /// The `[cluster]` table, validated; `None`: a single node
    /// (`docs/design/replication.md`, "Running a cluster").
    pub cluster: Option<crate::control::cluster::ClusterConfig>,
}

/// One shard's memory budget and its pools, bytes
/// (`BrokerConfig::shard_memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMemoryBytes {
    /// The shard's part of `memory_bytes`: an even share of what the
    /// admin port's pool leaves.
    pub shard: u64,
    /// Read buffers above their floor and frames being handled.
    pub requests: u64,
    /// Responses produced and not yet written.
    pub responses: u64,
    /// The rest: queue state, dedupe windows, the journal caches.
    pub state: u64,
}

impl BrokerConfig {
    /// The log settings every shard journal of this broker derives its own
    /// from.
    pub fn log_config(&self) -> crate::log::LogConfig {
        crate::log::LogConfig {
            segment_bytes: self.segment_bytes,
            tail_cache_bytes: self.tail_cache_bytes,
            ..crate::log::LogConfig::default()
        }
    }

    /// The admin port's pool (`admin/memory.rs`), carved off the top of
    /// `memory_bytes` before the shards' split: `MEMORY_ADMIN_PERCENT` of
    /// it, at least [`Self::admin_memory_floor`] and at most
    /// `MEMORY_ADMIN_REQUESTS_MAX` largest requests; 0 with the admin port
    /// off (the shards get everything).
    pub fn admin_memory_bytes(&self) -> u64 {
        self.admin_memory_for(self.memory_bytes)
    }

    /// The least the admin pool is given: `MEMORY_ADMIN_REQUESTS_MIN`
    /// largest requests with their answers; 0 with the admin port off.
    pub fn admin_memory_floor(&self) -> u64 {
        if self.admin_listen.is_none() {
            return 0;
        }
        MEMORY_ADMIN_REQUESTS_MIN * MEMORY_ADMIN_REQUEST_BYTES
    }

    /// The admin pool a budget of `memory_bytes` gives.
    fn admin_memory_for(&self, memory_bytes: u64) -> u64 {
        if self.admin_listen.is_none() {
            return 0;
        }
        let ceiling = MEMORY_ADMIN_REQUESTS_MAX * MEMORY_ADMIN_REQUEST_BYTES;
        (memory_bytes / 100 * MEMORY_ADMIN_PERCENT).clamp(self.admin_memory_floor(), ceiling)
    }

    /// The least `memory_bytes` that leaves the shards `shards_bytes` in
    /// all once the admin pool is carved off (for the start refusals'
    /// advice).
    fn memory_bytes_for(&self, shards_bytes: u64) -> u64 {
        let fits =
            |memory: u64| memory.saturating_sub(self.admin_memory_for(memory)) >= shards_bytes;
        let ceiling = MEMORY_ADMIN_REQUESTS_MAX * MEMORY_ADMIN_REQUEST_BYTES;
        // The least budget with the admin pool at its share: m = 100 q + r
        // leaves the shards (100 - PERCENT) q + r (the share is taken of
        // whole hundreds); the least q with r ≤ 99, then the least r.
        let kept = 100 - MEMORY_ADMIN_PERCENT;
        let hundreds = shards_bytes.saturating_sub(99).div_ceil(kept);
        let at_share = 100 * hundreds + shards_bytes.saturating_sub(kept * hundreds);
        // The admin pool at its floor, at its share, at its ceiling: the
        // least that fits.
        [shards_bytes + self.admin_memory_floor(), at_share, shards_bytes + ceiling]
            .into_iter()
            .filter(|&memory| fits(memory))
            .min()
            .unwrap_or(shards_bytes + ceiling)
    }

    /// Each shard's part of `memory_bytes` (what the admin pool leaves),
    /// and its pools.
    pub fn shard_memory(&self) -> ShardMemoryBytes {
        let shard = self.memory_bytes.saturating_sub(self.admin_memory_bytes())
            / u64::from(self.shards.max(1));
        ShardMemoryBytes {
            shard,
            requests: shard / 100 * MEMORY_REQUESTS_PERCENT,
            responses: shard / 100 * MEMORY_RESPONSES_PERCENT,
            state: shard
                - shard / 100 * MEMORY_REQUESTS_PERCENT
                - shard / 100 * MEMORY_RESPONSES_PERCENT,
        }
    }

    /// Each shard's memory for queue state: its state share less the
    /// journal's two caches (`2 × tail_cache_bytes`, at most half of the
    /// share: `validate` refuses more).
    pub fn queue_state_bytes(&self) -> u64 {
        self.shard_memory().state.saturating_sub(2 * self.tail_cache_bytes)
    }

    /// Listen address of shard `shard`.
    pub fn shard_listen(&self, shard: u16) -> SocketAddr {
        assert!(shard < self.shards);
        let mut address = self.listen;
        // validate() proved base port + shards - 1 fits in u16.
        address.set_port(self.listen.port() + shard);
        address
    }

    pub fn housekeeping_tick(&self) -> Duration {
        Duration::from_millis(self.housekeeping_tick_ms)
    }

    pub fn spin_before_park(&self) -> Duration {
        Duration::from_micros(self.spin_before_park_us)
    }

    pub fn io_poll_interval(&self) -> Duration {
        Duration::from_micros(self.io_poll_interval_us)
    }

    /// Checks every range. [`PartialConfig::resolve`](super::layers::PartialConfig::resolve) calls it; the broker
    /// calls it again at start in case a caller built the struct by hand.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn validate(&self, allowed_cpus: usize) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::Invalid { field: "data_dir", reason: "is empty".into() });
        }
        let shards_limit = u64::from(SHARDS_MAX).min(allowed_cpus as u64);
        check_range("cores", u64::from(self.shards), 1, shards_limit)?;
        if self.listen.port() == 0 {
            return Err(ConfigError::Invalid {
                field: "listen",
                reason: "port 0 is not allowed: shard i listens on a fixed base port + i".into(),
            });
        }
        let last_port = u32::from(self.listen.port()) + u32::from(self.shards) - 1;
        if last_port > u32::from(u16::MAX) {
            return Err(ConfigError::Invalid {
                field: "listen",
                reason: format!(
                    "base port {} + {} shards runs past port 65535",
                    self.listen.port(),
                    self.shards
                ),
            });
        }
        if let Some(admin) = self.admin_listen {
            let shard_ports = u32::from(self.listen.port())..=last_port;
            if admin.ip() == self.listen.ip() && shard_ports.contains(&u32::from(admin.port())) {
                return Err(ConfigError::Invalid {
                    field: "admin_listen",
                    reason: format!(
                        "{admin} is one of the shard ports {}..={last_port}",
                        self.listen.port()
                    ),
                });
            }
        }
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.log_filter) {
            return Err(ConfigError::Invalid { field: "log_filter", reason: error.to_string() });
        }
        check_range("spin_before_park_us", self.spin_before_park_us, 0, SPIN_BEFORE_PARK_US_MAX)?;
        check_range(
            "io_poll_interval_us",
            self.io_poll_interval_us,
            IO_POLL_INTERVAL_US_MIN,
            IO_POLL_INTERVAL_US_MAX,
        )?;
        if self.consumer_pace_percent != 0 {
            check_range(
                "consumer_pace_percent",
                u64::from(self.consumer_pace_percent),
                u64::from(CONSUMER_PACE_PERCENT_MIN),
                u64::from(CONSUMER_PACE_PERCENT_MAX),
            )?;
        }
        check_range(
            "housekeeping_tick_ms",
            self.housekeeping_tick_ms,
            HOUSEKEEPING_TICK_MS_MIN,
            HOUSEKEEPING_TICK_MS_MAX,
        )?;
        check_range("tail_cache_bytes", self.tail_cache_bytes, 0, TAIL_CACHE_BYTES_MAX)?;
        check_range("memory_bytes", self.memory_bytes, 1, crate::limits::MEMORY_BYTES_MAX)?;
        let admin_floor = self.admin_memory_floor();
        let requests = self.shard_memory().requests;
        let needed = MEMORY_REQUESTS_FRAMES_MIN * u64::from(self.frame_bytes_max);
        // The least budget that starts: each shard's requests pool at its
        // floor, and the admin pool carved off the top.
        let shard_least = needed.div_ceil(MEMORY_REQUESTS_PERCENT) * 100;
        let least = self.memory_bytes_for(shard_least * u64::from(self.shards));
        if self.memory_bytes <= admin_floor {
            return Err(ConfigError::Invalid {
                field: "memory_bytes",
                reason: format!(
                    "{} bytes cannot hold the admin port's memory pool of at least \
                     {admin_floor} bytes ({MEMORY_ADMIN_REQUESTS_MIN} API requests of \
                     {MEMORY_ADMIN_REQUEST_BYTES}: a largest body and its answer) and leave \
                     the shards any: raise memory_bytes to at least {least} or turn the admin \
                     port off (admin_listen = off)",
                    self.memory_bytes,
                ),
            });
        }
        if requests < needed {
            let admin = self.admin_memory_bytes();
            return Err(ConfigError::Invalid {
                field: "memory_bytes",
                reason: format!(
                    "{} bytes less the admin port's {admin} over {} shards leave each shard \
                     {requests} bytes for requests ({MEMORY_REQUESTS_PERCENT}%), under \
                     {MEMORY_REQUESTS_FRAMES_MIN} frames of frame_bytes_max = {} ({needed} \
                     bytes): raise memory_bytes to at least {least} or lower frame_bytes_max",
                    self.memory_bytes, self.shards, self.frame_bytes_max,
                ),
            });
        }
        // The journal caches (newest commits, chunks read back) live in the
        // state share, beside the queues' state: they must leave room in it.
        let memory = self.shard_memory();
        let caches = 2 * self.tail_cache_bytes;
        if caches > memory.state / 2 {
            return Err(ConfigError::Invalid {
                field: "tail_cache_bytes",
                reason: format!(
                    "two caches of {} bytes per shard take {caches} of the {} bytes each shard \
                     keeps for state (memory_bytes = {} less the admin port's {} over {} \
                     shards, less the requests and responses pools): at most half of it may go \
                     to caches; lower tail_cache_bytes or raise memory_bytes",
                    self.tail_cache_bytes,
                    memory.state,
                    self.memory_bytes,
                    self.admin_memory_bytes(),
                    self.shards,
                ),
            });
        }
        check_range(
            "journal_retain_bytes",
            self.journal_retain_bytes,
            0,
            crate::limits::JOURNAL_RETAIN_BYTES_MAX,
        )?;
        check_range(
            "partitions_max",
            self.partitions_max.into(),
            1,
            PARTITIONS_PER_NODE_MAX as u64,
        )?;
        let log = self.log_config();
        log.validate().map_err(|error| ConfigError::Invalid {
            field: "segment_bytes",
            reason: error.to_string(),
        })?;
        check_range(
            "connections_per_shard_max",
            u64::from(self.connections_per_shard_max),
            1,
            u64::from(CONNECTIONS_PER_SHARD_LIMIT),
        )?;
        check_range(
            "in_flight_per_connection_max",
            u64::from(self.in_flight_per_connection_max),
            1,
            u64::from(IN_FLIGHT_PER_CONNECTION_LIMIT),
        )?;
        check_range(
            "claim_waiters_per_connection_max",
            u64::from(self.claim_waiters_per_connection_max),
            1,
            u64::from(CLAIM_WAITERS_PER_CONNECTION_LIMIT),
        )?;
        check_range(
            "frame_bytes_max",
            u64::from(self.frame_bytes_max),
            u64::from(FRAME_BYTES_MAX_LOWER),
            u64::from(FRAME_BYTES_MAX_UPPER),
        )?;
        check_range(
            "idle_timeout_ms",
            self.idle_timeout_ms,
            IDLE_TIMEOUT_MS_MIN,
            IDLE_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "frame_timeout_ms",
            self.frame_timeout_ms,
            FRAME_TIMEOUT_MS_MIN,
            FRAME_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "write_timeout_ms",
            self.write_timeout_ms,
            WRITE_TIMEOUT_MS_MIN,
            WRITE_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "startup_timeout_ms",
            self.startup_timeout_ms,
            STARTUP_TIMEOUT_MS_MIN,
            STARTUP_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "shutdown_timeout_ms",
            self.shutdown_timeout_ms,
            SHUTDOWN_TIMEOUT_MS_MIN,
            SHUTDOWN_TIMEOUT_MS_MAX,
        )?;
        Ok(())
    }
}

fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange { field, value, min, max });
    }
    Ok(())
}

/// ", did you mean X?" or nothing.
pub(super) fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map(|name| format!(" (did you mean {name}?)")).unwrap_or_default()
}

/// What can be wrong with the configuration. Each variant names its source.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid: {source}{}", did_you_mean(suggestion.as_deref()))]
    ParseFile { path: PathBuf, source: Box<toml::de::Error>, suggestion: Option<&'static str> },
    #[error("environment variable {name}={value:?} is not valid: {reason}")]
    EnvVar { name: String, value: String, reason: String },
    #[error(
        "unknown environment variable {name}{}: every SPOOL_* variable spoold sees must be one \
         of its settings (see `spoold --help`) or a known non-setting ({})",
        did_you_mean(suggestion.as_deref()),
        ENV_NOT_CONFIG.join(", ")
    )]
    UnknownEnvVar { name: String, suggestion: Option<String> },
    #[error("{field} = {value} is out of range {min}..={max}")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{field} is not valid: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("auth_file: {0}")]
    Auth(#[from] crate::auth::AuthError),
    #[error("TLS: {0}")]
    Tls(#[from] crate::net::tls::TlsError),
}

/// Prefix of every environment variable the broker reads.
pub const ENV_PREFIX: &str = "SPOOL_";

/// The settings read from `SPOOL_<NAME>` (the part after the prefix), in
/// the order of [`PartialConfig`](super::layers::PartialConfig)'s fields.
pub const ENV_SETTINGS: &[&str] = &[
    "CONFIG",
    "DATA_DIR",
    "LISTEN",
    "ADMIN_LISTEN",
    "CORES",
    "LOG_FORMAT",
    "LOG",
    "SPIN_BEFORE_PARK_US",
    "IO_POLL_INTERVAL_US",
    "CONSUMER_PACE_PERCENT",
    "HOUSEKEEPING_TICK_MS",
    "SEGMENT_BYTES",
    "CONNECTIONS_PER_SHARD_MAX",
    "IN_FLIGHT_PER_CONNECTION_MAX",
    "CLAIM_WAITERS_PER_CONNECTION_MAX",
    "TAIL_CACHE_BYTES",
    "MEMORY_BYTES",
    "JOURNAL_GARBAGE_RATIO_MAX",
    "JOURNAL_RETAIN_BYTES",
    "PARTITIONS_MAX",
    "FRAME_BYTES_MAX",
    "IDLE_TIMEOUT_MS",
    "FRAME_TIMEOUT_MS",
    "WRITE_TIMEOUT_MS",
    "STARTUP_TIMEOUT_MS",
    "SHUTDOWN_TIMEOUT_MS",
    "AUTH_FILE",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "TLS_CLIENT_CA_FILE",
];

/// Tables a config file accepts besides [`FILE_KEYS`]: file only, no
/// environment variable or flag.
pub const FILE_TABLES: &[&str] = &["cluster"];

/// `SPOOL_*` variables that are not broker settings but may be in a
/// broker's environment: the failpoint build's (`SPOOL_FAILPOINTS`, also
/// warned about by a build without failpoints) and those of this
/// repository's tests and scripts, which start `spoold` from an
/// environment that holds them. Any other `SPOOL_*` name is a
/// [`ConfigError::UnknownEnvVar`], so a misspelt setting never passes
/// silently.
pub const ENV_NOT_CONFIG: &[&str] = &[
    "SPOOL_FAILPOINTS",
    "SPOOL_E2E_SPOOLD",
    "SPOOL_E2E_SPOOL",
    "SPOOL_E2E_SPOOLD_FAILPOINTS",
    "SPOOL_E2E_RELEASE_DIR",
    "SPOOL_E2E_MESSAGES",
    "SPOOL_KILLLOOP_SEED",
    "SPOOL_MODEL_SEED",
    "SPOOL_MODEL_SEEDS",
    "SPOOL_LONG",
    // The `spool` CLI's credentials, often exported in the same shell.
    "SPOOL_PRINCIPAL",
    "SPOOL_SECRET",
    // The `spool` CLI's TLS options.
    "SPOOL_TLS_CA",
    "SPOOL_TLS_SERVER_NAME",
    "SPOOL_TLS_CERT",
    "SPOOL_TLS_KEY",
];

/// The keys a config file accepts: [`ENV_SETTINGS`] without `CONFIG`, in
/// lower case.
pub const FILE_KEYS: &[&str] = &[
    "data_dir",
    "listen",
    "admin_listen",
    "cores",
    "log_format",
    "log_filter",
    "spin_before_park_us",
    "io_poll_interval_us",
    "consumer_pace_percent",
    "housekeeping_tick_ms",
    "segment_bytes",
    "connections_per_shard_max",
    "in_flight_per_connection_max",
    "claim_waiters_per_connection_max",
    "tail_cache_bytes",
    "memory_bytes",
    "journal_garbage_ratio_max",
    "journal_retain_bytes",
    "partitions_max",
    "frame_bytes_max",
    "idle_timeout_ms",
    "frame_timeout_ms",
    "write_timeout_ms",
    "startup_timeout_ms",
    "shutdown_timeout_ms",
    "auth_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::layers::edit_distance;
    use crate::control::layers::{closest, Cli, PartialConfig};
    use crate::limits::{CONSUMER_PACE_PERCENT_DEFAULT, IO_POLL_INTERVAL_US_DEFAULT};
    use clap::Parser;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    fn cli(args: &[&str]) -> Cli {
        let mut argv = vec!["spoold"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("flags parse")
    }

    // Goal: defaults alone produce a valid config that works on a fresh
    // machine. Method: resolve an empty layer with 2 CPUs.
    #[test]
    fn defaults_are_valid() {
        let config = PartialConfig::default().resolve(2).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("./spool-data"));
        assert_eq!(config.listen, "127.0.0.1:7400".parse::<SocketAddr>().unwrap());
        assert_eq!(config.shards, 2);
        assert_eq!(config.log_format, LogFormat::Human);
        assert_eq!(config.spin_before_park_us, 0);
        assert_eq!(config.housekeeping_tick_ms, 5);
        assert_eq!(config.io_poll_interval_us, IO_POLL_INTERVAL_US_DEFAULT);
        assert_eq!(config.consumer_pace_percent, CONSUMER_PACE_PERCENT_DEFAULT);
        assert_eq!(config.shard_listen(1), "127.0.0.1:7401".parse::<SocketAddr>().unwrap());
    }

    // Goal: the preempt interval is read from the environment and refused
    // outside its range with the key named. Method: resolve layers with an
    // in-range, a too-small and a too-large value.
    #[test]
    fn io_poll_interval_is_read_and_bounded() {
        let layer = |value: &str| {
            PartialConfig::from_env([("SPOOL_IO_POLL_INTERVAL_US".to_string(), value.to_string())])
                .unwrap()
        };
        assert_eq!(layer("250").resolve(2).unwrap().io_poll_interval_us, 250);
        for bad in ["99", "100001"] {
            let error = layer(bad).resolve(2).unwrap_err().to_string();
            assert!(error.contains("io_poll_interval_us"), "{error}");
        }
    }

    // Goal: the consumer pace is read from the environment, 0 turns it off,
    // and a value outside its range is refused with the key named. Method:
    // resolve layers with the default, 0, in-range and out-of-range values.
    #[test]
    fn consumer_pace_percent_is_read_and_bounded() {
        let layer = |value: &str| {
            PartialConfig::from_env([(
                "SPOOL_CONSUMER_PACE_PERCENT".to_string(),
                value.to_string(),
            )])
            .unwrap()
        };
        assert_eq!(layer("0").resolve(2).unwrap().consumer_pace_percent, 0);
        assert_eq!(layer("150").resolve(2).unwrap().consumer_pace_percent, 150);
        for bad in ["99", "1001"] {
            let error = layer(bad).resolve(2).unwrap_err().to_string();
            assert!(error.contains("consumer_pace_percent"), "{error}");
        }
    }

    // Goal: flags beat env beat file beat defaults, field by field. Method:
    // set one field in all three sources, others in two or one, and check
    // which value survives.
    #[test]
    fn precedence_is_flags_then_env_then_file_then_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.toml");
        std::fs::write(
            &path,
            "housekeeping_tick_ms = 2\nspin_before_park_us = 10\nidle_timeout_ms = 1000\n\
             log_format = \"json\"\n",
        )
        .unwrap();
        let flags = cli(&["--config", path.to_str().unwrap(), "--housekeeping-tick-ms", "7"]);
        let vars = env(&[
            ("SPOOL_HOUSEKEEPING_TICK_MS", "3"),
            ("SPOOL_SPIN_BEFORE_PARK_US", "20"),
            ("OTHER_VAR", "ignored"),
            ("SPOOL_FAILPOINTS", "ignored too: not a setting, but known"),
        ]);
        let config = BrokerConfig::load(&flags, vars, 4).unwrap();
        assert_eq!(config.housekeeping_tick_ms, 7, "flag wins");
        assert_eq!(config.spin_before_park_us, 20, "env beats file");
        assert_eq!(config.idle_timeout_ms, 1000, "file beats default");
        assert_eq!(config.log_format, LogFormat::Json, "file value kept");
        assert_eq!(config.shards, 4, "default: one shard per allowed CPU");
    }

    // Goal: the config file can come from SPOOL_CONFIG, and --config beats it.
    // Method: two files, each setting a different tick.
    #[test]
    fn config_file_from_env_and_flag_overrides_it() {
        let dir = tempfile::tempdir().unwrap();
        let env_file = dir.path().join("env.toml");
        let flag_file = dir.path().join("flag.toml");
        std::fs::write(&env_file, "housekeeping_tick_ms = 3\n").unwrap();
        std::fs::write(&flag_file, "housekeeping_tick_ms = 9\n").unwrap();
        let vars = env(&[("SPOOL_CONFIG", env_file.to_str().unwrap())]);
        let from_env = BrokerConfig::load(&cli(&[]), vars.clone(), 1).unwrap();
        assert_eq!(from_env.housekeeping_tick_ms, 3);
        let from_flag =
            BrokerConfig::load(&cli(&["--config", flag_file.to_str().unwrap()]), vars, 1).unwrap();
        assert_eq!(from_flag.housekeeping_tick_ms, 9);
    }

    // Goal: each kind of bad input gives its own typed error naming the
    // culprit. Method: one bad input per source and per range.
    #[test]
    fn validation_errors_are_typed_and_name_the_field() {
        let tick = PartialConfig { housekeeping_tick_ms: Some(11), ..Default::default() };
        assert!(matches!(
            tick.resolve(1),
            Err(ConfigError::OutOfRange {
                field: "housekeeping_tick_ms",
                value: 11,
                min: 1,
                max: 10
            })
        ));
        let zero_tick = PartialConfig { housekeeping_tick_ms: Some(0), ..Default::default() };
        assert!(matches!(
            zero_tick.resolve(1),
            Err(ConfigError::OutOfRange { field: "housekeeping_tick_ms", .. })
        ));
        let too_many = PartialConfig { cores: Some(3), ..Default::default() };
        assert!(matches!(
            too_many.resolve(2),
            Err(ConfigError::OutOfRange { field: "cores", value: 3, max: 2, .. })
        ));
        let port_zero =
            PartialConfig { listen: Some("127.0.0.1:0".parse().unwrap()), ..Default::default() };
        assert!(matches!(port_zero.resolve(1), Err(ConfigError::Invalid { field: "listen", .. })));
        let port_overflow = PartialConfig {
            listen: Some("127.0.0.1:65535".parse().unwrap()),
            cores: Some(2),
            ..Default::default()
        };
        assert!(matches!(
            port_overflow.resolve(2),
            Err(ConfigError::Invalid { field: "listen", .. })
        ));
        let retain = PartialConfig {
            journal_retain_bytes: Some(crate::limits::JOURNAL_RETAIN_BYTES_MAX + 1),
            ..Default::default()
        };
        assert!(matches!(
            retain.resolve(1),
            Err(ConfigError::OutOfRange { field: "journal_retain_bytes", .. })
        ));
        let frame = PartialConfig { frame_bytes_max: Some(100), ..Default::default() };
        assert!(matches!(
            frame.resolve(1),
            Err(ConfigError::OutOfRange { field: "frame_bytes_max", .. })
        ));
        let cache = PartialConfig { tail_cache_bytes: Some(1 << 40), ..Default::default() };
        assert!(matches!(
            cache.resolve(1),
            Err(ConfigError::OutOfRange { field: "tail_cache_bytes", .. })
        ));
        // A budget whose requests pool cannot hold two largest frames, and
        // journal caches over half the state share, are refused with the
        // figures; a budget that fits resolves with its pools.
        let small = PartialConfig { memory_bytes: Some(16 << 20), ..Default::default() };
        match small.resolve(1) {
            Err(ConfigError::Invalid { field: "memory_bytes", reason }) => {
                assert!(reason.contains("raise memory_bytes to at least"), "{reason}");
            }
            other => panic!("a 16 MiB budget: {other:?}"),
        }
        let caches = PartialConfig {
            memory_bytes: Some(64 << 20),
            tail_cache_bytes: Some(16 << 20),
            ..Default::default()
        };
        assert!(matches!(
            caches.resolve(1),
            Err(ConfigError::Invalid { field: "tail_cache_bytes", .. })
        ));
        let fits = PartialConfig { memory_bytes: Some(64 << 20), ..Default::default() };
        let resolved = fits.resolve(1).unwrap();
        let pools = resolved.shard_memory();
        // 5 % of 64 MiB is under the admin pool's floor (two 4 MiB
        // requests): the floor comes off the top, the shard gets the rest.
        let admin = resolved.admin_memory_bytes();
        assert_eq!(admin, 8 << 20);
        assert_eq!(
            (pools.shard, pools.requests + pools.responses + pools.state),
            (56 << 20, 56 << 20)
        );
        let filter = PartialConfig { log_filter: Some("info,[[[".into()), ..Default::default() };
        assert!(matches!(filter.resolve(1), Err(ConfigError::Invalid { field: "log_filter", .. })));

        let bad_env = PartialConfig::from_env(env(&[("SPOOL_CORES", "many")]));
        match bad_env {
            Err(ConfigError::EnvVar { name, value, .. }) => {
                assert_eq!(name, "SPOOL_CORES");
                assert_eq!(value, "many");
            }
            other => panic!("expected EnvVar error, got {other:?}"),
        }
        let bad_format = PartialConfig::from_env(env(&[("SPOOL_LOG_FORMAT", "xml")]));
        assert!(matches!(bad_format, Err(ConfigError::EnvVar { .. })));
    }

    // Goal: the admin port's pool comes off the top of memory_bytes — its
    // share between a floor and a ceiling, none with the admin port off —
    // and a budget that cannot hold its floor is refused naming the
    // figures, with advice that itself starts. Method: resolve budgets
    // around each bend, two shards, admin on and off.
    #[test]
    fn admin_pool_comes_off_the_top_of_memory_bytes() {
        let with = |memory: u64, admin: Option<AdminListen>| PartialConfig {
            memory_bytes: Some(memory),
            admin_listen: admin,
            ..Default::default()
        };
        let floor = MEMORY_ADMIN_REQUESTS_MIN * MEMORY_ADMIN_REQUEST_BYTES;
        let ceiling = MEMORY_ADMIN_REQUESTS_MAX * MEMORY_ADMIN_REQUEST_BYTES;
        for (memory, admin) in [
            (160 << 20, floor),
            (1 << 30, (1u64 << 30) / 100 * MEMORY_ADMIN_PERCENT),
            (64 << 30, ceiling),
        ] {
            let resolved = with(memory, None).resolve(2).unwrap();
            assert_eq!(resolved.admin_memory_bytes(), admin, "{memory}");
            assert_eq!(resolved.shard_memory().shard, (memory - admin) / 2, "{memory}");
            let off = with(memory, Some(AdminListen::Off)).resolve(2).unwrap();
            assert_eq!(off.admin_memory_bytes(), 0);
            assert_eq!(off.shard_memory().shard, memory / 2, "admin off: all to the shards");
        }
        // Under the floor: refused, naming the floor and what would start.
        match with(floor, None).resolve(1) {
            Err(ConfigError::Invalid { field: "memory_bytes", reason }) => {
                assert!(reason.contains(&floor.to_string()), "{reason}");
                assert!(reason.contains("admin_listen = off"), "{reason}");
            }
            other => panic!("a budget of the admin floor: {other:?}"),
        }
        // Each refusal's advice is a budget that starts, and one byte less
        // of it does not (with the admin pool at its floor and at its share).
        for (shards, frame) in [(1usize, 4u64 << 20), (2, 4 << 20), (8, 64 << 20)] {
            let config = |memory: u64| PartialConfig {
                memory_bytes: Some(memory),
                frame_bytes_max: Some(u32::try_from(frame).unwrap()),
                tail_cache_bytes: Some(1 << 20),
                ..Default::default()
            };
            let Err(ConfigError::Invalid { reason, .. }) = config(1 << 20).resolve(shards) else {
                panic!("1 MiB starts");
            };
            let least: u64 = reason
                .split("raise memory_bytes to at least ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|figure| figure.parse().ok())
                .unwrap_or_else(|| panic!("no figure in {reason}"));
            assert!(config(least).resolve(shards).is_ok(), "{least}: {reason}");
            assert!(config(least - 1).resolve(shards).is_err(), "{least} - 1: {reason}");
        }
    }

    // Goal: a misspelt or unknown SPOOL_* variable is an error naming the
    // closest setting, while the known non-settings (failpoints, test
    // harness) pass. Method: typos of settings, a name close to nothing,
    // and every ENV_NOT_CONFIG name.
    #[test]
    fn unknown_env_vars_are_refused_with_the_closest_setting() {
        let cases = [
            ("SPOOL_DATADIR", Some("SPOOL_DATA_DIR")),
            ("SPOOL_CORE", Some("SPOOL_CORES")),
            ("SPOOL_IDLE_TIMEOUT", Some("SPOOL_IDLE_TIMEOUT_MS")),
            ("SPOOL_log_format", Some("SPOOL_LOG_FORMAT")),
            ("SPOOL_FAILPOINT", Some("SPOOL_FAILPOINTS")),
            ("SPOOL_WHATEVER_ELSE_ENTIRELY", None),
        ];
        for (name, expected) in cases {
            match PartialConfig::from_env(env(&[(name, "1")])) {
                Err(error @ ConfigError::UnknownEnvVar { .. }) => {
                    let text = error.to_string();
                    let ConfigError::UnknownEnvVar { name: named, suggestion } = error else {
                        unreachable!()
                    };
                    assert_eq!(named, name);
                    assert_eq!(suggestion.as_deref(), expected, "{name}");
                    assert!(text.contains(name), "{text}");
                    if let Some(expected) = expected {
                        assert!(text.contains(&format!("did you mean {expected}?")), "{text}");
                    }
                }
                other => panic!("{name}: expected UnknownEnvVar, got {other:?}"),
            }
        }
        let known: Vec<(&str, &str)> = ENV_NOT_CONFIG.iter().map(|name| (*name, "x")).collect();
        assert_eq!(PartialConfig::from_env(env(&known)).unwrap(), PartialConfig::default());
        // Every setting name is accepted (and so never reported unknown).
        for setting in ENV_SETTINGS {
            let name = format!("{ENV_PREFIX}{setting}");
            let result = PartialConfig::from_env(vec![(name.clone(), "1".to_owned())]);
            assert!(!matches!(result, Err(ConfigError::UnknownEnvVar { .. })), "{name}");
        }
    }

    // Goal: the admin port defaults to 127.0.0.1:7480, is set or turned off
    // from every source, and may not collide with a shard port. Method:
    // resolve layers from defaults, env, file and flags.
    #[test]
    fn admin_listen_defaults_sets_turns_off_and_avoids_shard_ports() {
        let config = PartialConfig::default().resolve(2).unwrap();
        assert_eq!(config.admin_listen, Some(DEFAULT_ADMIN_LISTEN));
        let off = PartialConfig::from_env(env(&[("SPOOL_ADMIN_LISTEN", "off")])).unwrap();
        assert_eq!(off.resolve(2).unwrap().admin_listen, None);
        let file = PartialConfig::from_toml("admin_listen = \"127.0.0.1:9100\"\n").unwrap();
        assert_eq!(file.resolve(2).unwrap().admin_listen, Some("127.0.0.1:9100".parse().unwrap()));
        let flags = cli(&["--admin-listen", "off"]).to_partial();
        assert_eq!(flags.resolve(2).unwrap().admin_listen, None);
        assert!(PartialConfig::from_env(env(&[("SPOOL_ADMIN_LISTEN", "nope")])).is_err());
        let clash = PartialConfig {
            admin_listen: Some(AdminListen::At("127.0.0.1:7401".parse().unwrap())),
            cores: Some(2),
            ..Default::default()
        };
        assert!(matches!(
            clash.resolve(2),
            Err(ConfigError::Invalid { field: "admin_listen", .. })
        ));
    }

    // Goal: the suggestion picks the nearest candidate and gives up when
    // nothing is near. Method: direct calls.
    #[test]
    fn closest_picks_the_nearest_candidate_or_none() {
        let candidates = ["data_dir", "listen", "cores"];
        assert_eq!(closest("dat_dir", candidates), Some("data_dir"));
        assert_eq!(closest("LISTN", candidates), Some("listen"));
        assert_eq!(closest("zzzzzzzz", candidates), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    // Goal: file errors name the file; unknown keys are rejected (typos must
    // not pass silently). Method: a missing file and a file with a typo.
    // Goal: the name lists behind "did you mean" (FILE_KEYS, ENV_SETTINGS)
    // hold every setting the parsers accept, so a new setting cannot be
    // left out of the suggestions. Method: serde's unknown-field error
    // lists every field of `PartialConfig`; compare that set with
    // FILE_KEYS, and FILE_KEYS with ENV_SETTINGS (upper case, `LOG` for
    // `log_filter`, plus `CONFIG`).
    #[test]
    fn setting_name_lists_match_the_parsers() {
        let error = PartialConfig::from_toml("no_such_setting = 1\n").unwrap_err();
        let message = error.message();
        let expected =
            message.split("expected one of").nth(1).unwrap_or_else(|| panic!("{message}"));
        let mut fields: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        fields.sort_unstable();
        let mut file_keys = FILE_KEYS.to_vec();
        file_keys.extend(FILE_TABLES);
        file_keys.sort_unstable();
        assert_eq!(fields, file_keys, "FILE_KEYS against PartialConfig's fields");
        let mut from_files: Vec<String> = FILE_KEYS
            .iter()
            .map(|key| if *key == "log_filter" { "LOG".to_owned() } else { key.to_uppercase() })
            .chain(std::iter::once("CONFIG".to_owned()))
            .collect();
        from_files.sort_unstable();
        let mut env_settings: Vec<String> =
            ENV_SETTINGS.iter().map(|name| (*name).to_owned()).collect();
        env_settings.sort_unstable();
        assert_eq!(env_settings, from_files, "ENV_SETTINGS against FILE_KEYS");
    }

    // Goal: a `[cluster]` table reaches the resolved config, `listen`
    // defaults to this node's client address, a `listen` that disagrees
    // and a table that does not validate are refused naming the field.
    // Method: resolve small files.
    #[test]
    fn the_cluster_table_resolves_with_its_listen() {
        let table = |node: u64, extra: &str| {
            format!(
                "{extra}\n[cluster]\nnode_id = {node}\nsecret_file = \"cluster.secret\"\n\
                 nodes = [\n\
                 {{ id = 1, client = \"127.0.0.1:7400\", peer = \"127.0.0.1:7500\", failure_domain = \"a\" }},\n\
                 {{ id = 2, client = \"127.0.0.1:7410\", peer = \"127.0.0.1:7510\", failure_domain = \"b\" }},\n\
                 {{ id = 3, client = \"127.0.0.1:7420\", peer = \"127.0.0.1:7520\", failure_domain = \"c\" }},\n]\n"
            )
        };
        let resolve = |text: &str| PartialConfig::from_toml(text).unwrap().resolve(1);
        let config = resolve(&table(2, "admin_listen = \"off\"")).unwrap();
        assert_eq!(config.listen, "127.0.0.1:7410".parse::<SocketAddr>().unwrap());
        assert_eq!(config.cluster.as_ref().unwrap().node_id, 2);
        let same =
            resolve(&table(3, "admin_listen = \"off\"\nlisten = \"127.0.0.1:7420\"")).unwrap();
        assert_eq!(same.listen, "127.0.0.1:7420".parse::<SocketAddr>().unwrap());
        let error = resolve(&table(3, "listen = \"127.0.0.1:9000\"")).unwrap_err().to_string();
        assert!(error.contains("listen") && error.contains("127.0.0.1:7420"), "{error}");
        let error = resolve(&table(9, "")).unwrap_err().to_string();
        assert!(error.contains("cluster") && error.contains("node_id = 9"), "{error}");
        assert!(resolve("admin_listen = \"off\"").unwrap().cluster.is_none());
    }

    #[test]
    fn file_errors_name_the_file_and_reject_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        match PartialConfig::from_file(&missing) {
            Err(ConfigError::ReadFile { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected ReadFile, got {other:?}"),
        }
        let typo = dir.path().join("typo.toml");
        std::fs::write(&typo, "housekeeping_tick = 5\n").unwrap();
        match PartialConfig::from_file(&typo) {
            Err(error @ ConfigError::ParseFile { .. }) => {
                let text = error.to_string();
                assert!(text.contains("typo.toml"), "{text}");
                assert!(text.contains("housekeeping_tick"), "{text}");
                assert!(text.contains("did you mean housekeeping_tick_ms?"), "{text}");
            }
            other => panic!("expected ParseFile, got {other:?}"),
        }
        let wrong_type = dir.path().join("wrong.toml");
        std::fs::write(&wrong_type, "cores = \"two\"\n").unwrap();
        assert!(matches!(
            PartialConfig::from_file(&wrong_type),
            Err(ConfigError::ParseFile { .. })
        ));
    }

    // Goal: every field the file accepts is also settable by env and flag, so
    // the three sources stay in step. Method: set all of them everywhere.
    #[test]
    fn all_fields_settable_from_every_source() {
        let file = PartialConfig::from_toml(
            "data_dir = \"/d\"\nlisten = \"127.0.0.1:9000\"\ncores = 1\nlog_format = \"json\"\n\
             log_filter = \"debug\"\nspin_before_park_us = 5\nhousekeeping_tick_ms = 4\n\
             tail_cache_bytes = 65536\n\
             connections_per_shard_max = 9\nin_flight_per_connection_max = 8\n\
             frame_bytes_max = 8192\nidle_timeout_ms = 500\nframe_timeout_ms = 400\n\
             write_timeout_ms = 300\nstartup_timeout_ms = 200\nshutdown_timeout_ms = 150\n",
        )
        .unwrap();
        let from_env = PartialConfig::from_env(env(&[
            ("SPOOL_DATA_DIR", "/d"),
            ("SPOOL_LISTEN", "127.0.0.1:9000"),
            ("SPOOL_CORES", "1"),
            ("SPOOL_LOG_FORMAT", "json"),
            ("SPOOL_LOG", "debug"),
            ("SPOOL_SPIN_BEFORE_PARK_US", "5"),
            ("SPOOL_HOUSEKEEPING_TICK_MS", "4"),
            ("SPOOL_TAIL_CACHE_BYTES", "65536"),
            ("SPOOL_CONNECTIONS_PER_SHARD_MAX", "9"),
            ("SPOOL_IN_FLIGHT_PER_CONNECTION_MAX", "8"),
            ("SPOOL_FRAME_BYTES_MAX", "8192"),
            ("SPOOL_IDLE_TIMEOUT_MS", "500"),
            ("SPOOL_FRAME_TIMEOUT_MS", "400"),
            ("SPOOL_WRITE_TIMEOUT_MS", "300"),
            ("SPOOL_STARTUP_TIMEOUT_MS", "200"),
            ("SPOOL_SHUTDOWN_TIMEOUT_MS", "150"),
        ]))
        .unwrap();
        let from_flags = cli(&[
            "--data-dir=/d",
            "--listen=127.0.0.1:9000",
            "--cores=1",
            "--log-format=json",
            "--log-filter=debug",
            "--spin-before-park-us=5",
            "--housekeeping-tick-ms=4",
            "--tail-cache-bytes=65536",
            "--connections-per-shard-max=9",
            "--in-flight-per-connection-max=8",
            "--frame-bytes-max=8192",
            "--idle-timeout-ms=500",
            "--frame-timeout-ms=400",
            "--write-timeout-ms=300",
            "--startup-timeout-ms=200",
            "--shutdown-timeout-ms=150",
        ])
        .to_partial();
        assert_eq!(file, from_env);
        assert_eq!(file, from_flags);
        let config = file.resolve(1).unwrap();
        assert_eq!(config.frame_bytes_max, 8192);
        assert_eq!(config.shutdown_timeout_ms, 150);
        assert_eq!(config.log_config().tail_cache_bytes, 65536);
    }

    // Goal: no auth file means authentication off; an auth file from the
    // file, env or flag turns it on with its principals; a bad auth file
    // is a typed error naming it. Method: a hashed secret in a temp file.
    #[test]
    fn auth_file_turns_authentication_on_from_every_source() {
        let config = PartialConfig::default().resolve(2).unwrap();
        assert!(!config.auth.is_enabled());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        let hash = crate::auth::hash_secret("s3cret").unwrap();
        std::fs::write(
            &path,
            format!("[[principals]]\nname = \"ops\"\nsecret_hash = \"{hash}\"\n"),
        )
        .unwrap();
        let shown = path.display().to_string();
        let layers = [
            PartialConfig::from_toml(&format!("auth_file = {shown:?}\n")).unwrap(),
            PartialConfig::from_env(env(&[("SPOOL_AUTH_FILE", shown.as_str())])).unwrap(),
            cli(&[format!("--auth-file={shown}").as_str()]).to_partial(),
        ];
        for layer in layers {
            let config = layer.resolve(2).unwrap();
            assert!(config.auth.is_enabled());
            assert_eq!(config.auth.principal_count(), 1);
            assert_eq!(config.auth_file.as_deref(), Some(path.as_path()));
        }
        std::fs::write(&path, "[[principals]]\nname = \"ops\"\nsecret_hash = \"x\"\n").unwrap();
        let layer = PartialConfig { auth_file: Some(path.clone()), ..PartialConfig::default() };
        let error = layer.resolve(2).unwrap_err();
        assert!(matches!(error, ConfigError::Auth(_)), "{error:?}");
        assert!(error.to_string().contains("auth.toml"), "{error}");
        // The CLI's credentials may sit in spoold's environment.
        let quiet =
            PartialConfig::from_env(env(&[("SPOOL_PRINCIPAL", "a"), ("SPOOL_SECRET", "b")]));
        assert!(quiet.is_ok());
    }
}
