//! The preparer task of a journal: keeps one zero-filled `next.prep` ready
//! for the next roll (`prepare.rs` makes it), and when the disk is full
//! gives back the partial file, asks for a smaller one next time and
//! refuses data until one fits. It reads and changes the appender's shared
//! state; it writes no journal entry.

use std::rc::Rc;

use super::Shared;
use crate::io::{IoError, Storage};
use crate::limits::PAGE_BYTES;
use crate::log::journal::layout::JOURNAL_PREPARED_NAME;
use crate::log::journal::prepare::prepare_file;
use crate::log::FatalCode;

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
