//! The sparse offset index of one segment: offset → file position, one entry
//! every `index_interval_bytes` or so, plus its persisted form for sealed
//! segments.
//!
//! ```text
//! index file (little-endian), padded with zeros to a whole page:
//!  0  4  magic "SPX1"
//!  4  2  version (1)
//!  6  2  reserved (0)
//!  8  4  entry_count
//! 12  4  crc32c of the whole [0, 48 + 16 * entry_count) with this field zero
//! 16  8  segment base offset
//! 24  8  data_end: file position after the segment's last batch
//! 32  8  next_offset: offset after the segment's last record
//! 40  8  reserved (0)
//! 48  16 * entry_count: (offset u64, file position u64), strictly increasing
//! ```
//!
//! The index is an accelerator, never the truth: a missing or damaged index
//! file is rebuilt by scanning the segment.

use crate::limits::{INDEX_ENTRIES_MAX, PAGE_BYTES};
use crate::log::layout::page_ceil;

const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"SPX1");
const INDEX_VERSION: u16 = 1;
const INDEX_HEADER_BYTES: usize = 48;
const INDEX_ENTRY_BYTES: usize = 16;
/// Largest index file recovery reads: a full index of the largest segment,
/// padded to whole pages. A longer file is not ours (rebuilt by a scan).
pub const INDEX_FILE_BYTES_MAX: u64 =
    (INDEX_HEADER_BYTES as u64 + INDEX_ENTRY_BYTES as u64 * INDEX_ENTRIES_MAX).div_ceil(PAGE_BYTES)
        * PAGE_BYTES;

/// One index entry: the batch starting at `pos` has base offset `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub pos: u64,
}

/// Sparse index of one segment, kept in memory for every segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseIndex {
    entries: Vec<IndexEntry>,
}

impl SparseIndex {
    /// Adds an entry; offsets and positions must increase.
    pub fn push(&mut self, entry: IndexEntry) {
        if let Some(last) = self.entries.last() {
            assert!(entry.offset > last.offset);
            assert!(entry.pos > last.pos);
        }
        assert!((self.entries.len() as u64) < INDEX_ENTRIES_MAX);
        self.entries.push(entry);
    }

    /// Position of the last indexed batch whose base offset is ≤ `offset`,
    /// or 0 (the segment start) when none is.
    pub fn floor_pos(&self, offset: u64) -> u64 {
        let after = self.entries.partition_point(|entry| entry.offset <= offset);
        if after == 0 {
            0
        } else {
            self.entries[after - 1].pos
        }
    }

    pub fn last_pos(&self) -> Option<u64> {
        self.entries.last().map(|entry| entry.pos)
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Serializes into a page-padded buffer image.
    pub fn encode(&self, base_offset: u64, data_end: u64, next_offset: u64) -> Vec<u8> {
        let used = INDEX_HEADER_BYTES + self.entries.len() * INDEX_ENTRY_BYTES;
        let mut bytes = vec![0u8; page_ceil(used as u64).max(PAGE_BYTES) as usize];
        bytes[0..4].copy_from_slice(&INDEX_MAGIC.to_le_bytes());
        bytes[4..6].copy_from_slice(&INDEX_VERSION.to_le_bytes());
        let count = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        bytes[8..12].copy_from_slice(&count.to_le_bytes());
        bytes[16..24].copy_from_slice(&base_offset.to_le_bytes());
        bytes[24..32].copy_from_slice(&data_end.to_le_bytes());
        bytes[32..40].copy_from_slice(&next_offset.to_le_bytes());
        for (slot, entry) in self.entries.iter().enumerate() {
            let at = INDEX_HEADER_BYTES + slot * INDEX_ENTRY_BYTES;
            bytes[at..at + 8].copy_from_slice(&entry.offset.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&entry.pos.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes[..used]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses a persisted index for segment `base_offset`; `None` when the
    /// bytes are not a valid index of that segment (then: rebuild).
    pub fn decode(bytes: &[u8], base_offset: u64) -> Option<PersistedIndex> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        if u32_at(0)? != INDEX_MAGIC || bytes.get(4..6)? != INDEX_VERSION.to_le_bytes() {
            return None;
        }
        let count = u64::from(u32_at(8)?);
        if count > INDEX_ENTRIES_MAX {
            return None;
        }
        let used = INDEX_HEADER_BYTES + count as usize * INDEX_ENTRY_BYTES;
        let stored_crc = u32_at(12)?;
        let mut covered = bytes.get(..used)?.to_vec();
        covered[12..16].fill(0);
        if crc32c::crc32c(&covered) != stored_crc || u64_at(16)? != base_offset {
            return None;
        }
        let mut index = SparseIndex::default();
        for slot in 0..count as usize {
            let at = INDEX_HEADER_BYTES + slot * INDEX_ENTRY_BYTES;
            let entry = IndexEntry { offset: u64_at(at)?, pos: u64_at(at + 8)? };
            if index
                .entries
                .last()
                .is_some_and(|last| entry.offset <= last.offset || entry.pos <= last.pos)
            {
                return None;
            }
            index.entries.push(entry);
        }
        Some(PersistedIndex { index, data_end: u64_at(24)?, next_offset: u64_at(32)? })
    }
}

/// Where a reopen may start scanning a segment instead of at its start
/// (`Log::open_from_resume`, `docs/design/segment-format.md` "Resume
/// point"): the batch at `pos` has base offset `offset`, everything before
/// `pos` in segment `base` was durable when the point was taken, and
/// `index` holds the sparse index entries of that prefix (positions below
/// `pos`), so reads below it still find their batches. Persisted in the
/// index file format, with `data_end` = `pos` and `next_offset` =
/// `offset`: the prefix is described exactly as a sealed segment's index
/// file describes a whole segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    pub base: u64,
    pub pos: u64,
    pub offset: u64,
    pub index: SparseIndex,
}

impl ResumePoint {
    /// The index file image (not padded).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.index.encode(self.base, self.pos, self.offset);
        bytes.truncate(INDEX_HEADER_BYTES + self.index.entries.len() * INDEX_ENTRY_BYTES);
        bytes
    }

    /// Parses [`ResumePoint::encode`]'s bytes; `None` when they are damaged
    /// (magic, version, crc) or inconsistent: a position of 0, an offset
    /// below the base, an entry outside `[base, offset)` × `[0, pos)`.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let base = u64::from_le_bytes(bytes.get(16..24)?.try_into().ok()?);
        let persisted = SparseIndex::decode(bytes, base)?;
        let point = Self {
            base,
            pos: persisted.data_end,
            offset: persisted.next_offset,
            index: persisted.index,
        };
        let consistent = point.pos > 0
            && point.offset >= base
            && point.index.entries.iter().all(|entry| {
                entry.offset >= base && entry.offset < point.offset && entry.pos < point.pos
            });
        consistent.then_some(point)
    }
}

/// A decoded index file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedIndex {
    pub index: SparseIndex,
    pub data_end: u64,
    pub next_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_round_trips_and_rejects_damage() {
        // Goal: encode/decode is lossless, lookups floor correctly, any flipped byte is caught.
        let mut index = SparseIndex::default();
        for step in 0..100u64 {
            index.push(IndexEntry { offset: 10 + step * 7, pos: step * 8192 });
        }
        assert_eq!(index.floor_pos(9), 0);
        assert_eq!(index.floor_pos(10), 0);
        assert_eq!(index.floor_pos(16), 0);
        assert_eq!(index.floor_pos(17), 8192);
        assert_eq!(index.floor_pos(10_000), 99 * 8192);
        let bytes = index.encode(10, 123_456, 999);
        assert_eq!(bytes.len() % PAGE_BYTES as usize, 0);
        let decoded = SparseIndex::decode(&bytes, 10).expect("valid");
        assert_eq!(decoded.index, index);
        assert_eq!(decoded.data_end, 123_456);
        assert_eq!(decoded.next_offset, 999);
        assert!(SparseIndex::decode(&bytes, 11).is_none(), "wrong segment");
        for at in [0, 5, 9, 13, 20, 30, 60, 200] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(SparseIndex::decode(&damaged, 10).is_none(), "flip at {at}");
        }
        assert!(SparseIndex::decode(&[0u8; 4096], 10).is_none());
    }

    #[test]
    fn resume_point_round_trips_and_rejects_damage_and_nonsense() {
        // Goal: a resume point survives encode/decode; a flipped byte, an entry at or past
        // its position or offset, or a position of 0 is refused (the reopen then scans).
        let mut index = SparseIndex::default();
        for step in 0..10u64 {
            index.push(IndexEntry { offset: 100 + step * 5, pos: step * 8192 });
        }
        let point = ResumePoint { base: 100, pos: 10 * 8192, offset: 150, index };
        let bytes = point.encode();
        assert_eq!(bytes.len(), 48 + 16 * 10);
        assert_eq!(ResumePoint::decode(&bytes), Some(point.clone()));
        for at in [0, 5, 13, 17, 25, 33, 60, 200] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(ResumePoint::decode(&damaged).is_none(), "flip at {at}");
        }
        let before_last = ResumePoint { pos: 9 * 8192, ..point.clone() };
        assert!(ResumePoint::decode(&before_last.encode()).is_none(), "entry at pos");
        let low_offset = ResumePoint { offset: 145, ..point.clone() };
        assert!(ResumePoint::decode(&low_offset.encode()).is_none(), "entry at offset");
        let at_start =
            ResumePoint { base: 100, pos: 0, offset: 100, index: SparseIndex::default() };
        assert!(ResumePoint::decode(&at_start.encode()).is_none(), "position 0");
    }
}
