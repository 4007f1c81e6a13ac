//! [`Journal`]: the shard's appender — two lanes, group commit, file roll
//! and preparation.
//!
//! `append` is synchronous: it checks the entry and queues a copy in its
//! lane. Committers — one per in-flight slot — each build a commit from
//! what is queued the moment they are free: every queued control entry (up
//! to `control_commit_bytes`), then data entries (up to `commit_bytes` in
//! total, or one larger entry), then a filler entry closing the last page.
//! Building assigns the journal positions and stamps every header with the
//! durable watermark known at that moment. A committer writes its commit
//! with one `write_at` and syncs it with one `fdatasync`; at most
//! `inflight_commits_max` commits lie between the durable watermark and the
//! newest write (N+1 is written while N syncs). The watermark advances only
//! over the contiguous prefix of synced commits, and only then are tickets
//! resolved.
//!
//! When the committers go idle (both lanes empty, nothing in flight) while
//! no header vouches for the last durable entries, one of them builds a
//! witness entry: a one-page filler whose watermark is the durable
//! watermark, written and synced like a commit without tickets, so
//! recovery refuses damage to the last answered commits instead of cutting
//! it (`shard-journal.md` §11, "Witness entries"). With a witness delay
//! set ([`Journal::set_witness_delay`]) the witness waits for it first: a
//! commit built meanwhile vouches instead (its headers carry the
//! watermark), so a thin steady stream — a commit every millisecond or so
//! — does not pay a second write and sync for each commit.
//!
//! A commit that does not fit in the rest of its file starts the next one
//! at the file's end position (the rest stays zero). Its committer first
//! waits until every earlier commit is durable — so a crash never leaves
//! data in a file after a lost commit in the one before — then takes the
//! zero-filled `next.prep` the preparer keeps ready, renames it to the new
//! position's name and syncs the directory, and only then writes.

mod committer;
mod preparer;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use super::config::JournalConfig;
use super::entry::{
    check_payload, write_filler, EntryHeader, Marker, ENTRY_HEADER_BYTES, FILLER_PARTITION,
    MARKER_BITS,
};
use super::error::JournalError;
use super::layout::{commit_span, journal_file_path};
use super::prepare::name_prepared;
use super::recovery::{recover, RecoveryReport, RecoverySink};
use super::{EntryCell, EntryStatus, JournalPos, JournalTicket, Lane, PartitionHandle, Wants};
use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::limits::PAGE_BYTES;
use crate::log::wakers::{join_all, Notify};
use crate::log::{FatalCode, FatalHandler, FatalReason};

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Commits built (each one write and one sync).
    pub commits_built: u64,
    /// Commits that became durable.
    pub commits: u64,
    /// Entries in durable commits, per lane (fillers not counted).
    pub control_entries: u64,
    pub data_entries: u64,
    /// Bytes durable commits occupy (whole pages, fillers included).
    pub commit_bytes: u64,
    /// Journal files named by a roll.
    pub files_rolled: u64,
    /// `next.prep` files zero-filled.
    pub files_prepared: u64,
    /// Witness entries that became durable (one page each, one write and
    /// one sync; not counted in `commits` nor `commit_bytes`).
    pub witnesses: u64,
    /// Preparations of the next file that failed for lack of disk space.
    pub prepares_disk_full: u64,
}

/// One journal file the appender writes to.
struct JournalFile<F> {
    base: u64,
    len_bytes: u64,
    /// `None` until the roll gives the prepared file this file's name.
    file: RefCell<Option<Rc<F>>>,
}

impl<F> JournalFile<F> {
    fn end(&self) -> u64 {
        self.base + self.len_bytes
    }
}

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

/// What an entry's header says of its place in its partition's log
/// (`docs/design/shard-journal.md` §14): the default (index 0) is an entry
/// that is not part of one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryMeta {
    pub entry_index: u64,
    pub term: u64,
}

/// An appended entry waiting in its lane.
struct Pending {
    partition: PartitionHandle,
    meta: EntryMeta,
    payload: Box<[u8]>,
    cell: Rc<EntryCell>,
}

impl Pending {
    fn entry_bytes(&self) -> u64 {
        (ENTRY_HEADER_BYTES + self.payload.len()) as u64
    }
}

#[derive(Default)]
struct LaneQueue {
    entries: VecDeque<Pending>,
    /// Entry bytes (headers included) queued.
    pending_bytes: u64,
}

/// A commit (or a witness entry) built and not yet part of the durable
/// prefix.
struct Inflight<B> {
    synced: bool,
    /// A witness entry: one page holding one filler, no ticket.
    witness: bool,
    pos: u64,
    /// The commit's bytes, kept for the read cache once it is durable.
    buf: Rc<B>,
    end_pos: u64,
    span: u64,
    cells: Vec<Rc<EntryCell>>,
    control_entries: u64,
    data_entries: u64,
}

struct Job<F: StorageFile> {
    seq: u64,
    witness: bool,
    pos: u64,
    buf: Rc<F::Buf>,
    file: Rc<JournalFile<F>>,
    opens_file: bool,
}

pub(super) struct State<F: StorageFile> {
    pub(super) failed: Option<Rc<str>>,
    pub(super) closing: bool,
    control: LaneQueue,
    data: LaneQueue,
    /// Where the next commit starts, and the file it goes to.
    build_pos: u64,
    build_file: Rc<JournalFile<F>>,
    next_seq: u64,
    durable_seq: u64,
    pub(super) durable_pos: u64,
    /// The highest watermark stamped into any header built (or recovered).
    recorded_watermark: u64,
    /// Every entry lies below this once durable: the end of the last
    /// durable commit holding entries (at open, of the last recovered
    /// entry). While it is above `recorded_watermark` no header vouches
    /// for the last entries, and an idle journal writes a witness entry.
    entries_end: u64,
    inflight: BTreeMap<u64, Inflight<F::Buf>>,
    /// Every journal file, by the journal position of its byte 0: where
    /// reads find an entry's bytes. A file is opened on its first read.
    pub(super) files: BTreeMap<u64, FileSlot<F>>,
    /// Recent durable commits, oldest first, for reads (`read_cache_bytes`).
    pub(super) cache: VecDeque<CachedCommit<F::Buf>>,
    pub(super) cache_bytes: u64,
    /// Chunks of journal files read for entries the commit cache no longer
    /// held, newest last, kept for the other partitions' reads of the same
    /// bytes (`read_ahead_bytes`).
    pub(super) chunks: VecDeque<super::read::ReadChunk>,
    pub(super) chunk_bytes: u64,
    /// The zero-filled `next.prep`, ready for the next roll, and its length.
    pub(super) prepared: Option<(Rc<F>, u64)>,
    pub(super) roll_waiting: bool,
    /// The length the next file gets: the file size, or less while the disk
    /// is short of space (halved per failed preparation, down to one
    /// largest commit: `JournalConfig::commit_span_max`), so a full disk
    /// clears once the space for the next commit returns, not a whole file.
    pub(super) next_len: u64,
    /// Lengths of the files commits were placed in that no roll has named
    /// yet, oldest first: the preparer makes the front one's length, which
    /// can then no longer shrink.
    pub(super) placed: VecDeque<u64>,
    /// The last preparation of the next file failed for lack of disk
    /// space: data entries are refused ([`JournalError::DiskFull`]) while
    /// control entries use the room left in the current file, and the
    /// preparer waits for [`Journal::retry_prepare`] before it tries again.
    pub(super) disk_full: bool,
    /// [`Journal::retry_prepare`] asked for another attempt.
    pub(super) retry_asked: bool,
    /// A roll took the prepared file and has not renamed it yet: `next.prep`
    /// still names it, so the preparer must not open that name.
    pub(super) renaming: bool,
    /// Any open file, to allocate write buffers from.
    alloc_file: Rc<F>,
    pub(super) workers_running: usize,
    background_started: bool,
    pub(super) stats: JournalStats,
    /// A committer waits out the witness delay (only one does).
    witness_armed: bool,
    /// The witness delay ran out with the journal still idle (or the open
    /// found the last entries unvouched): the next idle committer builds
    /// the witness at once. Cleared by every commit built.
    witness_ripe: bool,
    /// A committer waits out the commit delay (only one does).
    defer_armed: bool,
    /// The commit (by the seq it will get) whose delay ran out: built
    /// without another wait.
    defer_ripe: Option<u64>,
}

pub use crate::log::WitnessDelay;

pub(super) struct Shared<S: Storage> {
    pub(super) storage: S,
    pub(super) dir: PathBuf,
    pub(super) config: JournalConfig,
    fatal: Rc<dyn FatalHandler>,
    pub(super) state: RefCell<State<S::File>>,
    /// Entries queued, room in flight, closing, or failure (`wants.work`),
    /// and the count of queued entries someone waits for.
    wants: Rc<Wants>,
    /// The durable watermark moved (or the journal failed).
    durable: Notify,
    /// A file received its name.
    named: Notify,
    /// The preparer has something to do.
    pub(super) prepare: Notify,
    /// A prepared file became available.
    pub(super) prepared: Notify,
    /// Queued bytes dropped.
    space: Notify,
    /// Told of every commit built and made durable (metrics).
    observer: RefCell<Option<Rc<dyn CommitObserver>>>,
    /// What a witness waits for once the committers went idle; none: it is
    /// built at once.
    witness_delay: RefCell<Option<WitnessDelay>>,
    /// How long a cycle of deferred entries only may wait for an entry
    /// someone waits for, and the running delay of the one held
    /// ([`Journal::set_commit_delay`]); none set: every cycle at once.
    commit_delay: crate::log::HeldDelay,
}

/// Told of each commit when it is built and when it becomes durable (in the
/// order they were built: the durable watermark is contiguous), so the
/// owner can count and time commits — the journal itself reads no clock.
/// Called from inside the journal: it must not call back into it.
pub trait CommitObserver {
    /// Commit `seq` was built and its write is about to be submitted.
    fn built(&self, seq: u64);
    /// Commit `seq`, `span_bytes` of whole pages, and every commit before it
    /// are durable.
    fn durable(&self, seq: u64, span_bytes: u64);
}

/// The shard journal's appender. Single-threaded; all futures are `!Send`.
pub struct Journal<S: Storage> {
    pub(super) shared: Rc<Shared<S>>,
}

impl<S: Storage> Journal<S> {
    /// Recovers the journal in `dir` from `start` (every intact entry at or
    /// after it goes to `sink`, in order; a torn tail is cut, and what is
    /// kept is synced) and returns an appender that continues after it. An
    /// empty directory gets its first file at `start`.
    ///
    /// # Errors
    /// [`JournalError::Config`]; [`JournalError::Corrupt`] naming file and
    /// byte for damage below the recorded durable watermark (the sink must
    /// then drop what it gathered); [`JournalError::StartNotFound`];
    /// [`JournalError::Io`].
    pub async fn open(
        storage: S,
        dir: &Path,
        config: JournalConfig,
        start: JournalPos,
        sink: &mut impl RecoverySink,
        fatal: Rc<dyn FatalHandler>,
    ) -> Result<(Self, RecoveryReport), JournalError> {
        config.validate()?;
        let recovered = recover(&storage, dir, &config, start, sink).await?;
        let active = recovered.active;
        let mut files = BTreeMap::new();
        for (base, path, file) in recovered.older {
            files.insert(base, FileSlot { path, file, len_bytes: None });
        }
        files.insert(
            active.base,
            FileSlot {
                path: active.path.clone(),
                file: Some(active.file.clone()),
                len_bytes: Some(active.len_bytes),
            },
        );
        let build_file = Rc::new(JournalFile {
            base: active.base,
            len_bytes: active.len_bytes,
            file: RefCell::new(Some(active.file.clone())),
        });
        let state = State {
            failed: None,
            closing: false,
            control: LaneQueue::default(),
            data: LaneQueue::default(),
            build_pos: recovered.next_pos,
            build_file,
            next_seq: 1,
            durable_seq: 0,
            durable_pos: recovered.next_pos,
            // A journal whose last entries no later header vouches for (a
            // crash before their witness was durable, a torn tail cut
            // after them) gets its witness as soon as the committers run.
            recorded_watermark: recovered.report.watermark.0,
            entries_end: recovered.report.entries_end.0,
            inflight: BTreeMap::new(),
            files,
            cache: VecDeque::new(),
            cache_bytes: 0,
            chunks: VecDeque::new(),
            chunk_bytes: 0,
            prepared: None,
            roll_waiting: false,
            next_len: config.file_bytes,
            placed: VecDeque::new(),
            disk_full: false,
            retry_asked: false,
            renaming: false,
            alloc_file: active.file,
            workers_running: 0,
            background_started: false,
            stats: JournalStats::default(),
            witness_armed: false,
            defer_armed: false,
            defer_ripe: None,
            // An open that found its last entries unvouched writes their
            // witness without a delay.
            witness_ripe: true,
        };
        let shared = Rc::new(Shared {
            storage,
            dir: dir.to_path_buf(),
            config,
            fatal,
            state: RefCell::new(state),
            wants: Rc::new(Wants::default()),
            durable: Notify::default(),
            named: Notify::default(),
            prepare: Notify::default(),
            prepared: Notify::default(),
            space: Notify::default(),
            observer: RefCell::new(None),
            witness_delay: RefCell::new(None),
            commit_delay: crate::log::HeldDelay::default(),
        });
        Ok((Self { shared }, recovered.report))
    }

    /// The future that runs the committers and the preparer. The owner must
    /// spawn or poll it; without it no ticket resolves. It completes after
    /// [`Journal::close`] once everything queued is durable, or right after
    /// a fatal error. Call once.
    pub fn background(&self) -> impl Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        let workers = {
            let mut state = shared.state.borrow_mut();
            assert!(!state.background_started, "Journal::background called twice");
            state.background_started = true;
            state.workers_running = shared.config.inflight_commits_max;
            state.workers_running
        };
        async move {
            let mut tasks: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
            for _ in 0..workers {
                tasks.push(Box::pin(committer::committer(shared.clone())));
            }
            tasks.push(Box::pin(preparer::preparer(shared.clone())));
            join_all(tasks).await;
        }
    }

    /// Queues `payload` (one record batch, both crcs intact) for
    /// `partition` in `lane`. Returns at once; the ticket resolves when the
    /// entry is durable.
    ///
    /// # Errors
    /// [`JournalError::ReservedPartition`], [`JournalError::InvalidEntry`]
    /// (not one intact batch), [`JournalError::EntryTooLarge`] (a control
    /// entry over `control_commit_bytes`, a data entry over
    /// `entry_bytes_max`), [`JournalError::Backpressure`] when the lane's
    /// queued bytes would pass its bound (nothing is queued; await
    /// [`Journal::writable`] and retry), [`JournalError::Failed`],
    /// [`JournalError::Closed`].
    pub fn append(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        payload: &[u8],
    ) -> Result<JournalTicket, JournalError> {
        self.append_owned(lane, partition, EntryMeta::default(), payload.into())
    }

    /// [`Journal::append`] of a payload the caller already holds in a
    /// buffer of its own (a partition stamps offsets into its copy): queued
    /// without another copy.
    ///
    /// # Errors
    /// As [`Journal::append`].
    pub fn append_owned(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
    ) -> Result<JournalTicket, JournalError> {
        if partition.0 & MARKER_BITS != 0 && partition != FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        check_payload(&payload).map_err(JournalError::InvalidEntry)?;
        self.append_owned_as(lane, partition, meta, payload, true)
    }

    /// Appends the `marker` of `handle`'s log at `meta` (control lane, no
    /// payload): [`Marker::Truncate`] cancels the entries of the handle
    /// from `meta.entry_index` on that lie before it in the journal,
    /// [`Marker::Commit`] records the log committed up to that index.
    /// Durable as any entry: await the ticket.
    ///
    /// # Errors
    /// [`JournalError::ReservedPartition`] for a handle with the marker
    /// bits set, [`JournalError::NotAppendable`] for index 0, and those of
    /// [`Journal::append`] (back-pressure, failed, closed).
    pub fn append_marker(
        &self,
        handle: PartitionHandle,
        marker: Marker,
        meta: EntryMeta,
        wanted: bool,
    ) -> Result<JournalTicket, JournalError> {
        if handle.0 & (MARKER_BITS | super::route::RELOCATED_BIT) != 0 {
            return Err(JournalError::ReservedPartition(handle.0));
        }
        if meta.entry_index == 0 {
            return Err(JournalError::NotAppendable("a marker names an entry index"));
        }
        let field = PartitionHandle(handle.0 | marker.bit());
        self.append_owned_as(Lane::Control, field, meta, Box::default(), wanted)
    }

    /// [`Journal::append_owned`] of an entry nobody waits for at once (a
    /// partition's claims, extends, releases and expiries, which reply
    /// without their own sync): with a commit delay set
    /// ([`Journal::set_commit_delay`]) a cycle of such entries only may wait
    /// for the delay, to ride the next cycle someone waits for. Awaiting
    /// its ticket takes the cycle at once.
    ///
    /// # Errors
    /// As [`Journal::append`].
    pub fn append_owned_deferred(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
    ) -> Result<JournalTicket, JournalError> {
        if partition.0 & MARKER_BITS != 0 && partition != FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        check_payload(&payload).map_err(JournalError::InvalidEntry)?;
        self.append_owned_as(lane, partition, meta, payload, false)
    }

    /// Queues an entry whose payload the caller checked (or a marker's
    /// empty one).
    fn append_owned_as(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
        wanted: bool,
    ) -> Result<JournalTicket, JournalError> {
        if partition == FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        let len_bytes = (ENTRY_HEADER_BYTES + payload.len()) as u64;
        let config = &self.shared.config;
        let max_bytes = match lane {
            Lane::Control => config.control_commit_bytes,
            Lane::Data => config.entry_bytes_max,
        };
        if len_bytes > max_bytes {
            return Err(JournalError::EntryTooLarge { lane, len_bytes, max_bytes });
        }
        let cell = {
            let mut state = self.shared.state.borrow_mut();
            if let Some(reason) = &state.failed {
                return Err(JournalError::Failed(reason.to_string()));
            }
            if state.closing {
                return Err(JournalError::Closed);
            }
            if lane == Lane::Data && state.disk_full {
                return Err(JournalError::DiskFull { file_bytes: state.next_len });
            }
            let limit_bytes = self.shared.pending_limit(lane);
            let queue = state.lane_mut(lane);
            if queue.pending_bytes + len_bytes > limit_bytes {
                return Err(JournalError::Backpressure {
                    lane,
                    pending_bytes: queue.pending_bytes,
                    limit_bytes,
                });
            }
            queue.pending_bytes += len_bytes;
            let cell = EntryCell::new(self.shared.wants.clone(), wanted);
            queue.entries.push_back(Pending { partition, meta, payload, cell: cell.clone() });
            // A deferred entry changes nothing a committer waits on unless
            // it is the first queued (a held cycle starts its delay) or
            // fills the control lane to a cycle's worth (the cycle is due).
            let due = state.control.entries.len() + state.data.entries.len() == 1
                || state.control.pending_bytes >= config.control_commit_bytes;
            (cell, due)
        };
        let (cell, due) = cell;
        if wanted || due {
            self.shared.wants.work.notify_all();
        }
        Ok(JournalTicket { cell })
    }

    /// Lets `amend` rewrite, in place, the payload of the entry `ticket`
    /// names while it is still queued in `lane` (no commit took it: its
    /// bytes are written as amended, as if appended so). `amend` returns
    /// whether it changed the payload; its length cannot change. Returns
    /// `false` without calling `amend` once a commit took the entry, or the
    /// journal failed or is closing.
    pub fn amend_queued(
        &self,
        lane: Lane,
        ticket: &JournalTicket,
        amend: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        if ticket.cell.position.get().is_some() {
            return false;
        }
        let mut state = self.shared.state.borrow_mut();
        if state.failed.is_some() || state.closing {
            return false;
        }
        // The entry amended is most often the newest of its lane.
        let queue = state.lane_mut(lane);
        let Some(entry) =
            queue.entries.iter_mut().rev().find(|entry| Rc::ptr_eq(&entry.cell, &ticket.cell))
        else {
            return false;
        };
        amend(&mut entry.payload)
    }

    /// Resolves when an entry of `len_bytes` (header included) would fit
    /// under `lane`'s bound, or the journal failed or closed (`append` then
    /// says why).
    pub async fn writable(&self, lane: Lane, len_bytes: u64) {
        let limit_bytes = self.shared.pending_limit(lane);
        loop {
            {
                let mut state = self.shared.state.borrow_mut();
                if state.failed.is_some() || state.closing {
                    return;
                }
                if state.lane_mut(lane).pending_bytes + len_bytes <= limit_bytes {
                    return;
                }
            }
            self.shared.space.wait().await;
        }
    }

    /// Whether an entry of `len_bytes` (header included) fits under
    /// `lane`'s bound now; also true once the journal failed or closed
    /// (`append` then says why).
    pub fn has_room(&self, lane: Lane, len_bytes: u64) -> bool {
        let limit_bytes = self.shared.pending_limit(lane);
        let mut state = self.shared.state.borrow_mut();
        state.failed.is_some()
            || state.closing
            || state.lane_mut(lane).pending_bytes + len_bytes <= limit_bytes
    }

    /// Stops accepting appends; [`Journal::background`] completes once every
    /// queued entry is durable.
    pub fn close(&self) {
        // A witness waiting out its delay is written at once.
        self.shared.state.borrow_mut().closing = true;
        for notify in [&self.shared.wants.work, &self.shared.prepare, &self.shared.space] {
            notify.notify_all();
        }
    }

    /// Every journal byte below this is durable.
    pub fn durable_position(&self) -> JournalPos {
        JournalPos(self.shared.state.borrow().durable_pos)
    }

    /// Where the next commit will start.
    pub fn next_position(&self) -> JournalPos {
        JournalPos(self.shared.state.borrow().build_pos)
    }

    /// Commits built and not yet part of the durable prefix.
    pub fn inflight_commits(&self) -> usize {
        self.shared.state.borrow().inflight.len()
    }

    /// Entry bytes queued in `lane`, not yet built into a commit.
    pub fn pending_bytes(&self, lane: Lane) -> u64 {
        self.shared.state.borrow_mut().lane_mut(lane).pending_bytes
    }

    /// `Some(reason)` once a write, sync, roll or preparation failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.state.borrow().failed.as_ref().map(|reason| reason.to_string())
    }

    pub fn stats(&self) -> JournalStats {
        self.shared.state.borrow().stats
    }

    /// Tells `observer` of every commit built and made durable from now on
    /// (replacing any earlier one).
    pub fn set_commit_observer(&self, observer: Rc<dyn CommitObserver>) {
        *self.shared.observer.borrow_mut() = Some(observer);
    }

    /// Makes every later witness entry wait for a future made by `delay`
    /// once the committers went idle, and be skipped if a commit is built
    /// meanwhile (its headers vouch for the same entries). The journal reads
    /// no clock: the owner's timer decides how long. The trade: an answered
    /// commit whose bytes are damaged on the medium before the delay ran
    /// out and a later commit or witness vouched for it is cut at recovery
    /// like a torn tail instead of refused (`shard-journal.md` §11).
    pub fn set_witness_delay(&self, delay: WitnessDelay) {
        *self.shared.witness_delay.borrow_mut() = Some(delay);
    }

    /// Lets a commit cycle whose queued entries were all appended with
    /// [`Journal::append_owned_deferred`] (and none of whose tickets is
    /// awaited) wait for `delay`, from when a committer could first build
    /// it, so that its entries ride the next cycle someone waits for
    /// instead of costing a write and a sync of their own. An entry
    /// appended with [`Journal::append`], a wait on any queued ticket, a
    /// full control lane and `close` end the delay; appends meanwhile do
    /// not restart it. Without it (the default) every cycle is built at
    /// once. (shard-journal.md §3, "Commit delay".)
    pub fn set_commit_delay(&self, delay: WitnessDelay) {
        self.shared.commit_delay.set(delay);
    }

    /// Whether a zero-filled `next.prep` is ready for the next roll.
    pub fn next_file_prepared(&self) -> bool {
        self.shared.state.borrow().prepared.is_some()
    }

    /// Whether data entries are refused because the next file could not
    /// be prepared for lack of disk space.
    pub fn disk_full(&self) -> bool {
        self.shared.state.borrow().disk_full
    }

    /// Asks the preparer to try again after [`Journal::disk_full`] (the
    /// broker's partitions call it every `DISK_FULL_RETRY_MS` while the
    /// disk is full; the journal reads no clock). Nothing while space is
    /// not short.
    pub fn retry_prepare(&self) {
        let mut state = self.shared.state.borrow_mut();
        if state.disk_full && !state.retry_asked {
            state.retry_asked = true;
            drop(state);
            self.shared.prepare.notify_all();
        }
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl<F: StorageFile> State<F> {
    fn lane_mut(&mut self, lane: Lane) -> &mut LaneQueue {
        match lane {
            Lane::Control => &mut self.control,
            Lane::Data => &mut self.data,
        }
    }
}

impl<S: Storage> Shared<S> {
    fn pending_limit(&self, lane: Lane) -> u64 {
        match lane {
            Lane::Control => self.config.control_pending_bytes_max,
            Lane::Data => self.config.data_pending_bytes_max,
        }
    }

    /// Enters the failed state once: fails every unacknowledged entry, wakes
    /// every waiter and calls the fatal handler. Never retried: after a
    /// failed write or sync the page cache state is unknown.
    pub(super) fn fail(&self, code: FatalCode, error: &IoError) {
        let message = format!("{code:?}: {error}");
        let cells = {
            let mut state = self.state.borrow_mut();
            if state.failed.is_some() {
                return;
            }
            state.failed = Some(Rc::from(message.as_str()));
            let mut cells: Vec<Rc<EntryCell>> =
                state.inflight.values().flat_map(|commit| commit.cells.iter().cloned()).collect();
            let state = &mut *state;
            for lane in [&mut state.control, &mut state.data] {
                cells.extend(lane.entries.drain(..).map(|pending| pending.cell));
                lane.pending_bytes = 0;
            }
            state.inflight.clear();
            self.wants.queued.set(0);
            cells
        };
        let reason: Rc<str> = Rc::from(message.as_str());
        for cell in cells {
            cell.resolve(EntryStatus::Failed(reason.clone()));
        }
        for notify in [
            &self.wants.work,
            &self.durable,
            &self.named,
            &self.prepare,
            &self.prepared,
            &self.space,
        ] {
            notify.notify_all();
        }
        self.fatal.fatal(&FatalReason { code, message });
    }

    fn is_failed(&self) -> bool {
        self.state.borrow().failed.is_some()
    }

    /// Waits until a commit can be built (room in flight, entries queued)
    /// and builds it, or builds a witness entry once the committers went
    /// idle; `None` when closed and drained (witness included), or failed.
    async fn next_job(&self) -> Option<Job<S::File>> {
        loop {
            // A witness delay this committer is to wait out (only one does).
            let mut witness_delay = None;
            // The held commit (by its seq) whose commit delay this
            // committer is to wait out (only one does).
            let mut defer = None;
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return None;
                }
                // In-flight bound: commits already synced but behind an
                // unsynced one still count, so no committer writes more than
                // `inflight_commits_max` commits past the durable watermark.
                let room = state.inflight.len() < self.config.inflight_commits_max;
                let queued = !state.control.entries.is_empty() || !state.data.entries.is_empty();
                let held = queued && room && self.held(&state);
                if held && !state.defer_armed {
                    state.defer_armed = true;
                    defer = Some(state.next_seq);
                }
                if room && queued && !held {
                    let job = self.build_commit(&mut state);
                    drop(state);
                    self.space.notify_all();
                    return Some(job);
                }
                // Idle: nothing queued in either lane, nothing in flight,
                // and the last durable entries vouched for by no header.
                if !queued
                    && state.inflight.is_empty()
                    && state.entries_end > state.recorded_watermark
                {
                    match self.witness_delay.borrow().clone() {
                        Some(delay) if !state.witness_ripe && !state.closing => {
                            if !state.witness_armed {
                                state.witness_armed = true;
                                witness_delay = Some(delay);
                            }
                        }
                        _ => {
                            state.witness_ripe = false;
                            return Some(self.build_witness(&mut state));
                        }
                    }
                }
                if witness_delay.is_none() && state.closing && room && !queued {
                    return None;
                }
            }
            match witness_delay {
                Some(delay) => {
                    let ran_out = crate::log::work_or_witness_delay(&self.wants.work, &delay).await;
                    let mut state = self.state.borrow_mut();
                    state.witness_armed = false;
                    state.witness_ripe |= ran_out;
                }
                None => self.work_wait(defer).await,
            }
        }
    }

    /// Whether the next cycle may be held back: nobody waits for any queued
    /// entry, a commit delay is set and has not run out for it, the control
    /// lane would not fill a cycle, and the journal is not closing.
    fn held(&self, state: &State<S::File>) -> bool {
        self.wants.queued.get() == 0
            && !state.closing
            && state.defer_ripe != Some(state.next_seq)
            && state.control.pending_bytes < self.config.control_commit_bytes
            && state.data.entries.is_empty()
            && self.commit_delay.is_set()
    }

    /// Waits for new work or, when `defer` names the held commit this
    /// committer waits out, for its commit delay to run out, whichever
    /// comes first ([`crate::log::HeldDelay::wait`]).
    async fn work_wait(&self, defer: Option<u64>) {
        let Some(seq) = defer else {
            self.wants.work.wait().await;
            return;
        };
        let ran_out = self.commit_delay.wait(&self.wants.work, seq).await;
        let mut state = self.state.borrow_mut();
        state.defer_armed = false;
        if ran_out {
            state.defer_ripe = Some(seq);
        } else if state.next_seq != seq {
            // Another committer built it meanwhile.
            self.commit_delay.taken(seq);
        }
    }

    /// Takes the cycle's entries — control first, then data — assigns their
    /// positions, stamps the durable watermark known now, closes the last
    /// page with a filler and puts the commit in flight.
    fn build_commit(&self, state: &mut State<S::File>) -> Job<S::File> {
        // This commit's headers vouch for every entry durable before it.
        state.witness_ripe = false;
        self.commit_delay.taken(state.next_seq);
        let config = &self.config;
        let mut taken: Vec<(Pending, Lane)> = Vec::new();
        let mut control_bytes = 0;
        while let Some(front) = state.control.entries.front() {
            let len = front.entry_bytes();
            if control_bytes + len > config.control_commit_bytes {
                break;
            }
            control_bytes += len;
            state.control.pending_bytes -= len;
            if let Some(entry) = state.control.entries.pop_front() {
                taken.push((entry, Lane::Control));
            }
        }
        let mut total = control_bytes;
        let mut data_taken = false;
        while let Some(front) = state.data.entries.front() {
            let len = front.entry_bytes();
            // The cycle's first data entry always goes, so a data entry
            // larger than what control left of `commit_bytes` still moves.
            if data_taken && total + len > config.commit_bytes {
                break;
            }
            total += len;
            data_taken = true;
            state.data.pending_bytes -= len;
            if let Some(entry) = state.data.entries.pop_front() {
                taken.push((entry, Lane::Data));
            }
        }
        assert!(!taken.is_empty(), "a commit is built only with entries queued");
        let span = commit_span(total);
        assert!(span <= config.commit_span_max());
        let opens_file = self.place(state, span);
        let seq = state.next_seq;
        state.next_seq += 1;
        let pos = state.build_pos;
        let watermark = JournalPos(state.durable_pos);
        assert!(watermark.0 <= pos);
        state.recorded_watermark = state.recorded_watermark.max(watermark.0);
        let mut buf = state.alloc_file.alloc_buf(span as usize);
        let buf_bytes = buf.as_mut().len();
        assert_eq!(buf_bytes as u64, span);
        let bytes = buf.as_mut();
        let mut at = 0usize;
        let mut cells = Vec::with_capacity(taken.len());
        let (mut control_entries, mut data_entries) = (0, 0);
        for (entry, lane) in taken {
            let len = entry.entry_bytes() as usize;
            let position = pos + at as u64;
            let header = EntryHeader::v2(
                entry.partition,
                JournalPos(position),
                watermark,
                u32::try_from(len).expect("entry length checked at append"),
                entry.meta.entry_index,
                entry.meta.term,
            );
            header.write_to(&mut bytes[at..at + ENTRY_HEADER_BYTES]);
            bytes[at + ENTRY_HEADER_BYTES..at + len].copy_from_slice(&entry.payload);
            entry.cell.taken();
            entry.cell.position.set(Some(position));
            entry.cell.commit_seq.set(Some(seq));
            cells.push(entry.cell);
            match lane {
                Lane::Control => control_entries += 1,
                Lane::Data => data_entries += 1,
            }
            at += len;
        }
        if span > total {
            write_filler(&mut bytes[at..], JournalPos(pos + total), watermark);
        }
        state.build_pos = pos + span;
        state.stats.commits_built += 1;
        if let Some(observer) = &*self.observer.borrow() {
            observer.built(seq);
        }
        let buf = Rc::new(buf);
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                witness: false,
                pos,
                buf: buf.clone(),
                end_pos: pos + span,
                span,
                cells,
                control_entries,
                data_entries,
            },
        );
        Job { seq, witness: false, pos, buf, file: state.build_file.clone(), opens_file }
    }

    /// Moves the build position to the next file when `span` does not fit
    /// in the rest of the current one; true when it did (the commit opens
    /// that file).
    fn place(&self, state: &mut State<S::File>, span: u64) -> bool {
        if state.build_pos + span <= state.build_file.end() {
            return false;
        }
        let base = state.build_file.end();
        let len_bytes = if state.placed.is_empty() {
            state.prepared.as_ref().map_or(state.next_len, |(_, len)| *len)
        } else {
            // The next file is placed already: this is the one after it.
            self.config.file_bytes
        };
        state.placed.push_back(len_bytes);
        state.build_file = Rc::new(JournalFile { base, len_bytes, file: RefCell::new(None) });
        state.build_pos = base;
        self.prepare.notify_all();
        true
    }

    /// Builds a witness entry (`shard-journal.md` §11, "Witness entries"):
    /// one page holding one filler whose watermark is the durable
    /// watermark, which covers every entry written so far, at the build
    /// position. It is an ordinary commit without tickets: it consumes its
    /// page (the next commit starts after it, nothing is written twice),
    /// joins the in-flight sequence, and the durable watermark passes it
    /// only once it is synced — so no entry after it is answered before it
    /// is durable.
    fn build_witness(&self, state: &mut State<S::File>) -> Job<S::File> {
        assert!(state.inflight.is_empty(), "a witness is built only when idle");
        let span = PAGE_BYTES;
        let opens_file = self.place(state, span);
        let seq = state.next_seq;
        state.next_seq += 1;
        let pos = state.build_pos;
        let watermark = state.durable_pos;
        assert!(watermark <= pos);
        assert!(watermark >= state.entries_end, "idle: every entry is durable");
        state.recorded_watermark = state.recorded_watermark.max(watermark);
        let mut buf = state.alloc_file.alloc_buf(span as usize);
        write_filler(buf.as_mut(), JournalPos(pos), JournalPos(watermark));
        state.build_pos = pos + span;
        let buf = Rc::new(buf);
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                witness: true,
                pos,
                buf: buf.clone(),
                end_pos: pos + span,
                span,
                cells: Vec::new(),
                control_entries: 0,
                data_entries: 0,
            },
        );
        Job { seq, witness: true, pos, buf, file: state.build_file.clone(), opens_file }
    }

    /// Marks `seq` synced and advances the durable watermark over the
    /// contiguous synced prefix, resolving those entries' tickets.
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
                assert!(done.end_pos > state.durable_pos);
                state.durable_seq = seq;
                state.durable_pos = done.end_pos;
                if done.witness {
                    // Holds no entry: not cached, not a commit to observe.
                    state.stats.witnesses += 1;
                    continue;
                }
                state.entries_end = done.end_pos;
                state.stats.commits += 1;
                state.stats.control_entries += done.control_entries;
                state.stats.data_entries += done.data_entries;
                state.stats.commit_bytes += done.span;
                if let Some(observer) = &*self.observer.borrow() {
                    observer.durable(seq, done.span);
                }
                resolved.extend(done.cells);
                let cache_max = self.config.read_cache_bytes;
                if done.span <= cache_max {
                    state.cache.push_back(CachedCommit { pos: done.pos, buf: done.buf });
                    state.cache_bytes += done.span;
                    while state.cache_bytes > cache_max {
                        let Some(old) = state.cache.pop_front() else { break };
                        state.cache_bytes -= old.buf.as_ref().as_ref().len() as u64;
                    }
                }
            }
        }
        for cell in resolved {
            cell.resolve(EntryStatus::Durable);
        }
        self.durable.notify_all();
        // Commits left the in-flight map: a committer held by the bound may
        // build the next one.
        self.wants.work.notify_all();
    }

    /// Names the prepared file for `job`'s new file once every earlier
    /// commit is durable. False when the journal failed.
    async fn roll(&self, job: &Job<S::File>) -> bool {
        loop {
            {
                let state = self.state.borrow();
                if state.failed.is_some() {
                    return false;
                }
                if state.durable_seq + 1 == job.seq {
                    break;
                }
            }
            self.durable.wait().await;
        }
        let prepared = loop {
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return false;
                }
                if let Some((file, len_bytes)) = state.prepared.take() {
                    state.roll_waiting = false;
                    state.renaming = true;
                    let placed = state.placed.pop_front();
                    if placed != Some(len_bytes) || len_bytes != job.file.len_bytes {
                        drop(state);
                        let reason = format!(
                            "the prepared journal file has {len_bytes} bytes, the commit was \
                             placed in one of {} (placed {placed:?}): not rolled",
                            job.file.len_bytes
                        );
                        let error = IoError::new(
                            IoOp::Rename,
                            &self.dir,
                            None,
                            std::io::Error::other(reason),
                        );
                        self.fail(FatalCode::RollFailed, &error);
                        return false;
                    }
                    // The file after this one: as placed, else the full size.
                    state.next_len =
                        state.placed.front().copied().unwrap_or(self.config.file_bytes);
                    break file;
                }
                state.roll_waiting = true;
            }
            self.prepare.notify_all();
            self.prepared.wait().await;
        };
        let named = async {
            let path = name_prepared(&self.storage, &self.dir, job.file.base).await?;
            drop(prepared);
            self.storage.open(&path).await
        };
        let file = match named.await {
            Ok(file) => Rc::new(file),
            Err(error) => {
                self.fail(FatalCode::RollFailed, &error);
                return false;
            }
        };
        {
            let mut state = self.state.borrow_mut();
            state.renaming = false;
            let path = journal_file_path(&self.dir, job.file.base);
            state.files.insert(
                job.file.base,
                FileSlot { path, file: Some(file.clone()), len_bytes: Some(job.file.len_bytes) },
            );
            *job.file.file.borrow_mut() = Some(file.clone());
            state.alloc_file = file;
            state.stats.files_rolled += 1;
        }
        self.named.notify_all();
        self.prepare.notify_all();
        true
    }

    async fn wait_named(&self, file: &JournalFile<S::File>) -> Option<Rc<S::File>> {
        loop {
            if self.is_failed() {
                return None;
            }
            if let Some(file) = file.file.borrow().clone() {
                return Some(file);
            }
            self.named.wait().await;
        }
    }
}
