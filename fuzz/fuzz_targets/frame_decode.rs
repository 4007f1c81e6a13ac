//! Fuzz target: arbitrary bytes from a peer, split into reads at
//! fuzzer-chosen points, through the streaming `FrameDecoder` and
//! `Request::decode`. Input layout: `[cut0, cut1, cut2, cut3, stream...]`;
//! reads take `cut + 1` bytes, cycling through the four cuts. Must never
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::proto::{FrameDecoder, Request};

fuzz_target!(|data: &[u8]| {
    let (cuts, stream) = data.split_at(data.len().min(4));
    let mut decoder = FrameDecoder::with_max_frame_bytes(64 * 1024);
    let mut rest = stream;
    let mut cut = cuts.iter().copied().cycle();
    while !rest.is_empty() {
        let take = (usize::from(cut.next().unwrap_or(255)) + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        if decoder.feed(chunk).is_err() {
            return;
        }
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let _ = Request::decode(&frame);
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
    }
});
