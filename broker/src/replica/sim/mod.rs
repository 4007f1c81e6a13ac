//! A deterministic simulation of replica sets (`docs/design/replication.md`
//! §8), run by the tests below over many seeds.
//!
//! One thread, one seeded random source. Each node is a [`Replica`] with a
//! simulated disk: a durable log, vote and committed index, and the
//! operations (truncate, append, vote) handed to it and not yet synced. A
//! sync makes them durable and only then tells the replica and sends the
//! messages that needed the disk; a crash keeps a random prefix of them
//! (power loss) and the node restarts from its disk. The network drops,
//! duplicates, delays (so reorders) and partitions messages.
//!
//! The checker ([`check`]) holds after every step: at most one leader per
//! term; every entry applied anywhere at an index is the same entry
//! (index, term, bytes); on restart a node's committed prefix is that same
//! history. At the end the network heals, every node comes back, and a new
//! proposal must commit and be applied everywhere within a bound, with
//! every acknowledged proposal in every node's log.
//!
//! A run may also replace a member ([`World::with_replacement`]): one
//! voter dies for good mid-run and a spare node takes its place by three
//! membership changes (learner, voter, the dead one removed), proposed by
//! whichever member leads, under the same faults; each member starts from
//! the group's initial members with its committed changes folded in, as a
//! restarted partition does. Such runs never let go of the log (the
//! simulation ships no snapshots, and the spare catches up from the first
//! entry).

mod check;

use std::collections::BTreeMap;

use bytes::Bytes;
use raft::eraftpb::{Entry, Message};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::limits::REPLICA_ELECTION_TICKS;
use super::{KnownTerms, Members, MembershipChange, Recovered, Replica, Timing};
use check::Checker;

/// How hostile one run is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    pub delay_max: u64,
    pub crash: f64,
    pub partition: f64,
}

impl Faults {
    pub(super) const HOSTILE: Faults =
        Faults { drop: 0.05, duplicate: 0.02, delay_max: 6, crash: 0.004, partition: 0.004 };
}

#[derive(Debug)]
enum Op {
    Truncate(u64),
    Append(Entry),
    Vote(u64, u64),
}

#[derive(Debug, Default)]
struct Disk {
    log: Vec<Entry>,
    vote: (u64, u64),
    commit: u64,
    /// The index the log was let go of up to (a checkpoint covers it and
    /// every member holds it): a restart starts after it.
    floor: u64,
}

impl Disk {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Truncate(from) => self.log.truncate(from.saturating_sub(1) as usize),
            Op::Append(entry) => {
                assert_eq!(entry.index, self.log.len() as u64 + 1, "the disk's log stays dense");
                self.log.push(entry);
            }
            Op::Vote(term, vote) => self.vote = (term, vote),
        }
    }
}

#[derive(Debug)]
struct Node {
    id: u64,
    replica: Option<Replica>,
    disk: Disk,
    pending: Vec<Op>,
    /// Works handed out and not yet synced: their number and the messages
    /// that wait for the sync.
    unsynced: Vec<(u64, Vec<Message>)>,
    /// The committed index the replica last handed out.
    commit: u64,
    /// Proposals made here: (index, term) → bytes, answered when applied.
    proposed: BTreeMap<u64, (u64, Bytes)>,
}

impl Node {
    /// The log as it is now, durable or not (what a read-back sees).
    fn memory_log(&self) -> Vec<Entry> {
        let mut disk = Disk { log: self.disk.log.clone(), ..Disk::default() };
        for op in &self.pending {
            match op {
                Op::Truncate(from) => disk.apply(Op::Truncate(*from)),
                Op::Append(entry) => disk.apply(Op::Append(entry.clone())),
                Op::Vote(..) => {}
            }
        }
        disk.log
    }
}

/// One simulated replica set.
pub(super) struct World {
    rng: ChaCha8Rng,
    faults: Faults,
    nodes: Vec<Node>,
    /// The group's initial voters, then learners (they get every entry and
    /// never vote nor count for a commit); changes in the log alter them.
    members: Members,
    /// Nodes that died for good: never restarted.
    retired: Vec<bool>,
    /// (dying voter, spare node, the step it dies at) of a replacement run.
    replacement: Option<(u64, u64, u64)>,
    /// (deliver at step, message)
    network: Vec<(u64, Message)>,
    /// Partition group of each node (same group: connected).
    groups: Vec<u8>,
    step: u64,
    next_payload: u64,
    /// Applied entry bytes each replica keeps: small in half the seeds, so
    /// lagging followers are served by read-backs of the log.
    cache_bytes: usize,
    pub(super) check: Checker,
}

impl World {
    pub(super) fn new(seed: u64, nodes: u64, faults: Faults) -> World {
        World::with_learners(seed, nodes, 0, faults)
    }

    /// A set of `voters` voters (ids `1..=voters`) and `learners` learners
    /// (the ids after them).
    pub(super) fn with_learners(seed: u64, voters: u64, learners: u64, faults: Faults) -> World {
        let members = Members {
            voters: (1..=voters).collect(),
            learners: (voters + 1..=voters + learners).collect(),
        };
        World::build(seed, members, 0, faults)
    }

    /// Three voters, of which one (at random) dies for good at a random
    /// step of the first 800, and a spare node (id 4, in no configuration
    /// at the start) that replaces it (module docs).
    pub(super) fn with_replacement(seed: u64, faults: Faults) -> World {
        let mut world = World::build(seed, Members::voters(&[1, 2, 3]), 1, faults);
        let dying = world.rng.random_range(1..=3);
        let at = world.rng.random_range(100..800);
        world.replacement = Some((dying, 4, at));
        world
    }

    fn build(seed: u64, members: Members, spares: u64, faults: Faults) -> World {
        let nodes = members.all().count() as u64 + spares;
        let mut world = World {
            rng: ChaCha8Rng::seed_from_u64(seed),
            faults,
            nodes: Vec::new(),
            members: members.clone(),
            retired: vec![false; nodes as usize],
            replacement: None,
            network: Vec::new(),
            groups: vec![0; nodes as usize],
            step: 0,
            next_payload: 0,
            cache_bytes: if seed.is_multiple_of(2) { 256 } else { usize::MAX },
            check: Checker::default(),
        };
        for id in 1..=nodes {
            world.nodes.push(Node {
                id,
                replica: None,
                disk: Disk::default(),
                pending: Vec::new(),
                unsynced: Vec::new(),
                commit: 0,
                proposed: BTreeMap::new(),
            });
            world.restart(id as usize - 1);
        }
        world
    }

    fn restart(&mut self, at: usize) {
        let node = &mut self.nodes[at];
        // The applied prefix stays on disk (terms only), as a reopened
        // partition's: a follower that needs it is served by read-backs.
        let applied = node.disk.commit.min(node.disk.log.len() as u64) as usize;
        let floor = node.disk.floor.min(applied as u64) as usize;
        let floor_term = floor.checked_sub(1).map_or(0, |at| node.disk.log[at].term);
        let mut known = KnownTerms { runs: Vec::new(), through: applied as u64 };
        for entry in &node.disk.log[floor..applied] {
            if known.runs.last().is_none_or(|run| run.1 != entry.term) {
                known.runs.push((entry.index, entry.term));
            }
        }
        let recovered = Recovered {
            abstain_ticks: 0,
            floor: (floor as u64, floor_term),
            known,
            entries: node.disk.log[applied..].to_vec(),
            term: node.disk.vote.0,
            vote: node.disk.vote.1,
            commit: node.disk.commit,
            applied: node.disk.commit,
        };
        // The state machine is rebuilt from the committed prefix.
        let prefix = node.disk.commit.min(node.disk.log.len() as u64) as usize;
        self.check.restarted(node.id, &node.disk.log[..prefix]);
        // Fixed timeouts, a little apart per member: raft-rs's own random
        // draw is not seeded; the members desynchronize by their ticks.
        let timing = Timing::Fixed { offset: self.rng.random_range(0..REPLICA_ELECTION_TICKS) };
        // The initial members with the committed changes folded in.
        let members = self
            .members
            .after(&node.disk.log[..prefix])
            .unwrap_or_else(|error| panic!("node {} restart: {error}", node.id));
        let replica = Replica::start_timed(node.id, &members, recovered, timing)
            .unwrap_or_else(|error| panic!("node {} restart: {error}", node.id));
        let mut replica = replica;
        replica.set_cache_bytes(self.cache_bytes);
        node.commit = node.disk.commit;
        node.replica = Some(replica);
        node.proposed.clear();
    }

    /// Node `at` lets go of its log as far as it may (a checkpoint covers
    /// its applied index; `Replica::compact` keeps to the group floor),
    /// checked against every node's durable log.
    fn compact(&mut self, at: usize) {
        let node = &mut self.nodes[at];
        let Some(replica) = node.replica.as_mut() else { return };
        let from = node.disk.floor;
        let to = replica.compact(u64::MAX);
        if to <= from {
            return;
        }
        // Applied entries are durable here: the floor is too.
        node.disk.floor = to;
        node.disk.commit = node.disk.commit.max(to);
        let id = node.id;
        let logs: Vec<(u64, &[Entry])> =
            self.nodes.iter().map(|node| (node.id, node.disk.log.as_slice())).collect();
        self.check.let_go(id, from, to, &logs);
    }

    fn crash(&mut self, at: usize) {
        let keep = self.rng.random_range(0..=self.nodes[at].pending.len());
        let node = &mut self.nodes[at];
        for op in node.pending.drain(..).take(keep) {
            node.disk.apply(op);
        }
        node.unsynced.clear();
        node.replica = None;
        self.check.crashed(node.id);
    }

    fn sync(&mut self, at: usize) {
        let node = &mut self.nodes[at];
        let Some(replica) = node.replica.as_mut() else { return };
        for op in node.pending.drain(..) {
            node.disk.apply(op);
        }
        node.disk.commit = node.disk.commit.max(node.commit.min(node.disk.log.len() as u64));
        let Some(&(number, _)) = node.unsynced.last() else { return };
        replica.persisted(number);
        let messages: Vec<Message> =
            node.unsynced.drain(..).flat_map(|(_, messages)| messages).collect();
        self.send(messages);
    }

    fn send(&mut self, messages: Vec<Message>) {
        for message in messages {
            if self.rng.random_bool(self.faults.drop) {
                continue;
            }
            let copies = if self.rng.random_bool(self.faults.duplicate) { 2 } else { 1 };
            for _ in 0..copies {
                let at = self.step + self.rng.random_range(1..=self.faults.delay_max);
                self.network.push((at, message.clone()));
            }
        }
    }

    fn deliver(&mut self) {
        let step = self.step;
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.network).into_iter().partition(|(at, _)| *at <= step);
        self.network = later;
        for (_, message) in due {
            let (from, to) = (message.from as usize - 1, message.to as usize - 1);
            if self.groups[from] != self.groups[to] {
                continue;
            }
            if let Some(replica) = self.nodes[to].replica.as_mut() {
                // A message raft-rs refuses (a stale kind) is dropped.
                let _ = replica.step(message);
            }
        }
    }

    fn propose(&mut self, at: usize) {
        self.next_payload += 1;
        let payload = Bytes::from(format!("p{}-n{}", self.next_payload, at + 1).into_bytes());
        let node = &mut self.nodes[at];
        let Some(replica) = node.replica.as_mut() else { return };
        if let Ok((index, term)) = replica.propose(payload.to_vec()) {
            node.proposed.insert(index, (term, payload));
        }
    }

    /// Drains every node's works: sends, applies, queues disk operations.
    fn drive(&mut self) {
        for at in 0..self.nodes.len() {
            loop {
                let node = &mut self.nodes[at];
                let Some(fetches) = node.replica.as_mut().map(Replica::fetches) else { break };
                for fetch in fetches {
                    self.check.fetches += 1;
                    let entries: Vec<Entry> = node
                        .memory_log()
                        .into_iter()
                        .filter(|entry| entry.index >= fetch.low && entry.index < fetch.high)
                        .collect();
                    if let Some(replica) = node.replica.as_mut() {
                        replica.fetched(fetch, entries);
                    }
                }
                let Some(replica) = node.replica.as_mut() else { break };
                let work = match replica.work() {
                    Ok(Some(work)) => work,
                    Ok(None) => break,
                    Err(error) => panic!("node {}: {error}", node.id),
                };
                if let Some(last) = work.apply.last().map(|entry| entry.index) {
                    for entry in &work.apply {
                        self.check.applied(node.id, entry);
                        replica.apply_membership(entry).unwrap_or_else(|error| {
                            panic!("node {}: {error}", node.id);
                        });
                        if let Some((term, bytes)) = node.proposed.remove(&entry.index) {
                            if term == entry.term && bytes == entry.data {
                                self.check.acknowledged(entry);
                            }
                        }
                    }
                    replica.applied(last);
                }
                if let Some(from) = work.truncate_from {
                    node.pending.push(Op::Truncate(from));
                }
                node.pending.extend(work.entries.into_iter().map(Op::Append));
                if let Some((term, vote)) = work.vote {
                    node.pending.push(Op::Vote(term, vote));
                }
                if let Some(commit) = work.commit {
                    node.commit = node.commit.max(commit);
                }
                node.unsynced.push((work.number, work.send_persisted));
                self.send(work.send);
            }
            if let Some(replica) = self.nodes[at].replica.as_ref() {
                let leads = replica.is_leader();
                assert!(
                    !leads || replica.membership().voters.contains(&replica.id()),
                    "{} leads in term {} and is no voter of {:?}",
                    replica.id(),
                    replica.term(),
                    replica.membership()
                );
                self.check.role(replica.id(), replica.term(), leads);
            }
        }
    }

    /// One step of the run: faults (while `hostile`), ticks, proposals,
    /// syncs, deliveries, then every node's works.
    pub(super) fn step(&mut self, hostile: bool) {
        self.step += 1;
        let count = self.nodes.len();
        if hostile && self.rng.random_bool(self.faults.crash) {
            let at = self.rng.random_range(0..count);
            if self.nodes[at].replica.is_some() {
                self.crash(at);
            }
        }
        if let Some((dying, _, at_step)) = self.replacement {
            let at = dying as usize - 1;
            if self.step == at_step {
                if self.nodes[at].replica.is_some() {
                    self.crash(at);
                }
                self.retired[at] = true;
            }
        }
        for at in 0..count {
            if self.nodes[at].replica.is_none() && !self.retired[at] && self.rng.random_bool(0.02) {
                self.restart(at);
            }
        }
        if hostile && self.rng.random_bool(self.faults.partition) {
            for group in &mut self.groups {
                *group = self.rng.random_range(0..2);
            }
        }
        if !hostile || self.rng.random_bool(0.01) {
            self.groups.iter_mut().for_each(|group| *group = 0);
        }
        for node in &mut self.nodes {
            // Each member's clock runs on its own (about one tick in two
            // steps), so equal timeouts still part.
            if let Some(replica) = node.replica.as_mut() {
                if self.rng.random_bool(0.5) {
                    replica.tick();
                }
            }
        }
        if self.rng.random_bool(0.3) {
            let at = self.rng.random_range(0..count);
            self.propose(at);
        }
        if self.replacement.is_none() && self.rng.random_bool(0.05) {
            let at = self.rng.random_range(0..count);
            self.compact(at);
        }
        self.replace_step();
        for at in 0..count {
            if self.rng.random_bool(0.3) {
                self.sync(at);
            }
        }
        self.deliver();
        self.drive();
    }

    /// The members a replacement run ends with: the dead voter's place
    /// taken by the spare.
    fn replaced(&self) -> Option<Members> {
        let (dying, spare, _) = self.replacement?;
        Some(
            self.members
                .changed(MembershipChange::AddVoter(spare))
                .changed(MembershipChange::Remove(dying)),
        )
    }

    /// A replacement run's controller: once the voter died, whichever live
    /// member leads proposes the next change its members need (the spare
    /// as a learner; once it holds everything committed, as a voter; then
    /// the dead one removed), one at a time.
    fn replace_step(&mut self) {
        let Some((dying, spare, at_step)) = self.replacement else { return };
        if self.step < at_step {
            return;
        }
        let Some(leader) = self
            .nodes
            .iter_mut()
            .filter_map(|node| node.replica.as_mut())
            .find(|replica| replica.is_leader())
        else {
            return;
        };
        if leader.membership_pending() {
            return;
        }
        let members = leader.membership();
        let change = if !members.all().any(|id| id == spare) {
            MembershipChange::AddLearner(spare)
        } else if members.learners.contains(&spare) {
            if !leader.caught_up(spare) {
                return;
            }
            MembershipChange::AddVoter(spare)
        } else if members.all().any(|id| id == dying) {
            MembershipChange::Remove(dying)
        } else {
            return;
        };
        if leader.propose_membership(change).is_ok() {
            self.check.membership_changes += 1;
        }
    }

    /// Heals everything, then proposes until one proposal is applied on
    /// every node; panics past `steps_max` steps.
    pub(super) fn converge(&mut self, steps_max: u64) {
        self.groups.iter_mut().for_each(|group| *group = 0);
        for at in 0..self.nodes.len() {
            if self.nodes[at].replica.is_none() && !self.retired[at] {
                self.restart(at);
            }
        }
        let start = self.step;
        let acknowledged_before = self.check.acknowledged_count();
        loop {
            assert!(
                self.step - start <= steps_max,
                "no progress {steps_max} steps after healing: leaders {:?}, commits {:?}",
                self.nodes
                    .iter()
                    .map(|node| node.replica.as_ref().map(Replica::leader))
                    .collect::<Vec<_>>(),
                self.nodes.iter().map(|node| node.commit).collect::<Vec<_>>(),
            );
            if self.step - start == steps_max {
                // What the failure message needs: each node's disk, floors
                // and, on a leader, its followers' progress.
                for node in &self.nodes {
                    let replica = node.replica.as_ref();
                    let progress = replica.filter(|r| r.is_leader()).map(|r| {
                        let prs = r.raw.raft.prs().iter();
                        prs.map(|(id, p)| (*id, p.matched, p.next_idx)).collect::<Vec<_>>()
                    });
                    eprintln!(
                        "node {}: disk floor {} commit {} log {}; group floor {:?}, view floor \
                         {:?}, (id, matched, next) {progress:?}",
                        node.id,
                        node.disk.floor,
                        node.disk.commit,
                        node.disk.log.len(),
                        replica.map(Replica::group_floor),
                        replica.map(|r| r.raw.store().floor()),
                    );
                }
            }
            self.step(false);
            let live = || self.nodes.iter().filter(|node| !self.retired[node.id as usize - 1]);
            let all_up = live().all(|node| node.replica.is_some());
            let newest = self.check.acknowledged_last();
            let everywhere = newest
                .is_some_and(|index| live().all(|node| self.check.applied_to(node.id) >= index));
            let replaced = self.replaced().is_none_or(|members| {
                live().all(|node| {
                    node.replica.as_ref().map(Replica::membership) == Some(members.clone())
                })
            });
            if all_up
                && self.check.acknowledged_count() > acknowledged_before
                && everywhere
                && replaced
            {
                break;
            }
        }
        for node in &self.nodes {
            if !self.retired[node.id as usize - 1] {
                let log = node.memory_log();
                self.check.holds_acknowledged(node.id, &log);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds per replica-set size in an ordinary run; `SPOOL_SIM_SEEDS`
    /// sets another count (long runs are opt-in).
    fn seeds() -> u64 {
        std::env::var("SPOOL_SIM_SEEDS").ok().and_then(|value| value.parse().ok()).unwrap_or(1_000)
    }

    fn run(nodes: u64, seed: u64) -> Checker {
        let mut world = World::new(seed, nodes, Faults::HOSTILE);
        for _ in 0..1_500 {
            world.step(true);
        }
        world.converge(3_000);
        world.check
    }

    #[test]
    fn three_replicas_keep_every_acknowledged_entry_through_faults() {
        let mut totals = (0, 0, 0, 0, 0);
        for seed in 0..seeds() {
            let check = run(3, seed);
            totals.0 += check.acknowledged_count();
            totals.1 += check.crashes;
            totals.2 += check.leaders_seen();
            totals.3 += check.fetches;
            totals.4 += check.compactions;
        }
        eprintln!(
            "{} seeds: {} acknowledged, {} crashes, {} terms with a leader, {} read-backs, \
             {} compactions",
            seeds(),
            totals.0,
            totals.1,
            totals.2,
            totals.3,
            totals.4
        );
        // The faults bit and work still got done: a run where nothing was
        // acknowledged or nothing crashed would check nothing.
        assert!(totals.0 > 10 * seeds() as usize, "acknowledged {} in all", totals.0);
        assert!(totals.1 > seeds() as usize / 2, "{} crashes in all", totals.1);
        assert!(totals.2 > seeds() as usize, "{} leaders in all", totals.2);
        assert!(totals.3 > seeds() as usize / 10, "{} read-backs in all", totals.3);
        assert!(totals.4 > seeds() as usize, "{} compactions in all", totals.4);
    }

    #[test]
    fn five_replicas_keep_every_acknowledged_entry_through_faults() {
        for seed in 0..seeds() / 2 {
            let check = run(5, 1_000 + seed);
            assert!(check.acknowledged_count() > 0, "seed {seed}: nothing acknowledged");
        }
    }

    /// Three voters and two learners: the learners hold every acknowledged
    /// entry once healed and never lead, and an entry counts as committed
    /// only on a majority of the voters (were the learners counted, a
    /// voter's power loss would lose acknowledged entries that the
    /// converged logs are checked for).
    #[test]
    fn learners_follow_every_acknowledged_entry_and_never_lead() {
        let mut acknowledged = 0;
        for seed in 0..seeds() / 4 {
            let mut world = World::with_learners(2_000 + seed, 3, 2, Faults::HOSTILE);
            for _ in 0..1_500 {
                world.step(true);
            }
            world.converge(3_000);
            acknowledged += world.check.acknowledged_count();
            for learner in [4, 5] {
                assert!(
                    world.check.applied_to(learner) >= world.check.acknowledged_last().unwrap_or(0),
                    "seed {seed}: learner {learner} behind"
                );
            }
        }
        assert!(acknowledged > seeds() as usize, "acknowledged {acknowledged} in all");
    }

    /// A voter dies for good and a spare takes its place by three
    /// membership changes under the hostile faults: every acknowledged
    /// entry survives (the checker), every live member ends with the new
    /// voters, and only voters lead. Run with members restarted from the
    /// initial configuration (their committed changes not folded in) and
    /// the group never converges ("no progress 4000 steps after healing").
    #[test]
    fn a_dead_voter_is_replaced_by_membership_changes_without_losing_an_entry() {
        let (mut acknowledged, mut changes) = (0, 0);
        for seed in 0..seeds() / 4 {
            let mut world = World::with_replacement(3_000 + seed, Faults::HOSTILE);
            for _ in 0..1_500 {
                world.step(true);
            }
            world.converge(4_000);
            acknowledged += world.check.acknowledged_count();
            changes += world.check.membership_changes;
            let (dying, spare, _) = world.replacement.unwrap_or_default();
            let spare_log = world.nodes[spare as usize - 1].memory_log();
            assert!(
                world.check.applied_to(spare) >= world.check.acknowledged_last().unwrap_or(0),
                "seed {seed}: spare {spare} behind (log {})",
                spare_log.len()
            );
            assert!(world.retired[dying as usize - 1]);
        }
        eprintln!("{} runs: {acknowledged} acknowledged, {changes} changes proposed", seeds() / 4);
        assert!(changes >= 3 * (seeds() / 4) as usize, "{changes} changes in all");
        assert!(acknowledged > seeds() as usize, "acknowledged {acknowledged} in all");
    }

    #[test]
    fn the_same_seed_runs_the_same() {
        let first = run(3, 7);
        let second = run(3, 7);
        assert_eq!(first.fingerprint(), second.fingerprint());
    }
}
