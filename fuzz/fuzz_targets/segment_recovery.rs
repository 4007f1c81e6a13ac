//! Fuzz target: a partition directory whose single segment holds
//! fuzzer-chosen bytes (after a few valid batches), opened with `Log::open`
//! on the simulated disk. Recovery must never panic: it either opens (and
//! then every batch it reads back is crc-valid and contiguous) or fails
//! with a typed error.
#![no_main]

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use libfuzzer_sys::fuzz_target;
use spool_broker::io::SimStorage;
use spool_broker::log::{segment_path, Log, LogConfig, Offset, RecordFatal};

const SEGMENT_BYTES: usize = 64 * 1024;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES as u64,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 8 * 1024,
        inflight_commits_max: 2,
        pending_bytes_max: 1 << 20,
        index_interval_bytes: 4096,
        tail_cache_bytes: 32 * 1024,
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/p");
    let disk = SimStorage::new();
    let mut image = data.to_vec();
    image.resize(SEGMENT_BYTES, 0);
    block_on(async {
        let fatal = Rc::new(RecordFatal::default());
        // Create the directory through the log, then replace its segment.
        if let Ok((log, _)) = Log::open(disk.clone(), dir, config(), 1, fatal.clone()).await {
            log.close();
            log.background().await;
        }
        disk.set_file_bytes(&segment_path(dir, 0), image);
        let Ok((log, _)) = Log::open(disk.clone(), dir, config(), 2, fatal).await else { return };
        let mut from = log.start_offset();
        while from < log.durable_offset() {
            let Ok(batches) = log.read(from, 64 * 1024).await else { break };
            if batches.is_empty() {
                break;
            }
            for batch in batches {
                assert_eq!(batch.header.base_offset, from.0, "recovered offsets are contiguous");
                from = Offset(batch.header.next_offset());
            }
        }
        log.close();
        log.background().await;
    });
});
