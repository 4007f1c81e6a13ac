//! [`DmaStorage`]: the production storage on glommio 0.9 `DmaFile`
//! (O_DIRECT, io_uring). Buffers come from `DmaFile::alloc_dma_buffer`, so a
//! commit is written from the very memory the appender copied batches into.
//! Directory listing and creation use std (blocking, but only at open and
//! retention); directory sync uses glommio's `Directory::sync`.
//!
//! glommio quirk handled here: the first DMA open on a device probes io_uring
//! IOPOLL support with a read, and caches the answer per thread and device.
//! When that first file is empty the probe read "succeeds" at EOF, IOPOLL is
//! wrongly enabled, and every later read on the device fails with
//! EOPNOTSUPP (seen on virtio). [`prime_iopoll_probe`] makes the first open
//! on each device hit a non-empty file. Executors should also run with
//! `io_memory(0)` on such hosts: registered-buffer reads failed the same way.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};

use super::{assert_page_aligned, IoBuf, IoError, IoOp, Storage, StorageFile};

/// Storage on real files with O_DIRECT. Must be used inside a glommio
/// executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct DmaStorage;

/// glommio's page-aligned DMA buffer is the write buffer: `write_rc_at`
/// takes it shared, so the tail cache can keep reading it.
impl IoBuf for DmaBuffer {
    fn trim(&mut self, len_bytes: usize) {
        assert!(len_bytes <= self.len());
        self.trim_to_size(len_bytes);
    }
}

/// The bytes of one read. A zero-length read never reaches glommio: 0.9
/// panics on the executor ("Buffer allocation failed") when asked for a
/// zero-byte buffer, and an empty side or index file left by a crash
/// between its create and its first write is asked for exactly that.
pub enum DmaRead {
    Read(ReadResult),
    Empty,
}

impl std::ops::Deref for DmaRead {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            DmaRead::Read(read) => read,
            DmaRead::Empty => &[],
        }
    }
}

/// One open O_DIRECT file.
pub struct DmaSegmentFile {
    file: DmaFile,
    path: PathBuf,
}

fn to_io(error: glommio::GlommioError<()>) -> std::io::Error {
    error.into()
}

thread_local! {
    /// Devices (st_dev) whose IOPOLL probe this thread already ran on data.
    static PRIMED_DEVICES: RefCell<BTreeSet<u64>> = const { RefCell::new(BTreeSet::new()) };
}

const PROBE_FILE_NAME: &str = ".spool-dma-probe";

/// Runs glommio's per-device IOPOLL probe against a one-page file, once per
/// thread and device, so the cached answer is truthful (see module doc).
async fn prime_iopoll_probe(path: &Path) -> Result<(), IoError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let io_error = |error| IoError::new(IoOp::Open, dir, None, error);
    let device = std::fs::metadata(dir).map_err(io_error)?.dev();
    if PRIMED_DEVICES.with(|primed| primed.borrow().contains(&device)) {
        return Ok(());
    }
    let probe = dir.join(PROBE_FILE_NAME);
    if let Err(error) = std::fs::write(&probe, vec![0u8; crate::limits::PAGE_BYTES as usize]) {
        let _ = std::fs::remove_file(&probe);
        // No room for the probe (a full disk). A file that already holds a
        // page answers glommio's probe as truthfully as the probe file
        // would, so opening it first is safe (reads of a checkpoint, say,
        // which recovery needs before it can make room); an empty or new
        // file is not, so its open fails as the probe did. Nothing is
        // marked primed: the next open tries the probe again.
        let holds_a_page =
            std::fs::metadata(path).is_ok_and(|meta| meta.len() >= crate::limits::PAGE_BYTES);
        if holds_a_page {
            tracing::debug!(dir = %dir.display(), %error,
                "iopoll probe not written; the file opened holds data and probes instead");
            return Ok(());
        }
        return Err(io_error(error));
    }
    let opened = OpenOptions::new().read(true).dma_open(&probe).await;
    let removed = std::fs::remove_file(&probe);
    let file = opened.map_err(|error| IoError::new(IoOp::Open, &probe, None, to_io(error)))?;
    file.close().await.map_err(|error| IoError::new(IoOp::Open, &probe, None, to_io(error)))?;
    removed.map_err(io_error)?;
    PRIMED_DEVICES.with(|primed| primed.borrow_mut().insert(device));
    Ok(())
}

impl Storage for DmaStorage {
    type File = DmaSegmentFile;

    async fn open(&self, path: &Path) -> Result<DmaSegmentFile, IoError> {
        prime_iopoll_probe(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .dma_open(path)
            .await
            .map_err(|error| IoError::new(IoOp::Open, path, None, to_io(error)))?;
        Ok(DmaSegmentFile { file, path: path.to_path_buf() })
    }

    async fn remove(&self, path: &Path) -> Result<(), IoError> {
        glommio::io::remove(path)
            .await
            .map_err(|error| IoError::new(IoOp::Remove, path, None, to_io(error)))
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), IoError> {
        glommio::io::rename(from, to)
            .await
            .map_err(|error| IoError::new(IoOp::Rename, from, None, to_io(error)))
    }

    async fn list_dir(&self, dir: &Path) -> Result<Vec<String>, IoError> {
        let io_error = |error| IoError::new(IoOp::ListDir, dir, None, error);
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_error)? {
            let entry = entry.map_err(io_error)?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    async fn create_dir_all(&self, dir: &Path) -> Result<Vec<PathBuf>, IoError> {
        let io_error = |error| IoError::new(IoOp::CreateDir, dir, None, error);
        let mut missing: Vec<&Path> = dir
            .ancestors()
            .filter(|ancestor| !ancestor.as_os_str().is_empty())
            .take_while(|ancestor| !ancestor.is_dir())
            .collect();
        missing.reverse();
        let mut created = Vec::with_capacity(missing.len());
        for ancestor in missing {
            match std::fs::create_dir(ancestor) {
                // Made meanwhile by another shard, which may not have synced
                // its parent yet: counted as created, so ours is synced too.
                Ok(()) => created.push(ancestor.to_path_buf()),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    created.push(ancestor.to_path_buf());
                }
                Err(error) => return Err(io_error(error)),
            }
        }
        Ok(created)
    }

    async fn sync_dir(&self, dir: &Path) -> Result<(), IoError> {
        // glommio 0.9's `Directory::open` fails with EBADF on a relative
        // path; resolve it here so no caller can trip over that again.
        let dir = &std::path::absolute(dir)
            .map_err(|error| IoError::new(IoOp::SyncDir, dir, None, error))?;
        let io_error = |error| IoError::new(IoOp::SyncDir, dir, None, to_io(error));
        let directory = glommio::io::Directory::open(dir).await.map_err(io_error)?;
        directory.sync().await.map_err(io_error)?;
        directory.close().await.map_err(io_error)
    }
}

impl StorageFile for DmaSegmentFile {
    type Buf = DmaBuffer;
    type ReadBuf = DmaRead;

    fn alloc_buf(&self, len_bytes: usize) -> DmaBuffer {
        assert_page_aligned(0, len_bytes);
        self.file.alloc_dma_buffer(len_bytes)
    }

    async fn write_at(&self, buf: Rc<DmaBuffer>, pos: u64) -> Result<(), IoError> {
        let len = buf.len();
        assert_page_aligned(pos, len);
        let _in_flight = super::stats::InFlight::begin();
        let written = self
            .file
            .write_rc_at(buf, pos)
            .await
            .map_err(|error| IoError::new(IoOp::Write, &self.path, Some(pos), to_io(error)))?;
        if written != len {
            let short = std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write: {written} of {len} bytes"),
            );
            return Err(IoError::new(IoOp::Write, &self.path, Some(pos), short));
        }
        super::stats::record_write(len);
        Ok(())
    }

    async fn read_at(&self, pos: u64, len_bytes: usize) -> Result<DmaRead, IoError> {
        assert!(pos.is_multiple_of(crate::limits::PAGE_BYTES));
        if len_bytes == 0 {
            return Ok(DmaRead::Empty);
        }
        let read = self
            .file
            .read_at_aligned(pos, len_bytes)
            .await
            .map_err(|error| IoError::new(IoOp::Read, &self.path, Some(pos), to_io(error)))?;
        super::stats::record_read_bytes(read.len());
        Ok(DmaRead::Read(read))
    }

    async fn fdatasync(&self) -> Result<(), IoError> {
        let started = crate::clock::instant_now();
        let _in_flight = super::stats::InFlight::begin();
        self.file
            .fdatasync()
            .await
            .map_err(|error| IoError::new(IoOp::Sync, &self.path, None, to_io(error)))?;
        super::stats::record_sync(crate::clock::instant_now().duration_since(started));
        Ok(())
    }

    async fn len_bytes(&self) -> Result<u64, IoError> {
        self.file
            .file_size()
            .await
            .map_err(|error| IoError::new(IoOp::Len, &self.path, None, to_io(error)))
    }

    fn path(&self) -> &Path {
        &self.path
    }
}
