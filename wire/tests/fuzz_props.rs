//! Stable-toolchain equivalents of the cargo-fuzz targets `frame_decode` and
//! `batch_validate` (`fuzz/fuzz_targets/`): the same harness bodies driven
//! by proptest, so CI (stable only) runs them on every change. Deeper
//! properties of each layer live in `proto_stream.rs` and `batch_props.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{build, reseal, sample_record};
use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::batch::{validate_record, BatchBytes, BatchKind, BatchView};
use spool_wire::limits::BATCH_HEADER_BYTES;
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
                let subscription: &'static str =
                    Box::leak(claim.subscription.to_owned().into_boxed_str());
                decoded.push(Request::Claim(ClaimRequest { queue, subscription, ..claim }));
            }
        }
    }
    decoded
}

/// The body of fuzz target `batch_validate`: validate (with both crcs
/// recomputed first when `fix_crcs`, so the checks behind them are reached),
/// then read every record back: 8-aligned, each data record valid alone, and
/// the batch re-framed from all its records valid again with the same record
/// bytes. Returns the number of records of a batch that validated.
fn batch_validate(bytes: &[u8], fix_crcs: bool) -> Option<usize> {
    // Frames arrive 8-aligned; so do these bytes.
    let mut aligned = BatchBytes::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    if fix_crcs && aligned.len() >= BATCH_HEADER_BYTES {
        reseal(&mut aligned);
    }
    let view = BatchView::validate(&aligned).ok()?;
    for index in 0..view.len() {
        assert_eq!(view.record_bytes(index).as_ptr().addr() % 8, 0, "record {index} unaligned");
    }
    if view.header().kind == BatchKind::Data {
        for index in 0..view.len() {
            validate_record(view.record_bytes(index)).expect("a record of a valid batch validates");
        }
        let all: Vec<u32> = (0..view.len() as u32).collect();
        let reframed = view.reframe(&all).expect("a valid data batch re-frames");
        let again = BatchView::validate(&reframed).expect("a re-framed batch validates");
        assert_eq!(again.len(), view.len());
        for index in 0..view.len() {
            assert_eq!(again.record_bytes(index), view.record_bytes(index));
        }
    }
    Some(view.len())
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
                subscription: "",
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

    // Goal: the batch_validate harness never panics on arbitrary bytes,
    // with or without the crcs recomputed. Method: random bytes, some with
    // the batch magic so validation gets past it.
    #[test]
    fn batch_validate_never_panics(
        mut bytes in vec(any::<u8>(), 0..4096),
        magic in any::<bool>(),
        fix_crcs in any::<bool>(),
    ) {
        if magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(b"SPB1");
        }
        let _ = batch_validate(&bytes, fix_crcs);
    }

    // Goal: the harness's checks on records run on batches that validate,
    // not only on noise that never does: a built batch validates with all
    // its records, and one with bytes overwritten (crcs recomputed) is
    // either refused or still has all its records. Method: batches of
    // sample records, read back unchanged, then with up to three edits.
    #[test]
    fn batch_validate_reads_back_built_batches(
        count in 1u32..12,
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let records: Vec<_> = (0..count).map(sample_record).collect();
        let mut bytes = build(&records).to_vec();
        prop_assert_eq!(batch_validate(&bytes, false), Some(records.len()));
        for (at, value) in &edits {
            let position = at.index(bytes.len());
            bytes[position] = *value;
        }
        if let Some(read) = batch_validate(&bytes, true) {
            prop_assert_eq!(read, records.len());
        }
    }
}
