//! The partition log: one directory of pre-zeroed segment files holding
//! record batches, with group commit, a sparse index, recovery and retention.
//!
//! What it owns: every byte under a partition directory, the assignment of
//! offsets, and the meaning of "durable" (a [`Ticket`] resolves only when its
//! batch and every batch before it are fdatasynced). What it does not do:
//! decide what to append (the queue state machine does), read a clock, or
//! name a runtime — it is generic over [`crate::io::Storage`], so the same
//! code runs on O_DIRECT files and on the crash simulator.
//!
//! Driving it: [`Log::open`] recovers the directory; the owner then spawns
//! (or polls) the single future returned by [`Log::background`], which runs
//! the committers (one per in-flight commit slot) and the segment preparer
//! until [`Log::close`] (after draining) or a fatal I/O error.
//!
//! Files: `handle.rs` ([`Log`]: open, background, close, stats),
//! `gather.rs` (append: offsets and the commit being gathered),
//! `committer.rs` (write, sync, the durable watermark, the tail cache),
//! `preparer.rs` (the next segment, sealed indexes), `state.rs` (what those
//! share), `disk.rs` (file operations the appender and recovery share),
//! `recovery.rs`, `reader.rs`, `retention.rs`, `index.rs`, `layout.rs`,
//! `window.rs`, `shared.rs` ([`SharedBytes`]), `sync.rs` (the wake-up
//! primitive).
//!
//! Layout, commit protocol and crash cases: `docs/design/segment-format.md`.

mod committer;
mod config;
mod disk;
mod error;
mod gather;
mod handle;
mod index;
pub mod journal;
mod layout;
mod preparer;
mod reader;
mod recovery;
mod reserve;
mod retention;
mod shared;
mod state;
pub(crate) mod sync;
mod window;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

pub use config::{ConfigError, LogConfig};
pub(crate) use disk::failpoint;
pub use error::{CorruptDetail, LogError};
pub use handle::Log;
pub use index::{IndexEntry, ResumePoint, SparseIndex};
pub use layout::{commit_span, index_path, segment_path, PREPARED_FILE_NAME};
pub use reserve::{reserve_claim_of, reserve_page, RESERVE_FILE_NAME};
pub use shared::SharedBytes;

/// Makes the future a witness (page of the segment log, entry of the shard
/// journal) waits for before it is built, once the committers went idle:
/// a commit built meanwhile vouches instead ([`Log::set_witness_delay`],
/// [`journal::Journal::set_witness_delay`]). The log reads no clock; the
/// broker makes a timer of `WITNESS_DELAY_MS`. The segment log's commit
/// delay ([`Log::set_commit_delay`]) is made the same way.
pub type WitnessDelay = std::rc::Rc<dyn Fn() -> DelayFuture>;

/// One delay a [`WitnessDelay`] made.
pub type DelayFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// The commit delay of a held commit — a segment log's gather, a shard
/// journal's cycle — by the seq that commit has or will get: made on the
/// first wait and kept across the waiting committer's wake-ups, so appends
/// meanwhile do not restart it ([`Log::set_commit_delay`],
/// [`journal::Journal::set_commit_delay`]).
#[derive(Default)]
pub(crate) struct HeldDelay {
    delay: RefCell<Option<WitnessDelay>>,
    running: RefCell<Option<(u64, DelayFuture)>>,
}

impl HeldDelay {
    pub(crate) fn set(&self, delay: WitnessDelay) {
        *self.delay.borrow_mut() = Some(delay);
    }

    /// Whether a delay is set (without one nothing is held).
    pub(crate) fn is_set(&self) -> bool {
        self.delay.borrow().is_some()
    }

    /// Waits for `work` or for the delay of held commit `seq` to run out,
    /// whichever comes first; true when it ran out (or none is set). A
    /// delay that work interrupted goes on at the next wait for `seq`.
    pub(crate) async fn wait(&self, work: &Notify, seq: u64) -> bool {
        let timer = match self.running.borrow_mut().take() {
            Some((running_seq, timer)) if running_seq == seq => Some(timer),
            _ => self.delay.borrow().as_ref().map(|delay| delay()),
        };
        let Some(mut timer) = timer else { return true };
        let ran_out = futures_lite::future::or(
            async {
                work.wait().await;
                false
            },
            async {
                (&mut timer).await;
                true
            },
        )
        .await;
        if !ran_out {
            *self.running.borrow_mut() = Some((seq, timer));
        }
        ran_out
    }

    /// Commit `seq` was taken: its delay is done with.
    pub(crate) fn taken(&self, seq: u64) {
        let mut running = self.running.borrow_mut();
        if running.as_ref().is_some_and(|(running_seq, _)| *running_seq == seq) {
            *running = None;
        }
    }
}

/// Waits for new `work` or for a witness `delay` to run out, whichever
/// comes first; true when the delay ran out (the witness is then due
/// without another wait). Work arriving first ends the wait: its commit
/// vouches instead of the witness.
pub(crate) async fn work_or_witness_delay(work: &sync::Notify, delay: &WitnessDelay) -> bool {
    let timer = delay();
    futures_lite::future::or(
        async {
            work.wait().await;
            false
        },
        async {
            timer.await;
            true
        },
    )
    .await
}
use spool_wire::batch::BatchHeader;
use sync::{Notify, NotifyWait};

/// Position of a record in a partition log: the workspace's one `Offset`
/// (`spool_wire::proto::ids`), the same type the queue and the wire use.
pub use spool_wire::proto::Offset;

/// Why the log (or its partition) stopped. The code doubles as the process
/// exit status in production, through [`crate::fatal`] like every other
/// fatal reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalCode {
    WriteFailed = 70,
    SyncFailed = 71,
    PrepareFailed = 72,
    RollFailed = 73,
    /// A partition side file (checkpoint, epoch) failed its fdatasync or
    /// directory sync; raised by the partition through the same handler.
    SideFileSyncFailed = 74,
}

impl From<FatalCode> for crate::fatal::FatalReason {
    fn from(code: FatalCode) -> Self {
        use crate::fatal::FatalReason;
        match code {
            FatalCode::WriteFailed => FatalReason::LogWrite,
            FatalCode::SyncFailed => FatalReason::LogSync,
            FatalCode::PrepareFailed => FatalReason::LogPrepare,
            FatalCode::RollFailed => FatalReason::LogRoll,
            FatalCode::SideFileSyncFailed => FatalReason::SideFileSync,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatalReason {
    pub code: FatalCode,
    pub message: String,
}

/// Called once when a write or sync fails. There is no in-process answer to
/// a failed fdatasync (the page cache state is unknown; retrying can report
/// success for lost data), so production exits.
pub trait FatalHandler {
    fn fatal(&self, reason: &FatalReason);
}

/// Production handler: exits through [`crate::fatal::fatal`] (logged, with
/// the reason's code), so no sibling shard keeps serving beside a log in an
/// unknown state.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitOnFatal;

impl FatalHandler for ExitOnFatal {
    fn fatal(&self, reason: &FatalReason) {
        crate::fatal::fatal(reason.code.into(), format_args!("log: {}", reason.message));
    }
}

/// Test handler: records every reason.
#[derive(Debug, Default)]
pub struct RecordFatal {
    reasons: RefCell<Vec<FatalReason>>,
}

impl RecordFatal {
    pub fn reasons(&self) -> Vec<FatalReason> {
        self.reasons.borrow().clone()
    }
}

impl FatalHandler for RecordFatal {
    fn fatal(&self, reason: &FatalReason) {
        self.reasons.borrow_mut().push(reason.clone());
    }
}

#[derive(Clone, Debug)]
enum CommitStatus {
    Pending,
    Durable,
    Failed(Rc<str>),
}

/// Shared completion state of one commit; every batch in it holds a ticket.
#[derive(Debug)]
struct CommitCell {
    status: RefCell<CommitStatus>,
    /// Told once, when the status leaves `Pending`.
    resolved: Notify,
    /// Someone waits for this commit: it holds a batch appended with
    /// [`Log::append`] (not [`Log::append_deferred`]), or a ticket of it is
    /// awaited. A commit nobody waits for may be held back by the commit
    /// delay ([`Log::set_commit_delay`]).
    wanted: Cell<bool>,
    /// The committers' work signal, told when the commit becomes wanted.
    work: Rc<Notify>,
}

impl CommitCell {
    fn new(work: Rc<Notify>) -> Rc<Self> {
        Rc::new(Self {
            status: RefCell::new(CommitStatus::Pending),
            resolved: Notify::default(),
            wanted: Cell::new(false),
            work,
        })
    }

    /// Marks the commit wanted; tells the committers the first time.
    fn want(&self) {
        if !self.wanted.replace(true) {
            self.work.notify_all();
        }
    }

    fn resolve(&self, status: CommitStatus) {
        {
            let mut current = self.status.borrow_mut();
            if !matches!(*current, CommitStatus::Pending) {
                return;
            }
            *current = status;
        }
        self.resolved.notify_all();
    }
}

/// Resolves when the appended batch is durable, or fails if the log failed
/// before that. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Ticket {
    commit: Rc<CommitCell>,
}

impl Ticket {
    /// `Some(Ok)` once durable, `Some(Err)` once failed, `None` while pending.
    pub fn status(&self) -> Option<Result<(), LogError>> {
        match &*self.commit.status.borrow() {
            CommitStatus::Pending => None,
            CommitStatus::Durable => Some(Ok(())),
            CommitStatus::Failed(reason) => Some(Err(LogError::Failed(reason.to_string()))),
        }
    }

    /// Waits until the batch is durable.
    ///
    /// # Errors
    /// [`LogError::Failed`] when a write or sync failed first: the batch was
    /// never acknowledged and may or may not be on disk.
    /// A commit held back by the commit delay is taken at once: someone
    /// waits for it now.
    pub fn durable(&self) -> TicketWait<'_> {
        if matches!(*self.commit.status.borrow(), CommitStatus::Pending) {
            self.commit.want();
        }
        TicketWait { ticket: self, resolved: self.commit.resolved.wait() }
    }
}

/// Future of [`Ticket::durable`]: a wait on the commit's [`Notify`], which
/// is told once when the commit resolves; dropping it deregisters.
pub struct TicketWait<'a> {
    ticket: &'a Ticket,
    resolved: NotifyWait<'a>,
}

impl Future for TicketWait<'_> {
    type Output = Result<(), LogError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            if let Some(result) = this.ticket.status() {
                return Poll::Ready(result);
            }
            // The status is set before the notify, so a resolved wait with
            // a pending status is not possible; wait again if it were.
            if Pin::new(&mut this.resolved).poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.resolved = this.ticket.commit.resolved.wait();
        }
    }
}

/// What `append` assigned.
#[derive(Clone, Debug)]
pub struct Appended {
    pub base_offset: Offset,
    /// The offset after this batch's last record.
    pub next_offset: Offset,
    pub ticket: Ticket,
    /// Where the batch waits in the commit being gathered, for
    /// [`Log::replace_gathered`].
    pub slot: GatherSlot,
}

/// A batch's place in the commit being gathered: the commit's sequence
/// number and the batch's byte position in it. Names the batch only while
/// that commit is still open (no committer took it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherSlot {
    seq: u64,
    at: u64,
}

/// One batch read back: its header, and its bytes as a range of the buffer
/// the log holds them in (no copy). Both crcs were checked when the batch
/// was read from a segment file; a batch served from the tail cache is the
/// commit buffer this log built from validated batches, and is not checked
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBatch {
    pub header: BatchHeader,
    pub bytes: SharedBytes,
}

/// What `open` found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Data and control batches found valid (fillers not counted).
    pub batches: u64,
    pub next_offset: Offset,
    /// The log was empty and its first segment was created.
    pub created: bool,
    /// Where the torn tail began, if one was cut.
    pub truncated_at: Option<(PathBuf, u64)>,
    /// Non-zero bytes after the valid end that were zeroed.
    pub truncated_bytes: u64,
    pub indexes_rebuilt: usize,
    pub stale_files_removed: usize,
    /// Sealed segments below the scan bound taken from their index files
    /// without being read (`Log::open_from`); their batches are crc-checked
    /// when read.
    pub segments_trusted: usize,
    /// Segments fdatasynced before the log served (every scanned one), so
    /// nothing recovery kept is answered as durable without a sync.
    pub segments_synced: usize,
    /// The scan of the segment holding the scan bound started at a resume
    /// point (`Log::open_from_resume`): that segment's path and the byte
    /// position the scan started at; the bytes before it were not read.
    pub resumed_at: Option<(PathBuf, u64)>,
    /// A resume point was given for a segment that was scanned, but the
    /// batch at its position did not verify (crc, base offset): that
    /// segment was scanned from its start.
    pub resume_rejected: bool,
    /// Bytes of segment files recovery read: the scans of the batches, the
    /// search for non-zero bytes after them and the torn-tail search (the
    /// repair's one-page read not counted).
    pub scan_bytes_read: u64,
    /// The written-bytes reservation bounded the last segment's search for
    /// non-zero bytes: the search stopped at this file position instead of
    /// the segment's capacity (`None`: no claim for that segment, an old
    /// data directory, or a claim rejected below).
    pub reserve_bound: Option<u64>,
    /// The reservation file claimed a bound for a scanned segment below
    /// the valid batches found in it (a stale or bogus claim): ignored,
    /// that segment was searched to its capacity.
    pub reserve_rejected: bool,
    /// The highest leader epoch in the header of a batch recovery read (0
    /// in an empty log). Trusted segments are not read; the newest batches
    /// always are.
    pub highest_epoch: u32,
}

/// Per-log counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Commits that became durable.
    pub commits: u64,
    /// Data and control batches in those commits (fillers not counted).
    pub batches: u64,
    /// Records (offsets) in those batches: what group commit amortizes a
    /// sync over, which `batches` undercounts for multi-record batches.
    pub records: u64,
    /// Bytes those commits occupy on disk (whole pages, fillers included).
    pub commit_bytes: u64,
    pub segments_rolled: u64,
    /// Witness pages written and synced: one per idle transition after a
    /// commit (`segment-format.md`, "Witness page").
    pub witness_pages: u64,
    /// Writes of the reservation file (each synced): the durable bound of
    /// written bytes extended (`segment-format.md`, "Written-bytes
    /// reservation").
    pub reservations: u64,
}

/// Summary of one segment, for tests and operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: Offset,
    pub next_offset: Offset,
    pub path: PathBuf,
    pub data_end: u64,
    pub index_entries: usize,
}
