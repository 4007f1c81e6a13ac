//! Reading records back for a request (claim, peek, record): one read ahead
//! per cache miss, sized to the records still to serve, and each record
//! served as a range of the batch the log holds (no copy).

use spool_wire::batch::{BatchBytes, BatchHeader, BatchKind, BatchView};
use spool_wire::limits::{BATCH_HEADER_BYTES, POSITION_ENTRY_BYTES};
use spool_wire::WireError;

use super::{
    to_log, Partition, PartitionError, READ_AHEAD_BYTES_MAX, READ_AHEAD_RECORD_SLACK_BYTES,
};
use crate::io::Storage;
use crate::log::SharedBytes;
use crate::queue::{Delivery, MessageView, Offset, SubscriptionId};

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

/// Data batches read back for one request, so serving a record copies
/// nothing. A vector sorted by base offset (reads go forward, so a batch is
/// usually pushed at the end), reused across requests by the partition.
#[derive(Default)]
pub(super) struct BatchCache {
    batches: Vec<CachedBatch>,
}

impl BatchCache {
    /// The batch holding `offset`, if read already.
    fn holding(&self, offset: u64) -> Option<&CachedBatch> {
        let after = self.batches.partition_point(|batch| batch.base_offset <= offset);
        let batch = self.batches.get(after.checked_sub(1)?)?;
        (batch.next_offset > offset).then_some(batch)
    }

    /// Adds a batch (replacing one with the same base offset).
    fn insert(&mut self, batch: CachedBatch) {
        let at = self.batches.partition_point(|held| held.base_offset < batch.base_offset);
        match self.batches.get_mut(at) {
            Some(held) if held.base_offset == batch.base_offset => *held = batch,
            _ => self.batches.insert(at, batch),
        }
    }

    /// Empties it for the next request; `false` when it grew past
    /// `REQUEST_SCRATCH_ENTRIES_MAX` batches (then the caller drops it).
    pub(super) fn recycle(&mut self) -> bool {
        self.batches.clear();
        self.batches.capacity() <= crate::limits::REQUEST_SCRATCH_ENTRIES_MAX
    }
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
    base_offset: u64,
    next_offset: u64,
    bytes: SharedBytes,
}

impl CachedBatch {
    /// Checks the layout of a batch the log read back and crc-checked
    /// (`header` is what its check returned), without checking the crcs a
    /// second time; its records are then found through its position table.
    fn new(bytes: SharedBytes, header: &BatchHeader) -> Result<Option<Self>, WireError> {
        if header.kind != BatchKind::Data {
            return Ok(None);
        }
        {
            let view_bytes = aligned(&bytes);
            verified_view(&view_bytes, header)?;
        }
        Ok(Some(Self { base_offset: header.base_offset, next_offset: header.next_offset(), bytes }))
    }

    /// (start, len) of record `index` inside `bytes`, read from the position
    /// table the layout check accepted (bounds-checked all the same).
    fn record_range(&self, index: usize) -> Option<(usize, usize)> {
        let count = (self.next_offset - self.base_offset) as usize;
        if index >= count {
            return None;
        }
        let entry = BATCH_HEADER_BYTES + index * POSITION_ENTRY_BYTES;
        let word = |at: usize| -> Option<usize> {
            let raw: [u8; 4] = self.bytes.get(at..at + 4)?.try_into().ok()?;
            Some(u32::from_le_bytes(raw) as usize)
        };
        let (start, len) = (word(entry)?, word(entry + 4)?);
        (start.checked_add(len)? <= self.bytes.len()).then_some((start, len))
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
        deliveries: &[Delivery],
    ) -> Result<Vec<Claimed>, PartitionError> {
        self.records_of(
            deliveries,
            |delivery| (delivery.offset, delivery.size_bytes),
            |delivery, record| Claimed { delivery: *delivery, record },
        )
        .await
    }

    /// The record bytes of each item, `locate` giving its (offset, size).
    ///
    /// An item whose batch is not yet in this request's cache reads ahead:
    /// one log read sized to the records still to serve at or past its
    /// offset (`read_ahead_bytes`, computed on a miss only), so a claim of a
    /// few hundred consecutive messages from the backlog is one or two reads
    /// of the segment file instead of one per batch, each of which scanned
    /// forward from the sparse index again.
    ///
    /// The answer is `make(item, record)` for each item: one vector, the
    /// reply's. The batch cache is the partition's reused one (taken for
    /// the request, given back after; a request that runs meanwhile starts
    /// from an empty one).
    async fn records_of<T, R>(
        &self,
        items: &[T],
        locate: impl Fn(&T) -> (Offset, u32),
        make: impl Fn(&T, SharedBytes) -> R,
    ) -> Result<Vec<R>, PartitionError> {
        let mut cache = self.scratch.read.take();
        let mut out = Vec::with_capacity(items.len());
        let mut failed = None;
        for (index, item) in items.iter().enumerate() {
            let (offset, _) = locate(item);
            let ahead = || read_ahead_bytes(offset, items[index..].iter().map(&locate));
            match self.record_bytes(offset, ahead, &mut cache).await {
                Ok(record) => out.push(make(item, record)),
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        if cache.recycle() {
            self.scratch.read.set(cache);
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(out),
        }
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
        let hit = cache.holding(offset.0).map(|batch| batch.base_offset);
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
                            cache.insert(cached);
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
        let batch = cache
            .holding(offset.0)
            .filter(|batch| batch.base_offset == base)
            .ok_or_else(|| missing("its batch left the read cache"))?;
        let index = (offset.0 - base) as usize;
        let (start, len) =
            batch.record_range(index).ok_or_else(|| missing("past the end of its batch"))?;
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

    /// The record bytes of each of `views` (`None` for one that cannot be
    /// read: the listing goes on without it), for a dead-letter page: one
    /// durability barrier and reads ahead over the page, as [`Self::peek`]
    /// (a barrier and a one-record read per letter made a page of a
    /// thousand letters wait for a thousand group commits).
    ///
    /// # Errors
    /// The barrier failed (the log stopped).
    pub async fn records_of_views(
        &self,
        views: &[MessageView],
    ) -> Result<Vec<Option<Vec<u8>>>, PartitionError> {
        let barrier = self.appends.borrow().barrier();
        barrier.durable().await?;
        let mut cache = self.scratch.read.take();
        let mut out = Vec::with_capacity(views.len());
        for (index, view) in views.iter().enumerate() {
            let located = views[index..].iter().map(|view| (view.offset, view.size_bytes));
            let ahead = || read_ahead_bytes(view.offset, located);
            let record = self.record_bytes(view.offset, ahead, &mut cache).await;
            out.push(record.ok().map(|record| record.to_vec()));
        }
        if cache.recycle() {
            self.scratch.read.set(cache);
        }
        Ok(out)
    }

    /// Live messages of subscription `sub`'s main lane from `from`, up to
    /// `max`, with their record bytes (none when the partition's log has
    /// not started the subscription yet). Changes nothing.
    ///
    /// # Errors
    /// Storage failure reading a record.
    pub async fn peek(
        &self,
        sub: SubscriptionId,
        from: Offset,
        max: usize,
    ) -> Result<Vec<Peeked>, PartitionError> {
        let views: Vec<MessageView> =
            self.state.borrow().peek_sub(sub, from, max).unwrap_or_default();
        // Records are readable once durable; wait for everything appended.
        let barrier = self.appends.borrow().barrier();
        barrier.durable().await?;
        self.records_of(
            &views,
            |view| (view.offset, view.size_bytes),
            |view, record| Peeked { view: *view, record: record.to_vec() },
        )
        .await
    }
}
