//! The data record: what one enqueued message looks like inside a batch.
//!
//! This module owns the record's fields, its rkyv archive (`ArchivedRecord`,
//! what readers see) and the semantic limits a record must respect. It does
//! not place records in a batch (see `builder` and `view`) and does not judge
//! queue semantics such as whether an expiry lies in the past: that needs a
//! clock, and this crate has none.
//!
//! The same limit check runs on the owned [`Record`] in the builder and on the
//! [`ArchivedRecord`] in validation, through one [`RecordShape`], so a record
//! the builder accepts is exactly a record validation accepts.

use rkyv::{Archive, Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{
    HEADER_BYTES_MAX, HEADER_COUNT_MAX, PAYLOAD_INLINE_BYTES_MAX, PAYLOAD_REF_BYTES_MAX,
    PAYLOAD_REF_LOCATION_BYTES_MAX, PRIORITY_BANDS_MAX, ROUTING_KEY_BYTES_MAX,
};

/// The producer-chosen identity of a message; the broker dedupes on it (the
/// queue state machine's `MessageId` is this type).
#[derive(
    Archive,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
#[rkyv(compare(PartialEq), derive(Debug, PartialEq, Eq, Hash))]
pub struct MessageId(pub [u8; 16]);

/// One application header: opaque key and value bytes.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub struct HeaderField {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// Where a payload too large to travel inline lives.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub struct PayloadRef {
    /// Where to fetch the payload (for example an object-store URL); at most
    /// [`PAYLOAD_REF_LOCATION_BYTES_MAX`] bytes, never empty.
    pub location: String,
    /// Size of the referenced payload; at most [`PAYLOAD_REF_BYTES_MAX`].
    pub len_bytes: u64,
    /// Digest of the referenced payload (the producer's choice of hash, e.g.
    /// blake3), so a consumer can tell it fetched the bytes that were meant.
    pub digest: [u8; 32],
}

/// A message body: inline bytes or a reference to bytes stored elsewhere.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(compare(PartialEq), derive(Debug))]
#[repr(u8)]
pub enum Payload {
    Inline(Vec<u8>),
    Reference(PayloadRef),
}

/// One enqueued message, as the producer builds it. Readers of a batch see
/// its archived form, [`ArchivedRecord`], in place.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub struct Record {
    pub message_id: MessageId,
    /// Chooses the partition; at most [`ROUTING_KEY_BYTES_MAX`] bytes.
    pub routing_key: Vec<u8>,
    /// At most [`HEADER_COUNT_MAX`] fields of at most [`HEADER_BYTES_MAX`]
    /// key and value bytes in total.
    pub headers: Vec<HeaderField>,
    pub payload: Payload,
    /// Priority band, `0` highest; below [`PRIORITY_BANDS_MAX`].
    pub priority: u8,
    /// Not deliverable before this time (Unix ms); `0` means no delay.
    pub not_before_ms: u64,
    /// Expires at this time (Unix ms); `0` means never.
    pub expiry_ms: u64,
    /// When the producer enqueued the message (Unix ms). The batch header's
    /// first/max timestamps are derived from these.
    pub enqueue_time_ms: u64,
}

/// The lengths of a record that the limits constrain, taken from either the
/// owned or the archived form so both are judged by the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordShape {
    pub routing_key_bytes: usize,
    pub header_count: usize,
    pub header_bytes: usize,
    pub priority: u8,
    pub payload: PayloadShape,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PayloadShape {
    Inline { len_bytes: usize },
    Reference { location_bytes: usize, len_bytes: u64 },
}

impl RecordShape {
    pub(crate) fn of_record(record: &Record) -> Self {
        Self {
            routing_key_bytes: record.routing_key.len(),
            header_count: record.headers.len(),
            header_bytes: record
                .headers
                .iter()
                .map(|field| field.key.len().saturating_add(field.value.len()))
                .fold(0usize, usize::saturating_add),
            priority: record.priority,
            payload: match &record.payload {
                Payload::Inline(bytes) => PayloadShape::Inline { len_bytes: bytes.len() },
                Payload::Reference(reference) => PayloadShape::Reference {
                    location_bytes: reference.location.len(),
                    len_bytes: reference.len_bytes,
                },
            },
        }
    }

    pub(crate) fn of_archived(record: &ArchivedRecord) -> Self {
        Self {
            routing_key_bytes: record.routing_key.len(),
            header_count: record.headers.len(),
            header_bytes: record
                .headers
                .iter()
                .map(|field| field.key.len().saturating_add(field.value.len()))
                .fold(0usize, usize::saturating_add),
            priority: record.priority,
            payload: match &record.payload {
                ArchivedPayload::Inline(bytes) => PayloadShape::Inline { len_bytes: bytes.len() },
                ArchivedPayload::Reference(reference) => PayloadShape::Reference {
                    location_bytes: reference.location.len(),
                    len_bytes: reference.len_bytes.to_native(),
                },
            },
        }
    }

    /// Checks every semantic limit of a record.
    ///
    /// # Errors
    /// The first limit exceeded, as its own [`WireError`] variant.
    pub(crate) fn check(&self) -> Result<(), WireError> {
        if self.routing_key_bytes > ROUTING_KEY_BYTES_MAX {
            return Err(WireError::RoutingKeyTooLong { len_bytes: self.routing_key_bytes });
        }
        if self.header_count > HEADER_COUNT_MAX {
            return Err(WireError::TooManyHeaders { count: self.header_count });
        }
        if self.header_bytes > HEADER_BYTES_MAX {
            return Err(WireError::HeadersTooLarge { len_bytes: self.header_bytes });
        }
        if self.priority >= PRIORITY_BANDS_MAX {
            return Err(WireError::PriorityOutOfRange(self.priority));
        }
        match self.payload {
            PayloadShape::Inline { len_bytes } => {
                if len_bytes > PAYLOAD_INLINE_BYTES_MAX {
                    return Err(WireError::InlinePayloadTooLarge { len_bytes });
                }
            }
            PayloadShape::Reference { location_bytes, len_bytes } => {
                if location_bytes == 0 || location_bytes > PAYLOAD_REF_LOCATION_BYTES_MAX {
                    return Err(WireError::BadPayloadLocation { len_bytes: location_bytes });
                }
                if len_bytes > PAYLOAD_REF_BYTES_MAX {
                    return Err(WireError::ReferencedPayloadTooLarge { len_bytes });
                }
            }
        }
        Ok(())
    }
}

impl ArchivedRecord {
    /// The record as the producer built it (an owned copy), e.g. to place
    /// it in another batch.
    ///
    /// # Errors
    /// [`WireError::InvalidRecord`] if the archive does not deserialize
    /// (not for a record of a validated batch).
    pub fn to_record(&self) -> Result<Record, WireError> {
        rkyv::deserialize::<Record, rkyv::rancor::Error>(self)
            .map_err(|error| WireError::InvalidRecord { index: 0, reason: error.to_string() })
    }
}
