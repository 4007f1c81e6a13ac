//! Stable-toolchain equivalent of the cargo-fuzz target `journal_recovery`
//! (`fuzz/fuzz_targets/journal_recovery.rs`): `Journal::open` on the
//! simulated disk over journal bytes that are partly or wholly arbitrary
//! must never panic, and when it opens, what it hands over is a prefix of
//! the entries that were really written, byte for byte, in journal order.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::path::Path;

use futures_lite::future::block_on;
use journal_common::{drive, open_collect, payload, small_config};
use proptest::collection::vec;
use proptest::prelude::*;
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{journal_file_path, JournalPos, Lane, PartitionHandle};
use spool_wire::batch::BatchKind;

const DIR: &str = "/shard-00/journal";

/// Writes `entries` entries of three partitions, both lanes, in commits of
/// a few each; returns the durable disk image and every entry as written
/// (partition, payload), in journal order.
fn written_journal(entries: u64) -> (SimStorage, Vec<(PartitionHandle, Vec<u8>)>) {
    let disk = SimStorage::new();
    let dir = Path::new(DIR);
    let (journal, ..) =
        block_on(open_collect(disk.clone(), dir, small_config(), JournalPos(0))).unwrap();
    let mut written = block_on(drive(&journal, async {
        let mut tickets = Vec::new();
        for tag in 0..entries {
            let kind = if tag % 4 == 3 { BatchKind::Control } else { BatchKind::Data };
            let lane = if kind == BatchKind::Data { Lane::Data } else { Lane::Control };
            let partition = PartitionHandle((tag % 3) as u32);
            let bytes = payload(kind, 40 + (tag as usize * 24) % 600, tag);
            let ticket = journal.append(lane, partition, &bytes).unwrap();
            tickets.push((ticket, partition, bytes));
            if tag % 5 == 4 {
                tickets.last().unwrap().0.durable().await.unwrap();
            }
        }
        let mut out = Vec::new();
        for (ticket, partition, bytes) in tickets {
            ticket.durable().await.unwrap();
            out.push((ticket.position().unwrap().0, partition, bytes));
        }
        out
    }));
    written.sort_by_key(|(position, ..)| *position);
    let written = written.into_iter().map(|(_, partition, bytes)| (partition, bytes)).collect();
    (disk.crash_image(CrashMode::DurableOnly), written)
}

/// The body of fuzz target `journal_recovery` on a prepared disk: open,
/// compare what recovery hands over with `written`.
fn recover_and_check(
    disk: SimStorage,
    written: &[(PartitionHandle, Vec<u8>)],
) -> Result<(), TestCaseError> {
    let opened = block_on(open_collect(disk, Path::new(DIR), small_config(), JournalPos(0)));
    let Ok((_journal, _report, found, _fatal)) = opened else { return Ok(()) };
    prop_assert!(found.len() <= written.len(), "recovery invented entries");
    for (index, entry) in found.iter().enumerate() {
        let (partition, bytes) = &written[index];
        prop_assert_eq!(entry.partition, *partition, "entry {} moved partition", index);
        prop_assert_eq!(&entry.payload, bytes, "entry {} changed", index);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    // Goal: arbitrary bytes over part of a real journal file never panic
    // recovery and never make it hand over an entry that was not written.
    // Method: a journal of a few commits, a random window of its first file
    // overwritten with random bytes, open, compare.
    #[test]
    fn damaged_journal_recovers_a_prefix_or_refuses(
        entries in 1u64..40,
        at in 0usize..(64 * 1024),
        junk in vec(any::<u8>(), 1..512),
    ) {
        let (disk, written) = written_journal(entries);
        let path = journal_file_path(Path::new(DIR), 0);
        let mut image = disk.file_bytes(&path).unwrap();
        let end = (at + junk.len()).min(image.len());
        let start = at.min(end);
        image[start..end].copy_from_slice(&junk[..end - start]);
        disk.set_file_bytes(&path, image);
        recover_and_check(disk, &written)?;
    }

    // Goal: a journal file of wholly arbitrary bytes (any length) never
    // panics recovery. Method: replace file 0 of an empty journal with
    // random bytes.
    #[test]
    fn arbitrary_journal_file_never_panics(image in vec(any::<u8>(), 0..(80 * 1024))) {
        let (disk, _) = written_journal(1);
        disk.set_file_bytes(&journal_file_path(Path::new(DIR), 0), image);
        recover_and_check(disk, &[])?;
    }
}
