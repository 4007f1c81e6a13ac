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
    index_path, CorruptDetail, Log, LogError, Offset, RecordFatal, ResumePoint, SegmentInfo,
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

/// The resume point a log recovered from `disk` gives for a checkpoint at `covers`.
fn resume_point_at(disk: &SimStorage, covers: u64) -> ResumePoint {
    block_on(async {
        let image = disk.crash_image(spool_broker::io::CrashMode::DurableOnly);
        let fatal = Rc::new(RecordFatal::default());
        let (log, _) = Log::open(image, dir(), small_config(), EPOCH + 1, fatal).await.unwrap();
        log.resume_point(Offset(covers)).expect("a resume point")
    })
}

async fn open_resume(
    storage: Counting,
    bound: u64,
    resume: ResumePoint,
) -> Result<(Log<Counting>, spool_broker::log::RecoveryReport), LogError> {
    let fatal = Rc::new(RecordFatal::default());
    Log::open_from_resume(
        storage,
        dir(),
        small_config(),
        EPOCH + 1,
        fatal,
        Offset(bound),
        Some(resume),
    )
    .await
}

/// Positions read in `path`.
fn reads_of(reads: &Reads, path: &Path) -> Vec<u64> {
    reads.borrow().iter().filter(|(read, _)| read == path).map(|(_, pos)| *pos).collect()
}

#[test]
fn a_resume_point_scans_the_last_segment_only_from_its_position() {
    // Goal: with a resume point the segment holding the bound is read only from the point's
    // page on (open_from reads it from 0), and every batch below the point still reads
    // back through the point's index entries after the reopen. Fails without the resume
    // point in recovery (the reads start at 0).
    let (disk, segments) = build(230);
    let last = segments.last().unwrap();
    let end = last.next_offset.0;
    let point = resume_point_at(&disk, end);
    assert_eq!(point.base, last.base_offset.0);
    assert!(point.pos >= 16 * 1024, "the test wants a point well into the segment: {point:?}");
    let floor = point.pos / 4096 * 4096;

    let storage = counting(&disk);
    let reads = storage.reads.clone();
    let (log, report) = block_on(open_resume(storage, end, point.clone())).unwrap();
    assert_eq!(report.resumed_at, Some((last.path.clone(), point.pos)));
    assert!(!report.resume_rejected);
    let positions = reads_of(&reads, &last.path);
    assert!(!positions.is_empty());
    assert!(positions.iter().all(|pos| *pos >= floor), "read below the point: {positions:?}");
    assert_eq!(report.scan_bytes_read, 64 * 1024 - floor);
    assert_eq!(report.next_offset.0, end);
    assert_eq!(log.segments(), segments, "same extents and index as a full scan");
    let batches = block_on(read_all(&log));
    assert_eq!(batches.len(), 230);

    // The same open without the point reads the segment from its start.
    let storage = counting(&disk);
    let reads = storage.reads.clone();
    let (_, report) = block_on(open_from(storage, end)).unwrap();
    assert_eq!(report.resumed_at, None);
    assert_eq!(report.scan_bytes_read, 64 * 1024);
    assert!(reads_of(&reads, &last.path).contains(&0));
}

#[test]
fn a_resume_point_in_a_sealed_segment_keeps_its_index_file() {
    // Goal: a bound inside a sealed segment resumes that segment's scan at the point; the
    // index it rebuilds (point's entries + scanned ones) equals its index file (not
    // rewritten), the segments below are trusted and the later ones scanned whole.
    let (disk, segments) = build(230);
    let holding = &segments[2];
    let span = holding.next_offset.0 - holding.base_offset.0;
    let bound = holding.base_offset.0 + span * 3 / 4;
    let point = resume_point_at(&disk, bound);
    assert_eq!(point.base, holding.base_offset.0);
    assert!(point.offset < bound && point.pos > 0);
    let storage = counting(&disk);
    let reads = storage.reads.clone();
    let (log, report) = block_on(open_resume(storage, bound, point.clone())).unwrap();
    assert_eq!(report.resumed_at, Some((holding.path.clone(), point.pos)));
    assert_eq!(report.segments_trusted, 2);
    assert_eq!(report.indexes_rebuilt, 0);
    let floor = point.pos / 4096 * 4096;
    assert!(reads_of(&reads, &holding.path).iter().all(|pos| *pos >= floor));
    assert!(reads_of(&reads, &segments[0].path).is_empty());
    assert_eq!(log.segments(), segments);
    assert_eq!(block_on(read_all(&log)).len(), 230);
}

#[test]
fn a_stale_or_bogus_resume_point_falls_back_to_the_full_scan() {
    // Goal: a point into the middle of a batch, with an offset other than its batch's, or past the end of
    // the data (zeros, as after a torn tail) is detected by the batch at its position and
    // the segment is scanned from its start: nothing is lost or skipped. A point past the
    // segment's capacity or for another segment is not used at all.
    let (disk, segments) = build(230);
    let last = segments.last().unwrap();
    let end = last.next_offset.0;
    let good = resume_point_at(&disk, end);
    let past_data = (last.data_end / 4096 + 1) * 4096;
    let rejected = [
        ResumePoint { pos: good.pos + 64, ..good.clone() },
        ResumePoint { offset: good.offset - 1, ..good.clone() },
        ResumePoint { pos: past_data, ..good.clone() },
    ];
    for point in rejected {
        let storage = counting(&disk);
        let reads = storage.reads.clone();
        let (log, report) = block_on(open_resume(storage, end, point.clone())).unwrap();
        assert!(report.resume_rejected, "{point:?}");
        assert_eq!(report.resumed_at, None);
        assert!(reads_of(&reads, &last.path).contains(&0), "{point:?}: scanned from 0");
        assert_eq!(report.next_offset.0, end);
        assert_eq!(log.segments(), segments);
        assert_eq!(block_on(read_all(&log)).len(), 230);
    }
    let unused = [
        ResumePoint { pos: 64 * 1024 + 4096, ..good.clone() },
        ResumePoint { base: segments[1].base_offset.0, ..good.clone() },
    ];
    for point in unused {
        let (log, report) = block_on(open_resume(counting(&disk), end, point.clone())).unwrap();
        assert!(!report.resume_rejected, "{point:?}");
        assert_eq!(report.resumed_at, None);
        assert_eq!(log.segments(), segments);
    }
    // A point at or past the bound is never used: the bound is what the checkpoint vouches.
    let (_, report) = block_on(open_resume(counting(&disk), good.offset, good.clone())).unwrap();
    assert_eq!(report.resumed_at, None);
}

#[test]
fn damage_and_torn_tails_after_a_resume_point_are_handled_as_by_the_full_scan() {
    // Goal: the part scanned from a resume point keeps the full scan's rules: damage to an
    // acknowledged batch after the point (before the tail window) is refused naming file
    // and byte; garbage right after the last commit is a torn tail, cut and zeroed.
    let (disk, segments) = build(230);
    let last = segments.last().unwrap();
    let end = last.next_offset.0;
    let point = resume_point_at(&disk, end);

    let torn = counting(&disk);
    let mut bytes = torn.inner.file_bytes(&last.path).unwrap();
    let data_end = last.data_end as usize;
    bytes[data_end..data_end + 300].fill(0x5A);
    torn.inner.set_file_bytes(&last.path, bytes);
    let (_, report) = block_on(open_resume(torn, end, point.clone())).unwrap();
    assert!(report.resumed_at.is_some());
    assert_eq!(report.truncated_at, Some((last.path.clone(), last.data_end)));
    assert_eq!(report.next_offset.0, end);

    // A bound inside a sealed segment: damage to the batch after the point is refused.
    let holding = &segments[2];
    let bound = holding.base_offset.0 + (holding.next_offset.0 - holding.base_offset.0) * 3 / 4;
    let point = resume_point_at(&disk, bound);
    assert_eq!(point.base, holding.base_offset.0);
    let damaged = counting(&disk);
    let mut bytes = damaged.inner.file_bytes(&holding.path).unwrap();
    let at = point.pos as usize;
    let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    let mut next = at + len;
    // Step over the filler that closes the point's commit, to the next batch.
    let kind = u16::from_le_bytes(bytes[next + 6..next + 8].try_into().unwrap());
    if kind == 2 {
        next += u32::from_le_bytes(bytes[next + 8..next + 12].try_into().unwrap()) as usize;
    }
    bytes[next + 100] ^= 0x40;
    damaged.inner.set_file_bytes(&holding.path, bytes);
    match block_on(open_resume(damaged, bound, point)) {
        Err(LogError::Corrupt { path, pos, .. }) => {
            assert_eq!(path, holding.path);
            assert_eq!(pos, next as u64);
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("damage after the resume point must be refused"),
    }
}
