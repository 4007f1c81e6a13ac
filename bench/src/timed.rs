//! [`TimedStorage`]: a pass-through [`Storage`] that times every write and
//! fdatasync, so a benchmark can say where an append's latency goes (the
//! disk's sync, the write, or the log itself) without a profiler.
//!
//! It wraps any storage and changes no behaviour: same buffers, same calls,
//! same errors. The log never reads a clock (it is tested under a simulated
//! one), so timing lives here, at the seam, in the benchmark.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_broker::io::{IoError, Storage, StorageFile};

use crate::error::BenchError;
use crate::histogram::{Latency, LatencySummary};

/// Write and sync counters shared by every file of one [`TimedStorage`].
#[derive(Debug)]
pub struct IoTimings {
    pub write: Latency,
    pub write_bytes: u64,
    pub sync: Latency,
}

/// What [`IoTimings`] saw, for a report.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct IoSummary {
    /// Every write: commits, witness entries and the preparer's zero-fill
    /// of the next journal file.
    pub write_bytes: u64,
    pub write_us: LatencySummary,
    pub sync_us: LatencySummary,
}

impl IoTimings {
    /// Empty counters.
    ///
    /// # Errors
    /// [`BenchError::Histogram`] if a histogram cannot be built.
    pub fn new() -> Result<Self, BenchError> {
        Ok(Self { write: Latency::new()?, write_bytes: 0, sync: Latency::new()? })
    }

    pub fn reset(&mut self) {
        self.write.reset();
        self.write_bytes = 0;
        self.sync.reset();
    }

    pub fn summary(&self) -> IoSummary {
        IoSummary {
            write_bytes: self.write_bytes,
            write_us: self.write.summary(),
            sync_us: self.sync.summary(),
        }
    }
}

/// `inner`, with every file's writes and syncs timed into `timings`.
#[derive(Debug, Clone)]
pub struct TimedStorage<S> {
    inner: S,
    timings: Rc<RefCell<IoTimings>>,
}

impl<S: Storage> TimedStorage<S> {
    pub fn new(inner: S, timings: Rc<RefCell<IoTimings>>) -> Self {
        Self { inner, timings }
    }
}

/// One file of a [`TimedStorage`].
pub struct TimedFile<F> {
    inner: F,
    timings: Rc<RefCell<IoTimings>>,
}

fn elapsed_ns(start: spool_broker::clock::Instant) -> u64 {
    u64::try_from(instant_now().duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

impl<S: Storage> Storage for TimedStorage<S> {
    type File = TimedFile<S::File>;

    async fn open(&self, path: &Path) -> Result<Self::File, IoError> {
        let inner = self.inner.open(path).await?;
        Ok(TimedFile { inner, timings: self.timings.clone() })
    }

    async fn remove(&self, path: &Path) -> Result<(), IoError> {
        self.inner.remove(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), IoError> {
        self.inner.rename(from, to).await
    }

    async fn list_dir(&self, dir: &Path) -> Result<Vec<String>, IoError> {
        self.inner.list_dir(dir).await
    }

    async fn create_dir_all(&self, dir: &Path) -> Result<Vec<std::path::PathBuf>, IoError> {
        self.inner.create_dir_all(dir).await
    }

    async fn sync_dir(&self, dir: &Path) -> Result<(), IoError> {
        self.inner.sync_dir(dir).await
    }
}

impl<F: StorageFile> StorageFile for TimedFile<F> {
    type Buf = F::Buf;
    type ReadBuf = F::ReadBuf;

    fn alloc_buf(&self, len_bytes: usize) -> Self::Buf {
        self.inner.alloc_buf(len_bytes)
    }

    async fn write_at(&self, buf: Rc<Self::Buf>, pos: u64) -> Result<(), IoError> {
        let len_bytes = (*buf).as_ref().len() as u64;
        let start = instant_now();
        let result = self.inner.write_at(buf, pos).await;
        let mut timings = self.timings.borrow_mut();
        timings.write.record_ns(elapsed_ns(start));
        timings.write_bytes += len_bytes;
        result
    }

    async fn read_at(&self, pos: u64, len_bytes: usize) -> Result<Self::ReadBuf, IoError> {
        self.inner.read_at(pos, len_bytes).await
    }

    async fn fdatasync(&self) -> Result<(), IoError> {
        let start = instant_now();
        let result = self.inner.fdatasync().await;
        self.timings.borrow_mut().sync.record_ns(elapsed_ns(start));
        result
    }

    async fn len_bytes(&self) -> Result<u64, IoError> {
        self.inner.len_bytes().await
    }

    fn path(&self) -> &Path {
        self.inner.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;
    use spool_broker::io::{IoBuf, SimStorage};

    #[test]
    fn counts_writes_and_syncs_and_passes_bytes_through() {
        // Goal: the wrapper times each write and sync and the bytes reach the inner storage.
        let sim = SimStorage::new();
        let timings = Rc::new(RefCell::new(IoTimings::new().unwrap()));
        let storage = TimedStorage::new(sim.clone(), timings.clone());
        block_on(async {
            storage.create_dir_all(Path::new("/d")).await.unwrap();
            let file = storage.open(Path::new("/d/f")).await.unwrap();
            let mut buf = file.alloc_buf(4096);
            buf.as_mut().fill(7);
            buf.trim(4096);
            file.write_at(Rc::new(buf), 0).await.unwrap();
            file.fdatasync().await.unwrap();
        });
        let summary = timings.borrow().summary();
        assert_eq!(summary.write_bytes, 4096);
        assert_eq!(summary.write_us.count, 1);
        assert_eq!(summary.sync_us.count, 1);
        assert_eq!(sim.file_bytes(Path::new("/d/f")).unwrap(), vec![7u8; 4096]);
    }
}
