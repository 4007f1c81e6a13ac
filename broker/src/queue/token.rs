//! Delivery tokens: the capability a claim hands a worker.
//!
//! A token binds (queue, partition, subscription, lane, offset, generation,
//! leader epoch, worker) and carries a 128-bit MAC: BLAKE3 in keyed mode under a key derived
//! from the broker's 32-byte secret. Tokens travel opaque on the wire; the
//! broker verifies the MAC (constant-time compare) before it looks at any
//! field, then the state machine checks that the claim they name is still the
//! current one. This module only builds, parses and verifies bytes; whether a
//! token is *current* is `PartitionState`'s business.
//!
//! ```text
//!  0  u8       version (1)
//!  1  u8       lane (0 main, 1 dead-letter)
//!  2  u16      subscription id (0 the default; reserved as 0 before
//!               subscriptions, so every older token names the default)
//!  4  u32      queue id
//!  8  u32      partition id
//! 12  u32      generation
//! 16  u64      offset
//! 24  u64      leader epoch
//! 32  u64      worker id
//! 40  [u8;16]  MAC = BLAKE3-keyed(key, bytes[0..40]) truncated to 16 bytes
//! ```

use subtle::ConstantTimeEq;

use super::error::CodecError;
use super::types::{
    Generation, Lane, LeaderEpoch, Offset, PartitionId, QueueId, SubscriptionId, WorkerId,
};

/// Size of a delivery token on the wire.
pub const DELIVERY_TOKEN_BYTES: usize = 56;
/// Bytes of the token the MAC covers.
const MAC_COVERS_BYTES: usize = 40;
/// Size of the MAC tag.
pub const TOKEN_MAC_BYTES: usize = 16;
const TOKEN_VERSION: u8 = 1;
/// BLAKE3 key-derivation context: a token key is never the raw secret, so the
/// same secret can key other MACs without cross-protocol confusion.
const KEY_CONTEXT: &str = "spool 2025 delivery token v1";

const _: () = assert!(MAC_COVERS_BYTES + TOKEN_MAC_BYTES == DELIVERY_TOKEN_BYTES);

/// The MAC key, derived from the broker secret. `Debug` does not print it.
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// Derives the token key from the broker's 32-byte secret.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self(blake3::derive_key(KEY_CONTEXT, secret))
    }

    fn tag(&self, covered: &[u8]) -> [u8; TOKEN_MAC_BYTES] {
        let hash = blake3::keyed_hash(&self.0, covered);
        let mut tag = [0u8; TOKEN_MAC_BYTES];
        tag.copy_from_slice(&hash.as_bytes()[..TOKEN_MAC_BYTES]);
        tag
    }

    /// Issues a token for `claim`.
    pub fn sign(&self, claim: &TokenClaim) -> DeliveryToken {
        let mut bytes = [0u8; DELIVERY_TOKEN_BYTES];
        claim.write(&mut bytes);
        let tag = self.tag(&bytes[..MAC_COVERS_BYTES]);
        bytes[MAC_COVERS_BYTES..].copy_from_slice(&tag);
        DeliveryToken { claim: *claim, bytes }
    }

    /// True when the token's MAC is the one this key gives its fields. The
    /// comparison takes the same time wherever the first difference is.
    pub fn verify(&self, token: &DeliveryToken) -> bool {
        let tag = self.tag(&token.bytes[..MAC_COVERS_BYTES]);
        bool::from(tag.ct_eq(&token.bytes[MAC_COVERS_BYTES..]))
    }
}

/// The fields a token binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenClaim {
    pub queue: QueueId,
    pub partition: PartitionId,
    pub sub: SubscriptionId,
    pub lane: Lane,
    pub offset: Offset,
    pub generation: Generation,
    pub epoch: LeaderEpoch,
    pub worker: WorkerId,
}

impl TokenClaim {
    fn write(&self, bytes: &mut [u8; DELIVERY_TOKEN_BYTES]) {
        bytes[0] = TOKEN_VERSION;
        bytes[1] = self.lane as u8;
        bytes[2..4].copy_from_slice(&self.sub.0.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.queue.0.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.partition.0.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.generation.0.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.offset.0.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.epoch.0.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.worker.0.to_le_bytes());
    }
}

/// A parsed token. Parsing does not verify the MAC: only a `TokenKey` can,
/// and every `PartitionState` decision that takes a token does so first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryToken {
    claim: TokenClaim,
    bytes: [u8; DELIVERY_TOKEN_BYTES],
}

impl DeliveryToken {
    /// The fields the token claims (unverified until checked with a key).
    pub fn claim(&self) -> &TokenClaim {
        &self.claim
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; DELIVERY_TOKEN_BYTES] {
        self.bytes
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// [`CodecError`] on a wrong length, unknown version or lane.
    pub fn from_bytes(raw: &[u8]) -> Result<Self, CodecError> {
        let bytes: [u8; DELIVERY_TOKEN_BYTES] = raw
            .try_into()
            .map_err(|_| CodecError::Length { expected: DELIVERY_TOKEN_BYTES, got: raw.len() })?;
        if bytes[0] != TOKEN_VERSION {
            return Err(CodecError::Version(u16::from(bytes[0])));
        }
        let lane = Lane::from_u8(bytes[1]).ok_or(CodecError::BadField("lane"))?;
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        let claim = TokenClaim {
            queue: QueueId(u32_at(4)),
            partition: PartitionId(u32_at(8)),
            sub: SubscriptionId(u16::from_le_bytes([bytes[2], bytes[3]])),
            lane,
            offset: Offset(u64_at(16)),
            generation: Generation(u32_at(12)),
            epoch: LeaderEpoch(u64_at(24)),
            worker: WorkerId(u64_at(32)),
        };
        Ok(Self { claim, bytes })
    }
}
