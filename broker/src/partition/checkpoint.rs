//! Checkpoints: when one falls due, and writing one in bounded steps while
//! the partition serves (a copy-on-write view of the state at the moment it
//! began), then deleting the log segments it lets go.

use std::cell::RefCell;

use super::files::{self, SideFileError, CHECKPOINT_FILE, CHECKPOINT_MAGIC};
use super::CHECKPOINT_INDEX_FLAG;
use super::{
    Partition, PartitionError, CHECKPOINT_INTERVAL_BYTES, CHECKPOINT_INTERVAL_HELD_DIVISOR,
    CHECKPOINT_INTERVAL_OFFSETS, CHECKPOINT_STEP_BYTES_MAX, CHECKPOINT_STEP_ENTRIES,
};
use crate::io::{IoOp, Storage};
use crate::log::journal::JournalPos;
use crate::log::{FatalCode, FatalReason, LogError};
use crate::queue::{Offset, PartitionState};

/// Set in a checkpoint's control cursor word, beside
/// [`CHECKPOINT_INDEX_FLAG`](super::CHECKPOINT_INDEX_FLAG), when the log's start follows the entry index
/// (8 more bytes): the position of the snapshot install the partition's
/// log starts at (`docs/design/replication.md` §6), carried by every
/// checkpoint after that install.
pub const CHECKPOINT_START_FLAG: u64 = 1 << 62;
/// Set in a checkpoint's control cursor word when the term of its entry
/// index follows the entry index (8 more bytes, before the log's start): a
/// replicated partition's log can then let go of that entry too, its
/// reopen taking the term from here.
pub const CHECKPOINT_TERM_FLAG: u64 = 1 << 61;
const CHECKPOINT_FLAGS: u64 = CHECKPOINT_INDEX_FLAG | CHECKPOINT_START_FLAG | CHECKPOINT_TERM_FLAG;

/// What a journal checkpoint's payload starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPrefix {
    /// The control cursor `c_p`.
    pub control: u64,
    /// The last entry index of the log at the checkpoint (0: none, or a
    /// checkpoint from before entry indexes).
    pub entry_index: u64,
    /// The term of that entry (replicated partitions' checkpoints).
    pub entry_term: Option<u64>,
    /// The install the log starts at (`None`: none).
    pub log_start: Option<u64>,
}

impl CheckpointPrefix {
    /// The prefix's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut word = self.control | CHECKPOINT_INDEX_FLAG;
        if self.log_start.is_some() {
            word |= CHECKPOINT_START_FLAG;
        }
        if self.entry_term.is_some() {
            word |= CHECKPOINT_TERM_FLAG;
        }
        let mut prefix = word.to_le_bytes().to_vec();
        prefix.extend_from_slice(&self.entry_index.to_le_bytes());
        if let Some(term) = self.entry_term {
            prefix.extend_from_slice(&term.to_le_bytes());
        }
        if let Some(log_start) = self.log_start {
            prefix.extend_from_slice(&log_start.to_le_bytes());
        }
        prefix
    }

    /// The prefix of a checkpoint's `payload`, and the snapshot after it.
    ///
    /// # Errors
    /// A payload shorter than the prefix it declares.
    pub fn decode(payload: &[u8]) -> Result<(CheckpointPrefix, &[u8]), String> {
        let word = |bytes: &[u8]| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
        };
        let short = |what: &str| format!("checkpoint shorter than its {what}");
        let control = word(payload).ok_or_else(|| short("control cursor"))?;
        // A checkpoint written before entry indexes holds the control
        // cursor alone (a journal position: top bits clear).
        if control & CHECKPOINT_INDEX_FLAG == 0 {
            let prefix =
                CheckpointPrefix { control, entry_index: 0, entry_term: None, log_start: None };
            return Ok((prefix, &payload[8..]));
        }
        let entry_index = word(&payload[8..]).ok_or_else(|| short("entry index"))?;
        let mut prefix = CheckpointPrefix {
            control: control & !CHECKPOINT_FLAGS,
            entry_index,
            entry_term: None,
            log_start: None,
        };
        let mut rest = &payload[16..];
        if control & CHECKPOINT_TERM_FLAG != 0 {
            prefix.entry_term = Some(word(rest).ok_or_else(|| short("entry term"))?);
            rest = &rest[8..];
        }
        if control & CHECKPOINT_START_FLAG != 0 {
            prefix.log_start = Some(word(rest).ok_or_else(|| short("log start"))?);
            rest = &rest[8..];
        }
        Ok((prefix, rest))
    }
}

/// What one checkpoint cost: it was written in `steps` steps of at most
/// `max_step_entries` table entries each, yielding the shard between them;
/// `touched` messages changed while it was written (their before-images
/// were held until it ended). `bytes` is the checkpoint's snapshot; the
/// sealed dedupe generations it refers to are `generations`, of which it
/// wrote `generation_files` new files of `generation_bytes` payload bytes
/// (each sealed generation is written once: `dedupe_files.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStats {
    pub covers: Offset,
    pub steps: u64,
    pub max_step_entries: usize,
    pub bytes: u64,
    pub touched: usize,
    pub generations: usize,
    pub generation_files: u64,
    pub generation_bytes: u64,
}

/// Ends the state's snapshot capture however a checkpoint ends (done,
/// failed, or its future dropped), so before-images are never held on.
struct CaptureGuard<'a>(&'a RefCell<PartitionState>);

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.try_borrow_mut() {
            state.end_snapshot();
        }
    }
}

/// Offsets appended after a checkpoint that make the next one due, for a
/// partition holding `held` messages (both lanes): at least
/// [`CHECKPOINT_INTERVAL_OFFSETS`], and at least `held /`
/// [`CHECKPOINT_INTERVAL_HELD_DIVISOR`], so the snapshot entries written
/// per appended offset stay bounded however deep the backlog is.
pub fn checkpoint_interval_offsets(held: u64) -> u64 {
    CHECKPOINT_INTERVAL_OFFSETS.max(held / CHECKPOINT_INTERVAL_HELD_DIVISOR)
}

impl<S: Storage + Clone> Partition<S> {
    /// Whether enough log has been written since the last checkpoint: either
    /// [`checkpoint_interval_offsets`] offsets (for what the state holds
    /// now) or [`CHECKPOINT_INTERVAL_BYTES`] bytes.
    pub fn checkpoint_due(&self) -> bool {
        // A replicated partition's only while its state covers its whole
        // log (`replicated.rs`, "Checkpoints").
        self.replica_checkpointable()
            && !self.checkpoint_running.get()
            && !self.sync_failed.get()
            && !self.closed.get()
            && {
                let growth = self.log.growth_since(self.checkpoint_covers.get());
                growth.offsets > 0
                    && (growth.bytes >= CHECKPOINT_INTERVAL_BYTES
                        || growth.offsets
                            >= checkpoint_interval_offsets(self.state.borrow().held_messages()))
            }
    }

    /// Writes a checkpoint of the current state once everything it covers is
    /// durable, then deletes log segments below the retention watermark.
    ///
    /// A failed write (a full disk) leaves the previous checkpoint in place
    /// and its temporary file unnamed (the next checkpoint starts a new one).
    /// A failed fdatasync or directory sync is never retried: what reached
    /// the disk is unknown, so the fatal handler is told
    /// ([`FatalCode::SideFileSyncFailed`]; production exits) and this
    /// partition writes no checkpoint again.
    ///
    /// # Errors
    /// Storage failure (the previous checkpoint is then intact, unless a
    /// sync failed after the rename).
    /// A closed partition takes no checkpoint (`Ok(None)`): its final one
    /// was written by [`Partition::close`], and its directory may be gone.
    pub async fn checkpoint(&self) -> Result<Option<Offset>, PartitionError> {
        if self.closed.get() {
            return Ok(None);
        }
        self.run_checkpoint().await
    }

    /// [`Partition::close`]'s final checkpoint, after any running one ended
    /// (none for a replicated partition: its entries may not all be
    /// committed, and its next open replays from the last one).
    pub(super) async fn final_checkpoint(&self) -> Result<Option<Offset>, PartitionError> {
        while self.checkpoint_running.get() {
            self.checkpoint_ended.wait().await;
        }
        if self.replica.is_some() {
            return Ok(None);
        }
        self.run_checkpoint().await
    }

    async fn run_checkpoint(&self) -> Result<Option<Offset>, PartitionError> {
        if self.sync_failed.get() {
            return Err(PartitionError::CheckpointsStopped { dir: self.dir.clone() });
        }
        if self.checkpoint_running.replace(true) {
            return Ok(None);
        }
        let result = self.checkpoint_inner().await;
        self.checkpoint_running.set(false);
        self.checkpoint_ended.notify_all();
        if let Err(PartitionError::Log(LogError::Io(error))) = &result {
            if matches!(error.op, IoOp::Sync | IoOp::SyncDir) {
                self.sync_failed.set(true);
                self.fatal.fatal(&FatalReason {
                    code: FatalCode::SideFileSyncFailed,
                    message: format!("checkpoint of {}: {error}", self.dir.display()),
                });
            }
        }
        result
    }

    async fn checkpoint_inner(&self) -> Result<Option<Offset>, PartitionError> {
        // Every event before the mark is applied and none after it (appends
        // assign their place and apply without an await between), so the
        // state now is the fold of the log up to the mark. From here the
        // state records what each message held before its first change, and
        // the steps below write the state as it is now while requests go on.
        // The snapshot records the data offset it covers; the side file the
        // cursor's value (the scan start; the control cursor leads the
        // payload: `log.rs`). A replicated partition's state must cover its
        // whole log here (checked in the same synchronous section), and the
        // checkpoint is put in place only once that log is committed.
        if !self.replica_checkpointable() {
            return Ok(None);
        }
        let covered = self.replica.as_ref().map(|_| {
            let part = self.log.journal();
            (part.last_index(), part.term_at(part.last_index()).unwrap_or(0))
        });
        let mark = self.log.mark();
        // The open attribution, if any, lies before the mark: it must not
        // grow over records after it (replay from the checkpoint would not
        // read it again), so the next batch gets an event of its own.
        self.attribution.borrow_mut().take();
        let covers = mark.data_offset();
        let mut encoder = self.state.borrow_mut().begin_snapshot(covers);
        let _capture = CaptureGuard(&self.state);
        let barrier = self.appends.borrow().barrier();
        // Sealed dedupe generations are written once each, as their own
        // side files, before the checkpoint that refers to them.
        let referred = self.refer_dedupe_generations(&mut encoder).await.map_err(LogError::Io)?;
        let mut writer = files::SideFileWriter::create(&self.storage, &self.dir, CHECKPOINT_FILE)
            .await
            .map_err(LogError::Io)?;
        let oldest_live = self.state.borrow().retention_watermark();
        let oldest_live_covered = oldest_live;
        let end = self.log.resolve(mark, oldest_live).await?;
        let prefix = self.log.checkpoint_prefix(end);
        if !prefix.is_empty() {
            writer.write(&prefix).await.map_err(LogError::Io)?;
        }
        let mut out = Vec::with_capacity(CHECKPOINT_STEP_BYTES_MAX);
        loop {
            out.clear();
            let done = self
                .state
                .borrow()
                .snapshot_step(&mut encoder, CHECKPOINT_STEP_ENTRIES, &mut out)
                .map_err(|error| SideFileError::Invalid {
                    path: self.dir.join(CHECKPOINT_FILE),
                    reason: format!("snapshot not written: {error}"),
                })?;
            writer.write(&out).await.map_err(LogError::Io)?;
            if done {
                break;
            }
            // Let the shard serve between steps.
            futures_lite::future::yield_now().await;
        }
        drop(out);
        let touched = self.state.borrow().snapshot_touched();
        self.state.borrow_mut().end_snapshot();
        barrier.durable().await?;
        if let Some((index, term)) = covered {
            if !self.checkpoint_committed(index, term).await {
                tracing::debug!(partition = ?self.name, index, "checkpoint dropped: not committed");
                return Ok(None);
            }
        }
        writer
            .finish(&self.storage, CHECKPOINT_MAGIC, end.to_checkpoint())
            .await
            .map_err(LogError::Io)?;
        self.checkpoint_covers.set(end);
        if let Some((index, term)) = covered {
            self.offer_snapshot(index, Some(term));
        }
        self.last_checkpoint.set(Some(CheckpointStats {
            covers,
            steps: encoder.steps(),
            max_step_entries: encoder.max_step_entries(),
            bytes: encoder.bytes(),
            touched,
            generations: referred.references.len(),
            generation_files: referred.written_files,
            generation_bytes: referred.written_bytes,
        }));
        // The new checkpoint is in place and its directory synced: the
        // generation files only older checkpoints referred to can go.
        super::dedupe_files::remove_unreferenced(&self.storage, &self.dir, &referred.references)
            .await
            .map_err(LogError::Io)?;
        // Records below the oldest live one and the checkpoint leave the
        // data index (a replicated partition's log entries stay readable by
        // index until its log pin moves past them: `journal_pin`). A
        // replicated leader's state now may hold acks not yet committed: a
        // rebuild from this checkpoint (`Partition::rebuild`) would make
        // their records live again, so it cuts below the checkpoint's own
        // oldest live record (its entries all committed) instead.
        let oldest_live = match self.replica {
            None => self.state.borrow().retention_watermark(),
            Some(_) => oldest_live_covered,
        };
        let deleted = self.log.delete_below(oldest_live, end).await?;
        tracing::debug!(
            partition = ?self.name,
            covers = covers.0,
            steps = encoder.steps(),
            bytes = encoder.bytes(),
            touched,
            deleted,
            "checkpoint written"
        );
        Ok(Some(covers))
    }

    /// The least journal position this partition needs now: its durable
    /// checkpoint's scan start (what its recovery replays from; 0 without a
    /// checkpoint) or the oldest data entry it still indexes (what reads of
    /// its live records need), whichever is lower.
    ///
    /// A replicated partition also pins its log's entries from the last
    /// one that is both held by every member and covered by its durable
    /// checkpoint (a reopen needs that entry's term), and first lets raft-rs's view go of the entries
    /// below it ([`Partition::replicated_log_pin`]).
    pub fn journal_pin(&self) -> JournalPos {
        let scan = JournalPos(self.checkpoint_covers.get().to_checkpoint());
        let pin = self.log.journal().oldest_indexed().map_or(scan, |oldest| oldest.min(scan));
        match self.replica {
            None => pin,
            Some(_) => pin.min(self.replicated_log_pin()),
        }
    }

    /// Whether a checkpoint taken now would let go of a
    /// journal file this partition pins: the scan start it would record
    /// (its oldest live record's entry, else the durable watermark) lies in
    /// a later file than [`Partition::journal_pin`]. An idle partition's
    /// checkpoint is never due by growth, so the shard asks for one when
    /// this holds; a partition pinned by an old live record answers false
    /// (a checkpoint would not move it).
    pub fn journal_checkpoint_frees(&self) -> bool {
        if self.checkpoint_running.get() || self.sync_failed.get() || self.closed.get() {
            return false;
        }
        let (part, pin) = (self.log.journal(), self.journal_pin());
        let journal = part.shard().journal();
        let (control_end, last_control) = part.control_mark();
        let mut control = control_end.max(journal.durable_position());
        if let Some((ticket, entry_len)) = last_control {
            match ticket.position() {
                Some(position) => control = control.max(JournalPos(position.0 + entry_len)),
                // Its place is not known yet: ask again next time.
                None => return false,
            }
        }
        let next = part.next_offset();
        let needed = self.state.borrow().retention_watermark().map_or(next, |live| live.min(next));
        let mut after =
            part.lowest_position_from(needed).map_or(control, |position| position.min(control));
        if let Some(driver) = self.log.driver() {
            // A checkpoint now covers the log's last entry (and records its
            // term): the log would pin from the group floor on, or from
            // after that entry when every member holds it.
            let last = part.last_index();
            let floor = driver.group_floor().min(last);
            let from = if floor >= last { last + 1 } else { floor };
            if let Some(position) = part.held_position_from(from) {
                after = after.min(position);
            }
        }
        journal.file_base(after) > journal.file_base(pin)
    }

    /// What the newest checkpoint written by this process cost.
    pub fn last_checkpoint(&self) -> Option<CheckpointStats> {
        self.last_checkpoint.get()
    }
}
