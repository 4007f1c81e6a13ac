//! Broker configuration: one validated [`BrokerConfig`] built from layers.
//!
//! Owns the list of runtime knobs and the precedence between sources (their
//! defaults and allowed ranges are named in `crate::limits`, with the
//! relations between them checked at compile time): command-line flags win over `SPOOL_*`
//! environment variables, which win over the TOML file (`--config FILE` or
//! `SPOOL_CONFIG`), which wins over the defaults. Every source is parsed into
//! a [`PartialConfig`] (all fields optional); the layers are overlaid and the
//! result is validated once, at start, into a [`BrokerConfig`] whose values are
//! all inside their ranges. It does not read the data directory or bind ports:
//! those checks need the environment and live with the code that uses it.
//!
//! Defaults work on a fresh machine: `./spool-data`, `127.0.0.1:7400` (shard
//! `i` listens on port `7400 + i`), one shard per allowed CPU.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest `spin_before_park` (defined in [`crate::limits`] with the
/// other ranges; re-exported for the load generator's existing path).
pub use crate::limits::SPIN_BEFORE_PARK_US_MAX;
use crate::limits::{
    CLAIM_WAITERS_PER_CONNECTION_DEFAULT, CLAIM_WAITERS_PER_CONNECTION_LIMIT,
    CONNECTIONS_PER_SHARD_DEFAULT, CONNECTIONS_PER_SHARD_LIMIT, CONSUMER_PACE_PERCENT_DEFAULT,
    CONSUMER_PACE_PERCENT_MAX, CONSUMER_PACE_PERCENT_MIN, FRAME_BYTES_MAX_DEFAULT,
    FRAME_BYTES_MAX_LOWER, FRAME_BYTES_MAX_UPPER, FRAME_TIMEOUT_MS_DEFAULT, FRAME_TIMEOUT_MS_MAX,
    FRAME_TIMEOUT_MS_MIN, HOUSEKEEPING_TICK_MS_DEFAULT, HOUSEKEEPING_TICK_MS_MAX,
    HOUSEKEEPING_TICK_MS_MIN, IDLE_TIMEOUT_MS_DEFAULT, IDLE_TIMEOUT_MS_MAX, IDLE_TIMEOUT_MS_MIN,
    IN_FLIGHT_PER_CONNECTION_DEFAULT, IN_FLIGHT_PER_CONNECTION_LIMIT, IO_POLL_INTERVAL_US_DEFAULT,
    IO_POLL_INTERVAL_US_MAX, IO_POLL_INTERVAL_US_MIN, PARTITIONS_MAX_DEFAULT,
    PARTITIONS_PER_NODE_MAX, SEGMENT_BYTES_DEFAULT, SHARDS_MAX, SHUTDOWN_TIMEOUT_MS_DEFAULT,
    SHUTDOWN_TIMEOUT_MS_MAX, SHUTDOWN_TIMEOUT_MS_MIN, STARTUP_TIMEOUT_MS_DEFAULT,
    STARTUP_TIMEOUT_MS_MAX, STARTUP_TIMEOUT_MS_MIN, TAIL_CACHE_BYTES_DEFAULT, TAIL_CACHE_BYTES_MAX,
    WRITE_TIMEOUT_MS_DEFAULT, WRITE_TIMEOUT_MS_MAX, WRITE_TIMEOUT_MS_MIN,
};
use clap::{Parser, ValueEnum};
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
pub struct Ratio(f64);

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
/// [`PartialConfig::resolve`]; every value is inside its documented range.
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
}

impl BrokerConfig {
    /// Builds the configuration from flags, the process environment and the
    /// file named by `--config` or `SPOOL_CONFIG`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the source and field that is wrong.
    pub fn load(
        cli: &Cli,
        env: impl IntoIterator<Item = (String, String)>,
        allowed_cpus: usize,
    ) -> Result<BrokerConfig, ConfigError> {
        let env_layer = PartialConfig::from_env(env)?;
        let file_path = cli.config.clone().or_else(|| env_layer.config_file.clone());
        let file_layer = match &file_path {
            Some(path) => PartialConfig::from_file(path)?,
            None => PartialConfig::default(),
        };
        file_layer.overlay(env_layer).overlay(cli.to_partial()).resolve(allowed_cpus)
    }

    /// The log settings every shard journal of this broker derives its own
    /// from.
    pub fn log_config(&self) -> crate::log::LogConfig {
        crate::log::LogConfig {
            segment_bytes: self.segment_bytes,
            tail_cache_bytes: self.tail_cache_bytes,
            ..crate::log::LogConfig::default()
        }
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

    /// Checks every range. [`PartialConfig::resolve`] calls it; the broker
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

/// One configuration layer: every field optional. The TOML file uses these
/// field names; unknown keys are an error so typos do not pass silently.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialConfig {
    /// Only meaningful from the environment (`SPOOL_CONFIG`); not a file key.
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<AdminListen>,
    pub cores: Option<u16>,
    pub log_format: Option<LogFormat>,
    pub log_filter: Option<String>,
    pub spin_before_park_us: Option<u64>,
    pub io_poll_interval_us: Option<u64>,
    pub consumer_pace_percent: Option<u32>,
    pub housekeeping_tick_ms: Option<u64>,
    pub segment_bytes: Option<u64>,
    pub tail_cache_bytes: Option<u64>,
    pub journal_garbage_ratio_max: Option<Ratio>,
    pub journal_retain_bytes: Option<u64>,
    pub partitions_max: Option<u32>,
    pub connections_per_shard_max: Option<u32>,
    pub in_flight_per_connection_max: Option<u32>,
    pub claim_waiters_per_connection_max: Option<u32>,
    pub frame_bytes_max: Option<u32>,
    pub idle_timeout_ms: Option<u64>,
    pub frame_timeout_ms: Option<u64>,
    pub write_timeout_ms: Option<u64>,
    pub startup_timeout_ms: Option<u64>,
    pub shutdown_timeout_ms: Option<u64>,
    pub auth_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_client_ca_file: Option<PathBuf>,
}

/// Prefix of every environment variable the broker reads.
pub const ENV_PREFIX: &str = "SPOOL_";

/// The settings read from `SPOOL_<NAME>` (the part after the prefix), in
/// the order of [`PartialConfig`]'s fields.
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

/// ", did you mean X?" or nothing.
fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map(|name| format!(" (did you mean {name}?)")).unwrap_or_default()
}

/// Edit distance (insertions, deletions, substitutions) between two names.
fn edit_distance(left: &str, right: &str) -> usize {
    let right: Vec<char> = right.chars().collect();
    let mut previous: Vec<usize> = (0..=right.len()).collect();
    for (row, left_char) in left.chars().enumerate() {
        let mut current = vec![row + 1; right.len() + 1];
        for (column, right_char) in right.iter().enumerate() {
            let substitution = previous[column] + usize::from(left_char != *right_char);
            current[column + 1] =
                substitution.min(previous[column + 1] + 1).min(current[column] + 1);
        }
        previous = current;
    }
    previous[right.len()]
}

/// The candidate closest to `name` (case-insensitive), if it is close
/// enough to be a likely typo: at most a third of the name's length in
/// edits (at least 2). Ties go to the earlier candidate.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.to_ascii_uppercase();
    let limit = (name.len() / 3).max(2);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(&name, &candidate.to_ascii_uppercase()), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

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

/// The closest file key to the unknown key a TOML error names, if any.
fn suggest_file_key(error: &toml::de::Error) -> Option<&'static str> {
    let unknown = error.message().strip_prefix("unknown field `")?.split('`').next()?;
    closest(unknown, FILE_KEYS.iter().copied())
}

fn parse_env<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    value.trim().parse::<T>().map_err(|error| ConfigError::EnvVar {
        name: name.to_owned(),
        value: value.to_owned(),
        reason: error.to_string(),
    })
}

impl PartialConfig {
    /// Parses a TOML file.
    ///
    /// # Errors
    /// [`ConfigError::ReadFile`] or [`ConfigError::ParseFile`].
    pub fn from_file(path: &Path) -> Result<PartialConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::ReadFile { path: path.to_owned(), source })?;
        Self::from_toml(&text).map_err(|source| {
            let suggestion = suggest_file_key(&source);
            ConfigError::ParseFile { path: path.to_owned(), source, suggestion }
        })
    }

    /// Parses TOML text.
    ///
    /// # Errors
    /// The TOML error (unknown keys included).
    pub fn from_toml(text: &str) -> Result<PartialConfig, Box<toml::de::Error>> {
        toml::from_str(text).map_err(Box::new)
    }

    /// Reads the `SPOOL_*` variables among `vars`. Variables with other
    /// prefixes, and the known non-settings in [`ENV_NOT_CONFIG`], are
    /// ignored.
    ///
    /// # Errors
    /// [`ConfigError::EnvVar`] for a known variable whose value does not
    /// parse; [`ConfigError::UnknownEnvVar`] (naming the closest setting)
    /// for any other `SPOOL_*` name.
    pub fn from_env(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<PartialConfig, ConfigError> {
        let mut layer = PartialConfig::default();
        for (name, value) in vars {
            let Some(key) = name.strip_prefix(ENV_PREFIX) else { continue };
            match key {
                "CONFIG" => layer.config_file = Some(PathBuf::from(&value)),
                "DATA_DIR" => layer.data_dir = Some(PathBuf::from(&value)),
                "LISTEN" => layer.listen = Some(parse_env(&name, &value)?),
                "ADMIN_LISTEN" => layer.admin_listen = Some(parse_env(&name, &value)?),
                "CORES" => layer.cores = Some(parse_env(&name, &value)?),
                "LOG_FORMAT" => layer.log_format = Some(parse_env(&name, &value)?),
                "LOG" => layer.log_filter = Some(value.clone()),
                "SPIN_BEFORE_PARK_US" => {
                    layer.spin_before_park_us = Some(parse_env(&name, &value)?)
                }
                "IO_POLL_INTERVAL_US" => {
                    layer.io_poll_interval_us = Some(parse_env(&name, &value)?)
                }
                "CONSUMER_PACE_PERCENT" => {
                    layer.consumer_pace_percent = Some(parse_env(&name, &value)?)
                }
                "HOUSEKEEPING_TICK_MS" => {
                    layer.housekeeping_tick_ms = Some(parse_env(&name, &value)?)
                }
                "SEGMENT_BYTES" => layer.segment_bytes = Some(parse_env(&name, &value)?),
                "TAIL_CACHE_BYTES" => layer.tail_cache_bytes = Some(parse_env(&name, &value)?),
                "JOURNAL_GARBAGE_RATIO_MAX" => {
                    layer.journal_garbage_ratio_max = Some(parse_env(&name, &value)?)
                }
                "JOURNAL_RETAIN_BYTES" => {
                    layer.journal_retain_bytes = Some(parse_env(&name, &value)?)
                }
                "PARTITIONS_MAX" => layer.partitions_max = Some(parse_env(&name, &value)?),
                "CONNECTIONS_PER_SHARD_MAX" => {
                    layer.connections_per_shard_max = Some(parse_env(&name, &value)?)
                }
                "IN_FLIGHT_PER_CONNECTION_MAX" => {
                    layer.in_flight_per_connection_max = Some(parse_env(&name, &value)?)
                }
                "CLAIM_WAITERS_PER_CONNECTION_MAX" => {
                    layer.claim_waiters_per_connection_max = Some(parse_env(&name, &value)?)
                }
                "FRAME_BYTES_MAX" => layer.frame_bytes_max = Some(parse_env(&name, &value)?),
                "IDLE_TIMEOUT_MS" => layer.idle_timeout_ms = Some(parse_env(&name, &value)?),
                "FRAME_TIMEOUT_MS" => layer.frame_timeout_ms = Some(parse_env(&name, &value)?),
                "WRITE_TIMEOUT_MS" => layer.write_timeout_ms = Some(parse_env(&name, &value)?),
                "STARTUP_TIMEOUT_MS" => layer.startup_timeout_ms = Some(parse_env(&name, &value)?),
                "SHUTDOWN_TIMEOUT_MS" => {
                    layer.shutdown_timeout_ms = Some(parse_env(&name, &value)?)
                }
                "AUTH_FILE" => layer.auth_file = Some(PathBuf::from(&value)),
                "TLS_CERT_FILE" => layer.tls_cert_file = Some(PathBuf::from(&value)),
                "TLS_KEY_FILE" => layer.tls_key_file = Some(PathBuf::from(&value)),
                "TLS_CLIENT_CA_FILE" => layer.tls_client_ca_file = Some(PathBuf::from(&value)),
                _ if ENV_NOT_CONFIG.contains(&name.as_str()) => {}
                _ => {
                    let others =
                        ENV_NOT_CONFIG.iter().filter_map(|other| other.strip_prefix(ENV_PREFIX));
                    let suggestion = closest(key, ENV_SETTINGS.iter().copied().chain(others))
                        .map(|found| format!("{ENV_PREFIX}{found}"));
                    return Err(ConfigError::UnknownEnvVar { name, suggestion });
                }
            }
        }
        Ok(layer)
    }

    /// Returns `self` with every field that `higher` sets replaced by it.
    pub fn overlay(self, higher: PartialConfig) -> PartialConfig {
        PartialConfig {
            config_file: higher.config_file.or(self.config_file),
            data_dir: higher.data_dir.or(self.data_dir),
            listen: higher.listen.or(self.listen),
            admin_listen: higher.admin_listen.or(self.admin_listen),
            cores: higher.cores.or(self.cores),
            log_format: higher.log_format.or(self.log_format),
            log_filter: higher.log_filter.or(self.log_filter),
            spin_before_park_us: higher.spin_before_park_us.or(self.spin_before_park_us),
            io_poll_interval_us: higher.io_poll_interval_us.or(self.io_poll_interval_us),
            consumer_pace_percent: higher.consumer_pace_percent.or(self.consumer_pace_percent),
            housekeeping_tick_ms: higher.housekeeping_tick_ms.or(self.housekeeping_tick_ms),
            segment_bytes: higher.segment_bytes.or(self.segment_bytes),
            tail_cache_bytes: higher.tail_cache_bytes.or(self.tail_cache_bytes),
            journal_garbage_ratio_max: higher
                .journal_garbage_ratio_max
                .or(self.journal_garbage_ratio_max),
            journal_retain_bytes: higher.journal_retain_bytes.or(self.journal_retain_bytes),
            partitions_max: higher.partitions_max.or(self.partitions_max),
            connections_per_shard_max: higher
                .connections_per_shard_max
                .or(self.connections_per_shard_max),
            in_flight_per_connection_max: higher
                .in_flight_per_connection_max
                .or(self.in_flight_per_connection_max),
            claim_waiters_per_connection_max: higher
                .claim_waiters_per_connection_max
                .or(self.claim_waiters_per_connection_max),
            frame_bytes_max: higher.frame_bytes_max.or(self.frame_bytes_max),
            idle_timeout_ms: higher.idle_timeout_ms.or(self.idle_timeout_ms),
            frame_timeout_ms: higher.frame_timeout_ms.or(self.frame_timeout_ms),
            write_timeout_ms: higher.write_timeout_ms.or(self.write_timeout_ms),
            startup_timeout_ms: higher.startup_timeout_ms.or(self.startup_timeout_ms),
            shutdown_timeout_ms: higher.shutdown_timeout_ms.or(self.shutdown_timeout_ms),
            auth_file: higher.auth_file.or(self.auth_file),
            tls_cert_file: higher.tls_cert_file.or(self.tls_cert_file),
            tls_key_file: higher.tls_key_file.or(self.tls_key_file),
            tls_client_ca_file: higher.tls_client_ca_file.or(self.tls_client_ca_file),
        }
    }

    /// Fills unset fields with defaults and validates. `allowed_cpus` is the
    /// number of CPUs this process may run on: the default shard count and
    /// the upper bound of `cores`.
    ///
    /// # Errors
    /// The first invalid field.
    pub fn resolve(self, allowed_cpus: usize) -> Result<BrokerConfig, ConfigError> {
        let default_shards = allowed_cpus.clamp(1, usize::from(SHARDS_MAX)) as u16;
        let config = BrokerConfig {
            data_dir: self.data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            listen: self.listen.unwrap_or(DEFAULT_LISTEN),
            shards: self.cores.unwrap_or(default_shards),
            admin_listen: match self.admin_listen.unwrap_or(AdminListen::At(DEFAULT_ADMIN_LISTEN)) {
                AdminListen::Off => None,
                AdminListen::At(addr) => Some(addr),
            },
            log_format: self.log_format.unwrap_or(LogFormat::Human),
            log_filter: self.log_filter.unwrap_or_else(|| "info".to_owned()),
            spin_before_park_us: self.spin_before_park_us.unwrap_or(0),
            io_poll_interval_us: self.io_poll_interval_us.unwrap_or(IO_POLL_INTERVAL_US_DEFAULT),
            consumer_pace_percent: self
                .consumer_pace_percent
                .unwrap_or(CONSUMER_PACE_PERCENT_DEFAULT),
            housekeeping_tick_ms: self.housekeeping_tick_ms.unwrap_or(HOUSEKEEPING_TICK_MS_DEFAULT),
            segment_bytes: self.segment_bytes.unwrap_or(SEGMENT_BYTES_DEFAULT),
            tail_cache_bytes: self.tail_cache_bytes.unwrap_or(TAIL_CACHE_BYTES_DEFAULT),
            journal_garbage_ratio_max: self
                .journal_garbage_ratio_max
                .unwrap_or(Ratio(crate::limits::JOURNAL_GARBAGE_RATIO_MAX_DEFAULT)),
            journal_retain_bytes: self
                .journal_retain_bytes
                .unwrap_or(crate::limits::JOURNAL_RETAIN_BYTES_DEFAULT),
            partitions_max: self.partitions_max.unwrap_or(PARTITIONS_MAX_DEFAULT),
            connections_per_shard_max: self
                .connections_per_shard_max
                .unwrap_or(CONNECTIONS_PER_SHARD_DEFAULT),
            in_flight_per_connection_max: self
                .in_flight_per_connection_max
                .unwrap_or(IN_FLIGHT_PER_CONNECTION_DEFAULT),
            claim_waiters_per_connection_max: self
                .claim_waiters_per_connection_max
                .unwrap_or(CLAIM_WAITERS_PER_CONNECTION_DEFAULT),
            frame_bytes_max: self.frame_bytes_max.unwrap_or(FRAME_BYTES_MAX_DEFAULT),
            idle_timeout_ms: self.idle_timeout_ms.unwrap_or(IDLE_TIMEOUT_MS_DEFAULT),
            frame_timeout_ms: self.frame_timeout_ms.unwrap_or(FRAME_TIMEOUT_MS_DEFAULT),
            write_timeout_ms: self.write_timeout_ms.unwrap_or(WRITE_TIMEOUT_MS_DEFAULT),
            startup_timeout_ms: self.startup_timeout_ms.unwrap_or(STARTUP_TIMEOUT_MS_DEFAULT),
            shutdown_timeout_ms: self.shutdown_timeout_ms.unwrap_or(SHUTDOWN_TIMEOUT_MS_DEFAULT),
            auth: match &self.auth_file {
                Some(path) => crate::auth::AuthPolicy::load(path)?,
                None => crate::auth::AuthPolicy::off(),
            },
            auth_file: self.auth_file,
            tls: tls_settings(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)?,
        };
        config.validate(allowed_cpus)?;
        Ok(config)
    }
}

/// `spoold` command-line flags. Every flag overrides the same-named
/// environment variable (`SPOOL_<NAME>`) and config-file key.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "spoold", version, about = "Spool broker daemon: a durable work-queue broker")]
pub struct Cli {
    /// TOML config file (keys are the flag names with `_`). Env: SPOOL_CONFIG.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./spool-data]. Env: SPOOL_DATA_DIR.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address of shard 0; shard i listens on port + i [default: 127.0.0.1:7400].
    /// Env: SPOOL_LISTEN.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Admin port (HTTP: /metrics, /health/live, /health/ready), or `off`
    /// [default: 127.0.0.1:7480]. Env: SPOOL_ADMIN_LISTEN.
    #[arg(long, value_name = "ADDR|off")]
    pub admin_listen: Option<AdminListen>,
    /// Number of shards, one pinned executor per CPU [default: all allowed CPUs].
    /// Env: SPOOL_CORES.
    #[arg(long, value_name = "N")]
    pub cores: Option<u16>,
    /// Log format [default: human]. Env: SPOOL_LOG_FORMAT.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter directives [default: info]. Env: SPOOL_LOG.
    #[arg(long, value_name = "FILTER")]
    pub log_filter: Option<String>,
    /// Spin this long before parking an idle executor [default: 0, max 10000].
    #[arg(long, value_name = "US")]
    pub spin_before_park_us: Option<u64>,
    /// Longest a busy shard's connections run before the executor polls for
    /// completed I/O [default: 500, 100..=100000].
    #[arg(long, value_name = "US")]
    pub io_poll_interval_us: Option<u64>,
    /// While consumers are behind producers, enqueued messages at most this
    /// % of delivered ones [default: 110, 100..=1000; 0 = off].
    #[arg(long, value_name = "PERCENT")]
    pub consumer_pace_percent: Option<u32>,
    /// Housekeeping timer period on every executor [default: 5, 1..=10].
    #[arg(long, value_name = "MS")]
    pub housekeeping_tick_ms: Option<u64>,
    /// Size of each shard journal's segment files, bytes (each is
    /// zero-filled before use) [default: 64 MiB; one maximal commit
    /// (≈ 4 MiB)..=1 GiB].
    #[arg(long, value_name = "BYTES")]
    pub segment_bytes: Option<u64>,
    /// Memory per shard journal for its newest commits (and as much again
    /// for chunks read back), bytes [default: 8 MiB; 0..=256 MiB]. Env:
    /// SPOOL_TAIL_CACHE_BYTES.
    #[arg(long, value_name = "BYTES")]
    pub tail_cache_bytes: Option<u64>,
    /// Share of the held journal files that may carry no
    /// live record before the live entries of the oldest file are
    /// relocated to the head so it can be released [default: 0.5; 0..=1,
    /// 1 never relocates]. Env: SPOOL_JOURNAL_GARBAGE_RATIO_MAX.
    #[arg(long, value_name = "RATIO")]
    pub journal_garbage_ratio_max: Option<Ratio>,
    /// Journal bytes a shard holds before it asks the
    /// partitions pinning its oldest files for checkpoints (and relocates)
    /// [default: 536870912 (512 MiB); 0..=2^40, 0 releases as soon as it
    /// can]. Env: SPOOL_JOURNAL_RETAIN_BYTES.
    #[arg(long, value_name = "BYTES")]
    pub journal_retain_bytes: Option<u64>,
    /// Partitions this node hosts over all queues [default: 10000;
    /// 1..=10000]. Env: SPOOL_PARTITIONS_MAX.
    #[arg(long, value_name = "N")]
    pub partitions_max: Option<u32>,
    /// Connections per shard [default: 1024].
    #[arg(long, value_name = "N")]
    pub connections_per_shard_max: Option<u32>,
    /// In-flight requests per connection [default: 128].
    #[arg(long, value_name = "N")]
    pub in_flight_per_connection_max: Option<u32>,
    /// Claims one connection may have long-polling at once [default: 64, 1..=4096].
    #[arg(long, value_name = "N")]
    pub claim_waiters_per_connection_max: Option<u32>,
    /// Largest frame a peer may send [default: 4 MiB + 64 KiB].
    #[arg(long, value_name = "BYTES")]
    pub frame_bytes_max: Option<u32>,
    /// Close connections idle this long [default: 300000].
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// A frame must arrive completely within this [default: 10000].
    #[arg(long, value_name = "MS")]
    pub frame_timeout_ms: Option<u64>,
    /// A stalled response write closes the connection after this [default: 10000].
    #[arg(long, value_name = "MS")]
    pub write_timeout_ms: Option<u64>,
    /// Every shard must be up, partitions recovered, within this [default: 120000].
    #[arg(long, value_name = "MS")]
    pub startup_timeout_ms: Option<u64>,
    /// In-flight work must drain within this after SIGTERM [default: 30000].
    #[arg(long, value_name = "MS")]
    pub shutdown_timeout_ms: Option<u64>,
    /// Auth file (TOML: principals with argon2 secret hashes, ACLs); turns
    /// authentication on [default: off]. Env: SPOOL_AUTH_FILE.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// PEM certificate chain (own certificate first); with --tls-key-file
    /// every shard port and the admin port speak TLS only [default: off].
    /// Env: SPOOL_TLS_CERT_FILE.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file. Env: SPOOL_TLS_KEY_FILE.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates that client certificates are verified against;
    /// a verified certificate authenticates its connection as the auth
    /// file's principal named by its subject CN (client certificates stay
    /// optional). Env: SPOOL_TLS_CLIENT_CA_FILE.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
}

impl Cli {
    /// The flags as a configuration layer.
    pub fn to_partial(&self) -> PartialConfig {
        PartialConfig {
            config_file: self.config.clone(),
            data_dir: self.data_dir.clone(),
            listen: self.listen,
            admin_listen: self.admin_listen,
            cores: self.cores,
            log_format: self.log_format,
            log_filter: self.log_filter.clone(),
            spin_before_park_us: self.spin_before_park_us,
            io_poll_interval_us: self.io_poll_interval_us,
            consumer_pace_percent: self.consumer_pace_percent,
            housekeeping_tick_ms: self.housekeeping_tick_ms,
            segment_bytes: self.segment_bytes,
            tail_cache_bytes: self.tail_cache_bytes,
            journal_garbage_ratio_max: self.journal_garbage_ratio_max,
            journal_retain_bytes: self.journal_retain_bytes,
            partitions_max: self.partitions_max,
            connections_per_shard_max: self.connections_per_shard_max,
            in_flight_per_connection_max: self.in_flight_per_connection_max,
            claim_waiters_per_connection_max: self.claim_waiters_per_connection_max,
            frame_bytes_max: self.frame_bytes_max,
            idle_timeout_ms: self.idle_timeout_ms,
            frame_timeout_ms: self.frame_timeout_ms,
            write_timeout_ms: self.write_timeout_ms,
            startup_timeout_ms: self.startup_timeout_ms,
            shutdown_timeout_ms: self.shutdown_timeout_ms,
            auth_file: self.auth_file.clone(),
            tls_cert_file: self.tls_cert_file.clone(),
            tls_key_file: self.tls_key_file.clone(),
            tls_client_ca_file: self.tls_client_ca_file.clone(),
        }
    }
}

/// Loads TLS when a certificate and key are configured; either alone, or
/// a client CA without them, is an error.
fn tls_settings(
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
) -> Result<Option<crate::net::tls::TlsServer>, ConfigError> {
    let invalid = |field, reason: &str| ConfigError::Invalid { field, reason: reason.to_owned() };
    match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => {
            let files = crate::net::tls::TlsFiles { cert_file, key_file, client_ca_file };
            Ok(Some(crate::net::tls::TlsServer::load(files)?))
        }
        (Some(_), None) => Err(invalid("tls_key_file", "tls_cert_file is set; set its key too")),
        (None, Some(_)) => {
            Err(invalid("tls_cert_file", "tls_key_file is set; set its certificate too"))
        }
        (None, None) if client_ca_file.is_some() => Err(invalid(
            "tls_client_ca_file",
            "client certificates need TLS: set tls_cert_file and tls_key_file",
        )),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
