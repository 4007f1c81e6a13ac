//! A shard journal's upkeep on the shard that runs it: release passes
//! (files no open partition needs removed; over the retain budget,
//! checkpoints asked of the partitions that pin the oldest file),
//! relocation passes of the oldest file, the journal's figures for the
//! shard's report, and its close after its partitions; the run's state
//! ([`ShardJournalRun`]) and the commit timer that feeds the commit
//! metrics. Opening the journal and its partitions is `mod.rs`'s.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use glommio::task::JoinHandle;

use super::{Served, ShardPartition, ShardState};
use crate::io::DmaStorage;
use crate::log::journal::{CommitObserver, JournalPos, PartitionHandle, RoutedEntry, ShardJournal};
use crate::partition::JournalReplayed;
use crate::shard::report::JournalReport;

/// The shard's journal, opened by [`SpoolHooks::start`].
pub struct ShardJournalRun {
    pub shard: Rc<ShardJournal<DmaStorage>>,
    /// The entries recovery routed to each handle, until its partition
    /// opens (taken then; a failed open leaves them for the next attempt).
    /// Handles of deleted queues keep theirs (positions only, no payload
    /// bytes) until the journal's reclamation (step 4).
    pub(super) routed: RefCell<BTreeMap<PartitionHandle, Vec<RoutedEntry>>>,
    /// Each handle's log as recovery found it (entry indexes, committed
    /// index): what a replicated partition's member opens from.
    pub(super) logs: RefCell<BTreeMap<PartitionHandle, crate::log::journal::RecoveredLog>>,
    /// The states the ordered replay at start made (checkpoint restored,
    /// entries replayed in journal order: `partition::replay_journal_shard`),
    /// taken by each partition's open; what is left once the catalog's
    /// replay is applied is dropped.
    pub(super) replayed: RefCell<HashMap<PartitionHandle, JournalReplayed>>,
    /// The journal's committers and preparer.
    pub(super) task: RefCell<Option<JoinHandle<()>>>,
    /// Bytes of one journal file.
    pub(super) file_bytes: u64,
    /// A release pass is running.
    pub(super) releasing: Cell<bool>,
    /// A relocation pass is running.
    pub(super) relocating: Cell<bool>,
    /// The checkpoints a release pass asked for are running.
    pub(super) checkpointing: Cell<bool>,
    /// When the next release pass may start (broker clock, ms).
    pub(super) next_release_ms: Cell<u64>,
    /// What the release passes did and found (`report`).
    pub(super) release: Cell<JournalReport>,
}

/// Feeds the shard journal's commits into the per-thread disk counters
/// (`io::stats::record_commit`: commit size and build-to-durable time) that
/// `spool_shard_commit_*` report. Commits become durable in the order they
/// were built.
#[derive(Default)]
pub(super) struct CommitTimer {
    built: RefCell<std::collections::VecDeque<(u64, crate::clock::Instant)>>,
}

impl CommitObserver for CommitTimer {
    fn built(&self, seq: u64) {
        self.built.borrow_mut().push_back((seq, crate::clock::instant_now()));
    }

    fn durable(&self, seq: u64, span_bytes: u64) {
        let mut built = self.built.borrow_mut();
        while let Some(&(front, started)) = built.front() {
            if front > seq {
                break;
            }
            built.pop_front();
            if front == seq {
                let took = crate::clock::instant_now().duration_since(started);
                crate::io::stats::record_commit(span_bytes, took);
            }
        }
    }
}

impl ShardState {
    /// Starts a journal release pass when one is due (journal layout; see
    /// the module docs): the least position the open partitions need, the
    /// files wholly below it removed, and, over the retain budget, a
    /// checkpoint asked of each partition whose pin a checkpoint would move
    /// to a later file.
    pub(super) fn release_journal(self: &Rc<Self>) {
        let Some(journal) = self.journal.borrow().clone() else { return };
        let now = (self.clock)();
        if journal.releasing.get() || now < journal.next_release_ms.get() {
            return;
        }
        journal.next_release_ms.set(now.saturating_add(crate::limits::JOURNAL_RELEASE_INTERVAL_MS));
        // A partition of this shard that is not open (opening, or refused)
        // may need any file at its next open.
        let owned = {
            let table = self.table.borrow();
            table
                .owned_by(self.shard)
                .filter(|(queue, partition)| {
                    table.queue(queue).is_some_and(|entry| self.holds_replica(entry, *partition))
                })
                .count()
        };
        let served: Vec<Rc<Served>> = self.partitions.borrow().values().cloned().collect();
        if served.len() < owned || !self.unavailable.borrow().is_empty() {
            return;
        }
        let files = journal.shard.journal();
        // Checkpoints asked for and relocation only once the shard holds
        // more than `journal_retain_bytes`: with many partitions each
        // holding a little of every file, releasing each file at once costs
        // a checkpoint per partition per file; holding a budget costs that
        // once per budget written.
        let held = u64::try_from(files.file_count())
            .unwrap_or(u64::MAX)
            .saturating_mul(journal.file_bytes);
        // (Not "or its next file is not prepared": that holds for a moment
        // after every roll, and a journal that cannot prepare one has
        // failed, fatally.)
        let over_budget = held > self.config.journal_retain_bytes;
        // While the checkpoints of an earlier pass run, none is asked (they
        // are what moves the pins); the pass still releases what it can.
        let ask = over_budget && !journal.checkpointing.get();
        let mut needed = files.durable_position();
        let mut asked = Vec::new();
        for entry in &served {
            needed = needed.min(entry.partition.journal_pin());
            if ask && entry.partition.journal_checkpoint_frees() {
                asked.push(entry.partition.clone());
            }
        }
        let mut figures = journal.release.get();
        figures.needed_from = needed.0;
        figures.release_checkpoints += asked.len() as u64;
        journal.release.set(figures);
        if !asked.is_empty() {
            // At most JOURNAL_RELEASE_CHECKPOINTS_IN_FLIGHT at once: each
            // holds a write buffer and a file, and a shard of thousands of
            // partitions asks thousands of them in one pass.
            journal.checkpointing.set(true);
            let run = Rc::clone(&journal);
            glommio::spawn_local(async move {
                futures_util::StreamExt::for_each_concurrent(
                    futures_util::stream::iter(asked),
                    crate::limits::JOURNAL_RELEASE_CHECKPOINTS_IN_FLIGHT,
                    |partition| async move {
                        if let Err(error) = partition.checkpoint().await {
                            tracing::warn!(partition = ?partition.name(), %error,
                                "checkpoint failed");
                        }
                    },
                )
                .await;
                run.checkpointing.set(false);
            })
            .detach();
        }
        if files.file_base(needed) <= files.oldest_file() {
            // Nothing to release: the oldest file is pinned. Relocating its
            // live entries (when most held bytes are garbage) lets it go.
            if over_budget {
                self.relocate_journal(&journal, served);
            }
            return;
        }
        journal.releasing.set(true);
        let shard = self.shard;
        glommio::spawn_local(async move {
            let result = journal.shard.journal().release_below(needed).await;
            journal.releasing.set(false);
            match result {
                Ok(released) => {
                    let mut figures = journal.release.get();
                    figures.released_files += released.files as u64;
                    figures.released_bytes += released.bytes;
                    journal.release.set(figures);
                    // Entries of deleted queues' handles that lay there.
                    journal.routed.borrow_mut().values_mut().for_each(|entries| {
                        entries.retain(|entry| entry.position >= released.oldest);
                    });
                    tracing::debug!(
                        shard = shard.0,
                        needed = needed.0,
                        files = released.files,
                        bytes = released.bytes,
                        oldest = released.oldest.0,
                        "journal files released"
                    );
                }
                Err(error) => {
                    tracing::warn!(shard = shard.0, needed = needed.0, %error,
                        "journal release failed; the next pass tries again");
                }
            }
        })
        .detach();
    }

    /// Starts a relocation pass (`partition::relocate_pass`) of the oldest
    /// journal file unless one is running: paced by
    /// [`JOURNAL_RELOCATE_BYTES_PER_PASS`] per release interval, its file
    /// released by a later release pass.
    ///
    /// [`JOURNAL_RELOCATE_BYTES_PER_PASS`]: crate::limits::JOURNAL_RELOCATE_BYTES_PER_PASS
    pub(super) fn relocate_journal(&self, journal: &Rc<ShardJournalRun>, served: Vec<Rc<Served>>) {
        if journal.relocating.get() {
            return;
        }
        journal.relocating.set(true);
        let journal = journal.clone();
        let ratio_max = self.config.journal_garbage_ratio_max.get();
        let shard = self.shard;
        glommio::spawn_local(async move {
            let partitions: Vec<Rc<ShardPartition>> =
                served.iter().map(|entry| entry.partition.clone()).collect();
            drop(served);
            let result = crate::partition::relocate_pass(
                journal.shard.journal(),
                &partitions,
                ratio_max,
                crate::limits::JOURNAL_RELOCATE_BYTES_PER_PASS,
            )
            .await;
            journal.relocating.set(false);
            match result {
                Ok(pass) => {
                    let mut figures = journal.release.get();
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    {
                        figures.garbage_ratio_millionths = (pass.garbage_ratio * 1e6) as u64;
                    }
                    if pass.file.is_some() {
                        figures.relocation_passes += 1;
                        figures.relocated_entries += pass.copied_entries;
                        figures.relocated_bytes += pass.copied_bytes;
                        figures.relocation_dropped_entries += pass.dropped_entries;
                        tracing::debug!(
                            shard = shard.0,
                            file = pass.file.map_or(0, |file| file.0),
                            ratio = pass.garbage_ratio,
                            copied = pass.copied_entries,
                            bytes = pass.copied_bytes,
                            dropped = pass.dropped_entries,
                            remaining = pass.remaining,
                            checkpoints = pass.checkpoints,
                            "journal relocation pass"
                        );
                    }
                    journal.release.set(figures);
                }
                Err(error) => {
                    tracing::warn!(shard = shard.0, %error,
                        "journal relocation failed; the next pass tries again");
                }
            }
        })
        .detach();
    }

    /// The journal figures for `report`: files held, the live bytes the
    /// open partitions index (per file, to count the files that hold none)
    /// and what the release passes did.
    pub(super) fn journal_report(&self, journal: &ShardJournalRun) -> JournalReport {
        let files = journal.shard.journal();
        let mut live: BTreeMap<JournalPos, u64> = BTreeMap::new();
        for served in self.partitions.borrow().values() {
            let part = served.partition.log().journal();
            part.indexed_bytes_by_file(|position| files.file_base(position), &mut live);
        }
        let count = files.file_count() as u64;
        let newest = files.newest_file();
        let held_with_live = live.keys().filter(|base| **base != newest).count() as u64;
        JournalReport {
            files: count,
            file_bytes: count * journal.file_bytes,
            live_bytes: live.values().sum(),
            files_without_live_bytes: count.saturating_sub(1).saturating_sub(held_with_live),
            witnesses: files.stats().witnesses,
            ..journal.release.get()
        }
    }

    /// Closes the shard journal once its partitions are closed: everything
    /// queued becomes durable, then its committers stop.
    pub(super) async fn close_journal(&self) {
        let journal = self.journal.borrow_mut().take();
        if let Some(journal) = journal {
            journal.shard.close();
            let task = journal.task.borrow_mut().take();
            if let Some(task) = task {
                task.await;
            }
            if let Some(reason) = journal.shard.journal().failure() {
                tracing::error!(shard = self.shard.0, %reason, "shard journal failed");
            }
        }
    }
}
