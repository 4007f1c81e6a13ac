//! The partition log as the Raft log (`docs/design/replication.md`,
//! `docs/design/shard-journal.md` §14): three members of one partition's
//! Raft group, each a [`Replica`] over its own shard journal on its own
//! [`SimStorage`], with the messages passed in memory (seeded drops and
//! delays) and the clocks ticked in a seeded pattern.
//!
//! Performing a [`Work`] on a member's [`JournalPartition`] means: send
//! `work.send`; apply `work.apply` (checked against every other member's
//! entry at that index); persist the vote (a test-local vote store, synced
//! at once, before the entries that may depend on it); `truncate_from`
//! (awaited); `append_at` of each entry at its (index, term), keeping the
//! tickets; `set_committed` (capped at the log's last index). Once every
//! ticket of the works up to `n` is durable, `persisted(n)`, and only then
//! `work.send_persisted` goes out.
//! Read-backs (entries raft-rs asks for below a member's window) and each
//! reopened log are read by entry index, `read_entries`
//! (`docs/design/shard-journal.md` §14.5).
//!
//! Raft entries carry journal batch bytes: a proposal is a data batch
//! stamped at proposal time with the leader's next data offset (the
//! proposal's work is drained at once, so the append lands before the next
//! proposal); raft-rs's empty entries (a new leader's first entry of its
//! term) become a small control batch, mapped back to empty data when read.
//!
//! Scenario, over 20 seeds: elect a leader, propose in rounds, crash the
//! leader (often right after a burst of proposals it alone holds) and
//! reopen its journal from a crash image, elect a new leader among the
//! other two, propose more, restart the old member from what its journal
//! recovered, and let the group converge. Checked at the end: every
//! acknowledged proposal (applied on the leader that took it) is in every
//! member's reopened journal at its index and term; the journals agree
//! entry by entry up to the committed index; and over the seeds some member
//! truncated a conflicting uncommitted suffix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod journal_common;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures_lite::future::{block_on, or, yield_now};
use journal_common::{open_shard, payload, Rng};
use raft::eraftpb::{Entry, Message};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{JournalPartition, JournalPos, JournalTicket, PartitionHandle};
use spool_broker::log::Offset;
use spool_broker::replica::{Recovered, Replica, Timing, Work};
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::proto::PartitionId;

const VOTERS: [u64; 3] = [1, 2, 3];
/// The leader epoch stamped in batches and given to the partition view.
const EPOCH: u32 = 1;
/// A bound on the steps of any phase: a run that needs more is stuck.
const STEPS_MAX: u64 = 4_000;

type Background = Pin<Box<dyn Future<Output = ()>>>;

/// Runs `work` while polling the journal's background future `background`.
fn run<T>(background: &mut Background, work: impl Future<Output = T>) -> T {
    block_on(or(work, async {
        background.as_mut().await;
        panic!("the journal's background ended while the test still uses it")
    }))
}

/// Lets the journal's background run for `polls` polls.
fn settle(background: &mut Background, polls: usize) {
    run(background, async {
        for _ in 0..polls {
            yield_now().await;
        }
    });
}

/// The batch an entry is stored as: its data, or for raft-rs's empty entry
/// (a new leader's first of its term) a minimal control batch (one record,
/// valid crcs, based at the log's `next_offset` as a control entry is) that
/// every member builds the same. The broker's driver will store a real
/// "term start" control record there; here any control batch reads back as
/// an empty entry.
fn stored_batch(entry: &Entry, next_offset: u64) -> Vec<u8> {
    if entry.data.is_empty() {
        let mut bytes = payload(BatchKind::Control, 8, entry.term);
        BatchHeader::assign(&mut bytes, next_offset, EPOCH);
        bytes
    } else {
        entry.data.to_vec()
    }
}

/// The Raft entry a stored batch stands for.
fn entry_of(index: u64, term: u64, batch: &[u8]) -> Entry {
    let header = BatchHeader::verify(batch).unwrap();
    let data = if header.kind == BatchKind::Control { Vec::new() } else { batch.to_vec() };
    Entry { index, term, data: data.into(), ..Entry::default() }
}

/// One member's journal: its disk, partition (which holds its shard) and
/// background.
struct Disk {
    storage: SimStorage,
    part: JournalPartition<SimStorage>,
    background: Background,
}

/// The Raft entries of `part` from `low` up to `high` (exclusive), read by
/// entry index.
async fn read_log(part: &JournalPartition<SimStorage>, low: u64, high: u64) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut next = low;
    while next < high {
        let read = part.read_entries(next, high, 1 << 20).await.unwrap();
        assert!(!read.is_empty(), "entries {next}..{high} are durable");
        next += read.len() as u64;
        entries.extend(read.iter().map(|e| entry_of(e.index, e.term, &e.batch.bytes)));
    }
    entries
}

/// Opens (recovering) the journal on `storage`; returns it with the
/// entries its partition recovered (dense from 1), read back by index.
fn open_disk(storage: SimStorage, handle: PartitionHandle) -> (Disk, Vec<Entry>) {
    let (shard, recovery) = open_shard(&storage, JournalPos(0));
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
    let count = routed.len() as u64;
    let part = shard.replicated_partition(handle, routed, log, Offset(0), EPOCH, 0).unwrap();
    assert_eq!((part.first_index(), part.last_index()), (1, count), "dense from 1");
    let entries = block_on(read_log(&part, 1, count + 1));
    let background: Background = Box::pin(shard.background());
    (Disk { storage, part, background }, entries)
}

/// A recovered log holds every entry `id` reported persisted.
fn holds_claimed(id: u64, claimed: &BTreeMap<u64, u64>, recovered: &[Entry]) {
    for (index, term) in claimed {
        let found = recovered.get(*index as usize - 1).map(|entry| entry.term);
        assert_eq!(found, Some(*term), "member {id}: entry {index} reported persisted, lost");
    }
}

/// A work performed and not yet reported persisted.
struct Unsynced {
    number: u64,
    tickets: Vec<JournalTicket>,
    entries: Vec<(u64, u64)>,
    send_persisted: Vec<Message>,
}

struct Member {
    id: u64,
    disk: Disk,
    replica: Option<Replica>,
    /// Works performed, not yet persisted: number, tickets, messages.
    unsynced: VecDeque<Unsynced>,
    /// Entries reported persisted (index → term), less those a truncation
    /// cancelled since: any crash image must hold them.
    claimed: BTreeMap<u64, u64>,
    /// Proposals taken here: index → (term, data), answered when applied.
    proposed: BTreeMap<u64, (u64, Bytes)>,
    /// The test-local vote store: (term, vote).
    vote: (u64, u64),
    /// The last index this member's state machine applied.
    applied_to: u64,
}

#[derive(Default)]
struct Totals {
    acknowledged: usize,
    truncations: u64,
    cancelled: u64,
    fetches: u64,
    /// Terms the runs went through (the last leader's term).
    terms: u64,
}

struct World {
    rng: Rng,
    members: Vec<Member>,
    handle: PartitionHandle,
    /// (deliver at step, message)
    network: Vec<(u64, Message)>,
    step: u64,
    tag: u64,
    /// Applied entry bytes each replica keeps in memory: small in half the
    /// seeds, so a lagging follower is served by read-backs of the journal.
    cache_bytes: usize,
    /// Every entry applied anywhere: index → (term, data).
    applied: BTreeMap<u64, (u64, Bytes)>,
    /// Proposals answered committed: (index, term, data).
    acknowledged: Vec<(u64, u64, Bytes)>,
    totals: Totals,
}

impl World {
    fn new(seed: u64) -> World {
        let mut members = Vec::new();
        let mut handle = None;
        for id in VOTERS {
            let storage = SimStorage::new();
            let (shard, _) = open_shard(&storage, JournalPos(0));
            let registered = block_on(shard.register(7, PartitionId(0))).unwrap();
            assert_eq!(*handle.get_or_insert(registered), registered);
            drop(shard);
            let (disk, recovered) = open_disk(storage, registered);
            assert!(recovered.is_empty());
            members.push(Member {
                id,
                disk,
                replica: None,
                unsynced: VecDeque::new(),
                claimed: BTreeMap::new(),
                proposed: BTreeMap::new(),
                vote: (0, 0),
                applied_to: 0,
            });
        }
        let mut world = World {
            rng: Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1),
            members,
            handle: handle.unwrap(),
            network: Vec::new(),
            step: 0,
            tag: seed * 1_000_000,
            cache_bytes: if seed.is_multiple_of(2) { 512 } else { usize::MAX },
            applied: BTreeMap::new(),
            acknowledged: Vec::new(),
            totals: Totals::default(),
        };
        for at in 0..VOTERS.len() {
            world.start(at, Vec::new());
        }
        world
    }

    /// Starts member `at`'s replica from its journal's recovered entries.
    fn start(&mut self, at: usize, entries: Vec<Entry>) {
        let offset = 3 * at + self.rng.below(3) as usize;
        let member = &mut self.members[at];
        let commit = member.disk.part.committed_index();
        let recovered = Recovered {
            floor: (0, 0),
            entries,
            term: member.vote.0,
            vote: member.vote.1,
            commit,
            // The state machine is rebuilt from the committed prefix (what
            // it applied before is in `applied` already).
            applied: commit,
        };
        member.applied_to = commit;
        let timing = Timing::Fixed { offset };
        let mut replica = Replica::start_timed(member.id, &VOTERS, recovered, timing).unwrap();
        replica.set_cache_bytes(self.cache_bytes);
        member.replica = Some(replica);
    }

    /// Drops member `at`'s memory and reopens its journal from a crash
    /// image of its disk; returns what it recovered (to start it later).
    fn crash(&mut self, at: usize, mode: CrashMode) -> Vec<Entry> {
        let member = &mut self.members[at];
        member.replica = None;
        member.unsynced.clear();
        member.proposed.clear();
        let image = member.disk.storage.crash_image(mode);
        let (disk, entries) = open_disk(image, self.handle);
        holds_claimed(member.id, &member.claimed, &entries);
        member.disk = disk;
        entries
    }

    /// Every member's disk, crashed now (only what was synced, or unsynced
    /// sectors at random), recovers every entry it reported persisted.
    fn check_crash_images(&mut self) {
        for member in &self.members {
            for mode in [CrashMode::DurableOnly, CrashMode::PowerLoss { seed: self.step }] {
                let (_, entries) = open_disk(member.disk.storage.crash_image(mode), self.handle);
                holds_claimed(member.id, &member.claimed, &entries);
            }
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        for message in messages {
            if self.rng.below(50) == 0 {
                continue;
            }
            let at = self.step + 1 + self.rng.below(3);
            self.network.push((at, message));
        }
    }

    /// Performs one work of member `at` (module docs), but for what waits
    /// for durability (see [`World::sync`]).
    fn perform(&mut self, at: usize, work: Work) {
        self.send(work.send);
        let member = &mut self.members[at];
        let replica = member.replica.as_mut().unwrap();
        if let Some(last) = work.apply.last().map(|entry| entry.index) {
            for entry in &work.apply {
                let data = Bytes::from(entry.data.to_vec());
                let seen = self.applied.entry(entry.index).or_insert((entry.term, data.clone()));
                assert_eq!(*seen, (entry.term, data.clone()), "member {}: applied", member.id);
                if member.proposed.remove(&entry.index) == Some((entry.term, data.clone())) {
                    self.acknowledged.push((entry.index, entry.term, data));
                }
            }
            replica.applied(last);
            member.applied_to = last;
        }
        if let Some(vote) = work.vote {
            member.vote = vote;
        }
        let disk = &mut member.disk;
        if let Some(from) = work.truncate_from {
            let cancelled = run(&mut disk.background, disk.part.truncate_from(from)).unwrap();
            if cancelled.entries > 0 {
                self.totals.truncations += 1;
                self.totals.cancelled += cancelled.entries;
            }
            member.claimed.retain(|index, _| *index < from);
        }
        let mut tickets = Vec::new();
        for entry in &work.entries {
            let batch = stored_batch(entry, disk.part.next_offset().0);
            let appended = disk.part.append_at(entry.index, entry.term, &batch, true);
            let appended = appended.unwrap_or_else(|error| {
                panic!("member {}: append_at {} failed: {error}", member.id, entry.index)
            });
            tickets.push(appended.ticket);
        }
        if let Some(commit) = work.commit {
            disk.part.set_committed(commit.min(disk.part.last_index())).unwrap();
        }
        let entries = work.entries.iter().map(|entry| (entry.index, entry.term)).collect();
        let (number, send_persisted) = (work.number, work.send_persisted);
        member.unsynced.push_back(Unsynced { number, tickets, entries, send_persisted });
    }

    /// Lets member `at`'s journal run a little, then reports to its replica
    /// every work whose tickets are all durable, sending what waited.
    fn sync(&mut self, at: usize) {
        let member = &mut self.members[at];
        settle(&mut member.disk.background, 4);
        let mut number = None;
        let mut messages = Vec::new();
        while let Some(work) = member.unsynced.front() {
            if !work.tickets.iter().all(|ticket| matches!(ticket.status(), Some(Ok(())))) {
                break;
            }
            let work = member.unsynced.pop_front().unwrap();
            number = Some(work.number);
            member.claimed.extend(work.entries);
            messages.extend(work.send_persisted);
        }
        if let Some(number) = number {
            member.replica.as_mut().unwrap().persisted(number);
            self.send(messages);
        }
    }

    /// Serves member `at`'s read-backs from its journal, by entry index.
    fn fetch(&mut self, at: usize) {
        let member = &mut self.members[at];
        let Some(replica) = member.replica.as_mut() else { return };
        for fetch in replica.fetches() {
            self.totals.fetches += 1;
            let disk = &mut member.disk;
            let entries = run(&mut disk.background, read_log(&disk.part, fetch.low, fetch.high));
            replica.fetched(fetch, entries);
        }
    }

    /// Drains member `at`'s works.
    fn drive(&mut self, at: usize) {
        loop {
            self.fetch(at);
            let Some(replica) = self.members[at].replica.as_mut() else { return };
            match replica.work().unwrap() {
                Some(work) => self.perform(at, work),
                None => return,
            }
        }
    }

    /// Proposes one data batch at member `at` (if it leads), stamped with
    /// its next data offset, and appends it at once.
    fn propose(&mut self, at: usize) -> bool {
        self.drive(at);
        self.tag += 1;
        let member = &mut self.members[at];
        let Some(replica) = member.replica.as_mut().filter(|replica| replica.is_leader()) else {
            return false;
        };
        let mut batch = payload(BatchKind::Data, 24 + (self.tag % 160) as usize, self.tag);
        BatchHeader::assign(&mut batch, member.disk.part.next_offset().0, EPOCH);
        let batch = Bytes::from(batch);
        let Ok((index, term)) = replica.propose(batch.clone()) else { return false };
        member.proposed.insert(index, (term, batch));
        self.drive(at);
        assert_eq!(self.members[at].disk.part.last_index(), index, "the proposal is appended");
        true
    }

    /// One step: ticks, deliveries, syncs and works of the live members.
    fn tick(&mut self) {
        self.step += 1;
        if self.step.is_multiple_of(40) {
            self.check_crash_images();
        }
        for member in &mut self.members {
            if let Some(replica) = member.replica.as_mut() {
                if self.rng.below(2) == 0 {
                    replica.tick();
                }
            }
        }
        let step = self.step;
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.network).into_iter().partition(|(at, _)| *at <= step);
        self.network = later;
        for (_, message) in due {
            if let Some(replica) = self.members[message.to as usize - 1].replica.as_mut() {
                // A message raft-rs refuses (a stale kind) is dropped.
                let _ = replica.step(message);
            }
        }
        for at in 0..self.members.len() {
            self.drive(at);
            self.sync(at);
            self.drive(at);
        }
    }

    fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|member| member.replica.as_ref().is_some_and(Replica::is_leader))
    }

    /// Steps until a leader is known; returns it.
    fn elect(&mut self) -> usize {
        for _ in 0..STEPS_MAX {
            self.tick();
            if let Some(at) = self.leader() {
                return at;
            }
        }
        panic!("no leader elected");
    }

    /// Proposes `count` batches at the leader over some steps.
    fn round(&mut self, count: usize) {
        let mut made = 0;
        let mut steps = 0;
        while made < count {
            steps += 1;
            assert!(steps < STEPS_MAX, "a round made {made} of {count} proposals");
            let leader = match self.leader() {
                Some(at) => at,
                None => self.elect(),
            };
            for _ in 0..1 + self.rng.below(4) {
                if made < count && self.propose(leader) {
                    made += 1;
                }
            }
            self.tick();
        }
    }

    /// Steps until every member is up and has applied the leader's
    /// committed index, which covers every proposal made.
    fn converge(&mut self) {
        for _ in 0..STEPS_MAX {
            self.tick();
            let Some(leader) = self.leader() else { continue };
            let replica = self.members[leader].replica.as_ref().unwrap();
            let (commit, last) = (replica.commit_index(), replica.last_index());
            let done = commit == last
                && self.members.iter().all(|member| {
                    member.replica.as_ref().is_some_and(|r| r.commit_index() == commit)
                        && member.disk.part.committed_index() == commit
                        && member.unsynced.is_empty()
                        && member.applied_to == commit
                });
            if done && self.members[leader].proposed.is_empty() {
                return;
            }
        }
        panic!("the group did not converge");
    }

    /// Each member's journal as a reopened image holds it: (index, term, data).
    fn journals(&mut self) -> Vec<(Vec<Entry>, u64)> {
        let handle = self.handle;
        self.members
            .iter_mut()
            .map(|member| {
                let disk = &mut member.disk;
                run(&mut disk.background, disk.part.persist_committed()).unwrap();
                let image = disk.storage.crash_image(CrashMode::DurableOnly);
                let (reopened, entries) = open_disk(image, handle);
                (entries, reopened.part.committed_index())
            })
            .collect()
    }
}

/// One seeded run; returns its totals.
fn run_seed(seed: u64) -> Totals {
    let mut world = World::new(seed);
    world.elect();
    for _ in 0..4 {
        world.round(50);
    }
    // Crash the leader, often right after a burst only it holds: its
    // appends are durable on its disk and never reached the others.
    let old = world.leader().unwrap_or_else(|| world.elect());
    let old_term = world.members[old].replica.as_ref().unwrap().term();
    if world.rng.below(3) != 0 {
        for _ in 0..1 + world.rng.below(4) {
            world.propose(old);
        }
        settle(&mut world.members[old].disk.background, 16);
        world.network.retain(|(_, message)| message.from != old as u64 + 1);
    }
    let mode = if world.rng.below(2) == 0 {
        CrashMode::DurableOnly
    } else {
        CrashMode::PowerLoss { seed: world.rng.next() }
    };
    let recovered = world.crash(old, mode);
    world.round(40);
    let new = world.leader().unwrap();
    assert!(world.members[new].replica.as_ref().unwrap().term() > old_term);
    world.start(old, recovered);
    world.round(10);
    world.converge();
    // Every acknowledged proposal is in every journal at its index and
    // term; the journals agree up to the committed index.
    let journals = world.journals();
    let commit = journals.iter().map(|(_, commit)| *commit).max().unwrap();
    for (at, (entries, committed)) in journals.iter().enumerate() {
        assert_eq!(*committed, commit, "seed {seed}: member {} commit", at + 1);
        assert!(entries.len() as u64 >= commit);
        for (index, term, data) in &world.acknowledged {
            let entry = &entries[*index as usize - 1];
            assert_eq!((entry.term, &entry.data[..]), (*term, &data[..]), "seed {seed}: {index}");
        }
        assert_eq!(entries[..commit as usize], journals[0].0[..commit as usize], "seed {seed}");
        for entry in &entries[..commit as usize] {
            let (term, data) = &world.applied[&entry.index];
            assert_eq!((entry.term, &entry.data[..]), (*term, &data[..]), "seed {seed}: applied");
        }
    }
    world.totals.acknowledged = world.acknowledged.len();
    let leader = world.leader().unwrap();
    world.totals.terms = world.members[leader].replica.as_ref().unwrap().term();
    world.totals
}

#[test]
fn the_partition_log_serves_as_the_raft_log_through_a_leader_crash() {
    let mut all = Totals::default();
    for seed in 0..20 {
        let totals = run_seed(seed);
        assert!(totals.acknowledged >= 200, "seed {seed}: {} acknowledged", totals.acknowledged);
        all.acknowledged += totals.acknowledged;
        all.truncations += totals.truncations;
        all.cancelled += totals.cancelled;
        all.fetches += totals.fetches;
        all.terms += totals.terms;
    }
    println!(
        "20 seeds: {} acknowledged, {} truncations cancelling {} entries, {} read-backs, {} terms",
        all.acknowledged, all.truncations, all.cancelled, all.fetches, all.terms
    );
    assert!(all.truncations > 0, "no member ever truncated a conflicting suffix");
}
