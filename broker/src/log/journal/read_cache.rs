//! What a journal's reads are served from, as plain data: the table of its
//! files, each opened on its first read ([`FileSlot`]), the recent durable
//! commits kept in memory ([`CachedCommit`]) and the chunks of files read
//! and kept for the reads that follow ([`ReadChunk`]).
//!
//! The appender holds these in its state and fills them (a roll lists its
//! new file, a durable commit enters the cache); `read.rs` serves reads
//! from them and keeps chunks; `retention.rs` drops what a release
//! removes. This module must not do I/O, decide what is kept or evicted,
//! or name the appender or the reader: both depend on it, not it on them.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use spool_wire::batch::BatchHeader;

use crate::log::SharedBytes;

/// A journal file as reads see it.
pub(super) struct FileSlot<F> {
    pub path: PathBuf,
    pub file: Option<Rc<F>>,
    /// Its length, when known (a file recovery found before the newest
    /// ends where the next begins).
    pub len_bytes: Option<u64>,
}

/// A durable commit kept in memory: its pages as written.
pub(super) struct CachedCommit<B> {
    pub pos: u64,
    pub buf: Rc<B>,
}

/// A chunk of a journal file as read, and how much of it was durable then.
#[derive(Clone)]
pub(crate) struct ReadChunk {
    /// Journal position of its first byte.
    pub(super) pos: u64,
    /// Entries ending past this were not durable when it was read: they are
    /// read again, not served from these bytes.
    pub(super) valid_end: u64,
    pub(super) bytes: SharedBytes,
    /// The entries of these bytes whose payload passed `check_payload`
    /// (crcs included), by offset in the chunk, sorted, with the header the
    /// check returned: a chunk kept for later reads checks each entry once,
    /// not once per read that takes a record from it (a backlog's claims
    /// take a few records of the same batch each). Shared by the clones.
    pub(super) checked: Rc<RefCell<Vec<(usize, BatchHeader)>>>,
}

impl ReadChunk {
    /// The header an earlier check of the entry at `off` returned.
    pub(super) fn checked_at(&self, off: usize) -> Option<BatchHeader> {
        let checked = self.checked.borrow();
        let at = checked.binary_search_by_key(&off, |&(entry, _)| entry).ok()?;
        Some(checked[at].1)
    }

    /// Records that the entry at `off` passed its check.
    pub(super) fn note_checked(&self, off: usize, header: BatchHeader) {
        let mut checked = self.checked.borrow_mut();
        if let Err(at) = checked.binary_search_by_key(&off, |&(entry, _)| entry) {
            checked.insert(at, (off, header));
        }
    }
}
