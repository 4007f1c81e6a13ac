//! Shared helpers for the broker's tests: batch builders, a small log
//! config, and a glommio executor to run them on.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::future::Future;

use spool_broker::log::LogConfig;
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;

/// Small segments and commits so tests roll often and stay fast.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 8 * 1024,
        inflight_commits_max: 2,
        pending_bytes_max: 1 << 20,
        data_pending_bytes_max: 1 << 20,
        tail_cache_bytes: 32 * 1024,
    }
}

/// A data batch of `records` records with `body_bytes` (rounded up to 8) of
/// body derived from `tag`, so every batch's bytes are distinct.
pub fn make_batch(records: u32, body_bytes: usize, tag: u64) -> Vec<u8> {
    let body = body_bytes.div_ceil(8) * 8;
    let len = BATCH_HEADER_BYTES + body;
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

/// The batch as the log stores it: offsets and epoch stamped.
pub fn stamped(batch: &[u8], base_offset: u64, epoch: u32) -> Vec<u8> {
    let mut copy = batch.to_vec();
    BatchHeader::assign(&mut copy, base_offset, epoch);
    copy
}

/// Runs `future` to completion on a fresh glommio executor (the partition
/// tests need one: partitions spawn their log's background task).
pub fn run_glommio<T>(future: impl Future<Output = T>) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(future)
}

/// A data batch of one 100-byte record per id, each record's id and
/// payload made of that id, enqueued at `now_ms`.
pub fn id_batch(ids: &[u8], now_ms: u64) -> spool_wire::batch::BatchBytes {
    use spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
    let mut builder = DataBatchBuilder::new();
    for &id in ids {
        builder
            .push(&Record {
                message_id: MessageId([id; 16]),
                routing_key: vec![],
                headers: vec![],
                payload: Payload::Inline(vec![id; 100]),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: now_ms,
            })
            .unwrap();
    }
    builder.finish().unwrap()
}
