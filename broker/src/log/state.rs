//! What the appender's parts share: the segments, the commits being
//! gathered, in flight and cached, the log's mutable [`State`], and
//! [`Shared`] (state, configuration and the wake-ups between the parts),
//! with the one way the log enters its failed state.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

use super::config::LogConfig;
use super::index::{IndexEntry, SparseIndex};
use super::layout::commit_span;
use super::reserve::Reservation;
use super::sync::Notify;
use super::{CommitCell, CommitStatus, FatalCode, FatalHandler, FatalReason, LogStats, ReadBatch};
use crate::io::{IoError, Storage, StorageFile};

/// One segment file and what is durable in it.
pub(super) struct Segment<F> {
    pub(super) base: u64,
    pub(super) path: PathBuf,
    /// Bytes the segment may hold (its pre-zeroed length).
    pub(super) capacity: u64,
    /// `None` until the roll gives the prepared file this segment's name.
    pub(super) file: RefCell<Option<Rc<F>>>,
    pub(super) index: RefCell<SparseIndex>,
    /// File position after the last durable commit.
    pub(super) data_end: Cell<u64>,
    /// Offset after the last durable record.
    pub(super) next_offset: Cell<u64>,
}

impl<F> Segment<F> {
    pub(super) fn file(&self) -> Option<Rc<F>> {
        self.file.borrow().clone()
    }
}

/// A commit being gathered or waiting for a committer.
pub(super) struct Gather<F: StorageFile> {
    pub(super) seq: u64,
    pub(super) buf: F::Buf,
    pub(super) data_bytes: u64,
    pub(super) cap_bytes: u64,
    pub(super) pos: u64,
    pub(super) segment: Rc<Segment<F>>,
    /// First commit of a not-yet-named segment: its committer performs the roll.
    pub(super) opens_segment: bool,
    pub(super) first_offset: u64,
    pub(super) next_offset: u64,
    pub(super) batches: u64,
    pub(super) entries: Vec<IndexEntry>,
    pub(super) commit: Rc<CommitCell>,
}

/// A commit handed to a committer and not yet part of the durable prefix.
pub(super) struct Inflight<F: StorageFile> {
    pub(super) synced: bool,
    pub(super) commit: Rc<CommitCell>,
    pub(super) segment: Rc<Segment<F>>,
    pub(super) pos: u64,
    pub(super) end_pos: u64,
    pub(super) first_offset: u64,
    pub(super) next_offset: u64,
    pub(super) entries: Vec<IndexEntry>,
    pub(super) buf: Rc<F::Buf>,
    /// Bytes allocated for `buf` (its length before the trim to the span).
    pub(super) alloc_bytes: u64,
    pub(super) batches: u64,
    /// When a committer took it to write (`spool_shard_commit_duration_seconds`
    /// runs from here to durable).
    pub(super) started: crate::clock::Instant,
}

/// A durable commit kept in memory to serve tail reads.
pub(super) struct Cached<B> {
    pub(super) first_offset: u64,
    pub(super) next_offset: u64,
    pub(super) path: PathBuf,
    pub(super) pos: u64,
    pub(super) buf: Rc<B>,
}

pub(super) struct Job<F: StorageFile> {
    pub(super) seq: u64,
    pub(super) pos: u64,
    pub(super) buf: Rc<F::Buf>,
    pub(super) segment: Rc<Segment<F>>,
    pub(super) opens_segment: bool,
}

/// A witness page handed to a committer: one page holding just a filler
/// whose watermark covers every durable commit, written where the next
/// commit will start (`segment-format.md`, "Witness page").
pub(super) struct WitnessJob<F: StorageFile> {
    pub(super) base: u64,
    pub(super) capacity: u64,
    pub(super) pos: u64,
    pub(super) buf: Rc<F::Buf>,
    pub(super) file: Rc<F>,
}

/// What a committer takes: a commit, or a witness page once they went idle.
pub(super) enum Task<F: StorageFile> {
    Commit(Job<F>),
    Witness(WitnessJob<F>),
}

pub(super) struct State<F: StorageFile> {
    pub(super) failed: Option<Rc<str>>,
    pub(super) closing: bool,
    pub(super) next_offset: u64,
    /// Named segments, oldest first; the last is active.
    pub(super) segments: Vec<Rc<Segment<F>>>,
    pub(super) gather_segment: Rc<Segment<F>>,
    pub(super) gather_pos: u64,
    pub(super) gather_last_index_pos: Option<u64>,
    pub(super) gather_segment_unopened: bool,
    pub(super) open: Option<Gather<F>>,
    pub(super) queued: VecDeque<Gather<F>>,
    pub(super) pending_bytes: u64,
    pub(super) next_seq: u64,
    pub(super) durable_seq: u64,
    pub(super) inflight: BTreeMap<u64, Inflight<F>>,
    pub(super) durable_offset: u64,
    /// The highest durable watermark a filler written (or found at the tail
    /// by recovery) records: when the committers go idle with
    /// `durable_offset` above it, one witness page records it.
    pub(super) witnessed_offset: u64,
    /// A witness page is being written or synced: no commit starts until it
    /// is synced (the next commit reuses its page).
    pub(super) witness_inflight: bool,
    /// A committer waits out the witness delay (only one does).
    pub(super) witness_armed: bool,
    /// The witness delay ran out idle: the page is written without another.
    pub(super) witness_ripe: bool,
    /// A committer waits out the commit delay of the open gather (only one
    /// does; [`super::Log::set_commit_delay`]).
    pub(super) defer_armed: bool,
    /// The gather (by seq) whose commit delay ran out: taken without
    /// another wait.
    pub(super) defer_ripe: Option<u64>,
    /// The written-bytes reservation: no byte of a segment is written at or
    /// past the bound a claim for it makes until a larger one is synced.
    pub(super) reservation: Reservation<F>,
    /// The zero-filled next segment under its temporary name, and its size.
    pub(super) prepared: Option<(Rc<F>, u64)>,
    pub(super) roll_waiting: bool,
    /// Preparing the next segment failed for lack of space: data appends
    /// are refused (`LogError::DiskFull`) so the room left in the active
    /// segment serves control batches (claims, acks), and no append may
    /// start a segment that cannot be created. Cleared when a retry
    /// ([`super::Log::retry_prepare`]) succeeds.
    pub(super) disk_full: bool,
    /// A retry of the preparation was asked for while `disk_full`.
    pub(super) prepare_retry: bool,
    /// A log without a zero-filled segment was asked for its first one by
    /// [`super::Log::writable`]: prepared before any append needs it, so a full
    /// disk refuses the append instead of failing a commit already applied.
    pub(super) first_segment_wanted: bool,
    /// Gathers started a segment the roll has not named yet (they will
    /// take the prepared file), oldest first: the capacity each was given.
    pub(super) rolls_pending: VecDeque<u64>,
    /// A roll took the prepared file and has not yet renamed it: the
    /// prepared path still names that file, so the preparer must not reopen it.
    pub(super) renaming: bool,
    pub(super) seal_queue: VecDeque<Rc<Segment<F>>>,
    pub(super) tail: VecDeque<Cached<F::Buf>>,
    pub(super) tail_bytes: u64,
    /// The batches the last read of a segment file returned or held whole
    /// (consecutive, crc-checked), kept for the reads that follow it
    /// (`reader.rs`); empty when none.
    pub(super) read_back: Vec<ReadBatch>,
    /// Bytes read from the file for `read_back` (its buffers' size at most).
    pub(super) read_back_bytes: u64,
    pub(super) alloc_file: Rc<F>,
    pub(super) workers_running: usize,
    pub(super) background_started: bool,
    pub(super) stats: LogStats,
}

pub(super) struct Shared<S: Storage> {
    pub(super) storage: S,
    pub(super) dir: PathBuf,
    pub(super) config: LogConfig,
    pub(super) leader_epoch: u32,
    pub(super) fatal: Rc<dyn FatalHandler>,
    pub(super) state: RefCell<State<S::File>>,
    /// New gathered work, a commit wanted, closing, or failure (shared with
    /// every commit's cell, [`super::CommitCell::want`]).
    pub(super) work: Rc<Notify>,
    /// The durable watermark moved (or the log failed).
    pub(super) durable: Notify,
    /// A segment received its name.
    pub(super) named: Notify,
    /// The preparer has something to do.
    pub(super) prepare: Notify,
    /// A prepared file became available.
    pub(super) prepared: Notify,
    /// Pending bytes dropped.
    pub(super) space: Notify,
    /// A reservation write was synced (or the log failed).
    pub(super) reserved: Notify,
    /// What an idle committer waits for before it writes a witness page
    /// ([`super::Log::set_witness_delay`]); none: at once.
    pub(super) witness_delay: RefCell<Option<super::WitnessDelay>>,
    /// How long a gather nobody waits for may stay open, and the running
    /// delay of the one held ([`super::Log::set_commit_delay`]); none set:
    /// every gather is taken at once.
    pub(super) commit_delay: super::HeldDelay,
}

/// Takes the open gather, advancing the gather position past its pages.
pub(super) fn close_open<F: StorageFile>(state: &mut State<F>) -> Option<Gather<F>> {
    let gather = state.open.take()?;
    assert!(gather.data_bytes > 0);
    state.gather_pos = gather.pos + commit_span(gather.data_bytes);
    Some(gather)
}

impl<S: Storage> Shared<S> {
    /// Enters the failed state once: fails every unacknowledged commit, wakes
    /// every waiter, and calls the fatal handler. Never retried.
    pub(super) fn fail(&self, code: FatalCode, error: &IoError) {
        let message = format!("{code:?}: {error}");
        let commits = {
            let mut state = self.state.borrow_mut();
            if state.failed.is_some() {
                return;
            }
            state.failed = Some(Rc::from(message.as_str()));
            let mut commits: Vec<Rc<CommitCell>> =
                state.inflight.values().map(|c| c.commit.clone()).collect();
            commits.extend(state.queued.iter().map(|g| g.commit.clone()));
            commits.extend(state.open.iter().map(|g| g.commit.clone()));
            state.inflight.clear();
            state.queued.clear();
            state.open = None;
            state.pending_bytes = 0;
            commits
        };
        let reason: Rc<str> = Rc::from(message.as_str());
        for commit in commits {
            commit.resolve(CommitStatus::Failed(reason.clone()));
        }
        for notify in [
            &self.work,
            &self.durable,
            &self.named,
            &self.prepare,
            &self.prepared,
            &self.space,
            &self.reserved,
        ] {
            notify.notify_all();
        }
        self.fatal.fatal(&FatalReason { code, message });
    }

    pub(super) fn is_failed(&self) -> bool {
        self.state.borrow().failed.is_some()
    }
}
