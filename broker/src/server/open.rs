//! Opening and closing what a shard serves: a partition opened on the
//! shard journal (its handle and new leader epoch made durable first, the
//! partitions of one queue together), the journal's own recovery and the
//! replay of its partitions, an open refused for lack of space kept for a
//! retry, and a deleted queue's partitions closed and removed. The request
//! path and the housekeeping tick are `handler.rs`' and `mod.rs`'; this file
//! must not answer requests.

use super::*;

impl ShardState {
    /// After the catalog's replay: refuses the start when what opened is
    /// charged more than the shard's state share, naming the queues that
    /// take the most (a broker serving with every enqueue refused would
    /// hide the cause).
    ///
    /// # Errors
    /// [`ServerError::MemoryAtStart`] with the figures.
    pub(super) fn check_state_memory(&self) -> Result<(), ServerError> {
        let stats = self.state_memory.stats();
        if stats.used_bytes <= stats.size_bytes {
            return Ok(());
        }
        let mut by_queue: BTreeMap<String, u64> = BTreeMap::new();
        for (queue, _, served) in self.partitions.borrow().iter() {
            *by_queue.entry(queue.to_owned()).or_default() += served.partition.memory_charged();
        }
        let mut queues: Vec<(String, u64)> = by_queue.into_iter().collect();
        queues.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        queues.truncate(crate::limits::MEMORY_REFUSAL_QUEUES_NAMED_MAX);
        Err(ServerError::MemoryAtStart {
            memory_bytes: self.config.memory_bytes,
            shard: self.shard.0,
            charged: stats.used_bytes,
            share: stats.size_bytes,
            queues,
        })
    }

    /// Records that `queue`/`partition` is not served (answered
    /// `STORAGE_FAILED`, reported by `/health/ready`) and builds the error.
    pub(super) fn refuse_partition(
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

    /// Whether this node holds a replica of `partition` of the queue
    /// `entry` (always on one node): the table names it, or the table
    /// re-placed the partition off it and its group has not settled there
    /// yet while this node still has its copy (which may be part of a
    /// majority until then: `server/replace.rs`).
    pub(super) fn holds_replica(
        &self,
        entry: &crate::control::assignment::QueueEntry,
        partition: PartitionId,
    ) -> bool {
        let Some(cluster) = &self.cluster else { return true };
        cluster.hosts(entry, partition)
            || (entry.replicas.get(&partition).is_some_and(|set| !set.settled)
                && partition_dir(&self.config.data_dir, entry.id, partition).is_dir())
    }

    /// Opens `queue`/`partition`. `epoch_opened`: its journal handle and
    /// new leader epoch when [`ShardState::open_journal_epochs`] already
    /// made them durable for a group of partitions; without it the open
    /// makes its own.
    /// The partitions of `shards` (partition `first + i` on `shards[i]`)
    /// this shard owns: in a cluster, only those this node is a replica
    /// of.
    pub(super) fn owned_partitions(
        &self,
        queue_id: QueueId,
        shards: &[ShardId],
        first: u32,
    ) -> Vec<PartitionId> {
        shards
            .iter()
            .enumerate()
            .filter(|(_, shard)| **shard == self.shard)
            .map(|(index, _)| {
                PartitionId(first.saturating_add(u32::try_from(index).unwrap_or(u32::MAX)))
            })
            .filter(|partition| {
                let table = self.table.borrow();
                table
                    .queue_by_id(queue_id)
                    .is_some_and(|(_, entry)| self.holds_replica(entry, *partition))
            })
            .collect()
    }

    /// Opens `owned` partitions of `queue` (a create's, or a resize's
    /// added ones). Every one is tried: one that fails to open must not
    /// keep its neighbours closed. Up to `PARTITION_OPENS_CONCURRENT` open
    /// at once, so their syncs (epoch file, directory) overlap instead of
    /// queueing one after another; the directories and the epochs of all
    /// of them are made durable first, together (a few syncs per shard,
    /// not several per partition).
    ///
    /// A `live` change (not the catalog's replay at start, which checks the
    /// whole charge and names the queues instead) that cannot fit the
    /// shard's state memory is refused before anything opens.
    ///
    /// # Errors
    /// `ServerError::Memory`; every partition that did not open
    /// (`ServerError::Several` for more than one).
    pub(super) async fn open_owned(
        self: &Rc<Self>,
        queue: &QueueName,
        queue_id: QueueId,
        config: &Arc<crate::queue::QueueConfig>,
        owned: &[PartitionId],
        live: bool,
    ) -> Result<(), ServerError> {
        if live {
            if let Err(full) = self.state_memory.admit_partitions(owned.len() as u64) {
                return Err(ServerError::Memory {
                    queue: queue.as_str().to_owned(),
                    partitions: owned.len(),
                    full,
                });
            }
        }
        let epochs = self.open_journal_epochs(queue_id, owned).await;
        let mut failures = Vec::new();
        for (at, wave) in owned.chunks(crate::limits::PARTITION_OPENS_CONCURRENT).enumerate() {
            let first = at * crate::limits::PARTITION_OPENS_CONCURRENT;
            let opening: Vec<_> = wave
                .iter()
                .enumerate()
                .map(|(index, &partition)| {
                    let state = self.clone();
                    let queue = queue.clone();
                    let config = config.clone();
                    let opened =
                        epochs.as_ref().and_then(|epochs| epochs.get(first + index).copied());
                    glommio::spawn_local(async move {
                        state.open_partition(&queue, queue_id, partition, &config, opened).await
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

    pub(super) async fn open_partition(
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
        // Its place in the queue's key map, before it serves anything.
        if let Some(route) = self.key_route_of(queue, partition) {
            partition_rc.set_key_route(route);
        }
        if let Some(cluster) = &self.cluster {
            cluster.serve(&partition_rc, self.epochs.clone());
        }
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
        served.partition.set_state_memory(self.state_memory.clone());
        // The first tick looks at it (the replay may have restored timers).
        self.tick_plan.touch(&served);
        let rings = self.partitions.borrow_mut().insert(queue.as_str(), partition, served.clone());
        // Listed at once: the replay may have restored ready messages; the
        // first claim of any partition that finds it exhausted drops it.
        let weak = Rc::downgrade(&rings);
        served.partition.set_ready_hook(Rc::new(move |count| {
            if let Some(rings) = weak.upgrade() {
                rings.mark(partition, count);
            }
        }));
        rings.mark(partition, 0);
        Ok(())
    }

    /// Opens `name` on the shard journal: its handle (registered, durably,
    /// before its first append) and new leader epoch (`epoch_opened`, or
    /// made here), and the entries recovery routed to it. The entries stay
    /// in the map until the caller knows the open succeeded.
    pub(super) async fn open_journal_partition(
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
        if let Some(cluster) = &self.cluster {
            let log = journal.logs.borrow().get(&handle).copied().unwrap_or_default();
            let recovered = super::cluster::Recovered { handle, routed, log };
            let (partition, background, report) = cluster
                .open_partition(
                    &journal.shard,
                    dir,
                    name,
                    config,
                    recovered,
                    self.secret,
                    self.clock.clone(),
                )
                .await?;
            return Ok((partition, background, report, Some(handle)));
        }
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
    pub(super) async fn journal_epoch_floor(
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
    pub(super) async fn open_journal_epochs(
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
    pub(super) async fn open_journal(&self) -> Result<(), ServerError> {
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
            let Some(entry) = self.recovered.queue(queue) else { continue };
            // In a cluster, only the partitions this node holds a replica of.
            if !self.holds_replica(entry, partition) {
                continue;
            }
            partitions += 1;
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
        let oldest = JournalPos(crate::log::journal::oldest_journal_file(&journal_dir));
        // A partition without a checkpoint needs every entry it wrote: all
        // in the files still held (none is released while it is open). A
        // cluster member's partitions are replicated: their logs are kept
        // whole and read from their first entry whatever their checkpoints
        // (a lagging follower reads any entry back by index, and the held
        // log must know the term before its first entry).
        let start = match start {
            Some(Some(start)) if self.cluster.is_none() => start,
            Some(_) | None => oldest,
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
            logs: RefCell::new(recovery.routed.logs),
            replayed: RefCell::new(HashMap::new()),
            task: RefCell::new(Some(task)),
            file_bytes,
            releasing: Cell::new(false),
            relocating: Cell::new(false),
            checkpointing: Cell::new(false),
            next_release_ms: Cell::new(0),
            release: Cell::new(JournalReport::default()),
        }));
        // A replicated partition replays its committed entries on its own
        // open (only those: the journal may hold an uncommitted suffix).
        if self.cluster.is_none() {
            self.replay_journal_partitions().await;
        }
        Ok(())
    }

    /// Drops the states of the ordered replay at start that no open took,
    /// once the catalog's replay (`recovered`, up to its version) has been
    /// applied: a partition opened later (a retry) replays on its own.
    pub(super) fn drop_unopened_replays(
        &self,
        applied: crate::control::assignment::AssignmentVersion,
    ) {
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
    pub(super) async fn replay_journal_partitions(&self) {
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
    pub(super) async fn discard_served(served: &Served) {
        served.partition.close_for_delete().await;
        Self::background_ended(served).await;
    }

    pub(super) async fn close_served(served: &Served) -> Result<(), PartitionError> {
        let result = served.partition.close().await;
        Self::background_ended(served).await;
        result
    }

    /// Waits for a closed partition's background task (its log's last
    /// commits durable).
    pub(super) async fn background_ended(served: &Served) {
        let task = served.background.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }
}

/// Whether a partition failed to open because the disk is full (ENOSPC at
/// any storage step of the open).
pub(super) fn lacks_space(error: &PartitionError) -> bool {
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
