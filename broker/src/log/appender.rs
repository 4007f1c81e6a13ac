//! [`Log`]: offset assignment, group commit, segment roll and preparation.
//!
//! `append` is synchronous: it stamps the batch with the next offsets and
//! copies it into the commit being gathered (an O_DIRECT buffer), so the
//! caller's state machine can use the offsets at once. Committers — one per
//! in-flight slot — each take whatever has gathered, close its last page with
//! a filler, write exactly its pages with one `write_at`, fdatasync, and mark
//! it synced. The durable watermark advances only over a contiguous prefix of
//! synced commits, and only then are tickets resolved: nothing is
//! acknowledged while an earlier commit is unsynced.
//!
//! The preparer zero-fills the next segment under a temporary name ahead of
//! need, so appends overwrite blocks instead of extending the file (DESIGN
//! §8), and persists the sparse index of each sealed segment.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use spool_wire::batch::{write_filler, BatchHeader, BatchKind};

use super::config::LogConfig;
use super::error::LogError;
use super::index::{IndexEntry, SparseIndex};
use super::layout::{commit_span, index_path, segment_path, PREPARED_FILE_NAME};
use super::recovery;
use super::sync::{join_all, Notify};
use super::{
    Appended, CommitCell, CommitStatus, FatalCode, FatalHandler, FatalReason, LogStats, Offset,
    RecoveryReport, SegmentInfo, Ticket,
};
use crate::io::{IoBuf, IoError, IoOp, Storage, StorageFile};
use crate::limits::{GATHER_BUF_INITIAL_BYTES, PAGE_BYTES, SEGMENTS_MAX, ZERO_FILL_CHUNK_BYTES};

/// Evaluates failpoint `point` (see `crate::failpoint`) as a failure of
/// `op` on `path`: `Ok` unless the point is armed with `error`.
pub(crate) fn failpoint(
    point: &str,
    op: IoOp,
    path: &Path,
    pos: Option<u64>,
) -> Result<(), IoError> {
    crate::failpoint::eval(point).map_err(|error| IoError::new(op, path, pos, error))
}

/// Whether an I/O error means the file system is out of space.
pub(crate) fn is_disk_full(error: &IoError) -> bool {
    error.source.kind() == std::io::ErrorKind::StorageFull
        || error.source.raw_os_error() == Some(libc::ENOSPC)
}

/// One segment file and what is durable in it.
pub(crate) struct Segment<F> {
    pub base: u64,
    pub path: PathBuf,
    /// Bytes the segment may hold (its pre-zeroed length).
    pub capacity: u64,
    /// `None` until the roll gives the prepared file this segment's name.
    pub file: RefCell<Option<Rc<F>>>,
    pub index: RefCell<SparseIndex>,
    /// File position after the last durable commit.
    pub data_end: Cell<u64>,
    /// Offset after the last durable record.
    pub next_offset: Cell<u64>,
}

impl<F> Segment<F> {
    pub fn file(&self) -> Option<Rc<F>> {
        self.file.borrow().clone()
    }
}

/// A commit being gathered or waiting for a committer.
struct Gather<F: StorageFile> {
    seq: u64,
    buf: F::Buf,
    data_bytes: u64,
    cap_bytes: u64,
    pos: u64,
    segment: Rc<Segment<F>>,
    /// First commit of a not-yet-named segment: its committer performs the roll.
    opens_segment: bool,
    first_offset: u64,
    next_offset: u64,
    batches: u64,
    entries: Vec<IndexEntry>,
    commit: Rc<CommitCell>,
}

/// A commit handed to a committer and not yet part of the durable prefix.
struct Inflight<F: StorageFile> {
    synced: bool,
    commit: Rc<CommitCell>,
    segment: Rc<Segment<F>>,
    pos: u64,
    end_pos: u64,
    first_offset: u64,
    next_offset: u64,
    entries: Vec<IndexEntry>,
    buf: Rc<F::Buf>,
    /// Bytes allocated for `buf` (its length before the trim to the span).
    alloc_bytes: u64,
    batches: u64,
}

/// A durable commit kept in memory to serve tail reads.
pub(crate) struct Cached<B> {
    pub first_offset: u64,
    pub next_offset: u64,
    pub path: PathBuf,
    pub pos: u64,
    pub buf: Rc<B>,
}

struct Job<F: StorageFile> {
    seq: u64,
    pos: u64,
    buf: Rc<F::Buf>,
    segment: Rc<Segment<F>>,
    opens_segment: bool,
}

pub(crate) struct State<F: StorageFile> {
    pub failed: Option<Rc<str>>,
    closing: bool,
    next_offset: u64,
    /// Named segments, oldest first; the last is active.
    pub segments: Vec<Rc<Segment<F>>>,
    gather_segment: Rc<Segment<F>>,
    gather_pos: u64,
    gather_last_index_pos: Option<u64>,
    gather_segment_unopened: bool,
    open: Option<Gather<F>>,
    queued: VecDeque<Gather<F>>,
    pending_bytes: u64,
    next_seq: u64,
    durable_seq: u64,
    inflight: BTreeMap<u64, Inflight<F>>,
    pub durable_offset: u64,
    /// The zero-filled next segment under its temporary name, and its size.
    prepared: Option<(Rc<F>, u64)>,
    roll_waiting: bool,
    /// Preparing the next segment failed for lack of space: data appends
    /// are refused (`LogError::DiskFull`) so the room left in the active
    /// segment serves control batches (claims, acks), and no append may
    /// start a segment that cannot be created. Cleared when a retry
    /// ([`Log::retry_prepare`]) succeeds.
    disk_full: bool,
    /// A retry of the preparation was asked for while `disk_full`.
    prepare_retry: bool,
    /// A log without a zero-filled segment was asked for its first one by
    /// [`Log::writable`]: prepared before any append needs it, so a full
    /// disk refuses the append instead of failing a commit already applied.
    first_segment_wanted: bool,
    /// Gathers started a segment the roll has not named yet (they will
    /// take the prepared file), oldest first: the capacity each was given.
    rolls_pending: VecDeque<u64>,
    /// A roll took the prepared file and has not yet renamed it: the
    /// prepared path still names that file, so the preparer must not reopen it.
    renaming: bool,
    pub seal_queue: VecDeque<Rc<Segment<F>>>,
    pub tail: VecDeque<Cached<F::Buf>>,
    tail_bytes: u64,
    alloc_file: Rc<F>,
    workers_running: usize,
    background_started: bool,
    stats: LogStats,
}

pub(crate) struct Shared<S: Storage> {
    pub storage: S,
    pub dir: PathBuf,
    pub config: LogConfig,
    leader_epoch: u32,
    fatal: Rc<dyn FatalHandler>,
    pub state: RefCell<State<S::File>>,
    /// New gathered work, closing, or failure.
    work: Notify,
    /// The durable watermark moved (or the log failed).
    durable: Notify,
    /// A segment received its name.
    named: Notify,
    /// The preparer has something to do.
    prepare: Notify,
    /// A prepared file became available.
    prepared: Notify,
    /// Pending bytes dropped.
    space: Notify,
}

/// One partition log. Single-threaded: clone-free handle around shared state;
/// all futures are `!Send`.
pub struct Log<S: Storage> {
    pub(crate) shared: Rc<Shared<S>>,
}

impl<S: Storage> Log<S> {
    /// Opens (recovering) or creates the log in `dir`. Every batch is
    /// crc-checked; a torn tail is cut and zeroed before this returns.
    ///
    /// # Errors
    /// [`LogError::Config`] for an invalid config, [`LogError::Corrupt`]
    /// naming file and byte for damage outside the torn-write window,
    /// [`LogError::Io`] when the directory cannot be read or repaired.
    pub async fn open(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        Self::open_inner(storage, dir, config, leader_epoch, fatal, None).await
    }

    /// Like [`Log::open`], but sealed segments that end at or below
    /// `scan_from` (the offset a valid checkpoint covers) are not read: their
    /// extent and sparse index come from their persisted index files, and
    /// their batches are crc-checked when read instead (a bad one is
    /// [`LogError::Corrupt`] from [`Log::read`], never served). A sealed
    /// segment without a valid index file, the segment holding `scan_from`,
    /// every later segment and the tail are scanned as by `open`, with the
    /// same torn-tail repair and the same refusal of damage before the tail.
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_from(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        scan_from: Offset,
    ) -> Result<(Self, RecoveryReport), LogError> {
        Self::open_inner(storage, dir, config, leader_epoch, fatal, Some(scan_from.0)).await
    }

    async fn open_inner(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        trust_below: Option<u64>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        config.validate()?;
        let recovered =
            recovery::recover(&storage, dir, &config, leader_epoch, trust_below).await?;
        let mut segments = Vec::with_capacity(recovered.segments.len());
        for found in recovered.segments {
            segments.push(Rc::new(Segment {
                base: found.base,
                path: found.path,
                capacity: found.capacity,
                file: RefCell::new(Some(found.file)),
                index: RefCell::new(found.index),
                data_end: Cell::new(found.data_end),
                next_offset: Cell::new(found.next_offset),
            }));
        }
        let no_active = |why: &'static str| LogError::NoActiveSegment { dir: dir.to_owned(), why };
        let active = segments.last().cloned().ok_or_else(|| no_active("recovery found none"))?;
        let alloc_file =
            active.file().ok_or_else(|| no_active("the last segment's file is not open"))?;
        let next_offset = active.next_offset.get();
        let gather_last_index_pos = active.index.borrow().last_pos();
        let state = State {
            failed: None,
            closing: false,
            next_offset,
            segments,
            gather_segment: active,
            gather_pos: recovered.next_commit_pos,
            gather_last_index_pos,
            gather_segment_unopened: false,
            open: None,
            queued: VecDeque::new(),
            pending_bytes: 0,
            next_seq: 1,
            durable_seq: 0,
            inflight: BTreeMap::new(),
            durable_offset: next_offset,
            prepared: None,
            roll_waiting: false,
            disk_full: false,
            first_segment_wanted: false,
            prepare_retry: false,
            rolls_pending: VecDeque::new(),
            renaming: false,
            seal_queue: VecDeque::new(),
            tail: VecDeque::new(),
            tail_bytes: 0,
            alloc_file,
            workers_running: 0,
            background_started: false,
            stats: LogStats::default(),
        };
        let shared = Rc::new(Shared {
            storage,
            dir: dir.to_path_buf(),
            config,
            leader_epoch,
            fatal,
            state: RefCell::new(state),
            work: Notify::default(),
            durable: Notify::default(),
            named: Notify::default(),
            prepare: Notify::default(),
            prepared: Notify::default(),
            space: Notify::default(),
        });
        Ok((Self { shared }, recovered.report))
    }

    /// The future that runs the committers and the preparer. The owner must
    /// spawn it (production: `glommio::spawn_local`) or poll it alongside
    /// its own work; without it no ticket ever resolves. It completes after
    /// [`Log::close`] once everything gathered is durable, or right after a
    /// fatal error. Call once.
    pub fn background(&self) -> impl Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        let workers = {
            let mut state = shared.state.borrow_mut();
            assert!(!state.background_started, "Log::background called twice");
            state.background_started = true;
            state.workers_running = shared.config.inflight_commits_max;
            state.workers_running
        };
        async move {
            let mut tasks: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
            for _ in 0..workers {
                tasks.push(Box::pin(committer(shared.clone())));
            }
            tasks.push(Box::pin(preparer(shared.clone())));
            join_all(tasks).await;
        }
    }

    /// Assigns offsets to `batch`, stamps its header and queues it for the
    /// next commit. Returns at once; await the ticket for durability.
    ///
    /// # Errors
    /// [`LogError::InvalidBatch`] (framing or body crc),
    /// [`LogError::BatchLengthMismatch`], [`LogError::BatchTooLarge`],
    /// [`LogError::NotAppendable`] (fillers, empty batches),
    /// [`LogError::Backpressure`] when `pending_bytes_max` would be exceeded
    /// (nothing is queued; await [`Log::writable`] and retry),
    /// [`LogError::TooManySegments`], [`LogError::Failed`], [`LogError::Closed`].
    pub fn append(&self, batch: &[u8]) -> Result<Appended, LogError> {
        failpoint("log.append", IoOp::Write, &self.shared.dir, None)?;
        let header = BatchHeader::verify_body(batch).map_err(LogError::InvalidBatch)?;
        if header.batch_len as usize != batch.len() {
            return Err(LogError::BatchLengthMismatch {
                declared: header.batch_len,
                given: batch.len(),
            });
        }
        let len = batch.len() as u64;
        let config = &self.shared.config;
        if len > config.batch_bytes_max {
            return Err(LogError::BatchTooLarge {
                len_bytes: len,
                max_bytes: config.batch_bytes_max,
            });
        }
        if header.kind == BatchKind::Filler {
            return Err(LogError::NotAppendable("filler batches are written by the log only"));
        }
        if header.record_count == 0 {
            return Err(LogError::NotAppendable("a batch must hold at least one record"));
        }
        let appended = {
            let mut state = self.shared.state.borrow_mut();
            if let Some(reason) = &state.failed {
                return Err(LogError::Failed(reason.to_string()));
            }
            if state.closing {
                return Err(LogError::Closed);
            }
            if state.disk_full && header.kind == BatchKind::Data {
                return Err(LogError::DiskFull);
            }
            let limit_bytes = config.pending_limit(header.kind);
            if state.pending_bytes + len > limit_bytes {
                return Err(LogError::Backpressure {
                    pending_bytes: state.pending_bytes,
                    limit_bytes,
                });
            }
            let fits =
                state.open.as_ref().is_some_and(|g| commit_span(g.data_bytes + len) <= g.cap_bytes);
            if !fits {
                self.start_gather(&mut state, len)?;
            }
            let base_offset = state.next_offset;
            let next_offset = base_offset + u64::from(header.record_count);
            let interval = config.index_interval_bytes;
            let last_index_pos = state.gather_last_index_pos;
            let epoch = self.shared.leader_epoch;
            let state_fields = &mut *state;
            let Some(gather) = state_fields.open.as_mut() else {
                unreachable!("start_gather leaves an open gather");
            };
            let at = gather.data_bytes as usize;
            grow_gather(gather, &state_fields.alloc_file, len);
            let slot = &mut gather.buf.as_mut()[at..at + batch.len()];
            slot.copy_from_slice(batch);
            BatchHeader::assign(slot, base_offset, epoch);
            let pos = gather.pos + gather.data_bytes;
            let indexed = last_index_pos.is_none_or(|last| pos >= last + interval);
            if indexed {
                gather.entries.push(IndexEntry { offset: base_offset, pos });
            }
            gather.data_bytes += len;
            gather.next_offset = next_offset;
            gather.batches += 1;
            let ticket = Ticket { commit: gather.commit.clone() };
            if indexed {
                state.gather_last_index_pos = Some(pos);
            }
            state.next_offset = next_offset;
            state.pending_bytes += len;
            let prepare = state.prepared.is_none() && wants_next(&state);
            let appended = Appended {
                base_offset: Offset(base_offset),
                next_offset: Offset(next_offset),
                ticket,
            };
            (appended, prepare)
        };
        let (appended, prepare) = appended;
        if prepare {
            self.shared.prepare.notify_all();
        }
        self.shared.work.notify_all();
        Ok(appended)
    }

    /// Closes the open gather and starts a new one that can hold a batch of
    /// `len` bytes, moving to a new (not yet named) segment when the current
    /// one cannot hold the commit.
    fn start_gather(&self, state: &mut State<S::File>, len: u64) -> Result<(), LogError> {
        let config = &self.shared.config;
        let span = commit_span(len);
        let room = state.gather_segment.capacity.saturating_sub(state.gather_pos);
        if span > room {
            let count = state.segments.len() + usize::from(state.gather_segment_unopened);
            if count >= SEGMENTS_MAX {
                return Err(LogError::TooManySegments { count });
            }
            // The next segment could not be created: starting one would
            // leave commits (already applied by the caller) with nowhere
            // to go.
            if state.disk_full {
                return Err(LogError::DiskFull);
            }
        }
        if let Some(gather) = close_open(state) {
            state.queued.push_back(gather);
        }
        if state.gather_pos + span > state.gather_segment.capacity {
            let base = state.next_offset;
            // Segments start at `segment_bytes_initial` and double up to
            // `segment_bytes`; a log without a zero-filled segment (its
            // active segment is the empty file recovery created) gets its
            // first one here, under the same base offset.
            let capacity = config.next_segment_bytes(state.gather_segment.capacity, span);
            state.gather_segment = Rc::new(Segment {
                base,
                path: segment_path(&self.shared.dir, base),
                capacity,
                file: RefCell::new(None),
                index: RefCell::new(SparseIndex::default()),
                data_end: Cell::new(0),
                next_offset: Cell::new(base),
            });
            state.gather_pos = 0;
            state.gather_last_index_pos = None;
            state.gather_segment_unopened = true;
            state.rolls_pending.push_back(capacity);
            self.shared.prepare.notify_all();
        }
        let room = state.gather_segment.capacity - state.gather_pos;
        let cap_bytes = config.commit_bytes.max(span).min(room);
        assert!(cap_bytes >= span);
        assert!(state.gather_pos.is_multiple_of(PAGE_BYTES));
        // The buffer starts small and grows with the gather (`grow_gather`):
        // most commits are far below `commit_bytes`, and a buffer stays
        // allocated at its full size until the commit is durable (the tail
        // cache then keeps a copy of its span only).
        let buf_bytes = span.max(GATHER_BUF_INITIAL_BYTES).min(cap_bytes);
        let buf = state.alloc_file.alloc_buf(buf_bytes as usize);
        let seq = state.next_seq;
        state.next_seq += 1;
        let opens_segment = std::mem::take(&mut state.gather_segment_unopened);
        state.open = Some(Gather {
            seq,
            buf,
            data_bytes: 0,
            cap_bytes,
            pos: state.gather_pos,
            segment: state.gather_segment.clone(),
            opens_segment,
            first_offset: state.next_offset,
            next_offset: state.next_offset,
            batches: 0,
            entries: Vec::new(),
            commit: CommitCell::new(),
        });
        Ok(())
    }

    /// Resolves when a `len`-byte batch of `kind` would fit under its pending
    /// bound ([`crate::log::LogConfig::pending_limit`]: data batches stop earlier than
    /// control batches), or the log failed or closed (`append` then reports
    /// why).
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        let limit_bytes = self.shared.config.pending_limit(kind);
        loop {
            {
                let mut state = self.shared.state.borrow_mut();
                if state.failed.is_some() || state.closing {
                    return;
                }
                // A log without a zero-filled segment (nothing appended
                // yet) has its first one prepared before the first append:
                // a full disk then refuses that append (`disk_full`) rather
                // than failing a commit whose events were applied.
                let needs_first = state.gather_segment.capacity == 0
                    && state.prepared.is_none()
                    && state.rolls_pending.is_empty()
                    && !state.disk_full;
                if needs_first {
                    if !state.first_segment_wanted {
                        state.first_segment_wanted = true;
                        drop(state);
                        self.shared.prepare.notify_all();
                    }
                } else if state.pending_bytes + len <= limit_bytes {
                    return;
                }
            }
            self.shared.space.wait().await;
        }
    }

    /// Whether the next segment could not be prepared for lack of space
    /// (data appends then fail with [`LogError::DiskFull`]).
    pub fn disk_full(&self) -> bool {
        self.shared.state.borrow().disk_full
    }

    /// Asks the preparer to try again after [`Log::disk_full`] (space may
    /// have been freed). The owner rate-limits this: each try writes zeros
    /// until the disk is full again. Data appends stay refused until the
    /// try succeeds.
    pub fn retry_prepare(&self) {
        let mut state = self.shared.state.borrow_mut();
        if state.disk_full && !state.prepare_retry {
            state.prepare_retry = true;
            drop(state);
            self.shared.prepare.notify_all();
        }
    }

    /// Stops accepting appends; [`Log::background`] completes once every
    /// gathered commit is durable.
    pub fn close(&self) {
        self.shared.state.borrow_mut().closing = true;
        self.shared.work.notify_all();
        self.shared.prepare.notify_all();
        self.shared.space.notify_all();
    }

    /// The offset the next appended record will get.
    pub fn next_offset(&self) -> Offset {
        Offset(self.shared.state.borrow().next_offset)
    }

    /// Every offset below this is durable (and readable).
    pub fn durable_offset(&self) -> Offset {
        Offset(self.shared.state.borrow().durable_offset)
    }

    /// The oldest offset still held (after retention).
    pub fn start_offset(&self) -> Offset {
        Offset(self.shared.state.borrow().segments.first().map_or(0, |s| s.base))
    }

    /// `Some(reason)` once a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.state.borrow().failed.as_ref().map(|r| r.to_string())
    }

    pub fn stats(&self) -> LogStats {
        self.shared.state.borrow().stats
    }

    /// Named segments, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let state = self.shared.state.borrow();
        state
            .segments
            .iter()
            .map(|s| SegmentInfo {
                base_offset: Offset(s.base),
                next_offset: Offset(s.next_offset.get()),
                path: s.path.clone(),
                data_end: s.data_end.get(),
                index_entries: s.index.borrow().entries().len(),
            })
            .collect()
    }

    /// Whether a zero-filled next segment is ready under its temporary name
    /// (prepared once the active segment is past
    /// [`LogConfig::prepare_at_bytes`], or when an append needs it).
    pub fn next_segment_prepared(&self) -> bool {
        self.shared.state.borrow().prepared.is_some()
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

/// Takes the open gather, advancing the gather position past its pages.
fn close_open<F: StorageFile>(state: &mut State<F>) -> Option<Gather<F>> {
    let gather = state.open.take()?;
    assert!(gather.data_bytes > 0);
    state.gather_pos = gather.pos + commit_span(gather.data_bytes);
    Some(gather)
}

impl<S: Storage> Shared<S> {
    /// Enters the failed state once: fails every unacknowledged commit, wakes
    /// every waiter, and calls the fatal handler. Never retried.
    fn fail(&self, code: FatalCode, error: &IoError) {
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
        for notify in
            [&self.work, &self.durable, &self.named, &self.prepare, &self.prepared, &self.space]
        {
            notify.notify_all();
        }
        self.fatal.fatal(&FatalReason { code, message });
    }

    fn is_failed(&self) -> bool {
        self.state.borrow().failed.is_some()
    }

    /// Waits for a gathered commit; `None` when closed and drained, or failed.
    async fn next_job(&self) -> Option<Job<S::File>> {
        loop {
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return None;
                }
                // In-flight bound: at most `inflight_commits_max` commits
                // between the durable watermark and the newest write. A
                // committer whose own commit synced while an earlier one
                // has not must not write further ahead: a crash would then
                // leave more unsynced bytes after the damage than
                // `recovery_window_bytes` (inflight × the largest commit)
                // allows, and recovery would refuse an ordinary torn tail
                // as corruption.
                let room = state.inflight.len() < self.config.inflight_commits_max;
                let gather = if !room {
                    None
                } else {
                    match state.queued.pop_front() {
                        Some(gather) => Some(gather),
                        None => close_open(&mut state),
                    }
                };
                if let Some(gather) = gather {
                    let job = self.start_commit(&mut state, gather);
                    drop(state);
                    self.space.notify_all();
                    return Some(job);
                }
                if state.closing && room {
                    return None;
                }
            }
            self.work.wait().await;
        }
    }

    /// Closes a gather's last page with a filler and moves it in flight.
    fn start_commit(&self, state: &mut State<S::File>, gather: Gather<S::File>) -> Job<S::File> {
        let Gather {
            seq,
            mut buf,
            data_bytes,
            cap_bytes,
            pos,
            segment,
            opens_segment,
            first_offset,
            next_offset,
            batches,
            entries,
            commit,
        } = gather;
        let span = commit_span(data_bytes);
        assert!(span <= cap_bytes);
        assert!(pos.is_multiple_of(PAGE_BYTES));
        assert!(pos + span <= segment.capacity);
        if span > data_bytes {
            let filler = &mut buf.as_mut()[data_bytes as usize..span as usize];
            write_filler(filler, (span - data_bytes) as usize, next_offset, self.leader_epoch);
        }
        let alloc_bytes = buf.as_ref().len() as u64;
        buf.trim(span as usize);
        let buf = Rc::new(buf);
        state.pending_bytes -= data_bytes;
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                commit,
                segment: segment.clone(),
                pos,
                end_pos: pos + span,
                first_offset,
                next_offset,
                entries,
                buf: buf.clone(),
                alloc_bytes,
                batches,
            },
        );
        Job { seq, pos, buf, segment, opens_segment }
    }

    /// Marks `seq` synced and advances the durable watermark over the
    /// contiguous synced prefix, resolving those commits' tickets.
    fn mark_synced(&self, seq: u64) {
        let mut resolved = Vec::new();
        {
            let mut state = self.state.borrow_mut();
            if state.failed.is_some() {
                return;
            }
            match state.inflight.get_mut(&seq) {
                Some(commit) => commit.synced = true,
                None => unreachable!("synced commit {seq} is not in flight"),
            }
            while let Some(entry) = state.inflight.first_entry() {
                if !entry.get().synced {
                    break;
                }
                let (seq, done) = entry.remove_entry();
                assert_eq!(seq, state.durable_seq + 1, "durable watermark must be contiguous");
                state.durable_seq = seq;
                let segment = &done.segment;
                assert!(done.pos >= segment.data_end.get());
                segment.data_end.set(done.end_pos);
                segment.next_offset.set(done.next_offset);
                {
                    let mut index = segment.index.borrow_mut();
                    for entry in &done.entries {
                        index.push(*entry);
                    }
                }
                state.durable_offset = done.next_offset;
                state.stats.commits += 1;
                state.stats.batches += done.batches;
                state.stats.records += done.next_offset - done.first_offset;
                state.stats.commit_bytes += done.end_pos - done.pos;
                let cached_bytes = done.end_pos - done.pos;
                // The cache is bounded by the memory it holds, not by the
                // bytes committed: a gather buffer is allocated ahead of its
                // data (at least `GATHER_BUF_INITIAL_BYTES`, then doubling),
                // so a 4 KiB commit may sit in a 64 KiB buffer. Such a buffer
                // is copied into one of its span before it is cached, so the
                // bound holds as many commits as it has bytes for.
                // A commit larger than the whole cache would evict itself.
                if cached_bytes <= self.config.tail_cache_bytes {
                    let buf = if done.alloc_bytes > cached_bytes {
                        compact(&*state.alloc_file, &done.buf)
                    } else {
                        done.buf
                    };
                    state.tail.push_back(Cached {
                        first_offset: done.first_offset,
                        next_offset: done.next_offset,
                        path: segment.path.clone(),
                        pos: done.pos,
                        buf,
                    });
                    state.tail_bytes += cached_bytes;
                }
                while state.tail_bytes > self.config.tail_cache_bytes {
                    let Some(evicted) = state.tail.pop_front() else { break };
                    state.tail_bytes -= evicted.buf.as_ref().as_ref().len() as u64;
                }
                resolved.push(done.commit);
            }
        }
        let advanced = !resolved.is_empty();
        for commit in resolved {
            commit.resolve(CommitStatus::Durable);
        }
        self.durable.notify_all();
        if advanced {
            // Commits left the in-flight map: a committer held back by the
            // in-flight bound (`next_job`) may take the next one.
            self.work.notify_all();
        }
    }

    /// Gives the prepared file this segment's name, once every earlier commit
    /// (all of the old segment) is durable. False when the log failed.
    async fn roll(&self, segment: &Rc<Segment<S::File>>, seq: u64) -> bool {
        loop {
            {
                let state = self.state.borrow();
                if state.failed.is_some() {
                    return false;
                }
                if state.durable_seq + 1 == seq {
                    break;
                }
            }
            self.durable.wait().await;
        }
        let file = loop {
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return false;
                }
                if let Some(prepared) = state.prepared.take() {
                    state.roll_waiting = false;
                    state.renaming = true;
                    assert!(state.rolls_pending.pop_front().is_some());
                    break prepared;
                }
                state.roll_waiting = true;
            }
            self.prepare.notify_all();
            self.prepared.wait().await;
        };
        let (file, prepared_bytes) = file;
        let prepared_path = self.dir.join(PREPARED_FILE_NAME);
        let renamed = async {
            // Prepared before a commit larger than its planned size started
            // this segment: zero the rest and sync it before the name.
            if prepared_bytes < segment.capacity {
                zero_fill(&*file, prepared_bytes, segment.capacity).await?;
                failpoint("log.prepare.sync", IoOp::Sync, file.path(), None)?;
                file.fdatasync().await?;
            }
            failpoint("log.roll.rename", IoOp::Rename, &prepared_path, None)?;
            self.storage.rename(&prepared_path, &segment.path).await?;
            failpoint("log.roll.dir_sync", IoOp::SyncDir, &self.dir, None)?;
            self.storage.sync_dir(&self.dir).await?;
            failpoint("log.roll.dir_sync.after", IoOp::SyncDir, &self.dir, None)
        };
        if let Err(error) = renamed.await {
            self.fail(FatalCode::RollFailed, &error);
            return false;
        }
        {
            let mut state = self.state.borrow_mut();
            state.renaming = false;
            *segment.file.borrow_mut() = Some(file.clone());
            let replaces_empty =
                state.segments.last().is_some_and(|last| last.base == segment.base);
            if replaces_empty {
                // The rename replaced the empty file of a log that held no
                // batch (a base offset starts one segment only otherwise:
                // every commit holds at least one record).
                let last = state.segments.len() - 1;
                state.segments[last] = segment.clone();
            } else {
                if let Some(sealed) = state.segments.last().cloned() {
                    state.seal_queue.push_back(sealed);
                }
                state.segments.push(segment.clone());
            }
            state.alloc_file = file;
            state.stats.segments_rolled += 1;
        }
        self.named.notify_all();
        self.prepare.notify_all();
        true
    }

    async fn wait_named(&self, segment: &Segment<S::File>) -> Option<Rc<S::File>> {
        loop {
            if self.is_failed() {
                return None;
            }
            if let Some(file) = segment.file() {
                return Some(file);
            }
            self.named.wait().await;
        }
    }
}

/// One committer: take a commit, (roll,) write it, sync it, mark it synced.
async fn committer<S: Storage>(shared: Rc<Shared<S>>) {
    loop {
        let Some(job) = shared.next_job().await else { break };
        if job.opens_segment && !shared.roll(&job.segment, job.seq).await {
            break;
        }
        let Some(file) = shared.wait_named(&job.segment).await else { break };
        let written = async {
            failpoint("log.commit.write", IoOp::Write, file.path(), Some(job.pos))?;
            file.write_at(job.buf.clone(), job.pos).await?;
            failpoint("log.commit.write.after", IoOp::Write, file.path(), Some(job.pos))
        };
        if let Err(error) = written.await {
            shared.fail(FatalCode::WriteFailed, &error);
            break;
        }
        if shared.is_failed() {
            break;
        }
        let synced = async {
            failpoint("log.commit.sync", IoOp::Sync, file.path(), None)?;
            file.fdatasync().await?;
            failpoint("log.commit.sync.after", IoOp::Sync, file.path(), None)
        };
        if let Err(error) = synced.await {
            shared.fail(FatalCode::SyncFailed, &error);
            break;
        }
        shared.mark_synced(job.seq);
    }
    shared.state.borrow_mut().workers_running -= 1;
    shared.prepare.notify_all();
}

/// Prepares the next segment ahead of need and persists sealed indexes.
async fn preparer<S: Storage>(shared: Rc<Shared<S>>) {
    enum Step<F> {
        Prepare,
        Seal(Rc<Segment<F>>),
        Wait,
        Exit,
    }
    loop {
        let step = {
            let mut state = shared.state.borrow_mut();
            let draining = state.closing && state.workers_running > 0;
            if state.failed.is_some() {
                Step::Exit
            } else if state.prepared.is_none()
                && !state.renaming
                && (!state.disk_full || state.prepare_retry)
                && (state.roll_waiting || (!state.closing && !draining && wants_next(&state)))
            {
                state.prepare_retry = false;
                Step::Prepare
            } else if let Some(segment) = state.seal_queue.pop_front() {
                Step::Seal(segment)
            } else if state.closing && state.workers_running == 0 {
                Step::Exit
            } else {
                Step::Wait
            }
        };
        match step {
            Step::Exit => return,
            Step::Wait => shared.prepare.wait().await,
            Step::Prepare => {
                let capacity = next_prepare_bytes(&shared.config, &shared.state.borrow());
                match prepare_segment_file(&shared.storage, &shared.dir, capacity).await {
                    Ok(file) => {
                        let was_full = {
                            let mut state = shared.state.borrow_mut();
                            state.prepared = Some((Rc::new(file), capacity));
                            state.first_segment_wanted = false;
                            std::mem::take(&mut state.disk_full)
                        };
                        if was_full {
                            tracing::info!(dir = %shared.dir.display(), "disk space is back: next segment prepared");
                        }
                        shared.prepared.notify_all();
                        // An append may wait in `writable` for this file.
                        shared.space.notify_all();
                    }
                    Err(error) if is_disk_full(&error) && disk_full_is_safe(&shared) => {
                        // Nothing gathered needs the segment yet: refuse
                        // data appends until a retry succeeds instead of
                        // stopping the process. The partial file would
                        // hold the space a retry needs.
                        let prepared_path = shared.dir.join(PREPARED_FILE_NAME);
                        if let Err(remove) = shared.storage.remove(&prepared_path).await {
                            tracing::warn!(%remove, "removing the partial next segment failed");
                        }
                        let first =
                            !std::mem::replace(&mut shared.state.borrow_mut().disk_full, true);
                        if first {
                            tracing::warn!(dir = %shared.dir.display(), %error,
                                "disk full: cannot prepare the next segment; refusing enqueues");
                        }
                        shared.space.notify_all();
                    }
                    Err(error) => {
                        shared.fail(FatalCode::PrepareFailed, &error);
                        return;
                    }
                }
            }
            Step::Seal(segment) => {
                if let Err(error) = persist_index(&shared.storage, &shared.dir, &segment).await {
                    // The index is an accelerator: recovery rebuilds it. A
                    // file whose write or sync failed is never trusted:
                    // removed (best effort; recovery also checks an index
                    // file's crc and extents before using it).
                    tracing::warn!(%error, segment = segment.base, "index persist failed; discarding the file");
                    let path = index_path(&shared.dir, segment.base);
                    if let Err(error) = shared.storage.remove(&path).await {
                        tracing::warn!(%error, path = %path.display(), "discarding the index file failed");
                    }
                }
            }
        }
    }
}

/// Whether a failed preparation can become "disk full" instead of fatal: no
/// gather has started the segment it was for (those commits are applied
/// and must reach the disk, so the log stops as for any write failure).
fn disk_full_is_safe<S: Storage>(shared: &Shared<S>) -> bool {
    let state = shared.state.borrow();
    state.rolls_pending.is_empty() && !state.roll_waiting
}

/// Whether the preparer should make the next segment now: a gather already
/// started it, or the segment being filled is past
/// [`LogConfig::prepare_at_bytes`]. A log without a zero-filled segment
/// prepares its first one only when an append needs it.
fn wants_next<F: StorageFile>(state: &State<F>) -> bool {
    if !state.rolls_pending.is_empty() || state.first_segment_wanted {
        return true;
    }
    // The pages the open gather will occupy count as filled.
    let fill = state
        .open
        .as_ref()
        .map_or(state.gather_pos, |gather| gather.pos + commit_span(gather.data_bytes));
    LogConfig::prepare_at_bytes(state.gather_segment.capacity).is_some_and(|at| fill >= at)
}

/// Size of the next file to prepare: the segment the oldest pending roll
/// will name, else the planned successor of the segment being filled (a
/// commit that turns out larger zero-fills the rest at its roll).
fn next_prepare_bytes<F: StorageFile>(config: &LogConfig, state: &State<F>) -> u64 {
    match state.rolls_pending.front() {
        Some(capacity) => *capacity,
        None => config.next_segment_bytes(state.gather_segment.capacity, PAGE_BYTES),
    }
}

/// Creates the prepared file, writes zeros through all of it, syncs it and
/// its directory. Appends then overwrite allocated blocks (DESIGN §8).
pub(crate) async fn prepare_segment_file<S: Storage>(
    storage: &S,
    dir: &Path,
    capacity: u64,
) -> Result<S::File, IoError> {
    let file = storage.open(&dir.join(PREPARED_FILE_NAME)).await?;
    zero_fill(&file, 0, capacity).await?;
    failpoint("log.prepare.sync", IoOp::Sync, file.path(), None)?;
    file.fdatasync().await?;
    failpoint("log.prepare.dir_sync", IoOp::SyncDir, dir, None)?;
    storage.sync_dir(dir).await?;
    Ok(file)
}

/// Writes zeros over `[from, to)` of `file` (page-aligned), in chunks of
/// `ZERO_FILL_CHUNK_BYTES`. The caller syncs.
async fn zero_fill<F: StorageFile>(file: &F, from: u64, to: u64) -> Result<(), IoError> {
    let chunk = ZERO_FILL_CHUNK_BYTES.min(to.saturating_sub(from));
    if chunk == 0 {
        return Ok(());
    }
    let mut zeros = file.alloc_buf(chunk as usize);
    zeros.as_mut().fill(0);
    let zeros = Rc::new(zeros);
    let mut pos = from;
    while pos + chunk <= to {
        failpoint("log.prepare.write", IoOp::Write, file.path(), Some(pos))?;
        file.write_at(zeros.clone(), pos).await?;
        pos += chunk;
    }
    if pos < to {
        let mut rest = file.alloc_buf((to - pos) as usize);
        rest.as_mut().fill(0);
        failpoint("log.prepare.write", IoOp::Write, file.path(), Some(pos))?;
        file.write_at(Rc::new(rest), pos).await?;
    }
    Ok(())
}

/// Writes a sealed segment's sparse index file (write, sync, dir sync).
pub(crate) async fn persist_index<S: Storage>(
    storage: &S,
    dir: &Path,
    segment: &Segment<S::File>,
) -> Result<(), IoError> {
    let bytes = segment.index.borrow().encode(
        segment.base,
        segment.data_end.get(),
        segment.next_offset.get(),
    );
    write_index_file(storage, dir, segment.base, &bytes).await
}

pub(crate) async fn write_index_file<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
    bytes: &[u8],
) -> Result<(), IoError> {
    let file = storage.open(&index_path(dir, base)).await?;
    let mut buf = file.alloc_buf(bytes.len());
    buf.as_mut().copy_from_slice(bytes);
    failpoint("log.index.write", IoOp::Write, file.path(), Some(0))?;
    file.write_at(Rc::new(buf), 0).await?;
    failpoint("log.index.sync", IoOp::Sync, file.path(), None)?;
    file.fdatasync().await?;
    storage.sync_dir(dir).await
}

/// A copy of `buf` in a buffer of exactly its length, so what the tail cache
/// keeps is what it counts.
fn compact<F: StorageFile>(alloc_file: &F, buf: &Rc<F::Buf>) -> Rc<F::Buf> {
    let bytes = buf.as_ref().as_ref();
    let mut exact = alloc_file.alloc_buf(bytes.len());
    exact.as_mut().copy_from_slice(bytes);
    Rc::new(exact)
}

/// Makes `gather`'s buffer hold `len` more bytes plus the filler that may
/// close its last page: doubles it (at most to the commit's `cap_bytes`,
/// which the caller already checked the batch fits) and copies what is
/// gathered.
fn grow_gather<F: StorageFile>(gather: &mut Gather<F>, alloc_file: &F, len: u64) {
    let needed = commit_span(gather.data_bytes + len);
    assert!(needed <= gather.cap_bytes);
    let have = gather.buf.as_ref().len() as u64;
    if needed <= have {
        return;
    }
    let grown = (have * 2).max(needed).min(gather.cap_bytes);
    let mut bigger = alloc_file.alloc_buf(grown as usize);
    let filled = gather.data_bytes as usize;
    bigger.as_mut()[..filled].copy_from_slice(&gather.buf.as_ref()[..filled]);
    gather.buf = bigger;
}
