//! The shard journal on a full disk: when its next file cannot be prepared
//! for lack of space, data is refused with a typed `DiskFull` (never a
//! fatal stop), acks and other control entries go on in the room left in
//! the current file, the partial file is removed, and a retry asks for a
//! smaller file (down to one largest commit), so service returns once the
//! space for the next commit does; the file after it is whole again, and
//! recovery reads the journal with files of both lengths; nothing answered
//! is lost.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::path::Path;

use futures_lite::future::{block_on, yield_now};
use journal_common::{drive, open_collect, payload, small_config};
use spool_broker::io::{IoOp, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, JournalError, JournalPos, Lane, PartitionHandle, JOURNAL_PREPARED_NAME,
};
use spool_wire::batch::BatchKind;

const DIR: &str = "/shard-00/journal";

// Goal: a full disk while the next journal file is prepared is not fatal:
// data appends get `DiskFull` (naming the smaller file the retry asks
// for), control appends are written and made durable, the partial
// `next.prep` is gone, and a retry prepares that smaller file and takes
// data again; data then rolls through the small file into a whole one;
// the fatal handler is never told. Method: SimStorage failing the
// preparer's first zero-fill write with ENOSPC; 200 KiB of data after the
// retry; reopen at the end and find every answered entry, in order, and
// the file lengths on disk.
#[test]
fn a_full_disk_refuses_data_keeps_acks_going_and_clears_on_retry() {
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, _, _, fatal) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    // The open created the first file; the preparer's first write (of the
    // next file) is the one that finds the disk full.
    disk.inject_disk_full(IoOp::Write, 1);
    let answered = block_on(drive(&journal, async {
        while !journal.disk_full() {
            yield_now().await;
        }
        assert!(!journal.next_file_prepared());
        assert!(disk.file_bytes(&dir.join(JOURNAL_PREPARED_NAME)).is_none(), "partial file kept");
        let data = payload(BatchKind::Data, 200, 1);
        let config = small_config();
        match journal.append(Lane::Data, PartitionHandle(0), &data) {
            Err(JournalError::DiskFull { file_bytes }) => {
                assert_eq!(file_bytes, config.file_bytes / 2, "the retry asks for half");
                assert!(file_bytes >= config.commit_span_max());
            }
            other => panic!("expected DiskFull, got {other:?}"),
        }
        let mut answered = Vec::new();
        for tag in 0..5 {
            let control = payload(BatchKind::Control, 64, 10 + tag);
            let ticket = journal.append(Lane::Control, PartitionHandle(0), &control).unwrap();
            ticket.durable().await.unwrap();
            answered.push((ticket, control));
        }
        assert!(journal.disk_full(), "no retry was asked: still full");
        // Space is back (nothing injected any more): a retry prepares.
        journal.retry_prepare();
        while journal.disk_full() || !journal.next_file_prepared() {
            yield_now().await;
        }
        // Through the rest of the first file, the small one and into a
        // whole one.
        for tag in 0..340 {
            let data = payload(BatchKind::Data, 600, 100 + tag);
            let ticket = journal.append(Lane::Data, PartitionHandle(0), &data).unwrap();
            if tag % 8 == 7 {
                ticket.durable().await.unwrap();
            }
            answered.push((ticket, data));
        }
        let mut out = Vec::new();
        for (ticket, data) in answered {
            ticket.durable().await.unwrap();
            out.push(data);
        }
        out
    }));
    assert!(fatal.reasons().is_empty(), "{:?}", fatal.reasons());
    assert_eq!(journal.stats().prepares_disk_full, 1);
    let file_bytes = small_config().file_bytes;
    let lens: Vec<u64> = [0, file_bytes, file_bytes + file_bytes / 2]
        .iter()
        .map(|base| disk.file_bytes(&journal_file_path(dir, *base)).expect("file").len() as u64)
        .collect();
    assert_eq!(lens, [file_bytes, file_bytes / 2, file_bytes], "whole, small, whole");
    let (_, _, found, _) =
        block_on(open_collect(disk, dir, small_config(), JournalPos(0))).unwrap();
    let payloads: Vec<Vec<u8>> = found.into_iter().map(|entry| entry.payload).collect();
    assert_eq!(payloads.len(), answered.len());
    assert_eq!(payloads, answered);
}
