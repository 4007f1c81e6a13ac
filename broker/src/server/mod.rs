//! What a shard serves: the partitions it owns and the Spool protocol on its
//! port.
//!
//! [`SpoolHooksFactory`] builds, on each shard's thread, a [`SpoolHooks`]
//! that opens the partitions the assignment table gives this shard (and
//! closes and removes the ones of a deleted queue), runs their timers from
//! the housekeeping tick, and answers requests ([`handler::SpoolHandler`]).
//! A data request for a partition this shard does not own is answered with
//! `NOT_OWNER` and the owner's address; it is never forwarded, so nothing on
//! the request path crosses cores.
//!
//! Leader epochs for `Metadata`: each shard publishes the epoch of every
//! partition it opens on an [`EpochBoard`] shared by all shards (a lock-free
//! read path is not needed: it is read only by Metadata and written only
//! when a partition opens or is deleted), so any shard answers Metadata with
//! every partition's real epoch. This is the one piece of state shards share,
//! and it is off the data path.
//!
//! Partition directories: `DATA_DIR/partitions/q{queue_id:010}/p{partition:05}`.
//! Queue ids are never reused, so a queue created again under a deleted
//! queue's name never sees the old files.
//!
//! The log: each shard owns one
//! [`ShardJournal`] in `DATA_DIR/shard-{shard:02}/` (`journal/` files and the
//! `handles` table; see [`journal_shard_dir`]), recovered by
//! [`SpoolHooks::start`] before any partition opens, from the least
//! checkpoint scan start over the partitions the catalog gives the shard;
//! each partition then opens with its routed entries
//! ([`Partition::open_journal`]; its directory keeps the checkpoint side
//! files), its handle and its new leader epoch made durable in the table
//! first (a partition created at run time gets a new handle before its
//! first append). The partitions of one queue on this shard do that
//! together ([`ShardState::open_journal_epochs`]): their directories
//! created with one sync of each parent, one table write for all their
//! handles and epochs, so a wide create or a restart costs a few syncs per
//! shard rather than several per partition.
//! A deleted queue's partitions close and their directories go; their
//! handles stay in the table and their entries in the journal files until
//! those files are released.
//!
//! Journal release: every [`JOURNAL_RELEASE_INTERVAL_MS`] the housekeeping
//! tick takes the least journal position the shard's open partitions need
//! ([`Partition::journal_pin`]: a checkpoint's scan start, or the oldest
//! data entry a live record is read from) and removes every journal file
//! wholly below it ([`Journal::release_below`]). Once the shard holds more
//! than `journal_retain_bytes` of journal files, a partition whose checkpoint would move its pin to a later file
//! (an idle one) is asked for a checkpoint, and the oldest file's live
//! entries may be relocated; below the budget neither happens, so a shard
//! of thousands of thinly written partitions pays their checkpoints once
//! per budget written, not once per file. Nothing is released while a partition the table gives the
//! shard is not open (its recovery may need any file), nor while a
//! partition without a checkpoint is open (it pins position 0).
//!
//! [`JOURNAL_RELEASE_INTERVAL_MS`]: crate::limits::JOURNAL_RELEASE_INTERVAL_MS
//! [`Journal::release_below`]: crate::log::journal::Journal::release_below

pub mod auth;
mod claim;
pub mod cluster;
pub mod convert;
pub mod counters;
mod describe;
mod frame;
mod frame_handler;
pub mod handler;
mod inspect;
mod journal;
mod keys;
mod limits;
mod open;
mod replace;
use journal::CommitTimer;
pub use journal::ShardJournalRun;
pub mod quota;
pub mod ready;
mod served;
mod session_ops;
pub mod sessions;
mod snapshot;
mod sub_admin;
mod subscriptions;
pub mod tick;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use glommio::task::JoinHandle;
use thiserror::Error;

use crate::control::assignment::{
    AssignmentChange, AssignmentTable, AssignmentUpdate, QueueName, ShardId,
};
use crate::control::config::BrokerConfig;
use crate::io::DmaStorage;
use crate::log::journal::{JournalConfig, JournalError, JournalPos, PartitionHandle, ShardJournal};
use crate::log::{ExitOnFatal, LogConfig};
use crate::partition::memory::StateMemory;
use crate::partition::{
    replay_journal_shard, Clock, JournalOpen, Partition, PartitionError, PartitionName,
    ShardReplayTarget,
};
use crate::queue::{LeaderEpoch, PartitionId, QueueId};
use crate::shard::alarm::Alarm;
use crate::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use crate::shard::report::{
    JournalReport, LogTotals, PartitionReport, RefusedPartition, ReplicaRole, ShardReport,
};
use crate::shard::CoordinatorHandle;
use counters::RequestCounters;
use handler::SpoolHandler;
use served::ServedMap;
use tick::{TickPlan, TickSlot, Visited};

/// The partition type a shard serves.
pub type ShardPartition = Partition<DmaStorage>;

/// Why an assignment change or a flush failed on a shard.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("partition {queue}/{partition}: {error}")]
    Partition { queue: String, partition: PartitionId, error: PartitionError },
    #[error("removing {}: {error}", path.display())]
    Remove { path: PathBuf, error: std::io::Error },
    /// The shard journal did not open (damage names file and byte).
    #[error("shard journal {}: {error}", dir.display())]
    Journal { dir: PathBuf, error: JournalError },
    /// A new queue's partitions do not fit the shard's memory for queue
    /// state (`partition/memory.rs`): the create is refused, nothing opened.
    #[error("queue {queue}: {partitions} partitions on this shard need {needed} B of memory for \
             queue state ({} B each before any message), {} B of its {} B are charged; raise \
             memory_bytes, use fewer partitions or delete a queue",
             crate::limits::PARTITION_MEMORY_BYTES_FIXED, full.used_bytes, full.size_bytes,
             needed = full.needed_bytes)]
    Memory { queue: String, partitions: usize, full: crate::partition::memory::StateMemoryFull },
    /// What the shard opened at start is charged more than its state share:
    /// the budget is below what its open queues need.
    #[error("memory_bytes={memory_bytes} is below what the open queues need: shard {shard}'s \
             queue state is charged {charged} B, over its {share} B share (the most: {}); raise \
             memory_bytes", queues.iter().map(|(queue, bytes)| format!("{queue} {bytes} B"))
             .collect::<Vec<_>>().join(", "))]
    MemoryAtStart {
        memory_bytes: u64,
        shard: u16,
        charged: u64,
        share: u64,
        queues: Vec<(String, u64)>,
    },
    /// The shard's replication did not start (vote log, peer port).
    #[error("replication: {0}")]
    Cluster(String),
    /// The shard's peer port is taken by another process.
    #[error("replication: peer port {addr} is in use")]
    PeerPortInUse { addr: std::net::SocketAddr },
    /// More than one partition of one change failed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<ServerError>),
}

/// Path of one partition's directory.
pub fn partition_dir(data_dir: &Path, queue_id: QueueId, partition: PartitionId) -> PathBuf {
    data_dir
        .join("partitions")
        .join(format!("q{:010}", queue_id.0))
        .join(format!("p{:05}", partition.0))
}

/// The directory of shard `shard`'s journal and handles table:
/// `DATA_DIR/shard-{shard:02}`.
pub fn journal_shard_dir(data_dir: &Path, shard: ShardId) -> PathBuf {
    data_dir.join(format!("shard-{:02}", shard.0))
}

/// The leader epoch of every partition open on any shard, keyed by queue id
/// (never reused) and partition. Holds one entry per open partition, so it is
/// bounded by the assignment table (queues × `PARTITIONS_MAX`).
#[derive(Debug, Default)]
pub struct EpochBoard {
    epochs: RwLock<BTreeMap<(QueueId, PartitionId), LeaderEpoch>>,
}

impl EpochBoard {
    /// Publishes the epoch a partition was opened with.
    pub fn publish(&self, queue_id: QueueId, partition: PartitionId, epoch: LeaderEpoch) {
        self.write().insert((queue_id, partition), epoch);
    }

    /// Forgets a partition that was closed for good (queue deleted).
    pub fn forget(&self, queue_id: QueueId, partition: PartitionId) {
        self.write().remove(&(queue_id, partition));
    }

    /// The epoch of an open partition, if some shard has it open.
    pub fn epoch(&self, queue_id: QueueId, partition: PartitionId) -> Option<LeaderEpoch> {
        // A panic while holding the lock cannot leave the map half-updated
        // (each operation is one insert or remove), so poisoning is ignored.
        self.epochs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(queue_id, partition))
            .copied()
    }

    fn write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<(QueueId, PartitionId), LeaderEpoch>> {
        self.epochs.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One partition this shard serves, its log's background task and the
/// handler's request counters for it.
pub struct Served {
    pub partition: Rc<ShardPartition>,
    pub requests: RequestCounters,
    background: RefCell<Option<JoinHandle<()>>>,
    /// Its place in the shard's [`TickPlan`].
    tick: TickSlot,
}

impl Visited for Served {
    fn tick_slot(&self) -> &TickSlot {
        &self.tick
    }
}

/// A partition open to try again (see [`ShardState::open_retries`]).
#[derive(Debug, Clone)]
struct OpenRetry {
    queue: QueueName,
    queue_id: QueueId,
    config: crate::queue::QueueConfig,
    at_ms: u64,
}

/// The shard journal's witness delay: a glommio timer of `WITNESS_DELAY_MS`
/// (`Journal::set_witness_delay`).
fn witness_delay() -> crate::log::WitnessDelay {
    timer_of(crate::limits::WITNESS_DELAY_MS)
}

/// The shard journal's commit delay: a glommio timer of `COMMIT_DELAY_MS`
/// (`Journal::set_commit_delay`).
fn commit_delay() -> crate::log::WitnessDelay {
    timer_of(crate::limits::COMMIT_DELAY_MS)
}

fn timer_of(ms: u64) -> crate::log::WitnessDelay {
    Rc::new(move || {
        Box::pin(async move {
            glommio::timer::Timer::new(Duration::from_millis(ms)).await;
        })
    })
}

impl std::ops::Deref for Served {
    type Target = ShardPartition;
    fn deref(&self) -> &ShardPartition {
        &self.partition
    }
}

/// State of one shard, shared by its hooks and its frame handler.
pub struct ShardState {
    pub shard: ShardId,
    pub config: Arc<BrokerConfig>,
    pub coordinator: CoordinatorHandle,
    pub secret: [u8; 32],
    pub log_config: LogConfig,
    /// This shard's copy of the assignment table.
    pub table: RefCell<AssignmentTable>,
    /// Partitions this shard owns, by queue name and partition.
    pub partitions: RefCell<ServedMap>,
    /// Partitions this shard owns that failed to open, with the reason
    /// (corruption names file and byte). Requests for them are answered
    /// `STORAGE_FAILED` with that reason until an operator repairs the
    /// files and restarts the broker.
    pub unavailable: RefCell<BTreeMap<(String, PartitionId), String>>,
    /// Partitions that failed to open for lack of disk space: opened again
    /// by the housekeeping tick every [`PARTITION_OPEN_RETRY_MS`] until they
    /// open (space came back) or their queue is deleted.
    ///
    /// [`PARTITION_OPEN_RETRY_MS`]: crate::limits::PARTITION_OPEN_RETRY_MS
    open_retries: RefCell<BTreeMap<(String, PartitionId), OpenRetry>>,
    pub clock: Clock,
    /// Every shard's partition epochs, for Metadata.
    pub epochs: Arc<EpochBoard>,
    /// Rung by a partition whose new deadline is earlier than the
    /// housekeeping timer's planned tick.
    pub alarm: Rc<Alarm>,
    /// The table after the catalog's replay (what `start` recovers for).
    recovered: Arc<AssignmentTable>,
    /// The shard's journal, once `start` opened it.
    pub journal: RefCell<Option<Rc<ShardJournalRun>>>,
    /// Which partitions the housekeeping tick visits (`tick.rs`).
    pub tick_plan: Rc<TickPlan<Served>>,
    /// The shard's memory for queue state: its state share less the
    /// journal's two caches (`partition/memory.rs`).
    pub state_memory: Rc<StateMemory>,
    /// The shard's replication, when the node is in a cluster
    /// (`cluster.rs`): its partitions are then Raft members.
    pub cluster: Option<Rc<cluster::ShardCluster>>,
    /// Snapshot transfers served and installs running (`snapshot.rs`).
    snapshots: snapshot::Snapshots,
    /// Older partitions draining for a resize (`keys.rs`).
    drains: keys::Drains,
    replacing: replace::Replacing,
    /// Partitions bringing their subscriptions in step (`subscriptions.rs`).
    subscribing: subscriptions::Subscribing,
}

impl std::fmt::Debug for ShardState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ShardState")
            .field("shard", &self.shard)
            .field("partitions", &self.partitions.borrow().len())
            .finish_non_exhaustive()
    }
}

impl ShardState {
    /// The address clients use for `shard`.
    pub fn shard_addr(&self, shard: ShardId) -> SocketAddr {
        self.config.shard_listen(shard.0)
    }

    /// The partition `queue`/`partition` if this shard serves it.
    pub fn partition(&self, queue: &str, partition: PartitionId) -> Option<Rc<ShardPartition>> {
        self.served(queue, partition).map(|served| served.partition.clone())
    }

    /// The served partition `queue`/`partition` (with its counters).
    pub fn served(&self, queue: &str, partition: PartitionId) -> Option<Rc<Served>> {
        self.partitions.borrow().get(queue, partition).cloned()
    }

    /// The partition with this queue id and partition, if served here.
    pub fn partition_by_id(
        &self,
        queue_id: QueueId,
        partition: PartitionId,
    ) -> Option<Rc<ShardPartition>> {
        self.served_by_id(queue_id, partition).map(|served| served.partition.clone())
    }

    /// The served partition with this queue id and partition.
    pub fn served_by_id(&self, queue_id: QueueId, partition: PartitionId) -> Option<Rc<Served>> {
        let table = self.table.borrow();
        let (name, _) = table.queue_by_id(queue_id)?;
        self.served(name.as_str(), partition)
    }

    /// Adds this shard's partitions, refusals and log figures to `report`.
    fn report(&self, report: &mut ShardReport) {
        let mut log = LogTotals::default();
        let now = (self.clock)();
        for (queue, partition, served) in self.partitions.borrow().iter() {
            let counters = served.partition.counters();
            let ack_rate_per_sec = served.requests.sample_acks(now, counters.totals.acked);
            report.partitions.push(PartitionReport {
                queue: queue.to_owned(),
                partition,
                counters,
                requests: served.requests.snapshot(),
                ack_rate_per_sec,
                memory_bytes: served.partition.memory_charged(),
                replica: served.partition.log().driver().map(|driver| {
                    let (_, term, leader) = driver.role();
                    ReplicaRole {
                        term,
                        leader,
                        serving: served.partition.serving(),
                        last: driver.log().last_index(),
                        committed: driver.log().committed_index(),
                        applied: served.partition.applied_index(),
                        group_floor: driver.group_floor(),
                        first_index: driver.log_floor() + 1,
                    }
                }),
                resize: self.resize_state(queue, partition),
                subscriptions: self
                    .subscription_report(queue, served.partition.subscription_counters()),
                window: served.partition.has_window(),
                losses: served.partition.losses_of(crate::queue::SubscriptionId::DEFAULT),
                ordered: served.partition.ordered(),
                oldest_waiting_age_ms: counters
                    .lanes
                    .oldest_waiting
                    .map(|(_, since)| now.saturating_sub(since)),
            });
        }
        if let Some(journal) = &*self.journal.borrow() {
            let stats = journal.shard.journal().stats();
            log.commits += stats.commits;
            log.commit_bytes += stats.commit_bytes;
            report.journal = Some(self.journal_report(journal));
        }
        report.log = log;
        report.refused = self
            .unavailable
            .borrow()
            .iter()
            .map(|((queue, partition), reason)| RefusedPartition {
                queue: queue.clone(),
                partition: *partition,
                reason: reason.clone(),
            })
            .collect();
    }

    /// Claims long-polling on this shard now: on one partition, or on a
    /// queue's ready ring (partition `ANY`).
    fn claims_waiting(&self) -> u64 {
        let partitions = self.partitions.borrow();
        let on_partitions: usize =
            partitions.values().map(|served| served.partition.claims_waiting()).sum();
        let on_rings: usize = partitions.rings().map(|rings| rings.claims_waiting()).sum();
        u64::try_from(on_partitions + on_rings).unwrap_or(u64::MAX)
    }

    /// Partitions of this shard whose open is retried (refused for lack of
    /// disk space): their records are not in any stored figure yet.
    pub fn partitions_waiting_to_open(&self) -> usize {
        self.open_retries.borrow().len()
    }
}

/// A deleted queue's partitions are closed and removed in steps of this
/// many, the shard serving its other partitions between steps.
const DELETE_YIELD_PARTITIONS: usize = 64;

/// A partition's background future, whichever its log.
type BackgroundTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Builds [`SpoolHooks`] on each shard. Partitions use the broker config's
/// log settings ([`BrokerConfig::log_config`]). Every shard it builds shares
/// one [`EpochBoard`].
#[derive(Debug, Clone, Default)]
pub struct SpoolHooksFactory {
    epochs: Arc<EpochBoard>,
}

impl ShardHooksFactory for SpoolHooksFactory {
    type Hooks = SpoolHooks;

    fn make(&self, context: &ShardContext) -> SpoolHooks {
        let state = Rc::new(ShardState {
            shard: context.shard,
            config: context.config.clone(),
            coordinator: context.coordinator.clone(),
            secret: *context.secret.as_bytes(),
            log_config: context.config.log_config(),
            table: RefCell::new(context.assignment_start.clone()),
            partitions: RefCell::new(ServedMap::default()),
            unavailable: RefCell::new(BTreeMap::new()),
            open_retries: RefCell::new(BTreeMap::new()),
            clock: Rc::new(crate::clock::now_ms),
            epochs: self.epochs.clone(),
            alarm: Rc::new(Alarm::default()),
            recovered: context.recovered.clone(),
            journal: RefCell::new(None),
            tick_plan: Rc::new(TickPlan::new(crate::limits::HOUSEKEEPING_FULL_SWEEP_MS)),
            state_memory: StateMemory::new(context.shard.0, context.config.queue_state_bytes()),
            cluster: context
                .cluster
                .as_ref()
                .map(|node| cluster::ShardCluster::new(node.clone(), context.shard)),
            snapshots: snapshot::Snapshots::default(),
            drains: keys::Drains::default(),
            replacing: replace::Replacing::default(),
            subscribing: subscriptions::Subscribing::default(),
        });
        let handler = Rc::new(SpoolHandler::new(state.clone()));
        SpoolHooks { state, handler }
    }
}

/// The hooks of one shard.
#[derive(Debug)]
pub struct SpoolHooks {
    state: Rc<ShardState>,
    handler: Rc<SpoolHandler>,
}

impl SpoolHooks {
    /// Opens again each partition whose open failed for lack of space and
    /// whose retry is due (a failure schedules the next one).
    fn retry_opens(&self) {
        let now = (self.state.clock)();
        let due: Vec<((String, PartitionId), OpenRetry)> = {
            let mut retries = self.state.open_retries.borrow_mut();
            let keys: Vec<(String, PartitionId)> = retries
                .iter()
                .filter(|(_, retry)| retry.at_ms <= now)
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter().filter_map(|key| retries.remove(&key).map(|r| (key, r))).collect()
        };
        for ((name, partition), retry) in due {
            let state = self.state.clone();
            glommio::spawn_local(async move {
                // Deleted (or deleted and created again) meanwhile: not ours.
                let current = state.table.borrow().queue(&retry.queue).map(|entry| entry.id);
                if current != Some(retry.queue_id) || state.partition(&name, partition).is_some() {
                    return;
                }
                // A failure is logged by the open (and retried again if it
                // lacked space).
                let opened = state
                    .open_partition(&retry.queue, retry.queue_id, partition, &retry.config, None)
                    .await;
                if opened.is_ok() {
                    tracing::info!(queue = %name, partition = partition.0,
                        "partition opened after disk space returned");
                }
            })
            .detach();
        }
    }
}

impl ShardHooks for SpoolHooks {
    type Handler = SpoolHandler;
    type Error = ServerError;

    async fn start(&self) -> Result<(), ServerError> {
        self.state.open_journal().await?;
        if let Some(cluster) = &self.state.cluster {
            cluster
                .start(&journal_shard_dir(&self.state.config.data_dir, self.state.shard))
                .await?;
            let state = Rc::downgrade(&self.state);
            cluster.host.set_snapshot_hook(Rc::new(move |group, message| {
                if let Some(state) = state.upgrade() {
                    snapshot::on_message(&state, group, message);
                }
            }));
        }
        Ok(())
    }

    fn replayed(&self) -> Result<(), ServerError> {
        self.state.check_state_memory()
    }

    fn refuses(error: &ServerError) -> bool {
        matches!(error, ServerError::Memory { .. })
    }

    fn port_in_use(error: &ServerError) -> Option<std::net::SocketAddr> {
        match error {
            ServerError::PeerPortInUse { addr } => Some(*addr),
            _ => None,
        }
    }

    fn frame_handler(&self) -> Rc<SpoolHandler> {
        self.handler.clone()
    }

    fn on_policy(&self, update: &crate::auth::reload::CurrentPolicy) {
        self.handler.replace_policy(update);
    }

    async fn on_assignment(
        &self,
        update: &AssignmentUpdate,
        table: &AssignmentTable,
    ) -> Result<(), ServerError> {
        let state = &self.state;
        // The id of a queue this update deletes, from the table before it.
        let deleted_id = match &update.change {
            AssignmentChange::DeleteQueue { queue } => {
                state.table.borrow().queue(queue).map(|entry| entry.id)
            }
            AssignmentChange::CreateQueue { .. }
            | AssignmentChange::GrowQueue { .. }
            | AssignmentChange::KeysDrained { .. }
            | AssignmentChange::SetReplicas { .. }
            | AssignmentChange::ReplicasSettled { .. }
            | AssignmentChange::Subscribe { .. }
            | AssignmentChange::Unsubscribe { .. }
            | AssignmentChange::Reseek { .. } => None,
        };
        *state.table.borrow_mut() = table.clone();
        let result = match &update.change {
            AssignmentChange::CreateQueue { queue, queue_id, shards, config, .. } => {
                // In a cluster, only the partitions this node is a replica of.
                let owned = state.owned_partitions(*queue_id, shards, 0);
                let live = update.version > state.recovered.version();
                if !live {
                    state.remove_stale_copies(queue);
                }
                state.open_owned(queue, *queue_id, config, &owned, live).await
            }
            AssignmentChange::GrowQueue { queue, shards } => {
                // The older partitions refuse moved keys from here on.
                state.set_key_routes(queue);
                let Some((queue_id, config, count)) = table
                    .queue(queue)
                    .map(|entry| (entry.id, entry.config.clone(), entry.partitions.len()))
                else {
                    return Ok(());
                };
                let from = u32::try_from(count - shards.len()).unwrap_or(u32::MAX);
                let owned = state.owned_partitions(queue_id, shards, from);
                let live = update.version > state.recovered.version();
                state.open_owned(queue, queue_id, &config, &owned, live).await
            }
            AssignmentChange::KeysDrained { queue, .. } => {
                // The hold ends once the last older partition drained.
                state.set_key_routes(queue);
                Ok(())
            }
            // Each partition's leader starts or ends it in its log: the
            // subscription watch (`subscriptions.rs`) sees the table differ.
            AssignmentChange::Subscribe { queue, .. }
            | AssignmentChange::Unsubscribe { queue, .. }
            | AssignmentChange::Reseek { queue, .. } => {
                state.subscriptions_changed(queue);
                Ok(())
            }
            AssignmentChange::SetReplicas { queue, partition, .. }
            | AssignmentChange::ReplicasSettled { queue, partition, .. } => {
                let live = update.version > state.recovered.version();
                state.replicas_changed(queue, *partition, live).await
            }
            AssignmentChange::DeleteQueue { queue } => {
                let doomed: Vec<((String, PartitionId), Rc<Served>)> =
                    state.partitions.borrow_mut().remove_queue(queue.as_str());
                // Partitions that never opened (a create rolled back after a
                // failed open, or damage found at start): forget them, and
                // remove what the failed open left behind. Only a directory
                // is removed; whatever stood in its way is not ours.
                let failed: Vec<PartitionId> = {
                    let mut unavailable = state.unavailable.borrow_mut();
                    let failed = unavailable
                        .keys()
                        .filter(|(name, _)| name == queue.as_str())
                        .map(|(_, partition)| *partition)
                        .collect();
                    unavailable.retain(|(name, _), _| name != queue.as_str());
                    state.open_retries.borrow_mut().retain(|(name, _), _| name != queue.as_str());
                    failed
                };
                if let Some(queue_id) = deleted_id {
                    for partition in failed {
                        state.epochs.forget(queue_id, partition);
                        let dir = partition_dir(&state.config.data_dir, queue_id, partition);
                        if dir.is_dir() {
                            if let Err(error) = std::fs::remove_dir_all(&dir) {
                                tracing::warn!(queue = %queue, partition = partition.0, %error,
                                    "could not remove the directory of a partition that never opened");
                            }
                        }
                    }
                }
                // Each removal is durable once its parent (the queue's
                // directory) is synced: once for all of them, after the
                // last. A crash before that may leave directories of the
                // deleted queue behind, unused (its id is never reused),
                // as a crash before the removal always could.
                let mut parents = BTreeSet::new();
                let count = doomed.len();
                for (index, ((name, partition), served)) in doomed.into_iter().enumerate() {
                    state.epochs.forget(served.partition.name().queue_id, partition);
                    if let Some(cluster) = &state.cluster {
                        cluster.forget(served.partition.name().queue_id, partition);
                    }
                    let dir = served.partition.dir().to_path_buf();
                    // No final checkpoint: the directory goes next.
                    ShardState::discard_served(&served).await;
                    state.tick_plan.forget(&served);
                    // Off the data path and rare: a blocking remove is acceptable here.
                    std::fs::remove_dir_all(&dir)
                        .map_err(|error| ServerError::Remove { path: dir.clone(), error })?;
                    if let Some(parent) = dir.parent() {
                        parents.insert(parent.to_path_buf());
                    }
                    if index % DELETE_YIELD_PARTITIONS == DELETE_YIELD_PARTITIONS - 1 {
                        // A wide queue's delete lets the shard serve between steps.
                        futures_lite::future::yield_now().await;
                    }
                    tracing::debug!(queue = %name, partition = partition.0, "partition deleted");
                }
                for parent in parents {
                    std::fs::File::open(&parent)
                        .and_then(|parent| parent.sync_all())
                        .map_err(|error| ServerError::Remove { path: parent.clone(), error })?;
                }
                if count > 0 {
                    tracing::info!(queue = %queue, partitions = count, shard = state.shard.0,
                        "partitions of a deleted queue removed");
                }
                Ok(())
            }
        };
        state.drop_unopened_replays(update.version);
        result
    }

    fn next_tick_in(&self, min: Duration, max: Duration) -> Duration {
        let now = (self.state.clock)();
        let due = self.state.tick_plan.next_round_at();
        let wait = Duration::from_millis(due.saturating_sub(now)).clamp(min, max);
        self.state
            .alarm
            .plan(now.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)));
        wait
    }

    fn alarm(&self) -> Option<Rc<Alarm>> {
        Some(self.state.alarm.clone())
    }

    fn report(&self, report: &mut ShardReport) {
        self.state.report(report);
        report.tick_visits = self.state.tick_plan.visits();
        let state_memory = self.state.state_memory.stats();
        report.memory[2] = (
            crate::net::memory::STATE_POOL,
            crate::net::memory::PoolStats {
                size_bytes: state_memory.size_bytes,
                used_bytes: state_memory.used_bytes,
                peak_bytes: state_memory.peak_bytes,
                waits: 0,
                refusals: state_memory.refusals,
            },
        );
        report.claims_waiting = self.state.claims_waiting();
        report.pace = crate::net::pace::Pace::of_this_shard().stats();
        report.quotas = self.handler.quota_report();
        report.sessions = self.handler.sessions.report();
        if let Some(cluster) = &self.state.cluster {
            let mut replication = cluster.report(&self.state.partitions.borrow());
            replication.snapshots = self.state.snapshots.stats();
            report.replication = Some(replication);
            report.peers = cluster.peers();
        }
    }

    fn on_tick(&self) {
        self.retry_opens();
        snapshot::watch(&self.state);
        keys::watch(&self.state);
        replace::watch(&self.state);
        subscriptions::watch(&self.state);
        self.state.release_journal();
        self.handler.quota_tick();
        // Only the partitions touched since the last tick, those with a
        // deadline passed, and all of them once per full sweep (`tick.rs`).
        let now = (self.state.clock)();
        let plan = &self.state.tick_plan;
        let visit = plan.round(now, || self.state.partitions.borrow().values().cloned().collect());
        for entry in visit {
            entry.partition.tick();
            plan.schedule(&entry, entry.partition.next_visit(now));
            if entry.partition.checkpoint_due() {
                let partition = entry.partition.clone();
                glommio::spawn_local(async move {
                    if let Err(error) = partition.checkpoint().await {
                        tracing::warn!(partition = ?partition.name(), %error, "checkpoint failed");
                    }
                })
                .detach();
            }
        }
    }

    async fn flush(&self) -> Result<(), ServerError> {
        let served: Vec<((String, PartitionId), Rc<Served>)> =
            self.state.partitions.borrow_mut().take_all();
        let mut first_error = None;
        for ((queue, partition), entry) in served {
            if let Err(error) = ShardState::close_served(&entry).await {
                tracing::error!(%queue, partition = partition.0, %error, "partition close failed");
                first_error.get_or_insert(ServerError::Partition { queue, partition, error });
            }
        }
        if let Some(cluster) = &self.state.cluster {
            cluster.stop().await;
        }
        self.state.close_journal().await;
        first_error.map_or(Ok(()), Err)
    }
}
