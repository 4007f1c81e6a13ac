//! Recovery routing: the [`RecoverySink`] a shard opens its journal with.
//! Every intact entry goes, by the partition handle in its header, to that
//! partition's list of [`RoutedEntry`] — positions and batch-header facts
//! only, no payload bytes kept; entries of a handle the handles table does
//! not hold are counted as garbage. From a partition's list come its index
//! and next offset ([`rebuild_index`]) and its replay (both lanes, in
//! journal order, from a checkpoint's cursor).
//!
//! A **relocated copy** (`docs/design/shard-journal.md` §6) is a data entry
//! appended again, byte for byte, at the journal's head so that the file
//! holding the original can be released: its header's partition field is
//! the handle with [`RELOCATED_BIT`] set. It carries the same offsets as
//! the original, so a partition's index keeps one entry per offset range
//! (the later copy, when both are found), and replay never applies it: a
//! copy is made only of records a durable checkpoint already covers.

use std::collections::{BTreeMap, BTreeSet};

use spool_wire::batch::{BatchHeader, BatchKind};

use super::entry::Marker;
use super::error::JournalError;
use super::recovery::{RecoveredEntry, RecoverySink};
use super::{JournalPos, Lane, PartitionHandle};

/// Set in an entry header's partition field (beside the handle, which is
/// below [`super::HANDLES_MAX`]) on a relocated copy of a data entry. The
/// filler's field (`u32::MAX`) has it set too: fillers are recognised first.
pub const RELOCATED_BIT: u32 = 1 << 31;

const _: () = assert!((super::HANDLES_MAX as u64) < RELOCATED_BIT as u64);

/// The partition field of a relocated copy of `handle`'s entry.
pub fn relocated_field(handle: PartitionHandle) -> PartitionHandle {
    PartitionHandle(handle.0 | RELOCATED_BIT)
}

/// The handle an entry header's partition field names, and whether the
/// entry is a relocated copy.
pub fn split_field(field: PartitionHandle) -> (PartitionHandle, bool) {
    (PartitionHandle(field.0 & !RELOCATED_BIT), field.0 & RELOCATED_BIT != 0)
}

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
    /// Header and batch: where the entry ends (headers are 32 or 48 bytes).
    pub entry_len: u32,
    /// A relocated copy of a data entry: data only, never replayed.
    pub relocated: bool,
    /// Its index in the partition's log and its term (0 for a v1 entry or
    /// a relocated copy, which are no log entries of their own; a copy an
    /// install appended carries the install's).
    pub entry_index: u64,
    pub term: u64,
    /// A snapshot install's marker ([`Marker::Install`]): no batch; its
    /// index and term are where the installed log starts again. Taken out
    /// of the list by [`settle_installs`] before anything reads it.
    pub install: bool,
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

/// What a partition's markers said (`docs/design/shard-journal.md` §14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveredLog {
    /// The highest index a commit marker recorded (0: none found).
    pub committed: u64,
    /// Entries a truncation marker cancelled (dropped from the list).
    pub cancelled: u64,
    /// Truncation markers found.
    pub truncations: u64,
}

/// Routes recovered entries into per-partition lists.
#[derive(Debug, Default)]
pub struct RecoveryRouter {
    known: BTreeSet<PartitionHandle>,
    partitions: BTreeMap<PartitionHandle, Vec<RoutedEntry>>,
    logs: BTreeMap<PartitionHandle, RecoveredLog>,
    garbage_entries: u64,
    garbage_bytes: u64,
}

/// What routing gathered: each known partition's entries in journal order
/// (less those a truncation marker cancelled; markers themselves are not
/// listed), what its markers said, and the entries of unknown handles
/// counted as garbage.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Routed {
    pub partitions: BTreeMap<PartitionHandle, Vec<RoutedEntry>>,
    pub logs: BTreeMap<PartitionHandle, RecoveredLog>,
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
            logs: self.logs,
            garbage_entries: self.garbage_entries,
            garbage_bytes: self.garbage_bytes,
        }
    }
}

impl RecoverySink for RecoveryRouter {
    fn entry(&mut self, entry: RecoveredEntry<'_>) {
        let entry_bytes = u64::from(entry.entry_len);
        if let Some(marker) = entry.marker {
            let handle = PartitionHandle(entry.partition.0 & !super::entry::MARKER_BITS);
            if !self.known.contains(&handle) {
                self.garbage_entries += 1;
                self.garbage_bytes += entry_bytes;
                return;
            }
            let log = self.logs.entry(handle).or_default();
            match marker {
                Marker::Install => self.partitions.entry(handle).or_default().push(RoutedEntry {
                    position: entry.position,
                    lane: Lane::Control,
                    first_offset: 0,
                    record_count: 0,
                    batch_len: 0,
                    entry_len: entry.entry_len,
                    relocated: false,
                    entry_index: entry.entry_index,
                    term: entry.term,
                    install: true,
                }),
                Marker::Commit => log.committed = log.committed.max(entry.entry_index),
                Marker::Truncate => {
                    // Every entry of the partition from that index on found
                    // so far lies before the marker: cancelled.
                    let from = entry.entry_index;
                    let list = self.partitions.entry(handle).or_default();
                    let before = list.len();
                    // Copies and installs are not log entries of their own
                    // (an install's copies carry its index): never cancelled.
                    list.retain(|routed| {
                        routed.relocated
                            || routed.install
                            || routed.entry_index == 0
                            || routed.entry_index < from
                    });
                    log.cancelled += (before - list.len()) as u64;
                    log.truncations += 1;
                }
            }
            return;
        }
        // Recovery checked both crcs of the payload; parsing cannot fail on
        // it, and an entry that did would be counted as garbage, not routed.
        let header = BatchHeader::parse(entry.payload);
        let (handle, relocated) = split_field(entry.partition);
        let (true, Ok(header)) = (self.known.contains(&handle), header) else {
            self.garbage_entries += 1;
            self.garbage_bytes += entry_bytes;
            return;
        };
        let lane = if header.kind == BatchKind::Data { Lane::Data } else { Lane::Control };
        if relocated && lane != Lane::Data {
            // Only data entries are relocated: nothing of the journal's
            // writes such an entry, so it is not routed.
            self.garbage_entries += 1;
            self.garbage_bytes += entry_bytes;
            return;
        }
        self.partitions.entry(handle).or_default().push(RoutedEntry {
            position: entry.position,
            lane,
            first_offset: header.base_offset,
            record_count: header.record_count,
            batch_len: header.batch_len,
            entry_len: entry.entry_len,
            relocated,
            // A relocated copy is no log entry; an install's copies carry
            // the install's index and term (`settle_installs`).
            entry_index: entry.entry_index,
            term: entry.term,
            install: false,
        });
    }
}

/// Takes a replicated partition's snapshot installs out of its routed
/// entries (`docs/design/replication.md` §6, "Install"). An install appends
/// its marker ([`Marker::Install`], naming the (index, term) the log starts
/// again after), then the snapshot's live records as relocated copies, and
/// is in effect once the checkpoint it writes is in place: that
/// checkpoint, and every later one, records the marker's position as the
/// log's start (`log_start`). So:
///
/// - every entry before `log_start` belongs to the log the install replaced
///   and is dropped (older installs' markers included);
/// - the marker at `log_start` gives the floor, returned as (index, term)
///   (`None` once its file is released: later checkpoints start the log
///   at entries it holds);
/// - any other marker is an install that never finished (a crash, or a
///   transfer that failed, before its checkpoint was renamed): it and its
///   copies (relocated copies stamped with its index and term; the
///   partition's own relocations carry none) are dropped, and the log is
///   the one before.
pub fn settle_installs(
    entries: &mut Vec<RoutedEntry>,
    log_start: Option<u64>,
) -> Option<(u64, u64)> {
    let mut floor = None;
    if let Some(log_start) = log_start {
        // Its file may be released since: a later checkpoint starts the
        // scan past it, and the log's floor is then an entry it holds.
        floor = entries
            .iter()
            .find(|entry| entry.install && entry.position.0 == log_start)
            .map(|marker| (marker.entry_index, marker.term));
        entries.retain(|entry| entry.position.0 > log_start);
    }
    let unfinished: Vec<(u64, u64)> = entries
        .iter()
        .filter(|entry| entry.install)
        .map(|entry| (entry.entry_index, entry.term))
        .collect();
    if !unfinished.is_empty() {
        entries.retain(|entry| {
            let copy_of_unfinished = entry.relocated
                && entry.entry_index > 0
                && unfinished.contains(&(entry.entry_index, entry.term));
            !(entry.install || copy_of_unfinished)
        });
    }
    floor
}

/// A partition's index and next offset from its routed entries: every data
/// entry, sorted by first offset. The entries that are not relocated copies
/// must number the offsets densely from the first one (a crash keeps a
/// prefix of the journal, so a partition's recovered appends are a prefix
/// of its appends); a relocated copy replaces the entry of the same offsets
/// found before it (the original, or an older copy) or, when the original's
/// file was released, stands alone below the appends. `floor` is the next
/// offset when the list holds no data entry (the checkpoint's, or 0).
///
/// # Errors
/// [`JournalError::OffsetGap`] naming the handle and the entry: appends not
/// dense, or a copy that overlaps another entry without matching it.
pub fn rebuild_index(
    handle: PartitionHandle,
    entries: &[RoutedEntry],
    floor: u64,
) -> Result<(Vec<JournalIndexEntry>, u64), JournalError> {
    let mut by_offset: BTreeMap<u64, JournalIndexEntry> = BTreeMap::new();
    let mut appended_end: Option<u64> = None;
    for entry in entries.iter().filter(|entry| entry.lane == Lane::Data) {
        let indexed = JournalIndexEntry {
            first_offset: entry.first_offset,
            position: entry.position,
            record_count: entry.record_count,
            batch_len: entry.batch_len,
        };
        let gap = |expected: u64| JournalError::OffsetGap {
            handle: handle.0,
            pos: entry.position,
            expected,
            found: entry.first_offset,
        };
        if entry.relocated {
            // The same range as an entry found before, or one overlapping
            // none.
            if let Some(same) = by_offset.get(&entry.first_offset) {
                if same.record_count != entry.record_count {
                    return Err(gap(same.end_offset()));
                }
            } else {
                let below = by_offset.range(..entry.first_offset).next_back();
                if let Some((_, below)) = below.filter(|(_, e)| e.end_offset() > entry.first_offset)
                {
                    return Err(gap(below.end_offset()));
                }
                let above = by_offset.range(entry.first_offset..).next();
                if let Some((_, above)) =
                    above.filter(|(_, e)| e.first_offset < indexed.end_offset())
                {
                    return Err(gap(above.first_offset));
                }
            }
            by_offset.insert(entry.first_offset, indexed);
            continue;
        }
        if let Some(end) = appended_end {
            if entry.first_offset != end {
                return Err(gap(end));
            }
        } else if let Some((_, last)) = by_offset.iter().next_back() {
            // Copies found before the first append: all below it.
            if last.end_offset() > entry.first_offset {
                return Err(gap(last.end_offset()));
            }
        }
        appended_end = Some(indexed.end_offset());
        by_offset.insert(entry.first_offset, indexed);
    }
    let index: Vec<JournalIndexEntry> = by_offset.into_values().collect();
    // The appends' end (copies lie below it); without appends the floor
    // (copies lie below the checkpoint that let them be made).
    let copies_end = index.last().map_or(0, JournalIndexEntry::end_offset);
    let next = appended_end.unwrap_or(floor).max(copies_end);
    Ok((index, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(position: u64, first_offset: u64, record_count: u32, relocated: bool) -> RoutedEntry {
        RoutedEntry {
            position: JournalPos(position),
            lane: Lane::Data,
            first_offset,
            record_count,
            batch_len: 64,
            entry_len: 112,
            relocated,
            entry_index: 0,
            term: 0,
            install: false,
        }
    }

    #[test]
    fn a_copy_replaces_its_original_or_stands_alone_below_the_appends() {
        // Goal: the later of an original and its relocated copy is indexed; a copy whose
        // original's file is gone is indexed below the appends; the next offset is the appends'
        // end (or the floor), never a copy's.
        let handle = PartitionHandle(3);
        let both = [data(0, 0, 2, false), data(100, 2, 3, false), data(900, 0, 2, true)];
        let (index, next) = rebuild_index(handle, &both, 0).unwrap();
        assert_eq!(index.len(), 2);
        assert_eq!((index[0].first_offset, index[0].position), (0, JournalPos(900)));
        assert_eq!(next, 5);
        let alone = [data(500, 40, 4, false), data(900, 7, 1, true), data(1000, 44, 1, false)];
        let (index, next) = rebuild_index(handle, &alone, 0).unwrap();
        let offsets: Vec<u64> = index.iter().map(|entry| entry.first_offset).collect();
        assert_eq!(offsets, vec![7, 40, 44]);
        assert_eq!(next, 45);
        // Only a copy, the checkpoint's next offset as the floor.
        let (index, next) = rebuild_index(handle, &[data(900, 7, 1, true)], 60).unwrap();
        assert_eq!((index.len(), next), (1, 60));
    }

    #[test]
    fn appends_must_stay_dense_and_copies_must_match_what_they_overlap() {
        // Goal: a gap between appends is still refused with copies around, and a copy that
        // overlaps an entry without matching its range is refused.
        let handle = PartitionHandle(3);
        let gap = [data(0, 0, 2, false), data(50, 0, 2, true), data(100, 3, 1, false)];
        assert!(matches!(rebuild_index(handle, &gap, 0), Err(JournalError::OffsetGap { .. })));
        let skewed = [data(0, 0, 4, false), data(100, 2, 2, true)];
        assert!(matches!(rebuild_index(handle, &skewed, 0), Err(JournalError::OffsetGap { .. })));
        let resized = [data(0, 0, 4, false), data(100, 0, 2, true)];
        assert!(matches!(rebuild_index(handle, &resized, 0), Err(JournalError::OffsetGap { .. })));
    }

    #[test]
    fn the_relocated_bit_round_trips_beside_any_handle() {
        // Goal: every handle the table can hold keeps its value under the relocated bit.
        for handle in [0, 1, 4_096, (super::super::HANDLES_MAX - 1) as u32] {
            let field = relocated_field(PartitionHandle(handle));
            assert_eq!(split_field(field), (PartitionHandle(handle), true));
            assert_eq!(split_field(PartitionHandle(handle)), (PartitionHandle(handle), false));
        }
    }

    fn install(position: u64, index: u64, term: u64) -> RoutedEntry {
        RoutedEntry {
            lane: Lane::Control,
            entry_index: index,
            term,
            install: true,
            ..data(position, 0, 0, false)
        }
    }

    fn copy_of(position: u64, first_offset: u64, install: (u64, u64)) -> RoutedEntry {
        RoutedEntry {
            entry_index: install.0,
            term: install.1,
            ..data(position, first_offset, 2, true)
        }
    }

    fn logged(position: u64, first_offset: u64, index: u64) -> RoutedEntry {
        RoutedEntry { entry_index: index, term: 3, ..data(position, first_offset, 2, false) }
    }

    #[test]
    fn a_finished_install_replaces_the_log_before_it_and_an_unfinished_one_leaves_no_trace() {
        // Goal: with the checkpoint naming an install, everything before that marker goes and
        // the marker gives the floor; an install no checkpoint names (a crash or failed
        // transfer before its checkpoint) goes with its own copies, never the partition's
        // own relocated copies nor its appends.
        let old = [logged(0, 0, 1), logged(100, 2, 2), data(150, 0, 2, true)];
        let mut entries = old.to_vec();
        entries.extend([install(200, 40, 5), copy_of(300, 10, (40, 5)), copy_of(400, 30, (40, 5))]);
        entries.extend([logged(500, 80, 41)]);
        let mut finished = entries.clone();
        assert_eq!(settle_installs(&mut finished, Some(200)), Some((40, 5)));
        let positions: Vec<u64> = finished.iter().map(|entry| entry.position.0).collect();
        assert_eq!(positions, vec![300, 400, 500]);

        let mut unfinished = entries.clone();
        // A restart after it: the old log goes on, its own copies carry no index.
        unfinished.extend([data(600, 2, 2, true), logged(700, 4, 3)]);
        assert_eq!(settle_installs(&mut unfinished, None), None);
        let positions: Vec<u64> = unfinished.iter().map(|entry| entry.position.0).collect();
        assert_eq!(positions, vec![0, 100, 150, 500, 600, 700]);

        // A second attempt finished after a first that failed: only the second counts.
        let mut twice = old.to_vec();
        twice.extend([install(200, 40, 5), copy_of(300, 10, (40, 5))]);
        twice.extend([install(350, 44, 6), copy_of(360, 10, (44, 6)), logged(500, 80, 45)]);
        assert_eq!(settle_installs(&mut twice, Some(350)), Some((44, 6)));
        let positions: Vec<u64> = twice.iter().map(|entry| entry.position.0).collect();
        assert_eq!(positions, vec![360, 500]);

        // The marker's file released since: entries before the start still go.
        let mut released = vec![copy_of(300, 10, (40, 5)), logged(500, 80, 41)];
        assert_eq!(settle_installs(&mut released, Some(200)), None);
        assert_eq!(released.len(), 2);
    }
}
