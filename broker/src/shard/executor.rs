//! The code that runs inside each executor: shard main and control main.
//!
//! A shard connects its end of the assignment channel, binds its port,
//! builds its hooks, reports ready, then runs three things until told to
//! stop: the accept loop, the assignment loop and the permanent housekeeping
//! timer. On stop it closes the listener, waits for every connection to
//! drain, flushes its hooks and returns. the coordinator connects the
//! sending ends, sends the catalog's replay, reports ready, and turns control
//! commands into assignment updates: applied to its table, written to the
//! catalog (durable), then broadcast to every shard, then answered. A catalog
//! write that fails before its rename undoes the tick's changes and answers
//! each with the error; one whose outcome is unknown (directory fsync
//! failed) stops the coordinator, and with it the broker. In a cluster the
//! controller group decides creates and deletes instead
//! (`controller_run.rs`).
//!
//! The housekeeping timer runs on every executor for the executor's whole
//! life, not only when there is work: glommio 0.9 can lose a cross-executor
//! wake-up under oversubscription (ARCHITECTURE.md, "Platform notes", DataDog/glommio#555) and a
//! periodic timer keeps each reactor turning. It is also how the
//! process-wide stop flag (set by a signal handler) reaches the executor.

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, PoisonError};
use std::time::Duration;

use futures_lite::future::or;
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};
use glommio::sync::Gate;
use glommio::timer::Timer;

use crate::clock::instant_now;
use crate::control::assignment::{
    AssignmentError, AssignmentTable, AssignmentUpdate, AssignmentVersion,
};
use crate::control::catalog::{self, Catalog};
use crate::limits::{COORDINATOR_BUSY_FOR, COORDINATOR_IDLE_POLL, HOUSEKEEPING_IDLE_MAX};
use crate::limits::{COORDINATOR_COMMANDS_PER_TICK_MAX, REPLAY_WAIT_POLL};
use crate::net::connection::ConnectionLimits;
use crate::net::listener::{accept_loop, bind_listener, AcceptStats, NetError};
use crate::net::stop::StopSignal;
use crate::queue::QueueId;
use crate::shard::alarm::Alarm;
use crate::shard::controller_run::ClusterCatalog;
use crate::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use crate::shard::report::{ConnectionCounts, ExecutorCounts, ShardReport};
use crate::shard::{
    broadcast, CoordinatorCommand, CoordinatorError, Event, ExecutorName, KeyChange, QueueCreated,
    ShardError, ShardMessage, Shared,
};

/// What the housekeeping loop drives: a shard's hooks, or nothing but the
/// stop flag and the allocator (the coordinator).
trait Ticker {
    fn tick(&self);
    fn next_tick_in(&self, min: Duration, max: Duration) -> Duration;
    fn alarm(&self) -> Option<Rc<Alarm>>;
}

impl<H: ShardHooks> Ticker for Rc<H> {
    fn tick(&self) {
        self.on_tick();
    }

    fn next_tick_in(&self, min: Duration, max: Duration) -> Duration {
        ShardHooks::next_tick_in(&**self, min, max).clamp(min, max)
    }

    fn alarm(&self) -> Option<Rc<Alarm>> {
        ShardHooks::alarm(&**self)
    }
}

/// the coordinator's housekeeping: nothing falls due on it.
struct NothingDue;

impl Ticker for NothingDue {
    fn tick(&self) {}

    fn next_tick_in(&self, _min: Duration, max: Duration) -> Duration {
        max
    }

    fn alarm(&self) -> Option<Rc<Alarm>> {
        None
    }
}

/// Ticks `ticker` until `finished` trips, tripping `stop` when the
/// process-wide stop flag is set. After each tick it sleeps until the
/// ticker's next deadline, at least `tick` and at most
/// [`HOUSEKEEPING_IDLE_MAX`], or until the ticker's alarm rings (a request
/// brought a deadline forward): a shard with nothing due wakes a few times a
/// second instead of every `tick`.
async fn housekeeping(
    tick: Duration,
    shared: Arc<Shared>,
    stop: StopSignal,
    finished: StopSignal,
    ticker: impl Ticker,
) {
    let alarm = ticker.alarm();
    let mut collected_at = instant_now();
    let mut sleep = tick;
    loop {
        let ended = or(
            async {
                or(
                    async {
                        Timer::new(sleep).await;
                    },
                    async {
                        match &alarm {
                            Some(alarm) => alarm.rung().await,
                            None => std::future::pending().await,
                        }
                    },
                )
                .await;
                false
            },
            async {
                finished.wait().await;
                true
            },
        )
        .await;
        if ended {
            return;
        }
        if shared.stop_requested.load(Ordering::Acquire) {
            stop.stop();
        }
        ticker.tick();
        let now = instant_now();
        if now.duration_since(collected_at) >= crate::limits::HEAP_COLLECT_INTERVAL {
            // Freed memory leaves RSS even while the shard is idle.
            crate::alloc::collect();
            collected_at = now;
        }
        sleep = ticker.next_tick_in(tick, HOUSEKEEPING_IDLE_MAX);
    }
}

pub(crate) async fn shard_main<F: ShardHooksFactory>(
    context: ShardContext,
    factory: Arc<F>,
    receiver: SharedReceiver<ShardMessage>,
    start_table: AssignmentTable,
    serve_from: AssignmentVersion,
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
) -> Result<(), ShardError> {
    let shard = context.shard;
    let receiver = receiver.connect().await;
    let listener = bind_listener(context.listen).map_err(ShardError::Net)?;
    let hooks = Rc::new(factory.make(&context));
    // Before the replay's updates are applied (the channel holds them).
    hooks.start().await.map_err(|error| match <F::Hooks as ShardHooks>::port_in_use(&error) {
        Some(addr) => ShardError::Net(NetError::PortInUse { addr }),
        None => ShardError::Start(error.to_string()),
    })?;
    let handler = hooks.frame_handler();
    let stop = StopSignal::new();
    let finished = StopSignal::new();

    let tick = context.config.housekeeping_tick();
    let housekeeping_task = glommio::spawn_local(housekeeping(
        tick,
        shared.clone(),
        stop.clone(),
        finished.clone(),
        hooks.clone(),
    ));

    // Created before the assignment loop, which reports them when asked.
    let stats = Rc::new(AcceptStats::default());
    let assignment_task = glommio::spawn_local({
        let hooks = hooks.clone();
        let stats = stats.clone();
        let stop = stop.clone();
        let shared = shared.clone();
        let mut table = start_table;
        async move {
            // glommio hands out its run-time figures since the previous call
            // (it resets them), so the shard adds them up here, the one
            // place that asks.
            let mut executor = ExecutorCounts::default();
            loop {
                let message = or(async { receiver.recv().await }, async {
                    stop.wait().await;
                    None
                })
                .await;
                let updates = match message {
                    Some(ShardMessage::Assignments(updates)) => updates,
                    Some(ShardMessage::Policy(update)) => {
                        hooks.on_policy(&update);
                        shared.auth.applied[usize::from(shard.0)]
                            .store(update.generation, Ordering::Release);
                        continue;
                    }
                    Some(ShardMessage::Report(reply)) => {
                        let mut report = ShardReport::new(shard, crate::io::stats::snapshot());
                        report.connections = ConnectionCounts {
                            active: stats.active.get() as u64,
                            accepted: stats.accepted.get(),
                            refused_over_limit: stats.refused_over_limit.get(),
                            tls_handshake_failures: stats.tls_handshake_failures.get(),
                            ended: stats.ended(),
                        };
                        let since = glommio::executor().executor_stats();
                        executor.busy_us = executor.busy_us.saturating_add(
                            u64::try_from(since.executor_runtime().as_micros()).unwrap_or(u64::MAX),
                        );
                        executor.tasks = executor.tasks.saturating_add(since.tasks_executed());
                        report.executor = executor;
                        hooks.report(&mut report);
                        // The asker may have given up; one slot per shard,
                        // so this never waits.
                        let _ = reply.try_send(report);
                        continue;
                    }
                    None => return Ok(()),
                };
                for update in updates.iter() {
                    // The coordinator sends consecutive versions over a
                    // FIFO channel; a refusal means the copies diverged.
                    table.apply(update).map_err(ShardError::Assignment)?;
                    if let Err(error) = hooks.on_assignment(update, &table).await {
                        tracing::error!(shard = shard.0, version = update.version.0, %error,
                            "assignment hook failed");
                        // Live changes only: a creator may be waiting for
                        // this version (the catalog's replay has none).
                        if update.version > serve_from {
                            shared.record_hook_failure(
                                update.version,
                                crate::shard::HookFailure {
                                    reason: format!("shard {}: {error}", shard.0),
                                    refused: <F::Hooks as ShardHooks>::refuses(&error),
                                },
                            );
                        }
                    }
                    shared.applied_versions[usize::from(shard.0)]
                        .store(update.version.0, Ordering::Release);
                }
            }
        }
    });

    // Ready only once the channel is connected and the port is bound.
    let _ = events.send(Event::Ready(ExecutorName::Shard(shard)));
    tracing::info!(shard = shard.0, cpu = context.cpu, listen = %context.listen, "shard serving");

    // Accept nothing before this shard has applied the catalog's replay
    // (`serve_from`): until then its table is empty and it would answer
    // QUEUE_NOT_FOUND for queues that exist. Connections wait in the backlog.
    let applied = &shared.applied_versions[usize::from(shard.0)];
    while applied.load(Ordering::Acquire) < serve_from.0 && !stop.is_stopped() {
        Timer::new(REPLAY_WAIT_POLL).await;
    }

    if !stop.is_stopped() {
        hooks.replayed().map_err(|error| ShardError::Refused(error.to_string()))?;
    }
    shared.replay_accepted[usize::from(shard.0)].store(true, Ordering::Release);
    let memory = context.config.shard_memory();
    crate::net::memory::ShardMemory::configure_this_shard(
        usize::try_from(memory.requests).unwrap_or(usize::MAX),
        usize::try_from(memory.responses).unwrap_or(usize::MAX),
        context.config.frame_bytes_max as usize + crate::limits::READ_CHUNK_BYTES,
    );
    let gate = Gate::new();
    accept_loop(
        listener,
        handler,
        connection_limits(&context.config),
        context.config.connections_per_shard_max as usize,
        stop.clone(),
        gate.clone(),
        stats.clone(),
        context.config.tls.clone(),
    )
    .await;
    tracing::info!(shard = shard.0, active = stats.active.get(), "stopped accepting; draining");
    // The gate only fails to close if it is already closed; it is ours.
    let _ = gate.close().await;
    let assignment_result = assignment_task.await;
    let flush_result = hooks.flush().await.map_err(|error| ShardError::Flush(error.to_string()));
    finished.stop();
    housekeeping_task.await;
    tracing::info!(shard = shard.0, accepted = stats.accepted.get(), "shard stopped");
    assignment_result.and(flush_result)
}

/// What the coordinator starts from: the table after the catalog's
/// replay, the replay itself (sent to the shards first) and the next id.
#[derive(Debug)]
pub(crate) struct ControlStart {
    pub(crate) table: AssignmentTable,
    pub(crate) replay: Vec<AssignmentUpdate>,
    pub(crate) next_queue_id: QueueId,
    pub(crate) data_dir: PathBuf,
    /// `BrokerConfig::partitions_max`.
    pub(crate) partitions_max: usize,
    /// This node's cluster: the catalog is the controller group's.
    pub(crate) cluster: Option<Arc<crate::control::cluster::ClusterNode>>,
}

/// A command's answer, held until the tick's catalog write decides it.
enum Answer {
    Create(
        mpsc::SyncSender<Result<QueueCreated, CoordinatorError>>,
        Result<QueueCreated, CoordinatorError>,
    ),
    Delete(
        mpsc::SyncSender<Result<AssignmentVersion, CoordinatorError>>,
        Result<AssignmentVersion, CoordinatorError>,
    ),
}

impl Answer {
    /// Turns a success into `error` (the change it reported was undone).
    fn undo(&mut self, error: &Arc<catalog::CatalogError>) {
        match self {
            Answer::Create(_, outcome @ Ok(_)) => {
                *outcome = Err(CoordinatorError::Catalog(error.clone()))
            }
            Answer::Delete(_, outcome @ Ok(_)) => {
                *outcome = Err(CoordinatorError::Catalog(error.clone()))
            }
            Answer::Create(..) | Answer::Delete(..) => {}
        }
    }

    fn send(self) {
        // The caller may have given up waiting; nothing to do then.
        match self {
            Answer::Create(reply, outcome) => {
                let _ = reply.send(outcome);
            }
            Answer::Delete(reply, outcome) => {
                let _ = reply.send(outcome);
            }
        }
    }
}

/// the coordinator's state: its table copy and the id allocator.
struct ControlState {
    table: AssignmentTable,
    next_queue_id: QueueId,
    partitions_max: usize,
}

impl ControlState {
    /// Plans and applies one command to the table; the catalog is written
    /// later, for the whole tick.
    fn execute(
        &mut self,
        command: CoordinatorCommand,
        batch: &mut Vec<AssignmentUpdate>,
    ) -> Answer {
        match command {
            CoordinatorCommand::CreateQueue { queue, partitions, config, reply } => {
                let outcome = (|| {
                    let queue_id = self.next_queue_id;
                    let next =
                        queue_id.0.checked_add(1).ok_or(CoordinatorError::QueueIdsExhausted)?;
                    // An existing name answers QUEUE_EXISTS whatever the
                    // node's room (a client's create-unless-it-exists).
                    if self.table.queue(&queue).is_some() {
                        return Err(AssignmentError::QueueExists(queue).into());
                    }
                    self.table.check_room_within(partitions as usize, self.partitions_max)?;
                    let update =
                        self.table.plan_create_queue(queue, queue_id, partitions, config)?;
                    self.table.apply(&update)?;
                    self.next_queue_id = QueueId(next);
                    let version = update.version;
                    batch.push(update);
                    Ok(QueueCreated { version, queue_id })
                })();
                Answer::Create(reply, outcome)
            }
            CoordinatorCommand::Report { .. } | CoordinatorCommand::Policy { .. } => {
                unreachable!("report requests and policies are forwarded, not executed")
            }
            CoordinatorCommand::KeyChange { change, reply } => {
                let outcome = (|| {
                    let update = match change {
                        KeyChange::Grow { queue, partitions } => {
                            let adding = self.table.partitions_added(&queue, partitions);
                            self.table.check_room_within(adding, self.partitions_max)?;
                            self.table.plan_grow_queue(queue, partitions)?
                        }
                        KeyChange::Drained { queue, key_version, partition } => {
                            self.table.plan_keys_drained(queue, key_version, partition)?
                        }
                        KeyChange::Subscribe { queue, name, start } => {
                            self.table.plan_subscribe(queue, name, start)?
                        }
                        KeyChange::Unsubscribe { queue, name } => {
                            self.table.plan_unsubscribe(queue, name)?
                        }
                        KeyChange::Reseek { queue, name, start } => {
                            self.table.plan_reseek(queue, name, start)?
                        }
                        KeyChange::Settled { .. } | KeyChange::Move { .. } => {
                            return Err(CoordinatorError::NotClustered);
                        }
                    };
                    self.table.apply(&update)?;
                    let version = update.version;
                    batch.push(update);
                    Ok(version)
                })();
                // Answered as a delete is: with the version that holds it.
                Answer::Delete(reply, outcome)
            }
            CoordinatorCommand::DeleteQueue { queue, expect_id, reply } => {
                let outcome = (|| {
                    if let Some(expected) = expect_id {
                        let current = self.table.queue(&queue).map(|entry| entry.id);
                        if current != Some(expected) {
                            return Err(AssignmentError::QueueNotFound(queue).into());
                        }
                    }
                    let update = self.table.plan_delete_queue(queue)?;
                    self.table.apply(&update)?;
                    let version = update.version;
                    batch.push(update);
                    Ok(version)
                })();
                Answer::Delete(reply, outcome)
            }
        }
    }
}

pub(crate) async fn control_main(
    senders: Vec<SharedSender<ShardMessage>>,
    commands: mpsc::Receiver<CoordinatorCommand>,
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
    tick: Duration,
    start: ControlStart,
) -> Result<(), ShardError> {
    let mut connected = Vec::with_capacity(senders.len());
    for sender in senders {
        connected.push(sender.connect().await);
    }
    let connected = Rc::new(connected);
    // The catalog's queues are the first updates every shard sees.
    if !start.replay.is_empty() {
        broadcast(&connected, Arc::new(start.replay)).await?;
    }
    // In a cluster the controller group decides every change
    // (`controller_run.rs`); opened before the coordinator reports ready,
    // so a node it refuses does not start.
    let cluster = match start.cluster.clone() {
        Some(node) => Some(
            ClusterCatalog::open(
                node,
                &start.data_dir,
                start.partitions_max,
                start.table.clone(),
                connected.clone(),
                shared.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let _ = events.send(Event::Ready(ExecutorName::Coordinator));
    let stop = StopSignal::new();
    let finished = StopSignal::new();
    let housekeeping_task = glommio::spawn_local(housekeeping(
        tick,
        shared.clone(),
        stop.clone(),
        finished.clone(),
        NothingDue,
    ));
    let data_dir = start.data_dir;
    let mut state = ControlState {
        table: start.table,
        next_queue_id: start.next_queue_id,
        partitions_max: start.partitions_max,
    };
    let mut result = Ok(());
    // Commands are polled every `tick` while they keep coming, and every
    // COORDINATOR_IDLE_POLL once none came for COORDINATOR_BUSY_FOR: an idle broker's
    // coordinator wakes a few dozen times a second, and the first
    // command after a quiet spell waits at most one idle poll.
    let mut last_command = instant_now();
    while !stop.is_stopped() {
        let poll = if instant_now().duration_since(last_command) < COORDINATOR_BUSY_FOR {
            tick
        } else {
            COORDINATOR_IDLE_POLL.max(tick)
        };
        Timer::new(poll).await;
        let (reports, commands): (Vec<CoordinatorCommand>, Vec<CoordinatorCommand>) =
            commands.try_iter().take(COORDINATOR_COMMANDS_PER_TICK_MAX).partition(|command| {
                matches!(
                    command,
                    CoordinatorCommand::Report { .. } | CoordinatorCommand::Policy { .. }
                )
            });
        for command in reports {
            match command {
                CoordinatorCommand::Report { reply } => {
                    // try_send: a shard whose channel is full (a burst of
                    // changes) is left out of this report rather than block
                    // the coordinator; the asker sees it missing.
                    for sender in connected.iter() {
                        let _ = sender.try_send(ShardMessage::Report(reply.clone()));
                    }
                }
                CoordinatorCommand::Policy { update, reply } => {
                    // Every shard must get it: wait for room in a full channel.
                    let mut sent = Ok(());
                    for (shard, sender) in connected.iter().enumerate() {
                        if sender.send(ShardMessage::Policy(update.clone())).await.is_err() {
                            sent = Err(format!("the channel to shard {shard} is closed"));
                            break;
                        }
                    }
                    let _ = reply.send(sent);
                }
                _ => {}
            }
        }
        if let Some(cluster) = &cluster {
            if let Some(error) = cluster.take_failure() {
                result = Err(error);
                break;
            }
            if !commands.is_empty() {
                last_command = instant_now();
                commands.into_iter().for_each(|command| cluster.handle(command));
            }
            continue;
        }
        if commands.is_empty() {
            continue;
        }
        last_command = instant_now();
        let before = (state.table.clone(), state.next_queue_id);
        let mut batch: Vec<AssignmentUpdate> = Vec::new();
        let mut answers: Vec<Answer> =
            commands.into_iter().map(|command| state.execute(command, &mut batch)).collect();
        if !batch.is_empty() {
            // Durable before any shard may act on it. Blocking std::fs on
            // this executor is deliberate: it serves nothing else.
            let catalog = Catalog::from_table(&state.table, state.next_queue_id);
            match catalog::store(&data_dir, &catalog) {
                Ok(()) => {
                    *shared.committed.write().unwrap_or_else(PoisonError::into_inner) =
                        Arc::new(state.table.clone());
                }
                Err(error) if !error.outcome_unknown() => {
                    tracing::error!(%error, "catalog write failed; change refused");
                    let error = Arc::new(error);
                    answers.iter_mut().for_each(|answer| answer.undo(&error));
                    (state.table, state.next_queue_id) = before;
                    batch.clear();
                }
                Err(error) => {
                    tracing::error!(%error, "catalog write outcome unknown; stopping");
                    let message = error.to_string();
                    let error = Arc::new(error);
                    answers.iter_mut().for_each(|answer| answer.undo(&error));
                    answers.into_iter().for_each(Answer::send);
                    result = Err(ShardError::Catalog(message));
                    break;
                }
            }
        }
        if !batch.is_empty() {
            if let Err(error) = broadcast(&connected, Arc::new(batch)).await {
                result = Err(error);
            }
        }
        answers.into_iter().for_each(Answer::send);
        if result.is_err() {
            break;
        }
    }
    if let Some(cluster) = cluster {
        cluster.stop().await;
    }
    finished.stop();
    housekeeping_task.await;
    result
}

/// The bounds every client connection of the shard runs under
/// (`net/connection.rs`), from the broker's settings: the network edge does
/// not read the configuration itself.
fn connection_limits(config: &crate::control::config::BrokerConfig) -> ConnectionLimits {
    ConnectionLimits {
        frame_bytes_max: config.frame_bytes_max as usize,
        in_flight_max: config.in_flight_per_connection_max as usize,
        waiting_max: config.claim_waiters_per_connection_max as usize,
        idle_timeout: Duration::from_millis(config.idle_timeout_ms),
        frame_timeout: Duration::from_millis(config.frame_timeout_ms),
        write_timeout: Duration::from_millis(config.write_timeout_ms),
        response_bytes_max: crate::limits::RESPONSE_QUEUE_BYTES_MAX,
        io_poll_interval: config.io_poll_interval(),
        pace_percent: config.consumer_pace_percent,
    }
}
