//! The code that runs inside each executor: shard main and control main.
//!
//! A shard connects its end of the assignment channel, binds its port,
//! builds its hooks, reports ready, then runs three things until told to
//! stop: the accept loop, the assignment loop and the permanent housekeeping
//! timer. On stop it closes the listener, waits for every connection to
//! drain, flushes its hooks and returns. The control executor connects the
//! sending ends, reports ready, and turns control commands into assignment
//! updates broadcast to every shard.
//!
//! The housekeeping timer runs on every executor for the executor's whole
//! life, not only when there is work: glommio 0.9 can lose a cross-executor
//! wake-up under oversubscription (DESIGN §8, DataDog/glommio#555) and a
//! periodic timer keeps each reactor turning. It is also how the
//! process-wide stop flag (set by a signal handler) reaches the executor.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use futures_lite::future::or;
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};
use glommio::sync::Gate;
use glommio::timer::Timer;

use crate::control::assignment::{AssignmentTable, AssignmentUpdate};
use crate::net::connection::ConnectionLimits;
use crate::net::listener::{accept_loop, bind_listener, AcceptStats};
use crate::net::stop::StopSignal;
use crate::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use crate::shard::{ControlCommand, Event, ExecutorName, ShardError, ShardMessage, Shared};

/// Most control commands turned into one batch of updates per tick.
pub const CONTROL_COMMANDS_PER_TICK_MAX: usize = 256;

/// Runs `on_tick` every `tick` until `finished` trips, tripping `stop` when
/// the process-wide stop flag is set.
async fn housekeeping(
    tick: Duration,
    shared: Arc<Shared>,
    stop: StopSignal,
    finished: StopSignal,
    mut on_tick: impl FnMut(),
) {
    loop {
        let ended = or(
            async {
                Timer::new(tick).await;
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
        on_tick();
    }
}

pub(crate) async fn shard_main<F: ShardHooksFactory>(
    context: ShardContext,
    factory: Arc<F>,
    receiver: SharedReceiver<ShardMessage>,
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
) -> Result<(), ShardError> {
    let shard = context.shard;
    let receiver = receiver.connect().await;
    let listener = bind_listener(context.listen).map_err(ShardError::Net)?;
    let hooks = Rc::new(factory.make(&context));
    let handler = hooks.frame_handler();
    let stop = StopSignal::new();
    let finished = StopSignal::new();

    let tick = context.config.housekeeping_tick();
    let housekeeping_task =
        glommio::spawn_local(housekeeping(tick, shared.clone(), stop.clone(), finished.clone(), {
            let hooks = hooks.clone();
            move || hooks.on_tick()
        }));

    let assignment_task = glommio::spawn_local({
        let hooks = hooks.clone();
        let stop = stop.clone();
        let shared = shared.clone();
        let mut table = AssignmentTable::new(context.shard_count);
        async move {
            loop {
                let message = or(async { receiver.recv().await }, async {
                    stop.wait().await;
                    None
                })
                .await;
                let Some(ShardMessage::Assignments(updates)) = message else {
                    return Ok(());
                };
                for update in updates.iter() {
                    // The control path sends consecutive versions over a
                    // FIFO channel; a refusal means the copies diverged.
                    table.apply(update).map_err(ShardError::Assignment)?;
                    if let Err(error) = hooks.on_assignment(update, &table).await {
                        tracing::error!(shard = shard.0, version = update.version.0, %error,
                            "assignment hook failed");
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

    let gate = Gate::new();
    let stats = Rc::new(AcceptStats::default());
    accept_loop(
        listener,
        handler,
        ConnectionLimits::from_config(&context.config),
        context.config.connections_per_shard_max as usize,
        stop.clone(),
        gate.clone(),
        stats.clone(),
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

pub(crate) async fn control_main(
    senders: Vec<SharedSender<ShardMessage>>,
    commands: mpsc::Receiver<ControlCommand>,
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
    tick: Duration,
    shard_count: u16,
) -> Result<(), ShardError> {
    let mut connected = Vec::with_capacity(senders.len());
    for sender in senders {
        connected.push(sender.connect().await);
    }
    let _ = events.send(Event::Ready(ExecutorName::Control));
    let stop = StopSignal::new();
    let finished = StopSignal::new();
    let housekeeping_task = glommio::spawn_local(housekeeping(
        tick,
        shared.clone(),
        stop.clone(),
        finished.clone(),
        || {},
    ));
    let mut table = AssignmentTable::new(shard_count);
    let mut result = Ok(());
    while !stop.is_stopped() {
        Timer::new(tick).await;
        let mut batch: Vec<AssignmentUpdate> = Vec::new();
        for command in commands.try_iter().take(CONTROL_COMMANDS_PER_TICK_MAX) {
            let (planned, reply) = match command {
                ControlCommand::CreateQueue { queue, partitions, reply } => {
                    (table.plan_create_queue(queue, partitions), reply)
                }
                ControlCommand::DeleteQueue { queue, reply } => {
                    (table.plan_delete_queue(queue), reply)
                }
            };
            let outcome = planned.and_then(|update| {
                table.apply(&update)?;
                batch.push(update.clone());
                Ok(update.version)
            });
            // The caller may have given up waiting; nothing to do then.
            let _ = reply.send(outcome);
        }
        if batch.is_empty() {
            continue;
        }
        let batch = Arc::new(batch);
        for (shard, sender) in connected.iter().enumerate() {
            if sender.send(ShardMessage::Assignments(batch.clone())).await.is_err() {
                result = Err(ShardError::ChannelClosed { shard: shard as u16 });
            }
        }
        if result.is_err() {
            break;
        }
    }
    finished.stop();
    housekeeping_task.await;
    result
}
