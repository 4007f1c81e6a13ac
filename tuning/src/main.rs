//! `spool-plan`: the capacity planner and host checks on the command line.
//!
//! A thin shell over the `spool_tuning` library: it merges inputs (defaults,
//! then an optional JSON file, then flags), prints a table or one JSON object,
//! and maps errors to exit codes (2 = invalid input or refused request,
//! 1 = a host change failed to apply). It computes nothing itself.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spool_tuning::host::{self, Check, HostError, Roots};
use spool_tuning::measure::{
    self, MeasureConfig, MEASURE_SECONDS_DEFAULT, MEASURE_SECONDS_MAX, MEASURE_SECONDS_MIN,
    PROBE_RATE_MSGS_PER_S_MAX, PROBE_RATE_MSGS_PER_S_MIN,
};
use spool_tuning::plan::MIB_BYTES;
use spool_tuning::verdict::{self, ModelNeed};
use spool_tuning::{plan, report, PlanError, PlanInputs};

/// Largest inputs file read: a PlanInputs object is well under a kilobyte.
const INPUTS_FILE_BYTES_MAX: u64 = 64 * 1024;

#[derive(Debug, Parser)]
#[command(
    name = "spool-plan",
    about = "Spool capacity planner: the 25k/s model as code, and host checks",
    allow_negative_numbers = true
)]
struct Cli {
    #[command(flatten)]
    inputs: InputArgs,
    /// Print one JSON object instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check this host (io_uring, memlock, CPUs, data dir's disk), list the changes Spool would
    /// make, and measure whether it carries the model (fdatasync beside the node's ingress,
    /// broker CPU per message).
    #[command(allow_negative_numbers = true)]
    Host {
        /// Data directory whose filesystem and device are checked (need not exist yet); the
        /// probes write in a temporary directory inside it (or its nearest existing ancestor).
        #[arg(long, default_value = ".")]
        data_dir: PathBuf,
        /// Make the listed changes (root only; runtime writes to /proc and /sys).
        #[arg(long)]
        apply: bool,
        #[command(flatten)]
        measure: MeasureArgs,
    },
}

/// How `host` measures the model's limits.
#[derive(Debug, Args)]
struct MeasureArgs {
    /// Only the read-only checks: no disk probes, no broker run.
    #[arg(long)]
    no_measure: bool,
    /// Length of each probe in seconds (sync alone, sync beside the writer, broker run).
    #[arg(long, default_value_t = MEASURE_SECONDS_DEFAULT, value_name = "SECONDS")]
    measure_seconds: f64,
    /// Directory holding spoold and spool-bench for the CPU probe [default: this executable's].
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Open-loop rate of the CPU probe (msgs/s) [default: the model's messages per node].
    #[arg(long, value_name = "MSGS_PER_S")]
    probe_rate: Option<u64>,
}

/// Workload flags; each overrides the defaults (the seed's model) and the inputs file.
#[derive(Debug, Args)]
struct InputArgs {
    /// JSON file with PlanInputs fields; missing fields keep their defaults.
    #[arg(long, global = true, value_name = "FILE")]
    inputs: Option<PathBuf>,
    /// Peak enqueue rate (msgs/s).
    #[arg(long, global = true)]
    rate: Option<f64>,
    /// Mean encoded record size including metadata (bytes; 1.6 KiB = 1638.4).
    #[arg(long, global = true)]
    record_bytes: Option<f64>,
    /// Copies of every record.
    #[arg(long, global = true)]
    replicas: Option<u32>,
    /// Broker nodes the replicas are spread over [default: one per replica].
    #[arg(long, global = true)]
    nodes: Option<u32>,
    /// Retention window after ingress (s).
    #[arg(long, global = true)]
    retention_s: Option<f64>,
    /// Producer rate during the burst (msgs/s).
    #[arg(long, global = true)]
    burst_rate: Option<f64>,
    /// Burst length (s).
    #[arg(long, global = true)]
    burst_s: Option<f64>,
    /// Consumer rate during the burst (msgs/s).
    #[arg(long, global = true)]
    burst_consumer_rate: Option<f64>,
    /// Producer rate after the burst (msgs/s).
    #[arg(long, global = true)]
    drain_ingress_rate: Option<f64>,
    /// Consumer rate after the burst (msgs/s).
    #[arg(long, global = true)]
    drain_consumer_rate: Option<f64>,
    /// Mean service time (ms).
    #[arg(long, global = true)]
    service_ms: Option<f64>,
    /// Service-time coefficient of variation (stddev / mean).
    #[arg(long, global = true)]
    service_cv: Option<f64>,
    /// Target worker utilization in (0, 1].
    #[arg(long, global = true)]
    utilization: Option<f64>,
    /// Produce throughput one partition sustains (msgs/s).
    #[arg(long, global = true)]
    partition_produce_rate: Option<f64>,
    /// Consume throughput one partition sustains (msgs/s).
    #[arg(long, global = true)]
    partition_consume_rate: Option<f64>,
    /// Fraction of disk kept free, in [0, 1).
    #[arg(long, global = true)]
    disk_reserve: Option<f64>,
    /// Lease = service p99.9 × this factor.
    #[arg(long, global = true)]
    lease_safety_factor: Option<f64>,
    /// Slow fdatasync used to size commits (ms).
    #[arg(long, global = true)]
    sync_slow_ms: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("invalid plan inputs: {0}")]
    Plan(#[from] PlanError),
    #[error("cannot read inputs file {path}: {source}")]
    InputsRead { path: PathBuf, source: std::io::Error },
    #[error("inputs file {path} is larger than {INPUTS_FILE_BYTES_MAX} bytes")]
    InputsTooLarge { path: PathBuf },
    #[error("inputs file {path} is not valid PlanInputs JSON: {source}")]
    InputsJson { path: PathBuf, source: serde_json::Error },
    #[error("{0}")]
    Host(#[from] HostError),
    #[error("--{flag} {value} is outside [{min}, {max}]")]
    OutOfRange { flag: &'static str, value: f64, min: f64, max: f64 },
    #[error("cannot encode JSON output: {0}")]
    Output(serde_json::Error),
    #[error("{failed} host change(s) failed to apply (see output)")]
    ApplyFailed { failed: usize },
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Plan(_)
            | CliError::InputsRead { .. }
            | CliError::InputsTooLarge { .. }
            | CliError::InputsJson { .. }
            | CliError::Host(_)
            | CliError::OutOfRange { .. } => 2,
            CliError::Output(_) | CliError::ApplyFailed { .. } => 1,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("spool-plan: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn run(cli: &Cli) -> Result<(), CliError> {
    let inputs = merged_inputs(&cli.inputs)?;
    let plan = plan(&inputs)?;
    match &cli.command {
        None => {
            if cli.json {
                let object = serde_json::json!({ "inputs": inputs, "plan": plan });
                println!("{}", to_json(&object)?);
            } else {
                print!("{}", report::render_plan(&inputs, &plan));
            }
            Ok(())
        }
        Some(Command::Host { data_dir, apply, measure: measure_args }) => {
            measure_args.validate()?;
            let roots = Roots::default();
            // Disk sizes are whole bytes; the plan's input limits keep this far below u64::MAX.
            let need_bytes = plan.disk_bytes_per_replica.ceil() as u64;
            let host_report = host::probe(data_dir, need_bytes, &roots);
            let applied = if *apply {
                // Refuses (NotRoot) before writing anything or printing a report.
                Some(host::apply(&host_report.changes, &roots)?)
            } else {
                None
            };
            let model = if measure_args.no_measure {
                None
            } else {
                let config = measure_args.config(&inputs, &plan, &host_report);
                eprintln!(
                    "spool-plan: measuring the model's limits in {} (about {:.0} s) ...",
                    host_report.probed_path,
                    config.seconds * 3.0 + 2.0
                );
                let measurements = measure::measure(Path::new(&host_report.probed_path), &config);
                let cpus = host_report.cpu_count.value().copied();
                Some(verdict::judge(measurements, cpus, ModelNeed::new(&inputs, &plan)))
            };
            if cli.json {
                let object = serde_json::json!({
                    "host": host_report,
                    "applied": applied,
                    "model": model,
                });
                println!("{}", to_json(&object)?);
            } else {
                print!("{}", report::render_host(&host_report));
                for result in applied.iter().flatten() {
                    let path = result.path.as_deref().unwrap_or("-");
                    println!("applied {} {path}: {}", result.setting, result.outcome);
                }
                match &model {
                    Some(model) => print!("\n{}", report::render_model(model)),
                    None => println!("\nmodel: not measured (--no-measure)"),
                }
            }
            let failed = applied
                .iter()
                .flatten()
                .filter(|result| result.outcome.starts_with("failed"))
                .count();
            if failed > 0 {
                return Err(CliError::ApplyFailed { failed });
            }
            Ok(())
        }
    }
}

impl MeasureArgs {
    fn validate(&self) -> Result<(), CliError> {
        let seconds = self.measure_seconds;
        if !(seconds.is_finite() && (MEASURE_SECONDS_MIN..=MEASURE_SECONDS_MAX).contains(&seconds))
        {
            return Err(CliError::OutOfRange {
                flag: "measure-seconds",
                value: seconds,
                min: MEASURE_SECONDS_MIN,
                max: MEASURE_SECONDS_MAX,
            });
        }
        let rate = self.probe_rate.unwrap_or(PROBE_RATE_MSGS_PER_S_MIN);
        if !(PROBE_RATE_MSGS_PER_S_MIN..=PROBE_RATE_MSGS_PER_S_MAX).contains(&rate) {
            return Err(CliError::OutOfRange {
                flag: "probe-rate",
                value: rate as f64,
                min: PROBE_RATE_MSGS_PER_S_MIN as f64,
                max: PROBE_RATE_MSGS_PER_S_MAX as f64,
            });
        }
        Ok(())
    }

    /// The probes' settings: the writer at this node's share of the model's
    /// ingress, the broker run with the model's record size on every CPU.
    fn config(
        &self,
        inputs: &PlanInputs,
        plan: &spool_tuning::Plan,
        report: &host::HostReport,
    ) -> MeasureConfig {
        let bin_dir = self.bin_dir.clone().or_else(|| {
            std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf))
        });
        let shards = match &report.cpu_count {
            Check::Ok { value } => u16::try_from(*value).unwrap_or(u16::MAX),
            Check::Unknown { .. } => 1,
        };
        MeasureConfig {
            seconds: self.measure_seconds,
            writer_target_bytes_per_s: plan.node_ingress_mib_per_s * MIB_BYTES,
            free_bytes: report.disk.free_bytes,
            bin_dir,
            // The node's rate: the CPU per message at the rate the verdict applies it to.
            probe_rate_msgs_per_s: self.probe_rate.unwrap_or_else(|| {
                let node_rate = plan.node_msgs_per_s.round() as u64;
                node_rate.clamp(PROBE_RATE_MSGS_PER_S_MIN, PROBE_RATE_MSGS_PER_S_MAX)
            }),
            // Validated to at most 1 MiB, so the cast is exact enough and in range.
            msg_bytes: inputs.record_bytes.round().max(1.0) as u64,
            shards,
        }
    }
}

fn to_json(value: &serde_json::Value) -> Result<String, CliError> {
    serde_json::to_string_pretty(value).map_err(CliError::Output)
}

/// Defaults, then the inputs file, then each flag given.
fn merged_inputs(args: &InputArgs) -> Result<PlanInputs, CliError> {
    let mut inputs = match &args.inputs {
        Some(path) => read_inputs_file(path)?,
        None => PlanInputs::default(),
    };
    let overrides: [(Option<f64>, &mut f64); 16] = [
        (args.rate, &mut inputs.rate_msgs_per_s),
        (args.record_bytes, &mut inputs.record_bytes),
        (args.retention_s, &mut inputs.retention_s),
        (args.burst_rate, &mut inputs.burst_rate_msgs_per_s),
        (args.burst_s, &mut inputs.burst_s),
        (args.burst_consumer_rate, &mut inputs.burst_consumer_msgs_per_s),
        (args.drain_ingress_rate, &mut inputs.drain_ingress_msgs_per_s),
        (args.drain_consumer_rate, &mut inputs.drain_consumer_msgs_per_s),
        (args.service_ms, &mut inputs.service_ms_mean),
        (args.service_cv, &mut inputs.service_cv),
        (args.utilization, &mut inputs.utilization_target),
        (args.partition_produce_rate, &mut inputs.partition_produce_msgs_per_s),
        (args.partition_consume_rate, &mut inputs.partition_consume_msgs_per_s),
        (args.disk_reserve, &mut inputs.disk_reserve_fraction),
        (args.lease_safety_factor, &mut inputs.lease_safety_factor),
        (args.sync_slow_ms, &mut inputs.sync_slow_ms),
    ];
    for (flag, field) in overrides {
        if let Some(value) = flag {
            *field = value;
        }
    }
    if let Some(replicas) = args.replicas {
        inputs.replicas = replicas;
    }
    if let Some(nodes) = args.nodes {
        inputs.nodes = Some(nodes);
    }
    Ok(inputs)
}

fn read_inputs_file(path: &Path) -> Result<PlanInputs, CliError> {
    use std::io::Read;
    let read_error = |source| CliError::InputsRead { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(INPUTS_FILE_BYTES_MAX + 1).read_to_string(&mut text).map_err(read_error)?;
    if text.len() as u64 > INPUTS_FILE_BYTES_MAX {
        return Err(CliError::InputsTooLarge { path: path.to_path_buf() });
    }
    serde_json::from_str(&text)
        .map_err(|source| CliError::InputsJson { path: path.to_path_buf(), source })
}
