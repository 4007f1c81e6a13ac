//! The release side of [`JournalPartition`]: what the shard's journal
//! release and relocation passes, its checkpoints and its claims ask of one
//! partition — where its live entries lie (the oldest it still reads, its
//! live bytes per journal file, the lowest position from an offset, the
//! position of an offset), dropping index entries (retention below a
//! watermark, entries no longer needed), and relocated copies of its data
//! entries, which the index follows once durable
//! (`docs/design/shard-journal.md` §6).
//!
//! What it must not do: remove or relocate journal files itself (the
//! journal's `retention.rs` and the shard's owner do), or decide what is
//! live: the caller names the watermark and the entries to let go.

use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::proto::Offset;

use super::appender::EntryMeta;
use super::entry::ENTRY_HEADER_BYTES;
use super::error::JournalError;
use super::partition::{JournalPartition, Relocating};
use super::route::{relocated_field, JournalIndexEntry};
use super::{JournalPos, JournalTicket, Lane};
use crate::io::Storage;

impl<S: Storage> JournalPartition<S> {
    /// Drops from the index every data entry whose every offset is below
    /// `watermark`; reads below the new start then fail with
    /// [`JournalError::OffsetOutOfRange`]. Returns how many were dropped.
    /// Journal files are not deleted here: the shard's release passes do
    /// that (`retention.rs`).
    ///
    /// # Errors
    /// None yet; the signature leaves room for an index kept on disk.
    #[allow(clippy::unused_async)]
    pub async fn delete_below(&self, watermark: Offset) -> Result<usize, JournalError> {
        let mut state = self.state.borrow_mut();
        state.settle();
        let cut = state.index.partition_point(|entry| entry.end_offset() <= watermark.0);
        if cut == 0 {
            return Ok(0);
        }
        state.start_offset = state.index[cut - 1].end_offset();
        state.index.drain(..cut);
        Ok(cut)
    }

    /// The journal position of the oldest data entry this partition still
    /// reads (the front of its index, or its oldest append a commit took
    /// but whose ticket has not resolved yet), or of its oldest entry above
    /// the committed index when lower: reads of its live records, and its
    /// log's uncommitted suffix, need every file from there on. `None` when
    /// it holds nothing.
    pub fn oldest_indexed(&self) -> Option<JournalPos> {
        let mut state = self.state.borrow_mut();
        state.settle();
        // Relocated copies make positions not follow offsets.
        let indexed = state
            .index
            .iter()
            .map(|entry| entry.position)
            .min()
            .or_else(|| state.pending.front().and_then(|pending| pending.ticket.position()));
        // Entries above the committed index stay too (both lanes): a
        // leader may resend them, a follower cancel them.
        match (indexed, state.log.uncommitted_from()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Entry bytes (header and batch) of the data entries this partition
    /// still indexes, per journal file (keyed by the file's base position
    /// as `file_of` names it): what its live records hold on disk.
    pub fn indexed_bytes_by_file(
        &self,
        file_of: impl Fn(JournalPos) -> JournalPos,
        into: &mut std::collections::BTreeMap<JournalPos, u64>,
    ) {
        let mut state = self.state.borrow_mut();
        state.settle();
        for entry in &state.index {
            *into.entry(file_of(entry.position)).or_default() +=
                ENTRY_HEADER_BYTES as u64 + u64::from(entry.batch_len);
        }
    }

    /// The lowest journal position of the data entries holding `offset` or
    /// a later one (indexed, or appended and placed by a commit): what a
    /// recovery must scan from to index every record from `offset` on.
    /// Relocated copies make positions not follow offsets, so this is not
    /// the position of `offset`'s entry. `None` when there is none.
    pub fn lowest_position_from(&self, offset: Offset) -> Option<JournalPos> {
        let mut state = self.state.borrow_mut();
        state.settle();
        let first = state.index.partition_point(|entry| entry.end_offset() <= offset.0);
        let indexed = state.index[first..].iter().map(|entry| entry.position).min();
        let pending = state.pending.iter().find_map(|pending| pending.ticket.position());
        match (indexed, pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The indexed data entries whose position lies in `[from, to)` and
    /// that have no relocated copy in flight: what relocating that range of
    /// the journal has to copy or let go.
    pub fn indexed_in(&self, from: JournalPos, to: JournalPos) -> Vec<JournalIndexEntry> {
        let mut state = self.state.borrow_mut();
        state.settle();
        let state = &*state;
        // Entries above the committed index are never moved.
        let uncommitted = state.log.uncommitted_data_from().unwrap_or(u64::MAX);
        state
            .index
            .iter()
            .filter(|entry| entry.position >= from && entry.position < to)
            .filter(|entry| entry.end_offset() <= uncommitted)
            .filter(|entry| {
                !state.relocating.iter().any(|copy| copy.first_offset == entry.first_offset)
            })
            .copied()
            .collect()
    }

    /// Appends `batch`, the bytes of the durable data entry `entry` as read
    /// back (offsets and epoch stamped), again at the journal's head as a
    /// relocated copy (data lane, same offsets); once its commit is durable
    /// the index points at the copy. The caller must make sure replay
    /// never needs the records as events (a durable checkpoint covers
    /// them): a copy is data only.
    ///
    /// # Errors
    /// [`JournalError::InvalidBatch`] when `batch` is not `entry`'s batch,
    /// [`JournalError::Closed`], and those of [`Journal::append`].
    pub fn relocate(
        &self,
        entry: &JournalIndexEntry,
        batch: &[u8],
    ) -> Result<JournalTicket, JournalError> {
        let header = BatchHeader::verify(batch).map_err(JournalError::InvalidBatch)?;
        if header.kind != BatchKind::Data
            || header.base_offset != entry.first_offset
            || header.record_count != entry.record_count
            || header.batch_len != entry.batch_len
            || batch.len() != header.batch_len as usize
        {
            return Err(JournalError::NotAppendable("a relocated copy must be its entry's batch"));
        }
        let mut state = self.state.borrow_mut();
        if state.closed {
            return Err(JournalError::Closed);
        }
        let ticket = self.shard.journal.append_owned(
            Lane::Data,
            relocated_field(self.handle),
            EntryMeta::default(),
            batch.into(),
        )?;
        state.relocating.push(Relocating {
            first_offset: entry.first_offset,
            record_count: entry.record_count,
            ticket: ticket.clone(),
        });
        Ok(ticket)
    }

    /// Drops the index entry starting at `first_offset` (none of its
    /// records is needed any more: the caller checked the state and a
    /// durable checkpoint covers them). Returns whether one was dropped.
    pub fn forget(&self, first_offset: Offset) -> bool {
        let mut state = self.state.borrow_mut();
        state.settle();
        match state.index.binary_search_by_key(&first_offset.0, |entry| entry.first_offset) {
            Ok(at) => {
                state.index.remove(at);
                if at == 0 {
                    state.start_offset =
                        state.index.first().map_or(state.next_offset, |e| e.first_offset);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Relocated copies appended and not yet durable.
    pub fn relocations_in_flight(&self) -> usize {
        self.settled(|state| state.relocating.len())
    }

    /// The journal position of the data entry holding `offset`, once a
    /// commit took it; `None` for an offset with no entry yet positioned
    /// (not appended, or appended and still queued).
    pub fn position_of(&self, offset: Offset) -> Option<JournalPos> {
        let mut state = self.state.borrow_mut();
        state.settle();
        let found = state.index.partition_point(|entry| entry.end_offset() <= offset.0);
        if let Some(entry) = state.index.get(found) {
            if entry.first_offset <= offset.0 {
                return Some(entry.position);
            }
        }
        state
            .pending
            .iter()
            .find(|pending| pending.first_offset + u64::from(pending.record_count) > offset.0)
            .filter(|pending| pending.first_offset <= offset.0)
            .and_then(|pending| pending.ticket.position())
    }
}
