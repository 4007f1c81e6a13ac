//! Segments that start small and grow (`segment-format.md` "Segment sizes"):
//! an empty log holds no zero-filled segment, the first append prepares one
//! of `segment_bytes_initial`, each next one doubles up to `segment_bytes`,
//! the successor is prepared only past `SEGMENT_PREPARE_AT_PERCENT` of the
//! active one, and recovery and retention work over the mixed sizes.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::rc::Rc;

use common::{drive, make_batch, read_all, stamped};
use futures_lite::future::{block_on, yield_now};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::limits::{PAGE_BYTES, SEGMENT_PREPARE_AT_PERCENT};
use spool_broker::log::{
    segment_path, Log, LogConfig, LogError, Offset, RecordFatal, PREPARED_FILE_NAME,
};
use spool_wire::limits::BATCH_HEADER_BYTES;

const KIB: u64 = 1024;

/// First segment 64 KiB, growing to 512 KiB; one-page commits are easy to count.
fn growth_config() -> LogConfig {
    LogConfig {
        segment_bytes: 512 * KIB,
        segment_bytes_initial: 64 * KIB,
        commit_bytes: 16 * KIB,
        batch_bytes_max: 160 * KIB,
        inflight_commits_max: 2,
        pending_bytes_max: 1 << 20,
        data_pending_bytes_max: 1 << 20,
        index_interval_bytes: 4096,
        tail_cache_bytes: 32 * KIB,
        reserve_step_bytes: LogConfig::default().reserve_step_bytes,
    }
}

/// A batch whose commit is exactly one page (no filler needed).
fn page_batch(tag: u64) -> Vec<u8> {
    make_batch(1, PAGE_BYTES as usize - BATCH_HEADER_BYTES, tag)
}

/// Sizes of the segment files, oldest first.
fn segment_file_sizes(disk: &SimStorage, log: &Log<SimStorage>) -> Vec<u64> {
    log.segments()
        .iter()
        .map(|segment| disk.file_bytes(&segment.path).map_or(0, |bytes| bytes.len() as u64))
        .collect()
}

fn open(disk: &SimStorage, config: LogConfig) -> Log<SimStorage> {
    let fatal = Rc::new(RecordFatal::default());
    block_on(Log::open(disk.clone(), Path::new("/p"), config, 1, fatal)).unwrap().0
}

#[test]
fn an_empty_log_holds_no_zero_filled_segment_until_its_first_append() {
    // Goal: opening an empty log writes no zeros and prepares nothing (the cost that made a
    // 1,000-partition queue write 128 GB); the first append prepares the first segment at
    // segment_bytes_initial and is durable. Method: SimStorage file sizes and names after open,
    // after running the background with no append, and after one append.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let log = open(&disk, growth_config());
    block_on(drive(&log, async {
        for _ in 0..50 {
            yield_now().await;
        }
        assert!(!log.next_segment_prepared(), "an empty log prepares nothing at open");
    }));
    assert_eq!(disk.file_bytes(&segment_path(dir, 0)).map(|b| b.len()), Some(0));
    assert!(!disk.names_in(dir).contains(&PREPARED_FILE_NAME.to_owned()));

    let log = open(&disk, growth_config());
    let batch = make_batch(2, 100, 7);
    block_on(drive(&log, async {
        let appended = log.append(&batch).unwrap();
        appended.ticket.durable().await.unwrap();
    }));
    assert_eq!(segment_file_sizes(&disk, &log), vec![64 * KIB]);
    assert_eq!(log.segments().len(), 1, "the first segment replaced the empty file");
    let reopened = open(&disk.crash_image(CrashMode::DurableOnly), growth_config());
    let batches = block_on(read_all(&reopened));
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].bytes, stamped(&batch, 0, 1));
}

#[test]
fn segment_sizes_double_from_the_initial_size_to_segment_bytes() {
    // Goal: segment files are 64, 128, 256, 512, 512 KiB as the log fills (start small,
    // double, cap at segment_bytes), and a reopen continues the doubling from the last
    // segment's size. Method: one-page commits on SimStorage; file sizes from the disk.
    let disk = SimStorage::new();
    let log = open(&disk, growth_config());
    let pages = (64 + 128 + 256 + 512 + 100) * KIB / PAGE_BYTES;
    block_on(drive(&log, async {
        for tag in 0..pages {
            log.append(&page_batch(tag)).unwrap().ticket.durable().await.unwrap();
        }
    }));
    let sizes: Vec<u64> = segment_file_sizes(&disk, &log).iter().map(|b| b / KIB).collect();
    assert_eq!(sizes, vec![64, 128, 256, 512, 512]);

    // Reopen with the active 512 KiB segment: the next one stays at the cap.
    let small = open(&disk, LogConfig { segment_bytes: 1 << 20, ..growth_config() });
    let more = (1 << 20) / PAGE_BYTES;
    block_on(drive(&small, async {
        for tag in 0..more {
            small.append(&page_batch(pages + tag)).unwrap().ticket.durable().await.unwrap();
        }
    }));
    let sizes: Vec<u64> = segment_file_sizes(&disk, &small).iter().map(|b| b / KIB).collect();
    assert_eq!(&sizes[..5], &[64, 128, 256, 512, 512]);
    assert_eq!(sizes[5], 1024, "after a reopen the next segment doubles the active one");
}

#[test]
fn the_next_segment_is_prepared_only_past_the_threshold() {
    // Goal: no successor is prepared while the active segment is below
    // SEGMENT_PREPARE_AT_PERCENT of its size; the first commit at the threshold prepares it,
    // at twice the active size. Method: one-page commits into a 64 KiB first segment, the
    // background run between commits; the prepared file's presence and size on SimStorage.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let log = open(&disk, growth_config());
    let threshold_pages = 64 * KIB * SEGMENT_PREPARE_AT_PERCENT / 100 / PAGE_BYTES;
    assert!(threshold_pages >= 2);
    block_on(drive(&log, async {
        for tag in 0..threshold_pages - 1 {
            log.append(&page_batch(tag)).unwrap().ticket.durable().await.unwrap();
            for _ in 0..20 {
                yield_now().await;
            }
            assert!(!log.next_segment_prepared(), "prepared after {} pages", tag + 1);
            assert!(!disk.names_in(dir).contains(&PREPARED_FILE_NAME.to_owned()));
        }
        log.append(&page_batch(threshold_pages)).unwrap().ticket.durable().await.unwrap();
        for _ in 0..1_000 {
            if log.next_segment_prepared() {
                break;
            }
            yield_now().await;
        }
        assert!(log.next_segment_prepared(), "prepared at the threshold");
    }));
    let prepared = disk.file_bytes(&dir.join(PREPARED_FILE_NAME)).unwrap();
    assert_eq!(prepared.len() as u64, 128 * KIB);
    assert!(prepared.iter().all(|byte| *byte == 0));
}

#[test]
fn a_commit_larger_than_the_planned_segment_gets_a_segment_it_fits() {
    // Goal: a batch larger than the next planned size (here 150 KiB against a 128 KiB
    // successor already prepared) still commits: its segment is the commit's size, the
    // prepared file zero-filled to it at the roll, and it survives a crash. Method: fill the
    // first segment past the threshold, append the big batch, check sizes and the reopened log.
    let disk = SimStorage::new();
    let log = open(&disk, growth_config());
    let big = make_batch(3, 150 * KIB as usize, 99);
    let mut expected = vec![];
    let mut next = 0;
    block_on(drive(&log, async {
        for tag in 0..10 {
            let batch = page_batch(tag);
            let appended = log.append(&batch).unwrap();
            appended.ticket.durable().await.unwrap();
            expected.push(stamped(&batch, next, 1));
            next = appended.next_offset.0;
        }
        while !log.next_segment_prepared() {
            yield_now().await;
        }
        let appended = log.append(&big).unwrap();
        appended.ticket.durable().await.unwrap();
        expected.push(stamped(&big, next, 1));
    }));
    let sizes = segment_file_sizes(&disk, &log);
    let span = spool_broker::log::commit_span(big.len() as u64);
    assert_eq!(sizes, vec![64 * KIB, span]);
    let image = disk.crash_image(CrashMode::DurableOnly);
    let reopened = open(&image, growth_config());
    let read: Vec<Vec<u8>> =
        block_on(read_all(&reopened)).into_iter().map(|b| b.bytes.to_vec()).collect();
    assert_eq!(read, expected);
}

#[test]
fn retention_deletes_sealed_segments_of_mixed_sizes() {
    // Goal: delete_below removes whole sealed segments of different sizes (64/128/256 KiB)
    // with their index files, keeps the rest readable, and a reopen starts at the new first
    // segment. Method: fill four growing segments, delete below the third's base, check names,
    // reads below the start (OffsetOutOfRange) and the reopened log.
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let log = open(&disk, growth_config());
    let pages = (64 + 128 + 256 + 16) * KIB / PAGE_BYTES;
    block_on(drive(&log, async {
        for tag in 0..pages {
            log.append(&page_batch(tag)).unwrap().ticket.durable().await.unwrap();
        }
        let segments = log.segments();
        assert_eq!(segments.len(), 4);
        let keep_from = segments[2].base_offset;
        assert_eq!(log.delete_below(keep_from).await.unwrap(), 2);
        assert_eq!(log.start_offset(), keep_from);
        assert!(matches!(log.read(Offset(0), 4096).await, Err(LogError::OffsetOutOfRange { .. })));
        let names = disk.names_in(dir);
        for gone in &segments[..2] {
            let name = gone.path.file_name().unwrap().to_str().unwrap().to_owned();
            assert!(!names.contains(&name), "{name} deleted");
        }
    }));
    let sizes: Vec<u64> = segment_file_sizes(&disk, &log).iter().map(|b| b / KIB).collect();
    assert_eq!(sizes, vec![256, 512]);
    let reopened = open(&disk.crash_image(CrashMode::DurableOnly), growth_config());
    assert_eq!(reopened.start_offset(), log.start_offset());
    assert_eq!(reopened.next_offset().0, pages);
    let batches = block_on(read_all(&reopened));
    assert_eq!(batches.len() as u64, pages - log.start_offset().0);
}

#[test]
fn a_crash_while_a_roll_grows_the_prepared_file_loses_nothing_acknowledged() {
    // Goal: a crash at any storage op while a roll zero-fills the rest of a prepared file
    // (a 150 KiB batch against a 128 KiB successor) or renames it keeps every acknowledged
    // batch, drops the unacknowledged big one whole or keeps it whole, and leaves no
    // prepared file behind. Method: a SimStorage hook recovers the durable-only, all-written
    // and torn images at every op of the big batch's commit.
    use std::cell::{Cell, RefCell};
    let disk = SimStorage::new();
    let dir = Path::new("/p");
    let log = open(&disk, growth_config());
    let big = make_batch(3, 150 * KIB as usize, 99);
    let acked: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let checked = Rc::new(Cell::new(0u32));
    block_on(drive(&log, async {
        let mut next = 0;
        for tag in 0..10 {
            let batch = page_batch(tag);
            let appended = log.append(&batch).unwrap();
            appended.ticket.durable().await.unwrap();
            acked.borrow_mut().push(stamped(&batch, next, 1));
            next = appended.next_offset.0;
        }
        while !log.next_segment_prepared() {
            yield_now().await;
        }
        let big_stored = stamped(&big, next, 1);
        {
            let acked = acked.clone();
            let checked = checked.clone();
            disk.set_hook(move |disk, _op, count| {
                let modes = [
                    CrashMode::DurableOnly,
                    CrashMode::AllWritten,
                    CrashMode::Torn { seed: count },
                ];
                for mode in modes {
                    let image = disk.crash_image(mode);
                    let fatal = Rc::new(RecordFatal::default());
                    let (log, _) =
                        block_on(Log::open(image.clone(), dir, growth_config(), 2, fatal))
                            .unwrap_or_else(|error| panic!("recovery failed: {error}"));
                    let read: Vec<Vec<u8>> =
                        block_on(read_all(&log)).into_iter().map(|b| b.bytes.to_vec()).collect();
                    let acked = acked.borrow();
                    assert!(read.len() == acked.len() || read.len() == acked.len() + 1);
                    assert_eq!(&read[..acked.len()], &acked[..], "acknowledged batches intact");
                    if read.len() > acked.len() {
                        assert_eq!(read[acked.len()], big_stored, "the big batch is whole");
                    }
                    assert!(!image.names_in(dir).contains(&PREPARED_FILE_NAME.to_owned()));
                    checked.set(checked.get() + 1);
                }
            });
        }
        let appended = log.append(&big).unwrap();
        appended.ticket.durable().await.unwrap();
        disk.clear_hook();
    }));
    // Zero-fill write, sync, rename, dir sync, commit write, commit sync: ≥ 6 ops × 3 images.
    assert!(checked.get() >= 18, "checked {} images", checked.get());
}

#[test]
fn a_full_disk_at_the_first_segment_refuses_the_append_and_a_retry_recovers() {
    // Goal: an empty log whose first segment cannot be prepared (ENOSPC) refuses the first
    // data append with DiskFull — the broker keeps running — instead of accepting it into a
    // commit that has nowhere to go (a fatal log failure); once space is back, a retry
    // prepares the segment and appends are durable again. Method: SimStorage failing the
    // preparation's first write with ENOSPC; `writable` (what every partition append awaits)
    // then `append`; `retry_prepare`; append again; a crash image holds only the second batch.
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let log = block_on(Log::open(disk.clone(), Path::new("/p"), growth_config(), 1, fatal.clone()))
        .unwrap()
        .0;
    disk.inject_disk_full(spool_broker::io::IoOp::Write, 1);
    let refused = make_batch(1, 100, 1);
    let accepted = make_batch(1, 100, 2);
    block_on(drive(&log, async {
        log.writable(spool_wire::batch::BatchKind::Data, refused.len() as u64).await;
        assert!(log.disk_full(), "the first segment's preparation hit the full disk");
        assert!(matches!(log.append(&refused), Err(LogError::DiskFull)));
        log.retry_prepare();
        while log.disk_full() {
            yield_now().await;
        }
        log.writable(spool_wire::batch::BatchKind::Data, accepted.len() as u64).await;
        log.append(&accepted).unwrap().ticket.durable().await.unwrap();
    }));
    assert!(fatal.reasons().is_empty(), "no fatal failure: {:?}", fatal.reasons());
    let reopened = open(&disk.crash_image(CrashMode::DurableOnly), growth_config());
    let batches = block_on(read_all(&reopened));
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].bytes, stamped(&accepted, 0, 1));
}
