//! Errors of the queue state machine, in three families: a decision refused
//! (`QueueError`, goes back to the client as a wire error code), an event that
//! does not fit the state (`ApplyError`, a bug in the caller's ordering), and
//! bytes that do not decode (`CodecError`: events, tokens, snapshots).

use thiserror::Error;

use super::types::{Generation, Lane, Millis, Offset, SubscriptionId};

/// Why a delivery token is not genuine or not for this partition. The client
/// cannot fix these by retrying.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidToken {
    #[error("token MAC does not verify")]
    BadMac,
    #[error("token names another queue")]
    WrongQueue,
    #[error("token names another partition")]
    WrongPartition,
}

/// Why a genuine token no longer entitles its holder to anything.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleToken {
    #[error("token is from leader epoch {token}, the partition is at {current}")]
    Epoch { token: u64, current: u64 },
    #[error("message is not claimed (acked, released, expired or moved)")]
    NotClaimed,
    #[error("token is for generation {token}, the current claim is generation {current}")]
    Generation { token: Generation, current: Generation },
    #[error("token names another worker than the current claim")]
    Worker,
    #[error("token names the {token} lane, the message is in the {current} lane")]
    Lane { token: Lane, current: Lane },
    #[error("lease ended at {deadline_ms} ms, now is {now_ms} ms")]
    LeaseExpired { deadline_ms: Millis, now_ms: Millis },
    #[error("the token's subscription has ended")]
    SubscriptionEnded,
}

/// A decision the state machine refuses. Nothing changes when one is returned.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueError {
    #[error("invalid delivery token: {0}")]
    InvalidToken(InvalidToken),
    #[error("stale delivery token: {0}")]
    StaleToken(StaleToken),
    #[error("lease {lease_ms} ms outside {min_ms}..={max_ms} ms")]
    LeaseOutOfRange { lease_ms: Millis, min_ms: Millis, max_ms: Millis },
    #[error("claim already lives until its lifetime cap at {cap_ms} ms")]
    LeaseLifetimeExhausted { cap_ms: Millis },
    #[error("credits {credits} outside 1..={max}")]
    CreditsOutOfRange { credits: u32, max: u32 },
    #[error("release not_before {not_before_ms} ms is more than {max_ms} ms after now")]
    ReleaseDelayTooLong { not_before_ms: Millis, max_ms: Millis },
    #[error("priority {priority} but the queue has {bands} bands")]
    PriorityOutOfRange { priority: u8, bands: usize },
    #[error("admission batch holds more than {max} enqueues")]
    AdmissionBatchFull { max: usize },
    #[error("offset {0} is not in the dead-letter queue, or is claimed there")]
    NotRedrivable(Offset),
    #[error("the queue has no subscription {0} on this partition")]
    UnknownSubscription(SubscriptionId),
}

/// An event that does not fit the current state. The state is unchanged. On
/// the live path this means two decisions were interleaved without applying
/// the first one's events; the caller should treat it as a bug.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApplyError {
    #[error("offset {0} is already known")]
    DuplicateOffset(Offset),
    #[error("offset {0} is not live in the named lane")]
    UnknownMessage(Offset),
    #[error("event for offset {offset} does not fit its state: {what}")]
    WrongState { offset: Offset, what: &'static str },
    #[error("event for offset {offset} names generation {event}, state has {state}")]
    Generation { offset: Offset, event: Generation, state: Generation },
    #[error("Enqueued offset {offset} is not above the highest applied {highest}")]
    OffsetNotIncreasing { offset: Offset, highest: Offset },
    #[error("the partition has no subscription {0}")]
    UnknownSubscription(SubscriptionId),
    #[error("subscription {sub} cannot start or end here: {what}")]
    Subscription { sub: SubscriptionId, what: &'static str },
}

/// Bytes that do not decode into an event, token or snapshot.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    #[error("wrong length: expected {expected} bytes, got {got}")]
    Length { expected: usize, got: usize },
    #[error("unknown event kind {0}")]
    UnknownKind(u8),
    #[error("bad field {0}")]
    BadField(&'static str),
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("Enqueued comes from data batches and has no control encoding")]
    NotControl,
    #[error("unsupported version {0}")]
    Version(u16),
    #[error("bad snapshot magic")]
    Magic,
    #[error("snapshot crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("snapshot truncated")]
    Truncated,
    #[error("snapshot larger than {0} bytes")]
    TooLarge(usize),
    #[error("snapshot content is inconsistent: {0}")]
    Inconsistent(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `text` holds Rust debug formatting of a newtype or tuple
    /// variant: a capitalised identifier directly followed by `(`.
    fn has_debug_newtype(text: &str) -> bool {
        let bytes = text.as_bytes();
        (1..bytes.len()).any(|end| {
            if bytes[end] != b'(' {
                return false;
            }
            let start = bytes[..end]
                .iter()
                .rposition(|byte| !byte.is_ascii_alphanumeric() && *byte != b'_')
                .map_or(0, |position| position + 1);
            start < end && bytes[start].is_ascii_uppercase()
        })
    }

    // Goal: errors a user reads print plain values (`offset 99`), never a
    // newtype's debug form (`Offset(99)`, as the redrive of an unknown
    // offset once printed). Method: render one error of each family that
    // carries offsets, generations and lanes, and scan for `Name(`.
    #[test]
    fn errors_print_plain_values_not_debug_newtypes() {
        assert!(has_debug_newtype("offset Offset(99) is"), "the detector works");
        assert!(!has_debug_newtype("limit (max_bytes) of queue jobs"), "and is not fooled");
        let rendered = [
            QueueError::NotRedrivable(Offset(99)).to_string(),
            QueueError::StaleToken(StaleToken::Generation {
                token: Generation(3),
                current: Generation(4),
            })
            .to_string(),
            QueueError::StaleToken(StaleToken::Lane {
                token: Lane::Main,
                current: Lane::DeadLetter,
            })
            .to_string(),
            ApplyError::DuplicateOffset(Offset(7)).to_string(),
            ApplyError::Generation {
                offset: Offset(7),
                event: Generation(1),
                state: Generation(2),
            }
            .to_string(),
            ApplyError::OffsetNotIncreasing { offset: Offset(5), highest: Offset(9) }.to_string(),
        ];
        for text in &rendered {
            assert!(!has_debug_newtype(text), "debug formatting in: {text}");
        }
        assert_eq!(rendered[0], "offset 99 is not in the dead-letter queue, or is claimed there");
        assert!(rendered[2].contains("main lane") && rendered[2].contains("dead-letter lane"));
    }
}
