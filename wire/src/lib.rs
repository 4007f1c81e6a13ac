//! Spool's wire and disk formats.
//!
//! This crate owns every byte layout that leaves a process: the record batch
//! (the same bytes travel on the wire and sit in segment files), and the named
//! limits that bound them. It does no I/O and knows nothing of the broker:
//! everything here is a pure function of its input bytes, so clients in other
//! processes and the broker agree by construction.
//!
//! Untrusted bytes enter through [`batch::BatchView::validate`], which checks
//! the crc32c, every length and every record (checked rkyv access) once and
//! never panics. Bytes the broker reads back from its own disk are checked by
//! crc only ([`batch::BatchHeader::verify`]).

pub mod batch;
pub mod codes;
pub mod error;
pub mod limits;
pub mod proto;

pub use codes::ErrorCode;
pub use error::WireError;
