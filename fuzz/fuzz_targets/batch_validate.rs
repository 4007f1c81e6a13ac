//! Fuzz target: arbitrary bytes as an enqueued record batch through
//! `BatchView::validate` (crc, layout, checked rkyv access of every record).
//! Must never panic; a batch that validates must give every record back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::batch::{BatchBytes, BatchView};

fuzz_target!(|data: &[u8]| {
    // Frames arrive 8-aligned; so do these bytes.
    let mut aligned = BatchBytes::with_capacity(data.len());
    aligned.extend_from_slice(data);
    if let Ok(view) = BatchView::validate(&aligned) {
        for index in 0..view.len() {
            let _ = view.record_bytes(index);
        }
    }
});
