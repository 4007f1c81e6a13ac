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
//! The table also holds each partition's **leader epoch**: opening a
//! partition bumps its epoch here, durably, before the partition serves
//! anything (the epoch fence, `shard-journal.md` §4). One write covers
//! every partition opened together ([`HandlesTable::open_epochs`]): a
//! queue's partitions on this shard, when it is created or when the broker
//! starts, cost one table write and one fdatasync, not one per partition.
//!
//! Layout (little-endian), zero-padded to whole pages:
//!
//! ```text
//!  0  4  magic "SPHT"
//!  4  4  format version (2; version 1 is read, its epochs as 0)
//!  8  4  entry count
//! 12  4  next handle to allocate (handles are never reused)
//! 16  4  crc32c of the entries
//! 20  8  zero
//! 28  4  crc32c of bytes [0, 28)
//! 32 ..  entries of 16 bytes: handle, queue id, partition, leader epoch
//! ```
//!
//! A leader epoch of 0 means the table holds none for that partition (a
//! version-1 table, where the word was zero, or a handle registered
//! without opening): its epoch is then the partition's epoch side file's
//! (the caller passes it as the floor of [`HandlesTable::open_epochs`]).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::proto::PartitionId;

use super::entry::{FILLER_PARTITION, MARKER_COMMIT};
use super::error::JournalError;
use super::PartitionHandle;
use crate::io::{create_dir_durable, IoError, IoOp, Storage, StorageFile};
use crate::limits::PAGE_BYTES;
use crate::log::failpoint;
use crate::log::wakers::Notify;

/// Name of the handles table in a shard directory.
pub const HANDLES_FILE_NAME: &str = "handles";
/// Name of the table being written; renamed over [`HANDLES_FILE_NAME`].
pub const HANDLES_TEMP_NAME: &str = "handles.tmp";
pub use super::limits::HANDLES_MAX;
// A handle never collides with the marker bits of an entry's partition field.
const _: () = assert!((HANDLES_MAX as u64) < MARKER_COMMIT as u64);

const HANDLES_MAGIC: u32 = u32::from_le_bytes(*b"SPHT");
const HANDLES_VERSION: u32 = 2;
/// The format before leader epochs: the fourth word of an entry is zero.
const HANDLES_VERSION_NO_EPOCHS: u32 = 1;
const HEADER_BYTES: usize = 32;
const RECORD_BYTES: usize = 16;

const _: () = assert!((HANDLES_MAX as u64) < FILLER_PARTITION.0 as u64);

/// The partition a handle stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HandleTarget {
    pub queue_id: u32,
    pub partition: PartitionId,
}

/// One handle's row: its partition and leader epoch (0: none recorded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    target: HandleTarget,
    epoch: u32,
}

type Rows = BTreeMap<PartitionHandle, Row>;

/// The table in memory: only what is durable on disk.
pub struct HandlesTable<S: Storage> {
    storage: S,
    dir: PathBuf,
    entries: RefCell<Rows>,
    /// Reverse index of `entries`: always the same handles.
    by_target: RefCell<BTreeMap<HandleTarget, PartitionHandle>>,
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
        let by_target = entries.iter().map(|(handle, row)| (row.target, *handle)).collect();
        Ok(Self {
            storage,
            dir: dir.to_path_buf(),
            entries: RefCell::new(entries),
            by_target: RefCell::new(by_target),
            next_handle: Cell::new(next_handle),
            writing: Cell::new(false),
            written: Notify::default(),
        })
    }

    /// The durable handle of `target`, if it has one.
    pub fn handle_of(&self, target: HandleTarget) -> Option<PartitionHandle> {
        self.by_target.borrow().get(&target).copied()
    }

    pub fn target(&self, handle: PartitionHandle) -> Option<HandleTarget> {
        self.entries.borrow().get(&handle).map(|row| row.target)
    }

    /// The durable leader epoch of `handle` (0: the table holds none).
    pub fn epoch(&self, handle: PartitionHandle) -> Option<u32> {
        self.entries.borrow().get(&handle).map(|row| row.epoch)
    }

    pub fn contains(&self, handle: PartitionHandle) -> bool {
        self.entries.borrow().contains_key(&handle)
    }

    /// Every durable handle and its partition.
    pub fn entries(&self) -> Vec<(PartitionHandle, HandleTarget)> {
        self.entries.borrow().iter().map(|(handle, row)| (*handle, row.target)).collect()
    }

    /// The handle of `target`: the one it has, or a new one, returned only
    /// once the table holding it is durable. Its epoch is left as it is.
    ///
    /// # Errors
    /// As [`HandlesTable::open_epochs`].
    pub async fn register(&self, target: HandleTarget) -> Result<PartitionHandle, JournalError> {
        if let Some(handle) = self.handle_of(target) {
            return Ok(handle);
        }
        let changed = self.change(&[target], None).await?;
        Ok(changed[0].0)
    }

    /// Opens the partitions `opening` together: each gets its handle (the
    /// one it has, or a new one) and a leader epoch one above the greater
    /// of the table's and its floor (the epoch its side file holds, 0 when
    /// none), and the whole table is written and made durable **once**
    /// before this returns. Returns (handle, new epoch) per partition, in
    /// order. A partition listed twice gets one handle and one bump.
    ///
    /// # Errors
    /// [`JournalError::Handles`] when the table is full or an epoch would
    /// pass `u32::MAX`, [`JournalError::Io`] when the write fails (the
    /// table in memory and on disk is then the old one, and no epoch was
    /// given out).
    pub async fn open_epochs(
        &self,
        opening: &[(HandleTarget, u64)],
    ) -> Result<Vec<(PartitionHandle, u32)>, JournalError> {
        let targets: Vec<HandleTarget> = opening.iter().map(|(target, _)| *target).collect();
        let floors: BTreeMap<HandleTarget, u64> = opening.iter().copied().collect();
        self.change(&targets, Some(&floors)).await
    }

    /// Registers `targets` and, with `floors`, bumps their epochs, in one
    /// durable write (waiting for a write in flight first).
    async fn change(
        &self,
        targets: &[HandleTarget],
        floors: Option<&BTreeMap<HandleTarget, u64>>,
    ) -> Result<Vec<(PartitionHandle, u32)>, JournalError> {
        while self.writing.get() {
            self.written.wait().await;
        }
        let mut next = self.entries.borrow().clone();
        let mut next_handle = self.next_handle.get();
        let mut by_target = self.by_target.borrow().clone();
        let mut bumped: BTreeMap<PartitionHandle, u32> = BTreeMap::new();
        let mut changed = Vec::with_capacity(targets.len());
        for target in targets {
            let handle = match by_target.get(target) {
                Some(handle) => *handle,
                None => {
                    let handle = PartitionHandle(next_handle);
                    if next.len() >= HANDLES_MAX || handle == FILLER_PARTITION {
                        return Err(JournalError::Handles(format!(
                            "the table holds {HANDLES_MAX} handles"
                        )));
                    }
                    next.insert(handle, Row { target: *target, epoch: 0 });
                    by_target.insert(*target, handle);
                    next_handle += 1;
                    handle
                }
            };
            let row = next.get_mut(&handle).expect("every handle of by_target has a row");
            if let Some(floors) = floors {
                if let Some(epoch) = bumped.get(&handle) {
                    changed.push((handle, *epoch));
                    continue;
                }
                let floor = floors.get(target).copied().unwrap_or(0);
                let epoch = u64::from(row.epoch).max(floor) + 1;
                let epoch = u32::try_from(epoch).map_err(|_| {
                    JournalError::Handles(format!(
                        "the leader epoch of queue {} partition {} passes {}",
                        target.queue_id,
                        target.partition.0,
                        u32::MAX
                    ))
                })?;
                row.epoch = epoch;
                bumped.insert(handle, epoch);
            }
            changed.push((handle, row.epoch));
        }
        self.writing.set(true);
        let written = self.write(&next, next_handle).await;
        self.writing.set(false);
        if written.is_ok() {
            *self.entries.borrow_mut() = next;
            *self.by_target.borrow_mut() = by_target;
            self.next_handle.set(next_handle);
        }
        self.written.notify_all();
        written?;
        Ok(changed)
    }

    async fn write(&self, entries: &Rows, next_handle: u32) -> Result<(), IoError> {
        let bytes = encode(entries, next_handle);
        let temp = self.dir.join(HANDLES_TEMP_NAME);
        // A temporary file left by a failed write may be longer; start clean.
        let _ = self.storage.remove(&temp).await;
        let file = self.storage.open(&temp).await?;
        let mut buf = file.alloc_buf(bytes.len());
        buf.as_mut().copy_from_slice(&bytes);
        failpoint("handles.write", IoOp::Write, &temp, Some(0))?;
        file.write_at(Rc::new(buf), 0).await?;
        failpoint("handles.sync", IoOp::Sync, &temp, None)?;
        file.fdatasync().await?;
        drop(file);
        failpoint("handles.rename", IoOp::Rename, &temp, None)?;
        self.storage.rename(&temp, &self.dir.join(HANDLES_FILE_NAME)).await?;
        failpoint("handles.dir_sync", IoOp::SyncDir, &self.dir, None)?;
        self.storage.sync_dir(&self.dir).await
    }
}

fn encode(entries: &Rows, next_handle: u32) -> Vec<u8> {
    let body = entries.len() * RECORD_BYTES;
    let len = ((HEADER_BYTES + body) as u64).div_ceil(PAGE_BYTES) * PAGE_BYTES;
    let mut bytes = vec![0u8; len as usize];
    for (index, (handle, row)) in entries.iter().enumerate() {
        let at = HEADER_BYTES + index * RECORD_BYTES;
        bytes[at..at + 4].copy_from_slice(&handle.0.to_le_bytes());
        bytes[at + 4..at + 8].copy_from_slice(&row.target.queue_id.to_le_bytes());
        bytes[at + 8..at + 12].copy_from_slice(&row.target.partition.0.to_le_bytes());
        bytes[at + 12..at + 16].copy_from_slice(&row.epoch.to_le_bytes());
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

type Decoded = (Rows, u32);

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
    let version = u32_at(bytes, 4);
    if version != HANDLES_VERSION && version != HANDLES_VERSION_NO_EPOCHS {
        return Err(format!("unsupported version {version}"));
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
        let epoch = if version == HANDLES_VERSION { u32_at(record, 12) } else { 0 };
        if handle.0 >= next_handle || entries.insert(handle, Row { target, epoch }).is_some() {
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
            entries.insert(PartitionHandle(handle), Row { target, epoch: handle * 11 });
        }
        let bytes = encode(&entries, 9);
        assert_eq!(bytes.len() as u64 % PAGE_BYTES, 0);
        assert_eq!(decode(&bytes), Ok((entries, 9)));
        // A version-1 table (the epoch word zero) reads with epochs 0.
        let mut old = bytes.clone();
        old[4..8].copy_from_slice(&HANDLES_VERSION_NO_EPOCHS.to_le_bytes());
        let header_crc = crc32c::crc32c(&old[..28]);
        old[28..32].copy_from_slice(&header_crc.to_le_bytes());
        let (old_entries, _) = decode(&old).unwrap();
        assert!(old_entries.values().all(|row| row.epoch == 0));
        for at in 0..HEADER_BYTES + 5 * RECORD_BYTES {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode(&damaged).is_err(), "flip at {at} accepted");
        }
    }
}
