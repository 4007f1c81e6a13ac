//! A replicated partition's roles (`docs/design/replication.md` §4): the
//! same [`Partition`] on every member of its Raft group, its log a
//! [`PartitionLog::replicated`], its state folded from committed entries —
//! served only by the leader, and only once that leader's state covers
//! every entry before its term.
//!
//! - **Follower.** Requests are refused ([`PartitionError::NotLeader`]);
//!   committed entries are folded into the state as they arrive
//!   ([`Partition::fold_committed`]), in index order, exactly as replay
//!   folds them at open.
//! - **Leader, not yet serving.** raft-rs's first entry of the new term
//!   (its `TermStarted` record) commits only after every entry before it;
//!   once it is folded the state covers them all, and
//!   [`Partition::take_leadership`] makes the term the state's leader
//!   epoch (every token of an earlier leader is then stale), runs the
//!   epoch fence (claims outstanding from earlier terms end, as at a
//!   restart) through the log, and opens the partition.
//! - **Leader, serving.** Requests decide, append (a proposal) and apply at
//!   once, as on one node; a reply that promises durability waits for the
//!   entry's commit (the log's tickets). The entries it appended come back
//!   committed and are skipped: the state holds them already.
//! - **Stepping down.** When the member stops leading, the partition stops
//!   serving. If its state holds entries not yet committed (applied when
//!   appended), they may be cancelled by the next leader: the state can no
//!   longer be trusted and the partition reports itself diverged
//!   ([`Partition::diverged`]); its owner rebuilds it from the log
//!   ([`Partition::rebuild`]: the last checkpoint, or an empty state, and
//!   every committed entry after it, read back by index).
//!
//! **Checkpoints.** A member writes checkpoints as one node does, but only
//! of a state that covers its whole log (the highest index it applied is
//! the log's last: always on a serving leader, on a follower between
//! appends), so the checkpoint's cursor and entry index describe exactly
//! what the state holds. A leader's state holds entries not yet committed;
//! the checkpoint is written, then put in place only once the log has
//! committed its last entry in the same term
//! ([`REPLICA_CHECKPOINT_COMMIT_WAIT_MS`] at most, else it is dropped), so
//! a checkpoint never holds an entry a next leader may cancel. At open its
//! entry index counts as committed (it was), and replay folds what follows
//! it.
//!
//! **Release.** A member lets its journal files go below what every member
//! holds and its durable checkpoint covers (`journal_pin`,
//! [`Partition::replicated_log_pin`]); its live records are relocated as on
//! one node. A member that needs entries released everywhere (its disk
//! was wiped) needs a snapshot, which is not built yet.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use raft::eraftpb::Message;
use spool_wire::batch::BatchHeader;

use super::open::{context_of, prepare_dir, restore_journal_state, Opening, ReplayFold};
use super::{
    Clock, LogAppended, OpenReport, Partition, PartitionError, PartitionLog, PartitionName,
    REPLAY_READ_BYTES,
};
use crate::io::Storage;
use crate::log::journal::{
    JournalPos, LogFloor, PartitionHandle, RecoveredLog, RoutedEntry, ShardJournal,
};
use crate::log::vote::VoteLog;
use crate::log::{FatalHandler, ReadBatch, SharedBytes};
use crate::queue::{LeaderEpoch, Offset, PartitionState, QueueConfig};
use crate::replica::limits::REPLICA_CHECKPOINT_COMMIT_WAIT_MS;
use crate::replica::{Members, ReplicaDriver, Timing};

/// What a replicated partition knows of its role; see the module docs.
#[derive(Default)]
pub(super) struct Role {
    /// The highest entry index the state holds (folded, or applied when
    /// appended as leader).
    applied: Cell<u64>,
    /// The term of the last committed entry folded.
    folded_term: Cell<u64>,
    serving: Cell<bool>,
    /// The leadership fence is appending: its events may go in.
    fencing: Cell<bool>,
    diverged: Cell<bool>,
    /// A rebuild is reading the log: committed entries wait in the member.
    rebuilding: Cell<bool>,
    /// The highest committed index taken from the member.
    taken: Cell<u64>,
    fold: RefCell<ReplayFold>,
    /// The broker secret tokens are made with (a rebuilt state needs it).
    secret: Cell<[u8; 32]>,
    /// The group's initial members (the placer's set), seeded into a state
    /// whose checkpoint names none before its replay folds the changes.
    initial: RefCell<Members>,
    stats: Cell<ReplicaRoleStats>,
}

impl Role {
    fn count(&self, change: impl FnOnce(&mut ReplicaRoleStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }

    /// The open's replay folded the entries up to `applied`.
    pub(super) fn opened_at(&self, applied: u64) {
        self.applied.set(applied);
        self.taken.set(applied);
    }
}

/// What [`Partition::open_replicated`] needs besides what every open
/// does: the shard's journal and vote log, the partition's handle and what
/// recovery routed to it, and its member of the group.
pub struct ReplicatedOpen<S: Storage> {
    pub shard: Rc<ShardJournal<S>>,
    pub handle: PartitionHandle,
    pub routed: Vec<RoutedEntry>,
    /// Its log's committed index as recovery found it.
    pub log: RecoveredLog,
    pub votes: Rc<VoteLog<S>>,
    /// This node's id in the group, and the group's voters.
    pub member: u64,
    pub voters: Vec<u64>,
    pub timing: Timing,
    /// Where the member's messages go (the shard's `ReplicationHost`).
    pub send: Rc<dyn Fn(Message)>,
}

/// What a replicated partition's role went through since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaRoleStats {
    /// Committed entries folded into the state (its own, as leader, not
    /// counted: they were applied when appended).
    pub folded: u64,
    /// Terms it took the lead in (fence run, serving).
    pub leaderships: u64,
    /// Times it stopped serving.
    pub step_downs: u64,
    /// Diverged states rebuilt from the log.
    pub rebuilds: u64,
}

/// What [`Partition::fold_committed`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Folded {
    /// Committed entries folded into the state.
    pub entries: u64,
    /// This member leads and its state now covers every entry before its
    /// term: call [`Partition::take_leadership`].
    pub ready_to_lead: bool,
    /// It stopped serving (it no longer leads).
    pub stepped_down: bool,
}

impl<S: Storage + Clone> Partition<S> {
    /// Whether this partition is replicated.
    pub fn is_replicated(&self) -> bool {
        self.replica.is_some()
    }

    /// Whether it serves requests now: its member leads and took the lead
    /// (always, on one node), and the node applied the key map its log
    /// names ([`key_map_behind`](Self::key_map_behind)).
    pub fn serving(&self) -> bool {
        self.replica.as_ref().is_none_or(|role| role.serving.get()) && !self.key_map_behind()
    }

    /// Whether its state can no longer be trusted (module docs): reopen it.
    pub fn diverged(&self) -> bool {
        self.replica.as_ref().is_some_and(|role| role.diverged.get())
    }

    /// What its role went through (all zero on one node).
    pub fn role_stats(&self) -> ReplicaRoleStats {
        self.replica.as_ref().map_or_else(ReplicaRoleStats::default, |role| role.stats.get())
    }

    /// The entry index the state holds up to (0 on one node).
    pub fn applied_index(&self) -> u64 {
        self.replica.as_ref().map_or(0, |role| role.applied.get())
    }

    /// Whether a checkpoint may be taken now: always on one node; for a
    /// replicated partition, when its state covers its whole log and is
    /// trusted (module docs, "Checkpoints").
    pub(super) fn replica_checkpointable(&self) -> bool {
        let Some(role) = &self.replica else { return true };
        !role.diverged.get()
            && !role.rebuilding.get()
            && role.applied.get() > 0
            && role.applied.get() == self.log.journal().last_index()
    }

    /// The least journal position a replicated partition's log needs:
    /// where its entry at the floor lies (or the first held after it), the
    /// floor being
    /// the highest index both held by every member (the group floor:
    /// `replica/node.rs`) and covered by its durable checkpoint. raft-rs's
    /// view first lets go of the entries up to the floor
    /// ([`ReplicaDriver::compact`]), so nothing asks for them once their
    /// files go: a member that needs them then needs a snapshot. Position 0
    /// without a checkpoint (every entry is needed to rebuild the state).
    pub(super) fn replicated_log_pin(&self) -> JournalPos {
        let Some(driver) = self.log.driver() else { return JournalPos(0) };
        let cursor = self.checkpoint_covers.get();
        let covered = cursor.entry_index();
        if covered == 0 {
            return JournalPos(0);
        }
        let floor = driver.compact(covered);
        // From the floor's own entry: a reopen needs its term (the log then
        // starts after the first entry it finds) — unless the floor is the
        // checkpoint's entry and the checkpoint recorded its term: an idle
        // partition's last entry would otherwise pin its journal file, and
        // every later one, for good.
        let from =
            if floor >= covered && cursor.entry_term().is_some() { covered + 1 } else { floor };
        self.log.journal().held_position_from(from).unwrap_or(JournalPos(u64::MAX))
    }

    /// Waits until the log has committed entry `index`, still of `term`,
    /// with the state trusted throughout; `false` when it does not within
    /// [`REPLICA_CHECKPOINT_COMMIT_WAIT_MS`], or the partition diverged or
    /// closed. Always `true` on one node.
    pub(super) async fn checkpoint_committed(&self, index: u64, term: u64) -> bool {
        let (Some(role), Some(driver)) = (&self.replica, self.log.driver()) else {
            return true;
        };
        let started = (self.clock)();
        loop {
            let progress = driver.progress();
            let part = self.log.journal();
            if self.closed.get() || role.diverged.get() || driver.failure().is_some() {
                return false;
            }
            if part.committed_index() >= index {
                return part.term_at(index) == Some(term) && !role.diverged.get();
            }
            if (self.clock)().saturating_sub(started) >= REPLICA_CHECKPOINT_COMMIT_WAIT_MS {
                return false;
            }
            // Every commit, role change and stop of the member wakes it.
            progress.await;
        }
    }

    /// Refuses an append unless this partition serves (or runs its
    /// leadership fence). Called in the same synchronous section as the
    /// decision it appends.
    pub(super) fn may_append(&self) -> Result<(), PartitionError> {
        let Some(role) = &self.replica else { return Ok(()) };
        if role.serving.get() || role.fencing.get() {
            return Ok(());
        }
        let leader = self.log.driver().map_or(0, |driver| driver.role().2);
        Err(PartitionError::NotLeader { partition: self.name.partition.0, leader })
    }

    /// Appends `batch` as the partition's next batch (`wanted`: someone
    /// waits for it now), once [`may_append`](Self::may_append) allows;
    /// a replicated partition's state holds its entry from here on.
    pub(super) fn log_append(
        &self,
        batch: &[u8],
        wanted: bool,
    ) -> Result<LogAppended, PartitionError> {
        self.may_append()?;
        let appended =
            if wanted { self.log.append(batch)? } else { self.log.append_deferred(batch)? };
        if let Some(role) = &self.replica {
            role.applied.set(appended.entry_index);
        }
        Ok(appended)
    }

    /// Folds the entries its member committed since the last call into the
    /// state (skipping those it appended itself as leader), then looks at
    /// its role (module docs). Call whenever the member reports progress.
    ///
    /// # Errors
    /// An entry out of order or that does not fold (the state then diverges
    /// from the log: the partition is marked diverged).
    pub fn fold_committed(&self) -> Result<Folded, PartitionError> {
        let (Some(role), Some(driver)) = (&self.replica, self.log.driver()) else {
            return Ok(Folded::default());
        };
        let mut folded = Folded::default();
        if role.rebuilding.get() {
            return Ok(folded);
        }
        let committed = driver.take_committed();
        let last = committed.last().map(|entry| entry.index);
        if let Some(last) = last {
            role.taken.set(role.taken.get().max(last));
        }
        for entry in committed {
            if entry.index <= role.applied.get() {
                role.folded_term.set(entry.term);
                continue;
            }
            if entry.index != role.applied.get() + 1 {
                role.diverged.set(true);
                return Err(self.recovery(format!(
                    "committed entry {} after entry {}",
                    entry.index,
                    role.applied.get()
                )));
            }
            if !entry.batch.is_empty() {
                let header = BatchHeader::verify(&entry.batch)
                    .map_err(|error| self.recovery(format!("entry {}: {error}", entry.index)))?;
                let batch = ReadBatch { header, bytes: SharedBytes::new(entry.batch) };
                let mut state = self.state.borrow_mut();
                let applied =
                    role.fold.borrow_mut().apply(&mut state, &batch, Offset(0), &self.dir);
                if let Err(error) = applied {
                    role.diverged.set(true);
                    return Err(error);
                }
            }
            role.applied.set(entry.index);
            role.folded_term.set(entry.term);
            folded.entries += 1;
        }
        if let Some(last) = last {
            driver.applied(last);
        }
        if folded.entries > 0 {
            self.recharge();
            self.hint_wakeup();
            role.count(|stats| stats.folded += folded.entries);
        }
        let (leads, term, _) = driver.role();
        if role.serving.get() && (!leads || term != self.epoch().0) {
            role.serving.set(false);
            folded.stepped_down = true;
            role.count(|stats| stats.step_downs += 1);
            // Entries applied when appended and not committed may be
            // cancelled by the next leader.
            if role.applied.get() > self.log.journal().committed_index() {
                role.diverged.set(true);
            }
            self.claimable.notify_all();
        }
        folded.ready_to_lead = leads
            && !role.serving.get()
            && !role.fencing.get()
            && !role.diverged.get()
            && role.folded_term.get() == term;
        Ok(folded)
    }

    /// Drives this partition's role for as long as it is open: at every
    /// progress of its member (entries committed, a role change) it folds
    /// what committed, takes the lead when it is due
    /// ([`take_leadership`](Self::take_leadership)) and rebuilds a diverged
    /// state ([`rebuild`](Self::rebuild)). A rebuild refused (the log too
    /// long to read back by index) is logged once and not tried again: the
    /// partition then refuses every request until it is reopened. Ends
    /// when the partition closes or its member stops. Spawn it once, beside
    /// the member's pump (a partition on one node returns at once).
    pub async fn run_replica(self: Rc<Self>) {
        let Some(driver) = self.log.driver().cloned() else { return };
        let mut rebuild_refused = false;
        loop {
            let progress = driver.progress();
            if self.closed.get() || driver.failure().is_some() {
                return;
            }
            let folded = match self.fold_committed() {
                Ok(folded) => folded,
                Err(error) => {
                    tracing::warn!(partition = ?self.name, %error, "committed entries not folded");
                    Folded::default()
                }
            };
            if self.diverged() && !rebuild_refused {
                if let Err(error) = self.rebuild().await {
                    tracing::error!(partition = ?self.name, %error,
                        "diverged state not rebuilt; the partition serves nothing until reopened");
                    rebuild_refused = true;
                }
                continue;
            }
            if folded.ready_to_lead {
                match self.take_leadership().await {
                    Ok(fenced) => tracing::info!(partition = ?self.name, term = self.epoch().0,
                        fenced, "leading"),
                    Err(error) => tracing::info!(partition = ?self.name, %error,
                        "did not take the lead"),
                }
                continue;
            }
            progress.await;
        }
    }

    /// Makes this member's term the partition's leader epoch, ends the
    /// claims of earlier terms (the epoch fence, through the log) and opens
    /// the partition. Returns how many claims the fence ended.
    ///
    /// # Errors
    /// [`PartitionError::NotLeader`] when it is not ready to lead (see
    /// [`Folded::ready_to_lead`]); the fence's append and commit errors
    /// (it stays closed; the next fold may try again).
    pub async fn take_leadership(&self) -> Result<u64, PartitionError> {
        let (Some(role), Some(driver)) = (&self.replica, self.log.driver()) else {
            return Ok(0);
        };
        let (leads, term, leader) = driver.role();
        if !leads || role.serving.get() || role.fencing.get() || role.folded_term.get() != term {
            return Err(PartitionError::NotLeader { partition: self.name.partition.0, leader });
        }
        self.epoch.set(LeaderEpoch(term));
        self.state.borrow_mut().set_leader_epoch(LeaderEpoch(term));
        role.fencing.set(true);
        let fenced = self.fence().await;
        role.fencing.set(false);
        let fenced = fenced?;
        let (leads, now_term, _) = driver.role();
        if !leads || now_term != term {
            return Err(PartitionError::NotLeader { partition: self.name.partition.0, leader: 0 });
        }
        role.serving.set(true);
        role.count(|stats| stats.leaderships += 1);
        self.claimable.notify_all();
        if self.state.borrow().has_ready() {
            self.ready(0);
        }
        Ok(fenced)
    }

    /// Opens (recovering) or creates a replicated partition in `dir`: its
    /// journal view from what the shard's recovery routed to it, its Raft
    /// member ([`ReplicaDriver::open`]) on that view and the shard's vote
    /// log, its state folded from the committed entries (never those above:
    /// they may yet be cancelled). It serves nothing until its member leads
    /// ([`fold_committed`](Self::fold_committed),
    /// [`take_leadership`](Self::take_leadership)). Spawn the member's pump
    /// (`partition.log().driver()`) and the returned background future;
    /// the owner steps and ticks the member.
    ///
    /// # Errors
    /// As [`Partition::open_journal`], and the member's open.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_replicated(
        storage: S,
        dir: &Path,
        name: PartitionName,
        config: QueueConfig,
        open: ReplicatedOpen<S>,
        secret: [u8; 32],
        fatal: Rc<dyn FatalHandler>,
        clock: Clock,
    ) -> Result<(Rc<Self>, impl Future<Output = ()> + 'static, OpenReport), PartitionError> {
        prepare_dir(&storage, dir, &config).await?;
        let ReplicatedOpen { shard, handle, routed, log, votes, member, voters, timing, send } =
            open;
        // Tokens are issued under the leader's term, set when it takes the
        // lead; until then the state issues none.
        let epoch = LeaderEpoch(0);
        let context = context_of(&name, epoch, secret, &config);
        let (mut state, covers, replay_from) =
            restore_journal_state(&storage, dir, context).await?;
        // The members its checkpoint names, else the group's initial ones;
        // the replay folds the committed changes after it.
        let initial = Members::voters(&voters);
        state.seed_members(initial.clone());
        let members = state.members().cloned().unwrap_or_else(|| initial.clone());
        let floor = covers.map_or(Offset(0), |covers| Offset(covers.0));
        // A checkpoint covers only committed entries (module docs): its
        // index is committed even where the commit markers lag.
        let mut log = log;
        log.committed = log.committed.max(replay_from.entry_index());
        let (index_floor, log_start) = (replay_from.entry_index(), replay_from.log_start());
        let at = LogFloor { index: index_floor, term: replay_from.entry_term(), log_start };
        let view = shard.replicated_partition(handle, routed, log, floor, 0, at)?;
        let view = Rc::new(view);
        let applied = view.committed_index();
        let driver =
            ReplicaDriver::open(member, members, view, votes, applied, timing, send).await?;
        let log = PartitionLog::replicated(driver);
        log.set_log_start(log_start);
        let opened = Self::finish_open(
            Opening { storage, dir, name, log, state, epoch, covers, replay_from, replayed: None },
            fatal,
            clock,
        )
        .await?;
        if let Some(role) = &opened.0.replica {
            role.secret.set(secret);
            *role.initial.borrow_mut() = initial;
            // raft-rs counts the committed entries applied: its
            // configuration is the one the replay reached.
            let reached = opened.0.state.borrow().members().cloned();
            if let (Some(reached), Some(driver)) = (reached, opened.0.log.driver()) {
                driver.restore_members(&reached)?;
            }
        }
        if index_floor > 0 {
            let recorded = replay_from.entry_term();
            let term = recorded.or_else(|| opened.0.log.journal().term_at(index_floor));
            opened.0.offer_snapshot(index_floor, term);
        }
        Ok(opened)
    }

    /// Rebuilds a diverged partition's state from its log (module docs): the
    /// last checkpoint (or an empty state) with every committed entry after
    /// it folded, read back by index, in place of the one that held
    /// entries a new leader cancelled.
    /// Committed entries arriving meanwhile wait in the member and are
    /// folded after. Returns the entries folded.
    ///
    /// # Errors
    /// [`PartitionError::Recovery`] when the log no longer holds by index
    /// the entries after the last checkpoint (the node must reopen the
    /// partition from its journal), and the checkpoint's and the log's read
    /// errors; the partition stays diverged.
    pub async fn rebuild(&self) -> Result<u64, PartitionError> {
        let Some(role) = &self.replica else { return Ok(0) };
        if !role.diverged.get() || role.rebuilding.replace(true) {
            return Ok(0);
        }
        let rebuilt = self.rebuild_state(role).await;
        role.rebuilding.set(false);
        let (state, fold, upto) = rebuilt?;
        *self.state.borrow_mut() = state;
        *role.fold.borrow_mut() = fold;
        role.applied.set(upto);
        role.folded_term.set(self.log.journal().term_at(upto).unwrap_or(0));
        role.diverged.set(false);
        role.count(|stats| stats.rebuilds += 1);
        self.recharge();
        self.hint_wakeup();
        self.claimable.notify_all();
        tracing::info!(partition = ?self.name, entries = upto, "diverged state rebuilt from the log");
        Ok(upto)
    }

    async fn rebuild_state(
        &self,
        role: &Role,
    ) -> Result<(PartitionState, ReplayFold, u64), PartitionError> {
        let part = self.log.journal().clone();
        let config = self.state.borrow().config().clone();
        let context = context_of(&self.name, self.epoch.get(), role.secret.get(), &config);
        // The last checkpoint in place (it covers only committed entries,
        // none a new leader cancelled), and the entries after it.
        let (mut state, _, cursor) =
            restore_journal_state(&self.storage, &self.dir, context).await?;
        state.seed_members(role.initial.borrow().clone());
        let from = cursor.entry_index() + 1;
        let first = part.first_index();
        if first > from {
            return Err(self.recovery(format!(
                "cannot rebuild: entries before {first} are no longer held by index and the \
                 last checkpoint covers up to {}; reopen the partition from its journal",
                from - 1
            )));
        }
        let mut fold = ReplayFold::default();
        // Every entry taken from the member (committed and durable here),
        // and what the log has committed since.
        let upto = part.committed_index().max(role.taken.get());
        let mut next = from;
        while next <= upto {
            let read = part.read_entries(next, upto + 1, REPLAY_READ_BYTES).await?;
            if read.is_empty() {
                return Err(self.recovery(format!("cannot rebuild: entry {next} is not durable")));
            }
            for entry in read {
                next = entry.index + 1;
                fold.apply(&mut state, &entry.batch, Offset(0), &self.dir)?;
            }
        }
        Ok((state, fold, upto))
    }

    fn recovery(&self, reason: String) -> PartitionError {
        PartitionError::Recovery { dir: self.dir.clone(), reason }
    }
}
