//! The journal seen from partitions, on the simulated disk: entries read
//! back by journal position (from the read cache and from the files);
//! `ShardJournal` + `JournalPartition` (dense data-only offsets, control
//! entries that take none, reads by offset through the per-partition index,
//! a durable offset that moves only with the commit); recovery routing that
//! rebuilds every partition's index from crash images; replay of a
//! partition's entries from a cursor; the handles table and its crash
//! safety.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::path::Path;

use futures_lite::future::{block_on, yield_now};
use journal_common::{drive, open_collect, payload, small_config};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, JournalDamage, JournalError, JournalPos, JournalTicket, Lane,
    PartitionHandle,
};
use spool_wire::batch::BatchKind;

const DIR: &str = "/shard-00/journal";

#[test]
fn entries_read_back_by_position_from_the_cache_and_from_the_files() {
    // Goal: every durable entry reads back byte for byte by its journal position, whether
    // the read cache still holds its commit or the file must be read; the batch header is
    // the payload's. Method: 120 entries over several 64 KiB files with a 32 KiB cache;
    // reads of old positions go to the files (counted as storage reads), of the newest to
    // the cache (no storage read); then a reopened journal (empty cache) reads them all.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let stored = block_on(drive(&journal, async {
        let mut stored: Vec<(JournalTicket, Vec<u8>)> = Vec::new();
        for tag in 0..120u64 {
            let (lane, kind) =
                if tag % 3 == 0 { (Lane::Control, BatchKind::Control) } else { (Lane::Data, BatchKind::Data) };
            let bytes = payload(kind, 200 + (tag as usize * 37) % 1500, tag);
            let ticket = journal.append(lane, PartitionHandle(tag as u32 % 5), &bytes).unwrap();
            stored.push((ticket, bytes));
            if tag % 7 == 0 {
                stored.last().unwrap().0.durable().await.unwrap();
            }
        }
        for (ticket, _) in &stored {
            ticket.durable().await.unwrap();
        }
        let reads_before = disk.count(IoOp::Read);
        let (newest, bytes) = stored.last().unwrap();
        let batch = journal.read(newest.position().unwrap()).await.unwrap();
        assert_eq!(&*batch.bytes, &bytes[..]);
        assert_eq!(disk.count(IoOp::Read), reads_before, "the newest entry came from the cache");
        assert!(journal.read_cache_bytes() <= 32 * 1024);
        let reads_before = disk.count(IoOp::Read);
        for (ticket, bytes) in &stored {
            let batch = journal.read(ticket.position().unwrap()).await.unwrap();
            assert_eq!(&*batch.bytes, &bytes[..], "entry at {:?}", ticket.position());
            assert_eq!(batch.header.batch_len as usize, bytes.len());
        }
        assert!(disk.count(IoOp::Read) > reads_before, "old entries were read from the files");
        // Many positions at once: one batch per position, in order.
        let positions: Vec<JournalPos> =
            stored.iter().map(|(ticket, _)| ticket.position().unwrap()).collect();
        let batches = journal.read_entries(&positions, 256 << 10).await.unwrap();
        assert_eq!(batches.len(), stored.len());
        for (batch, (_, bytes)) in batches.iter().zip(&stored) {
            assert_eq!(&*batch.bytes, &bytes[..]);
        }
        stored
    }));
    assert!(journal.stats().files_rolled >= 2);
    let image = disk.crash_image(CrashMode::DurableOnly);
    let (reopened, ..) = block_on(open_collect(image, dir, small_config(), JournalPos(0))).unwrap();
    assert_eq!(reopened.read_cache_bytes(), 0);
    block_on(async {
        for (ticket, bytes) in &stored {
            let batch = reopened.read(ticket.position().unwrap()).await.unwrap();
            assert_eq!(&*batch.bytes, &bytes[..]);
        }
    });
}

#[test]
fn reads_past_the_watermark_below_the_oldest_file_or_of_damage_are_typed_errors() {
    // Goal: a position not yet durable is `NotDurable` (held write), a position below the
    // oldest file is `BelowOldestFile`, a damaged entry in a file recovery did not scan
    // (below its start) is `Corrupt` naming the file and byte, and a filler is no entry.
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let gate = disk.hold(|op, path, pos| {
        op == IoOp::Write && path.extension().is_some_and(|ext| ext == "wal") && pos == Some(4096)
    });
    let (first, held) = block_on(drive(&journal, async {
        let first = journal.append(Lane::Data, PartitionHandle(1), &payload(BatchKind::Data, 100, 1));
        let first = first.unwrap();
        first.durable().await.unwrap();
        let held =
            journal.append(Lane::Data, PartitionHandle(1), &payload(BatchKind::Data, 100, 2)).unwrap();
        while !gate.reached() {
            yield_now().await;
        }
        let pos = held.position().unwrap();
        match journal.read(pos).await {
            Err(JournalError::NotDurable { pos: at, durable }) => {
                assert_eq!(at, pos);
                assert_eq!(durable, JournalPos(4096));
            }
            other => panic!("expected NotDurable, got {other:?}"),
        }
        // The filler closing the first commit's page is not an entry.
        let filler_at = JournalPos(first.position().unwrap().0 + 32 + 168);
        assert!(matches!(
            journal.read(filler_at).await,
            Err(JournalError::Corrupt { detail: JournalDamage::Unreadable(_), .. })
        ));
        gate.release();
        held.durable().await.unwrap();
        (first, held)
    }));
    // A journal reopened from the second file's start: the first file is held but was not
    // scanned; bit rot in it shows at the read, named by file and byte.
    let fill = block_on(async {
        let (journal, ..) =
            open_collect(disk.clone(), dir, small_config(), JournalPos(0)).await.unwrap();
        drive(&journal, async {
            let mut last = None;
            for tag in 0..40u64 {
                let bytes = payload(BatchKind::Data, 3000, 100 + tag);
                let ticket = journal.append(Lane::Data, PartitionHandle(2), &bytes).unwrap();
                ticket.durable().await.unwrap();
                last = ticket.position();
            }
            last.unwrap()
        })
        .await
    });
    assert!(fill.0 >= 65_536, "the workload reached the second file");
    let image = disk.crash_image(CrashMode::DurableOnly);
    let path = journal_file_path(dir, 0);
    let mut bytes = image.file_bytes(&path).unwrap();
    bytes[(held.position().unwrap().0 + 100) as usize] ^= 0x40;
    image.set_file_bytes(&path, bytes);
    let (journal, report, ..) =
        block_on(open_collect(image, dir, small_config(), JournalPos(65_536))).unwrap();
    assert_eq!(report.files_scanned + 1, disk.names_in(dir).iter().filter(|n| n.ends_with(".wal")).count());
    block_on(async {
        let intact = journal.read(first.position().unwrap()).await.unwrap();
        assert_eq!(&*intact.bytes, &payload(BatchKind::Data, 100, 1)[..]);
        match journal.read(held.position().unwrap()).await {
            Err(JournalError::Corrupt { path: at, pos, detail: JournalDamage::Unreadable(_) }) => {
                assert_eq!(at, path);
                assert_eq!(pos, held.position().unwrap().0);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    });
    // An empty journal started at 64 KiB holds nothing below it.
    let (fresh, ..) =
        block_on(open_collect(SimStorage::new(), dir, small_config(), JournalPos(65_536))).unwrap();
    assert!(matches!(
        block_on(fresh.read(JournalPos(0))),
        Err(JournalError::BelowOldestFile { oldest: JournalPos(65_536), .. })
    ));
}
