//! Shared helpers for the shard-journal tests: a small config, batch
//! payloads, a driver that polls the journal's background future beside a
//! workload, and a recovery sink that keeps what it is handed.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::rc::Rc;

use spool_broker::io::{SimStorage, Storage};
use spool_broker::log::journal::{
    Journal, JournalConfig, JournalError, JournalPos, JournalTicket, Lane, PartitionHandle,
    RecoveredEntry, RecoveryReport, ShardJournal, ShardRecovery,
};
use spool_broker::log::RecordFatal;
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;

/// Small files and commits so tests roll often and stay fast.
pub fn small_config() -> JournalConfig {
    JournalConfig {
        file_bytes: 64 * 1024,
        commit_bytes: 16 * 1024,
        control_commit_bytes: 4 * 1024,
        entry_bytes_max: 8 * 1024,
        inflight_commits_max: 2,
        control_pending_bytes_max: 1 << 20,
        data_pending_bytes_max: 1 << 20,
        read_cache_bytes: 32 * 1024,
        read_ahead_bytes: 32 * 1024,
    }
}

/// A batch of `kind` with `body_bytes` (rounded up to 8) of body derived
/// from `tag`, so every payload is distinct.
pub fn payload(kind: BatchKind, body_bytes: usize, tag: u64) -> Vec<u8> {
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
        kind,
        batch_len: len as u32,
        body_crc: 0,
        base_offset: tag,
        leader_epoch: 1,
        header_crc: 0,
        record_count: 1,
        flags: 0,
        first_timestamp_ms: tag,
        max_timestamp_ms: tag,
    }
    .write(&mut bytes);
    bytes
}

/// One entry recovery handed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub partition: PartitionHandle,
    pub position: JournalPos,
    pub watermark: JournalPos,
    pub payload: Vec<u8>,
}

/// Opens (recovering) the journal in `dir` from `start`, keeping every
/// entry recovery hands over.
pub async fn open_collect<S: Storage>(
    storage: S,
    dir: &Path,
    config: JournalConfig,
    start: JournalPos,
) -> Result<(Journal<S>, RecoveryReport, Vec<Found>, Rc<RecordFatal>), JournalError> {
    let mut found = Vec::new();
    let fatal = Rc::new(RecordFatal::default());
    let mut sink = |entry: RecoveredEntry<'_>| {
        found.push(Found {
            partition: entry.partition,
            position: entry.position,
            watermark: entry.watermark,
            payload: entry.payload.to_vec(),
        });
    };
    let (journal, report) =
        Journal::open(storage, dir, config, start, &mut sink, fatal.clone()).await?;
    Ok((journal, report, found, fatal))
}

/// Runs `work` while polling the journal's background future; closes the
/// journal when `work` ends and waits for the drain.
pub async fn drive<S: Storage, T>(journal: &Journal<S>, work: impl Future<Output = T>) -> T {
    let background = journal.background();
    let work = async {
        let result = work.await;
        journal.close();
        result
    };
    let ((), result) = futures_lite::future::zip(background, work).await;
    result
}

/// Appends `count` data entries of `body_bytes` for `partition` (tags
/// 0..count), waiting for every `sync_every`-th to be durable, then for
/// all of them and for the next file to be prepared. Returns each ticket
/// with its payload. Run it under [`drive`].
pub async fn append_durable<S: Storage>(
    journal: &Journal<S>,
    partition: PartitionHandle,
    count: u64,
    body_bytes: usize,
    sync_every: u64,
) -> Vec<(JournalTicket, Vec<u8>)> {
    let mut stored: Vec<(JournalTicket, Vec<u8>)> = Vec::new();
    for tag in 0..count {
        let bytes = payload(BatchKind::Data, body_bytes, tag);
        let ticket = journal.append(Lane::Data, partition, &bytes).unwrap();
        stored.push((ticket, bytes));
        if tag % sync_every == sync_every - 1 {
            stored.last().unwrap().0.durable().await.unwrap();
        }
    }
    for (ticket, _) in &stored {
        ticket.durable().await.unwrap();
    }
    while !journal.next_file_prepared() {
        futures_lite::future::yield_now().await;
    }
    stored
}

/// The shard directory of the partition-level journal tests.
pub const SHARD: &str = "/shard-00";

/// Opens (recovering) the shard journal of [`SHARD`] on `disk` from
/// `start` with [`small_config`].
pub fn open_shard(
    disk: &SimStorage,
    start: JournalPos,
) -> (Rc<ShardJournal<SimStorage>>, ShardRecovery) {
    let fatal = Rc::new(RecordFatal::default());
    futures_lite::future::block_on(ShardJournal::open(
        disk.clone(),
        Path::new(SHARD),
        small_config(),
        start,
        fatal,
    ))
    .unwrap_or_else(|error| panic!("shard open failed: {error}"))
}

/// A seeded xorshift generator: workloads that replay exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
