//! Checkpoints of the fold: `snapshot` writes the state's canonical bytes
//! with a crc32c and the log offset they cover; `restore` rebuilds the state
//! (and every derived index) from them. Replaying the log after `covers`
//! onto a restored state gives the same state as replaying all of it; the
//! model test checks exactly that. File I/O is the caller's.
//!
//! Layout (little-endian): header (magic "SPQS", version, bands, covers,
//! highest enqueued + 1, last enqueue time, totals, credits), then fresh
//! entries per band, warm entries, dead letters, the dedupe section (each
//! list preceded by its u64 count), the stored counts per principal (the
//! attribution runs, then the counts, each list preceded by its u64 count),
//! the key map the log names last (version 4: u64 version, 0 for none, and
//! u32 partition count) and a replicated partition's group members (u8
//! flag, then the voters and the learners, each a u64 count and ids), the
//! subscriptions (version 5), the losses (version 6), the lanes (version 7, `SNAPSHOT_VERSION`
//! below), then crc32c of
//! everything before it. Derived indexes (phase sets, expiry
//! index, chunk headers) are not stored.
//!
//! The dedupe section (version 3): `dead_through` (u8 flag, u64 ms: entries
//! of the referenced generation files at or before it are dead), the
//! sealed generations written once as side files (count, then first
//! offset, base time, entry count, crc32c of each: `GenerationRef`), then
//! the open generation's live entries inline (count, 32 B each). Versions 1
//! and 2 hold every live entry inline and nothing else, and no stored
//! counts (nothing attributed).
//!
//! Files: this one holds the format (magic, versions, entry sizes, phase
//! tags) and the little-endian writer and reader both halves share;
//! `encode.rs` writes a snapshot in steps while the state serves;
//! `restore.rs` reads one back and checks it; `generations.rs` joins the
//! dedupe generation files a version-3 snapshot refers to (the references
//! an encoder writes, the second half of a restore).

mod encode;
mod generations;
mod restore;
mod subs;

use super::dedupe::DEDUPE_RECORD_BYTES;
use super::error::CodecError;
use super::state::PartitionState;
use super::types::Offset;
pub use encode::SnapshotEncoder;
pub use generations::PendingRestore;

const SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"SPQS");
/// Version 4 adds the key map the log names last (`Event::KeyMap`) and
/// the group members (`Event::Membership`), a trailing section; version 3 refers to sealed dedupe generations in side
/// files (the dedupe section, module docs) and adds the stored counts per
/// principal (a trailing section); version 2 adds the dead-letter moves by
/// cause to the totals; versions 3, 2 and 1 (nine totals) are still read,
/// version 1's moves' causes unknown.
///
/// Version 5 adds the subscriptions (`docs/design/subscriptions.md`), a
/// trailing section: the default subscription's cursor and
/// skipped marks per band (u64 cursor, u64 count, the offsets), the count
/// of the others, then for each: u16 id, its marks, its totals and
/// credits, its warm entries and its dead letters (each list preceded by
/// its u64 count). The fresh section is the shared index, the warm and
/// dead sections the default's. Versions 1 to 4 read as the default
/// subscription alone.
///
/// Version 6 adds the retention window's losses (`state/window.rs`), a
/// trailing section: for every subscription, the default first, its
/// `lost` total (u64) and its loss reports (u64 count, then from, to,
/// count and at_ms, u64 each). With a window the fresh section also holds
/// records no subscription has left to deliver. Version 5 reads with no
/// losses.
///
/// Version 7 adds the ordered lanes (`state/ordered.rs`), a trailing
/// section after the losses: for every subscription, the default first,
/// the heads of its lanes (u64 count, then offset and key, u64 each; 0
/// for an unordered subscription). A message waiting behind its head is a
/// warm entry of phase `PHASE_WAITING` (due, key, 0). Version 6 reads
/// with no lanes (no queue was ordered before it).
const SNAPSHOT_VERSION: u16 = 7;
/// The version before the lanes section.
const SNAPSHOT_VERSION_V6: u16 = 6;
/// The version before the losses section.
const SNAPSHOT_VERSION_V5: u16 = 5;
/// The version before the subscriptions section.
const SNAPSHOT_VERSION_V4: u16 = 4;
/// The version before the key map section.
const SNAPSHOT_VERSION_V3: u16 = 3;
/// The version before dedupe generation files and stored counts.
const SNAPSHOT_VERSION_V2: u16 = 2;
/// The oldest version `restore` reads.
const SNAPSHOT_VERSION_V1: u16 = 1;

/// A restored state and the log offset its snapshot covers: replay resumes
/// after it.
#[derive(Debug)]
pub struct Restored {
    pub state: PartitionState,
    pub covers: Offset,
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Phase tag and three time/identity fields.
    fn phase(&mut self, tag: u8, a: u64, b: u64, c: u64) {
        self.u8(tag);
        self.u64(a);
        self.u64(b);
        self.u64(c);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let end = self.at.checked_add(N).ok_or(CodecError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(CodecError::Truncated)?;
        self.at = end;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A list count, bounded by the bytes left so a corrupt count cannot
    /// make the reader allocate or loop beyond the input.
    fn count(&mut self, entry_bytes: usize) -> Result<usize, CodecError> {
        let count = usize::try_from(self.u64()?).map_err(|_| CodecError::Truncated)?;
        let left = self.bytes.len() - self.at;
        if count.checked_mul(entry_bytes).is_none_or(|need| need > left) {
            return Err(CodecError::Truncated);
        }
        Ok(count)
    }
    /// The next `len` bytes as one slice.
    fn take_slice(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        let end = self.at.checked_add(len).ok_or(CodecError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(CodecError::Truncated)?;
        self.at = end;
        Ok(slice)
    }
    fn phase(&mut self) -> Result<(u8, u64, u64, u64), CodecError> {
        Ok((self.u8()?, self.u64()?, self.u64()?, self.u64()?))
    }
}

const FRESH_ENTRY_BYTES: usize = 28;
const PHASE_BYTES: usize = 25;
const WARM_ENTRY_BYTES: usize = 8 + 8 + 8 + 4 + 1 + 2 + 4 + 2 + PHASE_BYTES;
const DEAD_ENTRY_BYTES: usize = WARM_ENTRY_BYTES + 1 + 8;
const DEDUPE_ENTRY_BYTES: usize = DEDUPE_RECORD_BYTES;
/// One generation reference: first offset, base time, entries, crc.
const DEDUPE_REF_BYTES: usize = 8 + 8 + 8 + 4;
/// A run: first offset, end, principal.
const STORED_RUN_BYTES: usize = 8 + 8 + 8;
/// A count: principal, messages, bytes.
const STORED_COUNT_BYTES: usize = 8 + 8 + 8;
/// A loss report: from, to, count, at_ms.
const LOSS_BYTES: usize = 8 + 8 + 8 + 8;
/// A lane head: offset, key.
const LANE_HEAD_BYTES: usize = 8 + 8;

const PHASE_SCHEDULED: u8 = 1;
const PHASE_READY: u8 = 2;
const PHASE_CLAIMED: u8 = 3;
const PHASE_WAITING: u8 = 4;
