//! Errors of the pure codecs. These describe what is wrong with some bytes;
//! the broker maps them onto stable wire error codes.

use thiserror::Error;

/// Everything that can be wrong with bytes handed to this crate.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad batch magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported batch format version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown batch kind {0}")]
    UnknownBatchKind(u16),
    #[error("bad batch length {0}")]
    BadBatchLength(u32),
    #[error("batch header crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrcMismatch { stored: u32, computed: u32 },
    #[error("batch body crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyCrcMismatch { stored: u32, computed: u32 },
}
