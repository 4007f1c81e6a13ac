//! Example-based tests of the batch format through the public API: round
//! trips, the documented layout, subsets, trust levels, and one test per
//! limit that the builder refuses and validation rejects.
// This whole crate is test code; helpers outside #[test] fns may unwrap too.
#![allow(clippy::unwrap_used)]

mod common;

use common::{aligned, archive, build, frame, frame_records, reseal, sample_record};
use spool_wire::batch::{
    validate_record, BatchBytes, BatchHeader, BatchKind, BatchView, ControlBatchBuilder,
    DataBatchBuilder, HeaderField, Payload, PayloadRef, Record, BATCH_FLAG_SUBSET,
};
use spool_wire::limits::{
    BATCH_BYTES_MAX, BATCH_RECORDS_MAX, CONTROL_RECORD_BYTES_MAX, HEADER_BYTES_MAX,
    HEADER_COUNT_MAX, PAYLOAD_INLINE_BYTES_MAX, PAYLOAD_REF_BYTES_MAX,
    PAYLOAD_REF_LOCATION_BYTES_MAX, PRIORITY_BANDS_MAX, RECORD_BYTES_MAX, ROUTING_KEY_BYTES_MAX,
};
use spool_wire::WireError;

fn records(count: u32) -> Vec<Record> {
    (0..count).map(sample_record).collect()
}

#[test]
fn round_trip_keeps_every_field() {
    // Goal: build → validate returns every field as pushed. Method: 12 varied
    // records (inline, reference, 0–3 headers), compare archived and owned.
    let originals = records(12);
    assert!(originals.iter().any(|r| matches!(r.payload, Payload::Reference(_))));
    assert!(originals.iter().any(|r| matches!(r.payload, Payload::Inline(_))));
    let bytes = build(&originals);
    let view = BatchView::validate(&bytes).unwrap();
    assert_eq!(view.header().kind, BatchKind::Data);
    assert_eq!(view.len(), originals.len());
    assert_eq!(view.header().base_offset, 0);
    assert_eq!(view.header().leader_epoch, 0);
    assert_eq!(view.header().first_timestamp_ms, originals[0].enqueue_time_ms);
    let max = originals.iter().map(|r| r.enqueue_time_ms).max().unwrap();
    assert_eq!(view.header().max_timestamp_ms, max);
    for (index, original) in originals.iter().enumerate() {
        let archived = view.record(index);
        assert_eq!(archived, original);
        assert_eq!(archived.message_id.0, original.message_id.0);
        assert_eq!(archived.routing_key.as_slice(), original.routing_key.as_slice());
        assert_eq!(archived.not_before_ms.to_native(), original.not_before_ms);
        assert_eq!(archived.expiry_ms.to_native(), original.expiry_ms);
        let owned: Record = rkyv::deserialize::<Record, rkyv::rancor::Error>(archived).unwrap();
        assert_eq!(&owned, original);
    }
    assert_eq!(view.records().count(), originals.len());
}

#[test]
fn reference_payload_round_trips() {
    // Goal: a reference payload's location, length and digest survive exactly.
    let mut record = sample_record(1);
    record.payload = Payload::Reference(PayloadRef {
        location: "https://objects.example/a/b?c=d".to_string(),
        len_bytes: PAYLOAD_REF_BYTES_MAX,
        digest: core::array::from_fn(|i| i as u8),
    });
    let bytes = build(std::slice::from_ref(&record));
    let view = BatchView::validate(&bytes).unwrap();
    match &view.record(0).payload {
        spool_wire::batch::ArchivedPayload::Reference(reference) => {
            assert_eq!(reference.location.as_str(), "https://objects.example/a/b?c=d");
            assert_eq!(reference.len_bytes.to_native(), PAYLOAD_REF_BYTES_MAX);
            assert_eq!(reference.digest, core::array::from_fn::<u8, 32, _>(|i| i as u8));
        }
        other => panic!("expected a reference, got {other:?}"),
    }
}

#[test]
fn builder_output_is_the_documented_layout() {
    // Goal: the builder writes exactly the layout the docs describe. Method:
    // compare its bytes with an independent hand framer over rkyv::to_bytes.
    let originals = records(9);
    assert_eq!(build(&originals).as_slice(), frame_records(&originals).as_slice());
}

#[test]
fn every_record_starts_eight_aligned_after_the_table() {
    // Goal: positions are 8-aligned, contiguous after padding, start after the table.
    let bytes = build(&records(7));
    let view = BatchView::validate(&bytes).unwrap();
    let base = bytes.as_ptr().addr();
    let mut expected = 64 + 8 * 7;
    for slice in view.record_slices() {
        let position = slice.as_ptr().addr() - base;
        assert_eq!(position % 8, 0);
        assert_eq!(position, expected);
        expected = (position + slice.len()).div_ceil(8) * 8;
    }
    assert_eq!(expected, bytes.len());
}

#[test]
fn control_batch_round_trips_opaque_events() {
    // Goal: control events come back byte-exact, kind Control, timestamps first/max.
    let events: Vec<Vec<u8>> = (0..20u8).map(|n| vec![n; 1 + n as usize * 5]).collect();
    let mut builder = ControlBatchBuilder::new();
    for (n, event) in events.iter().enumerate() {
        builder.push(100 + (n as u64 * 13) % 7, event).unwrap();
    }
    let bytes = builder.finish().unwrap();
    let view = BatchView::validate(&bytes).unwrap();
    assert_eq!(view.header().kind, BatchKind::Control);
    assert_eq!(view.header().first_timestamp_ms, 100);
    assert_eq!(view.header().max_timestamp_ms, 106);
    for (index, event) in events.iter().enumerate() {
        assert_eq!(view.control_record(index), event.as_slice());
    }
}

#[test]
fn trusted_reads_what_validate_accepted_after_assign() {
    // Goal: after the broker stamps offsets, trusted() sees the same records.
    let originals = records(5);
    let mut bytes = build(&originals);
    BatchView::validate(&bytes).unwrap();
    BatchHeader::assign(&mut bytes, 4242, 7);
    // SAFETY: validated just above; only assign() changed the header since.
    let view = unsafe { BatchView::trusted(&bytes) }.unwrap();
    assert_eq!(view.header().base_offset, 4242);
    assert_eq!(view.header().next_offset(), 4247);
    for (index, original) in originals.iter().enumerate() {
        assert_eq!(view.record(index), original);
    }
    // Validation also accepts the stamped batch (a consumer's view).
    assert_eq!(BatchView::validate(&bytes).unwrap().header().leader_epoch, 7);
}

#[test]
fn trusted_still_rejects_damage() {
    // Goal: trusted() is not a blind cast: a flipped body bit fails its crc.
    let mut bytes = build(&records(3));
    let last = bytes.len() - 9;
    bytes[last] ^= 0x04;
    // SAFETY: the call must reject these bytes before any record is accessed.
    let result = unsafe { BatchView::trusted(&bytes) };
    assert!(matches!(result, Err(WireError::BodyCrcMismatch { .. })));
}

#[test]
fn trusted_verified_skips_the_crc_but_not_the_header_match() {
    // Goal: trusted_verified() views bytes under the header verify() gave for
    // them, and refuses a header that is not theirs. Method: verify, view,
    // compare records; then pass another batch's verified header.
    let originals = records(4);
    let mut bytes = build(&originals);
    BatchHeader::assign(&mut bytes, 100, 3);
    let header = BatchHeader::verify(&bytes).unwrap();
    // SAFETY: `header` is verify()'s result on these unchanged, validated bytes.
    let view = unsafe { BatchView::trusted_verified(&bytes, &header) }.unwrap();
    assert_eq!(view.header().base_offset, 100);
    for (index, original) in originals.iter().enumerate() {
        assert_eq!(view.record(index), original);
    }
    let mut other = build(&records(4));
    BatchHeader::assign(&mut other, 200, 3);
    let other_header = BatchHeader::verify(&other).unwrap();
    // SAFETY: the call must refuse before any record is accessed.
    let result = unsafe { BatchView::trusted_verified(&bytes, &other_header) };
    assert!(matches!(result, Err(WireError::HeaderMismatch)));
}

#[test]
fn misaligned_buffers_are_rejected() {
    // Goal: a batch at an odd address is refused, not read misaligned.
    let bytes = build(&records(2));
    let mut shifted = BatchBytes::new();
    shifted.push(0);
    shifted.extend_from_slice(&bytes);
    assert!(matches!(
        BatchView::validate(&shifted[1..]),
        Err(WireError::Misaligned { align: 8, misalignment: 1 })
    ));
    let mut record = BatchBytes::new();
    record.push(0);
    record.extend_from_slice(&archive(&sample_record(1)));
    assert!(matches!(validate_record(&record[1..]), Err(WireError::Misaligned { .. })));
}

#[test]
fn trailing_bytes_after_the_batch_are_ignored() {
    // Goal: a view covers exactly batch_len, so a reader can walk a log.
    let first = build(&records(2));
    let mut log = aligned(&first);
    log.extend_from_slice(&build(&records(3)));
    let view = BatchView::validate(&log).unwrap();
    assert_eq!(view.as_bytes().len(), first.len());
    let next = BatchView::validate(&log[first.len()..]).unwrap();
    assert_eq!(next.len(), 3);
}

#[test]
fn every_truncation_is_rejected() {
    // Goal: no prefix of a valid batch validates. Method: all lengths.
    let bytes = build(&records(6));
    for len in 0..bytes.len() {
        assert!(BatchView::validate(&bytes[..len]).is_err(), "prefix {len} validated");
    }
}

#[test]
fn every_single_bit_flip_is_rejected() {
    // Goal: crc32c catches every one-bit error anywhere in the batch.
    // Method: flip each bit of a small batch in turn.
    let original = build(&records(3));
    let mut bytes = original.clone();
    for position in 0..bytes.len() {
        for bit in 0..8 {
            bytes[position] ^= 1 << bit;
            assert!(BatchView::validate(&bytes).is_err(), "flip {position}:{bit} validated");
            bytes[position] ^= 1 << bit;
        }
    }
    assert_eq!(bytes.as_slice(), original.as_slice());
}

#[test]
fn subset_slices_are_exactly_the_chosen_records() {
    // Goal: a claim of 10 of 100 records gets those records' bytes, each
    // independently valid and equal to the original record.
    let originals = records(100);
    let bytes = build(&originals);
    let view = BatchView::validate(&bytes).unwrap();
    let chosen = [3u32, 4, 17, 50, 51, 52, 60, 77, 98, 99];
    let mut slices = Vec::new();
    view.subset_slices(&chosen, &mut slices).unwrap();
    assert_eq!(slices.len(), chosen.len());
    for (slice, &index) in slices.iter().zip(&chosen) {
        // Slices borrow the batch: no copy was made.
        assert!(std::ptr::eq(*slice, view.record_bytes(index as usize)));
        assert_eq!(slice.as_ptr().addr() % 8, 0);
        let record = validate_record(slice).unwrap();
        assert_eq!(record, &originals[index as usize]);
    }
    let mut out = Vec::new();
    assert_eq!(
        view.subset_slices(&[1, 100], &mut out),
        Err(WireError::IndexOutOfRange { index: 100, len: 100 })
    );
    assert!(out.is_empty(), "nothing appended on error");
}

#[test]
fn reframed_subset_is_a_valid_flagged_batch_of_the_chosen_records() {
    // Goal: reframe copies exactly the chosen records into a valid batch with
    // the subset flag and timestamps taken from those records.
    let originals = records(40);
    let bytes = build(&originals);
    let view = BatchView::validate(&bytes).unwrap();
    let chosen = [0u32, 5, 6, 39];
    let subset = view.reframe(&chosen).unwrap();
    let sub = BatchView::validate(&subset).unwrap();
    assert_eq!(sub.header().flags, BATCH_FLAG_SUBSET);
    assert_eq!(sub.len(), chosen.len());
    let picked: Vec<&Record> = chosen.iter().map(|&i| &originals[i as usize]).collect();
    for (index, original) in picked.iter().enumerate() {
        assert_eq!(sub.record(index), *original);
        assert_eq!(sub.record_bytes(index), view.record_bytes(chosen[index] as usize));
    }
    assert_eq!(sub.header().first_timestamp_ms, picked[0].enqueue_time_ms);
    let max = picked.iter().map(|r| r.enqueue_time_ms).max().unwrap();
    assert_eq!(sub.header().max_timestamp_ms, max);
    assert_eq!(view.reframe(&[]).unwrap_err(), WireError::BadSubset);
    assert_eq!(view.reframe(&[5, 5]).unwrap_err(), WireError::BadSubset);
    assert_eq!(view.reframe(&[6, 5]).unwrap_err(), WireError::BadSubset);
    assert_eq!(
        view.reframe(&[1, 40]).unwrap_err(),
        WireError::IndexOutOfRange { index: 40, len: 40 }
    );
    let mut control = ControlBatchBuilder::new();
    control.push(1, &[1; 8]).unwrap();
    let control = control.finish().unwrap();
    let control_view = BatchView::validate(&control).unwrap();
    assert!(matches!(control_view.reframe(&[0]), Err(WireError::WrongKind { .. })));
}

#[test]
fn fillers_validate_as_empty_batches() {
    // Goal: a filler written by the log validates, holds nothing, and a
    // filler with a record count or dirty body is rejected.
    let mut page = BatchBytes::new();
    page.resize(4096, 0xAA);
    spool_wire::batch::write_filler(&mut page, 4096, 10, 2, 0);
    let view = BatchView::validate(&page).unwrap();
    assert!(view.is_empty());
    assert_eq!(view.header().kind, BatchKind::Filler);
    page[1000] = 1;
    reseal(&mut page);
    assert_eq!(BatchView::validate(&page).unwrap_err(), WireError::BadFiller);
}

// ---- structure: one test per structural check, crcs resealed ----

fn valid_three() -> BatchBytes {
    build(&records(3))
}

fn set_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn structure_bad_positions_are_rejected() {
    // Goal: positions that overlap, leave gaps, go backwards or are misaligned
    // are rejected even with correct crcs.
    let entry1 = 64 + 8;
    for delta in [-8i64, 8, 1, -1] {
        let mut bytes = valid_three();
        let position = get_u32(&bytes, entry1);
        set_u32(&mut bytes, entry1, (i64::from(position) + delta) as u32);
        reseal(&mut bytes);
        assert!(
            matches!(
                BatchView::validate(&bytes),
                Err(WireError::BadRecordPosition { index: 1, .. })
            ),
            "delta {delta}"
        );
    }
}

#[test]
fn structure_bad_lengths_are_rejected() {
    // Goal: zero, oversized and out-of-bounds record lengths are rejected.
    let entry2_len = 64 + 2 * 8 + 4;
    let mut zero = valid_three();
    set_u32(&mut zero, entry2_len, 0);
    reseal(&mut zero);
    assert!(matches!(BatchView::validate(&zero), Err(WireError::BadRecordLength { index: 2, .. })));
    let mut past_end = valid_three();
    let len = get_u32(&past_end, entry2_len);
    set_u32(&mut past_end, entry2_len, len + 64);
    reseal(&mut past_end);
    assert!(matches!(
        BatchView::validate(&past_end),
        Err(WireError::RecordOutOfBounds { index: 2, .. })
    ));
    // An archive over RECORD_BYTES_MAX is refused by the table check.
    let mut big = sample_record(0);
    big.payload = Payload::Inline(vec![1; RECORD_BYTES_MAX]);
    let big = frame_records(&[big]);
    assert!(matches!(BatchView::validate(&big), Err(WireError::BadRecordLength { index: 0, .. })));
}

#[test]
fn structure_nonzero_padding_and_slack_are_rejected() {
    // Goal: only the canonical encoding validates: padding is zero and the
    // batch ends right after the last record.
    // Data archives are whole multiples of 8 (the root is 8-aligned), so
    // padding shows up after odd-sized control events.
    let mut bytes = frame(BatchKind::Control, &[&[1, 2, 3]], 0, 0);
    let end = get_u32(&bytes, 64) as usize + 3;
    bytes[end] = 0xFF;
    reseal(&mut bytes);
    assert_eq!(
        BatchView::validate(&bytes).unwrap_err(),
        WireError::NonZeroPadding { position: end }
    );

    let originals = records(2);
    let mut slack = aligned(&build(&originals));
    let new_len = slack.len() + 8;
    slack.resize(new_len, 0);
    set_u32(&mut slack, 8, new_len as u32);
    reseal(&mut slack);
    assert!(matches!(BatchView::validate(&slack), Err(WireError::BatchLengthMismatch { .. })));
}

#[test]
fn header_reserved_flags_and_count_are_checked() {
    // Goal: reserved bytes, unknown flags, subset flag on control, a zero or
    // oversized record count and lying timestamps are each rejected.
    let mut reserved = valid_three();
    reserved[60] = 1;
    reseal(&mut reserved);
    assert_eq!(BatchView::validate(&reserved).unwrap_err(), WireError::ReservedNotZero);

    let mut flags = valid_three();
    set_u32(&mut flags, 36, 0x80);
    reseal(&mut flags);
    assert_eq!(BatchView::validate(&flags).unwrap_err(), WireError::UnknownFlags(0x80));

    let mut control = frame(BatchKind::Control, &[&[1; 8]], 0, 0);
    set_u32(&mut control, 36, BATCH_FLAG_SUBSET);
    reseal(&mut control);
    assert!(matches!(BatchView::validate(&control), Err(WireError::FlagsNotAllowed { .. })));

    let empty = frame(BatchKind::Data, &[], 0, 0);
    assert_eq!(BatchView::validate(&empty).unwrap_err(), WireError::EmptyBatch("data"));

    let mut count = valid_three();
    set_u32(&mut count, 32, 4);
    reseal(&mut count);
    assert!(BatchView::validate(&count).is_err());

    let mut timestamps = valid_three();
    timestamps[48] ^= 1;
    reseal(&mut timestamps);
    assert!(matches!(BatchView::validate(&timestamps), Err(WireError::TimestampMismatch { .. })));
}

#[test]
fn garbage_record_archive_is_rejected_by_checked_access() {
    // Goal: record bytes that are not a valid archive fail checked access
    // (here: a relative pointer aimed far outside the record).
    let archive = archive(&sample_record(4));
    let mut bad = archive.to_vec();
    let root = bad.len() - core::mem::size_of::<spool_wire::batch::ArchivedRecord>();
    // routing_key is the first variable field after the 16-byte id: aim its
    // relative offset far outside the record.
    bad[root + 16..root + 20].copy_from_slice(&(-100_000i32).to_le_bytes());
    let batch = frame(BatchKind::Data, &[&bad], 1_000 + 28 % 11, 1_000 + 28 % 11);
    assert!(matches!(BatchView::validate(&batch), Err(WireError::InvalidRecord { index: 0, .. })));
}

// ---- limits: the builder refuses, validation rejects ----

/// Pushes `record` into a fresh builder (expecting `error`) and validates a
/// hand-framed batch holding it (expecting the same error).
fn assert_refused_both_ways(record: Record, error: WireError) {
    let mut builder = DataBatchBuilder::new();
    assert_eq!(builder.push(&record), Err(error.clone()), "builder");
    assert!(builder.is_empty(), "builder unchanged after a refusal");
    let batch = frame_records(&[record]);
    assert_eq!(BatchView::validate(&batch).map(|_| ()), Err(error.clone()), "validate");
    assert_eq!(validate_record(&archive_of(&batch)).map(|_| ()), Err(error), "validate_record");
}

fn archive_of(batch: &[u8]) -> BatchBytes {
    let position = get_u32(batch, 64) as usize;
    let len = get_u32(batch, 68) as usize;
    aligned(&batch[position..position + len])
}

#[test]
fn limit_routing_key() {
    // Goal: ROUTING_KEY_BYTES_MAX holds in builder and validation; the max is fine.
    let mut at_limit = sample_record(1);
    at_limit.routing_key = vec![b'k'; ROUTING_KEY_BYTES_MAX];
    assert!(DataBatchBuilder::new().push(&at_limit).is_ok());
    let over = Record { routing_key: vec![b'k'; ROUTING_KEY_BYTES_MAX + 1], ..at_limit };
    let error = WireError::RoutingKeyTooLong { len_bytes: ROUTING_KEY_BYTES_MAX + 1 };
    assert_refused_both_ways(over, error);
}

#[test]
fn limit_header_count() {
    // Goal: HEADER_COUNT_MAX holds in builder and validation.
    let field = HeaderField { key: vec![1], value: vec![2] };
    let mut at_limit = sample_record(1);
    at_limit.headers = vec![field.clone(); HEADER_COUNT_MAX];
    assert!(DataBatchBuilder::new().push(&at_limit).is_ok());
    let over = Record { headers: vec![field; HEADER_COUNT_MAX + 1], ..at_limit };
    assert_refused_both_ways(over, WireError::TooManyHeaders { count: HEADER_COUNT_MAX + 1 });
}

#[test]
fn limit_header_bytes() {
    // Goal: HEADER_BYTES_MAX (keys plus values) holds in builder and validation.
    let half = HEADER_BYTES_MAX / 2;
    let mut at_limit = sample_record(1);
    at_limit.headers = vec![HeaderField { key: vec![1; half], value: vec![2; half] }];
    assert!(DataBatchBuilder::new().push(&at_limit).is_ok());
    let over = Record {
        headers: vec![HeaderField { key: vec![1; half], value: vec![2; half + 1] }],
        ..at_limit
    };
    assert_refused_both_ways(over, WireError::HeadersTooLarge { len_bytes: HEADER_BYTES_MAX + 1 });
}

#[test]
fn limit_priority() {
    // Goal: priorities at or above PRIORITY_BANDS_MAX are refused.
    let at_limit = Record { priority: PRIORITY_BANDS_MAX - 1, ..sample_record(1) };
    assert!(DataBatchBuilder::new().push(&at_limit).is_ok());
    let over = Record { priority: PRIORITY_BANDS_MAX, ..at_limit };
    assert_refused_both_ways(over, WireError::PriorityOutOfRange(PRIORITY_BANDS_MAX));
}

#[test]
fn limit_inline_payload() {
    // Goal: PAYLOAD_INLINE_BYTES_MAX holds, and a record with every field at
    // its limit still fits RECORD_BYTES_MAX (the envelope bound is real).
    let at_limit = Record {
        routing_key: vec![b'k'; ROUTING_KEY_BYTES_MAX],
        headers: (0..HEADER_COUNT_MAX)
            .map(|_| HeaderField { key: vec![1; 1], value: vec![2; 255] })
            .collect(),
        payload: Payload::Inline(vec![3; PAYLOAD_INLINE_BYTES_MAX]),
        ..sample_record(1)
    };
    assert!(archive(&at_limit).len() <= RECORD_BYTES_MAX);
    let mut builder = DataBatchBuilder::new();
    builder.push(&at_limit).unwrap();
    assert!(BatchView::validate(&builder.finish().unwrap()).is_ok());
    let over = Record {
        headers: Vec::new(),
        payload: Payload::Inline(vec![3; PAYLOAD_INLINE_BYTES_MAX + 1]),
        ..at_limit
    };
    let error = WireError::InlinePayloadTooLarge { len_bytes: PAYLOAD_INLINE_BYTES_MAX + 1 };
    assert_refused_both_ways(over, error);
}

fn with_reference(location: String, len_bytes: u64) -> Record {
    Record {
        payload: Payload::Reference(PayloadRef { location, len_bytes, digest: [9; 32] }),
        ..sample_record(1)
    }
}

#[test]
fn limit_payload_location() {
    // Goal: locations must be 1..=PAYLOAD_REF_LOCATION_BYTES_MAX bytes.
    let at_limit = with_reference("x".repeat(PAYLOAD_REF_LOCATION_BYTES_MAX), 1);
    assert!(DataBatchBuilder::new().push(&at_limit).is_ok());
    let over = with_reference("x".repeat(PAYLOAD_REF_LOCATION_BYTES_MAX + 1), 1);
    let len_bytes = PAYLOAD_REF_LOCATION_BYTES_MAX + 1;
    assert_refused_both_ways(over, WireError::BadPayloadLocation { len_bytes });
    assert_refused_both_ways(
        with_reference(String::new(), 1),
        WireError::BadPayloadLocation { len_bytes: 0 },
    );
}

#[test]
fn limit_referenced_payload_size() {
    // Goal: a reference may not claim more than PAYLOAD_REF_BYTES_MAX bytes.
    assert!(DataBatchBuilder::new()
        .push(&with_reference("s3://a".into(), PAYLOAD_REF_BYTES_MAX))
        .is_ok());
    let len_bytes = PAYLOAD_REF_BYTES_MAX + 1;
    assert_refused_both_ways(
        with_reference("s3://a".into(), len_bytes),
        WireError::ReferencedPayloadTooLarge { len_bytes },
    );
}

#[test]
fn limit_batch_records() {
    // Goal: BATCH_RECORDS_MAX holds: the builder refuses one more and stays
    // usable; validation rejects a batch that claims one more.
    let mut builder = ControlBatchBuilder::new();
    for n in 0..BATCH_RECORDS_MAX {
        builder.push(u64::from(n), &n.to_le_bytes()).unwrap();
    }
    let full = builder.push(0, &[1; 4]);
    assert_eq!(full, Err(WireError::BatchRecordsFull { count: BATCH_RECORDS_MAX }));
    let bytes = builder.finish().unwrap();
    assert_eq!(BatchView::validate(&bytes).unwrap().len(), BATCH_RECORDS_MAX as usize);

    let mut data = DataBatchBuilder::new();
    let tiny =
        Record { headers: Vec::new(), payload: Payload::Inline(Vec::new()), ..sample_record(0) };
    for _ in 0..BATCH_RECORDS_MAX {
        data.push(&tiny).unwrap();
    }
    assert_eq!(data.push(&tiny), Err(WireError::BatchRecordsFull { count: BATCH_RECORDS_MAX }));

    let event = [7u8; 8];
    let events = vec![&event[..]; BATCH_RECORDS_MAX as usize + 1];
    let over = frame(BatchKind::Control, &events, 0, 0);
    assert_eq!(
        BatchView::validate(&over).unwrap_err(),
        WireError::TooManyRecords { count: BATCH_RECORDS_MAX + 1, max: BATCH_RECORDS_MAX }
    );
}

#[test]
fn limit_batch_bytes() {
    // Goal: BATCH_BYTES_MAX holds: the builder refuses the record that would
    // cross it (and keeps the others); validation rejects a longer batch.
    let big = Record {
        headers: Vec::new(),
        payload: Payload::Inline(vec![5; PAYLOAD_INLINE_BYTES_MAX]),
        ..sample_record(0)
    };
    let mut builder = DataBatchBuilder::new();
    let mut pushed = 0;
    let error = loop {
        match builder.push(&big) {
            Ok(()) => pushed += 1,
            Err(error) => break error,
        }
    };
    assert!(
        matches!(error, WireError::BatchBytesFull { needed_bytes } if needed_bytes > BATCH_BYTES_MAX)
    );
    assert_eq!(builder.len(), pushed);
    let bytes = builder.finish().unwrap();
    assert!(bytes.len() <= BATCH_BYTES_MAX);
    assert_eq!(BatchView::validate(&bytes).unwrap().len(), pushed);

    let mut over = aligned(&bytes);
    set_u32(&mut over, 8, (BATCH_BYTES_MAX + 8) as u32);
    assert_eq!(
        BatchView::validate(&over).unwrap_err(),
        WireError::BadBatchLength((BATCH_BYTES_MAX + 8) as u32)
    );
}

#[test]
fn limit_control_record_length() {
    // Goal: control events must be 1..=CONTROL_RECORD_BYTES_MAX bytes.
    let mut builder = ControlBatchBuilder::new();
    builder.push(0, &vec![1; CONTROL_RECORD_BYTES_MAX]).unwrap();
    assert_eq!(builder.push(0, &[]), Err(WireError::BadControlRecordLength { len_bytes: 0 }));
    let over = vec![1; CONTROL_RECORD_BYTES_MAX + 1];
    assert_eq!(
        builder.push(0, &over),
        Err(WireError::BadControlRecordLength { len_bytes: CONTROL_RECORD_BYTES_MAX + 1 })
    );
    assert_eq!(builder.len(), 1);
    let batch = frame(BatchKind::Control, &[&over], 0, 0);
    assert!(matches!(
        BatchView::validate(&batch),
        Err(WireError::BadRecordLength { index: 0, .. })
    ));
}

#[test]
fn limit_empty_batch() {
    // Goal: an empty batch is neither built nor accepted.
    assert_eq!(DataBatchBuilder::new().finish().unwrap_err(), WireError::EmptyBatch("data"));
    assert_eq!(ControlBatchBuilder::new().finish().unwrap_err(), WireError::EmptyBatch("control"));
    let empty = frame(BatchKind::Control, &[], 0, 0);
    assert_eq!(BatchView::validate(&empty).unwrap_err(), WireError::EmptyBatch("control"));
}

#[test]
fn builder_clear_reuses_and_restarts() {
    // Goal: clear() starts a fresh batch: old records are gone, timestamps reset.
    let mut builder = DataBatchBuilder::with_capacity(1 << 16);
    builder.push(&sample_record(1)).unwrap();
    builder.clear();
    assert!(builder.is_empty());
    builder.push(&sample_record(2)).unwrap();
    let bytes = builder.finish().unwrap();
    assert_eq!(builder.encoded_len_bytes(), bytes.len());
    let view = BatchView::validate(&bytes).unwrap();
    assert_eq!(view.len(), 1);
    assert_eq!(view.record(0), &sample_record(2));
    assert_eq!(view.header().first_timestamp_ms, sample_record(2).enqueue_time_ms);
}
