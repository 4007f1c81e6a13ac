//! The shard journal: one write-ahead journal per shard for the entries of
//! every partition it owns (`docs/design/shard-journal.md`).
//!
//! What it owns: the files under its directory (pre-zeroed, fixed-size,
//! named by the journal position of their byte 0, overwritten in place and
//! never extended), the assignment of journal positions, the commit cycle
//! with its two lanes — control entries ahead of data — and the meaning of
//! "durable" (a [`JournalTicket`] resolves only when its commit and every
//! commit before it are fdatasynced), and recovery with the watermark rule.
//! What it does not do: know what a partition, an offset or an event is
//! (payloads are record batches it only crc-checks), read a clock, or name a
//! runtime — it is generic over [`crate::io::Storage`].
//!
//! Driving it: [`Journal::open`] recovers the directory from a start
//! position, handing every intact entry to a [`RecoverySink`]; the owner
//! then polls [`Journal::background`] (committers and the file preparer)
//! until [`Journal::close`] or a fatal I/O error.
//!
//! Reading: [`Journal::read`] / [`Journal::read_entries`] return a durable
//! entry's batch by journal position (`read.rs`: from the read cache of
//! recent commits, else the file; what reads are served from, the appender
//! holds: `read_cache.rs`).
//!
//! Releasing: [`Journal::release_below`] removes the files wholly below a
//! position the owner no longer needs (`retention.rs`).
//!
//! The partition side (`docs/design/shard-journal.md` §12), on top of the
//! journal and still unaware of queues: [`ShardJournal`] (one per shard:
//! the journal and the [`HandlesTable`], `shard.rs`, `handles.rs`),
//! [`JournalPartition`] (a partition's dense data-only offsets, index,
//! durable offset, reads and replay, `partition.rs`; where its entries lie,
//! retention and relocated copies, `partition_release.rs`; a replicated
//! log, `replicate.rs`) and [`RecoveryRouter`] (recovery's entries routed
//! by handle into per-partition position lists, `route.rs`).

mod appender;
mod config;
mod entry;
mod entry_log;
mod error;
mod handles;
mod install;
mod layout;
mod limits;
mod partition;
mod partition_release;
mod prepare;
mod read;
mod read_cache;
mod recovery;
mod replicate;
mod retention;
mod route;
mod shard;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

pub use appender::{CommitObserver, EntryMeta, Journal, JournalStats, WitnessDelay};
pub use config::{
    JournalConfig, JournalConfigError, CONTROL_COMMIT_BYTES_DEFAULT, CONTROL_PENDING_BYTES_DEFAULT,
    DATA_PENDING_BYTES_DEFAULT, JOURNAL_COMMIT_BYTES_DEFAULT, JOURNAL_FILE_BYTES_DEFAULT,
    JOURNAL_FILE_BYTES_MAX, JOURNAL_FILE_BYTES_MIN, JOURNAL_INFLIGHT_COMMITS_DEFAULT,
    JOURNAL_READ_CACHE_BYTES_DEFAULT, JOURNAL_READ_CACHE_BYTES_MAX, LANE_PENDING_BYTES_MAX,
};
pub use entry::{
    check_payload, decode_entry, write_filler, Entry, EntryError, EntryHeader, HeaderForm, Marker,
    ENTRY_ALIGN, ENTRY_BYTES_MAX, ENTRY_HEADER_BYTES, ENTRY_MAGIC, FILLER_PARTITION, MARKER_COMMIT,
    MARKER_TRUNCATE, V1_HEADER_BYTES, V1_MAGIC,
};
pub use entry_log::{Cancelled, LogMode};
pub use error::{JournalDamage, JournalError};
pub use handles::{HandleTarget, HandlesTable, HANDLES_FILE_NAME, HANDLES_MAX, HANDLES_TEMP_NAME};
pub use install::JournalInstall;
pub use layout::{
    commit_span, journal_file_path, oldest_journal_file, parse_journal_file_name,
    JOURNAL_FILE_SUFFIX, JOURNAL_PREPARED_NAME,
};
pub use partition::{JournalAppended, JournalPartition, LogFloor};
pub use recovery::{RecoveredEntry, RecoveryReport, RecoverySink};
pub use replicate::IndexedEntry;
pub use retention::Released;
pub use route::{
    rebuild_index, settle_installs, JournalIndexEntry, RecoveredLog, RecoveryRouter, Routed,
    RoutedEntry,
};
pub use shard::{ShardJournal, ShardRecovery, JOURNAL_DIR_NAME};

/// A byte position in the shard's journal (private to the broker: clients
/// see partition offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct JournalPos(pub u64);

impl fmt::Display for JournalPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A partition's shard-local handle, stable for the partition's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PartitionHandle(pub u32);

impl fmt::Display for PartitionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Which queue of the commit cycle an entry waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Claims, extends, releases, acks, markers: every cycle takes all of
    /// them (up to `control_commit_bytes`) before any data.
    Control,
    /// Enqueued batches: up to `commit_bytes` per cycle, after control.
    Data,
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Control => "control",
            Self::Data => "data",
        })
    }
}

#[derive(Clone, Debug)]
enum EntryStatus {
    Pending,
    Durable,
    Failed(std::rc::Rc<str>),
}

/// Completion state of one appended entry.
#[derive(Debug)]
struct EntryCell {
    status: RefCell<EntryStatus>,
    /// Set when a commit takes the entry.
    position: Cell<Option<u64>>,
    commit_seq: Cell<Option<u64>>,
    wakers: RefCell<Vec<Waker>>,
    /// Someone waits for this entry: appended with [`Journal::append`]
    /// (not [`Journal::append_deferred`]), or its ticket is awaited.
    wanted: Cell<bool>,
    /// The appender's count of queued entries someone waits for, and the
    /// committers' signal ([`Journal::set_commit_delay`]).
    wants: std::rc::Rc<Wants>,
}

/// Queued (not yet taken) entries someone waits for, and the committers'
/// work signal, told when a queued entry becomes wanted: while the count is
/// zero and a commit delay is set, a cycle of deferred entries only may be
/// held ([`Journal::set_commit_delay`]).
#[derive(Debug, Default)]
pub(super) struct Wants {
    pub(super) queued: Cell<usize>,
    pub(super) work: crate::log::wakers::Notify,
}

impl EntryCell {
    fn new(wants: std::rc::Rc<Wants>, wanted: bool) -> std::rc::Rc<Self> {
        if wanted {
            wants.queued.set(wants.queued.get() + 1);
        }
        std::rc::Rc::new(Self {
            status: RefCell::new(EntryStatus::Pending),
            position: Cell::new(None),
            commit_seq: Cell::new(None),
            wakers: RefCell::new(Vec::new()),
            wanted: Cell::new(wanted),
            wants,
        })
    }

    /// Marks a queued entry wanted (its ticket is awaited): the committers
    /// take its cycle at once. No effect once taken or resolved.
    fn want(&self) {
        let queued =
            self.position.get().is_none() && matches!(*self.status.borrow(), EntryStatus::Pending);
        if queued && !self.wanted.replace(true) {
            self.wants.queued.set(self.wants.queued.get() + 1);
            self.wants.work.notify_all();
        }
    }

    /// A commit took the entry: it no longer counts as queued.
    fn taken(&self) {
        if self.wanted.get() {
            self.wants.queued.set(self.wants.queued.get().saturating_sub(1));
        }
    }

    fn resolve(&self, status: EntryStatus) {
        {
            let mut current = self.status.borrow_mut();
            if !matches!(*current, EntryStatus::Pending) {
                return;
            }
            *current = status;
        }
        for waker in std::mem::take(&mut *self.wakers.borrow_mut()) {
            waker.wake();
        }
    }
}

/// Resolves when the appended entry and everything before it in the journal
/// is durable, or fails if the journal failed first. Cheap to clone.
#[derive(Clone, Debug)]
pub struct JournalTicket {
    cell: std::rc::Rc<EntryCell>,
}

impl JournalTicket {
    /// `Some(Ok)` once durable, `Some(Err)` once failed, `None` while pending.
    pub fn status(&self) -> Option<Result<(), JournalError>> {
        match &*self.cell.status.borrow() {
            EntryStatus::Pending => None,
            EntryStatus::Durable => Some(Ok(())),
            EntryStatus::Failed(reason) => Some(Err(JournalError::Failed(reason.to_string()))),
        }
    }

    /// The entry's journal position, once a commit took it.
    pub fn position(&self) -> Option<JournalPos> {
        self.cell.position.get().map(JournalPos)
    }

    /// The number of the commit cycle that took the entry (1 = the first
    /// commit built since open), once one did.
    pub fn commit_seq(&self) -> Option<u64> {
        self.cell.commit_seq.get()
    }

    /// Waits until the entry is durable.
    ///
    /// # Errors
    /// [`JournalError::Failed`] when a write, sync or roll failed first: the
    /// entry was never acknowledged and may or may not be on disk.
    /// An entry held back by the commit delay is taken at once: someone
    /// waits for it now.
    pub fn durable(&self) -> TicketWait<'_> {
        self.cell.want();
        TicketWait { ticket: self }
    }
}

pub struct TicketWait<'a> {
    ticket: &'a JournalTicket,
}

impl Future for TicketWait<'_> {
    type Output = Result<(), JournalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.ticket.status() {
            Some(result) => Poll::Ready(result),
            None => {
                let mut wakers = self.ticket.cell.wakers.borrow_mut();
                if !wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
                    wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}
