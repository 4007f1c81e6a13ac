//! The vote log's on-disk record and the scan recovery runs over a whole
//! file: pure functions over bytes, no I/O (the layout and the rules are
//! explained in the module doc of [`crate::log::vote`] and in
//! `docs/design/shard-journal.md` §16).
//!
//! A record is 32 bytes, little-endian, so 16 fill a 512-byte sector and
//! none straddles one:
//!
//! ```text
//!  0  4  partition handle
//!  4  4  cycle number (1, 2, … within one file; one per write)
//!  8  8  term
//! 16  8  vote (node id, 0 = none)
//! 24  1  format version (1)
//! 25  2  zero (reserved)
//! 27  4  crc32c of bytes [0, 27)
//! 31  1  end mark 0xB7
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::limits::PAGE_BYTES;
use crate::log::journal::PartitionHandle;

/// Size of one record (a format size, not a limit).
pub const RECORD_LEN: usize = 32;
/// Records in one page.
pub const RECORDS_PER_PAGE: usize = PAGE_BYTES as usize / RECORD_LEN;
/// The record format this code writes and the only one it reads.
pub const FORMAT_VERSION: u8 = 1;
/// The last byte of every record. Never zero: a slot whose last byte is
/// zero was not completely written (a torn slot).
pub const END_MARK: u8 = 0xB7;
/// Bytes the crc covers.
const CRC_COVERS: usize = 27;

const _: () = assert!((PAGE_BYTES as usize).is_multiple_of(RECORD_LEN));
const _: () = assert!((crate::limits::SECTOR_BYTES as usize).is_multiple_of(RECORD_LEN));

/// A partition's Raft vote state: its current term and the node it voted
/// for in that term (0: none yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Vote {
    pub term: u64,
    pub vote: u64,
}

impl Vote {
    pub fn new(term: u64, vote: u64) -> Self {
        Self { term, vote }
    }
}

/// What one 32-byte slot of a file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// All zeros: never written (padding after a cycle's last record, or
    /// past the end).
    Zero,
    /// Some bytes written but not the end mark: what a write torn inside
    /// this slot leaves, since writes land over zeros and a torn sector
    /// keeps a prefix of its new bytes (§15).
    Torn,
    /// The end mark is there but the record is not intact (crc, version or
    /// reserved bytes): no torn write leaves this. Damage.
    Bad(String),
    Valid(Record),
}

/// One intact record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub cycle: u32,
    pub handle: PartitionHandle,
    pub vote: Vote,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Writes one record into `out` (exactly [`RECORD_LEN`] bytes).
pub(crate) fn encode_record(out: &mut [u8], cycle: u32, handle: PartitionHandle, vote: Vote) {
    out[0..4].copy_from_slice(&handle.0.to_le_bytes());
    out[4..8].copy_from_slice(&cycle.to_le_bytes());
    out[8..16].copy_from_slice(&vote.term.to_le_bytes());
    out[16..24].copy_from_slice(&vote.vote.to_le_bytes());
    out[24] = FORMAT_VERSION;
    out[25..27].fill(0);
    let crc = crc32c::crc32c(&out[..CRC_COVERS]);
    out[27..31].copy_from_slice(&crc.to_le_bytes());
    out[31] = END_MARK;
}

/// Bytes a cycle of `records` records takes on disk: whole pages.
pub(crate) fn cycle_len(records: usize) -> u64 {
    ((records * RECORD_LEN) as u64).div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Fills `out` (whole pages) with one cycle: the records in order, then
/// zeros to the end.
pub(crate) fn encode_cycle(
    out: &mut [u8],
    cycle: u32,
    records: impl IntoIterator<Item = (PartitionHandle, Vote)>,
) {
    let mut at = 0;
    for (handle, vote) in records {
        encode_record(&mut out[at..at + RECORD_LEN], cycle, handle, vote);
        at += RECORD_LEN;
    }
    out[at..].fill(0);
}

/// Classifies one slot (exactly [`RECORD_LEN`] bytes).
pub(crate) fn classify(slot: &[u8]) -> Slot {
    if slot.iter().all(|byte| *byte == 0) {
        return Slot::Zero;
    }
    match slot[31] {
        0 => return Slot::Torn,
        END_MARK => {}
        mark => return Slot::Bad(format!("end mark {mark:#04x}, not {END_MARK:#04x}")),
    }
    if u32_at(slot, 27) != crc32c::crc32c(&slot[..CRC_COVERS]) {
        return Slot::Bad("crc mismatch".to_owned());
    }
    if slot[24] != FORMAT_VERSION {
        return Slot::Bad(format!(
            "format version {} (this binary reads {FORMAT_VERSION})",
            slot[24]
        ));
    }
    if slot[25] != 0 || slot[26] != 0 {
        return Slot::Bad("reserved bytes set".to_owned());
    }
    Slot::Valid(Record {
        cycle: u32_at(slot, 4),
        handle: PartitionHandle(u32_at(slot, 0)),
        vote: Vote { term: u64_at(slot, 8), vote: u64_at(slot, 16) },
    })
}

/// What a file holds, once scanned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// The last record of each partition, in file order.
    pub latest: BTreeMap<PartitionHandle, Vote>,
    /// Where the next cycle goes (a page boundary; only zeros from here on
    /// when `repair` is false).
    pub end: u64,
    /// Number of the next cycle.
    pub next_cycle: u32,
    /// The last cycle is torn: the file must be rewritten (with `latest`)
    /// before anything is appended to it.
    pub repair: bool,
}

/// Why a file is refused: the byte position of the first slot found
/// wrong, and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    pub pos: u64,
    pub reason: String,
}

fn damage(slot: usize, reason: String) -> Damage {
    Damage { pos: (slot * RECORD_LEN) as u64, reason }
}

/// Scans a whole file. `bytes` need not be a page multiple (what is missing
/// reads as zeros).
///
/// The file is a run of cycles, each written by one `write_at` starting on
/// a fresh page: its records, then zeros to the page end; cycle `n + 1`
/// was written only after cycle `n` was synced. So every cycle but the last
/// is intact, and the last may be torn in any way a write into zeros can
/// be: slots zero, [`Slot::Torn`], or intact, in any mix. The scan:
///
/// - refuses any [`Slot::Bad`] slot, wherever it is;
/// - takes the last cycle number `c` of any intact record; every page
///   up to the last one holding a record of an earlier cycle (the prefix)
///   must be whole: starting with a record, records of one cycle then
///   zeros, cycles numbered 1, 2, … with a new cycle only after a page
///   that ends in zeros or is full — anything else is refused;
/// - the rest (the tail) must be cycle `c`, one after the prefix's last:
///   its leading intact records are kept; if anything but zeros follows
///   them, the tail is torn and `repair` is set (what follows is cut).
///
/// # Errors
/// [`Damage`] naming the first wrong slot.
pub(crate) fn scan(bytes: &[u8]) -> Result<Scanned, Damage> {
    let page = PAGE_BYTES as usize;
    let bytes: Cow<'_, [u8]> = if bytes.len().is_multiple_of(page) {
        Cow::Borrowed(bytes)
    } else {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().div_ceil(page) * page, 0);
        Cow::Owned(padded)
    };
    let slots: Vec<Slot> = bytes.chunks_exact(RECORD_LEN).map(classify).collect();
    if let Some((index, Slot::Bad(reason))) =
        slots.iter().enumerate().find(|(_, slot)| matches!(slot, Slot::Bad(_)))
    {
        return Err(damage(index, reason.clone()));
    }
    let cycle_of = |slot: &Slot| match slot {
        Slot::Valid(record) => Some(record.cycle),
        _ => None,
    };
    let Some(last) = slots.iter().filter_map(cycle_of).max() else {
        let repair = slots.iter().any(|slot| *slot != Slot::Zero);
        return Ok(Scanned { latest: BTreeMap::new(), end: 0, next_cycle: 1, repair });
    };
    let tail_page = slots
        .iter()
        .rposition(|slot| cycle_of(slot).is_some_and(|cycle| cycle < last))
        .map_or(0, |index| index / RECORDS_PER_PAGE + 1);
    let mut latest = BTreeMap::new();
    // (cycle of the previous page, whether that page was full)
    let mut previous: Option<(u32, bool)> = None;
    for page_index in 0..tail_page {
        let first_slot = page_index * RECORDS_PER_PAGE;
        let page_slots = &slots[first_slot..first_slot + RECORDS_PER_PAGE];
        let Slot::Valid(first) = &page_slots[0] else {
            return Err(damage(first_slot, "a page of a synced cycle has no record".to_owned()));
        };
        let cycle = first.cycle;
        let follows = match previous {
            None => cycle == 1,
            Some((before, full)) => cycle == before + 1 || (full && cycle == before),
        };
        if !follows {
            let before = previous.map_or(0, |(before, _)| before);
            return Err(damage(first_slot, format!("cycle {cycle} follows cycle {before}")));
        }
        let mut records = 0;
        for (index, slot) in page_slots.iter().enumerate() {
            match slot {
                Slot::Valid(record) if record.cycle == cycle && records == index => {
                    latest.insert(record.handle, record.vote);
                    records += 1;
                }
                Slot::Zero if records <= index => {}
                _ => {
                    return Err(damage(
                        first_slot + index,
                        format!("a synced cycle ({cycle}) is not whole: records, then zeros"),
                    ))
                }
            }
        }
        previous = Some((cycle, records == RECORDS_PER_PAGE));
    }
    let expected = previous.map_or(1, |(before, _)| before + 1);
    let tail_slot = tail_page * RECORDS_PER_PAGE;
    if last != expected {
        let at = slots[tail_slot..].iter().position(|slot| cycle_of(slot).is_some()).unwrap_or(0);
        return Err(damage(tail_slot + at, format!("cycle {last} where cycle {expected} was due")));
    }
    let tail = &slots[tail_slot..];
    let kept = tail.iter().take_while(|slot| matches!(slot, Slot::Valid(_))).count();
    for slot in &tail[..kept] {
        if let Slot::Valid(record) = slot {
            latest.insert(record.handle, record.vote);
        }
    }
    let repair = tail[kept..].iter().any(|slot| *slot != Slot::Zero);
    let end = cycle_len(tail_slot + kept);
    let next_cycle = if kept > 0 { last + 1 } else { expected };
    Ok(Scanned { latest, end, next_cycle, repair })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, vote: u64) -> Vote {
        Vote { term, vote }
    }

    /// A file of `cycles`, each a list of (handle, term, vote).
    fn file(cycles: &[&[(u32, u64, u64)]]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (index, records) in cycles.iter().enumerate() {
            let mut out = vec![0xEE; cycle_len(records.len()) as usize];
            let records = records
                .iter()
                .map(|(handle, term, node)| (PartitionHandle(*handle), vote(*term, *node)));
            encode_cycle(&mut out, index as u32 + 1, records);
            bytes.extend_from_slice(&out);
        }
        bytes
    }

    fn one_record(handle: u32, term: u64, node: u64) -> Vec<u8> {
        let mut out = vec![0u8; RECORD_LEN];
        encode_record(&mut out, 3, PartitionHandle(handle), vote(term, node));
        out
    }

    #[test]
    fn a_vote_record_round_trips_and_every_flipped_bit_is_caught() {
        // Goal: encode/classify round trip; any single bit flip is never
        // read as an intact record, and a flip outside the end mark is
        // damage (Bad), never a torn write.
        let bytes = one_record(7, 9, 4);
        let expected = Record { cycle: 3, handle: PartitionHandle(7), vote: vote(9, 4) };
        assert_eq!(classify(&bytes), Slot::Valid(expected));
        for bit in 0..RECORD_LEN * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let slot = classify(&flipped);
            assert!(matches!(slot, Slot::Bad(_)), "bit {bit}: {slot:?}");
        }
    }

    #[test]
    fn a_vote_record_torn_at_any_byte_reads_as_torn() {
        // Goal: every strict prefix of a record followed by zeros (what a
        // torn sector leaves over zeros) is Torn or Zero, never Bad.
        let bytes = one_record(1, u64::MAX, u64::MAX);
        for cut in 0..RECORD_LEN {
            let mut torn = vec![0u8; RECORD_LEN];
            torn[..cut].copy_from_slice(&bytes[..cut]);
            let slot = classify(&torn);
            assert!(matches!(slot, Slot::Torn | Slot::Zero), "cut {cut}: {slot:?}");
        }
    }

    #[test]
    fn a_vote_file_scan_keeps_the_last_record_per_partition() {
        // Goal: the last record of each partition wins; end and the next
        // cycle follow the last cycle; a multi-page cycle is whole.
        let many: Vec<(u32, u64, u64)> = (0..200).map(|handle| (handle, 1, 0)).collect();
        let bytes = file(&[&[(1, 1, 0), (2, 1, 5)], &many, &[(1, 2, 3)]]);
        let scanned = scan(&bytes).unwrap();
        assert_eq!(scanned.latest.len(), 200);
        assert_eq!(scanned.latest[&PartitionHandle(1)], vote(2, 3));
        assert_eq!(scanned.latest[&PartitionHandle(2)], vote(1, 0));
        assert_eq!(scanned.end, 4 * PAGE_BYTES);
        assert_eq!(scanned.next_cycle, 4);
        assert!(!scanned.repair);
        // Zeros after the end (and a length that is not a page multiple)
        // change nothing.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0u8; 1000]);
        assert_eq!(scan(&longer).unwrap(), scanned);
        // Empty and all-zero files hold nothing.
        let empty = scan(&[]).unwrap();
        assert_eq!((empty.end, empty.next_cycle, empty.repair), (0, 1, false));
        assert_eq!(scan(&vec![0u8; 8192]).unwrap(), empty);
    }

    #[test]
    fn a_torn_last_vote_cycle_is_cut_and_damage_before_it_refused() {
        // Goal: any mix of zero and torn slots in the last cycle is cut
        // (repair), keeping its leading intact records; the same shapes in
        // a cycle followed by a later one are refused with the slot's
        // position.
        let bytes = file(&[&[(1, 1, 0)], &[(2, 1, 0), (3, 1, 0), (4, 1, 0)]]);
        let page = PAGE_BYTES as usize;
        // The second record of the last cycle torn.
        let mut torn = bytes.clone();
        torn[page + RECORD_LEN + 10..page + 2 * RECORD_LEN].fill(0);
        let scanned = scan(&torn).unwrap();
        assert!(scanned.repair);
        assert_eq!(scanned.latest.keys().map(|h| h.0).collect::<Vec<_>>(), vec![1, 2]);
        // Its first record lost, later ones landed: all of the cycle cut.
        let mut holed = bytes.clone();
        holed[page..page + RECORD_LEN].fill(0);
        let scanned = scan(&holed).unwrap();
        assert!(scanned.repair);
        assert_eq!(scanned.latest.keys().map(|h| h.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(scanned.next_cycle, 2);
        // The same damage in cycle 1 while cycle 2 is intact: refused.
        let two = file(&[&[(1, 1, 0), (5, 1, 0)], &[(2, 1, 0)]]);
        let mut early = two.clone();
        early[RECORD_LEN + 20..2 * RECORD_LEN].fill(0);
        assert_eq!(scan(&early).unwrap_err().pos, RECORD_LEN as u64);
        let mut gap = two.clone();
        gap[..RECORD_LEN].fill(0);
        assert_eq!(scan(&gap).unwrap_err().pos, 0);
        // A flipped bit in the very last record (end mark intact) is damage,
        // not a torn tail.
        let mut rotten = bytes.clone();
        rotten[page + 2 * RECORD_LEN + 9] ^= 4;
        assert_eq!(scan(&rotten).unwrap_err().pos, (page + 2 * RECORD_LEN) as u64);
    }

    #[test]
    fn a_lost_or_misnumbered_vote_cycle_is_refused() {
        // Goal: a whole synced cycle missing (zeros between two intact
        // cycles, or numbers that skip) and a file not starting at cycle 1
        // are refused.
        let page = PAGE_BYTES as usize;
        let bytes = file(&[&[(1, 1, 0)], &[(2, 1, 0)], &[(3, 1, 0)]]);
        let mut lost = bytes.clone();
        lost[page..2 * page].fill(0);
        assert_eq!(scan(&lost).unwrap_err().pos, 2 * page as u64);
        let mut skipped = bytes[..page].to_vec();
        skipped.extend_from_slice(&bytes[2 * page..]);
        assert!(scan(&skipped).is_err());
        let late = bytes[page..].to_vec();
        assert_eq!(scan(&late).unwrap_err().pos, 0);
        // A page of an earlier cycle after a later one.
        let mut swapped = bytes[page..2 * page].to_vec();
        swapped.extend_from_slice(&bytes[..page]);
        swapped.extend_from_slice(&bytes[2 * page..]);
        assert!(scan(&swapped).is_err());
    }
}
