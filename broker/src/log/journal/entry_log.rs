//! A partition's log as replication sees it (`docs/design/shard-journal.md`
//! §14): every entry of the partition, data and control alike, numbered
//! densely by its **entry index** with the **term** it was appended in, and
//! the **committed index** below which nothing may be cancelled.
//!
//! Pure: no I/O and no clock. [`JournalPartition`](super::JournalPartition)
//! keeps one per partition and tells it what it appended and what became
//! durable; this type keeps the entries above the committed index (their
//! term, lane, first data offset and completion), decides the index and
//! term rules of a follower's append and of a truncation, and moves the
//! committed index:
//!
//! - [`LogMode::Local`] (one node): an entry is committed once it and every
//!   entry before it is durable — the committed index follows the journal's
//!   group commit, so nothing above it is ever cancelled (a truncation can
//!   only name what is not yet durable, and waiting for it commits it).
//! - [`LogMode::Replicated`]: the committed index is what the replication
//!   layer says is on a quorum ([`EntryLog::set_commit_target`]), capped at
//!   the local durable prefix; entries above it may be truncated.
//!
//! Entries at or below the committed index: in local mode they are let go
//! of here (their positions are the partition's data index and replay
//! list, as before); in replicated mode their positions, batch lengths and
//! terms move to [`Held`], so that a leader can read them back by index
//! for a lagging follower (`docs/design/shard-journal.md` §14.5). The term
//! of the last committed one is kept for the log-matching check.

use std::collections::VecDeque;

use super::error::JournalError;
use super::limits::LOG_HELD_ENTRIES_MAX;
use super::route::RoutedEntry;
use super::{JournalPos, JournalTicket, Lane};
use crate::limits::LOG_UNCOMMITTED_ENTRIES_MAX;

/// How a partition's committed index moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogMode {
    /// Committed once durable locally (a single node).
    #[default]
    Local,
    /// Committed when the replication layer says so, never past the local
    /// durable prefix.
    Replicated,
}

/// What an entry's completion tells the log: durable yet, and where.
pub(super) trait Completion {
    fn is_durable(&self) -> bool;
    fn position(&self) -> Option<JournalPos>;
}

impl Completion for JournalTicket {
    fn is_durable(&self) -> bool {
        matches!(self.status(), Some(Ok(())))
    }

    fn position(&self) -> Option<JournalPos> {
        JournalTicket::position(self)
    }
}

/// An entry above the committed index.
#[derive(Clone, Debug)]
pub(super) struct LogSlot<T> {
    pub index: u64,
    pub term: u64,
    pub lane: Lane,
    /// A data entry's first offset; a control entry's is the partition's
    /// next data offset at its append.
    pub first_offset: u64,
    /// The batch's length (the entry less its header).
    pub batch_len: u32,
    /// `None`: recovered (durable, at `recovered_at`).
    pub ticket: Option<T>,
    pub recovered_at: JournalPos,
}

impl<T: Completion> LogSlot<T> {
    fn is_durable(&self) -> bool {
        self.ticket.as_ref().is_none_or(Completion::is_durable)
    }

    fn position(&self) -> Option<JournalPos> {
        match &self.ticket {
            None => Some(self.recovered_at),
            Some(ticket) => ticket.position(),
        }
    }
}

/// A partition's entry log: indexes, terms, the committed index.
#[derive(Debug)]
pub(super) struct EntryLog<T> {
    mode: LogMode,
    last_index: u64,
    last_term: u64,
    committed: u64,
    /// The term of the entry at `committed` (`None` when it is unknown: a
    /// reopened log whose committed entry was let go of before).
    committed_term: Option<u64>,
    /// What the replication layer says is committed (replicated mode).
    commit_target: u64,
    /// Entries `committed + 1 ..= last_index`, in index order.
    slots: VecDeque<LogSlot<T>>,
    /// A truncation waits for its suffix to be durable: appends are
    /// refused meanwhile.
    truncating: bool,
    /// Where the committed entries still readable by index lie (replicated
    /// mode only; empty in local mode).
    held: Held,
}

/// Where the committed entries of a replicated log lie, densely by index
/// up to the committed one, for reads by index
/// (`docs/design/shard-journal.md` §14.5): 12 bytes per entry (journal
/// position, batch length) and 16 per term change, at most
/// [`LOG_HELD_ENTRIES_MAX`] entries (the oldest are let go of first, as
/// are those whose journal file was released). Positions increase with
/// the index: a replicated log goes through one lane, and only an
/// uncommitted suffix is ever cancelled.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// The index of the first entry held (the next one to hold when none
    /// is).
    first: u64,
    positions: VecDeque<u64>,
    lens: VecDeque<u32>,
    /// (first index, term) runs over the entries held, ascending.
    terms: VecDeque<(u64, u64)>,
    /// The term of the entry `first - 1` when known (it was held, or
    /// found on reopening): the floor a replica's log starts after.
    before: Option<u64>,
}

impl Held {
    /// Nothing held; the next entry to hold is `next`.
    fn empty_at(next: u64) -> Self {
        Self { first: next, ..Self::default() }
    }

    /// One past the last entry held.
    fn end(&self) -> u64 {
        self.first + self.positions.len() as u64
    }

    /// Holds the committed entry `index`, the one after the last held
    /// (otherwise what was held is let go of: the run must stay dense).
    fn push(&mut self, index: u64, term: u64, position: Option<JournalPos>, batch_len: u32) {
        let Some(position) = position else {
            *self = Self::empty_at(index + 1);
            return;
        };
        if index != self.end() || self.positions.back().is_some_and(|last| *last >= position.0) {
            let before = index.checked_sub(1).and_then(|previous| self.term_at(previous));
            *self = Self { before, ..Self::empty_at(index) };
        }
        if self.terms.back().is_none_or(|run| run.1 != term) {
            self.terms.push_back((index, term));
        }
        self.positions.push_back(position.0);
        self.lens.push_back(batch_len);
        while self.positions.len() > LOG_HELD_ENTRIES_MAX {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        let popped = self.term_at(self.first);
        if self.positions.pop_front().is_none() {
            return;
        }
        self.before = popped;
        self.lens.pop_front();
        self.first += 1;
        while self.terms.len() > 1 && self.terms[1].0 <= self.first {
            self.terms.pop_front();
        }
        if self.positions.is_empty() {
            self.terms.clear();
        }
    }

    /// Lets go of the entries lying below `oldest` (their file was
    /// released).
    fn release_below(&mut self, oldest: JournalPos) {
        while self.positions.front().is_some_and(|position| *position < oldest.0) {
            self.pop_front();
        }
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        if index + 1 == self.first {
            return self.before;
        }
        if index < self.first || index >= self.end() {
            return None;
        }
        let run = self.terms.partition_point(|run| run.0 <= index);
        run.checked_sub(1).map(|run| self.terms[run].1)
    }

    /// The (first index, term) runs over the entries held, the first
    /// starting at the first held.
    fn term_runs(&self) -> Vec<(u64, u64)> {
        self.terms.iter().map(|&(first, term)| (first.max(self.first), term)).collect()
    }

    fn get(&self, index: u64) -> Option<(JournalPos, u32)> {
        let at = usize::try_from(index.checked_sub(self.first)?).ok()?;
        Some((JournalPos(*self.positions.get(at)?), *self.lens.get(at)?))
    }
}

/// Where an entry of the log lies, for a read by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Located {
    pub index: u64,
    pub term: u64,
    pub position: JournalPos,
    pub batch_len: u32,
}

/// What a truncation cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled {
    pub entries: u64,
    /// The first data offset of the cancelled suffix (the partition's next
    /// data offset goes back to it), when it held data.
    pub data_from: Option<u64>,
}

impl<T: Completion + Clone> EntryLog<T> {
    /// The log of a partition reopened with `recovered` (the entries
    /// recovery routed to it, any order; those of index 0 — v1 entries,
    /// relocated copies — are not log entries), `floor` (the last index its
    /// checkpoint recorded; `floor_term` its term when an install named it)
    /// and, in replicated mode, the highest index a commit marker recorded. In replicated mode the committed entries
    /// found densely up to the committed index are held for reads by
    /// index.
    ///
    /// # Errors
    /// [`JournalError::IndexGap`] when the entries above the committed
    /// index are not dense (replicated mode: they would be the log a
    /// leader compares against), or an index is found twice.
    pub fn open(
        mode: LogMode,
        floor: u64,
        floor_term: Option<u64>,
        recovered: &[RoutedEntry],
        committed_marker: u64,
    ) -> Result<Self, JournalError> {
        let mut sorted: Vec<_> = recovered
            .iter()
            .filter(|entry| entry.entry_index > 0 && !entry.relocated && !entry.install)
            .map(|e| (e.entry_index, e.term, e.lane, e.first_offset, e.position, e.batch_len))
            .collect();
        sorted.sort_unstable_by_key(|entry| entry.0);
        if let Some(pair) = sorted.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(JournalError::IndexGap { expected: pair[0].0 + 1, got: pair[1].0 });
        }
        let (last_index, last_term) = match sorted.last() {
            Some(last) if last.0 >= floor => (last.0, last.1),
            _ => (floor, 0),
        };
        let committed = match mode {
            LogMode::Local => last_index,
            LogMode::Replicated => committed_marker.min(last_index),
        };
        let term_of = |index: u64| {
            let found = sorted.iter().find(|entry| entry.0 == index).map(|e| e.1);
            found.or_else(|| floor_term.filter(|_| index == floor && index > 0))
        };
        let committed_term = if committed == 0 { Some(0) } else { term_of(committed) };
        let mut slots = VecDeque::new();
        let mut expected = committed + 1;
        for &(index, term, lane, first_offset, position, batch_len) in
            sorted.iter().filter(|entry| entry.0 > committed)
        {
            if index != expected {
                return Err(JournalError::IndexGap { expected, got: index });
            }
            slots.push_back(LogSlot {
                index,
                term,
                lane,
                first_offset,
                batch_len,
                ticket: None,
                recovered_at: position,
            });
            expected += 1;
        }
        // Every index above the committed one up to the last is held (a
        // checkpoint's floor past them would leave a hole a leader compares
        // against).
        if last_index > committed && expected != last_index + 1 {
            return Err(JournalError::IndexGap { expected, got: last_index });
        }
        let last_term =
            if last_index == committed { committed_term.unwrap_or(last_term) } else { last_term };
        // The dense run of committed entries ending at the committed one,
        // their positions rising with the index (a log written in local
        // mode before may not: only its tail is held).
        let mut held = Held::empty_at(committed + 1);
        if committed == floor {
            held.before = committed_term.filter(|_| floor > 0);
        }
        if mode == LogMode::Replicated {
            let below = sorted.partition_point(|entry| entry.0 <= committed);
            let mut start = below;
            while start > 0 {
                let entry = sorted[start - 1];
                let next = sorted.get(start).filter(|next| next.0 <= committed);
                let dense = next.map_or(entry.0 == committed, |next| next.0 == entry.0 + 1);
                if !dense || next.is_some_and(|next| next.4 <= entry.4) {
                    break;
                }
                start -= 1;
            }
            let run = &sorted[start..below];
            if let Some(first) = run.first() {
                // The entry before the run, when found, names the floor's
                // term; entries past the bound are let go of by `push`,
                // which keeps the term of the last one let go of.
                let before = start
                    .checked_sub(1)
                    .map(|at| sorted[at])
                    .filter(|entry| entry.0 + 1 == first.0)
                    .map(|entry| entry.1)
                    .or_else(|| floor_term.filter(|_| floor > 0 && floor + 1 == first.0));
                held = Held { before, ..Held::empty_at(first.0) };
            }
            for &(index, term, _, _, position, batch_len) in run {
                held.push(index, term, Some(position), batch_len);
            }
        }
        Ok(Self {
            mode,
            last_index,
            last_term,
            committed,
            committed_term,
            commit_target: committed,
            slots,
            truncating: false,
            held,
        })
    }

    pub fn mode(&self) -> LogMode {
        self.mode
    }

    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    pub fn last_term(&self) -> u64 {
        self.last_term
    }

    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// The term of the entry at `index`, when the log still knows it (the
    /// committed entry, or one above it; 0 for index 0).
    pub fn term_at(&self, index: u64) -> Option<u64> {
        if index == self.committed {
            return self.committed_term;
        }
        if index < self.committed {
            return self.held.term_at(index);
        }
        let first = self.slots.front()?.index;
        let at = usize::try_from(index.checked_sub(first)?).ok()?;
        self.slots.get(at).map(|slot| slot.term)
    }

    /// Checks an append at (`index`, `term`): the next index, a term not
    /// below the last one's, no truncation under way, room above the
    /// committed index (replicated mode).
    ///
    /// # Errors
    /// [`JournalError::Truncating`], [`JournalError::IndexGap`],
    /// [`JournalError::TermBehind`], [`JournalError::UncommittedFull`].
    pub fn check_append(&self, index: u64, term: u64) -> Result<(), JournalError> {
        if self.truncating {
            return Err(JournalError::Truncating);
        }
        if index != self.last_index + 1 {
            return Err(JournalError::IndexGap { expected: self.last_index + 1, got: index });
        }
        if term < self.last_term {
            return Err(JournalError::TermBehind { last_term: self.last_term, got: term });
        }
        if self.mode == LogMode::Replicated && self.slots.len() >= LOG_UNCOMMITTED_ENTRIES_MAX {
            return Err(JournalError::UncommittedFull { limit: LOG_UNCOMMITTED_ENTRIES_MAX });
        }
        Ok(())
    }

    /// Records an append [`check_append`](Self::check_append) allowed.
    pub fn push(&mut self, term: u64, lane: Lane, first_offset: u64, batch_len: u32, ticket: T) {
        self.last_index += 1;
        self.last_term = term;
        self.slots.push_back(LogSlot {
            index: self.last_index,
            term,
            lane,
            first_offset,
            batch_len,
            ticket: Some(ticket),
            recovered_at: JournalPos(0),
        });
    }

    /// The highest index at and below which every entry is durable.
    pub fn durable_index(&self) -> u64 {
        let durable = self.slots.iter().take_while(|slot| slot.is_durable()).count();
        self.committed + durable as u64
    }

    /// Moves the committed index as far as the mode allows now; returns
    /// whether it moved.
    pub fn settle(&mut self) -> bool {
        let target = match self.mode {
            LogMode::Local => self.durable_index(),
            LogMode::Replicated => self.commit_target.min(self.durable_index()),
        };
        if target <= self.committed {
            return false;
        }
        while self.slots.front().is_some_and(|slot| slot.index <= target) {
            if let Some(slot) = self.slots.pop_front() {
                self.committed_term = Some(slot.term);
                if self.mode == LogMode::Replicated {
                    self.held.push(slot.index, slot.term, slot.position(), slot.batch_len);
                }
            }
        }
        self.committed = target;
        true
    }

    /// Records that the entries up to `index` are committed (replicated
    /// mode: on a quorum); the committed index follows once they are
    /// durable here too. Lower targets than one already given change
    /// nothing.
    ///
    /// # Errors
    /// [`JournalError::CommitPastLog`] for an index past the last entry;
    /// [`JournalError::NotReplicated`] in local mode (durability commits).
    pub fn set_commit_target(&mut self, index: u64) -> Result<(), JournalError> {
        if self.mode != LogMode::Replicated {
            return Err(JournalError::NotReplicated);
        }
        if index > self.last_index {
            return Err(JournalError::CommitPastLog { index, last_index: self.last_index });
        }
        self.commit_target = self.commit_target.max(index);
        Ok(())
    }

    /// Starts cancelling the entries from `from` on: returns the
    /// completions to wait for (the suffix must be durable before the
    /// marker is written, so that every cancelled entry lies before it in
    /// the journal) — `None` when there is nothing to cancel (`from` is the
    /// next index). Appends are refused until
    /// [`finish_truncate`](Self::finish_truncate) or
    /// [`abort_truncate`](Self::abort_truncate).
    ///
    /// # Errors
    /// [`JournalError::TruncateCommitted`] at or below the committed index
    /// (or the commit target), [`JournalError::IndexGap`] past the next
    /// index, [`JournalError::Truncating`] during another truncation.
    pub fn begin_truncate(&mut self, from: u64) -> Result<Option<Vec<T>>, JournalError> {
        if self.truncating {
            return Err(JournalError::Truncating);
        }
        let committed = self.committed.max(self.commit_target);
        if from <= committed {
            return Err(JournalError::TruncateCommitted { from, committed });
        }
        if from > self.last_index + 1 {
            return Err(JournalError::IndexGap { expected: self.last_index + 1, got: from });
        }
        if from == self.last_index + 1 {
            return Ok(None);
        }
        self.truncating = true;
        Ok(Some(
            self.slots
                .iter()
                .filter(|slot| slot.index >= from)
                .filter_map(|slot| slot.ticket.clone())
                .collect(),
        ))
    }

    /// The truncation's marker is durable: drops the entries from `from`
    /// on and lets appends in again, at `from`.
    pub fn finish_truncate(&mut self, from: u64) -> Cancelled {
        self.truncating = false;
        let keep = self.slots.iter().take_while(|slot| slot.index < from).count();
        let cancelled: Vec<LogSlot<T>> = self.slots.drain(keep..).collect();
        self.last_index = from - 1;
        self.last_term = match self.slots.back() {
            Some(slot) => slot.term,
            None => self.committed_term.unwrap_or(0),
        };
        Cancelled {
            entries: cancelled.len() as u64,
            data_from: cancelled
                .iter()
                .find(|slot| slot.lane == Lane::Data)
                .map(|slot| slot.first_offset),
        }
    }

    /// The truncation failed before its marker was durable: nothing was
    /// cancelled (the journal has failed, or the caller gave up).
    pub fn abort_truncate(&mut self) {
        self.truncating = false;
    }

    /// The lowest journal position of an entry above the committed index
    /// (placed by a commit): files from there on must stay, since a
    /// leader may resend or a follower cancel what they hold.
    pub fn uncommitted_from(&self) -> Option<JournalPos> {
        self.slots.iter().filter_map(LogSlot::position).min()
    }

    /// The first data offset above the committed index: data entries from
    /// there on are not relocated.
    pub fn uncommitted_data_from(&self) -> Option<u64> {
        self.slots.iter().find(|slot| slot.lane == Lane::Data).map(|slot| slot.first_offset)
    }

    /// Entries above the committed index.
    pub fn uncommitted(&self) -> usize {
        self.slots.len()
    }

    /// The lowest index a read by index serves (replicated mode): the
    /// first committed entry held, or the first above the committed index
    /// when none is (`last_index + 1` for an empty log).
    pub fn first_held(&self) -> u64 {
        self.held.first
    }

    /// The (first index, term) runs over the committed entries held
    /// (`first_held()..=committed`), ascending.
    pub fn held_term_runs(&self) -> Vec<(u64, u64)> {
        self.held.term_runs()
    }

    /// Where the first committed entry held at or after `index` lies
    /// (`None`: none is held from there).
    pub fn held_position_from(&self, index: u64) -> Option<JournalPos> {
        self.held.get(index.max(self.held.first)).map(|(position, _)| position)
    }

    /// Lets go of the committed entries that lie below `oldest`, the
    /// oldest journal file still held.
    pub fn release_below(&mut self, oldest: JournalPos) {
        self.held.release_below(oldest);
    }

    /// Where the entries from `low` on lie, in index order, up to `high`
    /// (exclusive, capped at the last index), as long as their batch bytes
    /// stay within `max_bytes` (the first one always), and stopping before
    /// the first entry not yet durable here.
    ///
    /// # Errors
    /// [`JournalError::NotReplicated`] in local mode (nothing is held);
    /// [`JournalError::Compacted`] below [`first_held`](Self::first_held);
    /// [`JournalError::IndexPastLog`] past the last index;
    /// [`JournalError::EntryNotDurable`] when `low` itself is not durable
    /// yet (queued, or written and not yet synced): retry once it is.
    pub fn locate(
        &self,
        low: u64,
        high: u64,
        max_bytes: u64,
    ) -> Result<Vec<Located>, JournalError> {
        if self.mode != LogMode::Replicated {
            return Err(JournalError::NotReplicated);
        }
        let first_index = self.held.first;
        if low < first_index || low == 0 {
            return Err(JournalError::Compacted { index: low, first_index });
        }
        if low > self.last_index {
            return Err(JournalError::IndexPastLog { index: low, last_index: self.last_index });
        }
        let high = high.min(self.last_index + 1);
        let mut found = Vec::new();
        let mut total = 0u64;
        for index in low..high {
            let located = if index < self.held.end() {
                let (position, batch_len) =
                    self.held.get(index).ok_or(JournalError::Compacted { index, first_index })?;
                let term = self.held.term_at(index).unwrap_or(0);
                Located { index, term, position, batch_len }
            } else {
                let first = self.slots.front().map_or(self.committed + 1, |slot| slot.index);
                let at = usize::try_from(index - first).unwrap_or(usize::MAX);
                let slot = self.slots.get(at).filter(|slot| slot.is_durable());
                let Some((slot, position)) = slot.and_then(|s| s.position().map(|p| (s, p))) else {
                    if found.is_empty() {
                        let durable_index = self.durable_index();
                        return Err(JournalError::EntryNotDurable { index, durable_index });
                    }
                    break;
                };
                Located { index, term: slot.term, position, batch_len: slot.batch_len }
            };
            total += u64::from(located.batch_len);
            if !found.is_empty() && total > max_bytes {
                break;
            }
            found.push(located);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use proptest::prelude::*;

    use super::*;

    /// A completion the test resolves by hand.
    #[derive(Clone, Debug, Default)]
    struct Done(Rc<Cell<bool>>);

    impl Completion for Done {
        fn is_durable(&self) -> bool {
            self.0.get()
        }

        fn position(&self) -> Option<JournalPos> {
            None
        }
    }

    fn routed(index: u64, term: u64, lane: Lane, position: u64) -> RoutedEntry {
        RoutedEntry {
            position: JournalPos(position),
            lane,
            first_offset: 0,
            record_count: 1,
            batch_len: 100,
            entry_len: 148,
            relocated: false,
            entry_index: index,
            term,
            install: false,
        }
    }

    fn log(mode: LogMode) -> EntryLog<Done> {
        EntryLog::open(mode, 0, None, &[], 0).unwrap()
    }

    fn push(log: &mut EntryLog<Done>, term: u64, lane: Lane) -> Done {
        let index = log.last_index() + 1;
        log.check_append(index, term).unwrap();
        let done = Done::default();
        log.push(term, lane, index * 10, 100, done.clone());
        done
    }

    #[test]
    fn local_commits_follow_the_durable_prefix_not_the_lane_order() {
        // Goal: a control entry durable ahead of an earlier data entry does
        // not commit past it; once both are durable both are committed.
        let mut log = log(LogMode::Local);
        let data = push(&mut log, 1, Lane::Data);
        let control = push(&mut log, 1, Lane::Control);
        control.0.set(true);
        assert!(!log.settle());
        assert_eq!(log.committed(), 0);
        data.0.set(true);
        assert!(log.settle());
        assert_eq!((log.committed(), log.term_at(2)), (2, Some(1)));
        assert_eq!(log.uncommitted(), 0);
        // Local mode takes no commit target and cancels nothing committed.
        assert!(matches!(log.set_commit_target(2), Err(JournalError::NotReplicated)));
        assert!(matches!(log.begin_truncate(2), Err(JournalError::TruncateCommitted { .. })));
    }

    #[test]
    fn a_follower_append_must_continue_the_log() {
        // Goal: gaps, repeats and lower terms are refused; the next index at
        // the same or a higher term is taken.
        let mut log = log(LogMode::Replicated);
        push(&mut log, 2, Lane::Data);
        assert!(matches!(log.check_append(3, 2), Err(JournalError::IndexGap { expected: 2, .. })));
        assert!(matches!(log.check_append(1, 2), Err(JournalError::IndexGap { .. })));
        assert!(matches!(log.check_append(2, 1), Err(JournalError::TermBehind { .. })));
        assert!(log.check_append(2, 3).is_ok());
    }

    #[test]
    fn replicated_commits_wait_for_the_target_and_for_durability() {
        // Goal: the committed index is the lower of the target and the
        // durable prefix; a target past the log is refused.
        let mut log = log(LogMode::Replicated);
        let first = push(&mut log, 1, Lane::Data);
        let second = push(&mut log, 1, Lane::Control);
        first.0.set(true);
        second.0.set(true);
        assert!(!log.settle());
        log.set_commit_target(1).unwrap();
        assert!(log.settle());
        assert_eq!(log.committed(), 1);
        assert!(matches!(log.set_commit_target(3), Err(JournalError::CommitPastLog { .. })));
        let third = push(&mut log, 1, Lane::Data);
        log.set_commit_target(3).unwrap();
        log.settle();
        assert_eq!(log.committed(), 2);
        third.0.set(true);
        log.settle();
        assert_eq!(log.committed(), 3);
    }

    #[test]
    fn truncation_cancels_the_suffix_and_the_next_append_reuses_its_index() {
        // Goal: truncating from 2 waits for entries 2.. and then drops them;
        // the data offsets go back to the first cancelled data entry; the
        // next append is index 2 again, at any term not below entry 1's.
        let mut log = log(LogMode::Replicated);
        push(&mut log, 1, Lane::Data);
        push(&mut log, 1, Lane::Control);
        push(&mut log, 1, Lane::Data);
        let waits = log.begin_truncate(2).unwrap().unwrap();
        assert_eq!(waits.len(), 2);
        assert!(matches!(log.check_append(4, 1), Err(JournalError::Truncating)));
        let cancelled = log.finish_truncate(2);
        assert_eq!(cancelled, Cancelled { entries: 2, data_from: Some(30) });
        assert_eq!((log.last_index(), log.last_term()), (1, 1));
        assert!(log.check_append(2, 1).is_ok());
        assert_eq!(log.begin_truncate(2).unwrap().map(|w| w.len()), None);
        assert!(matches!(log.begin_truncate(3), Err(JournalError::IndexGap { .. })));
    }

    #[test]
    fn reopening_checks_density_above_the_commit_marker() {
        // Goal: a replicated log reopens with its uncommitted entries dense
        // and refuses a hole among them; below the committed index holes
        // are what retention left and are fine.
        let entries = [
            routed(7, 2, Lane::Data, 0),
            routed(9, 2, Lane::Data, 0),
            routed(10, 3, Lane::Control, 0),
            routed(11, 3, Lane::Data, 0),
        ];
        let log = EntryLog::<Done>::open(LogMode::Replicated, 0, None, &entries, 9).unwrap();
        assert_eq!((log.committed(), log.last_index(), log.last_term()), (9, 11, 3));
        assert_eq!((log.term_at(9), log.term_at(10), log.term_at(8)), (Some(2), Some(3), None));
        let hole = EntryLog::<Done>::open(LogMode::Replicated, 0, None, &entries, 7);
        assert!(matches!(hole, Err(JournalError::IndexGap { expected: 8, got: 9 })));
        let local = EntryLog::<Done>::open(LogMode::Local, 0, None, &entries, 0).unwrap();
        assert_eq!(local.committed(), 11);
        // A checkpoint's floor above every recovered index is the last one.
        let floor = EntryLog::<Done>::open(LogMode::Local, 40, None, &entries, 0).unwrap();
        assert_eq!(floor.last_index(), 40);
    }

    /// A completion durable at a given position.
    #[derive(Clone, Debug)]
    struct At(u64);

    impl Completion for At {
        fn is_durable(&self) -> bool {
            true
        }

        fn position(&self) -> Option<JournalPos> {
            Some(JournalPos(self.0))
        }
    }

    #[test]
    fn committed_entries_stay_readable_by_index_up_to_their_bound() {
        // Goal: a replicated log holds the positions and terms of its committed entries
        // densely (term runs included), serves them with the uncommitted ones by index,
        // bounded by bytes (one entry at least), lets go of those below a released file and
        // beyond LOG_HELD_ENTRIES_MAX, and answers typed errors outside what it holds.
        let mut log = EntryLog::<At>::open(LogMode::Replicated, 0, None, &[], 0).unwrap();
        for index in 1..=6u64 {
            let term = if index <= 3 { 1 } else { 2 };
            log.check_append(index, term).unwrap();
            log.push(term, Lane::Data, index, 100, At(index * 1_000));
        }
        log.set_commit_target(4).unwrap();
        log.settle();
        assert_eq!((log.committed(), log.first_held(), log.uncommitted()), (4, 1, 2));
        assert_eq!((log.term_at(2), log.term_at(4), log.term_at(5)), (Some(1), Some(2), Some(2)));
        let all = log.locate(1, 7, 1 << 20).unwrap();
        let got: Vec<_> = all.iter().map(|e| (e.index, e.term, e.position.0)).collect();
        let want: Vec<_> = (1..=6).map(|i| (i, if i <= 3 { 1 } else { 2 }, i * 1_000)).collect();
        assert_eq!(got, want);
        assert_eq!(log.locate(3, 9, 250).unwrap().len(), 2);
        assert_eq!(log.locate(3, 9, 1).unwrap().len(), 1);
        assert!(log.locate(3, 3, 1).unwrap().is_empty());
        assert!(matches!(log.locate(0, 2, 1), Err(JournalError::Compacted { first_index: 1, .. })));
        assert!(matches!(
            log.locate(7, 8, 1),
            Err(JournalError::IndexPastLog { last_index: 6, .. })
        ));
        log.release_below(JournalPos(2_500));
        assert_eq!(log.first_held(), 3);
        assert!(matches!(log.locate(2, 4, 1), Err(JournalError::Compacted { first_index: 3, .. })));
        // The entry before the first held keeps its term (a replica's floor).
        assert_eq!((log.term_at(1), log.term_at(2)), (None, Some(1)));
        assert_eq!(log.held_term_runs(), vec![(3, 1), (4, 2)]);
        // The bound: only the newest LOG_HELD_ENTRIES_MAX committed entries are held.
        let mut index = log.last_index();
        while index < (LOG_HELD_ENTRIES_MAX + 10) as u64 {
            index += 1;
            log.push(3, Lane::Control, 7, 40, At(index * 1_000));
        }
        log.set_commit_target(index).unwrap();
        log.settle();
        assert_eq!(log.first_held(), index + 1 - LOG_HELD_ENTRIES_MAX as u64);
        assert_eq!(log.term_at(index - 1), Some(3));
        assert_eq!(log.term_at(log.first_held() - 1), Some(3));
        assert_eq!(log.held_term_runs(), vec![(log.first_held(), 3)]);
        // Reopened past the bound, the log knows the term before the first
        // entry it holds (what a replica starts after).
        let routed: Vec<_> = (1..=(LOG_HELD_ENTRIES_MAX as u64 + 3))
            .map(|i| routed(i, if i <= 2 { 1 } else { 4 }, Lane::Data, i * 200))
            .collect();
        let last = routed.len() as u64;
        let reopened = EntryLog::<At>::open(LogMode::Replicated, 0, None, &routed, last).unwrap();
        assert_eq!(reopened.first_held(), 4);
        assert_eq!((reopened.term_at(2), reopened.term_at(3)), (None, Some(4)));
        assert_eq!(reopened.held_term_runs(), vec![(4, 4)]);
        // Local mode holds nothing and refuses reads by index.
        assert!(matches!(
            EntryLog::<At>::open(LogMode::Local, 0, None, &[], 0).unwrap().locate(1, 2, 1),
            Err(JournalError::NotReplicated)
        ));
    }

    #[test]
    fn a_reopened_log_holds_the_dense_run_ending_at_its_committed_index() {
        // Goal: after a reopen the committed entries found densely (positions rising) up
        // to the committed index are held; a hole or a position out of order below them
        // ends the run.
        let entries = [
            routed(2, 1, Lane::Data, 100),
            routed(4, 1, Lane::Data, 300),
            routed(5, 1, Lane::Control, 200),
            routed(6, 2, Lane::Data, 400),
            routed(7, 2, Lane::Data, 500),
            routed(8, 2, Lane::Data, 600),
        ];
        let log = EntryLog::<At>::open(LogMode::Replicated, 0, None, &entries, 7).unwrap();
        // Entry 5 lies below entry 4 (written ahead of it, as in local mode): 5 is
        // the first held.
        assert_eq!((log.first_held(), log.committed(), log.last_index()), (5, 7, 8));
        let found = log.locate(5, 9, 1 << 20).unwrap();
        let got: Vec<_> = found.iter().map(|e| (e.index, e.term, e.position.0)).collect();
        assert_eq!(got, vec![(5, 1, 200), (6, 2, 400), (7, 2, 500), (8, 2, 600)]);
        // The committed entry not found: nothing committed is held.
        let log = EntryLog::<At>::open(LogMode::Replicated, 0, None, &entries[..2], 3).unwrap();
        assert_eq!(log.first_held(), 4);
    }

    proptest! {
        #[test]
        fn committed_never_passes_a_non_durable_entry(
            ops in proptest::collection::vec((0u8..4, any::<bool>()), 1..80),
        ) {
            // Goal: whatever resolves in whatever order, every entry at or
            // below the committed index is durable, and indexes stay dense.
            let mut log = log(LogMode::Local);
            let mut all: Vec<Done> = Vec::new();
            for (op, data) in ops {
                match op {
                    0 | 1 => {
                        let lane = if data { Lane::Data } else { Lane::Control };
                        all.push(push(&mut log, 1, lane));
                    }
                    2 => {
                        // Resolve some entry, not necessarily the oldest.
                        if let Some(done) = all.iter().find(|d| !d.0.get() && data == d.0.get()) {
                            done.0.set(true);
                        } else if let Some(done) = all.iter().rev().find(|d| !d.0.get()) {
                            done.0.set(true);
                        }
                    }
                    _ => { log.settle(); }
                }
                log.settle();
                let committed = log.committed() as usize;
                prop_assert!(all[..committed].iter().all(|done| done.0.get()));
                prop_assert_eq!(log.last_index() as usize, all.len());
                prop_assert_eq!(log.uncommitted(), all.len() - committed);
            }
        }
    }

    #[test]
    fn an_installed_floor_names_its_term_with_nothing_held() {
        // Goal: a log an install started again after (40, 5) knows the term of its floor, so a
        // leader's append at 41 after (40, 5) matches; without the install's term it is unknown.
        let log = EntryLog::<At>::open(LogMode::Replicated, 40, Some(5), &[], 40).unwrap();
        assert_eq!((log.last_index(), log.last_term(), log.committed()), (40, 5, 40));
        assert_eq!(log.term_at(40), Some(5));
        assert_eq!(log.first_held(), 41);
        let bare = EntryLog::<At>::open(LogMode::Replicated, 40, None, &[], 40).unwrap();
        assert_eq!(bare.term_at(40), None);
    }
}
