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
pub mod convert;
pub mod counters;
pub mod handler;
mod journal;
use journal::CommitTimer;
pub use journal::ShardJournalRun;
pub mod quota;
pub mod ready;
mod served;
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
use crate::partition::{
    replay_journal_shard, Clock, JournalOpen, Partition, PartitionError, PartitionName,
    ShardReplayTarget,
};
use crate::queue::{LeaderEpoch, PartitionId, QueueId};
use crate::shard::alarm::Alarm;
use crate::shard::hooks::{ShardContext, ShardHooks, ShardHooksFactory};
use crate::shard::report::{
    JournalReport, LogTotals, PartitionReport, RefusedPartition, ShardReport,
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

/// Whether a partition failed to open because the disk is full (ENOSPC at
/// any storage step of the open).
fn lacks_space(error: &PartitionError) -> bool {
    use crate::log::LogError;
    use crate::partition::files::SideFileError;
    let io = match error {
        PartitionError::Log(LogError::Io(io))
        | PartitionError::SideFile(SideFileError::Io(io))
        | PartitionError::Journal(JournalError::Io(io)) => io,
        _ => return false,
    };
    io.source.raw_os_error() == Some(libc::ENOSPC)
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
        let on_rings: usize = partitions.rings().map(|ring| ring.waiters().claims_waiting()).sum();
        u64::try_from(on_partitions + on_rings).unwrap_or(u64::MAX)
    }

    /// Partitions of this shard whose open is retried (refused for lack of
    /// disk space): their records are not in any stored figure yet.
    pub fn partitions_waiting_to_open(&self) -> usize {
        self.open_retries.borrow().len()
    }

    /// Records that `queue`/`partition` is not served (answered
    /// `STORAGE_FAILED`, reported by `/health/ready`) and builds the error.
    fn refuse_partition(
        &self,
        queue: &QueueName,
        partition: PartitionId,
        error: PartitionError,
    ) -> ServerError {
        self.unavailable
            .borrow_mut()
            .insert((queue.as_str().to_owned(), partition), error.to_string());
        ServerError::Partition { queue: queue.as_str().to_owned(), partition, error }
    }

    /// Opens `queue`/`partition`. `epoch_opened`: its journal handle and
    /// new leader epoch when [`ShardState::open_journal_epochs`] already
    /// made them durable for a group of partitions; without it the open
    /// makes its own.
    async fn open_partition(
        &self,
        queue: &QueueName,
        queue_id: QueueId,
        partition: PartitionId,
        config: &crate::queue::QueueConfig,
        epoch_opened: Option<(PartitionHandle, u32)>,
    ) -> Result<(), ServerError> {
        let dir = partition_dir(&self.config.data_dir, queue_id, partition);
        let name = PartitionName { queue: queue.as_str().to_owned(), queue_id, partition };
        let journal = self.journal.borrow().clone();
        let opened = match journal {
            None => Err(PartitionError::Journal(JournalError::Failed(
                "the shard journal is not open".into(),
            ))),
            Some(journal) => {
                self.open_journal_partition(&journal, &dir, name, config, epoch_opened).await
            }
        };
        let (partition_rc, background, report, handle) = match opened {
            Ok(opened) => opened,
            Err(error) if lacks_space(&error) => {
                let retry_ms = crate::limits::PARTITION_OPEN_RETRY_MS;
                let key = (queue.as_str().to_owned(), partition);
                if self.unavailable.borrow().contains_key(&key) {
                    tracing::debug!(queue = %queue, partition = partition.0, %error, "still no disk space");
                } else {
                    tracing::warn!(shard = self.shard.0, queue = %queue, partition = partition.0, %error,
                        retry_ms, "partition could not open for lack of disk space; serving \
                        STORAGE_FAILED for it and opening it again when space returns");
                }
                self.open_retries.borrow_mut().insert(
                    (queue.as_str().to_owned(), partition),
                    OpenRetry {
                        queue: queue.clone(),
                        queue_id,
                        config: config.clone(),
                        at_ms: (self.clock)().saturating_add(retry_ms),
                    },
                );
                return Err(self.refuse_partition(queue, partition, error));
            }
            Err(error) => {
                tracing::error!(shard = self.shard.0, queue = %queue, partition = partition.0, %error,
                    "partition refused to open; serving STORAGE_FAILED for it");
                return Err(self.refuse_partition(queue, partition, error));
            }
        };
        tracing::info!(
            shard = self.shard.0,
            queue = %queue,
            partition = partition.0,
            epoch = report.epoch.0,
            next_offset = report.next_offset.0,
            checkpoint = ?report.checkpoint_covers.map(|offset| offset.0),
            replayed_events = report.replayed_events,
            "partition open"
        );
        self.unavailable.borrow_mut().remove(&(queue.as_str().to_owned(), partition));
        self.epochs.publish(queue_id, partition, report.epoch);
        let alarm = self.alarm.clone();
        partition_rc.set_wakeup_hook(Rc::new(move |at| alarm.request(at)));
        // Deadlines the replay restored (leases, scheduled messages).
        if let Some(at) = partition_rc.next_due() {
            self.alarm.request(at);
        }
        if let (Some(handle), Some(journal)) = (handle, &*self.journal.borrow()) {
            journal.routed.borrow_mut().remove(&handle);
        }
        let task = glommio::spawn_local(background).detach();
        let served = Rc::new(Served {
            partition: partition_rc,
            requests: RequestCounters::default(),
            background: RefCell::new(Some(task)),
            tick: self.tick_plan.slot(),
        });
        // Weak both ways: the plan holds the served partition while it is
        // listed, and the partition holds this hook.
        let (plan, weak) = (Rc::downgrade(&self.tick_plan), Rc::downgrade(&served));
        served.partition.set_touch_hook(Rc::new(move || {
            if let (Some(plan), Some(served)) = (plan.upgrade(), weak.upgrade()) {
                plan.touch(&served);
            }
        }));
        // The first tick looks at it (the replay may have restored timers).
        self.tick_plan.touch(&served);
        let ring = self.partitions.borrow_mut().insert(queue.as_str(), partition, served.clone());
        // Listed at once: the replay may have restored ready messages; the
        // first claim of any partition that finds it exhausted drops it.
        let weak = Rc::downgrade(&ring);
        served.partition.set_ready_hook(Rc::new(move |count| {
            if let Some(ring) = weak.upgrade() {
                ring.mark(partition, count);
            }
        }));
        ring.mark(partition, 0);
        Ok(())
    }

    /// Opens `name` on the shard journal: its handle (registered, durably,
    /// before its first append) and new leader epoch (`epoch_opened`, or
    /// made here), and the entries recovery routed to it. The entries stay
    /// in the map until the caller knows the open succeeded.
    async fn open_journal_partition(
        &self,
        journal: &ShardJournalRun,
        dir: &Path,
        name: PartitionName,
        config: &crate::queue::QueueConfig,
        epoch_opened: Option<(PartitionHandle, u32)>,
    ) -> Result<
        (Rc<ShardPartition>, BackgroundTask, crate::partition::OpenReport, Option<PartitionHandle>),
        PartitionError,
    > {
        let (handle, epoch) = match epoch_opened {
            Some(opened) => opened,
            None => {
                crate::io::create_dir_durable(&DmaStorage, dir)
                    .await
                    .map_err(crate::log::LogError::Io)?;
                let floor =
                    Self::journal_epoch_floor(journal, name.queue_id, name.partition, dir).await?;
                let opened = journal
                    .shard
                    .open_partitions(&[(name.queue_id.0, name.partition, floor)])
                    .await?;
                opened.first().copied().ok_or_else(|| {
                    PartitionError::Journal(JournalError::Failed("no epoch was opened".into()))
                })?
            }
        };
        let routed = journal.routed.borrow().get(&handle).cloned().unwrap_or_default();
        let replayed = journal.replayed.borrow_mut().remove(&handle);
        let (partition, background, report) = Partition::open_journal(
            DmaStorage,
            dir,
            name,
            config.clone(),
            JournalOpen { shard: journal.shard.clone(), handle, epoch, routed, replayed },
            self.secret,
            Rc::new(ExitOnFatal),
            self.clock.clone(),
        )
        .await?;
        Ok((partition, Box::pin(background) as BackgroundTask, report, Some(handle)))
    }

    /// The epoch floor of a journal partition besides the handles table:
    /// its epoch side file, read only when the table holds no epoch for it
    /// (a table written before tables held epochs).
    async fn journal_epoch_floor(
        journal: &ShardJournalRun,
        queue_id: QueueId,
        partition: PartitionId,
        dir: &Path,
    ) -> Result<u64, PartitionError> {
        let handles = journal.shard.handles();
        let target = crate::log::journal::HandleTarget { queue_id: queue_id.0, partition };
        let in_table = handles.handle_of(target).and_then(|handle| handles.epoch(handle));
        match in_table {
            Some(epoch) if epoch > 0 => Ok(0),
            _ => Partition::<DmaStorage>::journal_epoch_floor(&DmaStorage, dir).await,
        }
    }

    /// Makes the journal partitions `partitions` of `queue_id` ready to
    /// open together: their directories created with one
    /// sync of each parent, then their handles and new leader epochs
    /// written to the shard's handles table in **one** durable write. What
    /// it returns is passed to [`ShardState::open_partition`]. `None`
    /// without partitions, before the journal opened or when the group
    /// step failed (each
    /// partition's open then tries on its own and reports its error).
    async fn open_journal_epochs(
        &self,
        queue_id: QueueId,
        partitions: &[PartitionId],
    ) -> Option<Vec<(PartitionHandle, u32)>> {
        if partitions.is_empty() {
            return None;
        }
        let journal = self.journal.borrow().clone()?;
        let dirs: Vec<PathBuf> = partitions
            .iter()
            .map(|partition| partition_dir(&self.config.data_dir, queue_id, *partition))
            .collect();
        let grouped = async {
            crate::io::create_dirs_durable(&DmaStorage, &dirs)
                .await
                .map_err(|error| PartitionError::Log(crate::log::LogError::Io(error)))?;
            let mut opening = Vec::with_capacity(partitions.len());
            for (partition, dir) in partitions.iter().zip(&dirs) {
                let floor = Self::journal_epoch_floor(&journal, queue_id, *partition, dir).await?;
                opening.push((queue_id.0, *partition, floor));
            }
            Ok::<_, PartitionError>(journal.shard.open_partitions(&opening).await?)
        };
        match grouped.await {
            Ok(opened) if opened.len() == partitions.len() => Some(opened),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(shard = self.shard.0, queue_id = queue_id.0, %error,
                    partitions = partitions.len(),
                    "opening the partitions' epochs together failed; each opens on its own");
                None
            }
        }
    }

    /// Opens the shard journal (journal layout) before any partition: from
    /// the least checkpoint scan start over the partitions the catalog gives
    /// this shard (a partition without a checkpoint, or without a directory
    /// yet, needs the journal from its first file), or from the oldest
    /// journal file when it has none.
    async fn open_journal(&self) -> Result<(), ServerError> {
        let shard_dir = journal_shard_dir(&self.config.data_dir, self.shard);
        let journal_error = |error: JournalError| ServerError::Journal {
            dir: shard_dir.join(crate::log::journal::JOURNAL_DIR_NAME),
            error,
        };
        crate::io::create_dir_durable(&DmaStorage, &shard_dir)
            .await
            .map_err(|error| journal_error(JournalError::Io(error)))?;
        // The least scan start; `Some(None)`: a partition without a
        // checkpoint (from the oldest file).
        let mut start: Option<Option<JournalPos>> = None;
        let mut partitions = 0usize;
        for (queue, partition) in self.recovered.owned_by(self.shard) {
            partitions += 1;
            let Some(entry) = self.recovered.queue(queue) else { continue };
            let dir = partition_dir(&self.config.data_dir, entry.id, partition);
            let scan_start = if dir.is_dir() {
                Partition::<DmaStorage>::journal_scan_start(&DmaStorage, &dir).await.map_err(
                    |error| ServerError::Partition {
                        queue: queue.as_str().to_owned(),
                        partition,
                        error,
                    },
                )?
            } else {
                None
            };
            start = Some(match (start, scan_start) {
                (None, scan) => scan,
                (Some(None), _) | (Some(_), None) => None,
                (Some(Some(least)), Some(scan)) => Some(least.min(scan)),
            });
        }
        let journal_dir = shard_dir.join(crate::log::journal::JOURNAL_DIR_NAME);
        let oldest = JournalPos(oldest_journal_file(&journal_dir));
        // A partition without a checkpoint needs every entry it wrote: all
        // in the files still held (none is released while it is open).
        let start = match start {
            Some(Some(start)) => start,
            Some(None) | None => oldest,
        };
        let config = JournalConfig::for_partitions(&self.log_config);
        let file_bytes = config.file_bytes;
        let (shard, recovery) =
            ShardJournal::open(DmaStorage, &shard_dir, config, start, Rc::new(ExitOnFatal))
                .await
                .map_err(journal_error)?;
        shard.journal().set_commit_observer(Rc::new(CommitTimer::default()));
        shard.journal().set_witness_delay(witness_delay());
        shard.journal().set_commit_delay(commit_delay());
        let report = &recovery.report;
        tracing::info!(
            shard = self.shard.0,
            dir = %shard_dir.display(),
            partitions,
            start = start.0,
            recovered_to = report.next_position.0,
            routed_partitions = recovery.routed.partitions.len(),
            garbage_entries = recovery.routed.garbage_entries,
            torn_tail_cut_at = ?report.truncated_at.as_ref().map(|(_, pos)| *pos),
            prepared_removed = report.prepared_removed,
            "shard journal open"
        );
        let task = glommio::spawn_local(shard.background()).detach();
        *self.journal.borrow_mut() = Some(Rc::new(ShardJournalRun {
            shard,
            routed: RefCell::new(recovery.routed.partitions),
            replayed: RefCell::new(HashMap::new()),
            task: RefCell::new(Some(task)),
            file_bytes,
            releasing: Cell::new(false),
            relocating: Cell::new(false),
            checkpointing: Cell::new(false),
            next_release_ms: Cell::new(0),
            release: Cell::new(JournalReport::default()),
        }));
        self.replay_journal_partitions().await;
        Ok(())
    }

    /// Drops the states of the ordered replay at start that no open took,
    /// once the catalog's replay (`recovered`, up to its version) has been
    /// applied: a partition opened later (a retry) replays on its own.
    fn drop_unopened_replays(&self, applied: crate::control::assignment::AssignmentVersion) {
        if applied < self.recovered.version() {
            return;
        }
        let Some(journal) = self.journal.borrow().clone() else { return };
        let left = std::mem::take(&mut *journal.replayed.borrow_mut());
        if !left.is_empty() {
            tracing::info!(
                shard = self.shard.0,
                partitions = left.len(),
                "states of the ordered replay no open took dropped"
            );
        }
    }

    /// Replays the journal partitions this shard owns in one pass, in
    /// journal order (`partition::replay_journal_shard`), before any of
    /// them opens: each chunk of the journal is read once, where partitions
    /// replaying on their own would each read the chunks holding their
    /// entries. Their opens take the states; a partition the pass leaves
    /// out opens as before.
    async fn replay_journal_partitions(&self) {
        let Some(journal) = self.journal.borrow().clone() else { return };
        let handles = journal.shard.handles();
        let mut targets = Vec::new();
        for (queue, partition) in self.recovered.owned_by(self.shard) {
            let Some(entry) = self.recovered.queue(queue) else { continue };
            let target = crate::log::journal::HandleTarget { queue_id: entry.id.0, partition };
            let Some(handle) = handles.handle_of(target) else { continue };
            let dir = partition_dir(&self.config.data_dir, entry.id, partition);
            if !dir.is_dir() {
                continue;
            }
            targets.push(ShardReplayTarget {
                handle,
                dir,
                queue: entry.id,
                partition,
                config: (*entry.config).clone(),
            });
        }
        if targets.is_empty() {
            return;
        }
        let started = crate::clock::instant_now();
        // Nothing else runs on the shard yet (no partition is open, no
        // assignment applied): the routed lists are lent to the pass.
        let routed = std::mem::take(&mut *journal.routed.borrow_mut());
        let (replayed, report) = replay_journal_shard(
            &DmaStorage,
            journal.shard.journal(),
            &routed,
            targets,
            self.secret,
        )
        .await;
        *journal.routed.borrow_mut() = routed;
        tracing::info!(
            shard = self.shard.0,
            partitions = report.partitions,
            replayed = report.replayed,
            left_to_open = report.left_to_open,
            entries = report.entries,
            entry_bytes = report.entry_bytes,
            events = report.events,
            read_failed = ?report.read_failed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "shard journal replayed in journal order"
        );
        *journal.replayed.borrow_mut() = replayed;
    }

    /// Closes a partition of a deleted queue without its final checkpoint
    /// ([`Partition::close_for_delete`]) and waits for its background task.
    async fn discard_served(served: &Served) {
        served.partition.close_for_delete().await;
        Self::background_ended(served).await;
    }

    async fn close_served(served: &Served) -> Result<(), PartitionError> {
        let result = served.partition.close().await;
        Self::background_ended(served).await;
        result
    }

    /// Waits for a closed partition's background task (its log's last
    /// commits durable).
    async fn background_ended(served: &Served) {
        let task = served.background.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }
}

/// A deleted queue's partitions are closed and removed in steps of this
/// many, the shard serving its other partitions between steps.
const DELETE_YIELD_PARTITIONS: usize = 64;

/// A partition's background future, whichever its log.
type BackgroundTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// The base position of the oldest journal file in `dir` (0 when there is
/// none, or the directory does not exist yet).
fn oldest_journal_file(dir: &Path) -> u64 {
    let Ok(names) = std::fs::read_dir(dir) else { return 0 };
    names
        .filter_map(Result::ok)
        .filter_map(|entry| {
            entry.file_name().to_str().and_then(crate::log::journal::parse_journal_file_name)
        })
        .min()
        .unwrap_or(0)
}

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
        self.state.open_journal().await
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
            AssignmentChange::CreateQueue { .. } => None,
        };
        *state.table.borrow_mut() = table.clone();
        let result = match &update.change {
            AssignmentChange::CreateQueue { queue, queue_id, shards, config } => {
                // Every owned partition is tried: one that fails to open
                // must not keep its neighbours closed. Up to
                // PARTITION_OPENS_CONCURRENT open at once, so their syncs
                // (epoch file, directory) overlap instead of queueing one
                // after another. The directories and the epochs of all of
                // them are made durable first, together (a few syncs per
                // shard, not several per partition).
                let owned: Vec<PartitionId> = shards
                    .iter()
                    .enumerate()
                    .filter(|(_, shard)| **shard == state.shard)
                    .map(|(partition, _)| PartitionId(u32::try_from(partition).unwrap_or(u32::MAX)))
                    .collect();
                let epochs = state.open_journal_epochs(*queue_id, &owned).await;
                let mut failures = Vec::new();
                for (at, wave) in
                    owned.chunks(crate::limits::PARTITION_OPENS_CONCURRENT).enumerate()
                {
                    let first = at * crate::limits::PARTITION_OPENS_CONCURRENT;
                    let opening: Vec<_> = wave
                        .iter()
                        .enumerate()
                        .map(|(index, &partition)| {
                            let state = state.clone();
                            let queue = queue.clone();
                            let config = config.clone();
                            let queue_id = *queue_id;
                            let opened = epochs
                                .as_ref()
                                .and_then(|epochs| epochs.get(first + index).copied());
                            glommio::spawn_local(async move {
                                state
                                    .open_partition(&queue, queue_id, partition, &config, opened)
                                    .await
                            })
                        })
                        .collect();
                    for task in opening {
                        if let Err(error) = task.await {
                            failures.push(error);
                        }
                    }
                }
                match failures.len() {
                    0 => Ok(()),
                    1 => Err(failures.remove(0)),
                    _ => Err(ServerError::Several(failures)),
                }
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
        report.claims_waiting = self.state.claims_waiting();
        report.pace = crate::net::pace::Pace::of_this_shard().stats();
        report.quotas = self.handler.quota_report();
    }

    fn on_tick(&self) {
        self.retry_opens();
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
        self.state.close_journal().await;
        first_error.map_or(Ok(()), Err)
    }
}
