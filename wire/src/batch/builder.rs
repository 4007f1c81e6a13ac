//! Building batches: [`DataBatchBuilder`] for producers, [`ControlBatchBuilder`]
//! for the queue state machine's events.
//!
//! A builder enforces every limit as records arrive, so a batch that would
//! break [`BATCH_BYTES_MAX`] or [`BATCH_RECORDS_MAX`] is refused one record
//! early with a typed error and the builder stays usable (the producer
//! flushes and starts a new batch). The builders write `base_offset` and
//! `leader_epoch` as zero: the broker assigns both with
//! [`BatchHeader::assign`] when it appends.
//!
//! Records are archived straight into one growing region, each starting on a
//! multiple of [`RECORD_ALIGN`]; `finish` copies that region once behind the
//! header and position table. It does not validate what it built beyond the
//! limits: [`super::BatchView::validate`] is the reader's check.

use rkyv::util::AlignedVec;

use super::header::{BatchHeader, BatchKind};
use super::record::{Record, RecordShape};
use crate::error::WireError;
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_HEADER_BYTES, BATCH_RECORDS_MAX, CONTROL_RECORD_BYTES_MAX,
    POSITION_ENTRY_BYTES, RECORD_ALIGN, RECORD_BYTES_MAX,
};

/// An owned batch (or record) buffer whose start is aligned for rkyv.
pub type BatchBytes = AlignedVec<RECORD_ALIGN>;

/// Rounds `len` up to the next multiple of [`RECORD_ALIGN`].
pub(crate) const fn align_up(len: usize) -> usize {
    len.next_multiple_of(RECORD_ALIGN)
}

/// Bytes a batch of `record_count` records whose (padded) records take
/// `records_bytes` occupies in total.
pub(crate) const fn batch_len_for(record_count: usize, records_bytes: usize) -> usize {
    BATCH_HEADER_BYTES + record_count * POSITION_ENTRY_BYTES + align_up(records_bytes)
}

/// The part both builders share: records back to back in `records` (each
/// padded to [`RECORD_ALIGN`]), their `(position in region, len)` entries and
/// the timestamp range.
#[derive(Debug, Default)]
pub(crate) struct Region {
    records: BatchBytes,
    entries: Vec<(u32, u32)>,
    first_timestamp_ms: u64,
    max_timestamp_ms: u64,
}

impl Region {
    pub(crate) fn with_capacity(records_bytes: usize) -> Self {
        Self {
            records: BatchBytes::with_capacity(records_bytes.min(BATCH_BYTES_MAX)),
            ..Self::default()
        }
    }

    fn record_count(&self) -> u32 {
        // Bounded by BATCH_RECORDS_MAX, checked in `check_count`.
        u32::try_from(self.entries.len()).unwrap_or(u32::MAX)
    }

    fn encoded_len_bytes(&self) -> usize {
        batch_len_for(self.entries.len(), self.records.len())
    }

    /// Checks that one more record could still be added at all.
    fn check_count(&self) -> Result<(), WireError> {
        let count = self.record_count();
        if count >= BATCH_RECORDS_MAX {
            return Err(WireError::BatchRecordsFull { count });
        }
        Ok(())
    }

    /// Checks that one more record fits when the region, that record
    /// included, is `records_end` bytes long.
    fn check_bytes(&self, records_end: usize) -> Result<(), WireError> {
        let needed_bytes = batch_len_for(self.entries.len() + 1, records_end);
        if needed_bytes > BATCH_BYTES_MAX {
            return Err(WireError::BatchBytesFull { needed_bytes });
        }
        Ok(())
    }

    /// Records the record that now occupies `records[start..]` and pads the
    /// region to the next record boundary.
    fn commit(&mut self, start: usize, timestamp_ms: u64) {
        let len = self.records.len() - start;
        let position = u32::try_from(start).expect("region is bounded by BATCH_BYTES_MAX");
        let len = u32::try_from(len).expect("record is bounded by RECORD_BYTES_MAX");
        if self.entries.is_empty() {
            self.first_timestamp_ms = timestamp_ms;
            self.max_timestamp_ms = timestamp_ms;
        } else {
            self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        }
        self.entries.push((position, len));
        self.records.resize(align_up(self.records.len()), 0);
    }

    /// Appends already-encoded record bytes as they are, after the count and
    /// size checks; the caller has checked the record's own length.
    pub(crate) fn push_encoded(
        &mut self,
        bytes: &[u8],
        timestamp_ms: u64,
    ) -> Result<(), WireError> {
        self.check_count()?;
        self.check_bytes(self.records.len() + bytes.len())?;
        let start = self.records.len();
        self.records.extend_from_slice(bytes);
        self.commit(start, timestamp_ms);
        Ok(())
    }

    /// Writes header, table and records into one new aligned buffer.
    pub(crate) fn finish(&self, kind: BatchKind, flags: u32) -> Result<BatchBytes, WireError> {
        let mut out = BatchBytes::with_capacity(self.encoded_len_bytes());
        self.finish_into(kind, flags, &mut out)?;
        Ok(out)
    }

    /// Writes header, table and records into `out` (cleared first, its
    /// capacity reused).
    pub(crate) fn finish_into(
        &self,
        kind: BatchKind,
        flags: u32,
        out: &mut BatchBytes,
    ) -> Result<(), WireError> {
        if self.entries.is_empty() {
            return Err(WireError::EmptyBatch(kind.name()));
        }
        let batch_len = self.encoded_len_bytes();
        assert!(batch_len <= BATCH_BYTES_MAX);
        let region_start = BATCH_HEADER_BYTES + self.entries.len() * POSITION_ENTRY_BYTES;
        out.clear();
        out.reserve(batch_len);
        out.resize(BATCH_HEADER_BYTES, 0);
        for &(position, len) in &self.entries {
            let absolute = u32::try_from(region_start + position as usize)
                .expect("batch is bounded by BATCH_BYTES_MAX");
            out.extend_from_slice(&absolute.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.extend_from_slice(&self.records);
        out.resize(batch_len, 0);
        BatchHeader {
            kind,
            batch_len: u32::try_from(batch_len).expect("batch is bounded by BATCH_BYTES_MAX"),
            body_crc: 0,
            base_offset: 0,
            leader_epoch: 0,
            header_crc: 0,
            record_count: self.record_count(),
            flags,
            first_timestamp_ms: self.first_timestamp_ms,
            max_timestamp_ms: self.max_timestamp_ms,
        }
        .write(out);
        Ok(())
    }
}

/// Builds a data batch from [`Record`]s, archiving each on its own.
///
/// ```
/// use spool_wire::batch::{BatchView, DataBatchBuilder, MessageId, Payload, Record};
///
/// let mut builder = DataBatchBuilder::new();
/// builder.push(&Record {
///     message_id: MessageId([7; 16]),
///     routing_key: b"user-42".to_vec(),
///     headers: Vec::new(),
///     payload: Payload::Inline(b"hello".to_vec()),
///     priority: 0,
///     not_before_ms: 0,
///     expiry_ms: 0,
///     enqueue_time_ms: 1_700_000_000_000,
/// })?;
/// let bytes = builder.finish()?;
/// let view = BatchView::validate(&bytes)?;
/// assert_eq!(view.len(), 1);
/// assert_eq!(view.record(0).routing_key.as_slice(), b"user-42");
/// # Ok::<(), spool_wire::WireError>(())
/// ```
#[derive(Debug, Default)]
pub struct DataBatchBuilder {
    region: Region,
}

impl DataBatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty builder whose record region starts with room for
    /// `capacity_bytes` (clamped to [`BATCH_BYTES_MAX`]).
    pub fn with_capacity(capacity_bytes: usize) -> Self {
        Self { region: Region::with_capacity(capacity_bytes) }
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.region.entries.len()
    }

    /// Whether no record has been pushed.
    pub fn is_empty(&self) -> bool {
        self.region.entries.is_empty()
    }

    /// Size the batch would have if finished now, header included; lets a
    /// producer flush on a byte target below [`BATCH_BYTES_MAX`].
    pub fn encoded_len_bytes(&self) -> usize {
        self.region.encoded_len_bytes()
    }

    /// Archives `record` into the batch. On error the builder is unchanged.
    ///
    /// # Errors
    /// A record-limit variant ([`WireError::RoutingKeyTooLong`],
    /// [`WireError::TooManyHeaders`], [`WireError::HeadersTooLarge`],
    /// [`WireError::PriorityOutOfRange`], [`WireError::InlinePayloadTooLarge`],
    /// [`WireError::BadPayloadLocation`], [`WireError::ReferencedPayloadTooLarge`],
    /// [`WireError::RecordTooLarge`] beyond [`RECORD_BYTES_MAX`]), or
    /// [`WireError::BatchRecordsFull`] / [`WireError::BatchBytesFull`] when
    /// the record does not fit this batch (finish it and start another).
    pub fn push(&mut self, record: &Record) -> Result<(), WireError> {
        RecordShape::of_record(record).check()?;
        self.region.check_count()?;
        let start = self.region.records.len();
        if let Err(error) =
            rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(record, &mut self.region.records)
        {
            self.region.records.resize(start, 0);
            return Err(WireError::RecordEncode(error.to_string()));
        }
        let len_bytes = self.region.records.len() - start;
        let fits = if len_bytes > RECORD_BYTES_MAX {
            Err(WireError::RecordTooLarge { len_bytes })
        } else {
            self.region.check_bytes(self.region.records.len())
        };
        if let Err(error) = fits {
            self.region.records.resize(start, 0);
            return Err(error);
        }
        self.region.commit(start, record.enqueue_time_ms);
        Ok(())
    }

    /// Writes the header (base offset and epoch zero, timestamps from the
    /// records' `enqueue_time_ms`) and returns the finished batch.
    ///
    /// # Errors
    /// [`WireError::EmptyBatch`] when no record was pushed.
    pub fn finish(&self) -> Result<BatchBytes, WireError> {
        self.region.finish(BatchKind::Data, 0)
    }

    /// Forgets every record, keeping the allocation for the next batch.
    pub fn clear(&mut self) {
        self.region.records.clear();
        self.region.entries.clear();
    }
}

/// Builds a control batch: opaque event records (the queue state machine's
/// fixed-size little-endian structs) in the same layout as data batches, so
/// the log stores, frames and checks both alike.
///
/// ```
/// use spool_wire::batch::{BatchKind, BatchView, ControlBatchBuilder};
///
/// let mut builder = ControlBatchBuilder::new();
/// builder.push(1_000, &42u64.to_le_bytes())?;
/// let bytes = builder.finish()?;
/// let view = BatchView::validate(&bytes)?;
/// assert_eq!(view.header().kind, BatchKind::Control);
/// assert_eq!(view.control_record(0), &42u64.to_le_bytes());
/// # Ok::<(), spool_wire::WireError>(())
/// ```
#[derive(Debug, Default)]
pub struct ControlBatchBuilder {
    region: Region,
}

impl ControlBatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.region.entries.len()
    }

    /// Whether no record has been pushed.
    pub fn is_empty(&self) -> bool {
        self.region.entries.is_empty()
    }

    /// Size the batch would have if finished now, header included.
    pub fn encoded_len_bytes(&self) -> usize {
        self.region.encoded_len_bytes()
    }

    /// Appends one event, stamped `timestamp_ms` (the state machine's `now`;
    /// it feeds the header's first/max timestamps). On error the builder is
    /// unchanged.
    ///
    /// # Errors
    /// [`WireError::BadControlRecordLength`] for an empty event or one over
    /// [`CONTROL_RECORD_BYTES_MAX`]; [`WireError::BatchRecordsFull`] /
    /// [`WireError::BatchBytesFull`] when it does not fit this batch.
    pub fn push(&mut self, timestamp_ms: u64, event: &[u8]) -> Result<(), WireError> {
        if event.is_empty() || event.len() > CONTROL_RECORD_BYTES_MAX {
            return Err(WireError::BadControlRecordLength { len_bytes: event.len() });
        }
        self.region.push_encoded(event, timestamp_ms)
    }

    /// Writes the header (kind Control, base offset and epoch zero) and
    /// returns the finished batch.
    ///
    /// # Errors
    /// [`WireError::EmptyBatch`] when no event was pushed.
    pub fn finish(&self) -> Result<BatchBytes, WireError> {
        self.region.finish(BatchKind::Control, 0)
    }

    /// [`ControlBatchBuilder::finish`] into `out` (cleared first), so a
    /// caller that builds many batches reuses one buffer.
    ///
    /// # Errors
    /// [`WireError::EmptyBatch`] when no event was pushed.
    pub fn finish_into(&self, out: &mut BatchBytes) -> Result<(), WireError> {
        self.region.finish_into(BatchKind::Control, 0, out)
    }

    /// Bytes the builder holds for records and their entries (its capacity,
    /// not its contents): lets an owner that reuses it bound what it keeps.
    pub fn capacity_bytes(&self) -> usize {
        self.region.records.capacity()
            + self.region.entries.capacity() * std::mem::size_of::<(u32, u32)>()
    }

    /// Forgets every event, keeping the allocation for the next batch.
    pub fn clear(&mut self) {
        self.region.records.clear();
        self.region.entries.clear();
    }
}
