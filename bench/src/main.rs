//! `spool-bench`: the command line over the `spool_bench` scenarios. Each
//! subcommand runs one scenario and prints one JSON object on stdout; errors
//! go to stderr with exit code 1. It measures nothing itself, but it is
//! the one place that installs the counting global allocator, so only this
//! binary (not the library or its tests) pays for counting.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use spool_bench::capacity::{self, CapacityConfig, CapacityError, HostModel};
use spool_bench::dist::{Arrivals, ServiceTime};
use spool_bench::failover::{self, FailoverConfig, FailoverError};
use spool_bench::harness::Broker;
use spool_bench::heap::CountingAllocator;
use spool_bench::hostile::{self, HostileConfig};
use spool_bench::idle::{self, IdleConfig, IdleError};
use spool_bench::latency_scenario::{self, LatencyConfig};
use spool_bench::load::{self, BrokerConfig, LoadConfig, LoadError, Phase, PhaseEnd, Sample};
use spool_bench::log_append::{self, LogAppendConfig};
use spool_bench::memory_attack::{self, MemoryAttackConfig, MemoryAttackError};
use spool_bench::omb::{self, OmbConfig, OmbError};
use spool_bench::recovery::{self, RecoveryConfig};
use spool_bench::redis_streams::{self, RedisLoad, RedisStreamsError};
use spool_bench::rss::{self, RssConfig, RssError};
use spool_bench::state_memory::{self, StateMemoryConfig};
use spool_bench::takeover::{self, TakeoverConfig, TakeoverError};
use spool_bench::throughput::{self, ThroughputConfig, ThroughputError, ThroughputLoad};
use spool_bench::BenchError;
use thiserror::Error;

/// Counts live heap bytes for `state-memory` (a relaxed atomic add per
/// allocation: noise for the I/O scenarios).
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Why a subcommand printed no report: each scenario's own error, as it
/// said it. The one place that names every scenario's error type (the
/// library's [`BenchError`] names none of them).
#[derive(Debug, Error)]
enum Failure {
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error("throughput: {0}")]
    Throughput(#[from] ThroughputError),
    #[error("load: {0}")]
    Load(#[from] LoadError),
    #[error("capacity: {0}")]
    Capacity(#[from] CapacityError),
    #[error("rss: {0}")]
    Rss(#[from] RssError),
    #[error("idle: {0}")]
    Idle(#[from] IdleError),
    #[error("memory: {0}")]
    Memory(#[from] MemoryAttackError),
    #[error("omb: {0}")]
    Omb(#[from] OmbError),
    #[error("redis-streams: {0}")]
    RedisStreams(#[from] RedisStreamsError),
    #[error("failover: {0}")]
    Failover(#[from] FailoverError),
    #[error("takeover: {0}")]
    Takeover(#[from] TakeoverError),
    #[error("cannot encode the report: {0}")]
    Report(#[from] serde_json::Error),
}

#[derive(Debug, Parser)]
#[command(name = "spool-bench", about = "Spool benchmarks; each prints one JSON object")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N appenders on partitions of one shard journal (one glommio shard, O_DIRECT): append → durable.
    LogAppend(LogAppendConfig),
    /// Heap bytes per message of the queue state machine (pure, no I/O).
    StateMemory(StateMemoryConfig),
    /// Reopen time of a large on-disk partition, with and without a checkpoint.
    Recovery(RecoveryConfig),
    /// Producers and consumers over the real client against a spoold (started here unless --addr).
    Throughput(ThroughputArgs),
    /// A fixed open-loop rate with simulated workers; percentiles every second.
    Latency(LatencyArgs),
    /// The capacity model: burst, then drain, measured beside the planner's prediction.
    Capacity(CapacityArgs),
    /// An OpenMessaging Benchmark workload file.
    Omb(OmbArgs),
    /// A producer's enqueue latency alone, then beside hostile connections (loopback).
    Hostile(HostileArgs),
    /// The started spoold's RSS at each backlog, after the drain, and after a settle.
    Rss(RssArgs),
    /// The started spoold's CPU and wake-ups per second with a queue and no traffic.
    Idle(IdleArgs),
    /// A spoold's RSS against connections holding unfinished frames, with and
    /// without its memory budget: a JSON line per cell, then a Markdown table.
    Memory(MemoryAttackConfig),
    /// The peer: Redis Streams (XADD / XREADGROUP / XACK) with throughput's load shape.
    RedisStreams(RedisLoad),
    /// Three spoold nodes in a cluster: leader killed → first acknowledged enqueue, N times.
    Failover(FailoverConfig),
    /// A worker dies holding claims: time until they are claimable again, with leases alone and with sessions.
    Takeover(TakeoverConfig),
}

#[derive(Debug, Args)]
struct HostileArgs {
    /// Broker bootstrap address; without it a spoold is started and stopped.
    #[arg(long)]
    addr: Option<String>,
    #[command(flatten)]
    started: StartedArgs,
    /// Broker shards: the started spoold's --cores.
    #[arg(long, default_value_t = 1)]
    shards: u16,
    /// Hostile connections (1..=1000).
    #[arg(long, default_value_t = 200)]
    connections: u32,
    /// 60 s long-poll claims each hostile connection opens with (0..=4096).
    #[arg(long, default_value_t = 120)]
    claims_per_connection: u32,
    /// DescribeQueue requests each keeps outstanding (0..=4096).
    #[arg(long, default_value_t = 8)]
    requests_in_flight: u32,
    /// Length of each phase (s, 1..=600).
    #[arg(long, default_value_t = 10.0)]
    phase_s: f64,
    /// The producer sends one message this often (ms).
    #[arg(long, default_value_t = 5)]
    interval_ms: u64,
}

#[derive(Debug, Args)]
struct IdleArgs {
    #[command(flatten)]
    started: StartedArgs,
    /// Broker shards [default: CPUs available].
    #[arg(long)]
    shards: Option<u16>,
    /// Partitions of the queue created before measuring.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// Pause after the queue is created, before measuring (ms).
    #[arg(long, default_value_t = 2_000)]
    settle_ms: u64,
    /// Length of the measurement (s).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Also write the report here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RssArgs {
    #[command(flatten)]
    started: StartedArgs,
    /// Broker shards [default: CPUs available].
    #[arg(long)]
    shards: Option<u16>,
    /// Partitions of the queue [default: shards × 2].
    #[arg(long)]
    partitions: Option<u32>,
    /// Record payload bytes (1.6 KiB).
    #[arg(long, default_value_t = 1638)]
    msg_bytes: u64,
    /// Backlogs to sample at, ascending, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    steps: Vec<u64>,
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Sends in flight per producer.
    #[arg(long, default_value_t = 8192)]
    window: u64,
    /// Producer linger in µs.
    #[arg(long, default_value_t = 5000)]
    linger_us: u64,
    /// Producer batch target in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    batch_bytes: u64,
    #[arg(long, default_value_t = 2)]
    consumers: u32,
    /// Execution slots per consumer.
    #[arg(long, default_value_t = 512)]
    slots: u32,
    /// Dedupe window of the queue (ms) [default: the client's queue default, 1 h].
    #[arg(long, default_value_t = 3_600_000)]
    dedupe_window_ms: u64,
    /// Pause before each sample (ms).
    #[arg(long, default_value_t = 2_000)]
    settle_ms: u64,
    /// Pause after the drain before the last sample (ms).
    #[arg(long, default_value_t = 10_000)]
    after_drain_ms: u64,
    /// Stop after the last backlog sample: no drain (a build-up-only run).
    #[arg(long)]
    no_drain: bool,
    /// tokio worker threads for all clients.
    #[arg(long, default_value_t = 2)]
    client_threads: u64,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ArrivalsArg {
    Fixed,
    Poisson,
}

/// Where a scenario that starts its own spoold puts it, and which binary.
#[derive(Debug, Args)]
struct StartedArgs {
    /// Parent of the started spoold's temporary data directory.
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// spoold binary to start [default: spoold next to this executable].
    #[arg(long)]
    spoold: Option<PathBuf>,
}

/// The broker and the queue a client scenario runs against.
#[derive(Debug, Args)]
struct TargetArgs {
    /// Broker bootstrap address; without it a spoold is started and stopped.
    #[arg(long)]
    addr: Option<String>,
    #[command(flatten)]
    started: StartedArgs,
    /// Broker shards: the started spoold's --cores [default: CPUs available].
    #[arg(long)]
    shards: Option<u16>,
    /// Queue name [default: <scenario>-<pid>, bench-<pid> for throughput]; created unless it exists.
    #[arg(long)]
    queue: Option<String>,
    /// Partitions of a created queue [default: shards × 2].
    #[arg(long)]
    partitions: Option<u32>,
}

/// Settings shared by the latency, capacity and omb scenarios.
#[derive(Debug, Args)]
struct LoadArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Open-loop producers (one pacing thread each).
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Consumers the slots are spread over (per subscription).
    #[arg(long, default_value_t = 2)]
    consumers: u32,
    /// Subscriptions of the queue: the default and `sub-1` ... (each with
    /// `--consumers` consumers, an equal share of the slots, and every
    /// message once; rates count every subscription's acks).
    #[arg(long, default_value_t = 1)]
    subscriptions: u32,
    /// Inter-arrival times: fixed gaps or exponential (Poisson process).
    #[arg(long, value_enum, default_value_t = ArrivalsArg::Fixed)]
    arrivals: ArrivalsArg,
    /// Sends in flight per producer.
    #[arg(long, default_value_t = 8192)]
    window: u64,
    /// Producer linger in µs.
    #[arg(long, default_value_t = 5000)]
    linger_us: u64,
    /// Producer batch target in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    batch_bytes: u64,
    /// Lease the workers ask for (ms).
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u32,
    /// Deliveries each consumer claims ahead of a free slot, as a fraction
    /// of its slots (hides the claim round trip).
    #[arg(long, default_value_t = load::PREFETCH_FRACTION_DEFAULT)]
    prefetch_fraction: f64,
    /// Claims each consumer keeps outstanding.
    #[arg(long, default_value_t = load::CLAIMS_IN_FLIGHT_DEFAULT)]
    claims_in_flight: u32,
    /// How long a finished delivery waits for company in an Ack (µs).
    #[arg(long, default_value_t = load::ACK_LINGER_US_DEFAULT)]
    ack_linger_us: u64,
    /// Dedupe window of created queues (ms): a short one keeps the broker's
    /// memory for message ids small (≈88 B each) over a long run.
    #[arg(long, default_value_t = 60_000)]
    dedupe_window_ms: u64,
    /// tokio worker threads for all clients.
    #[arg(long, default_value_t = 2)]
    client_threads: u64,
    /// Seed of the arrival and service-time draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG plot of the time series to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// An argument for the started spoold, after its own (repeat it:
    /// `--spoold-arg=--journal-retain-bytes --spoold-arg=0`).
    #[arg(long = "spoold-arg", allow_hyphen_values = true)]
    spoold_args: Vec<String>,
}

impl LoadArgs {
    fn config(&self, label: &'static str) -> LoadConfig {
        LoadConfig {
            broker: BrokerConfig {
                addr: self.target.addr.clone(),
                dir: self.target.started.dir.clone(),
                spoold: self.target.started.spoold.clone(),
                shards: self.target.shards,
                spoold_args: self.spoold_args.clone(),
            },
            label,
            queue: self.target.queue.clone(),
            queues: 1,
            partitions: self.target.partitions,
            queue_max_messages: QUEUE_MAX_MESSAGES,
            queue_max_bytes: QUEUE_MAX_BYTES,
            dedupe_window_ms: self.dedupe_window_ms,
            msg_bytes: 1024,
            payloads: std::sync::Arc::default(),
            producers_per_queue: self.producers,
            consumers_per_queue: self.consumers,
            subscriptions: self.subscriptions,
            arrivals: match self.arrivals {
                ArrivalsArg::Fixed => Arrivals::Fixed,
                ArrivalsArg::Poisson => Arrivals::Poisson,
            },
            service: ServiceTime { mean_ms: 0.0, cv: 0.0 },
            // Replaced by every scenario.
            phases: vec![Phase {
                name: "unset".to_owned(),
                seconds: 1.0,
                rate_per_s: 0.0,
                slots: 1,
                end: PhaseEnd::Elapsed,
            }],
            window: self.window,
            linger_us: self.linger_us,
            batch_bytes: self.batch_bytes,
            lease_ms: self.lease_ms,
            prefetch_fraction: self.prefetch_fraction,
            claims_in_flight: self.claims_in_flight,
            ack_linger_us: self.ack_linger_us,
            client_threads: self.client_threads,
            seed: self.seed,
            progress: !self.quiet,
            expected_s: 1.0,
        }
    }
}

/// Admission limits of a queue the load scenarios create (capacity raises
/// them to the planner's figures).
const QUEUE_MAX_MESSAGES: u64 = 10_000_000;
const QUEUE_MAX_BYTES: u64 = 16 << 30;

#[derive(Debug, Args)]
struct LatencyArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Total msgs/s over all producers.
    #[arg(long, default_value_t = 25_000.0)]
    rate: f64,
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Execution slots over all consumers.
    #[arg(long, default_value_t = 512)]
    slots: u32,
    #[arg(long, default_value_t = 1024)]
    msg_bytes: u64,
    /// Mean handler service time (ms); 0 acks at once.
    #[arg(long, default_value_t = 0.0)]
    service_ms: f64,
    /// Service time coefficient of variation (log-normal).
    #[arg(long, default_value_t = 1.0)]
    service_cv: f64,
}

#[derive(Debug, Args)]
struct CapacityArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Shortens both phases, keeps every rate (0.05 → a 60 s burst).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Burst length before scaling (s).
    #[arg(long, default_value_t = 1200.0)]
    burst_s: f64,
    #[arg(long, default_value_t = 25_000.0)]
    burst_rate: f64,
    /// Consumer rate during the burst: slots = rate × service time.
    #[arg(long, default_value_t = 19_000.0)]
    burst_consumer_rate: f64,
    #[arg(long, default_value_t = 19_000.0)]
    drain_ingress_rate: f64,
    #[arg(long, default_value_t = 23_000.0)]
    drain_consumer_rate: f64,
    /// Record payload bytes (1.6 KiB).
    #[arg(long, default_value_t = 1638)]
    msg_bytes: u64,
    #[arg(long, default_value_t = 18.0)]
    service_ms: f64,
    #[arg(long, default_value_t = 1.0)]
    service_cv: f64,
    /// Override the burst's slots [default: burst consumer rate × service time].
    #[arg(long)]
    slots_burst: Option<u32>,
    /// Override the drain's slots [default: drain consumer rate × service time].
    #[arg(long)]
    slots_drain: Option<u32>,
    /// The drain ends at the latest after this × the predicted drain time.
    #[arg(long, default_value_t = 4.0)]
    drain_max_factor: f64,
    /// `spool-plan host --json` output for this host: also predict at its measured limits.
    #[arg(long, value_name = "FILE")]
    host: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct OmbArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// The OMB workload YAML.
    #[arg(long)]
    workload: PathBuf,
    /// Execution slots per consumer.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Mean handler service time (ms); 0 acks at once, as OMB consumers do.
    #[arg(long, default_value_t = 0.0)]
    service_ms: f64,
    #[arg(long, default_value_t = 1.0)]
    service_cv: f64,
    /// Run this long instead of testDurationMinutes.
    #[arg(long)]
    duration_s: Option<f64>,
    /// Where a relative payloadFile is looked for first (then next to the
    /// workload file, then in its directory's parent).
    #[arg(long)]
    payload_dir: Option<PathBuf>,
}

/// The report as the one JSON object a subcommand prints.
fn to_json<R: Serialize>(report: R) -> Result<String, Failure> {
    Ok(serde_json::to_string(&report)?)
}

/// Prints the report (stdout), and writes it and the plot where asked.
fn emit<R: Serialize>(
    report: &R,
    series: &[Sample],
    title: &str,
    json: Option<&Path>,
    plot: Option<&Path>,
) -> Result<String, Failure> {
    let text = serde_json::to_string(report)?;
    if let Some(path) = json {
        std::fs::write(path, format!("{text}\n")).map_err(|source| BenchError::Dir {
            action: "cannot write the report to",
            path: path.to_owned(),
            source,
        })?;
    }
    if let Some(path) = plot {
        spool_bench::plot::write(path, title, series).map_err(|source| BenchError::Dir {
            action: "cannot write the plot to",
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(text)
}

#[derive(Debug, Args)]
struct ThroughputArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    security: spool_bench::security::ClientSecurity,
    #[command(flatten)]
    load: ThroughputLoad,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The client's warnings (a refused ack names its code) on stderr when
    // RUST_LOG asks for them; silent otherwise (stdout is the report).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let report = match cli.command {
        Command::LogAppend(config) => {
            log_append::run(&config).map_err(Failure::from).and_then(to_json)
        }
        Command::StateMemory(config) => {
            state_memory::run(&config).map_err(Failure::from).and_then(to_json)
        }
        Command::Recovery(config) => {
            recovery::run(&config).map_err(Failure::from).and_then(to_json)
        }
        Command::Throughput(args) => {
            let target = args.target;
            let config = ThroughputConfig {
                addr: target.addr,
                dir: target.started.dir,
                spoold: target.started.spoold,
                shards: target.shards,
                queue: target.queue,
                partitions: target.partitions,
                load: args.load,
                security: args.security.with_env(),
            };
            throughput::run(&config).map_err(Failure::from).and_then(to_json)
        }
        Command::Latency(args) => latency(&args),
        Command::Capacity(args) => capacity(&args),
        Command::Omb(args) => omb(&args),
        Command::Hostile(args) => hostile(&args),
        Command::Rss(args) => rss_run(&args),
        Command::Idle(args) => idle_run(&args),
        Command::Memory(config) => memory(&config),
        Command::RedisStreams(load) => {
            redis_streams::run(&load).map_err(Failure::from).and_then(to_json)
        }
        Command::Failover(config) => failover_run(&config),
        Command::Takeover(config) => takeover_run(&config),
    };
    report_result(report)
}

fn hostile(args: &HostileArgs) -> Result<String, Failure> {
    let bounded = BenchError::check_range;
    bounded("connections", u64::from(args.connections), 1, 1_000)?;
    bounded("claims_per_connection", u64::from(args.claims_per_connection), 0, 4_096)?;
    bounded("requests_in_flight", u64::from(args.requests_in_flight), 0, 4_096)?;
    bounded("phase_s", args.phase_s as u64, 1, 600)?;
    let config = HostileConfig {
        connections: args.connections,
        claims_per_connection: args.claims_per_connection,
        requests_in_flight: args.requests_in_flight,
        phase_s: args.phase_s,
        interval_ms: args.interval_ms,
    };
    let broker = Broker::start_or_connect(
        args.addr.as_deref(),
        args.started.spoold.as_deref(),
        &args.started.dir,
        args.shards,
        "hostile",
        0,
    )
    .map_err(|error| BenchError::Hostile(error.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| BenchError::Hostile(error.to_string()))?;
    // The hostile clients get threads of their own, like separate processes.
    let hostile_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("hostile")
        .build()
        .map_err(|error| BenchError::Hostile(error.to_string()))?;
    let report = runtime.block_on(hostile::run(broker.addr(), &config, hostile_runtime.handle()));
    drop(runtime);
    drop(hostile_runtime);
    broker.stop().map_err(|error| BenchError::Hostile(error.to_string()))?;
    Ok(serde_json::to_string(&report?)?)
}

/// The failover rounds: the summary on stderr; a run that stopped early or
/// lost an acknowledged message prints its report and fails.
fn failover_run(config: &FailoverConfig) -> Result<String, Failure> {
    let report = failover::run(config)?;
    eprintln!("{}", failover::summary(&report));
    let json = to_json(&report)?;
    if let Some(stopped) = report.stopped {
        println!("{json}");
        return Err(FailoverError::Stopped(stopped).into());
    }
    if report.lost > 0 {
        println!("{json}");
        return Err(FailoverError::Lost { lost: report.lost, acked: report.acked }.into());
    }
    Ok(json)
}

/// The takeover cases: one summary line each on stderr, the JSON report.
fn takeover_run(config: &TakeoverConfig) -> Result<String, Failure> {
    let report = takeover::run(config)?;
    eprintln!("{}", takeover::summary(&report));
    to_json(&report)
}

/// The memory matrix: each cell's JSON line as it ends, the table last.
fn memory(config: &MemoryAttackConfig) -> Result<String, Failure> {
    let reports = memory_attack::run(config, &mut |report| {
        println!("{}", serde_json::to_string(report)?);
        Ok(())
    })?;
    if let Some(path) = &config.json {
        memory_attack::write_json(path, &reports)?;
    }
    Ok(memory_attack::markdown_table(&reports).trim_end().to_owned())
}

fn report_result(report: Result<String, Failure>) -> ExitCode {
    match report {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("spool-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn latency(args: &LatencyArgs) -> Result<String, Failure> {
    let config = LatencyConfig {
        load: args.load.config("latency"),
        rate_per_s: args.rate,
        seconds: args.seconds,
        slots: args.slots,
        msg_bytes: args.msg_bytes,
        service: ServiceTime { mean_ms: args.service_ms, cv: args.service_cv },
    };
    let report = latency_scenario::run(&config)?;
    let title = format!("spool-bench latency: {} msgs/s for {} s", args.rate, args.seconds);
    emit(&report, &report.series, &title, args.load.json.as_deref(), args.load.plot.as_deref())
}

/// Largest `--host` file read: a `spool-plan host --json` object is a few KiB.
const HOST_FILE_BYTES_MAX: u64 = 1024 * 1024;

fn read_host_model(path: &Path, clients_on_host: bool) -> Result<HostModel, Failure> {
    use std::io::Read;
    let read_error = |source| BenchError::Dir {
        action: "cannot read the host file",
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(HOST_FILE_BYTES_MAX).read_to_string(&mut text).map_err(read_error)?;
    Ok(HostModel::from_host_json(&text, clients_on_host)?)
}

fn capacity(args: &CapacityArgs) -> Result<String, Failure> {
    // Without --addr the bench starts spoold here: its clients share the measured CPUs.
    let clients_on_host = args.load.target.addr.is_none();
    let host =
        args.host.as_deref().map(|path| read_host_model(path, clients_on_host)).transpose()?;
    let config = CapacityConfig {
        load: args.load.config("capacity"),
        time_scale: args.time_scale,
        burst_s: args.burst_s,
        burst_rate: args.burst_rate,
        burst_consumer_rate: args.burst_consumer_rate,
        drain_ingress_rate: args.drain_ingress_rate,
        drain_consumer_rate: args.drain_consumer_rate,
        record_bytes: args.msg_bytes,
        service: ServiceTime { mean_ms: args.service_ms, cv: args.service_cv },
        slots_burst: args.slots_burst,
        slots_drain: args.slots_drain,
        drain_max_factor: args.drain_max_factor,
        host,
    };
    let report = capacity::run(&config)?;
    let mut title = format!(
        "spool-bench capacity (time scale {}): peak backlog {:.0} measured vs {:.0} predicted, \
         drain {:.1} s vs {:.1} s",
        args.time_scale,
        report.measured.peak_backlog,
        report.predicted.peak_backlog,
        report.measured.drain_s,
        report.predicted.drain_s
    );
    if let Some(at_host) = &report.predicted_at_host {
        title.push_str(&capacity::at_host_line(at_host));
        eprintln!("{title}");
    }
    emit(&report, &report.series, &title, args.load.json.as_deref(), args.load.plot.as_deref())
}

fn idle_run(args: &IdleArgs) -> Result<String, Failure> {
    let config = IdleConfig {
        spoold: args.started.spoold.clone(),
        dir: args.started.dir.clone(),
        shards: args.shards,
        partitions: args.partitions,
        settle_ms: args.settle_ms,
        seconds: args.seconds,
    };
    let report = idle::run(&config)?;
    eprintln!(
        "spool-bench idle: {} shards, {} partitions: {:.2} % of a core, {:.0} wake-ups/s over {:.1} s",
        report.shards, report.partitions, report.core_pct, report.wakeups_per_s, report.seconds
    );
    emit(&report, &[], "spool-bench idle", args.json.as_deref(), None)
}

fn rss_run(args: &RssArgs) -> Result<String, Failure> {
    let config = RssConfig {
        spoold: args.started.spoold.clone(),
        dir: args.started.dir.clone(),
        shards: args.shards,
        partitions: args.partitions,
        msg_bytes: args.msg_bytes,
        steps: args.steps.clone(),
        producers: args.producers,
        window: args.window,
        linger_us: args.linger_us,
        batch_bytes: args.batch_bytes,
        consumers: args.consumers,
        slots: args.slots,
        dedupe_window_ms: args.dedupe_window_ms,
        settle_ms: args.settle_ms,
        after_drain_ms: args.after_drain_ms,
        drain: !args.no_drain,
        client_threads: args.client_threads,
    };
    let report = rss::run(&config)?;
    emit(&report, &[], "spool-bench rss", args.json.as_deref(), None)
}

fn omb(args: &OmbArgs) -> Result<String, Failure> {
    let parsed = omb::read(&args.workload)?;
    for (field, value) in &parsed.unsupported {
        eprintln!(
            "spool-bench omb: unsupported workload field `{field}` ({value}) is not applied; \
             it is listed under \"unsupported\" in the report"
        );
    }
    if let Some(seconds) = args.duration_s {
        eprintln!(
            "spool-bench omb: --duration-s {seconds} overrides testDurationMinutes {} \
             ({} s)",
            parsed.workload.test_duration_minutes,
            parsed.workload.test_duration_minutes * 60.0
        );
    }
    let config = OmbConfig {
        load: args.load.config("omb"),
        workload_file: args.workload.clone(),
        parsed,
        slots_per_consumer: args.slots,
        duration_s: args.duration_s,
        payload_dir: args.payload_dir.clone(),
    };
    let mut config = config;
    config.load.service = ServiceTime { mean_ms: args.service_ms, cv: args.service_cv };
    let report = omb::run(&config)?;
    let title = format!("spool-bench omb: {}", args.workload.display());
    emit(&report, &report.series, &title, args.load.json.as_deref(), args.load.plot.as_deref())
}
