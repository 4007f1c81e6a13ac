//! `spool-bench`: the command line over the `spool_bench` scenarios. Each
//! subcommand runs one scenario and prints one JSON object on stdout; errors
//! go to stderr with exit code 1. It measures nothing itself, but it is
//! the one place that installs the counting global allocator, so only this
//! binary (not the library or its tests) pays for counting.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spool_bench::heap::CountingAllocator;
use spool_bench::log_append::{self, LogAppendConfig};
use spool_bench::recovery::{self, RecoveryConfig};
use spool_bench::state_memory::{self, StateMemoryConfig};
use spool_bench::throughput::{self, ThroughputConfig};
use spool_bench::BenchError;
use spool_broker::limits::{COMMIT_BYTES_DEFAULT, INFLIGHT_COMMITS_DEFAULT, SEGMENT_BYTES_DEFAULT};

/// Counts live heap bytes for `state-memory` (a relaxed atomic add per
/// allocation: noise for the I/O scenarios).
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Debug, Parser)]
#[command(name = "spool-bench", about = "Spool benchmarks; each prints one JSON object")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N appenders on one partition log (one glommio shard, O_DIRECT): append → durable.
    LogAppend(LogAppendArgs),
    /// Heap bytes per message of the queue state machine (pure, no I/O).
    StateMemory(StateMemoryArgs),
    /// Reopen time of a large on-disk partition, with and without a checkpoint.
    Recovery(RecoveryArgs),
    /// Producers and consumers over the real client against a spoold (started here unless --addr).
    Throughput(ThroughputArgs),
}

#[derive(Debug, Args)]
struct StateMemoryArgs {
    /// Never-claimed backlog to build (the capacity model's burst).
    #[arg(long, default_value_t = 7_200_000)]
    messages: u64,
    /// Messages claimed, released and scheduled for the per-message figures.
    #[arg(long, default_value_t = 100_000)]
    warm_messages: u64,
    /// Simulated enqueue rate: enqueue times advance 1/rate s per message.
    #[arg(long, default_value_t = 25_000)]
    rate_per_s: u64,
}

#[derive(Debug, Args)]
struct RecoveryArgs {
    /// Parent directory; the run uses a fresh subdirectory and removes it afterwards.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 7_200_000)]
    messages: u64,
    /// Inline payload bytes per record (1.6 KiB by default).
    #[arg(long, default_value_t = 1_638)]
    record_bytes: u64,
    /// Records per data batch.
    #[arg(long, default_value_t = 100)]
    batch_records: u64,
    /// Concurrent enqueue tasks.
    #[arg(long, default_value_t = 8)]
    enqueuers: u64,
    /// Simulated enqueue rate: the broker clock advances 1/rate s per message.
    #[arg(long, default_value_t = 25_000)]
    rate_per_s: u64,
    #[arg(long, default_value_t = SEGMENT_BYTES_DEFAULT)]
    segment_bytes: u64,
    /// CPU to pin the shard to.
    #[arg(long, default_value_t = 0)]
    core: usize,
    /// Keep the partition directory after the run.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct ThroughputArgs {
    /// Broker bootstrap address; without it a spoold is started and stopped.
    #[arg(long)]
    addr: Option<String>,
    /// Parent of the started spoold's temporary data directory.
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// spoold binary to start [default: spoold next to this executable].
    #[arg(long)]
    spoold: Option<PathBuf>,
    /// Broker shards: the started spoold's --cores [default: CPUs available].
    #[arg(long)]
    shards: Option<u16>,
    /// Queue name [default: bench-<pid>]; created unless it exists.
    #[arg(long)]
    queue: Option<String>,
    /// Partitions of a created queue [default: shards × 2].
    #[arg(long)]
    partitions: Option<u32>,
    /// Payload bytes per message (the first 8 carry the send time).
    #[arg(long, default_value_t = 1024)]
    msg_bytes: u64,
    #[arg(long, default_value_t = 2)]
    producers: u64,
    #[arg(long, default_value_t = 2)]
    consumers: u64,
    /// Execution slots (claim credits) per consumer.
    #[arg(long, default_value_t = 256)]
    slots: u64,
    /// Sends in flight per producer.
    #[arg(long, default_value_t = 8192)]
    window: u64,
    /// Open loop: total msgs/s on a fixed schedule, latency from the intended send time.
    #[arg(long)]
    rate: Option<u64>,
    /// Producer linger in µs (0: send at once, batch while a partition's
    /// batches are in flight).
    #[arg(long, default_value_t = 0)]
    linger_us: u64,
    /// Producer batch target in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    batch_bytes: u64,
    /// Length of the measured window.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Warm-up before the window (not measured).
    #[arg(long, default_value_t = 2000)]
    warmup_ms: u64,
    /// tokio worker threads for all clients.
    #[arg(long, default_value_t = 2)]
    client_threads: u64,
    /// Claims each consumer keeps outstanding.
    #[arg(long, default_value_t = 4)]
    claims_in_flight: u64,
    /// How long a finished delivery waits for others to share its Ack (µs).
    #[arg(long, default_value_t = 1000)]
    ack_linger_us: u64,
    /// A started spoold's --spin-before-park-us (0 = park at once).
    #[arg(long, default_value_t = 0)]
    spin_before_park_us: u64,
}

#[derive(Debug, Args)]
struct LogAppendArgs {
    /// Parent directory; the run uses a fresh subdirectory and removes it afterwards.
    #[arg(long)]
    dir: PathBuf,
    /// Inline payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    record_bytes: u64,
    /// Concurrent appender tasks, each with one append in flight.
    #[arg(long, default_value_t = 256)]
    appenders: u64,
    /// Length of the measured window.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Warm-up before the window (not measured).
    #[arg(long, default_value_t = 1000)]
    warmup_ms: u64,
    #[arg(long, default_value_t = SEGMENT_BYTES_DEFAULT)]
    segment_bytes: u64,
    /// Group-commit target size (page multiple).
    #[arg(long, default_value_t = COMMIT_BYTES_DEFAULT)]
    commit_bytes: u64,
    /// Commits written but not yet synced at once.
    #[arg(long, default_value_t = INFLIGHT_COMMITS_DEFAULT as u64)]
    inflight_commits: u64,
    /// CPU to pin the shard to.
    #[arg(long, default_value_t = 0)]
    core: usize,
    /// Keep the log directory after the run.
    #[arg(long)]
    keep: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let report = match cli.command {
        Command::LogAppend(args) => {
            let config = LogAppendConfig {
                dir: args.dir,
                record_bytes: args.record_bytes,
                appenders: args.appenders,
                seconds: args.seconds,
                warmup_ms: args.warmup_ms,
                segment_bytes: args.segment_bytes,
                commit_bytes: args.commit_bytes,
                inflight_commits: args.inflight_commits,
                core: args.core,
                keep: args.keep,
            };
            log_append::run(&config)
                .and_then(|report| serde_json::to_string(&report).map_err(BenchError::from))
        }
        Command::StateMemory(args) => {
            let config = StateMemoryConfig {
                messages: args.messages,
                warm_messages: args.warm_messages,
                rate_per_s: args.rate_per_s,
            };
            state_memory::run(&config)
                .and_then(|report| serde_json::to_string(&report).map_err(BenchError::from))
        }
        Command::Recovery(args) => {
            let config = RecoveryConfig {
                dir: args.dir,
                messages: args.messages,
                record_bytes: args.record_bytes,
                batch_records: args.batch_records,
                enqueuers: args.enqueuers,
                rate_per_s: args.rate_per_s,
                segment_bytes: args.segment_bytes,
                core: args.core,
                keep: args.keep,
            };
            recovery::run(&config)
                .and_then(|report| serde_json::to_string(&report).map_err(BenchError::from))
        }
        Command::Throughput(args) => {
            let config = ThroughputConfig {
                addr: args.addr,
                dir: args.dir,
                spoold: args.spoold,
                shards: args.shards,
                queue: args.queue,
                partitions: args.partitions,
                msg_bytes: args.msg_bytes,
                producers: args.producers,
                consumers: args.consumers,
                slots: args.slots,
                window: args.window,
                rate: args.rate,
                linger_us: args.linger_us,
                batch_bytes: args.batch_bytes,
                seconds: args.seconds,
                warmup_ms: args.warmup_ms,
                client_threads: args.client_threads,
                claims_in_flight: args.claims_in_flight,
                ack_linger_us: args.ack_linger_us,
                spin_before_park_us: args.spin_before_park_us,
            };
            throughput::run(&config)
                .map_err(BenchError::from)
                .and_then(|report| serde_json::to_string(&report).map_err(BenchError::from))
        }
    };
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
