//! Disk probes: 4 KiB write + fdatasync latency, alone and beside a paced
//! writer.
//!
//! What it owns: opening probe files O_DIRECT (falling back to buffered with
//! a note where the filesystem refuses it), the sync loop, and the writer
//! thread that streams at a target rate. Both write over files zeroed
//! beforehand, as the journal overwrites its pre-zeroed files in place: a
//! sync that also commits a file's growth is a different, slower
//! operation (several ms on ext4 where the overwrite takes a fraction of one). What it does not do: judge the
//! figures ([`crate::verdict`]) or pick the target ([`crate::plan`]'s
//! per-node ingress). Std threads and blocking calls: this crate has no
//! runtime, and a probe that measures the kernel should not add one.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{latency_summary, Probe, SyncProbe, WriteMode, WriterProbe, WRITER_RAMP};
use crate::clock::instant_now;

/// Alignment and size of an O_DIRECT sector write on every device Spool supports.
pub const ALIGN_BYTES: usize = 4096;
/// The sync probe's write: one sector, the smallest commit the journal makes.
pub const SYNC_WRITE_BYTES: usize = 4096;
/// The sync probe's file (zeroed first); it writes sequentially and wraps.
pub const SYNC_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Most sync samples kept (a RAM-backed "disk" syncs in a microsecond).
pub const SYNC_SAMPLES_MAX: usize = 500_000;
/// The writer's block: a large sequential write, as the journal's commits under load.
pub const WRITER_BLOCK_BYTES: usize = 256 * 1024;
/// The writer syncs after this many bytes (as a journal commit does).
pub const WRITER_SYNC_BYTES: u64 = 1024 * 1024;
/// The writer's file (zeroed first); it wraps, so a long probe does not fill the disk.
pub const WRITER_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Block of the zeroing pass.
const ZERO_BLOCK_BYTES: usize = 1024 * 1024;
/// Free space left untouched beyond what the writer needs.
pub const FREE_BYTES_MARGIN: u64 = 256 * 1024 * 1024;
/// Longest pause of the writer between blocks when it is ahead of its pace.
const WRITER_PAUSE_MAX: Duration = Duration::from_millis(1);

/// A buffer whose usable slice starts at an [`ALIGN_BYTES`] boundary
/// (O_DIRECT needs aligned memory), made without unsafe code.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let storage = vec![0x5a_u8; len + ALIGN_BYTES];
        let start = storage.as_ptr().align_offset(ALIGN_BYTES);
        assert!(start < ALIGN_BYTES);
        Self { storage, start, len }
    }

    fn bytes(&self) -> &[u8] {
        let slice = &self.storage[self.start..self.start + self.len];
        assert_eq!(slice.as_ptr() as usize % ALIGN_BYTES, 0);
        slice
    }
}

/// An open probe file and how it is written.
struct ProbeFile {
    file: File,
    mode: WriteMode,
    note: Option<String>,
}

/// Opens (creates, truncates) `path` for O_DIRECT writes, or buffered when
/// the filesystem refuses O_DIRECT at open or at the first aligned write.
fn open_probe_file(path: &Path) -> io::Result<ProbeFile> {
    let open = |flags: i32| {
        OpenOptions::new().write(true).create(true).truncate(true).custom_flags(flags).open(path)
    };
    let refused = match open(libc::O_DIRECT) {
        Ok(file) => {
            let probe = AlignedBuf::new(ALIGN_BYTES);
            match file.write_all_at(probe.bytes(), 0) {
                Ok(()) => return Ok(ProbeFile { file, mode: WriteMode::Direct, note: None }),
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => error,
                Err(error) => return Err(error),
            }
        }
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => error,
        Err(error) => return Err(error),
    };
    let file = open(0)?;
    Ok(ProbeFile {
        file,
        mode: WriteMode::Buffered,
        note: Some(format!(
            "the filesystem refused O_DIRECT ({refused}); buffered writes, so fdatasync \
             also writes the page back"
        )),
    })
}

/// Opens `path` as [`open_probe_file`] and writes `bytes` of zeros (then
/// fdatasync), so later writes overwrite allocated blocks in place.
fn zeroed_probe_file(path: &Path, bytes: u64) -> io::Result<ProbeFile> {
    let probe_file = open_probe_file(path)?;
    let mut zeros = AlignedBuf::new(ZERO_BLOCK_BYTES);
    zeros.storage.fill(0);
    let block = ZERO_BLOCK_BYTES as u64;
    assert_eq!(bytes % block, 0);
    for offset in (0..bytes).step_by(ZERO_BLOCK_BYTES) {
        probe_file.file.write_all_at(zeros.bytes(), offset)?;
    }
    probe_file.file.sync_data()?;
    Ok(probe_file)
}

/// 4 KiB write + fdatasync at sequential offsets of a zeroed file for
/// `duration` (at least one sample), then removes the file.
///
/// # Errors
/// The file cannot be created, written or synced.
pub fn sync_probe(path: &Path, duration: Duration) -> io::Result<SyncProbe> {
    let result = zeroed_probe_file(path, SYNC_FILE_BYTES)
        .and_then(|probe_file| sync_loop(probe_file, duration));
    let _ = fs::remove_file(path);
    result
}

fn sync_loop(probe_file: ProbeFile, duration: Duration) -> io::Result<SyncProbe> {
    let buf = AlignedBuf::new(SYNC_WRITE_BYTES);
    let mut samples = Vec::new();
    let mut offset = 0_u64;
    let start = instant_now();
    loop {
        let began = instant_now();
        probe_file.file.write_all_at(buf.bytes(), offset)?;
        probe_file.file.sync_data()?;
        samples.push(began.elapsed().as_secs_f64() * 1e6);
        offset = (offset + SYNC_WRITE_BYTES as u64) % SYNC_FILE_BYTES;
        if start.elapsed() >= duration || samples.len() >= SYNC_SAMPLES_MAX {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let latency = latency_summary(&mut samples)
        .ok_or_else(|| io::Error::other("no finite sync latency was measured"))?;
    Ok(SyncProbe {
        mode: probe_file.mode,
        note: probe_file.note,
        write_bytes: SYNC_WRITE_BYTES as u64,
        seconds,
        latency,
    })
}

/// A writer thread streaming at a target rate until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<io::Result<WriterProbe>>,
}

impl Writer {
    /// Zeroes a [`WRITER_FILE_BYTES`] file at `path` here (so an error is
    /// returned at once) and starts overwriting it in [`WRITER_BLOCK_BYTES`]
    /// blocks at `target_bytes_per_s`, fdatasync every [`WRITER_SYNC_BYTES`].
    ///
    /// # Errors
    /// The file cannot be created or zeroed, or the thread cannot start.
    pub fn start(path: &Path, target_bytes_per_s: f64) -> io::Result<Self> {
        assert!(target_bytes_per_s.is_finite());
        assert!(target_bytes_per_s > 0.0);
        let probe_file = zeroed_probe_file(path, WRITER_FILE_BYTES)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("spool-plan-writer".to_owned())
            .spawn(move || write_paced(probe_file, target_bytes_per_s, &stop_seen))?;
        Ok(Self { stop, thread })
    }

    /// Stops the writer and returns what it achieved.
    ///
    /// # Errors
    /// A write or sync failed, or the thread panicked.
    pub fn stop(self) -> io::Result<WriterProbe> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().map_err(|_| io::Error::other("the writer thread panicked"))?
    }
}

fn write_paced(
    probe_file: ProbeFile,
    target_bytes_per_s: f64,
    stop: &AtomicBool,
) -> io::Result<WriterProbe> {
    let buf = AlignedBuf::new(WRITER_BLOCK_BYTES);
    let block = WRITER_BLOCK_BYTES as u64;
    let mut written = 0_u64;
    let mut since_sync = 0_u64;
    let start = instant_now();
    while !stop.load(Ordering::Acquire) {
        let due_bytes = target_bytes_per_s * start.elapsed().as_secs_f64();
        if (written as f64) < due_bytes {
            probe_file.file.write_all_at(buf.bytes(), written % WRITER_FILE_BYTES)?;
            written += block;
            since_sync += block;
            if since_sync >= WRITER_SYNC_BYTES {
                probe_file.file.sync_data()?;
                since_sync = 0;
            }
        } else {
            let ahead_s = (written as f64 - due_bytes) / target_bytes_per_s;
            std::thread::sleep(Duration::from_secs_f64(ahead_s).min(WRITER_PAUSE_MAX));
        }
    }
    probe_file.file.sync_data()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(WriterProbe {
        mode: probe_file.mode,
        note: probe_file.note,
        target_bytes_per_s,
        achieved_bytes_per_s: written as f64 / seconds,
        bytes: written,
        seconds,
        block_bytes: block,
        sync_every_bytes: WRITER_SYNC_BYTES,
    })
}

/// The sync probe beside a writer at `target_bytes_per_s`: the writer
/// starts [`WRITER_RAMP`] before the syncs and stops after them. Files go
/// in `dir` and are removed. Skipped when `free_bytes` cannot hold both
/// files plus [`FREE_BYTES_MARGIN`].
pub fn sync_beside_writer(
    dir: &Path,
    duration: Duration,
    target_bytes_per_s: f64,
    free_bytes: Option<u64>,
) -> (Probe<SyncProbe>, Probe<WriterProbe>) {
    let need_bytes = WRITER_FILE_BYTES + SYNC_FILE_BYTES;
    if let Some(free) = free_bytes {
        if free < need_bytes.saturating_add(FREE_BYTES_MARGIN) {
            let reason = format!(
                "the writer and syncs need {need_bytes} bytes plus a {FREE_BYTES_MARGIN}-byte \
                 margin, the filesystem has {free} free"
            );
            return (Probe::Skipped { reason: reason.clone() }, Probe::Skipped { reason });
        }
    }
    let sync_path = dir.join("sync-beside");
    let writer_path = dir.join("writer");
    let result = beside_writer(&sync_path, &writer_path, duration, target_bytes_per_s);
    let _ = fs::remove_file(&sync_path);
    let _ = fs::remove_file(&writer_path);
    result
}

fn beside_writer(
    sync_path: &Path,
    writer_path: &Path,
    duration: Duration,
    target_bytes_per_s: f64,
) -> (Probe<SyncProbe>, Probe<WriterProbe>) {
    let failed = |what: &str, error: io::Error| {
        let reason = format!("{what}: {error}");
        (Probe::Failed { reason: reason.clone() }, Probe::Failed { reason })
    };
    // Both files are zeroed before the writer starts, so the syncs meet
    // the writer's pace alone.
    let sync_file = match zeroed_probe_file(sync_path, SYNC_FILE_BYTES) {
        Ok(file) => file,
        Err(error) => return failed("cannot prepare the sync file", error),
    };
    let writer = match Writer::start(writer_path, target_bytes_per_s) {
        Ok(writer) => writer,
        Err(error) => return failed("cannot start the writer", error),
    };
    std::thread::sleep(WRITER_RAMP);
    let sync = sync_loop(sync_file, duration);
    let writer = writer.stop();
    (sync.into(), writer.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sane(latency: &super::super::LatencyUs) {
        for value in [latency.p50_us, latency.p99_us, latency.max_us] {
            assert!(value.is_finite() && value > 0.0, "{latency:?}");
        }
        assert!(latency.p50_us <= latency.p99_us, "{latency:?}");
        assert!(latency.p99_us <= latency.max_us, "{latency:?}");
        assert!(latency.samples >= 1);
    }

    // Goal: the sync probe runs on a real directory and reports sane figures,
    // leaving nothing behind. Method: 0.2 s in a tempdir.
    #[test]
    fn sync_probe_runs_briefly_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let probe = sync_probe(&dir.path().join("sync"), Duration::from_millis(200)).unwrap();
        sane(&probe.latency);
        assert!(probe.seconds >= 0.2);
        assert_eq!(probe.mode == WriteMode::Buffered, probe.note.is_some());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    // Goal: the writer paces itself near its target and the sync probe beside
    // it reports sane figures. Method: a 4 MiB/s writer (any disk reaches it)
    // beside 0.3 s of syncs; the writer must not overshoot its pace.
    #[test]
    fn writer_paces_and_sync_beside_it_is_sane() {
        let dir = tempfile::tempdir().unwrap();
        let target = 4.0 * 1024.0 * 1024.0;
        let (sync, writer) =
            sync_beside_writer(dir.path(), Duration::from_millis(300), target, None);
        sane(&sync.value().unwrap().latency);
        let writer = writer.value().unwrap().clone();
        assert!(writer.achieved_bytes_per_s.is_finite() && writer.achieved_bytes_per_s > 0.0);
        // One block ahead of the pace at most: 256 KiB over the ≥ 0.5 s it ran.
        assert!(
            writer.achieved_bytes_per_s <= target + 2.0 * WRITER_BLOCK_BYTES as f64,
            "{writer:?}"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    // Goal: a filesystem too full for the writer is a skip, not a filled disk.
    // Method: claim 1 byte free.
    #[test]
    fn writer_skipped_without_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let (sync, writer) =
            sync_beside_writer(dir.path(), Duration::from_millis(100), 1e6, Some(1));
        assert!(matches!(sync, Probe::Skipped { .. }));
        assert!(writer.reason().unwrap().contains("free"));
    }
}
