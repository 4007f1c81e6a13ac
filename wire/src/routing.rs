//! The routing hash: FNV-1a 64 of a message's routing key, the one
//! definition every producer places keys with (the client's
//! `partition_for_key`) and the cluster's key map hashes
//! (`spool_broker::control::cluster::keys`). It is tiny, stable across
//! platforms and releases, and trivially written again in another language;
//! the published test vectors below pin it. Keys are not adversarial here:
//! they only spread load.

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `key`.
pub fn routing_hash(key: &[u8]) -> u64 {
    key.iter()
        .fold(FNV_OFFSET_BASIS, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME))
}

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
}
