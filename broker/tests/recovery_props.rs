//! Stable-toolchain equivalent of the cargo-fuzz target `segment_recovery`
//! (`fuzz/fuzz_targets/segment_recovery.rs`): `Log::open` on the simulated
//! disk over segment bytes that are partly or wholly arbitrary must never
//! panic, and when it opens, what it serves is a contiguous run of the
//! batches that were really written, byte for byte.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::rc::Rc;

use common::{drive, make_batch, read_all, small_config};
use futures_lite::future::block_on;
use proptest::collection::vec;
use proptest::prelude::*;
use spool_broker::io::SimStorage;
use spool_broker::log::{segment_path, Log, RecordFatal};

/// Writes `batches` small batches durably; returns the disk and every
/// batch as stored (offset-stamped), in order.
fn written_log(batches: u64) -> (SimStorage, Vec<Vec<u8>>) {
    let dir = Path::new("/p");
    let disk = SimStorage::new();
    let fatal = Rc::new(RecordFatal::default());
    let stored = block_on(async {
        let (log, _) = Log::open(disk.clone(), dir, small_config(), 1, fatal).await.unwrap();
        drive(&log, async {
            let mut tickets = Vec::new();
            for tag in 0..batches {
                let batch = make_batch(1 + (tag % 3) as u32, 40 + (tag as usize * 24) % 600, tag);
                tickets.push(log.append(&batch).unwrap().ticket);
            }
            for ticket in tickets {
                ticket.durable().await.unwrap();
            }
            read_all(&log).await.into_iter().map(|batch| batch.bytes.to_vec()).collect::<Vec<_>>()
        })
        .await
    });
    (disk, stored)
}

/// The body of fuzz target `segment_recovery` on a prepared disk: open,
/// read everything back, check it against `stored`.
fn recover_and_check(disk: SimStorage, stored: &[Vec<u8>]) -> Result<(), TestCaseError> {
    let dir = Path::new("/p");
    let fatal = Rc::new(RecordFatal::default());
    let opened = block_on(Log::open(disk, dir, small_config(), 2, fatal));
    let Ok((log, _)) = opened else { return Ok(()) };
    let served = block_on(drive(&log, read_all(&log)));
    prop_assert!(served.len() <= stored.len() + 1, "recovery invented batches");
    for (index, batch) in served.iter().enumerate() {
        match stored.get(index) {
            Some(original) => {
                prop_assert_eq!(&batch.bytes.to_vec(), original, "batch {} changed", index)
            }
            None => prop_assert!(false, "batch {} was never written", index),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    // Goal: arbitrary bytes over part of a real segment never panic recovery
    // and never make it serve a batch that was not written. Method: a log of
    // a few batches, a random window of the segment overwritten with random
    // bytes, open, read back, compare.
    #[test]
    fn damaged_segment_recovers_a_prefix_or_refuses(
        batches in 1u64..40,
        at in 0usize..(64 * 1024),
        junk in vec(any::<u8>(), 1..512),
    ) {
        let (disk, stored) = written_log(batches);
        let path = segment_path(Path::new("/p"), 0);
        let mut image = disk.file_bytes(&path).unwrap();
        let end = (at + junk.len()).min(image.len());
        let start = at.min(end);
        image[start..end].copy_from_slice(&junk[..end - start]);
        disk.set_file_bytes(&path, image);
        recover_and_check(disk, &stored)?;
    }

    // Goal: a segment of wholly arbitrary bytes (any length) never panics
    // recovery. Method: replace segment 0 of an empty log with random bytes.
    #[test]
    fn arbitrary_segment_never_panics(image in vec(any::<u8>(), 0..(80 * 1024))) {
        let (disk, _) = written_log(1);
        disk.set_file_bytes(&segment_path(Path::new("/p"), 0), image);
        recover_and_check(disk, &[])?;
    }
}
