//! Little-endian cursor over a frame body, and the matching writer helpers.
//! Shared by the hand-written data-path layouts and the frame header. Every
//! read is bounds-checked and returns [`ProtoError::Truncated`] instead of
//! panicking; offsets are relative to the body start, which is 8-aligned in
//! the frame, so `align` here aligns within the frame too.

use super::error::ProtoError;
use super::limits::{FRAME_ALIGN, QUEUE_NAME_BYTES_MAX, SUBSCRIPTION_NAME_BYTES_MAX};

/// Bounds-checked little-endian reader that borrows from its input.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, position: 0 }
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], ProtoError> {
        let available = self.bytes.len() - self.position;
        if len > available {
            return Err(ProtoError::Truncated { needed: len, available });
        }
        let slice = &self.bytes[self.position..self.position + len];
        self.position += len;
        Ok(slice)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A reserved field: must be zero so it can gain a meaning later.
    pub(crate) fn reserved_u32(&mut self, field: &'static str) -> Result<(), ProtoError> {
        if self.u32()? != 0 {
            return Err(ProtoError::NonzeroReserved { field });
        }
        Ok(())
    }

    /// Skip zero padding up to the next multiple of [`FRAME_ALIGN`].
    pub(crate) fn align(&mut self) -> Result<(), ProtoError> {
        let pad = padding(self.position);
        let bytes = self.take(pad)?;
        if bytes.iter().any(|&byte| byte != 0) {
            return Err(ProtoError::NonzeroReserved { field: "alignment padding" });
        }
        Ok(())
    }

    /// A `u16`-length-prefixed UTF-8 string of at most `max` bytes.
    pub(crate) fn str(&mut self, field: &'static str, max: usize) -> Result<&'a str, ProtoError> {
        let len = usize::from(self.u16()?);
        if len > max {
            return Err(ProtoError::TooLong { field, len, max });
        }
        std::str::from_utf8(self.take(len)?).map_err(|_| ProtoError::NotUtf8 { field })
    }

    /// A `u16`-length-prefixed queue name, validated.
    pub(crate) fn queue_name(&mut self) -> Result<&'a str, ProtoError> {
        let len = usize::from(self.u16()?);
        if len > QUEUE_NAME_BYTES_MAX {
            return Err(ProtoError::InvalidQueueName { reason: "longer than 128 bytes" });
        }
        let bytes = self.take(len)?;
        validate_queue_name_bytes(bytes)?;
        // Validated ASCII is UTF-8.
        std::str::from_utf8(bytes).map_err(|_| ProtoError::NotUtf8 { field: "queue" })
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// The body must end exactly here.
    pub(crate) fn finish(self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(ProtoError::TrailingBytes { extra }),
        }
    }
}

/// Bytes of zero padding after `position` to reach a multiple of [`FRAME_ALIGN`].
pub(crate) const fn padding(position: usize) -> usize {
    (FRAME_ALIGN - position % FRAME_ALIGN) % FRAME_ALIGN
}

/// The name of a queue's default subscription (id 0): the one a claim
/// naming none claims from.
pub const DEFAULT_SUBSCRIPTION: &str = "default";

/// Suffix that names a queue's dead-letter lane: a Claim of `jobs.dlq`
/// claims the dead letters of `jobs`'s partitions, so no new queue may end
/// with it.
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

/// Checks a queue name: 1..=[`QUEUE_NAME_BYTES_MAX`] bytes of `[A-Za-z0-9._-]`.
///
/// # Errors
/// [`ProtoError::InvalidQueueName`] saying which rule failed.
pub fn validate_queue_name(name: &str) -> Result<(), ProtoError> {
    validate_queue_name_bytes(name.as_bytes())
}

fn validate_queue_name_bytes(bytes: &[u8]) -> Result<(), ProtoError> {
    if bytes.is_empty() {
        return Err(ProtoError::InvalidQueueName { reason: "empty" });
    }
    if bytes.len() > QUEUE_NAME_BYTES_MAX {
        return Err(ProtoError::InvalidQueueName { reason: "longer than 128 bytes" });
    }
    if !bytes.iter().all(|&byte| name_byte_allowed(byte)) {
        return Err(ProtoError::InvalidQueueName { reason: "character outside [A-Za-z0-9._-]" });
    }
    Ok(())
}

/// Whether a queue or subscription name may hold `byte`.
fn name_byte_allowed(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

/// Checks a subscription name by the queue names' rule:
/// 1..=[`SUBSCRIPTION_NAME_BYTES_MAX`] bytes of `[A-Za-z0-9._-]`. (A Claim
/// names the default subscription with an empty name, which it does not
/// pass here.)
///
/// # Errors
/// [`ProtoError::InvalidSubscriptionName`] saying which rule failed.
pub fn validate_subscription_name(name: &str) -> Result<(), ProtoError> {
    if name.is_empty() {
        return Err(ProtoError::InvalidSubscriptionName { reason: "empty" });
    }
    if name.len() > SUBSCRIPTION_NAME_BYTES_MAX {
        return Err(ProtoError::InvalidSubscriptionName { reason: "longer than 128 bytes" });
    }
    if !name.bytes().all(name_byte_allowed) {
        return Err(ProtoError::InvalidSubscriptionName {
            reason: "character outside [A-Za-z0-9._-]",
        });
    }
    Ok(())
}

// The length reason above names the limit.
const _: () = assert!(SUBSCRIPTION_NAME_BYTES_MAX == 128);

/// Checks `min <= value <= max`.
pub(crate) fn check_range(
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<(), ProtoError> {
    if value < min || value > max {
        return Err(ProtoError::OutOfRange { field, value, min, max });
    }
    Ok(())
}

/// Checks a string length against its limit.
pub(crate) fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), ProtoError> {
    if len > max {
        return Err(ProtoError::TooLong { field, len, max });
    }
    Ok(())
}

/// Little-endian writer helpers over a `Vec<u8>`; positions for alignment are
/// measured from `base` (the body start inside the frame).
pub(crate) struct Writer<'v> {
    out: &'v mut Vec<u8>,
    base: usize,
}

impl<'v> Writer<'v> {
    pub(crate) fn new(out: &'v mut Vec<u8>) -> Self {
        let base = out.len();
        Self { out, base }
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Makes room for `more` bytes at once, so a large body is written
    /// without the buffer growing (and copying itself) several times.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.out.reserve(more);
    }

    pub(crate) fn u8(&mut self, value: u8) {
        self.out.push(value);
    }

    pub(crate) fn u16(&mut self, value: u16) {
        self.bytes(&value.to_le_bytes());
    }

    pub(crate) fn u32(&mut self, value: u32) {
        self.bytes(&value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    /// Zero padding to the next multiple of [`FRAME_ALIGN`] from the body start.
    pub(crate) fn align(&mut self) {
        let pad = padding(self.out.len() - self.base);
        self.out.resize(self.out.len() + pad, 0);
    }

    /// A `u16`-length-prefixed string. The caller has validated its length;
    /// a string that does not fit a `u16` is a caller bug.
    pub(crate) fn str(&mut self, value: &str) {
        let len = u16::try_from(value.len());
        assert!(len.is_ok(), "string of {} bytes cannot be length-prefixed", value.len());
        self.u16(len.unwrap_or(u16::MAX));
        self.bytes(value.as_bytes());
    }
}
