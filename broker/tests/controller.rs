//! The controller (`broker/src/control/controller.rs`): three members of
//! the catalog's Raft group on one glommio executor, each with its own
//! journal and vote log on a simulated disk, the messages carried in
//! memory. Queues created and deleted at the leader reach every member
//! with the same ids and versions; a follower refuses; the leader killed,
//! a new one continues the ids without reuse; the killed member restarts
//! from its disk's crash image and folds to the same table; an entry
//! planned on a stale state is skipped by every member alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod journal_common;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use raft::eraftpb::Message;
use spool_broker::control::assignment::{
    AssignmentChange, AssignmentUpdate, AssignmentVersion, QueueName,
};
use spool_broker::control::controller::{
    decode_update, encode_update, Controller, ControllerError, ControllerState, Skipped,
    CONTROLLER_GROUP,
};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{JournalPos, LogFloor, ShardJournal};
use spool_broker::log::vote::VoteLog;
use spool_broker::log::{Offset, RecordFatal};
use spool_broker::queue::{PartitionId, QueueConfig, QueueId};
use spool_broker::replica::{Members, ReplicaDriver, Timing};

const VOTERS: [u64; 3] = [1, 2, 3];
const DIR: &str = "/controller";
const SHARDS: u16 = 4;

type Network = Rc<RefCell<VecDeque<Message>>>;

async fn open_member(
    id: u64,
    storage: &SimStorage,
    network: &Network,
) -> Rc<Controller<SimStorage>> {
    let fatal = Rc::new(RecordFatal::default());
    let (shard, recovery) = ShardJournal::open(
        storage.clone(),
        Path::new(DIR),
        journal_common::small_config(),
        JournalPos(0),
        fatal,
    )
    .await
    .unwrap();
    let handle = shard
        .register(CONTROLLER_GROUP.queue, PartitionId(CONTROLLER_GROUP.partition))
        .await
        .unwrap();
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
    let part = Rc::new(
        shard.replicated_partition(handle, routed, log, Offset(0), 0, LogFloor::default()).unwrap(),
    );
    glommio::spawn_local(shard.background()).detach();
    let (votes, _) = VoteLog::open(storage.clone(), Path::new(DIR)).await.unwrap();
    let sink = network.clone();
    let send: Rc<dyn Fn(Message)> = Rc::new(move |message| sink.borrow_mut().push_back(message));
    let timing = Timing::Fixed { offset: 3 * id as usize };
    let driver =
        ReplicaDriver::open(id, Members::voters(&VOTERS), part, Rc::new(votes), 0, timing, send)
            .await
            .unwrap();
    glommio::spawn_local(driver.clone().pump()).detach();
    Controller::new(driver, SHARDS)
}

struct Group {
    storages: Vec<SimStorage>,
    members: Vec<Option<Rc<Controller<SimStorage>>>>,
    network: Network,
    /// Every update each member handed out, in order.
    handed: Vec<Vec<AssignmentUpdate>>,
}

impl Group {
    async fn round(&mut self) {
        let messages: Vec<Message> = self.network.borrow_mut().drain(..).collect();
        for message in messages {
            if let Some(member) = &self.members[message.to as usize - 1] {
                member.driver().step(message);
            }
        }
        for (at, member) in self.members.iter().enumerate() {
            let Some(member) = member else { continue };
            member.driver().tick();
            member.fold_committed().unwrap();
            self.handed[at].extend(member.take_applied());
        }
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }

    async fn until(&mut self, what: &str, done: impl Fn(&Group) -> bool) {
        for _ in 0..5_000 {
            if done(self) {
                return;
            }
            self.round().await;
        }
        panic!("never: {what}");
    }

    /// A member that leads and has folded its term's start.
    fn leader(&self) -> Option<usize> {
        self.members.iter().position(|member| {
            member.as_ref().is_some_and(|m| {
                let (leads, term, _) = m.driver().role();
                leads && m.driver().log().committed_index() > 0 && {
                    let last = m.driver().log().committed_index();
                    m.driver().log().term_at(last) == Some(term)
                }
            })
        })
    }

    /// Runs a proposal at member `at` while the group keeps moving.
    async fn run<T>(&mut self, work: impl std::future::Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            if let Some(done) = futures_lite::future::poll_once(work.as_mut()).await {
                return done;
            }
            self.round().await;
        }
    }
}

fn name(text: &str) -> QueueName {
    QueueName::new(text).unwrap()
}

#[test]
fn the_catalog_is_the_same_on_every_member_through_a_leader_kill() {
    LocalExecutorBuilder::new(Placement::Unbound).io_memory(0).make().expect("executor").run(
        async {
            let network: Network = Rc::default();
            let mut group = Group {
                storages: Vec::new(),
                members: Vec::new(),
                network: network.clone(),
                handed: vec![Vec::new(); 3],
            };
            for id in VOTERS {
                let storage = SimStorage::new();
                group.members.push(Some(open_member(id, &storage, &network).await));
                group.storages.push(storage);
            }
            group.until("a leader", |g| g.leader().is_some()).await;
            let leader = group.leader().unwrap();
            let lead = group.members[leader].clone().unwrap();
            let config = Arc::new(QueueConfig::default());

            // A follower refuses.
            let follower = group.members[(leader + 1) % 3].clone().unwrap();
            let refused = follower.create_queue(name("nope"), 2, config.clone()).await;
            assert!(matches!(refused, Err(ControllerError::NotLeader { .. })), "{refused:?}");

            for at in 0..5 {
                let created = lead.create_queue(name(&format!("q{at}")), 3, config.clone());
                let update = group.run(created).await.unwrap();
                assert_eq!(update.version, AssignmentVersion(at + 1));
            }
            // An existing name is refused by the table, and takes no id.
            let again = group.run(lead.create_queue(name("q1"), 1, config.clone())).await;
            assert!(matches!(again, Err(ControllerError::Refused(_))), "{again:?}");
            group.run(lead.delete_queue(name("q0"))).await.unwrap();

            // Kill the leader; the others continue the ids.
            let image = group.storages[leader].crash_image(CrashMode::DurableOnly);
            group.members[leader].take().unwrap().driver().close();
            drop(lead);
            group.until("a new leader", |g| g.leader().is_some_and(|at| at != leader)).await;
            let lead = group.members[group.leader().unwrap()].clone().unwrap();
            for at in 5..8 {
                group
                    .run(lead.create_queue(name(&format!("q{at}")), 2, config.clone()))
                    .await
                    .unwrap();
            }
            let state = lead.state().clone();
            assert_eq!(state.next_queue_id, 9, "ids 1..=8, none reused");
            assert_eq!(state.table.version(), AssignmentVersion(9));
            assert!(state.table.queue(&name("q0")).is_none());
            assert_eq!(state.table.queue(&name("q7")).unwrap().id, QueueId(8));

            // The killed member restarts from its crash image and folds to
            // the same table.
            group.members[leader] = Some(open_member(leader as u64 + 1, &image, &network).await);
            group.storages[leader] = image;
            group.handed[leader].clear();
            group
                .until("every member's table", |g| {
                    g.members.iter().all(|m| *m.as_ref().unwrap().state() == state)
                })
                .await;
            // Every member handed out the same updates in the same order
            // (the restarted one: all of them again, from its log).
            let survivors: Vec<_> = (0..3).filter(|at| *at != leader).collect();
            assert_eq!(group.handed[survivors[0]], group.handed[survivors[1]]);
            assert_eq!(group.handed[leader], group.handed[survivors[0]]);
            assert_eq!(group.handed[leader].len(), 9);
        },
    );
}

#[test]
fn an_update_planned_on_a_stale_state_is_skipped_by_every_member_alike() {
    // Goal: the fold is deterministic about what it skips: a version that
    // does not follow, an id that is not the next, a change the table
    // refuses. Method: apply each to a state and check it is unchanged.
    let config = Arc::new(QueueConfig::default());
    let mut state = ControllerState::new(SHARDS);
    let first = state.table.plan_create_queue(name("a"), QueueId(1), 2, config.clone()).unwrap();
    state.apply(&first).unwrap();
    let before = state.clone();
    let stale = AssignmentUpdate { version: AssignmentVersion(1), ..first.clone() };
    assert_eq!(state.apply(&stale), Err(Skipped::Version { table: 1, update: 1 }));
    let wrong_id = state.table.plan_create_queue(name("b"), QueueId(5), 2, config.clone()).unwrap();
    assert_eq!(state.apply(&wrong_id), Err(Skipped::QueueId { expected: 2, got: 5 }));
    let exists = AssignmentUpdate {
        version: AssignmentVersion(2),
        change: AssignmentChange::CreateQueue {
            subscriptions: Default::default(),
            queue: name("a"),
            queue_id: QueueId(2),
            shards: vec![spool_broker::control::assignment::ShardId(0)],
            config,
            keys: spool_broker::control::assignment::KeyPlacement::fresh(1),
            replicas: Default::default(),
        },
    };
    assert!(matches!(state.apply(&exists), Err(Skipped::Refused(_))));
    assert_eq!(state, before);
    // And an update round-trips through its stored batch.
    assert_eq!(decode_update(&encode_update(&first).unwrap()).unwrap(), first);
    let delete = state.table.plan_delete_queue(name("a")).unwrap();
    assert_eq!(decode_update(&encode_update(&delete).unwrap()).unwrap(), delete);
    assert!(decode_update(b"not a batch").is_err());
}
