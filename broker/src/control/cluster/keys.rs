//! Versioned key placement: which partition of a queue a routing key goes
//! to, such that growing the queue moves few keys.
//!
//! [`KeyMap::partition_for`] is **jump consistent hash** (Lamping & Veach,
//! 2014) of **FNV-1a 64** of the key ([`key_hash`]). Growing a queue from
//! `n` to `m` partitions moves a key only to one of the new partitions
//! `n..m`, and about `(m − n) / m` of the keys (tested below); the modulo
//! of today's mapping moves most keys (`n / (n + 1)` of them from `n` to
//! `n + 1` partitions).
//!
//! **Relation to the client.** The client routes a key with
//! `spool_client::routing::partition_for_key`, the same function
//! (`spool_wire::routing::key_partition`: jump hash of FNV-1a 64) over the
//! partition count its metadata gives (Metadata also names the key map's
//! version). A broker refuses a record whose key a resize moved
//! (`KEY_MOVED`); the client then fetches the metadata again and routes
//! the record by the new count. Records of a moved key still
//! waiting in the old partition go out first: the added partitions hold
//! their messages until the older ones drained (`docs/design/replication.md`,
//! "Resizing a queue").
//!
//! Jump hash computes in `f64`; the operations used (an integer converted
//! to `f64`, one division, one multiplication, a truncation) are exactly
//! rounded by IEEE 754, so every platform computes the same partition.

use spool_wire::proto::PartitionId;
use thiserror::Error;

use super::hash::fnv1a64;
use super::limits::KEY_MAP_PARTITIONS_MAX;

/// Why a key map could not be built or changed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyMapError {
    #[error("a key map needs 1..={max} partitions, not {partitions}")]
    Partitions { partitions: u32, max: u32 },
    #[error("a key map only grows: {from} partitions cannot become {to}")]
    NotGrowing { from: u32, to: u32 },
    #[error("key map version {version} cannot increase")]
    VersionExhausted { version: u64 },
}

/// The hash a key is placed by: FNV-1a 64, the function today's client
/// routes keys with.
pub fn key_hash(key: &[u8]) -> u64 {
    fnv1a64(key)
}

/// Jump consistent hash, defined once in `spool_wire::routing`.
pub use spool_wire::routing::jump_consistent_hash;

/// A queue's key → partition map at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMap {
    version: u64,
    partitions: u32,
}

impl KeyMap {
    /// # Errors
    /// [`KeyMapError::Partitions`] outside `1..=KEY_MAP_PARTITIONS_MAX`.
    pub fn new(version: u64, partitions: u32) -> Result<KeyMap, KeyMapError> {
        if partitions == 0 || partitions > KEY_MAP_PARTITIONS_MAX {
            return Err(KeyMapError::Partitions { partitions, max: KEY_MAP_PARTITIONS_MAX });
        }
        Ok(KeyMap { version, partitions })
    }

    /// Identifies the map: a client holding an older version routes by a
    /// map that is no longer the queue's.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition of `key`: jump consistent hash of [`key_hash`].
    pub fn partition_for(&self, key: &[u8]) -> PartitionId {
        PartitionId(jump_consistent_hash(key_hash(key), self.partitions))
    }

    /// The map of the queue grown to `partitions`, at the next version.
    ///
    /// # Errors
    /// [`KeyMapError::NotGrowing`] unless `partitions` is more than now
    /// (shrinking would move every key of the removed partitions and more),
    /// [`KeyMapError::Partitions`] above the bound,
    /// [`KeyMapError::VersionExhausted`] at version `u64::MAX`.
    pub fn grow(&self, partitions: u32) -> Result<KeyMap, KeyMapError> {
        if partitions <= self.partitions {
            return Err(KeyMapError::NotGrowing { from: self.partitions, to: partitions });
        }
        let version = self
            .version
            .checked_add(1)
            .ok_or(KeyMapError::VersionExhausted { version: self.version })?;
        KeyMap::new(version, partitions)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    fn key(n: u64) -> Vec<u8> {
        format!("user-{n}").into_bytes()
    }

    /// Chi-square statistic of `keys` keys over `partitions`.
    fn chi_square(map: &KeyMap, keys: u64) -> f64 {
        let mut counts = vec![0u64; map.partitions() as usize];
        for n in 0..keys {
            counts[map.partition_for(&key(n)).0 as usize] += 1;
        }
        let expected = keys as f64 / f64::from(map.partitions());
        counts.iter().map(|&count| (count as f64 - expected).powi(2) / expected).sum()
    }

    // Goal: the function is pinned, so every client and release agrees;
    // method: the paper's reference outputs, and known keys.
    #[test]
    fn jump_hash_matches_known_answers() {
        // The vectors other implementations of the paper's function share
        // (Go's, Python's, Elixir's test suites).
        let vectors: [(u64, u32, u32); 10] = [
            (1, 1, 0),
            (42, 57, 43),
            (0xdead_10cc, 1, 0),
            (0xdead_10cc, 666, 361),
            (256, 1024, 520),
            (4, 2, 1),
            (7, 2, 0),
            (1, 128, 55),
            (129, 128, 120),
            (u64::MAX, 128, 92),
        ];
        for (key, buckets, bucket) in vectors {
            assert_eq!(jump_consistent_hash(key, buckets), bucket, "{key} over {buckets}");
        }
        assert_eq!(jump_consistent_hash(u64::MAX, 0), 0);
        let map = KeyMap::new(1, 16).unwrap();
        let answers: Vec<u32> =
            [&b"user-1"[..], b"user-2", b"order-77", b""].map(|k| map.partition_for(k).0).into();
        assert_eq!(answers, KNOWN_KEYS);
    }

    const KNOWN_KEYS: [u32; 4] = [12, 7, 10, 13];

    // Goal: a key always lands on the same partition, whatever the version;
    // method: the same keys twice, under two versions.
    #[test]
    fn placement_is_deterministic_and_independent_of_version() {
        let one = KeyMap::new(1, 37).unwrap();
        let other = KeyMap::new(9, 37).unwrap();
        for n in 0..1000 {
            let partition = one.partition_for(&key(n));
            assert!(partition.0 < 37);
            assert_eq!(partition, one.partition_for(&key(n)));
            assert_eq!(partition, other.partition_for(&key(n)));
        }
    }

    // Goal: keys spread evenly; method: 100,000 sequential keys over 10, 100
    // and 1,000 partitions, chi-square within 5 standard deviations of its
    // mean (the degrees of freedom; its variance is twice that).
    #[test]
    fn keys_spread_uniformly() {
        for partitions in [10u32, 100, 1000] {
            let map = KeyMap::new(1, partitions).unwrap();
            let statistic = chi_square(&map, 100_000);
            let freedom = f64::from(partitions - 1);
            let bound = freedom + 5.0 * (2.0 * freedom).sqrt();
            eprintln!("{partitions} partitions: chi-square {statistic:.1} (bound {bound:.1})");
            assert!(statistic < bound, "{partitions}: chi-square {statistic:.1} ≥ {bound:.1}");
        }
    }

    // Goal: growing from n to m moves about (m − n)/m of the keys, each into
    // a new partition; method: 100,000 keys, several growths, the moved
    // share within ±10 % (relative) of (m − n)/m.
    #[test]
    fn growth_moves_only_the_new_share_into_new_partitions() {
        for (from, to) in [(1u32, 2u32), (4, 5), (10, 16), (100, 101), (64, 128)] {
            let old = KeyMap::new(3, from).unwrap();
            let new = old.grow(to).unwrap();
            assert_eq!(new.version(), 4);
            let mut moved = 0u32;
            for n in 0..100_000 {
                let (before, after) = (old.partition_for(&key(n)), new.partition_for(&key(n)));
                if before != after {
                    assert!(after.0 >= from, "{n}: {before:?} -> {after:?}");
                    moved += 1;
                }
            }
            let share = f64::from(moved) / 100_000.0;
            let expected = f64::from(to - from) / f64::from(to);
            eprintln!("{from} -> {to}: moved {share:.4} (expected {expected:.4})");
            assert!((share - expected).abs() <= 0.1 * expected + 0.002, "{from}->{to}: {share}");
        }
    }

    // Goal: the map differs from today's modulo mapping, which a client must
    // know to switch; method: count agreement with FNV-1a modulo at 1 and 4.
    #[test]
    fn key_maps_are_not_todays_modulo() {
        let one = KeyMap::new(1, 1).unwrap();
        let four = KeyMap::new(1, 4).unwrap();
        let mut agree = 0;
        for n in 0..10_000 {
            let hash = key_hash(&key(n));
            assert_eq!(one.partition_for(&key(n)).0, 0);
            agree += u32::from(four.partition_for(&key(n)).0 == (hash % 4) as u32);
        }
        assert!((1500..3500).contains(&agree), "{agree}");
    }

    // Goal: the version is carried and advanced, bad counts refused;
    // method: build, grow, shrink, exceed, exhaust.
    #[test]
    fn versions_and_bounds_are_kept() {
        let map = KeyMap::new(7, 16).unwrap();
        assert_eq!((map.version(), map.partitions()), (7, 16));
        let grown = map.grow(20).unwrap();
        assert_eq!((grown.version(), grown.partitions()), (8, 20));
        assert_eq!(map.grow(16), Err(KeyMapError::NotGrowing { from: 16, to: 16 }));
        assert_eq!(map.grow(3), Err(KeyMapError::NotGrowing { from: 16, to: 3 }));
        let max = KEY_MAP_PARTITIONS_MAX;
        assert_eq!(map.grow(max + 1), Err(KeyMapError::Partitions { partitions: max + 1, max }));
        assert_eq!(KeyMap::new(0, 0), Err(KeyMapError::Partitions { partitions: 0, max }));
        assert!(KeyMap::new(0, max).is_ok());
        let last = KeyMap::new(u64::MAX, 2).unwrap();
        assert_eq!(last.grow(3), Err(KeyMapError::VersionExhausted { version: u64::MAX }));
    }

    proptest! {
        // Goal: for any key and growth, a key stays or moves into a new
        // partition, and it is always within the count; method: random keys
        // and counts up to the bound.
        #[test]
        fn any_key_stays_or_moves_to_a_new_partition(
            key in proptest::collection::vec(any::<u8>(), 0..64),
            from in 1u32..=KEY_MAP_PARTITIONS_MAX,
            extra in 1u32..=KEY_MAP_PARTITIONS_MAX,
        ) {
            let to = from.saturating_add(extra).min(KEY_MAP_PARTITIONS_MAX);
            prop_assume!(to > from);
            let old = KeyMap::new(0, from).unwrap();
            let new = old.grow(to).unwrap();
            let (before, after) = (old.partition_for(&key), new.partition_for(&key));
            prop_assert!(before.0 < from && after.0 < to);
            prop_assert!(before == after || after.0 >= from);
        }
    }
}
