//! The shard's handles table: partition handle → (queue id, partition),
//! the meaning of the partition field of every journal entry
//! (`docs/design/shard-journal.md` §12). A handle is allocated, and the
//! table holding it made durable, before a partition's first append, so
//! every entry on disk names a handle the table knows; entries of a handle
//! the table does not hold (a deleted queue) are garbage.
//!
//! The file `handles` in the shard directory is replaced as the catalog is
//! (`control/catalog.rs`), here through the storage seam: write
//! `handles.tmp`, fdatasync it, rename it over `handles`, sync the
//! directory. A crash leaves the old table or the new one; a leftover
//! `handles.tmp` is removed by [`HandlesTable::load`].
//!
//! Layout (little-endian), zero-padded to whole pages:
//!
//! ```text
//!  0  4  magic "SPHT"
//!  4  4  format version (1)
//!  8  4  entry count
//! 12  4  next handle to allocate (handles are never reused)
//! 16  4  crc32c of the entries
//! 20  8  zero
//! 28  4  crc32c of bytes [0, 28)
//! 32 ..  entries of 16 bytes: handle, queue id, partition, zero
//! ```

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::proto::PartitionId;

use super::entry::FILLER_PARTITION;
use super::error::JournalError;
use super::PartitionHandle;
use crate::io::{create_dir_durable, IoError, Storage, StorageFile};
use crate::limits::PAGE_BYTES;
use crate::log::sync::Notify;

/// Name of the handles table in a shard directory.
pub const HANDLES_FILE_NAME: &str = "handles";
/// Name of the table being written; renamed over [`HANDLES_FILE_NAME`].
pub const HANDLES_TEMP_NAME: &str = "handles.tmp";
/// Most handles one shard's table holds (16 B each: 1 MiB of table).
pub const HANDLES_MAX: usize = 65_536;

const HANDLES_MAGIC: u32 = u32::from_le_bytes(*b"SPHT");
const HANDLES_VERSION: u32 = 1;
const HEADER_BYTES: usize = 32;
const RECORD_BYTES: usize = 16;

const _: () = assert!((HANDLES_MAX as u64) < FILLER_PARTITION.0 as u64);

/// The partition a handle stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HandleTarget {
    pub queue_id: u32,
    pub partition: PartitionId,
}

/// The table in memory: only what is durable on disk.
pub struct HandlesTable<S: Storage> {
    storage: S,
    dir: PathBuf,
    entries: RefCell<BTreeMap<PartitionHandle, HandleTarget>>,
    next_handle: Cell<u32>,
    /// A write is in flight; other registrations wait for it.
    writing: Cell<bool>,
    written: Notify,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

impl<S: Storage> HandlesTable<S> {
    /// Loads the table of the shard directory `dir` (creating the directory
    /// durably if missing); removes a leftover `handles.tmp`. No file: an
    /// empty table.
    ///
    /// # Errors
    /// [`JournalError::HandlesCorrupt`] naming the file, [`JournalError::Io`].
    pub async fn load(storage: S, dir: &Path) -> Result<Self, JournalError> {
        create_dir_durable(&storage, dir).await?;
        let names = storage.list_dir(dir).await?;
        if names.iter().any(|name| name == HANDLES_TEMP_NAME) {
            storage.remove(&dir.join(HANDLES_TEMP_NAME)).await?;
            storage.sync_dir(dir).await?;
        }
        let mut entries = BTreeMap::new();
        let mut next_handle = 0;
        if names.iter().any(|name| name == HANDLES_FILE_NAME) {
            let path = dir.join(HANDLES_FILE_NAME);
            let file = storage.open(&path).await?;
            let len = file.len_bytes().await?;
            let max = (HEADER_BYTES + HANDLES_MAX * RECORD_BYTES) as u64;
            let corrupt =
                |reason: String| JournalError::HandlesCorrupt { path: path.clone(), reason };
            if len > max.div_ceil(PAGE_BYTES) * PAGE_BYTES {
                return Err(corrupt(format!("{len} bytes, more than a full table")));
            }
            let bytes = file.read_at(0, len as usize).await?;
            (entries, next_handle) = decode(&bytes).map_err(corrupt)?;
        }
        Ok(Self {
            storage,
            dir: dir.to_path_buf(),
            entries: RefCell::new(entries),
            next_handle: Cell::new(next_handle),
            writing: Cell::new(false),
            written: Notify::default(),
        })
    }

    /// The durable handle of `target`, if it has one.
    pub fn handle_of(&self, target: HandleTarget) -> Option<PartitionHandle> {
        self.entries.borrow().iter().find(|(_, t)| **t == target).map(|(handle, _)| *handle)
    }

    pub fn target(&self, handle: PartitionHandle) -> Option<HandleTarget> {
        self.entries.borrow().get(&handle).copied()
    }

    pub fn contains(&self, handle: PartitionHandle) -> bool {
        self.entries.borrow().contains_key(&handle)
    }

    /// Every durable handle and its partition.
    pub fn entries(&self) -> Vec<(PartitionHandle, HandleTarget)> {
        self.entries.borrow().iter().map(|(handle, target)| (*handle, *target)).collect()
    }

    /// The handle of `target`: the one it has, or a new one, returned only
    /// once the table holding it is durable.
    ///
    /// # Errors
    /// [`JournalError::Handles`] when the table is full,
    /// [`JournalError::Io`] when the write fails (the table in memory and
    /// on disk is then the old one).
    pub async fn register(&self, target: HandleTarget) -> Result<PartitionHandle, JournalError> {
        loop {
            if let Some(handle) = self.handle_of(target) {
                return Ok(handle);
            }
            if !self.writing.get() {
                break;
            }
            self.written.wait().await;
        }
        let handle = PartitionHandle(self.next_handle.get());
        if self.entries.borrow().len() >= HANDLES_MAX || handle == FILLER_PARTITION {
            return Err(JournalError::Handles(format!("the table holds {HANDLES_MAX} handles")));
        }
        let mut next = self.entries.borrow().clone();
        next.insert(handle, target);
        self.writing.set(true);
        let written = self.write(&next, handle.0 + 1).await;
        self.writing.set(false);
        if written.is_ok() {
            *self.entries.borrow_mut() = next;
            self.next_handle.set(handle.0 + 1);
        }
        self.written.notify_all();
        written?;
        Ok(handle)
    }

    async fn write(
        &self,
        entries: &BTreeMap<PartitionHandle, HandleTarget>,
        next_handle: u32,
    ) -> Result<(), IoError> {
        let bytes = encode(entries, next_handle);
        let temp = self.dir.join(HANDLES_TEMP_NAME);
        // A temporary file left by a failed write may be longer; start clean.
        let _ = self.storage.remove(&temp).await;
        let file = self.storage.open(&temp).await?;
        let mut buf = file.alloc_buf(bytes.len());
        buf.as_mut().copy_from_slice(&bytes);
        file.write_at(Rc::new(buf), 0).await?;
        file.fdatasync().await?;
        drop(file);
        self.storage.rename(&temp, &self.dir.join(HANDLES_FILE_NAME)).await?;
        self.storage.sync_dir(&self.dir).await
    }
}

fn encode(entries: &BTreeMap<PartitionHandle, HandleTarget>, next_handle: u32) -> Vec<u8> {
    let body = entries.len() * RECORD_BYTES;
    let len = ((HEADER_BYTES + body) as u64).div_ceil(PAGE_BYTES) * PAGE_BYTES;
    let mut bytes = vec![0u8; len as usize];
    for (index, (handle, target)) in entries.iter().enumerate() {
        let at = HEADER_BYTES + index * RECORD_BYTES;
        bytes[at..at + 4].copy_from_slice(&handle.0.to_le_bytes());
        bytes[at + 4..at + 8].copy_from_slice(&target.queue_id.to_le_bytes());
        bytes[at + 8..at + 12].copy_from_slice(&target.partition.0.to_le_bytes());
    }
    let count = u32::try_from(entries.len()).expect("the table is bounded by HANDLES_MAX");
    bytes[0..4].copy_from_slice(&HANDLES_MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&HANDLES_VERSION.to_le_bytes());
    bytes[8..12].copy_from_slice(&count.to_le_bytes());
    bytes[12..16].copy_from_slice(&next_handle.to_le_bytes());
    let body_crc = crc32c::crc32c(&bytes[HEADER_BYTES..HEADER_BYTES + body]);
    bytes[16..20].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&bytes[..28]);
    bytes[28..32].copy_from_slice(&header_crc.to_le_bytes());
    bytes
}

type Decoded = (BTreeMap<PartitionHandle, HandleTarget>, u32);

fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    if u32_at(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
        return Err("header crc mismatch".to_owned());
    }
    if u32_at(bytes, 0) != HANDLES_MAGIC {
        return Err(format!("bad magic {:#010x}", u32_at(bytes, 0)));
    }
    if u32_at(bytes, 4) != HANDLES_VERSION {
        return Err(format!("unsupported version {}", u32_at(bytes, 4)));
    }
    let count = u32_at(bytes, 8) as usize;
    let next_handle = u32_at(bytes, 12);
    if count > HANDLES_MAX || HEADER_BYTES + count * RECORD_BYTES > bytes.len() {
        return Err(format!("{count} entries do not fit the file"));
    }
    let body = &bytes[HEADER_BYTES..HEADER_BYTES + count * RECORD_BYTES];
    if u32_at(bytes, 16) != crc32c::crc32c(body) {
        return Err("entries crc mismatch".to_owned());
    }
    let mut entries = BTreeMap::new();
    for record in body.chunks_exact(RECORD_BYTES) {
        let handle = PartitionHandle(u32_at(record, 0));
        let target =
            HandleTarget { queue_id: u32_at(record, 4), partition: PartitionId(u32_at(record, 8)) };
        if handle.0 >= next_handle || entries.insert(handle, target).is_some() {
            return Err(format!("handle {handle} repeated or not below the next handle"));
        }
    }
    Ok((entries, next_handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_damage_is_named() {
        // Goal: encode/decode round trip; a flipped byte anywhere in the used bytes is refused.
        let mut entries = BTreeMap::new();
        for handle in 0..5u32 {
            let target = HandleTarget { queue_id: 7 + handle, partition: PartitionId(handle * 3) };
            entries.insert(PartitionHandle(handle), target);
        }
        let bytes = encode(&entries, 9);
        assert_eq!(bytes.len() as u64 % PAGE_BYTES, 0);
        assert_eq!(decode(&bytes), Ok((entries, 9)));
        for at in 0..HEADER_BYTES + 5 * RECORD_BYTES {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode(&damaged).is_err(), "flip at {at} accepted");
        }
    }
}
