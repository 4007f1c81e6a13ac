//! The segment log's read-back (`log/reader.rs`): a read that misses the
//! tail cache reads at least `READ_BACK_MIN_BYTES` and keeps the batches it
//! read whole, so the reads that follow it through a backlog (a claim takes
//! a few records of a producer batch at a time) are served from memory, and
//! each batch is read from the file and crc-checked once, not once per claim.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::rc::Rc;

use common::{drive, make_batch, small_config, stamped};
use futures_lite::future::block_on;
use spool_broker::io::{stats, SimStorage};
use spool_broker::log::{Log, LogConfig, Offset, RecordFatal};

const BATCHES: u64 = 40;
const RECORDS: u32 = 4;

/// No tail cache, so every read goes past it; segments large enough to hold
/// the whole run.
fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4 << 20,
        segment_bytes_initial: 4 << 20,
        commit_bytes: 64 * 1024,
        tail_cache_bytes: 0,
        ..small_config()
    }
}

/// Reads from the log's files and from memory so far on this thread.
fn reads() -> (u64, u64) {
    let snapshot = stats::snapshot();
    (snapshot.reads_from_files, snapshot.reads_from_cache)
}

#[test]
fn reads_through_a_backlog_go_to_the_file_once_per_read_back_and_trim_frees_it() {
    // Goal: a backlog's consecutive small reads (one record each, like claims of a few
    // records) read the segment file once for all the batches one read-back holds, serve
    // the exact bytes appended, count the read-back in `cached_bytes`, and give it up
    // when trimmed below (the next read goes to the file again). Method: 40 durable
    // batches of 4 records × ~3 KiB (≈ 120 KiB, under READ_BACK_MIN_BYTES) with no tail
    // cache; read every offset with max_bytes 1 and compare with the stamped batches;
    // count file and memory reads through the thread's I/O counters.
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let (log, _) = block_on(Log::open(disk, Path::new("/p"), config(), 1, fatal)).unwrap();
    block_on(drive(&log, async {
        let mut expected = Vec::new();
        for tag in 0..BATCHES {
            let batch = make_batch(RECORDS, 3000, tag);
            let appended = log.append(&batch).unwrap();
            appended.ticket.durable().await.unwrap();
            expected.push(stamped(&batch, appended.base_offset.0, 1));
        }
        assert_eq!(log.cached_bytes(), 0, "no tail cache, nothing read yet");
        let (files_before, memory_before) = reads();
        for offset in 0..BATCHES * u64::from(RECORDS) {
            let read = log.read(Offset(offset), 1).await.unwrap();
            let batch = (offset / u64::from(RECORDS)) as usize;
            assert_eq!(read[0].bytes.to_vec(), expected[batch], "the batch holding {offset}");
        }
        let (files, memory) = reads();
        assert_eq!(files - files_before, 1, "one file read for the whole backlog");
        assert_eq!(memory - memory_before, BATCHES * u64::from(RECORDS) - 1);
        assert!(log.cached_bytes() > 0, "the read-back is counted as cached memory");

        // Trimmed below a watermark inside it: kept; past its end: freed.
        log.trim_cache_below(Offset(4));
        assert!(log.cached_bytes() > 0, "still needed above the watermark");
        log.trim_cache_below(Offset(BATCHES * u64::from(RECORDS)));
        assert_eq!(log.cached_bytes(), 0, "freed once consumers passed it");
        let (files_before, _) = reads();
        let read = log.read(Offset(0), 1).await.unwrap();
        assert_eq!(read[0].bytes.to_vec(), expected[0]);
        assert_eq!(reads().0 - files_before, 1, "after the trim the file is read again");
    }));
}

#[test]
fn a_read_past_the_read_back_reads_the_file_and_keeps_the_new_batches() {
    // Goal: the read-back serves only what it holds: a read from an offset past it goes
    // to the file (right bytes, not a stale batch), and its batches replace the old
    // read-back. Method: batches of ~64 KiB so one read-back (READ_BACK_MIN_BYTES plus a
    // page) holds a few; read offsets in order and count file reads: more than one, far
    // fewer than the batches.
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let config = LogConfig { batch_bytes_max: 80 * 1024, ..config() };
    let (log, _) = block_on(Log::open(disk, Path::new("/p"), config, 1, fatal)).unwrap();
    block_on(drive(&log, async {
        let mut expected = Vec::new();
        for tag in 0..24u64 {
            let batch = make_batch(1, 64 * 1024, tag);
            let appended = log.append(&batch).unwrap();
            appended.ticket.durable().await.unwrap();
            expected.push(stamped(&batch, appended.base_offset.0, 1));
        }
        let (files_before, _) = reads();
        for (offset, batch) in expected.iter().enumerate() {
            let read = log.read(Offset(offset as u64), 1).await.unwrap();
            assert_eq!(&read[0].bytes.to_vec(), batch, "the batch at {offset}");
        }
        let files = reads().0 - files_before;
        assert!((2..=12).contains(&files), "{files} file reads for 24 batches of 64 KiB");
    }));
}
