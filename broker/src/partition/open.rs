//! Open: recover the log, load the newest checkpoint, replay the log after
//! it, then the epoch fence (every claim of an older epoch ended, durably,
//! before the partition serves).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use spool_wire::batch::BatchKind;

use super::enqueue::enqueue_request;
use super::files::{self, CHECKPOINT_FILE, CHECKPOINT_MAGIC};
use super::log::CheckpointPrefix;
use super::read::{aligned, verified_view};
use super::signal::Signal;
use super::{
    AttributionStats, Clock, LastAppends, LogCursor, Partition, PartitionError, PartitionLog,
    PartitionName, ReplayBatch, Role, CONTROL_BATCH_EVENTS_MAX,
};
use crate::io::Storage;
use crate::log::journal::{JournalPos, PartitionHandle, RoutedEntry, ShardJournal};
use crate::log::{FatalHandler, LogError, ReadBatch};
use crate::queue::{
    ApplyError, EnqueueMeta, Event, LeaderEpoch, Offset, OrderKey, PartitionContext,
    PartitionState, QueueConfig,
};

/// What [`Partition::open_journal`] needs of the shard: its journal, the
/// partition's handle in it (registered before its first append), its new
/// leader epoch, already durable in the shard's handles table
/// ([`ShardJournal::open_partitions`], which bumps the epochs of every
/// partition opened together in one write), and the entries the shard's
/// recovery routed to it.
pub struct JournalOpen<S: Storage> {
    pub shard: Rc<ShardJournal<S>>,
    pub handle: PartitionHandle,
    pub epoch: u32,
    pub routed: Vec<RoutedEntry>,
    /// Its checkpoint restored and its entries replayed already, by the
    /// shard's one ordered pass at start ([`super::replay_journal_shard`]);
    /// `None`: the open does both.
    pub replayed: Option<JournalReplayed>,
}

/// A journal partition's state as its open would have made it before the
/// epoch fence: checkpoint restored, every entry past it replayed. Made by
/// the shard's ordered pass ([`super::replay_journal_shard`]) so that a
/// shard of many partitions reads its journal once at start, instead of
/// each partition reading the chunks that hold its own entries.
pub struct JournalReplayed {
    /// The queue config it was restored with: a partition opened with
    /// another one does it all again.
    pub(super) config: QueueConfig,
    pub(super) state: PartitionState,
    pub(super) covers: Option<Offset>,
    pub(super) replay_from: LogCursor,
    pub(super) batches: u64,
    pub(super) events: u64,
}

impl std::fmt::Debug for JournalReplayed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("JournalReplayed")
            .field("covers", &self.covers)
            .field("replay_from", &self.replay_from)
            .field("batches", &self.batches)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// A log opened and a state restored, for [`Partition::finish_open`].
pub(super) struct Opening<'a, S: Storage> {
    pub(super) storage: S,
    pub(super) dir: &'a Path,
    pub(super) name: PartitionName,
    pub(super) log: PartitionLog<S>,
    pub(super) state: PartitionState,
    pub(super) epoch: LeaderEpoch,
    pub(super) covers: Option<Offset>,
    pub(super) replay_from: LogCursor,
    /// (batches, events) replayed before the open (the shard's ordered
    /// pass): `finish_open` replays nothing.
    pub(super) replayed: Option<(u64, u64)>,
}

fn control_of(cursor: &LogCursor) -> JournalPos {
    JournalPos(cursor.control_cursor())
}

/// What [`Partition::open_journal`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    pub epoch: LeaderEpoch,
    pub checkpoint_covers: Option<Offset>,
    pub replayed_batches: u64,
    pub replayed_events: u64,
    /// Claims of an older epoch ended by the epoch fence (released, or
    /// quarantined / expired as a release would have).
    pub fenced_claims: u64,
    pub next_offset: Offset,
}

impl<S: Storage + Clone> Partition<S> {
    /// Opens (recovering) or creates the partition in `dir` on its shard's
    /// journal (`docs/design/shard-journal.md` §12): takes the leader epoch
    /// the shard's handles table made durable, loads the checkpoint (its
    /// payload is the control cursor `c_p`, then the snapshot: `log.rs`),
    /// builds the partition's journal view from the entries the shard's
    /// recovery routed to it, replays those past the checkpoint and runs
    /// the epoch fence. The shard's journal background must be running.
    /// The returned future completes once the partition is closed and its
    /// appends are durable.
    ///
    /// # Errors
    /// A damaged checkpoint, a journal that no longer holds
    /// what the checkpoint covers, data entries that do not number offsets
    /// densely, an event that does not fit the state during replay.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_journal(
        storage: S,
        dir: &Path,
        name: PartitionName,
        config: QueueConfig,
        journal: JournalOpen<S>,
        secret: [u8; 32],
        fatal: Rc<dyn FatalHandler>,
        clock: Clock,
    ) -> Result<(Rc<Self>, impl Future<Output = ()> + 'static, OpenReport), PartitionError> {
        prepare_dir(&storage, dir, &config).await?;
        let JournalOpen { shard, handle, epoch: log_epoch, routed, replayed } = journal;
        // The shard's handles table made the epoch durable (one write for
        // every partition opened with this one); the fence below relies on
        // it being above every epoch a token was issued under.
        if log_epoch == 0 {
            return Err(PartitionError::Journal(crate::log::journal::JournalError::Failed(
                "a journal partition opened without a leader epoch".into(),
            )));
        }
        let epoch = LeaderEpoch(u64::from(log_epoch));
        let context = context_of(&name, epoch, secret, &config);
        let (mut state, covers, replay_from, replayed) =
            match replayed.filter(|replayed| replayed.config == config) {
                Some(done) => {
                    (done.state, done.covers, done.replay_from, Some((done.batches, done.events)))
                }
                None => {
                    let (state, covers, replay_from) =
                        restore_journal_state(&storage, dir, context).await?;
                    (state, covers, replay_from, None)
                }
            };
        // Replay never reads the epoch: a state the shard's pass restored
        // before the new epoch was known takes it now.
        state.set_leader_epoch(epoch);
        let recovery = |reason: String| PartitionError::Recovery { dir: dir.to_path_buf(), reason };
        let floor = covers.map_or(Offset(0), |covers| Offset(covers.0));
        let view = shard.partition(handle, routed, floor, log_epoch, replay_from.entry_index())?;
        // A checkpoint is written only once everything it covers is
        // durable: a journal that now ends before it lost answered batches.
        if view.next_offset() < floor {
            return Err(recovery(format!(
                "the checkpoint covers offset {} but the journal holds this partition's data \
                 only to offset {}: acknowledged batches are damaged or missing",
                floor.0,
                view.next_offset().0
            )));
        }
        view.raise_control_end(control_of(&replay_from));
        let log = PartitionLog::new(Rc::new(view));
        Self::finish_open(
            Opening { storage, dir, name, log, state, epoch, covers, replay_from, replayed },
            fatal,
            clock,
        )
        .await
    }

    /// The state the checkpoint in `dir` restores to, exactly as the
    /// partition's open restores it (the snapshot and the dedupe generation
    /// files it refers to), and the data offset it covers (`None`: no
    /// checkpoint, a new state). For tools that time a restore on its own.
    ///
    /// # Errors
    /// The checkpoint or a generation file it refers to is unreadable or
    /// does not decode.
    pub async fn restore_checkpoint(
        storage: &S,
        dir: &Path,
        context: PartitionContext,
    ) -> Result<(PartitionState, Option<Offset>), PartitionError> {
        let (state, covers, _) = restore_journal_state(storage, dir, context).await?;
        Ok((state, covers))
    }

    /// The floor of a journal partition's next leader epoch besides the
    /// shard's handles table: the epoch side file of `dir`, which holds
    /// the epoch of a partition opened before the table held epochs (0
    /// without one). Read it only when the table's epoch is 0.
    ///
    /// # Errors
    /// The epoch side file is unreadable or damaged.
    pub async fn journal_epoch_floor(storage: &S, dir: &Path) -> Result<u64, PartitionError> {
        super::epoch::stored(storage, dir).await
    }

    /// Where the shard's journal recovery must start for the partition in
    /// `dir`: its checkpoint's scan start, or `None`
    /// without a checkpoint (every entry of the partition is needed: the
    /// shard releases no journal file while a partition without a
    /// checkpoint is open, so they are all in the files it still holds).
    /// The shard starts at the least over its partitions.
    ///
    /// # Errors
    /// The checkpoint side file is unreadable or damaged: the partition
    /// cannot be recovered without it (the journal below a scan start may
    /// be gone).
    pub async fn journal_scan_start(
        storage: &S,
        dir: &Path,
    ) -> Result<Option<JournalPos>, PartitionError> {
        let checkpoint =
            files::read_side_file(storage, dir, CHECKPOINT_FILE, CHECKPOINT_MAGIC).await?;
        Ok(checkpoint.map(|file| JournalPos(file.value)))
    }

    /// Once the journal view is made and the checkpoint restored: the
    /// partition, its replay, the epoch fence.
    pub(super) async fn finish_open(
        opening: Opening<'_, S>,
        fatal: Rc<dyn FatalHandler>,
        clock: Clock,
    ) -> Result<(Rc<Self>, impl Future<Output = ()> + 'static, OpenReport), PartitionError> {
        let Opening { storage, dir, name, log, state, epoch, covers, replay_from, replayed } =
            opening;
        let mut background = log.background();
        let log_replicated = log.driver().is_some();
        let partition = Rc::new(Self {
            name,
            dir: dir.to_path_buf(),
            storage,
            log,
            state: RefCell::new(state),
            clock,
            epoch: Cell::new(epoch),
            replica: log_replicated.then(Role::default),
            claimable: Signal::default(),
            appends: RefCell::new(LastAppends::default()),
            checkpoint_covers: Cell::new(replay_from),
            checkpoint_running: Cell::new(false),
            checkpoint_ended: crate::log::wakers::Notify::default(),
            last_checkpoint: Cell::new(None),
            fatal,
            sync_failed: Cell::new(false),
            closed: Cell::new(false),
            disk_retry_at_ms: Cell::new(0),
            wakeup_hook: RefCell::new(None),
            touch_hook: RefCell::new(None),
            ready_hook: RefCell::new(None),
            scratch: super::scratch::Scratch::default(),
            attribution: RefCell::new(None),
            attribution_stats: Cell::new(AttributionStats::default()),
            memory: RefCell::new(super::memory::StateCharge::new(
                super::memory::StateMemory::unbounded(),
            )),
            keys: super::keys::KeyState::default(),
        });
        let (replayed_batches, replayed_events) = match replayed {
            Some(done) => done,
            None => partition.replay(replay_from).await?,
        };
        partition.log.journal().finish_replay();
        if let Some(role) = &partition.replica {
            // Replay folded the committed entries (and no others); the
            // fence runs when this member takes the lead.
            role.opened_at(partition.log.journal().committed_index());
        }
        // The fence's events must be durable before anything is served, and
        // durability needs the log's background future: drive it here until
        // the fence is done, then hand it (still running) to the caller.
        let fenced_claims = {
            let replicated = partition.replica.is_some();
            let fence = std::pin::pin!(async {
                if replicated {
                    return Ok(0);
                }
                partition.fence().await
            });
            let mut fence = fence;
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(result) = fence.as_mut().poll(cx) {
                    return std::task::Poll::Ready(result);
                }
                if background.as_mut().poll(cx).is_ready() {
                    let reason = partition.log.failure().unwrap_or_else(|| "log closed".into());
                    return std::task::Poll::Ready(Err(PartitionError::Log(LogError::Failed(
                        reason,
                    ))));
                }
                std::task::Poll::Pending
            })
            .await?
        };
        let report = OpenReport {
            epoch,
            checkpoint_covers: covers,
            replayed_batches,
            replayed_events,
            fenced_claims,
            next_offset: Offset(partition.log.next_offset().0),
        };
        Ok((partition, background, report))
    }

    /// Folds every batch after `from` to the log's end into the state.
    async fn replay(&self, from: LogCursor) -> Result<(u64, u64), PartitionError> {
        let mut replay = self.log.replay(from);
        let mut fold = ReplayFold::default();
        while let Some(ReplayBatch { batch, apply_from }) = replay.next_batch().await? {
            fold.apply(&mut self.state.borrow_mut(), &batch, apply_from, &self.dir)?;
        }
        Ok(fold.finish(&mut self.state.borrow_mut()))
    }

    /// The epoch fence: ends every claim outstanding after replay (all of
    /// them were made under an older epoch, since open bumped it) with the
    /// events `PartitionState::fence` decides, appended and applied like any
    /// other, and waits until they are durable. A crash before that repeats
    /// the fence at the next open on the same claims. Returns how many
    /// claims it ended.
    pub(super) async fn fence(&self) -> Result<u64, PartitionError> {
        let mut fenced = 0u64;
        let mut last = None;
        loop {
            if self.state.borrow().claims_outstanding() == 0 {
                break;
            }
            self.log
                .writable(BatchKind::Control, Self::control_bytes(CONTROL_BATCH_EVENTS_MAX, false))
                .await;
            let now = (self.clock)();
            let events = self.state.borrow().fence(now, CONTROL_BATCH_EVENTS_MAX);
            if events.is_empty() {
                break;
            }
            fenced += events.len() as u64;
            if let Some(ticket) = self.append_events(&events, now)? {
                last = Some(ticket);
            }
        }
        if let Some(ticket) = last {
            ticket.durable().await?;
            tracing::info!(partition = ?self.name, epoch = self.epoch.get().0, fenced, "claims of an older epoch released");
        }
        Ok(fenced)
    }
}

/// Checks `config` and makes `dir` durable: what every open does first.
pub(super) async fn prepare_dir<S: Storage>(
    storage: &S,
    dir: &Path,
    config: &QueueConfig,
) -> Result<(), PartitionError> {
    config.validate()?;
    crate::io::create_dir_durable(storage, dir).await.map_err(LogError::Io)?;
    Ok(())
}

/// The context a partition named `name` is opened (or rebuilt) with.
pub(super) fn context_of(
    name: &PartitionName,
    epoch: LeaderEpoch,
    secret: [u8; 32],
    config: &QueueConfig,
) -> PartitionContext {
    PartitionContext {
        queue: name.queue_id,
        partition: name.partition,
        epoch,
        secret,
        config: config.clone(),
    }
}

/// Restores a journal partition's state from the checkpoint in `dir` (a
/// new state without one): the state, the offset it covers and the cursor
/// replay starts from.
pub(super) async fn restore_journal_state<S: Storage>(
    storage: &S,
    dir: &Path,
    context: PartitionContext,
) -> Result<(PartitionState, Option<Offset>, LogCursor), PartitionError> {
    let checkpoint = files::read_side_file(storage, dir, CHECKPOINT_FILE, CHECKPOINT_MAGIC).await?;
    let recovery = |reason: String| PartitionError::Recovery { dir: dir.to_path_buf(), reason };
    let Some(file) = checkpoint else {
        return Ok((PartitionState::new(context)?, None, LogCursor::default()));
    };
    let (prefix, snapshot) = CheckpointPrefix::decode(&file.payload).map_err(recovery)?;
    let (control, entry_index) = (prefix.control, prefix.entry_index);
    let control = JournalPos(control);
    // The journal before the scan start may be gone: a checkpoint that does
    // not decode cannot be replaced by a full replay.
    let restored = super::dedupe_files::restore_checkpoint(storage, dir, snapshot, context)
        .await?
        .map_err(|error| recovery(format!("checkpoint does not decode: {error}")))?;
    let cursor = LogCursor::from_journal_checkpoint(
        file.value,
        Offset(restored.covers.0),
        control,
        entry_index,
    )
    .with_recorded(prefix.entry_term, prefix.log_start);
    Ok((restored.state, Some(restored.covers), cursor))
}

/// Folds replayed batches, in log order, into a partition's state; shared
/// by a partition's own replay and the shard's ordered pass.
#[derive(Default)]
pub(super) struct ReplayFold {
    /// The leader epoch of the last batch folded.
    epoch: Option<u64>,
    batches: u64,
    events: u64,
}

impl ReplayFold {
    /// Applies the events of `batch` from `apply_from` on (records below
    /// were applied before the cursor replay started at).
    ///
    /// # Errors
    /// A batch that does not verify, an event that does not decode or does
    /// not fit the state (naming `dir` and the offset).
    pub(super) fn apply(
        &mut self,
        state: &mut PartitionState,
        batch: &ReadBatch,
        apply_from: Offset,
        dir: &Path,
    ) -> Result<(), PartitionError> {
        let recovery = |reason: String| PartitionError::Recovery { dir: dir.to_path_buf(), reason };
        let bytes = aligned(&batch.bytes);
        let view = verified_view(&bytes, &batch.header)?;
        let base = view.header().base_offset;
        // An attribution whose records have not arrived when the epoch
        // changes (or replay ends) outlived records a crash lost: the
        // offsets are taken again by the next epoch's records.
        let batch_epoch = u64::from(view.header().leader_epoch);
        if self.epoch.is_some_and(|last| last != batch_epoch) {
            state.drop_pending_attributions();
        }
        self.epoch = Some(batch_epoch);
        for index in 0..view.len() {
            let offset = base + index as u64;
            if offset < apply_from.0 {
                continue;
            }
            let event = match view.header().kind {
                BatchKind::Data => {
                    let request = enqueue_request(&view, index);
                    let stamp = view.record(index).enqueue_time_ms.to_native();
                    // Keys matter to an ordered queue's lanes alone.
                    let key = if state.config.ordered {
                        OrderKey::of(view.record(index).routing_key.as_slice())
                    } else {
                        None
                    };
                    Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), stamp).with_key(key))
                }
                BatchKind::Control => Event::decode(view.control_record(index))
                    .map_err(|error| recovery(format!("event at offset {offset}: {error}")))?,
                BatchKind::Filler => continue,
            };
            state.apply(&event).map_err(|error: ApplyError| {
                recovery(format!("event at offset {offset} does not apply: {error}"))
            })?;
            self.events += 1;
        }
        self.batches += 1;
        Ok(())
    }

    /// Ends the replay: (batches, events) folded.
    pub(super) fn finish(self, state: &mut PartitionState) -> (u64, u64) {
        state.drop_pending_attributions();
        (self.batches, self.events)
    }
}
