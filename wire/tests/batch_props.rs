//! Property tests of batch validation: it never panics, it accepts exactly
//! what the builder made, and no damage to a valid batch slips through.

// This whole crate is test code; helpers outside #[test] fns may unwrap too.
#![allow(clippy::unwrap_used)]

mod common;

use common::{aligned, build, reseal};
use proptest::collection::vec;
use proptest::prelude::*;
use spool_wire::batch::{
    validate_record, BatchKind, BatchView, ControlBatchBuilder, HeaderField, MessageId, Payload,
    PayloadRef, Record, BATCH_MAGIC,
};

fn arb_payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        vec(any::<u8>(), 0..600).prop_map(Payload::Inline),
        ("[a-z0-9:/._-]{1,60}", any::<u64>(), any::<[u8; 32]>()).prop_map(
            |(location, len_bytes, digest)| {
                Payload::Reference(PayloadRef { location, len_bytes: len_bytes >> 24, digest })
            }
        ),
    ]
}

fn arb_record() -> impl Strategy<Value = Record> {
    (
        any::<[u8; 16]>(),
        vec(any::<u8>(), 0..64),
        vec((vec(any::<u8>(), 0..16), vec(any::<u8>(), 0..32)), 0..5),
        arb_payload(),
        0u8..8,
        any::<[u64; 3]>(),
    )
        .prop_map(|(id, routing_key, headers, payload, priority, times)| Record {
            message_id: MessageId(id),
            routing_key,
            headers: headers.into_iter().map(|(key, value)| HeaderField { key, value }).collect(),
            payload,
            priority,
            not_before_ms: times[0],
            expiry_ms: times[1],
            enqueue_time_ms: times[2],
        })
}

fn arb_records() -> impl Strategy<Value = Vec<Record>> {
    vec(arb_record(), 1..12)
}

/// Walks everything a view exposes, so a view that validated but lies about
/// its layout would panic here.
fn touch_everything(view: &BatchView<'_>) {
    for (index, slice) in view.record_slices().enumerate() {
        assert_eq!(slice.as_ptr().addr() % 8, 0);
        match view.header().kind {
            BatchKind::Data => {
                let record = view.record(index);
                let again = validate_record(slice).expect("a record of a valid batch is valid");
                assert!(std::ptr::eq(record, again));
                let _ = (record.routing_key.len(), record.headers.len(), &record.payload);
            }
            BatchKind::Control => assert_eq!(view.control_record(index), slice),
            BatchKind::Filler => unreachable!("fillers have no records"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..2048)) {
        // Goal: validate() returns rather than panics on any input, even one
        // that passes the magic check. Method: random bytes, raw and with a
        // plausible header and resealed crcs.
        let raw = aligned(&bytes);
        let _ = BatchView::validate(&raw);
        let mut shaped = raw.clone();
        shaped.resize(shaped.len().max(64), 0);
        shaped[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        shaped[4..6].copy_from_slice(&1u16.to_le_bytes());
        shaped[6] %= 3;
        shaped[7] = 0;
        let len = shaped.len() / 8 * 8;
        shaped[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        reseal(&mut shaped);
        if let Ok(view) = BatchView::validate(&shaped) {
            touch_everything(&view);
        }
        let _ = validate_record(&raw);
    }

    #[test]
    fn built_batches_round_trip(records in arb_records()) {
        // Goal: any records within limits build, validate, and read back equal.
        let bytes = build(&records);
        let view = BatchView::validate(&bytes).unwrap();
        prop_assert_eq!(view.len(), records.len());
        for (index, record) in records.iter().enumerate() {
            prop_assert_eq!(view.record(index), record);
        }
        touch_everything(&view);
    }

    #[test]
    fn any_byte_mutation_is_rejected(
        records in arb_records(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        // Goal: changing any one byte of a valid batch (any value) fails
        // validation: crc32c detects every error burst of up to 32 bits.
        let mut bytes = build(&records);
        let position = at.index(bytes.len());
        bytes[position] ^= xor;
        prop_assert!(BatchView::validate(&bytes).is_err(), "mutation at {} validated", position);
    }

    #[test]
    fn resealed_mutation_never_panics_or_lies(
        records in arb_records(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        // Goal: with crcs recomputed (a crafted batch), structural and rkyv
        // checks still hold the line: no panic, and whatever validates is
        // internally consistent; a change outside the records' content never
        // yields a batch with different records.
        let original = build(&records);
        let mut bytes = original.clone();
        for (at, value) in &edits {
            let position = at.index(bytes.len());
            bytes[position] = *value;
        }
        reseal(&mut bytes);
        if let Ok(view) = BatchView::validate(&bytes) {
            touch_everything(&view);
            // Records occupy the same places, so each either kept its bytes
            // or is a different, but valid, archive at the same position.
            let original_view = BatchView::validate(&original).unwrap();
            prop_assert_eq!(view.len(), original_view.len());
            for index in 0..view.len() {
                prop_assert_eq!(
                    view.record_bytes(index).len(),
                    original_view.record_bytes(index).len()
                );
            }
        }
    }

    #[test]
    fn truncation_at_any_length_is_rejected(records in arb_records(), cut in any::<prop::sample::Index>()) {
        // Goal: a batch cut short anywhere is rejected (a torn tail).
        let bytes = build(&records);
        let len = cut.index(bytes.len());
        prop_assert!(BatchView::validate(&bytes[..len]).is_err());
    }

    #[test]
    fn subsets_select_exactly_the_chosen_records(
        records in vec(arb_record(), 1..40),
        picks in vec(any::<prop::sample::Index>(), 1..10),
    ) {
        // Goal: slices and reframed subsets carry exactly the chosen records.
        let bytes = build(&records);
        let view = BatchView::validate(&bytes).unwrap();
        let mut indices: Vec<u32> = picks.iter().map(|p| p.index(records.len()) as u32).collect();
        indices.sort_unstable();
        indices.dedup();
        let mut slices = Vec::new();
        view.subset_slices(&indices, &mut slices).unwrap();
        let subset = view.reframe(&indices).unwrap();
        let sub = BatchView::validate(&subset).unwrap();
        prop_assert_eq!(sub.len(), indices.len());
        for (position, &index) in indices.iter().enumerate() {
            let expected = &records[index as usize];
            prop_assert_eq!(validate_record(slices[position]).unwrap(), expected);
            prop_assert_eq!(sub.record(position), expected);
        }
    }

    #[test]
    fn control_batches_round_trip(events in vec(vec(any::<u8>(), 1..100), 1..30)) {
        // Goal: arbitrary control events round trip byte-exact.
        let mut builder = ControlBatchBuilder::new();
        for (n, event) in events.iter().enumerate() {
            builder.push(n as u64, event).unwrap();
        }
        let bytes = builder.finish().unwrap();
        let view = BatchView::validate(&bytes).unwrap();
        for (index, event) in events.iter().enumerate() {
            prop_assert_eq!(view.control_record(index), event.as_slice());
        }
        let mut damaged = bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        prop_assert!(BatchView::validate(&damaged).is_err());
    }
}
