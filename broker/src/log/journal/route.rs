//! Recovery routing: the [`RecoverySink`] a shard opens its journal with.
//! Every intact entry goes, by the partition handle in its header, to that
//! partition's list of [`RoutedEntry`] — positions and batch-header facts
//! only, no payload bytes kept; entries of a handle the handles table does
//! not hold are counted as garbage. From a partition's list come its index
//! and next offset ([`rebuild_index`]) and its replay (both lanes, in
//! journal order, from a checkpoint's cursor).

use std::collections::{BTreeMap, BTreeSet};

use spool_wire::batch::{BatchHeader, BatchKind};

use super::entry::ENTRY_HEADER_BYTES;
use super::error::JournalError;
use super::recovery::{RecoveredEntry, RecoverySink};
use super::{JournalPos, Lane, PartitionHandle};

/// One entry of a partition as recovery found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutedEntry {
    pub position: JournalPos,
    /// `Data` for data batches, `Control` for control batches.
    pub lane: Lane,
    /// The batch's base offset: a data entry's first offset; for a control
    /// entry, the partition's next data offset when it was appended.
    pub first_offset: u64,
    pub record_count: u32,
    /// The batch's length (the entry less its header).
    pub batch_len: u32,
}

/// One data entry in a partition's index: ≈ 24 bytes per batch, not per
/// record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalIndexEntry {
    pub first_offset: u64,
    pub position: JournalPos,
    pub record_count: u32,
    pub batch_len: u32,
}

impl JournalIndexEntry {
    /// The offset after the entry's last record.
    pub fn end_offset(&self) -> u64 {
        self.first_offset + u64::from(self.record_count)
    }
}

/// Routes recovered entries into per-partition lists.
#[derive(Debug, Default)]
pub struct RecoveryRouter {
    known: BTreeSet<PartitionHandle>,
    partitions: BTreeMap<PartitionHandle, Vec<RoutedEntry>>,
    garbage_entries: u64,
    garbage_bytes: u64,
}

/// What routing gathered: each known partition's entries in journal order,
/// and the entries of unknown handles counted as garbage.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Routed {
    pub partitions: BTreeMap<PartitionHandle, Vec<RoutedEntry>>,
    pub garbage_entries: u64,
    /// Entry bytes (headers included) of the garbage entries.
    pub garbage_bytes: u64,
}

impl RecoveryRouter {
    /// A router for the partitions of `known` (the handles table).
    pub fn new(known: impl IntoIterator<Item = PartitionHandle>) -> Self {
        Self { known: known.into_iter().collect(), ..Self::default() }
    }

    pub fn finish(self) -> Routed {
        Routed {
            partitions: self.partitions,
            garbage_entries: self.garbage_entries,
            garbage_bytes: self.garbage_bytes,
        }
    }
}

impl RecoverySink for RecoveryRouter {
    fn entry(&mut self, entry: RecoveredEntry<'_>) {
        let entry_bytes = (ENTRY_HEADER_BYTES + entry.payload.len()) as u64;
        // Recovery checked both crcs of the payload; parsing cannot fail on
        // it, and an entry that did would be counted as garbage, not routed.
        let header = BatchHeader::parse(entry.payload);
        let (true, Ok(header)) = (self.known.contains(&entry.partition), header) else {
            self.garbage_entries += 1;
            self.garbage_bytes += entry_bytes;
            return;
        };
        let lane = if header.kind == BatchKind::Data { Lane::Data } else { Lane::Control };
        self.partitions.entry(entry.partition).or_default().push(RoutedEntry {
            position: entry.position,
            lane,
            first_offset: header.base_offset,
            record_count: header.record_count,
            batch_len: header.batch_len,
        });
    }
}

/// A partition's index and next offset from its routed entries: every data
/// entry, which must number the offsets densely from the first one (a crash
/// keeps a prefix of the journal, so a partition's recovered data entries
/// are a prefix of its appends). `floor` is the next offset when the list
/// holds no data entry (the checkpoint's, or 0).
///
/// # Errors
/// [`JournalError::OffsetGap`] naming the handle and the entry.
pub fn rebuild_index(
    handle: PartitionHandle,
    entries: &[RoutedEntry],
    floor: u64,
) -> Result<(Vec<JournalIndexEntry>, u64), JournalError> {
    let mut index: Vec<JournalIndexEntry> = Vec::new();
    for entry in entries.iter().filter(|entry| entry.lane == Lane::Data) {
        if let Some(last) = index.last() {
            if entry.first_offset != last.end_offset() {
                return Err(JournalError::OffsetGap {
                    handle: handle.0,
                    pos: entry.position,
                    expected: last.end_offset(),
                    found: entry.first_offset,
                });
            }
        }
        index.push(JournalIndexEntry {
            first_offset: entry.first_offset,
            position: entry.position,
            record_count: entry.record_count,
            batch_len: entry.batch_len,
        });
    }
    let next = index.last().map_or(floor, JournalIndexEntry::end_offset);
    Ok((index, next))
}
