//! Data-path messages — Enqueue, Claim, Extend, Ack, Release — in a
//! hand-written compact little-endian layout.
//!
//! These are the messages sent thousands of times a second, so decoding
//! borrows: a decoded Enqueue's batch and a decoded Claim response's records
//! are slices of the frame, never copies, and they sit at 8-aligned offsets of
//! the frame so rkyv can read them in place. This module does not validate the
//! batch's contents (crc, records): that is `crate::batch`'s job, done once by
//! the broker on arrival. Byte diagrams: `docs/design/protocol.md`.
//!
//! Every struct has `validate`, run by the encoder before writing and by the
//! decoder after parsing, so a message that encodes always decodes.

use super::codec::{
    check_len, check_range, validate_queue_name, validate_subscription_name, Reader, Writer,
};
use super::error::ProtoError;
use super::frame::{ApiKey, CorrelationId, CLAIM_VERSION_ANY, CLAIM_VERSION_SUBSCRIPTION};
use super::ids::{Generation, Offset, PartitionId, WorkerId};
use super::limits::{
    ACK_TOKENS_MAX, CLAIM_BYTES_MAX, CLAIM_CREDITS_MAX, CLAIM_WAIT_MS_MAX, DELIVERY_TOKEN_BYTES,
    LEASE_MS_MAX, LEASE_MS_MIN, RELEASE_DELAY_MS_MAX, RELEASE_REASON_BYTES_MAX,
    SUBSCRIPTION_NAME_BYTES_MAX,
};
use crate::codes::ErrorCode;
use crate::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES, BATCH_RECORDS_MAX, RECORD_BYTES_MAX};

/// An opaque delivery token. The broker defines its inner layout (scope,
/// generation, epoch, MAC); clients only hand it back.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryToken(pub [u8; DELIVERY_TOKEN_BYTES]);

impl std::fmt::Debug for DeliveryToken {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A prefix identifies a token in logs without printing the MAC.
        write!(formatter, "DeliveryToken({:02x?}..)", &self.0[..8])
    }
}

fn read_token(reader: &mut Reader<'_>) -> Result<DeliveryToken, ProtoError> {
    Ok(DeliveryToken(reader.array()?))
}

fn check_lease_ms(field: &'static str, lease_ms: u32) -> Result<(), ProtoError> {
    check_range(field, lease_ms.into(), LEASE_MS_MIN.into(), LEASE_MS_MAX.into())
}

// ---------------------------------------------------------------- Enqueue

/// Append one record batch to a partition. `batch` is the exact bytes the log
/// stores (`crate::batch` layout); it is validated by the broker, not here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueRequest<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// Target partition.
    pub partition: PartitionId,
    /// One record batch.
    pub batch: &'a [u8],
}

impl<'a> EnqueueRequest<'a> {
    /// Checks the name and the batch size bounds.
    ///
    /// # Errors
    /// [`ProtoError::InvalidQueueName`], [`ProtoError::BatchSize`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(self.queue)?;
        let len_bytes = self.batch.len();
        if !(BATCH_HEADER_BYTES..=BATCH_BYTES_MAX).contains(&len_bytes) {
            return Err(ProtoError::BatchSize {
                len_bytes,
                min_bytes: BATCH_HEADER_BYTES,
                max_bytes: BATCH_BYTES_MAX,
            });
        }
        Ok(())
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.str(self.queue);
        writer.align();
        writer.u32(self.partition.0);
        // Bounded by BATCH_BYTES_MAX in validate.
        writer.u32(self.batch.len() as u32);
        writer.bytes(self.batch);
    }

    pub(crate) fn read(body: &'a [u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let queue = reader.queue_name()?;
        reader.align()?;
        let partition = PartitionId(reader.u32()?);
        let batch_len = reader.u32()? as usize;
        if batch_len > BATCH_BYTES_MAX {
            return Err(ProtoError::BatchSize {
                len_bytes: batch_len,
                min_bytes: BATCH_HEADER_BYTES,
                max_bytes: BATCH_BYTES_MAX,
            });
        }
        let batch = reader.take(batch_len)?;
        reader.finish()?;
        let request = Self { queue, partition, batch };
        request.validate()?;
        Ok(request)
    }
}

/// What happened to one record of an enqueued batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// Written at `offset`.
    Appended { offset: Offset },
    /// Its message id was seen within the dedupe window; nothing was written
    /// and the original's offset is returned.
    Duplicate { original_offset: Offset },
    /// Not written, for the given reason (never [`ErrorCode::None`]).
    Rejected { code: ErrorCode },
}

const OUTCOME_APPENDED: u16 = 0;
const OUTCOME_DUPLICATE: u16 = 1;
const OUTCOME_REJECTED: u16 = 2;

/// Result of an Enqueue: one outcome per record, in batch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueResponse {
    /// The log offset assigned to the batch.
    pub base_offset: Offset,
    /// One per record of the request's batch.
    pub records: Vec<RecordOutcome>,
}

impl EnqueueResponse {
    /// Checks the record count and that rejections carry a real code.
    ///
    /// # Errors
    /// [`ProtoError::TooLong`], [`ProtoError::Inconsistent`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("enqueue results", self.records.len(), BATCH_RECORDS_MAX as usize)?;
        let none_rejection = self
            .records
            .iter()
            .any(|outcome| matches!(outcome, RecordOutcome::Rejected { code: ErrorCode::None }));
        if none_rejection {
            return Err(ProtoError::Inconsistent("a rejected record carries code NONE"));
        }
        Ok(())
    }

    /// Writes the outcomes as `version` of Enqueue may carry them
    /// ([`ApiKey::answerable`]: `KEY_MOVED` only from v2).
    pub(crate) fn write(&self, writer: &mut Writer<'_>, version: u16) {
        writer.u64(self.base_offset.0);
        writer.u32(self.records.len() as u32);
        writer.u32(0);
        for outcome in &self.records {
            let (kind, code, offset) = match *outcome {
                RecordOutcome::Appended { offset } => (OUTCOME_APPENDED, ErrorCode::None, offset),
                RecordOutcome::Duplicate { original_offset } => {
                    (OUTCOME_DUPLICATE, ErrorCode::None, original_offset)
                }
                RecordOutcome::Rejected { code } => (OUTCOME_REJECTED, code, Offset(0)),
            };
            writer.u16(kind);
            writer.u16(ApiKey::Enqueue.answerable(version, code).as_u16());
            writer.u32(0);
            writer.u64(offset.0);
        }
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let base_offset = Offset(reader.u64()?);
        let count = reader.u32()? as usize;
        reader.reserved_u32("enqueue response reserved")?;
        check_len("enqueue results", count, BATCH_RECORDS_MAX as usize)?;
        // 16 bytes each: checking up front bounds the allocation by the body.
        if count * 16 != reader.remaining() {
            return Err(ProtoError::Truncated {
                needed: count * 16,
                available: reader.remaining(),
            });
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            let kind = reader.u16()?;
            let raw_code = reader.u16()?;
            let code =
                ErrorCode::from_u16(raw_code).ok_or(ProtoError::UnknownErrorCode(raw_code))?;
            reader.reserved_u32("enqueue result reserved")?;
            let offset = Offset(reader.u64()?);
            let outcome = match kind {
                OUTCOME_APPENDED | OUTCOME_DUPLICATE if code != ErrorCode::None => {
                    return Err(ProtoError::Inconsistent("a written record carries an error code"));
                }
                OUTCOME_APPENDED => RecordOutcome::Appended { offset },
                OUTCOME_DUPLICATE => RecordOutcome::Duplicate { original_offset: offset },
                OUTCOME_REJECTED if offset.0 != 0 => {
                    return Err(ProtoError::NonzeroReserved {
                        field: "offset of a rejected record",
                    });
                }
                OUTCOME_REJECTED => RecordOutcome::Rejected { code },
                other => {
                    return Err(ProtoError::UnknownEnumValue {
                        field: "record outcome",
                        value: other.into(),
                    })
                }
            };
            records.push(outcome);
        }
        reader.finish()?;
        let response = Self { base_offset, records };
        response.validate()?;
        Ok(response)
    }
}

// ---------------------------------------------------------------- Claim

/// Lease up to `credits` messages (at most `max_bytes` of records) from one
/// partition, or (version 1, [`PartitionId::ANY`]) from any partitions of
/// the queue that the shard reached leads, long-polling up to `wait_ms` if
/// none is ready; from version 3 ([`CLAIM_VERSION_SUBSCRIPTION`]) for the
/// subscription it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// Partition to claim from; [`PartitionId::ANY`] (version 1 and later):
    /// any the shard leads.
    pub partition: PartitionId,
    /// The claiming worker.
    pub worker: WorkerId,
    /// Most messages to deliver: `1..=CLAIM_CREDITS_MAX`.
    pub credits: u32,
    /// Most record bytes to deliver: `1..=CLAIM_BYTES_MAX` (one larger record
    /// may still be delivered alone).
    pub max_bytes: u32,
    /// Lease length; the queue's own range is checked by the broker.
    pub lease_ms: u32,
    /// Long-poll wait, `0..=CLAIM_WAIT_MS_MAX`.
    pub wait_ms: u32,
    /// The subscription claimed for, by name; `""`: the queue's default
    /// subscription. Carried from version 3 ([`CLAIM_VERSION_SUBSCRIPTION`])
    /// on; an older version carries none and decodes as `""`. A name
    /// follows the queue names' rule ([`validate_subscription_name`]).
    pub subscription: &'a str,
}

impl<'a> ClaimRequest<'a> {
    /// Checks every field's absolute range (as the newest Claim version
    /// carries them).
    ///
    /// # Errors
    /// [`ProtoError::InvalidQueueName`], [`ProtoError::OutOfRange`],
    /// [`ProtoError::InvalidSubscriptionName`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        self.validate_version(CLAIM_VERSION_SUBSCRIPTION)
    }

    /// [`ClaimRequest::validate`] as `version` of the Claim reads it:
    /// [`PartitionId::ANY`] needs version 1, a subscription name version 3.
    ///
    /// # Errors
    /// As [`ClaimRequest::validate`]; [`ProtoError::Inconsistent`] for `ANY`
    /// in version 0 or a subscription before version 3.
    pub fn validate_version(&self, version: u16) -> Result<(), ProtoError> {
        if self.partition == PartitionId::ANY && version < CLAIM_VERSION_ANY {
            return Err(ProtoError::Inconsistent("claim partition ANY needs claim version 1"));
        }
        if !self.subscription.is_empty() && version < CLAIM_VERSION_SUBSCRIPTION {
            return Err(ProtoError::Inconsistent("claim subscription needs claim version 3"));
        }
        validate_queue_name(self.queue)?;
        if !self.subscription.is_empty() {
            validate_subscription_name(self.subscription)?;
        }
        check_range("credits", self.credits.into(), 1, CLAIM_CREDITS_MAX.into())?;
        check_range("max_bytes", self.max_bytes.into(), 1, CLAIM_BYTES_MAX.into())?;
        check_lease_ms("lease_ms", self.lease_ms)?;
        check_range("wait_ms", self.wait_ms.into(), 0, CLAIM_WAIT_MS_MAX.into())
    }

    /// Writes the request as `version` of Claim lays it out (validated for
    /// that version: no subscription before v3).
    pub(crate) fn write(&self, writer: &mut Writer<'_>, version: u16) {
        writer.str(self.queue);
        writer.align();
        writer.u32(self.partition.0);
        writer.u32(self.credits);
        writer.u64(self.worker.0);
        writer.u32(self.max_bytes);
        writer.u32(self.lease_ms);
        writer.u32(self.wait_ms);
        writer.u32(0);
        if version >= CLAIM_VERSION_SUBSCRIPTION {
            writer.str(self.subscription);
        }
    }

    pub(crate) fn read(body: &'a [u8], version: u16) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let queue = reader.queue_name()?;
        reader.align()?;
        let partition = PartitionId(reader.u32()?);
        let credits = reader.u32()?;
        let worker = WorkerId(reader.u64()?);
        let max_bytes = reader.u32()?;
        let lease_ms = reader.u32()?;
        let wait_ms = reader.u32()?;
        reader.reserved_u32("claim reserved")?;
        let subscription = if version >= CLAIM_VERSION_SUBSCRIPTION {
            reader.str("subscription", SUBSCRIPTION_NAME_BYTES_MAX)?
        } else {
            ""
        };
        reader.finish()?;
        let request =
            Self { queue, partition, worker, credits, max_bytes, lease_ms, wait_ms, subscription };
        request.validate_version(version)?;
        Ok(request)
    }
}

/// One leased message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// Hand back to extend, ack or release.
    pub token: DeliveryToken,
    /// The message's partition: the one the Claim named, or (Claim `ANY`)
    /// the one it came from. A version-0 response does not carry it; its
    /// decoder says [`PartitionId::ANY`].
    pub partition: PartitionId,
    /// The message's offset in the partition.
    pub offset: Offset,
    /// How many times it has been delivered, this time included.
    pub attempt: u32,
    /// Its claim generation.
    pub generation: Generation,
    /// The archived record bytes, exactly as stored; 8-aligned in the frame.
    pub record: &'a [u8],
}

/// Result of a Claim: zero or more deliveries sharing one lease deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimResponse<'a> {
    /// When the leases end (broker clock, Unix ms) unless extended.
    pub lease_deadline_ms: u64,
    /// The leased messages, at most the request's credits.
    pub deliveries: Vec<Delivery<'a>>,
}

impl<'a> ClaimResponse<'a> {
    /// Checks the delivery count and record sizes.
    ///
    /// # Errors
    /// [`ProtoError::TooLong`], [`ProtoError::RecordTooLarge`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("deliveries", self.deliveries.len(), CLAIM_CREDITS_MAX as usize)?;
        for delivery in &self.deliveries {
            if delivery.record.len() > RECORD_BYTES_MAX {
                return Err(ProtoError::RecordTooLarge {
                    len_bytes: delivery.record.len(),
                    max_bytes: RECORD_BYTES_MAX,
                });
            }
        }
        Ok(())
    }

    /// Fixed bytes of one delivery before its record in `version`.
    pub(crate) const fn delivery_fixed_bytes(version: u16) -> usize {
        let v0 = DELIVERY_TOKEN_BYTES + 8 + 4 + 4 + 8;
        if version >= CLAIM_VERSION_ANY {
            v0 + 8
        } else {
            v0
        }
    }

    /// Body bytes of this response in `version`, padding included.
    pub(crate) fn body_bytes(&self, version: u16) -> usize {
        let fixed = Self::delivery_fixed_bytes(version);
        16 + self
            .deliveries
            .iter()
            .map(|delivery| fixed + delivery.record.len().next_multiple_of(8))
            .sum::<usize>()
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>, version: u16) {
        // Each delivery: token, offset, attempt, length, generation, (v1:
        // partition and 4 reserved bytes,) the record padded to 8 bytes.
        writer.reserve(self.body_bytes(version));
        writer.u64(self.lease_deadline_ms);
        writer.u32(self.deliveries.len() as u32);
        writer.u32(0);
        for delivery in &self.deliveries {
            writer.bytes(&delivery.token.0);
            writer.u64(delivery.offset.0);
            writer.u32(delivery.attempt);
            writer.u32(delivery.record.len() as u32);
            writer.u64(delivery.generation.0);
            if version >= CLAIM_VERSION_ANY {
                writer.u32(delivery.partition.0);
                writer.u32(0);
            }
            writer.bytes(delivery.record);
            writer.align();
        }
    }

    pub(crate) fn read(body: &'a [u8], version: u16) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let lease_deadline_ms = reader.u64()?;
        let count = reader.u32()? as usize;
        reader.reserved_u32("claim response reserved")?;
        check_len("deliveries", count, CLAIM_CREDITS_MAX as usize)?;
        let mut deliveries = Vec::with_capacity(count);
        for _ in 0..count {
            let token = read_token(&mut reader)?;
            let offset = Offset(reader.u64()?);
            let attempt = reader.u32()?;
            let record_len = reader.u32()? as usize;
            let generation = Generation(reader.u64()?);
            let partition = if version >= CLAIM_VERSION_ANY {
                let partition = PartitionId(reader.u32()?);
                reader.reserved_u32("delivery reserved")?;
                partition
            } else {
                PartitionId::ANY
            };
            if record_len > RECORD_BYTES_MAX {
                return Err(ProtoError::RecordTooLarge {
                    len_bytes: record_len,
                    max_bytes: RECORD_BYTES_MAX,
                });
            }
            let record = reader.take(record_len)?;
            reader.align()?;
            deliveries.push(Delivery { token, partition, offset, attempt, generation, record });
        }
        reader.finish()?;
        Ok(Self { lease_deadline_ms, deliveries })
    }
}

// ---------------------------------------------------------------- Extend

/// Push a lease's deadline to now + `lease_ms` (capped by the queue's lifetime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendRequest {
    /// The delivery's token.
    pub token: DeliveryToken,
    /// New lease length from now.
    pub lease_ms: u32,
}

impl ExtendRequest {
    /// Checks the lease range.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_lease_ms("lease_ms", self.lease_ms)
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.bytes(&self.token.0);
        writer.u32(self.lease_ms);
        writer.u32(0);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let token = read_token(&mut reader)?;
        let lease_ms = reader.u32()?;
        reader.reserved_u32("extend reserved")?;
        reader.finish()?;
        let request = Self { token, lease_ms };
        request.validate()?;
        Ok(request)
    }
}

/// Result of an Extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendResponse {
    /// The new deadline (broker clock, Unix ms).
    pub lease_deadline_ms: u64,
}

impl ExtendResponse {
    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u64(self.lease_deadline_ms);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let lease_deadline_ms = reader.u64()?;
        reader.finish()?;
        Ok(Self { lease_deadline_ms })
    }
}

// ---------------------------------------------------------------- Ack

/// Finish a batch of deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRequest {
    /// `1..=ACK_TOKENS_MAX` tokens.
    pub tokens: Vec<DeliveryToken>,
}

impl AckRequest {
    /// Checks the token count.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_range("ack tokens", self.tokens.len() as u64, 1, ACK_TOKENS_MAX.into())
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u32(self.tokens.len() as u32);
        writer.u32(0);
        for token in &self.tokens {
            writer.bytes(&token.0);
        }
    }

    /// The checks of [`AckRequest::read`], in the same order and with the
    /// same errors, without collecting the tokens (no allocation).
    pub(crate) fn check(body: &[u8]) -> Result<(), ProtoError> {
        let mut reader = Reader::new(body);
        let count = reader.u32()?;
        reader.reserved_u32("ack reserved")?;
        check_range("ack tokens", count.into(), 1, ACK_TOKENS_MAX.into())?;
        for _ in 0..count {
            read_token(&mut reader)?;
        }
        reader.finish()
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let count = reader.u32()?;
        reader.reserved_u32("ack reserved")?;
        check_range("ack tokens", count.into(), 1, ACK_TOKENS_MAX.into())?;
        let count = count as usize;
        let mut tokens = Vec::with_capacity(count);
        for _ in 0..count {
            tokens.push(read_token(&mut reader)?);
        }
        reader.finish()?;
        Ok(Self { tokens })
    }
}

/// Result of an Ack: one code per token, in request order
/// ([`ErrorCode::None`] = acked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckResponse {
    /// Per-token outcome.
    pub results: Vec<ErrorCode>,
}

impl AckResponse {
    /// Checks the result count.
    ///
    /// # Errors
    /// [`ProtoError::TooLong`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("ack results", self.results.len(), ACK_TOKENS_MAX as usize)
    }

    /// Writes the results as `version` of Ack may carry them
    /// ([`ApiKey::answerable`]).
    pub(crate) fn write(&self, writer: &mut Writer<'_>, version: u16) {
        writer.u32(self.results.len() as u32);
        for code in &self.results {
            writer.u16(ApiKey::Ack.answerable(version, *code).as_u16());
        }
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let count = reader.u32()? as usize;
        check_len("ack results", count, ACK_TOKENS_MAX as usize)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            let raw_code = reader.u16()?;
            results
                .push(ErrorCode::from_u16(raw_code).ok_or(ProtoError::UnknownErrorCode(raw_code))?);
        }
        reader.finish()?;
        Ok(Self { results })
    }
}

// ---------------------------------------------------------------- Release

/// Give a delivery back. It becomes ready after `delay_ms`, or after the
/// queue's backoff when `delay_ms` is 0. The delay is relative to the broker's
/// receipt so that no client clock is trusted and the codec can range-check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest<'a> {
    /// The delivery's token.
    pub token: DeliveryToken,
    /// `0` (queue backoff) or a delay up to `RELEASE_DELAY_MS_MAX`.
    pub delay_ms: u32,
    /// Why; kept as the message's last release reason (dead letters show it).
    pub reason: &'a str,
}

impl<'a> ReleaseRequest<'a> {
    /// Checks the delay and the reason length.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`], [`ProtoError::TooLong`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_range("delay_ms", self.delay_ms.into(), 0, RELEASE_DELAY_MS_MAX.into())?;
        check_len("reason", self.reason.len(), RELEASE_REASON_BYTES_MAX)
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.bytes(&self.token.0);
        writer.u32(self.delay_ms);
        writer.str(self.reason);
    }

    pub(crate) fn read(body: &'a [u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let token = read_token(&mut reader)?;
        let delay_ms = reader.u32()?;
        let reason = reader.str("reason", RELEASE_REASON_BYTES_MAX)?;
        reader.finish()?;
        let request = Self { token, delay_ms, reason };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a Release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseResponse {
    /// When the message becomes ready again (broker clock, Unix ms).
    pub not_before_ms: u64,
}

impl ReleaseResponse {
    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u64(self.not_before_ms);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let not_before_ms = reader.u64()?;
        reader.finish()?;
        Ok(Self { not_before_ms })
    }
}

// ---------------------------------------------------------------- CancelClaim

/// Withdraw a long-poll Claim sent earlier on the same connection, named by
/// its correlation id. A claim still waiting (nothing decided yet) ends at
/// once and answers with no deliveries, as if its wait had run out; a claim
/// that already claimed, answered, or never existed on this connection is
/// left alone. A connection can only reach its own claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelClaimRequest {
    /// The Claim's correlation id; never 0.
    pub claim: CorrelationId,
}

impl CancelClaimRequest {
    /// Checks that the id is not the reserved 0.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_range("claim correlation id", self.claim.0, 1, u64::MAX)
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u64(self.claim.0);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let claim = CorrelationId(reader.u64()?);
        reader.finish()?;
        let request = Self { claim };
        request.validate()?;
        Ok(request)
    }
}

/// What a CancelClaim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The claim was waiting; it answers (or has answered) with no
    /// deliveries and claimed nothing.
    Cancelled,
    /// No waiting claim with that id on this connection: it already decided
    /// its deliveries (its answer stands), already answered, or never was.
    NotPending,
}

const CANCEL_CANCELLED: u32 = 0;
const CANCEL_NOT_PENDING: u32 = 1;

/// Result of a CancelClaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelClaimResponse {
    /// Whether a waiting claim was withdrawn.
    pub outcome: CancelOutcome,
}

impl CancelClaimResponse {
    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u32(match self.outcome {
            CancelOutcome::Cancelled => CANCEL_CANCELLED,
            CancelOutcome::NotPending => CANCEL_NOT_PENDING,
        });
        writer.u32(0);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let outcome = match reader.u32()? {
            CANCEL_CANCELLED => CancelOutcome::Cancelled,
            CANCEL_NOT_PENDING => CancelOutcome::NotPending,
            other => {
                return Err(ProtoError::UnknownEnumValue {
                    field: "cancel outcome",
                    value: other.into(),
                })
            }
        };
        reader.reserved_u32("cancel claim response reserved")?;
        reader.finish()?;
        Ok(Self { outcome })
    }
}
