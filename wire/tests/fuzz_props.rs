//! Stable-toolchain equivalents of the cargo-fuzz targets `frame_decode` and
//! `batch_validate` (`fuzz/fuzz_targets/`): the same harness bodies driven
//! by proptest, so CI (stable only) runs them on every change. Deeper
//! properties of each layer live in `proto_stream.rs` and `batch_props.rs`.
#![allow(clippy::unwrap_used)]

use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::batch::{BatchBytes, BatchView};
use spool_wire::proto::{
    ClaimRequest, CorrelationId, FrameDecoder, PartitionId, Request, WorkerId,
};

/// The body of fuzz target `frame_decode`: feed `stream` in chunks sized by
/// `cuts`, decode every complete frame. Returns the requests decoded.
fn frame_decode(cuts: &[u8], stream: &[u8]) -> Vec<Request<'static>> {
    let mut decoder = FrameDecoder::with_max_frame_bytes(64 * 1024);
    let mut decoded = Vec::new();
    let mut rest = stream;
    let mut cut = cuts.iter().copied().cycle();
    while !rest.is_empty() {
        let take = (usize::from(cut.next().unwrap_or(255)) + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        if decoder.feed(chunk).is_err() {
            return decoded;
        }
        while let Ok(Some(frame)) = decoder.next_frame() {
            if let Ok(Request::Claim(claim)) = Request::decode(&frame) {
                let queue: &'static str = Box::leak(claim.queue.to_owned().into_boxed_str());
                decoded.push(Request::Claim(ClaimRequest { queue, ..claim }));
            }
        }
    }
    decoded
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    // Goal: the frame_decode harness never panics on arbitrary bytes and
    // arbitrary read sizes. Method: random streams and cut lists.
    #[test]
    fn frame_decode_never_panics(cuts in vec(any::<u8>(), 0..4), stream in vec(any::<u8>(), 0..2048)) {
        frame_decode(&cuts, &stream);
    }

    // Goal: valid claim requests round-trip through the same harness at any
    // read sizes. Method: encode random in-range claims back to back, decode.
    #[test]
    fn valid_claims_round_trip(
        cuts in vec(any::<u8>(), 1..4),
        fields in vec(("[a-z][a-z0-9-]{0,20}", any::<u32>(), any::<u64>(), 1u32..=256, 0u32..60_000), 1..6),
    ) {
        let mut stream = Vec::new();
        let mut sent = Vec::new();
        for (index, (queue, partition, worker, credits, wait_ms)) in fields.iter().enumerate() {
            let claim = ClaimRequest {
                queue: queue.as_str(),
                partition: PartitionId(*partition),
                worker: WorkerId(*worker),
                credits: *credits,
                max_bytes: 1 << 20,
                lease_ms: 30_000,
                wait_ms: *wait_ms,
            };
            if Request::Claim(claim.clone()).encode(CorrelationId(index as u64 + 1), &mut stream).is_ok() {
                sent.push(claim);
            }
        }
        let got = frame_decode(&cuts, &stream);
        prop_assert_eq!(got.len(), sent.len());
        for (got, sent) in got.iter().zip(&sent) {
            let Request::Claim(got) = got else { unreachable!("only claims are kept") };
            prop_assert_eq!(got, sent);
        }
    }

    // Goal: the batch_validate harness never panics and a validated batch
    // yields every record. Method: random bytes, some with a plausible
    // header prefix so validation gets past the magic.
    #[test]
    fn batch_validate_never_panics(mut bytes in vec(any::<u8>(), 0..4096), magic in any::<bool>()) {
        if magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(b"SPB1");
        }
        let mut aligned = BatchBytes::with_capacity(bytes.len());
        aligned.extend_from_slice(&bytes);
        if let Ok(view) = BatchView::validate(&aligned) {
            for index in 0..view.len() {
                let _ = view.record_bytes(index);
            }
        }
    }
}
