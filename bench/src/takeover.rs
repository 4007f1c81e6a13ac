//! `takeover`: time from a worker's death to its claims being claimable
//! again (`docs/design/sessions.md`), per round, as p50/p99, in three
//! cases: leases alone (the worker's process dies: its claims wait out
//! their lease), a session and a process that dies (its sockets close: each
//! shard sees its connection end), and a session and a worker that hangs
//! (its sockets stay open, its heartbeats stop: the shard's sweep finds the
//! timeout).
//!
//! What it owns: a `spoold` child, one queue of `partitions` partitions,
//! and per round a worker — its own client on its own tokio runtime —
//! that claims `claims` messages with a `lease_ms` lease; "dies" is that
//! runtime dropped (its tasks and sockets gone, as the kernel does for a
//! killed process), "hangs" is the runtime kept and nothing sent. The clock
//! starts just before the death; a second client long-polls claims of
//! every partition until all `claims` came back, acks them, and the round's
//! time is when the last one came.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_client::spool_wire::ErrorCode;
use spool_client::{default_queue_config, Admin, ClaimOptions, Client, ClientError, Session};
use spool_client::{Message, Producer, ProducerConfig};
use thiserror::Error;

use crate::failover::{percentiles, Percentiles};
use crate::harness::{default_shards, sibling_spoold, HarnessError, SpooldProcess};

/// What one run does: the `takeover` subcommand's flags.
#[derive(Clone, Debug, clap::Args)]
pub struct TakeoverConfig {
    /// Rounds per case.
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,
    /// Claims the worker holds when it dies.
    #[arg(long, default_value_t = 8)]
    pub claims: u32,
    /// Partitions of the queue (over every shard).
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// The worker's lease (ms): what leases alone wait out.
    #[arg(long, default_value_t = 3_000)]
    pub lease_ms: u32,
    /// The worker's session timeout (ms).
    #[arg(long, default_value_t = 1_000)]
    pub session_timeout_ms: u32,
    /// Shards of the started spoold [default: the CPUs].
    #[arg(long)]
    pub shards: Option<u16>,
    /// Parent of the broker's temporary data directory.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// spoold binary to start [default: spoold next to this executable].
    #[arg(long)]
    pub spoold: Option<PathBuf>,
}

/// One case's rounds.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// `lease`, `session-killed`, `session-hung`.
    pub case: &'static str,
    /// Death → every claim claimable again, per round (ms).
    pub takeover_ms: Percentiles,
    /// Attempts of the messages taken over (2: the dead claim counted).
    pub attempts_seen: Vec<u32>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct TakeoverReport {
    pub shards: u16,
    pub partitions: u32,
    pub rounds: u32,
    pub claims: u32,
    pub lease_ms: u32,
    pub session_timeout_ms: u32,
    pub cases: Vec<CaseReport>,
}

/// Why a run failed.
#[derive(Debug, Error)]
pub enum TakeoverError {
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("cannot start a tokio runtime: {0}")]
    Runtime(std::io::Error),
    #[error("round {round} of {case}: the worker claimed {got} of {want} messages")]
    Short { case: &'static str, round: u32, got: usize, want: u32 },
    #[error(
        "round {round} of {case}: only {got} of {want} claims came back within {waited_ms} ms"
    )]
    NotBack { case: &'static str, round: u32, got: usize, want: u32, waited_ms: u64 },
}

#[derive(Clone, Copy)]
enum Case {
    Lease,
    SessionKilled,
    SessionHung,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Lease => "lease",
            Case::SessionKilled => "session-killed",
            Case::SessionHung => "session-hung",
        }
    }
}

/// Runs every case.
///
/// # Errors
/// [`TakeoverError`] when the broker cannot be started, a worker cannot
/// claim, or claims do not come back within twice the lease.
pub fn run(config: &TakeoverConfig) -> Result<TakeoverReport, TakeoverError> {
    let binary = match &config.spoold {
        Some(path) => path.clone(),
        None => sibling_spoold()?,
    };
    let shards = config.shards.unwrap_or_else(default_shards);
    let spoold = SpooldProcess::start(&binary, &config.dir, shards, "takeover", 0)?;
    let result = measure(config, spoold.addr());
    let stopped = spoold.stop();
    let cases = result?;
    stopped?;
    Ok(TakeoverReport {
        shards,
        partitions: config.partitions,
        rounds: config.rounds,
        claims: config.claims,
        lease_ms: config.lease_ms,
        session_timeout_ms: config.session_timeout_ms,
        cases,
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, TakeoverError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(TakeoverError::Runtime)
}

fn measure(config: &TakeoverConfig, addr: &str) -> Result<Vec<CaseReport>, TakeoverError> {
    let main = runtime()?;
    let queue = format!("takeover-{}", std::process::id());
    let taker = main.block_on(async {
        let client = Client::connect(addr).await?;
        let mut queue_config = default_queue_config(config.partitions);
        queue_config.lease_max_ms = queue_config.lease_max_ms.max(config.lease_ms);
        match Admin::new(client.clone()).create_queue(&queue, queue_config).await {
            Ok(_) => Ok(client),
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => Ok(client),
            Err(error) => Err(TakeoverError::from(error)),
        }
    })?;
    let mut cases = Vec::new();
    for case in [Case::Lease, Case::SessionKilled, Case::SessionHung] {
        let mut times = Vec::new();
        let mut attempts_seen = Vec::new();
        for round in 0..config.rounds {
            let (took, attempts) = one_round(config, addr, &queue, &main, &taker, case, round)?;
            times.push(took.as_secs_f64() * 1e3);
            for attempt in attempts {
                if !attempts_seen.contains(&attempt) {
                    attempts_seen.push(attempt);
                }
            }
        }
        attempts_seen.sort_unstable();
        cases.push(CaseReport {
            case: case.name(),
            takeover_ms: percentiles(times),
            attempts_seen,
        });
    }
    Ok(cases)
}

#[allow(clippy::too_many_arguments)]
fn one_round(
    config: &TakeoverConfig,
    addr: &str,
    queue: &str,
    main: &tokio::runtime::Runtime,
    taker: &Client,
    case: Case,
    round: u32,
) -> Result<(Duration, Vec<u32>), TakeoverError> {
    let want = config.claims;
    main.block_on(async {
        let producer = Producer::new(taker.clone(), ProducerConfig::default())?;
        for index in 0..want {
            producer.send(queue, Message::new(format!("round-{round}-{index}"))).await?;
        }
        Ok::<_, TakeoverError>(())
    })?;
    let worker = runtime()?;
    let held = worker.block_on(async {
        let client = Client::connect(addr).await?;
        let mut sessions: Vec<Session> = Vec::new();
        if !matches!(case, Case::Lease) {
            for &via in client.claim_targets(queue).await?.iter() {
                let member = format!("takeover-{round}");
                let timeout = config.session_timeout_ms;
                sessions.push(client.open_session(queue, via, None, &member, timeout).await?);
            }
        }
        let mut held = Vec::new();
        while held.len() < want as usize {
            let left = want - u32::try_from(held.len()).unwrap_or(want);
            let options = ClaimOptions::new(left).lease_ms(config.lease_ms).wait_ms(2_000);
            let more = client.claim_any(queue, &options).await?;
            if more.is_empty() {
                break;
            }
            held.extend(more);
        }
        Ok::<_, TakeoverError>((client, sessions, held.len()))
    })?;
    let (client, sessions, got) = held;
    if got < want as usize {
        return Err(TakeoverError::Short { case: case.name(), round, got, want });
    }
    let started = instant_now();
    // The death: a killed process's runtime and sockets are gone; a hung
    // one keeps them and sends nothing.
    let hung = match case {
        Case::SessionHung => Some((worker, client, sessions)),
        Case::Lease | Case::SessionKilled => {
            drop((client, sessions));
            drop(worker);
            None
        }
    };
    let bound = Duration::from_millis(u64::from(config.lease_ms) * 2 + 5_000);
    let (back, attempts, took) = main.block_on(async {
        let mut back = Vec::new();
        while back.len() < want as usize && instant_now().duration_since(started) < bound {
            let left = want - u32::try_from(back.len()).unwrap_or(want);
            let options = ClaimOptions::new(left).lease_ms(30_000).wait_ms(1_000);
            back.extend(taker.claim_any(queue, &options).await?);
        }
        // When the last one came, before the acks.
        let took = instant_now().duration_since(started);
        let attempts: Vec<u32> = back.iter().map(|delivery| delivery.attempt()).collect();
        for delivery in &back {
            taker.ack(queue, delivery.partition(), &[delivery.token()]).await?;
        }
        Ok::<_, TakeoverError>((back.len(), attempts, took))
    })?;
    drop(hung);
    if back < want as usize {
        let waited_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        return Err(TakeoverError::NotBack {
            case: case.name(),
            round,
            got: back,
            want,
            waited_ms,
        });
    }
    Ok((took, attempts))
}

/// One line per case for the terminal.
pub fn summary(report: &TakeoverReport) -> String {
    report
        .cases
        .iter()
        .map(|case| {
            format!(
                "spool-bench takeover {}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} rounds \
                 ({} claims, lease {} ms, session {} ms)",
                case.case,
                case.takeover_ms.p50,
                case.takeover_ms.p99,
                case.takeover_ms.max,
                report.rounds,
                report.claims,
                report.lease_ms,
                report.session_timeout_ms
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
