//! The segment log's commit delay (`Log::set_commit_delay`): a commit that
//! only holds batches nobody waits for (`Log::append_deferred`: a
//! partition's claims, extends, releases and expiries) stays open for the
//! delay, so it rides the next commit someone waits for instead of costing
//! a write and a sync of its own; a wait on one of its tickets, a full
//! gather or `close` takes it at once, and appends meanwhile do not restart
//! the delay.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod common;
mod witness_gate;

use std::path::Path;
use std::rc::Rc;

use common::{drive, make_batch, read_all, small_config};
use futures_lite::future::{block_on, yield_now};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::{Log, RecordFatal};
use witness_gate::Gate;

/// A log on `disk` whose commit delay is `commit_gate` and whose witness
/// delay never runs out while the test runs (so no witness page shows in
/// the counts; `close` writes it without waiting).
fn open(disk: &SimStorage, commit_gate: &Rc<Gate>) -> (Log<SimStorage>, Rc<RecordFatal>) {
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), Path::new("/p"), small_config(), 1, fatal.clone()))
            .unwrap();
    log.set_witness_delay(Rc::new(Gate::default()).delay());
    log.set_commit_delay(commit_gate.delay());
    (log, fatal)
}

/// A fresh disk, a commit delay the test ends by hand, and a log on them.
fn setup() -> (SimStorage, Rc<Gate>, Log<SimStorage>, Rc<RecordFatal>) {
    let disk = SimStorage::new();
    let gate = Rc::new(Gate::default());
    let (log, fatal) = open(&disk, &gate);
    (disk, gate, log, fatal)
}

async fn settle() {
    for _ in 0..300 {
        yield_now().await;
    }
}

/// Writes, syncs and commits so far.
fn counts(disk: &SimStorage, log: &Log<SimStorage>) -> (u64, u64, u64) {
    (disk.count(IoOp::Write), disk.count(IoOp::Sync), log.stats().commits)
}

/// Writes, syncs and commits since `before` (a [`counts`]).
fn since(disk: &SimStorage, log: &Log<SimStorage>, before: (u64, u64, u64)) -> (u64, u64, u64) {
    let now = counts(disk, log);
    (now.0 - before.0, now.1 - before.1, now.2 - before.2)
}

/// A first commit (which also names the first segment), waited for, then
/// the committers left to go idle: counts taken after it see only the
/// test's own commits.
async fn first_commit(log: &Log<SimStorage>) {
    log.append(&make_batch(1, 1000, 1)).unwrap().ticket.durable().await.unwrap();
    settle().await;
}

/// The batches a reopened crash image of `disk` holds (durable bytes only).
fn batches_after_crash(disk: &SimStorage) -> usize {
    let image = disk.crash_image(CrashMode::DurableOnly);
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(image, Path::new("/p"), small_config(), 2, fatal.clone())).unwrap();
    let batches = block_on(read_all(&log)).len();
    assert!(fatal.reasons().is_empty());
    batches
}

#[test]
fn a_deferred_batch_rides_the_next_commit_someone_waits_for() {
    // Goal: a batch nobody waits for costs no write and no sync of its own
    // while the delay runs: the next append someone waits for takes it
    // along, in one commit (one write, one sync). Without the delay each
    // would be a commit. Method: one deferred append, count I/O; then a
    // wanted append and its wait; count again; a crash image in between.
    let (disk, gate, log, fatal) = setup();
    block_on(drive(&log, async {
        first_commit(&log).await;
        let before = counts(&disk, &log);
        let claim = log.append_deferred(&make_batch(2, 200, 2)).unwrap();
        settle().await;
        assert_eq!(counts(&disk, &log), before, "held: no write, no sync");
        assert!(claim.ticket.status().is_none());
        assert_eq!(log.durable_offset(), claim.base_offset, "not durable yet");
        assert_eq!(gate.made.get(), 1, "one delay for the held commit");
        // A crash now loses the held batch and nothing else.
        assert_eq!(batches_after_crash(&disk), 1);
        let enqueue = log.append(&make_batch(1, 1000, 3)).unwrap();
        enqueue.ticket.durable().await.unwrap();
        assert!(matches!(claim.ticket.status(), Some(Ok(()))), "carried by the wanted commit");
        let one_commit = since(&disk, &log, before);
        assert_eq!(one_commit, (1, 1, 1), "both batches in one commit: one write, one sync");
        assert_eq!(batches_after_crash(&disk), 3);
    }));
    assert!(fatal.reasons().is_empty());
}

#[test]
fn a_held_commit_is_taken_when_its_delay_runs_out_and_appends_do_not_restart_it() {
    // Goal: the delay bounds how long a deferred batch stays unwritten, from
    // when a committer could first take it: further deferred appends join
    // the held commit without making a new delay (a steady stream of them
    // cannot hold it forever), and once the delay runs out the commit is
    // written and synced with everything gathered. Method: four deferred
    // appends with the executor settling between them; count delays and
    // I/O; end the delay by hand.
    let (disk, gate, log, fatal) = setup();
    block_on(drive(&log, async {
        first_commit(&log).await;
        let before = counts(&disk, &log);
        let mut tickets = Vec::new();
        for tag in 2..6 {
            tickets.push(log.append_deferred(&make_batch(1, 300, tag)).unwrap().ticket);
            settle().await;
        }
        assert_eq!(gate.made.get(), 1, "one delay, not one per append");
        assert_eq!(counts(&disk, &log), before, "held while the delay runs");
        assert!(tickets.iter().all(|ticket| ticket.status().is_none()));
        gate.open();
        settle().await;
        assert!(tickets.iter().all(|ticket| matches!(ticket.status(), Some(Ok(())))));
        let (writes, _, commits) = since(&disk, &log, before);
        assert_eq!((writes, commits), (1, 1), "one commit of all four");
        assert_eq!(batches_after_crash(&disk), 5);
    }));
    assert!(fatal.reasons().is_empty());
}

#[test]
fn a_wait_on_a_held_ticket_or_close_takes_the_commit_at_once() {
    // Goal: whoever waits for a deferred batch (a checkpoint's barrier, a
    // test) is not kept waiting by the delay: the wait takes the commit at
    // once; and `close` takes a held commit before the committers exit, so
    // an orderly stop loses nothing appended. Method: a deferred append
    // awaited under a delay that never runs out; another left held when
    // the log closes; reopen.
    let (disk, gate, log, fatal) = setup();
    block_on(drive(&log, async {
        let held = log.append_deferred(&make_batch(1, 500, 1)).unwrap();
        settle().await;
        assert!(held.ticket.status().is_none());
        held.ticket.durable().await.unwrap();
        assert_eq!(log.stats().commits, 1);
        let left = log.append_deferred(&make_batch(1, 500, 2)).unwrap();
        settle().await;
        assert!(left.ticket.status().is_none(), "held when the log closes");
        assert_eq!(log.stats().commits, 1);
    }));
    assert_eq!(gate.made.get(), 2, "each held commit made its delay; neither ran out");
    assert_eq!(log.stats().commits, 2, "close wrote the held commit");
    assert!(fatal.reasons().is_empty());
    assert_eq!(batches_after_crash(&disk), 2);
}

#[test]
fn without_a_commit_delay_a_deferred_batch_is_committed_at_once() {
    // Goal: the delay is opt-in (the broker sets it for segment
    // partitions); a log without one commits every batch as it always did.
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), Path::new("/p"), small_config(), 1, fatal.clone()))
            .unwrap();
    block_on(drive(&log, async {
        let appended = log.append_deferred(&make_batch(1, 500, 1)).unwrap();
        settle().await;
        assert!(matches!(appended.ticket.status(), Some(Ok(()))), "no delay: written and synced");
        assert_eq!(log.stats().commits, 1);
    }));
    assert!(fatal.reasons().is_empty());
}
