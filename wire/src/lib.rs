//! Spool's wire and disk formats.
//!
//! This crate owns every byte layout that leaves a process: the record batch
//! (the same bytes travel on the wire and sit in segment files), and the named
//! limits that bound them ([`limits`]), and the routing hash every producer
//! places keys with ([`routing`]). It does no I/O and knows nothing of the
//! broker: everything here is a pure function of its input bytes, so clients
//! in other processes and the broker agree by construction.
//!
//! A batch is a 64-byte header, a position table of `(u32 position, u32 len)`
//! entries, then the records, each starting on a multiple of 8 bytes and, for
//! data batches, archived on its own with rkyv (see [`batch`] for the full
//! layout):
//!
//! ```text
//! [ header 64 | table 8×n | rec 0 | pad | rec 1 | pad | ... | rec n-1 | pad ]
//! ```
//!
//! Untrusted bytes enter through [`batch::BatchView::validate`], which checks
//! both crc32c checksums, the layout and every record (checked rkyv access and
//! the record limits) once and never panics. Bytes the broker reads back from
//! its own disk go through `unsafe` [`batch::BatchView::trusted`]: crc and
//! layout only, then unchecked access.
//!
//! ```
//! use spool_wire::batch::{BatchView, DataBatchBuilder, MessageId, Payload, Record};
//!
//! let mut builder = DataBatchBuilder::new();
//! for n in 0..3u8 {
//!     builder.push(&Record {
//!         message_id: MessageId([n; 16]),
//!         routing_key: b"orders".to_vec(),
//!         headers: Vec::new(),
//!         payload: Payload::Inline(vec![n; 32]),
//!         priority: 1,
//!         not_before_ms: 0,
//!         expiry_ms: 0,
//!         enqueue_time_ms: 10 + u64::from(n),
//!     })?;
//! }
//! let bytes = builder.finish()?;
//! let view = BatchView::validate(&bytes)?;
//! assert_eq!(view.header().max_timestamp_ms, 12);
//! let ids: Vec<u8> = view.records().map(|record| record.message_id.0[0]).collect();
//! assert_eq!(ids, [0, 1, 2]);
//! # Ok::<(), spool_wire::WireError>(())
//! ```

pub mod batch;
pub mod codes;
pub mod error;
pub mod limits;
pub mod proto;
pub mod routing;

pub use codes::ErrorCode;
pub use error::WireError;
