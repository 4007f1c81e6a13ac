//! File operations the appender's parts and recovery share: failpoints,
//! the disk-full test, preparing (zero-filling) a segment file, and writing
//! an index file. Depends on nothing else of the log, so recovery and the
//! appender both use it without depending on each other.

use std::path::Path;
use std::rc::Rc;

use super::layout::{index_path, PREPARED_FILE_NAME};
use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::limits::ZERO_FILL_CHUNK_BYTES;

/// Evaluates failpoint `point` (see `crate::failpoint`) as a failure of
/// `op` on `path`: `Ok` unless the point is armed with `error`.
pub(crate) fn failpoint(
    point: &str,
    op: IoOp,
    path: &Path,
    pos: Option<u64>,
) -> Result<(), IoError> {
    crate::failpoint::eval(point).map_err(|error| IoError::new(op, path, pos, error))
}

/// Whether an I/O error means the file system is out of space.
pub(super) fn is_disk_full(error: &IoError) -> bool {
    error.source.kind() == std::io::ErrorKind::StorageFull
        || error.source.raw_os_error() == Some(libc::ENOSPC)
}

/// Creates the prepared file, writes zeros through all of it, syncs it and
/// its directory. Appends then overwrite allocated blocks (DESIGN §8).
pub(super) async fn prepare_segment_file<S: Storage>(
    storage: &S,
    dir: &Path,
    capacity: u64,
) -> Result<S::File, IoError> {
    let file = storage.open(&dir.join(PREPARED_FILE_NAME)).await?;
    zero_fill(&file, 0, capacity).await?;
    failpoint("log.prepare.sync", IoOp::Sync, file.path(), None)?;
    file.fdatasync().await?;
    failpoint("log.prepare.dir_sync", IoOp::SyncDir, dir, None)?;
    storage.sync_dir(dir).await?;
    Ok(file)
}

/// Writes zeros over `[from, to)` of `file` (page-aligned), in chunks of
/// `ZERO_FILL_CHUNK_BYTES`. The caller syncs.
pub(super) async fn zero_fill<F: StorageFile>(file: &F, from: u64, to: u64) -> Result<(), IoError> {
    let chunk = ZERO_FILL_CHUNK_BYTES.min(to.saturating_sub(from));
    if chunk == 0 {
        return Ok(());
    }
    let mut zeros = file.alloc_buf(chunk as usize);
    zeros.as_mut().fill(0);
    let zeros = Rc::new(zeros);
    let mut pos = from;
    while pos + chunk <= to {
        failpoint("log.prepare.write", IoOp::Write, file.path(), Some(pos))?;
        file.write_at(zeros.clone(), pos).await?;
        pos += chunk;
    }
    if pos < to {
        let mut rest = file.alloc_buf((to - pos) as usize);
        rest.as_mut().fill(0);
        failpoint("log.prepare.write", IoOp::Write, file.path(), Some(pos))?;
        file.write_at(Rc::new(rest), pos).await?;
    }
    Ok(())
}

pub(super) async fn write_index_file<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
    bytes: &[u8],
) -> Result<(), IoError> {
    let file = storage.open(&index_path(dir, base)).await?;
    let mut buf = file.alloc_buf(bytes.len());
    buf.as_mut().copy_from_slice(bytes);
    failpoint("log.index.write", IoOp::Write, file.path(), Some(0))?;
    file.write_at(Rc::new(buf), 0).await?;
    failpoint("log.index.sync", IoOp::Sync, file.path(), None)?;
    file.fdatasync().await?;
    storage.sync_dir(dir).await
}
