//! Where a configuration comes from: the layers [`PartialConfig`] (every
//! field optional) read from the TOML file, the `SPOOL_*` environment and
//! the command line ([`Cli`]), their overlay in precedence order, and the
//! resolution into a validated [`BrokerConfig`] (TLS files loaded there). A
//! misspelt key or variable is refused with the closest name. What each
//! setting means, its range and its default are `config.rs`'s; this file
//! must not define a setting's meaning or range.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::limits::{
    CLAIM_WAITERS_PER_CONNECTION_DEFAULT, CONNECTIONS_PER_SHARD_DEFAULT,
    CONSUMER_PACE_PERCENT_DEFAULT, FRAME_BYTES_MAX_DEFAULT, FRAME_TIMEOUT_MS_DEFAULT,
    HOUSEKEEPING_TICK_MS_DEFAULT, IDLE_TIMEOUT_MS_DEFAULT, IN_FLIGHT_PER_CONNECTION_DEFAULT,
    IO_POLL_INTERVAL_US_DEFAULT, PARTITIONS_MAX_DEFAULT, SEGMENT_BYTES_DEFAULT, SHARDS_MAX,
    SHUTDOWN_TIMEOUT_MS_DEFAULT, STARTUP_TIMEOUT_MS_DEFAULT, TAIL_CACHE_BYTES_DEFAULT,
    WRITE_TIMEOUT_MS_DEFAULT,
};
use clap::Parser;
use serde::Deserialize;

use super::config::*;

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
    pub memory_bytes: Option<u64>,
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
    /// The `[cluster]` table (file only: [`FILE_TABLES`]); without it the
    /// node runs alone.
    pub cluster: Option<crate::control::cluster::ClusterConfig>,
}

/// Edit distance (insertions, deletions, substitutions) between two names.
pub(super) fn edit_distance(left: &str, right: &str) -> usize {
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

/// The closest file key to the unknown key a TOML error names, if any.
fn suggest_file_key(error: &toml::de::Error) -> Option<&'static str> {
    let unknown = error.message().strip_prefix("unknown field `")?.split('`').next()?;
    closest(unknown, FILE_KEYS.iter().chain(FILE_TABLES).copied())
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
                "MEMORY_BYTES" => layer.memory_bytes = Some(parse_env(&name, &value)?),
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
            memory_bytes: higher.memory_bytes.or(self.memory_bytes),
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
            cluster: higher.cluster.or(self.cluster),
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
            listen: cluster_listen(self.listen, self.cluster.as_ref())?,
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
            memory_bytes: self.memory_bytes.unwrap_or_else(default_memory_bytes),
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
            cluster: self.cluster,
        };
        config.validate(allowed_cpus)?;
        Ok(config)
    }
}

/// The shard-0 address: `listen`, else this node's client address of the
/// `[cluster]` table, else the default. With a cluster table both must
/// agree (the other nodes reach this one at its table address).
fn cluster_listen(
    listen: Option<SocketAddr>,
    cluster: Option<&crate::control::cluster::ClusterConfig>,
) -> Result<SocketAddr, ConfigError> {
    let invalid = |field, reason: &str| ConfigError::Invalid { field, reason: reason.to_owned() };
    let Some(cluster) = cluster else { return Ok(listen.unwrap_or(DEFAULT_LISTEN)) };
    cluster.validate().map_err(|error| invalid("cluster", &error.to_string()))?;
    let own = cluster
        .this_node()
        .map(|node| node.client)
        .ok_or_else(|| invalid("cluster", "cluster.node_id names no node"))?;
    match listen {
        Some(listen) if listen != own => Err(invalid(
            "listen",
            &format!("{listen} differs from this node's client address {own} in [cluster]"),
        )),
        _ => Ok(own),
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
    /// The node's memory budget, bytes: the admin port's pool (5 %, at
    /// least 8 MiB) off the top, the rest split over the shards
    /// [default: half the machine's memory or the cgroup's limit, whichever
    /// is lower]. Env: SPOOL_MEMORY_BYTES.
    #[arg(long, value_name = "BYTES")]
    pub memory_bytes: Option<u64>,
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
            memory_bytes: self.memory_bytes,
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
            cluster: None,
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
}

/// `memory_bytes` when no layer sets it: a share of what the host gives
/// (`control/host.rs`), or a fixed fallback when that cannot be read.
fn default_memory_bytes() -> u64 {
    super::host::memory_limit_bytes().map_or(crate::limits::MEMORY_BYTES_FALLBACK, |limit| {
        limit / 100 * crate::limits::MEMORY_SHARE_PERCENT_DEFAULT
    })
}
