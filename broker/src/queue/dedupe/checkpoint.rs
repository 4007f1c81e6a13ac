//! What checkpoints read from the dedupe table, and how a restore rebuilds
//! it: the listing of the table as it was when a stepped checkpoint began
//! (`DedupeCapture`, `DedupeCursor`, and the dropped generations held
//! meanwhile), the sealed generations a checkpoint refers to instead of
//! listing them (`SealedGeneration`: written once as side files by the
//! partition), and the rebuild from a checkpoint's groups.
//!
//! Owns no byte layout (an entry's stored form is `dedupe.rs`'s) and does
//! no I/O: the snapshot (`queue/snapshot/`) frames the lists, the partition
//! reads and writes the files. Must not change an entry in place: a
//! running checkpoint reads the table while it changes.

use super::generation::{closes, Generation};
use super::{encode_record, DedupeTable, GenerationRef};
use crate::queue::types::{MessageId, Millis, Offset};

/// Why a snapshot's dedupe list cannot be restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestoreError {
    /// Enqueue times go backwards.
    TimeOrder,
    /// Offsets do not increase.
    OffsetOrder,
    /// An id appears twice.
    DuplicateId,
}

/// What a checkpoint needs to list the table as it was when it began: the
/// liveness horizon of that moment. Entries are never changed in place;
/// later ones are appended (at offsets the checkpoint does not cover) and
/// whole generations dropped (kept in `retained` meanwhile), so the table at
/// that moment is the prefix of the held list below its `covers` offset,
/// filtered by this horizon.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DedupeCapture {
    horizon_ms: Option<Millis>,
    /// Entries at or before this time were dead at that moment (see
    /// [`DedupeTable::dead_through`]).
    dead_through_ms: Option<Millis>,
    last_recorded: Option<Offset>,
    /// Whether the listing reads the held generations (a stepped
    /// checkpoint) or only the table as it is now (a one-shot listing,
    /// which may run while a checkpoint holds generations).
    held: bool,
}

/// Where a stepped listing of the table stands: generation (in the held
/// list) and entry within it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DedupeCursor {
    generation: usize,
    index: usize,
}

impl DedupeCursor {
    /// The start of held generation `generation`.
    pub fn at_generation(generation: usize) -> Self {
        Self { generation, index: 0 }
    }
}

/// A generation a checkpoint does not list inline: sealed when the
/// checkpoint began (not the newest, or persisted), with entries still
/// live then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SealedGeneration {
    /// Its place in the held list of the capture.
    pub index: usize,
    pub first_offset: Offset,
    pub base_time_ms: Millis,
    pub entries: u64,
    /// Its file, when one was written before.
    pub persisted: Option<GenerationRef>,
}

/// Entries of one restored generation group: a referenced generation
/// (`base`: opened at its base, and marked persisted when its live entries
/// fit one generation) or the inline list (`None`).
pub(crate) struct RestoreGroup<I> {
    pub base: Option<GenerationRef>,
    pub entries: I,
}

impl DedupeTable {
    /// Starts holding dropped generations for a checkpoint that lists the
    /// table in steps; returns the horizon of this moment.
    pub fn begin_capture(&mut self) -> DedupeCapture {
        self.retained = Some(Vec::new());
        DedupeCapture {
            horizon_ms: self.horizon_ms,
            dead_through_ms: self.dead_through(),
            last_recorded: self.last_recorded,
            held: true,
        }
    }

    /// The horizon of this moment, without holding anything (a one-shot
    /// listing with no change in between).
    pub fn capture_now(&self) -> DedupeCapture {
        DedupeCapture {
            horizon_ms: self.horizon_ms,
            dead_through_ms: self.dead_through(),
            last_recorded: self.last_recorded,
            held: false,
        }
    }

    /// Entries stored, live or not (O(generations)): an upper bound of
    /// the live count, for sizing a buffer.
    pub fn held_len(&self) -> usize {
        self.generations.iter().map(|generation| generation.len).sum()
    }

    /// Frees the generations held for a checkpoint.
    pub fn end_capture(&mut self) {
        self.retained = None;
    }

    fn held(&self, index: usize, held: bool) -> Option<&Generation> {
        let retained = if held { self.retained.as_deref().unwrap_or(&[]) } else { &[] };
        match index.checked_sub(retained.len()) {
            None => retained.get(index),
            Some(live) => self.generations.get(live),
        }
    }

    /// Visits at most `budget` entries from `cursor` of the table as it was
    /// at `capture` (entries at or above `limit` were recorded later and
    /// end the listing), calling `each` with every entry live then. Returns
    /// the entries visited and whether the listing is complete.
    pub fn capture_step(
        &self,
        capture: DedupeCapture,
        limit: Offset,
        cursor: &mut DedupeCursor,
        budget: usize,
        mut each: impl FnMut(MessageId, Offset, Millis),
    ) -> (usize, bool) {
        let mut visited = 0;
        while visited < budget {
            let Some(generation) = self.held(cursor.generation, capture.held) else {
                return (visited, true);
            };
            if cursor.index >= generation.len {
                cursor.generation += 1;
                cursor.index = 0;
                continue;
            }
            let entry = generation.entry(cursor.index);
            let (offset, time_ms) = generation.decode(entry);
            if offset >= limit {
                return (visited, true);
            }
            visited += 1;
            cursor.index += 1;
            let live = capture
                .horizon_ms
                .is_none_or(|horizon| time_ms.saturating_add(self.window_ms) > horizon)
                || capture.last_recorded == Some(offset);
            if live {
                each(MessageId(entry.id), offset, time_ms);
            }
        }
        (visited, false)
    }

    /// The time at and before which every entry is dead now (outside the
    /// window at the horizon, or dropped by the restore): `None` when none is.
    fn dead_through(&self) -> Option<Millis> {
        let by_horizon = self.horizon_ms.and_then(|horizon| horizon.checked_sub(self.window_ms));
        by_horizon.max(self.dead_floor_ms)
    }

    /// What a checkpoint holding `capture` records as dead: entries of the
    /// generation files it refers to at or before this time are skipped
    /// by the restore.
    pub fn capture_dead_through(capture: DedupeCapture) -> Option<Millis> {
        capture.dead_through_ms
    }

    /// The sealed generations of a stepped capture just begun (call right
    /// after [`begin_capture`](Self::begin_capture), before any change),
    /// oldest first, leaving out those wholly dead; and the held-list index
    /// the inline listing starts from (the open generation's, past the end
    /// when there is none).
    pub fn sealed(&self, capture: DedupeCapture) -> (Vec<SealedGeneration>, usize) {
        let count = self.generations.len();
        let open_from = match self.generations.back() {
            Some(newest) if newest.persisted.is_none() => count - 1,
            _ => count,
        };
        let sealed = self
            .generations
            .iter()
            .enumerate()
            .take(open_from)
            .filter(|(_, generation)| {
                capture.dead_through_ms.is_none_or(|dead| generation.last_time_ms > dead)
            })
            .map(|(index, generation)| SealedGeneration {
                index,
                first_offset: Offset(generation.base_offset),
                base_time_ms: generation.base_time_ms,
                entries: generation.len as u64,
                persisted: generation.persisted,
            })
            .collect();
        (sealed, open_from)
    }

    /// Appends at most `budget` entries of held generation `index` from
    /// `*at` to `out` in their stored form (every entry of the arena, in
    /// record order); returns whether the generation is complete.
    pub fn generation_step(
        &self,
        capture: DedupeCapture,
        index: usize,
        at: &mut usize,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> bool {
        let Some(generation) = self.held(index, capture.held) else { return true };
        let end = generation.len.min(at.saturating_add(budget));
        for entry in (*at..end).map(|position| generation.entry(position)) {
            let (offset, time_ms) = generation.decode(entry);
            encode_record(out, &MessageId(entry.id), offset, time_ms);
        }
        *at = end;
        end == generation.len
    }

    /// Records that the sealed generation based at `reference.first_offset`
    /// has its file: later checkpoints refer to it instead of writing it.
    pub fn mark_persisted(&mut self, reference: GenerationRef) {
        let retained = self.retained.iter_mut().flatten();
        if let Some(generation) = retained
            .chain(self.generations.iter_mut())
            .find(|generation| generation.base_offset == reference.first_offset.0)
        {
            generation.persisted = Some(reference);
        }
    }

    /// Rebuilds the table from a checkpoint's groups, in order: each
    /// group opens a new generation (a referenced one at its recorded
    /// base), and entries already filtered by the checkpoint's
    /// `dead_through` (kept as this table's floor). A referenced group whose
    /// entries fit one generation is marked persisted: its file is not
    /// written again. Generations are sized from a first pass.
    ///
    /// # Errors
    /// [`RestoreError`] when times go backwards, offsets do not increase,
    /// an entry lies before its group's base or an id repeats within a
    /// generation; the table is then partially filled (the caller discards
    /// the whole state).
    pub fn restore_groups<I>(
        &mut self,
        groups: &[RestoreGroup<I>],
        dead_floor_ms: Option<Millis>,
    ) -> Result<(), RestoreError>
    where
        I: Iterator<Item = (MessageId, Offset, Millis)> + Clone,
    {
        assert!(self.generations.is_empty());
        let span_ms = self.span_ms;
        // Where a group's first entry opens its generation: at the
        // referenced base when the entry fits a generation based there.
        let first_base = |base: Option<GenerationRef>, time_ms: Millis, offset: Offset| {
            let Some(base) = base else { return Ok((time_ms, offset.0)) };
            if time_ms < base.base_time_ms {
                return Err(RestoreError::TimeOrder);
            }
            if offset < base.first_offset {
                return Err(RestoreError::OffsetOrder);
            }
            let (base_time, base_offset) = (base.base_time_ms, base.first_offset.0);
            Ok(if closes(base_time, base_offset, 0, span_ms, time_ms, offset.0) {
                (time_ms, offset.0)
            } else {
                (base_time, base_offset)
            })
        };
        // Pass 1: how many entries each generation will get (same boundaries
        // as `push`; out-of-order input is refused by `push` in pass 2), and
        // which groups land in exactly one generation at their base.
        let mut sizes: Vec<usize> = Vec::new();
        let mut whole: Vec<bool> = Vec::with_capacity(groups.len());
        for group in groups {
            let mut current: Option<(Millis, u64, usize)> = None;
            let mut opened = 0usize;
            let mut at_base = false;
            for (_, offset, time_ms) in group.entries.clone() {
                let opens_at = match current {
                    None => {
                        let base = first_base(group.base, time_ms, offset)?;
                        at_base = group.base.is_some_and(|r| r.first_offset.0 == base.1);
                        Some(base)
                    }
                    Some((base_time_ms, base_offset, len)) => {
                        closes(base_time_ms, base_offset, len, span_ms, time_ms, offset.0)
                            .then_some((time_ms, offset.0))
                    }
                };
                if let Some((base_time_ms, base_offset)) = opens_at {
                    current = Some((base_time_ms, base_offset, 0));
                    sizes.push(0);
                    opened += 1;
                }
                if let Some((_, _, len)) = current.as_mut() {
                    *len += 1;
                }
                if let Some(size) = sizes.last_mut() {
                    *size += 1;
                }
            }
            whole.push(opened == 1 && at_base);
        }
        // Pass 2: insert into generations presized for those counts. A
        // repeated id is refused within a generation (the insert probe
        // meets it for free); probing every older generation per entry would
        // cost more than the rest of the restore, for a case our own
        // snapshots never contain (the newest entry would shadow it anyway).
        for (group, whole) in groups.iter().zip(whole) {
            let mut first = true;
            let mut any = false;
            for (id, offset, time_ms) in group.entries.clone() {
                let hash = self.keys.hash(&id.0);
                let opens_at =
                    if first { Some(first_base(group.base, time_ms, offset)?) } else { None };
                first = false;
                any = true;
                // Nothing is dropped during a restore, so a generation opened
                // now is number `generations.len()`.
                let hint = sizes.get(self.generations.len()).copied().unwrap_or(0);
                self.push(hash, &id, offset, time_ms, Some(hint), opens_at)?;
            }
            if let (true, true, Some(reference)) = (any, whole, group.base) {
                if let Some(newest) = self.generations.back_mut() {
                    newest.persisted = Some(reference);
                }
            }
        }
        self.dead_floor_ms = dead_floor_ms;
        Ok(())
    }

    /// Rebuilds the table from a snapshot's list (time order, as `entries`
    /// wrote it) into an empty table. Every entry is live afterwards: the
    /// snapshot held only live ones and nothing has been forgotten since.
    /// Generations are sized from a first pass, so no table grows.
    ///
    /// # Errors
    /// [`RestoreError`] when times go backwards, offsets do not increase or
    /// an id repeats within a generation; the table is then left partially
    /// filled (the caller discards the whole state).
    #[cfg(test)]
    pub fn restore<I>(&mut self, entries: I) -> Result<(), RestoreError>
    where
        I: Iterator<Item = (MessageId, Offset, Millis)> + Clone,
    {
        self.restore_groups(&[RestoreGroup { base: None, entries }], None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::dedupe::tests::id;

    // Goal: restore refuses a list out of time order or with a repeated id.
    #[test]
    fn restore_refuses_disorder_and_duplicates() {
        let mut table = DedupeTable::new(&[1; 32], 1_000);
        let list = [(id(1), Offset(1), 10), (id(2), Offset(2), 9)];
        assert_eq!(table.restore(list.iter().copied()), Err(RestoreError::TimeOrder));
        let mut table = DedupeTable::new(&[1; 32], 1_000);
        let list = [(id(1), Offset(1), 10), (id(1), Offset(2), 11)];
        assert_eq!(table.restore(list.iter().copied()), Err(RestoreError::DuplicateId));
        let mut table = DedupeTable::new(&[1; 32], 1_000);
        let list = [(id(1), Offset(1), 10), (id(2), Offset(900), 500)];
        assert_eq!(table.restore(list.iter().copied()), Ok(()));
        assert_eq!(table.len(), 2);
    }
}
