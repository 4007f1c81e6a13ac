//! Never-claimed ready messages of one priority band, in offset order.
//!
//! This is where a backlog lives, so it is built for memory: 24 bytes per
//! message in fixed chunks of `FRESH_CHUNK_ENTRIES`, plus a small header per
//! chunk (its minimum expiry, so `tick` can skip chunks with nothing expired,
//! and its live count). No per-message heap object, no map node. A message
//! leaves from the front when claimed (the common case) or is marked dead in
//! place (expiry or purge deep in the backlog); wholly dead chunks are freed.
//! Everything a claimed, scheduled or retried message needs lives elsewhere
//! (`PartitionState::warm`), so this type knows nothing of claims.

use std::collections::{BTreeMap, VecDeque};

use super::limits::FRESH_CHUNK_ENTRIES;
use super::types::{Millis, Offset};

/// Expiry value meaning "never expires".
pub(crate) const NEVER: Millis = Millis::MAX;
/// `enqueue_time_ms` value marking a dead entry.
const DEAD: u64 = u64::MAX;
/// `expiry_code` meaning "no expiry".
const NO_EXPIRY: u32 = 0;
/// `expiry_code` meaning "too far out for 32 bits: see `long_expiry`".
const LONG_EXPIRY: u32 = u32::MAX;

/// One never-claimed message: 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreshEntry {
    offset: u64,
    /// Enqueue time; `DEAD` once the entry has left in place.
    enqueue_time_ms: u64,
    size_bytes: u32,
    /// 0 none; `LONG_EXPIRY` see the side map; else expiry = enqueue + code - 1.
    expiry_code: u32,
}

const _: () = assert!(std::mem::size_of::<FreshEntry>() == 24);

/// A never-claimed message as the rest of the state machine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreshView {
    pub offset: Offset,
    pub enqueue_time_ms: Millis,
    pub size_bytes: u32,
    /// `NEVER` when the message does not expire.
    pub expiry_ms: Millis,
}

#[derive(Clone, Debug)]
struct Chunk {
    entries: Vec<FreshEntry>,
    /// Lower bound of the expiry of this chunk's live entries (`NEVER` if none
    /// expires). Recomputed whenever an entry leaves.
    min_expiry_ms: Millis,
    live: u32,
}

/// The never-claimed messages of one band.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreshBand {
    chunks: VecDeque<Chunk>,
    /// Index in `chunks[0]` of the first entry not yet popped. Kept on a live
    /// entry (or at the end of the last chunk) by `settle`.
    head: usize,
    live: u64,
    bytes: u64,
    /// Expiries more than `u32::MAX - 2` ms after enqueue (about 49 days).
    long_expiry: BTreeMap<u64, Millis>,
}

impl FreshBand {
    pub fn len(&self) -> u64 {
        self.live
    }

    /// Record bytes of the live messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn view(&self, entry: &FreshEntry) -> FreshView {
        let expiry_ms = match entry.expiry_code {
            NO_EXPIRY => NEVER,
            LONG_EXPIRY => *self.long_expiry.get(&entry.offset).unwrap_or(&NEVER),
            code => entry.enqueue_time_ms + u64::from(code) - 1,
        };
        FreshView {
            offset: Offset(entry.offset),
            enqueue_time_ms: entry.enqueue_time_ms,
            size_bytes: entry.size_bytes,
            expiry_ms,
        }
    }

    fn last_offset(&self) -> Option<u64> {
        self.chunks.back().and_then(|c| c.entries.last()).map(|e| e.offset)
    }

    /// Makes room for `count` more messages in one step (restore).
    pub fn reserve(&mut self, count: usize) {
        self.chunks.reserve(count.div_ceil(FRESH_CHUNK_ENTRIES));
    }

    /// Appends a message. Offsets must increase; `expiry_ms` must be `NEVER`
    /// or not before `enqueue_time_ms` (the caller normalizes).
    pub fn push(&mut self, message: FreshView) {
        assert!(self.last_offset().is_none_or(|last| last < message.offset.0));
        assert!(message.enqueue_time_ms != DEAD);
        assert!(message.expiry_ms >= message.enqueue_time_ms);
        let expiry_code = if message.expiry_ms == NEVER {
            NO_EXPIRY
        } else {
            let delta = message.expiry_ms - message.enqueue_time_ms;
            if delta < u64::from(LONG_EXPIRY - 1) {
                // `delta + 1` is at most LONG_EXPIRY - 1, so it fits and is not a marker.
                (delta + 1) as u32
            } else {
                self.long_expiry.insert(message.offset.0, message.expiry_ms);
                LONG_EXPIRY
            }
        };
        let entry = FreshEntry {
            offset: message.offset.0,
            enqueue_time_ms: message.enqueue_time_ms,
            size_bytes: message.size_bytes,
            expiry_code,
        };
        let needs_chunk = self.chunks.back().is_none_or(|c| c.entries.len() == FRESH_CHUNK_ENTRIES);
        if needs_chunk {
            if self.chunks.len() == 1 && self.chunks[0].live == 0 {
                // The only chunk is full of consumed entries: reuse its allocation.
                self.chunks[0].entries.clear();
                self.chunks[0].min_expiry_ms = NEVER;
                self.head = 0;
            } else {
                self.chunks.push_back(Chunk {
                    entries: Vec::with_capacity(FRESH_CHUNK_ENTRIES),
                    min_expiry_ms: NEVER,
                    live: 0,
                });
            }
        }
        let chunk = self.chunks.back_mut().expect("a chunk was just ensured");
        chunk.entries.push(entry);
        chunk.live += 1;
        chunk.min_expiry_ms = chunk.min_expiry_ms.min(message.expiry_ms);
        self.live += 1;
        self.bytes += u64::from(message.size_bytes);
    }

    /// A lower bound of the earliest expiry in this band (`NEVER` if none).
    pub fn min_expiry_ms(&self) -> Millis {
        self.chunks.iter().map(|c| c.min_expiry_ms).min().unwrap_or(NEVER)
    }

    /// The oldest live message.
    pub fn front(&self) -> Option<FreshView> {
        let chunk = self.chunks.front()?;
        let entry = chunk.entries.get(self.head)?;
        assert!(entry.enqueue_time_ms != DEAD);
        Some(self.view(entry))
    }

    /// Live messages in offset order.
    pub fn iter(&self) -> impl Iterator<Item = FreshView> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .flat_map(move |(index, chunk)| {
                let start = if index == 0 { self.head } else { 0 };
                chunk.entries[start.min(chunk.entries.len())..].iter()
            })
            .filter(|e| e.enqueue_time_ms != DEAD)
            .map(move |e| self.view(e))
    }

    /// Live messages with an offset above `after` (all of them for `None`),
    /// in offset order: a checkpoint resumes here after yielding, however
    /// the band changed in between. O(log chunks) to find the start.
    pub fn iter_after(&self, after: Option<Offset>) -> impl Iterator<Item = FreshView> + '_ {
        let (first, skip_to) = match after {
            None => (0, None),
            Some(after) => (
                self.chunks.partition_point(|c| c.entries[0].offset <= after.0).saturating_sub(1),
                Some(after.0),
            ),
        };
        self.chunks
            .iter()
            .enumerate()
            .skip(first)
            .flat_map(move |(index, chunk)| {
                let start = if index == 0 { self.head } else { 0 };
                chunk.entries[start.min(chunk.entries.len())..].iter()
            })
            .filter(move |e| {
                e.enqueue_time_ms != DEAD && skip_to.is_none_or(|after| e.offset > after)
            })
            .map(move |e| self.view(e))
    }

    /// Position of a live message, if it is in this band.
    fn locate(&self, offset: Offset) -> Option<(usize, usize)> {
        let after = self.chunks.partition_point(|c| c.entries[0].offset <= offset.0);
        let chunk_index = after.checked_sub(1)?;
        let chunk = &self.chunks[chunk_index];
        let entry_index = chunk.entries.binary_search_by_key(&offset.0, |e| e.offset).ok()?;
        if chunk_index == 0 && entry_index < self.head {
            return None;
        }
        (chunk.entries[entry_index].enqueue_time_ms != DEAD).then_some((chunk_index, entry_index))
    }

    pub fn get(&self, offset: Offset) -> Option<FreshView> {
        let (c, e) = self.locate(offset)?;
        Some(self.view(&self.chunks[c].entries[e]))
    }

    /// Removes a live message wherever it is; `None` if it is not here.
    pub fn remove(&mut self, offset: Offset) -> Option<FreshView> {
        let (chunk_index, entry_index) = self.locate(offset)?;
        let view = self.view(&self.chunks[chunk_index].entries[entry_index]);
        self.long_expiry.remove(&offset.0);
        let chunk = &mut self.chunks[chunk_index];
        chunk.entries[entry_index].enqueue_time_ms = DEAD;
        chunk.live -= 1;
        self.live -= 1;
        self.bytes -= u64::from(view.size_bytes);
        self.recompute_min(chunk_index);
        let chunk = &self.chunks[chunk_index];
        if chunk.live == 0 && chunk.entries.len() == FRESH_CHUNK_ENTRIES && self.chunks.len() > 1 {
            // A wholly dead full chunk: free it now rather than when the head
            // reaches it, so purges and expiries deep in a backlog return memory.
            self.chunks.remove(chunk_index);
            if chunk_index == 0 {
                self.head = 0;
            }
        }
        self.settle();
        Some(view)
    }

    fn recompute_min(&mut self, chunk_index: usize) {
        let start = if chunk_index == 0 { self.head } else { 0 };
        let chunk = &self.chunks[chunk_index];
        let min = chunk.entries[start.min(chunk.entries.len())..]
            .iter()
            .filter(|e| e.enqueue_time_ms != DEAD)
            .map(|e| self.view(e).expiry_ms)
            .min()
            .unwrap_or(NEVER);
        self.chunks[chunk_index].min_expiry_ms = min;
    }

    /// Moves `head` onto the first live entry, freeing consumed chunks.
    fn settle(&mut self) {
        loop {
            let Some(front) = self.chunks.front() else {
                self.head = 0;
                return;
            };
            while self.head < front.entries.len()
                && front.entries[self.head].enqueue_time_ms == DEAD
            {
                self.head += 1;
            }
            if self.head < front.entries.len() || self.chunks.len() == 1 {
                return;
            }
            self.chunks.pop_front();
            self.head = 0;
        }
    }

    /// Appends to `out` the first `max` live messages below offset `below`
    /// with `expiry_ms <= now`, in offset order. Chunks whose minimum expiry
    /// is later are skipped unread; the scan stops at the first entry at or
    /// past `below`.
    pub fn expired(&self, now: Millis, below: Offset, max: usize, out: &mut Vec<FreshView>) {
        let limit = out.len() + max;
        for (index, chunk) in self.chunks.iter().enumerate() {
            if out.len() >= limit || chunk.entries[0].offset >= below.0 {
                return;
            }
            if chunk.min_expiry_ms > now {
                continue;
            }
            let start = if index == 0 { self.head } else { 0 };
            for entry in &chunk.entries[start.min(chunk.entries.len())..] {
                if entry.offset >= below.0 {
                    return;
                }
                if entry.enqueue_time_ms == DEAD {
                    continue;
                }
                let view = self.view(entry);
                if view.expiry_ms <= now && out.len() < limit {
                    out.push(view);
                }
            }
        }
    }

    /// The first live message enqueued at or after `time_ms`. Enqueue times
    /// are non-decreasing in offset (clamped at enqueue), so a chunk whose
    /// last live entry is older is skipped unread: O(chunks + one chunk).
    pub fn first_at_or_after(&self, time_ms: Millis) -> Option<FreshView> {
        for (index, chunk) in self.chunks.iter().enumerate() {
            let start = if index == 0 { self.head } else { 0 };
            let entries = &chunk.entries[start.min(chunk.entries.len())..];
            let last = entries.iter().rev().find(|entry| entry.enqueue_time_ms != DEAD);
            if last.is_none_or(|entry| entry.enqueue_time_ms < time_ms) {
                continue;
            }
            let first = entries
                .iter()
                .find(|entry| entry.enqueue_time_ms != DEAD && entry.enqueue_time_ms >= time_ms);
            return first.map(|entry| self.view(entry));
        }
        None
    }

    /// Read-only consistency check: order, counts, chunk headers.
    pub fn assert_invariants(&self) {
        let mut live = 0u64;
        let mut bytes = 0u64;
        let mut last: Option<u64> = None;
        for (index, chunk) in self.chunks.iter().enumerate() {
            assert!(!chunk.entries.is_empty());
            if index + 1 < self.chunks.len() {
                assert!(chunk.entries.len() == FRESH_CHUNK_ENTRIES);
            }
            let start = if index == 0 { self.head } else { 0 };
            let mut chunk_live = 0u32;
            for (position, entry) in chunk.entries.iter().enumerate() {
                assert!(last.is_none_or(|l| l < entry.offset));
                last = Some(entry.offset);
                if position < start || entry.enqueue_time_ms == DEAD {
                    continue;
                }
                chunk_live += 1;
                bytes += u64::from(entry.size_bytes);
                assert!(chunk.min_expiry_ms <= self.view(entry).expiry_ms);
            }
            assert!(chunk_live == chunk.live);
            live += u64::from(chunk_live);
        }
        assert!(live == self.live);
        assert!(bytes == self.bytes);
        if let Some(front) = self.chunks.front() {
            if self.head < front.entries.len() {
                assert!(front.entries[self.head].enqueue_time_ms != DEAD);
            } else {
                assert!(self.chunks.len() == 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: u64, expiry_ms: Millis) -> FreshView {
        FreshView { offset: Offset(offset), enqueue_time_ms: 10, size_bytes: 7, expiry_ms }
    }

    // Goal: push/pop/remove across chunk boundaries keep order, counts and
    // expiry encodings. Method: mirror a Vec through mixed operations.
    #[test]
    fn band_matches_a_vec_through_pushes_and_removals() {
        let mut band = FreshBand::default();
        let mut mirror: Vec<FreshView> = Vec::new();
        for i in 0..300u64 {
            let expiry = match i % 4 {
                0 => NEVER,
                1 => 10 + i,
                2 => 10 + (1u64 << 40),
                _ => 10,
            };
            band.push(msg(i * 3, expiry));
            mirror.push(msg(i * 3, expiry));
        }
        for i in (0..300u64).filter(|i| i % 7 == 3 || *i < 70) {
            let got = band.remove(Offset(i * 3));
            let pos = mirror.iter().position(|m| m.offset == Offset(i * 3)).unwrap();
            assert_eq!(got, Some(mirror.remove(pos)));
            band.assert_invariants();
        }
        assert_eq!(band.iter().collect::<Vec<_>>(), mirror);
        assert_eq!(band.front(), mirror.first().copied());
        assert_eq!(band.remove(Offset(1)), None);
        let mut expired = Vec::new();
        band.expired(50, Offset(u64::MAX), usize::MAX, &mut expired);
        let want: Vec<_> = mirror.iter().copied().filter(|m| m.expiry_ms <= 50).collect();
        assert_eq!(expired, want);
        let below = Offset(mirror.len() as u64 * 3 / 2);
        expired.clear();
        band.expired(50, below, usize::MAX, &mut expired);
        let want: Vec<_> =
            mirror.iter().copied().filter(|m| m.expiry_ms <= 50 && m.offset < below).collect();
        assert_eq!(expired, want, "nothing at or past `below`");
        assert_eq!(band.len(), mirror.len() as u64);
    }
}
