//! `spool-bench`: the command line over the `spool_bench` scenarios. Each
//! subcommand runs one scenario and prints one JSON object on stdout; errors
//! go to stderr with exit code 1. It measures nothing itself.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spool_bench::log_append::{self, LogAppendConfig};
use spool_bench::BenchError;
use spool_broker::limits::{COMMIT_BYTES_DEFAULT, INFLIGHT_COMMITS_DEFAULT, SEGMENT_BYTES_DEFAULT};

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
