//! Witness entries of the shard journal (`shard-journal.md` §11): once the
//! committers go idle, one page holding a filler entry whose watermark is
//! the durable end vouches for the last answered commits, so bit rot in
//! them is refused instead of cut as a torn tail. Counted per idle
//! transition; written by an open whose journal lacks one; an entry after a
//! witness is answered only once the witness is durable. The crash images
//! around witness entries are in `journal_crash.rs`.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;
mod witness_gate;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::{block_on, yield_now};
use journal_common::{drive, open_collect, payload, small_config};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, Journal, JournalDamage, JournalError, JournalPos, JournalTicket, Lane,
    PartitionHandle,
};
use spool_wire::batch::BatchKind;
use witness_gate::Gate;

const DIR: &str = "/shard-00/journal";
const PAGE: u64 = 4096;

fn kind(lane: Lane) -> BatchKind {
    match lane {
        Lane::Control => BatchKind::Control,
        Lane::Data => BatchKind::Data,
    }
}

/// Appends `count` entries in `lane`, each answered before the next is
/// appended (every one an idle transition); returns tickets and payloads.
async fn one_by_one(
    journal: &Journal<SimStorage>,
    lane: Lane,
    count: u64,
) -> Vec<(JournalTicket, Vec<u8>)> {
    let mut out = Vec::new();
    for tag in 0..count {
        let bytes = payload(kind(lane), 40 + tag as usize * 16, tag);
        let ticket = journal.append(lane, PartitionHandle(tag as u32 % 3), &bytes).unwrap();
        ticket.durable().await.unwrap();
        out.push((ticket, bytes));
    }
    out
}

/// Lets the committers run until they are idle again.
async fn settle() {
    for _ in 0..300 {
        yield_now().await;
    }
}

/// Flips one bit of `image`'s file 0 at byte `at`; returns the damaged bytes.
fn flip(image: &SimStorage, at: u64) -> Vec<u8> {
    let path = journal_file_path(Path::new(DIR), 0);
    let mut bytes = image.file_bytes(&path).unwrap();
    bytes[at as usize] ^= 0x10;
    image.set_file_bytes(&path, bytes.clone());
    bytes
}

/// Opens `image` expecting a refusal naming file 0 and byte `pos` as damage
/// below the watermark, with nothing repaired.
fn assert_refused_at(image: &SimStorage, pos: u64, damaged: &[u8]) {
    let path = journal_file_path(Path::new(DIR), 0);
    let error =
        block_on(open_collect(image.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .err()
            .unwrap_or_else(|| panic!("damage at {pos} cut as a torn tail, not refused"));
    match &error {
        JournalError::Corrupt { path: at, pos: byte, detail } => {
            assert_eq!(at, &path);
            assert_eq!(*byte, pos);
            assert!(matches!(detail, JournalDamage::BelowWatermark { .. }), "{detail}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert_eq!(image.file_bytes(&path).unwrap(), damaged, "a refused journal is not repaired");
}

#[test]
fn a_flipped_bit_in_the_last_answered_commit_of_an_idle_journal_is_refused() {
    // Goal: the last answered commit of a journal that then went idle has no later commit
    // to record it durable; its witness entry does, so bit rot in it (payload or header) is
    // refused naming file and byte, in either lane, while the undamaged image opens whole.
    // Method: three commits answered one by one, the committers left idle (no close); the
    // durable image taken then; one bit flipped in the last entry. Without witness entries
    // the damage is past every recorded watermark and is cut.
    for lane in [Lane::Data, Lane::Control] {
        let disk = SimStorage::new();
        let (journal, ..) =
            block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
                .unwrap();
        let (entries, image) = block_on(drive(&journal, async {
            let entries = one_by_one(&journal, lane, 3).await;
            settle().await;
            (entries, disk.crash_image(CrashMode::DurableOnly))
        }));
        let last = entries.last().unwrap().0.position().unwrap().0;
        let (_j, report, found, _) = block_on(open_collect(
            image.crash_image(CrashMode::DurableOnly),
            Path::new(DIR),
            small_config(),
            JournalPos(0),
        ))
        .unwrap();
        assert_eq!(found.len(), 3, "{lane:?}: the undamaged image keeps every entry");
        assert!(report.truncated_at.is_none());
        for flip_at in [last + 100, last + 9] {
            let damaged = image.crash_image(CrashMode::DurableOnly);
            let bytes = flip(&damaged, flip_at);
            assert_refused_at(&damaged, last, &bytes);
        }
        assert!(report.watermark.0 > last, "{lane:?}: a witness recorded {:?}", report.watermark);
    }
}

#[test]
fn one_witness_entry_per_idle_transition() {
    // Goal: each idle transition costs one witness entry — one page, written after the last
    // commit and consumed (the next commit starts after it) — and load with the committers
    // never idle costs one in all; a reopened journal that ends witnessed writes none.
    // Method: five one-page commits answered one by one, then 40 entries of 2000 bytes in
    // both lanes queued at once (several commits, two in flight) and awaited; count.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    block_on(drive(&journal, async {
        let entries = one_by_one(&journal, Lane::Data, 5).await;
        settle().await;
        let stats = journal.stats();
        assert_eq!((stats.commits, stats.witnesses), (5, 5), "{stats:?}");
        for (index, (ticket, _)) in entries.iter().enumerate() {
            // Commit page, then its witness page.
            assert_eq!(ticket.position(), Some(JournalPos(index as u64 * 2 * PAGE)));
        }
        assert_eq!(journal.durable_position(), JournalPos(10 * PAGE));
        assert_eq!(journal.next_position(), JournalPos(10 * PAGE));
        let mut burst = Vec::new();
        for tag in 0..40u64 {
            let lane = if tag % 4 == 0 { Lane::Control } else { Lane::Data };
            let bytes = payload(kind(lane), 2000, 100 + tag);
            burst.push(journal.append(lane, PartitionHandle(1), &bytes).unwrap());
        }
        for ticket in &burst {
            ticket.durable().await.unwrap();
        }
        settle().await;
        let stats = journal.stats();
        assert!(stats.commits >= 5 + 4, "the burst took several commits: {stats:?}");
        assert_eq!(stats.witnesses, 6, "one witness for the whole burst: {stats:?}");
    }));
    assert_eq!(journal.stats().witnesses, 6, "close of a witnessed journal writes none");
    let image = disk.crash_image(CrashMode::DurableOnly);
    let (reopened, report, found, _) =
        block_on(open_collect(image, dir, small_config(), JournalPos(0))).unwrap();
    assert_eq!(found.len(), 45);
    assert!(report.entries_end <= report.watermark, "{report:?}");
    block_on(drive(&reopened, settle()));
    assert_eq!(reopened.stats().witnesses, 0, "the journal ended witnessed");
}

#[test]
fn an_open_whose_journal_lacks_the_witness_writes_one() {
    // Goal: a crash after the last commit's sync and before its witness was written leaves
    // that commit unvouched (damage to it is cut: the documented gap); the next open writes
    // the witness at once, after which the same damage is refused.
    // Method: hold the witness's write, take the durable image, open it and let it idle.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let gate = disk.hold(|op, path, pos| {
        op == IoOp::Write && path.extension().is_some_and(|ext| ext == "wal") && pos == Some(PAGE)
    });
    let image = block_on(drive(&journal, async {
        let entries = one_by_one(&journal, Lane::Control, 1).await;
        assert_eq!(entries[0].0.position(), Some(JournalPos(0)));
        for _ in 0..1000 {
            if gate.reached() {
                break;
            }
            yield_now().await;
        }
        assert!(gate.reached(), "the idle journal writes a witness after its commit");
        let image = disk.crash_image(CrashMode::DurableOnly);
        gate.release();
        image
    }));
    // Unvouched: damage in the commit is indistinguishable from a torn write.
    let cut = image.crash_image(CrashMode::DurableOnly);
    flip(&cut, 100);
    let (_j, report, found, _) =
        block_on(open_collect(cut, dir, small_config(), JournalPos(0))).unwrap();
    assert!(found.is_empty() && report.truncated_at.is_some());
    // The open writes the witness before anything else.
    let (reopened, report, found, fatal) =
        block_on(open_collect(image.clone(), dir, small_config(), JournalPos(0))).unwrap();
    assert_eq!(found.len(), 1);
    assert!(report.entries_end > report.watermark, "{report:?}");
    block_on(drive(&reopened, settle()));
    assert_eq!(reopened.stats().witnesses, 1);
    assert!(fatal.reasons().is_empty());
    let witnessed = image.crash_image(CrashMode::DurableOnly);
    let bytes = flip(&witnessed, 100);
    assert_refused_at(&witnessed, 0, &bytes);
}

#[test]
fn an_entry_after_a_witness_is_answered_only_once_the_witness_is_durable() {
    // Goal: a commit built while a witness entry's write is in flight may be written and
    // synced, but is answered only once the witness before it is durable; a crash in
    // between keeps every answered entry and cuts the unanswered one (no refusal).
    // Method: hold the witness write after one answered commit; append another entry and
    // let its commit (after the witness page) be written and synced; check, crash, release.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let gate = disk.hold(|op, path, pos| {
        op == IoOp::Write && path.extension().is_some_and(|ext| ext == "wal") && pos == Some(PAGE)
    });
    block_on(drive(&journal, async {
        one_by_one(&journal, Lane::Data, 1).await;
        for _ in 0..1000 {
            if gate.reached() {
                break;
            }
            yield_now().await;
        }
        assert!(gate.reached());
        let bytes = payload(BatchKind::Control, 64, 77);
        let after = journal.append(Lane::Control, PartitionHandle(2), &bytes).unwrap();
        let syncs = disk.count(IoOp::Sync);
        for _ in 0..300 {
            yield_now().await;
        }
        assert_eq!(after.position(), Some(JournalPos(2 * PAGE)), "after the witness page");
        assert!(disk.count(IoOp::Sync) > syncs, "its commit was synced");
        assert!(after.status().is_none(), "answered before the witness is durable");
        assert_eq!(journal.durable_position(), JournalPos(PAGE));
        let image = disk.crash_image(CrashMode::DurableOnly);
        let (_j, report, found, _) =
            open_collect(image, dir, small_config(), JournalPos(0)).await.unwrap();
        assert_eq!(found.len(), 1, "the unanswered entry is cut, the answered one kept");
        assert!(report.truncated_at.is_some());
        gate.release();
        after.durable().await.unwrap();
        settle().await;
        assert_eq!(journal.stats().witnesses, 2);
    }));
}

#[test]
fn a_failed_witness_write_is_fatal() {
    // Goal: a witness entry's write error is fatal like any journal write: the fatal
    // handler runs once with the write code, and appends are refused afterwards.
    let disk = SimStorage::new();
    let (journal, _, _, fatal) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    block_on(drive(&journal, async {
        // The preparer's zero-fill first, then fail the next write: the witness.
        while !journal.next_file_prepared() {
            yield_now().await;
        }
        let bytes = payload(BatchKind::Data, 64, 1);
        let ticket = journal.append(Lane::Data, PartitionHandle(0), &bytes).unwrap();
        disk.inject_failure(IoOp::Write, 2);
        ticket.durable().await.unwrap();
        settle().await;
        let refused = journal.append(Lane::Data, PartitionHandle(0), &bytes);
        assert!(matches!(refused, Err(JournalError::Failed(_))));
    }));
    let reasons = fatal.reasons();
    assert_eq!(reasons.len(), 1);
    assert_eq!(reasons[0].code, spool_broker::log::FatalCode::WriteFailed);
    assert_eq!(journal.stats().witnesses, 0);
}

#[test]
fn a_witness_waits_out_its_delay_and_a_commit_within_it_vouches_instead() {
    // Goal: with a witness delay, an idle transition followed by a commit within the delay
    // costs no witness (the commit's headers vouch for the entries before it, so damage to
    // them is still refused); the witness comes once the delay runs out with the journal
    // still idle, and only then is damage to the last commit refused rather than cut — the
    // window the delay trades for one write and sync less per commit of a thin stream.
    // Method: a gate as the delay; three commits answered one by one (each an idle
    // transition) with the gate shut; durable image A; open the gate; durable image B.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let gate = Rc::new(Gate::default());
    journal.set_witness_delay(gate.delay());
    let (entries, before, after) = block_on(drive(&journal, async {
        let entries = one_by_one(&journal, Lane::Data, 3).await;
        settle().await;
        let stats = journal.stats();
        assert_eq!((stats.commits, stats.witnesses), (3, 0), "no witness within the delay");
        for (index, (ticket, _)) in entries.iter().enumerate() {
            // One page each, end to end: no witness page between them.
            assert_eq!(ticket.position(), Some(JournalPos(index as u64 * PAGE)));
        }
        assert_eq!(gate.made.get(), 3, "one delay per idle transition, each ended by work");
        let before = disk.crash_image(CrashMode::DurableOnly);
        gate.open();
        settle().await;
        assert_eq!(journal.stats().witnesses, 1, "the delay ran out idle: one witness");
        (entries, before, disk.crash_image(CrashMode::DurableOnly))
    }));
    let second = entries[1].0.position().unwrap().0;
    let last = entries[2].0.position().unwrap().0;
    // Within the delay: the second commit is vouched for by the third's header.
    let damaged = before.crash_image(CrashMode::DurableOnly);
    let bytes = flip(&damaged, second + 100);
    assert_refused_at(&damaged, second, &bytes);
    // ... the last one by nothing yet: damage to it is cut like a torn tail.
    let damaged = before.crash_image(CrashMode::DurableOnly);
    flip(&damaged, last + 100);
    let (_j, report, found, _) =
        block_on(open_collect(damaged, dir, small_config(), JournalPos(0))).unwrap();
    assert_eq!(found.len(), 2, "the unvouched last commit is cut: {report:?}");
    // After the delay its witness vouches for it: refused.
    let damaged = after.crash_image(CrashMode::DurableOnly);
    let bytes = flip(&damaged, last + 100);
    assert_refused_at(&damaged, last, &bytes);
}
