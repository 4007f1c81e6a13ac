//! What this thread's disk did: bytes written and `fdatasync` latencies,
//! counted where `DmaStorage` does the I/O; and what its logs did with it:
//! the size of each group commit made durable and the time from its write
//! being submitted to it being durable, and whether each read was served
//! from the journal's in-memory caches or from its files (counted by
//! `log/`, on whatever storage it runs).
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

/// Upper bounds (inclusive, bytes) of the group commit size histogram's
/// buckets; a last `+Inf` bucket holds the rest. A commit is whole pages:
/// from one page (a lone ack) to a commit of many maximal batches.
pub const COMMIT_SIZE_BUCKETS_BYTES: [u64; 13] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
];

const COMMIT_BUCKETS: usize = COMMIT_SIZE_BUCKETS_BYTES.len() + 1;
const _: () = assert!(COMMIT_SIZE_BUCKETS_BYTES[0] == crate::limits::PAGE_BYTES);

/// One thread's counters.
struct IoCounters {
    written_bytes: Cell<u64>,
    syncs: [Cell<u64>; BUCKETS],
    sync_sum_us: Cell<u64>,
    commits: [Cell<u64>; COMMIT_BUCKETS],
    commit_sum_bytes: Cell<u64>,
    commit_durations: [Cell<u64>; BUCKETS],
    commit_duration_sum_us: Cell<u64>,
    reads_from_cache: Cell<u64>,
    reads_from_files: Cell<u64>,
    read_bytes: Cell<u64>,
}

thread_local! {
    static COUNTERS: IoCounters = const {
        IoCounters {
            written_bytes: Cell::new(0),
            syncs: [const { Cell::new(0) }; BUCKETS],
            sync_sum_us: Cell::new(0),
            commits: [const { Cell::new(0) }; COMMIT_BUCKETS],
            commit_sum_bytes: Cell::new(0),
            commit_durations: [const { Cell::new(0) }; BUCKETS],
            commit_duration_sum_us: Cell::new(0),
            reads_from_cache: Cell::new(0),
            reads_from_files: Cell::new(0),
            read_bytes: Cell::new(0),
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
    /// Group commits made durable per bucket of
    /// [`COMMIT_SIZE_BUCKETS_BYTES`] (not cumulative; the last entry counts
    /// those larger than every bound).
    pub commit_buckets: [u64; COMMIT_BUCKETS],
    pub commit_sum_bytes: u64,
    /// Group commits made durable per bucket of [`SYNC_LATENCY_BUCKETS_US`]
    /// of the time from their write being submitted to their being durable
    /// (not cumulative; the last entry counts the slower ones).
    pub commit_duration_buckets: [u64; BUCKETS],
    pub commit_duration_sum_us: u64,
    /// Log reads served from the tail cache of recent commits.
    pub reads_from_cache: u64,
    /// Log reads that went to the journal files.
    pub reads_from_files: u64,
    /// Bytes read from the disk by this thread (every file kind).
    pub read_bytes: u64,
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

/// Counts `bytes` read from the disk by this thread.
pub fn record_read_bytes(bytes: usize) {
    COUNTERS.with(|counters| {
        counters.read_bytes.set(counters.read_bytes.get().saturating_add(bytes as u64));
    });
}

/// `took` in microseconds and the index of its bucket of
/// [`SYNC_LATENCY_BUCKETS_US`] (the last one: slower than every bound).
fn latency_bucket(took: Duration) -> (u64, usize) {
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    let bucket = SYNC_LATENCY_BUCKETS_US
        .iter()
        .position(|bound| micros <= *bound)
        .unwrap_or(SYNC_LATENCY_BUCKETS_US.len());
    (micros, bucket)
}

/// Counts one `fdatasync` that took `took`.
pub fn record_sync(took: Duration) {
    let (micros, bucket) = latency_bucket(took);
    COUNTERS.with(|counters| {
        let cell = &counters.syncs[bucket];
        cell.set(cell.get() + 1);
        counters.sync_sum_us.set(counters.sync_sum_us.get().saturating_add(micros));
    });
}

/// Counts one group commit of `bytes` (whole pages) made durable `took`
/// after its write was submitted (the write, its `fdatasync`, and any wait
/// for earlier commits to become durable: the durable watermark is
/// contiguous).
pub fn record_commit(bytes: u64, took: Duration) {
    let bucket = COMMIT_SIZE_BUCKETS_BYTES
        .iter()
        .position(|bound| bytes <= *bound)
        .unwrap_or(COMMIT_SIZE_BUCKETS_BYTES.len());
    let (micros, duration_bucket) = latency_bucket(took);
    COUNTERS.with(|counters| {
        let cell = &counters.commits[bucket];
        cell.set(cell.get() + 1);
        counters.commit_sum_bytes.set(counters.commit_sum_bytes.get().saturating_add(bytes));
        let cell = &counters.commit_durations[duration_bucket];
        cell.set(cell.get() + 1);
        let sum = &counters.commit_duration_sum_us;
        sum.set(sum.get().saturating_add(micros));
    });
}

/// Counts one log read, served from the journal's caches (`from_cache`) or
/// from its files.
pub fn record_read(from_cache: bool) {
    COUNTERS.with(|counters| {
        let cell = if from_cache { &counters.reads_from_cache } else { &counters.reads_from_files };
        cell.set(cell.get().wrapping_add(1));
    });
}

thread_local! {
    /// Disk writes and syncs this thread has submitted and not yet seen
    /// complete. The poll gate (`net/poll_gate.rs`) reads it: while the
    /// disk has work of ours in flight, a busy shard looks at its
    /// completions more often, so a commit's write, its sync and the reply
    /// they release follow the disk and not the gate's clock.
    static DISK_IN_FLIGHT: Cell<u32> = const { Cell::new(0) };
}

/// Marks one disk operation of this thread in flight until it is dropped
/// (completed, failed or cancelled alike).
#[must_use = "the operation counts as in flight only while the guard lives"]
pub struct InFlight(());

impl InFlight {
    pub fn begin() -> InFlight {
        DISK_IN_FLIGHT.with(|count| count.set(count.get().saturating_add(1)));
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        DISK_IN_FLIGHT.with(|count| count.set(count.get().saturating_sub(1)));
    }
}

/// Whether this thread has a disk write or sync in flight.
pub fn disk_in_flight() -> bool {
    DISK_IN_FLIGHT.with(|count| count.get() > 0)
}

/// This thread's counters now.
pub fn snapshot() -> IoSnapshot {
    COUNTERS.with(|counters| IoSnapshot {
        written_bytes: counters.written_bytes.get(),
        sync_buckets: std::array::from_fn(|index| counters.syncs[index].get()),
        sync_sum_us: counters.sync_sum_us.get(),
        commit_buckets: std::array::from_fn(|index| counters.commits[index].get()),
        commit_sum_bytes: counters.commit_sum_bytes.get(),
        commit_duration_buckets: std::array::from_fn(|index| {
            counters.commit_durations[index].get()
        }),
        commit_duration_sum_us: counters.commit_duration_sum_us.get(),
        reads_from_cache: counters.reads_from_cache.get(),
        reads_from_files: counters.reads_from_files.get(),
        read_bytes: counters.read_bytes.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the in-flight mark lasts exactly as long as its guards, also
    // when one is dropped early (a cancelled write). Method: nest guards.
    #[test]
    fn disk_in_flight_follows_the_guards() {
        std::thread::spawn(|| {
            assert!(!disk_in_flight());
            let write = InFlight::begin();
            let sync = InFlight::begin();
            assert!(disk_in_flight());
            drop(write);
            assert!(disk_in_flight(), "one operation is still in flight");
            drop(sync);
            assert!(!disk_in_flight());
        })
        .join()
        .unwrap();
    }

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

    // Goal: a commit lands in the first bucket whose bound covers its size
    // (a bound itself included) and in the one that covers its duration,
    // and reads are told apart by their source.
    // Method: record on a fresh thread and read its snapshot.
    #[test]
    fn commits_and_reads_are_counted() {
        let seen = std::thread::spawn(|| {
            record_commit(4096, Duration::from_micros(40));
            record_commit(4097, Duration::from_micros(1_000));
            record_commit(1 << 30, Duration::from_secs(2));
            record_read(true);
            record_read(true);
            record_read(false);
            record_read_bytes(1 << 20);
            record_read_bytes(4096);
            snapshot()
        })
        .join()
        .unwrap();
        assert_eq!(seen.commit_buckets[0], 1);
        assert_eq!(seen.commit_buckets[1], 1);
        assert_eq!(seen.commit_buckets[COMMIT_BUCKETS - 1], 1);
        assert_eq!(seen.commit_sum_bytes, 4096 + 4097 + (1 << 30));
        assert_eq!(seen.read_bytes, (1 << 20) + 4096);
        let mut durations = [0; BUCKETS];
        durations[0] = 1;
        durations[4] = 1;
        durations[BUCKETS - 1] = 1;
        assert_eq!(seen.commit_duration_buckets, durations);
        assert_eq!(seen.commit_duration_sum_us, 40 + 1_000 + 2_000_000);
        assert_eq!((seen.reads_from_cache, seen.reads_from_files), (2, 1));
    }
}
