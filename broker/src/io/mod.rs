//! The storage seam: the only door between the log and the disk.
//!
//! A small trait pair, [`Storage`] (directory operations) and [`StorageFile`]
//! (positional I/O on one file), with owned, page-aligned buffers so an
//! O_DIRECT implementation can hand them to the kernel without a copy. Two
//! implementations:
//!
//! - [`DmaStorage`]: glommio 0.9 `DmaFile` (O_DIRECT through io_uring). This
//!   module is the only part of the log path that names glommio.
//! - [`SimStorage`]: in-memory files that keep *written* and *durable* bytes
//!   apart, build the image a crash would leave (torn at page and sector
//!   granularity), inject errors on the Nth operation and count operations so
//!   a test can crash at every write and sync boundary.
//!
//! This module does not know what a batch, a segment or a commit is; it only
//! moves aligned pages. Futures are `!Send`: Spool is thread-per-core, so the
//! traits use plain `async fn`.

mod dma;
mod sim;
pub mod stats;

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use thiserror::Error;

pub use dma::{DmaSegmentFile, DmaStorage};
pub use glommio::io::DmaBuffer;
pub use sim::{CrashMode, HoldGate, SimBuf, SimFile, SimOp, SimStorage, SplitMix};

/// Which storage operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Open,
    Write,
    Read,
    Sync,
    Len,
    Remove,
    Rename,
    ListDir,
    CreateDir,
    SyncDir,
}

impl fmt::Display for IoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Open => "open",
            Self::Write => "write",
            Self::Read => "read",
            Self::Sync => "fdatasync",
            Self::Len => "file length",
            Self::Remove => "remove",
            Self::Rename => "rename",
            Self::ListDir => "list directory",
            Self::CreateDir => "create directory",
            Self::SyncDir => "sync directory",
        };
        f.write_str(name)
    }
}

/// An I/O failure at the storage edge, naming the operation and the path.
#[derive(Debug, Error)]
#[error("{op} {}{}: {source}", path.display(), IoError::at(*pos))]
pub struct IoError {
    pub op: IoOp,
    pub path: PathBuf,
    /// File position for positional operations.
    pub pos: Option<u64>,
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    pub fn new(op: IoOp, path: &Path, pos: Option<u64>, source: std::io::Error) -> Self {
        Self { op, path: path.to_path_buf(), pos, source }
    }

    /// " at byte N" for a positional operation, nothing otherwise.
    fn at(pos: Option<u64>) -> String {
        pos.map(|pos| format!(" at byte {pos}")).unwrap_or_default()
    }
}

/// An owned, page-aligned buffer the caller fills and then hands to
/// [`StorageFile::write_at`].
pub trait IoBuf: AsRef<[u8]> + AsMut<[u8]> {
    /// Shortens the buffer to `len_bytes` (a page multiple) so a write covers
    /// exactly the pages that were filled.
    fn trim(&mut self, len_bytes: usize);
}

/// Directory-level operations. Paths are absolute or relative to the process
/// working directory; the log passes `dir.join(name)`.
#[allow(async_fn_in_trait)] // thread-per-core: these futures are !Send by design.
pub trait Storage: 'static {
    type File: StorageFile;

    /// Opens `path` for reading and writing, creating it (empty) if missing.
    /// The new name is durable only after [`Storage::sync_dir`] of its parent.
    async fn open(&self, path: &Path) -> Result<Self::File, IoError>;
    async fn remove(&self, path: &Path) -> Result<(), IoError>;
    /// Atomically renames `from` to `to` (replacing `to`); durable after
    /// [`Storage::sync_dir`].
    async fn rename(&self, from: &Path, to: &Path) -> Result<(), IoError>;
    /// File names (not paths) in `dir`, in no particular order.
    async fn list_dir(&self, dir: &Path) -> Result<Vec<String>, IoError>;
    /// Creates `dir` and its missing ancestors; returns the directories it
    /// created, outermost first. Like a file's, a new directory's name is
    /// durable only after [`Storage::sync_dir`] of its parent: use
    /// [`create_dir_durable`], which does that.
    async fn create_dir_all(&self, dir: &Path) -> Result<Vec<PathBuf>, IoError>;
    /// fsyncs the directory itself, making creates, renames and removes in it
    /// durable.
    async fn sync_dir(&self, dir: &Path) -> Result<(), IoError>;
}

/// Creates `dir` (and missing ancestors) and makes each created name
/// durable: the parent of every directory it created is synced, outermost
/// first, before this returns. A directory that already existed costs no
/// sync.
///
/// The seam's rule, which every caller follows: a create, rename or remove
/// of a file or directory is followed by a [`Storage::sync_dir`] of its
/// parent before anything depends on it being durable.
///
/// # Errors
/// Any I/O error of the storage.
pub async fn create_dir_durable<S: Storage>(storage: &S, dir: &Path) -> Result<(), IoError> {
    for created in storage.create_dir_all(dir).await? {
        if let Some(parent) = created.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            storage.sync_dir(parent).await?;
        }
    }
    Ok(())
}

/// [`create_dir_durable`] for many directories at once: all are created
/// first, then each parent that gained a name is synced **once**, outermost
/// first (in the order the creates first touched it). Creating the 5,000
/// partition directories of one queue costs a sync of the queue's directory
/// and of its parent, not 5,000 syncs of the same directory.
///
/// # Errors
/// Any I/O error of the storage; nothing is durable then.
pub async fn create_dirs_durable<S: Storage>(storage: &S, dirs: &[PathBuf]) -> Result<(), IoError> {
    let mut parents: Vec<PathBuf> = Vec::new();
    let mut seen: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    for dir in dirs {
        for created in storage.create_dir_all(dir).await? {
            if let Some(parent) = created.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                if seen.insert(parent.to_path_buf()) {
                    parents.push(parent.to_path_buf());
                }
            }
        }
    }
    for parent in &parents {
        storage.sync_dir(parent).await?;
    }
    Ok(())
}

/// Positional I/O on one open file. Positions and lengths of writes are whole
/// pages ([`crate::limits::PAGE_BYTES`]); implementations assert it.
#[allow(async_fn_in_trait)] // thread-per-core: these futures are !Send by design.
pub trait StorageFile: 'static {
    type Buf: IoBuf;
    type ReadBuf: Deref<Target = [u8]> + 'static;

    /// Allocates a write buffer of `len_bytes` (a page multiple) suitable for
    /// zero-copy O_DIRECT. Its contents are unspecified: fill all of it.
    fn alloc_buf(&self, len_bytes: usize) -> Self::Buf;
    /// Writes all of `buf` at `pos`. The buffer is shared so the caller can
    /// keep reading it (the log's tail cache) while the write is in flight.
    async fn write_at(&self, buf: Rc<Self::Buf>, pos: u64) -> Result<(), IoError>;
    /// Reads up to `len_bytes` at `pos` (both page-aligned). Returns fewer
    /// bytes only at end of file.
    async fn read_at(&self, pos: u64, len_bytes: usize) -> Result<Self::ReadBuf, IoError>;
    /// Makes every completed write to this file durable (data and size).
    async fn fdatasync(&self) -> Result<(), IoError>;
    async fn len_bytes(&self) -> Result<u64, IoError>;
    /// The path the file was opened with (for error messages).
    fn path(&self) -> &Path;
}

/// Asserts the O_DIRECT contract of a write: page-aligned position and length.
pub(crate) fn assert_page_aligned(pos: u64, len_bytes: usize) {
    let page = crate::limits::PAGE_BYTES;
    assert!(pos.is_multiple_of(page), "write position {pos} not page-aligned");
    assert!((len_bytes as u64).is_multiple_of(page), "write length {len_bytes} not page-aligned");
    assert!(len_bytes > 0, "empty write");
}
