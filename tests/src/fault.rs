//! Helpers of the fault tests (`tests/tests/{corruption,lease_pause,hostile,
//! full_disk,failpoints,overload}.rs`): message ids and payloads a checker
//! can recompute, damaging files, finding a partition's directory, and
//! draining a partition while checking every payload.
//!
//! It asserts nothing about the broker itself; each test does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{ClaimOptions, Client, ClientError, Delivery, PayloadView};

/// A message id naming `(source, sequence)`.
pub fn message_id(source: u32, sequence: u64) -> MessageId {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&source.to_le_bytes());
    id[4..12].copy_from_slice(&sequence.to_le_bytes());
    MessageId(id)
}

/// The `(source, sequence)` of an id built by [`message_id`].
pub fn id_parts(id: MessageId) -> (u32, u64) {
    let mut source = [0u8; 4];
    source.copy_from_slice(&id.0[..4]);
    let mut sequence = [0u8; 8];
    sequence.copy_from_slice(&id.0[4..12]);
    (u32::from_le_bytes(source), u64::from_le_bytes(sequence))
}

/// The payload of message `id`: `len_bytes` bytes derived from the id, so
/// a checker can tell a right payload from a neighbour's.
pub fn payload_for(id: MessageId, len_bytes: usize) -> Vec<u8> {
    let (source, sequence) = id_parts(id);
    let mut state = (u64::from(source) << 40) ^ sequence ^ 0x9E37_79B9_7F4A_7C15;
    (0..len_bytes)
        .map(|_| {
            // xorshift64: cheap, deterministic, no repeating short period.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Claim options for a test worker.
pub fn claim_options(worker: u64, credits: u32, lease_ms: u32, wait_ms: u32) -> ClaimOptions {
    ClaimOptions { worker: WorkerId(worker), credits, max_bytes: 4 << 20, lease_ms, wait_ms }
}

/// The inline payload of a delivery (tests never send references).
pub fn inline_payload(delivery: &Delivery) -> Vec<u8> {
    match delivery.payload() {
        PayloadView::Inline(bytes) => bytes.to_vec(),
        PayloadView::Reference { location, .. } => panic!("unexpected reference {location}"),
    }
}

/// Claims and acks everything in one partition until a claim long-polling
/// `wait_ms` finds nothing. Returns message id → (offset, payload) of what
/// was drained; a message delivered twice is an error (nothing else
/// claims while this runs).
///
/// # Errors
/// The first claim or ack that failed, or a refused ack.
pub async fn drain_partition(
    client: &Client,
    queue: &str,
    partition: PartitionId,
    wait_ms: u32,
) -> Result<HashMap<MessageId, (u64, Vec<u8>)>, ClientError> {
    let mut drained = HashMap::new();
    loop {
        let batch =
            client.claim(queue, partition, &claim_options(0xd7a1, 256, 30_000, wait_ms)).await?;
        if batch.deliveries.is_empty() {
            return Ok(drained);
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack(queue, partition, &tokens).await?;
        for delivery in &batch.deliveries {
            let entry = (delivery.offset().0, inline_payload(delivery));
            if drained.insert(delivery.message_id(), entry).is_some() {
                return Err(ClientError::Protocol(format!(
                    "{:?} delivered twice while draining",
                    id_parts(delivery.message_id())
                )));
            }
        }
    }
}

/// Copies a directory tree (files and directories only).
pub fn copy_dir_all(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir_all(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The directories of every partition under `data_dir`, sorted
/// (`partitions/q*/p*`).
pub fn partition_dirs(data_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(queues) = std::fs::read_dir(data_dir.join("partitions")) else { return dirs };
    for queue in queues.flatten() {
        let Ok(partitions) = std::fs::read_dir(queue.path()) else { continue };
        dirs.extend(partitions.flatten().map(|entry| entry.path()));
    }
    dirs.sort();
    dirs
}

/// Files in `dir` whose name ends with `suffix`, sorted.
pub fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.to_str().is_some_and(|name| name.ends_with(suffix)))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Inverts bit `bit` of the byte at `pos` of `path`.
pub fn flip_bit(path: &Path, pos: u64, bit: u8) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let mut byte = [0u8; 1];
    file.seek(SeekFrom::Start(pos))?;
    file.read_exact(&mut byte)?;
    byte[0] ^= 1 << (bit % 8);
    file.seek(SeekFrom::Start(pos))?;
    file.write_all(&byte)?;
    file.sync_all()
}

/// One batch found in a segment file by [`segment_batches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchAt {
    /// File position of its header.
    pub pos: u64,
    /// `batch_len`.
    pub len_bytes: u64,
    /// 0 data, 1 control, 2 filler.
    pub kind: u16,
    /// Base offset.
    pub base_offset: u64,
}

/// Walks the batch headers of a segment file (see
/// `docs/design/segment-format.md`) up to the first all-zero header. Reads
/// the header fields only; checks nothing.
pub fn segment_batches(path: &Path) -> std::io::Result<Vec<BatchAt>> {
    const HEADER_BYTES: usize = 64;
    let bytes = std::fs::read(path)?;
    let mut batches = Vec::new();
    let mut pos = 0usize;
    while pos + HEADER_BYTES <= bytes.len() {
        let header = &bytes[pos..pos + HEADER_BYTES];
        if header.iter().all(|byte| *byte == 0) {
            break;
        }
        let field = |at: usize, len: usize| {
            let mut raw = [0u8; 8];
            raw[..len].copy_from_slice(&header[at..at + len]);
            u64::from_le_bytes(raw)
        };
        let len_bytes = field(8, 4);
        if len_bytes < HEADER_BYTES as u64 {
            break;
        }
        let kind = u16::try_from(field(6, 2)).unwrap_or(u16::MAX);
        batches.push(BatchAt { pos: pos as u64, len_bytes, kind, base_offset: field(16, 8) });
        pos += usize::try_from(len_bytes).unwrap_or(usize::MAX / 2);
    }
    Ok(batches)
}
