//! The vote log: each partition's Raft vote state — its term and the node
//! it voted for in that term — made durable per shard, so a node never
//! votes twice in one term across crashes. A partition's entries and its
//! committed index live in the shard journal (`docs/design/shard-journal.md`
//! §14); this is the rest of its Raft `HardState`. Design and crash cases:
//! §16 of that page.
//!
//! **File.** One per shard directory, `votes` (and `votes.tmp` while a
//! compaction writes its replacement). It is a run of **cycles**: each
//! cycle is one `write_at` of whole pages starting on a fresh page, holding
//! 32-byte records (partition handle, cycle number, term, vote, a format
//! version byte, a crc32c and an end mark: `record.rs`), then zeros to the
//! page end. Cycles are numbered 1, 2, … within a file.
//!
//! **Writes: whole new pages, never a page rewritten in place.** §15 does
//! not assume sector atomicity. Rewriting the tail page with the records
//! before it unchanged would be safe under its model (a torn sector keeps a
//! prefix of the new bytes, and those bytes equal the old ones), but it puts
//! acknowledged votes under every later write: a device that loses or
//! garbles a whole sector on power loss would take them with it. Appending
//! whole new pages means a torn write only ever touches pages no caller was
//! answered for. The price is a page per cycle (4 KiB for a lone vote),
//! which compaction bounds; votes are rare outside election storms, and a
//! storm is batched.
//!
//! **Group commit.** [`VoteLog::persist`] checks its updates (a term below
//! the partition's last accepted one, or another vote in a term that has
//! one, is a caller bug: [`VoteError::TermBehind`], [`VoteError::VoteChanged`]),
//! queues them (one pending record per partition: a newer update replaces a
//! queued one) and takes a ticket. A caller that finds no cycle running
//! runs one: it takes every queued record, writes them as one cycle,
//! fdatasyncs, and answers every ticket issued before it took them; callers
//! arriving meanwhile wait and one of them runs the next cycle. One write
//! and one fdatasync per cycle, one cycle at a time, so a cycle is written
//! only after the one before it is durable.
//!
//! **Recovery** ([`VoteLog::open`], `record::scan`). Every cycle but the
//! last is intact (it was synced before the next was written). The last may
//! be torn in any way a write into zeros can be (§15): each slot zero, a
//! prefix of its record (end mark missing), or whole. So the scan refuses
//! a slot whose end mark is there but whose crc, version or reserved bytes
//! are wrong (no tear makes one), and any flaw in a cycle followed by a
//! later cycle (it was synced: that is damage), naming the file and byte
//! ([`VoteError::Damaged`]); in the last cycle it keeps the leading intact
//! records and cuts the rest. A cut tail is never zeroed in place (a torn
//! zeroing would leave shapes a torn append cannot, which the next open
//! would refuse): the file is rewritten by compaction. The file and its
//! directory are synced before `open` returns, so nothing it reports can
//! vanish in a later crash.
//!
//! **Compaction.** Before a cycle, when the file would pass the bound
//! ([`VOTE_LOG_BYTES_MAX`], or a smaller one set with
//! [`VoteLog::set_compact_bytes`]) and rewriting would shrink it, or when
//! the file would hold records of more than [`VOTE_PARTITIONS_MAX`]
//! partitions: the last durable
//! vote of every partition not forgotten is written to `votes.tmp` as cycle
//! 1, fdatasynced, renamed over `votes`, and the directory synced; then the
//! cycle appends to the new file. A crash leaves `votes` old or new, both
//! whole; a leftover `votes.tmp` is removed. [`VoteLog::forget`] drops a
//! deleted partition: its record is left out of the next compaction.
//!
//! **Failures.** A failed write or sync is never retried (§15): the log
//! refuses everything after it ([`VoteError::Failed`]). A cycle abandoned
//! by its caller (the future dropped mid-write) puts its records back in
//! the queue, and the next cycle compacts first: what reached the old
//! file's tail is unknown, so nothing is appended to it.

mod limits;
mod record;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use thiserror::Error;

use crate::io::{create_dir_durable, IoError, Storage, StorageFile};
use crate::limits::PAGE_BYTES;
use crate::log::journal::PartitionHandle;
use crate::log::wakers::Notify;
pub use limits::{VOTE_LOG_BYTES_MAX, VOTE_LOG_BYTES_MIN, VOTE_PARTITIONS_MAX};
use record::{cycle_len, encode_cycle, scan};
pub use record::{Vote, END_MARK, FORMAT_VERSION, RECORD_LEN};

/// Name of the vote log in a shard directory.
pub const VOTES_FILE_NAME: &str = "votes";
/// Name of the file a compaction writes; renamed over [`VOTES_FILE_NAME`].
pub const VOTES_TEMP_NAME: &str = "votes.tmp";

/// Every way the vote log fails.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VoteError {
    #[error(transparent)]
    Io(#[from] IoError),
    /// Damage no torn write explains: a durable vote may be lost, so the
    /// shard does not start on it.
    #[error("vote log {}: damaged at byte {pos}: {reason}", path.display())]
    Damaged { path: PathBuf, pos: u64, reason: String },
    #[error("vote log {}: {len_bytes} bytes, more than {max_bytes}", path.display())]
    TooLarge { path: PathBuf, len_bytes: u64, max_bytes: u64 },
    /// A caller bug: terms never go back.
    #[error("partition {handle}: term {term} is below its persisted term {persisted}")]
    TermBehind { handle: PartitionHandle, term: u64, persisted: u64 },
    /// A caller bug: a node votes at most once per term.
    #[error("partition {handle}: term {term} already holds a vote for {voted}, not {asked}")]
    VoteChanged { handle: PartitionHandle, term: u64, voted: u64, asked: u64 },
    #[error("partition {handle} refused: {max} partitions already hold votes")]
    TooManyPartitions { handle: PartitionHandle, max: usize },
    #[error("compaction bound {bytes} outside [{min}, {max}]")]
    CompactBytes { bytes: u64, min: u64, max: u64 },
    /// A write or sync failed earlier; nothing more is accepted.
    #[error("vote log failed: {0}")]
    Failed(String),
}

/// Counters of one log since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VoteLogStats {
    /// Cycles written (each one write and one fdatasync).
    pub cycles: u64,
    /// Records those cycles held.
    pub records: u64,
    /// Compactions (the one a torn tail at open needs included).
    pub compactions: u64,
}

struct State<F> {
    file: Rc<F>,
    /// Where the next cycle goes: a page boundary, zeros from here on.
    end: u64,
    next_cycle: u32,
    compact_bytes: u64,
    /// The last durable vote of each partition not forgotten.
    durable: BTreeMap<PartitionHandle, Vote>,
    /// The last accepted vote of each partition not forgotten: durable,
    /// in flight or queued. Updates are checked against it.
    accepted: BTreeMap<PartitionHandle, Vote>,
    /// Queued for the next cycle.
    pending: BTreeMap<PartitionHandle, Vote>,
    /// Forgotten partitions with records in the current file.
    forgotten_in_file: BTreeSet<PartitionHandle>,
    /// Last ticket handed out.
    issued: u64,
    /// Every ticket up to this one is durable.
    covered: u64,
    /// A cycle is running.
    writing: bool,
    /// A cycle was abandoned: compact before appending again.
    fresh_file_due: bool,
    failed: Option<String>,
    stats: VoteLogStats,
}

/// The vote log of one shard. Single-threaded (thread-per-core): share it
/// by reference or `Rc` among the shard's tasks.
pub struct VoteLog<S: Storage> {
    storage: S,
    dir: PathBuf,
    state: RefCell<State<S::File>>,
    /// Notified after every cycle, failed or abandoned ones included.
    cycled: Notify,
    /// When it was opened, if it held no vote then (a shard that never
    /// voted, or whose directory was lost: `fresh_since`).
    fresh_since: Option<crate::clock::Instant>,
}

/// Writes `records` as a new file (cycle 1), syncs it, renames it over the
/// vote log and syncs the directory; returns the file opened under its
/// name, its length and its next cycle number.
async fn write_compacted<S: Storage>(
    storage: &S,
    dir: &Path,
    records: &BTreeMap<PartitionHandle, Vote>,
) -> Result<(S::File, u64, u32), IoError> {
    let temp = dir.join(VOTES_TEMP_NAME);
    // One left by a failed or abandoned compaction may be longer: start clean.
    if storage.list_dir(dir).await?.iter().any(|name| name == VOTES_TEMP_NAME) {
        storage.remove(&temp).await?;
    }
    let file = storage.open(&temp).await?;
    let len = cycle_len(records.len());
    if len > 0 {
        let mut buf = file.alloc_buf(len as usize);
        encode_cycle(buf.as_mut(), 1, records.iter().map(|(handle, vote)| (*handle, *vote)));
        file.write_at(Rc::new(buf), 0).await?;
    }
    file.fdatasync().await?;
    drop(file);
    let path = dir.join(VOTES_FILE_NAME);
    storage.rename(&temp, &path).await?;
    storage.sync_dir(dir).await?;
    let file = storage.open(&path).await?;
    Ok((file, len, if records.is_empty() { 1 } else { 2 }))
}

/// Whether `next` may follow `last` for `handle`.
fn check(handle: PartitionHandle, last: Vote, next: Vote) -> Result<(), VoteError> {
    if next.term < last.term {
        return Err(VoteError::TermBehind { handle, term: next.term, persisted: last.term });
    }
    if next.term == last.term && last.vote != 0 && next.vote != last.vote {
        return Err(VoteError::VoteChanged {
            handle,
            term: next.term,
            voted: last.vote,
            asked: next.vote,
        });
    }
    Ok(())
}

impl<S: Storage> VoteLog<S> {
    /// Opens the vote log of shard directory `dir` (creating the directory
    /// and the file as needed) and returns it with the last vote of every
    /// partition it holds. A torn last cycle is cut (the file rewritten);
    /// everything returned is durable.
    ///
    /// # Errors
    /// [`VoteError::Damaged`] naming the file and byte, [`VoteError::TooLarge`],
    /// [`VoteError::Io`].
    pub async fn open(
        storage: S,
        dir: &Path,
    ) -> Result<(Self, BTreeMap<PartitionHandle, Vote>), VoteError> {
        create_dir_durable(&storage, dir).await?;
        if storage.list_dir(dir).await?.iter().any(|name| name == VOTES_TEMP_NAME) {
            storage.remove(&dir.join(VOTES_TEMP_NAME)).await?;
        }
        let path = dir.join(VOTES_FILE_NAME);
        let file = storage.open(&path).await?;
        let len_bytes = file.len_bytes().await?;
        if len_bytes > VOTE_LOG_BYTES_MAX {
            return Err(VoteError::TooLarge { path, len_bytes, max_bytes: VOTE_LOG_BYTES_MAX });
        }
        let scanned = if len_bytes == 0 {
            scan(&[])
        } else {
            let read_len = len_bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES;
            scan(&file.read_at(0, read_len as usize).await?)
        };
        let scanned = scanned.map_err(|damage| VoteError::Damaged {
            path: path.clone(),
            pos: damage.pos,
            reason: damage.reason,
        })?;
        if scanned.latest.len() > VOTE_PARTITIONS_MAX {
            return Err(VoteError::Damaged {
                path,
                pos: 0,
                reason: format!(
                    "{} partitions, more than the log ever holds",
                    scanned.latest.len()
                ),
            });
        }
        let mut stats = VoteLogStats::default();
        let (file, end, next_cycle) = if scanned.repair {
            drop(file);
            stats.compactions += 1;
            write_compacted(&storage, dir, &scanned.latest).await?
        } else {
            // What was read may be written and not yet durable (a killed
            // process): make it durable before anyone acts on it.
            file.fdatasync().await?;
            storage.sync_dir(dir).await?;
            (file, scanned.end, scanned.next_cycle)
        };
        let state = State {
            file: Rc::new(file),
            end,
            next_cycle,
            compact_bytes: VOTE_LOG_BYTES_MAX,
            durable: scanned.latest.clone(),
            accepted: scanned.latest.clone(),
            pending: BTreeMap::new(),
            forgotten_in_file: BTreeSet::new(),
            issued: 0,
            covered: 0,
            writing: false,
            fresh_file_due: false,
            failed: None,
            stats,
        };
        let fresh_since = scanned.latest.is_empty().then(crate::clock::instant_now);
        let log = Self {
            storage,
            dir: dir.to_path_buf(),
            state: RefCell::new(state),
            cycled: Notify::default(),
            fresh_since,
        };
        Ok((log, scanned.latest))
    }

    /// When this log was opened holding no vote at all: the shard never
    /// voted, or lost the votes it made with its data directory (a member
    /// then abstains from elections for a while:
    /// `docs/design/replication.md` §3, "A member that lost its votes").
    pub fn fresh_since(&self) -> Option<crate::clock::Instant> {
        self.fresh_since
    }

    /// Sets the size past which the file is compacted (default and largest
    /// [`VOTE_LOG_BYTES_MAX`]; tests set small ones).
    ///
    /// # Errors
    /// [`VoteError::CompactBytes`] outside [`VOTE_LOG_BYTES_MIN`]..=[`VOTE_LOG_BYTES_MAX`].
    pub fn set_compact_bytes(&self, bytes: u64) -> Result<(), VoteError> {
        if !(VOTE_LOG_BYTES_MIN..=VOTE_LOG_BYTES_MAX).contains(&bytes) {
            return Err(VoteError::CompactBytes {
                bytes,
                min: VOTE_LOG_BYTES_MIN,
                max: VOTE_LOG_BYTES_MAX,
            });
        }
        self.state.borrow_mut().compact_bytes = bytes;
        Ok(())
    }

    /// Makes `updates` durable: returns once a cycle holding each of them
    /// (or a later vote of the same partition) is fdatasynced. Updates are
    /// checked first, all or none accepted; a partition listed twice takes
    /// its last. An update equal to the partition's durable vote costs no
    /// I/O. Dropping the future does not withdraw accepted updates: they go
    /// with the next cycle.
    ///
    /// # Errors
    /// [`VoteError::TermBehind`], [`VoteError::VoteChanged`] and
    /// [`VoteError::TooManyPartitions`] (nothing accepted);
    /// [`VoteError::Io`] for the caller whose cycle failed and
    /// [`VoteError::Failed`] for every other caller then and after.
    pub async fn persist(&self, updates: &[(PartitionHandle, Vote)]) -> Result<(), VoteError> {
        let Some(ticket) = self.accept(updates)? else { return Ok(()) };
        loop {
            let cycled = self.cycled.wait();
            let writing = {
                let state = self.state.borrow();
                if state.covered >= ticket {
                    return Ok(());
                }
                if let Some(reason) = &state.failed {
                    return Err(VoteError::Failed(reason.clone()));
                }
                state.writing
            };
            if writing {
                cycled.await;
            } else {
                drop(cycled);
                self.cycle(false).await?;
            }
        }
    }

    /// Checks and queues `updates`; the ticket to wait for, or none when
    /// everything is durable already.
    fn accept(&self, updates: &[(PartitionHandle, Vote)]) -> Result<Option<u64>, VoteError> {
        let mut state = self.state.borrow_mut();
        if let Some(reason) = &state.failed {
            return Err(VoteError::Failed(reason.clone()));
        }
        let mut taken: BTreeMap<PartitionHandle, Vote> = BTreeMap::new();
        let mut added = 0;
        for (handle, vote) in updates {
            match taken.get(handle).or_else(|| state.accepted.get(handle)) {
                Some(last) => check(*handle, *last, *vote)?,
                None => {
                    added += 1;
                    if state.accepted.len() + added > VOTE_PARTITIONS_MAX {
                        return Err(VoteError::TooManyPartitions {
                            handle: *handle,
                            max: VOTE_PARTITIONS_MAX,
                        });
                    }
                }
            }
            taken.insert(*handle, *vote);
        }
        let mut queued = false;
        for (handle, vote) in taken {
            let durable = state.durable.get(&handle) == Some(&vote);
            if durable && state.accepted.get(&handle) == Some(&vote) {
                continue;
            }
            state.accepted.insert(handle, vote);
            state.pending.insert(handle, vote);
            queued = true;
        }
        if !queued {
            return Ok(None);
        }
        state.issued += 1;
        Ok(Some(state.issued))
    }

    /// Compacts the file now (with any queued updates written after),
    /// waiting for a running cycle first.
    ///
    /// # Errors
    /// As [`VoteLog::persist`].
    pub async fn compact(&self) -> Result<(), VoteError> {
        loop {
            let cycled = self.cycled.wait();
            let writing = {
                let state = self.state.borrow();
                if let Some(reason) = &state.failed {
                    return Err(VoteError::Failed(reason.clone()));
                }
                state.writing
            };
            if !writing {
                drop(cycled);
                return self.cycle(true).await;
            }
            cycled.await;
        }
    }

    /// Forgets a deleted partition: its queued update is dropped, its
    /// votes are no longer checked or returned by [`VoteLog::get`], and its
    /// record is left out of the next compaction (until then a recovery
    /// still returns it). Call it after the partition's last `persist`
    /// returned; a vote persisted after it starts the partition afresh.
    pub fn forget(&self, handle: PartitionHandle) {
        let mut state = self.state.borrow_mut();
        state.accepted.remove(&handle);
        state.pending.remove(&handle);
        if state.durable.remove(&handle).is_some() {
            state.forgotten_in_file.insert(handle);
        }
    }

    /// The last durable vote of `handle`.
    pub fn get(&self, handle: PartitionHandle) -> Option<Vote> {
        self.state.borrow().durable.get(&handle).copied()
    }

    /// Partitions with a durable vote.
    pub fn len(&self) -> usize {
        self.state.borrow().durable.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> VoteLogStats {
        self.state.borrow().stats
    }

    /// Why the log stopped, once a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        self.state.borrow().failed.clone()
    }

    /// The path of the vote log.
    pub fn path(&self) -> PathBuf {
        self.dir.join(VOTES_FILE_NAME)
    }

    /// Runs one cycle: compacts first when due (or `force_compact`), then
    /// writes and syncs every queued record, then answers the tickets
    /// issued before they were taken.
    async fn cycle(&self, force_compact: bool) -> Result<(), VoteError> {
        let (batch, covers, compact) = {
            let mut state = self.state.borrow_mut();
            state.writing = true;
            let batch = std::mem::take(&mut state.pending);
            let new_partitions = batch
                .keys()
                .filter(|handle| {
                    !state.durable.contains_key(handle) && !state.forgotten_in_file.contains(handle)
                })
                .count();
            let grown = state.end + cycle_len(batch.len()) > state.compact_bytes
                && cycle_len(state.durable.len()) < state.end;
            let crowded = state.durable.len() + state.forgotten_in_file.len() + new_partitions
                > VOTE_PARTITIONS_MAX;
            let compact = force_compact || state.fresh_file_due || grown || crowded;
            (batch, state.issued, compact)
        };
        let mut guard = CycleGuard { log: self, batch: Some(batch) };
        let result = match guard.batch.as_ref() {
            Some(batch) => self.write_cycle(batch, compact).await,
            None => Ok(()),
        };
        let batch = guard.batch.take().unwrap_or_default();
        let mut state = self.state.borrow_mut();
        state.writing = false;
        match &result {
            Ok(()) => {
                for (handle, vote) in batch {
                    if state.accepted.contains_key(&handle) {
                        state.durable.insert(handle, vote);
                        state.forgotten_in_file.remove(&handle);
                    } else {
                        state.forgotten_in_file.insert(handle);
                    }
                }
                state.covered = state.covered.max(covers);
            }
            Err(error) => state.failed = Some(error.to_string()),
        }
        drop(state);
        self.cycled.notify_all();
        result.map_err(VoteError::from)
    }

    /// The I/O of a cycle.
    async fn write_cycle(
        &self,
        batch: &BTreeMap<PartitionHandle, Vote>,
        compact: bool,
    ) -> Result<(), IoError> {
        if compact {
            let durable = self.state.borrow().durable.clone();
            let (file, end, next_cycle) =
                write_compacted(&self.storage, &self.dir, &durable).await?;
            let mut state = self.state.borrow_mut();
            state.file = Rc::new(file);
            state.end = end;
            state.next_cycle = next_cycle;
            state.forgotten_in_file.clear();
            state.fresh_file_due = false;
            state.stats.compactions += 1;
        }
        if batch.is_empty() {
            return Ok(());
        }
        let (file, pos, cycle) = {
            let state = self.state.borrow();
            (state.file.clone(), state.end, state.next_cycle)
        };
        let len = cycle_len(batch.len());
        let mut buf = file.alloc_buf(len as usize);
        encode_cycle(buf.as_mut(), cycle, batch.iter().map(|(handle, vote)| (*handle, *vote)));
        file.write_at(Rc::new(buf), pos).await?;
        file.fdatasync().await?;
        let mut state = self.state.borrow_mut();
        state.end = pos + len;
        // At most one cycle per page of a file no larger than the bound
        // (asserted in `limits.rs`), so this never saturates.
        state.next_cycle = cycle.saturating_add(1);
        state.stats.cycles += 1;
        state.stats.records += batch.len() as u64;
        Ok(())
    }
}

/// A running cycle's records. Dropped while it still holds them (the
/// cycle's future was dropped mid-I/O), it puts them back in the queue and
/// has the next cycle start a fresh file.
struct CycleGuard<'a, S: Storage> {
    log: &'a VoteLog<S>,
    batch: Option<BTreeMap<PartitionHandle, Vote>>,
}

impl<S: Storage> Drop for CycleGuard<'_, S> {
    fn drop(&mut self) {
        let Some(batch) = self.batch.take() else { return };
        let mut state = self.log.state.borrow_mut();
        state.writing = false;
        state.fresh_file_due = true;
        for (handle, vote) in batch {
            if state.accepted.contains_key(&handle) {
                state.pending.entry(handle).or_insert(vote);
            }
        }
        drop(state);
        self.log.cycled.notify_all();
    }
}
