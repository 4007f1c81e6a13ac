//! The log on real files through glommio O_DIRECT (`DmaStorage`) in a temp
//! dir: segment roll, pre-zeroed next segment, index lookups, reopen,
//! retention, torn tails at every byte of the last commit, and corruption
//! refused with file and offset.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use common::{drive, make_batch, read_all, small_config, stamped};
use glommio::{LocalExecutorBuilder, Placement};
use spool_broker::io::DmaStorage;
use spool_broker::log::{
    index_path, Log, LogError, Offset, RecordFatal, SegmentInfo, PREPARED_FILE_NAME,
};

fn run<T>(future: impl Future<Output = T>) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        // Registered (fixed) buffers make reads fail with EOPNOTSUPP on this kernel: see io/dma.rs.
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(future)
}

async fn open(
    dir: &Path,
) -> Result<(Log<DmaStorage>, spool_broker::log::RecoveryReport), LogError> {
    Log::open(DmaStorage, dir, small_config(), 1, Rc::new(RecordFatal::default())).await
}

/// Appends `count` batches of varying size while driving the log, then
/// closes it; returns the stored bytes.
async fn fill(log: &Log<DmaStorage>, count: u64, tag_base: u64) -> Vec<Vec<u8>> {
    drive(log, fill_inner(log, count, tag_base)).await
}

/// Appends `count` batches of varying size, awaiting them in groups.
async fn fill_inner(log: &Log<DmaStorage>, count: u64, tag_base: u64) -> Vec<Vec<u8>> {
    let mut stored = Vec::new();
    {
        let mut tickets = Vec::new();
        for tag in 0..count {
            let batch =
                make_batch(1 + (tag % 3) as u32, 200 + (tag as usize * 37) % 2500, tag_base + tag);
            let appended = log.append(&batch).unwrap();
            stored.push(stamped(&batch, appended.base_offset.0, 1));
            tickets.push(appended.ticket);
            if tag % 7 == 0 {
                for ticket in tickets.drain(..) {
                    ticket.durable().await.unwrap();
                }
            }
        }
        for ticket in tickets {
            ticket.durable().await.unwrap();
        }
    }
    stored
}

#[test]
fn roll_index_reopen_and_retention_on_real_files() {
    // Goal: segments roll at segment_bytes with a zero-filled successor ready, reads through
    // the sparse index return exactly what was appended, reopen recovers it, retention deletes.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("partition");
    run(async {
        let (log, report) = open(&dir).await.unwrap();
        assert!(report.created);
        // The preparer works in the background: wait (bounded) for the next segment before
        // closing, or the close can stop it between the last append and the zero fill.
        let stored = drive(&log, async {
            let stored = fill_inner(&log, 200, 0).await;
            for _ in 0..20_000 {
                if log.next_segment_prepared() {
                    break;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            stored
        })
        .await;
        assert!(log.next_segment_prepared(), "the next segment was prepared within 20 s");
        let segments: Vec<SegmentInfo> = log.segments();
        assert!(segments.len() >= 4, "rolled: {}", segments.len());
        for pair in segments.windows(2) {
            assert_eq!(pair[0].next_offset, pair[1].base_offset, "segments are contiguous");
        }
        // The next segment is prepared: full length, all zeros, synced.
        let prepared = std::fs::read(dir.join(PREPARED_FILE_NAME)).unwrap();
        assert_eq!(prepared.len() as u64, small_config().segment_bytes);
        assert!(prepared.iter().all(|b| *b == 0));
        // Sealed segments have persisted indexes.
        for sealed in &segments[..segments.len() - 1] {
            assert!(index_path(&dir, sealed.base_offset.0).exists());
            assert!(sealed.index_entries > 1);
        }
        // Point reads anywhere return the batch holding the offset.
        let mut offsets = Vec::new();
        let mut next = 0;
        for bytes in &stored {
            offsets.push(next);
            next += u64::from(u32::from_le_bytes(bytes[32..36].try_into().unwrap()));
        }
        for (slot, offset) in offsets.iter().enumerate().step_by(13) {
            let got = log.read(Offset(*offset), 1).await.unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].bytes, stored[slot]);
        }
        assert_eq!(
            read_all(&log).await.into_iter().map(|b| b.bytes.to_vec()).collect::<Vec<_>>(),
            stored
        );
        drop(log);
        let (log, report) = open(&dir).await.unwrap();
        assert_eq!(report.next_offset.0, next);
        assert_eq!(report.batches, 200);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(report.indexes_rebuilt, 0);
        assert_eq!(report.stale_files_removed, 1, "the prepared file is discarded");
        assert_eq!(
            read_all(&log).await.into_iter().map(|b| b.bytes.to_vec()).collect::<Vec<_>>(),
            stored
        );
        // Retention: delete everything below the start of the third segment.
        let cut = segments[2].base_offset;
        let deleted = log.delete_below(cut).await.unwrap();
        assert_eq!(deleted, 2);
        assert!(!segments[0].path.exists());
        assert!(!segments[1].path.exists());
        assert!(!index_path(&dir, segments[0].base_offset.0).exists());
        assert!(segments[2].path.exists());
        assert!(matches!(
            log.read(Offset(0), 100).await,
            Err(LogError::OffsetOutOfRange { start, .. }) if start == cut.0
        ));
        let sealed_left = log.segments().len() - 1;
        assert_eq!(log.delete_below(Offset(u64::MAX)).await.unwrap(), sealed_left);
        assert_eq!(log.segments().len(), 1, "the active segment is never deleted");
        drop(log);
        let (_log, report) = open(&dir).await.unwrap();
        assert_eq!(report.segments, 1);
        assert_eq!(report.next_offset.0, next);
    });
}

fn last_segment(dir: &Path) -> PathBuf {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    names.sort();
    names.pop().unwrap()
}

#[test]
fn torn_tail_at_every_byte_of_the_last_commit() {
    // Goal: whatever prefix of the last commit reached the disk (zeros or garbage after it),
    // recovery keeps every earlier commit, exposes only whole original batches, and the log
    // keeps working. Method: damage the file bytes directly from each byte offset, reopen.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("p");
    let (stored, commit_start, commit_end) = run(async {
        let (log, _) = open(&dir).await.unwrap();
        let (stored, commit_start) = drive(&log, async {
            let mut stored = fill_inner(&log, 12, 0).await;
            let commit_start = log.segments().last().unwrap().data_end;
            // The last commit: three batches gathered together.
            let mut out = Vec::new();
            let mut tickets = Vec::new();
            for tag in 0..3 {
                let batch = make_batch(2, 900 + tag * 8, 500 + tag as u64);
                let appended = log.append(&batch).unwrap();
                out.push(stamped(&batch, appended.base_offset.0, 1));
                tickets.push(appended.ticket);
            }
            for ticket in tickets {
                ticket.durable().await.unwrap();
            }
            stored.extend(out);
            (stored, commit_start)
        })
        .await;
        (stored, commit_start, log.segments().last().unwrap().data_end)
    });
    assert!(commit_end - commit_start >= 4096);
    let segment = last_segment(&dir);
    let mut pristine = std::fs::read(&segment).unwrap();
    // The idle log wrote a witness page after the last commit; a torn last
    // commit is a crash before that page (with it, the damage would be
    // refused as below a recorded watermark).
    let witness = commit_end as usize..commit_end as usize + 4096;
    assert!(pristine[witness.clone()].iter().any(|byte| *byte != 0), "a witness page");
    pristine[witness].fill(0);
    let earlier = stored.len() - 3;
    // One executor for all cuts: building executors dominates otherwise.
    let checked = run(async {
        let mut checked = 0;
        // Every byte of the first and last 512 bytes of the commit (sector tears around
        // the first header and the filler), every 8th byte (each batch boundary) between:
        // an fdatasync per reopen makes all 4 KiB of cuts cost ~30 s on this disk.
        let cuts = (commit_start..=commit_end)
            .filter(|cut| cut - commit_start < 512 || commit_end - cut < 512 || cut % 8 == 0);
        for cut in cuts {
            for garbage in [false, true] {
                if garbage && cut % 61 != 0 {
                    continue;
                }
                let mut bytes = pristine.clone();
                let fill_byte = if garbage { 0xA7 } else { 0 };
                bytes[cut as usize..commit_end as usize].fill(fill_byte);
                std::fs::write(&segment, &bytes).unwrap();
                let (log, _) = open(&dir).await.unwrap_or_else(|e| panic!("cut {cut}: {e}"));
                let recovered: Vec<Vec<u8>> =
                    read_all(&log).await.into_iter().map(|b| b.bytes.to_vec()).collect();
                assert!(recovered.len() >= earlier, "cut {cut}: earlier commits lost");
                assert_eq!(recovered[..], stored[..recovered.len()], "cut {cut}: foreign bytes");
                if cut == commit_end {
                    assert_eq!(recovered.len(), stored.len());
                }
                checked += 1;
            }
        }
        checked
    });
    eprintln!("torn tails checked: {checked}");
    assert!(checked as u64 > (commit_end - commit_start) / 8 + 900);
    // After the last repair, the log accepts and keeps a new batch.
    std::fs::write(&segment, &pristine[..]).unwrap();
    let mut bytes = pristine.clone();
    bytes[commit_start as usize + 100..commit_end as usize].fill(0x5A);
    std::fs::write(&segment, &bytes).unwrap();
    run(async {
        let (log, report) = open(&dir).await.unwrap();
        assert!(report.truncated_bytes > 0);
        let before = read_all(&log).await.len();
        fill(&log, 1, 9_000).await;
        drop(log);
        let (log, _) = open(&dir).await.unwrap();
        assert_eq!(read_all(&log).await.len(), before + 1);
    });
}

#[test]
fn sealed_segment_corruption_is_refused_on_real_files() {
    // Goal: a flipped byte in a sealed segment makes open fail naming that file and the
    // batch's byte offset; the file is left untouched.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("p");
    let segments = run(async {
        let (log, _) = open(&dir).await.unwrap();
        fill(&log, 120, 0).await;
        log.segments()
    });
    assert!(segments.len() >= 2);
    let victim = &segments[0].path;
    let mut bytes = std::fs::read(victim).unwrap();
    let first_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    bytes[first_len + 40] ^= 0xFF;
    std::fs::write(victim, &bytes).unwrap();
    let error = run(async { open(&dir).await.err().expect("must refuse") });
    match error {
        LogError::Corrupt { path, pos, .. } => {
            assert_eq!(&path, victim);
            assert_eq!(pos, first_len as u64);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert_eq!(std::fs::read(victim).unwrap(), bytes, "nothing was truncated");
}

#[test]
fn a_log_under_a_relative_path_opens_appends_and_syncs() {
    // Goal: a partition directory named relative to the working directory
    // works end to end (glommio 0.9's `Directory::open` fails with EBADF on
    // a relative path; the default data dir `./spool-data` once hit that).
    // Method: chdir into a temp dir (nextest runs each test in its own
    // process), open a log at "./rel/partition", append, reopen, read back.
    let temp = tempfile::tempdir().unwrap();
    std::env::set_current_dir(temp.path()).unwrap();
    let dir = PathBuf::from("./rel/partition");
    run(async {
        let (log, report) = open(&dir).await.unwrap();
        assert!(report.created);
        let stored = fill(&log, 5, 0).await;
        drop(log);
        let (log, _) = open(&dir).await.unwrap();
        let got = log.read(Offset(0), 1 << 20).await.unwrap();
        let got: Vec<Vec<u8>> = got.into_iter().map(|batch| batch.bytes.to_vec()).collect();
        assert_eq!(got, stored);
    });
}

#[test]
fn a_zero_length_read_of_an_empty_file_answers_empty() {
    // Goal: reading 0 bytes (an empty index or side file left by a crash
    // between its create and its first write) answers an empty buffer
    // instead of panicking the executor: glommio 0.9 aborts on a zero-byte
    // DMA buffer ("Buffer allocation failed"). Method: create an empty file,
    // open it through DmaStorage, read 0 bytes at 0.
    use spool_broker::io::{Storage, StorageFile};
    let temp = tempfile::tempdir().unwrap();
    let path = temp.path().join("empty.index");
    std::fs::write(&path, b"").unwrap();
    run(async {
        let file = DmaStorage.open(&path).await.unwrap();
        assert_eq!(file.len_bytes().await.unwrap(), 0);
        let read = file.read_at(0, 0).await.unwrap();
        assert!(read.is_empty());
    });
}
