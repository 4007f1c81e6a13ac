//! `ReplicaDriver`: one replicated partition's Raft member performed on its
//! shard — the [`Replica`] step function bound to the partition's journal
//! view (its log) and the shard's vote log (its term and vote), so that
//! nothing raft-rs is told is durable is not (`docs/design/replication.md`
//! §2–§4).
//!
//! **Inputs are synchronous.** [`tick`](ReplicaDriver::tick),
//! [`step`](ReplicaDriver::step) and [`propose`](ReplicaDriver::propose)
//! change the member and then perform every work it has at once: messages
//! go to the transport, committed entries to the owner's queue, and each
//! new entry is appended to the journal at its index and term
//! ([`JournalPartition::append_at`]) before the call returns. So the journal
//! and raft-rs's log never disagree on an index while the owner runs: a
//! leader's proposal lands at the index raft-rs gave it, and the next
//! proposal is stamped with the next data offset.
//!
//! **The pump is asynchronous** ([`pump`](ReplicaDriver::pump), spawned by
//! the owner): it waits for what the synchronous side queued — the
//! journal's tickets of appended entries, then the vote's sync — and only
//! then reports the works persisted and sends the messages that promise
//! durability (a vote granted, an append acknowledged). It also performs
//! what cannot be done at once: a truncation of a conflicting suffix (the
//! journal waits for that suffix, then its marker), appends that wait for
//! room in the journal's lane, and reads of old entries a lagging follower
//! needs. Works behind one of those wait in order; a proposal meanwhile is
//! refused ([`DriverError::Busy`]).
//!
//! **Stored bytes.** A proposal is a batch the owner built; the driver
//! stamps it with the partition's next data offset and the term as leader
//! epoch, and that stamped batch is the Raft entry, shipped and stored by
//! every member as it is. raft-rs's own empty entry (a new leader's first
//! of its term) is stored as a control batch of one
//! [`Event::TermStarted`] record, which every member builds the same from
//! the term and the offset it lands at, and which reads back as an empty
//! entry.
//!
//! **Epochs.** The leader epoch stamped in a batch header is the term
//! (`u32`): a member refuses to propose in a term above `u32::MAX`
//! ([`DriverError::TermTooLarge`]), which four billion elections would
//! reach.
//!
//! Does not own: the transport (messages go to a callback, which must not
//! call back into the driver), the clock (the owner ticks), or the queue
//! state (the owner folds [`Committed`] entries and reports them applied).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use raft::eraftpb::{Entry, Message};
use spool_wire::batch::{BatchHeader, BatchKind};

mod members;
mod offer;

use super::entries::read_raft_entries;
pub use super::entries::{
    is_term_start, membership_batch, membership_of_batch, raft_entry, term_start_batch,
};
pub use super::error::DriverError;
use super::limits::{
    REPLICA_FETCH_AHEAD_BYTES, REPLICA_FETCH_ENTRIES_MAX, REPLICA_TERM_START_BYTES_MAX,
    REPLICA_TICK, REPLICA_VOTE_QUARANTINE_TICKS,
};
use super::membership::change_of_entry;
use super::node::{Members, Recovered, Replica, ReplicaError, Timing, Work};
use super::view::KnownTerms;
use crate::io::Storage;
use crate::limits::LOG_UNCOMMITTED_ENTRIES_MAX;
use crate::log::journal::{JournalPartition, JournalTicket};
use crate::log::vote::{Vote, VoteLog};
use crate::log::wakers::Notify;
use crate::log::Offset;

/// A committed entry for the owner's state machine, in index order.
#[derive(Debug, Clone)]
pub struct Committed {
    pub index: u64,
    pub term: u64,
    /// The stored batch (empty for a term's start).
    pub batch: Bytes,
}

/// Where a proposal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposed {
    pub index: u64,
    pub term: u64,
    /// A data batch's first offset (a control batch: the next data offset).
    pub base_offset: Offset,
}

/// What the driver did since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub appended: u64,
    pub truncations: u64,
    pub persisted: u64,
    pub votes_synced: u64,
    pub fetches: u64,
    pub fetch_failures: u64,
    pub waits_for_room: u64,
}

/// Why the first blocked work waits.
#[derive(Debug, Clone, Copy)]
enum Blocked {
    /// A conflicting suffix from this index is to be cancelled first.
    Truncate(u64),
    /// The journal's lane has no room for the next entry (its bytes).
    Room(u64),
    /// The log holds as many entries above its committed index as it may.
    Uncommitted,
}

/// A work's log changes, performed in order.
struct LogWork {
    number: u64,
    truncate_from: Option<u64>,
    entries: VecDeque<Entry>,
    tickets: Vec<JournalTicket>,
    vote: Option<(u64, u64)>,
    send_persisted: Vec<Message>,
}

struct Inner {
    replica: Replica,
    /// Works whose log changes wait (a truncation, room), in order.
    blocked: VecDeque<LogWork>,
    /// Works whose entries are queued in the journal, not yet reported.
    unsynced: VecDeque<LogWork>,
    committed: VecDeque<Committed>,
    /// The highest committed index raft-rs reported (the journal's may
    /// trail it until the entries are appended here).
    commit_target: u64,
    stats: DriverStats,
}

/// One replicated partition's member on its shard. See the module docs.
pub struct ReplicaDriver<S: Storage> {
    part: Rc<JournalPartition<S>>,
    votes: Rc<VoteLog<S>>,
    inner: RefCell<Inner>,
    send: Rc<dyn Fn(Message)>,
    /// The pump has something to do.
    wake: Notify,
    /// Entries committed, the role changed, or the driver stopped.
    progress: Notify,
    failure: RefCell<Option<String>>,
    closed: Cell<bool>,
    /// Members warned of as wanting a snapshot (`report_snapshot_asks`).
    snapshot_warned: RefCell<std::collections::BTreeSet<u64>>,
}

impl<S: Storage> std::fmt::Debug for ReplicaDriver<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaDriver").field("replica", &self.inner.borrow().replica).finish()
    }
}

/// A proposal's commit as a ticket sees it, without the storage type
/// ([`ReplicaDriver::status`], [`ReplicaDriver::committed`]).
pub trait CommitWatch {
    /// `Some(Ok)` committed, `Some(Err)` never will be, `None` pending.
    fn commit_status(&self, index: u64, term: u64) -> Option<Result<(), DriverError>>;

    /// Waits for the entry's commit.
    fn wait_committed(
        self: Rc<Self>,
        index: u64,
        term: u64,
    ) -> Pin<Box<dyn Future<Output = Result<(), DriverError>>>>;
}

impl<S: Storage + 'static> CommitWatch for ReplicaDriver<S> {
    fn commit_status(&self, index: u64, term: u64) -> Option<Result<(), DriverError>> {
        self.status(index, term)
    }

    fn wait_committed(
        self: Rc<Self>,
        index: u64,
        term: u64,
    ) -> Pin<Box<dyn Future<Output = Result<(), DriverError>>>> {
        Box::pin(async move { self.committed(index, term).await })
    }
}

impl<S: Storage> ReplicaDriver<S> {
    /// Member `id` of `members` over the partition log `part` and the
    /// shard's vote log, from what they recovered; `applied`: the index the
    /// owner's state holds (at most the committed index). Reads the
    /// partition's held entries back (`read_entries`) for raft-rs's view.
    ///
    /// # Errors
    /// [`DriverError::Journal`] for a log that cannot be read back,
    /// [`DriverError::Replica`] for a recovered state raft-rs refuses.
    pub async fn open(
        id: u64,
        members: Members,
        part: Rc<JournalPartition<S>>,
        votes: Rc<VoteLog<S>>,
        applied: u64,
        timing: Timing,
        send: Rc<dyn Fn(Message)>,
    ) -> Result<Rc<Self>, DriverError> {
        let mut first = part.first_index();
        let last = part.last_index();
        let mut floor_index = first.saturating_sub(1);
        let mut floor_term =
            if floor_index == 0 { 0 } else { part.term_at(floor_index).unwrap_or(0) };
        if floor_index > 0 && floor_term == 0 {
            // The entries before the first one held were let go of (their
            // journal files released below what every member held and a
            // checkpoint covered, `Partition::journal_pin`): the log starts
            // after its first entry held, whose term is known.
            let applied_here = applied.min(part.committed_index());
            match part.term_at(first) {
                Some(term) if first <= applied_here => {
                    floor_index = first;
                    floor_term = term;
                    first += 1;
                }
                _ => {
                    return Err(ReplicaError::Recovered {
                        id,
                        reason: format!(
                            "the term of entry {floor_index}, before the held log, is unknown"
                        ),
                    }
                    .into())
                }
            }
        }
        let commit = part.committed_index();
        // What the state machine holds stays on disk, known by its terms
        // (read back when a follower needs it); the rest is read now.
        let from = (applied.min(commit) + 1).max(first);
        let runs = runs_from(part.held_term_runs(), first).into_iter().filter(|run| run.0 < from);
        let runs = runs.collect();
        let known = KnownTerms { runs, through: from - 1 };
        let entries = read_raft_entries(&part, from, last + 1, u64::MAX, usize::MAX).await?;
        let vote = votes.get(part.handle()).unwrap_or_default();
        // A shard whose vote store held nothing at its start abstains from
        // elections until the quarantine since then is over.
        let abstain_ticks = votes.fresh_since().map_or(0, |since| {
            let quarantine = REPLICA_TICK * REPLICA_VOTE_QUARANTINE_TICKS as u32;
            let left = quarantine.saturating_sub(since.elapsed());
            u64::try_from(left.as_millis() / REPLICA_TICK.as_millis().max(1)).unwrap_or(u64::MAX)
        });
        let recovered = Recovered {
            abstain_ticks,
            floor: (floor_index, floor_term),
            known,
            entries,
            term: vote.term,
            vote: vote.vote,
            commit,
            applied: applied.min(commit),
        };
        let replica = Replica::start_timed(id, &members, recovered, timing)?;
        Ok(Rc::new(ReplicaDriver {
            part,
            votes,
            inner: RefCell::new(Inner {
                replica,
                blocked: VecDeque::new(),
                unsynced: VecDeque::new(),
                committed: VecDeque::new(),
                commit_target: commit,
                stats: DriverStats::default(),
            }),
            send,
            wake: Notify::default(),
            progress: Notify::default(),
            failure: RefCell::new(None),
            closed: Cell::new(false),
            snapshot_warned: RefCell::default(),
        }))
    }

    /// The partition log this member performs on.
    pub fn log(&self) -> &Rc<JournalPartition<S>> {
        &self.part
    }

    /// (leads now, term, the leader it knows of: 0 for none).
    pub fn role(&self) -> (bool, u64, u64) {
        let inner = self.inner.borrow();
        (inner.replica.is_leader(), inner.replica.term(), inner.replica.leader())
    }

    /// On the leader, the lowest index every member holds
    /// ([`Replica::lowest_matched`]).
    pub fn lowest_matched(&self) -> Option<u64> {
        self.inner.borrow().replica.lowest_matched()
    }

    /// The highest index every member was known to hold
    /// ([`Replica::group_floor`]).
    pub fn group_floor(&self) -> u64 {
        self.inner.borrow().replica.group_floor()
    }

    /// Lets raft-rs's view of the log go up to `index`, at most the group
    /// floor and the applied index ([`Replica::compact`]); the journal
    /// files below may then be released. Returns the index the log starts
    /// after.
    pub fn compact(&self, index: u64) -> u64 {
        self.inner.borrow_mut().replica.compact(index)
    }

    /// The group's members ([`Replica::members`]).
    pub fn members(&self) -> Vec<u64> {
        self.inner.borrow().replica.members()
    }

    /// The index the log starts after ([`Replica::log_floor`]).
    pub fn log_floor(&self) -> u64 {
        self.inner.borrow().replica.log_floor()
    }

    pub fn stats(&self) -> DriverStats {
        self.inner.borrow().stats
    }

    /// Why the driver stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Resolves at the next change the owner may care about: entries
    /// committed, the role changed, a busy log caught up, a stop.
    pub fn progress(&self) -> impl Future<Output = ()> + '_ {
        self.progress.wait()
    }

    /// One logical clock tick (elections, heartbeats).
    pub fn tick(&self) {
        if self.stopped() {
            return;
        }
        self.inner.borrow_mut().replica.tick();
        self.drain();
        self.report_snapshot_asks();
    }

    /// A message from another member of the group. A message raft-rs
    /// refuses is dropped (the transport's concern, not the group's).
    pub fn step(&self, message: Message) {
        if self.stopped() {
            return;
        }
        let stepped = self.inner.borrow_mut().replica.step(message);
        if stepped.is_ok() {
            self.drain();
        }
    }

    /// Proposes `batch` (a data or control batch, as a producer or the
    /// queue built it) as the next entry; it is stamped, appended and sent
    /// before this returns. Wait for it with
    /// [`committed`](Self::committed).
    ///
    /// # Errors
    /// [`DriverError::NotLeader`], [`DriverError::Busy`] (also when the
    /// journal has no room for it: wait for [`progress`](Self::progress)
    /// or the log's `writable`), [`DriverError::TermTooLarge`],
    /// [`DriverError::InvalidBatch`], [`DriverError::Replica`],
    /// [`DriverError::Stopped`].
    pub fn propose(&self, batch: &[u8]) -> Result<Proposed, DriverError> {
        self.check_running()?;
        let header = BatchHeader::verify_body(batch)
            .map_err(|error| DriverError::InvalidBatch(error.to_string()))?;
        let proposed = {
            let mut inner = self.inner.borrow_mut();
            let replica = &mut inner.replica;
            if !replica.is_leader() {
                return Err(DriverError::NotLeader { leader: replica.leader() });
            }
            if !inner.blocked.is_empty()
                || inner.replica.last_index() != self.part.last_index()
                || self.part.uncommitted_entries() >= LOG_UNCOMMITTED_ENTRIES_MAX
                || !self.part.has_room(BatchKind::Data, u64::from(header.batch_len))
            {
                return Err(DriverError::Busy);
            }
            let term = inner.replica.term();
            let epoch = u32::try_from(term).map_err(|_| DriverError::TermTooLarge { term })?;
            let base_offset = self.part.next_offset();
            let (index, term) = match membership_of_batch(batch) {
                // A change is raft-rs's change entry, stored again as this
                // record when it is appended (`perform_blocked_in`).
                Some(change) => inner.replica.propose_membership(change)?,
                None => {
                    let mut bytes = batch.to_vec();
                    BatchHeader::assign(&mut bytes, base_offset.0, epoch);
                    inner.replica.propose(bytes)?
                }
            };
            Proposed { index, term, base_offset }
        };
        self.drain();
        self.check_running()?;
        if self.part.term_at(proposed.index) != Some(proposed.term) {
            return Err(self.stop(format!(
                "proposal {} of term {} is not in the log after its append",
                proposed.index, proposed.term
            )));
        }
        Ok(proposed)
    }

    /// Waits until the entry (`index`, `term`) is committed — durable on a
    /// quorum and here.
    ///
    /// # Errors
    /// [`DriverError::Superseded`] when another entry took its index;
    /// [`DriverError::Stopped`].
    pub async fn committed(&self, index: u64, term: u64) -> Result<(), DriverError> {
        loop {
            let wait = self.progress.wait();
            if let Some(outcome) = self.status(index, term) {
                return outcome;
            }
            wait.await;
        }
    }

    /// Where the entry (`index`, `term`) stands: `Some(Ok)` committed,
    /// `Some(Err)` never will be (superseded, or the driver stopped),
    /// `None` pending.
    pub fn status(&self, index: u64, term: u64) -> Option<Result<(), DriverError>> {
        if let Err(error) = self.check_running() {
            return Some(Err(error));
        }
        let committed = self.part.committed_index();
        match self.part.term_at(index) {
            Some(found) if found == term && committed >= index => Some(Ok(())),
            Some(found) if found == term => None,
            Some(_) => Some(Err(DriverError::Superseded { index, term })),
            None if committed >= index || self.part.last_index() < index => {
                Some(Err(DriverError::Superseded { index, term }))
            }
            None => None,
        }
    }

    /// Takes the entries committed since the last call, in index order.
    /// Report each folded with [`applied`](Self::applied).
    pub fn take_committed(&self) -> Vec<Committed> {
        self.inner.borrow_mut().committed.drain(..).collect()
    }

    /// Keeps at most `bytes` of applied entries in memory; older ones a
    /// lagging follower needs are read back from the log.
    pub fn set_cache_bytes(&self, bytes: usize) {
        self.inner.borrow_mut().replica.set_cache_bytes(bytes);
    }

    /// The owner's state holds every entry up to `index`.
    pub fn applied(&self, index: u64) {
        self.inner.borrow_mut().replica.applied(index);
    }

    /// Stops the pump (the owner closes the partition log after it).
    pub fn close(&self) {
        self.closed.set(true);
        self.wake.notify_all();
        self.progress.notify_all();
    }

    fn stopped(&self) -> bool {
        self.closed.get() || self.failure.borrow().is_some()
    }

    fn check_running(&self) -> Result<(), DriverError> {
        if let Some(reason) = self.failure.borrow().as_ref() {
            return Err(DriverError::Stopped(reason.clone()));
        }
        if self.closed.get() {
            return Err(DriverError::Stopped("closed".into()));
        }
        Ok(())
    }

    /// Stops the member: raft-rs was told something the log cannot now
    /// keep, so it must not take part again until reopened from its disk.
    fn stop(&self, reason: String) -> DriverError {
        self.failure.borrow_mut().get_or_insert(reason.clone());
        self.wake.notify_all();
        self.progress.notify_all();
        DriverError::Stopped(reason)
    }

    /// Performs every work raft-rs has now (module docs).
    fn drain(&self) {
        let mut moved = false;
        loop {
            if self.stopped() {
                return;
            }
            let work = match self.inner.borrow_mut().replica.work() {
                Ok(Some(work)) => work,
                Ok(None) => break,
                Err(error) => {
                    self.stop(error.to_string());
                    return;
                }
            };
            moved = true;
            let Work { number, send, apply, truncate_from, entries, vote, send_persisted, commit } =
                work;
            for message in send {
                (self.send)(message);
            }
            let mut inner = self.inner.borrow_mut();
            for entry in apply {
                // A membership change is raft-rs's to apply when it is
                // handed out; the owner folds its stored record.
                let applied = inner.replica.apply_membership(&entry).and_then(|change| {
                    change
                        .map(|change| membership_batch(change, entry.term, 0).map(Bytes::from))
                        .transpose()
                        .map_err(|error| ReplicaError::Membership {
                            index: entry.index,
                            reason: error.to_string(),
                        })
                });
                let batch = match applied {
                    Ok(Some(batch)) => batch,
                    Ok(None) => entry.data,
                    Err(error) => {
                        drop(inner);
                        self.stop(error.to_string());
                        return;
                    }
                };
                inner.committed.push_back(Committed {
                    index: entry.index,
                    term: entry.term,
                    batch,
                });
            }
            if let Some(commit) = commit {
                inner.commit_target = inner.commit_target.max(commit);
            }
            inner.blocked.push_back(LogWork {
                number,
                truncate_from,
                entries: entries.into(),
                tickets: Vec::new(),
                vote,
                send_persisted,
            });
            drop(inner);
            if let Err(error) = self.perform_blocked() {
                self.stop(error.to_string());
                return;
            }
        }
        if moved {
            self.set_commit();
            if matches!(self.blocked(), Some(Blocked::Uncommitted)) {
                if let Err(error) = self.perform_blocked() {
                    self.stop(error.to_string());
                    return;
                }
            }
            self.progress.notify_all();
        }
    }

    /// Performs the blocked works in order, as far as they go without
    /// waiting; a work that must wait ([`Blocked`]) stays first and the
    /// pump is woken for it.
    fn perform_blocked(&self) -> Result<(), DriverError> {
        let mut inner = self.inner.borrow_mut();
        let (mut appended, mut waits) = (0, 0);
        let performed = self.perform_blocked_in(&mut inner, &mut appended, &mut waits);
        inner.stats.appended += appended;
        inner.stats.waits_for_room += waits;
        performed
    }

    fn perform_blocked_in(
        &self,
        inner: &mut Inner,
        appended: &mut u64,
        waits: &mut u64,
    ) -> Result<(), DriverError> {
        while let Some(work) = inner.blocked.front_mut() {
            if let Some(from) = work.truncate_from {
                if from <= self.part.last_index() {
                    self.wake.notify_all();
                    return Ok(());
                }
                work.truncate_from = None;
            }
            while let Some(entry) = work.entries.front() {
                let built;
                let batch: &[u8] = if let Some(change) = change_of_entry(entry)? {
                    built = membership_batch(change, entry.term, self.part.next_offset().0)?;
                    &built
                } else if entry.data.is_empty() {
                    built = term_start_batch(entry.term, self.part.next_offset().0)?;
                    &built
                } else {
                    &entry.data
                };
                if self.part.uncommitted_entries() >= LOG_UNCOMMITTED_ENTRIES_MAX
                    || !self.part.has_room(BatchKind::Data, batch.len() as u64)
                {
                    *waits += 1;
                    self.wake.notify_all();
                    return Ok(());
                }
                let queued = self.part.append_at(entry.index, entry.term, batch, true)?;
                work.tickets.push(queued.ticket);
                work.entries.pop_front();
                *appended += 1;
            }
            if let Some(done) = inner.blocked.pop_front() {
                inner.unsynced.push_back(done);
            }
            self.wake.notify_all();
        }
        Ok(())
    }

    /// Why the first blocked work waits, if one does.
    fn blocked(&self) -> Option<Blocked> {
        let inner = self.inner.borrow();
        let work = inner.blocked.front()?;
        if let Some(from) = work.truncate_from.filter(|from| *from <= self.part.last_index()) {
            return Some(Blocked::Truncate(from));
        }
        let entry = work.entries.front()?;
        if self.part.uncommitted_entries() >= LOG_UNCOMMITTED_ENTRIES_MAX {
            return Some(Blocked::Uncommitted);
        }
        // A term start is a small control batch; any other entry is its bytes.
        Some(Blocked::Room(entry.data.len().max(REPLICA_TERM_START_BYTES_MAX) as u64))
    }

    /// Moves the journal's committed index as far as raft-rs's, within
    /// what is appended here.
    fn set_commit(&self) {
        let inner = self.inner.borrow();
        // The journal agrees with raft-rs's log up to its last index, less
        // a suffix a waiting truncation is to cancel: raft-rs may already
        // count the entries replacing it committed.
        let agreed = inner
            .blocked
            .iter()
            .filter_map(|work| work.truncate_from)
            .fold(self.part.last_index(), |agreed, from| agreed.min(from.saturating_sub(1)));
        let target = inner.commit_target.min(agreed);
        drop(inner);
        if target > self.part.committed_index() {
            if let Err(error) = self.part.set_committed(target) {
                self.stop(error.to_string());
            }
        }
    }

    /// The driver's background: waits for durability, truncations, room
    /// and read-backs (module docs). Ends when the driver is closed or
    /// stopped. Spawn it once.
    pub async fn pump(self: Rc<Self>) {
        while !self.stopped() {
            let wait = self.wake.wait();
            match self.pump_once().await {
                // Other tasks of the shard run between two steps: a step
                // whose reads complete at once must not hold the executor.
                Ok(true) => futures_lite::future::yield_now().await,
                Ok(false) => wait.await,
                Err(error) => {
                    self.stop(error.to_string());
                }
            }
        }
        self.progress.notify_all();
    }

    /// One step of the pump; `false`: nothing to do now.
    async fn pump_once(&self) -> Result<bool, DriverError> {
        match self.blocked() {
            Some(Blocked::Truncate(from)) => {
                self.part.truncate_from(from).await?;
                self.inner.borrow_mut().stats.truncations += 1;
                self.perform_blocked()?;
                self.drain();
                return Ok(true);
            }
            Some(Blocked::Room(len)) => {
                self.part.writable(BatchKind::Data, len).await;
                self.perform_blocked()?;
                self.drain();
                return Ok(true);
            }
            // Entries above the committed index are at their bound: the
            // next commit (a step) performs the work.
            Some(Blocked::Uncommitted) | None => {}
        }
        // Read-backs first, then what waits for durability, in the same
        // step: a leader under a steady load always has entries to sync,
        // and read-backs served only in its idle moments left a lagging
        // follower a few messages a second (it never caught up).
        let fetched = self.serve_fetches().await;
        let works: Vec<LogWork> = self.inner.borrow_mut().unsynced.drain(..).collect();
        if !works.is_empty() {
            self.persist(works).await?;
            return Ok(true);
        }
        Ok(fetched)
    }

    /// Reads back what raft-rs asked below its window and hands it over;
    /// `false` when nothing was asked.
    async fn serve_fetches(&self) -> bool {
        let fetches = self.inner.borrow_mut().replica.fetches();
        if fetches.is_empty() {
            return false;
        }
        for fetch in fetches {
            match read_raft_entries(
                &self.part,
                fetch.low,
                fetch.high,
                REPLICA_FETCH_AHEAD_BYTES,
                REPLICA_FETCH_ENTRIES_MAX,
            )
            .await
            {
                Ok(entries) => {
                    self.inner.borrow_mut().stats.fetches += 1;
                    self.inner.borrow_mut().replica.fetched(fetch, entries);
                }
                Err(error) => {
                    tracing::debug!(low = fetch.low, high = fetch.high, %error, "read-back failed");
                    self.inner.borrow_mut().stats.fetch_failures += 1;
                }
            }
        }
        self.drain();
        true
    }

    /// Waits until `works` are durable (entries, then the newest vote),
    /// reports them persisted and sends what waited for it.
    async fn persist(&self, works: Vec<LogWork>) -> Result<(), DriverError> {
        for work in &works {
            for ticket in &work.tickets {
                ticket.durable().await?;
            }
        }
        if let Some((term, vote)) = works.iter().rev().find_map(|work| work.vote) {
            self.votes.persist(&[(self.part.handle(), Vote::new(term, vote))]).await?;
            self.inner.borrow_mut().stats.votes_synced += 1;
        }
        if self.stopped() {
            return Ok(());
        }
        let last = works.last().map_or(0, |work| work.number);
        {
            let mut inner = self.inner.borrow_mut();
            inner.replica.persisted(last);
            inner.stats.persisted += works.len() as u64;
        }
        for work in works {
            for message in work.send_persisted {
                (self.send)(message);
            }
        }
        self.drain();
        self.set_commit();
        self.progress.notify_all();
        Ok(())
    }
}

/// Term runs (first index, term), ascending, cut to start at `first`.
fn runs_from(runs: Vec<(u64, u64)>, first: u64) -> Vec<(u64, u64)> {
    let mut cut: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for (start, term) in runs {
        let start = start.max(first);
        match cut.last_mut() {
            Some(last) if last.0 == start => *last = (start, term),
            _ => cut.push((start, term)),
        }
    }
    cut
}
