//! Reading entries back by journal position: the batch of a durable entry,
//! as a range of the buffer that holds it (no copy) — the read cache of
//! recent durable commits when it still holds the commit, otherwise an
//! aligned read of the journal file through the storage seam.
//!
//! A batch read from a file is checked once, right after the read (the entry header's crc and
//! position, then both batch crcs and its length); a batch served from the
//! cache lies in a commit buffer this journal built from checked payloads,
//! so only its headers are parsed. Positions at or past the durable
//! watermark, and below the oldest journal file, are typed errors.

use std::path::PathBuf;
use std::rc::Rc;

use spool_wire::batch::BatchHeader;

use super::appender::Journal;
use super::entry::{check_payload, EntryError, EntryHeader, ENTRY_HEADER_BYTES};
use super::error::{JournalDamage, JournalError};
use super::layout::{page_ceil, page_floor};
use super::read_cache::{CachedCommit, FileSlot, ReadChunk};
use super::JournalPos;
use crate::io::Storage;
use crate::io::StorageFile;
use crate::limits::{JOURNAL_READ_CHUNK_BYTES, PAGE_BYTES};
use crate::log::{ReadBatch, SharedBytes};

impl<S: Storage> Journal<S> {
    /// The batch of the durable entry at `pos`.
    ///
    /// # Errors
    /// [`JournalError::NotDurable`] at or past the durable watermark,
    /// [`JournalError::BelowOldestFile`], [`JournalError::Corrupt`] naming
    /// file and byte when no intact entry is there (or it is a filler),
    /// [`JournalError::Io`].
    pub async fn read(&self, pos: JournalPos) -> Result<ReadBatch, JournalError> {
        let mut batches = self.read_entries(&[pos], PAGE_BYTES).await?;
        match batches.pop() {
            Some(batch) => Ok(batch),
            None => unreachable!("read_entries returns one batch per position"),
        }
    }

    /// The batches of the durable entries at `positions`, one per position,
    /// in the order given. An entry the commit cache no longer holds is
    /// served from a chunk of its file: one read of
    /// [`JOURNAL_READ_CHUNK_BYTES`] (aligned to a multiple of it, longer
    /// only for an entry that crosses its end), checked entry by entry and
    /// kept for the reads that follow (`read_ahead_bytes`), since the
    /// entries of the shard's other partitions lie between this one's.
    /// `read_bytes` is how much the caller wants in all; a lone entry
    /// asked with at most a page of `read_bytes` ([`Journal::read`]) reads
    /// only the pages it needs.
    ///
    /// # Errors
    /// As [`Journal::read`], for the first position that fails.
    pub async fn read_entries(
        &self,
        positions: &[JournalPos],
        read_bytes: u64,
    ) -> Result<Vec<ReadBatch>, JournalError> {
        let durable = self.durable_position();
        let mut out = Vec::with_capacity(positions.len());
        let mut went_to_file = false;
        // The chunk read last, for a journal that keeps no chunks.
        let mut last: Option<ReadChunk> = None;
        let whole_chunks = positions.len() > 1 || read_bytes > PAGE_BYTES;
        for &pos in positions {
            if pos >= durable {
                return Err(JournalError::NotDurable { pos, durable });
            }
            if let Some(batch) = self.read_cached(pos)? {
                out.push(batch);
                continue;
            }
            if let Some(batch) = self.read_chunked(pos, last.as_ref())? {
                out.push(batch);
                continue;
            }
            went_to_file = true;
            let chunk = self.read_chunk(pos, durable, whole_chunks).await?;
            let Some(batch) = self.read_chunked(pos, Some(&chunk))? else {
                unreachable!("a chunk read for an entry covers it")
            };
            out.push(batch);
            self.keep_chunk(&chunk);
            last = Some(chunk);
        }
        crate::io::stats::record_read(!went_to_file);
        Ok(out)
    }

    /// The entry at `pos` from `last` or a kept chunk that holds all of it,
    /// checked (crc included). `None` when no chunk holds the entry whole.
    fn read_chunked(
        &self,
        pos: JournalPos,
        last: Option<&ReadChunk>,
    ) -> Result<Option<ReadBatch>, JournalError> {
        let state = self.shared.state.borrow();
        let oldest = state.files.keys().next().copied().unwrap_or(0);
        if pos.0 < oldest {
            return Ok(None);
        }
        let covering = last.into_iter().chain(state.chunks.iter().rev());
        for chunk in covering.filter(|chunk| chunk.pos <= pos.0 && pos.0 < chunk.valid_end) {
            if let Some(batch) = entry_in_chunk(&state.files, chunk, pos)? {
                return Ok(Some(batch));
            }
        }
        Ok(None)
    }

    /// Reads the chunk of `pos`'s file that holds the entry at `pos`: from
    /// the multiple of [`JOURNAL_READ_CHUNK_BYTES`] at or below it to the
    /// next (`whole`; otherwise the entry's first page only), never past the
    /// file. An entry that crosses that end gets a read of its own pages.
    async fn read_chunk(
        &self,
        pos: JournalPos,
        durable: JournalPos,
        whole: bool,
    ) -> Result<ReadChunk, JournalError> {
        let (base, end, path, file) = self.file_for(pos).await?;
        let off = pos.0 - base;
        let file_len = end - base;
        let (start, want) = if whole {
            let start = off - off % JOURNAL_READ_CHUNK_BYTES;
            (start, start + JOURNAL_READ_CHUNK_BYTES)
        } else {
            (page_floor(off), page_ceil(off + ENTRY_HEADER_BYTES as u64))
        };
        // Bytes past the durable watermark are not served: not read either.
        let stop = want.min(file_len).min(page_ceil(durable.0 - base).max(start + PAGE_BYTES));
        // An entry whose header a kept chunk holds runs past that chunk's
        // end: only its own pages are read.
        let (start, stop) = match self.kept_entry_len(pos) {
            Some(len) if off + len <= file_len => (page_floor(off), page_ceil(off + len)),
            _ => (start, stop),
        };
        let mut start = start;
        let mut bytes = file.read_at(start, (stop - start) as usize).await?;
        // An entry that runs past the chunk just read (its header, then its
        // body): its own pages, read again to its end.
        let header_end = off + ENTRY_HEADER_BYTES as u64;
        if header_end > start + bytes.len() as u64 && header_end <= file_len {
            start = page_floor(off);
            bytes =
                file.read_at(start, (page_ceil(header_end).min(file_len) - start) as usize).await?;
        }
        let head_at = (off - start) as usize;
        if head_at + ENTRY_HEADER_BYTES <= bytes.len() {
            if let Ok(header) = EntryHeader::decode_at(&bytes[head_at..], pos) {
                let entry_end = off + u64::from(header.entry_len);
                if entry_end > start + bytes.len() as u64 && entry_end <= file_len {
                    start = page_floor(off);
                    let stop = page_ceil(entry_end).min(file_len);
                    bytes = file.read_at(start, (stop - start) as usize).await?;
                }
            }
        }
        let chunk_pos = base + start;
        let read_end = chunk_pos + bytes.len() as u64;
        let chunk = ReadChunk {
            pos: chunk_pos,
            valid_end: read_end.min(durable.0),
            bytes: SharedBytes::new(bytes),
            checked: Rc::default(),
        };
        // An entry still short (a read that ended early, a damaged header):
        // the checks name the byte.
        if self.read_chunked(pos, Some(&chunk))?.is_none() {
            return Err(unreadable(
                path,
                off,
                EntryError::Truncated {
                    needed: ENTRY_HEADER_BYTES,
                    available: (read_end.min(durable.0)).saturating_sub(pos.0) as usize,
                },
            ));
        }
        Ok(chunk)
    }

    /// The length of the entry at `pos` when a kept chunk holds its intact
    /// header but not all of it.
    fn kept_entry_len(&self, pos: JournalPos) -> Option<u64> {
        let state = self.shared.state.borrow();
        state.chunks.iter().rev().find_map(|chunk| {
            let valid = chunk.valid_end.min(chunk.pos + chunk.bytes.len() as u64);
            if pos.0 < chunk.pos || pos.0 + ENTRY_HEADER_BYTES as u64 > valid {
                return None;
            }
            let off = (pos.0 - chunk.pos) as usize;
            EntryHeader::decode_at(&chunk.bytes[off..], pos)
                .ok()
                .map(|header| u64::from(header.entry_len))
        })
    }

    /// Keeps `chunk` for later reads, dropping the oldest beyond
    /// `read_ahead_bytes` and any of a file no longer held.
    fn keep_chunk(&self, chunk: &ReadChunk) {
        let max = self.shared.config.read_ahead_bytes;
        let len = chunk.bytes.len() as u64;
        if len > max {
            return;
        }
        let mut state = self.shared.state.borrow_mut();
        let oldest = state.files.keys().next().copied().unwrap_or(0);
        state.chunks.push_back(chunk.clone());
        state.chunk_bytes += len;
        while state.chunk_bytes > max
            || state.chunks.front().is_some_and(|front| front.pos < oldest)
        {
            let Some(old) = state.chunks.pop_front() else { break };
            state.chunk_bytes -= old.bytes.len() as u64;
        }
    }

    /// The entry at `pos` from the read cache, if a cached commit holds it.
    fn read_cached(&self, pos: JournalPos) -> Result<Option<ReadBatch>, JournalError> {
        let state = self.shared.state.borrow();
        let cache = &state.cache;
        let Some(front) = cache.front() else { return Ok(None) };
        if pos.0 < front.pos {
            return Ok(None);
        }
        let index = cache.partition_point(|commit| commit.pos <= pos.0) - 1;
        let commit: &CachedCommit<_> = &cache[index];
        let bytes: &[u8] = commit.buf.as_ref().as_ref();
        let off = (pos.0 - commit.pos) as usize;
        if off >= bytes.len() {
            return Ok(None);
        }
        let path = || {
            let base = state.files.range(..=pos.0).next_back().map(|(base, _)| *base);
            let path = base.and_then(|base| state.files.get(&base)).map(|slot| slot.path.clone());
            (path.unwrap_or_default(), pos.0 - base.unwrap_or(0))
        };
        let header = match EntryHeader::decode_at(&bytes[off..], pos) {
            Ok(header) if header.is_filler() => Err(EntryError::FillerPayload),
            Ok(header) if off + header.entry_len as usize > bytes.len() => {
                Err(EntryError::Truncated {
                    needed: header.entry_len as usize,
                    available: bytes.len() - off,
                })
            }
            other => other,
        };
        let header = header.map_err(|error| {
            let (path, at) = path();
            unreadable(path, at, error)
        })?;
        let payload = off + header.header_bytes()..off + header.entry_len as usize;
        // Built by this journal from payloads that passed `check_payload`:
        // parsing the batch header is enough.
        let batch = BatchHeader::parse(&bytes[payload.clone()]).map_err(|error| {
            let (path, at) = path();
            unreadable(path, at, EntryError::Payload(error))
        })?;
        let shared = SharedBytes::from_shared(commit.buf.clone()).slice(payload);
        Ok(Some(ReadBatch { header: batch, bytes: shared }))
    }

    /// The file holding `pos`: its base, end, path and open handle (opened
    /// on first use).
    async fn file_for(
        &self,
        pos: JournalPos,
    ) -> Result<(u64, u64, PathBuf, Rc<S::File>), JournalError> {
        let (base, end, path, file) = {
            let state = self.shared.state.borrow();
            let Some((base, slot)) = state.files.range(..=pos.0).next_back() else {
                let oldest = state.files.keys().next().copied().unwrap_or(0);
                return Err(JournalError::BelowOldestFile { pos, oldest: JournalPos(oldest) });
            };
            // A file ends where the next begins; the newest where its own
            // length says (files are shorter while the disk is short of
            // space).
            let end = state.files.range(base + 1..).next().map_or_else(
                || base + slot.len_bytes.unwrap_or(self.shared.config.file_bytes),
                |(next, _)| *next,
            );
            (*base, end, slot.path.clone(), slot.file.clone())
        };
        if let Some(file) = file {
            return Ok((base, end, path, file));
        }
        let file = Rc::new(self.shared.storage.open(&path).await?);
        let mut state = self.shared.state.borrow_mut();
        if let Some(slot) = state.files.get_mut(&base) {
            slot.file.get_or_insert_with(|| file.clone());
        }
        Ok((base, end, path, file))
    }

    /// The position of the oldest journal file still held.
    pub fn oldest_position(&self) -> JournalPos {
        JournalPos(self.shared.state.borrow().files.keys().next().copied().unwrap_or(0))
    }

    /// Bytes of durable commits the read cache holds.
    pub fn read_cache_bytes(&self) -> u64 {
        self.shared.state.borrow().cache_bytes
    }

    /// Bytes of file chunks kept for reads.
    pub fn read_ahead_bytes(&self) -> u64 {
        self.shared.state.borrow().chunk_bytes
    }
}

fn unreadable(path: PathBuf, pos: u64, error: EntryError) -> JournalError {
    JournalError::Corrupt { path, pos, detail: JournalDamage::Unreadable(error) }
}

/// The entry at `pos` if `chunk` holds all of it, checked (crc included);
/// damage is named by file (from `files`) and byte.
fn entry_in_chunk<F: StorageFile>(
    files: &std::collections::BTreeMap<u64, FileSlot<F>>,
    chunk: &ReadChunk,
    pos: JournalPos,
) -> Result<Option<ReadBatch>, JournalError> {
    let off = (pos.0 - chunk.pos) as usize;
    let valid = (chunk.valid_end - chunk.pos) as usize;
    let bytes = &chunk.bytes[..valid.min(chunk.bytes.len())];
    if off + ENTRY_HEADER_BYTES > bytes.len() {
        return Ok(None);
    }
    let bad = |error| {
        let base = files.range(..=pos.0).next_back().map_or(0, |(base, _)| *base);
        let path = files.get(&base).map(|slot| slot.path.clone()).unwrap_or_default();
        unreadable(path, pos.0 - base, error)
    };
    let header = EntryHeader::decode_at(&bytes[off..], pos).map_err(bad)?;
    if header.is_filler() {
        return Err(bad(EntryError::FillerPayload));
    }
    let end = off + header.entry_len as usize;
    if end > bytes.len() {
        return Ok(None);
    }
    let payload = off + header.header_bytes()..end;
    let batch = match chunk.checked_at(off) {
        Some(batch) => batch,
        None => {
            let batch = check_payload(&bytes[payload.clone()]).map_err(bad)?;
            chunk.note_checked(off, batch);
            batch
        }
    };
    Ok(Some(ReadBatch { header: batch, bytes: chunk.bytes.slice(payload) }))
}
