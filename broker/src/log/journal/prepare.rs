//! Making journal files: zero-filled under the temporary name `next.prep`,
//! synced, and only then renamed to their position's name (commits
//! overwrite pre-written blocks, never extend a file); the preparer task
//! that keeps one ready, and what it does when the disk is full.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::appender::Shared;
use super::layout::{journal_file_path, JOURNAL_PREPARED_NAME};
use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::limits::{PAGE_BYTES, ZERO_FILL_CHUNK_BYTES};
use crate::log::{failpoint, FatalCode};

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

/// Whether an I/O error means the file system is out of space.
fn is_disk_full(error: &IoError) -> bool {
    error.source.kind() == std::io::ErrorKind::StorageFull
        || error.source.raw_os_error() == Some(libc::ENOSPC)
}

/// Keeps one zero-filled `next.prep` ready for the next roll.
pub(super) async fn preparer<S: Storage>(shared: Rc<Shared<S>>) {
    enum Step {
        Prepare,
        Wait,
        Exit,
    }
    loop {
        let step = {
            let state = shared.state.borrow();
            if state.failed.is_some() {
                Step::Exit
            } else if state.prepared.is_none()
                && !state.renaming
                && (state.roll_waiting || !state.closing)
                && (!state.disk_full || state.retry_asked)
            {
                Step::Prepare
            } else if state.closing && state.workers_running == 0 {
                Step::Exit
            } else {
                Step::Wait
            }
        };
        match step {
            Step::Exit => return,
            Step::Wait => shared.prepare.wait().await,
            Step::Prepare => {
                let len_bytes = {
                    let mut state = shared.state.borrow_mut();
                    state.retry_asked = false;
                    state.next_len
                };
                match prepare_file(&shared.storage, &shared.dir, len_bytes).await {
                    Ok(file) => {
                        let was_full = {
                            let mut state = shared.state.borrow_mut();
                            // A commit placed meanwhile took this length.
                            debug_assert_eq!(state.next_len, len_bytes);
                            state.prepared = Some((Rc::new(file), len_bytes));
                            state.stats.files_prepared += 1;
                            std::mem::replace(&mut state.disk_full, false)
                        };
                        if was_full {
                            tracing::info!(dir = %shared.dir.display(),
                                "disk space is back: the next journal file is prepared; \
                                 data is accepted again");
                        }
                        shared.prepared.notify_all();
                    }
                    Err(error) if is_disk_full(&error) => {
                        // Out of space: give back what the attempt took
                        // (the partial file is never part of the journal)
                        // and refuse data until a retry succeeds.
                        let prep = shared.dir.join(JOURNAL_PREPARED_NAME);
                        if let Err(error) = shared.storage.remove(&prep).await {
                            tracing::warn!(path = %prep.display(), %error,
                                "could not remove the partial next journal file");
                        }
                        let _ = shared.storage.sync_dir(&shared.dir).await;
                        let first = {
                            let mut state = shared.state.borrow_mut();
                            state.stats.prepares_disk_full += 1;
                            // The next try asks for less, unless a commit
                            // already sits in the next file at this length.
                            if state.placed.is_empty() {
                                let least = shared.config.commit_span_max();
                                state.next_len = (state.next_len / 2 / PAGE_BYTES * PAGE_BYTES)
                                    .max(least)
                                    .min(shared.config.file_bytes);
                            }
                            !std::mem::replace(&mut state.disk_full, true)
                        };
                        if first {
                            tracing::warn!(dir = %shared.dir.display(), %error,
                                file_bytes = len_bytes,
                                "disk full: the next journal file cannot be prepared; data is \
                                 refused (DISK_FULL) until a smaller one fits (down to one \
                                 commit), acks and claims go on in the current file");
                        }
                    }
                    Err(error) => {
                        shared.fail(FatalCode::PrepareFailed, &error);
                        return;
                    }
                }
            }
        }
    }
}
