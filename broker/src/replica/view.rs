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
//! `LogTemporarilyUnavailable` and is recorded as a [`Fetch`]: the owner
//! reads those entries from the log, hands them back with
//! [`LogView::fetched`], and tells raft-rs (`on_entries_fetched`), which
//! asks again and is served from them. Any other read below the window is
//! a broken invariant and answers `Unavailable`.
//!
//! The view is changed only by the replica driver (`node.rs`): entries a
//! `Ready` hands over are put in the view at once (before they are durable:
//! raft-rs reads its own unstable entries first, so the view never serves
//! one it does not also hold), a conflicting suffix is dropped first.
//!
//! [`REPLICA_ENTRY_CACHE_BYTES_MAX`]: super::limits::REPLICA_ENTRY_CACHE_BYTES_MAX

use std::cell::RefCell;
use std::collections::VecDeque;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

use super::limits::{REPLICA_ENTRY_CACHE_BYTES_MAX, REPLICA_FETCH_ENTRIES_MAX};

/// Entries raft-rs asked for that the view no longer holds: read them from
/// the log, give them to [`LogView::fetched`], then call
/// `RawNode::on_entries_fetched(context)`.
#[derive(Debug)]
pub struct Fetch {
    /// First index wanted.
    pub low: u64,
    /// One past the last index wanted.
    pub high: u64,
    /// raft-rs's context, handed back to it.
    pub context: GetEntriesContext,
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
    /// Reads below the window raft-rs is waiting for.
    fetches: RefCell<Vec<Fetch>>,
    /// Entries read back for those reads, served until the window passes
    /// them.
    fetched: VecDeque<Entry>,
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
        let start = self.window_start();
        while self.fetched.front().is_some_and(|entry| entry.index + 1 < start) {
            self.fetched.pop_front();
        }
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

    /// Entries read back from the log for a [`Fetch`] (dense, ascending,
    /// at most [`REPLICA_FETCH_ENTRIES_MAX`] kept).
    pub fn fetched(&mut self, entries: Vec<Entry>) {
        self.fetched = entries.into_iter().take(REPLICA_FETCH_ENTRIES_MAX).collect();
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
        self.fetched.retain(|entry| entry.index < from);
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
        let source: Vec<Entry> = if low >= start {
            let skip = (low - start) as usize;
            self.window.iter().skip(skip).take((high - low) as usize).cloned().collect()
        } else if self.fetched.front().is_some_and(|entry| entry.index == low) {
            // The dense run from `low`: a read-back holds a message's worth,
            // which may end short of the window (raft-rs asks again from
            // where it ends).
            self.fetched
                .iter()
                .chain(self.window.iter())
                .skip_while(|entry| entry.index < low)
                .take_while(|entry| entry.index < high)
                .enumerate()
                .take_while(|(at, entry)| entry.index == low + *at as u64)
                .map(|(_, entry)| entry.clone())
                .collect()
        } else if context.can_async() {
            self.fetches.borrow_mut().push(Fetch { low, high: high.min(start), context });
            return Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable));
        } else {
            return Err(raft::Error::Store(StorageError::Unavailable));
        };
        let mut entries = source;
        // Served only when dense from `low` (a fetch may have come back
        // short of the window): otherwise read again.
        let dense = entries.iter().enumerate().all(|(at, entry)| entry.index == low + at as u64);
        if !dense || entries.is_empty() && low < high {
            if context.can_async() {
                self.fetches.borrow_mut().push(Fetch { low, high: high.min(start), context });
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

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Snapshots (a checkpoint plus the entries after it) are not built
        // yet: the log is never compacted past what a follower needs.
        Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))
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
