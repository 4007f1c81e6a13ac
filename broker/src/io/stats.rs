//! What this thread's disk did: bytes written and `fdatasync` latencies,
//! counted where `DmaStorage` does the I/O.
//!
//! Thread-per-core makes "per shard" the same as "per thread": every shard's
//! files are written only by its own executor thread, so the counters are
//! thread-locals of plain `Cell`s (no atomics, no sharing). A scrape reads
//! them on the shard's own thread ([`snapshot`]), through the cross-core
//! report message (`shard::report`); nothing else reads them. The simulated
//! storage counts nothing here: it has no disk and no latency to report.

use std::cell::Cell;
use std::time::Duration;

/// Upper bounds (inclusive, microseconds) of the `fdatasync` latency
/// histogram's buckets; a last `+Inf` bucket holds the rest. From a fast
/// NVMe flush (tens of µs) to a stalled disk (a second).
pub const SYNC_LATENCY_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

const BUCKETS: usize = SYNC_LATENCY_BUCKETS_US.len() + 1;
const _: () = assert!(SYNC_LATENCY_BUCKETS_US[0] > 0);

/// One thread's counters.
struct IoCounters {
    written_bytes: Cell<u64>,
    syncs: [Cell<u64>; BUCKETS],
    sync_sum_us: Cell<u64>,
}

thread_local! {
    static COUNTERS: IoCounters = const {
        IoCounters {
            written_bytes: Cell::new(0),
            syncs: [const { Cell::new(0) }; BUCKETS],
            sync_sum_us: Cell::new(0),
        }
    };
}

/// A copy of this thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoSnapshot {
    pub written_bytes: u64,
    /// Syncs per bucket of [`SYNC_LATENCY_BUCKETS_US`] (not cumulative); the
    /// last entry counts those slower than every bound.
    pub sync_buckets: [u64; BUCKETS],
    pub sync_sum_us: u64,
}

impl IoSnapshot {
    /// Syncs counted.
    pub fn syncs(&self) -> u64 {
        self.sync_buckets.iter().sum()
    }
}

/// Counts `bytes` written by this thread.
pub fn record_write(bytes: usize) {
    COUNTERS.with(|counters| {
        counters.written_bytes.set(counters.written_bytes.get().saturating_add(bytes as u64));
    });
}

/// Counts one `fdatasync` that took `took`.
pub fn record_sync(took: Duration) {
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    let bucket = SYNC_LATENCY_BUCKETS_US
        .iter()
        .position(|bound| micros <= *bound)
        .unwrap_or(SYNC_LATENCY_BUCKETS_US.len());
    COUNTERS.with(|counters| {
        let cell = &counters.syncs[bucket];
        cell.set(cell.get() + 1);
        counters.sync_sum_us.set(counters.sync_sum_us.get().saturating_add(micros));
    });
}

/// This thread's counters now.
pub fn snapshot() -> IoSnapshot {
    COUNTERS.with(|counters| IoSnapshot {
        written_bytes: counters.written_bytes.get(),
        sync_buckets: std::array::from_fn(|index| counters.syncs[index].get()),
        sync_sum_us: counters.sync_sum_us.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a sync lands in the first bucket whose bound covers it, the sum
    // adds up, writes add up, and another thread's counters are its own.
    // Method: record on a fresh thread, snapshot there and here.
    #[test]
    fn records_land_in_their_bucket_and_stay_on_their_thread() {
        let seen = std::thread::spawn(|| {
            record_write(4096);
            record_write(8192);
            record_sync(Duration::from_micros(50));
            record_sync(Duration::from_micros(51));
            record_sync(Duration::from_secs(3));
            snapshot()
        })
        .join()
        .unwrap();
        assert_eq!(seen.written_bytes, 12_288);
        assert_eq!(seen.sync_buckets[0], 1);
        assert_eq!(seen.sync_buckets[1], 1);
        assert_eq!(seen.sync_buckets[BUCKETS - 1], 1);
        assert_eq!(seen.syncs(), 3);
        assert_eq!(seen.sync_sum_us, 50 + 51 + 3_000_000);
        assert_eq!(snapshot().written_bytes, 0);
    }
}
