//! What routing a request costs the client: with a queue's partitions in
//! the metadata cache, finding the shard of one partition looks at that
//! partition only, however many partitions the queue has. It used to copy
//! the queue's whole partition list for every request (every enqueue, ack,
//! extend and release asks), which at 10,000 partitions was most of a
//! producer's CPU: `spool-bench throughput --partitions 10000 --rate 25000`
//! reached 12k msgs/s with the bench using 15 CPU-seconds in 10 s.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use spool_client::spool_wire::proto::PartitionId;
use spool_client::Client;

/// Counts the bytes the calling thread allocates while counting is on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn counted(bytes: usize) {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = BYTES.try_with(|total| total.set(total.get() + bytes as u64));
        }
    });
}

// SAFETY: delegates to the system allocator and only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(new_size);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// Goal: routing a request to its partition's shard allocates the same few
// bytes at 10,000 partitions as at 4 (the old code copied the partition list,
// ≈ 10,000 entries with their host strings, per request). Method: a fake
// broker serving one queue of P partitions; one lookup fills the client's
// metadata cache; the bytes this thread allocates over 1,000 lookups of
// partitions spread over the queue (current-thread runtime: all of it runs
// here) stay under 256 per lookup for both P.
#[tokio::test(flavor = "current_thread")]
async fn routing_a_request_allocates_the_same_at_10_000_partitions_as_at_4() {
    const LOOKUPS: u32 = 1_000;
    for partitions in [4u32, 10_000] {
        let (server, _state) = common::start_broker("wide", partitions).await;
        let client = Client::connect(&server.addr).await.unwrap();
        let first = client.owner_address("wide", PartitionId(0)).await.unwrap();
        assert_eq!(first, server.addr);
        BYTES.with(|bytes| bytes.set(0));
        COUNTING.with(|on| on.set(true));
        for lookup in 0..LOOKUPS {
            let partition = PartitionId(lookup.wrapping_mul(7_919) % partitions);
            let addr = client.owner_address("wide", partition).await.unwrap();
            assert_eq!(addr, server.addr);
        }
        COUNTING.with(|on| on.set(false));
        let per_lookup = BYTES.with(Cell::get) / u64::from(LOOKUPS);
        assert!(
            per_lookup < 256,
            "{partitions} partitions: {per_lookup} bytes allocated per routed request"
        );
    }
}
