//! The controller of a run: start or reach the broker, create the queues,
//! start the workers and the pacers, step through the phases, then stop the
//! load, collect the last sends and build the [`LoadOutcome`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use spool_client::spool_wire::proto::limits::PARTITIONS_MAX;
use spool_client::spool_wire::proto::{QueueConfig, SubscriptionStart};
use spool_client::spool_wire::ErrorCode;
use spool_client::{default_queue_config, Admin, Client, ClientError, Producer, ProducerConfig};
use spool_wire::limits::BATCH_BYTES_MAX;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};

use super::config::{LoadConfig, PhaseEnd, PACER_THREADS_MAX};
use super::pacer::Pacer;
use super::recorder::Recorder;
use super::report::{LoadOutcome, PhaseOutcome, Sample};
use super::sampler::{describe, progress_bar, sampler, Live};
use super::workers::Workers;
use super::LoadError;
use crate::dist;
use crate::harness::{add_consumer_errors, client_runtime, default_shards, Broker};
use crate::sends::{self, TIMESTAMP_BYTES};

/// How often the controller checks whether a draining phase is done.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// How long a queue's subscriptions may take to start in every partition.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long sends and handlers still in flight after the last phase may take.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `config` and returns what happened.
///
/// # Errors
/// A bad config, a broker that does not start or stop, a refused queue, or
/// sends or handlers still outstanding [`FINISH_TIMEOUT`] after the last
/// phase.
pub fn run(config: &LoadConfig) -> Result<LoadOutcome, LoadError> {
    config.validate()?;
    let shards = config.broker.shards.unwrap_or_else(default_shards);
    let broker = Broker::start_or_connect_with_args(
        config.broker.addr.as_deref(),
        config.broker.spoold.as_deref(),
        &config.broker.dir,
        shards,
        config.label,
        0,
        &config.broker.spoold_args,
    )?;
    let runtime = client_runtime(config.client_threads).map_err(LoadError::Runtime)?;
    let handle = runtime.handle().clone();
    let result = runtime.block_on(drive(config, broker.addr(), broker.started(), shards, handle));
    runtime.shutdown_timeout(Duration::from_secs(5));
    let stopped = broker.stop();
    let outcome = result?;
    stopped?;
    Ok(outcome)
}

async fn create_queues(
    config: &LoadConfig,
    admin: &Admin,
    shards: u16,
) -> Result<(Vec<String>, bool, u32), ClientError> {
    let base =
        config.queue.clone().unwrap_or_else(|| format!("{}-{}", config.label, std::process::id()));
    let names: Vec<String> = if config.queues == 1 {
        vec![base]
    } else {
        (0..config.queues).map(|index| format!("{base}-{index}")).collect()
    };
    let wanted = config.partitions.unwrap_or(u32::from(shards) * 2).min(PARTITIONS_MAX);
    let mut created = false;
    for name in &names {
        let queue_config = QueueConfig {
            max_messages: config.queue_max_messages,
            max_bytes: config.queue_max_bytes,
            dedupe_window_ms: config.dedupe_window_ms,
            ..default_queue_config(wanted)
        };
        match admin.create_queue(name, queue_config).await {
            Ok(_) => created = true,
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => {}
            Err(error) => return Err(error),
        }
    }
    let partitions =
        u32::try_from(admin.client().partitions(&names[0]).await?.len()).unwrap_or(u32::MAX);
    for name in &names {
        subscribe(admin, name, config.subscriptions, partitions).await?;
    }
    Ok((names, created, partitions))
}

/// The name of a queue's `index`-th subscription (0: the default).
pub(super) fn subscription_name(index: u32) -> Option<String> {
    (index > 0).then(|| format!("sub-{index}"))
}

/// Gives `queue` its subscriptions `sub-1` ... `sub-{count - 1}` besides
/// the default (those it lacks, from the earliest record) and waits until
/// every one has started in each of its `partitions` partitions, so that
/// each sees every enqueue of the run.
async fn subscribe(
    admin: &Admin,
    queue: &str,
    count: u32,
    partitions: u32,
) -> Result<(), ClientError> {
    if count <= 1 {
        return Ok(());
    }
    let has = |described: &spool_client::spool_wire::proto::DescribeQueueResponse, name: &str| {
        described.subscriptions.iter().any(|sub| sub.name == name)
    };
    let described = admin.describe_queue(queue).await?;
    for name in (1..count).filter_map(subscription_name) {
        if !has(&described, &name) {
            admin.create_subscription(queue, &name, SubscriptionStart::Earliest).await?;
        }
    }
    let deadline = tokio::time::Instant::now() + SUBSCRIBE_TIMEOUT;
    loop {
        let described = admin.describe_queue(queue).await?;
        let started = (1..count).filter_map(subscription_name).all(|name| {
            described
                .subscriptions
                .iter()
                .any(|sub| sub.name == name && sub.partitions >= partitions)
        });
        if started {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ClientError::Protocol(format!(
                "the subscriptions of {queue} did not start in its {partitions} partitions \
                 within {SUBSCRIBE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn drive(
    config: &LoadConfig,
    addr: &str,
    spoold_started: bool,
    shards: u16,
    handle: Handle,
) -> Result<LoadOutcome, LoadError> {
    let admin = Admin::new(Client::connect(addr).await?);
    let (queues, created, partitions) = create_queues(config, &admin, shards).await?;
    let recorder = Arc::new(Recorder::new(config.seed)?);
    let mut workers = Workers::new(config, addr, &queues, Arc::clone(&recorder));
    workers.set_slots(config.phases[0].slots).await?;

    // Producers: the pacing threads start as soon as they exist, so time 0 of
    // the recorder is reset just before the first is spawned.
    let producer_config = ProducerConfig {
        linger: Duration::from_micros(config.linger_us),
        max_batch_bytes: usize::try_from(config.batch_bytes).unwrap_or(BATCH_BYTES_MAX),
        ..ProducerConfig::default()
    };
    // Producer k (queue by queue) is paced by thread k mod threads; each
    // thread has its own connection.
    let producers_total = config.producers();
    let threads = producers_total.clamp(1, PACER_THREADS_MAX);
    let mut thread_queues: Vec<Vec<String>> = vec![Vec::new(); threads as usize];
    let mut index = 0usize;
    for queue in &queues {
        for _ in 0..config.producers_per_queue {
            thread_queues[index % threads as usize].push(queue.clone());
            index += 1;
        }
    }
    let mut pacer_parts = Vec::new();
    for served in thread_queues {
        let producer = Producer::new(Client::connect(addr).await?, producer_config.clone())?;
        pacer_parts.push((served, producer));
    }
    let live = Arc::new(Live {
        recorder: Arc::clone(&recorder),
        workers: tokio::sync::Mutex::new(workers),
        admin: admin.clone(),
        queues: queues.clone(),
        phase_names: config.phases.iter().map(|phase| phase.name.clone()).collect(),
        phase_slots: config.phases.iter().map(|phase| phase.slots).collect(),
        progress: progress_bar(config),
        subscriptions: config.subscriptions,
    });
    // Time zero: from here on the recorder's clock is the run's clock.
    let recorder_base_ns = recorder.now_ns();
    let zero_ns = |ns: u64| ns.saturating_sub(recorder_base_ns);
    let window = usize::try_from(config.window).unwrap_or(1);
    let msg_bytes = usize::try_from(config.msg_bytes).unwrap_or(TIMESTAMP_BYTES);
    let mut producers = Vec::new();
    let mut collectors = Vec::new();
    let mut pacers = Vec::new();
    for (stream, (served, producer)) in pacer_parts.into_iter().enumerate() {
        let share = served.len() as f64 / f64::from(producers_total.max(1));
        producers.push(producer.clone());
        let (sender, receiver) = mpsc::channel(window);
        let collector = Arc::clone(&recorder);
        collectors.push(tokio::spawn(sends::collect(receiver, move |sent| collector.sent(sent))));
        let pacer = Pacer {
            handle: handle.clone(),
            producer,
            queues: served,
            recorder: Arc::clone(&recorder),
            rates: config.phases.iter().map(|phase| phase.rate_per_s * share).collect(),
            arrivals: config.arrivals,
            rng: dist::rng(config.seed, 1 + stream as u64),
            permits: Arc::new(Semaphore::new(window)),
            msg_bytes,
            payloads: Arc::clone(&config.payloads),
            sends: sender,
        };
        let thread = std::thread::Builder::new()
            .name(format!("bench-pacer-{stream}"))
            .spawn(move || pacer.run())
            .map_err(LoadError::Thread)?;
        pacers.push(thread);
    }
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = tokio::spawn(sampler(Arc::clone(&live), Arc::clone(&stop_sampling)));

    let mut phases = Vec::new();
    for (index, phase) in config.phases.iter().enumerate() {
        if index > 0 {
            live.workers.lock().await.set_slots(phase.slots).await?;
            recorder.phase.store(index, Ordering::Release);
        }
        let start = live.snapshot().await;
        let mut backlog_max = start.backlog();
        let length = Duration::from_secs_f64(phase.seconds);
        let drained = match phase.end {
            PhaseEnd::Elapsed => {
                tokio::time::sleep(length).await;
                None
            }
            PhaseEnd::Backlog { target_msgs } => {
                let deadline = tokio::time::Instant::now() + length;
                loop {
                    let now = live.snapshot().await;
                    backlog_max = backlog_max.max(now.backlog());
                    if now.backlog() >= target_msgs as i64 {
                        break Some(true);
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break Some(false);
                    }
                    tokio::time::sleep(DRAIN_POLL).await;
                }
            }
            PhaseEnd::Drained { threshold_msgs } => {
                let deadline = tokio::time::Instant::now() + length;
                loop {
                    let now = live.snapshot().await;
                    backlog_max = backlog_max.max(now.backlog());
                    if now.ready() <= threshold_msgs as i64 {
                        break Some(true);
                    }
                    if tokio::time::Instant::now() >= deadline {
                        break Some(false);
                    }
                    tokio::time::sleep(DRAIN_POLL).await;
                }
            }
        };
        let end = live.snapshot().await;
        let (end_check, _) = live.check().await?;
        let length_s = (end.t_ns.saturating_sub(start.t_ns)) as f64 / 1e9;
        let per_s = |now: u64, before: u64| now.saturating_sub(before) as f64 / length_s.max(1e-9);
        phases.push(PhaseOutcome {
            name: phase.name.clone(),
            started_s: zero_ns(start.t_ns) as f64 / 1e9,
            ended_s: zero_ns(end.t_ns) as f64 / 1e9,
            drained,
            rate_per_s: phase.rate_per_s,
            slots: phase.slots,
            publish_rate: per_s(end.enqueued, start.enqueued),
            consume_rate: per_s(end.stats.acked, start.stats.acked),
            backlog_client_max: backlog_max.max(end.backlog()),
            end_check,
            busy_slots_mean: 0.0,
        });
    }

    // Stop sending, let the last sends land, stop the workers.
    recorder.stopping.store(true, Ordering::Release);
    stop_sampling.store(true, Ordering::Release);
    sends::finish(collectors, &producers, pacers, FINISH_TIMEOUT)
        .await
        .map_err(|_| LoadError::Finish("producers", FINISH_TIMEOUT))?;
    let mut series = match sampling.await {
        Ok(result) => result?,
        Err(_) => Vec::new(),
    };
    let duration_s = zero_ns(recorder.now_ns()) as f64 / 1e9;
    live.progress.finish_and_clear();
    // The sampler, the only other owner, has ended.
    let live = Arc::try_unwrap(live).map_err(|_| LoadError::Finish("sampler", FINISH_TIMEOUT))?;
    let workers = live.workers.into_inner();
    let stats = tokio::time::timeout(FINISH_TIMEOUT, workers.finish())
        .await
        .map_err(|_| LoadError::Finish("consumers", FINISH_TIMEOUT))?;
    let broker_final = describe(&admin, &queues).await?;
    if created && !spoold_started {
        for queue in &queues {
            admin.delete_queue(queue).await?;
        }
    }

    // Samples on the run's clock; busy slots per phase.
    for sample in &mut series {
        sample.t_s = zero_ns((sample.t_s * 1e9) as u64) as f64 / 1e9;
    }
    for phase in &mut phases {
        let busy: Vec<f64> = series
            .iter()
            .filter(|sample| sample.t_s > phase.started_s && sample.t_s <= phase.ended_s)
            .map(|sample| sample.busy_slots as f64)
            .collect();
        phase.busy_slots_mean =
            if busy.is_empty() { 0.0 } else { busy.iter().sum::<f64>() / busy.len() as f64 };
    }
    let claim_to_ack_mean_ms = {
        let with_acks: Vec<&Sample> =
            series.iter().filter(|sample| sample.consume_rate > 0.0).collect();
        let held: f64 = with_acks.iter().map(|sample| sample.held_slots as f64).sum();
        let rate: f64 = with_acks.iter().map(|sample| sample.consume_rate).sum();
        if rate > 0.0 {
            held / rate * 1000.0
        } else {
            0.0
        }
    };
    let mut errors = recorder.errors.lock().unwrap_or_else(PoisonError::into_inner).clone();
    add_consumer_errors(&mut errors, &stats);
    let histograms = recorder.histograms();
    Ok(LoadOutcome {
        duration_s,
        subscriptions: config.subscriptions,
        phases,
        series,
        submitted: recorder.submitted.load(Ordering::Acquire),
        enqueued: recorder.enqueued.load(Ordering::Acquire),
        claimed: stats.claimed,
        acked: stats.acked,
        released: stats.released,
        redelivered: recorder.redelivered.load(Ordering::Acquire),
        extend_failed: stats.extend_failed,
        claim_requests: stats.claim_requests,
        ack_requests: stats.ack_requests,
        publish_latency_ms: histograms.publish.summary().into(),
        e2e_latency_ms: histograms.e2e.summary().into(),
        service_ms: histograms.service.summary().into(),
        claim_to_ack_mean_ms,
        broker_final,
        errors,
        addr: addr.to_owned(),
        spoold_started,
        shards,
        queues,
        queues_created: created,
        partitions,
    })
}
