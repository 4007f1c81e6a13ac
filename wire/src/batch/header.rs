//! The fixed 64-byte batch header.
//!
//! ```text
//! offset size field              written by   covered by
//!  0     4    magic "SPB1"        producer     header_crc
//!  4     2    format version (1)  producer     header_crc
//!  6     2    kind                producer     header_crc
//!  8     4    batch_len           producer     header_crc
//! 12     4    body_crc            producer     header_crc
//! 16     8    base_offset         broker       header_crc
//! 24     4    leader_epoch        broker       header_crc
//! 28     4    header_crc          broker       -
//! 32     4    record_count        producer     body_crc
//! 36     4    flags               producer     body_crc
//! 40     8    first_timestamp_ms  producer     body_crc   (filler: watermark)
//! 48     8    max_timestamp_ms    producer     body_crc
//! 56     8    reserved (zero)     producer     body_crc
//! 64     ...  body: position table, records
//! ```
//!
//! A filler batch (written by the broker only, to close a commit's last page)
//! carries no records and no timestamps; its `first_timestamp_ms` field
//! holds instead the **durable watermark** known to the writer when the
//! commit was built: the log's contiguous durable offset then (0 when none is
//! known). Recovery uses it to tell damage to an acknowledged commit from a
//! torn tail (`FILLER_WATERMARK_NONE`, [`BatchHeader::filler_watermark`]).
//!
//! `body_crc` is crc32c over bytes `[32, batch_len)`: everything the producer
//! chose after the framing fields. The broker never changes those bytes, so
//! the producer's checksum is the one that sits on disk. `header_crc` is
//! crc32c over bytes `[0, 28)` and is recomputed whenever the broker assigns
//! `base_offset` and `leader_epoch`; it also covers `body_crc`, so a damaged
//! header is always detected. All integers are little-endian.

use crate::error::WireError;
use crate::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES, RECORD_ALIGN};

/// `b"SPB1"` read as a little-endian u32.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"SPB1");
/// The only format version this crate reads and writes.
pub const BATCH_FORMAT_VERSION: u16 = 1;

/// Flag of a data batch that carries a subset of another batch's records
/// (see `BatchView::reframe`): record `i`'s offset is *not* `base_offset + i`;
/// the offsets travel beside the batch. The log never stores such a batch.
pub const BATCH_FLAG_SUBSET: u32 = 1;
/// Every flag this version knows; validation rejects any other bit.
pub const BATCH_FLAGS_KNOWN: u32 = BATCH_FLAG_SUBSET;

pub(crate) const BODY_CRC_START: usize = 32;
const HEADER_CRC_COVERS: usize = 28;
/// Bytes `[56, 64)` of the header: reserved, written as zero.
pub(crate) const RESERVED_RANGE: core::ops::Range<usize> = 56..64;

/// What a batch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum BatchKind {
    /// Enqueued records, archived one by one with rkyv.
    Data = 0,
    /// State transitions (claimed, acked, ...) in fixed-size binary form.
    Control = 1,
    /// Padding that closes a commit's last 4 KiB page. Holds no records and
    /// consumes no offsets.
    Filler = 2,
}

impl BatchKind {
    /// Decodes a kind field.
    ///
    /// # Errors
    /// [`WireError::UnknownBatchKind`] for any value this version does not know.
    pub fn from_u16(value: u16) -> Result<Self, WireError> {
        match value {
            0 => Ok(Self::Data),
            1 => Ok(Self::Control),
            2 => Ok(Self::Filler),
            other => Err(WireError::UnknownBatchKind(other)),
        }
    }

    /// A lowercase name for messages and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Control => "control",
            Self::Filler => "filler",
        }
    }
}

/// The decoded fixed header of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub kind: BatchKind,
    /// Total bytes of the batch, header included; a multiple of 8.
    pub batch_len: u32,
    pub body_crc: u32,
    /// Offset of the first record; assigned by the broker.
    pub base_offset: u64,
    /// Leader epoch of the partition when the batch was appended; assigned by
    /// the broker.
    pub leader_epoch: u32,
    pub header_crc: u32,
    pub record_count: u32,
    pub flags: u32,
    pub first_timestamp_ms: u64,
    pub max_timestamp_ms: u64,
}

fn le_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

impl BatchHeader {
    /// Decodes the framing fields of the header at the start of `bytes`
    /// without checking any checksum. Checks magic, version, kind and that
    /// `batch_len` is aligned, at least a header, and within
    /// [`BATCH_BYTES_MAX`]. Does not require `bytes` to hold the whole batch.
    ///
    /// # Errors
    /// [`WireError::Truncated`] when fewer than 64 bytes are given;
    /// [`WireError::BadMagic`], [`WireError::UnsupportedVersion`],
    /// [`WireError::UnknownBatchKind`], [`WireError::BadBatchLength`].
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        if bytes.len() < BATCH_HEADER_BYTES {
            return Err(WireError::Truncated {
                needed: BATCH_HEADER_BYTES,
                available: bytes.len(),
            });
        }
        let magic = le_u32(bytes, 0);
        if magic != BATCH_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = le_u16(bytes, 4);
        if version != BATCH_FORMAT_VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        let kind = BatchKind::from_u16(le_u16(bytes, 6))?;
        let batch_len = le_u32(bytes, 8);
        let len = batch_len as usize;
        if !(BATCH_HEADER_BYTES..=BATCH_BYTES_MAX).contains(&len)
            || !len.is_multiple_of(RECORD_ALIGN)
        {
            return Err(WireError::BadBatchLength(batch_len));
        }
        Ok(Self {
            kind,
            batch_len,
            body_crc: le_u32(bytes, 12),
            base_offset: le_u64(bytes, 16),
            leader_epoch: le_u32(bytes, 24),
            header_crc: le_u32(bytes, 28),
            record_count: le_u32(bytes, 32),
            flags: le_u32(bytes, 36),
            first_timestamp_ms: le_u64(bytes, 40),
            max_timestamp_ms: le_u64(bytes, 48),
        })
    }

    /// Parses the header and checks both checksums against the whole batch,
    /// which must be exactly `bytes[..batch_len]`. This is the check for bytes
    /// read back from the broker's own disk; untrusted bytes additionally go
    /// through full structural validation.
    ///
    /// # Errors
    /// Everything [`BatchHeader::parse`] returns, plus [`WireError::Truncated`]
    /// when `bytes` is shorter than `batch_len` and
    /// [`WireError::HeaderCrcMismatch`] / [`WireError::BodyCrcMismatch`].
    pub fn verify(bytes: &[u8]) -> Result<Self, WireError> {
        let header = Self::parse(bytes)?;
        let len = header.batch_len as usize;
        if bytes.len() < len {
            return Err(WireError::Truncated { needed: len, available: bytes.len() });
        }
        let header_crc = crc32c::crc32c(&bytes[..HEADER_CRC_COVERS]);
        if header_crc != header.header_crc {
            return Err(WireError::HeaderCrcMismatch {
                stored: header.header_crc,
                computed: header_crc,
            });
        }
        let body_crc = crc32c::crc32c(&bytes[BODY_CRC_START..len]);
        if body_crc != header.body_crc {
            return Err(WireError::BodyCrcMismatch { stored: header.body_crc, computed: body_crc });
        }
        Ok(header)
    }

    /// Checks only the body checksum (what the producer wrote). Used on
    /// arrival, before the broker assigns offsets and rewrites the header crc.
    ///
    /// # Errors
    /// As [`BatchHeader::verify`], without the header crc check.
    pub fn verify_body(bytes: &[u8]) -> Result<Self, WireError> {
        let header = Self::parse(bytes)?;
        let len = header.batch_len as usize;
        if bytes.len() < len {
            return Err(WireError::Truncated { needed: len, available: bytes.len() });
        }
        let body_crc = crc32c::crc32c(&bytes[BODY_CRC_START..len]);
        if body_crc != header.body_crc {
            return Err(WireError::BodyCrcMismatch { stored: header.body_crc, computed: body_crc });
        }
        Ok(header)
    }

    /// Writes every header field into `bytes[..64]`, computing `body_crc` over
    /// `bytes[32..batch_len]` and then `header_crc`. The body (from byte 64)
    /// must already be in place.
    ///
    /// # Panics
    /// If `bytes` is shorter than `batch_len` or `batch_len` is not a valid
    /// length: callers build batches they sized themselves.
    pub fn write(&self, bytes: &mut [u8]) {
        let len = self.batch_len as usize;
        assert!(len >= BATCH_HEADER_BYTES);
        assert!(len.is_multiple_of(RECORD_ALIGN));
        assert!(bytes.len() >= len);
        bytes[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        bytes[4..6].copy_from_slice(&BATCH_FORMAT_VERSION.to_le_bytes());
        bytes[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        bytes[8..12].copy_from_slice(&self.batch_len.to_le_bytes());
        bytes[32..36].copy_from_slice(&self.record_count.to_le_bytes());
        bytes[36..40].copy_from_slice(&self.flags.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.first_timestamp_ms.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.max_timestamp_ms.to_le_bytes());
        bytes[RESERVED_RANGE].fill(0);
        let body_crc = crc32c::crc32c(&bytes[BODY_CRC_START..len]);
        bytes[12..16].copy_from_slice(&body_crc.to_le_bytes());
        Self::assign(bytes, self.base_offset, self.leader_epoch);
    }

    /// Sets the broker-assigned fields of an already-built batch in place and
    /// recomputes `header_crc`. The body and `body_crc` are untouched, so the
    /// producer's bytes are stored as they arrived.
    ///
    /// # Panics
    /// If `bytes` is shorter than the header.
    pub fn assign(bytes: &mut [u8], base_offset: u64, leader_epoch: u32) {
        assert!(bytes.len() >= BATCH_HEADER_BYTES);
        bytes[16..24].copy_from_slice(&base_offset.to_le_bytes());
        bytes[24..28].copy_from_slice(&leader_epoch.to_le_bytes());
        let header_crc = crc32c::crc32c(&bytes[..HEADER_CRC_COVERS]);
        bytes[28..32].copy_from_slice(&header_crc.to_le_bytes());
    }

    /// Offsets this batch consumes: one per record; fillers consume none.
    pub fn offset_count(&self) -> u64 {
        match self.kind {
            BatchKind::Filler => 0,
            BatchKind::Data | BatchKind::Control => u64::from(self.record_count),
        }
    }

    /// The offset after the last record of this batch.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + self.offset_count()
    }

    /// For a filler, the durable watermark its writer recorded (an offset:
    /// every record below it was durable when the commit the filler closes
    /// was built); `None` for other kinds and for fillers that record none
    /// ([`FILLER_WATERMARK_NONE`]).
    pub fn filler_watermark(&self) -> Option<u64> {
        match self.kind {
            BatchKind::Filler if self.first_timestamp_ms != FILLER_WATERMARK_NONE => {
                Some(self.first_timestamp_ms)
            }
            _ => None,
        }
    }
}

/// The watermark a filler records when its writer knows none (and what
/// every filler written before fillers carried one holds).
pub const FILLER_WATERMARK_NONE: u64 = 0;

/// Writes a filler batch of exactly `len` bytes into `bytes[..len]`: a header
/// with no records and a zero body. Fillers close the last 4 KiB page of a
/// commit so the next commit starts on a fresh page; `watermark` is the
/// durable watermark known to the writer ([`FILLER_WATERMARK_NONE`] if none).
///
/// # Panics
/// If `len` is smaller than a header, not a multiple of 8, larger than
/// [`BATCH_BYTES_MAX`], or larger than `bytes`, or if `watermark` is past
/// `base_offset` (nothing after the filler can have been durable before it
/// was written).
pub fn write_filler(
    bytes: &mut [u8],
    len: usize,
    base_offset: u64,
    leader_epoch: u32,
    watermark: u64,
) {
    assert!(watermark <= base_offset, "a filler's watermark is never past its own offset");
    assert!(len >= BATCH_HEADER_BYTES);
    assert!(len <= BATCH_BYTES_MAX);
    assert!(len.is_multiple_of(RECORD_ALIGN));
    let batch_len = u32::try_from(len).expect("filler length fits u32 (checked above)");
    bytes[BATCH_HEADER_BYTES..len].fill(0);
    BatchHeader {
        kind: BatchKind::Filler,
        batch_len,
        body_crc: 0,
        base_offset,
        leader_epoch,
        header_crc: 0,
        record_count: 0,
        flags: 0,
        first_timestamp_ms: watermark,
        max_timestamp_ms: 0,
    }
    .write(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_round_trips_and_consumes_no_offsets() {
        // Goal: a filler is a valid batch that carries no offsets.
        let mut page = vec![0xAAu8; 4096];
        write_filler(&mut page, 4096, 77, 3, FILLER_WATERMARK_NONE);
        let header = BatchHeader::verify(&page).expect("filler verifies");
        assert_eq!(header.kind, BatchKind::Filler);
        assert_eq!(header.batch_len, 4096);
        assert_eq!(header.base_offset, 77);
        assert_eq!(header.next_offset(), 77);
        assert_eq!(header.filler_watermark(), None);
    }

    #[test]
    fn a_filler_carries_its_watermark_under_the_body_crc() {
        // Goal: the watermark round-trips, and a flipped bit in it fails the
        // body crc (it is the writer's claim that earlier data was durable).
        let mut page = vec![0u8; 4096];
        write_filler(&mut page, 4096, 77, 3, 70);
        let header = BatchHeader::verify(&page).expect("filler verifies");
        assert_eq!(header.filler_watermark(), Some(70));
        page[40] ^= 0x01;
        assert!(BatchHeader::verify(&page).is_err());
    }

    #[test]
    #[should_panic(expected = "never past its own offset")]
    fn a_filler_watermark_past_its_offset_is_a_bug() {
        let mut page = vec![0u8; 4096];
        write_filler(&mut page, 4096, 77, 3, 78);
    }

    #[test]
    fn assign_keeps_body_crc_and_changes_header_crc() {
        // Goal: the broker can stamp offsets without touching producer bytes.
        let mut batch = vec![0u8; 128];
        BatchHeader {
            kind: BatchKind::Data,
            batch_len: 128,
            body_crc: 0,
            base_offset: 0,
            leader_epoch: 0,
            header_crc: 0,
            record_count: 0,
            flags: 0,
            first_timestamp_ms: 1,
            max_timestamp_ms: 2,
        }
        .write(&mut batch);
        let before = BatchHeader::verify(&batch).expect("valid");
        BatchHeader::assign(&mut batch, 1000, 9);
        let after = BatchHeader::verify(&batch).expect("still valid");
        assert_eq!(before.body_crc, after.body_crc);
        assert_ne!(before.header_crc, after.header_crc);
        assert_eq!(after.base_offset, 1000);
        assert_eq!(after.leader_epoch, 9);
        // Damaging the broker-assigned field is detected.
        batch[17] ^= 1;
        assert!(matches!(BatchHeader::verify(&batch), Err(WireError::HeaderCrcMismatch { .. })));
    }

    #[test]
    fn zeros_are_not_a_batch() {
        // Goal: the zero-filled tail of a prepared segment reads as "no batch".
        let zeros = [0u8; 64];
        assert!(matches!(BatchHeader::parse(&zeros), Err(WireError::BadMagic(0))));
    }
}
