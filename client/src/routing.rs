//! Which partition a message goes to: a pure function of its routing key and
//! the queue's partition count, so every producer (in any language) places a
//! key on the same partition. Jump consistent hash of the key's FNV-1a 64,
//! defined once in `spool_wire::routing` (`docs/design/protocol.md`, "Key
//! routing"): a queue grown from `n` to `m` partitions moves about
//! `(m − n) / m` of the keys, each into a new partition.

use spool_wire::proto::PartitionId;

pub use spool_wire::routing::routing_hash;

/// The partition of a non-empty routing key among `partitions` (> 0).
pub fn partition_for_key(key: &[u8], partitions: u32) -> PartitionId {
    assert!(partitions > 0);
    PartitionId(spool_wire::routing::key_partition(key, partitions))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the hash is the published FNV-1a 64 (so other clients agree) and
    // keys spread; method: known test vectors, then a histogram over 4 partitions.
    #[test]
    fn fnv_vectors_and_spread() {
        assert_eq!(routing_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(routing_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(routing_hash(b"foobar"), 0x8594_4171_f739_67e8);
        let mut counts = [0u32; 4];
        for n in 0..4000 {
            counts[partition_for_key(format!("user-{n}").as_bytes(), 4).0 as usize] += 1;
        }
        assert!(counts.iter().all(|&count| count > 800), "{counts:?}");
        assert_eq!(partition_for_key(b"user-1", 4), partition_for_key(b"user-1", 4));
        // Growing 4 → 5 moves only keys into the new partition, ≈ 1/5 of them.
        let moved = (0..4000)
            .filter(|n| {
                let key = format!("user-{n}");
                let (before, after) =
                    (partition_for_key(key.as_bytes(), 4), partition_for_key(key.as_bytes(), 5));
                assert!(
                    before == after || after == PartitionId(4),
                    "{key} moved {before:?} → {after:?}"
                );
                before != after
            })
            .count();
        assert!((700..=900).contains(&moved), "{moved} of 4000 keys moved");
    }
}
