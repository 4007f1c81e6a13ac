//! Releasing journal files below a position (`Journal::release_below`,
//! `docs/design/shard-journal.md` §6): which files go, what reads and
//! recovery see afterwards, and crashes at every step of a release.
// Tests may unwrap (ARCHITECTURE.md, "Errors").
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "journal_common/mod.rs"]
mod journal_common;

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use futures_lite::future::{block_on, yield_now};
use journal_common::{append_durable, drive, open_collect, payload, small_config};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, Journal, JournalError, JournalPos, Lane, PartitionHandle,
    JOURNAL_FILE_SUFFIX,
};
use spool_wire::batch::BatchKind;

const DIR: &str = "/shard-00/journal";

/// Journal file names in `dir`, oldest first (names sort by position).
fn journal_files(disk: &SimStorage) -> Vec<String> {
    let mut names: Vec<String> = disk
        .names_in(Path::new(DIR))
        .into_iter()
        .filter(|name| name.ends_with(JOURNAL_FILE_SUFFIX))
        .collect();
    names.sort();
    names
}

/// A journal of `count` durable data entries of 2,000 bytes (several
/// files with the small config), and each entry's position and bytes.
fn written(count: u64) -> (SimStorage, Vec<(JournalPos, Vec<u8>)>) {
    let disk = SimStorage::new();
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), JournalPos(0)))
            .unwrap();
    let entries =
        block_on(drive(&journal, append_durable(&journal, PartitionHandle(1), count, 2000, 8)));
    let entries =
        entries.into_iter().map(|(ticket, bytes)| (ticket.position().unwrap(), bytes)).collect();
    (disk, entries)
}

/// Runs `work` against the journal reopened (from `start`) on `disk`,
/// polling its background future.
fn with_journal<T>(
    disk: &SimStorage,
    start: JournalPos,
    work: impl AsyncFnOnce(&Journal<SimStorage>) -> T,
) -> T {
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), small_config(), start)).unwrap();
    block_on(drive(&journal, work(&journal)))
}

#[test]
fn files_wholly_below_the_position_go_and_reads_there_are_refused() {
    // Goal: release_below removes exactly the files that end at or below the position,
    // syncs the directory, refuses reads below the oldest file left (even of commits the
    // read cache held), serves reads above it byte for byte, and a recovery from the
    // position finds every entry at or after it.
    let (disk, entries) = written(120);
    let config = small_config();
    let before = journal_files(&disk);
    assert!(before.len() >= 4, "{before:?}");
    // An entry in the third file: the first two files lie wholly below it.
    let third_base = 2 * config.file_bytes;
    let (pos, _) = *entries.iter().find(|(pos, _)| pos.0 >= third_base).unwrap();
    let first = entries[0].clone();
    let last = entries.last().unwrap().clone();
    let (released, oldest, read_first, read_last, files) =
        with_journal(&disk, JournalPos(0), async |journal: &Journal<SimStorage>| {
            // Warm the read cache with the newest commits, then release.
            let _ = journal.read(last.0).await.unwrap();
            let released = journal.release_below(pos).await.unwrap();
            let oldest = journal.oldest_file();
            let read_first = journal.read(first.0).await.map(|batch| batch.bytes.to_vec());
            let read_last = journal.read(last.0).await.unwrap().bytes.to_vec();
            (released, oldest, read_first, read_last, journal.file_count())
        });
    assert_eq!(released.files, 2);
    assert_eq!(released.bytes, 2 * config.file_bytes);
    assert_eq!(oldest, JournalPos(third_base));
    assert_eq!(released.oldest, oldest);
    assert_eq!(files, before.len() - 2);
    assert!(
        matches!(read_first, Err(JournalError::BelowOldestFile { oldest: o, .. }) if o == oldest),
        "{read_first:?}"
    );
    assert_eq!(read_last, last.1);
    let after = journal_files(&disk);
    assert_eq!(after, before[2..].to_vec());
    assert!(!after
        .iter()
        .any(|name| Path::new(DIR).join(name) == journal_file_path(Path::new(DIR), 0)));
    assert!(disk.dirty_dirs().is_empty(), "removals left unsynced: {:?}", disk.dirty_dirs());
    let (_journal, _report, found, _) =
        block_on(open_collect(disk.clone(), Path::new(DIR), config, pos)).unwrap();
    let expected: Vec<&(JournalPos, Vec<u8>)> =
        entries.iter().filter(|(at, _)| *at >= pos).collect();
    assert_eq!(found.len(), expected.len());
    for (entry, (at, bytes)) in found.iter().zip(expected) {
        assert_eq!(entry.position, *at);
        assert_eq!(&entry.payload, bytes);
    }
}

#[test]
fn the_newest_file_is_never_released_even_with_a_commit_in_flight() {
    // Goal: a position past everything releases every file but the newest one (commits go
    // there) and appends go on after it, also while a commit into the newest file is still
    // being written.
    let (disk, entries) = written(120);
    let before = journal_files(&disk);
    let last = entries.last().unwrap().clone();
    let (released, appended) =
        with_journal(&disk, JournalPos(0), async |journal: &Journal<SimStorage>| {
            let released = journal.release_below(JournalPos(u64::MAX)).await.unwrap();
            let bytes = payload(BatchKind::Data, 2000, 9_999);
            let ticket = journal.append(Lane::Data, PartitionHandle(1), &bytes).unwrap();
            ticket.durable().await.unwrap();
            let again = journal.read(ticket.position().unwrap()).await.unwrap().bytes.to_vec();
            assert_eq!(&*journal.read(last.0).await.unwrap().bytes, &last.1[..]);
            (released, again == bytes)
        });
    assert_eq!(released.files, before.len() - 1);
    assert!(appended);
    assert_eq!(journal_files(&disk), before[before.len() - 1..].to_vec());

    // A commit in flight in the newest file: hold the first write into the second file.
    // A roll names the new file only once every commit of the old one is durable, so the
    // old file may go, the new one stays, and the held commit completes and is read back.
    let disk = SimStorage::new();
    let config = small_config();
    let second = journal_file_path(Path::new(DIR), config.file_bytes);
    let gate = disk.hold(move |op, path, _| op == IoOp::Write && path == second);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), Path::new(DIR), config.clone(), JournalPos(0)))
            .unwrap();
    let (released, durable, last) = block_on(drive(&journal, async {
        let mut tickets = Vec::new();
        for tag in 0..60u64 {
            let bytes = payload(BatchKind::Data, 2000, 50_000 + tag);
            tickets.push(journal.append(Lane::Data, PartitionHandle(1), &bytes).unwrap());
        }
        while !gate.reached() {
            yield_now().await;
        }
        let durable = journal.durable_position();
        let released = journal.release_below(JournalPos(u64::MAX)).await.unwrap();
        assert_eq!(journal.durable_position(), durable, "the write is still held");
        gate.release();
        for ticket in &tickets {
            ticket.durable().await.unwrap();
        }
        let last = tickets.last().unwrap().position().unwrap();
        let read = journal.read(last).await.unwrap().bytes.to_vec();
        assert_eq!(read, payload(BatchKind::Data, 2000, 50_000 + 59));
        (released, durable, last)
    }));
    assert!(durable.0 <= config.file_bytes, "the held write kept the watermark at file 0's end");
    assert!(last.0 >= config.file_bytes);
    assert_eq!(released.files, 1, "file 0 went, the file being written stayed");
    let first_name = journal_file_path(Path::new(DIR), 0);
    assert!(!journal_files(&disk).iter().any(|name| Path::new(DIR).join(name) == first_name));
}

#[test]
fn a_failed_remove_keeps_the_file_listed_and_the_next_release_takes_it() {
    // Goal: a remove that fails is an error, not a lost file: the file is still read and
    // still listed, and the next call removes it.
    let (disk, entries) = written(120);
    let config = small_config();
    let second_base = config.file_bytes;
    let (pos, _) = *entries.iter().find(|(pos, _)| pos.0 >= 2 * second_base).unwrap();
    let first = entries[0].clone();
    let (failed, read_first, second) =
        with_journal(&disk, JournalPos(0), async |journal: &Journal<SimStorage>| {
            // The next remove, after recovery's own (a stale next.prep), fails.
            disk.inject_failure(IoOp::Remove, 1);
            let failed = journal.release_below(pos).await;
            let read_first = journal.read(first.0).await.map(|batch| batch.bytes.to_vec());
            let second = journal.release_below(pos).await.unwrap();
            (failed, read_first, second)
        });
    assert!(matches!(failed, Err(JournalError::Io(_))), "{failed:?}");
    assert_eq!(read_first.unwrap(), first.1, "the file that failed to go is still read");
    assert_eq!(second.files, 2);
    assert_eq!(second.oldest, JournalPos(2 * second_base));
}

#[test]
fn a_crash_at_any_step_of_a_release_recovers_everything_at_or_after_the_position() {
    // Goal: at every remove and directory sync of a release, every crash image (synced only,
    // everything written) recovers from the position with every entry at or after it,
    // whatever subset of the released files survived.
    let (disk, entries) = written(160);
    let config = small_config();
    let (pos, _) = *entries.iter().find(|(pos, _)| pos.0 >= 3 * config.file_bytes).unwrap();
    let expected: Vec<(JournalPos, Vec<u8>)> =
        entries.iter().filter(|(at, _)| *at >= pos).cloned().collect();
    let images = Rc::new(RefCell::new(Vec::new()));
    {
        let images = images.clone();
        disk.set_hook(move |disk, op, _count| {
            if matches!(op, IoOp::Remove | IoOp::SyncDir) {
                images.borrow_mut().push(disk.crash_image(CrashMode::DurableOnly));
                images.borrow_mut().push(disk.crash_image(CrashMode::AllWritten));
            }
        });
    }
    let released = with_journal(&disk, JournalPos(0), async |journal: &Journal<SimStorage>| {
        journal.release_below(pos).await.unwrap()
    });
    disk.clear_hook();
    assert_eq!(released.files, 3);
    let images = images.take();
    // Three removes and one directory sync, two images each.
    assert!(images.len() >= 8, "{}", images.len());
    for image in images {
        let (_journal, _report, found, _) =
            block_on(open_collect(image, Path::new(DIR), config.clone(), pos)).unwrap();
        let found: Vec<(JournalPos, Vec<u8>)> =
            found.into_iter().map(|entry| (entry.position, entry.payload)).collect();
        assert_eq!(found, expected);
    }
}
