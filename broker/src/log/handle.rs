//! [`Log`]: the handle of one partition log. Opening (recovery, then the
//! appender's state), the background future that runs the committers and
//! the preparer, close, and what the log reports about itself. Appends are
//! in `gather.rs`, reads in `reader.rs`, retention in `retention.rs`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;

use super::committer::committer;
use super::config::LogConfig;
use super::error::LogError;
use super::index::{ResumePoint, SparseIndex};
use super::preparer::preparer;
use super::recovery;
use super::reserve::Reservation;
use super::state::{Segment, Shared, State};
use super::sync::{join_all, Notify};
use super::{FatalHandler, LogStats, Offset, RecoveryReport, SegmentInfo};
use crate::io::Storage;

/// One partition log. Single-threaded: clone-free handle around shared state;
/// all futures are `!Send`.
pub struct Log<S: Storage> {
    pub(super) shared: Rc<Shared<S>>,
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
        Self::open_inner(storage, dir, config, leader_epoch, fatal, None, None).await
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
        Self::open_inner(storage, dir, config, leader_epoch, fatal, Some(scan_from.0), None).await
    }

    /// Like [`Log::open_from`], but the scan of the segment holding
    /// `scan_from` starts at `resume` (a [`Log::resume_point`] taken when
    /// everything below `scan_from` was durable) when it names that segment
    /// and an offset below `scan_from`: the bytes before its position are
    /// not read, its sparse index entries stand for them, and their batches
    /// are crc-checked when read, as in a trusted sealed segment. The batch
    /// at the position must verify and carry the point's offset; otherwise
    /// the segment is scanned from its start
    /// ([`RecoveryReport::resume_rejected`]).
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_from_resume(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        scan_from: Offset,
        resume: Option<ResumePoint>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        Self::open_inner(storage, dir, config, leader_epoch, fatal, Some(scan_from.0), resume).await
    }

    async fn open_inner(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        trust_below: Option<u64>,
        resume: Option<ResumePoint>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        config.validate()?;
        let recovered =
            recovery::recover(&storage, dir, &config, leader_epoch, trust_below, resume.as_ref())
                .await?;
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
            // A tail that recovery found witnessed (or holding no commit)
            // needs no page; otherwise the committers write one as soon
            // as they run, so the last commits before a crash (or before a
            // torn tail was cut) get a witness too.
            witnessed_offset: if recovered.tail_witnessed { next_offset } else { 0 },
            witness_inflight: false,
            witness_armed: false,
            witness_ripe: false,
            defer_armed: false,
            defer_ripe: None,
            reservation: Reservation {
                file: recovered.reserve_file,
                durable: recovered.reserve_claim,
                inflight: None,
            },
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
            read_back: Vec::new(),
            read_back_bytes: 0,
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
            work: Rc::new(Notify::default()),
            durable: Notify::default(),
            named: Notify::default(),
            prepare: Notify::default(),
            prepared: Notify::default(),
            space: Notify::default(),
            reserved: Notify::default(),
            witness_delay: RefCell::new(None),
            commit_delay: super::HeldDelay::default(),
        });
        Ok((Self { shared }, recovered.report))
    }

    /// Makes an idle committer wait for `delay` before it writes a witness
    /// page: a commit built meanwhile vouches for the commits before it
    /// (its filler records the durable watermark), so a thin steady stream
    /// does not pay a page and a sync for each commit. Damage to the last
    /// commit within the delay of a crash is then cut like a torn tail
    /// rather than refused (segment-format.md, "Witness delay"). Without it
    /// (the default) the page is written as soon as the committers go idle;
    /// while closing it never waits.
    pub fn set_witness_delay(&self, delay: super::WitnessDelay) {
        *self.shared.witness_delay.borrow_mut() = Some(delay);
    }

    /// Lets a commit that nobody waits for — every batch in it appended
    /// with [`Log::append_deferred`], no ticket of it awaited — stay open
    /// for `delay` from when a committer could first take it, so that it
    /// rides the next commit someone waits for instead of costing a write
    /// and a sync of its own. An append with [`Log::append`] or a wait on
    /// any of its tickets ends the delay; so do a full gather and `close`.
    /// The delay is not restarted by appends meanwhile: a deferred batch
    /// is taken at most `delay` after a committer was free to take it.
    /// Without it (the default) every commit is taken at once.
    /// (segment-format.md, "Commit protocol", step 2.)
    pub fn set_commit_delay(&self, delay: super::WitnessDelay) {
        self.shared.commit_delay.set(delay);
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

    /// Where a reopen bounded by `covers` may start scanning
    /// ([`Log::open_from_resume`]): in the segment a bounded recovery scans
    /// first (the first whose durable records reach `covers`, else the
    /// last), the last indexed durable batch below `covers`, with the
    /// index entries before it. `None` when that segment has no such batch
    /// past its first position (the scan then starts at 0 anyway). Every
    /// offset below `covers` must be durable (a checkpoint's barrier); the
    /// point then names bytes that were synced before it was taken.
    pub fn resume_point(&self, covers: Offset) -> Option<ResumePoint> {
        let state = self.shared.state.borrow();
        let segment = state
            .segments
            .iter()
            .find(|segment| segment.next_offset.get() > covers.0)
            .or(state.segments.last())?;
        let index = segment.index.borrow();
        let below = index.entries().partition_point(|entry| entry.offset < covers.0);
        let (last, before) = index.entries()[..below].split_last()?;
        if last.pos == 0 || last.offset >= segment.next_offset.get() {
            return None;
        }
        let mut prefix = SparseIndex::default();
        for entry in before {
            prefix.push(*entry);
        }
        Some(ResumePoint { base: segment.base, pos: last.pos, offset: last.offset, index: prefix })
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
