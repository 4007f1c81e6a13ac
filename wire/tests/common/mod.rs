//! Test helpers shared by the batch tests: sample records, and an
//! independent hand-written framer, so tests can build batches the builder
//! would refuse and check the builder against the documented layout.

#![allow(dead_code)]

use spool_wire::batch::{
    BatchBytes, BatchHeader, BatchKind, HeaderField, MessageId, Payload, PayloadRef, Record,
};

/// A record with every field set, varied by `n`.
pub fn sample_record(n: u32) -> Record {
    let byte = n.to_le_bytes()[0];
    Record {
        message_id: MessageId([byte; 16]),
        routing_key: format!("key-{n}").into_bytes(),
        headers: (0..n % 4)
            .map(|h| HeaderField {
                key: format!("h{h}").into_bytes(),
                value: vec![byte; h as usize],
            })
            .collect(),
        payload: if n % 3 == 2 {
            Payload::Reference(PayloadRef {
                location: format!("s3://bucket/object-{n}"),
                len_bytes: 5 << 20,
                digest: [byte ^ 0x5a; 32],
            })
        } else {
            Payload::Inline(vec![byte; (n as usize * 37) % 300])
        },
        priority: byte % 8,
        not_before_ms: u64::from(n) * 3,
        expiry_ms: if n.is_multiple_of(2) { 0 } else { 9_000_000 + u64::from(n) },
        enqueue_time_ms: 1_000 + u64::from(n * 7 % 11),
    }
}

/// The archive of one record, made with rkyv directly (no limit checks).
pub fn archive(record: &Record) -> BatchBytes {
    let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(record).expect("archive");
    let mut out = BatchBytes::new();
    out.extend_from_slice(&bytes);
    out
}

/// Frames `records` into a batch exactly as the layout documentation says,
/// without any limit checks, and writes a header with valid crcs.
pub fn frame(kind: BatchKind, records: &[&[u8]], first_ms: u64, max_ms: u64) -> BatchBytes {
    let align = |len: usize| len.div_ceil(8) * 8;
    let table_end = 64 + 8 * records.len();
    let mut out = BatchBytes::new();
    out.resize(table_end, 0);
    let mut position = table_end;
    for (index, record) in records.iter().enumerate() {
        let entry = 64 + 8 * index;
        out[entry..entry + 4].copy_from_slice(&(position as u32).to_le_bytes());
        out[entry + 4..entry + 8].copy_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
        position = align(position + record.len());
        out.resize(position, 0);
    }
    BatchHeader {
        kind,
        batch_len: out.len() as u32,
        body_crc: 0,
        base_offset: 0,
        leader_epoch: 0,
        header_crc: 0,
        record_count: records.len() as u32,
        flags: 0,
        first_timestamp_ms: first_ms,
        max_timestamp_ms: max_ms,
    }
    .write(&mut out);
    out
}

/// A data batch of `records` framed by hand, timestamps derived correctly.
pub fn frame_records(records: &[Record]) -> BatchBytes {
    let archives: Vec<BatchBytes> = records.iter().map(archive).collect();
    let slices: Vec<&[u8]> = archives.iter().map(|a| a.as_slice()).collect();
    let first = records.first().map_or(0, |r| r.enqueue_time_ms);
    let max = records.iter().map(|r| r.enqueue_time_ms).max().unwrap_or(0);
    frame(BatchKind::Data, &slices, first, max)
}

/// Recomputes both crcs after a test edited the bytes on purpose, so the
/// structural checks behind the crcs are what gets exercised.
pub fn reseal(bytes: &mut [u8]) {
    let batch_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let end = batch_len.clamp(32, bytes.len());
    let body_crc = crc32c::crc32c(&bytes[32..end]);
    bytes[12..16].copy_from_slice(&body_crc.to_le_bytes());
    let base_offset = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let epoch = u32::from_le_bytes(bytes[24..28].try_into().unwrap());
    BatchHeader::assign(bytes, base_offset, epoch);
}

/// Copies `bytes` into a fresh aligned buffer.
pub fn aligned(bytes: &[u8]) -> BatchBytes {
    let mut out = BatchBytes::new();
    out.extend_from_slice(bytes);
    out
}

/// Builds a data batch from `records` with the builder.
pub fn build(records: &[Record]) -> BatchBytes {
    let mut builder = spool_wire::batch::DataBatchBuilder::new();
    for record in records {
        builder.push(record).expect("push");
    }
    builder.finish().expect("finish")
}
