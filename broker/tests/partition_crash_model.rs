//! A crash model of one partition on the simulated disk: concurrent
//! producers, consumers (claim, ack, release, extend), housekeeping ticks and
//! checkpoints run against one partition; the disk's hook takes a crash
//! image at a random operation, together with what the clients had been
//! answered by then; the image is reopened and checked against that
//! knowledge; and the next round runs on the reopened partition, so crashes
//! chain as they do in the kill loop.
//!
//! The contract checked after every reopen:
//! - every enqueue that was answered is live, dead-lettered, or acked (an ack
//!   in flight at the crash may or may not have been applied);
//! - every ack that was answered is applied: its message is neither live nor
//!   dead-lettered;
//! - no claim in any round delivers a message whose ack was answered before
//!   the claim was sent, and each delivered record is the one enqueued at
//!   its offset.
//!
//! Crash images are mostly what a killed process leaves (every written byte
//! readable, unsynced ones not yet durable: `process_crash_image`), as the
//! kill loop does with SIGKILL, and sometimes what a power loss leaves.
//! Everything is seeded; a failure names its seed and round.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod common;
mod partition_layout;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;

use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::{Clock, EnqueueOutcome, Partition, PartitionName};
use spool_broker::queue::{
    ClaimRequest, DeliveryToken, Lane, PartitionId, QueueConfig, QueueId, ReleaseReason, WorkerId,
};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};

const START_MS: u64 = 1_700_000_000_000;
/// Seeds run by default; `SPOOL_CRASH_MODEL_SEEDS` raises it for a soak.
const SEEDS_DEFAULT: u64 = 40;
/// Crash-and-reopen rounds per seed.
const ROUNDS: usize = 5;

/// A small, seeded generator (xorshift64*): the test must repeat exactly.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the clients know: only answers count.
#[derive(Clone, Debug, Default)]
struct Model {
    /// Answered enqueues: offset → message id.
    enqueued: BTreeMap<u64, u64>,
    /// Offsets whose ack was answered with success.
    acked: BTreeSet<u64>,
    /// Offsets with an ack sent and not (yet) answered: may be applied.
    ack_unknown: BTreeSet<u64>,
}

fn log_config() -> LogConfig {
    // Small segments and commits: rolls, retention and several commits in
    // flight happen within a round.
    LogConfig {
        segment_bytes: 256 * 1024,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 64 * 1024,
        inflight_commits_max: 2,
        pending_bytes_max: 256 * 1024,
        data_pending_bytes_max: 128 * 1024,
        tail_cache_bytes: 64 * 1024,
    }
}

fn queue_config() -> QueueConfig {
    // A few deliveries before quarantine, so releases dead-letter some.
    QueueConfig { max_deliveries: 4, ..QueueConfig::default() }
}

fn clock(now: &Rc<Cell<u64>>) -> Clock {
    let now = now.clone();
    Rc::new(move || now.get())
}

fn message_id(id: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&id.to_le_bytes());
    bytes[8..].copy_from_slice(&(!id).to_le_bytes());
    bytes
}

fn batch(first: u64, count: u64, now_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for id in first..first + count {
        builder
            .push(&Record {
                message_id: MessageId(message_id(id)),
                routing_key: vec![],
                headers: vec![],
                payload: Payload::Inline(payload(id)),
                priority: (id % 3) as u8,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: now_ms,
            })
            .unwrap();
    }
    builder.finish().unwrap()
}

/// Marks the id inside a record's payload (the record is archived with rkyv,
/// whose payload bytes appear verbatim).
const ID_MARK: &[u8; 8] = b"SPOOLID:";

fn payload(id: u64) -> Vec<u8> {
    let mut bytes = ID_MARK.to_vec();
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&(!id).to_le_bytes());
    bytes
}

/// The id a delivered record carries in its payload.
fn id_of(record: &[u8]) -> Option<u64> {
    let at = record.windows(ID_MARK.len()).position(|window| window == ID_MARK)?;
    let id = u64::from_le_bytes(record.get(at + 8..at + 16)?.try_into().ok()?);
    let check = u64::from_le_bytes(record.get(at + 16..at + 24)?.try_into().ok()?);
    (check == !id).then_some(id)
}

type Opened = (Rc<Partition<SimStorage>>, glommio::task::JoinHandle<()>);

async fn open(
    layout: Layout,
    disk: &SimStorage,
    now: &Rc<Cell<u64>>,
    context: &str,
    stats: &Stats,
) -> Opened {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let (partition, background, report) = open_partition(
        layout,
        disk.clone(),
        Path::new("/data/p0"),
        name,
        queue_config(),
        log_config(),
        Rc::new(RecordFatal::default()),
        clock(now),
    )
    .await
    .unwrap_or_else(|error| panic!("{context}: reopen failed: {error}"));
    stats.fenced.set(stats.fenced.get() + report.fenced_claims);
    let task = glommio::spawn_local(background.into_future()).detach();
    (partition, task)
}

/// Checks a reopened partition against what the clients were answered.
fn check(partition: &Partition<SimStorage>, model: &mut Model, context: &str) {
    let live: BTreeMap<u64, Lane> = partition
        .with_state(|state| state.messages())
        .into_iter()
        .map(|view| (view.offset.0, view.lane))
        .collect();
    for offset in &model.acked {
        assert!(
            !live.contains_key(offset),
            "{context}: offset {offset} is live ({:?}) after its ack was answered",
            live.get(offset)
        );
    }
    for offset in model.enqueued.keys() {
        assert!(
            live.contains_key(offset)
                || model.acked.contains(offset)
                || model.ack_unknown.contains(offset),
            "{context}: the answered enqueue at offset {offset} is gone"
        );
    }
    // Acks in flight at the crash: applied or not, now known.
    for offset in std::mem::take(&mut model.ack_unknown) {
        if !live.contains_key(&offset) {
            model.acked.insert(offset);
        }
    }
}

struct Round {
    partition: Rc<Partition<SimStorage>>,
    model: Rc<RefCell<Model>>,
    now: Rc<Cell<u64>>,
    next_id: Rc<Cell<u64>>,
    stop: Rc<Cell<bool>>,
    context: String,
    stats: Rc<Stats>,
}

/// What the runs exercised, so the test can tell it tested something.
#[derive(Debug, Default)]
struct Stats {
    checkpoints: Cell<u64>,
    fenced: Cell<u64>,
    power_losses: Cell<u64>,
    rounds: Cell<u64>,
}

async fn producer(round: Rc<Round>, mut rng: Rng) {
    while !round.stop.get() {
        let count = 1 + rng.below(24);
        let first = round.next_id.get();
        round.next_id.set(first + count);
        let bytes = batch(first, count, round.now.get());
        match round.partition.enqueue(&bytes).await {
            Ok(outcomes) => {
                let mut model = round.model.borrow_mut();
                for (index, outcome) in outcomes.iter().enumerate() {
                    if let EnqueueOutcome::Appended { offset } = outcome {
                        let previous = model.enqueued.insert(offset.0, first + index as u64);
                        assert!(previous.is_none(), "{}: offset {offset:?} reused", round.context);
                    }
                }
            }
            Err(error) => panic!("{}: enqueue failed: {error}", round.context),
        }
        if rng.chance(30) {
            futures_lite::future::yield_now().await;
        }
    }
}

async fn consumer(round: Rc<Round>, mut rng: Rng, worker: u64) {
    let mut held: Vec<(DeliveryToken, u64)> = Vec::new();
    while !round.stop.get() {
        let request = ClaimRequest {
            sub: spool_broker::queue::SubscriptionId::DEFAULT,
            worker: WorkerId(worker),
            credits: 1 + rng.below(16) as u32,
            max_bytes: 1 << 20,
            lease_ms: Some(30_000),
        };
        let claimed = match round.partition.claim(&request, Lane::Main, 0).await {
            Ok(claimed) => claimed,
            Err(error) => panic!("{}: claim failed: {error}", round.context),
        };
        {
            let model = round.model.borrow();
            for claim in &claimed {
                let offset = claim.delivery.offset.0;
                assert!(
                    !model.acked.contains(&offset),
                    "{}: offset {offset} delivered (generation {:?}) after its ack was answered",
                    round.context,
                    claim.delivery.generation
                );
                if let Some(&id) = model.enqueued.get(&offset) {
                    assert_eq!(
                        id_of(&claim.record),
                        Some(id),
                        "{}: offset {offset} delivered another record",
                        round.context
                    );
                }
            }
        }
        held.extend(claimed.iter().map(|c| (c.delivery.token, c.delivery.offset.0)));
        if held.is_empty() {
            futures_lite::future::yield_now().await;
            continue;
        }
        match rng.below(10) {
            // Ack a random subset (most of the traffic).
            0..=5 => {
                let mut acks = Vec::new();
                held.retain(|entry| {
                    if acks.len() < 32 && rng.chance(70) {
                        acks.push(*entry);
                        false
                    } else {
                        true
                    }
                });
                if acks.is_empty() {
                    continue;
                }
                round.model.borrow_mut().ack_unknown.extend(acks.iter().map(|(_, o)| *o));
                let tokens: Vec<DeliveryToken> = acks.iter().map(|(token, _)| *token).collect();
                let results = round.partition.ack(&tokens).await;
                let mut model = round.model.borrow_mut();
                for ((_, offset), result) in acks.iter().zip(&results) {
                    model.ack_unknown.remove(offset);
                    match result {
                        Ok(()) => {
                            model.acked.insert(*offset);
                        }
                        // A lease may have run out under the moving clock.
                        Err(error) if error.code() == spool_wire::ErrorCode::StaleToken => {}
                        Err(error) => panic!("{}: ack failed: {error}", round.context),
                    }
                }
            }
            6..=7 => {
                let (token, _) = held.swap_remove(rng.below(held.len() as u64) as usize);
                let at = rng.chance(50).then(|| round.now.get() + rng.below(50));
                let _ = round.partition.release(&token, ReleaseReason(7), at).await;
            }
            8 => {
                let (token, _) = held[rng.below(held.len() as u64) as usize];
                let _ = round.partition.extend(&token, Some(30_000)).await;
            }
            _ => futures_lite::future::yield_now().await,
        }
    }
}

async fn housekeeper(round: Rc<Round>, mut rng: Rng) {
    while !round.stop.get() {
        round.now.set(round.now.get() + rng.below(40));
        round.partition.tick();
        if rng.chance(10) {
            match round.partition.checkpoint().await {
                Ok(Some(_)) => round.stats.checkpoints.set(round.stats.checkpoints.get() + 1),
                Ok(None) => {}
                Err(error) => panic!("{}: checkpoint failed: {error}", round.context),
            }
        }
        futures_lite::future::yield_now().await;
    }
}

/// One seed: `ROUNDS` crash-and-reopen rounds.
async fn run_seed(layout: Layout, seed: u64, stats: Rc<Stats>) {
    let mut rng = Rng::new(seed);
    let now = Rc::new(Cell::new(START_MS));
    let mut disk = SimStorage::new();
    let model = Rc::new(RefCell::new(Model::default()));
    let next_id = Rc::new(Cell::new(1u64));
    for round_index in 0..ROUNDS {
        let context = format!("seed {seed} round {round_index}");
        let (partition, task) = open(layout, &disk, &now, &context, &stats).await;
        check(&partition, &mut model.borrow_mut(), &context);
        // The crash point: a random mutating operation of this round.
        let crash_at = disk.op_count() + 40 + rng.below(1_500);
        let power_loss = rng.chance(40);
        let power_seed = rng.next();
        stats.rounds.set(stats.rounds.get() + 1);
        if power_loss {
            stats.power_losses.set(stats.power_losses.get() + 1);
        }
        let captured: Rc<RefCell<Option<(SimStorage, Model)>>> = Rc::default();
        let stop = Rc::new(Cell::new(false));
        disk.set_hook({
            let captured = captured.clone();
            let model = model.clone();
            let stop = stop.clone();
            move |disk, _op: IoOp, count| {
                if count >= crash_at && captured.borrow().is_none() {
                    let image = if power_loss {
                        disk.crash_image(CrashMode::PowerLoss { seed: power_seed })
                    } else {
                        disk.process_crash_image()
                    };
                    *captured.borrow_mut() = Some((image, model.borrow().clone()));
                    stop.set(true);
                }
            }
        });
        let round = Rc::new(Round {
            partition: partition.clone(),
            model: model.clone(),
            now: now.clone(),
            next_id: next_id.clone(),
            stop,
            context: context.clone(),
            stats: stats.clone(),
        });
        let mut tasks = vec![
            glommio::spawn_local(producer(round.clone(), Rng::new(rng.next()))).detach(),
            glommio::spawn_local(producer(round.clone(), Rng::new(rng.next()))).detach(),
            glommio::spawn_local(consumer(round.clone(), Rng::new(rng.next()), 1)).detach(),
            glommio::spawn_local(consumer(round.clone(), Rng::new(rng.next()), 2)).detach(),
            glommio::spawn_local(housekeeper(round.clone(), Rng::new(rng.next()))).detach(),
        ];
        for task in tasks.drain(..) {
            task.await;
        }
        disk.clear_hook();
        let (image, known) = captured.borrow_mut().take().expect("a crash image was taken");
        // The old process is gone: its answers after the image never
        // happened for the next one. Stop its log without a checkpoint.
        partition.log().close();
        task.await;
        drop(partition);
        *model.borrow_mut() = known;
        disk = image;
        // Time goes on across the restart, less than a lease.
        now.set(now.get() + 500);
    }
    let context = format!("seed {seed} final");
    let (partition, task) = open(layout, &disk, &now, &context, &stats).await;
    check(&partition, &mut model.borrow_mut(), &context);
    assert!(!model.borrow().acked.is_empty(), "{context}: the workload acked nothing");
    partition.log().close();
    task.await;
}

both_layouts!(answered_enqueues_and_acks_survive_chained_crashes_with_checkpoints_running);

fn answered_enqueues_and_acks_survive_chained_crashes_with_checkpoints_running(layout: Layout) {
    // Goal: the partition keeps its contract across chains of crashes taken
    // at arbitrary disk operations while producers, consumers, ticks and
    // checkpoints run concurrently (see the module doc for what is checked).
    let seeds = std::env::var("SPOOL_CRASH_MODEL_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(SEEDS_DEFAULT);
    let stats = common::run_glommio(async move {
        let stats = Rc::new(Stats::default());
        for seed in 0..seeds {
            run_seed(layout, seed, stats.clone()).await;
        }
        stats
    });
    // The runs crossed what the contract is about: crashes of both kinds,
    // checkpoints between them, claims outstanding at a crash.
    assert!(stats.power_losses.get() > 0 && stats.power_losses.get() < stats.rounds.get());
    assert!(stats.checkpoints.get() >= seeds, "{stats:?}");
    assert!(stats.fenced.get() > 0, "{stats:?}");
    eprintln!("{stats:?}");
}
