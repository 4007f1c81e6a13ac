//! `Log::open_from`: recovery bounded by a checkpoint offset. Sealed segments
//! wholly below the bound are taken from their index files without being
//! read; their batches are still crc-checked when read. Everything from the
//! bound on gets the full scan. Runs on the simulated disk behind a wrapper
//! that records every read, so "not read" is observed, not assumed.
// Tests may unwrap (COMMON.md); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use common::{drive, make_batch, read_all, small_config};
use futures_lite::future::block_on;
use spool_broker::io::{IoError, SimBuf, SimFile, SimStorage, Storage, StorageFile};
use spool_broker::log::{
    index_path, CorruptDetail, Log, LogError, Offset, RecordFatal, SegmentInfo,
};

const EPOCH: u32 = 5;

/// Every `read_at` issued through the wrapper: (path, position).
type Reads = Rc<RefCell<Vec<(PathBuf, u64)>>>;

/// A storage that forwards to the simulator and records each read.
#[derive(Clone)]
struct Counting {
    inner: SimStorage,
    reads: Reads,
}

struct CountingFile {
    inner: SimFile,
    reads: Reads,
}

impl Storage for Counting {
    type File = CountingFile;

    async fn open(&self, path: &Path) -> Result<CountingFile, IoError> {
        Ok(CountingFile { inner: self.inner.open(path).await?, reads: self.reads.clone() })
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

impl StorageFile for CountingFile {
    type Buf = SimBuf;
    type ReadBuf = Vec<u8>;

    fn alloc_buf(&self, len_bytes: usize) -> SimBuf {
        self.inner.alloc_buf(len_bytes)
    }
    async fn write_at(&self, buf: Rc<SimBuf>, pos: u64) -> Result<(), IoError> {
        self.inner.write_at(buf, pos).await
    }
    async fn read_at(&self, pos: u64, len_bytes: usize) -> Result<Vec<u8>, IoError> {
        self.reads.borrow_mut().push((self.inner.path().to_path_buf(), pos));
        self.inner.read_at(pos, len_bytes).await
    }
    async fn fdatasync(&self) -> Result<(), IoError> {
        self.inner.fdatasync().await
    }
    async fn len_bytes(&self) -> Result<u64, IoError> {
        self.inner.len_bytes().await
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

fn dir() -> &'static Path {
    Path::new("/p")
}

/// A log of `count` 1-record batches of ~1.5 KiB: about 40 per 64 KiB
/// segment, so 200 batches give several sealed segments with index files.
fn build(count: u64) -> (SimStorage, Vec<SegmentInfo>) {
    let disk = SimStorage::new();
    let segments = block_on(async {
        let fatal = Rc::new(RecordFatal::default());
        let (log, _) = Log::open(disk.clone(), dir(), small_config(), EPOCH, fatal).await.unwrap();
        drive(&log, async {
            for tag in 0..count {
                let appended = log.append(&make_batch(1, 1500, tag)).unwrap();
                appended.ticket.durable().await.unwrap();
            }
        })
        .await;
        log.segments()
    });
    assert!(segments.len() >= 4, "want several sealed segments, got {}", segments.len());
    for sealed in &segments[..segments.len() - 1] {
        assert!(disk.file_bytes(&index_path(dir(), sealed.base_offset.0)).is_some());
    }
    (disk, segments)
}

fn counting(disk: &SimStorage) -> Counting {
    Counting {
        inner: disk.crash_image(spool_broker::io::CrashMode::DurableOnly),
        reads: Reads::default(),
    }
}

async fn open_from(
    storage: Counting,
    bound: u64,
) -> Result<(Log<Counting>, spool_broker::log::RecoveryReport), LogError> {
    let fatal = Rc::new(RecordFatal::default());
    Log::open_from(storage, dir(), small_config(), EPOCH + 1, fatal, Offset(bound)).await
}

/// Flips one byte inside the body of the second data batch of `segment`
/// (walking headers, stepping over fillers); returns that batch's position.
fn flip_second_batch(disk: &SimStorage, segment: &Path) -> u64 {
    let mut bytes = disk.file_bytes(segment).unwrap();
    let mut pos = 0usize;
    let mut data_batches = 0;
    loop {
        let kind = u16::from_le_bytes(bytes[pos + 6..pos + 8].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        assert!(len >= 64, "walked off the batches at {pos}");
        if kind != 2 {
            data_batches += 1;
            if data_batches == 2 {
                break;
            }
        }
        pos += len;
    }
    bytes[pos + 100] ^= 0x40;
    disk.set_file_bytes(segment, bytes);
    pos as u64
}

#[test]
fn open_from_reads_no_sealed_segment_below_the_bound() {
    // Goal: with a bound at the log end only the last segment's file is read (plus index
    // files); a full open reads every segment. Method: count reads per path.
    let (disk, segments) = build(200);
    let end = segments.last().unwrap().next_offset.0;
    let last = segments.last().unwrap().path.clone();
    let storage = counting(&disk);
    let reads = storage.reads.clone();
    let (log, report) = block_on(open_from(storage, end)).unwrap();
    assert_eq!(report.segments_trusted, segments.len() - 1);
    assert_eq!(report.next_offset.0, end);
    let segment_reads: Vec<PathBuf> = reads
        .borrow()
        .iter()
        .filter(|(path, _)| path.extension().is_some_and(|ext| ext == "log"))
        .map(|(path, _)| path.clone())
        .collect();
    assert!(!segment_reads.is_empty(), "the tail segment is scanned");
    assert!(
        segment_reads.iter().all(|path| *path == last),
        "read a sealed segment: {segment_reads:?}"
    );
    // Same extents as a full scan, and every batch still reads back.
    assert_eq!(log.segments(), segments);
    assert_eq!(block_on(read_all(&log)).len(), 200);

    let full = counting(&disk);
    let full_reads = full.reads.clone();
    let fatal = Rc::new(RecordFatal::default());
    let (_, report) = block_on(Log::open(full, dir(), small_config(), EPOCH + 1, fatal)).unwrap();
    assert_eq!(report.segments_trusted, 0);
    for sealed in &segments {
        assert!(full_reads.borrow().iter().any(|(path, _)| *path == sealed.path));
    }
}

#[test]
fn bit_flip_below_the_bound_is_caught_when_read() {
    // Goal: damage in a trusted sealed segment does not stop open_from, but the read that
    // meets it fails with Corrupt naming file and batch position; a full open refuses.
    let (disk, segments) = build(200);
    let end = segments.last().unwrap().next_offset.0;
    let victim = &segments[1];
    let pos = flip_second_batch(&disk, &victim.path);
    let (log, report) = block_on(open_from(counting(&disk), end)).unwrap();
    assert_eq!(report.segments_trusted, segments.len() - 1);
    let second = victim.base_offset.0 + 1;
    match block_on(log.read(Offset(second), 4096)) {
        Err(LogError::Corrupt { path, pos: at, detail: CorruptDetail::Batch(_) }) => {
            assert_eq!(path, victim.path);
            assert_eq!(at, pos);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Batches before the damaged one still read.
    let first = block_on(log.read(victim.base_offset, 1)).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].header.base_offset, victim.base_offset.0);

    let fatal = Rc::new(RecordFatal::default());
    match block_on(Log::open(counting(&disk), dir(), small_config(), EPOCH + 1, fatal)) {
        Err(LogError::Corrupt { path, pos: at, .. }) => {
            assert_eq!(path, victim.path);
            assert_eq!(at, pos);
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("a full open must refuse the damaged segment"),
    }
}

#[test]
fn damage_after_the_bound_before_the_tail_is_refused() {
    // Goal: a sealed segment holding or after the bound is scanned, so damage there fails
    // open_from naming file and position, like a full open.
    let (disk, segments) = build(200);
    let victim = &segments[2];
    let pos = flip_second_batch(&disk, &victim.path);
    // Bound inside the victim (it holds the bound) and before it (it is after the bound).
    for bound in [victim.base_offset.0 + 1, segments[1].base_offset.0] {
        match block_on(open_from(counting(&disk), bound)) {
            Err(LogError::Corrupt { path, pos: at, .. }) => {
                assert_eq!(path, victim.path, "bound {bound}");
                assert_eq!(at, pos, "bound {bound}");
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("bound {bound}: damage at or after the bound must be refused"),
        }
    }
}

#[test]
fn sealed_segment_without_a_valid_index_is_scanned() {
    // Goal: a missing or damaged index file below the bound falls back to a scan of that
    // segment (and a rebuilt index); the others stay unread.
    let (disk, segments) = build(200);
    let end = segments.last().unwrap().next_offset.0;
    let damaged = index_path(dir(), segments[0].base_offset.0);
    let mut bytes = disk.file_bytes(&damaged).unwrap();
    bytes[20] ^= 1;
    disk.set_file_bytes(&damaged, bytes);
    let storage = counting(&disk);
    let reads = storage.reads.clone();
    let (log, report) = block_on(open_from(storage, end)).unwrap();
    assert_eq!(report.segments_trusted, segments.len() - 2);
    assert_eq!(report.indexes_rebuilt, 1);
    let read_paths: Vec<PathBuf> = reads.borrow().iter().map(|(path, _)| path.clone()).collect();
    assert!(read_paths.contains(&segments[0].path));
    assert!(!read_paths.contains(&segments[1].path));
    assert_eq!(block_on(read_all(&log)).len(), 200);
}

#[test]
fn torn_tail_is_still_cut_with_a_bound() {
    // Goal: open_from keeps the torn-tail repair: garbage right after the last commit of
    // the last segment is zeroed and appends continue at the old end.
    let (disk, segments) = build(120);
    let last = segments.last().unwrap();
    let mut bytes = disk.file_bytes(&last.path).unwrap();
    let end = last.data_end as usize;
    bytes[end..end + 300].fill(0x5A);
    disk.set_file_bytes(&last.path, bytes);
    let (log, report) = block_on(open_from(counting(&disk), last.next_offset.0)).unwrap();
    assert_eq!(report.truncated_at, Some((last.path.clone(), last.data_end)));
    assert_eq!(report.next_offset, last.next_offset);
    let appended = block_on(drive(&log, async {
        let appended = log.append(&make_batch(1, 100, 9_999)).unwrap();
        appended.ticket.durable().await.unwrap();
        appended
    }));
    assert_eq!(appended.base_offset, last.next_offset);
}
