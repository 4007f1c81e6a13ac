//! Stable 64-bit hashes for placement: fixed functions, written out here, so
//! every node (and every release) computes the same placement. `std`'s
//! `DefaultHasher` is not used: its algorithm may change between releases.
//!
//! - [`fnv1a64`]: FNV-1a 64 over bytes, the routing hash every client
//!   places keys with (`spool_wire::routing::routing_hash`, re-exported).
//! - [`mix64`]: the SplitMix64 finalizer (Stafford's "Mix13"), a bijection
//!   on `u64` whose every output bit depends on every input bit.

/// FNV-1a 64 of `bytes`: the routing hash, defined once in
/// `spool_wire::routing`.
pub use spool_wire::routing::routing_hash as fnv1a64;

/// The SplitMix64 finalizer of `value`.
pub fn mix64(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: both functions are the published ones, so another implementation
    // (a client in another language, a later release) agrees bit for bit;
    // method: known vectors.
    #[test]
    fn hashes_match_their_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        // SplitMix64 seeded with 0: its first output is mix64(0x9e37_79b9_7f4a_7c15).
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }
}
