//! Fuzz target: arbitrary bytes as an enqueued record batch through
//! `BatchView::validate` (crc, layout, checked rkyv access of every record).
//!
//! Input layout: `[flags, batch bytes...]`. With bit 0 of `flags` both crcs
//! are recomputed over the mutated bytes before validation, so the fuzzer
//! reaches the layout, record and limit checks instead of stopping at the
//! checksum. Must never panic; a batch that validates gives every record
//! back, and a data batch re-framed from all its records validates again
//! with the same record bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::batch::{validate_record, BatchBytes, BatchHeader, BatchKind, BatchView};
use spool_wire::limits::BATCH_HEADER_BYTES;

fuzz_target!(|data: &[u8]| {
    let [flags, batch @ ..] = data else { return };
    // Frames arrive 8-aligned; so do these bytes.
    let mut aligned = BatchBytes::with_capacity(batch.len());
    aligned.extend_from_slice(batch);
    if flags & 1 != 0 {
        fix_crcs(&mut aligned);
    }
    let Ok(view) = BatchView::validate(&aligned) else { return };
    for index in 0..view.len() {
        let _ = view.record_bytes(index);
    }
    if view.header().kind != BatchKind::Data {
        return;
    }
    let all: Vec<u32> = (0..view.len() as u32).collect();
    let mut slices = Vec::new();
    view.subset_slices(&all, &mut slices).expect("every index is in range");
    for slice in &slices {
        let mut copy = BatchBytes::with_capacity(slice.len());
        copy.extend_from_slice(slice);
        validate_record(&copy).expect("a record of a valid batch validates alone");
    }
    let reframed = view.reframe(&all).expect("a valid data batch re-frames");
    let again = BatchView::validate(&reframed).expect("a re-framed batch validates");
    assert_eq!(again.len(), view.len());
    for index in 0..view.len() {
        assert_eq!(again.record_bytes(index), view.record_bytes(index));
    }
});

/// Recomputes `body_crc` and `header_crc` when the header parses and the
/// bytes hold the whole batch.
fn fix_crcs(bytes: &mut [u8]) {
    let Ok(header) = BatchHeader::parse(bytes) else { return };
    let len = header.batch_len as usize;
    if len > bytes.len() || len < BATCH_HEADER_BYTES {
        return;
    }
    let body_crc = crc32c::crc32c(&bytes[32..len]);
    bytes[12..16].copy_from_slice(&body_crc.to_le_bytes());
    BatchHeader::assign(bytes, header.base_offset, header.leader_epoch);
}
