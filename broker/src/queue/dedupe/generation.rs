//! One generation of the dedupe table: the ids recorded in one time
//! bucket, in an append-only arena (24-byte entries in fixed chunks, offset
//! and time as deltas from the generation's base), and their index: a
//! directory of open-addressing sub-tables that grow by a quarter, or split
//! in two by one more hash bit, moving only their own ids.
//!
//! Owns placement, probing, growth and the reuse of a dropped generation.
//! Must not decide what is live, when a generation opens or is dropped, or
//! what a checkpoint lists (the table, `dedupe.rs`, and `checkpoint.rs` do);
//! reads no clock, does no I/O.

use super::keys::Keys;
use super::{
    GenerationRef, DIRECTORY_DEPTH_MAX, DIRECTORY_SHIFT, FIRST_CHUNK_FLOOR_ENTRIES,
    GROW_DENOMINATOR, GROW_NUMERATOR, LOAD_MAX_DENOMINATOR, LOAD_MAX_NUMERATOR,
    PRESIZE_DENOMINATOR, PRESIZE_NUMERATOR, SLOTS_MIN, SLOT_INDEX_BITS, SLOT_INDEX_MASK,
    SUBTABLE_SLOTS_MAX,
};
use crate::queue::limits::{DEDUPE_CHUNK_ENTRIES, DEDUPE_GENERATION_ENTRIES_MAX};
use crate::queue::types::{MessageId, Millis, Offset};

/// One remembered id: 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) id: [u8; 16],
    /// Offset minus the generation's base offset.
    offset_delta: u32,
    /// Enqueue time minus the generation's base time.
    time_delta: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 24);

/// Where a probe for an id ended (positions are in sub-table `table`).
pub(super) enum Probe {
    /// Slot `pos` refers to arena entry `index`, which holds the id.
    Found { table: usize, pos: usize, index: usize },
    /// The id is not in this generation; `pos` is the empty slot for it.
    Vacant { table: usize, pos: usize },
}

/// One sub-table of a generation's index: open addressing, linear probing,
/// slots `tag << 24 | (index + 1)`, 0 empty.
#[derive(Debug)]
pub(super) struct SubTable {
    /// Hash bits (from `DIRECTORY_SHIFT`) its ids share.
    pub(super) depth: u32,
    /// Occupied slots.
    pub(super) len: usize,
    pub(super) slots: Vec<u32>,
}

impl SubTable {
    fn new(depth: u32, slots: usize) -> Self {
        Self { depth, len: 0, slots: vec![0; slots.max(SLOTS_MIN)] }
    }

    fn is_full_for_one_more(&self) -> bool {
        (self.len + 1) * LOAD_MAX_DENOMINATOR > self.slots.len() * LOAD_MAX_NUMERATOR
    }

    /// Places `slot` (not present) at the first empty slot from its home.
    fn place(&mut self, hash: u64, slot: u32) {
        let mut at = home(hash, self.slots.len());
        while self.slots[at] != 0 {
            at += 1;
            if at == self.slots.len() {
                at = 0;
            }
        }
        self.slots[at] = slot;
        self.len += 1;
    }
}

/// The directory index of `hash` at `depth` bits.
fn directory_index(hash: u64, depth: u32) -> usize {
    ((hash >> DIRECTORY_SHIFT) as usize) & ((1usize << depth) - 1)
}

/// One time bucket: an append-only arena in time order and its index.
#[derive(Debug)]
pub(super) struct Generation {
    pub(super) base_time_ms: Millis,
    pub(super) base_offset: u64,
    pub(super) last_time_ms: Millis,
    pub(super) last_offset: u64,
    pub(super) len: usize,
    /// Fixed chunks of `DEDUPE_CHUNK_ENTRIES` (only the last is partial), so
    /// the arena never holds a doubled `Vec`'s spare half — except the first,
    /// which starts at the generation's expected size (at least
    /// `FIRST_CHUNK_FLOOR_ENTRIES`) and doubles up to a whole chunk: a quiet
    /// partition's few ids cost a few hundred bytes, not a 48 KiB chunk.
    pub(super) chunks: Vec<Vec<Entry>>,
    /// `1 << depth` entries: the sub-table (index into `tables`) of the ids
    /// whose hash has those bits at `DIRECTORY_SHIFT`.
    pub(super) directory: Vec<u32>,
    pub(super) depth: u32,
    pub(super) tables: Vec<SubTable>,
    /// Most slot bytes (index and directory) held at once, the transient
    /// copy of a growing sub-table included.
    slot_bytes_peak: usize,
    /// Ids hashed again to grow or split sub-tables (the cost of growth;
    /// tests read it).
    #[cfg_attr(not(test), allow(dead_code))]
    rehashed: usize,
    /// The side file this (sealed) generation was written to, if any: a
    /// persisted generation takes no more entries (see [`GenerationRef`]).
    pub(super) persisted: Option<GenerationRef>,
}

pub(super) fn slots_for(expected_len: usize) -> usize {
    (expected_len * PRESIZE_NUMERATOR / PRESIZE_DENOMINATOR + 1).max(SLOTS_MIN)
}

/// Slots for `len` ids at the lowest load a grown sub-table has (7/10, the
/// load after a 5/4 step from 7/8).
fn slots_at_load_min(len: usize) -> usize {
    (len * LOAD_MAX_DENOMINATOR * GROW_NUMERATOR / (LOAD_MAX_NUMERATOR * GROW_DENOMINATOR) + 1)
        .max(SLOTS_MIN)
}

/// Ids a growth step hashes in one batch.
const REHASH_BATCH: usize = 8;

/// Calls `each(hash, slot)` for every occupied slot of `slots` (of a
/// sub-table being rebuilt), stopping when it returns `false`; returns the
/// ids hashed. The slots point anywhere in the arena, so each id is a cache
/// miss: a batch's ids are loaded first, then hashed, so the misses of a
/// batch overlap instead of each waiting behind the previous hash.
fn rehash_each(
    keys: &Keys,
    chunks: &[Vec<Entry>],
    slots: &[u32],
    mut each: impl FnMut(u64, u32) -> bool,
) -> usize {
    let mut hashed = 0;
    let mut batch = [0u32; REHASH_BATCH];
    let mut filled = 0;
    let mut occupied = slots.iter().copied().filter(|&slot| slot != 0);
    loop {
        let next = occupied.next();
        if let Some(slot) = next {
            batch[filled] = slot;
            filled += 1;
            if filled < REHASH_BATCH {
                continue;
            }
        }
        let mut ids = [[0u8; 16]; REHASH_BATCH];
        for (id, &slot) in ids.iter_mut().zip(&batch[..filled]) {
            *id = entry_in(chunks, (slot & SLOT_INDEX_MASK) as usize - 1).id;
        }
        for (id, &slot) in ids.iter().zip(&batch[..filled]) {
            hashed += 1;
            if !each(keys.hash(id), slot) {
                return hashed;
            }
        }
        filled = 0;
        if next.is_none() {
            return hashed;
        }
    }
}

/// Arena entry `index` of a generation's `chunks`.
fn entry_in(chunks: &[Vec<Entry>], index: usize) -> &Entry {
    &chunks[index / DEDUPE_CHUNK_ENTRIES][index % DEDUPE_CHUNK_ENTRIES]
}

/// First slot to probe in a table of `slots`: the hash scaled onto it (any
/// table size, no power of two needed).
fn home(hash: u64, slots: usize) -> usize {
    ((u128::from(hash) * slots as u128) >> 64) as usize
}

/// Whether an entry at (`time_ms`, `offset`) must open a new generation after
/// one based at (`base_time_ms`, `base_offset`) holding `len` entries: its
/// time span is over, it is full, or the offset delta would not fit 32 bits.
pub(super) fn closes(
    base_time_ms: Millis,
    base_offset: u64,
    len: usize,
    span_ms: Millis,
    time_ms: Millis,
    offset: u64,
) -> bool {
    time_ms >= base_time_ms.saturating_add(span_ms)
        || len >= DEDUPE_GENERATION_ENTRIES_MAX
        || offset.saturating_sub(base_offset) > u64::from(u32::MAX)
}

/// Capacity of a generation's first entry chunk when `expected_len` ids are
/// expected: the next power of two, between `FIRST_CHUNK_FLOOR_ENTRIES` and a
/// whole chunk (a power of two, so doubling never passes it).
fn first_chunk_entries(expected_len: usize) -> usize {
    expected_len.next_power_of_two().clamp(FIRST_CHUNK_FLOOR_ENTRIES, DEDUPE_CHUNK_ENTRIES)
}

/// Tag kept in a slot: the hash's low byte (placement uses its high bits).
pub(super) fn tag_of(hash: u64) -> u32 {
    (hash & 0xFF) as u32
}

impl Generation {
    pub(super) fn new(base_time_ms: Millis, base_offset: u64, expected_len: usize) -> Self {
        // Presized: as many sub-tables as keep each under the maximum.
        let slots = slots_for(expected_len);
        let mut depth = 0;
        while slots >> depth > SUBTABLE_SLOTS_MAX && depth < DIRECTORY_DEPTH_MAX {
            depth += 1;
        }
        let tables: Vec<SubTable> =
            (0..1usize << depth).map(|_| SubTable::new(depth, slots >> depth)).collect();
        let mut generation = Self {
            base_time_ms,
            base_offset,
            last_time_ms: base_time_ms,
            last_offset: base_offset,
            len: 0,
            chunks: vec![Vec::with_capacity(first_chunk_entries(expected_len))],
            directory: (0..tables.len() as u32).collect(),
            depth,
            tables,
            slot_bytes_peak: 0,
            rehashed: 0,
            persisted: None,
        };
        generation.slot_bytes_peak = generation.slot_bytes();
        generation
    }

    /// Bytes of the index: every sub-table's slots and the directory.
    fn slot_bytes(&self) -> usize {
        let slots: usize = self.tables.iter().map(|table| table.slots.len()).sum();
        (slots + self.directory.len()) * std::mem::size_of::<u32>()
    }

    pub(super) fn table_of(&self, hash: u64) -> usize {
        self.directory[directory_index(hash, self.depth)] as usize
    }

    pub(super) fn entry(&self, index: usize) -> &Entry {
        entry_in(&self.chunks, index)
    }

    pub(super) fn decode(&self, entry: &Entry) -> (Offset, Millis) {
        (
            Offset(self.base_offset + u64::from(entry.offset_delta)),
            self.base_time_ms + u64::from(entry.time_delta),
        )
    }

    pub(super) fn probe(&self, hash: u64, id: &[u8; 16]) -> Probe {
        let tag = tag_of(hash);
        let table = self.table_of(hash);
        let slots = &self.tables[table].slots;
        let mut pos = home(hash, slots.len());
        loop {
            let slot = slots[pos];
            if slot == 0 {
                return Probe::Vacant { table, pos };
            }
            if slot >> SLOT_INDEX_BITS == tag {
                let index = (slot & SLOT_INDEX_MASK) as usize - 1;
                if self.entry(index).id == *id {
                    return Probe::Found { table, pos, index };
                }
            }
            pos += 1;
            if pos == slots.len() {
                pos = 0;
            }
        }
    }

    pub(super) fn is_closed_for(&self, span_ms: Millis, time_ms: Millis, offset: u64) -> bool {
        self.persisted.is_some()
            || closes(self.base_time_ms, self.base_offset, self.len, span_ms, time_ms, offset)
    }

    /// Empties a dropped generation for reuse as a new one.
    pub(super) fn reset(&mut self, base_time_ms: Millis, base_offset: u64) {
        self.base_time_ms = base_time_ms;
        self.base_offset = base_offset;
        self.last_time_ms = base_time_ms;
        self.last_offset = base_offset;
        self.len = 0;
        self.chunks.truncate(1);
        if let Some(chunk) = self.chunks.first_mut() {
            chunk.clear();
        }
        self.tables.truncate(1);
        if let Some(table) = self.tables.first_mut() {
            table.depth = 0;
            table.len = 0;
            table.slots.fill(0);
        }
        self.directory.clear();
        self.directory.push(0);
        self.depth = 0;
        self.slot_bytes_peak = self.slot_bytes();
        self.rehashed = 0;
        self.persisted = None;
    }

    /// Total slots of a spare generation (it has one sub-table).
    pub(super) fn slots_held(&self) -> usize {
        self.tables.iter().map(|table| table.slots.len()).sum()
    }

    /// Makes room for one more id in sub-table `table`: grows it by a
    /// quarter while under `SUBTABLE_SLOTS_MAX`, else splits it in two by
    /// the next hash bit. Only that sub-table's entries move, and each is
    /// hashed once (see [`rehash_each`]).
    fn make_room(&mut self, keys: &Keys, table: usize) {
        let current = self.tables[table].slots.len();
        let depth = self.tables[table].depth;
        if current < SUBTABLE_SLOTS_MAX || depth >= DIRECTORY_DEPTH_MAX {
            // Not capped at `SUBTABLE_SLOTS_MAX`: a step to just under it
            // and another to it would move every id twice for ~no room.
            let grown = (current * GROW_NUMERATOR / GROW_DENOMINATOR).max(current + 8);
            self.note_peak(grown);
            let old = std::mem::replace(&mut self.tables[table], SubTable::new(depth, grown));
            let target = &mut self.tables[table];
            self.rehashed += rehash_each(keys, &self.chunks, &old.slots, |hash, slot| {
                target.place(hash, slot);
                true
            });
            return;
        }
        // Split: the ids whose next hash bit is set move to a new sub-table.
        if depth == self.depth {
            self.directory.extend_from_within(..);
            self.depth += 1;
        }
        let bit = 1usize << depth;
        let goes_up = |hash: u64| directory_index(hash, depth + 1) & bit != 0;
        // One pass: each half sized for half the ids at the lowest load
        // (7/10), so the split is one 5/4 step of the whole. A half that
        // would pass 7/8 (a hash this far from uniform: a keyed PRF does
        // not give one) is redone with exact counts.
        let half = slots_at_load_min(self.tables[table].len / 2);
        self.note_peak(2 * half);
        let old = std::mem::replace(&mut self.tables[table], SubTable::new(depth + 1, half));
        let mut upper = SubTable::new(depth + 1, half);
        let lower = &mut self.tables[table];
        let mut fits = true;
        self.rehashed += rehash_each(keys, &self.chunks, &old.slots, |hash, slot| {
            let target = if goes_up(hash) { &mut upper } else { &mut *lower };
            fits = !target.is_full_for_one_more();
            if fits {
                target.place(hash, slot);
            }
            fits
        });
        if !fits {
            let mut up = 0;
            self.rehashed += rehash_each(keys, &self.chunks, &old.slots, |hash, _| {
                up += usize::from(goes_up(hash));
                true
            });
            let (lower_slots, upper_slots) =
                (slots_at_load_min(old.len - up), slots_at_load_min(up));
            self.note_peak(lower_slots + upper_slots);
            self.tables[table] = SubTable::new(depth + 1, lower_slots);
            upper = SubTable::new(depth + 1, upper_slots);
            let lower = &mut self.tables[table];
            self.rehashed += rehash_each(keys, &self.chunks, &old.slots, |hash, slot| {
                let target = if goes_up(hash) { &mut upper } else { &mut *lower };
                target.place(hash, slot);
                true
            });
        }
        let new_table = self.tables.len();
        self.tables.push(upper);
        for (at, entry) in self.directory.iter_mut().enumerate() {
            if *entry as usize == table && at & bit != 0 {
                *entry = new_table as u32;
            }
        }
    }

    /// Records the slot bytes held while `added` new slots exist beside the
    /// current ones (a sub-table being rebuilt, and a directory about to
    /// have doubled at most).
    fn note_peak(&mut self, added: usize) {
        let held = self.slot_bytes() + added * std::mem::size_of::<u32>();
        self.slot_bytes_peak = self.slot_bytes_peak.max(held);
    }

    /// Appends an entry and points the id's slot at it (replacing the slot of
    /// an older, dead entry of the same id in this generation, if any).
    /// `Err` (nothing changed) if `refuse_present` and the id is here.
    pub(super) fn push(
        &mut self,
        keys: &Keys,
        hash: u64,
        id: &MessageId,
        offset: u64,
        time_ms: Millis,
        refuse_present: bool,
    ) -> Result<(), ()> {
        assert!(time_ms >= self.last_time_ms);
        assert!(self.len == 0 || offset > self.last_offset);
        assert!(self.len < DEDUPE_GENERATION_ENTRIES_MAX);
        let table = self.table_of(hash);
        if self.tables[table].is_full_for_one_more() {
            self.make_room(keys, table);
        }
        let (table, pos) = match self.probe(hash, &id.0) {
            Probe::Found { .. } if refuse_present => return Err(()),
            Probe::Found { table, pos, .. } => (table, pos),
            Probe::Vacant { table, pos } => {
                self.tables[table].len += 1;
                (table, pos)
            }
        };
        let index = self.len;
        self.tables[table].slots[pos] = tag_of(hash) << SLOT_INDEX_BITS | (index as u32 + 1);
        // The first chunk starts at the generation's expected size and
        // doubles as a `Vec` does (powers of two, so it stops at exactly
        // `DEDUPE_CHUNK_ENTRIES`); later ones are allocated whole.
        if self.chunks.last().is_none_or(|chunk| chunk.len() == DEDUPE_CHUNK_ENTRIES) {
            self.chunks.push(Vec::with_capacity(DEDUPE_CHUNK_ENTRIES));
        }
        let chunk = self.chunks.last_mut().expect("a chunk was just ensured");
        chunk.push(Entry {
            id: id.0,
            // Both fit: `is_closed_for` opened a new generation otherwise.
            offset_delta: (offset - self.base_offset) as u32,
            time_delta: (time_ms - self.base_time_ms) as u32,
        });
        self.len += 1;
        self.last_time_ms = time_ms;
        self.last_offset = offset;
        Ok(())
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = (MessageId, Offset, Millis)> + '_ {
        self.chunks.iter().flatten().map(move |entry| {
            let (offset, time_ms) = self.decode(entry);
            (MessageId(entry.id), offset, time_ms)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::dedupe::tests::id;
    use crate::queue::dedupe::DedupeTable;

    // Goal: a generation's index holds a bounded number of bytes per id at
    // every size, and growing it never holds much more than that: it grows
    // one sub-table at a time, never by doubling the whole table (a doubled
    // table holds up to 9.1 B per id, and 13.7 B while it copies). Method:
    // one generation (1 h window, one timestamp) filled from empty to 300 k
    // ids; every 10 k ids, compare its slot bytes per id and the most it
    // ever held at once with the bounds.
    #[test]
    fn the_index_grows_in_steps_with_bounded_bytes_per_id() {
        const IDS: u64 = 300_000;
        // 4-byte slots at least 7/10 full, plus the directory's share.
        const BYTES_PER_ID_MAX: f64 = 4.0 * 10.0 / 7.0 + 0.1;
        // What one growth step may hold beside the index: a rebuilt
        // sub-table, or the two halves of a split one.
        const STEP_BYTES_MAX: usize = 2 * SUBTABLE_SLOTS_MAX * 4;
        let mut table = DedupeTable::new(&[5; 32], 3_600_000);
        for n in 0..IDS {
            table.record(&id(n), Offset(n), 1_000);
            let ids = n + 1;
            if ids % 10_000 != 0 || ids < 20_000 {
                continue;
            }
            assert_eq!(table.generations.len(), 1);
            let generation = table.generations.back().expect("one generation");
            let held = generation.slot_bytes();
            let per_id = held as f64 / ids as f64;
            assert!(per_id <= BYTES_PER_ID_MAX, "{per_id:.2} B of slots per id at {ids} ids");
            assert!(
                generation.slot_bytes_peak <= held + STEP_BYTES_MAX,
                "peak {} B of slots while growing, {held} B held at {ids} ids",
                generation.slot_bytes_peak
            );
        }
        table.assert_invariants();
        let generation = table.generations.back().expect("one generation");
        assert!(generation.tables.len() > 1, "the index split into sub-tables");
        assert_eq!(table.hit(1_000, &id(IDS - 1)), Some(Offset(IDS - 1)));
        assert_eq!(table.hit(1_000, &id(0)), Some(Offset(0)));
        assert_eq!(table.hit(1_000, &id(IDS)), None);
    }

    // Goal: a generation holding a few ids holds a few entries' memory, not
    // a whole 48 KiB chunk (a quiet partition's cost), and its first chunk
    // grows to exactly a whole chunk before the next one opens. Method: 3
    // ids, then 5,000 in the same generation.
    #[test]
    fn a_few_ids_hold_a_small_first_chunk_that_grows_to_a_whole_one() {
        let mut table = DedupeTable::new(&[9; 32], 60_000);
        for n in 0..3 {
            table.record(&id(n), Offset(n), 1_000);
        }
        let capacity = |table: &DedupeTable| -> Vec<usize> {
            let generation = table.generations.back().expect("one generation");
            generation.chunks.iter().map(Vec::capacity).collect()
        };
        assert_eq!(capacity(&table), vec![FIRST_CHUNK_FLOOR_ENTRIES]);
        for n in 3..5_000 {
            table.record(&id(n), Offset(n), 1_000);
        }
        table.assert_invariants();
        assert_eq!(table.generations.len(), 1);
        assert_eq!(capacity(&table), vec![DEDUPE_CHUNK_ENTRIES; 3]);
        assert_eq!(table.hit(1_000, &id(0)), Some(Offset(0)));
        assert_eq!(table.hit(1_000, &id(4_999)), Some(Offset(4_999)));
    }

    /// Every id recorded into `table`'s single generation (`ids[n]` at
    /// offset `n`) has exactly one slot, pointing at its own entry, and the
    /// sub-tables' counts add up: checked after each growth step.
    fn assert_every_id_placed_once(table: &DedupeTable, ids: &[MessageId]) {
        let generation = table.generations.back().expect("one generation");
        assert_eq!(generation.len, ids.len());
        let mut pointed = vec![false; ids.len()];
        let mut counted = 0;
        for sub in &generation.tables {
            let occupied: Vec<u32> = sub.slots.iter().copied().filter(|&s| s != 0).collect();
            assert_eq!(occupied.len(), sub.len);
            counted += sub.len;
            for slot in occupied {
                let index = (slot & SLOT_INDEX_MASK) as usize - 1;
                assert!(!pointed[index], "entry {index} has two slots");
                pointed[index] = true;
            }
        }
        assert_eq!(counted, ids.len(), "slots lost or duplicated");
        for (n, id) in ids.iter().enumerate() {
            let hash = table.keys.hash(&id.0);
            match generation.probe(hash, &id.0) {
                Probe::Found { index, .. } => assert_eq!(index, n, "id {n} found at {index}"),
                Probe::Vacant { .. } => panic!("id {n} lost after growing"),
            }
        }
    }

    /// Total slots of `table`'s newest generation and its sub-table count.
    fn shape(table: &DedupeTable) -> (usize, usize) {
        table.generations.back().map_or((0, 0), |g| (g.slots_held(), g.tables.len()))
    }

    // Goal: growing and splitting sub-tables neither lose nor duplicate an
    // id, and each step hashes an id about once: from empty, a generation
    // hashes its ids again ≈ 4 times each in all (5/4 steps, a split placed
    // in one pass); growing by capped steps and splitting with a counting
    // pass first hashed them ≈ 6.5 times. Method: 200 k distinct ids at one
    // timestamp (one generation, many grow steps and three splits); after
    // every step, each id has exactly one slot and is found at its entry;
    // at the end, ids hashed again per id.
    #[test]
    fn growth_neither_loses_nor_duplicates_ids_and_hashes_each_about_four_times() {
        const IDS: u64 = 200_000;
        let mut table = DedupeTable::new(&[9; 32], 3_600_000);
        let mut ids = Vec::new();
        let mut steps = 0;
        for n in 0..IDS {
            let before = shape(&table);
            let fresh = random_id(n);
            assert!(table.record(&fresh, Offset(n), 1_000));
            ids.push(fresh);
            if shape(&table) != before {
                steps += 1;
                assert_every_id_placed_once(&table, &ids);
            }
        }
        let generation = table.generations.back().expect("one generation");
        assert!(generation.tables.len() >= 4, "{} sub-tables", generation.tables.len());
        assert!(steps > 30, "{steps} growth steps");
        let per_id = generation.rehashed as f64 / IDS as f64;
        assert!((3.0..=4.6).contains(&per_id), "ids hashed again {per_id:.2} times each");
        table.assert_invariants();
    }

    // Goal: a split whose halves are far from even (a hash bit that is not
    // uniform; a keyed PRF does not give one, so this builds it with the
    // key) still places every id once and keeps each half under 7/8.
    // Method: ids chosen so that 4 in 5 have the split bit set, past the
    // first split; every step checked as above.
    #[test]
    fn an_uneven_split_keeps_every_id() {
        let mut table = DedupeTable::new(&[4; 32], 3_600_000);
        let keys = table.keys;
        let mut ids = Vec::new();
        let mut candidate = 0u64;
        let mut n = 0u64;
        while ids.len() < 75_000 {
            let fresh = random_id(candidate);
            candidate += 1;
            let up = directory_index(keys.hash(&fresh.0), 1) == 1;
            if up == n.is_multiple_of(5) {
                continue;
            }
            let before = shape(&table);
            assert!(table.record(&fresh, Offset(n), 1_000));
            ids.push(fresh);
            n += 1;
            if shape(&table) != before && shape(&table).1 != before.1 {
                assert_every_id_placed_once(&table, &ids);
            }
        }
        let generation = table.generations.back().expect("one generation");
        assert!(generation.tables.len() >= 2, "the index split");
        assert_every_id_placed_once(&table, &ids);
        table.assert_invariants();
    }

    fn random_id(n: u64) -> MessageId {
        let mut raw = [0u8; 16];
        let mixed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
        raw[..8].copy_from_slice(&mixed.to_le_bytes());
        raw[8..].copy_from_slice(
            &mixed.rotate_left(29).wrapping_mul(0xD6E8_FEB8_6659_FD93).to_le_bytes(),
        );
        MessageId(raw)
    }
}
