//! Record batches: the unit the producer sends, the log appends and the
//! consumer receives. The same bytes travel on the wire and sit on disk.
//!
//! This module owns the batch layout, its builders ([`DataBatchBuilder`],
//! [`ControlBatchBuilder`]) and its readers ([`BatchView`]). It does no I/O,
//! assigns no offsets (the broker stamps them with [`BatchHeader::assign`])
//! and interprets no control events (the queue state machine does).
//!
//! # Layout
//!
//! ```text
//! offset                 size        contents
//! 0                      64          header (see `header.rs`: magic, kind, batch_len,
//!                                    crcs, base_offset, epoch, record_count, timestamps)
//! 64                     8 × count   position table: (u32 position, u32 len) LE per record,
//!                                    position counted from the batch start
//! 64 + 8 × count         len_0       record 0, then zero padding to a multiple of 8
//! align8(end of rec 0)   len_1       record 1, zero padding
//! ...                                batch_len = align8(end of the last record)
//! ```
//!
//! Each data record is a [`Record`] **archived on its own** with rkyv, so any
//! subset of a batch is a set of byte slices ([`BatchView::subset_slices`])
//! that a receiver reads in place; no whole-batch archive has to be
//! re-encoded. Control records are opaque event bytes in the same places.
//! The layout is canonical (each record starts exactly at the padded end of
//! the one before), so validation checks equalities, not ranges.
//!
//! # Trust
//!
//! Untrusted bytes: [`BatchView::validate`] (both crcs, layout, checked rkyv
//! access of every record, semantic limits). Bytes read back from the
//! broker's own disk: `unsafe` [`BatchView::trusted`] (crcs and layout, then
//! unchecked access). crc32c is the integrity check; rkyv's bytecheck only
//! guarantees memory safety.
//!
//! # Example
//!
//! ```
//! use spool_wire::batch::{
//!     validate_record, BatchBytes, BatchHeader, BatchView, DataBatchBuilder, HeaderField,
//!     MessageId, Payload, PayloadRef, Record,
//! };
//!
//! let record = |n: u8| Record {
//!     message_id: MessageId([n; 16]),
//!     routing_key: vec![b'k', n],
//!     headers: vec![HeaderField { key: b"trace".to_vec(), value: vec![n] }],
//!     payload: if n % 2 == 0 {
//!         Payload::Inline(vec![n; 100])
//!     } else {
//!         Payload::Reference(PayloadRef {
//!             location: format!("s3://bucket/{n}"),
//!             len_bytes: 10 << 20,
//!             digest: [n; 32],
//!         })
//!     },
//!     priority: n % 4,
//!     not_before_ms: 0,
//!     expiry_ms: 0,
//!     enqueue_time_ms: 1_000 + u64::from(n),
//! };
//!
//! // Producer: build.
//! let mut builder = DataBatchBuilder::new();
//! for n in 0..10 {
//!     builder.push(&record(n))?;
//! }
//! let mut bytes = builder.finish()?;
//!
//! // Broker: validate once on arrival, then stamp offsets.
//! assert_eq!(BatchView::validate(&bytes)?.len(), 10);
//! BatchHeader::assign(&mut bytes, 500, 1);
//!
//! // Later, from its own disk: crc + layout only.
//! // SAFETY: these bytes passed `validate` above and were only re-stamped.
//! let view = unsafe { BatchView::trusted(&bytes)? };
//! assert_eq!(view.header().base_offset, 500);
//! assert_eq!(view.record(3), &record(3));
//!
//! // A claim takes records 2 and 7: serve slices, no re-encoding.
//! let mut slices = Vec::new();
//! view.subset_slices(&[2, 7], &mut slices)?;
//! let mut received = BatchBytes::new(); // receivers read into aligned buffers
//! received.extend_from_slice(slices[1]);
//! assert_eq!(validate_record(&received)?, &record(7));
//! # Ok::<(), spool_wire::WireError>(())
//! ```

mod builder;
mod header;
mod record;
mod view;

pub use builder::{BatchBytes, ControlBatchBuilder, DataBatchBuilder};
pub use header::{
    write_filler, BatchHeader, BatchKind, BATCH_FLAGS_KNOWN, BATCH_FLAG_SUBSET,
    BATCH_FORMAT_VERSION, BATCH_MAGIC, FILLER_WATERMARK_NONE,
};
pub use record::{
    ArchivedHeaderField, ArchivedMessageId, ArchivedPayload, ArchivedPayloadRef, ArchivedRecord,
    HeaderField, MessageId, Payload, PayloadRef, Record,
};
pub use view::{validate_record, BatchView};
