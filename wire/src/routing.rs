//! Key routing, defined once for every producer (the client's
//! `partition_for_key`) and the cluster's key map
//! (`spool_broker::control::cluster::keys`): a routing key's partition among
//! `n` is **jump consistent hash** (Lamping & Veach, 2014) of its **FNV-1a
//! 64** ([`key_partition`]). Both are tiny, stable across platforms and
//! releases, and trivially written again in another language; the
//! published vectors below pin them. Growing a queue from `n` to `m`
//! partitions moves a key only into one of the new partitions, and about
//! `(m − n) / m` of the keys (a modulo would move `n / (n + 1)` of them
//! from `n` to `n + 1`). Keys are not adversarial here: they only spread
//! load.
//!
//! Jump hash computes in `f64`; the operations used (an integer converted
//! to `f64`, one division, one multiplication, a truncation) are exactly
//! rounded by IEEE 754, so every platform computes the same partition.

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `key`.
pub fn routing_hash(key: &[u8]) -> u64 {
    key.iter()
        .fold(FNV_OFFSET_BASIS, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME))
}

/// The multiplier of jump hash's linear congruential step (the paper's).
const JUMP_MULTIPLIER: u64 = 2_862_933_555_777_941_757;

/// Jump consistent hash: the bucket in `0..buckets` of `key`. Growing
/// `buckets` moves a key only into a new bucket. `buckets` 0 is taken as 1.
pub fn jump_consistent_hash(key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets.max(1));
    let mut state = key;
    let mut bucket: i64 = -1;
    let mut next: i64 = 0;
    while next < buckets {
        bucket = next;
        state = state.wrapping_mul(JUMP_MULTIPLIER).wrapping_add(1);
        let step = (1u64 << 31) as f64 / ((state >> 33) + 1) as f64;
        next = ((bucket + 1) as f64 * step) as i64;
    }
    // The loop runs at least once (buckets ≥ 1) and leaves bucket below
    // buckets, which fits a u32.
    bucket as u32
}

/// The partition (in `0..partitions`) of routing key `key`: jump
/// consistent hash of its FNV-1a 64. `partitions` 0 is taken as 1.
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    jump_consistent_hash(routing_hash(key), partitions)
}

/// `user-1`, `user-2`, `user-42`, `order-7` among 8 partitions.
#[cfg(test)]
const PINNED_PARTITIONS_OF_8: [u32; 4] = [7, 7, 0, 6];

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the hash is the published FNV-1a 64, so another client agrees
    // bit for bit; method: its known test vectors.
    #[test]
    fn the_routing_hash_is_fnv1a_64() {
        assert_eq!(routing_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(routing_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(routing_hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    // Goal: jump hash is the published function, so another client places
    // a key on the same partition; method: values of the paper's reference
    // code (Lamping & Veach's C++, run as a line-for-line transcription in
    // double precision), and the partitions of a few keys pinned (a change
    // here moves keys between partitions).
    #[test]
    fn jump_hash_is_the_published_one() {
        assert_eq!(jump_consistent_hash(0, 1), 0);
        assert_eq!(jump_consistent_hash(0, 100), 0);
        assert_eq!(jump_consistent_hash(1, 100), 55);
        assert_eq!(jump_consistent_hash(0xdead_beef, 100), 87);
        assert_eq!(jump_consistent_hash(u64::MAX, 1_000), 313);
        let pinned: Vec<u32> = ["user-1", "user-2", "user-42", "order-7"]
            .iter()
            .map(|key| key_partition(key.as_bytes(), 8))
            .collect();
        assert_eq!(pinned, PINNED_PARTITIONS_OF_8);
    }
}
