//! Fuzz target: a partition directory whose single segment holds a few
//! batches the log really wrote, then fuzzer-chosen bytes at a
//! fuzzer-chosen position, opened with `Log::open` on the simulated disk.
//!
//! Input layout: `[batches, flags, at_lo, at_hi, bytes...]`. `batches % 8`
//! valid batches are appended first; the bytes overwrite the segment from
//! `at × 8`. With bit 0 of `flags` the crcs of every batch header found at or
//! after the overwrite are recomputed, so the fuzzer gets past the checksum
//! and explores lengths, kinds, offset gaps and fillers instead of crc
//! mismatches only.
//!
//! Properties, when `Log::open` succeeds (failing with a typed error is
//! always allowed):
//! - every durable offset reads back as crc-valid, contiguous batches;
//! - batches written before the overwrite position are served byte for byte;
//! - recovery is idempotent: reopening serves the same batches and finds
//!   nothing left to truncate.
#![no_main]

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::{block_on, zip};
use libfuzzer_sys::fuzz_target;
use spool_broker::io::SimStorage;
use spool_broker::log::{segment_path, Log, LogConfig, Offset, RecordFatal};
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;

const SEGMENT_BYTES: usize = 64 * 1024;
const BATCHES_MAX: u8 = 8;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES as u64,
        segment_bytes_initial: 64 * 1024,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 8 * 1024,
        inflight_commits_max: 2,
        pending_bytes_max: 1 << 20,
        data_pending_bytes_max: 1 << 20,
        index_interval_bytes: 4096,
        tail_cache_bytes: 32 * 1024,
    }
}

/// A data batch of `records` records and a body derived from `tag`.
fn make_batch(records: u32, body_bytes: usize, tag: u64) -> Vec<u8> {
    let len = BATCH_HEADER_BYTES + body_bytes.div_ceil(8) * 8;
    let mut bytes = vec![0u8; len];
    let mut state = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for byte in &mut bytes[BATCH_HEADER_BYTES..] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
    BatchHeader {
        kind: BatchKind::Data,
        batch_len: len as u32,
        body_crc: 0,
        base_offset: 0,
        leader_epoch: 0,
        header_crc: 0,
        record_count: records,
        flags: 0,
        first_timestamp_ms: tag,
        max_timestamp_ms: tag,
    }
    .write(&mut bytes);
    bytes
}

/// Recomputes both crcs of every parseable batch header from `from` on,
/// walking by `batch_len`, so mutated batches stay checksum-valid.
fn fix_crcs(image: &mut [u8], from: usize) {
    let mut pos = from;
    while pos + BATCH_HEADER_BYTES <= image.len() {
        let Ok(header) = BatchHeader::parse(&image[pos..]) else { break };
        let end = pos + header.batch_len as usize;
        if end > image.len() {
            break;
        }
        let body_crc = crc32c::crc32c(&image[pos + 32..end]);
        image[pos + 12..pos + 16].copy_from_slice(&body_crc.to_le_bytes());
        BatchHeader::assign(&mut image[pos..end], header.base_offset, header.leader_epoch);
        pos = end;
    }
}

/// How many non-filler batches of the freshly written `image` end at or
/// before `at` (commits are page-aligned, so fillers sit between them).
fn intact_batches(image: &[u8], at: usize) -> usize {
    let mut pos = 0;
    let mut count = 0;
    while let Ok(header) = BatchHeader::verify(&image[pos..]) {
        pos += header.batch_len as usize;
        if pos > at {
            break;
        }
        if header.kind != BatchKind::Filler {
            count += 1;
        }
    }
    count
}

/// Every durable batch from the start, checking crc and contiguity.
async fn read_all(log: &Log<SimStorage>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut from = log.start_offset();
    while from < log.durable_offset() {
        let batches = log.read(from, 64 * 1024).await.expect("a durable offset reads");
        assert!(!batches.is_empty(), "no batch at {from} below the durable end");
        for batch in batches {
            assert_eq!(batch.header.base_offset, from.0, "recovered offsets are contiguous");
            assert!(BatchHeader::verify(&batch.bytes).is_ok(), "served batch fails its crc");
            from = Offset(batch.header.next_offset());
            out.push(batch.bytes);
        }
    }
    out
}

/// Runs `work` beside the log's background future, then closes the log.
async fn drive<T>(log: &Log<SimStorage>, work: impl std::future::Future<Output = T>) -> T {
    let background = log.background();
    let work = async {
        let result = work.await;
        log.close();
        result
    };
    zip(background, work).await.1
}

fuzz_target!(|data: &[u8]| {
    let [batches, flags, at_lo, at_hi, junk @ ..] = data else { return };
    let dir = Path::new("/p");
    let disk = SimStorage::new();
    let batches = u64::from(*batches % BATCHES_MAX);
    let at = usize::from(u16::from_le_bytes([*at_lo, *at_hi])) * 8 % SEGMENT_BYTES;
    block_on(async {
        let fatal = Rc::new(RecordFatal::default());
        let (log, _) = Log::open(disk.clone(), dir, config(), 1, fatal.clone())
            .await
            .expect("a fresh log opens");
        let written = drive(&log, async {
            let mut tickets = Vec::new();
            for tag in 0..batches {
                let batch = make_batch(1 + (tag % 3) as u32, 40 + (tag as usize * 24) % 600, tag);
                tickets.push(log.append(&batch).expect("append").ticket);
            }
            for ticket in tickets {
                ticket.durable().await.expect("durable");
            }
            read_all(&log).await
        })
        .await;

        let path = segment_path(dir, 0);
        let mut image = disk.file_bytes(&path).expect("segment 0 exists");
        image.resize(SEGMENT_BYTES, 0);
        let intact = intact_batches(&image, at);
        let end = (at + junk.len()).min(image.len());
        image[at..end].copy_from_slice(&junk[..end - at]);
        if flags & 1 != 0 {
            fix_crcs(&mut image, at);
        }
        disk.set_file_bytes(&path, image);

        let Ok((log, _)) = Log::open(disk.clone(), dir, config(), 2, fatal.clone()).await else {
            return;
        };
        let served = drive(&log, read_all(&log)).await;
        // Written batches that lie wholly before the overwrite are untouched.
        assert!(intact <= written.len());
        assert!(served.len() >= intact, "recovery dropped an intact batch");
        assert_eq!(served[..intact], written[..intact], "intact batches not served as written");

        let (log, report) = Log::open(disk.clone(), dir, config(), 3, fatal)
            .await
            .expect("a log that recovered once reopens");
        assert_eq!(report.truncated_at, None, "a recovered log had more to truncate");
        let again = drive(&log, read_all(&log)).await;
        assert_eq!(again, served, "reopening a recovered log changed what it serves");
    });
});
