//! The shard journal on the simulated disk: crash images at every write,
//! sync, open, rename, remove and directory-sync boundary of a seeded
//! workload of control and data entries from several partitions (durable
//! only, everything written, byte prefixes, page/sector tears and power-loss
//! sector images), each recovered and checked; bit rot in an answered commit
//! refused with file and byte; the control lane ahead of queued data,
//! counted in commit cycles; back-pressure per lane; the in-flight bound.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_lite::future::{block_on, yield_now};
use journal_common::{append_durable, drive, open_collect, payload, small_config, Rng};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, JournalConfig, JournalDamage, JournalError, JournalPos, JournalTicket, Lane,
    PartitionHandle, JOURNAL_PREPARED_NAME,
};
use spool_broker::log::FatalCode;
use spool_wire::batch::BatchKind;

const DIR: &str = "/shard-00/journal";

/// One appended entry: partition, payload, ticket.
type Appended = Rc<RefCell<Vec<(PartitionHandle, Vec<u8>, JournalTicket)>>>;

/// What the workload had built and answered at one crash point.
struct Snapshot {
    /// Every entry a commit took: position → (partition, payload).
    built: BTreeMap<u64, (PartitionHandle, Vec<u8>)>,
    /// Positions of entries whose ticket completed.
    answered: Vec<u64>,
}

fn snapshot(appended: &Appended) -> Snapshot {
    let mut built = BTreeMap::new();
    let mut answered = Vec::new();
    for (partition, bytes, ticket) in appended.borrow().iter() {
        if let Some(position) = ticket.position() {
            built.insert(position.0, (*partition, bytes.clone()));
            if matches!(ticket.status(), Some(Ok(()))) {
                answered.push(position.0);
            }
        }
    }
    Snapshot { built, answered }
}

/// Recovers `image` and checks it: the recovered entries are exactly the
/// first k built entries in journal order, byte for byte (nothing after a
/// hole, nothing foreign), every answered entry is among them; then the
/// recovered journal appends one more entry, and a crash right after that
/// recovers it too. Returns whether a torn tail was cut.
fn check_image(image: SimStorage, snap: &Snapshot, config: &JournalConfig) -> bool {
    let dir = Path::new(DIR);
    block_on(async {
        let (journal, report, found, fatal) =
            open_collect(image.clone(), dir, config.clone(), JournalPos(0))
                .await
                .unwrap_or_else(|error| panic!("recovery failed: {error}"));
        let built: Vec<(&u64, &(PartitionHandle, Vec<u8>))> = snap.built.iter().collect();
        assert!(found.len() <= built.len(), "{} found, {} built", found.len(), built.len());
        for (entry, (position, (partition, bytes))) in found.iter().zip(&built) {
            assert_eq!(entry.position.0, **position, "recovered entries are a prefix");
            assert_eq!(entry.partition, *partition);
            assert_eq!(&entry.payload, bytes, "entry at {position} intact");
        }
        // Watermarks: never past their own entry, never going back.
        for pair in found.windows(2) {
            assert!(pair[0].watermark <= pair[1].watermark, "watermarks go back");
        }
        assert!(found.iter().all(|entry| entry.watermark <= entry.position));
        let kept_end = found.last().map_or(0, |entry| entry.position.0);
        for answered in &snap.answered {
            assert!(
                found.iter().any(|entry| entry.position.0 == *answered),
                "answered entry at {answered} lost (recovered up to {kept_end})"
            );
        }
        assert!(report.next_position.0 > kept_end || found.is_empty());
        assert!(image.dirty_dirs().is_empty(), "recovery left names unsynced");
        // The recovered journal keeps appending, and that survives a crash.
        let extra = payload(BatchKind::Control, 40, 424_242);
        let ticket = drive(&journal, async {
            let ticket = journal.append(Lane::Control, PartitionHandle(9), &extra).unwrap();
            ticket.durable().await.expect("durable after recovery");
            ticket
        })
        .await;
        assert!(ticket.position().unwrap() >= report.next_position);
        assert!(fatal.reasons().is_empty());
        let again = image.crash_image(CrashMode::DurableOnly);
        let (_journal, _, refound, _) = open_collect(again, dir, config.clone(), JournalPos(0))
            .await
            .unwrap_or_else(|error| panic!("second recovery failed: {error}"));
        assert_eq!(refound.len(), found.len() + 1);
        assert_eq!(refound[..found.len()], found[..]);
        assert_eq!(refound[found.len()].payload, extra);
        report.truncated_at.is_some()
    })
}

/// Torn images per workload whose recovery is itself crashed at every step.
const REPAIR_CRASHES_PER_WORKLOAD: u64 = 12;

/// Recovers `image` with a hook that, at every mutating operation of the
/// recovery (the repair write, its sync, the removals, the directory sync,
/// the preparation of the first `next.prep`), checks the images a crash
/// there could leave, as `check_image` does.
fn crash_during_recovery(image: SimStorage, snap: &Snapshot, config: &JournalConfig) {
    let checked = Rc::new(Cell::new(0u64));
    {
        let checked = checked.clone();
        let snap = Snapshot { built: snap.built.clone(), answered: snap.answered.clone() };
        let config = config.clone();
        let mut rng = Rng(0x5EED ^ snap.built.len() as u64);
        image.set_hook(move |disk, _op, _count| {
            for mode in [
                CrashMode::DurableOnly,
                CrashMode::AllWritten,
                CrashMode::PowerLoss { seed: rng.next() },
                CrashMode::Torn { seed: rng.next() },
            ] {
                check_image(disk.crash_image(mode), &snap, &config);
                checked.set(checked.get() + 1);
            }
        });
    }
    block_on(open_collect(image.clone(), Path::new(DIR), config.clone(), JournalPos(0)))
        .unwrap_or_else(|error| panic!("recovery failed: {error}"));
    image.clear_hook();
    assert!(checked.get() >= 4, "the recovery of a torn tail performs operations");
}

/// Runs one seeded workload with the crash explorer installed; returns
/// (images checked, images with a torn tail cut). With `idle_steps`, every
/// step ends waiting for the newest entry: each is an idle transition, so
/// the committers write a witness entry after almost every commit.
fn explore(seed: u64, config: &JournalConfig, steps: usize, idle_steps: bool) -> (u64, u64) {
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, report, found, fatal) =
        block_on(open_collect(disk.clone(), dir, config.clone(), JournalPos(0))).unwrap();
    assert!(report.created);
    assert!(found.is_empty());
    let appended: Appended = Rc::new(RefCell::new(Vec::new()));
    let explored = Rc::new(Cell::new(0u64));
    let torn = Rc::new(Cell::new(0u64));
    {
        let appended = appended.clone();
        let explored = explored.clone();
        let torn = torn.clone();
        let mut rng = Rng(seed ^ 0xDEAD_BEEF);
        let config = config.clone();
        disk.set_hook(move |disk, _op, _count| {
            let snap = snapshot(&appended);
            let unsynced = disk.unsynced_bytes();
            let mut modes = vec![
                CrashMode::DurableOnly,
                CrashMode::AllWritten,
                CrashMode::Torn { seed: rng.next() },
                CrashMode::PowerLoss { seed: rng.next() },
                CrashMode::PowerLoss { seed: rng.next() },
            ];
            if unsynced > 0 {
                modes.push(CrashMode::Prefix { bytes: rng.below(unsynced) });
            }
            for mode in modes {
                if check_image(disk.crash_image(mode), &snap, &config) {
                    torn.set(torn.get() + 1);
                    if torn.get() <= REPAIR_CRASHES_PER_WORKLOAD {
                        // The same image again (images are deterministic), now
                        // crashed at every operation of its own recovery.
                        crash_during_recovery(disk.crash_image(mode), &snap, &config);
                    }
                }
                explored.set(explored.get() + 1);
            }
        });
    }
    block_on(drive(&journal, async {
        let mut rng = Rng(seed);
        let mut tag = seed * 1_000_000;
        let append = |lane: Lane, partition: u32, bytes: Vec<u8>| {
            let ticket = journal.append(lane, PartitionHandle(partition), &bytes).unwrap();
            appended.borrow_mut().push((PartitionHandle(partition), bytes, ticket));
        };
        for _step in 0..steps {
            match rng.below(10) {
                0..=3 => {
                    for _ in 0..=rng.below(3) {
                        tag += 1;
                        let size = rng.below(3000) as usize;
                        append(
                            Lane::Data,
                            rng.below(4) as u32,
                            payload(BatchKind::Data, size, tag),
                        );
                    }
                }
                4..=5 => {
                    for _ in 0..=rng.below(4) {
                        tag += 1;
                        let size = 8 + rng.below(200) as usize;
                        let bytes = payload(BatchKind::Control, size, tag);
                        append(Lane::Control, rng.below(4) as u32, bytes);
                    }
                }
                6..=7 => {
                    let ticket = appended.borrow().last().map(|(_, _, ticket)| ticket.clone());
                    if let Some(ticket) = ticket {
                        ticket.durable().await.expect("durable");
                    }
                }
                _ => {
                    for _ in 0..rng.below(5) {
                        yield_now().await;
                    }
                }
            }
            if idle_steps {
                let ticket = appended.borrow().last().map(|(_, _, ticket)| ticket.clone());
                if let Some(ticket) = ticket {
                    ticket.durable().await.expect("durable");
                }
            }
        }
        let tickets: Vec<JournalTicket> =
            appended.borrow().iter().map(|(_, _, ticket)| ticket.clone()).collect();
        for ticket in tickets {
            ticket.durable().await.expect("durable");
        }
    }));
    disk.clear_hook();
    assert!(fatal.reasons().is_empty());
    let stats = journal.stats();
    assert!(stats.files_rolled >= 2, "workload rolled files: {stats:?}");
    assert!(stats.witnesses >= 1, "the journal went idle at least at close: {stats:?}");
    if idle_steps {
        assert!(stats.witnesses * 2 >= stats.commits, "witness entries written: {stats:?}");
    }
    assert!(disk.dirty_dirs().is_empty(), "names left unsynced: {:?}", disk.dirty_dirs());
    // The final image, fully synced, holds everything, every entry answered.
    let snap = snapshot(&appended);
    assert_eq!(snap.answered.len(), appended.borrow().len());
    check_image(disk.crash_image(CrashMode::DurableOnly), &snap, config);
    (explored.get(), torn.get())
}

#[test]
fn every_crash_point_keeps_every_answered_entry_and_nothing_after_a_hole() {
    // Goal: a crash at any write/sync/open/rename/remove/dir-sync boundary, with the unsynced
    // writes kept whole, dropped, cut at a byte, torn per page and sector, or landed sector by
    // sector at random (power loss), recovers every answered entry byte for byte and in order,
    // keeps only a prefix of what was built, and leaves a journal that keeps appending.
    // Method: seeded workloads of control and data entries from four partitions over 64 KiB
    // files; a hook recovers six images at every mutating operation; some torn images are
    // also crashed at every operation of their own recovery (repair write, syncs, removals).
    let config = small_config();
    let (mut total, mut torn) = (0, 0);
    for seed in [1, 2, 3, 4] {
        let (explored, cut) = explore(seed, &config, 160, false);
        total += explored;
        torn += cut;
    }
    println!("explored {total} crash images, {torn} with a torn tail cut");
    assert!(total > 1000, "explored {total} images");
    assert!(torn > 50, "torn tails exercised: {torn}");
}

#[test]
fn crash_points_with_four_commits_in_flight() {
    // Goal: the watermark rule holds with a deeper pipeline (damage in any of four
    // overlapping commits is past every recorded watermark). Method: as above, inflight 4.
    let config = JournalConfig { inflight_commits_max: 4, ..small_config() };
    let (total, torn) = explore(11, &config, 100, false);
    assert!(total > 200, "explored {total}");
    assert!(torn > 10, "torn {torn}");
}

#[test]
fn every_crash_point_around_witness_entries_keeps_every_answered_entry() {
    // Goal: a crash at any write or sync of a witness entry, or of the commits around it
    // (the one it vouches for, the one built while it is in flight, a witness that rolls
    // to the next file), with any unsynced-write outcome, loses no answered entry in either
    // lane and refuses no undamaged image. Method: the explorer above on workloads that wait
    // for the newest entry after every step, so nearly every commit is followed by a
    // witness entry (counted); some steps queue several entries of both lanes at once.
    let config = small_config();
    let (mut total, mut torn) = (0, 0);
    for seed in [5, 6] {
        let (explored, cut) = explore(seed, &config, 120, true);
        total += explored;
        torn += cut;
    }
    println!("explored {total} crash images around witness entries, {torn} with a torn tail cut");
    assert!(total > 1000, "explored {total} images");
    assert!(torn > 50, "torn tails exercised: {torn}");
}

/// Appends `count` entries one commit at a time (each awaited before the
/// next is appended, so every later commit records the earlier ones as
/// durable); returns the tickets and payloads.
async fn answered_commits(
    journal: &spool_broker::log::journal::Journal<SimStorage>,
    count: u64,
) -> Vec<(JournalTicket, Vec<u8>)> {
    let mut out = Vec::new();
    for tag in 0..count {
        let bytes = payload(BatchKind::Data, 300 + tag as usize * 10, tag);
        let ticket = journal.append(Lane::Data, PartitionHandle(tag as u32 % 3), &bytes).unwrap();
        ticket.durable().await.unwrap();
        out.push((ticket, bytes));
    }
    out
}

fn committed_disk(count: u64) -> (SimStorage, Vec<(JournalTicket, Vec<u8>)>) {
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let entries = block_on(drive(&journal, answered_commits(&journal, count)));
    (disk.crash_image(CrashMode::DurableOnly), entries)
}

#[test]
fn bit_rot_inside_an_answered_commit_is_refused_with_file_and_byte() {
    // Goal: damage below the recorded durable watermark is corruption, never a torn tail:
    // recovery refuses naming the file and the entry's byte, and changes nothing.
    // Method: eight commits, each answered before the next; flip one payload byte, then one
    // header byte, of the third entry on the durable image.
    let (disk, entries) = committed_disk(8);
    let path = journal_file_path(Path::new(DIR), 0);
    let position = entries[2].0.position().unwrap().0;
    for flip_at in [position + 100, position + 9] {
        let image = disk.crash_image(CrashMode::DurableOnly);
        let mut bytes = image.file_bytes(&path).unwrap();
        bytes[flip_at as usize] ^= 0x10;
        image.set_file_bytes(&path, bytes.clone());
        let error =
            block_on(open_collect(image.clone(), Path::new(DIR), small_config(), JournalPos(0)))
                .err()
                .expect("corruption refused");
        match &error {
            JournalError::Corrupt { path: at, pos, detail } => {
                assert_eq!(at, &path);
                assert_eq!(*pos, position);
                assert!(matches!(detail, JournalDamage::BelowWatermark { .. }), "{detail}");
            }
            other => panic!("expected Corrupt, got {other}"),
        }
        let text = error.to_string();
        assert!(text.contains("00000000000000000000.wal") && text.contains(&position.to_string()));
        assert_eq!(image.file_bytes(&path).unwrap(), bytes, "a refused journal is not repaired");
    }
}

#[test]
fn a_torn_tail_is_cut_zeroed_and_synced_before_open_returns() {
    // Goal: garbage past the last answered commit is a torn tail: cut with a filler,
    // zeroed in one write, file and directory synced, and appends continue after the cut.
    // Method: answered commits, then garbage written into the next pages of the durable
    // image (as a torn in-flight commit would leave); recover; crash the result at once.
    let (disk, entries) = committed_disk(4);
    let path = journal_file_path(Path::new(DIR), 0);
    // The last commit is one page at its entry's position, its witness entry the next
    // page; leave one zero page after that.
    let last_commit = entries.last().unwrap().0.position().unwrap().0 as usize;
    let mut bytes = disk.file_bytes(&path).unwrap();
    let garbage_at = last_commit + 3 * 4096;
    for (index, byte) in bytes[garbage_at..garbage_at + 5000].iter_mut().enumerate() {
        *byte = (index % 251) as u8 + 1;
    }
    disk.set_file_bytes(&path, bytes);
    let syncs_before = disk.count(IoOp::Sync);
    let (_journal, report, found, _) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    assert_eq!(found.len(), 4);
    let (cut_path, cut_at) = report.truncated_at.clone().expect("tail cut");
    assert_eq!(cut_path, path);
    assert_eq!(cut_at, garbage_at as u64 - 4096);
    assert!(report.zeroed_bytes >= 5000);
    assert!(disk.count(IoOp::Sync) > syncs_before, "the repair was synced");
    assert!(disk.dirty_dirs().is_empty());
    // Durable at once: a power loss right after open keeps the repair.
    let image = disk.crash_image(CrashMode::DurableOnly);
    let repaired = image.file_bytes(&path).unwrap();
    assert!(repaired[garbage_at..].iter().all(|byte| *byte == 0));
    let (_j, again, refound, _) =
        block_on(open_collect(image, Path::new(DIR), small_config(), JournalPos(0))).unwrap();
    assert!(again.truncated_at.is_none());
    assert_eq!(refound, found);
}

#[test]
fn recovery_from_a_start_position_reads_nothing_below_it() {
    // Goal: a scan from a start position hands over only entries at or after it, and a
    // start that is not in the journal is refused by name.
    let (disk, entries) = committed_disk(6);
    let start = entries[3].0.position().unwrap();
    let (_journal, report, found, _) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), start)).unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].position, start);
    assert_eq!(found[0].payload, entries[3].1);
    assert_eq!(report.start, start);
    let error = block_on(open_collect(disk, Path::new(DIR), small_config(), JournalPos(1 << 40)))
        .err()
        .expect("start beyond the journal");
    assert!(matches!(error, JournalError::StartNotFound { .. }), "{error}");
}

#[test]
fn control_entries_go_ahead_of_ten_mebibytes_of_queued_data() {
    // Goal: an ack enqueued behind 10 MiB of queued data is in the very next commit cycle
    // and durable while most of that data still waits. Method: count cycles (commit
    // sequence numbers), not time: 160 data entries of 64 KiB queued at once, wait until
    // two commits are in flight, append a control entry; its commit must be the next built.
    let config = JournalConfig {
        file_bytes: 16 << 20,
        commit_bytes: 1 << 20,
        control_commit_bytes: 64 << 10,
        entry_bytes_max: 128 << 10,
        inflight_commits_max: 2,
        control_pending_bytes_max: 1 << 20,
        data_pending_bytes_max: 16 << 20,
        read_cache_bytes: 0,
        read_ahead_bytes: 0,
    };
    let disk = SimStorage::new();
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), config, JournalPos(0))).unwrap();
    block_on(drive(&journal, async {
        let mut data = Vec::new();
        for tag in 0..160u64 {
            let bytes = payload(BatchKind::Data, (64 << 10) - 64 - 32, tag);
            data.push(journal.append(Lane::Data, PartitionHandle(tag as u32 % 4), &bytes).unwrap());
        }
        assert!(journal.pending_bytes(Lane::Data) >= 10 << 20);
        while journal.stats().commits_built < 2 {
            yield_now().await;
        }
        let built_before = journal.stats().commits_built;
        let ack = journal
            .append(Lane::Control, PartitionHandle(1), &payload(BatchKind::Control, 40, 7))
            .unwrap();
        ack.durable().await.unwrap();
        assert_eq!(ack.commit_seq(), Some(built_before + 1), "the ack waited a cycle");
        let data_durable = data.iter().filter(|ticket| ticket.status().is_some()).count();
        assert!(data_durable <= 4 * 16, "{data_durable} data entries durable before the ack");
        assert!(journal.pending_bytes(Lane::Data) >= 4 << 20);
        // Within its commit the ack precedes every data entry.
        let ack_pos = ack.position().unwrap();
        for ticket in &data {
            if ticket.commit_seq() == ack.commit_seq() {
                assert!(ticket.position().unwrap() > ack_pos);
            }
        }
        for ticket in &data {
            ticket.durable().await.unwrap();
        }
        // Every commit carried at most commit_bytes of entries: ten or more cycles.
        assert!(journal.stats().commits >= 11, "{:?}", journal.stats());
    }));
}

#[test]
fn each_lane_has_its_own_bound_and_back_pressure_names_it() {
    // Goal: a full data lane refuses data with a clear error naming the lane and limit,
    // while control entries are still accepted; `writable` resolves once room returns.
    let config = JournalConfig { data_pending_bytes_max: 16 * 1024, ..small_config() };
    let disk = SimStorage::new();
    let (journal, ..) =
        block_on(open_collect(disk, Path::new(DIR), config, JournalPos(0))).unwrap();
    // 48 header + 64 batch header + 3984 body: 4 KiB entries.
    let bytes = payload(BatchKind::Data, 3984, 1);
    let mut accepted = 0;
    let error = loop {
        match journal.append(Lane::Data, PartitionHandle(0), &bytes) {
            Ok(_) => accepted += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(accepted, 4, "four 4 KiB entries fill the 16 KiB data lane");
    match &error {
        JournalError::Backpressure { lane, limit_bytes, .. } => {
            assert_eq!(*lane, Lane::Data);
            assert_eq!(*limit_bytes, 16 * 1024);
        }
        other => panic!("expected Backpressure, got {other}"),
    }
    assert!(error.to_string().contains("data lane"), "{error}");
    let control = payload(BatchKind::Control, 40, 2);
    journal.append(Lane::Control, PartitionHandle(0), &control).unwrap();
    let too_big = payload(BatchKind::Control, 5000, 3);
    assert!(matches!(
        journal.append(Lane::Control, PartitionHandle(0), &too_big),
        Err(JournalError::EntryTooLarge { lane: Lane::Control, .. })
    ));
    assert!(matches!(
        journal.append(Lane::Data, PartitionHandle(u32::MAX), &control),
        Err(JournalError::ReservedPartition(_))
    ));
    let mut damaged = control.clone();
    damaged[70] ^= 1;
    assert!(matches!(
        journal.append(Lane::Control, PartitionHandle(0), &damaged),
        Err(JournalError::InvalidEntry(_))
    ));
    block_on(drive(&journal, async {
        journal.writable(Lane::Data, bytes.len() as u64 + 32).await;
        journal.append(Lane::Data, PartitionHandle(0), &bytes).unwrap().durable().await.unwrap();
    }));
}

#[test]
fn a_slow_write_holds_tickets_and_the_in_flight_bound() {
    // Goal: a commit's ticket completes only when it and every commit before it are durable,
    // and no more than `inflight_commits_max` commits are ever built past the watermark.
    // Method: hold the first commit's write in the simulator while later commits are built,
    // written and synced; check the tickets and the bound; release.
    let disk = SimStorage::new();
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    let gate = disk
        .hold(|op, path, _| op == IoOp::Write && path.extension().is_some_and(|ext| ext == "wal"));
    let later = block_on(drive(&journal, async {
        let first =
            journal.append(Lane::Data, PartitionHandle(0), &payload(BatchKind::Data, 100, 1));
        let first = first.unwrap();
        while !gate.reached() {
            yield_now().await;
        }
        let mut later = Vec::new();
        for tag in 2..40u64 {
            let bytes = payload(BatchKind::Data, 1000, tag);
            later.push(journal.append(Lane::Data, PartitionHandle(1), &bytes).unwrap());
            for _ in 0..20 {
                yield_now().await;
                assert!(journal.inflight_commits() <= 2);
            }
        }
        assert_eq!(journal.stats().commits_built, 2, "no third commit past a held one");
        assert!(later[0].commit_seq() == Some(2));
        for _ in 0..200 {
            yield_now().await;
        }
        assert!(later[0].status().is_none(), "commit 2 synced but commit 1 is not durable");
        assert!(first.status().is_none());
        assert_eq!(journal.durable_position(), JournalPos(0));
        gate.release();
        for ticket in later.iter().chain([&first]) {
            ticket.durable().await.unwrap();
        }
        later
    }));
    // Each entry recorded the watermark known when its commit was built: commit 2 was
    // built while commit 1 was held (nothing durable), later ones after it was durable.
    let (_j, _, found, _) = block_on(open_collect(
        disk.crash_image(CrashMode::DurableOnly),
        Path::new(DIR),
        small_config(),
        JournalPos(0),
    ))
    .unwrap();
    let recorded = |ticket: &JournalTicket| {
        found.iter().find(|entry| Some(entry.position) == ticket.position()).unwrap().watermark
    };
    assert_eq!(recorded(&later[0]), JournalPos(0));
    let last = later.last().unwrap();
    assert!(recorded(last) >= JournalPos(8192), "{:?}", recorded(last));
    assert!(recorded(last) <= last.position().unwrap());
}

#[test]
fn a_failed_write_fails_every_waiting_ticket_once() {
    // Goal: a write error is fatal: never retried, every pending ticket fails, the fatal
    // handler runs once with the write code, and appends are refused afterwards.
    let disk = SimStorage::new();
    let (journal, _, _, fatal) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    block_on(drive(&journal, async {
        let ok = journal.append(Lane::Data, PartitionHandle(0), &payload(BatchKind::Data, 64, 1));
        ok.unwrap().durable().await.unwrap();
        // The preparer's zero-fill is done by now; fail the next commit write.
        while !journal.next_file_prepared() {
            yield_now().await;
        }
        disk.inject_failure(IoOp::Write, 1);
        let doomed =
            journal.append(Lane::Data, PartitionHandle(0), &payload(BatchKind::Data, 64, 2));
        let error = doomed.unwrap().durable().await.unwrap_err();
        assert!(matches!(error, JournalError::Failed(_)), "{error}");
        let refused =
            journal.append(Lane::Control, PartitionHandle(0), &payload(BatchKind::Control, 8, 3));
        assert!(matches!(refused, Err(JournalError::Failed(_))));
    }));
    let reasons = fatal.reasons();
    assert_eq!(reasons.len(), 1);
    assert_eq!(reasons[0].code, FatalCode::WriteFailed);
}

#[test]
fn files_roll_named_by_position_with_the_next_one_prepared() {
    // Goal: journal files are fixed-size, named by the journal position of byte 0, never
    // extended; a zero-filled next.prep waits for the roll; every name change is synced;
    // a stale next.prep is deleted by recovery.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let config = small_config();
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, config.clone(), JournalPos(0))).unwrap();
    let stored =
        block_on(drive(&journal, append_durable(&journal, PartitionHandle(2), 120, 2000, 10)));
    let names = disk.names_in(dir);
    let files: Vec<&String> = names.iter().filter(|name| name.ends_with(".wal")).collect();
    assert!(files.len() >= 3, "{names:?}");
    for (index, name) in files.iter().enumerate() {
        let expected: PathBuf = journal_file_path(dir, index as u64 * config.file_bytes);
        assert_eq!(dir.join(name), expected);
        assert_eq!(disk.file_bytes(&expected).unwrap().len() as u64, config.file_bytes);
    }
    assert!(names.iter().any(|name| name == JOURNAL_PREPARED_NAME), "{names:?}");
    assert!(disk.dirty_dirs().is_empty(), "{:?}", disk.dirty_dirs());
    let (_journal, report, found, _) =
        block_on(open_collect(disk.clone(), dir, config, JournalPos(0))).unwrap();
    assert!(report.prepared_removed);
    assert!(!disk.names_in(dir).iter().any(|name| name == JOURNAL_PREPARED_NAME));
    assert_eq!(found.len(), stored.len());
    for (entry, (ticket, bytes)) in found.iter().zip(&stored) {
        assert_eq!(Some(entry.position), ticket.position());
        assert_eq!(&entry.payload, bytes);
    }
}

#[test]
fn a_watermark_inside_a_skipped_file_tail_is_refused() {
    // Goal: when a commit did not fit and the journal continued in the next file, no
    // commit ends inside the zero tail it skipped; an intact entry recording a watermark
    // there means a commit was lost from it, and recovery refuses naming that tail.
    // Method: eight 8 KiB commits, each answered before the next and so each followed by a
    // 4 KiB witness entry, leave file 0 ending at 61440 (five commits, five witnesses) and
    // the journal continuing at 65536; rewrite one entry of file 1 to record a watermark of
    // 63488 (its crc recomputed).
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let positions = block_on(drive(&journal, async {
        let mut positions = Vec::new();
        for tag in 0..8u64 {
            let bytes = payload(BatchKind::Data, 5000, tag);
            let ticket = journal.append(Lane::Data, PartitionHandle(0), &bytes).unwrap();
            ticket.durable().await.unwrap();
            positions.push(ticket.position().unwrap().0);
        }
        positions
    }));
    assert_eq!(positions[4], 4 * 12_288);
    assert_eq!(positions[5], 65536, "the sixth commit starts the next file");
    let image = disk.crash_image(CrashMode::DurableOnly);
    let second = journal_file_path(dir, 65536);
    let mut bytes = image.file_bytes(&second).unwrap();
    let at = (positions[6] - 65536) as usize;
    bytes[at + 16..at + 24].copy_from_slice(&63_488u64.to_le_bytes());
    // The v2 header's crc covers its first 44 bytes.
    let crc = crc32c::crc32c(&bytes[at..at + 44]);
    bytes[at + 44..at + 48].copy_from_slice(&crc.to_le_bytes());
    image.set_file_bytes(&second, bytes);
    let error =
        block_on(open_collect(image, dir, small_config(), JournalPos(0))).err().expect("refused");
    match error {
        JournalError::Corrupt { path, pos, detail } => {
            assert_eq!(path, journal_file_path(dir, 0));
            assert_eq!(pos, 61_440);
            assert!(matches!(detail, JournalDamage::WatermarkInSkippedTail { .. }), "{detail}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}

#[test]
fn a_roll_waits_until_the_old_file_is_durable() {
    // Goal: the first commit of a new file is not written (the file is not even named)
    // while a commit of the old file is not durable, so a crash can never keep the new
    // file's data behind a lost commit of the old one. Method: fill file 0 to 61440 with
    // answered commits; hold the write of the 4 KiB commit at 61440; append an entry that
    // must roll to file 1; check file 1 stays unnamed and a crash image keeps no entry past
    // the held one; release and check both become durable in order. Each answered commit
    // is followed by its witness entry (one page): one 8 KiB and six 4 KiB commits reach
    // 61440.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let first_file = journal_file_path(dir, 0);
    let second_file = journal_file_path(dir, 65536);
    block_on(drive(&journal, async {
        for tag in 0..7u64 {
            let size = if tag == 0 { 5000 } else { 3000 };
            let bytes = payload(BatchKind::Data, size, tag);
            journal
                .append(Lane::Data, PartitionHandle(0), &bytes)
                .unwrap()
                .durable()
                .await
                .unwrap();
        }
        let held_path = first_file.clone();
        let gate = disk.hold(move |op, path, pos| {
            op == IoOp::Write && path == held_path && pos == Some(61_440)
        });
        let last_in_file =
            journal.append(Lane::Data, PartitionHandle(0), &payload(BatchKind::Data, 3000, 8));
        let last_in_file = last_in_file.unwrap();
        while !gate.reached() {
            yield_now().await;
        }
        let rolls =
            journal.append(Lane::Data, PartitionHandle(1), &payload(BatchKind::Data, 5000, 9));
        let rolls = rolls.unwrap();
        for _ in 0..500 {
            yield_now().await;
        }
        assert_eq!(last_in_file.position(), Some(JournalPos(61_440)));
        assert_eq!(rolls.position(), Some(JournalPos(65_536)));
        assert!(disk.file_bytes(&second_file).is_none(), "file 1 named before file 0 is durable");
        assert!(rolls.status().is_none());
        let image = disk.crash_image(CrashMode::AllWritten);
        let (_j, _, found, _) =
            open_collect(image, dir, small_config(), JournalPos(0)).await.unwrap();
        assert_eq!(found.len(), 7, "nothing kept past the held commit");
        gate.release();
        last_in_file.durable().await.unwrap();
        rolls.durable().await.unwrap();
    }));
    assert_eq!(journal.stats().files_rolled, 1);
}
