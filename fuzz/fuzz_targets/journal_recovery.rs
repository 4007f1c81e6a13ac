//! Fuzz target: a shard journal whose first file holds a few entries the
//! journal really wrote (three partitions, both lanes), then fuzzer-chosen
//! bytes at a fuzzer-chosen position, opened with `Journal::open` on the
//! simulated disk.
//!
//! Input layout: `[entries, at_lo, at_hi, bytes...]`. `entries % 16` valid
//! entries are appended first; the bytes overwrite the file from `at × 8`.
//!
//! Properties, when `Journal::open` succeeds (failing with a typed error is
//! always allowed):
//! - what recovery hands over is a prefix of the entries written, in
//!   journal order, each with its partition and its bytes unchanged;
//! - recovery is idempotent: reopening the repaired image hands over the
//!   same entries and finds nothing left to cut.
#![no_main]

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::{block_on, zip};
use libfuzzer_sys::fuzz_target;
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, Journal, JournalConfig, JournalPos, Lane, PartitionHandle, RecoveredEntry,
};
use spool_broker::log::RecordFatal;
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;

const DIR: &str = "/shard-00/journal";
const ENTRIES_MAX: u8 = 16;

fn config() -> JournalConfig {
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

/// A batch of `kind` and a body derived from `tag`.
fn payload(kind: BatchKind, body_bytes: usize, tag: u64) -> Vec<u8> {
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

type Found = Vec<(PartitionHandle, Vec<u8>)>;

/// Opens the journal on `disk`, keeping what recovery hands over.
fn open(disk: SimStorage) -> Option<(Journal<SimStorage>, Found, bool)> {
    let mut found = Vec::new();
    let mut sink = |entry: RecoveredEntry<'_>| {
        found.push((entry.partition, entry.payload.to_vec()));
    };
    let fatal = Rc::new(RecordFatal::default());
    let opened =
        block_on(Journal::open(disk, Path::new(DIR), config(), JournalPos(0), &mut sink, fatal));
    let (journal, report) = opened.ok()?;
    Some((journal, found, report.truncated_at.is_some()))
}

fn written(disk: &SimStorage, count: u64) -> Found {
    let (journal, _, _) = open(disk.clone()).expect("a new journal opens");
    let work = async {
        let mut tickets = Vec::new();
        for tag in 0..count {
            let kind = if tag % 4 == 3 { BatchKind::Control } else { BatchKind::Data };
            let lane = if kind == BatchKind::Data { Lane::Data } else { Lane::Control };
            let partition = PartitionHandle((tag % 3) as u32);
            let bytes = payload(kind, 40 + (tag as usize * 24) % 600, tag);
            let ticket = journal.append(lane, partition, &bytes).expect("append");
            tickets.push((ticket, partition, bytes));
        }
        let mut out = Vec::new();
        for (ticket, partition, bytes) in tickets {
            ticket.durable().await.expect("durable");
            out.push((ticket.position().expect("placed").0, partition, bytes));
        }
        journal.close();
        out
    };
    let ((), mut out) = block_on(zip(journal.background(), work));
    out.sort_by_key(|(position, ..)| *position);
    out.into_iter().map(|(_, partition, bytes)| (partition, bytes)).collect()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let count = u64::from(data[0] % ENTRIES_MAX);
    let at = usize::from(u16::from_le_bytes([data[1], data[2]])) * 8;
    let junk = &data[3..];
    let disk = SimStorage::new();
    let entries = written(&disk, count);
    let image = disk.crash_image(CrashMode::DurableOnly);
    let path = journal_file_path(Path::new(DIR), 0);
    let Some(mut bytes) = image.file_bytes(&path) else { return };
    let start = at.min(bytes.len());
    let end = (start + junk.len()).min(bytes.len());
    bytes[start..end].copy_from_slice(&junk[..end - start]);
    image.set_file_bytes(&path, bytes);
    let Some((journal, found, _)) = open(image.clone()) else { return };
    assert!(found.len() <= entries.len(), "recovery invented entries");
    for (index, entry) in found.iter().enumerate() {
        assert_eq!(entry, &entries[index], "entry {index} changed");
    }
    drop(journal);
    let again = open(image.crash_image(CrashMode::DurableOnly)).expect("a repaired journal opens");
    assert_eq!(again.1, found, "recovery is idempotent");
    assert!(!again.2, "nothing left to cut");
});
