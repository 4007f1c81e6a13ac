//! Thread-per-core bootstrap: one pinned glommio executor per shard, plus a
//! small control executor; the only code that sees more than one core.
//!
//! Owns process start-up and shutdown around the shards ([`Broker`]):
//! validate config, raise RLIMIT_MEMLOCK, lock the data directory, load the
//! secret, check every port is free, create the cross-core channels on the
//! main thread, start the executors, wait (under `startup_timeout_ms`) until
//! each has connected its channel and bound its port, and later drain them
//! on stop (under `shutdown_timeout_ms`).
//!
//! Cross-core channels (glommio `shared_channel`, one per shard, created here
//! and connected at start-up) carry **assignment changes only**; nothing on
//! the request path crosses cores. `channel_mesh` is avoided (DESIGN §8).
//! Stop requests reach executors through an `AtomicBool` polled by every
//! executor's permanent housekeeping timer, so a signal handler never has to
//! wake a glommio reactor.
//!
//! What a shard serves is not decided here: see [`hooks::ShardHooks`].

pub mod cpus;
mod executor;
pub mod hooks;
pub mod memlock;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use glommio::channels::shared_channel;
use glommio::{LocalExecutorBuilder, Placement};
use thiserror::Error;

use crate::control::assignment::{
    AssignmentError, AssignmentUpdate, AssignmentVersion, QueueName, ShardId,
};
use crate::control::config::{BrokerConfig, ConfigError};
use crate::control::data_dir::{BrokerSecret, DataDirError, DataDirLock};
use crate::fatal::FatalReason;
use crate::net::listener::{check_port_free, NetError};
use hooks::{ShardContext, ShardHooksFactory};

/// Capacity of each control → shard channel, in batches (≥ 1024 keeps a
/// burst of admin changes from blocking the control executor; DESIGN §8).
pub const SHARD_CHANNEL_CAPACITY: usize = 1024;
/// Control commands waiting for the control executor.
pub const CONTROL_COMMAND_QUEUE_MAX: usize = 1024;
/// How often the main thread checks the stop flag while shards run.
const MAIN_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Message from the control executor to a shard.
#[derive(Debug, Clone)]
pub enum ShardMessage {
    /// Consecutive table updates, to apply in order.
    Assignments(Arc<Vec<AssignmentUpdate>>),
}

/// A request to the control executor, answered on `reply`.
#[derive(Debug)]
pub(crate) enum ControlCommand {
    CreateQueue {
        queue: QueueName,
        partitions: u32,
        reply: mpsc::SyncSender<Result<AssignmentVersion, AssignmentError>>,
    },
    DeleteQueue {
        queue: QueueName,
        reply: mpsc::SyncSender<Result<AssignmentVersion, AssignmentError>>,
    },
}

/// Which executor an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorName {
    Shard(ShardId),
    Control,
}

impl std::fmt::Display for ExecutorName {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecutorName::Shard(shard) => write!(formatter, "shard {}", shard.0),
            ExecutorName::Control => formatter.write_str("control executor"),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    Ready(ExecutorName),
    Exited(ExecutorName, Result<(), ShardError>),
    StartupDeadline,
    ShutdownDeadline,
}

/// Why one executor failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ShardError {
    #[error("cannot create executor (cpu {cpu:?}): {reason}")]
    Executor { cpu: Option<usize>, reason: String },
    #[error(transparent)]
    Net(NetError),
    #[error("assignment copies diverged: {0}")]
    Assignment(AssignmentError),
    #[error("flush failed: {0}")]
    Flush(String),
    #[error("channel to shard {shard} closed")]
    ChannelClosed { shard: u16 },
    #[error("executor thread could not be spawned: {0}")]
    Spawn(String),
    #[error("executor thread panicked")]
    Panicked,
}

/// Why the broker did not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Memlock(#[from] memlock::MemlockError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{executor} failed to start: {error}")]
    Executor { executor: ExecutorName, error: ShardError },
    #[error("not up within startup_timeout_ms={timeout_ms}: {}", missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Timeout { timeout_ms: u64, missing: Vec<ExecutorName> },
}

impl StartError {
    /// The exit reason for `spoold`.
    pub fn fatal_reason(&self) -> FatalReason {
        match self {
            StartError::Config(_) => FatalReason::Config,
            StartError::Memlock(_) => FatalReason::Memlock,
            StartError::DataDir(DataDirError::Locked { .. }) => FatalReason::DataDirLocked,
            StartError::DataDir(_) => FatalReason::DataDir,
            StartError::Net(NetError::PortInUse { .. })
            | StartError::Executor { error: ShardError::Net(NetError::PortInUse { .. }), .. } => {
                FatalReason::PortInUse
            }
            StartError::Net(_) | StartError::Executor { .. } | StartError::Timeout { .. } => {
                FatalReason::Startup
            }
        }
    }
}

/// Why a running broker stopped with an error.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RunError {
    #[error("{executor} failed: {error}")]
    Executor { executor: ExecutorName, error: ShardError },
    #[error("{executor} stopped while the broker was running")]
    Unexpected { executor: ExecutorName },
    #[error("did not drain within shutdown_timeout_ms={timeout_ms}: {}", remaining.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    ShutdownTimeout { timeout_ms: u64, remaining: Vec<ExecutorName> },
}

impl RunError {
    pub fn fatal_reason(&self) -> FatalReason {
        match self {
            RunError::Executor { error: ShardError::Flush(_), .. } => FatalReason::Storage,
            RunError::Executor { .. } | RunError::Unexpected { .. } => FatalReason::ShardFailed,
            RunError::ShutdownTimeout { .. } => FatalReason::ShutdownTimeout,
        }
    }
}

/// A control-path request failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error(transparent)]
    Assignment(#[from] AssignmentError),
    #[error("too many control commands queued ({CONTROL_COMMAND_QUEUE_MAX})")]
    Busy,
    #[error("the control executor has stopped")]
    Stopped,
    #[error("not every shard applied version {version:?} within {timeout_ms} ms")]
    Timeout { version: AssignmentVersion, timeout_ms: u64 },
}

/// State the main thread, the control executor and the shards share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) stop_requested: Arc<AtomicBool>,
    pub(crate) applied_versions: Vec<AtomicU64>,
}

/// Handle to the control path, usable from any non-executor thread (it
/// blocks). Will back the admin endpoint; tests use it directly.
#[derive(Debug, Clone)]
pub struct ControlHandle {
    commands: mpsc::SyncSender<ControlCommand>,
    shared: Arc<Shared>,
}

impl ControlHandle {
    fn submit(
        &self,
        make: impl FnOnce(
            mpsc::SyncSender<Result<AssignmentVersion, AssignmentError>>,
        ) -> ControlCommand,
    ) -> Result<AssignmentVersion, ControlError> {
        let (reply, answer) = mpsc::sync_channel(1);
        match self.commands.try_send(make(reply)) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => return Err(ControlError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => return Err(ControlError::Stopped),
        }
        let version = answer.recv().map_err(|_| ControlError::Stopped)??;
        Ok(version)
    }

    /// Creates `queue` with `partitions` partitions placed round-robin over
    /// the shards; returns the table version that holds it. Shards apply it
    /// asynchronously: see [`wait_applied`](Self::wait_applied).
    ///
    /// # Errors
    /// Invalid name or count, queue exists, control stopped or busy.
    pub fn create_queue(
        &self,
        queue: &str,
        partitions: u32,
    ) -> Result<AssignmentVersion, ControlError> {
        let queue = QueueName::new(queue)?;
        self.submit(|reply| ControlCommand::CreateQueue { queue, partitions, reply })
    }

    /// Deletes `queue`; returns the table version without it.
    ///
    /// # Errors
    /// Unknown queue, control stopped or busy.
    pub fn delete_queue(&self, queue: &str) -> Result<AssignmentVersion, ControlError> {
        let queue = QueueName::new(queue)?;
        self.submit(|reply| ControlCommand::DeleteQueue { queue, reply })
    }

    /// The newest table version `shard` has applied.
    pub fn applied_version(&self, shard: ShardId) -> AssignmentVersion {
        AssignmentVersion(
            self.shared.applied_versions[usize::from(shard.0)].load(Ordering::Acquire),
        )
    }

    /// Blocks until every shard has applied `version`.
    ///
    /// # Errors
    /// [`ControlError::Timeout`] after about `timeout_ms`.
    pub fn wait_applied(
        &self,
        version: AssignmentVersion,
        timeout_ms: u64,
    ) -> Result<(), ControlError> {
        let poll = Duration::from_millis(2);
        let polls = timeout_ms.div_ceil(2).max(1);
        for _ in 0..polls {
            let all = self
                .shared
                .applied_versions
                .iter()
                .all(|applied| applied.load(Ordering::Acquire) >= version.0);
            if all {
                return Ok(());
            }
            std::thread::sleep(poll);
        }
        Err(ControlError::Timeout { version, timeout_ms })
    }
}

/// A running broker: the executors, the data-dir lock, the control handle.
/// Dropping it without [`wait`](Self::wait) leaves the executors running
/// until the process exits.
#[derive(Debug)]
pub struct Broker {
    config: Arc<BrokerConfig>,
    shared: Arc<Shared>,
    control: ControlHandle,
    events: mpsc::Receiver<Event>,
    events_sender: mpsc::Sender<Event>,
    threads: Vec<(ExecutorName, JoinHandle<()>)>,
    secret: BrokerSecret,
    // Held until the broker is dropped, after every executor has stopped.
    _lock: DataDirLock,
}

fn spawn_executor(
    name: ExecutorName,
    builder: LocalExecutorBuilder,
    cpu: Option<usize>,
    events: mpsc::Sender<Event>,
    body: impl FnOnce(
            mpsc::Sender<Event>,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ShardError>>>>
        + Send
        + 'static,
) -> Result<JoinHandle<()>, ShardError> {
    let thread_name = match name {
        ExecutorName::Shard(shard) => format!("spool-shard-{}", shard.0),
        ExecutorName::Control => "spool-control".to_owned(),
    };
    std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            // make() rather than spawn(): glommio's spawn panics in the new
            // thread when the executor cannot be created; we want a value.
            let events_for_body = events.clone();
            // With panic = "abort" (release) a panic ends the process; in
            // debug builds, report it instead of leaving the main thread
            // waiting for an executor that is gone.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                match builder.make() {
                    Ok(executor) => executor.run(async move { body(events_for_body).await }),
                    Err(error) => Err(ShardError::Executor { cpu, reason: error.to_string() }),
                }
            }));
            let result = outcome.unwrap_or(Err(ShardError::Panicked));
            let _ = events.send(Event::Exited(name, result));
        })
        .map_err(|error| ShardError::Spawn(error.to_string()))
}

impl Broker {
    /// Starts the broker and returns once every executor is serving.
    ///
    /// # Errors
    /// [`StartError`]; map it to an exit with [`StartError::fatal_reason`].
    pub fn start<F: ShardHooksFactory>(
        config: BrokerConfig,
        factory: F,
    ) -> Result<Broker, StartError> {
        let cpus = cpus::allowed_cpus();
        config.validate(cpus.len())?;
        let shard_count = config.shards;
        // One executor per shard plus the control executor.
        memlock::ensure(usize::from(shard_count) + 1)?;
        let lock = DataDirLock::acquire(&config.data_dir)?;
        let secret = BrokerSecret::load_or_create(&lock)?;
        for shard in 0..shard_count {
            check_port_free(config.shard_listen(shard))?;
        }

        let config = Arc::new(config);
        let stop_requested = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            stop_requested,
            applied_versions: (0..shard_count).map(|_| AtomicU64::new(0)).collect(),
        });
        let (events_sender, events) = mpsc::channel();
        let (commands_sender, commands) = mpsc::sync_channel(CONTROL_COMMAND_QUEUE_MAX);
        let factory = Arc::new(factory);
        let tick = config.housekeeping_tick();

        // Channel pairs are created here, on the main thread, and each end is
        // connected on its executor (DESIGN §8: no channel_mesh).
        let mut senders = Vec::with_capacity(usize::from(shard_count));
        let mut threads = Vec::with_capacity(usize::from(shard_count) + 1);
        let mut broker_threads_failed = None;
        for shard in 0..shard_count {
            let (sender, receiver) = shared_channel::new_bounded(SHARD_CHANNEL_CAPACITY);
            senders.push(sender);
            let cpu = cpus[usize::from(shard)];
            let context = ShardContext {
                shard: ShardId(shard),
                shard_count,
                cpu,
                listen: config.shard_listen(shard),
                config: config.clone(),
                secret: secret.clone(),
            };
            let mut builder = LocalExecutorBuilder::new(Placement::Fixed(cpu))
                .name(&format!("spool-shard-{shard}"));
            if config.spin_before_park_us > 0 {
                builder = builder.spin_before_park(config.spin_before_park());
            }
            let factory = factory.clone();
            let shared = shared.clone();
            let name = ExecutorName::Shard(ShardId(shard));
            let spawned =
                spawn_executor(name, builder, Some(cpu), events_sender.clone(), move |events| {
                    Box::pin(executor::shard_main(context, factory, receiver, shared, events))
                });
            match spawned {
                Ok(handle) => threads.push((name, handle)),
                Err(error) => {
                    broker_threads_failed = Some((name, error));
                    break;
                }
            }
        }
        if broker_threads_failed.is_none() {
            let shared_for_control = shared.clone();
            let builder = LocalExecutorBuilder::new(Placement::Unbound).name("spool-control");
            let spawned = spawn_executor(
                ExecutorName::Control,
                builder,
                None,
                events_sender.clone(),
                move |events| {
                    Box::pin(executor::control_main(
                        senders,
                        commands,
                        shared_for_control,
                        events,
                        tick,
                        shard_count,
                    ))
                },
            );
            match spawned {
                Ok(handle) => threads.push((ExecutorName::Control, handle)),
                Err(error) => broker_threads_failed = Some((ExecutorName::Control, error)),
            }
        }
        if let Some((executor, error)) = broker_threads_failed {
            shared.stop_requested.store(true, Ordering::Release);
            return Err(StartError::Executor { executor, error });
        }

        // The deadline is a message from a sleeping thread, so the main
        // thread never reads a clock.
        let deadline_sender = events_sender.clone();
        let startup_timeout = Duration::from_millis(config.startup_timeout_ms);
        std::thread::spawn(move || {
            std::thread::sleep(startup_timeout);
            let _ = deadline_sender.send(Event::StartupDeadline);
        });

        let mut waiting: Vec<ExecutorName> = threads.iter().map(|(name, _)| *name).collect();
        while !waiting.is_empty() {
            let event = match events.recv() {
                Ok(event) => event,
                // We hold a sender, so this cannot happen; treat as timeout.
                Err(_) => Event::StartupDeadline,
            };
            match event {
                Event::Ready(name) => waiting.retain(|waiting_name| *waiting_name != name),
                Event::Exited(executor, result) => {
                    shared.stop_requested.store(true, Ordering::Release);
                    let error = result.err().unwrap_or(ShardError::Panicked);
                    return Err(StartError::Executor { executor, error });
                }
                Event::StartupDeadline => {
                    shared.stop_requested.store(true, Ordering::Release);
                    return Err(StartError::Timeout {
                        timeout_ms: config.startup_timeout_ms,
                        missing: waiting,
                    });
                }
                Event::ShutdownDeadline => {}
            }
        }
        tracing::info!(
            shards = shard_count,
            listen = %config.listen,
            data_dir = %config.data_dir.display(),
            "spoold started"
        );
        let control = ControlHandle { commands: commands_sender, shared: shared.clone() };
        Ok(Broker { config, shared, control, events, events_sender, threads, secret, _lock: lock })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn control(&self) -> ControlHandle {
        self.control.clone()
    }

    pub fn secret(&self) -> &BrokerSecret {
        &self.secret
    }

    /// Listen address of every shard, by shard index.
    pub fn shard_addrs(&self) -> Vec<SocketAddr> {
        (0..self.config.shards).map(|shard| self.config.shard_listen(shard)).collect()
    }

    /// The flag that stops the broker; signal handlers set it.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.shared.stop_requested.clone()
    }

    /// Asks every executor to stop accepting and drain.
    pub fn request_stop(&self) {
        self.shared.stop_requested.store(true, Ordering::Release);
    }

    /// Blocks until every executor has stopped: normally after a stop
    /// request, or early if one fails (the others are then stopped too).
    ///
    /// # Errors
    /// The first executor failure, an executor that stopped unasked, or a
    /// drain that exceeded `shutdown_timeout_ms`.
    pub fn wait(mut self) -> Result<(), RunError> {
        let mut running: Vec<ExecutorName> = self.threads.iter().map(|(name, _)| *name).collect();
        let mut first_error: Option<RunError> = None;
        let mut deadline_armed = false;
        while !running.is_empty() {
            let stopping = self.shared.stop_requested.load(Ordering::Acquire);
            if stopping && !deadline_armed {
                deadline_armed = true;
                let sender = self.events_sender.clone();
                let timeout = Duration::from_millis(self.config.shutdown_timeout_ms);
                std::thread::spawn(move || {
                    std::thread::sleep(timeout);
                    let _ = sender.send(Event::ShutdownDeadline);
                });
                tracing::info!("stop requested: draining shards");
            }
            let event = match self.events.recv_timeout(MAIN_POLL_INTERVAL) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            match event {
                Event::Exited(executor, result) => {
                    running.retain(|name| *name != executor);
                    let error = match result {
                        Err(error) => Some(RunError::Executor { executor, error }),
                        Ok(()) if !self.shared.stop_requested.load(Ordering::Acquire) => {
                            Some(RunError::Unexpected { executor })
                        }
                        Ok(()) => None,
                    };
                    if let Some(error) = error {
                        tracing::error!(%error, "executor failed; stopping the broker");
                        self.request_stop();
                        first_error.get_or_insert(error);
                    }
                }
                Event::ShutdownDeadline => {
                    return Err(RunError::ShutdownTimeout {
                        timeout_ms: self.config.shutdown_timeout_ms,
                        remaining: running,
                    });
                }
                Event::Ready(_) | Event::StartupDeadline => {}
            }
        }
        for (name, handle) in self.threads.drain(..) {
            if handle.join().is_err() {
                first_error.get_or_insert(RunError::Executor {
                    executor: name,
                    error: ShardError::Panicked,
                });
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => {
                tracing::info!("spoold stopped cleanly");
                Ok(())
            }
        }
    }
}
