//! The loop itself ([`run`]): start the broker and the load, then per cycle
//! wait a seeded interval, take witness claims, kill, restart (or run a
//! failpoint cycle), check the full listing against the ledger and the
//! witnesses' refusal; at the end stop the load, let every lease run out,
//! check again, drain, and build the report.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spool_client::Admin;

use super::broker::{armed_cycle, blocking, cycle};
use super::check::{check_witness, drain, list_live, take_witness, WitnessTally};
use super::config::KillLoopConfig;
use super::ledger::Placement;
use super::report::{percentile_ms, FailpointOutcome, KillLoopReport, SubscriptionReport};
use super::rng::Rng;
use super::second;
use super::sessions;
use super::workers::{self, Shared};
use super::{now, unix_ms, KillLoopError, BULK_QUEUE, QUEUE};
use crate::{test_queue_config, Spoold, SpooldOptions};

/// Lines of the broker log printed when a run fails.
const LOG_TAIL_LINES: usize = 200;

/// Runs the kill loop (see the module doc) on the current tokio runtime.
///
/// # Errors
/// A bad configuration, or a broker that stops answering; contract
/// violations are not errors but counts in the report.
///
/// # Panics
/// When a broker does not start or restart (the harness panics with its
/// log).
pub async fn run(config: KillLoopConfig) -> Result<KillLoopReport, KillLoopError> {
    config.validate()?;
    let started = now();
    let mut options = SpooldOptions::new(config.cores);
    options.bin = config.spoold_bin.clone();
    options.args.extend(config.spoold_args.iter().cloned());
    let broker = blocking(move || Spoold::start_with(options)).await;
    let mut slot = Some(broker);
    let result = run_on(config, &mut slot, started).await;
    if let (Err(_), Some(broker)) = (&result, &slot) {
        // Its log says why the broker stopped answering.
        let log = broker.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        eprintln!(
            "---- spoold log tail ({}) ----\n{tail}\n---- end ----",
            broker.log_path().display()
        );
    }
    result
}

async fn run_on(
    config: KillLoopConfig,
    slot: &mut Option<Spoold>,
    started: Instant,
) -> Result<KillLoopReport, KillLoopError> {
    let broker =
        slot.as_ref().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin
        .create_queue(QUEUE, config.queue_config())
        .await
        .map_err(|error| KillLoopError::Setup(format!("create queue: {error}")))?;
    if let Some(name) = &config.subscription {
        second::create(&broker.admin_addr(), name, config.partitions).await?;
    }
    let shared = Arc::new(Shared::new(QUEUE.to_owned(), config.clone()));
    if !config.failpoints.is_empty() {
        admin
            .create_queue(BULK_QUEUE, test_queue_config(1, 30_000, 10_000))
            .await
            .map_err(|error| KillLoopError::Setup(format!("create bulk queue: {error}")))?;
    }
    let mut failpoints = Vec::new();

    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..config.producers {
        let worker_client = broker.client().await;
        let rng = Rng::new(config.seed, 1000 + u64::from(index));
        tasks.spawn(workers::producer(Arc::clone(&shared), worker_client, index, rng));
    }
    for index in 0..config.consumers {
        let rng = Rng::new(config.seed, 2000 + u64::from(index));
        if config.ordered {
            // Each life of these consumers connects a client of its own.
            let (bootstrap, client_config) =
                (client.bootstrap().to_owned(), client.config().clone());
            let shared = Arc::clone(&shared);
            tasks.spawn(sessions::consumer(shared, bootstrap, client_config, index, rng));
            continue;
        }
        let worker_client = broker.client().await;
        tasks.spawn(workers::consumer(Arc::clone(&shared), worker_client, index, rng, false));
    }
    if config.subscription.is_some() {
        for index in 0..config.consumers {
            let worker_client = broker.client().await;
            let rng = Rng::new(config.seed, 3000 + u64::from(index));
            let index = config.consumers + index;
            tasks.spawn(workers::consumer(Arc::clone(&shared), worker_client, index, rng, true));
        }
    }

    let mut rng = Rng::new(config.seed, 0);
    let mut restart_ms = Vec::new();
    let mut tally = WitnessTally::default();
    let mut port_waits = 0u64;
    for cycle_index in 0..config.kills {
        let pause = rng.range(config.kill_interval_ms_min, config.kill_interval_ms_max);
        // Time under test: the load runs this long between two kills.
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if let Some(finished) = tasks.try_join_next() {
            worker_result(finished)?;
        }
        let witness = take_witness(&shared, &client, &mut rng).await?;
        let killed_at = now();
        cycle(slot, false).await?;
        // After the reap, before the next start: see `Instance`.
        shared.instance.fetch_add(1, Ordering::AcqRel);
        if let Some(arm) = config.failpoints.get(cycle_index as usize) {
            let fired_at = armed_cycle(slot, arm, &client).await?;
            shared.instance.fetch_add(1, Ordering::AcqRel);
            if config.progress {
                eprintln!("killloop: failpoint {} fired at {fired_at:?}", arm.point);
            }
            failpoints.push(FailpointOutcome { point: arm.point.clone(), fired_at });
        }
        let gate = shared.gate.write().await;
        port_waits += u64::from(cycle(slot, true).await?);
        restart_ms.push(u64::try_from(killed_at.elapsed().as_millis()).unwrap_or(u64::MAX));
        let live = list_live(&admin, config.partitions).await?;
        shared.ledger().live_check(&live);
        if let Some(witness) = witness {
            check_witness(&shared, &client, witness, &mut tally).await?;
        }
        drop(gate);
        if config.progress {
            let ledger = shared.ledger();
            eprintln!(
                "killloop: kill {}/{}: restart {} ms, {} enqueues and {} acks acknowledged, \
                 {} violations",
                restart_ms.len(),
                config.kills,
                restart_ms.last().copied().unwrap_or(0),
                ledger.enqueued_count(),
                ledger.acked_count(),
                ledger.violations().total()
            );
        }
    }
    if config.progress {
        eprintln!("killloop: stopping the load and draining");
    }

    shared.stop.store(true, Ordering::Release);
    while let Some(finished) = tasks.join_next().await {
        worker_result(finished)?;
    }
    // Every lease handed out must run out before the listing can be exact
    // and the drain can claim everything.
    let deadline_ms = shared.lease_deadline_ms_max.load(Ordering::Acquire);
    let wait_ms = (deadline_ms + 100).saturating_sub(unix_ms());
    // Time under test: the leases run out.
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let live = list_live(&admin, config.partitions).await?;
    shared.ledger().live_check(&live);
    let drained = drain(&shared, &client, &admin).await?;
    let dead: HashSet<Placement> = list_live(&admin, config.partitions)
        .await?
        .into_iter()
        .filter(|(_, entry)| entry.dead_letter)
        .map(|(placement, _)| placement)
        .collect();
    let ledger = {
        let mut ledger = shared.ledger();
        ledger.final_check(&dead);
        std::mem::take(&mut *ledger)
    };
    let subscription = match &config.subscription {
        Some(name) => {
            let admin_addr = slot
                .as_ref()
                .ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?
                .admin_addr();
            let (drained, dead_letters) =
                second::drain(&shared, &client, &admin_addr, name).await?;
            let ledger = std::mem::take(&mut *shared.ledger_in(true));
            Some(SubscriptionReport {
                name: name.clone(),
                acked_enqueues_checked: ledger.enqueued_count() as u64,
                acks_acknowledged: ledger.acked_count() as u64,
                drained,
                dead_letters,
                violations: ledger.violations(),
                activity: ledger.activity(),
                samples: ledger.samples().to_vec(),
            })
        }
        None => None,
    };
    restart_ms.sort_unstable();
    let counters = &shared.counters;
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    Ok(KillLoopReport {
        seed: config.seed,
        kills: config.kills,
        duration_s: started.elapsed().as_secs_f64(),
        acked_enqueues_checked: ledger.enqueued_count() as u64,
        acks_acknowledged: ledger.acked_count() as u64,
        partitions_used: u32::try_from(ledger.partitions_enqueued()).unwrap_or(u32::MAX),
        drained,
        dead_letters: dead.len() as u64,
        witness_tokens_tried: tally.tried,
        witness_tokens_unexpired: tally.unexpired,
        witness_tokens_refused: tally.refused,
        port_waits,
        restart_ms_p50: percentile_ms(&restart_ms, 50),
        restart_ms_max: restart_ms.last().copied().unwrap_or(0),
        violations: ledger.violations(),
        activity: ledger.activity(),
        enqueue_retries: load(&counters.enqueue_retries),
        enqueue_rejected: load(&counters.enqueue_rejected),
        acks_refused: load(&counters.acks_refused),
        acks_refused_other: load(&counters.acks_refused_other),
        releases: load(&counters.releases),
        extends: load(&counters.extends),
        abandoned: load(&counters.abandoned),
        sessions_opened: load(&counters.sessions_opened),
        connections_dropped: load(&counters.connections_dropped),
        held_at_drop: load(&counters.held_at_drop),
        samples: ledger.samples().to_vec(),
        failpoints,
        subscription,
    })
}

fn worker_result(
    finished: Result<Result<(), KillLoopError>, tokio::task::JoinError>,
) -> Result<(), KillLoopError> {
    match finished {
        Ok(result) => result,
        Err(error) => Err(KillLoopError::Worker(error.to_string())),
    }
}
