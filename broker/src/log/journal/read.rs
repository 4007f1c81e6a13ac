//! Reading entries back by journal position: the batch of a durable entry,
//! as a range of the buffer that holds it (no copy) — the read cache of
//! recent durable commits when it still holds the commit, otherwise an
//! aligned read of the journal file through the storage seam.
//!
//! The checks are the segment log's (`log/reader.rs`): a batch read from a
//! file is checked once, right after the read (the entry header's crc and
//! position, then both batch crcs and its length); a batch served from the
//! cache lies in a commit buffer this journal built from checked payloads,
//! so only its headers are parsed. Positions at or past the durable
//! watermark, and below the oldest journal file, are typed errors.

use std::path::PathBuf;
use std::rc::Rc;

use spool_wire::batch::BatchHeader;

use super::appender::{CachedCommit, Journal};
use super::entry::{check_payload, EntryError, EntryHeader, ENTRY_HEADER_BYTES};
use super::error::{JournalDamage, JournalError};
use super::JournalPos;
use crate::io::{Storage, StorageFile};
use crate::limits::{PAGE_BYTES, SCAN_CHUNK_BYTES};
use crate::log::window::Window;
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
    /// in the order given. Consecutive positions in one file that lie close
    /// together are served from one read of up to `read_bytes` (at most
    /// [`SCAN_CHUNK_BYTES`]).
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
        let chunk = read_bytes.div_ceil(PAGE_BYTES).max(1).saturating_mul(PAGE_BYTES);
        let chunk = chunk.min(SCAN_CHUNK_BYTES);
        let mut at = 0;
        while at < positions.len() {
            let pos = positions[at];
            if pos >= durable {
                return Err(JournalError::NotDurable { pos, durable });
            }
            if let Some(batch) = self.read_cached(pos)? {
                out.push(batch);
                at += 1;
                continue;
            }
            // Every following position in the same file, not in the cache,
            // shares one window.
            let (base, end, path, file) = self.file_for(pos).await?;
            let mut window = Window::new(&*file, chunk);
            while at < positions.len() {
                let pos = positions[at];
                if pos.0 < base || pos.0 >= end {
                    break;
                }
                if pos >= durable {
                    return Err(JournalError::NotDurable { pos, durable });
                }
                out.push(read_from_file(&mut window, &path, base, pos).await?);
                at += 1;
            }
        }
        Ok(out)
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
        let payload = off + ENTRY_HEADER_BYTES..off + header.entry_len as usize;
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
            let end = state
                .files
                .range(base + 1..)
                .next()
                .map_or(base + self.shared.config.file_bytes, |(next, _)| *next);
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
}

fn unreadable(path: PathBuf, pos: u64, error: EntryError) -> JournalError {
    JournalError::Corrupt { path, pos, detail: JournalDamage::Unreadable(error) }
}

/// Reads and checks the entry at `pos` of the file whose byte 0 is `base`.
async fn read_from_file<F: StorageFile>(
    window: &mut Window<'_, F>,
    path: &std::path::Path,
    base: u64,
    pos: JournalPos,
) -> Result<ReadBatch, JournalError> {
    let off = pos.0 - base;
    let bad = |error| unreadable(path.to_path_buf(), off, error);
    let head = window.get(off, ENTRY_HEADER_BYTES as u64).await?;
    let header = EntryHeader::decode_at(head, pos).map_err(bad)?;
    if header.is_filler() {
        return Err(bad(EntryError::FillerPayload));
    }
    let len = u64::from(header.entry_len);
    let bytes = window.get(off, len).await?;
    if (bytes.len() as u64) < len {
        return Err(bad(EntryError::Truncated { needed: len as usize, available: bytes.len() }));
    }
    let batch = check_payload(&bytes[ENTRY_HEADER_BYTES..]).map_err(bad)?;
    let header_bytes = ENTRY_HEADER_BYTES as u64;
    Ok(ReadBatch { header: batch, bytes: window.share(off + header_bytes, len - header_bytes) })
}
