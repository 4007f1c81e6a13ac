//! [`Delivery`]: one leased message as a handler sees it, owned so it can
//! move into a spawned task. The record is validated once (checked rkyv access
//! and the record limits) when the claim response arrives; the accessors read
//! the archived fields in place.

use std::sync::Arc;

use spool_wire::batch::{validate_record, ArchivedPayload, ArchivedRecord, BatchBytes, MessageId};
use spool_wire::proto::{DeliveryToken, Generation, Offset, PartitionId};

use crate::error::ClientError;

/// A message body as stored: inline bytes or a reference to bytes elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadView<'a> {
    /// The bytes themselves.
    Inline(&'a [u8]),
    /// Where the bytes live.
    Reference {
        /// Location string (e.g. an object-store URL).
        location: &'a str,
        /// Size of the referenced payload.
        len_bytes: u64,
        /// Producer-chosen digest of the payload.
        digest: &'a [u8; 32],
    },
}

/// One leased message.
#[derive(Clone)]
pub struct Delivery {
    pub(crate) queue: Arc<str>,
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
    pub(crate) attempt: u32,
    pub(crate) generation: Generation,
    pub(crate) token: DeliveryToken,
    pub(crate) lease_deadline_ms: u64,
    /// The archived record, 8-aligned, validated at construction.
    record: BatchBytes,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Delivery")
            .field("queue", &self.queue)
            .field("partition", &self.partition.0)
            .field("offset", &self.offset.0)
            .field("attempt", &self.attempt)
            .field("generation", &self.generation.0)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// Validates `record` and copies it.
    ///
    /// # Errors
    /// [`ClientError::Record`] when the broker sent a record that does not
    /// validate.
    pub(crate) fn new(
        queue: Arc<str>,
        partition: PartitionId,
        lease_deadline_ms: u64,
        wire: &spool_wire::proto::Delivery<'_>,
    ) -> Result<Self, ClientError> {
        validate_record(wire.record)?;
        let mut record = BatchBytes::with_capacity(wire.record.len());
        record.extend_from_slice(wire.record);
        Ok(Self {
            queue,
            partition,
            offset: wire.offset,
            attempt: wire.attempt,
            generation: wire.generation,
            token: wire.token,
            lease_deadline_ms,
            record,
        })
    }

    /// The archived record.
    pub fn record(&self) -> &ArchivedRecord {
        match validate_record(&self.record) {
            Ok(record) => record,
            // The same bytes validated in `new` and are never mutated.
            Err(error) => panic!("delivery record changed after validation: {error}"),
        }
    }

    /// The queue it came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Its partition.
    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// Its offset in the partition.
    pub fn offset(&self) -> Offset {
        self.offset
    }

    /// How many times it has been delivered, this time included.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Its claim generation (with the offset, what a downstream fence uses).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The delivery token (for extend/ack/release through [`crate::Client`]).
    pub fn token(&self) -> DeliveryToken {
        self.token
    }

    /// When the lease ends (broker clock, Unix ms) unless extended.
    pub fn lease_deadline_ms(&self) -> u64 {
        self.lease_deadline_ms
    }

    /// The producer's message id.
    pub fn message_id(&self) -> MessageId {
        MessageId(self.record().message_id.0)
    }

    /// The routing key (empty if none).
    pub fn routing_key(&self) -> &[u8] {
        self.record().routing_key.as_slice()
    }

    /// Application headers as `(key, value)` pairs.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.record().headers.iter().map(|field| (field.key.as_slice(), field.value.as_slice()))
    }

    /// The payload.
    pub fn payload(&self) -> PayloadView<'_> {
        match &self.record().payload {
            ArchivedPayload::Inline(bytes) => PayloadView::Inline(bytes.as_slice()),
            ArchivedPayload::Reference(reference) => PayloadView::Reference {
                location: reference.location.as_str(),
                len_bytes: reference.len_bytes.to_native(),
                digest: &reference.digest,
            },
        }
    }

    /// Priority band of the message (0 highest).
    pub fn priority(&self) -> u8 {
        self.record().priority
    }

    /// When the producer enqueued it (Unix ms).
    pub fn enqueue_time_ms(&self) -> u64 {
        self.record().enqueue_time_ms.to_native()
    }
}
