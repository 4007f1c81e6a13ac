//! Micro benchmarks of the batch hot paths: building (producer), validating
//! (broker on arrival), trusted access (broker reading its own log), subset
//! reframing (serving a claim) and the crc32c that guards all of them.
//! Run with `cargo bench -p spool-wire`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use spool_wire::batch::{BatchView, DataBatchBuilder, HeaderField, MessageId, Payload, Record};

const RECORDS: usize = 100;
const PAYLOAD_BYTES: usize = 1024;

fn records() -> Vec<Record> {
    (0..RECORDS)
        .map(|n| Record {
            message_id: MessageId([n as u8; 16]),
            routing_key: format!("tenant-{}", n % 7).into_bytes(),
            headers: vec![HeaderField { key: b"trace-id".to_vec(), value: vec![n as u8; 16] }],
            payload: Payload::Inline(vec![n as u8; PAYLOAD_BYTES]),
            priority: (n % 4) as u8,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: 1_700_000_000_000 + n as u64,
        })
        .collect()
}

fn build(records: &[Record], builder: &mut DataBatchBuilder) -> spool_wire::batch::BatchBytes {
    builder.clear();
    for record in records {
        builder.push(record).expect("bench records are within limits");
    }
    builder.finish().expect("non-empty")
}

fn batch_benches(c: &mut Criterion) {
    let records = records();
    let mut builder = DataBatchBuilder::with_capacity(256 * 1024);
    let bytes = build(&records, &mut builder);
    // The trusted bench below relies on this: these bytes passed validation.
    BatchView::validate(&bytes).expect("the bench batch is valid");

    let mut group = c.benchmark_group("batch_100x1KiB");
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.bench_function("build", |b| b.iter(|| black_box(build(&records, &mut builder))));
    group.bench_function("validate", |b| {
        b.iter(|| {
            let view = BatchView::validate(black_box(&bytes)).expect("valid");
            black_box(view.len())
        })
    });
    group.bench_function("trusted_read_all", |b| {
        b.iter(|| {
            // SAFETY: `bytes` passed `validate` right after it was built and
            // has not changed since.
            let view = unsafe { BatchView::trusted(black_box(&bytes)) }.expect("valid");
            view.records().map(|record| record.enqueue_time_ms.to_native()).sum::<u64>()
        })
    });
    group.bench_function("reframe_10_of_100", |b| {
        let view = BatchView::validate(&bytes).expect("valid");
        let indices: Vec<u32> = (0..10).map(|n| n * 10 + 3).collect();
        b.iter(|| black_box(view.reframe(black_box(&indices)).expect("in range")))
    });
    group.finish();

    let mib = vec![0xA5u8; 1 << 20];
    let mut group = c.benchmark_group("crc32c");
    group.throughput(Throughput::Bytes(mib.len() as u64));
    group.bench_function("1MiB", |b| b.iter(|| crc32c::crc32c(black_box(&mib))));
    group.finish();

    // One record's rkyv encoding alone, into a reused buffer: the part of
    // `build` that is not the final copy and crc.
    let mut scratch = spool_wire::batch::BatchBytes::with_capacity(4096);
    c.bench_function("record_1KiB/archive", |b| {
        b.iter(|| {
            scratch.clear();
            rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(&records[0], &mut scratch)
                .expect("encodes");
            black_box(scratch.len())
        })
    });

    // Keep the allocation pattern of a fresh builder visible too.
    c.bench_function("batch_100x1KiB/build_fresh_builder", |b| {
        b.iter_batched(
            DataBatchBuilder::new,
            |mut fresh| black_box(build(&records, &mut fresh)),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, batch_benches);
criterion_main!(benches);
