//! Making journal files: zero-filled under the temporary name `next.prep`,
//! synced, and only then renamed to their position's name (commits
//! overwrite pre-written blocks, never extend a file). The task that keeps
//! one ready is the appender's (`appender/preparer.rs`).

use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::layout::{journal_file_path, JOURNAL_PREPARED_NAME};
use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::limits::ZERO_FILL_CHUNK_BYTES;
use crate::log::failpoint;

/// Creates `next.prep`, writes zeros through `len_bytes` of it, fdatasyncs
/// it and syncs the directory (its name is then durable, so a crash leaves
/// it for recovery to delete rather than an unnamed inode).
pub(super) async fn prepare_file<S: Storage>(
    storage: &S,
    dir: &Path,
    len_bytes: u64,
) -> Result<S::File, IoError> {
    let file = storage.open(&dir.join(JOURNAL_PREPARED_NAME)).await?;
    zero_fill(&file, len_bytes).await?;
    failpoint("journal.prepare.sync", IoOp::Sync, file.path(), None)?;
    file.fdatasync().await?;
    failpoint("journal.prepare.dir_sync", IoOp::SyncDir, dir, None)?;
    storage.sync_dir(dir).await?;
    Ok(file)
}

/// Gives the prepared file the name of journal position `base` and syncs
/// the directory: from here on the file is part of the journal. Returns the
/// new path; the caller opens the file again under it (a handle keeps the
/// path it was opened with, and errors must name the journal file).
pub(super) async fn name_prepared<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
) -> Result<PathBuf, IoError> {
    let path = journal_file_path(dir, base);
    failpoint("journal.roll.rename", IoOp::Rename, &path, None)?;
    storage.rename(&dir.join(JOURNAL_PREPARED_NAME), &path).await?;
    failpoint("journal.roll.dir_sync", IoOp::SyncDir, dir, None)?;
    storage.sync_dir(dir).await?;
    failpoint("journal.roll.dir_sync.after", IoOp::SyncDir, dir, None)?;
    Ok(path)
}

/// Writes zeros over `[0, len_bytes)` in chunks of `ZERO_FILL_CHUNK_BYTES`.
async fn zero_fill<F: StorageFile>(file: &F, len_bytes: u64) -> Result<(), IoError> {
    let chunk = ZERO_FILL_CHUNK_BYTES.min(len_bytes);
    let mut zeros = file.alloc_buf(chunk as usize);
    zeros.as_mut().fill(0);
    let zeros = Rc::new(zeros);
    let mut pos = 0;
    while pos + chunk <= len_bytes {
        failpoint("journal.prepare.write", IoOp::Write, file.path(), Some(pos))?;
        file.write_at(zeros.clone(), pos).await?;
        pos += chunk;
    }
    if pos < len_bytes {
        let mut rest = file.alloc_buf((len_bytes - pos) as usize);
        rest.as_mut().fill(0);
        file.write_at(Rc::new(rest), pos).await?;
    }
    Ok(())
}
