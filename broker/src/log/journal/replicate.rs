//! The replication side of [`JournalPartition`]
//! (`docs/design/shard-journal.md` §14): appending an entry at a given
//! (index, term) as a follower does, cancelling an uncommitted suffix, the
//! committed index and its commit markers, reading entries back by index
//! (§14.5), and the entry log's accessors.
//!
//! The partition's own appends, reads and retention live in `partition.rs`;
//! the pure entry bookkeeping (indexes, terms, what is committed) in
//! `entry_log.rs`. This file only drives that bookkeeping against the
//! shard's journal: it waits for tickets and appends markers.

use spool_wire::batch::{BatchHeader, BatchKind};

use super::appender::EntryMeta;
use super::entry::{Marker, ENTRY_HEADER_BYTES};
use super::entry_log::{Cancelled, Located, LogMode};
use super::error::{JournalDamage, JournalError};
use super::partition::{check_appendable, JournalAppended, JournalPartition};
use super::JournalPos;
use crate::io::Storage;
use crate::limits::READ_BYTES_MAX;
use crate::log::{Offset, ReadBatch};

/// One entry of a partition's log read back by index: its index, its term
/// and its batch exactly as appended at them (a leader's own append as
/// stamped, a follower's as its leader sent it).
#[derive(Clone, Debug)]
pub struct IndexedEntry {
    pub index: u64,
    pub term: u64,
    pub batch: ReadBatch,
}

impl<S: Storage> JournalPartition<S> {
    /// Appends `batch` as the entry (`index`, `term`) of this partition's
    /// log, as a follower appends what its leader sent
    /// (`docs/design/shard-journal.md` §14.2): the leader's bytes as they
    /// are (offsets and epoch already stamped, crcs checked), a data
    /// batch's base offset continuing this partition's offsets exactly.
    /// `index` must be the next one: a conflicting suffix is cancelled
    /// first with [`truncate_from`](Self::truncate_from). Durable with the
    /// shard's group commit, as any append; `wanted: false` lets it ride
    /// the next cycle someone waits for.
    ///
    /// # Errors
    /// [`JournalError::IndexGap`], [`JournalError::TermBehind`],
    /// [`JournalError::OffsetMismatch`], [`JournalError::Truncating`],
    /// [`JournalError::UncommittedFull`], and those of
    /// [`append`](Self::append). On an error nothing is queued.
    pub fn append_at(
        &self,
        index: u64,
        term: u64,
        batch: &[u8],
        wanted: bool,
    ) -> Result<JournalAppended, JournalError> {
        let header = BatchHeader::verify(batch).map_err(JournalError::InvalidBatch)?;
        check_appendable(&header, batch)?;
        let mut state = self.state.borrow_mut();
        if state.closed {
            return Err(JournalError::Closed);
        }
        state.log.settle();
        state.log.check_append(index, term)?;
        if header.kind == BatchKind::Data && header.base_offset != state.next_offset {
            return Err(JournalError::OffsetMismatch {
                expected: state.next_offset,
                got: header.base_offset,
            });
        }
        let meta = EntryMeta { entry_index: index, term };
        let appended = self.queue(&mut state, &header, meta, batch.into(), wanted)?;
        state.term = state.term.max(term);
        Ok(appended)
    }

    /// Cancels this partition's log from entry `from` on
    /// (`docs/design/shard-journal.md` §14.3): waits until every entry of
    /// that suffix is durable (appends are refused meanwhile with
    /// [`JournalError::Truncating`]), appends a truncation marker and waits
    /// for it, then drops the suffix — its data offsets are taken again by
    /// the next data append. A crash before the marker is durable keeps
    /// the suffix; after, recovery drops it whatever follows. Returns what
    /// was cancelled (nothing when `from` is the next index).
    ///
    /// # Errors
    /// [`JournalError::TruncateCommitted`] at or below the committed index
    /// (or the commit target), [`JournalError::IndexGap`] past the next
    /// index, [`JournalError::Truncating`], [`JournalError::Closed`], and
    /// the journal's failure: then nothing was cancelled.
    pub async fn truncate_from(&self, from: u64) -> Result<Cancelled, JournalError> {
        let waits = {
            let mut state = self.state.borrow_mut();
            if state.closed {
                return Err(JournalError::Closed);
            }
            state.settle();
            match state.log.begin_truncate(from)? {
                Some(waits) => waits,
                None => return Ok(Cancelled { entries: 0, data_from: None }),
            }
        };
        let marked = async {
            for ticket in &waits {
                ticket.durable().await?;
            }
            let term = self.state.borrow().term;
            let meta = EntryMeta { entry_index: from, term };
            let marker =
                self.shard.journal().append_marker(self.handle, Marker::Truncate, meta, true)?;
            marker.durable().await
        };
        if let Err(error) = marked.await {
            self.state.borrow_mut().log.abort_truncate();
            return Err(error);
        }
        let mut state = self.state.borrow_mut();
        let cancelled = state.log.finish_truncate(from);
        if let Some(data_from) = cancelled.data_from {
            state.pending.retain(|pending| pending.first_offset < data_from);
            let cut = state.index.partition_point(|entry| entry.first_offset < data_from);
            state.index.truncate(cut);
            state.next_offset = data_from;
            state.start_offset = state.start_offset.min(data_from);
        }
        Ok(cancelled)
    }

    /// Records that this partition's log is committed up to `index`
    /// (replicated mode: on a quorum); the committed index follows as far
    /// as the entries are durable here, and a commit marker carrying it is
    /// appended (deferred: it rides the next commit) when it moved and no
    /// earlier marker is still queued. Returns the committed index now.
    ///
    /// # Errors
    /// [`JournalError::NotReplicated`], [`JournalError::CommitPastLog`],
    /// and those of the journal's append (the index is taken; only its
    /// marker is not).
    pub fn set_committed(&self, index: u64) -> Result<u64, JournalError> {
        let mut state = self.state.borrow_mut();
        state.log.set_commit_target(index)?;
        state.settle();
        let committed = state.log.committed();
        let marker_queued =
            state.commit_marker.as_ref().is_some_and(|ticket| ticket.status().is_none());
        if committed > state.commit_marked && !marker_queued {
            let meta = EntryMeta { entry_index: committed, term: state.term };
            let ticket =
                self.shard.journal().append_marker(self.handle, Marker::Commit, meta, false)?;
            state.commit_marked = committed;
            state.commit_marker = Some(ticket);
        }
        Ok(committed)
    }

    /// Makes the committed index durable now: appends a commit marker for
    /// it (unless one is) and waits for it.
    ///
    /// # Errors
    /// [`JournalError::NotReplicated`] in local mode, and the journal's.
    pub async fn persist_committed(&self) -> Result<u64, JournalError> {
        let (committed, ticket) = {
            let mut state = self.state.borrow_mut();
            if state.log.mode() != LogMode::Replicated {
                return Err(JournalError::NotReplicated);
            }
            state.settle();
            let committed = state.log.committed();
            let queued = state.commit_marker.clone().filter(|_| state.commit_marked == committed);
            let ticket = match queued {
                Some(ticket) => Some(ticket),
                None if committed > state.commit_marked => {
                    let meta = EntryMeta { entry_index: committed, term: state.term };
                    let ticket = self.shard.journal().append_marker(
                        self.handle,
                        Marker::Commit,
                        meta,
                        true,
                    )?;
                    state.commit_marked = committed;
                    state.commit_marker = Some(ticket.clone());
                    Some(ticket)
                }
                None => None,
            };
            (committed, ticket)
        };
        if let Some(ticket) = ticket {
            ticket.durable().await?;
        }
        Ok(committed)
    }

    /// Reads the entries of this replicated partition's log from `low`, in
    /// index order, data and control alike (`docs/design/shard-journal.md`
    /// §14.5): up to `high` (exclusive; capped at the last index), as long
    /// as their batch bytes stay within `max_bytes` (the first entry is
    /// returned whatever its size), and stopping before the first entry
    /// not yet durable here. Committed entries and those above the
    /// committed index alike; after a reopen, what recovery found. The
    /// entries are as of the call: one above the committed index may be
    /// cancelled by a truncation while the caller holds it.
    ///
    /// # Errors
    /// [`JournalError::NotReplicated`] for a partition in local mode (its
    /// log keeps no positions by index);
    /// [`JournalError::Compacted`] below [`first_index`](Self::first_index)
    /// (naming it); [`JournalError::IndexPastLog`] past the last index;
    /// [`JournalError::EntryNotDurable`] when `low` is not durable yet
    /// (retry once it is); [`JournalError::ReadTooLarge`]; and the
    /// journal's read errors ([`JournalError::Corrupt`] with
    /// [`JournalDamage::EntryMismatch`] when the batch found is not the
    /// length appended).
    pub async fn read_entries(
        &self,
        low: u64,
        high: u64,
        max_bytes: u64,
    ) -> Result<Vec<IndexedEntry>, JournalError> {
        if max_bytes > READ_BYTES_MAX {
            return Err(JournalError::ReadTooLarge { max_bytes, limit_bytes: READ_BYTES_MAX });
        }
        let oldest = self.shard.journal.oldest_position();
        let located = {
            let mut state = self.state.borrow_mut();
            state.settle();
            state.log.release_below(oldest);
            state.log.locate(low, high, max_bytes)?
        };
        if located.is_empty() {
            return Ok(Vec::new());
        }
        let positions: Vec<_> = located.iter().map(|entry| entry.position).collect();
        let read_bytes = located.iter().map(|entry| u64::from(entry.batch_len)).sum::<u64>()
            + (ENTRY_HEADER_BYTES * located.len()) as u64;
        let batches = match self.shard.journal.read_entries(&positions, read_bytes).await {
            Ok(batches) => batches,
            Err(JournalError::BelowOldestFile { pos, oldest }) => {
                // A release passed the entries meanwhile.
                let mut state = self.state.borrow_mut();
                state.log.release_below(oldest);
                let first_index = state.log.first_held();
                if first_index <= low {
                    return Err(JournalError::BelowOldestFile { pos, oldest });
                }
                return Err(JournalError::Compacted { index: low, first_index });
            }
            Err(error) => return Err(error),
        };
        let mut entries = Vec::with_capacity(batches.len());
        for (batch, entry) in batches.into_iter().zip(&located) {
            if batch.header.batch_len != entry.batch_len
                || batch.bytes.len() != entry.batch_len as usize
            {
                return Err(self.entry_mismatch(entry, batch.header.batch_len));
            }
            entries.push(IndexedEntry { index: entry.index, term: entry.term, batch });
        }
        Ok(entries)
    }

    fn entry_mismatch(&self, entry: &Located, found_len: u32) -> JournalError {
        let detail = JournalDamage::EntryMismatch {
            index: entry.index,
            expected_len: entry.batch_len,
            found_len,
        };
        self.corrupt_at(entry.position, detail)
    }

    /// The lowest index [`read_entries`](Self::read_entries) serves now
    /// (replicated mode): the first committed entry still held — entries
    /// before what recovery found, in released journal files, or beyond
    /// the newest `LOG_HELD_ENTRIES_MAX` committed ones are not — or, when
    /// none is, the first above the committed index (`last_index + 1` for
    /// a log whose every entry is let go of).
    pub fn first_index(&self) -> u64 {
        let oldest = self.shard.journal.oldest_position();
        let mut state = self.state.borrow_mut();
        state.settle();
        state.log.release_below(oldest);
        state.log.first_held()
    }

    /// Where the first committed entry held at or after `index` lies
    /// (replicated mode; `None` when none is held from there: every entry
    /// from `index` on is above the committed index, or let go of): the
    /// journal position a replicated partition's log pins.
    pub fn held_position_from(&self, index: u64) -> Option<JournalPos> {
        self.settled(|state| state.log.held_position_from(index))
    }

    /// The (first index, term) runs over the committed entries held for
    /// reads by index (`first_index()..=committed_index()`), ascending.
    pub fn held_term_runs(&self) -> Vec<(u64, u64)> {
        let oldest = self.shard.journal.oldest_position();
        let mut state = self.state.borrow_mut();
        state.settle();
        state.log.release_below(oldest);
        state.log.held_term_runs()
    }

    /// The index of this partition's last entry (0: none yet).
    pub fn last_index(&self) -> u64 {
        self.state.borrow().log.last_index()
    }

    /// The committed index: every entry at or below it is durable here and
    /// (replicated mode) on a quorum; never cancelled.
    pub fn committed_index(&self) -> u64 {
        self.settled(|state| state.log.committed())
    }

    /// Every data offset below this is committed: in replicated mode on a
    /// quorum and durable here (what a leader may hand out to a claim), in
    /// local mode durable here.
    pub fn committed_offset(&self) -> Offset {
        self.settled(|state| Offset(state.log.uncommitted_data_from().unwrap_or(state.next_offset)))
    }

    /// The term of the entry at `index`, while the log knows it (the
    /// committed entry or one above it; in replicated mode also a committed
    /// entry still held for reads by index).
    pub fn term_at(&self, index: u64) -> Option<u64> {
        self.settled(|state| state.log.term_at(index))
    }

    /// Entries above the committed index (at most
    /// [`LOG_UNCOMMITTED_ENTRIES_MAX`](crate::limits::LOG_UNCOMMITTED_ENTRIES_MAX)
    /// in replicated mode).
    pub fn uncommitted_entries(&self) -> usize {
        self.settled(|state| state.log.uncommitted())
    }

    /// How this partition's committed index moves.
    pub fn log_mode(&self) -> LogMode {
        self.state.borrow().log.mode()
    }

    /// Sets the term this partition's own appends get from now on (a
    /// leader's term); never lowers it.
    pub fn raise_term(&self, term: u64) {
        let mut state = self.state.borrow_mut();
        state.term = state.term.max(term);
    }
}
