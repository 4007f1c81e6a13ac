//! The partition log as the Raft log, through the broker's own driver
//! (`docs/design/replication.md`, `docs/design/shard-journal.md` §14):
//! three members of one partition's Raft group, each a [`ReplicaDriver`]
//! over its own shard journal and vote log on its own [`SimStorage`], with
//! the messages passed in memory (seeded drops and delays), the clocks
//! ticked in a seeded pattern, and every future (the drivers' pumps, the
//! journals' backgrounds) polled by the test in a fixed order, so a seed
//! replays exactly.
//!
//! Scenario, over 20 seeds: elect a leader, propose in rounds, crash the
//! leader (often right after a burst of proposals it alone holds) and
//! reopen its journal and vote log from a crash image, elect a new leader
//! among the other two, propose more, restart the old member from what it
//! recovered, and let the group converge. Checked:
//!
//! - every acknowledged proposal (its `committed` resolved on the leader
//!   that took it) is in every member's reopened journal at its index and
//!   term, byte for byte, and every member applied the same entries;
//! - an append a member acknowledged (a `MsgAppendResponse` it sent) is in
//!   any crash image of its disk taken at any later step, unless a
//!   truncation replaced it since: the driver sends those only once the
//!   entries are durable;
//! - a vote a member granted is in its vote log's crash image;
//! - a new leader's first entry of its term is stored as a `TermStarted`
//!   control record and reads back as raft-rs's empty entry;
//! - over the seeds some member truncated a conflicting uncommitted suffix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod journal_common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use futures_lite::future::{block_on, poll_once};
use journal_common::{open_shard, payload, Rng, SHARD};
use raft::eraftpb::{Message, MessageType};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{JournalPartition, JournalPos, LogFloor, PartitionHandle};
use spool_broker::log::vote::VoteLog;
use spool_broker::log::Offset;
use spool_broker::replica::driver::{is_term_start, raft_entry};
use spool_broker::replica::{DriverError, Members, ReplicaDriver, Timing};
use spool_wire::batch::BatchKind;
use spool_wire::proto::PartitionId;

const VOTERS: [u64; 3] = [1, 2, 3];
/// A bound on the steps of any phase: a run that needs more is stuck.
const STEPS_MAX: u64 = 4_000;

/// An entry as a journal holds it: index, term, stored bytes.
type Stored = (u64, u64, Vec<u8>);
type Task = Pin<Box<dyn Future<Output = ()>>>;
type Waiting = Pin<Box<dyn Future<Output = Result<(), DriverError>>>>;

/// What the members sent and promised, shared with their send callbacks.
#[derive(Default)]
struct Wires {
    rng: Option<Rng>,
    step: u64,
    /// (deliver at step, message)
    network: Vec<(u64, Message)>,
    /// Per member: appends it acknowledged, index → the term its log held
    /// there when it did.
    acked: BTreeMap<u64, BTreeMap<u64, u64>>,
    /// Per member: the (term, candidate) of every vote it granted.
    granted: BTreeMap<u64, Vec<(u64, u64)>>,
    /// The logs the callbacks look entries up in, by member.
    logs: BTreeMap<u64, Rc<JournalPartition<SimStorage>>>,
}

impl Wires {
    fn send(&mut self, message: Message) {
        let from = message.from;
        match message.get_msg_type() {
            MessageType::MsgAppendResponse if !message.reject => {
                if let Some(term) = self.logs[&from].term_at(message.index) {
                    self.acked.entry(from).or_default().insert(message.index, term);
                }
            }
            MessageType::MsgRequestVoteResponse if !message.reject => {
                self.granted.entry(from).or_default().push((message.term, message.to));
            }
            _ => {}
        }
        let rng = self.rng.as_mut().unwrap();
        if rng.below(50) == 0 {
            return;
        }
        let at = self.step + 1 + rng.below(3);
        self.network.push((at, message));
    }
}

/// One member: its disk and what runs on it.
struct Member {
    id: u64,
    storage: SimStorage,
    driver: Option<Rc<ReplicaDriver<SimStorage>>>,
    tasks: Vec<Task>,
    /// Proposals taken here and not yet answered.
    waiting: Vec<(u64, u64, Bytes, Waiting)>,
    applied_to: u64,
}

#[derive(Default)]
struct Totals {
    acknowledged: usize,
    truncations: u64,
    fetches: u64,
    term_starts: u64,
}

struct World {
    rng: Rng,
    wires: Rc<RefCell<Wires>>,
    members: Vec<Member>,
    handle: PartitionHandle,
    tag: u64,
    cache_bytes: usize,
    /// Every entry applied anywhere: index → (term, data).
    applied: BTreeMap<u64, (u64, Bytes)>,
    /// Proposals answered committed: (index, term, data).
    acknowledged: Vec<(u64, u64, Bytes)>,
    totals: Totals,
}

/// Applied entry bytes each member keeps in memory: small in half the
/// seeds, so a lagging follower is served by read-backs of the journal.
fn cache_bytes(seed: u64) -> usize {
    if seed.is_multiple_of(2) {
        512
    } else {
        usize::MAX
    }
}

/// Opens member `id`'s journal and vote log on `storage` and starts its
/// driver; returns the tasks to poll.
fn open_member(
    id: u64,
    storage: &SimStorage,
    handle: PartitionHandle,
    wires: &Rc<RefCell<Wires>>,
    offset: usize,
    cache_bytes: usize,
) -> (Rc<ReplicaDriver<SimStorage>>, Vec<Task>) {
    let (shard, recovery) = open_shard(storage, JournalPos(0));
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
    let part =
        shard.replicated_partition(handle, routed, log, Offset(0), 1, LogFloor::default()).unwrap();
    let part = Rc::new(part);
    let (votes, _) = block_on(VoteLog::open(storage.clone(), Path::new(SHARD))).unwrap();
    wires.borrow_mut().logs.insert(id, part.clone());
    let sink = wires.clone();
    let send: Rc<dyn Fn(Message)> = Rc::new(move |message| sink.borrow_mut().send(message));
    // The state machine is rebuilt from the committed prefix.
    let applied = part.committed_index();
    let opened = ReplicaDriver::open(
        id,
        Members::voters(&VOTERS),
        part,
        Rc::new(votes),
        applied,
        Timing::Fixed { offset },
        send,
    );
    let driver = block_on(opened).unwrap();
    driver.set_cache_bytes(cache_bytes);
    let tasks: Vec<Task> = vec![Box::pin(shard.background()), Box::pin(driver.clone().pump())];
    (driver, tasks)
}

impl World {
    fn new(seed: u64) -> World {
        let wires = Rc::new(RefCell::new(Wires {
            rng: Some(Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)),
            ..Wires::default()
        }));
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut members = Vec::new();
        let mut handle = None;
        for (at, id) in VOTERS.into_iter().enumerate() {
            let storage = SimStorage::new();
            let (shard, _) = open_shard(&storage, JournalPos(0));
            let registered = block_on(shard.register(7, PartitionId(0))).unwrap();
            assert_eq!(*handle.get_or_insert(registered), registered);
            drop(shard);
            let offset = 3 * at + rng.below(3) as usize;
            let (driver, tasks) =
                open_member(id, &storage, registered, &wires, offset, cache_bytes(seed));
            members.push(Member {
                id,
                storage,
                driver: Some(driver),
                tasks,
                waiting: Vec::new(),
                applied_to: 0,
            });
        }
        World {
            rng,
            wires,
            members,
            handle: handle.unwrap(),
            tag: seed * 1_000_000,
            cache_bytes: cache_bytes(seed),
            applied: BTreeMap::new(),
            acknowledged: Vec::new(),
            totals: Totals::default(),
        }
    }

    /// Polls every future of every member `rounds` times, in order.
    fn poll_all(&mut self, rounds: usize) {
        for _ in 0..rounds {
            for member in &mut self.members {
                for task in &mut member.tasks {
                    if block_on(poll_once(task.as_mut())).is_some() {
                        let failure = member.driver.as_ref().and_then(|driver| driver.failure());
                        panic!("member {}: a task ended: {failure:?}", member.id);
                    }
                }
                let mut answered = Vec::new();
                for (at, (index, term, data, waiting)) in member.waiting.iter_mut().enumerate() {
                    match block_on(poll_once(waiting.as_mut())) {
                        Some(Ok(())) => {
                            self.acknowledged.push((*index, *term, data.clone()));
                            answered.push(at);
                        }
                        Some(Err(DriverError::Superseded { .. } | DriverError::Stopped(_))) => {
                            answered.push(at);
                        }
                        Some(Err(error)) => panic!("member {}: {error}", member.id),
                        None => {}
                    }
                }
                for at in answered.into_iter().rev() {
                    drop(member.waiting.swap_remove(at));
                }
            }
        }
    }

    /// Folds what member `at` committed (checked against every other
    /// member's entry at that index) and reports it applied.
    fn apply(&mut self, at: usize) {
        let member = &mut self.members[at];
        let Some(driver) = member.driver.as_ref() else { return };
        let committed = driver.take_committed();
        let Some(last) = committed.last().map(|entry| entry.index) else { return };
        for entry in committed {
            assert_eq!(entry.index, member.applied_to + 1, "member {}: in order", member.id);
            let seen = self.applied.entry(entry.index).or_insert((entry.term, entry.batch.clone()));
            assert_eq!(*seen, (entry.term, entry.batch), "member {}: applied", member.id);
            member.applied_to = entry.index;
        }
        driver.applied(last);
    }

    /// Every member's disk, crashed now, holds every append it acknowledged
    /// (unless a truncation replaced it since), and its vote log every vote
    /// it granted.
    fn check_crash_images(&mut self) {
        for member in &self.members {
            let Some(driver) = member.driver.as_ref() else { continue };
            let part = driver.log();
            let wires = self.wires.borrow();
            let acked = wires.acked.get(&member.id).cloned().unwrap_or_default();
            let granted = wires.granted.get(&member.id).cloned().unwrap_or_default();
            drop(wires);
            let step = self.rng.next();
            for mode in [CrashMode::DurableOnly, CrashMode::PowerLoss { seed: step }] {
                let image = member.storage.crash_image(mode);
                let (shard, recovery) = open_shard(&image, JournalPos(0));
                let routed = recovery.routed.partitions.get(&self.handle).cloned();
                let log = recovery.routed.logs.get(&self.handle).copied().unwrap_or_default();
                let held = shard
                    .replicated_partition(
                        self.handle,
                        routed.unwrap_or_default(),
                        log,
                        Offset(0),
                        1,
                        LogFloor::default(),
                    )
                    .unwrap();
                for (index, term) in &acked {
                    if part.term_at(*index) == Some(*term) {
                        assert_eq!(
                            held.term_at(*index),
                            Some(*term),
                            "member {}: acknowledged append {index} lost",
                            member.id
                        );
                    }
                }
                let (_, votes) = block_on(VoteLog::open(image, Path::new(SHARD))).unwrap();
                let vote = votes.get(&self.handle).copied().unwrap_or_default();
                if let Some((term, candidate)) = granted.last() {
                    assert!(
                        vote.term > *term || (vote.term == *term && vote.vote == *candidate),
                        "member {}: vote for {candidate} in term {term} lost: {vote:?}",
                        member.id
                    );
                }
            }
        }
    }

    /// Crashes member `at`: drops its memory and keeps a crash image of its
    /// disk; returns the image (to restart it later).
    fn crash(&mut self, at: usize, mode: CrashMode) -> SimStorage {
        let member = &mut self.members[at];
        if let Some(driver) = member.driver.take() {
            let stats = driver.stats();
            self.totals.truncations += stats.truncations;
            self.totals.fetches += stats.fetches;
            driver.close();
        }
        member.tasks.clear();
        member.waiting.clear();
        self.wires.borrow_mut().acked.remove(&member.id);
        member.storage.crash_image(mode)
    }

    /// Restarts member `at` from `image`.
    fn restart(&mut self, at: usize, image: SimStorage) {
        let offset = 3 * at + self.rng.below(3) as usize;
        let id = self.members[at].id;
        let cache = self.cache_bytes;
        let (driver, tasks) = open_member(id, &image, self.handle, &self.wires, offset, cache);
        let member = &mut self.members[at];
        member.applied_to = driver.log().committed_index();
        member.storage = image;
        member.driver = Some(driver);
        member.tasks = tasks;
    }

    /// Proposes one data batch at member `at` if it leads; `true` if it
    /// was taken.
    fn propose(&mut self, at: usize) -> bool {
        self.tag += 1;
        let batch = payload(BatchKind::Data, 24 + (self.tag % 160) as usize, self.tag);
        let member = &mut self.members[at];
        let Some(driver) = member.driver.clone() else { return false };
        match driver.propose(&batch) {
            Ok(proposed) => {
                assert_eq!(driver.log().last_index(), proposed.index, "appended at once");
                let mut stamped = batch.clone();
                spool_wire::batch::BatchHeader::assign(
                    &mut stamped,
                    proposed.base_offset.0,
                    proposed.term as u32,
                );
                let waiting: Waiting = {
                    let driver = driver.clone();
                    let (index, term) = (proposed.index, proposed.term);
                    Box::pin(async move { driver.committed(index, term).await })
                };
                member.waiting.push((proposed.index, proposed.term, Bytes::from(stamped), waiting));
                true
            }
            Err(DriverError::NotLeader { .. } | DriverError::Busy) => false,
            Err(error) => panic!("member {}: propose: {error}", member.id),
        }
    }

    /// One step: ticks, deliveries, polls.
    fn tick(&mut self) {
        let step = {
            let mut wires = self.wires.borrow_mut();
            wires.step += 1;
            wires.step
        };
        if step.is_multiple_of(40) {
            self.check_crash_images();
        }
        for member in &self.members {
            if let Some(driver) = member.driver.as_ref() {
                if self.rng.below(2) == 0 {
                    driver.tick();
                }
            }
        }
        let due: Vec<Message> = {
            let mut wires = self.wires.borrow_mut();
            let (due, later) =
                std::mem::take(&mut wires.network).into_iter().partition(|(at, _)| *at <= step);
            wires.network = later;
            due.into_iter().map(|(_, message)| message).collect()
        };
        for message in due {
            if let Some(driver) = self.members[message.to as usize - 1].driver.as_ref() {
                driver.step(message);
            }
        }
        self.poll_all(4);
        for at in 0..self.members.len() {
            self.apply(at);
        }
    }

    fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|member| member.driver.as_ref().is_some_and(|driver| driver.role().0))
    }

    fn elect(&mut self) -> usize {
        for _ in 0..STEPS_MAX {
            self.tick();
            if let Some(at) = self.leader() {
                return at;
            }
        }
        panic!("no leader elected");
    }

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

    /// Steps until every member is up, has applied the leader's committed
    /// index and every proposal is answered.
    fn converge(&mut self) {
        for _ in 0..STEPS_MAX {
            self.tick();
            let Some(leader) = self.leader() else { continue };
            let part = self.members[leader].driver.as_ref().unwrap().log().clone();
            let (commit, last) = (part.committed_index(), part.last_index());
            let done = commit == last
                && self.members.iter().all(|member| {
                    member.waiting.is_empty()
                        && member.applied_to == commit
                        && member
                            .driver
                            .as_ref()
                            .is_some_and(|d| d.log().committed_index() == commit)
                });
            if done {
                return;
            }
        }
        panic!("the group did not converge");
    }

    /// Each member's journal, reopened from a durable-only image: its
    /// entries (index, term, stored bytes) and committed index.
    fn journals(&mut self) -> Vec<(Vec<Stored>, u64)> {
        let handle = self.handle;
        let mut out = Vec::new();
        for member in &mut self.members {
            let driver = member.driver.clone().unwrap();
            let mut persisting: Task = Box::pin(async move {
                driver.log().persist_committed().await.unwrap();
            });
            let mut tasks = std::mem::take(&mut member.tasks);
            for _ in 0..1000 {
                if block_on(poll_once(persisting.as_mut())).is_some() {
                    break;
                }
                for task in &mut tasks {
                    let _ = block_on(poll_once(task.as_mut()));
                }
            }
            member.tasks = tasks;
            let image = member.storage.crash_image(CrashMode::DurableOnly);
            let (shard, recovery) = open_shard(&image, JournalPos(0));
            let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
            let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
            let part = shard
                .replicated_partition(handle, routed, log, Offset(0), 1, LogFloor::default())
                .unwrap();
            let last = part.last_index();
            let mut entries = Vec::new();
            let mut background: Task = Box::pin(shard.background());
            let _ = block_on(poll_once(background.as_mut()));
            let mut next = 1;
            while next <= last {
                let read = block_on(part.read_entries(next, last + 1, 1 << 20)).unwrap();
                assert!(!read.is_empty());
                next += read.len() as u64;
                entries.extend(read.into_iter().map(|e| (e.index, e.term, e.batch.bytes.to_vec())));
            }
            out.push((entries, part.committed_index()));
        }
        out
    }
}

fn run_seed(seed: u64) -> Totals {
    let mut world = World::new(seed);
    world.elect();
    for _ in 0..4 {
        world.round(50);
    }
    let old = world.leader().unwrap_or_else(|| world.elect());
    let old_term = world.members[old].driver.as_ref().unwrap().role().1;
    if world.rng.below(3) != 0 {
        // A burst only the old leader holds: appended and durable on its
        // disk, never delivered to the others.
        for _ in 0..1 + world.rng.below(4) {
            world.propose(old);
        }
        world.poll_all(16);
        let from = old as u64 + 1;
        world.wires.borrow_mut().network.retain(|(_, message)| message.from != from);
    }
    let mode = if world.rng.below(2) == 0 {
        CrashMode::DurableOnly
    } else {
        CrashMode::PowerLoss { seed: world.rng.next() }
    };
    let image = world.crash(old, mode);
    world.round(40);
    let new = world.leader().unwrap();
    assert!(world.members[new].driver.as_ref().unwrap().role().1 > old_term);
    world.restart(old, image);
    world.round(10);
    world.converge();
    let journals = world.journals();
    let commit = journals.iter().map(|(_, commit)| *commit).max().unwrap();
    for (at, (entries, committed)) in journals.iter().enumerate() {
        assert_eq!(*committed, commit, "seed {seed}: member {} commit", at + 1);
        assert!(entries.len() as u64 >= commit);
        for (index, term, data) in &world.acknowledged {
            let (_, stored_term, stored) = &entries[*index as usize - 1];
            assert_eq!((*stored_term, &stored[..]), (*term, &data[..]), "seed {seed}: {index}");
        }
        assert_eq!(entries[..commit as usize], journals[0].0[..commit as usize], "seed {seed}");
        for (index, term, stored) in &entries[..commit as usize] {
            let (applied_term, data) = &world.applied[index];
            let entry = raft_entry(*index, *term, stored);
            assert_eq!((*term, &entry.data[..]), (*applied_term, &data[..]), "seed {seed}");
            if is_term_start(stored) {
                world.totals.term_starts += 1;
            }
        }
    }
    for member in &world.members {
        let stats = member.driver.as_ref().unwrap().stats();
        world.totals.truncations += stats.truncations;
        world.totals.fetches += stats.fetches;
    }
    world.totals.acknowledged = world.acknowledged.len();
    world.totals
}

#[test]
fn the_partition_log_serves_as_the_raft_log_through_a_leader_crash() {
    let mut all = Totals::default();
    for seed in 0..20 {
        let totals = run_seed(seed);
        assert!(totals.acknowledged >= 200, "seed {seed}: {} acknowledged", totals.acknowledged);
        assert!(totals.term_starts >= 2, "seed {seed}: two terms began");
        all.acknowledged += totals.acknowledged;
        all.truncations += totals.truncations;
        all.fetches += totals.fetches;
        all.term_starts += totals.term_starts;
    }
    println!(
        "20 seeds: {} acknowledged, {} truncations, {} read-backs, {} term starts stored",
        all.acknowledged, all.truncations, all.fetches, all.term_starts
    );
    assert!(all.truncations > 0, "no member ever truncated a conflicting suffix");
}
