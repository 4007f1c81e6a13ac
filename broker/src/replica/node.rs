//! `Replica`: one partition's Raft group member, driven as a pure step
//! function (`docs/design/replication.md` §2–§4).
//!
//! It owns a raft-rs `RawNode` over a [`LogView`] and turns each `Ready`
//! into a [`Work`]: what the owner must do, in order, with no I/O here.
//!
//! 1. send [`Work::send`] at once (a leader's appends go out while its own
//!    write is in flight: its fdatasync overlaps its followers');
//! 2. apply [`Work::apply`] (committed, and durable here) in order, then
//!    call [`Replica::applied`];
//! 3. cancel the log from [`Work::truncate_from`] if set, append
//!    [`Work::entries`] at their index and term, persist [`Work::vote`] if
//!    set, and once all of that is durable call [`Replica::persisted`] with
//!    [`Work::number`] and only then send [`Work::send_persisted`] (a vote
//!    granted, an append acknowledged: promises that need the disk);
//! 4. record [`Work::commit`] (the journal's commit marker; it may lag).
//!
//! **Group floor.** What every member holds is known only to the leader
//! (raft-rs's progress: [`Replica::lowest_matched`], taken at most up to
//! the committed index: a matched entry above it may still be replaced). A member may let go
//! of entries only below it (and below what its own checkpoint covers),
//! or a later leader could lack entries a lagging follower needs. So the
//! leader stamps it on its heartbeats ([`GROUP_FLOOR_TAG`] and the index,
//! in the message's `context`, which raft-rs echoes only for read-index
//! requests, which the group never makes), and a member takes it off
//! before raft-rs sees the message, keeping the highest seen
//! ([`Replica::group_floor`]). It stays true across leaders: a member's
//! matched index only grows (a member whose disk was wiped is a new
//! replica, caught up by a snapshot).
//!
//! The vote store and the log sync apart: a crash may keep entries of a
//! term whose vote was lost, and recovery then takes the log's term with no
//! vote ([`LogView::recovered`]) — safe, since a vote's grant is among the
//! messages sent only after its sync.
//!
//! Works may overlap: a later one can be handed out while an earlier one's
//! writes are in flight, and `persisted(n)` covers every work up to `n`.
//! The log's appends are durable in the order they were asked for (the
//! shard journal's one lane for a replicated partition), which is what
//! raft-rs's async persistence needs.

use raft::eraftpb::{Entry, HardState, Message, MessageType};
use raft::{Config, RawNode, StateRole};
use thiserror::Error;

use super::limits::{
    REPLICA_APPEND_BYTES_MAX, REPLICA_ELECTION_TICKS, REPLICA_FETCH_RUNS_MAX,
    REPLICA_HEARTBEAT_TICKS, REPLICA_INFLIGHT_APPENDS_MAX,
};
use super::view::{Fetch, KnownTerms, LogView};

/// The `context` of the refusal a member that lost its log sends its
/// leader (`Replica::lost_log`).
pub const LOST_LOG_TAG: u8 = 0xF3;

/// First byte of a heartbeat's `context` that carries the group floor (the
/// 8 bytes after it, little-endian); module docs, "Group floor".
pub const GROUP_FLOOR_TAG: u8 = 0xF1;
const GROUP_FLOOR_CONTEXT_LEN: usize = 9;

/// Why a replica could not start or step.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The recovered log or hard state cannot start a member.
    #[error("replica {id}: recovered state refused: {reason}")]
    Recovered { id: u64, reason: String },
    /// raft-rs refused the operation (a proposal to a non-leader, a message
    /// for another group, a bad configuration).
    #[error("replica {id}: {source}")]
    Raft {
        id: u64,
        #[source]
        source: raft::Error,
    },
    /// A proposal to a member that does not lead (`leader`: the one it
    /// knows of, 0 for none): the caller redirects.
    #[error("replica {id} does not lead (leader: {leader})")]
    NotLeader { id: u64, leader: u64 },
    /// A membership change that cannot be proposed or applied
    /// (`membership.rs`); `index` 0 for a proposal.
    #[error("replica membership change at index {index}: {reason}")]
    Membership { index: u64, reason: String },
    /// The leader sent a snapshot; installing one is not built yet.
    #[error("replica {id}: a snapshot at index {index} arrived; snapshots are not built yet")]
    SnapshotUnsupported { id: u64, index: u64 },
}

/// A group's members (`queue/members.rs`). A member starts with its
/// group's initial members and every change of its committed log folded
/// in (`membership.rs`), even one that does not name it (a node joining
/// the group).
pub use crate::queue::Members;

/// What a replica recovered from its disk.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The entry the log starts after (index, term).
    pub floor: (u64, u64),
    /// The terms of the entries left on disk (`floor.0 + 1..=known.through`;
    /// none when `through` is at or below the floor): read back when a
    /// follower needs them.
    pub known: KnownTerms,
    /// The log's entries in memory, dense from `max(floor.0,
    /// known.through) + 1`: at least every one above `applied`.
    pub entries: Vec<Entry>,
    /// The persisted term and vote (the vote store).
    pub term: u64,
    pub vote: u64,
    /// The persisted committed index (the journal's commit markers).
    pub commit: u64,
    /// What the state machine already holds (≤ commit).
    pub applied: u64,
    /// Ticks to abstain from elections first: neither vote nor campaign (a
    /// member whose vote store was empty: it may have lost votes it made).
    pub abstain_ticks: u64,
}

/// One `Ready`'s work for the owner. See the module docs for the order.
#[derive(Debug, Default)]
pub struct Work {
    pub number: u64,
    pub send: Vec<Message>,
    pub apply: Vec<Entry>,
    pub truncate_from: Option<u64>,
    pub entries: Vec<Entry>,
    /// Term and vote to make durable (changed since the last one).
    pub vote: Option<(u64, u64)>,
    pub send_persisted: Vec<Message>,
    pub commit: Option<u64>,
}

/// One partition's Raft group member. See the module docs.
pub struct Replica {
    id: u64,
    pub(super) raw: RawNode<LogView>,
    /// Term and vote as last handed out for persistence.
    vote: (u64, u64),
    /// The highest index every member of the group was known to hold
    /// (module docs, "Group floor").
    group_floor: u64,
    /// Ticks left abstaining from elections ([`Recovered::abstain_ticks`]).
    abstain_ticks: u64,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("term", &self.raw.raft.term)
            .field("role", &self.raw.raft.state)
            .finish_non_exhaustive()
    }
}

/// How a member's election timeout is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Drawn at random in `[REPLICA_ELECTION_TICKS, 2 ×)` at each reset
    /// (raft-rs's own random source): members of a group time out apart.
    Randomized,
    /// Exactly `REPLICA_ELECTION_TICKS + offset` ticks, for a deterministic
    /// simulation (which desynchronizes members by when it ticks them).
    Fixed { offset: usize },
}

fn config(id: u64, applied: u64, timing: Timing) -> Config {
    let (min_election_tick, max_election_tick) = match timing {
        Timing::Randomized => (0, 0),
        Timing::Fixed { offset } => {
            (REPLICA_ELECTION_TICKS + offset, REPLICA_ELECTION_TICKS + offset + 1)
        }
    };
    Config {
        min_election_tick,
        max_election_tick,
        id,
        election_tick: REPLICA_ELECTION_TICKS,
        heartbeat_tick: REPLICA_HEARTBEAT_TICKS,
        applied,
        max_size_per_msg: REPLICA_APPEND_BYTES_MAX,
        max_inflight_msgs: REPLICA_INFLIGHT_APPENDS_MAX,
        // A leader that lost its quorum steps down; a node cut off does not
        // raise the term of the others when it comes back.
        check_quorum: true,
        pre_vote: true,
        ..Config::default()
    }
}

impl Replica {
    /// Member `id` of the group of `members`, from what it recovered.
    ///
    /// # Errors
    /// [`ReplicaError::Recovered`] for a log that is not dense or whose
    /// terms go down, [`ReplicaError::Raft`] for a configuration raft-rs
    /// refuses (a voter also a learner).
    pub fn start(
        id: u64,
        members: &Members,
        recovered: Recovered,
    ) -> Result<Replica, ReplicaError> {
        Replica::start_timed(id, members, recovered, Timing::Randomized)
    }

    /// [`Replica::start`] with the election timeout drawn as `timing` says.
    ///
    /// # Errors
    /// As [`Replica::start`].
    pub fn start_timed(
        id: u64,
        members: &Members,
        recovered: Recovered,
        timing: Timing,
    ) -> Result<Replica, ReplicaError> {
        // A node outside `members` starts too: one joining the group by a
        // membership change (it learns the change from the leader's
        // entries) or one removed from it. raft-rs never lets it campaign.
        let applied = recovered.applied.min(recovered.commit);
        let view = LogView::recovered_after(
            &recovered.known,
            recovered.floor,
            recovered.entries,
            members.voters.clone(),
            (recovered.term, recovered.vote),
            recovered.commit,
            applied,
        )
        .map_err(|reason| ReplicaError::Recovered { id, reason })?;
        let view = view.with_learners(members.learners.clone());
        let vote = (view.hard_state().term, view.hard_state().vote);
        let applied = applied.max(recovered.floor.0);
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config(id, applied, timing), view, &logger)
            .map_err(|source| ReplicaError::Raft { id, source })?;
        let abstain_ticks = recovered.abstain_ticks;
        Ok(Replica { id, raw, vote, group_floor: 0, abstain_ticks })
    }

    /// This member's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// Whether this member leads its group now.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this member knows of (0: none).
    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    /// On a leader, the lowest index every member (voter or learner) is
    /// known to hold; `None` elsewhere (a follower does not track the
    /// others).
    pub fn lowest_matched(&self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        self.raw.raft.prs().iter().map(|(_, progress)| progress.matched).min()
    }

    /// The committed index this member knows of.
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The last index of this member's log (durable or not).
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// One logical clock tick (elections, heartbeats).
    pub fn tick(&mut self) {
        // Abstaining, it never times out, so never campaigns.
        if self.abstain_ticks > 0 {
            self.abstain_ticks -= 1;
        } else {
            self.raw.tick();
        }
        self.raw.mut_store().tick();
    }

    /// A message from another member.
    ///
    /// # Errors
    /// raft-rs refused it (a message of another group, a step of a local
    /// message kind): the owner drops it.
    pub fn step(&mut self, mut message: Message) -> Result<(), ReplicaError> {
        let asks_vote = matches!(
            message.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        );
        if asks_vote && self.abstain_ticks > 0 {
            return Ok(());
        }
        if message.get_msg_type() == MessageType::MsgHeartbeat {
            if let Some(floor) = group_floor_of(&message.context) {
                self.group_floor = self.group_floor.max(floor);
                message.context = Default::default();
            }
        }
        let lost = self.lost_log(&mut message);
        if message.get_msg_type() == MessageType::MsgAppendResponse && message.reject {
            self.forget_lost_match(&message);
        }
        self.raw.step(message).map_err(|source| ReplicaError::Raft { id: self.id, source })?;
        if let Some(lost) = lost {
            self.raw.raft.msgs.push(lost);
        }
        self.probe_above_matched();
        Ok(())
    }

    /// A heartbeat carries at most the commit index the leader knows this
    /// member to hold (its match): one past this member's log means it lost
    /// entries it held (its data directory wiped). raft-rs would panic on
    /// that commit: the member commits what it holds, and tells the leader
    /// with a refusal tagged [`LOST_LOG_TAG`] (to send once the heartbeat
    /// is stepped, in its term) naming its log's end.
    fn lost_log(&mut self, message: &mut Message) -> Option<Message> {
        let last = self.raw.raft.raft_log.last_index();
        if message.get_msg_type() != MessageType::MsgHeartbeat || message.commit <= last {
            return None;
        }
        let mut lost = Message::default();
        lost.set_msg_type(MessageType::MsgAppendResponse);
        lost.to = message.from;
        lost.from = self.id;
        lost.term = message.term;
        lost.index = message.commit;
        lost.reject = true;
        lost.reject_hint = last;
        lost.context = vec![LOST_LOG_TAG].into();
        message.commit = last;
        Some(lost)
    }

    /// A member that says it lost its log ([`LOST_LOG_TAG`]: its data
    /// directory wiped) would be sent after its old match forever: raft-rs
    /// (0.7) takes a refusal below a match as stale (a refusal alone cannot
    /// tell a lost log from a late answer). This leader forgets that match
    /// and probes it from its log's end instead;
    /// below the entries let go of, it is offered a snapshot
    /// (`docs/design/replication.md` §6). Lowering a match never undoes a
    /// commit: it only lets fewer entries commit with that member.
    fn forget_lost_match(&mut self, message: &Message) {
        if !self.is_leader() {
            return;
        }
        let id = self.id;
        let told = message.get_context() == [LOST_LOG_TAG];
        let Some(progress) = self.raw.raft.mut_prs().get_mut(message.from) else { return };
        let lost = told
            && progress.state != raft::ProgressState::Snapshot
            && message.reject_hint < progress.matched;
        if lost {
            tracing::warn!(
                id,
                member = message.from,
                matched = progress.matched,
                holds = message.reject_hint,
                "a member lost entries it held; probing it again"
            );
            progress.matched = message.reject_hint;
            progress.become_probe();
        }
    }

    /// A probing follower's next index is never at or below its matched
    /// one: raft-rs (0.7) takes a rejection's hint as is in the probe state,
    /// and a hint from before the follower caught up could send it below
    /// the entries let go of (module docs, "Group floor"), where it would
    /// wait for a snapshot forever. The follower holds what it matched
    /// (etcd's raft clamps the same way).
    fn probe_above_matched(&mut self) {
        if !self.is_leader() {
            return;
        }
        for (_, progress) in self.raw.raft.mut_prs().iter_mut() {
            if progress.state == raft::ProgressState::Probe && progress.next_idx <= progress.matched
            {
                progress.next_idx = progress.matched + 1;
            }
        }
    }

    /// The highest index every member of the group was known to hold:
    /// this leader's [`lowest_matched`](Self::lowest_matched), or the
    /// highest a leader's heartbeat carried (module docs, "Group floor").
    pub fn group_floor(&self) -> u64 {
        self.group_floor.max(self.held_everywhere().unwrap_or(0))
    }

    /// On a leader, the highest committed index every member holds: the
    /// lowest matched index, at most the committed one (an entry a member
    /// matched above the committed index may still be replaced there by a
    /// later leader; a committed one never is).
    fn held_everywhere(&self) -> Option<u64> {
        Some(self.lowest_matched()?.min(self.raw.raft.raft_log.committed))
    }

    /// Lets go of the log up to `index` ([`LogView::compact_to`]): at most
    /// the group floor and the applied index. Returns the index the log
    /// starts after now.
    pub fn compact(&mut self, index: u64) -> u64 {
        let index = index.min(self.group_floor());
        let view = self.raw.mut_store();
        view.compact_to(index);
        view.floor().0
    }

    /// The owner's durable checkpoint at (`index`, `term`) can be shipped
    /// as a snapshot ([`LogView::set_snapshot_at`]).
    pub fn set_snapshot_at(&mut self, index: u64, term: u64) {
        self.raw.mut_store().set_snapshot_at(index, term);
    }

    /// The snapshot offered, if any.
    pub fn snapshot_at(&self) -> Option<(u64, u64)> {
        self.raw.store().snapshot_at()
    }

    /// Tells raft-rs (leading) that member `to` installed the snapshot it
    /// was sent (`finished`), or that the transfer failed: it then sends
    /// from the entry after the snapshot, or probes it again.
    pub fn report_snapshot(&mut self, to: u64, finished: bool) {
        let status =
            if finished { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
        self.raw.report_snapshot(to, status);
    }

    /// The members this leader sent a snapshot and waits on (raft-rs sends
    /// them nothing else until it is told how the transfer went), with the
    /// snapshot's index; none unless it leads.
    pub fn snapshots_pending(&self) -> Vec<(u64, u64)> {
        if !self.is_leader() {
            return Vec::new();
        }
        let snapshot = raft::ProgressState::Snapshot;
        let prs = self.raw.raft.prs().iter();
        prs.filter(|(_, pr)| pr.state == snapshot)
            .map(|(id, pr)| (*id, pr.pending_snapshot))
            .collect()
    }

    /// The members raft-rs wanted a snapshot for since the last call
    /// ([`LogView::take_snapshot_asks`]).
    pub fn take_snapshot_asks(&mut self) -> Vec<u64> {
        self.raw.store().take_snapshot_asks()
    }

    /// The group's members (voters and learners), as raft-rs tracks them.
    pub fn members(&self) -> Vec<u64> {
        self.raw.raft.prs().iter().map(|(id, _)| *id).collect()
    }

    /// The index the log starts after (entries up to it were let go of).
    pub fn log_floor(&self) -> u64 {
        self.raw.store().floor().0
    }

    /// Stamps the group floor on this leader's heartbeats (module docs).
    fn stamp_group_floor(&mut self, messages: &mut [Message]) {
        let Some(floor) = self.held_everywhere() else { return };
        self.group_floor = self.group_floor.max(floor);
        for message in messages {
            if message.get_msg_type() == MessageType::MsgHeartbeat && message.context.is_empty() {
                let mut context = Vec::with_capacity(GROUP_FLOOR_CONTEXT_LEN);
                context.push(GROUP_FLOOR_TAG);
                context.extend_from_slice(&self.group_floor.to_le_bytes());
                message.context = context.into();
            }
        }
    }

    /// Proposes `data` (the stored bytes of a batch) as the next entry;
    /// returns the (index, term) it will have if it commits.
    ///
    /// # Errors
    /// [`ReplicaError::NotLeader`] (raft-rs would forward it to the leader:
    /// a proposal is answered by the member that took it, so it is refused
    /// instead); [`ReplicaError::Raft`] when the leader drops it (a
    /// leadership transfer under way).
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(u64, u64), ReplicaError> {
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader { id: self.id, leader: self.leader() });
        }
        let before = self.last_index();
        self.raw
            .propose(Vec::new(), data)
            .map_err(|source| ReplicaError::Raft { id: self.id, source })?;
        let index = self.last_index();
        debug_assert_eq!(index, before + 1, "one proposal, one entry");
        Ok((index, self.term()))
    }

    /// The next work, if raft-rs has any.
    ///
    /// # Errors
    /// [`ReplicaError::SnapshotUnsupported`] when the leader sent a
    /// snapshot.
    pub fn work(&mut self) -> Result<Option<Work>, ReplicaError> {
        if !self.raw.has_ready() {
            return Ok(None);
        }
        let mut ready = self.raw.ready();
        if !ready.snapshot().is_empty() {
            let index = ready.snapshot().get_metadata().index;
            return Err(ReplicaError::SnapshotUnsupported { id: self.id, index });
        }
        let mut work = Work {
            number: ready.number(),
            send: ready.take_messages(),
            apply: ready.take_committed_entries(),
            entries: ready.take_entries(),
            send_persisted: ready.take_persisted_messages(),
            ..Work::default()
        };
        self.stamp_group_floor(&mut work.send);
        let view = self.raw.mut_store();
        work.truncate_from = view.append(&work.entries);
        if let Some(hard_state) = ready.hs() {
            work.vote = self.take_vote(hard_state);
            let moved = hard_state.commit != self.raw.store().hard_state().commit;
            work.commit = moved.then_some(hard_state.commit);
            self.raw.mut_store().set_hard_state(hard_state);
        }
        self.raw.advance_append_async(ready);
        Ok(Some(work))
    }

    fn take_vote(&mut self, hard_state: &HardState) -> Option<(u64, u64)> {
        let vote = (hard_state.term, hard_state.vote);
        (vote != self.vote).then(|| {
            self.vote = vote;
            vote
        })
    }

    /// Keeps at most `bytes` of applied entries in memory
    /// ([`LogView::set_cache_bytes`]).
    pub fn set_cache_bytes(&mut self, bytes: usize) {
        self.raw.mut_store().set_cache_bytes(bytes);
    }

    /// Every work up to `number` is durable (its truncation, entries and
    /// vote).
    pub fn persisted(&mut self, number: u64) {
        self.raw.on_persist_ready(number);
    }

    /// The state machine holds every entry up to `index`.
    pub fn applied(&mut self, index: u64) {
        self.raw.advance_apply_to(index);
        self.raw.mut_store().set_applied(index);
    }

    /// Entries to read back from the log for sends to lagging followers.
    /// An ask the entries already read back now serve (recorded while
    /// its read was under way) is answered here and needs no read.
    pub fn fetches(&mut self) -> Vec<Fetch> {
        let mut reads: Vec<Fetch> = Vec::new();
        // Answering may ask again (from where the entries held end):
        // bounded, the rest waits for a read.
        let mut answers = REPLICA_FETCH_RUNS_MAX;
        loop {
            let fetches = self.raw.store().take_fetches();
            if fetches.is_empty() {
                return reads;
            }
            for fetch in fetches {
                if answers > 0 && self.raw.store().holds_fetched(fetch.low) {
                    answers -= 1;
                    self.answer(fetch);
                } else if let Some(read) = reads.iter_mut().find(|read| read.low == fetch.low) {
                    read.join(fetch);
                } else {
                    reads.push(fetch);
                }
            }
        }
    }

    /// The entries read back for `fetch`: raft-rs asks again and sends.
    /// Asks for the same entries recorded while they were read are
    /// answered with it: raft-rs then asks from where each follower is now,
    /// instead of the same entries being read again for a follower already
    /// sent them.
    pub fn fetched(&mut self, mut fetch: Fetch, entries: Vec<Entry>) {
        self.raw.mut_store().fetched(entries);
        self.raw.store().join_asked(&mut fetch);
        self.answer(fetch);
    }

    fn answer(&mut self, fetch: Fetch) {
        for context in fetch.contexts {
            self.raw.on_entries_fetched(context);
        }
    }
}

/// The group floor a heartbeat's `context` carries, if it carries one.
fn group_floor_of(context: &[u8]) -> Option<u64> {
    if context.len() != GROUP_FLOOR_CONTEXT_LEN || context[0] != GROUP_FLOOR_TAG {
        return None;
    }
    let bytes: [u8; 8] = context[1..].try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote_request(from: u64, term: u64) -> Message {
        let mut request = Message::default();
        request.set_msg_type(MessageType::MsgRequestVote);
        (request.from, request.to, request.term) = (from, 1, term);
        request
    }

    fn messages(replica: &mut Replica) -> Vec<Message> {
        let Some(work) = replica.work().unwrap() else { return Vec::new() };
        replica.persisted(work.number);
        work.send.into_iter().chain(work.send_persisted).collect()
    }

    #[test]
    fn a_member_that_may_have_lost_its_votes_neither_votes_nor_campaigns_for_a_while() {
        // Goal: a member whose vote store was empty (its data directory lost) cannot vote a
        // second time in a term it voted in before: it grants nothing and never campaigns
        // while it abstains, and votes as any member once that is over.
        let members = Members::voters(&[1, 2, 3]);
        let recovered = Recovered { abstain_ticks: 30, ..Recovered::default() };
        let mut replica =
            Replica::start_timed(1, &members, recovered, Timing::Fixed { offset: 0 }).unwrap();
        replica.step(vote_request(2, 1)).unwrap();
        let asked = messages(&mut replica);
        assert!(asked.is_empty(), "abstaining, it answered {asked:?}");
        for _ in 0..29 {
            replica.tick();
            let sent = messages(&mut replica);
            assert!(sent.is_empty(), "abstaining, it sent {sent:?}");
        }
        replica.tick();
        replica.step(vote_request(3, 2)).unwrap();
        let granted = messages(&mut replica);
        assert!(
            granted.iter().any(|m| m.get_msg_type() == MessageType::MsgRequestVoteResponse
                && !m.reject
                && m.to == 3),
            "{granted:?}"
        );
    }
}
