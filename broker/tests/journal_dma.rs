//! The shard journal on real files through glommio O_DIRECT (`DmaStorage`)
//! in a temp dir: appends from several partitions in both lanes across file
//! rolls, reopen and recovery byte for byte, and a torn tail written into
//! the file by hand cut on the next open.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::future::Future;
use std::os::unix::fs::FileExt;

use glommio::{LocalExecutorBuilder, Placement};
use journal_common::{drive, open_collect, payload, small_config};
use spool_broker::io::DmaStorage;
use spool_broker::log::journal::{journal_file_path, JournalPos, Lane, PartitionHandle};
use spool_wire::batch::BatchKind;

fn run<T>(future: impl Future<Output = T>) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        // Registered (fixed) buffers make reads fail with EOPNOTSUPP on this kernel: see io/dma.rs.
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(future)
}

#[test]
fn append_sync_reopen_and_recover_on_real_files() {
    // Goal: on O_DIRECT files the journal rolls through pre-zeroed files, and a reopen
    // recovers every entry byte for byte, in order, with its partition; garbage past the
    // end (a torn commit) is cut and the journal appends after it.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("shard-00").join("journal");
    let config = small_config();
    run(async {
        let (journal, report, found, fatal) =
            open_collect(DmaStorage, &dir, config.clone(), JournalPos(0)).await.unwrap();
        assert!(report.created);
        assert!(found.is_empty());
        let stored = drive(&journal, async {
            let mut stored = Vec::new();
            for tag in 0..140u64 {
                let (lane, kind, size) = if tag % 3 == 0 {
                    (Lane::Control, BatchKind::Control, 40 + (tag as usize % 5) * 8)
                } else {
                    (Lane::Data, BatchKind::Data, 200 + (tag as usize * 37) % 2500)
                };
                let bytes = payload(kind, size, tag);
                let partition = PartitionHandle(tag as u32 % 5);
                let ticket = journal.append(lane, partition, &bytes).unwrap();
                stored.push((partition, bytes, ticket));
                if tag % 9 == 0 {
                    stored.last().unwrap().2.durable().await.unwrap();
                }
            }
            for (_, _, ticket) in &stored {
                ticket.durable().await.unwrap();
            }
            stored
        })
        .await;
        assert!(fatal.reasons().is_empty());
        assert!(journal.stats().files_rolled >= 2, "{:?}", journal.stats());
        let end = journal.durable_position();
        drop(journal);

        let (journal, report, found, _) =
            open_collect(DmaStorage, &dir, config.clone(), JournalPos(0)).await.unwrap();
        assert!(report.truncated_at.is_none());
        assert_eq!(report.next_position, end);
        let mut by_position: Vec<_> = stored.iter().collect();
        by_position.sort_by_key(|(_, _, ticket)| ticket.position().unwrap());
        assert_eq!(found.len(), stored.len());
        for (entry, (partition, bytes, ticket)) in found.iter().zip(&by_position) {
            assert_eq!(Some(entry.position), ticket.position());
            assert_eq!(entry.partition, *partition);
            assert_eq!(&entry.payload, bytes);
        }
        drop(journal);

        // A torn commit after the end: garbage pages where the next commit would go.
        let last_base = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|entry| {
                let name = entry.unwrap().file_name().into_string().unwrap();
                spool_broker::log::journal::parse_journal_file_name(&name)
            })
            .max()
            .unwrap();
        assert!(end.0 - last_base + 4096 <= config.file_bytes, "end {end}, last file {last_base}");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(journal_file_path(&dir, last_base))
            .unwrap();
        let garbage: Vec<u8> = (0..3000u32).map(|index| (index % 253) as u8 + 1).collect();
        file.write_all_at(&garbage, end.0 - last_base).unwrap();
        file.sync_all().unwrap();
        drop(file);
        let (journal, report, refound, _) =
            open_collect(DmaStorage, &dir, config.clone(), JournalPos(0)).await.unwrap();
        let (_, cut_at) = report.truncated_at.clone().expect("torn tail cut");
        assert_eq!(cut_at, end.0 - last_base);
        assert_eq!(refound, found);
        let extra = payload(BatchKind::Control, 48, 9_999);
        drive(&journal, async {
            let ticket = journal.append(Lane::Control, PartitionHandle(3), &extra).unwrap();
            ticket.durable().await.unwrap();
        })
        .await;
        drop(journal);
        let (_journal, _, last, _) =
            open_collect(DmaStorage, &dir, config, JournalPos(0)).await.unwrap();
        assert_eq!(last.len(), found.len() + 1);
        assert_eq!(last.last().unwrap().payload, extra);
    });
}

#[test]
fn recovery_reads_files_larger_than_its_reads_in_flight_byte_for_byte() {
    // Goal: the recovery scan reads several 1 MiB chunks at once; entries that straddle
    // chunk boundaries and the boundary between one batch of reads and the next come back
    // whole and in order. 12 MiB files hold three batches of four chunks each; a break
    // in the order of the concurrent reads would fail the byte comparison (or the crc).
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("shard-00").join("journal");
    let config = spool_broker::log::journal::JournalConfig {
        file_bytes: 12 << 20,
        commit_bytes: 1 << 20,
        entry_bytes_max: 512 << 10,
        data_pending_bytes_max: 8 << 20,
        ..small_config()
    };
    run(async {
        let (journal, _, _, fatal) =
            open_collect(DmaStorage, &dir, config.clone(), JournalPos(0)).await.unwrap();
        let stored = drive(&journal, async {
            let mut stored = Vec::new();
            // ≈ 27 MiB: entries of 37 KiB to 480 KiB, over three files.
            for tag in 0..180u64 {
                let size = 37_000 + (tag as usize * 104_729) % 443_000;
                let bytes = payload(BatchKind::Data, size, tag);
                let partition = PartitionHandle(tag as u32 % 3);
                let ticket = journal.append(Lane::Data, partition, &bytes).unwrap();
                ticket.durable().await.unwrap();
                stored.push((partition, bytes, ticket));
            }
            stored
        })
        .await;
        assert!(fatal.reasons().is_empty());
        assert!(journal.stats().files_rolled >= 2, "{:?}", journal.stats());
        let end = journal.durable_position();
        drop(journal);

        let (_journal, report, found, _) =
            open_collect(DmaStorage, &dir, config, JournalPos(0)).await.unwrap();
        assert!(report.truncated_at.is_none());
        assert_eq!(report.next_position, end);
        assert_eq!(found.len(), stored.len());
        for (entry, (partition, bytes, ticket)) in found.iter().zip(&stored) {
            assert_eq!(Some(entry.position), ticket.position());
            assert_eq!(entry.partition, *partition);
            assert_eq!(&entry.payload, bytes);
        }
    });
}
