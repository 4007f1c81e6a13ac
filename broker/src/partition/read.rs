//! Reading records back for a request (claim, peek, record): one read ahead
//! per cache miss, sized to the records still to serve, and each record
//! served as a range of the batch the log holds (no copy).

use std::collections::BTreeMap;

use spool_wire::batch::{BatchBytes, BatchHeader, BatchKind, BatchView};
use spool_wire::WireError;

use super::{
    to_log, Partition, PartitionError, READ_AHEAD_BYTES_MAX, READ_AHEAD_RECORD_SLACK_BYTES,
};
use crate::io::Storage;
use crate::log::SharedBytes;
use crate::queue::{Delivery, Lane, MessageView, Offset};

/// One claimed message and its record bytes (exactly as the producer sent
/// them, 8-aligned rkyv archive).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery: Delivery,
    /// The record, as a range of the batch the log holds it in (no copy).
    pub record: SharedBytes,
}

/// A live message and its record bytes, for peeks.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub view: MessageView,
    pub record: Vec<u8>,
}

/// Bytes that are 8-aligned in memory (rkyv's archived types need it):
/// borrowed when they already are, copied into an aligned buffer otherwise.
pub(super) enum Aligned<'a> {
    Borrowed(&'a [u8]),
    Owned(BatchBytes),
}

impl std::ops::Deref for Aligned<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Aligned::Borrowed(bytes) => bytes,
            Aligned::Owned(bytes) => bytes,
        }
    }
}

pub(super) fn aligned(bytes: &[u8]) -> Aligned<'_> {
    if (bytes.as_ptr() as usize).is_multiple_of(8) {
        Aligned::Borrowed(bytes)
    } else {
        let mut copy = BatchBytes::with_capacity(bytes.len());
        copy.extend_from_slice(bytes);
        Aligned::Owned(copy)
    }
}

/// Data batches read back for one request, each with the byte range of
/// every record, so serving a record copies only that record.
#[derive(Default)]
struct BatchCache {
    /// Base offset → batch.
    batches: BTreeMap<u64, CachedBatch>,
}

/// Bytes one log read of a request may cover: the records (offset, size)
/// it still serves at or past `from`, plus their framing and the control
/// batches interleaved with them, at most `READ_AHEAD_BYTES_MAX`. Never
/// below 1 (the log returns at least the batch holding `from`).
fn read_ahead_bytes(from: Offset, remaining: impl Iterator<Item = (Offset, u32)>) -> u64 {
    let records: u64 = remaining
        .filter(|(offset, _)| *offset >= from)
        .map(|(_, size_bytes)| u64::from(size_bytes) + READ_AHEAD_RECORD_SLACK_BYTES)
        .sum();
    (records + records / 4).clamp(1, READ_AHEAD_BYTES_MAX)
}

struct CachedBatch {
    next_offset: u64,
    bytes: SharedBytes,
    /// (start, len) of each record inside `bytes`.
    records: Vec<(usize, usize)>,
}

impl CachedBatch {
    /// Indexes a batch the log read back and crc-checked (`header` is what
    /// its check returned), without checking the crcs a second time.
    fn new(bytes: SharedBytes, header: &BatchHeader) -> Result<Option<Self>, WireError> {
        if header.kind != BatchKind::Data {
            return Ok(None);
        }
        let records = {
            let view_bytes = aligned(&bytes);
            let view = verified_view(&view_bytes, header)?;
            let start = view_bytes.as_ptr() as usize;
            view.record_slices()
                .map(|slice| (slice.as_ptr() as usize - start, slice.len()))
                .collect()
        };
        Ok(Some(Self { next_offset: header.next_offset(), bytes, records }))
    }
}

/// A view of a batch this broker wrote and the log has just read back and
/// crc-checked: `header` is the log's verified header of exactly these bytes
/// (a `ReadBatch`), so the crcs are not computed a second time.
pub(super) fn verified_view<'a>(
    bytes: &'a [u8],
    header: &BatchHeader,
) -> Result<BatchView<'a>, WireError> {
    // SAFETY: the bytes come from this partition's own log. Data batches
    // passed `BatchView::validate` (checked rkyv access of every record)
    // before they were appended, control batches were built by this broker,
    // and `Log::read` returns each batch's bytes with the header that
    // `BatchHeader::verify` (both crcs) produced for those very bytes, so
    // they are the bytes that were validated.
    unsafe { BatchView::trusted_verified(bytes, header) }
}

impl<S: Storage + Clone> Partition<S> {
    /// Reads the record bytes of each delivery from the log.
    pub(super) async fn with_records(
        &self,
        deliveries: Vec<Delivery>,
    ) -> Result<Vec<Claimed>, PartitionError> {
        let records =
            self.records_of(&deliveries, |delivery| (delivery.offset, delivery.size_bytes)).await?;
        Ok(deliveries
            .into_iter()
            .zip(records)
            .map(|(delivery, record)| Claimed { delivery, record })
            .collect())
    }

    /// The record bytes of each item, `locate` giving its (offset, size).
    ///
    /// An item whose batch is not yet in this request's cache reads ahead:
    /// one log read sized to the records still to serve at or past its
    /// offset (`read_ahead_bytes`, computed on a miss only), so a claim of a
    /// few hundred consecutive messages from the backlog is one or two reads
    /// of the segment file instead of one per batch, each of which scanned
    /// forward from the sparse index again.
    async fn records_of<T>(
        &self,
        items: &[T],
        locate: impl Fn(&T) -> (Offset, u32),
    ) -> Result<Vec<SharedBytes>, PartitionError> {
        let mut cache = BatchCache::default();
        let mut out = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let (offset, _) = locate(item);
            let ahead = || read_ahead_bytes(offset, items[index..].iter().map(&locate));
            out.push(self.record_bytes(offset, ahead, &mut cache).await?);
        }
        Ok(out)
    }

    /// The bytes of the data record at `offset`, reading its batch into
    /// `cache` unless an earlier lookup of this request did.
    async fn record_bytes(
        &self,
        offset: Offset,
        read_ahead: impl FnOnce() -> u64,
        cache: &mut BatchCache,
    ) -> Result<SharedBytes, PartitionError> {
        let missing = |reason: &'static str| PartitionError::ReadMiss {
            dir: self.dir.clone(),
            offset,
            reason,
        };
        let hit = cache
            .batches
            .range(..=offset.0)
            .next_back()
            .filter(|(_, batch)| batch.next_offset > offset.0)
            .map(|(base, _)| *base);
        let base = match hit {
            Some(base) => base,
            None => {
                let read = self.log.read(to_log(offset), read_ahead()).await?;
                let mut found = None;
                for batch in read {
                    let base = batch.header.base_offset;
                    let holds_offset = base <= offset.0 && batch.header.next_offset() > offset.0;
                    // Control batches read on the way are skipped; the one
                    // holding `offset` must be data.
                    match CachedBatch::new(batch.bytes, &batch.header)? {
                        Some(cached) => {
                            cache.batches.insert(base, cached);
                            if holds_offset {
                                found = Some(base);
                            }
                        }
                        None if holds_offset => {
                            return Err(missing("not a data record"));
                        }
                        None => {}
                    }
                }
                found.ok_or_else(|| missing("no record there in the log"))?
            }
        };
        let batch =
            cache.batches.get(&base).ok_or_else(|| missing("its batch left the read cache"))?;
        let index = (offset.0 - base) as usize;
        let (start, len) =
            *batch.records.get(index).ok_or_else(|| missing("past the end of its batch"))?;
        Ok(batch.bytes.slice(start..start + len))
    }

    /// The record bytes of the live message at `offset` (either lane).
    ///
    /// # Errors
    /// Storage failure, or no data record at `offset`.
    pub async fn record(&self, offset: Offset) -> Result<Vec<u8>, PartitionError> {
        let barrier = self.appends.borrow().barrier();
        barrier.durable().await?;
        let record = self.record_bytes(offset, || 1, &mut BatchCache::default()).await?;
        Ok(record.to_vec())
    }

    /// Live messages of the main lane from `from`, up to `max`, with their
    /// record bytes. Changes nothing.
    ///
    /// # Errors
    /// Storage failure reading a record.
    pub async fn peek(&self, from: Offset, max: usize) -> Result<Vec<Peeked>, PartitionError> {
        let views: Vec<MessageView> = self
            .state
            .borrow()
            .messages()
            .into_iter()
            .filter(|view| view.lane == Lane::Main && view.offset >= from)
            .take(max)
            .collect();
        // Records are readable once durable; wait for everything appended.
        let barrier = self.appends.borrow().barrier();
        barrier.durable().await?;
        let records = self.records_of(&views, |view| (view.offset, view.size_bytes)).await?;
        Ok(views
            .into_iter()
            .zip(records)
            .map(|(view, record)| Peeked { view, record: record.to_vec() })
            .collect())
    }
}
