//! `PartitionLog`: what a partition needs of its log, behind one type.
//!
//! Every partition is a view of its shard's journal
//! ([`JournalPartition`], `docs/design/shard-journal.md`): its own dense
//! data offsets, its entries interleaved with the other partitions' in the
//! shard's files. The rest of `partition/` speaks only to this type, which
//! adds what a partition's checkpoint and replay need on top of the view.
//!
//! - **Where replay starts.** Control entries take no partition offsets (an
//!   ack written ahead of a queued data batch could otherwise not be
//!   numbered), so "the log up to here" is a journal position as well as an
//!   offset. A checkpoint records a [`LogCursor`] it got from
//!   [`PartitionLog::resolve`], and replay takes one back
//!   ([`PartitionLog::replay`]); nothing else reads it.
//! - **Retention.** A checkpoint lets go of what its state no longer needs:
//!   data records below the oldest live message and control records below the
//!   checkpoint ([`PartitionLog::delete_below`] takes both).
//! - **Durability across lanes.** The journal makes appends durable per lane
//!   (control ahead of queued data), so "everything appended so far is
//!   durable" is the newest ticket of each lane ([`LastAppends`]).
//!
//! A checkpoint needs two points, because control entries can be written
//! ahead of data appended before them: the data offset its state covers (in
//! the snapshot itself) and the **control cursor** `c_p`, the end of the
//! last control entry the state holds (every control entry of the partition
//! appended before the snapshot lies below it, every later one at or past
//! it: the control lane is written in append order). Replay applies data
//! entries past the offset and control entries at or past `c_p`. The side
//! file's value is the **scan start**: `c_p`, or lower when a data entry the
//! partition still needs (its oldest live message, or one past the covered
//! offset) sits lower — the shard's journal recovery starts at the least
//! scan start of its partitions, so every entry a partition needs is routed
//! to it. The side file's payload is `c_p` (8 bytes, little-endian, its top
//! bit set) and the last entry index of the partition's log at the
//! checkpoint (8 bytes: the floor of its index when no later entry
//! survives, `docs/design/shard-journal.md` §14), followed by the snapshot;
//! a checkpoint written before entry indexes has `c_p` alone, top bit
//! clear.

use std::collections::VecDeque;
use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use spool_wire::batch::BatchKind;

use super::{PartitionError, REPLAY_READ_BYTES};
use crate::io::Storage;
use crate::log::journal::{
    JournalPartition, JournalPos, JournalTicket, Lane as JournalLane, RoutedEntry,
    ENTRY_HEADER_BYTES,
};
use crate::log::{Offset, ReadBatch};
use crate::replica::{CommitWatch, ReplicaDriver};

pub use super::checkpoint::CheckpointPrefix;

/// Bytes of the journal layout's checkpoint payload before the snapshot:
/// the control cursor `c_p` (see the module docs), with
/// [`CHECKPOINT_INDEX_FLAG`] set when the entry index follows
/// ([`CHECKPOINT_INDEX_BYTES`] more).
pub const JOURNAL_CHECKPOINT_PREFIX_BYTES: usize = 8;
/// Bytes of the entry index a checkpoint records after its control cursor.
pub const CHECKPOINT_INDEX_BYTES: usize = 8;
/// Set in a checkpoint's control cursor word when the last entry index of
/// the partition's log at the checkpoint follows it (checkpoints written
/// before entry indexes have 8 bytes, a journal position, whose top bit is
/// never set).
pub const CHECKPOINT_INDEX_FLAG: u64 = 1 << 63;
/// A point in a partition's log: "everything before here", as a checkpoint
/// records it and as replay resumes from it.
///
/// Opaque on purpose: a data offset plus the control cursor `c_p` and the
/// scan start (module docs), so arithmetic with record offsets alone would
/// be wrong. The checkpoint side file stores [`LogCursor::to_checkpoint`]
/// (the scan start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogCursor {
    /// The scan start.
    value: u64,
    /// The data offset the state covers.
    data: u64,
    /// The control cursor `c_p`.
    control: u64,
    /// Records and batch bytes appended since open at this point (what a
    /// checkpoint being due is measured from).
    records: u64,
    bytes: u64,
    /// The last entry index of the partition's log at this point
    /// (`docs/design/shard-journal.md` §14): the floor of its index when
    /// no later entry survives.
    entry_index: u64,
    /// The install the log starts at, as the checkpoint recorded it (0:
    /// none); a cursor made by the log does not carry it (the log does).
    log_start: Option<u64>,
    /// The term of `entry_index` (a replicated partition's).
    entry_term: Option<u64>,
}

impl LogCursor {
    /// The install the checkpoint this cursor was read from starts the
    /// log at (`None`: none).
    pub fn log_start(self) -> Option<u64> {
        self.log_start
    }

    /// The term of the last entry index, when recorded.
    pub fn entry_term(self) -> Option<u64> {
        self.entry_term
    }

    /// This cursor, read from a checkpoint that recorded its entry's term
    /// and the install that starts the log.
    #[must_use]
    pub fn with_recorded(self, entry_term: Option<u64>, log_start: Option<u64>) -> Self {
        Self { entry_term, log_start, ..self }
    }

    /// The value the checkpoint side file stores for this cursor.
    pub fn to_checkpoint(self) -> u64 {
        self.value
    }

    /// The cursor a journal checkpoint recorded: its scan start (the side
    /// file's value), the data offset its state covers and its control
    /// cursor.
    pub fn from_journal_checkpoint(
        scan: u64,
        data: Offset,
        control: JournalPos,
        entry_index: u64,
    ) -> Self {
        let (records, bytes, log_start, entry_term) = (0, 0, None, None);
        Self {
            value: scan,
            data: data.0,
            control: control.0,
            records,
            bytes,
            entry_index,
            log_start,
            entry_term,
        }
    }

    /// The last entry index the checkpoint recorded (0: none, or a
    /// checkpoint written before entry indexes).
    pub fn entry_index(self) -> u64 {
        self.entry_index
    }

    /// The control cursor `c_p`.
    pub fn control_cursor(self) -> u64 {
        self.control
    }

    /// The data offset the state at this cursor covers: records below it
    /// are in the state.
    pub fn data_offset(self) -> Offset {
        Offset(self.data)
    }

    /// Whether replay from this cursor applies `entry` — both
    /// lanes in journal order, data entries with records past the covered
    /// offset, control entries at or past `c_p`. Relocated copies are data
    /// only: their records are in the checkpoint that let them be made,
    /// never events again.
    pub fn journal_replays(self, entry: &RoutedEntry) -> bool {
        match entry.lane {
            JournalLane::Data => {
                !entry.relocated && entry.first_offset + u64::from(entry.record_count) > self.data
            }
            JournalLane::Control => entry.position.0 >= self.control,
        }
    }
}

impl std::fmt::Display for LogCursor {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.control == 0 && self.value == self.data {
            write!(formatter, "{}", self.value)
        } else {
            write!(
                formatter,
                "offset {} (control cursor {}, scan start {})",
                self.data, self.control, self.value
            )
        }
    }
}

/// Where the log ends at the moment a checkpoint's snapshot begins
/// ([`PartitionLog::mark`]); [`PartitionLog::resolve`] turns it into the
/// cursor the checkpoint records, once the appends before it have a place
/// in the log.
pub struct LogMark {
    data: u64,
    records: u64,
    bytes: u64,
    /// The control end known at the mark, and the newest control append
    /// (its position is known once a commit took it).
    control_end: JournalPos,
    control: Option<(JournalTicket, u64)>,
    entry_index: u64,
}

impl LogMark {
    /// The data offset the snapshot covers.
    pub fn data_offset(&self) -> Offset {
        Offset(self.data)
    }
}

/// How much log was written after a cursor: what decides that a checkpoint
/// is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogGrowth {
    /// Records appended after it, both lanes.
    pub offsets: u64,
    /// Batch bytes appended after it.
    pub bytes: u64,
}

/// Resolves when an append is durable: on one node, when the journal has
/// it on disk; for a replicated partition, when it is committed (on a
/// quorum, and on disk here).
#[derive(Clone)]
pub struct LogTicket(TicketKind);

#[derive(Clone)]
enum TicketKind {
    Journal(JournalTicket),
    Commit { watch: Rc<dyn CommitWatch>, index: u64, term: u64 },
}

impl std::fmt::Debug for LogTicket {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            TicketKind::Journal(ticket) => ticket.fmt(formatter),
            TicketKind::Commit { index, term, .. } => {
                write!(formatter, "LogTicket(entry {index} of term {term})")
            }
        }
    }
}

impl LogTicket {
    /// Waits until the append is durable.
    ///
    /// # Errors
    /// The journal failed before that, or (replicated) the entry was
    /// superseded or this member stopped: the append was never
    /// acknowledged.
    pub async fn durable(&self) -> Result<(), PartitionError> {
        match &self.0 {
            TicketKind::Journal(ticket) => ticket.durable().await.map_err(PartitionError::from),
            TicketKind::Commit { watch, index, term } => {
                watch.clone().wait_committed(*index, *term).await.map_err(PartitionError::from)
            }
        }
    }

    /// `Some(Ok)` once durable, `Some(Err)` once failed, `None` while pending.
    pub fn status(&self) -> Option<Result<(), PartitionError>> {
        match &self.0 {
            TicketKind::Journal(ticket) => ticket.status().map(|r| r.map_err(PartitionError::from)),
            TicketKind::Commit { watch, index, term } => {
                watch.commit_status(*index, *term).map(|r| r.map_err(PartitionError::from))
            }
        }
    }
}

/// What `append` assigned.
#[derive(Clone, Debug)]
pub struct LogAppended {
    /// A data batch's first offset (control batch: the next data offset; it
    /// takes none).
    pub base_offset: Offset,
    pub next_offset: Offset,
    pub ticket: LogTicket,
    /// Where the batch waits for its commit
    /// ([`PartitionLog::replace_queued`]).
    pub slot: QueuedSlot,
    /// Its entry index (a replicated partition's; 0 on one node, where
    /// nothing reads it).
    pub entry_index: u64,
}

/// Where an appended batch waits until a commit takes it: its place in the
/// journal's lane queue (none for a replicated partition's entries, which
/// are never rewritten in place: `docs/design/replication.md` §2).
#[derive(Clone, Debug)]
pub struct QueuedSlot(Option<JournalTicket>);

/// The newest ticket of each lane: once all of them resolve, every append
/// made so far is durable.
#[derive(Debug, Default)]
pub struct LastAppends {
    data: Option<LogTicket>,
    control: Option<LogTicket>,
}

impl LastAppends {
    /// Records the ticket of an append of `kind`.
    pub fn note(&mut self, kind: BatchKind, ticket: &LogTicket) {
        if kind == BatchKind::Data {
            self.data = Some(ticket.clone());
        } else {
            self.control = Some(ticket.clone());
        }
    }

    /// The tickets to wait for (at most one per lane).
    pub fn barrier(&self) -> Barrier {
        Barrier(self.data.iter().chain(self.control.iter()).cloned().collect())
    }
}

/// Every append made before it was taken ([`LastAppends::barrier`]).
#[derive(Debug, Default)]
pub struct Barrier(Vec<LogTicket>);

impl Barrier {
    /// Waits until every append before the barrier is durable.
    ///
    /// # Errors
    /// The log failed first.
    pub async fn durable(&self) -> Result<(), PartitionError> {
        for ticket in &self.0 {
            ticket.durable().await?;
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A partition's log: its view of the shard journal; see the module docs.
pub struct PartitionLog<S: Storage> {
    part: Rc<JournalPartition<S>>,
    /// A replicated partition's Raft member: appends are its proposals.
    driver: Option<Rc<ReplicaDriver<S>>>,
    /// The snapshot install its log starts at (0: none), which every
    /// checkpoint records ([`CheckpointPrefix::log_start`]).
    log_start: std::cell::Cell<Option<u64>>,
}

impl<S: Storage> PartitionLog<S> {
    /// The log of a partition whose journal view the shard made.
    pub fn new(part: Rc<JournalPartition<S>>) -> Self {
        Self { part, driver: None, log_start: std::cell::Cell::new(None) }
    }

    /// The log of a replicated partition: `driver` performs its member of
    /// the partition's Raft group on `driver.log()`. Appends are proposals
    /// (refused unless this member leads), durable once committed; nothing
    /// is rewritten in place; claims see only committed records.
    pub fn replicated(driver: Rc<ReplicaDriver<S>>) -> Self {
        Self {
            part: driver.log().clone(),
            driver: Some(driver),
            log_start: std::cell::Cell::new(None),
        }
    }

    /// The replicated partition's member, if this log is replicated.
    pub fn driver(&self) -> Option<&Rc<ReplicaDriver<S>>> {
        self.driver.as_ref()
    }

    /// The future that completes once the partition is closed and its
    /// appends are durable (the shard runs the journal's own background).
    /// Call once.
    pub fn background(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'static>> {
        let part = self.part.clone();
        Box::pin(async move {
            part.wait_closed().await;
            let (data, control) = part.last_tickets();
            for ticket in data.iter().chain(control.iter()) {
                // A failure was answered to the appender already.
                let _ = ticket.durable().await;
            }
        })
    }

    /// Appends one batch (offsets assigned now, durable when its ticket
    /// resolves).
    ///
    /// # Errors
    /// As [`JournalPartition::append`].
    pub fn append(&self, batch: &[u8]) -> Result<LogAppended, PartitionError> {
        self.append_as(batch, true)
    }

    /// [`append`](Self::append) of a batch nobody is to wait for at once:
    /// the shard journal may hold its cycle back for its commit delay
    /// ([`JournalPartition::append_deferred`]).
    ///
    /// # Errors
    /// As [`append`](Self::append).
    pub fn append_deferred(&self, batch: &[u8]) -> Result<LogAppended, PartitionError> {
        self.append_as(batch, false)
    }

    fn append_as(&self, batch: &[u8], wanted: bool) -> Result<LogAppended, PartitionError> {
        if let Some(driver) = &self.driver {
            let proposed = driver.propose(batch)?;
            let watch: Rc<dyn CommitWatch> = driver.clone();
            let (index, term) = (proposed.index, proposed.term);
            return Ok(LogAppended {
                base_offset: proposed.base_offset,
                next_offset: self.part.next_offset(),
                slot: QueuedSlot(None),
                ticket: LogTicket(TicketKind::Commit { watch, index, term }),
                entry_index: index,
            });
        }
        let part = &self.part;
        let appended = if wanted { part.append(batch)? } else { part.append_deferred(batch)? };
        Ok(LogAppended {
            base_offset: appended.base_offset,
            next_offset: appended.next_offset,
            slot: QueuedSlot(Some(appended.ticket.clone())),
            ticket: LogTicket(TicketKind::Journal(appended.ticket)),
            entry_index: 0,
        })
    }

    /// Replaces the control batch appended at `slot` with `batch` (same
    /// length and record count) while no commit has taken it, so its bytes
    /// are written as if appended so in the first place
    /// ([`JournalPartition::replace_queued_control`]). Returns whether it
    /// was replaced; `false` (nothing changed) once its commit was taken (or
    /// the journal failed or is closing).
    pub fn replace_queued(&self, slot: &QueuedSlot, batch: &[u8]) -> bool {
        slot.0.as_ref().is_some_and(|ticket| self.part.replace_queued_control(ticket, batch))
    }

    /// Waits until a batch of `kind` and `len` bytes would be taken (a
    /// replicated partition's entries all go through the data lane).
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        let kind = if self.driver.is_some() { BatchKind::Data } else { kind };
        self.part.writable(kind, len).await;
    }

    /// Resolves when a data batch of `data_len` bytes and a control batch
    /// of `control_len` bytes appended right after it, with no await
    /// between, both fit under their bounds (or the log failed or closed:
    /// `append` then says why). So the second append cannot be refused for
    /// room once the first was taken.
    pub async fn writable_pair(&self, data_len: u64, control_len: u64) {
        if self.driver.is_some() {
            // One lane takes both (each with its entry header).
            let both = data_len + control_len + ENTRY_HEADER_BYTES as u64;
            self.part.writable(BatchKind::Data, both).await;
            return;
        }
        loop {
            self.part.writable(BatchKind::Data, data_len).await;
            // One bound per lane.
            self.part.writable(BatchKind::Control, control_len).await;
            if self.part.has_room(BatchKind::Data, data_len)
                && self.part.has_room(BatchKind::Control, control_len)
            {
                return;
            }
        }
    }

    /// Data batches from the one holding `from`, up to about `max_bytes`.
    ///
    /// # Errors
    /// As [`JournalPartition::read`].
    pub async fn read(
        &self,
        from: Offset,
        max_bytes: u64,
    ) -> Result<Vec<ReadBatch>, PartitionError> {
        Ok(self.part.read(from, max_bytes).await?)
    }

    /// The offset the next appended record will get.
    pub fn next_offset(&self) -> Offset {
        self.part.next_offset()
    }

    /// Every record below this offset is durable (and readable); for a
    /// replicated partition, committed.
    pub fn durable_offset(&self) -> Offset {
        if self.driver.is_some() {
            return self.part.committed_offset();
        }
        self.part.durable_offset()
    }

    /// The oldest offset still held (after retention).
    pub fn start_offset(&self) -> Offset {
        self.part.start_offset()
    }

    /// Where the log ends now, taken at the moment a checkpoint's snapshot
    /// begins (no await between this and the snapshot).
    pub fn mark(&self) -> LogMark {
        let part = &self.part;
        let (records, bytes) = part.appended();
        let (control_end, control) = part.control_mark();
        // Every control entry appended from now on goes into a commit built
        // later, at or past the durable watermark; the ones appended before
        // end at `control_end` or at the end of `control` (which `resolve`
        // waits for). So the watermark is as good a control cursor as the
        // last entry's end, and it lets an idle partition's checkpoint move
        // its cursor up to the journal's head (and stop pinning old journal
        // files).
        let control_end = control_end.max(part.shard().journal().durable_position());
        LogMark {
            data: part.next_offset().0,
            records,
            bytes,
            control_end,
            control,
            entry_index: part.last_index(),
        }
    }

    /// The cursor a checkpoint taken at `mark` records: waits until the
    /// newest control append before the mark is in a commit (its end is the
    /// control cursor), and lowers the scan start to the data entry of
    /// `oldest_live` (or of the covered offset) when that lies lower.
    ///
    /// # Errors
    /// The journal failed before the control append was written.
    pub async fn resolve(
        &self,
        mark: LogMark,
        oldest_live: Option<Offset>,
    ) -> Result<LogCursor, PartitionError> {
        let mut control = mark.control_end;
        if let Some((ticket, entry_len)) = &mark.control {
            ticket.durable().await?;
            if let Some(position) = ticket.position() {
                control = control.max(JournalPos(position.0 + entry_len));
            }
        }
        // A data entry built after now lies past `control` (that control
        // entry is already in a commit); one built before may lie lower, and
        // replay needs it if it holds a record the state still needs or one
        // past the covered offset. Relocated copies
        // (`docs/design/shard-journal.md` §6) put an older record's entry
        // above later ones: the scan starts at the lowest entry holding
        // `needed` or any later offset.
        let needed = oldest_live.map_or(mark.data, |live| live.0.min(mark.data));
        let scan = self
            .part
            .lowest_position_from(Offset(needed))
            .map_or(control.0, |position| position.0.min(control.0));
        Ok(LogCursor {
            value: scan,
            data: mark.data,
            control: control.0,
            records: mark.records,
            bytes: mark.bytes,
            entry_index: mark.entry_index,
            log_start: None,
            entry_term: self.driver.as_ref().and_then(|_| self.part.term_at(mark.entry_index)),
        })
    }

    /// The bytes a checkpoint's payload starts with for `cursor`: its
    /// control cursor (flagged), then the last entry index.
    pub fn checkpoint_prefix(&self, cursor: LogCursor) -> Vec<u8> {
        let control = cursor.control;
        let (entry_index, entry_term) = (cursor.entry_index, cursor.entry_term);
        CheckpointPrefix { control, entry_index, entry_term, log_start: self.log_start.get() }
            .encode()
    }

    /// The install its log starts at (0: none).
    pub fn log_start(&self) -> Option<u64> {
        self.log_start.get()
    }

    /// Its log starts at the install at `position` (its checkpoint said).
    pub fn set_log_start(&self, position: Option<u64>) {
        self.log_start.set(position);
    }

    /// How much was written after `cursor`.
    pub fn growth_since(&self, cursor: LogCursor) -> LogGrowth {
        let (records, bytes) = self.part.appended();
        LogGrowth {
            offsets: records.saturating_sub(cursor.records),
            bytes: bytes.saturating_sub(cursor.bytes),
        }
    }

    /// Reads the log after `from` to its end, batch by batch, for replay.
    pub fn replay(&self, from: LogCursor) -> Replay<'_, S> {
        // A replicated partition folds only what is committed: entries
        // above it may yet be cancelled, and come back through its member
        // once committed.
        let committed = match self.driver {
            Some(_) => self.part.committed_index(),
            None => u64::MAX,
        };
        let entries: VecDeque<RoutedEntry> = self
            .part
            .replay_entries(JournalPos(0))
            .into_iter()
            .filter(|entry| from.journal_replays(entry) && entry.entry_index <= committed)
            .collect();
        Replay {
            log: self,
            cursor: ReplayCursor { next: from.data },
            entries,
            read: VecDeque::new(),
        }
    }

    /// Lets go of what a checkpoint at `checkpoint` no longer needs: data
    /// records below `oldest_live` (the oldest message the state still
    /// holds; `None`: none) and control records before `checkpoint`. The
    /// journal's files are reclaimed per shard; here the partition's index
    /// is cut. Returns how many index entries were deleted.
    ///
    /// # Errors
    /// As [`JournalPartition::delete_below`].
    pub async fn delete_below(
        &self,
        oldest_live: Option<Offset>,
        checkpoint: LogCursor,
    ) -> Result<usize, PartitionError> {
        let covers = Offset(checkpoint.data);
        let below = oldest_live.unwrap_or(covers).min(covers);
        Ok(self.part.delete_below(below).await?)
    }

    /// Whether appends of data are refused for lack of disk space.
    pub fn disk_full(&self) -> bool {
        self.part.disk_full()
    }

    /// Tries again to make room after [`PartitionLog::disk_full`].
    pub fn retry_prepare(&self) {
        self.part.retry_prepare();
    }

    /// `Some(reason)` once a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        self.part.failure()
    }

    /// Stops accepting appends; the background completes once everything
    /// appended is durable.
    pub fn close(&self) {
        if let Some(driver) = &self.driver {
            driver.close();
        }
        self.part.close();
    }

    /// The directory of the shard journal's files.
    pub fn dir(&self) -> &Path {
        self.part.shard().dir()
    }

    /// The partition's journal view.
    pub fn journal(&self) -> &Rc<JournalPartition<S>> {
        &self.part
    }
}

/// One batch replay hands out: the batch and the first offset in it to
/// apply (records below were applied before the cursor replay started at).
pub struct ReplayBatch {
    pub batch: ReadBatch,
    pub apply_from: Offset,
}

/// Which records of the batches read in log order replay applies: those
/// past the offset the checkpoint covers and past every batch before.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReplayCursor {
    /// The next data offset to apply.
    next: u64,
}

impl ReplayCursor {
    /// A cursor for a replay from `from`.
    pub(super) fn new(from: LogCursor) -> Self {
        Self { next: from.data }
    }

    /// The first offset of `header`'s batch to apply (control batches
    /// take no offsets: every event of one the filter chose), or `None` for
    /// a data batch wholly applied before.
    pub(super) fn admit(&mut self, header: &spool_wire::batch::BatchHeader) -> Option<Offset> {
        if header.kind != BatchKind::Data {
            return Some(Offset(0));
        }
        if header.next_offset() <= self.next {
            return None;
        }
        let apply_from = Offset(self.next);
        self.next = header.next_offset();
        Some(apply_from)
    }
}

/// The batches after a cursor, in log order ([`PartitionLog::replay`]).
pub struct Replay<'a, S: Storage> {
    log: &'a PartitionLog<S>,
    cursor: ReplayCursor,
    /// The journal entries still to read, in journal order.
    entries: VecDeque<RoutedEntry>,
    read: VecDeque<ReadBatch>,
}

impl<S: Storage> Replay<'_, S> {
    /// The next batch, or `None` at the end of the log.
    ///
    /// # Errors
    /// A read that fails.
    pub async fn next_batch(&mut self) -> Result<Option<ReplayBatch>, PartitionError> {
        loop {
            while let Some(batch) = self.read.pop_front() {
                // Batches wholly before the cursor were applied already.
                if let Some(apply_from) = self.cursor.admit(&batch.header) {
                    return Ok(Some(ReplayBatch { batch, apply_from }));
                }
            }
            if self.entries.is_empty() {
                return Ok(None);
            }
            let mut total = 0u64;
            let mut chunk = Vec::new();
            while let Some(entry) = self.entries.front() {
                let len = u64::from(entry.entry_len);
                if !chunk.is_empty() && total + len > REPLAY_READ_BYTES {
                    break;
                }
                total += len;
                chunk.push(entry.position);
                self.entries.pop_front();
            }
            let read = self.log.part.shard().journal().read_entries(&chunk, total).await?;
            self.read.extend(read);
        }
    }
}
