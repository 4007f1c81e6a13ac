//! The dedupe window of one partition: which message ids were enqueued
//! recently, and at which offset.
//!
//! Owns only the id → (original offset, enqueue time) memory and its expiry;
//! the rules (what counts as inside the window, when an entry is recorded)
//! are the ones `docs/design/queue-semantics.md` states, unchanged from the
//! map this replaced. Does no I/O and reads no clock.
//!
//! Why this shape: at 25,000 enqueues/s a 5-minute window holds 7.5 M ids,
//! and a `BTreeMap` plus an expiry FIFO cost ~88 B each. Here an entry is 24
//! bytes in an append-only arena (the full 16-byte id, offset and time as
//! 32-bit deltas) plus one 4-byte slot of an open-addressing table between
//! 7/10 and 7/8 full: ≈ 29–30 B. Entries live in time-bucketed **generations** of
//! `window / DEDUPE_GENERATIONS` each; expiry drops a whole generation (arena
//! and table) once its newest entry has left the window, instead of one FIFO
//! pop per entry. Entries of the oldest generation that are already outside
//! the window linger until then (at most one generation's worth) and are
//! treated exactly as the old map treated a pruned id: absent.
//!
//! A generation's index grows in small steps, never by doubling the whole
//! table: it is a directory of **sub-tables** (extendible hashing). A
//! sub-table that fills grows by a quarter while it is under
//! [`SUBTABLE_SLOTS_MAX`] slots (256 KiB; so none passes 5/4 of that,
//! 320 KiB), and past it splits in two by one more bit of the hash, each
//! half sized for half its ids at 7/10 full (the split is one 5/4 step of
//! the whole); only its own entries move. So the slots held stay within
//! 4/(7/10) ≈ 5.7 B per entry at any size (a doubled table held up to
//! 9.1 B, and 13.7 B during the copy), and growing holds at most one
//! sub-table twice, not the whole table: a generation of 1.8 M ids no
//! longer copies 8 MB into a 16 MB table.
//!
//! A slot keeps 8 bits of the hash, so an id that moves is hashed again.
//! Every step is a 5/4 step of the ids it moves, placed in one pass: an id
//! is hashed about 4 times more while its generation grows from empty
//! (4/5 + (4/5)² + …), and a presized generation (every one after a
//! partition's first, at a steady rate) does not grow. A step loads its
//! ids in batches before hashing them, so their cache misses overlap.
//!
//! Ids are compared in full, so two distinct ids never collide. Slots are
//! placed by SipHash-1-3 keyed from the broker secret, so a client cannot
//! choose ids that pile into one probe chain (written out for the 16-byte
//! id: six SipRounds, no buffering; the same function as the generic
//! hasher, which a test checks). The key is derived
//! (`blake3::derive_key`) from the secret the data directory already keeps;
//! the layout is never persisted (snapshots list entries in time order), so
//! nothing new is stored.
//!
//! Semantics, as the old map: `record(id, offset, now)` first forgets every
//! entry with `time + window <= now`, then stores `id` unless it still has an
//! entry. `hit(now, id)` answers the stored entry's offset when `time +
//! window > now`. The "forgotten" horizon is the `now` of the last `record`
//! since the table was built or restored (after a restore nothing has been
//! forgotten yet), and the entry the last `record` stored survives until the
//! next `record` even with a zero window.
//!
//! Files: this one holds the table (`DedupeTable`: the window's rules, the
//! list of generations, the admission memo), the index geometry all parts
//! share, and the stored form of an entry; `generation.rs` one generation
//! (its arena and sub-table index: placement, probes, growth, splits);
//! `keys.rs` the slot hash; `checkpoint.rs` what checkpoints read and
//! restores rebuild (the stepped listing, sealed generations, groups).

mod checkpoint;
mod generation;
mod keys;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use super::limits::{
    ADMISSION_BATCH_MAX, DEDUPE_ABSENT_MEMO_KEPT_MAX, DEDUPE_CHUNK_ENTRIES, DEDUPE_GENERATIONS,
    DEDUPE_GENERATION_ENTRIES_MAX,
};
use super::types::{MessageId, Millis, Offset};
pub(crate) use checkpoint::{
    DedupeCapture, DedupeCursor, RestoreError, RestoreGroup, SealedGeneration,
};
use generation::{slots_for, tag_of, Generation, Probe};
use keys::Keys;

// The geometry of the index (the module docs give the reasons);
// `generation.rs` builds it, the table and its invariant check read it.

/// Low bits of a slot: arena index + 1 (0 marks an empty slot).
const SLOT_INDEX_BITS: u32 = 24;
const SLOT_INDEX_MASK: u32 = (1 << SLOT_INDEX_BITS) - 1;
/// A sub-table grows (or splits) before it is fuller than 7/8, so a probe
/// always meets an empty slot.
const LOAD_MAX_NUMERATOR: usize = 7;
const LOAD_MAX_DENOMINATOR: usize = 8;
/// A new generation's table is sized for the previous generation's entries
/// at load 4/5: under a steady rate it never grows, and ends near 4/5 full.
const PRESIZE_NUMERATOR: usize = 5;
const PRESIZE_DENOMINATOR: usize = 4;
/// Smallest table of a generation.
const SLOTS_MIN: usize = 64;
/// Smallest capacity of a generation's first entry chunk (8 entries, 192 B).
const FIRST_CHUNK_FLOOR_ENTRIES: usize = 8;
/// Sub-table size (256 KiB of slots) from which a full sub-table splits in
/// two instead of growing; a grown one stays under 5/4 of it.
pub(crate) const SUBTABLE_SLOTS_MAX: usize = 1 << 16;
/// A sub-table under [`SUBTABLE_SLOTS_MAX`] grows by this factor (5/4), so
/// a grown table is still 7/10 full.
const GROW_NUMERATOR: usize = 5;
const GROW_DENOMINATOR: usize = 4;
/// Hash bits that pick a sub-table start here (the low byte is the slot
/// tag; the home slot comes from the high bits).
const DIRECTORY_SHIFT: u32 = 8;
/// Deepest directory (2^16 sub-tables, far past what
/// `DEDUPE_GENERATION_ENTRIES_MAX` needs); a sub-table of a directory this
/// deep grows past `SUBTABLE_SLOTS_MAX` instead of splitting.
const DIRECTORY_DEPTH_MAX: u32 = 16;
/// A dropped generation with at most this many slots is kept for reuse by
/// the next one: with a tiny window (0 ms is valid) a generation lives for a
/// millisecond, and allocating its arena chunk each time would dominate.
const SPARE_SLOTS_MAX: usize = 4096;

const _: () = assert!(DEDUPE_GENERATION_ENTRIES_MAX < SLOT_INDEX_MASK as usize);
const _: () = assert!(DEDUPE_CHUNK_ENTRIES.is_power_of_two());
const _: () = assert!(SPARE_SLOTS_MAX <= SUBTABLE_SLOTS_MAX);
const _: () = assert!(DIRECTORY_SHIFT + DIRECTORY_DEPTH_MAX <= 32);
const _: () = assert!(
    super::limits::DEDUPE_WINDOW_MS_MAX / DEDUPE_GENERATIONS as u64 <= u32::MAX as u64,
    "a generation's time deltas fit 32 bits"
);

/// The dedupe window. See the module docs.
#[derive(Debug)]
pub(crate) struct DedupeTable {
    keys: Keys,
    window_ms: Millis,
    /// Time span of one generation: `window / DEDUPE_GENERATIONS`, at least 1.
    span_ms: Millis,
    generations: VecDeque<Generation>,
    /// `now` of the last `record` since construction or restore: entries
    /// with `time + window <= horizon` are forgotten. `None`: none yet.
    horizon_ms: Option<Millis>,
    /// The entry the last `record` stored (alive until the next `record`).
    last_recorded: Option<Offset>,
    /// Entries of the last generation dropped or closed: the size estimate
    /// of the next one.
    last_generation_len: usize,
    /// A small dropped generation kept for reuse (`SPARE_SLOTS_MAX`).
    spare: Option<Generation>,
    /// While a checkpoint reads the table in steps: the generations dropped
    /// since it began, oldest first, kept until it ends. The checkpoint
    /// reads `retained` then `generations` as one list, which only grows at
    /// its end while it is held (see [`DedupeCapture`]).
    retained: Option<Vec<Generation>>,
    /// Entries at or before this time were dropped as dead by the restore
    /// that built this table (from the checkpoint's `dead_through`): a
    /// persisted generation's file still lists them, so every later
    /// checkpoint that refers to the file must filter them out again.
    dead_floor_ms: Option<Millis>,
    /// The ids the current admission's checks found absent, in check order,
    /// with their hashes ([`DedupeTable::begin_admission`]): the `record` of
    /// an accepted one takes its entry instead of probing every generation
    /// again (see [`DedupeTable::take_absent`] for why that is exact).
    absent: RefCell<VecDeque<(u64, MessageId)>>,
    /// Set by the first [`DedupeTable::begin_admission`].
    admitting: Cell<bool>,
}

impl DedupeTable {
    pub fn new(secret: &[u8; 32], window_ms: Millis) -> Self {
        Self {
            keys: Keys::from_secret(secret),
            window_ms,
            span_ms: (window_ms / DEDUPE_GENERATIONS as u64).max(1),
            generations: VecDeque::new(),
            horizon_ms: None,
            last_recorded: None,
            last_generation_len: 0,
            spare: None,
            retained: None,
            dead_floor_ms: None,
            absent: RefCell::default(),
            admitting: Cell::new(false),
        }
    }

    /// A data batch's admission begins: forgets the ids earlier checks found
    /// absent, so every id remembered below was checked by this admission,
    /// whose accepted records are applied right after its checks with
    /// nothing in between (`partition/enqueue.rs`).
    pub fn begin_admission(&self) {
        let mut absent = self.absent.borrow_mut();
        if absent.capacity() > DEDUPE_ABSENT_MEMO_KEPT_MAX {
            *absent = VecDeque::new();
        } else {
            absent.clear();
        }
        self.admitting.set(true);
    }

    /// Remembers that this admission's check found `id` absent (only once
    /// admissions are in use: a table read and written directly keeps no
    /// memo).
    fn note_absent(&self, hash: u64, id: &MessageId) {
        let mut absent = self.absent.borrow_mut();
        if self.admitting.get() && absent.len() < ADMISSION_BATCH_MAX {
            absent.push_back((hash, *id));
        }
    }

    /// Whether this admission's check found `id` absent: takes its entry,
    /// and those of ids checked before it that were not recorded (refused,
    /// or repeated in the batch). Exact, because within one admission an id
    /// is recorded at most once (a repeat is `DuplicateInBatch`), `record`
    /// only adds the id it records, and dropping old generations or moving
    /// the horizon only makes entries absent: an id absent at its check is
    /// still absent at its record. Anything else (no entry, a `record`
    /// outside an admission) empties the memo and answers `false`, and the
    /// caller probes as before.
    fn take_absent(&self, hash: u64, id: &MessageId) -> bool {
        let mut absent = self.absent.borrow_mut();
        while let Some((noted_hash, noted)) = absent.pop_front() {
            if noted_hash == hash && noted == *id {
                return true;
            }
        }
        false
    }

    fn is_live(&self, offset: Offset, time_ms: Millis) -> bool {
        self.horizon_ms.is_none_or(|horizon| time_ms.saturating_add(self.window_ms) > horizon)
            || self.last_recorded == Some(offset)
    }

    /// The newest entry for `id` (live or not): generations newest first,
    /// and within one generation the slot points at the newest.
    fn newest(&self, hash: u64, id: &MessageId) -> Option<(Offset, Millis)> {
        self.generations.iter().rev().find_map(|generation| match generation.probe(hash, &id.0) {
            Probe::Found { index, .. } => Some(generation.decode(generation.entry(index))),
            Probe::Vacant { .. } => None,
        })
    }

    /// The live entry of `id`, if any.
    fn live(&self, hash: u64, id: &MessageId) -> Option<(Offset, Millis)> {
        // Times never decrease, so an older entry of the id than the newest
        // is dead whenever the newest is.
        self.newest(hash, id).filter(|&(offset, time_ms)| self.is_live(offset, time_ms))
    }

    /// The original offset if `id` was enqueued within the window as seen at
    /// `now` (the enqueue decision's check).
    pub fn hit(&self, now: Millis, id: &MessageId) -> Option<Offset> {
        let hash = self.keys.hash(&id.0);
        let Some((offset, time_ms)) = self.live(hash, id) else {
            self.note_absent(hash, id);
            return None;
        };
        (time_ms.saturating_add(self.window_ms) > now).then_some(offset)
    }

    /// Applies an enqueue at `now` (its clamped enqueue time, non-decreasing):
    /// forgets what left the window, then remembers `id` at `offset` unless it
    /// is still remembered. Returns whether it was stored.
    pub fn record(&mut self, id: &MessageId, offset: Offset, now: Millis) -> bool {
        self.horizon_ms = Some(now);
        self.last_recorded = None;
        while let Some(oldest) = self.generations.front() {
            if oldest.last_time_ms.saturating_add(self.window_ms) > now {
                break;
            }
            self.last_generation_len = oldest.len;
            if let Some(dropped) = self.generations.pop_front() {
                if let Some(retained) = self.retained.as_mut() {
                    retained.push(dropped);
                } else if dropped.slots_held() <= SPARE_SLOTS_MAX {
                    self.spare = Some(dropped);
                }
            }
        }
        let hash = self.keys.hash(&id.0);
        if !self.take_absent(hash, id) && self.live(hash, id).is_some() {
            return false;
        }
        let pushed = self.push(hash, id, offset, now, None, None);
        assert!(pushed.is_ok(), "a dead entry is replaced, never refused");
        self.last_recorded = Some(offset);
        true
    }

    /// Appends to the newest generation, opening one when needed (sized for
    /// `size_hint` entries, else for as many as the previous one got);
    /// `opens_at`: open a new generation with that base (time, offset)
    /// whatever the newest is (a restore's group boundary).
    fn push(
        &mut self,
        hash: u64,
        id: &MessageId,
        offset: Offset,
        time_ms: Millis,
        size_hint: Option<usize>,
        opens_at: Option<(Millis, u64)>,
    ) -> Result<(), RestoreError> {
        if let Some(newest) = self.generations.back() {
            if time_ms < newest.last_time_ms {
                return Err(RestoreError::TimeOrder);
            }
            if offset.0 <= newest.last_offset {
                return Err(RestoreError::OffsetOrder);
            }
        }
        let opens = opens_at.is_some()
            || self
                .generations
                .back()
                .is_none_or(|newest| newest.is_closed_for(self.span_ms, time_ms, offset.0));
        if opens {
            let (base_time_ms, base_offset) = opens_at.unwrap_or((time_ms, offset.0));
            let previous = self.generations.back().map_or(self.last_generation_len, |g| g.len);
            let expected = size_hint.unwrap_or(previous);
            if let Some(newest) = self.generations.back() {
                self.last_generation_len = newest.len;
            }
            let generation = match self.spare.take() {
                Some(mut spare) if spare.slots_held() >= slots_for(expected) => {
                    spare.reset(base_time_ms, base_offset);
                    spare
                }
                _ => Generation::new(base_time_ms, base_offset, expected),
            };
            self.generations.push_back(generation);
        }
        let keys = self.keys;
        let newest = self.generations.back_mut().expect("a generation was just ensured");
        newest
            .push(&keys, hash, id, offset.0, time_ms, size_hint.is_some())
            .map_err(|()| RestoreError::DuplicateId)
    }

    /// Live entries in the order they were recorded (time, then offset):
    /// the snapshot's canonical list.
    pub fn entries(&self) -> impl Iterator<Item = (MessageId, Offset, Millis)> + '_ {
        self.generations
            .iter()
            .flat_map(Generation::entries)
            .filter(|&(_, offset, time_ms)| self.is_live(offset, time_ms))
    }

    /// Entries held in memory, live or not yet dropped with their
    /// generation: what the table's memory grows with. O(generations).
    pub fn held_entries(&self) -> usize {
        self.generations.iter().map(|generation| generation.len).sum()
    }

    /// Live entries. O(entries): for tests and invariant checks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries().count()
    }

    /// Read-only consistency check (tests): generation order and bounds,
    /// every slot pointing at an entry with its tag, loads under the limit,
    /// live ids distinct and each found by a lookup.
    pub fn assert_invariants(&self) {
        let mut previous_time = 0;
        let mut previous_offset: Option<u64> = None;
        for generation in &self.generations {
            assert!(generation.len > 0);
            assert!(generation.len <= DEDUPE_GENERATION_ENTRIES_MAX);
            let held: usize = generation.chunks.iter().map(Vec::len).sum();
            assert!(held == generation.len);
            for (index, chunk) in generation.chunks.iter().enumerate() {
                if index + 1 < generation.chunks.len() {
                    assert!(chunk.len() == DEDUPE_CHUNK_ENTRIES);
                }
                assert!(chunk.capacity() <= DEDUPE_CHUNK_ENTRIES);
            }
            assert!(generation.directory.len() == 1 << generation.depth);
            let mut occupied = 0;
            for (number, table) in generation.tables.iter().enumerate() {
                assert!(table.depth <= generation.depth);
                let pointing =
                    generation.directory.iter().filter(|&&entry| entry as usize == number).count();
                assert!(pointing == 1 << (generation.depth - table.depth));
                assert!(table.len * LOAD_MAX_DENOMINATOR <= table.slots.len() * LOAD_MAX_NUMERATOR);
                let mut held = 0;
                for &slot in table.slots.iter().filter(|&&slot| slot != 0) {
                    let index = (slot & SLOT_INDEX_MASK) as usize - 1;
                    assert!(index < generation.len);
                    let hash = self.keys.hash(&generation.entry(index).id);
                    assert!(slot >> SLOT_INDEX_BITS == tag_of(hash));
                    assert!(generation.table_of(hash) == number);
                    held += 1;
                }
                assert!(held == table.len);
                occupied += held;
            }
            assert!(occupied <= generation.len);
            for (_, offset, time_ms) in generation.entries() {
                assert!(time_ms >= previous_time);
                assert!(time_ms < generation.base_time_ms + self.span_ms);
                assert!(previous_offset.is_none_or(|previous| offset.0 > previous));
                previous_time = time_ms;
                previous_offset = Some(offset.0);
            }
            assert!(generation.last_time_ms == previous_time);
        }
        let mut ids = std::collections::BTreeSet::new();
        for (id, offset, time_ms) in self.entries() {
            assert!(ids.insert(id));
            assert!(self.live(self.keys.hash(&id.0), &id) == Some((offset, time_ms)));
        }
    }
}

/// Bytes of one entry in a snapshot's dedupe list and in a generation
/// file: time, id, offset (little-endian).
pub(crate) const DEDUPE_RECORD_BYTES: usize = 8 + 16 + 8;

/// Appends one entry in its 32-byte stored form.
pub(crate) fn encode_record(out: &mut Vec<u8>, id: &MessageId, offset: Offset, time_ms: Millis) {
    out.extend_from_slice(&time_ms.to_le_bytes());
    out.extend_from_slice(&id.0);
    out.extend_from_slice(&offset.0.to_le_bytes());
}

/// One stored entry (the caller slices exact records).
pub(crate) fn decode_record(record: &[u8]) -> (MessageId, Offset, Millis) {
    let mut time = [0u8; 8];
    time.copy_from_slice(&record[0..8]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&record[8..24]);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&record[24..32]);
    (MessageId(id), Offset(u64::from_le_bytes(offset)), u64::from_le_bytes(time))
}

/// A sealed generation written once as a side file
/// (`partition/dedupe_files.rs`), as a checkpoint refers to it: the
/// generation's base, every entry its arena held when written (dead ones
/// too: a restore filters them by the checkpoint's `dead_through`), and
/// the crc32c of the file's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationRef {
    pub first_offset: Offset,
    pub base_time_ms: Millis,
    pub entries: u64,
    pub crc: u32,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The map and FIFO this table replaced, kept as the reference.
    struct Reference {
        window_ms: Millis,
        map: BTreeMap<MessageId, (Offset, Millis)>,
    }

    impl Reference {
        fn record(&mut self, id: MessageId, offset: Offset, now: Millis) {
            let window = self.window_ms;
            self.map.retain(|_, &mut (_, time)| time.saturating_add(window) > now);
            self.map.entry(id).or_insert((offset, now));
        }
        fn hit(&self, now: Millis, id: &MessageId) -> Option<Offset> {
            let &(offset, time) = self.map.get(id)?;
            (time.saturating_add(self.window_ms) > now).then_some(offset)
        }
    }

    /// A seeded xorshift64 stream (tests repeat exactly).
    pub(super) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    pub(super) fn id(n: u64) -> MessageId {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&n.to_le_bytes());
        MessageId(raw)
    }

    // Goal: hit/record/entries agree with the old map for random id reuse,
    // time steps and windows (zero included), also across a snapshot/restore
    // at random points. Method: drive both with a seeded xorshift.
    #[test]
    fn table_matches_the_reference_map() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
        for round in 0..60u64 {
            let window_ms = match round % 4 {
                0 => 0,
                1 => 1 + next() % 10,
                _ => 1 + next() % 2_000,
            };
            let secret = [round as u8; 32];
            let mut table = DedupeTable::new(&secret, window_ms);
            let mut reference = Reference { window_ms, map: BTreeMap::new() };
            let mut now = 1_000u64;
            let ids = 1 + next() % 300;
            for step in 0..3_000u64 {
                now += next() % 4;
                let probe_now = now.saturating_sub(next() % 50) + next() % 50;
                let asked = id(next() % ids);
                assert_eq!(table.hit(probe_now, &asked), reference.hit(probe_now, &asked));
                let fresh = id(next() % ids);
                reference.record(fresh, Offset(step), now);
                table.record(&fresh, Offset(step), now);
                if step % 500 == 499 {
                    table.assert_invariants();
                    let listed: Vec<_> = table.entries().collect();
                    let mut want: Vec<_> =
                        reference.map.iter().map(|(&i, &(o, t))| (i, o, t)).collect();
                    want.sort_by_key(|&(_, o, t)| (t, o));
                    assert_eq!(listed, want, "round {round} step {step}");
                    assert_eq!(table.len(), want.len());
                    let mut restored = DedupeTable::new(&secret, window_ms);
                    restored.restore(listed.iter().copied()).unwrap();
                    restored.assert_invariants();
                    assert_eq!(restored.entries().collect::<Vec<_>>(), listed);
                    table = restored;
                }
            }
        }
    }

    // Goal: admissions (every id of a batch checked, then the accepted ones
    // recorded, each once) give the answers of the reference map although a
    // record of an id its admission found absent probes no generation
    // again: repeats within a batch, ids refused as duplicates, batches
    // refused whole (checked, nothing recorded), and expiry between checks
    // and records. A memo that outlived its admission or served a repeated
    // id would store a duplicate and differ from the map.
    #[test]
    fn admissions_that_skip_the_record_probe_match_the_reference_map() {
        let mut next = xorshift(0x6A09_E667_F3BC_C908u64);
        let mut skipped = 0usize;
        for round in 0..40u64 {
            let window_ms = 1 + next() % 400;
            let mut table = DedupeTable::new(&[round as u8; 32], window_ms);
            let mut reference = Reference { window_ms, map: BTreeMap::new() };
            let mut now = 1_000u64;
            let mut offset = 0u64;
            let ids = 1 + next() % 200;
            for batch in 0..400u64 {
                now += next() % 8;
                let len = 1 + next() % 12;
                let asked: Vec<MessageId> = (0..len).map(|_| id(next() % ids)).collect();
                table.begin_admission();
                let mut accepted: Vec<MessageId> = Vec::new();
                for request in &asked {
                    let hit = table.hit(now, request);
                    assert_eq!(hit, reference.hit(now, request), "round {round} batch {batch}");
                    if hit.is_none() && !accepted.contains(request) {
                        accepted.push(*request);
                    }
                }
                if next().is_multiple_of(10) {
                    continue; // refused whole: checked, nothing recorded
                }
                let memo_before = table.absent.borrow().len();
                for request in accepted {
                    let absent_before = !reference.map.contains_key(&request)
                        || reference.hit(now, &request).is_none();
                    reference.record(request, Offset(offset), now);
                    assert_eq!(
                        table.record(&request, Offset(offset), now),
                        absent_before,
                        "round {round} batch {batch}: stored"
                    );
                    offset += 1;
                }
                skipped += memo_before - table.absent.borrow().len();
            }
            table.assert_invariants();
            let listed: Vec<_> = table.entries().collect();
            let mut want: Vec<_> = reference.map.iter().map(|(&i, &(o, t))| (i, o, t)).collect();
            want.sort_by_key(|&(_, o, t)| (t, o));
            assert_eq!(listed, want, "round {round}");
        }
        assert!(skipped > 10_000, "records took their admission's answer ({skipped})");
    }

    // Goal: one huge admission does not pin its memo (24 B per record) for the
    // partition's life: the next admission drops a memo grown past
    // DEDUPE_ABSENT_MEMO_KEPT_MAX and keeps a smaller one for reuse.
    #[test]
    fn a_large_admission_does_not_pin_its_memo() {
        let mut table = DedupeTable::new(&[2; 32], 60_000);
        table.begin_admission();
        for n in 0..5_000u64 {
            assert_eq!(table.hit(1_000, &id(n)), None);
        }
        assert!(table.absent.borrow().capacity() >= 5_000);
        for n in 0..5_000u64 {
            assert!(table.record(&id(n), Offset(n), 1_000));
        }
        table.begin_admission();
        assert!(table.absent.borrow().capacity() <= DEDUPE_ABSENT_MEMO_KEPT_MAX);
        for n in 5_000..5_100u64 {
            assert_eq!(table.hit(1_000, &id(n)), None);
        }
        let kept = table.absent.borrow().capacity();
        table.begin_admission();
        assert_eq!(table.absent.borrow().capacity(), kept, "a small memo is reused");
    }

    // Goal: whole generations are dropped once their newest entry leaves the
    // window, so memory follows the window, and grown tables stay correct.
    #[test]
    fn generations_are_dropped_as_the_window_passes() {
        let window_ms = 8_000;
        let mut table = DedupeTable::new(&[3; 32], window_ms);
        for n in 0..100_000u64 {
            table.record(&id(n), Offset(n), n / 4);
        }
        table.assert_invariants();
        let held: usize = table.generations.iter().map(|g| g.len).sum();
        let live = table.len();
        assert_eq!(live, 4 * window_ms as usize);
        assert!(held <= live + live / DEDUPE_GENERATIONS + 4, "held {held}, live {live}");
        assert!(table.generations.len() <= DEDUPE_GENERATIONS + 1);
        assert_eq!(table.hit(25_000, &id(99_999)), Some(Offset(99_999)));
        assert_eq!(table.hit(25_000, &id(0)), None);
    }
}
