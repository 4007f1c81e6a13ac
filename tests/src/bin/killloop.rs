//! `killloop`: runs the kill loop ([`spool_tests::killloop`]) against a real
//! `spoold` and prints one JSON report on stdout.
//!
//! ```text
//! cargo run --release -p spool-tests --bin killloop -- --kills 200 --seed 7 [--cores 2] [--quick]
//!     [--partitions 4] [--backlog 4000] [--sub NAME] [--ordered [--keys 32]] [--spoold-arg=FLAG ...]
//! ```
//!
//! Exit code: 0 when every violation count is 0, 1 when any is not, 2 for a
//! usage error, 3 when the run could not finish (the broker stopped
//! answering). The seed goes to stderr first, so a run that dies still names
//! it. `--quick` uses the test's short intervals and small load.
//! `--partitions N` sets the queue's partition count (default 4);
//! `--backlog N` the unacked enqueues at which producers pause (default
//! 4,000, 1,000 with `--quick`).
//! `--sub NAME` adds a second subscription with its own consumers and
//! ledger (`docs/testing.md`, "Kill loop"); `--max-deliveries N` lowers
//! the queue's delivery limit (default 10,000) so dead letters are made
//! and accounted for too.
//! `--ordered` makes the queue ordered: records get one of `--keys N`
//! routing keys (default 32), consumers claim under sessions and drop their
//! connections while holding claims, and each key's deliveries are checked
//! for order (`key_order_regressions`, `key_overlaps`).
//! Each `--spoold-arg=FLAG` (or `--spoold-arg FLAG`) is passed to every
//! `spoold` start as is, after the harness's own flags.

use std::process::ExitCode;

use spool_tests::killloop::{run, KillLoopConfig};

const USAGE: &str = "usage: killloop --kills N [--seed S] [--cores C] [--quick] \
                     [--partitions P] [--backlog B] [--sub NAME] [--max-deliveries N] [--ordered] [--keys K] \
                     [--spoold-arg=FLAG ...]";

struct Args {
    kills: u32,
    seed: u64,
    cores: Option<u16>,
    partitions: Option<u32>,
    backlog: Option<usize>,
    quick: bool,
    spoold_args: Vec<String>,
    subscription: Option<String>,
    max_deliveries: Option<u32>,
    ordered: bool,
    keys: Option<u32>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut kills = None;
    let mut seed = None;
    let mut cores = None;
    let mut partitions = None;
    let mut backlog = None;
    let mut quick = false;
    let mut spoold_args = Vec::new();
    let mut subscription = None;
    let mut max_deliveries = None;
    let mut ordered = false;
    let mut keys = None;
    while let Some(arg) = args.next() {
        if let Some(flag) = arg.strip_prefix("--spoold-arg=") {
            spoold_args.push(flag.to_owned());
            continue;
        }
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--kills" => {
                kills = Some(value("--kills")?.parse().map_err(|e| format!("--kills: {e}"))?)
            }
            "--seed" => seed = Some(value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--cores" => {
                cores = Some(value("--cores")?.parse().map_err(|e| format!("--cores: {e}"))?)
            }
            "--partitions" => {
                partitions =
                    Some(value("--partitions")?.parse().map_err(|e| format!("--partitions: {e}"))?)
            }
            "--backlog" => {
                backlog = Some(value("--backlog")?.parse().map_err(|e| format!("--backlog: {e}"))?)
            }
            "--quick" => quick = true,
            "--sub" => subscription = Some(value("--sub")?),
            "--max-deliveries" => {
                let text = value("--max-deliveries")?;
                max_deliveries = Some(text.parse().map_err(|e| format!("--max-deliveries: {e}"))?)
            }
            "--ordered" => ordered = true,
            "--keys" => keys = Some(value("--keys")?.parse().map_err(|e| format!("--keys: {e}"))?),
            "--spoold-arg" => spoold_args.push(value("--spoold-arg")?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    let kills = kills.ok_or_else(|| format!("--kills is required\n{USAGE}"))?;
    // No seed given: one from the clock, printed so the run can be repeated.
    let seed = seed.unwrap_or_else(spool_tests::killloop::unix_ms);
    Ok(Args {
        kills,
        seed,
        cores,
        partitions,
        backlog,
        quick,
        spoold_args,
        subscription,
        max_deliveries,
        ordered,
        keys,
    })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    eprintln!("killloop: seed {} kills {}", args.seed, args.kills);
    let mut config = if args.quick {
        KillLoopConfig::quick(args.kills, args.seed)
    } else {
        KillLoopConfig::new(args.kills, args.seed)
    };
    config.progress = true;
    config.spoold_args = args.spoold_args;
    config.subscription = args.subscription;
    config.ordered = args.ordered;
    if let Some(keys) = args.keys {
        config.keys = keys;
    }
    if let Some(max) = args.max_deliveries {
        config.max_deliveries = max;
    }
    if let Some(cores) = args.cores {
        config.cores = cores;
    }
    if let Some(partitions) = args.partitions {
        config.partitions = partitions;
    }
    if let Some(backlog) = args.backlog {
        config.backlog_max = backlog;
    }
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("killloop: tokio runtime: {error}");
                return ExitCode::from(3);
            }
        };
    match runtime.block_on(run(config)) {
        Ok(report) => {
            println!("{}", report.to_json());
            if report.violations_total() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("killloop: seed {}: {error}", args.seed);
            println!("{}", serde_json::json!({ "seed": args.seed, "error": error.to_string() }));
            ExitCode::from(3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Args, String> {
        parse_args(text.split_whitespace().map(str::to_owned))
    }

    // Goal: the flags parse and bad input is refused. Method: a few lines.
    #[test]
    fn arguments_parse() {
        let args = parse("--kills 5 --seed 9 --cores 1 --quick").expect("valid flags");
        assert_eq!((args.kills, args.seed, args.cores, args.quick), (5, 9, Some(1), true));
        assert!(parse("--seed 1").is_err(), "--kills is required");
        assert!(parse("--kills x").is_err());
        assert!(parse("--kills 1 --bogus").is_err());
        let args = parse("--kills 1 --spoold-arg=--journal-retain-bytes --spoold-arg 0")
            .expect("valid flags");
        assert_eq!(args.spoold_args, ["--journal-retain-bytes", "0"]);
        assert!(parse("--kills 1 --log-layout journal").is_err(), "the layout flag is gone");
        let args = parse("--kills 1 --partitions 256 --backlog 4000").expect("valid flags");
        assert_eq!((args.partitions, args.backlog), (Some(256), Some(4000)));
        assert!(parse("--kills 1 --partitions many").is_err());
        let args = parse("--kills 1 --ordered --keys 8").expect("valid flags");
        assert_eq!((args.ordered, args.keys), (true, Some(8)));
        assert!(!parse("--kills 1").expect("valid flags").ordered);
        assert!(parse("--kills 1 --keys").is_err());
    }
}
