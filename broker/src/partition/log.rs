//! `PartitionLog`: what a partition needs of its log, behind one type.
//!
//! Today every partition sits on its own segment log ([`Log`],
//! `docs/design/segment-format.md`). The shard journal
//! (`docs/design/shard-journal.md`, §12) will be a second variant; the rest
//! of `partition/` speaks only to this type, so the variant is chosen in one
//! place. Each method delegates to the variant with a `match`.
//!
//! Two things differ between the variants beyond the calls themselves, and
//! are therefore abstracted here rather than left to the callers:
//!
//! - **Where replay starts.** In the segment log every batch, data or
//!   control, takes partition offsets, so "the log up to here" is an offset
//!   and a checkpoint records the next offset. In the journal control
//!   entries take no partition offsets (an ack written ahead of a queued data
//!   batch could otherwise not be numbered), so the same point is a journal
//!   position. A checkpoint records a [`LogCursor`] it got from
//!   [`PartitionLog::end`], and replay takes one back
//!   ([`PartitionLog::replay`]); nothing else reads it.
//! - **Retention.** A checkpoint lets go of what its state no longer needs:
//!   data records below the oldest live message and control records below the
//!   checkpoint ([`PartitionLog::delete_below`] takes both).
//! - **Durability across lanes.** The segment log makes appends durable in
//!   append order; the journal does so per lane (control ahead of queued
//!   data), so "everything appended so far is durable" is the newest ticket
//!   of each lane ([`LastAppends`]).
//!
//! A checkpoint of the journal layout needs two points, because control
//! entries can be written ahead of data appended before them: the data
//! offset its state covers (in the snapshot itself, as for the segment log)
//! and the **control cursor** `c_p`, the end of the last control entry the
//! state holds (every control entry of the partition appended before the
//! snapshot lies below it, every later one at or past it: the control lane
//! is written in append order). Replay applies data entries past the
//! offset and control entries at or past `c_p`. The side file's value is
//! the **scan start**: `c_p`, or lower when a data entry the partition still
//! needs (its oldest live message, or one past the covered offset) sits
//! lower — the shard's journal recovery starts at the least scan start of
//! its partitions, so every entry a partition needs is routed to it. The
//! side file's payload is `c_p` (8 bytes, little-endian) followed by the
//! snapshot. For the segment log value and cursor are the covered offset
//! and the payload is the snapshot, as it always was.

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::batch::BatchKind;

use super::{PartitionError, REPLAY_READ_BYTES};
use crate::io::Storage;
use crate::log::journal::{
    JournalPartition, JournalPos, JournalTicket, Lane as JournalLane, RoutedEntry,
    ENTRY_HEADER_BYTES,
};
use crate::log::{
    FatalHandler, GatherSlot, Log, LogConfig, LogError, LogStats, Offset, ReadBatch,
    RecoveryReport, ResumePoint, SegmentInfo, Ticket,
};

/// Bytes of the journal layout's checkpoint payload before the snapshot:
/// the control cursor `c_p` (see the module docs).
pub const JOURNAL_CHECKPOINT_PREFIX_BYTES: usize = 8;

/// A point in a partition's log: "everything before here", as a checkpoint
/// records it and as replay resumes from it.
///
/// Opaque on purpose: in the segment log it is a partition offset (control
/// batches take offsets there), in the shard journal a data offset plus the
/// control cursor `c_p` and the scan start (module docs), so arithmetic
/// with record offsets would be right for one layout and wrong for the
/// other. The checkpoint side file stores [`LogCursor::to_checkpoint`]; for
/// the segment log that is the offset, as it always was, so the file format
/// does not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogCursor {
    /// Segment log: the offset. Journal: the scan start.
    value: u64,
    /// The data offset the state covers (segment log: the offset).
    data: u64,
    /// Journal: the control cursor `c_p`.
    control: u64,
    /// Journal: records and batch bytes appended since open at this point
    /// (what a checkpoint being due is measured from).
    records: u64,
    bytes: u64,
}

impl LogCursor {
    /// The value the checkpoint side file stores for this cursor.
    pub fn to_checkpoint(self) -> u64 {
        self.value
    }

    /// The cursor a checkpoint side file of the segment log recorded.
    pub fn from_checkpoint(value: u64) -> Self {
        Self { value, data: value, ..Self::default() }
    }

    /// The cursor a journal checkpoint recorded: its scan start (the side
    /// file's value), the data offset its state covers and its control
    /// cursor.
    pub fn from_journal_checkpoint(scan: u64, data: Offset, control: JournalPos) -> Self {
        Self { value: scan, data: data.0, control: control.0, records: 0, bytes: 0 }
    }

    /// Journal: the control cursor `c_p` (0 for the segment log).
    pub fn control_cursor(self) -> u64 {
        self.control
    }

    /// The data offset the state at this cursor covers: records below it
    /// are in the state.
    pub fn data_offset(self) -> Offset {
        Offset(self.data)
    }

    /// Journal: whether replay from this cursor applies `entry` — both
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
    /// Journal: the control end known at the mark, and the newest control
    /// append (its position is known once a commit took it).
    control_end: JournalPos,
    control: Option<(JournalTicket, u64)>,
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
    /// Offsets assigned after it (journal: records appended, both lanes).
    pub offsets: u64,
    /// Bytes of log held after it (journal: batch bytes appended).
    pub bytes: u64,
}

/// A ticket of either layout: resolves when the append is durable.
#[derive(Clone, Debug)]
pub enum LogTicket {
    Segments(Ticket),
    Journal(JournalTicket),
}

impl LogTicket {
    /// Waits until the append is durable.
    ///
    /// # Errors
    /// The log (or journal) failed before that; the append was never
    /// acknowledged.
    pub async fn durable(&self) -> Result<(), PartitionError> {
        match self {
            Self::Segments(ticket) => ticket.durable().await.map_err(PartitionError::from),
            Self::Journal(ticket) => ticket.durable().await.map_err(PartitionError::from),
        }
    }

    /// `Some(Ok)` once durable, `Some(Err)` once failed, `None` while pending.
    pub fn status(&self) -> Option<Result<(), PartitionError>> {
        match self {
            Self::Segments(ticket) => ticket.status().map(|r| r.map_err(PartitionError::from)),
            Self::Journal(ticket) => ticket.status().map(|r| r.map_err(PartitionError::from)),
        }
    }
}

/// What `append` assigned, for both layouts.
#[derive(Clone, Debug)]
pub struct LogAppended {
    /// A data batch's first offset (journal control batch: the next data
    /// offset; it takes none).
    pub base_offset: Offset,
    pub next_offset: Offset,
    pub ticket: LogTicket,
    /// Where the batch waits for its commit
    /// ([`PartitionLog::replace_queued`]).
    pub slot: QueuedSlot,
}

/// Where an appended batch waits until a commit takes it: the segment
/// log's open gather, or the journal's lane queue.
#[derive(Clone, Debug)]
pub enum QueuedSlot {
    Segments(GatherSlot),
    Journal(JournalTicket),
}

/// The newest ticket of each lane: once all of them resolve, every append
/// made so far is durable. The segment log is durable in append order, so
/// its newest ticket alone says it.
#[derive(Debug, Default)]
pub struct LastAppends {
    data: Option<LogTicket>,
    control: Option<LogTicket>,
}

impl LastAppends {
    /// Records the ticket of an append of `kind`.
    pub fn note(&mut self, kind: BatchKind, ticket: &LogTicket) {
        match ticket {
            LogTicket::Segments(_) => {
                self.data = Some(ticket.clone());
                self.control = None;
            }
            LogTicket::Journal(_) if kind == BatchKind::Data => self.data = Some(ticket.clone()),
            LogTicket::Journal(_) => self.control = Some(ticket.clone()),
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

/// A partition's log; see the module docs.
pub enum PartitionLog<S: Storage> {
    /// The per-partition segment log.
    Segments(Log<S>),
    /// The partition's view of its shard's journal.
    Journal(Rc<JournalPartition<S>>),
}

impl<S: Storage> PartitionLog<S> {
    /// Opens (recovering) the segment log in `dir` at `leader_epoch`.
    /// `scan_from`: what a usable checkpoint covers; sealed segments below
    /// it are not read ([`Log::open_from`]), and the segment holding it is
    /// scanned from `resume` when that verifies
    /// ([`Log::open_from_resume`]). `None`: a full scan.
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_segments(
        storage: S,
        dir: &Path,
        config: LogConfig,
        leader_epoch: u32,
        fatal: Rc<dyn FatalHandler>,
        scan_from: Option<LogCursor>,
        resume: Option<ResumePoint>,
    ) -> Result<(Self, RecoveryReport), LogError> {
        let (log, report) = match scan_from {
            Some(from) => {
                let bound = Offset(from.value);
                Log::open_from_resume(storage, dir, config, leader_epoch, fatal, bound, resume)
                    .await?
            }
            None => Log::open(storage, dir, config, leader_epoch, fatal).await?,
        };
        Ok((Self::Segments(log), report))
    }

    /// The future that makes appends durable; the owner spawns it (see
    /// [`Log::background`]). Call once. For the journal the shard runs the
    /// journal's own background; this one completes once the partition is
    /// closed and its appends are durable.
    pub fn background(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'static>> {
        match self {
            Self::Segments(log) => Box::pin(log.background()),
            Self::Journal(part) => {
                let part = part.clone();
                Box::pin(async move {
                    part.wait_closed().await;
                    let (data, control) = part.last_tickets();
                    for ticket in data.iter().chain(control.iter()) {
                        // A failure was answered to the appender already.
                        let _ = ticket.durable().await;
                    }
                })
            }
        }
    }

    /// Appends one batch (offsets assigned now, durable when its ticket
    /// resolves).
    ///
    /// # Errors
    /// As [`Log::append`] and [`JournalPartition::append`].
    pub fn append(&self, batch: &[u8]) -> Result<LogAppended, PartitionError> {
        self.append_as(batch, true)
    }

    /// [`append`](Self::append) of a batch nobody is to wait for at once:
    /// the segment log may hold its commit back for its commit delay
    /// ([`Log::append_deferred`]), the shard journal its cycle
    /// ([`JournalPartition::append_deferred`]).
    ///
    /// # Errors
    /// As [`append`](Self::append).
    pub fn append_deferred(&self, batch: &[u8]) -> Result<LogAppended, PartitionError> {
        self.append_as(batch, false)
    }

    fn append_as(&self, batch: &[u8], wanted: bool) -> Result<LogAppended, PartitionError> {
        match self {
            Self::Segments(log) => {
                let appended =
                    if wanted { log.append(batch)? } else { log.append_deferred(batch)? };
                Ok(LogAppended {
                    base_offset: appended.base_offset,
                    next_offset: appended.next_offset,
                    ticket: LogTicket::Segments(appended.ticket),
                    slot: QueuedSlot::Segments(appended.slot),
                })
            }
            Self::Journal(part) => {
                let appended =
                    if wanted { part.append(batch)? } else { part.append_deferred(batch)? };
                Ok(LogAppended {
                    base_offset: appended.base_offset,
                    next_offset: appended.next_offset,
                    slot: QueuedSlot::Journal(appended.ticket.clone()),
                    ticket: LogTicket::Journal(appended.ticket),
                })
            }
        }
    }

    /// Replaces the control batch appended at `slot` with `batch` (same
    /// length and record count) while no commit has taken it, so its bytes
    /// are written as if appended so in the first place: the segment log's
    /// [`Log::replace_gathered`], the journal's
    /// [`JournalPartition::replace_queued_control`]. Returns whether it was
    /// replaced; `false` (nothing changed) once its commit was taken (or
    /// the log failed or is closing).
    pub fn replace_queued(&self, slot: &QueuedSlot, batch: &[u8]) -> bool {
        match (self, slot) {
            (Self::Segments(log), QueuedSlot::Segments(slot)) => log.replace_gathered(*slot, batch),
            (Self::Journal(part), QueuedSlot::Journal(ticket)) => {
                part.replace_queued_control(ticket, batch)
            }
            _ => false,
        }
    }

    /// Waits until a batch of `kind` and `len` bytes would be taken.
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        match self {
            Self::Segments(log) => log.writable(kind, len).await,
            Self::Journal(part) => part.writable(kind, len).await,
        }
    }

    /// Resolves when a data batch of `data_len` bytes and a control batch
    /// of `control_len` bytes appended right after it, with no await
    /// between, both fit under their bounds (or the log failed or closed:
    /// `append` then says why). So the second append cannot be refused for
    /// room once the first was taken.
    pub async fn writable_pair(&self, data_len: u64, control_len: u64) {
        loop {
            self.writable(BatchKind::Data, data_len).await;
            match self {
                // Both share one pending bound (the data one is tighter).
                Self::Segments(log) => {
                    log.writable(BatchKind::Control, data_len + control_len).await;
                    if log.room_for_pair(data_len, control_len) {
                        return;
                    }
                }
                // One bound per lane.
                Self::Journal(part) => {
                    part.writable(BatchKind::Control, control_len).await;
                    if part.has_room(BatchKind::Data, data_len)
                        && part.has_room(BatchKind::Control, control_len)
                    {
                        return;
                    }
                }
            }
        }
    }

    /// Data batches from the one holding `from`, up to about `max_bytes`.
    ///
    /// # Errors
    /// As [`Log::read`] and [`JournalPartition::read`].
    pub async fn read(
        &self,
        from: Offset,
        max_bytes: u64,
    ) -> Result<Vec<ReadBatch>, PartitionError> {
        match self {
            Self::Segments(log) => Ok(log.read(from, max_bytes).await?),
            Self::Journal(part) => Ok(part.read(from, max_bytes).await?),
        }
    }

    /// The offset the next appended record will get.
    pub fn next_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.next_offset(),
            Self::Journal(part) => part.next_offset(),
        }
    }

    /// Every record below this offset is durable (and readable).
    pub fn durable_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.durable_offset(),
            Self::Journal(part) => part.durable_offset(),
        }
    }

    /// The oldest offset still held (after retention).
    pub fn start_offset(&self) -> Offset {
        match self {
            Self::Segments(log) => log.start_offset(),
            Self::Journal(part) => part.start_offset(),
        }
    }

    /// Where the log ends now, taken at the moment a checkpoint's snapshot
    /// begins (no await between this and the snapshot).
    pub fn mark(&self) -> LogMark {
        match self {
            Self::Segments(log) => {
                let next = log.next_offset().0;
                LogMark {
                    data: next,
                    records: 0,
                    bytes: 0,
                    control_end: JournalPos(0),
                    control: None,
                }
            }
            Self::Journal(part) => {
                let (records, bytes) = part.appended();
                let (control_end, control) = part.control_mark();
                // Every control entry appended from now on goes into a
                // commit built later, at or past the durable watermark; the
                // ones appended before end at `control_end` or at the end of
                // `control` (which `resolve` waits for). So the watermark is
                // as good a control cursor as the last entry's end, and it
                // lets an idle partition's checkpoint move its cursor up to
                // the journal's head (and stop pinning old journal files).
                let control_end = control_end.max(part.shard().journal().durable_position());
                LogMark { data: part.next_offset().0, records, bytes, control_end, control }
            }
        }
    }

    /// The cursor a checkpoint taken at `mark` records: for the journal,
    /// waits until the newest control append before the mark is in a
    /// commit (its end is the control cursor), and lowers the scan start to
    /// the data entry of `oldest_live` (or of the covered offset) when that
    /// lies lower.
    ///
    /// # Errors
    /// The journal failed before the control append was written.
    pub async fn resolve(
        &self,
        mark: LogMark,
        oldest_live: Option<Offset>,
    ) -> Result<LogCursor, PartitionError> {
        match self {
            Self::Segments(_) => Ok(LogCursor::from_checkpoint(mark.data)),
            Self::Journal(part) => {
                let mut control = mark.control_end;
                if let Some((ticket, entry_len)) = &mark.control {
                    ticket.durable().await?;
                    if let Some(position) = ticket.position() {
                        control = control.max(JournalPos(position.0 + entry_len));
                    }
                }
                // A data entry built after now lies past `control` (that
                // control entry is already in a commit); one built before
                // may lie lower, and replay needs it if it holds a record
                // the state still needs or one past the covered offset.
                // Relocated copies (`docs/design/shard-journal.md` §6) put
                // an older record's entry above later ones: the scan starts
                // at the lowest entry holding `needed` or any later offset.
                let needed = oldest_live.map_or(mark.data, |live| live.0.min(mark.data));
                let scan = part
                    .lowest_position_from(Offset(needed))
                    .map_or(control.0, |position| position.0.min(control.0));
                Ok(LogCursor {
                    value: scan,
                    data: mark.data,
                    control: control.0,
                    records: mark.records,
                    bytes: mark.bytes,
                })
            }
        }
    }

    /// Segment log: where a reopen after a checkpoint at `cursor` may start
    /// scanning ([`Log::resume_point`]); `None` for the journal.
    pub fn resume_point(&self, cursor: LogCursor) -> Option<ResumePoint> {
        match self {
            Self::Segments(log) => log.resume_point(Offset(cursor.value)),
            Self::Journal(_) => None,
        }
    }

    /// The bytes a checkpoint's payload starts with for `cursor` (the
    /// journal's control cursor; nothing for the segment log).
    pub fn checkpoint_prefix(&self, cursor: LogCursor) -> Vec<u8> {
        match self {
            Self::Segments(_) => Vec::new(),
            Self::Journal(_) => cursor.control.to_le_bytes().to_vec(),
        }
    }

    /// How much was written after `cursor`.
    pub fn growth_since(&self, cursor: LogCursor) -> LogGrowth {
        match self {
            Self::Segments(log) => LogGrowth {
                offsets: log.next_offset().0.saturating_sub(cursor.value),
                bytes: log
                    .segments()
                    .iter()
                    .filter(|segment| segment.next_offset.0 > cursor.value)
                    .map(|segment| segment.data_end)
                    .sum(),
            },
            Self::Journal(part) => {
                let (records, bytes) = part.appended();
                LogGrowth {
                    offsets: records.saturating_sub(cursor.records),
                    bytes: bytes.saturating_sub(cursor.bytes),
                }
            }
        }
    }

    /// Reads the log after `from` to its end, batch by batch, for replay.
    pub fn replay(&self, from: LogCursor) -> Replay<'_, S> {
        let source = match self {
            Self::Segments(log) => ReplaySource::Segments { end: log.next_offset().0 },
            Self::Journal(part) => {
                let entries: VecDeque<RoutedEntry> = part
                    .replay_entries(JournalPos(0))
                    .into_iter()
                    .filter(|entry| from.journal_replays(entry))
                    .collect();
                ReplaySource::Journal { entries }
            }
        };
        Replay {
            log: self,
            cursor: ReplayCursor { next: from.data },
            source,
            read: VecDeque::new(),
        }
    }

    /// Lets go of what a checkpoint at `checkpoint` no longer needs: data
    /// records below `oldest_live` (the oldest message the state still
    /// holds; `None`: none) and control records before `checkpoint`. Returns
    /// how many files (journal: index entries) were deleted.
    ///
    /// # Errors
    /// As [`Log::delete_below`].
    pub async fn delete_below(
        &self,
        oldest_live: Option<Offset>,
        checkpoint: LogCursor,
    ) -> Result<usize, PartitionError> {
        let covers = Offset(checkpoint.data);
        let below = oldest_live.unwrap_or(covers).min(covers);
        match self {
            // Control batches take offsets here: below both bounds.
            Self::Segments(log) => Ok(log.delete_below(below).await?),
            // Journal files are reclaimed per shard (not yet): the index is
            // cut.
            Self::Journal(part) => Ok(part.delete_below(below).await?),
        }
    }

    /// Whether appends of data are refused for lack of disk space.
    pub fn disk_full(&self) -> bool {
        match self {
            Self::Segments(log) => log.disk_full(),
            Self::Journal(part) => part.disk_full(),
        }
    }

    /// Tries again to make room after [`PartitionLog::disk_full`].
    pub fn retry_prepare(&self) {
        match self {
            Self::Segments(log) => log.retry_prepare(),
            Self::Journal(part) => part.retry_prepare(),
        }
    }

    /// `Some(reason)` once a write or sync failed.
    pub fn failure(&self) -> Option<String> {
        match self {
            Self::Segments(log) => log.failure(),
            Self::Journal(part) => part.failure(),
        }
    }

    /// Stops accepting appends; the background completes once everything
    /// gathered is durable.
    pub fn close(&self) {
        match self {
            Self::Segments(log) => log.close(),
            Self::Journal(part) => part.close(),
        }
    }

    /// Counters since open (the journal's are the shard's: see
    /// [`crate::log::journal::Journal::stats`]; none per partition).
    pub fn stats(&self) -> LogStats {
        match self {
            Self::Segments(log) => log.stats(),
            Self::Journal(_) => LogStats::default(),
        }
    }

    /// Frees the cached commits whose every record is below `oldest_live`
    /// (the oldest message the state still holds; `None`: none, so every
    /// durable commit) and returns the bytes freed: a partition whose
    /// messages were acked holds no cache at rest. The journal's read cache
    /// is the shard's, bounded there: nothing to do per partition.
    pub fn trim_cache_below(&self, oldest_live: Option<Offset>) -> u64 {
        match self {
            Self::Segments(log) => {
                log.trim_cache_below(oldest_live.unwrap_or_else(|| log.durable_offset()))
            }
            Self::Journal(_) => 0,
        }
    }

    /// The witness delay of the segment log ([`Log::set_witness_delay`]);
    /// the journal's is the shard's (`Journal::set_witness_delay`), so
    /// nothing here.
    pub fn set_witness_delay(&self, delay: crate::log::WitnessDelay) {
        if let Self::Segments(log) = self {
            log.set_witness_delay(delay);
        }
    }

    /// The commit delay of the segment log ([`Log::set_commit_delay`]);
    /// the journal's is the shard's (`Journal::set_commit_delay`), so
    /// nothing here.
    pub fn set_commit_delay(&self, delay: crate::log::WitnessDelay) {
        if let Self::Segments(log) = self {
            log.set_commit_delay(delay);
        }
    }

    /// Bytes this partition's own tail cache holds (0 for the journal,
    /// whose cache is the shard's).
    pub fn cached_bytes(&self) -> u64 {
        match self {
            Self::Segments(log) => log.cached_bytes(),
            Self::Journal(_) => 0,
        }
    }

    /// Named segment files, oldest first (none for the journal).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        match self {
            Self::Segments(log) => log.segments(),
            Self::Journal(_) => Vec::new(),
        }
    }

    /// The directory the log's files are in (journal: the shard's).
    pub fn dir(&self) -> &Path {
        match self {
            Self::Segments(log) => log.dir(),
            Self::Journal(part) => part.shard().dir(),
        }
    }

    /// The journal view, for the journal layout.
    pub fn journal(&self) -> Option<&Rc<JournalPartition<S>>> {
        match self {
            Self::Segments(_) => None,
            Self::Journal(part) => Some(part),
        }
    }
}

/// One batch replay hands out: the batch and the first offset in it to
/// apply (records below were applied before the cursor replay started at).
pub struct ReplayBatch {
    pub batch: ReadBatch,
    pub apply_from: Offset,
}

enum ReplaySource {
    Segments {
        end: u64,
    },
    /// The journal entries still to read, in journal order.
    Journal {
        entries: VecDeque<RoutedEntry>,
    },
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

    /// The first offset of `header`'s batch to apply (journal control
    /// batches take no offsets: every event of one the filter chose), or
    /// `None` for a data batch wholly applied before.
    pub(super) fn admit(
        &mut self,
        header: &spool_wire::batch::BatchHeader,
        journal: bool,
    ) -> Option<Offset> {
        if journal && header.kind != BatchKind::Data {
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
    source: ReplaySource,
    read: VecDeque<ReadBatch>,
}

impl<S: Storage> Replay<'_, S> {
    /// The next batch, or `None` at the end of the log.
    ///
    /// # Errors
    /// A read that fails, or that finds nothing before the log's end.
    pub async fn next_batch(&mut self) -> Result<Option<ReplayBatch>, PartitionError> {
        loop {
            while let Some(batch) = self.read.pop_front() {
                let journal = matches!(self.source, ReplaySource::Journal { .. });
                // Batches wholly before the cursor were applied already.
                if let Some(apply_from) = self.cursor.admit(&batch.header, journal) {
                    return Ok(Some(ReplayBatch { batch, apply_from }));
                }
            }
            match (&mut self.source, self.log) {
                (ReplaySource::Segments { end }, PartitionLog::Segments(log)) => {
                    if self.cursor.next >= *end {
                        return Ok(None);
                    }
                    let read = log.read(Offset(self.cursor.next), REPLAY_READ_BYTES).await?;
                    if read.is_empty() {
                        return Err(PartitionError::Recovery {
                            dir: PathBuf::from(log.dir()),
                            reason: format!(
                                "log read at {} returned nothing before {end}",
                                self.cursor.next
                            ),
                        });
                    }
                    self.read.extend(read);
                }
                (ReplaySource::Journal { entries }, PartitionLog::Journal(part)) => {
                    if entries.is_empty() {
                        return Ok(None);
                    }
                    let mut total = 0u64;
                    let mut chunk = Vec::new();
                    while let Some(entry) = entries.front() {
                        let len = u64::from(entry.batch_len) + ENTRY_HEADER_BYTES as u64;
                        if !chunk.is_empty() && total + len > REPLAY_READ_BYTES {
                            break;
                        }
                        total += len;
                        chunk.push(entry.position);
                        entries.pop_front();
                    }
                    let read = part.shard().journal().read_entries(&chunk, total).await?;
                    self.read.extend(read);
                }
                (_, log) => {
                    return Err(PartitionError::Recovery {
                        dir: PathBuf::from(log.dir()),
                        reason: "replay source of the other log layout".into(),
                    })
                }
            }
        }
    }
}
