//! `LogView`: what raft-rs sees of a partition's log (its `Storage`).
//!
//! raft-rs reads its storage synchronously, while the partition's entries
//! live in the shard journal. The view holds, in memory:
//!
//! - the **terms** of the whole log as runs (first index, term): O(term
//!   changes), so `term(i)` always answers — raft-rs asks it for any index a
//!   follower's log might match;
//! - a **window** of the newest entries: every entry above the applied
//!   index (what raft-rs applies and sends most) and, below it, the newest
//!   ones up to [`REPLICA_ENTRY_CACHE_BYTES_MAX`];
//! - the hard state and the voters.
//!
//! An entry below the window asked for by a send to a follower answers
//! `LogTemporarilyUnavailable` and is recorded as a [`Fetch`] (one per
//! first index: raft-rs asks again on every proposal while a read is
//! pending, and those asks join it): the owner reads those entries from the
//! log, ahead of what one message takes ([`REPLICA_FETCH_AHEAD_BYTES`]),
//! hands them back with [`LogView::fetched`], and tells raft-rs
//! (`on_entries_fetched`), which asks again and is served from them. The
//! entries read back are kept as **runs** (one per lagging follower, at most
//! [`REPLICA_FETCH_RUNS_MAX`] and [`REPLICA_FETCH_HELD_BYTES_MAX`] bytes):
//! a run serves every ask that starts inside it, lets go of what it served
//! (the follower's next index is past it) and is dropped after
//! [`REPLICA_FETCH_IDLE_TICKS`] ticks without an ask. Any other read below
//! the window is a broken invariant and answers `Unavailable`.
//!
//! The view is changed only by the replica driver (`node.rs`): entries a
//! `Ready` hands over are put in the view at once (before they are durable:
//! raft-rs reads its own unstable entries first, so the view never serves
//! one it does not also hold), a conflicting suffix is dropped first.
//!
//! [`REPLICA_ENTRY_CACHE_BYTES_MAX`]: super::limits::REPLICA_ENTRY_CACHE_BYTES_MAX
//! [`REPLICA_FETCH_AHEAD_BYTES`]: super::limits::REPLICA_FETCH_AHEAD_BYTES
//! [`REPLICA_FETCH_RUNS_MAX`]: super::limits::REPLICA_FETCH_RUNS_MAX
//! [`REPLICA_FETCH_HELD_BYTES_MAX`]: super::limits::REPLICA_FETCH_HELD_BYTES_MAX
//! [`REPLICA_FETCH_IDLE_TICKS`]: super::limits::REPLICA_FETCH_IDLE_TICKS

use std::cell::RefCell;
use std::collections::VecDeque;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

use super::limits::{
    REPLICA_ENTRY_CACHE_BYTES_MAX, REPLICA_FETCH_CONTEXTS_MAX, REPLICA_FETCH_ENTRIES_MAX,
    REPLICA_FETCH_HELD_BYTES_MAX, REPLICA_FETCH_IDLE_TICKS, REPLICA_FETCH_RUNS_MAX,
};

/// Entries raft-rs asked for that the view no longer holds: read them from
/// the log, give them to [`LogView::fetched`], then call
/// `RawNode::on_entries_fetched` with each of the contexts.
#[derive(Debug)]
pub struct Fetch {
    /// First index wanted.
    pub low: u64,
    /// One past the last index wanted.
    pub high: u64,
    /// raft-rs's contexts of the asks that wait for it (at most
    /// [`REPLICA_FETCH_CONTEXTS_MAX`]: raft-rs keeps no state for an ask,
    /// and one answered ask sends as much as it may).
    pub contexts: Vec<GetEntriesContext>,
}

impl Fetch {
    /// Takes in `other`'s contexts (an ask from the same first index):
    /// the read reaches the further end of the two, and at most
    /// [`REPLICA_FETCH_CONTEXTS_MAX`] contexts are kept.
    pub fn join(&mut self, other: Fetch) {
        debug_assert_eq!(self.low, other.low, "only asks from one index join");
        self.high = self.high.max(other.high);
        let room = REPLICA_FETCH_CONTEXTS_MAX.saturating_sub(self.contexts.len());
        self.contexts.extend(other.contexts.into_iter().take(room));
    }
}

/// Entries read back, dense and ascending, below the window.
#[derive(Debug, Default)]
struct Run {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// Ticks since an ask was last served from it.
    idle_ticks: u32,
}

impl Run {
    fn first(&self) -> u64 {
        self.entries.front().map_or(0, |entry| entry.index)
    }

    fn holds(&self, index: u64) -> bool {
        match (self.entries.front(), self.entries.back()) {
            (Some(first), Some(last)) => first.index <= index && index <= last.index,
            _ => false,
        }
    }

    /// Lets go of the entries below `index`.
    fn drop_below(&mut self, index: u64) {
        while self.entries.front().is_some_and(|entry| entry.index < index) {
            if let Some(entry) = self.entries.pop_front() {
                self.bytes -= entry_bytes(&entry);
            }
        }
    }

    /// Lets go of the entries at and above `index`.
    fn drop_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|entry| entry.index >= index) {
            if let Some(entry) = self.entries.pop_back() {
                self.bytes -= entry_bytes(&entry);
            }
        }
    }
}

/// The terms of a recovered log's entries that stay on disk: (first
/// index, term) runs covering `floor + 1..=through` (none when `through`
/// is at or below the floor).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownTerms {
    pub runs: Vec<(u64, u64)>,
    pub through: u64,
}

/// A partition's log as raft-rs sees it. See the module docs.
#[derive(Debug, Default)]
pub struct LogView {
    hard_state: HardState,
    conf_state: ConfState,
    /// The entry the log starts after (a checkpoint's index and term; 0, 0
    /// for a log from its first entry).
    floor: (u64, u64),
    last_index: u64,
    /// (first index, term), ascending by both; covers `floor + 1..=last`.
    terms: Vec<(u64, u64)>,
    /// Entries `window_start..=last_index`, in order.
    window: VecDeque<Entry>,
    window_bytes: usize,
    /// The applied index: the window keeps everything above it.
    applied: u64,
    /// Bytes of applied entries the window keeps
    /// ([`REPLICA_ENTRY_CACHE_BYTES_MAX`] unless set smaller).
    cache_bytes: usize,
    /// Reads below the window raft-rs is waiting for, one per first index.
    fetches: RefCell<Vec<Fetch>>,
    /// Entries read back for those reads (module docs).
    runs: RefCell<Vec<Run>>,
    /// Members raft-rs wanted a snapshot for since the owner last took
    /// them (each once): behind the log's first index.
    snapshot_asks: RefCell<Vec<u64>>,
    /// The (index, term) of the durable checkpoint the owner can ship as a
    /// snapshot (`docs/design/replication.md` §6), if any.
    snapshot_at: Option<(u64, u64)>,
}

impl LogView {
    /// A view of a log that starts after `floor` (index, term) and holds
    /// `entries` (dense, from `floor.0 + 1`), with `voters`, the persisted
    /// term and vote, and the committed index `commit` (clamped to the
    /// log). Every entry is in the window at first; the applied index is
    /// `applied` (≤ `commit`).
    ///
    /// # Errors
    /// Entries not dense from the floor, or terms going down.
    pub fn recovered(
        floor: (u64, u64),
        entries: Vec<Entry>,
        voters: Vec<u64>,
        vote: (u64, u64),
        commit: u64,
        applied: u64,
    ) -> Result<LogView, String> {
        LogView::recovered_after(
            &KnownTerms::default(),
            floor,
            entries,
            voters,
            vote,
            commit,
            applied,
        )
    }

    /// [`LogView::recovered`] for a log whose entries up to `known.through`
    /// stay on disk: only their terms (`known.runs`) are held, `entries`
    /// are dense from `known.through + 1`, and a read below them is a
    /// [`Fetch`]. Every entry above `applied` must be in `entries`.
    ///
    /// # Errors
    /// As [`LogView::recovered`]; runs not ascending from `floor.0 + 1`,
    /// and an applied index below the entries held.
    pub fn recovered_after(
        known: &KnownTerms,
        floor: (u64, u64),
        entries: Vec<Entry>,
        voters: Vec<u64>,
        (term, vote): (u64, u64),
        commit: u64,
        applied: u64,
    ) -> Result<LogView, String> {
        let mut view = LogView {
            floor,
            last_index: floor.0,
            applied: floor.0,
            cache_bytes: REPLICA_ENTRY_CACHE_BYTES_MAX,
            ..LogView::default()
        };
        let mut previous_term = floor.1;
        if known.through > floor.0 {
            if known.runs.first().is_none_or(|run| run.0 != floor.0 + 1) {
                return Err(format!("recovered terms do not start after the floor {}", floor.0));
            }
            let mut previous_first = floor.0;
            for &(first, run_term) in &known.runs {
                if first <= previous_first || first > known.through || run_term < previous_term {
                    return Err(format!("recovered term run ({first}, {run_term}) out of order"));
                }
                view.terms.push((first, run_term));
                previous_first = first;
                previous_term = run_term;
            }
            view.last_index = known.through;
            if applied < known.through {
                return Err(format!(
                    "applied {applied} is below the entries held from {}",
                    known.through + 1
                ));
            }
        }
        for entry in entries {
            if entry.index != view.last_index + 1 {
                return Err(format!(
                    "recovered log is not dense: entry {} after {}",
                    entry.index, view.last_index
                ));
            }
            if entry.term < previous_term {
                return Err(format!(
                    "recovered log's terms go down at entry {}: {} after {previous_term}",
                    entry.index, entry.term
                ));
            }
            previous_term = entry.term;
            view.push(entry);
        }
        let commit = commit.clamp(floor.0, view.last_index);
        // The vote store and the journal sync apart: a crash can keep
        // entries of a term whose vote was lost. The term is then the
        // log's, with no vote in it (a vote never sent: its grant waits
        // for the vote's sync), never the older term's vote.
        view.hard_state.term = term.max(previous_term);
        view.hard_state.vote = if previous_term > term { 0 } else { vote };
        view.hard_state.commit = commit;
        view.applied = applied.clamp(floor.0, commit);
        view.conf_state.voters = voters;
        Ok(view)
    }

    /// The view with `learners` in its configuration (members that get
    /// every entry and neither vote nor count for a commit).
    #[must_use]
    pub fn with_learners(mut self, learners: Vec<u64>) -> LogView {
        self.conf_state.learners = learners;
        self
    }

    /// The configuration after a membership change was applied (what
    /// raft-rs restarts from and snapshots name).
    pub fn set_conf_state(&mut self, conf: ConfState) {
        self.conf_state = conf;
    }

    /// The last index held.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// The term of the last entry (the floor's when empty).
    pub fn last_term(&self) -> u64 {
        self.terms.last().map_or(self.floor.1, |&(_, term)| term)
    }

    /// The hard state last handed to the view.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Records the hard state raft-rs handed over (in a `Ready`).
    pub fn set_hard_state(&mut self, hard_state: &HardState) {
        self.hard_state = hard_state.clone();
    }

    /// Puts `entries` (dense, ascending) in the view, dropping first every
    /// entry held at or above the first one's index (a conflicting suffix).
    /// Returns that index when something was dropped.
    pub fn append(&mut self, entries: &[Entry]) -> Option<u64> {
        let first = entries.first()?.index;
        assert!(first > self.floor.0, "append at {first}, at or below the floor {}", self.floor.0);
        assert!(first <= self.last_index + 1, "append at {first} past {}", self.last_index + 1);
        let cut = (first <= self.last_index).then_some(first);
        if cut.is_some() {
            assert!(first > self.applied, "append at {first} rewrites applied {}", self.applied);
            self.truncate_from(first);
        }
        for entry in entries {
            self.push(entry.clone());
        }
        cut
    }

    /// Entries up to `index` are applied: below it the window keeps only
    /// its newest [`REPLICA_ENTRY_CACHE_BYTES_MAX`] bytes.
    pub fn set_applied(&mut self, index: u64) {
        self.applied = self.applied.max(index.min(self.last_index));
        while self.window_bytes > self.cache_bytes {
            match self.window.front() {
                Some(entry) if entry.index <= self.applied => {
                    self.window_bytes -= entry_bytes(entry);
                    self.window.pop_front();
                }
                _ => break,
            }
        }
    }

    /// Lets go of the entries up to `index` (at most the applied index):
    /// raft-rs's first index becomes `index + 1`, and an ask below it
    /// answers `Compacted` (raft-rs then wants a snapshot for that
    /// follower). The owner calls it once every member holds those entries
    /// and a checkpoint covers them, before their journal files go.
    /// Returns whether the floor moved.
    pub fn compact_to(&mut self, index: u64) -> bool {
        let index = index.min(self.applied);
        if index <= self.floor.0 {
            return false;
        }
        let Some(term) = self.term_of(index) else { return false };
        self.floor = (index, term);
        let mut dropped = 0;
        while dropped + 1 < self.terms.len() && self.terms[dropped + 1].0 <= index + 1 {
            dropped += 1;
        }
        self.terms.drain(..dropped);
        if index >= self.last_index {
            self.terms.clear();
        } else if let Some(first) = self.terms.first_mut() {
            first.0 = index + 1;
        }
        while self.window.front().is_some_and(|entry| entry.index <= index) {
            if let Some(entry) = self.window.pop_front() {
                self.window_bytes -= entry_bytes(&entry);
            }
        }
        let runs = self.runs.get_mut();
        for run in runs.iter_mut() {
            run.drop_below(index + 1);
        }
        runs.retain(|run| !run.entries.is_empty());
        self.fetches.get_mut().retain(|fetch| fetch.low > index);
        true
    }

    /// The owner's durable checkpoint at (`index`, `term`) can be shipped
    /// as a snapshot from now on.
    pub fn set_snapshot_at(&mut self, index: u64, term: u64) {
        if index > 0 && term > 0 && self.snapshot_at.is_none_or(|at| at.0 <= index) {
            self.snapshot_at = Some((index, term));
        }
    }

    /// The snapshot the owner offers, if any.
    pub fn snapshot_at(&self) -> Option<(u64, u64)> {
        self.snapshot_at
    }

    /// The members raft-rs wanted a snapshot for since the last call.
    pub fn take_snapshot_asks(&self) -> Vec<u64> {
        std::mem::take(&mut *self.snapshot_asks.borrow_mut())
    }

    /// The entry the log starts after (index, term).
    pub fn floor(&self) -> (u64, u64) {
        self.floor
    }

    /// Keeps at most `bytes` of applied entries (at most
    /// [`REPLICA_ENTRY_CACHE_BYTES_MAX`]): a simulation sets it small so
    /// lagging followers are served by read-backs.
    pub fn set_cache_bytes(&mut self, bytes: usize) {
        self.cache_bytes = bytes.min(REPLICA_ENTRY_CACHE_BYTES_MAX);
    }

    /// The reads raft-rs waits for (taken: each is asked once).
    pub fn take_fetches(&self) -> Vec<Fetch> {
        std::mem::take(&mut *self.fetches.borrow_mut())
    }

    /// Moves the contexts of a pending ask from `fetch.low` into `fetch`
    /// (at most [`REPLICA_FETCH_CONTEXTS_MAX`] in all).
    pub fn join_asked(&self, fetch: &mut Fetch) {
        let mut fetches = self.fetches.borrow_mut();
        if let Some(at) = fetches.iter().position(|asked| asked.low == fetch.low) {
            fetch.join(fetches.remove(at));
        }
    }

    /// Whether an ask from `index` is served from the entries read back
    /// (a fetch taken while an earlier read of it was under way needs no
    /// read of its own).
    pub fn holds_fetched(&self, index: u64) -> bool {
        self.runs.borrow().iter().any(|run| run.holds(index))
    }

    /// Entries read back from the log for a [`Fetch`] (dense, ascending,
    /// at most [`REPLICA_FETCH_ENTRIES_MAX`] kept), kept as a run. It
    /// replaces the run it continues (that follower was sent it) and what
    /// it overlaps; it keeps its first entry whatever its size (the ask it
    /// answers is served: never read back again and again), then as much
    /// as [`REPLICA_FETCH_HELD_BYTES_MAX`] allows; the least recently asked
    /// runs are let go of past [`REPLICA_FETCH_RUNS_MAX`] or that bound.
    pub fn fetched(&mut self, entries: Vec<Entry>) {
        let start = self.window_start();
        let mut entries: VecDeque<Entry> = entries
            .into_iter()
            .take(REPLICA_FETCH_ENTRIES_MAX)
            .take_while(|entry| entry.index < start)
            .collect();
        let (Some(first), Some(last)) = (entries.front(), entries.back()) else { return };
        let (first, last) = (first.index, last.index);
        let runs = self.runs.get_mut();
        // A run ending just before this read is its follower's previous
        // one (sent): replaced. A run overlapping it keeps what is below.
        runs.retain(|run| run.entries.back().is_none_or(|entry| entry.index + 1 != first));
        for run in runs.iter_mut() {
            if run.holds(first) || run.holds(last) || (first..=last).contains(&run.first()) {
                run.drop_from(first);
            }
        }
        runs.retain(|run| !run.entries.is_empty());
        // The new run always keeps its first entry (the ask it answers
        // must be served, or it would be read again and again), and as
        // much more as the bound allows.
        let mut bytes: usize = entries.iter().map(entry_bytes).sum();
        while bytes > REPLICA_FETCH_HELD_BYTES_MAX && entries.len() > 1 {
            if let Some(entry) = entries.pop_back() {
                bytes -= entry_bytes(&entry);
            }
        }
        // Then the least recently asked of the others go first.
        runs.sort_by_key(|run| std::cmp::Reverse(run.idle_ticks));
        let mut held: usize = runs.iter().map(|run| run.bytes).sum();
        while !runs.is_empty()
            && (runs.len() + 1 > REPLICA_FETCH_RUNS_MAX
                || held + bytes > REPLICA_FETCH_HELD_BYTES_MAX)
        {
            held -= runs.remove(0).bytes;
        }
        runs.push(Run { entries, bytes, idle_ticks: 0 });
    }

    /// One tick: runs no ask was served from for
    /// [`REPLICA_FETCH_IDLE_TICKS`] are let go of (their follower caught
    /// up, or is gone).
    pub fn tick(&mut self) {
        let runs = self.runs.get_mut();
        for run in runs.iter_mut() {
            run.idle_ticks += 1;
        }
        runs.retain(|run| run.idle_ticks <= REPLICA_FETCH_IDLE_TICKS);
    }

    /// Bytes of entries read back that the view holds.
    pub fn fetched_bytes(&self) -> usize {
        self.runs.borrow().iter().map(|run| run.bytes).sum()
    }

    /// Records an ask from `low` to read back (joining a pending one from
    /// the same index).
    fn ask(&self, low: u64, high: u64, context: GetEntriesContext) {
        let asked = Fetch { low, high, contexts: vec![context] };
        let mut fetches = self.fetches.borrow_mut();
        match fetches.iter_mut().find(|fetch| fetch.low == low) {
            Some(fetch) => fetch.join(asked),
            None => fetches.push(asked),
        }
    }

    /// The entries from `low` (below the window) toward `high` a run holds,
    /// continued by the window when the run reaches it; the run lets go of
    /// what is below `low`. Empty when no run holds `low`.
    fn served_by_runs(&self, low: u64, high: u64) -> Vec<Entry> {
        let start = self.window_start();
        let mut runs = self.runs.borrow_mut();
        let Some(run) = runs.iter_mut().find(|run| run.holds(low)) else { return Vec::new() };
        run.drop_below(low);
        run.idle_ticks = 0;
        let mut entries: Vec<Entry> =
            run.entries.iter().take_while(|entry| entry.index < high).cloned().collect();
        let next = low + entries.len() as u64;
        if next == start {
            entries.extend(self.window.iter().take_while(|entry| entry.index < high).cloned());
        }
        entries
    }

    fn window_start(&self) -> u64 {
        self.window.front().map_or(self.last_index + 1, |entry| entry.index)
    }

    fn push(&mut self, entry: Entry) {
        if self.terms.last().is_none_or(|&(_, term)| term != entry.term) {
            self.terms.push((entry.index, entry.term));
        }
        self.last_index = entry.index;
        self.window_bytes += entry_bytes(&entry);
        self.window.push_back(entry);
    }

    fn truncate_from(&mut self, from: u64) {
        while self.window.back().is_some_and(|entry| entry.index >= from) {
            if let Some(entry) = self.window.pop_back() {
                self.window_bytes -= entry_bytes(&entry);
            }
        }
        while self.terms.last().is_some_and(|&(first, _)| first >= from) {
            self.terms.pop();
        }
        for run in self.runs.get_mut() {
            run.drop_from(from);
        }
        self.last_index = from - 1;
    }

    fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.floor.0 {
            return Some(self.floor.1);
        }
        if index < self.floor.0 || index > self.last_index {
            return None;
        }
        let run = self.terms.partition_point(|&(first, _)| first <= index);
        run.checked_sub(1).map(|run| self.terms[run].1)
    }
}

fn entry_bytes(entry: &Entry) -> usize {
    entry.data.len() + entry.context.len() + 32
}

impl raft::Storage for LogView {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState { hard_state: self.hard_state.clone(), conf_state: self.conf_state.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.floor.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let start = self.window_start();
        let mut entries: Vec<Entry> = if low >= start {
            let skip = (low - start) as usize;
            self.window.iter().skip(skip).take((high - low) as usize).cloned().collect()
        } else {
            // A run ends short of the window or of what was asked: raft-rs
            // asks again from where it ends.
            self.served_by_runs(low, high)
        };
        // Served only when dense from `low`: otherwise read back.
        let dense = entries.iter().enumerate().all(|(at, entry)| entry.index == low + at as u64);
        if !dense || entries.is_empty() && low < high {
            if context.can_async() && low < start {
                self.ask(low, high.min(start), context);
                return Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable));
            }
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.floor.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.floor.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        // Asked for a member behind the log's first index (its log lost,
        // or a new replica). The owner's durable checkpoint is offered
        // when the log holds every entry after it: raft-rs then sends from
        // the entry after it once the member installed it. Its bytes are
        // pulled by the member (`snapshot.rs`); `data` only says so.
        let mut asks = self.snapshot_asks.borrow_mut();
        if !asks.contains(&to) {
            asks.push(to);
        }
        match self.snapshot_at {
            Some((index, term))
                if index >= self.floor.0 && index <= self.last_index && index >= request_index =>
            {
                let mut snapshot = Snapshot::default();
                snapshot.data = super::snapshot::SNAPSHOT_DESCRIPTOR.to_vec().into();
                let metadata = snapshot.mut_metadata();
                metadata.index = index;
                metadata.term = term;
                metadata.set_conf_state(self.conf_state.clone());
                Ok(snapshot)
            }
            _ => Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;

    fn entry(index: u64, term: u64, bytes: usize) -> Entry {
        Entry { index, term, data: vec![index as u8; bytes].into(), ..Entry::default() }
    }

    fn view(entries: &[(u64, u64)]) -> LogView {
        let entries = entries.iter().map(|&(index, term)| entry(index, term, 10)).collect();
        LogView::recovered((0, 0), entries, vec![1, 2, 3], (0, 0), 0, 0).expect("a dense log")
    }

    #[test]
    fn terms_answer_for_every_index_from_runs() {
        let view = view(&[(1, 1), (2, 1), (3, 2), (4, 2), (5, 5)]);
        let terms: Vec<_> = (0..=5).map(|index| view.term(index).expect("held")).collect();
        assert_eq!(terms, [0, 1, 1, 2, 2, 5]);
        assert!(view.term(6).is_err());
        assert_eq!(view.terms.len(), 3, "one run per term");
    }

    #[test]
    fn a_conflicting_append_drops_the_suffix_and_its_terms() {
        let mut view = view(&[(1, 1), (2, 1), (3, 2), (4, 2)]);
        let cut = view.append(&[entry(3, 3, 10), entry(4, 3, 10), entry(5, 3, 10)]);
        assert_eq!(cut, Some(3));
        assert_eq!(view.last_index(), 5);
        assert_eq!(view.term(2).expect("held"), 1);
        assert_eq!(view.term(4).expect("held"), 3);
        assert_eq!(view.append(&[entry(6, 3, 10)]), None, "a plain append cuts nothing");
        let all = view.entries(1, 7, None, GetEntriesContext::empty(false)).expect("held");
        let shape: Vec<_> = all.iter().map(|entry| (entry.index, entry.term)).collect();
        assert_eq!(shape, [(1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3)]);
    }

    #[test]
    fn a_log_reopened_with_its_applied_prefix_on_disk_knows_its_terms_and_fetches_it() {
        // Goal: a reopened partition keeps only what it has not applied in
        // memory; the applied prefix answers by term and is read back for a
        // follower, and a short read-back is served as far as it is dense.
        let known = KnownTerms { runs: vec![(3, 1), (5, 2)], through: 6 };
        let entries = vec![entry(7, 2, 10), entry(8, 3, 10)];
        let view = LogView::recovered_after(&known, (2, 1), entries, vec![1, 2], (3, 0), 8, 6)
            .expect("terms and entries");
        assert_eq!(view.last_index(), 8);
        let terms: Vec<_> = (2..=8).map(|index| view.term(index).expect("known")).collect();
        assert_eq!(terms, [1, 1, 1, 2, 2, 2, 3]);
        let asked = view.entries(3, 9, None, GetEntriesContext::empty(true));
        assert!(matches!(asked, Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable))));
        let fetches = view.take_fetches();
        assert_eq!((fetches[0].low, fetches[0].high), (3, 7));
        let mut view = view;
        view.fetched(vec![entry(3, 1, 10), entry(4, 1, 10)]);
        let served = view.entries(3, 9, None, GetEntriesContext::empty(true)).expect("fetched");
        let shape: Vec<_> = served.iter().map(|entry| entry.index).collect();
        assert_eq!(shape, [3, 4], "a read-back short of the window serves its dense run");
        assert!(view.entries(7, 9, None, GetEntriesContext::empty(false)).is_ok());
        // Terms that do not start after the floor, or an applied index below
        // the entries in memory, are refused.
        let late = KnownTerms { runs: vec![(4, 1)], through: 6 };
        let after = |known: &KnownTerms, applied| {
            let entries = vec![entry(7, 2, 10)];
            LogView::recovered_after(known, (2, 1), entries, vec![1], (3, 0), 7, applied)
        };
        assert!(after(&late, 6).is_err());
        assert!(after(&known, 5).is_err());
        assert!(after(&KnownTerms { runs: vec![(3, 1), (5, 0)], through: 6 }, 6).is_err());
    }

    #[test]
    fn below_the_window_a_send_is_fetched_and_then_served() {
        let big = REPLICA_ENTRY_CACHE_BYTES_MAX / 4;
        let entries = (1..=8).map(|index| entry(index, 1, big)).collect();
        let mut view =
            LogView::recovered((0, 0), entries, vec![1, 2], (1, 0), 8, 0).expect("a dense log");
        view.set_applied(8);
        let start = view.window_start();
        assert!(start > 1 && start <= 6, "the window kept the cache's worth: from {start}");
        // A read for a send below the window: asked, not served.
        let context = GetEntriesContext::empty(true);
        let refused = view.entries(1, 4, None, context);
        assert!(matches!(
            refused,
            Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable))
        ));
        let fetches = view.take_fetches();
        assert_eq!(fetches.len(), 1);
        assert_eq!((fetches[0].low, fetches[0].high), (1, 4));
        // A read of another kind below the window is a broken invariant.
        let sync = view.entries(1, 4, None, GetEntriesContext::empty(false));
        assert!(matches!(sync, Err(raft::Error::Store(StorageError::Unavailable))));
        view.fetched((1..start).map(|index| entry(index, 1, big)).collect());
        let served = view.entries(1, 4, None, GetEntriesContext::empty(true)).expect("fetched");
        assert_eq!(served.iter().map(|entry| entry.index).collect::<Vec<_>>(), [1, 2, 3]);
        // Across the fetched entries and the window alike.
        let across = view.entries(1, 9, None, GetEntriesContext::empty(true)).expect("both");
        assert_eq!(across.len(), 8);
    }

    /// A view of `count` entries of `bytes` each, all applied, with the
    /// window holding only the newest few.
    fn lagging_view(count: u64, bytes: usize) -> LogView {
        let entries = (1..=count).map(|index| entry(index, 1, bytes)).collect();
        let mut view = LogView::recovered((0, 0), entries, vec![1, 2, 3], (1, 0), count, 0)
            .expect("a dense log");
        view.set_cache_bytes(2 * bytes);
        view.set_applied(count);
        view
    }

    fn unavailable(view: &LogView, low: u64, high: u64) -> bool {
        matches!(
            view.entries(low, high, None, GetEntriesContext::empty(true)),
            Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable))
        )
    }

    #[test]
    fn asks_for_the_same_entries_join_one_read_back() {
        // Goal: raft-rs asks again on every proposal while a follower's
        // read-back is pending; those asks must not each read the log.
        let view = lagging_view(100, 1_000);
        for _ in 0..50 {
            assert!(unavailable(&view, 10, 101));
        }
        assert!(unavailable(&view, 40, 101), "another follower's ask is its own read");
        let fetches = view.take_fetches();
        let lows: Vec<_> = fetches.iter().map(|fetch| fetch.low).collect();
        assert_eq!(lows, [10, 40]);
        assert_eq!(fetches[0].contexts.len(), REPLICA_FETCH_CONTEXTS_MAX, "contexts are bounded");
        assert_eq!(fetches[0].high, view.window_start(), "a read stops at the window");
    }

    #[test]
    fn a_run_read_back_serves_every_ask_inside_it_and_lets_go_of_what_it_served() {
        // Goal: one read ahead of one message feeds a lagging follower's
        // next messages too, without holding what it was already sent.
        let mut view = lagging_view(100, 1_000);
        let start = view.window_start();
        view.fetched((10..60).map(|index| entry(index, 1, 1_000)).collect());
        assert!(view.holds_fetched(10) && view.holds_fetched(59) && !view.holds_fetched(60));
        let size = Some(10_500);
        let first = view.entries(10, 101, size, GetEntriesContext::empty(true)).expect("run");
        assert_eq!((first[0].index, first.len()), (10, 10), "a message's worth from the run");
        let next = view.entries(20, 101, size, GetEntriesContext::empty(true)).expect("run");
        assert_eq!(next[0].index, 20, "the next ask is served from the same run");
        assert!(!view.holds_fetched(19), "what was sent is let go of");
        assert_eq!(view.fetched_bytes(), 40 * entry_bytes(&entry(0, 1, 1_000)));
        // Past the run's end the follower is read back again.
        assert!(unavailable(&view, 60, 101));
        assert_eq!(view.take_fetches()[0].low, 60);
        // A run reaching the window is continued by it.
        view.fetched((60..start).map(|index| entry(index, 1, 1_000)).collect());
        let across = view.entries(60, 101, None, GetEntriesContext::empty(true)).expect("both");
        assert_eq!(across.len() as u64, 101 - 60, "run and window, dense");
        // A run nobody asks from is let go of.
        for _ in 0..=REPLICA_FETCH_IDLE_TICKS {
            view.tick();
        }
        assert_eq!(view.fetched_bytes(), 0);
        assert!(!view.holds_fetched(60));
    }

    #[test]
    fn a_read_continuing_a_run_replaces_it_and_is_always_served() {
        // Goal: a follower's next read-back is served even when it and the
        // run before it are over the bound together; were it trimmed away,
        // raft-rs would ask for it again at once, and the shard would read
        // the same entries in a loop (seen on a real cluster).
        let big = REPLICA_FETCH_HELD_BYTES_MAX / 6;
        let mut view = lagging_view(400, big);
        view.fetched((300..305).map(|index| entry(index, 1, big)).collect());
        let sent = view.entries(300, 305, None, GetEntriesContext::empty(true)).expect("run");
        assert_eq!(sent.len(), 5);
        view.fetched((305..307).map(|index| entry(index, 1, big)).collect());
        assert!(view.holds_fetched(305) && view.holds_fetched(306));
        assert!(!view.holds_fetched(304), "the run it continues was sent: let go of");
        assert!(view.entries(305, 307, None, GetEntriesContext::empty(true)).is_ok());
        // One entry over the bound alone is still kept (and served).
        let huge = entry(390, 1, REPLICA_FETCH_HELD_BYTES_MAX + 1);
        view.fetched(vec![huge]);
        assert!(view.holds_fetched(390));
    }

    #[test]
    fn asks_recorded_during_a_read_join_its_answer() {
        let view = lagging_view(100, 1_000);
        assert!(unavailable(&view, 10, 101));
        let mut fetch = view.take_fetches().remove(0);
        // While it is read, raft-rs asks again (a proposal, a heartbeat).
        assert!(unavailable(&view, 10, 101));
        assert!(unavailable(&view, 10, 101));
        assert!(unavailable(&view, 30, 101));
        view.join_asked(&mut fetch);
        assert_eq!(fetch.contexts.len(), 3, "the asks for the same entries are answered with it");
        let left: Vec<_> = view.take_fetches().iter().map(|fetch| fetch.low).collect();
        assert_eq!(left, [30], "another follower's ask stays");
    }

    #[test]
    fn read_back_runs_are_bounded_in_number_and_bytes() {
        let big = REPLICA_FETCH_HELD_BYTES_MAX / 8;
        let mut view = lagging_view(200, big);
        for run in 0..(REPLICA_FETCH_RUNS_MAX as u64 + 2) {
            let first = 1 + run * 20;
            view.fetched((first..first + 2).map(|index| entry(index, 1, big)).collect());
            view.tick();
        }
        let runs = view.runs.borrow();
        assert!(runs.len() <= REPLICA_FETCH_RUNS_MAX);
        assert!(view.fetched_bytes() <= REPLICA_FETCH_HELD_BYTES_MAX);
        let newest = 1 + (REPLICA_FETCH_RUNS_MAX as u64 + 1) * 20;
        assert!(runs.iter().any(|run| run.holds(newest)), "the newest run is kept");
        drop(runs);
        // One read larger than the bound keeps its head, the bound's worth.
        view.fetched((150..170).map(|index| entry(index, 1, big)).collect());
        assert!(view.holds_fetched(150));
        assert!(view.fetched_bytes() <= REPLICA_FETCH_HELD_BYTES_MAX);
        // A read overlapping a run replaces the overlap.
        view.fetched((160..165).map(|index| entry(index, 2, 10)).collect());
        let served = view.entries(160, 165, None, GetEntriesContext::empty(true)).expect("run");
        assert!(served.iter().all(|entry| entry.term == 2));
    }

    #[test]
    fn everything_above_the_applied_index_stays_in_the_window() {
        let big = REPLICA_ENTRY_CACHE_BYTES_MAX / 2;
        let entries = (1..=6).map(|index| entry(index, 1, big)).collect();
        let mut view =
            LogView::recovered((0, 0), entries, vec![1], (1, 0), 6, 0).expect("a dense log");
        view.set_applied(2);
        // Over the cache: 1 and 2 go, 3..=6 stay although over it.
        assert_eq!(view.window_start(), 3, "nothing above applied 2 is let go of");
        assert!(view.entries(3, 7, None, GetEntriesContext::empty(false)).is_ok());
        view.set_applied(5);
        assert_eq!(view.window_start(), 6, "applied entries beyond the cache are let go of");
        assert!(view.entries(6, 7, None, GetEntriesContext::empty(false)).is_ok());
    }

    #[test]
    fn a_compacted_view_starts_after_its_floor_and_keeps_the_terms_above() {
        // Terms 1 (1..=4), 2 (5..=8), 3 (9..=12); applied 10.
        let entries: Vec<(u64, u64)> = (1..=12)
            .map(|index| {
                (
                    index,
                    if index <= 4 {
                        1
                    } else if index <= 8 {
                        2
                    } else {
                        3
                    },
                )
            })
            .collect();
        let mut view = view(&entries);
        view.set_applied(10);
        // Not past the applied index, and never down.
        assert!(view.compact_to(11));
        assert_eq!(view.floor(), (10, 3));
        assert!(!view.compact_to(6));
        assert_eq!(view.first_index().unwrap(), 11);
        assert_eq!(view.term(10).unwrap(), 3);
        assert_eq!(view.term(11).unwrap(), 3);
        assert_eq!(view.term(12).unwrap(), 3);
        assert!(matches!(view.term(9), Err(raft::Error::Store(StorageError::Compacted))));
        let context = GetEntriesContext::empty(false);
        assert!(matches!(
            view.entries(10, 12, None, context),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let above = view.entries(11, 13, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(above.iter().map(|e| e.index).collect::<Vec<_>>(), vec![11, 12]);

        // Inside a term run: the run is cut to start after the floor.
        let mut inside = view_of_applied(&entries, 12);
        assert!(inside.compact_to(6));
        assert_eq!(inside.floor(), (6, 2));
        assert_eq!(inside.term(7).unwrap(), 2);
        assert_eq!(inside.term(9).unwrap(), 3);
        assert_eq!(inside.last_term(), 3);
        // To the last entry: no run left, the last term is the floor's.
        assert!(inside.compact_to(12));
        assert_eq!(inside.last_term(), 3);
        assert_eq!(inside.last_index(), 12);
    }

    #[test]
    fn a_snapshot_ask_is_refused_and_recorded_once_per_member() {
        let view = view(&[(1, 1), (2, 1)]);
        for _ in 0..3 {
            assert!(matches!(
                view.snapshot(0, 3),
                Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))
            ));
        }
        let _ = view.snapshot(0, 2);
        assert_eq!(view.take_snapshot_asks(), vec![3, 2]);
        assert!(view.take_snapshot_asks().is_empty());
    }

    fn view_of_applied(entries: &[(u64, u64)], applied: u64) -> LogView {
        let mut view = view(entries);
        view.set_applied(applied);
        view
    }

    #[test]
    fn a_log_past_the_stored_term_takes_its_term_and_no_vote() {
        let entries = vec![entry(1, 4, 1), entry(2, 5, 1)];
        let view =
            LogView::recovered((0, 0), entries, vec![1, 2, 3], (4, 3), 2, 0).expect("a dense log");
        assert_eq!((view.hard_state().term, view.hard_state().vote), (5, 0));
        let entries = vec![entry(1, 4, 1)];
        let view =
            LogView::recovered((0, 0), entries, vec![1, 2, 3], (6, 3), 1, 0).expect("a dense log");
        assert_eq!((view.hard_state().term, view.hard_state().vote), (6, 3));
    }

    #[test]
    fn a_recovered_log_with_a_hole_or_falling_terms_is_refused() {
        let hole = vec![entry(1, 1, 1), entry(3, 1, 1)];
        assert!(LogView::recovered((0, 0), hole, vec![1], (1, 0), 0, 0).is_err());
        let falling = vec![entry(1, 2, 1), entry(2, 1, 1)];
        assert!(LogView::recovered((0, 0), falling, vec![1], (2, 0), 0, 0).is_err());
    }
}
