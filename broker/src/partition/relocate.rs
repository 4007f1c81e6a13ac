//! Journal layout: relocation (`docs/design/shard-journal.md` §6, "Built:
//! relocation"). When most of the journal files a shard holds carry no
//! live record, the live data entries of its oldest file are appended
//! again at the head (relocated copies: same offsets, data only) and the
//! entries nobody needs are dropped from the partitions' indexes, so the
//! file stops pinning the journal and the shard's release pass can remove
//! it (after a checkpoint that records the copies as the scan start).
//!
//! Only records a durable checkpoint covers are copied or dropped: replay
//! never applies them as events (their state is in the checkpoint, acks
//! and every other control entry after it are replayed from its control
//! cursor), so a copy can neither resurrect an acked message nor deliver a
//! record twice; a partition whose records in the file lie past its
//! checkpoint is asked for one first.

use std::rc::Rc;

use super::{Partition, PartitionError};
use crate::io::Storage;
use crate::limits::{JOURNAL_RELOCATE_ENTRIES_PER_PASS, JOURNAL_RELOCATE_YIELD_ENTRIES};
use crate::log::journal::{Journal, JournalError, JournalPos, ENTRY_HEADER_BYTES};
use crate::queue::Offset;

/// What one partition's relocation step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelocateStep {
    /// Live data entries appended again at the head, and their entry bytes.
    pub copied_entries: u64,
    pub copied_bytes: u64,
    /// Index entries dropped: none of their records is held any more.
    pub dropped_entries: u64,
    /// Entries left in the range (over budget, past the checkpoint, or
    /// refused by back-pressure): a later step takes them.
    pub remaining: u64,
    /// Some entries hold records past the durable checkpoint: a checkpoint
    /// must be written before they can move.
    pub needs_checkpoint: bool,
}

/// What one shard relocation pass did ([`relocate_pass`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RelocatePass {
    /// The journal file relocated from (`None`: the garbage ratio did not
    /// call for a pass, or only one file is held).
    pub file: Option<JournalPos>,
    /// The garbage ratio that was measured (share of held bytes, the newest
    /// file aside, not holding a live record).
    pub garbage_ratio: f64,
    pub copied_entries: u64,
    pub copied_bytes: u64,
    pub dropped_entries: u64,
    pub remaining: u64,
    /// Checkpoints written so that records could move.
    pub checkpoints: u64,
}

impl<S: Storage + Clone> Partition<S> {
    /// Journal layout: relocates this partition's indexed data entries
    /// whose position lies in `[from, to)` (one journal file): an entry
    /// with a record the state still holds is copied to the head (at most
    /// `budget_bytes` of them, at least one), one without is dropped from
    /// the index. Entries with a record past the durable checkpoint stay
    /// (`needs_checkpoint`). Nothing for a closed partition.
    ///
    /// # Errors
    /// A read of an entry that fails, or a journal that failed.
    pub async fn journal_relocate(
        &self,
        from: JournalPos,
        to: JournalPos,
        budget_bytes: u64,
    ) -> Result<RelocateStep, PartitionError> {
        let mut step = RelocateStep::default();
        let part = self.log.journal();
        // A replicated partition's copies are its own (not log entries:
        // no index), as on one node; its log's entries stay where they are
        // until its log pin passes them (`journal_pin`).
        if self.closed.get() {
            return Ok(step);
        }
        let entries = part.indexed_in(from, to);
        for (seen, entry) in entries.iter().enumerate() {
            if seen >= JOURNAL_RELOCATE_ENTRIES_PER_PASS {
                step.remaining += (entries.len() - seen) as u64;
                break;
            }
            if seen > 0 && seen % JOURNAL_RELOCATE_YIELD_ENTRIES == 0 {
                futures_lite::future::yield_now().await;
            }
            if self.closed.get() {
                step.remaining += 1;
                continue;
            }
            // Read now: a checkpoint may have ended while this step yielded.
            let covers = self.checkpoint_covers.get().data_offset();
            if entry.end_offset() > covers.0 {
                step.needs_checkpoint = true;
                step.remaining += 1;
                continue;
            }
            let (first, end) = (Offset(entry.first_offset), Offset(entry.end_offset()));
            // A replicated leader's state may hold acks not yet committed
            // (a rebuild would make their records live again): it forgets
            // records only while its whole log is committed.
            let settled = self.replica.is_none() || part.uncommitted_entries() == 0;
            if !self.state.borrow().holds_any(first, end) {
                if !settled {
                    step.remaining += 1;
                    continue;
                }
                if part.forget(first) {
                    step.dropped_entries += 1;
                }
                continue;
            }
            let len = ENTRY_HEADER_BYTES as u64 + u64::from(entry.batch_len);
            if step.copied_entries > 0 && step.copied_bytes + len > budget_bytes {
                step.remaining += 1;
                continue;
            }
            let batch = part.shard().journal().read(entry.position).await?;
            match part.relocate(entry, &batch.bytes) {
                Ok(_) => {
                    step.copied_entries += 1;
                    step.copied_bytes += len;
                }
                // The data lane is full: producers first, the rest later.
                Err(JournalError::Backpressure { .. }) => {
                    step.remaining += 1;
                    break;
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(step)
    }
}

/// The share of the journal files held below the newest one that carries
/// no live record: 1 − (record bytes the partitions hold) / (bytes of those
/// files), clamped to [0, 1]; 0 when only the newest file is held.
pub fn garbage_ratio<S: Storage + Clone>(
    journal: &Journal<S>,
    partitions: &[Rc<Partition<S>>],
) -> f64 {
    let held = journal.newest_file().0.saturating_sub(journal.oldest_file().0);
    if held == 0 {
        return 0.0;
    }
    let live: u64 = partitions.iter().map(|p| p.with_state(|state| state.held_bytes())).sum();
    #[allow(clippy::cast_precision_loss)] // a ratio: precision to spare
    let ratio = 1.0 - live as f64 / held as f64;
    ratio.clamp(0.0, 1.0)
}

/// One relocation pass of a shard (journal layout): when the garbage ratio
/// of the files it holds passes `garbage_ratio_max`, relocates the live
/// data entries of the oldest file (at most `budget_bytes` of copies over
/// all `partitions`, which must be every partition of the shard, open),
/// drops the entries nobody needs, and writes a checkpoint of each
/// partition whose records in the file lie past its checkpoint. The file
/// itself goes at a later release pass, once the copies are durable and
/// each partition's checkpoint records them (the shard's pass asks for
/// that checkpoint: [`Partition::journal_checkpoint_frees`]).
///
/// # Errors
/// The first partition step that fails (a read or the journal); failed
/// checkpoints are logged and retried at the next pass.
pub async fn relocate_pass<S: Storage + Clone>(
    journal: &Journal<S>,
    partitions: &[Rc<Partition<S>>],
    garbage_ratio_max: f64,
    budget_bytes: u64,
) -> Result<RelocatePass, PartitionError> {
    let mut pass = RelocatePass {
        garbage_ratio: garbage_ratio(journal, partitions),
        ..RelocatePass::default()
    };
    if pass.garbage_ratio <= garbage_ratio_max {
        return Ok(pass);
    }
    let from = journal.oldest_file();
    let Some(to) = journal.next_file(from) else { return Ok(pass) };
    pass.file = Some(from);
    for partition in partitions {
        let left = budget_bytes.saturating_sub(pass.copied_bytes);
        if left == 0 {
            break;
        }
        let step = partition.journal_relocate(from, to, left).await?;
        pass.copied_entries += step.copied_entries;
        pass.copied_bytes += step.copied_bytes;
        pass.dropped_entries += step.dropped_entries;
        pass.remaining += step.remaining;
        if step.needs_checkpoint {
            match partition.checkpoint().await {
                Ok(Some(_)) => pass.checkpoints += 1,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(partition = ?partition.name(), %error,
                        "checkpoint for a journal relocation failed; the next pass tries again");
                }
            }
        }
    }
    Ok(pass)
}
