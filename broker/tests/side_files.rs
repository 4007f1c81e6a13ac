//! Side files (checkpoints, dedupe generations) written in pieces: the
//! write buffer starts small and grows per chunk, and whatever the payload's
//! size and the pieces' split, the file reads back byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::path::Path;

mod common;

use common::run_glommio as run;
use spool_broker::io::{IoOp, SimStorage, Storage};
use spool_broker::limits::{SIDE_WRITE_CHUNK_BYTES, SIDE_WRITE_CHUNK_FIRST_BYTES};
use spool_broker::partition::files::{read_side_file, SideFileWriter};

const MAGIC: u32 = 0x5344_4546;

/// Bytes that differ at every offset (a misplaced chunk cannot read back equal).
fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7])
        .collect()
}

/// Writes `payload` through a writer in pieces of `piece` bytes; returns the
/// largest live buffer bytes seen after each piece.
async fn write_in_pieces(disk: &SimStorage, name: &str, payload: &[u8], piece: usize) -> u64 {
    let dir = Path::new("/data/p0");
    let mut writer = SideFileWriter::create(disk, dir, name).await.unwrap();
    let mut held_max = disk.live_buf_bytes();
    for part in payload.chunks(piece.max(1)) {
        writer.write(part).await.unwrap();
        held_max = held_max.max(disk.live_buf_bytes());
    }
    assert_eq!(writer.payload_len(), payload.len() as u64);
    writer.finish(disk, MAGIC, payload.len() as u64 * 3).await.unwrap();
    held_max
}

// Goal: a side file of any size reads back exactly, across the growing
// chunks (first chunk, each doubling, the capped ones, a partial last one).
// Method: payloads of 0 B, 1 B, exactly the first chunk less its 32-byte
// header, one more byte than that, and 3 MiB + 7 B, each written in pieces
// of 1 B (small ones), 1,000 B and 300 KiB; read back payload and value.
#[test]
fn side_files_of_every_size_read_back_across_the_growing_chunks() {
    run(async {
        let disk = SimStorage::new();
        disk.create_dir_all(Path::new("/data/p0")).await.unwrap();
        let first = SIDE_WRITE_CHUNK_FIRST_BYTES - 32;
        let sizes = [0, 1, first, first + 1, 3 * SIDE_WRITE_CHUNK_BYTES + 7];
        for (index, &size) in sizes.iter().enumerate() {
            let bytes = payload(size);
            for piece in [1, 1_000, 300 * 1024] {
                if piece == 1 && size > 64 * 1024 {
                    continue;
                }
                let name = format!("side-{index}-{piece}");
                write_in_pieces(&disk, &name, &bytes, piece).await;
                let read = read_side_file(&disk, Path::new("/data/p0"), &name, MAGIC)
                    .await
                    .unwrap()
                    .expect("the file exists");
                assert_eq!(read.value, size as u64 * 3, "{name}");
                assert!(read.payload == bytes, "{name}: {size} bytes did not read back");
            }
        }
    });
}

// Goal: a small side file holds a small write buffer (a shard may write
// the checkpoints of thousands of small partitions), and a large one still
// writes in chunks of up to SIDE_WRITE_CHUNK_BYTES. Method: the simulated
// disk's live buffer bytes while writing 4 KiB stay within the first chunk
// and a page (the header page of `finish`); 8 MiB are written in few writes
// (the doubling chunks up to 1 MiB, then 1 MiB each), never in 16 KiB ones.
#[test]
fn small_side_files_hold_a_small_buffer_and_large_ones_write_large_chunks() {
    run(async {
        let disk = SimStorage::new();
        disk.create_dir_all(Path::new("/data/p0")).await.unwrap();
        let held = write_in_pieces(&disk, "small", &payload(4096), 512).await;
        assert!(
            held <= (SIDE_WRITE_CHUNK_FIRST_BYTES + 4096) as u64,
            "a 4 KiB side file held {held} bytes of buffers"
        );
        let writes_before = disk.count(IoOp::Write);
        let large = 8 * SIDE_WRITE_CHUNK_BYTES;
        let held = write_in_pieces(&disk, "large", &payload(large), 256 * 1024).await;
        assert!(held <= 2 * SIDE_WRITE_CHUNK_BYTES as u64 + 4096, "held {held}");
        let writes = disk.count(IoOp::Write) - writes_before;
        let doublings = (SIDE_WRITE_CHUNK_BYTES / SIDE_WRITE_CHUNK_FIRST_BYTES).ilog2() as u64;
        // The doubling chunks sum to just under SIDE_WRITE_CHUNK_BYTES; the rest go
        // in full chunks, one partial chunk, and the header page.
        let full = (large / SIDE_WRITE_CHUNK_BYTES) as u64;
        assert!(writes <= doublings + full + 2, "{writes} writes for {large} bytes");
    });
}
