//! `ChunkMap`: an offset-ordered map stored as a list of sorted chunks.
//!
//! Holds the main-lane messages that have left the fresh backlog (claimed,
//! scheduled, retried). A `BTreeMap` leaves its nodes about half full when
//! keys arrive in increasing order (they do here: claims take the oldest
//! messages first), which alone costs ~130 bytes per 64-byte entry. Chunks of
//! `WARM_CHUNK_ENTRIES` that append at the end of the last chunk fill
//! completely in that case, split in half otherwise, and merge with a
//! neighbour when two fit in one, so memory stays close to the entries
//! themselves. Lookups are two binary searches. Ordered, so iteration and
//! snapshots are deterministic.

use super::limits::WARM_CHUNK_ENTRIES;
use super::types::Offset;

#[derive(Clone, Debug)]
pub(crate) struct ChunkMap<V> {
    chunks: Vec<Vec<(Offset, V)>>,
    len: usize,
}

impl<V> Default for ChunkMap<V> {
    fn default() -> Self {
        Self { chunks: Vec::new(), len: 0 }
    }
}

impl<V> ChunkMap<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Index of the chunk that holds, or would hold, `key`.
    fn chunk_for(&self, key: Offset) -> usize {
        self.chunks.partition_point(|c| c[0].0 <= key).saturating_sub(1)
    }

    fn position(&self, key: Offset) -> Option<(usize, usize)> {
        if self.chunks.is_empty() {
            return None;
        }
        let chunk = self.chunk_for(key);
        let entry = self.chunks[chunk].binary_search_by_key(&key, |e| e.0).ok()?;
        Some((chunk, entry))
    }

    pub fn get(&self, key: &Offset) -> Option<&V> {
        let (c, e) = self.position(*key)?;
        Some(&self.chunks[c][e].1)
    }

    pub fn get_mut(&mut self, key: &Offset) -> Option<&mut V> {
        let (c, e) = self.position(*key)?;
        Some(&mut self.chunks[c][e].1)
    }

    pub fn contains_key(&self, key: &Offset) -> bool {
        self.position(*key).is_some()
    }

    pub fn first_key(&self) -> Option<Offset> {
        self.chunks.first().map(|c| c[0].0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Offset, &V)> + '_ {
        self.chunks.iter().flatten().map(|(k, v)| (k, v))
    }

    /// Entries with a key above `after` (all for `None`), in key order: a
    /// checkpoint resumes here after yielding. O(log chunks) to find the start.
    pub fn iter_after(&self, after: Option<Offset>) -> impl Iterator<Item = (&Offset, &V)> + '_ {
        let first = after.map_or(0, |key| self.chunk_for(key));
        self.chunks
            .iter()
            .skip(first)
            .flatten()
            .filter(move |(k, _)| after.is_none_or(|after| *k > after))
            .map(|(k, v)| (k, v))
    }

    /// Inserts `value` under `key`; returns the value it replaced.
    pub fn insert(&mut self, key: Offset, value: V) -> Option<V> {
        if self.chunks.is_empty() {
            let mut chunk = Vec::with_capacity(WARM_CHUNK_ENTRIES);
            chunk.push((key, value));
            self.chunks.push(chunk);
            self.len = 1;
            return None;
        }
        let mut chunk = self.chunk_for(key);
        let mut at = match self.chunks[chunk].binary_search_by_key(&key, |e| e.0) {
            Ok(at) => return Some(std::mem::replace(&mut self.chunks[chunk][at].1, value)),
            Err(at) => at,
        };
        if self.chunks[chunk].len() == WARM_CHUNK_ENTRIES {
            if chunk + 1 == self.chunks.len() && at == WARM_CHUNK_ENTRIES {
                // Appending past the end: start a new chunk, keep this one full.
                let mut fresh = Vec::with_capacity(WARM_CHUNK_ENTRIES);
                fresh.push((key, value));
                self.chunks.push(fresh);
                self.len += 1;
                return None;
            }
            let half = WARM_CHUNK_ENTRIES / 2;
            let mut right = Vec::with_capacity(WARM_CHUNK_ENTRIES);
            right.extend(self.chunks[chunk].drain(half..));
            self.chunks.insert(chunk + 1, right);
            if at > half {
                chunk += 1;
                at -= half;
            }
        }
        self.chunks[chunk].insert(at, (key, value));
        self.len += 1;
        None
    }

    pub fn remove(&mut self, key: &Offset) -> Option<V> {
        let (mut chunk, entry) = self.position(*key)?;
        let (_, value) = self.chunks[chunk].remove(entry);
        self.len -= 1;
        if self.chunks[chunk].is_empty() {
            self.chunks.remove(chunk);
            return Some(value);
        }
        if chunk + 1 < self.chunks.len()
            && self.chunks[chunk].len() + self.chunks[chunk + 1].len() <= WARM_CHUNK_ENTRIES
        {
            let next = self.chunks.remove(chunk + 1);
            self.chunks[chunk].extend(next);
        }
        if chunk > 0
            && self.chunks[chunk - 1].len() + self.chunks[chunk].len() <= WARM_CHUNK_ENTRIES
        {
            let current = self.chunks.remove(chunk);
            chunk -= 1;
            self.chunks[chunk].extend(current);
        }
        Some(value)
    }

    pub fn assert_invariants(&self) {
        let mut count = 0;
        let mut last: Option<Offset> = None;
        for chunk in &self.chunks {
            assert!(!chunk.is_empty());
            assert!(chunk.len() <= WARM_CHUNK_ENTRIES);
            assert!(chunk.capacity() == WARM_CHUNK_ENTRIES);
            for (key, _) in chunk {
                assert!(last.is_none_or(|l| l < *key));
                last = Some(*key);
            }
            count += chunk.len();
        }
        assert!(count == self.len);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    // Goal: ChunkMap behaves as a BTreeMap under random inserts and removes
    // (splits, merges, appends). Method: mirror 20 000 operations.
    #[test]
    fn chunk_map_matches_btreemap() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut map = ChunkMap::default();
        let mut mirror = BTreeMap::new();
        for step in 0..20_000u64 {
            let key =
                Offset(if rng.random_bool(0.5) { step } else { rng.random_range(0..step + 1) });
            if rng.random_bool(0.6) {
                assert_eq!(map.insert(key, step), mirror.insert(key, step));
            } else {
                assert_eq!(map.remove(&key), mirror.remove(&key));
            }
            assert_eq!(map.get(&key), mirror.get(&key));
            if step % 500 == 0 {
                map.assert_invariants();
                assert!(map.iter().map(|(k, v)| (*k, *v)).eq(mirror.iter().map(|(k, v)| (*k, *v))));
            }
        }
        assert_eq!(map.len(), mirror.len());
        assert_eq!(map.first_key(), mirror.keys().next().copied());
    }
}
