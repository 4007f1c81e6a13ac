//! The shard journal's commit delay (`Journal::set_commit_delay`,
//! shard-journal.md §3): a cycle whose queued entries were all appended with
//! `Journal::append_owned_deferred` (a partition's claims, extends,
//! releases and expiries) waits for the delay, so its entries ride the next
//! cycle someone waits for instead of costing a write and a sync of their
//! own; a wait on a queued ticket, a wanted append, a full control lane or
//! `close` builds it at once, and appends meanwhile do not restart the
//! delay.
#![allow(clippy::unwrap_used)]

mod journal_common;
mod witness_gate;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::{block_on, yield_now};
use journal_common::{drive, open_collect, payload, small_config};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::{Journal, JournalPos, JournalTicket, Lane, PartitionHandle};
use spool_wire::batch::BatchKind;
use witness_gate::Gate;

const DIR: &str = "/shard-00/journal";

async fn settle() {
    for _ in 0..300 {
        yield_now().await;
    }
}

/// A journal on `disk` whose commit delay is `gate` and whose witness
/// delay never runs out while the test runs.
fn open(disk: &SimStorage, gate: &Rc<Gate>) -> Journal<SimStorage> {
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    journal.set_witness_delay(Rc::new(Gate::default()).delay());
    journal.set_commit_delay(gate.delay());
    journal
}

fn deferred(journal: &Journal<SimStorage>, partition: u32, tag: u64) -> JournalTicket {
    let bytes = payload(BatchKind::Control, 40, tag);
    journal
        .append_owned_deferred(
            Lane::Control,
            PartitionHandle(partition),
            spool_broker::log::journal::EntryMeta::default(),
            bytes.into(),
        )
        .unwrap()
}

/// Writes, syncs and commits built so far.
fn counts(disk: &SimStorage, journal: &Journal<SimStorage>) -> (u64, u64, u64) {
    (disk.count(IoOp::Write), disk.count(IoOp::Sync), journal.stats().commits_built)
}

/// Entries a reopened crash image of `disk` holds (durable bytes only).
fn entries_after_crash(disk: &SimStorage) -> usize {
    let image = disk.crash_image(CrashMode::DurableOnly);
    let (_journal, _report, found, _) =
        block_on(open_collect(image, Path::new(DIR), small_config(), JournalPos(0))).unwrap();
    found.len()
}

#[test]
fn deferred_entries_ride_the_next_cycle_someone_waits_for() {
    // Goal: control entries nobody waits for (of two partitions) cost no
    // write and no sync of their own while the delay runs; the next wanted
    // entry (an enqueue) takes them along in one commit. A crash while they
    // are held loses them and nothing else. Method: deferred appends, count
    // I/O, crash image; a data append and its wait; count again.
    let disk = SimStorage::new();
    let gate = Rc::new(Gate::default());
    let journal = open(&disk, &gate);
    block_on(drive(&journal, async {
        let first = payload(BatchKind::Data, 200, 1);
        journal.append(Lane::Data, PartitionHandle(0), &first).unwrap().durable().await.unwrap();
        settle().await;
        let before = counts(&disk, &journal);
        let claims = [deferred(&journal, 0, 2), deferred(&journal, 1, 3)];
        settle().await;
        assert_eq!(counts(&disk, &journal), before, "held: no write, no sync");
        assert!(claims.iter().all(|ticket| ticket.position().is_none()));
        assert_eq!(gate.made.get(), 1, "one delay for the held cycle");
        assert_eq!(entries_after_crash(&disk), 1, "a crash now loses the held entries only");
        let enqueue = payload(BatchKind::Data, 200, 4);
        let ticket = journal.append(Lane::Data, PartitionHandle(1), &enqueue).unwrap();
        ticket.durable().await.unwrap();
        assert!(claims.iter().all(|ticket| matches!(ticket.status(), Some(Ok(())))));
        let after = counts(&disk, &journal);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (1, 1, 1),
            "the held entries and the enqueue in one commit"
        );
        assert_eq!(entries_after_crash(&disk), 4);
    }));
}

#[test]
fn a_held_cycle_is_built_when_its_delay_runs_out_and_appends_do_not_restart_it() {
    // Goal: the delay bounds how long deferred entries stay unwritten:
    // later deferred appends join the held cycle without a new delay, and
    // once it runs out one commit takes them all. Method: four deferred
    // appends with the executor settling between them; open the gate.
    let disk = SimStorage::new();
    let gate = Rc::new(Gate::default());
    let journal = open(&disk, &gate);
    block_on(drive(&journal, async {
        // The preparer zero-fills the next file meanwhile: let it finish.
        settle().await;
        let before = counts(&disk, &journal);
        let mut tickets = Vec::new();
        for tag in 0..4 {
            tickets.push(deferred(&journal, tag as u32 % 2, tag));
            settle().await;
        }
        assert_eq!(gate.made.get(), 1, "one delay, not one per append");
        assert_eq!(counts(&disk, &journal), before, "held while the delay runs");
        gate.open();
        settle().await;
        assert!(tickets.iter().all(|ticket| matches!(ticket.status(), Some(Ok(())))));
        let after = counts(&disk, &journal);
        assert_eq!((after.0 - before.0, after.2 - before.2), (1, 1), "one commit of all four");
        assert_eq!(entries_after_crash(&disk), 4);
    }));
}

#[test]
fn a_wait_on_a_held_ticket_a_full_control_lane_or_close_builds_the_cycle_at_once() {
    // Goal: nobody who waits is kept waiting by the delay: awaiting a held
    // ticket builds its cycle at once; so does a control lane holding a
    // whole cycle's worth (`control_commit_bytes`), and `close` builds a
    // held cycle before the committers exit. Method: a delay that never
    // runs out; each case in turn; reopen.
    let disk = SimStorage::new();
    let gate = Rc::new(Gate::default());
    let journal = open(&disk, &gate);
    let control_commit_bytes = small_config().control_commit_bytes;
    block_on(drive(&journal, async {
        let held = deferred(&journal, 0, 1);
        settle().await;
        assert!(held.position().is_none());
        held.durable().await.unwrap();
        assert_eq!(journal.stats().commits_built, 1, "the wait built it");

        // Deferred entries until one cycle's worth of control bytes is
        // queued: built then, not before.
        let mut appended = 0u64;
        let mut queued_most = 0;
        while journal.stats().commits_built == 1 && appended < 1_000 {
            deferred(&journal, 1, 10 + appended);
            appended += 1;
            queued_most = queued_most.max(journal.pending_bytes(Lane::Control));
            settle().await;
        }
        assert_eq!(journal.stats().commits_built, 2, "a full control lane is built at once");
        assert!(queued_most >= control_commit_bytes, "built at {queued_most} bytes, not before");

        let left = deferred(&journal, 2, 99);
        settle().await;
        assert!(left.position().is_none(), "held when the journal closes");
    }));
    assert!(journal.stats().commits_built >= 3, "close built the held cycle");
    let entries = entries_after_crash(&disk);
    assert!(entries >= 3, "{entries}");
}
