//! Thread-per-core bootstrap: one pinned glommio executor per shard, plus a
//! small coordinator; the only code that sees more than one core.
//!
//! Owns process start-up and shutdown around the shards ([`Broker`]):
//! validate config, raise RLIMIT_MEMLOCK, lock the data directory, load the
//! secret, check every port is free, create the cross-core channels on the
//! main thread, start the executors, wait (under `startup_timeout_ms`) until
//! each has connected its channel and bound its port, and later drain them
//! on stop (under `shutdown_timeout_ms`).
//!
//! Queues survive restarts through the catalog (`control::catalog`): start
//! loads it (a damaged one, or one placing partitions on shards that no
//! longer exist, is a [`StartError::Catalog`]), the coordinator replays
//! its creates to the shards as their first assignment updates, and start
//! returns only once every shard has applied them. the coordinator
//! rewrites the catalog before broadcasting each later change.
//!
//! Cross-core channels (glommio `shared_channel`, one per shard, created here
//! and connected at start-up) carry assignment changes and the admin port's
//! report requests (`ShardMessage::Report`: each shard answers with a
//! [`report::ShardReport`] of what it already counts); nothing on the
//! request path crosses cores. A reloaded auth policy takes the same path
//! (`ShardMessage::Policy`, see `auth_reload.rs` and `auth::reload`).
//! `channel_mesh` is avoided (ARCHITECTURE.md, "Platform notes").
//! Stop requests reach executors through an `AtomicBool` polled by every
//! executor's permanent housekeeping timer, so a signal handler never has to
//! wake a glommio reactor.
//!
//! What a shard serves is not decided here: see [`hooks::ShardHooks`].

pub mod alarm;
mod auth_reload;
mod controller_run;
mod coordinator;
pub mod cpus;
mod executor;
pub mod hooks;
pub mod memlock;
pub mod nofile;
pub mod replication;
pub mod report;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use glommio::channels::shared_channel;
use glommio::{LocalExecutorBuilder, Placement};
use thiserror::Error;

use crate::control::assignment::{
    AssignmentError, AssignmentTable, AssignmentUpdate, AssignmentVersion, QueueName, ShardId,
};
use crate::control::catalog::{self, Catalog, CatalogError};
use crate::control::config::{BrokerConfig, ConfigError};
use crate::control::data_dir::{BrokerSecret, DataDirError, DataDirFormat, DataDirLock};
use crate::fatal::FatalReason;
use crate::limits::{
    COORDINATOR_COMMAND_QUEUE_MAX, COORDINATOR_POLL_INTERVAL, HOOK_FAILURES_PER_VERSION_MAX,
    HOOK_FAILURE_VERSIONS_MAX, MAIN_POLL_INTERVAL, SHARD_CHANNEL_CAPACITY,
};
use crate::net::listener::{wait_port_free, NetError};
use crate::queue::{QueueConfig, QueueId};
use coordinator::not_leader_message;
pub(crate) use coordinator::KeyChange;
pub use coordinator::{CoordinatorHandle, QueueCreated};
use hooks::{ShardContext, ShardHooksFactory};

/// Message from the coordinator to a shard.
#[derive(Debug, Clone)]
pub enum ShardMessage {
    /// Consecutive table updates, to apply in order.
    Assignments(Arc<Vec<AssignmentUpdate>>),
    /// Send this shard's [`report::ShardReport`] here (`try_send`: the
    /// channel holds one slot per shard, so it never blocks the shard).
    Report(mpsc::SyncSender<report::ShardReport>),
    /// A reloaded auth policy: swap it in (`auth::reload`), then publish
    /// its generation as applied.
    Policy(Arc<crate::auth::reload::CurrentPolicy>),
}

/// A request to the coordinator, answered on `reply`.
#[derive(Debug)]
pub(crate) enum CoordinatorCommand {
    CreateQueue {
        queue: QueueName,
        partitions: u32,
        /// Already validated by the handle; the table checks again.
        config: Arc<QueueConfig>,
        reply: mpsc::SyncSender<Result<QueueCreated, CoordinatorError>>,
    },
    DeleteQueue {
        queue: QueueName,
        /// Delete only if the queue still has this id: a rollback must not
        /// remove a queue of the same name created since.
        expect_id: Option<QueueId>,
        reply: mpsc::SyncSender<Result<AssignmentVersion, CoordinatorError>>,
    },
    /// A change to an existing queue's key map; answered with the table
    /// version that holds it.
    KeyChange {
        change: KeyChange,
        reply: mpsc::SyncSender<Result<AssignmentVersion, CoordinatorError>>,
    },
    /// Ask every shard for its report; each answers on `reply` itself.
    Report { reply: mpsc::SyncSender<report::ShardReport> },
    /// Hand a reloaded auth policy to every shard; answered once it is in
    /// every shard's channel.
    Policy {
        update: Arc<crate::auth::reload::CurrentPolicy>,
        reply: mpsc::SyncSender<Result<(), String>>,
    },
}

/// Which executor an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorName {
    Shard(ShardId),
    Coordinator,
}

impl std::fmt::Display for ExecutorName {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecutorName::Shard(shard) => write!(formatter, "shard {}", shard.0),
            ExecutorName::Coordinator => formatter.write_str("coordinator"),
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
    #[error("cannot create executor{}: {reason}", cpu.map(|cpu| format!(" on cpu {cpu}")).unwrap_or_default())]
    Executor { cpu: Option<usize>, reason: String },
    #[error(transparent)]
    Net(NetError),
    #[error("assignment copies diverged: {0}")]
    Assignment(AssignmentError),
    #[error("flush failed: {0}")]
    Flush(String),
    #[error("shard start failed: {0}")]
    Start(String),
    /// The shard's hooks refused what the catalog's replay opened
    /// (`ShardHooks::replayed`): a configuration that does not fit the data.
    #[error("{0}")]
    Refused(String),
    #[error("catalog write failed: {0}")]
    Catalog(String),
    /// The controller group's member on the coordinator failed (an entry
    /// that does not decode, a log or vote failure, a shard table that
    /// refuses its update).
    #[error("controller failed: {0}")]
    Controller(String),
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
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Cluster(#[from] crate::control::cluster::ClusterStartError),
    #[error("{executor} failed to start: {error}")]
    Executor { executor: ExecutorName, error: ShardError },
    #[error("not up within startup_timeout_ms={timeout_ms}: {}", missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Timeout { timeout_ms: u64, missing: Vec<ExecutorName> },
}

impl StartError {
    /// The exit reason for `spoold`.
    pub fn fatal_reason(&self) -> FatalReason {
        match self {
            StartError::Config(_) | StartError::Executor { error: ShardError::Refused(_), .. } => {
                FatalReason::Config
            }
            StartError::Memlock(_) => FatalReason::Memlock,
            StartError::Cluster(_) => FatalReason::Config,
            StartError::DataDir(DataDirError::Locked { .. }) => FatalReason::DataDirLocked,
            // The data is fine; the flags (layout, shard count) do not fit it.
            StartError::DataDir(error) if error.is_config_mismatch() => FatalReason::Config,
            StartError::DataDir(_) => FatalReason::DataDir,
            // The data is fine; the flags no longer fit it.
            StartError::Catalog(CatalogError::PlacementBeyondShards { .. }) => FatalReason::Config,
            StartError::Catalog(_) => FatalReason::DataDir,
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
            RunError::Executor { error: ShardError::Flush(_) | ShardError::Catalog(_), .. } => {
                FatalReason::Storage
            }
            RunError::Executor { .. } | RunError::Unexpected { .. } => FatalReason::ShardFailed,
            RunError::ShutdownTimeout { .. } => FatalReason::ShutdownTimeout,
        }
    }
}

/// A control-path request failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    #[error(transparent)]
    Assignment(#[from] AssignmentError),
    #[error("too many coordinator commands queued ({COORDINATOR_COMMAND_QUEUE_MAX})")]
    Busy,
    #[error("the coordinator has stopped")]
    Stopped,
    #[error("not every shard applied version {} within {timeout_ms} ms", version.0)]
    Timeout { version: AssignmentVersion, timeout_ms: u64 },
    #[error("no answer from the coordinator within {timeout_ms} ms; outcome unknown")]
    NoReply { timeout_ms: u64 },
    #[error("queue ids are exhausted")]
    QueueIdsExhausted,
    #[error("the change was not made: {0}")]
    Catalog(Arc<CatalogError>),
    /// A shard could not open a partition of the new queue. The queue was
    /// deleted again (`rollback: None`), or deleting it failed too (`Some`,
    /// with the reason): then it still exists and the operator deletes it.
    #[error("queue {queue} was not created: {}; {}", failures.join("; "), match rollback {
        None => "it was removed again".to_owned(),
        Some(reason) => format!("removing it again failed ({reason}); delete it and retry"),
    })]
    CreateFailed { queue: String, failures: Vec<String>, rollback: Option<String> },
    /// Every shard that failed refused the new queue for a limit it would
    /// pass (memory for its partitions, `ShardHooks::refuses`), not for a
    /// failure: the request asked too much, and the queue was removed again.
    #[error("queue {queue} was not created: {}; it was removed again", failures.join("; "))]
    CreateRefused { queue: String, failures: Vec<String> },
    /// The resize is in the table, but a shard could not open one of the
    /// added partitions: it stays unavailable (answers as a partition that
    /// failed to open) until the broker restarts and opens it.
    #[error("queue {queue} was resized, but: {}", failures.join("; "))]
    ResizeIncomplete { queue: String, failures: Vec<String> },
    /// In a cluster: this node's member of the controller group does not
    /// lead it (or has not caught up with its own term yet). `leader`: the
    /// leader it knows of (0: none yet); `client`: that node's first client
    /// port, where the change should go.
    #[error("{}", not_leader_message(*leader, client))]
    NotLeader { leader: u64, client: Option<SocketAddr> },
    /// In a cluster: the controller group did not make the change (its
    /// entry was superseded by a new leader's, contended, or the member
    /// stopped); nothing changed unless a later read shows it did.
    #[error("the controller did not make the change: {0}")]
    Controller(String),
    #[error("this broker runs one node: partitions have no replica sets to change")]
    NotClustered,
}

/// Sends `batch` to every shard, in shard order, waiting for room in a
/// full channel.
///
/// # Errors
/// [`ShardError::ChannelClosed`] naming the first shard whose channel is
/// closed.
pub(crate) async fn broadcast(
    connected: &[shared_channel::ConnectedSender<ShardMessage>],
    batch: Arc<Vec<AssignmentUpdate>>,
) -> Result<(), ShardError> {
    for (shard, sender) in connected.iter().enumerate() {
        if sender.send(ShardMessage::Assignments(batch.clone())).await.is_err() {
            return Err(ShardError::ChannelClosed { shard: shard as u16 });
        }
    }
    Ok(())
}

/// Why a shard's hooks did not apply an update, for its creator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookFailure {
    pub(crate) reason: String,
    /// A refusal for a limit (`ShardHooks::refuses`), not a failure.
    pub(crate) refused: bool,
}

/// State the main thread, the coordinator and the shards share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) stop_requested: Arc<AtomicBool>,
    pub(crate) applied_versions: Vec<AtomicU64>,
    /// Per shard: its hooks accepted what the catalog's replay opened
    /// (`ShardHooks::replayed`); the start waits for every one.
    pub(crate) replay_accepted: Vec<AtomicBool>,
    /// the coordinator's table as of the last durable catalog write;
    /// replaced (never mutated) after each write.
    pub(crate) committed: RwLock<Arc<AssignmentTable>>,
    /// Why a shard's hooks failed to apply a live update, by table version,
    /// for the creator waiting on that version. Written before the shard
    /// publishes the version as applied. Bounded by
    /// [`HOOK_FAILURE_VERSIONS_MAX`].
    pub(crate) hook_failures: Mutex<BTreeMap<u64, Vec<HookFailure>>>,
    /// The auth policy in force, each shard's applied generation and the
    /// reload counts (`auth::reload`); off the data path.
    pub(crate) auth: crate::auth::reload::AuthState,
    /// The data directory (for the admin port's disk figures).
    pub(crate) data_dir: std::path::PathBuf,
    /// What the controller's member last published of the nodes' health
    /// (`control/cluster/health.rs`); none on a single node.
    pub(crate) health: RwLock<crate::control::cluster::ClusterView>,
}

impl Shared {
    fn all_applied(&self, version: AssignmentVersion) -> bool {
        self.applied_versions.iter().all(|applied| applied.load(Ordering::Acquire) >= version.0)
    }

    /// Notes that a shard's hooks failed to apply `version`. Call before
    /// storing the version in `applied_versions`, so a waiter that sees it
    /// applied also sees the failure.
    pub(crate) fn record_hook_failure(&self, version: AssignmentVersion, failure: HookFailure) {
        let mut failures = self.hook_failures.lock().unwrap_or_else(PoisonError::into_inner);
        let reasons = failures.entry(version.0).or_default();
        if reasons.len() < HOOK_FAILURES_PER_VERSION_MAX {
            reasons.push(failure);
        }
        while failures.len() > HOOK_FAILURE_VERSIONS_MAX {
            failures.pop_first();
        }
    }

    /// Takes the hook failures recorded for `version` (empty if none).
    fn take_hook_failures(&self, version: AssignmentVersion) -> Vec<HookFailure> {
        let mut failures = self.hook_failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.remove(&version.0).unwrap_or_default()
    }
}

/// Refuses a data directory written in the other mode: a single node's
/// queues (a catalog without the controller's log) under a `[cluster]`
/// table, whose catalog the controller's log would not hold; or a cluster
/// member's directory (it has the controller's log) without its table,
/// whose partitions are Raft logs a single node must not serve.
fn check_cluster_data_dir(
    dir: &std::path::Path,
    cluster: bool,
    queues: usize,
) -> Result<(), StartError> {
    let member = dir.join(controller_run::CONTROLLER_DIR_NAME).is_dir();
    let refused = |reason: String| StartError::Executor {
        executor: ExecutorName::Coordinator,
        error: ShardError::Refused(reason),
    };
    if cluster && !member && queues > 0 {
        return Err(refused(format!(
            "{} holds a single node's {queues} queue(s): a cluster member starts from an empty \
             data directory (its queues come from the controller)",
            dir.display()
        )));
    }
    if !cluster && member {
        return Err(refused(format!(
            "{} belongs to a cluster member (it holds the controller's log): start it with its \
             [cluster] table",
            dir.display()
        )));
    }
    Ok(())
}

/// A running broker: the executors, the data-dir lock, the control handle.
/// Dropping it without [`wait`](Self::wait) leaves the executors running
/// until the process exits.
#[derive(Debug)]
pub struct Broker {
    config: Arc<BrokerConfig>,
    shared: Arc<Shared>,
    coordinator: CoordinatorHandle,
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
        ExecutorName::Coordinator => "spool-coord".to_owned(),
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
        // One executor per shard plus the coordinator.
        memlock::ensure(usize::from(shard_count) + 1)?;
        let lock = DataDirLock::acquire(&config.data_dir)?;
        // Before the secret: a directory without one is new and records
        // the journal layout and this shard count; an existing one must be
        // of the journal layout and have the same shard count.
        DataDirFormat::load_or_create(&lock, shard_count)?;
        // File descriptors do not grow with partitions (one journal per
        // shard), but connections and side-file opens do: take what the
        // hard limit allows, and say so.
        nofile::raise_to_hard();
        let mut secret = BrokerSecret::load_or_create(&lock)?;
        let cluster = match &config.cluster {
            Some(table) => {
                let node = crate::control::cluster::ClusterNode::load(table, shard_count)?;
                // Tokens verify on every replica: the cluster's key.
                secret = node.secret().clone();
                if node.tls().is_none() {
                    tracing::warn!(
                        "cluster peer links are plain TCP (no cluster.peer_tls_*): keep the \
                         peer ports on a private network"
                    );
                }
                Some(Arc::new(node))
            }
            None => None,
        };
        // Read before anything starts, so a bad catalog is a start error.
        let catalog = catalog::load(lock.dir())?.unwrap_or_else(|| Catalog::empty(shard_count));
        check_cluster_data_dir(lock.dir(), cluster.is_some(), catalog.queues.len())?;
        let catalog_path = lock.dir().join(catalog::CATALOG_FILE_NAME);
        let replay = catalog.replay(shard_count, &catalog_path)?;
        let replay_version = replay.table.version();
        let recovered = Arc::new(replay.table.clone());
        // A SIGKILLed predecessor's sockets outlive it by milliseconds.
        let patience = Duration::from_millis(crate::limits::PORT_IN_USE_RETRY_MS);
        for shard in 0..shard_count {
            wait_port_free(config.shard_listen(shard), patience)?;
        }
        let config = Arc::new(config);
        let stop_requested = Arc::new(AtomicBool::new(false));
        let start_version = replay.start.version().0;
        let shared = Arc::new(Shared {
            stop_requested,
            applied_versions: (0..shard_count).map(|_| AtomicU64::new(start_version)).collect(),
            replay_accepted: (0..shard_count).map(|_| AtomicBool::new(false)).collect(),
            committed: RwLock::new(Arc::new(replay.table.clone())),
            hook_failures: Mutex::new(BTreeMap::new()),
            auth: crate::auth::reload::AuthState::new(
                config.auth_file.clone(),
                config.auth.clone(),
                usize::from(shard_count),
            ),
            data_dir: config.data_dir.clone(),
            health: RwLock::default(),
        });
        let (events_sender, events) = mpsc::channel();
        let (commands_sender, commands) = mpsc::sync_channel(COORDINATOR_COMMAND_QUEUE_MAX);
        let coordinator = CoordinatorHandle { commands: commands_sender, shared: shared.clone() };
        let factory = Arc::new(factory);
        let tick = config.housekeeping_tick();

        // Channel pairs are created here, on the main thread, and each end is
        // connected on its executor (ARCHITECTURE.md, "Platform notes": no channel_mesh).
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
                coordinator: coordinator.clone(),
                assignment_start: replay.start.clone(),
                recovered: recovered.clone(),
                cluster: cluster.clone(),
            };
            // Registered (fixed) buffers make O_DIRECT reads fail with
            // EOPNOTSUPP on some kernels (see io/dma.rs): do without them.
            let mut builder = LocalExecutorBuilder::new(Placement::Fixed(cpu))
                .name(&format!("spool-shard-{shard}"))
                .io_memory(0);
            if config.spin_before_park_us > 0 {
                builder = builder.spin_before_park(config.spin_before_park());
            }
            let factory = factory.clone();
            let shared = shared.clone();
            let start_table = context.assignment_start.clone();
            let name = ExecutorName::Shard(ShardId(shard));
            let spawned =
                spawn_executor(name, builder, Some(cpu), events_sender.clone(), move |events| {
                    Box::pin(executor::shard_main(
                        context,
                        factory,
                        receiver,
                        start_table,
                        replay_version,
                        shared,
                        events,
                    ))
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
            let start = executor::ControlStart {
                table: replay.table,
                replay: replay.updates,
                next_queue_id: replay.next_queue_id,
                data_dir: lock.dir().to_owned(),
                partitions_max: config.partitions_max as usize,
                cluster: cluster.clone(),
            };
            let mut builder = LocalExecutorBuilder::new(Placement::Unbound).name("spool-coord");
            if cluster.is_some() {
                // The controller's journal is O_DIRECT: as the shards, no
                // registered buffers (see io/dma.rs).
                builder = builder.io_memory(0);
            }
            let spawned = spawn_executor(
                ExecutorName::Coordinator,
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
                        start,
                    ))
                },
            );
            match spawned {
                Ok(handle) => threads.push((ExecutorName::Coordinator, handle)),
                Err(error) => broker_threads_failed = Some((ExecutorName::Coordinator, error)),
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

        // Wait until every executor is up and (so a restart never briefly
        // answers "no such queue") every shard has applied the catalog's
        // replay; one deadline covers both.
        let mut waiting: Vec<ExecutorName> = threads.iter().map(|(name, _)| *name).collect();
        loop {
            if waiting.is_empty()
                && shared.all_applied(replay_version)
                && shared.replay_accepted.iter().all(|accepted| accepted.load(Ordering::Acquire))
            {
                break;
            }
            let event = match events.recv_timeout(COORDINATOR_POLL_INTERVAL) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                // We hold a sender, so this cannot happen; treat as timeout.
                Err(mpsc::RecvTimeoutError::Disconnected) => Event::StartupDeadline,
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
                    let behind = (0..shard_count)
                        .map(|shard| ExecutorName::Shard(ShardId(shard)))
                        .filter(|name| !waiting.contains(name))
                        .filter(|name| match name {
                            ExecutorName::Shard(shard) => {
                                coordinator.applied_version(*shard) < replay_version
                            }
                            ExecutorName::Coordinator => false,
                        })
                        .collect::<Vec<_>>();
                    waiting.extend(behind);
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
            queues = catalog.queues.len(),
            assignment_version = replay_version.0,
            listen = %config.listen,
            data_dir = %lock.dir().display(),
            "spoold started"
        );
        Ok(Broker {
            config,
            shared,
            coordinator,
            events,
            events_sender,
            threads,
            secret,
            _lock: lock,
        })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn coordinator(&self) -> CoordinatorHandle {
        self.coordinator.clone()
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
