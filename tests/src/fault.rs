//! Helpers of the fault tests (`tests/tests/{corruption,lease_pause,hostile,
//! full_disk,failpoints,overload}.rs`): message ids and payloads a checker
//! can recompute, damaging files, finding a partition's directory and a
//! shard's journal files, walking a journal file entry by entry, and
//! draining a partition while checking every payload; what a hostile
//! client sends and a good client's round trip beside it.
//!
//! It asserts nothing about the broker itself; each test does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{ClaimOptions, Client, ClientError, Delivery, Message, PayloadView, Producer};

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
    ClaimOptions {
        worker: WorkerId(worker),
        credits,
        max_bytes: 4 << 20,
        lease_ms,
        wait_ms,
        subscription: None,
    }
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

/// crc32c (Castagnoli, reflected, as the broker's headers use), computed
/// here so the helpers below read journal files without the broker's code.
pub fn crc32c(bytes: &[u8]) -> u32 {
    const POLY: u32 = 0x82F6_3B78;
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
        }
    }
    !crc
}

/// Bytes of the journal entry header the broker writes (v2, "SPJ2", with
/// the entry index and term; `broker/src/log/journal/entry.rs`).
pub const JOURNAL_HEADER_BYTES: u64 = 48;
/// Bytes of a v1 header ("SPJ1"): fillers, and entries of older journals.
pub const JOURNAL_V1_HEADER_BYTES: u64 = 32;
/// Bytes of the batch header at the start of a journal entry's payload.
pub const BATCH_HEADER_BYTES: u64 = 64;
/// Partition field of a filler entry.
pub const FILLER_HANDLE: u32 = u32::MAX;
/// Suffix of journal files (`{position:020}.wal`).
pub const JOURNAL_FILE_SUFFIX: &str = ".wal";
/// The journal file being zero-filled ahead of need.
pub const JOURNAL_PREPARED_NAME: &str = "next.prep";

/// `DATA_DIR/shard-NN`.
pub fn shard_dir(data_dir: &Path, shard: u16) -> PathBuf {
    data_dir.join(format!("shard-{shard:02}"))
}

/// `DATA_DIR/shard-NN/journal`.
pub fn journal_dir(data_dir: &Path, shard: u16) -> PathBuf {
    shard_dir(data_dir, shard).join("journal")
}

/// The journal files (`*.wal`) of shard `shard`, oldest first (their names
/// are zero-padded positions, so name order is position order).
pub fn journal_files(data_dir: &Path, shard: u16) -> Vec<PathBuf> {
    files_ending(&journal_dir(data_dir, shard), JOURNAL_FILE_SUFFIX)
}

/// The journal position of byte 0 of a journal file, from its name.
pub fn journal_file_base(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(JOURNAL_FILE_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One entry found in a journal file by [`journal_entries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryAt {
    /// File offset of its header.
    pub pos: u64,
    /// Bytes of its header: 48 (v2) or 32 (v1, fillers).
    pub header_bytes: u64,
    /// Its entry index in its partition's log (0 in a v1 header).
    pub entry_index: u64,
    /// Journal position it names (file base + `pos`).
    pub position: u64,
    /// Partition handle (bit 31: a relocated copy); [`FILLER_HANDLE`] for a
    /// filler.
    pub handle: u32,
    /// The durable watermark its writer recorded.
    pub watermark: u64,
    /// `entry_len`: header plus payload.
    pub len_bytes: u64,
    /// The payload batch's kind (0 data, 1 control); `None` for a filler.
    pub batch_kind: Option<u16>,
    /// The payload batch's base offset (a data batch's first partition
    /// offset); 0 for a filler.
    pub base_offset: u64,
    /// The payload batch's record count; 0 for a filler.
    pub record_count: u32,
}

impl EntryAt {
    pub fn is_filler(&self) -> bool {
        self.handle == FILLER_HANDLE
    }

    pub fn is_data(&self) -> bool {
        self.batch_kind == Some(0)
    }

    pub fn is_control(&self) -> bool {
        self.batch_kind == Some(1)
    }

    /// File offset just past the entry.
    pub fn end(&self) -> u64 {
        self.pos + self.len_bytes
    }

    /// File offset of its payload (the batch header).
    pub fn payload_pos(&self) -> u64 {
        self.pos + self.header_bytes
    }
}

fn le(bytes: &[u8], at: usize, len: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw[..len].copy_from_slice(&bytes[at..at + len]);
    u64::from_le_bytes(raw)
}

/// Walks the entries of one journal file (layout in
/// `broker/src/log/journal/entry.rs`) from byte 0, header by header, up to
/// the first header that is not intact (all zero: the unwritten rest; bad
/// magic, header crc, length or self-named position: damage). Reads both
/// header forms — v2 (48 bytes, crc of the first 44) and v1 (32 bytes, crc
/// of the first 28; fillers) — and not the payloads' batch crcs; reads the
/// kind, base offset and record count of each payload's batch header.
pub fn journal_entries(path: &Path) -> std::io::Result<Vec<EntryAt>> {
    let base = journal_file_base(path).ok_or_else(|| {
        std::io::Error::other(format!("{} is not a journal file name", path.display()))
    })?;
    let bytes = std::fs::read(path)?;
    let mut entries = Vec::new();
    let mut pos = 0usize;
    while pos + JOURNAL_V1_HEADER_BYTES as usize <= bytes.len() {
        let (header_bytes, len_at, crc_at) = match &bytes[pos..pos + 4] {
            b"SPJ2" => (JOURNAL_HEADER_BYTES as usize, 40, 44),
            b"SPJ1" => (JOURNAL_V1_HEADER_BYTES as usize, 24, 28),
            _ => break,
        };
        if pos + header_bytes > bytes.len() {
            break;
        }
        let header = &bytes[pos..pos + header_bytes];
        if le(header, crc_at, 4) != u64::from(crc32c(&header[..crc_at])) {
            break;
        }
        let len_bytes = le(header, len_at, 4);
        let position = le(header, 8, 8);
        if len_bytes < header_bytes as u64
            || !len_bytes.is_multiple_of(8)
            || position != base + pos as u64
            || pos as u64 + len_bytes > bytes.len() as u64
        {
            break;
        }
        let handle = u32::try_from(le(header, 4, 4)).unwrap_or(FILLER_HANDLE);
        let payload = pos + header_bytes;
        let batch = (handle != FILLER_HANDLE
            && len_bytes >= header_bytes as u64 + BATCH_HEADER_BYTES)
            .then(|| &bytes[payload..payload + BATCH_HEADER_BYTES as usize]);
        entries.push(EntryAt {
            pos: pos as u64,
            header_bytes: header_bytes as u64,
            entry_index: if header_bytes == 48 { le(header, 24, 8) } else { 0 },
            position,
            handle,
            watermark: le(header, 16, 8),
            len_bytes,
            batch_kind: batch.map(|batch| u16::try_from(le(batch, 6, 2)).unwrap_or(u16::MAX)),
            base_offset: batch.map_or(0, |batch| le(batch, 16, 8)),
            record_count: batch.map_or(0, |batch| u32::try_from(le(batch, 32, 4)).unwrap_or(0)),
        });
        pos += usize::try_from(len_bytes).unwrap_or(usize::MAX / 2);
    }
    Ok(entries)
}

/// A frame header (`wire/src/proto/frame.rs`) of an Enqueue whose length
/// prefix says `frame_bytes` and whose body length says `body_bytes`: what
/// a hostile client sends before (or instead of) a body.
pub fn enqueue_frame_header(frame_bytes: u32, body_bytes: u32, correlation: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&frame_bytes.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // api key: enqueue
    out.extend_from_slice(&0u16.to_le_bytes()); // api version
    out.extend_from_slice(&correlation.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // flags
    out.extend_from_slice(&0u16.to_le_bytes()); // error code
    out.extend_from_slice(&body_bytes.to_le_bytes());
    out
}

/// Connections to `addr` that each start an Enqueue frame of
/// `frame_bytes`, send all of it but its last 64 bytes, and then neither
/// finish it nor read: memory a hostile client makes the broker hold.
/// Each task blocks (once the broker stops reading) until aborted. With
/// `reset_on_close` an aborted connection is reset (`SO_LINGER` 0: its
/// unsent bytes are dropped and the broker sees the end at once); without
/// it, its close waits behind its unsent bytes, as a killed client's does.
pub fn hold_unfinished_frames(
    addr: &str,
    connections: usize,
    frame_bytes: u32,
    reset_on_close: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..connections)
        .map(|slot| {
            let addr = addr.to_owned();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else { return };
                if reset_on_close {
                    stream.set_zero_linger().expect("SO_LINGER 0");
                }
                let mut frame =
                    enqueue_frame_header(frame_bytes, frame_bytes - 24, slot as u64 + 1);
                frame.resize(frame_bytes as usize - 64, 0x5A);
                // Blocks once the broker stops reading: that is the point.
                let _ = stream.write_all(&frame).await;
                std::future::pending::<()>().await;
            })
        })
        .collect()
}

/// A well-behaved client of `broker` with queue `queue` (one partition)
/// created, and its paths warmed by one round trip (message id `(9, 0)`),
/// so a test's resident-memory figures measure its load rather than
/// first-use allocations.
pub async fn warmed_good_client(broker: &crate::Spoold, queue: &str) -> (Client, Producer) {
    let client = broker.client().await;
    spool_client::Admin::new(client.clone())
        .create_queue(queue, crate::test_queue_config(1, 10_000, 10))
        .await
        .unwrap_or_else(|error| panic!("create {queue}: {error}"));
    let producer = Producer::new(client.clone(), spool_client::ProducerConfig::default())
        .unwrap_or_else(|error| panic!("producer: {error}"));
    good_round_trip(&client, &producer, queue, message_id(9, 0), 0).await;
    (client, producer)
}

/// A well-behaved client's round trip on partition 0 of `queue`: enqueue
/// message `id`, claim one message (worker 2), check it is that one (the
/// queue holds nothing else), ack it. Returns how long it took; panics
/// naming `round` on any error.
pub async fn good_round_trip(
    client: &Client,
    producer: &Producer,
    queue: &str,
    id: MessageId,
    round: u64,
) -> std::time::Duration {
    let started = crate::now();
    producer
        .send(queue, Message::new(format!("job {round}")).id(id))
        .await
        .unwrap_or_else(|error| panic!("round {round}: send: {error}"));
    let batch = client
        .claim(queue, PartitionId(0), &claim_options(2, 1, 5_000, 2_000))
        .await
        .unwrap_or_else(|error| panic!("round {round}: claim: {error}"));
    assert_eq!(batch.deliveries.len(), 1, "round {round}");
    assert_eq!(batch.deliveries[0].message_id(), id, "round {round}: FIFO");
    let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
    client
        .ack(queue, PartitionId(0), &tokens)
        .await
        .unwrap_or_else(|error| panic!("round {round}: {error}"));
    started.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // Goal: the test's own crc32c is Castagnoli's (check value of
        // "123456789"), so header crcs it computes are the broker's.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn journal_file_names_parse() {
        // Goal: only `{20 digits}.wal` names a journal file.
        assert_eq!(journal_file_base(Path::new("/j/00000000000008388608.wal")), Some(8_388_608));
        assert_eq!(journal_file_base(Path::new("/j/next.prep")), None);
        assert_eq!(journal_file_base(Path::new("/j/0000000000000000000x.wal")), None);
    }
}
