//! The slot hash of the dedupe index: SipHash-1-3 of a 16-byte id under a
//! key derived (`blake3::derive_key`) from the broker secret, written out
//! for exactly two 8-byte words.
//!
//! Owns the key and the function. Must stay bit for bit the generic
//! SipHash-1-3 (a test compares them) and keyed by the secret, so a client
//! that cannot learn the key cannot choose ids that share a probe chain;
//! stores nothing (the key is derived again at each start).

/// Key-derivation context for the slot-placement key.
const KEY_CONTEXT: &str = "spool 2025 dedupe table v1";

/// SipHash-1-3 key for slot placement.
#[derive(Clone, Copy, Debug)]
pub(super) struct Keys {
    k0: u64,
    k1: u64,
}

/// One SipRound.
#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

impl Keys {
    /// The key of a table: derived from the broker secret under
    /// [`KEY_CONTEXT`], so nothing new is stored.
    pub(super) fn from_secret(secret: &[u8; 32]) -> Self {
        let key = blake3::derive_key(KEY_CONTEXT, secret);
        let word = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&key[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        Self { k0: word(0), k1: word(8) }
    }

    /// SipHash-1-3 of the 16 id bytes under this key: the very function
    /// `SipHasher13::write(id)` + `finish` computes (a test compares them),
    /// written out for exactly two 8-byte words. The generic hasher buffers
    /// its input and handles any length and tail; here the two words are
    /// loaded at once and the final block is a constant, so a hash is six
    /// SipRounds and nothing else. The function, and so the HashDoS
    /// argument (a secret per-data-directory key, a keyed PRF: a client
    /// that cannot learn the key cannot choose ids that share a probe
    /// chain), is unchanged.
    #[inline]
    pub(super) fn hash(&self, id: &[u8; 16]) -> u64 {
        let mut low = [0u8; 8];
        let mut high = [0u8; 8];
        low.copy_from_slice(&id[..8]);
        high.copy_from_slice(&id[8..]);
        let words = [u64::from_le_bytes(low), u64::from_le_bytes(high)];
        let mut v = [
            self.k0 ^ 0x736f_6d65_7073_6575,
            self.k1 ^ 0x646f_7261_6e64_6f6d,
            self.k0 ^ 0x6c79_6765_6e65_7261,
            self.k1 ^ 0x7465_6462_7974_6573,
        ];
        for word in words {
            v[3] ^= word;
            sip_round(&mut v);
            v[0] ^= word;
        }
        // The last block: the length (16) in the top byte, no tail bytes.
        let last = 16u64 << 56;
        v[3] ^= last;
        sip_round(&mut v);
        v[0] ^= last;
        v[2] ^= 0xff;
        sip_round(&mut v);
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::dedupe::tests::xorshift;

    // Goal: the slot hash is SipHash-1-3 of the id under the table's key,
    // bit for bit (the written-out two-word form is only faster). Method:
    // compare with the `siphasher` crate for seeded random keys and ids.
    #[test]
    fn the_slot_hash_is_siphash_1_3_of_the_id() {
        use std::hash::Hasher;
        let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
        for _ in 0..1_000 {
            let keys = Keys { k0: next(), k1: next() };
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&next().to_le_bytes());
            id[8..].copy_from_slice(&next().to_le_bytes());
            let mut reference = siphasher::sip::SipHasher13::new_with_keys(keys.k0, keys.k1);
            reference.write(&id);
            assert_eq!(keys.hash(&id), reference.finish());
        }
    }
}
