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
//!
//! This file holds the appender's state, its opening, its background task
//! and its accessors, and the failure that ends it. Queueing entries is
//! `append.rs`; building a commit or a witness, `build.rs`; writing,
//! syncing, rolling and the durable watermark, `committer.rs`; keeping the
//! next file ready, `preparer.rs`. Reads of what it wrote are `read.rs`'s
//! (from `read_cache.rs`'s pieces of its state); releasing old files,
//! `retention.rs`'s.

mod append;
mod build;
mod committer;
mod preparer;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use super::config::JournalConfig;
use super::entry::ENTRY_HEADER_BYTES;
use super::error::JournalError;
use super::read_cache::{CachedCommit, FileSlot, ReadChunk};
use super::recovery::{recover, RecoveryReport, RecoverySink};
use super::{EntryCell, EntryStatus, JournalPos, Lane, PartitionHandle, Wants};
use crate::io::{IoError, Storage, StorageFile};
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
    pub(super) chunks: VecDeque<ReadChunk>,
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
}
