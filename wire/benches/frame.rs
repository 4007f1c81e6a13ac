//! Encode/decode cost of the hot data-path frames: an Enqueue carrying a
//! 100 × 1 KiB batch, a Claim response with 32 deliveries of 1 KiB, and an
//! Ack of 64 tokens. Decode goes through the streaming `FrameDecoder` the
//! server and client use, so it includes the copy into its buffer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use spool_wire::proto::{
    AckRequest, ClaimResponse, CorrelationId, Delivery, DeliveryToken, EnqueueRequest,
    FrameDecoder, Generation, Offset, PartitionId, Reply, Request, Response,
};

fn enqueue(criterion: &mut Criterion) {
    // The batch is opaque to the codec; its size is what matters here.
    let batch = vec![0x5Au8; 64 + 100 * (1024 + 8)];
    let request = Request::Enqueue(EnqueueRequest {
        queue: "orders",
        partition: PartitionId(3),
        batch: &batch,
    });
    let mut group = criterion.benchmark_group("enqueue_100x1KiB");
    group.throughput(Throughput::Bytes(batch.len() as u64));
    let mut out = Vec::with_capacity(batch.len() + 256);
    group.bench_function("encode", |bench| {
        bench.iter(|| {
            out.clear();
            request.encode(CorrelationId(1), &mut out).unwrap();
            std::hint::black_box(out.len())
        })
    });
    let mut frame = Vec::new();
    request.encode(CorrelationId(1), &mut frame).unwrap();
    let mut decoder = FrameDecoder::new();
    group.bench_function("decode", |bench| {
        bench.iter(|| {
            decoder.feed(&frame).unwrap();
            let frame = decoder.next_frame().unwrap().unwrap();
            let Request::Enqueue(decoded) = Request::decode(&frame).unwrap() else { panic!() };
            std::hint::black_box(decoded.batch.len())
        })
    });
    group.finish();
}

fn claim_response(criterion: &mut Criterion) {
    let records: Vec<Vec<u8>> = (0..32).map(|index| vec![index as u8; 1024]).collect();
    let deliveries = records
        .iter()
        .enumerate()
        .map(|(index, record)| Delivery {
            token: DeliveryToken([index as u8; 64]),
            partition: PartitionId(index as u32 % 4),
            offset: Offset(1000 + index as u64),
            attempt: 1,
            generation: Generation(1),
            record,
        })
        .collect();
    let response =
        Response::Claim(ClaimResponse { lease_deadline_ms: 1_700_000_000_000, deliveries });
    let mut group = criterion.benchmark_group("claim_response_32x1KiB");
    group.throughput(Throughput::Elements(32));
    let mut out = Vec::with_capacity(64 * 1024);
    group.bench_function("encode", |bench| {
        bench.iter(|| {
            out.clear();
            response.encode(CorrelationId(2), &mut out).unwrap();
            std::hint::black_box(out.len())
        })
    });
    let mut frame = Vec::new();
    response.encode(CorrelationId(2), &mut frame).unwrap();
    let mut decoder = FrameDecoder::new();
    group.bench_function("decode", |bench| {
        bench.iter(|| {
            decoder.feed(&frame).unwrap();
            let frame = decoder.next_frame().unwrap().unwrap();
            let Reply::Ok(Response::Claim(decoded)) = Response::decode(&frame).unwrap().reply
            else {
                panic!()
            };
            std::hint::black_box(decoded.deliveries.len())
        })
    });
    group.finish();
}

fn ack(criterion: &mut Criterion) {
    let tokens = (0..64).map(|index| DeliveryToken([index as u8; 64])).collect();
    let request = Request::Ack(AckRequest { tokens });
    let mut group = criterion.benchmark_group("ack_64_tokens");
    group.throughput(Throughput::Elements(64));
    let mut out = Vec::with_capacity(8 * 1024);
    group.bench_function("encode", |bench| {
        bench.iter(|| {
            out.clear();
            request.encode(CorrelationId(3), &mut out).unwrap();
            std::hint::black_box(out.len())
        })
    });
    let mut frame = Vec::new();
    request.encode(CorrelationId(3), &mut frame).unwrap();
    let mut decoder = FrameDecoder::new();
    group.bench_function("decode", |bench| {
        bench.iter(|| {
            decoder.feed(&frame).unwrap();
            let frame = decoder.next_frame().unwrap().unwrap();
            let Request::Ack(decoded) = Request::decode(&frame).unwrap() else { panic!() };
            std::hint::black_box(decoded.tokens.len())
        })
    });
    group.finish();
}

criterion_group!(benches, enqueue, claim_response, ack);
criterion_main!(benches);
