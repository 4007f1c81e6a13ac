//! Errors of the pure codecs. These describe what is wrong with some bytes
//! (or with a record a producer tried to add to a batch); the broker maps them
//! onto stable wire error codes.

use thiserror::Error;

use crate::limits::{
    BATCH_BYTES_MAX, CONTROL_RECORD_BYTES_MAX, HEADER_BYTES_MAX, HEADER_COUNT_MAX,
    PAYLOAD_INLINE_BYTES_MAX, PAYLOAD_REF_BYTES_MAX, PAYLOAD_REF_LOCATION_BYTES_MAX,
    RECORD_BYTES_MAX, ROUTING_KEY_BYTES_MAX,
};

/// Everything that can be wrong with bytes handed to this crate.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    // --- framing (header) ---
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad batch magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported batch format version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown batch kind {0}")]
    UnknownBatchKind(u16),
    #[error("bad batch length {0}")]
    BadBatchLength(u32),
    #[error("batch header crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrcMismatch { stored: u32, computed: u32 },
    #[error("batch body crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyCrcMismatch { stored: u32, computed: u32 },
    #[error("batch buffer is not {align}-byte aligned (address mod {align} = {misalignment})")]
    Misaligned { align: usize, misalignment: usize },
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    #[error("unknown batch flags {0:#010x}")]
    UnknownFlags(u32),
    #[error("batch flags {flags:#010x} are not allowed on a {kind} batch")]
    FlagsNotAllowed { flags: u32, kind: &'static str },
    #[error("batch timestamps do not match its records: header first {first_ms}, max {max_ms}")]
    TimestampMismatch { first_ms: u64, max_ms: u64 },
    #[error("batch bytes do not match the header verified for them")]
    HeaderMismatch,

    // --- structure (position table and record placement) ---
    #[error("a {0} batch must hold at least one record")]
    EmptyBatch(&'static str),
    #[error("filler batch must have no records and a zero body")]
    BadFiller,
    #[error("batch holds {count} records, more than the limit {max}")]
    TooManyRecords { count: u32, max: u32 },
    #[error("record {index} at position {position}, expected {expected}")]
    BadRecordPosition { index: u32, position: u32, expected: u64 },
    #[error("record {index} has length {len_bytes}, outside 1..={max}")]
    BadRecordLength { index: u32, len_bytes: u32, max: usize },
    #[error("record {index} ends at {end}, past the batch length {batch_len}")]
    RecordOutOfBounds { index: u32, end: u64, batch_len: u32 },
    #[error("batch length {batch_len} does not match its records (expected {expected})")]
    BatchLengthMismatch { batch_len: u32, expected: u64 },
    #[error("non-zero padding byte at {position}")]
    NonZeroPadding { position: usize },
    #[error("record {index} is not a valid archive: {reason}")]
    InvalidRecord { index: u32, reason: String },

    // --- record limits (builder and validation alike) ---
    #[error("routing key of {len_bytes} bytes exceeds the limit of {ROUTING_KEY_BYTES_MAX} bytes")]
    RoutingKeyTooLong { len_bytes: usize },
    #[error("{count} headers exceed the limit of {HEADER_COUNT_MAX}")]
    TooManyHeaders { count: usize },
    #[error("headers of {len_bytes} bytes exceed the limit of {HEADER_BYTES_MAX} bytes")]
    HeadersTooLarge { len_bytes: usize },
    #[error("priority {0} is outside the priority bands")]
    PriorityOutOfRange(u8),
    #[error(
        "inline payload of {len_bytes} bytes exceeds the limit of {PAYLOAD_INLINE_BYTES_MAX} \
         bytes; send it by reference"
    )]
    InlinePayloadTooLarge { len_bytes: usize },
    #[error(
        "payload reference location of {len_bytes} bytes is empty or exceeds the limit of \
         {PAYLOAD_REF_LOCATION_BYTES_MAX} bytes"
    )]
    BadPayloadLocation { len_bytes: usize },
    #[error("referenced payload of {len_bytes} bytes exceeds the limit of {PAYLOAD_REF_BYTES_MAX} bytes")]
    ReferencedPayloadTooLarge { len_bytes: u64 },
    #[error("archived record of {len_bytes} bytes exceeds the limit of {RECORD_BYTES_MAX} bytes")]
    RecordTooLarge { len_bytes: usize },
    #[error(
        "control record of {len_bytes} bytes is empty or exceeds the limit of \
         {CONTROL_RECORD_BYTES_MAX} bytes"
    )]
    BadControlRecordLength { len_bytes: usize },
    #[error("record could not be encoded: {0}")]
    RecordEncode(String),

    // --- batch capacity (builder) ---
    #[error("batch is full: already {count} records")]
    BatchRecordsFull { count: u32 },
    #[error(
        "batch is full: adding the record would make it {needed_bytes} bytes, over the limit \
         of {BATCH_BYTES_MAX} bytes"
    )]
    BatchBytesFull { needed_bytes: usize },

    // --- subsets ---
    #[error("record index {index} out of range for a batch of {len} records")]
    IndexOutOfRange { index: u32, len: u32 },
    #[error("subset indices must be strictly increasing and non-empty")]
    BadSubset,
    #[error("operation needs a {expected} batch, found {found}")]
    WrongKind { expected: &'static str, found: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a size refusal states both the size given and the limit, so a
    // user knows how far over it is (the broker sends this text in its
    // error response, and clients print it). Method: render each.
    #[test]
    fn size_errors_state_the_size_and_the_limit() {
        let payload = WireError::InlinePayloadTooLarge { len_bytes: 2_000_000 }.to_string();
        assert!(payload.contains("2000000 bytes"), "{payload}");
        assert!(
            payload.contains(&format!("limit of {PAYLOAD_INLINE_BYTES_MAX} bytes")),
            "{payload}"
        );
        assert!(payload.contains("by reference"), "{payload}");
        let record = WireError::RecordTooLarge { len_bytes: 1_500_000 }.to_string();
        assert!(record.contains("1500000") && record.contains(&RECORD_BYTES_MAX.to_string()));
        let key = WireError::RoutingKeyTooLong { len_bytes: 300 }.to_string();
        assert!(key.contains("300") && key.contains(&ROUTING_KEY_BYTES_MAX.to_string()), "{key}");
        let headers = WireError::HeadersTooLarge { len_bytes: 20_000 }.to_string();
        assert!(headers.contains(&HEADER_BYTES_MAX.to_string()), "{headers}");
    }
}
