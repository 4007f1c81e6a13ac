//! Delivery tokens as the HTTP API writes them: one opaque string that
//! carries what an ack, extend or release needs to reach the owning shard
//! (queue and partition) and the protocol's 64-byte token itself.
//!
//! Layout before base64url (no padding): format byte `1`, partition
//! (u32 big-endian), queue name length (u8), the name, the token. The
//! token's own MAC is what the broker checks; this wrapping only routes
//! it, so a string that does not decode is `INVALID_TOKEN`, as a token the
//! broker does not recognise would be.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use spool_wire::proto::{DeliveryToken, PartitionId, DELIVERY_TOKEN_BYTES};
use spool_wire::ErrorCode;

use super::error::ApiError;
use super::limits::TOKEN_TEXT_BYTES_MAX;

/// The layout's version byte.
const TOKEN_FORMAT: u8 = 1;

/// A decoded token string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedToken {
    pub queue: String,
    pub partition: PartitionId,
    pub token: DeliveryToken,
}

/// The string for `token` of `partition` of `queue`.
pub fn encode(queue: &str, partition: PartitionId, token: &DeliveryToken) -> String {
    let name = queue.as_bytes();
    // Queue names are at most QUEUE_NAME_BYTES_MAX (128) bytes.
    let name_len = u8::try_from(name.len()).unwrap_or(u8::MAX);
    let name = &name[..usize::from(name_len)];
    let mut raw = Vec::with_capacity(6 + name.len() + DELIVERY_TOKEN_BYTES);
    raw.push(TOKEN_FORMAT);
    raw.extend_from_slice(&partition.0.to_be_bytes());
    raw.push(name_len);
    raw.extend_from_slice(name);
    raw.extend_from_slice(&token.0);
    URL_SAFE_NO_PAD.encode(raw)
}

/// Reads a token string.
///
/// # Errors
/// `INVALID_TOKEN` (400) for anything [`encode`] did not write.
pub fn decode(text: &str) -> Result<RoutedToken, ApiError> {
    let invalid = |why: &str| ApiError::new(ErrorCode::InvalidToken, format!("token: {why}"));
    if text.len() > TOKEN_TEXT_BYTES_MAX {
        return Err(invalid(&format!("longer than {TOKEN_TEXT_BYTES_MAX} characters")));
    }
    let raw = URL_SAFE_NO_PAD.decode(text).map_err(|_| invalid("not base64url"))?;
    let Some((&format, rest)) = raw.split_first() else { return Err(invalid("empty")) };
    if format != TOKEN_FORMAT {
        return Err(invalid("unknown format"));
    }
    let (partition, rest) = rest.split_at_checked(4).ok_or_else(|| invalid("truncated"))?;
    let (&name_len, rest) = rest.split_first().ok_or_else(|| invalid("truncated"))?;
    let (name, rest) =
        rest.split_at_checked(usize::from(name_len)).ok_or_else(|| invalid("truncated"))?;
    let token: [u8; DELIVERY_TOKEN_BYTES] = rest.try_into().map_err(|_| invalid("wrong length"))?;
    let queue = std::str::from_utf8(name).map_err(|_| invalid("queue name is not UTF-8"))?;
    let partition = u32::from_be_bytes([partition[0], partition[1], partition[2], partition[3]]);
    Ok(RoutedToken {
        queue: queue.to_owned(),
        partition: PartitionId(partition),
        token: DeliveryToken(token),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a token string routes back to the same queue, partition and
    // token; anything else is INVALID_TOKEN, never a panic. Method: round
    // trip, then every truncation, a flipped format byte and junk.
    #[test]
    fn round_trips_and_refuses_everything_else() {
        let token = DeliveryToken([7; DELIVERY_TOKEN_BYTES]);
        let text = encode("jobs.eu", PartitionId(70_000), &token);
        let routed = decode(&text).expect("round trip");
        assert_eq!(routed.queue, "jobs.eu");
        assert_eq!(routed.partition, PartitionId(70_000));
        assert_eq!(routed.token, token);
        for end in 0..text.len() {
            let refused = decode(&text[..end]);
            assert_eq!(refused.map(|_| ()).unwrap_err().code, ErrorCode::InvalidToken);
        }
        let mut raw = URL_SAFE_NO_PAD.decode(&text).expect("base64");
        raw[0] = 2;
        assert!(decode(&URL_SAFE_NO_PAD.encode(&raw)).is_err());
        assert!(decode("!!!").is_err());
        assert!(decode(&"A".repeat(TOKEN_TEXT_BYTES_MAX + 4)).is_err());
        let longest = encode(&"q".repeat(128), PartitionId(u32::MAX), &token);
        assert!(longest.len() <= TOKEN_TEXT_BYTES_MAX);
        assert_eq!(decode(&longest).expect("longest").queue.len(), 128);
    }
}
