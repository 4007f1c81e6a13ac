//! [`JournalPartition`]: one partition's view of its shard's journal, its
//! log as the partition sees it (`docs/design/shard-journal.md` §12), and
//! its opening from the entries recovery routed to it
//! ([`ShardJournal::partition`]):
//!
//! - offsets number **data records only**, densely: `append` of a data
//!   batch stamps the next offset and the leader epoch into its header
//!   (`header_crc` recomputed) and queues
//!   it in the data lane; a control batch goes to the control lane and
//!   takes no offset (its header's base offset is the next data offset, for
//!   information only);
//! - the **index** is a sorted `Vec` of (first offset, journal position,
//!   record count, batch length) per durable data entry; reads find their
//!   entry by binary search and read it through the journal;
//! - `durable_offset` is the end of the last data entry whose commit is
//!   durable (tickets resolve in commit order, so the appends not yet
//!   durable are a suffix of the partition's).
//!
//! This file holds the view's state and its appends, reads, replay and
//! checkpoint marks. What it must not do: hold the shard's journal or
//! handles table (`shard.rs`); where its entries lie for the shard's
//! release and relocation passes, retention and relocated copies are
//! `partition_release.rs`'s, a replicated log's appends and markers
//! `replicate.rs`'s.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::proto::Offset;

use super::appender::EntryMeta;
use super::entry::ENTRY_HEADER_BYTES;
use super::entry_log::{EntryLog, LogMode};
use super::error::{JournalDamage, JournalError};
use super::layout::journal_file_path;
use super::route::{rebuild_index, settle_installs, JournalIndexEntry, RecoveredLog, RoutedEntry};
use super::shard::ShardJournal;
use super::{JournalPos, JournalTicket, Lane, PartitionHandle};
use crate::io::Storage;
use crate::limits::READ_BYTES_MAX;
use crate::log::wakers::Notify;
use crate::log::ReadBatch;

impl<S: Storage> ShardJournal<S> {
    /// The view of partition `handle`, from the entries recovery routed to
    /// it (empty for a new partition). `floor` is its next offset when no
    /// data entry was routed (the checkpoint's next offset, or 0);
    /// `index_floor` the last entry index its checkpoint recorded (0
    /// without one). Its log commits by local durability
    /// ([`LogMode::Local`]).
    ///
    /// # Errors
    /// [`JournalError::UnknownHandle`] for a handle the table does not hold;
    /// [`JournalError::OffsetGap`] when its data entries are not dense.
    pub fn partition(
        self: &Rc<Self>,
        handle: PartitionHandle,
        recovered: Vec<RoutedEntry>,
        floor: Offset,
        leader_epoch: u32,
        index_floor: u64,
    ) -> Result<JournalPartition<S>, JournalError> {
        let log = RecoveredLog::default();
        let at = LogFloor { index: index_floor, ..LogFloor::default() };
        self.view(handle, recovered, log, floor, leader_epoch, at, LogMode::Local)
    }

    /// [`partition`](Self::partition) of a partition whose log is
    /// replicated ([`LogMode::Replicated`]): its committed index is what
    /// its commit markers recorded (`log`, from
    /// [`Routed::logs`]) and moves only by
    /// [`JournalPartition::set_committed`].
    ///
    /// # Errors
    /// As [`partition`](Self::partition), and [`JournalError::IndexGap`]
    /// when its entries above the committed index are not dense.
    /// `at`: where its checkpoint starts the log ([`LogFloor`]).
    pub fn replicated_partition(
        self: &Rc<Self>,
        handle: PartitionHandle,
        recovered: Vec<RoutedEntry>,
        log: RecoveredLog,
        floor: Offset,
        leader_epoch: u32,
        at: LogFloor,
    ) -> Result<JournalPartition<S>, JournalError> {
        self.view(handle, recovered, log, floor, leader_epoch, at, LogMode::Replicated)
    }

    #[allow(clippy::too_many_arguments)]
    fn view(
        self: &Rc<Self>,
        handle: PartitionHandle,
        recovered: Vec<RoutedEntry>,
        log: RecoveredLog,
        floor: Offset,
        leader_epoch: u32,
        at: LogFloor,
        mode: LogMode,
    ) -> Result<JournalPartition<S>, JournalError> {
        if !self.handles.contains(handle) {
            return Err(JournalError::UnknownHandle(handle.0));
        }
        let mut recovered = recovered;
        let index_floor = at.index;
        let installed = settle_installs(&mut recovered, at.log_start);
        // An install's floor is the checkpoint's entry index (it wrote it).
        let installed = installed.filter(|install| install.0 == index_floor).map(|i| i.1);
        let floor_term = at.term.or(installed);
        let (index, next_offset) = rebuild_index(handle, &recovered, floor.0)?;
        let start_offset = index.first().map_or(next_offset, |entry| entry.first_offset);
        // Where the recovered control entries end: the control cursor of a
        // checkpoint taken before this partition appends any.
        let control_end = recovered
            .iter()
            .rev()
            .find(|entry| entry.lane == Lane::Control)
            .map_or(JournalPos(0), |entry| {
                JournalPos(entry.position.0 + u64::from(entry.entry_len))
            });
        let entry_log = EntryLog::open(mode, index_floor, floor_term, &recovered, log.committed)?;
        let term = entry_log.last_term().max(u64::from(leader_epoch));
        Ok(JournalPartition {
            shard: self.clone(),
            handle,
            leader_epoch,
            state: RefCell::new(PartitionState {
                next_offset,
                start_offset,
                index,
                pending: VecDeque::new(),
                relocating: Vec::new(),
                replay: recovered,
                closed: false,
                last_data: None,
                last_control: None,
                control_end,
                appended_records: 0,
                appended_bytes: 0,
                log: entry_log,
                term,
                commit_marked: log.committed,
                commit_marker: None,
            }),
            closed: Notify::default(),
        })
    }
}

/// Where a partition's checkpoint starts its log: the entry index it
/// covers, that entry's term when recorded (a replicated partition's log
/// may have let go of the entry itself), and the snapshot install its log
/// starts at ([`settle_installs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFloor {
    pub index: u64,
    pub term: Option<u64>,
    pub log_start: Option<u64>,
}

/// What `append` assigned.
#[derive(Clone, Debug)]
pub struct JournalAppended {
    /// A data batch's first offset; for a control batch the next data
    /// offset (it takes none).
    pub base_offset: Offset,
    /// The offset after the batch's last record (equal to `base_offset`
    /// for a control batch).
    pub next_offset: Offset,
    pub ticket: JournalTicket,
}

/// A relocated copy of an indexed data entry whose commit is not yet known
/// durable: the index moves to it once it is.
pub(super) struct Relocating {
    pub(super) first_offset: u64,
    pub(super) record_count: u32,
    pub(super) ticket: JournalTicket,
}

/// A data append whose commit is not yet known durable.
pub(super) struct PendingData {
    pub(super) first_offset: u64,
    pub(super) record_count: u32,
    batch_len: u32,
    pub(super) ticket: JournalTicket,
}

pub(super) struct PartitionState {
    pub(super) next_offset: u64,
    pub(super) start_offset: u64,
    /// Durable data entries, by first offset.
    pub(super) index: Vec<JournalIndexEntry>,
    /// Data appends not yet durable, in append (and so journal) order.
    pub(super) pending: VecDeque<PendingData>,
    /// Relocated copies not yet known durable (`docs/design/shard-journal.md`
    /// §6).
    pub(super) relocating: Vec<Relocating>,
    /// The entries recovery routed here, kept (positions only) until
    /// [`JournalPartition::finish_replay`].
    replay: Vec<RoutedEntry>,
    pub(super) closed: bool,
    /// The newest data append's ticket.
    last_data: Option<JournalTicket>,
    /// The newest control append's ticket and entry length.
    last_control: Option<(JournalTicket, u64)>,
    /// The end of the newest control entry whose position is known (a
    /// recovered one, or an append a commit took).
    control_end: JournalPos,
    /// Records (data and control) and batch bytes appended since open: how
    /// much a replay would have to apply, for when a checkpoint is due.
    appended_records: u64,
    appended_bytes: u64,
    /// Entry indexes, terms and the committed index
    /// (`docs/design/shard-journal.md` §14).
    pub(super) log: EntryLog<JournalTicket>,
    /// The term this partition's own appends get.
    pub(super) term: u64,
    /// The highest committed index a commit marker was appended for, and
    /// the newest such marker while it is not durable.
    pub(super) commit_marked: u64,
    pub(super) commit_marker: Option<JournalTicket>,
}

impl PartitionState {
    /// Moves the appends whose commit is durable into the index, and the
    /// committed index as far as it may go.
    pub(super) fn settle(&mut self) {
        self.log.settle();
        while let Some(front) = self.pending.front() {
            if !matches!(front.ticket.status(), Some(Ok(()))) {
                break;
            }
            let Some(position) = front.ticket.position() else { break };
            self.index.push(JournalIndexEntry {
                first_offset: front.first_offset,
                position,
                record_count: front.record_count,
                batch_len: front.batch_len,
            });
            self.pending.pop_front();
        }
        if self.relocating.is_empty() {
            return;
        }
        let index = &mut self.index;
        self.relocating.retain(|copy| match copy.ticket.status() {
            None => true,
            // A failed journal fails every partition; the original stays.
            Some(Err(_)) => false,
            Some(Ok(())) => {
                // The entry may have been cut meanwhile (its records acked
                // and a checkpoint let them go): the copy is then garbage.
                let found = index.binary_search_by_key(&copy.first_offset, |e| e.first_offset);
                if let (Ok(at), Some(position)) = (found, copy.ticket.position()) {
                    let entry = &mut index[at];
                    if entry.record_count == copy.record_count && entry.position < position {
                        entry.position = position;
                    }
                }
                false
            }
        });
    }

    fn durable_offset(&self) -> u64 {
        self.pending.front().map_or(self.next_offset, |pending| pending.first_offset)
    }
}

/// One partition's view of its shard's journal.
pub struct JournalPartition<S: Storage> {
    pub(super) shard: Rc<ShardJournal<S>>,
    pub(super) handle: PartitionHandle,
    leader_epoch: u32,
    pub(super) state: RefCell<PartitionState>,
    /// Told once, by [`JournalPartition::close`].
    closed: Notify,
}

impl<S: Storage> JournalPartition<S> {
    pub fn handle(&self) -> PartitionHandle {
        self.handle
    }

    pub fn shard(&self) -> &Rc<ShardJournal<S>> {
        &self.shard
    }

    /// Queues `batch`: a data batch gets the next offsets (stamped, with the
    /// leader epoch, into its header) and goes to the data lane; a control
    /// batch goes to the control lane and takes no offset. Returns at once;
    /// await the ticket for durability.
    ///
    /// # Errors
    /// [`JournalError::InvalidBatch`] (framing or body crc, or a length that
    /// is not the batch's), [`JournalError::NotAppendable`] (fillers, empty
    /// batches), [`JournalError::Closed`], and every error of
    /// [`Journal::append`] (back-pressure per lane, entry too large,
    /// failed). On an error nothing is queued and no offset is taken.
    pub fn append(&self, batch: &[u8]) -> Result<JournalAppended, JournalError> {
        self.append_as(batch, true)
    }

    /// [`append`](Self::append) of a control batch nobody waits for at
    /// once (claims, extends, releases, expiries): queued with
    /// [`Journal::append_owned_deferred`], so a cycle of such entries only
    /// may wait for the shard's commit delay. A data batch is appended as
    /// by `append`.
    ///
    /// # Errors
    /// As [`append`](Self::append).
    pub fn append_deferred(&self, batch: &[u8]) -> Result<JournalAppended, JournalError> {
        self.append_as(batch, false)
    }

    fn append_as(&self, batch: &[u8], wanted: bool) -> Result<JournalAppended, JournalError> {
        let header = BatchHeader::verify_body(batch).map_err(JournalError::InvalidBatch)?;
        check_appendable(&header, batch)?;
        let mut state = self.state.borrow_mut();
        if state.closed {
            return Err(JournalError::Closed);
        }
        state.log.settle();
        let meta = EntryMeta { entry_index: state.log.last_index() + 1, term: state.term };
        state.log.check_append(meta.entry_index, meta.term)?;
        let base_offset = state.next_offset;
        let mut bytes: Box<[u8]> = batch.into();
        BatchHeader::assign(&mut bytes, base_offset, self.leader_epoch);
        self.queue(&mut state, &header, meta, bytes, wanted)
    }

    /// Queues a checked batch as the entry `meta` and records it.
    pub(super) fn queue(
        &self,
        state: &mut PartitionState,
        header: &BatchHeader,
        meta: EntryMeta,
        bytes: Box<[u8]>,
        wanted: bool,
    ) -> Result<JournalAppended, JournalError> {
        let base_offset = state.next_offset;
        let (lane, next_offset) = match header.kind {
            BatchKind::Data => (Lane::Data, base_offset + u64::from(header.record_count)),
            _ => (Lane::Control, base_offset),
        };
        // A replicated log goes through one lane, so that the journal holds
        // its entries in index order and a crash keeps a prefix of them (a
        // control entry written ahead of queued data would leave a hole a
        // leader compares against). On one node, control goes ahead.
        let journal_lane = match state.log.mode() {
            LogMode::Local => lane,
            LogMode::Replicated => Lane::Data,
        };
        let ticket = if wanted || journal_lane == Lane::Data {
            self.shard.journal.append_owned(journal_lane, self.handle, meta, bytes)?
        } else {
            self.shard.journal.append_owned_deferred(journal_lane, self.handle, meta, bytes)?
        };
        state.log.push(meta.term, lane, base_offset, header.batch_len, ticket.clone());
        state.appended_records += u64::from(header.record_count);
        state.appended_bytes += u64::from(header.batch_len);
        if lane == Lane::Data {
            state.next_offset = next_offset;
            state.pending.push_back(PendingData {
                first_offset: base_offset,
                record_count: header.record_count,
                batch_len: header.batch_len,
                ticket: ticket.clone(),
            });
            state.last_data = Some(ticket.clone());
        } else {
            let entry_len = ENTRY_HEADER_BYTES as u64 + u64::from(header.batch_len);
            state.last_control = Some((ticket.clone(), entry_len));
        }
        Ok(JournalAppended {
            base_offset: Offset(base_offset),
            next_offset: Offset(next_offset),
            ticket,
        })
    }

    /// `read` of the state once what became durable is settled.
    pub(super) fn settled<R>(&self, read: impl FnOnce(&PartitionState) -> R) -> R {
        let mut state = self.state.borrow_mut();
        state.settle();
        read(&state)
    }

    /// Replaces the control batch `ticket` names with `batch` while no
    /// commit took it (the journal's [`Journal::amend_queued`]): `batch`
    /// must be a control batch of the same length and record count; it is
    /// stamped with the base offset and leader epoch of the one it
    /// replaces. Returns whether it was replaced (`false`: nothing
    /// changed).
    pub fn replace_queued_control(&self, ticket: &JournalTicket, batch: &[u8]) -> bool {
        let Ok(header) = BatchHeader::verify_body(batch) else { return false };
        if header.kind != BatchKind::Control || header.batch_len as usize != batch.len() {
            return false;
        }
        let epoch = self.leader_epoch;
        self.shard.journal.amend_queued(Lane::Control, ticket, |payload| {
            let Ok(old) = BatchHeader::parse(payload) else { return false };
            let same = old.kind == header.kind
                && old.batch_len == header.batch_len
                && old.record_count == header.record_count
                && payload.len() == batch.len();
            if !same {
                return false;
            }
            let base_offset = old.base_offset;
            payload.copy_from_slice(batch);
            BatchHeader::assign(payload, base_offset, epoch);
            true
        })
    }

    /// Whether a `len`-byte batch of `kind` fits under its lane's bound
    /// now (or the journal failed or closed).
    pub fn has_room(&self, kind: BatchKind, len: u64) -> bool {
        let lane = if kind == BatchKind::Data { Lane::Data } else { Lane::Control };
        self.shard.journal.has_room(lane, len + ENTRY_HEADER_BYTES as u64)
    }

    /// Resolves when a `len`-byte batch of `kind` would fit under its lane's
    /// bound (data batches: the data lane; control: the control lane), or
    /// the journal failed or closed (`append` then says why).
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        let lane = if kind == BatchKind::Data { Lane::Data } else { Lane::Control };
        self.shard.journal.writable(lane, len + ENTRY_HEADER_BYTES as u64).await;
    }

    /// The offset the next data record will get.
    pub fn next_offset(&self) -> Offset {
        Offset(self.state.borrow().next_offset)
    }

    /// Every offset below this is durable (and readable).
    pub fn durable_offset(&self) -> Offset {
        self.settled(|state| Offset(state.durable_offset()))
    }

    /// The oldest offset still held (after retention).
    pub fn start_offset(&self) -> Offset {
        Offset(self.state.borrow().start_offset)
    }

    /// The durable data entries the index holds, oldest first.
    pub fn index(&self) -> Vec<JournalIndexEntry> {
        self.settled(|state| state.index.clone())
    }

    /// Reads durable data batches starting with the one holding `from`,
    /// until `max_bytes` is reached (at least one batch when any is durable
    /// at or after `from`). Empty when `from` is at the durable end.
    ///
    /// # Errors
    /// [`JournalError::OffsetOutOfRange`] below the start,
    /// [`JournalError::ReadTooLarge`], [`JournalError::Corrupt`] naming file
    /// and byte when an entry fails its checks or is not the batch the index
    /// expects, [`JournalError::Io`].
    pub async fn read(&self, from: Offset, max_bytes: u64) -> Result<Vec<ReadBatch>, JournalError> {
        if max_bytes > READ_BYTES_MAX {
            return Err(JournalError::ReadTooLarge { max_bytes, limit_bytes: READ_BYTES_MAX });
        }
        let wanted: Vec<JournalIndexEntry> = {
            let mut state = self.state.borrow_mut();
            state.settle();
            if from.0 < state.start_offset {
                return Err(JournalError::OffsetOutOfRange {
                    offset: from.0,
                    start: state.start_offset,
                });
            }
            let first = state.index.partition_point(|entry| entry.end_offset() <= from.0);
            let mut total = 0u64;
            let mut wanted = Vec::new();
            for entry in &state.index[first..] {
                wanted.push(*entry);
                total += u64::from(entry.batch_len);
                if total >= max_bytes {
                    break;
                }
            }
            wanted
        };
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let positions: Vec<JournalPos> = wanted.iter().map(|entry| entry.position).collect();
        let read_bytes = wanted.iter().map(|entry| u64::from(entry.batch_len)).sum::<u64>()
            + (ENTRY_HEADER_BYTES * wanted.len()) as u64;
        let batches = self.shard.journal.read_entries(&positions, read_bytes).await?;
        for (batch, entry) in batches.iter().zip(&wanted) {
            let header = &batch.header;
            if header.kind != BatchKind::Data
                || header.base_offset != entry.first_offset
                || header.record_count != entry.record_count
            {
                return Err(self.mismatch(entry, header.base_offset));
            }
        }
        Ok(batches)
    }

    fn mismatch(&self, entry: &JournalIndexEntry, found_offset: u64) -> JournalError {
        let detail =
            JournalDamage::IndexMismatch { expected_offset: entry.first_offset, found_offset };
        self.corrupt_at(entry.position, detail)
    }

    /// Damage found at journal position `position`, named by its file and
    /// the byte in it.
    pub(super) fn corrupt_at(&self, position: JournalPos, detail: JournalDamage) -> JournalError {
        let journal = &self.shard.journal;
        let files = journal.shared.state.borrow();
        let base = files.files.range(..=position.0).next_back().map_or(0, |(base, _)| *base);
        JournalError::Corrupt {
            path: journal_file_path(journal.dir(), base),
            pos: position.0 - base,
            detail,
        }
    }

    /// Whether the shard journal refuses data for lack of disk space (its
    /// next file could not be prepared): [`Journal::disk_full`].
    pub fn disk_full(&self) -> bool {
        self.shard.journal.disk_full()
    }

    /// Asks the shard journal to try preparing its next file again
    /// ([`Journal::retry_prepare`]).
    pub fn retry_prepare(&self) {
        self.shard.journal.retry_prepare();
    }

    /// `Some(reason)` once the shard's journal failed.
    pub fn failure(&self) -> Option<String> {
        self.shard.journal.failure()
    }

    /// Stops this partition's appends; the shard's journal keeps running.
    pub fn close(&self) {
        self.state.borrow_mut().closed = true;
        self.closed.notify_all();
    }

    /// Resolves once [`JournalPartition::close`] was called.
    pub async fn wait_closed(&self) {
        loop {
            let wait = self.closed.wait();
            if self.state.borrow().closed {
                return;
            }
            wait.await;
        }
    }

    /// The tickets of the newest data and the newest control append (each
    /// lane is durable in append order, but the lanes are not ordered
    /// against each other): once both resolve, every append so far is
    /// durable.
    pub fn last_tickets(&self) -> (Option<JournalTicket>, Option<JournalTicket>) {
        let state = self.state.borrow();
        (state.last_data.clone(), state.last_control.as_ref().map(|(ticket, _)| ticket.clone()))
    }

    /// Records and batch bytes appended (both lanes) since open.
    pub fn appended(&self) -> (u64, u64) {
        let state = self.state.borrow();
        (state.appended_records, state.appended_bytes)
    }

    /// The end of the newest control entry appended so far (or recovered):
    /// every control entry of this partition appended before now lies below
    /// it, every later one at or past it. `None` while the newest control
    /// append is not yet in a commit (its position is not known; it is once
    /// its ticket resolves).
    pub fn control_end(&self) -> Option<JournalPos> {
        let mut state = self.state.borrow_mut();
        if let Some((ticket, entry_len)) = &state.last_control {
            let position = ticket.position()?;
            let end = JournalPos(position.0 + entry_len);
            state.control_end = state.control_end.max(end);
        }
        Some(state.control_end)
    }

    /// The control end known now and the newest control append with its
    /// entry length (whose end, once a commit placed it, may lie past it):
    /// what a checkpoint's control cursor is made of.
    pub fn control_mark(&self) -> (JournalPos, Option<(JournalTicket, u64)>) {
        let state = self.state.borrow();
        (state.control_end, state.last_control.clone())
    }

    /// Raises the control end to at least `floor` (a checkpoint's control
    /// cursor: control entries below it were folded into its state).
    pub fn raise_control_end(&self, floor: JournalPos) {
        let mut state = self.state.borrow_mut();
        state.control_end = state.control_end.max(floor);
    }

    /// The recovered entries of this partition at or after `from` (the
    /// checkpoint's cursor), both lanes, in journal order: what replay
    /// applies.
    pub fn replay_entries(&self, from: JournalPos) -> Vec<RoutedEntry> {
        let state = self.state.borrow();
        let first = state.replay.partition_point(|entry| entry.position < from);
        state.replay[first..].to_vec()
    }

    /// Reads the recovered entries at or after `from`, in journal order, in
    /// reads of at most `read_bytes`, handing each with its routing facts
    /// to `apply`.
    ///
    /// # Errors
    /// As [`Journal::read_entries`].
    pub async fn replay(
        &self,
        from: JournalPos,
        read_bytes: u64,
        mut apply: impl FnMut(&RoutedEntry, &ReadBatch),
    ) -> Result<usize, JournalError> {
        let entries = self.replay_entries(from);
        let mut done = 0;
        while done < entries.len() {
            let mut total = 0u64;
            let mut end = done;
            while end < entries.len() && (end == done || total < read_bytes) {
                total += u64::from(entries[end].batch_len) + ENTRY_HEADER_BYTES as u64;
                end += 1;
            }
            let positions: Vec<JournalPos> =
                entries[done..end].iter().map(|entry| entry.position).collect();
            let batches = self.shard.journal.read_entries(&positions, total).await?;
            for (entry, batch) in entries[done..end].iter().zip(&batches) {
                apply(entry, batch);
            }
            done = end;
        }
        Ok(entries.len())
    }

    /// Drops the recovered entry list once replay is done.
    pub fn finish_replay(&self) {
        self.state.borrow_mut().replay = Vec::new();
    }
}

/// The rules every appended batch obeys: its length is the batch's, not a
/// filler, at least one record.
pub(super) fn check_appendable(header: &BatchHeader, batch: &[u8]) -> Result<(), JournalError> {
    if header.batch_len as usize != batch.len() {
        return Err(JournalError::InvalidBatch(spool_wire::WireError::Truncated {
            needed: header.batch_len as usize,
            available: batch.len(),
        }));
    }
    if header.kind == BatchKind::Filler {
        return Err(JournalError::NotAppendable("filler batches are written by the log only"));
    }
    if header.record_count == 0 {
        return Err(JournalError::NotAppendable("a batch must hold at least one record"));
    }
    Ok(())
}
