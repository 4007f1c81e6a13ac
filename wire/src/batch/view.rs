//! Reading batches: [`BatchView`] over untrusted bytes ([`BatchView::validate`])
//! or over bytes the broker validated before and reads back from its own disk
//! ([`BatchView::trusted`]), plus subset slicing for claims.
//!
//! A view borrows the batch bytes and never copies them; every accessor hands
//! out slices of the original buffer. This module does not decide which
//! records a claim takes (the queue does) and does not assign offsets (the
//! log does, with [`BatchHeader::assign`]).
//!
//! Validation order is cheapest first, and nothing is read before the length
//! that covers it was checked: alignment, header fields, both crcs, reserved
//! bytes and flags, the position table (the *canonical* layout: record `i`
//! starts exactly at the 8-aligned end of record `i - 1`, padding is zero,
//! the batch ends at the last record's padded end), then every data record
//! through checked rkyv access and the semantic limits, then the header
//! timestamps against the records. Because the layout is canonical, a batch
//! has exactly one valid encoding of its records, and a mutated batch cannot
//! pass as another one unless its crcs were recomputed.

use super::builder::{align_up, BatchBytes, Region};
use super::header::{BatchHeader, BatchKind, BATCH_FLAGS_KNOWN, BATCH_FLAG_SUBSET, RESERVED_RANGE};
use super::record::{ArchivedRecord, RecordShape};
use crate::error::WireError;
use crate::limits::{
    BATCH_HEADER_BYTES, BATCH_RECORDS_MAX, CONTROL_RECORD_BYTES_MAX, POSITION_ENTRY_BYTES,
    RECORD_ALIGN, RECORD_BYTES_MAX,
};

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn check_aligned(bytes: &[u8]) -> Result<(), WireError> {
    let misalignment = bytes.as_ptr().addr() % RECORD_ALIGN;
    if misalignment != 0 {
        return Err(WireError::Misaligned { align: RECORD_ALIGN, misalignment });
    }
    Ok(())
}

/// Checked rkyv access plus the semantic record limits: the one gate every
/// untrusted data record passes.
fn check_record(index: u32, bytes: &[u8]) -> Result<&ArchivedRecord, WireError> {
    let record = rkyv::access::<ArchivedRecord, rkyv::rancor::Error>(bytes)
        .map_err(|error| WireError::InvalidRecord { index, reason: error.to_string() })?;
    RecordShape::of_archived(record).check()?;
    Ok(record)
}

/// Validates one data record received on its own (a slice served from a
/// subset, see [`BatchView::subset_slices`]) and returns its archived form.
/// `bytes` must be exactly the record, starting 8-aligned in memory.
///
/// # Errors
/// [`WireError::Misaligned`]; [`WireError::BadRecordLength`] for an empty
/// slice or one over [`RECORD_BYTES_MAX`]; [`WireError::InvalidRecord`] when
/// the checked rkyv access fails; any record-limit variant.
pub fn validate_record(bytes: &[u8]) -> Result<&ArchivedRecord, WireError> {
    check_aligned(bytes)?;
    if bytes.is_empty() || bytes.len() > RECORD_BYTES_MAX {
        return Err(WireError::BadRecordLength {
            index: 0,
            len_bytes: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            max: RECORD_BYTES_MAX,
        });
    }
    check_record(0, bytes)
}

/// A borrowed, checked batch. Constructed only by [`BatchView::validate`] or
/// [`BatchView::trusted`], so every accessor may rely on the layout (and, for
/// data batches, on every record being a valid archive).
#[derive(Clone, Copy)]
pub struct BatchView<'a> {
    /// Exactly `header.batch_len` bytes.
    bytes: &'a [u8],
    header: BatchHeader,
}

impl core::fmt::Debug for BatchView<'_> {
    // The header says what the batch is; dumping up to 4 MiB of bytes does not.
    fn fmt(&self, formatter: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        formatter.debug_struct("BatchView").field("header", &self.header).finish_non_exhaustive()
    }
}

impl<'a> BatchView<'a> {
    /// Checks untrusted bytes completely, once. `bytes` must start with the
    /// batch, 8-aligned in memory; bytes past `batch_len` are ignored (the
    /// caller advances by [`BatchHeader::batch_len`]). Never panics.
    ///
    /// ```
    /// use spool_wire::batch::{BatchView, ControlBatchBuilder};
    /// use spool_wire::WireError;
    ///
    /// let mut builder = ControlBatchBuilder::new();
    /// builder.push(5, &[1, 2, 3, 4])?;
    /// let mut bytes = builder.finish()?;
    /// bytes[70] ^= 0x10;
    /// assert!(matches!(BatchView::validate(&bytes), Err(WireError::BodyCrcMismatch { .. })));
    /// # Ok::<(), WireError>(())
    /// ```
    ///
    /// # Errors
    /// [`WireError::Misaligned`]; every error of [`BatchHeader::verify`]
    /// (header fields, truncation, both crcs); [`WireError::ReservedNotZero`],
    /// [`WireError::UnknownFlags`], [`WireError::FlagsNotAllowed`];
    /// structural errors ([`WireError::EmptyBatch`], [`WireError::BadFiller`],
    /// [`WireError::TooManyRecords`], [`WireError::BadRecordPosition`],
    /// [`WireError::BadRecordLength`], [`WireError::RecordOutOfBounds`],
    /// [`WireError::NonZeroPadding`], [`WireError::BatchLengthMismatch`]);
    /// [`WireError::InvalidRecord`] and the record-limit variants for data
    /// records; [`WireError::TimestampMismatch`].
    pub fn validate(bytes: &'a [u8]) -> Result<Self, WireError> {
        let view = Self::checked_layout(bytes)?;
        match view.header.kind {
            BatchKind::Data => {
                let mut max_ms = 0u64;
                let mut first_ms = 0u64;
                for (index, record_bytes) in (0u32..).zip(view.record_slices()) {
                    let record = check_record(index, record_bytes)?;
                    let enqueue_ms = record.enqueue_time_ms.to_native();
                    if index == 0 {
                        first_ms = enqueue_ms;
                    }
                    max_ms = max_ms.max(enqueue_ms);
                }
                if first_ms != view.header.first_timestamp_ms
                    || max_ms != view.header.max_timestamp_ms
                {
                    return Err(view.timestamp_mismatch());
                }
            }
            BatchKind::Control => {
                // Event bytes are opaque here; the state machine decodes them.
                if view.header.first_timestamp_ms > view.header.max_timestamp_ms {
                    return Err(view.timestamp_mismatch());
                }
            }
            BatchKind::Filler => {}
        }
        Ok(view)
    }

    /// Views a batch the broker itself validated (with [`BatchView::validate`])
    /// before writing it, and now reads back from its own disk. Checks both
    /// crcs and the position table, but not the records: their archives are
    /// then accessed without rkyv's validation, which is 10–20× cheaper.
    ///
    /// # Safety
    /// `bytes` must hold a batch that passed [`BatchView::validate`] at some
    /// point (only the broker-assigned `base_offset` / `leader_epoch` may have
    /// changed since, through [`BatchHeader::assign`]). The crc32c check here
    /// rejects accidental damage since then — every burst error of up to 32
    /// bits and all but about 2^-32 of other corruptions — so the bytes are
    /// the validated bytes and unchecked access is sound. It is *not* a
    /// defense against crafted input: never call this on bytes from a peer.
    ///
    /// # Errors
    /// [`WireError::Misaligned`], every error of [`BatchHeader::verify`], and
    /// the structural errors of [`BatchView::validate`].
    pub unsafe fn trusted(bytes: &'a [u8]) -> Result<Self, WireError> {
        // The layout check is a few integer compares per record; it keeps the
        // accessors free of out-of-bounds panics even in the 2^-32 case.
        Self::checked_layout(bytes)
    }

    /// [`BatchView::trusted`] for bytes whose crcs the caller has just
    /// checked itself: `verified` is what [`BatchHeader::verify`] returned
    /// for exactly these bytes (the broker's log verifies every batch it
    /// reads back). Skips the second crc32c pass over the batch, which is
    /// the bulk of the cost of viewing a large batch; the header must still
    /// parse to `verified`, and the layout is checked as in `trusted`.
    ///
    /// # Safety
    /// As [`BatchView::trusted`], and `verified` must come from
    /// [`BatchHeader::verify`] on these same, unmodified bytes.
    ///
    /// # Errors
    /// [`WireError::HeaderMismatch`] when the bytes do not parse to
    /// `verified`; otherwise as [`BatchView::trusted`] minus the crc errors.
    pub unsafe fn trusted_verified(
        bytes: &'a [u8],
        verified: &BatchHeader,
    ) -> Result<Self, WireError> {
        check_aligned(bytes)?;
        let header = BatchHeader::parse(bytes)?;
        if header != *verified || bytes.len() < header.batch_len as usize {
            return Err(WireError::HeaderMismatch);
        }
        Self::layout(bytes, header)
    }

    /// Everything [`BatchView::validate`] checks except the records' content.
    fn checked_layout(bytes: &'a [u8]) -> Result<Self, WireError> {
        check_aligned(bytes)?;
        let header = BatchHeader::verify(bytes)?;
        Self::layout(bytes, header)
    }

    /// The checks after the crcs: reserved bytes, flags, position table.
    fn layout(bytes: &'a [u8], header: BatchHeader) -> Result<Self, WireError> {
        let bytes = &bytes[..header.batch_len as usize];
        if bytes[RESERVED_RANGE].iter().any(|&byte| byte != 0) {
            return Err(WireError::ReservedNotZero);
        }
        if header.flags & !BATCH_FLAGS_KNOWN != 0 {
            return Err(WireError::UnknownFlags(header.flags));
        }
        if header.flags != 0 && header.kind != BatchKind::Data {
            return Err(WireError::FlagsNotAllowed {
                flags: header.flags,
                kind: header.kind.name(),
            });
        }
        let view = Self { bytes, header };
        match header.kind {
            BatchKind::Filler => view.check_filler()?,
            BatchKind::Data => view.check_table(RECORD_BYTES_MAX)?,
            BatchKind::Control => view.check_table(CONTROL_RECORD_BYTES_MAX)?,
        }
        Ok(view)
    }

    fn check_filler(&self) -> Result<(), WireError> {
        let header = &self.header;
        // `first_timestamp_ms` of a filler is its writer's durable watermark
        // (`BatchHeader::filler_watermark`), never past the filler itself.
        if header.record_count != 0
            || header.first_timestamp_ms > header.base_offset
            || header.max_timestamp_ms != 0
            || self.bytes[BATCH_HEADER_BYTES..].iter().any(|&byte| byte != 0)
        {
            return Err(WireError::BadFiller);
        }
        Ok(())
    }

    /// Checks the position table describes the canonical layout exactly.
    fn check_table(&self, record_len_max: usize) -> Result<(), WireError> {
        let count = self.header.record_count;
        let batch_len = self.header.batch_len;
        if count == 0 {
            return Err(WireError::EmptyBatch(self.header.kind.name()));
        }
        if count > BATCH_RECORDS_MAX {
            return Err(WireError::TooManyRecords { count, max: BATCH_RECORDS_MAX });
        }
        // u64 arithmetic: nothing below can overflow for u32 inputs.
        let table_end = BATCH_HEADER_BYTES as u64 + u64::from(count) * POSITION_ENTRY_BYTES as u64;
        if table_end > u64::from(batch_len) {
            return Err(WireError::BatchLengthMismatch { batch_len, expected: table_end });
        }
        let mut expected = table_end;
        for index in 0..count {
            let entry = BATCH_HEADER_BYTES + index as usize * POSITION_ENTRY_BYTES;
            let position = le_u32(self.bytes, entry);
            let len_bytes = le_u32(self.bytes, entry + 4);
            if u64::from(position) != expected {
                return Err(WireError::BadRecordPosition { index, position, expected });
            }
            if len_bytes == 0 || len_bytes as usize > record_len_max {
                return Err(WireError::BadRecordLength { index, len_bytes, max: record_len_max });
            }
            let end = u64::from(position) + u64::from(len_bytes);
            if end > u64::from(batch_len) {
                return Err(WireError::RecordOutOfBounds { index, end, batch_len });
            }
            // In range: end <= batch_len, and batch_len is a multiple of 8.
            let end = end as usize;
            let padded_end = align_up(end);
            if let Some(offset) = self.bytes[end..padded_end].iter().position(|&byte| byte != 0) {
                return Err(WireError::NonZeroPadding { position: end + offset });
            }
            expected = padded_end as u64;
        }
        if expected != u64::from(batch_len) {
            return Err(WireError::BatchLengthMismatch { batch_len, expected });
        }
        Ok(())
    }

    fn timestamp_mismatch(&self) -> WireError {
        WireError::TimestampMismatch {
            first_ms: self.header.first_timestamp_ms,
            max_ms: self.header.max_timestamp_ms,
        }
    }

    /// The decoded header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The whole batch, exactly `batch_len` bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of records (zero only for a filler).
    pub fn len(&self) -> usize {
        self.header.record_count as usize
    }

    /// Whether the batch holds no records (a filler).
    pub fn is_empty(&self) -> bool {
        self.header.record_count == 0
    }

    /// The raw bytes of record `index`, any kind: for a data batch an rkyv
    /// archive, for a control batch the event. Starts 8-aligned in memory.
    ///
    /// # Panics
    /// If `index >= self.len()`, like slice indexing.
    pub fn record_bytes(&self, index: usize) -> &'a [u8] {
        assert!(index < self.len(), "record index {index} out of range {}", self.len());
        let entry = BATCH_HEADER_BYTES + index * POSITION_ENTRY_BYTES;
        let position = le_u32(self.bytes, entry) as usize;
        let len = le_u32(self.bytes, entry + 4) as usize;
        // In bounds: the table was checked when the view was made.
        &self.bytes[position..position + len]
    }

    /// Archived data record `index`, accessed in place without copying.
    ///
    /// # Panics
    /// If the batch is not a data batch or `index >= self.len()`: the caller
    /// checks [`BatchHeader::kind`] first, as it must to interpret offsets.
    pub fn record(&self, index: usize) -> &'a ArchivedRecord {
        assert!(self.header.kind == BatchKind::Data, "record() on a {} batch", self.kind_name());
        let bytes = self.record_bytes(index);
        // SAFETY: a view exists only after `validate` ran checked rkyv access
        // on exactly this slice, or through `trusted`, whose contract is that
        // these bytes passed `validate` before and are crc-identical to them.
        // `bytes` starts 8-aligned (aligned buffer, 8-aligned position).
        unsafe { rkyv::access_unchecked::<ArchivedRecord>(bytes) }
    }

    /// Event bytes of control record `index`.
    ///
    /// # Panics
    /// If the batch is not a control batch or `index >= self.len()`.
    pub fn control_record(&self, index: usize) -> &'a [u8] {
        assert!(
            self.header.kind == BatchKind::Control,
            "control_record() on a {} batch",
            self.kind_name()
        );
        self.record_bytes(index)
    }

    /// Raw bytes of every record in order (any kind).
    pub fn record_slices(&self) -> impl ExactSizeIterator<Item = &'a [u8]> + '_ {
        (0..self.len()).map(move |index| self.record_bytes(index))
    }

    /// Every archived data record in order.
    ///
    /// # Panics
    /// If the batch is not a data batch.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &'a ArchivedRecord> + '_ {
        assert!(self.header.kind == BatchKind::Data, "records() on a {} batch", self.kind_name());
        (0..self.len()).map(move |index| self.record(index))
    }

    fn kind_name(&self) -> &'static str {
        self.header.kind.name()
    }

    fn check_indices(&self, indices: &[u32]) -> Result<(), WireError> {
        let len = self.header.record_count;
        match indices.iter().find(|&&index| index >= len) {
            Some(&index) => Err(WireError::IndexOutOfRange { index, len }),
            None => Ok(()),
        }
    }

    /// Appends to `out` the bytes of exactly the records at `indices` (in the
    /// order given), without copying or re-encoding: how a claim that takes 10
    /// of 100 records serves them. Each slice is a complete record a receiver
    /// checks with [`validate_record`] (after placing it 8-aligned); record
    /// `i`'s offset is `header().base_offset + i` and travels beside it.
    ///
    /// # Errors
    /// [`WireError::IndexOutOfRange`], before anything is appended.
    pub fn subset_slices(&self, indices: &[u32], out: &mut Vec<&'a [u8]>) -> Result<(), WireError> {
        self.check_indices(indices)?;
        out.extend(indices.iter().map(|&index| self.record_bytes(index as usize)));
        Ok(())
    }

    /// Re-frames the records at `indices` as a new data batch, copying their
    /// bytes (one memcpy each, no re-encoding) behind a fresh header and
    /// table, with [`BATCH_FLAG_SUBSET`] set, `base_offset` 0 and timestamps
    /// from the chosen records. This is the wire form for serving a subset
    /// under one crc: the receiver runs [`BatchView::validate`] once, and the
    /// records' offsets (not contiguous) travel beside the batch.
    ///
    /// # Errors
    /// [`WireError::WrongKind`] unless this is a data batch;
    /// [`WireError::BadSubset`] unless `indices` is non-empty and strictly
    /// increasing; [`WireError::IndexOutOfRange`].
    pub fn reframe(&self, indices: &[u32]) -> Result<BatchBytes, WireError> {
        if self.header.kind != BatchKind::Data {
            return Err(WireError::WrongKind { expected: "data", found: self.kind_name() });
        }
        if indices.is_empty() || indices.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(WireError::BadSubset);
        }
        self.check_indices(indices)?;
        let records_bytes =
            indices.iter().map(|&index| align_up(self.record_bytes(index as usize).len())).sum();
        let mut region = Region::with_capacity(records_bytes);
        for &index in indices {
            let index = index as usize;
            // A subset of a batch within the limits is within them too.
            region.push_encoded(
                self.record_bytes(index),
                self.record(index).enqueue_time_ms.to_native(),
            )?;
        }
        region.finish(BatchKind::Data, BATCH_FLAG_SUBSET)
    }
}
