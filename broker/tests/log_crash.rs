//! Crash-consistency tests on the simulated disk: a seeded random workload
//! runs against the log while a hook builds, at every write, sync, rename,
//! open and directory-sync boundary, the disk images a crash there could
//! leave (durable only, everything written, byte prefixes and random tears of
//! the unsynced writes), recovers each, and checks that every acknowledged
//! batch survived intact, nothing else appeared, and offsets are contiguous.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod common;
mod witness_gate;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use common::{drive, make_batch, read_all, small_config, stamped};
use futures_lite::future::{block_on, yield_now};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::{
    reserve_claim_of, reserve_page, segment_path, CorruptDetail, Log, LogConfig, LogError,
    RecordFatal, Ticket, RESERVE_FILE_NAME,
};
use witness_gate::Gate;

const EPOCH: u32 = 3;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

thread_local! {
    /// Crash images whose reopen bounded the search for non-zero bytes by
    /// the written-bytes reservation (`RecoveryReport::reserve_bound`).
    static BOUNDED_REOPENS: Cell<u64> = const { Cell::new(0) };
}

/// The reservation rule on a crash image: when the reservation file claims
/// a bound for a segment, every byte of that segment from the bound on is
/// zero (the committers write nothing there before the claim is synced).
fn assert_reservation_holds(image: &SimStorage, dir: &Path) {
    let Some(page) = image.file_bytes(&dir.join(RESERVE_FILE_NAME)) else { return };
    let Some((base, bound)) = reserve_claim_of(&page) else { return };
    let Some(segment) = image.file_bytes(&segment_path(dir, base)) else { return };
    let from = (bound as usize).min(segment.len());
    if let Some(at) = segment[from..].iter().position(|byte| *byte != 0) {
        panic!("segment {base}: non-zero byte at {} past the claimed bound {bound}", from + at);
    }
}

/// Every batch appended so far: base offset → (stored bytes, ticket).
type Appended = Rc<RefCell<BTreeMap<u64, (Vec<u8>, Ticket)>>>;

/// Recovers `image`, checks it against what was appended and acknowledged,
/// then appends one more batch, syncs, and recovers the synced image again:
/// the repair must leave a log that keeps growing correctly.
fn check_image(
    image: SimStorage,
    acked_below: u64,
    appended: &BTreeMap<u64, Vec<u8>>,
    config: &LogConfig,
) -> bool {
    let dir = Path::new("/p");
    assert_reservation_holds(&image, dir);
    block_on(async {
        let fatal = Rc::new(RecordFatal::default());
        let (log, report) = Log::open(image.clone(), dir, config.clone(), EPOCH + 1, fatal.clone())
            .await
            .unwrap_or_else(|error| panic!("recovery failed: {error}"));
        if report.reserve_bound.is_some() {
            BOUNDED_REOPENS.with(|count| count.set(count.get() + 1));
        }
        let batches = read_all(&log).await;
        let mut expected_next = 0;
        for batch in &batches {
            let base = batch.header.base_offset;
            assert_eq!(base, expected_next, "contiguous offsets");
            let original = appended.get(&base).expect("recovered batch was appended");
            assert_eq!(&batch.bytes.to_vec(), original, "batch at {base} intact");
            expected_next = batch.header.next_offset();
        }
        assert_eq!(report.next_offset.0, expected_next);
        assert!(
            expected_next >= acked_below,
            "acknowledged offsets below {acked_below} lost: log ends at {expected_next}"
        );
        // The recovered log accepts appends and they survive the next crash.
        let extra = make_batch(1, 100, 999_999);
        let appended_extra = drive(&log, async {
            let appended = log.append(&extra).expect("append after recovery");
            appended.ticket.durable().await.expect("durable after recovery");
            appended
        })
        .await;
        assert_eq!(appended_extra.base_offset.0, expected_next);
        let again = image.crash_image(CrashMode::DurableOnly);
        assert_reservation_holds(&again, dir);
        let (log, second) = Log::open(again, dir, config.clone(), EPOCH + 2, fatal.clone())
            .await
            .unwrap_or_else(|error| panic!("second recovery failed: {error}"));
        assert_eq!(second.next_offset.0, expected_next + 1);
        let all = read_all(&log).await;
        assert_eq!(all.len(), batches.len() + 1);
        assert!(fatal.reasons().is_empty());
        report.truncated_at.is_some()
    })
}

/// Runs one seeded workload with the crash explorer installed; returns the
/// number of crash images recovered and checked. `big_bytes`: now and then a
/// batch of about this size (0: none).
fn explore(seed: u64, config: &LogConfig, big_bytes: usize) -> (u64, u64) {
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk.clone(), dir, config.clone(), EPOCH, fatal.clone()))
        .expect("open empty log");
    let appended: Appended = Rc::new(RefCell::new(BTreeMap::new()));
    let explored = Rc::new(Cell::new(0u64));
    let torn = Rc::new(Cell::new(0u64));
    {
        let appended = appended.clone();
        let explored = explored.clone();
        let torn = torn.clone();
        let mut rng = Rng(seed ^ 0xDEAD_BEEF);
        let config = config.clone();
        disk.set_hook(move |disk, _op, _count| {
            let (acked_below, bytes): (u64, BTreeMap<u64, Vec<u8>>) = {
                let appended = appended.borrow();
                let acked_below = appended
                    .iter()
                    .filter(|(_, (_, ticket))| matches!(ticket.status(), Some(Ok(()))))
                    .map(|(base, (bytes, _))| {
                        base + u64::from(u32::from_le_bytes(bytes[32..36].try_into().unwrap()))
                    })
                    .max()
                    .unwrap_or(0);
                let bytes = appended.iter().map(|(k, (b, _))| (*k, b.clone())).collect();
                (acked_below, bytes)
            };
            let unsynced = disk.unsynced_bytes();
            let mut modes = vec![
                CrashMode::DurableOnly,
                CrashMode::AllWritten,
                CrashMode::Torn { seed: rng.next() },
                CrashMode::Torn { seed: rng.next() },
                CrashMode::PowerLoss { seed: rng.next() },
            ];
            if unsynced > 0 {
                modes.push(CrashMode::Prefix { bytes: rng.below(unsynced) });
            }
            for mode in modes {
                if check_image(disk.crash_image(mode), acked_below, &bytes, &config) {
                    torn.set(torn.get() + 1);
                }
                explored.set(explored.get() + 1);
            }
        });
    }
    block_on(drive(&log, async {
        let mut rng = Rng(seed);
        let mut tag = 0u64;
        for _step in 0..160 {
            match rng.below(10) {
                0 if big_bytes > 0 && rng.below(6) == 0 => {
                    tag += 1;
                    let size = big_bytes / 2 + rng.below(big_bytes as u64 / 2) as usize;
                    let batch = make_batch(2, size, tag + seed * 1000);
                    let result = log.append(&batch).expect("append");
                    let stored = stamped(&batch, result.base_offset.0, EPOCH);
                    appended.borrow_mut().insert(result.base_offset.0, (stored, result.ticket));
                }
                0..=5 => {
                    for _ in 0..=rng.below(4) {
                        tag += 1;
                        let records = 1 + rng.below(3) as u32;
                        let batch =
                            make_batch(records, rng.below(3000) as usize, tag + seed * 1000);
                        let result = log.append(&batch).expect("append");
                        let stored = stamped(&batch, result.base_offset.0, EPOCH);
                        appended.borrow_mut().insert(result.base_offset.0, (stored, result.ticket));
                    }
                }
                6..=7 => {
                    let ticket = appended.borrow().values().last().map(|(_, t)| t.clone());
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
        }
        let tickets: Vec<Ticket> = appended.borrow().values().map(|(_, t)| t.clone()).collect();
        for ticket in tickets {
            ticket.durable().await.expect("durable");
        }
    }));
    disk.clear_hook();
    assert!(fatal.reasons().is_empty());
    assert!(log.segments().len() >= 3, "workload rolled segments: {:?}", log.segments().len());
    // The final image, fully synced, holds everything.
    let all: BTreeMap<u64, Vec<u8>> =
        appended.borrow().iter().map(|(k, (b, _))| (*k, b.clone())).collect();
    check_image(disk.crash_image(CrashMode::DurableOnly), log.next_offset().0, &all, config);
    (explored.get(), torn.get())
}

#[test]
fn every_crash_point_keeps_every_acknowledged_batch() {
    // Goal: recovery after a crash at any write/sync/rename/dir-sync boundary, with the
    // in-flight writes torn every which way, keeps all acknowledged batches and nothing foreign.
    // Method: seeded workloads; a hook recovers several crash images at every mutating op.
    let (mut total, mut torn) = (0, 0);
    for seed in [1, 2, 3, 4, 5, 6] {
        let (explored, cut) = explore(seed, &small_config(), 0);
        total += explored;
        torn += cut;
    }
    eprintln!("crash images explored: {total}, of which {torn} needed a torn tail cut");
    assert!(total > 4000, "explored only {total} crash images");
    assert!(torn > 100, "only {torn} images exercised torn-tail repair");
}

#[test]
fn every_crash_point_keeps_every_acknowledged_batch_across_growing_segments() {
    // Goal: the same crash guarantees hold while segments start small and grow (64, 128,
    // 256 KiB): a torn tail in the small first segment, a crash while a grown successor is
    // zero-filled or renamed, and recovery across the mixed sizes, with commits of one big
    // batch (20–40 KiB) among small ones. Method: the crash explorer with a growing config.
    let config = LogConfig {
        segment_bytes: 256 * 1024,
        segment_bytes_initial: 64 * 1024,
        batch_bytes_max: 48 * 1024,
        ..small_config()
    };
    let (mut total, mut torn) = (0, 0);
    for seed in [11, 12] {
        let (explored, cut) = explore(seed, &config, 40 * 1024);
        total += explored;
        torn += cut;
    }
    eprintln!("crash images explored: {total}, of which {torn} needed a torn tail cut");
    assert!(total > 1000, "explored only {total} crash images");
    assert!(torn > 30, "only {torn} images exercised torn-tail repair");
}

#[test]
fn write_or_sync_failure_is_fatal_and_never_acknowledged() {
    // Goal: an injected write or sync error fails the tickets, calls the fatal hook once,
    // and every later append fails. Method: SimStorage fault injection on the Nth op.
    for op in [IoOp::Write, IoOp::Sync] {
        let disk = SimStorage::new();
        let fatal = Rc::new(RecordFatal::default());
        let (log, _) =
            block_on(Log::open(disk.clone(), Path::new("/p"), small_config(), 1, fatal.clone()))
                .unwrap();
        block_on(drive(&log, async {
            let first = log.append(&make_batch(1, 100, 1)).unwrap();
            first.ticket.durable().await.expect("first commit is fine");
            // The first append prepared and named the first segment; the next
            // one is not prepared below the threshold, so the next failing op
            // is the commit's.
            assert!(!log.next_segment_prepared());
            disk.inject_failure(op, 1);
            let second = log.append(&make_batch(1, 100, 2)).unwrap();
            let third = log.append(&make_batch(2, 100, 3)).unwrap();
            assert!(matches!(second.ticket.durable().await, Err(LogError::Failed(_))));
            assert!(matches!(third.ticket.durable().await, Err(LogError::Failed(_))));
            assert!(matches!(log.append(&make_batch(1, 8, 4)), Err(LogError::Failed(_))));
            assert_eq!(log.durable_offset().0, 1, "nothing after the failure is durable");
        }));
        let reasons = fatal.reasons();
        assert_eq!(reasons.len(), 1, "{op}: fatal handler called once");
        assert!(log.failure().is_some());
    }
}

#[test]
fn mid_log_corruption_is_refused_with_file_and_offset() {
    // Goal: a damaged batch far from the tail (sealed segment, or the active segment
    // outside the in-flight window) fails open naming the file and byte, never truncates.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
    let window = small_config().recovery_window_bytes();
    block_on(drive(&log, async {
        let mut tag = 0;
        loop {
            let segments = log.segments();
            let active_end = segments.last().unwrap().data_end;
            if segments.len() >= 3 && active_end > window + 8192 {
                break;
            }
            tag += 1;
            let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
        }
    }));
    let segments = log.segments();
    assert!(segments.len() >= 3);
    // Damage the body of the second batch of the first (sealed) segment.
    let victim = &segments[0].path;
    let mut bytes = disk.file_bytes(victim).unwrap();
    let second = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    bytes[second + 100] ^= 0x01;
    disk.set_file_bytes(victim, bytes.clone());
    let error = block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal.clone()))
        .err()
        .expect("open must refuse");
    match error {
        LogError::Corrupt { path, pos, .. } => {
            assert_eq!(&path, victim);
            assert_eq!(pos, second as u64);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let message = block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("00000000000000000000.log") && message.contains(&second.to_string()));
    bytes[second + 100] ^= 0x01;
    disk.set_file_bytes(victim, bytes);
    // Now damage the first batch of the active segment, which has more than the
    // in-flight window (2 x 16 KiB) of data after it.
    let active = segments.last().unwrap();
    let mut bytes = disk.file_bytes(&active.path).unwrap();
    bytes[70] ^= 0x80;
    disk.set_file_bytes(&active.path, bytes);
    let error = block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal))
        .err()
        .expect("open must refuse");
    assert!(matches!(error, LogError::Corrupt { ref path, pos: 0, .. } if path == &active.path));
}

#[test]
fn damage_to_an_acknowledged_commit_near_the_tail_is_refused_not_cut() {
    // Goal: inside the in-flight window, a flipped bit in a commit that was
    // durable (acknowledged) is told from a torn tail by the watermark a later
    // intact commit recorded in its filler: open refuses naming file and byte
    // instead of cutting the commit and everything after it. The same flip in
    // the last commit, which no later commit vouches for, is still cut.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
    // Three commits, each durable before the next is appended: the third
    // commit's filler records the end of the second as durable.
    let mut positions = Vec::new();
    block_on(drive(&log, async {
        for tag in 1..=3 {
            let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
            positions.push(log.segments().last().unwrap().data_end);
        }
    }));
    let active = log.segments().last().unwrap().path.clone();
    log.close();
    let window = small_config().recovery_window_bytes();
    assert!(positions[2] <= window, "all three commits lie inside the torn-tail window");
    let pristine = disk.file_bytes(&active).unwrap();
    // Damage the first commit's record body (it starts at byte 0).
    let mut bytes = pristine.clone();
    bytes[200] ^= 0x04;
    disk.set_file_bytes(&active, bytes);
    let error = block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal.clone()))
        .err()
        .expect("open must refuse damage below a recorded watermark");
    match &error {
        LogError::Corrupt { path, pos, detail } => {
            assert_eq!(path, &active);
            assert_eq!(*pos, 0);
            let text = detail.to_string();
            assert!(
                text.contains("durable watermark") && text.contains("not a torn tail"),
                "{text}"
            );
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    // The file was not repaired: the damage is still there to look at.
    assert_ne!(disk.file_bytes(&active).unwrap(), pristine);
    // Damage only the last commit of a log whose witness page was lost (a
    // crash after the commit's sync, before the witness page's): no later
    // commit vouches for it, so it is indistinguishable from a torn write
    // and is cut. (With the witness page on disk it is refused:
    // `a_flipped_bit_in_the_last_commit_of_an_idle_log_is_refused`.)
    let mut bytes = pristine.clone();
    let last_start = positions[1] as usize;
    let witness = positions[2] as usize;
    assert!(bytes[witness..witness + 4096].iter().any(|byte| *byte != 0), "a witness page");
    bytes[witness..witness + 4096].fill(0);
    bytes[last_start + 200] ^= 0x04;
    disk.set_file_bytes(&active, bytes);
    let (log, report) =
        block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal.clone())).unwrap();
    assert_eq!(report.truncated_at, Some((active.clone(), positions[1])));
    assert_eq!(block_on(read_all(&log)).len(), 2, "the first two commits are kept");
}

/// The batches of `log` after reopening `disk`, or the refusal.
fn reopen(disk: &SimStorage, config: &LogConfig, epoch: u32) -> Result<usize, LogError> {
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), Path::new("/p"), config.clone(), epoch, fatal))?;
    Ok(block_on(read_all(&log)).len())
}

#[test]
fn a_flipped_bit_in_the_last_commit_of_an_idle_log_is_refused() {
    // Goal: the last acknowledged commit of a log that then went idle has a
    // witness: once the committers are idle, one page holding just a filler
    // whose watermark covers that commit is written and synced where the
    // next commit will start. A flipped bit in that commit is then refused
    // on open (`BelowWatermark`, file and byte, nothing cut) instead of cut
    // like a torn tail. Method: commits one by one (each acknowledged before
    // the next), the log left idle (not closed: the witness is written as
    // soon as the committers are idle), then flip a bit in the last commit,
    // and in each one-commit prefix's last commit of several logs.
    for commits in 1..=3u64 {
        let disk = SimStorage::new();
        let dir = Path::new("/p");
        let fatal = Rc::new(RecordFatal::default());
        let (log, _) =
            block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
        let mut starts = Vec::new();
        block_on(drive(&log, async {
            for tag in 1..=commits {
                starts.push(log.segments().last().map_or(0, |segment| segment.data_end));
                let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
                appended.ticket.durable().await.unwrap();
            }
            // Idle: the committers write the witness page on their own.
            while log.stats().witness_pages < commits {
                yield_now().await;
            }
        }));
        assert_eq!(log.stats().witness_pages, commits, "one witness page per idle transition");
        let active = log.segments().last().unwrap().path.clone();
        let data_end = log.segments().last().unwrap().data_end;
        assert_eq!(data_end, commits * 4096, "the witness pages took no place of their own");
        let pristine = disk.file_bytes(&active).unwrap();
        let last = *starts.last().unwrap() as usize;
        let mut bytes = pristine.clone();
        bytes[last + 200] ^= 0x04;
        disk.set_file_bytes(&active, bytes);
        let error =
            reopen(&disk, &small_config(), 2).expect_err("the last commit was acknowledged");
        match error {
            LogError::Corrupt {
                path,
                pos,
                detail: CorruptDetail::BelowWatermark { offset, watermark, .. },
            } => {
                assert_eq!(path, active);
                assert_eq!(pos, last as u64);
                assert_eq!(offset, commits - 1);
                assert_eq!(watermark, commits, "the witness page covers the last commit");
            }
            other => panic!("expected Corrupt BelowWatermark, got {other}"),
        }
        assert_ne!(disk.file_bytes(&active).unwrap(), pristine, "nothing was repaired");
        // The intact log reopens with every commit, and the next commit
        // reuses the witness page's position.
        disk.set_file_bytes(&active, pristine);
        let (log, report) =
            block_on(Log::open(disk.clone(), dir, small_config(), 3, fatal.clone())).unwrap();
        assert_eq!(report.truncated_at, None);
        assert_eq!(block_on(read_all(&log)).len() as u64, commits);
        assert_eq!(log.segments().last().unwrap().data_end, commits * 4096);
        block_on(drive(&log, async {
            log.append(&make_batch(1, 1000, 99)).unwrap().ticket.durable().await.unwrap();
        }));
        assert_eq!(log.segments().last().unwrap().data_end, (commits + 1) * 4096);
        assert!(fatal.reasons().is_empty());
    }
}

#[test]
fn a_witness_page_waits_out_its_delay_and_a_commit_within_it_vouches_instead() {
    // Goal: with a witness delay, an idle transition followed by a commit within the delay
    // costs no page and no sync (that commit's filler records the durable watermark, so
    // damage to the commits before it is still refused); the page comes once the delay runs
    // out with the log still idle, and only then is damage to the last commit refused rather
    // than cut: the window the delay trades for one write and sync less per commit of a
    // thin stream. Method: three 1-page commits one by one under a delay the test ends by
    // hand; count pages, syncs and delays; flip a bit in the second and the last commit of
    // crash images taken before and after the delay ran out; reopen each.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
    let gate = Rc::new(Gate::default());
    log.set_witness_delay(gate.delay());
    let settle = || async {
        for _ in 0..300 {
            yield_now().await;
        }
    };
    let (starts, syncs, before, after) = block_on(drive(&log, async {
        let mut starts = Vec::new();
        let mut syncs = 0;
        for tag in 1..=3u64 {
            starts.push(log.segments().last().map_or(0, |segment| segment.data_end));
            let syncs_before = disk.count(IoOp::Sync);
            let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
            settle().await;
            if tag > 1 {
                syncs += disk.count(IoOp::Sync) - syncs_before;
            }
        }
        assert_eq!(log.stats().witness_pages, 0, "no page within the delay");
        assert_eq!(gate.made.get(), 3, "one delay per idle transition");
        let before = disk.crash_image(CrashMode::DurableOnly);
        gate.open();
        settle().await;
        assert_eq!(log.stats().witness_pages, 1, "the delay ran out idle: one page");
        (starts, syncs, before, disk.crash_image(CrashMode::DurableOnly))
    }));
    assert_eq!(syncs, 2, "the second and third commits: one sync each, no page's");
    assert!(fatal.reasons().is_empty());
    let active = log.segments().last().unwrap().path.clone();
    let flipped = |image: &SimStorage, at: u64| {
        let damaged = image.crash_image(CrashMode::DurableOnly);
        let mut bytes = damaged.file_bytes(&active).unwrap();
        bytes[at as usize + 200] ^= 0x04;
        damaged.set_file_bytes(&active, bytes);
        damaged
    };
    let refused_at = |result: Result<usize, LogError>, at: u64| match result {
        Err(LogError::Corrupt { pos, detail: CorruptDetail::BelowWatermark { .. }, .. }) => {
            assert_eq!(pos, at);
        }
        other => panic!("expected Corrupt BelowWatermark at {at}, got {other:?}"),
    };
    // Within the delay: the second commit is vouched for by the third's filler.
    refused_at(reopen(&flipped(&before, starts[1]), &small_config(), 2), starts[1]);
    // ... the last one by nothing yet: damage to it is cut like a torn tail.
    assert_eq!(reopen(&flipped(&before, starts[2]), &small_config(), 2).unwrap(), 2);
    // After the delay its page vouches for it: refused.
    refused_at(reopen(&flipped(&after, starts[2]), &small_config(), 2), starts[2]);
    assert_eq!(reopen(&after, &small_config(), 2).unwrap(), 3);
}

#[test]
fn one_by_one_traffic_uses_one_page_and_two_syncs_per_commit() {
    // Goal: a producer that waits for every reply makes every commit an idle
    // transition; the witness page it leaves is reused by the next commit,
    // so such traffic uses one page per commit (not two), one extra sync per
    // commit, and segments roll as without witness pages. A segment sealed
    // after a witness page (which lies past its indexed data end) reopens
    // with its index file accepted. Method: 1-page commits one by one into
    // 64 KiB segments; count pages, syncs and rolls; reopen.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    // 1 MiB segments: 15 pages stay below the threshold that prepares the
    // next segment (whose syncs would be counted too).
    let config =
        LogConfig { segment_bytes: 1 << 20, segment_bytes_initial: 1 << 20, ..small_config() };
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 1, fatal.clone())).unwrap();
    let (syncs, witness_pages, commits) = block_on(drive(&log, async {
        // The first append prepares and names the first segment.
        log.append(&make_batch(1, 1000, 0)).unwrap().ticket.durable().await.unwrap();
        while log.stats().witness_pages < 1 {
            yield_now().await;
        }
        let syncs_before = disk.count(IoOp::Sync);
        for tag in 1..=14 {
            let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
            while log.stats().witness_pages < tag + 1 {
                yield_now().await;
            }
        }
        (disk.count(IoOp::Sync) - syncs_before, log.stats().witness_pages, log.stats().commits)
    }));
    assert_eq!(commits, 15);
    assert_eq!(witness_pages, 15);
    assert_eq!(syncs, 14 * 2, "one sync for each commit and one for its witness page");
    let segments = log.segments();
    assert_eq!(segments.len(), 1);
    assert_eq!(segments[0].data_end, 15 * 4096, "one page per commit");
    // Three-page commits into the 16-page segments: five of them leave one
    // page, which takes the witness; the sixth rolls. The sealed segment then
    // ends with a witness page past its indexed data end.
    let config = LogConfig { batch_bytes_max: 12 * 1024, ..small_config() };
    let disk = SimStorage::new();
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 1, fatal.clone())).unwrap();
    block_on(drive(&log, async {
        for tag in 1..=7 {
            let appended = log.append(&make_batch(1, 9000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
            while log.stats().witness_pages < tag {
                yield_now().await;
            }
        }
    }));
    let segments = log.segments();
    assert_eq!(segments.len(), 2, "the sixth commit rolled");
    assert_eq!(segments[0].data_end, 15 * 4096);
    let sealed = disk.file_bytes(&segments[0].path).unwrap();
    assert!(sealed[15 * 4096..].iter().any(|byte| *byte != 0), "a witness page ends it");
    let (log, report) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 2, fatal.clone())).unwrap();
    assert_eq!(report.indexes_rebuilt, 0, "the sealed index is accepted as written");
    assert_eq!(report.truncated_at, None);
    assert_eq!(block_on(read_all(&log)).len(), 7);
    assert!(fatal.reasons().is_empty());
}

#[test]
fn no_commit_write_starts_before_the_witness_page_it_reuses_is_synced() {
    // Goal: the next commit reuses the witness page's position, so its write
    // must not start while that page's write (or sync) is still in flight:
    // two writes to one page in flight may land in either order. Method:
    // hold the witness page's write, append, let everything else run; no
    // other write may be issued and the append stays unacknowledged until
    // the page is released.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
    block_on(drive(&log, async {
        log.append(&make_batch(1, 1000, 1)).unwrap().ticket.durable().await.unwrap();
        while log.stats().witness_pages < 1 {
            yield_now().await;
        }
        // The second commit's witness page (at page 2) is held.
        let gate = disk.hold(|op, _, pos| op == IoOp::Write && pos == Some(2 * 4096));
        log.append(&make_batch(1, 1000, 2)).unwrap().ticket.durable().await.unwrap();
        for _ in 0..20 {
            yield_now().await;
        }
        assert!(gate.reached(), "the witness page's write was issued and held");
        let writes = disk.count(IoOp::Write);
        let third = log.append(&make_batch(1, 1000, 3)).unwrap();
        for _ in 0..200 {
            yield_now().await;
        }
        assert_eq!(disk.count(IoOp::Write), writes, "no write while the witness page's is held");
        assert!(third.ticket.status().is_none(), "the third commit waits for the witness page");
        gate.release();
        third.ticket.durable().await.unwrap();
    }));
    assert_eq!(log.segments().last().unwrap().data_end, 3 * 4096);
    assert_eq!(reopen(&disk, &small_config(), 2).unwrap(), 3);
    assert!(fatal.reasons().is_empty());
}

#[test]
fn every_crash_point_around_witness_pages_keeps_every_acknowledged_commit() {
    // Goal: crash images at every write and sync of witness pages and of the
    // commits that reuse their pages (durable only, all written, byte
    // prefixes, random tears, power loss) lose no acknowledged commit and
    // never refuse to open after such an ordinary crash. Method: idle
    // transitions after one, two and several commits (some overlapping), the
    // crash explorer's checks at every mutating op.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let config = small_config();
    let (log, _) = block_on(Log::open(disk.clone(), dir, config.clone(), EPOCH, fatal.clone()))
        .expect("open empty log");
    let appended: Appended = Rc::new(RefCell::new(BTreeMap::new()));
    let explored = Rc::new(Cell::new(0u64));
    {
        let appended = appended.clone();
        let explored = explored.clone();
        let mut rng = Rng(77);
        let config = config.clone();
        disk.set_hook(move |disk, _op, _count| {
            let (acked_below, bytes): (u64, BTreeMap<u64, Vec<u8>>) = {
                let appended = appended.borrow();
                let acked_below = appended
                    .iter()
                    .filter(|(_, (_, ticket))| matches!(ticket.status(), Some(Ok(()))))
                    .map(|(base, (bytes, _))| {
                        base + u64::from(u32::from_le_bytes(bytes[32..36].try_into().unwrap()))
                    })
                    .max()
                    .unwrap_or(0);
                let bytes = appended.iter().map(|(k, (b, _))| (*k, b.clone())).collect();
                (acked_below, bytes)
            };
            let unsynced = disk.unsynced_bytes();
            let mut modes = vec![CrashMode::DurableOnly, CrashMode::AllWritten];
            for _ in 0..3 {
                modes.push(CrashMode::Torn { seed: rng.next() });
                modes.push(CrashMode::PowerLoss { seed: rng.next() });
            }
            if unsynced > 0 {
                for _ in 0..3 {
                    modes.push(CrashMode::Prefix { bytes: rng.below(unsynced) });
                }
            }
            for mode in modes {
                check_image(disk.crash_image(mode), acked_below, &bytes, &config);
                explored.set(explored.get() + 1);
            }
        });
    }
    let mut tag = 0;
    block_on(drive(&log, async {
        for round in 0..24u64 {
            let count = 1 + round % 4;
            let mut last = None;
            for _ in 0..count {
                tag += 1;
                let size = [500, 3000, 7000][(tag % 3) as usize];
                let batch = make_batch(1, size, tag);
                let result = log.append(&batch).expect("append");
                let stored = stamped(&batch, result.base_offset.0, EPOCH);
                last = Some(result.ticket.clone());
                appended.borrow_mut().insert(result.base_offset.0, (stored, result.ticket));
                if round % 2 == 0 {
                    yield_now().await;
                }
            }
            last.unwrap().durable().await.expect("durable");
            let witnessed = log.stats().witness_pages;
            // Idle until the witness page is synced, or (every third round)
            // append again at once, while it may be in flight.
            if round % 3 != 2 {
                while log.stats().witness_pages == witnessed {
                    yield_now().await;
                }
            }
        }
    }));
    disk.clear_hook();
    assert!(fatal.reasons().is_empty());
    assert!(log.stats().witness_pages >= 16, "{:?}", log.stats());
    assert!(log.segments().len() >= 2, "the workload rolled");
    let all: BTreeMap<u64, Vec<u8>> =
        appended.borrow().iter().map(|(k, (b, _))| (*k, b.clone())).collect();
    check_image(disk.crash_image(CrashMode::DurableOnly), log.next_offset().0, &all, &config);
    eprintln!("crash images explored: {}", explored.get());
    assert!(explored.get() > 1000, "explored only {}", explored.get());
}

#[test]
fn the_filler_that_ends_the_log_vouches_for_the_commit_before_it() {
    // Goal: the watermark search reads the filler whose header holds the
    // last non-zero byte of the segment. A filler's body is zeros and its
    // header ends in zero bytes, so the log's last non-zero byte lies inside
    // that header; the search used to stop at that byte, never parsed the
    // header, and so cut a damaged acknowledged commit that the next
    // commit's filler vouched for. Method: two one-page commits, each
    // durable before the next; flip a bit in the first; reopen.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, small_config(), 1, fatal.clone())).unwrap();
    block_on(drive(&log, async {
        for tag in 1..=2 {
            let appended = log.append(&make_batch(1, 1000, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
        }
    }));
    let active = log.segments().last().unwrap().path.clone();
    let mut pristine = disk.file_bytes(&active).unwrap();
    // The witness page the idle log wrote at page 2 would vouch for both
    // commits; without it (a crash before it was written) the second
    // commit's filler is the only witness of the first.
    assert!(pristine[8192..12288].iter().any(|byte| *byte != 0), "a witness page");
    pristine[8192..12288].fill(0);
    let last_nonzero = pristine.iter().rposition(|byte| *byte != 0).unwrap();
    // The second commit starts on page 1; its filler follows its one batch.
    let filler = 4096 + make_batch(1, 1000, 2).len();
    let header_end = filler + spool_wire::limits::BATCH_HEADER_BYTES;
    assert!(
        (filler..header_end - 1).contains(&last_nonzero),
        "the last non-zero byte ({last_nonzero}) lies inside the last filler's header \
         ({filler}..{header_end}), before its end"
    );
    let mut bytes = pristine;
    bytes[200] ^= 0x04;
    disk.set_file_bytes(&active, bytes);
    let error = block_on(Log::open(disk.clone(), dir, small_config(), 2, fatal.clone()))
        .err()
        .expect("open must refuse damage the second commit's filler vouches for");
    match error {
        LogError::Corrupt {
            path,
            pos,
            detail: CorruptDetail::BelowWatermark { offset, watermark, .. },
        } => {
            assert_eq!(path, active);
            assert_eq!(pos, 0);
            assert_eq!(offset, 0);
            assert_eq!(watermark, 1, "the second commit was built after the first was durable");
        }
        other => panic!("expected Corrupt BelowWatermark, got {other}"),
    }
}

#[test]
fn backpressure_is_a_typed_error_and_writable_waits_for_space() {
    // Goal: appends beyond pending_bytes_max fail with Backpressure without queuing,
    // and space returns once the committer drains.
    let disk = SimStorage::new();
    let config = spool_broker::log::LogConfig { pending_bytes_max: 16 * 1024, ..small_config() };
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk, Path::new("/p"), config, 1, fatal)).unwrap();
    let batch = make_batch(1, 4000, 7);
    let mut accepted = 0;
    let error = loop {
        match log.append(&batch) {
            Ok(_) => accepted += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(accepted, 4, "four 4064-byte batches fit under 16 KiB, a fifth does not");
    assert!(matches!(error, LogError::Backpressure { limit_bytes: 16384, .. }));
    block_on(drive(&log, async {
        log.writable(spool_wire::batch::BatchKind::Data, batch.len() as u64).await;
        let appended = log.append(&batch).expect("space after drain");
        appended.ticket.durable().await.unwrap();
    }));
    assert_eq!(log.durable_offset().0, 5);
}

#[test]
fn data_appends_stop_at_the_data_bound_and_control_events_pass_them() {
    // Goal: producer data cannot fill the whole pending budget, so a claim or ack (a control
    // batch) never queues behind more than `data_pending_bytes_max` of data. Method: data
    // appends until Backpressure at the 8 KiB data bound; a control batch still appends (the
    // 16 KiB bound), and `writable(Data)` waits while `writable(Control)` does not.
    use spool_wire::batch::{BatchKind, ControlBatchBuilder};
    let disk = SimStorage::new();
    let config = spool_broker::log::LogConfig {
        pending_bytes_max: 16 * 1024,
        data_pending_bytes_max: 8 * 1024,
        ..small_config()
    };
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk, Path::new("/p"), config, 1, fatal)).unwrap();
    let batch = make_batch(1, 4000, 7);
    let mut accepted = 0;
    let error = loop {
        match log.append(&batch) {
            Ok(_) => accepted += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(accepted, 2, "two 4064-byte data batches fit under the 8 KiB data bound");
    assert!(matches!(error, LogError::Backpressure { limit_bytes: 8192, .. }));
    let mut control = ControlBatchBuilder::new();
    control.push(1, &[0u8; 64]).unwrap();
    let control = control.finish().unwrap();
    let before = log.durable_offset().0;
    block_on(async {
        // Control room exists now: this resolves without any commit draining.
        log.writable(BatchKind::Control, control.len() as u64).await;
    });
    assert_eq!(log.durable_offset().0, before, "nothing drained while checking control room");
    let appended = log.append(&control).expect("a control batch passes the data bound");
    block_on(drive(&log, async {
        appended.ticket.durable().await.unwrap();
        log.writable(BatchKind::Data, batch.len() as u64).await;
        log.append(&batch).expect("data room after the drain").ticket.durable().await.unwrap();
    }));
    assert_eq!(log.durable_offset().0, 4, "two data, one control, one more data record");
}

#[test]
fn stats_count_durable_commits_batches_and_records() {
    // Goal: LogStats counts commits, batches, records (offsets, not batches) and whole-page
    // commit bytes once durable. Method: gather three multi-record batches before the
    // committers run (one commit), then one more batch alone (a second commit).
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk, Path::new("/p"), small_config(), 1, fatal)).unwrap();
    let gathered: Vec<Ticket> = (1..=3u32)
        .map(|records| log.append(&make_batch(records, 300, u64::from(records))).unwrap().ticket)
        .collect();
    assert_eq!(log.stats().commits, 0, "nothing is durable before a committer runs");
    block_on(drive(&log, async {
        for ticket in &gathered {
            ticket.durable().await.unwrap();
        }
        let stats = log.stats();
        assert_eq!((stats.commits, stats.batches, stats.records), (1, 3, 6));
        let alone = log.append(&make_batch(4, 300, 9)).unwrap();
        alone.ticket.durable().await.unwrap();
    }));
    let stats = log.stats();
    assert_eq!(stats.commits, 2);
    assert_eq!(stats.batches, 4);
    assert_eq!(stats.records, 10);
    assert_eq!(stats.records, log.durable_offset().0);
    assert_eq!(stats.commit_bytes, 2 * 4096, "each small commit is one page");
}

#[test]
fn a_gather_grows_past_its_first_buffer_and_keeps_every_byte() {
    // Goal: a commit's buffer starts at GATHER_BUF_INITIAL_BYTES and grows as batches
    // gather, keeping what was already copied in. Method: a 1 MiB commit size, 40 batches of
    // ~7 KiB gathered before any committer runs (one commit of ~280 KiB: four doublings),
    // then read back every batch after a reopen and compare bytes.
    use spool_broker::limits::GATHER_BUF_INITIAL_BYTES;
    let config = spool_broker::log::LogConfig {
        segment_bytes: 4 << 20,
        segment_bytes_initial: 4 << 20,
        commit_bytes: 1 << 20,
        pending_bytes_max: 2 << 20,
        data_pending_bytes_max: 2 << 20,
        tail_cache_bytes: 4 << 20,
        ..small_config()
    };
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let dir = Path::new("/p");
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 1, fatal.clone())).unwrap();
    let mut expected = Vec::new();
    let mut tickets = Vec::new();
    let mut next = 0u64;
    for tag in 0..40u64 {
        let batch = make_batch(3, 7000, tag);
        let appended = log.append(&batch).unwrap();
        expected.push(stamped(&batch, next, 1));
        next = appended.next_offset.0;
        tickets.push(appended.ticket);
    }
    let gathered: usize = expected.iter().map(Vec::len).sum();
    assert!(gathered as u64 > 4 * GATHER_BUF_INITIAL_BYTES, "the gather outgrew its first buffer");
    block_on(drive(&log, async {
        for ticket in &tickets {
            ticket.durable().await.unwrap();
        }
    }));
    assert_eq!(log.stats().commits, 1, "one commit held every batch");
    let (reopened, _) =
        block_on(Log::open(disk.crash_image(CrashMode::DurableOnly), dir, config, 2, fatal))
            .unwrap();
    let batches = block_on(read_all(&reopened));
    let read: Vec<Vec<u8>> = batches.into_iter().map(|batch| batch.bytes.to_vec()).collect();
    assert_eq!(read, expected);
}

#[test]
fn the_tail_cache_holds_no_more_memory_than_its_bound() {
    // Goal: the tail cache is bounded by the memory its buffers hold, not by the bytes
    // committed into them: a small commit gathered in a GATHER_BUF_INITIAL_BYTES buffer
    // must not pin the whole buffer (it did: 16× the bound with one-page commits), and
    // everything the cache reads from is still served from it. Method: a 256 KiB cache,
    // 300 one-page commits made durable one at a time; then the disk's live write-buffer
    // bytes (every allocation at its full size) must be within the bound plus the one
    // open gather, and the cache still serves the newest commits' batches.
    use spool_broker::limits::GATHER_BUF_INITIAL_BYTES;
    let tail_cache_bytes = 256 << 10;
    let config = spool_broker::log::LogConfig {
        segment_bytes: 4 << 20,
        segment_bytes_initial: 4 << 20,
        commit_bytes: 1 << 20,
        pending_bytes_max: 2 << 20,
        data_pending_bytes_max: 2 << 20,
        tail_cache_bytes,
        ..small_config()
    };
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk.clone(), Path::new("/p"), config, 1, fatal)).unwrap();
    let mut newest = Vec::new();
    block_on(drive(&log, async {
        for tag in 0..300u64 {
            let batch = make_batch(1, 1500, tag);
            let appended = log.append(&batch).unwrap();
            appended.ticket.durable().await.unwrap();
            newest = stamped(&batch, appended.next_offset.0 - 1, 1);
        }
        let live = disk.live_buf_bytes();
        assert!(
            live <= tail_cache_bytes + GATHER_BUF_INITIAL_BYTES,
            "{live} bytes of write buffers alive against a {tail_cache_bytes}-byte cache"
        );
        let read = log.read(spool_broker::log::Offset(299), 4096).await.unwrap();
        assert_eq!(read[0].bytes.to_vec(), newest);
    }));
    assert_eq!(log.stats().commits, 300, "each append committed alone");
}

// Goal: committers never write further ahead of the durable watermark than
// the recovery window allows (issue: a crash during one slow commit left
// more unsynced bytes than `recovery_window_bytes`, and the partition then
// refused to open after an ordinary crash). Method: hold the write of one
// commit (a slow write), keep appending so the other committer runs ahead,
// take the disk a crash at that moment leaves, and reopen it: recovery must
// treat the hole as a torn tail (the held commit and everything after it
// were never acknowledged) and keep every acknowledged batch.
#[test]
fn a_slow_commit_never_lets_later_commits_run_past_the_recovery_window() {
    let config =
        LogConfig { segment_bytes: 1 << 20, segment_bytes_initial: 1 << 20, ..small_config() };
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), EPOCH, fatal.clone())).unwrap();
    let warm = make_batch(1, 6000, 0);
    let (image, held_reached) = block_on(drive(&log, async {
        log.append(&warm).unwrap().ticket.durable().await.unwrap();
        // The witness page of the idle log is written first: the held write
        // is a commit's.
        while log.stats().witness_pages < 1 {
            yield_now().await;
        }
        let gate = disk.hold(|op, _, _| op == IoOp::Write);
        let mut tickets = Vec::new();
        for tag in 1..=12 {
            tickets.push(log.append(&make_batch(1, 6000, tag)).unwrap().ticket);
            for _ in 0..50 {
                yield_now().await;
            }
        }
        let reached = gate.reached();
        // A crash now: the held commit never reached the disk.
        let image = disk.crash_image(CrashMode::DurableOnly);
        gate.release();
        for ticket in tickets {
            ticket.durable().await.unwrap();
        }
        (image, reached)
    }));
    assert!(held_reached, "the commit write was held");
    let (reopened, report) = block_on(Log::open(image, dir, config.clone(), EPOCH + 1, fatal))
        .unwrap_or_else(|error| panic!("an ordinary crash must recover: {error}"));
    let batches = block_on(read_all(&reopened));
    assert_eq!(batches.len(), 1, "the acknowledged batch, and nothing after the hole");
    assert_eq!(batches[0].bytes.to_vec(), stamped(&warm, 0, EPOCH), "acked batch kept intact");
    assert_eq!(report.next_offset.0, 1, "nothing after the hole survives: none of it was acked");
}

/// Commits one by one (each acknowledged, then idle until its witness
/// page is synced) of `size` bytes each; returns where each commit started.
fn commits_one_by_one(log: &Log<SimStorage>, count: u64, size: usize) -> Vec<u64> {
    let mut starts = Vec::new();
    block_on(drive(log, async {
        for tag in 1..=count {
            starts.push(log.segments().last().map_or(0, |segment| segment.data_end));
            let witnessed = log.stats().witness_pages;
            let appended = log.append(&make_batch(1, size, tag)).unwrap();
            appended.ticket.durable().await.unwrap();
            while log.stats().witness_pages == witnessed {
                yield_now().await;
            }
        }
    }));
    starts
}

#[test]
fn a_reopen_reads_the_written_bytes_not_the_segment_capacity() {
    // Goal: the reopen of a large active segment holding little data reads
    // about the written bytes plus one reservation step, not the segment's
    // capacity: recovery's search for non-zero bytes after the last valid
    // batch stops at the durable written-bytes bound. Fails on a search that
    // runs to the capacity (64 MiB read). Method: a 64 MiB segment, 3 MiB
    // of data in 1 MiB steps, reopen, read counts from the report.
    let config = LogConfig {
        segment_bytes: 64 << 20,
        segment_bytes_initial: 64 << 20,
        commit_bytes: 256 * 1024,
        batch_bytes_max: 64 * 1024,
        pending_bytes_max: 4 << 20,
        data_pending_bytes_max: 4 << 20,
        reserve_step_bytes: 1 << 20,
        ..small_config()
    };
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 1, fatal.clone())).unwrap();
    block_on(drive(&log, async {
        for tag in 0..100u64 {
            let appended = log.append(&make_batch(2, 30_000, tag)).unwrap();
            if tag % 10 == 9 {
                appended.ticket.durable().await.unwrap();
            }
        }
    }));
    let written = log.segments().last().unwrap().data_end;
    assert!(written > 2 << 20, "the workload wrote {written} bytes");
    assert!(log.stats().reservations >= 3, "the bound was extended: {:?}", log.stats());
    log.close();
    let capacity = 64u64 << 20;
    let (log, report) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 2, fatal.clone())).unwrap();
    assert_eq!(block_on(read_all(&log)).len(), 100);
    let bound = report.reserve_bound.expect("the reservation bounded the search");
    assert!(bound >= written && bound <= written + (1 << 20) + 4096, "bound {bound}");
    // The scan re-reads the pages of a batch that straddles a read chunk.
    assert!(
        report.scan_bytes_read <= bound + (256 << 10) && report.scan_bytes_read < capacity / 8,
        "read {} bytes for {written} written (capacity {capacity})",
        report.scan_bytes_read
    );
    assert!(!report.reserve_rejected);
    // A data directory without the reservation file (an older version) is
    // searched to the capacity, as before.
    block_on(spool_broker::io::Storage::remove(&disk, &dir.join(RESERVE_FILE_NAME))).unwrap();
    let (log, report) = block_on(Log::open(disk.clone(), dir, config, 3, fatal.clone())).unwrap();
    assert_eq!(block_on(read_all(&log)).len(), 100);
    assert_eq!(report.reserve_bound, None);
    assert!(report.scan_bytes_read >= capacity, "read {}", report.scan_bytes_read);
    assert!(fatal.reasons().is_empty());
}

#[test]
fn every_crash_point_of_the_reservation_path_keeps_every_acknowledged_batch() {
    // Goal: crash images at every write and sync of the reservation file and
    // of the commits around its extensions (durable only, all written, byte
    // prefixes, random tears, power loss) lose no acknowledged batch, open
    // without a refusal, and never hold a non-zero byte past a bound the
    // reservation file claims (checked on every image). Method: the crash
    // explorer with an 8 KiB step over growing segments, so nearly every
    // commit extends the bound, ahead of need beside a commit or waited for.
    let config = LogConfig {
        segment_bytes: 256 * 1024,
        segment_bytes_initial: 64 * 1024,
        batch_bytes_max: 48 * 1024,
        reserve_step_bytes: 8 * 1024,
        ..small_config()
    };
    BOUNDED_REOPENS.with(|count| count.set(0));
    let (mut total, mut torn) = (0, 0);
    for seed in [21, 22, 23] {
        let (explored, cut) = explore(seed, &config, 40 * 1024);
        total += explored;
        torn += cut;
    }
    let bounded = BOUNDED_REOPENS.with(Cell::get);
    eprintln!("crash images explored: {total}, {torn} cut a torn tail, {bounded} bounded");
    assert!(total > 1000, "explored only {total} crash images");
    assert!(torn > 30, "only {torn} images exercised torn-tail repair");
    assert!(bounded > total / 2, "only {bounded} of {total} reopens used the reservation");
}

#[test]
fn a_stale_or_absent_reservation_falls_back_and_damage_is_still_refused() {
    // Goal: a reservation that is missing, damaged, for another segment, or
    // stale (below bytes on disk) never turns damage to an acknowledged
    // commit into a cut: recovery searches to the capacity, finds the later
    // intact commit that vouches for the damaged one, and refuses
    // (BelowWatermark). A claim below valid batches is rejected and every
    // batch is kept. Method: commits one by one in a 1 MiB segment with an
    // 8 KiB step, a flipped bit in the first commit, then each kind of
    // reservation file; the stale claim (4 KiB) lies below the second
    // commit, so a search bounded by it would see no vouching commit.
    let config = LogConfig {
        segment_bytes: 1 << 20,
        segment_bytes_initial: 1 << 20,
        reserve_step_bytes: 8 * 1024,
        ..small_config()
    };
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 1, fatal.clone())).unwrap();
    let starts = commits_one_by_one(&log, 4, 1000);
    assert_eq!(starts, vec![0, 4096, 8192, 12288]);
    assert!(log.stats().reservations >= 2, "{:?}", log.stats());
    let active = log.segments().last().unwrap().path.clone();
    log.close();
    let reserve = dir.join(RESERVE_FILE_NAME);
    let genuine = disk.file_bytes(&reserve).unwrap();
    let (base, bound) = reserve_claim_of(&genuine).expect("a claim");
    assert_eq!(base, 0);
    assert!(bound > 16384 && bound < 1 << 20, "bound {bound}");
    // Intact: every commit kept, the search bounded.
    let (_, report) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 2, fatal.clone())).unwrap();
    assert_eq!(report.reserve_bound, Some(bound));
    // A claim below valid batches (stale, no damage): rejected, nothing lost.
    disk.set_file_bytes(&reserve, reserve_page(0, 8192));
    let (log, report) =
        block_on(Log::open(disk.clone(), dir, config.clone(), 2, fatal.clone())).unwrap();
    assert!(report.reserve_rejected);
    assert_eq!(report.reserve_bound, None);
    assert_eq!(block_on(read_all(&log)).len(), 4);
    log.close();
    let mut damaged = disk.file_bytes(&active).unwrap();
    damaged[200] ^= 0x04;
    let mut flipped = genuine.clone();
    flipped[17] ^= 0x01;
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("the genuine claim", Some(genuine.clone())),
        ("no reservation file", None),
        ("a flipped bit in the claim", Some(flipped)),
        ("a claim for another segment", Some(reserve_page(1 << 40, 8192))),
        ("a stale claim below the second commit", Some(reserve_page(0, 4096))),
    ];
    for (case, page) in cases {
        disk.set_file_bytes(&active, damaged.clone());
        match page {
            Some(page) => {
                if disk.file_bytes(&reserve).is_none() {
                    block_on(spool_broker::io::Storage::open(&disk, &reserve)).unwrap();
                }
                disk.set_file_bytes(&reserve, page);
            }
            None => {
                if disk.file_bytes(&reserve).is_some() {
                    block_on(spool_broker::io::Storage::remove(&disk, &reserve)).unwrap();
                }
            }
        }
        let error = reopen(&disk, &config, 3).expect_err(case);
        match error {
            LogError::Corrupt { path, pos: 0, detail: CorruptDetail::BelowWatermark { .. } } => {
                assert_eq!(path, active, "{case}");
            }
            other => panic!("{case}: expected Corrupt BelowWatermark at 0, got {other}"),
        }
        assert_eq!(disk.file_bytes(&active).unwrap(), damaged, "{case}: nothing was cut");
    }
    assert!(fatal.reasons().is_empty());
}
