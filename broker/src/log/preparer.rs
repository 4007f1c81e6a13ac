//! The segment preparer: zero-fills the next segment under a temporary name
//! once the active one is half full (or an append needs it), so appends
//! overwrite allocated blocks instead of extending the file (DESIGN §8);
//! turns a full disk into refused enqueues while nothing needs the segment;
//! persists the sparse index of each sealed segment.

use std::path::Path;
use std::rc::Rc;

use super::config::LogConfig;
use super::disk::{is_disk_full, prepare_segment_file, write_index_file};
use super::layout::{commit_span, index_path, PREPARED_FILE_NAME};
use super::state::{Segment, Shared, State};
use super::FatalCode;
use crate::io::{IoError, Storage, StorageFile};
use crate::limits::PAGE_BYTES;

/// Prepares the next segment ahead of need and persists sealed indexes.
pub(super) async fn preparer<S: Storage>(shared: Rc<Shared<S>>) {
    enum Step<F> {
        Prepare,
        Seal(Rc<Segment<F>>),
        Wait,
        Exit,
    }
    loop {
        let step = {
            let mut state = shared.state.borrow_mut();
            let draining = state.closing && state.workers_running > 0;
            if state.failed.is_some() {
                Step::Exit
            } else if state.prepared.is_none()
                && !state.renaming
                && (!state.disk_full || state.prepare_retry)
                && (state.roll_waiting || (!state.closing && !draining && wants_next(&state)))
            {
                state.prepare_retry = false;
                Step::Prepare
            } else if let Some(segment) = state.seal_queue.pop_front() {
                Step::Seal(segment)
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
                let capacity = next_prepare_bytes(&shared.config, &shared.state.borrow());
                match prepare_segment_file(&shared.storage, &shared.dir, capacity).await {
                    Ok(file) => {
                        let was_full = {
                            let mut state = shared.state.borrow_mut();
                            state.prepared = Some((Rc::new(file), capacity));
                            state.first_segment_wanted = false;
                            std::mem::take(&mut state.disk_full)
                        };
                        if was_full {
                            tracing::info!(dir = %shared.dir.display(), "disk space is back: next segment prepared");
                        }
                        shared.prepared.notify_all();
                        // An append may wait in `writable` for this file.
                        shared.space.notify_all();
                    }
                    Err(error) if is_disk_full(&error) && disk_full_is_safe(&shared) => {
                        // Nothing gathered needs the segment yet: refuse
                        // data appends until a retry succeeds instead of
                        // stopping the process. The partial file would
                        // hold the space a retry needs.
                        let prepared_path = shared.dir.join(PREPARED_FILE_NAME);
                        if let Err(remove) = shared.storage.remove(&prepared_path).await {
                            tracing::warn!(%remove, "removing the partial next segment failed");
                        }
                        let first =
                            !std::mem::replace(&mut shared.state.borrow_mut().disk_full, true);
                        if first {
                            tracing::warn!(dir = %shared.dir.display(), %error,
                                "disk full: cannot prepare the next segment; refusing enqueues");
                        }
                        shared.space.notify_all();
                    }
                    Err(error) => {
                        shared.fail(FatalCode::PrepareFailed, &error);
                        return;
                    }
                }
            }
            Step::Seal(segment) => {
                if let Err(error) = persist_index(&shared.storage, &shared.dir, &segment).await {
                    // The index is an accelerator: recovery rebuilds it. A
                    // file whose write or sync failed is never trusted:
                    // removed (best effort; recovery also checks an index
                    // file's crc and extents before using it).
                    tracing::warn!(%error, segment = segment.base, "index persist failed; discarding the file");
                    let path = index_path(&shared.dir, segment.base);
                    if let Err(error) = shared.storage.remove(&path).await {
                        tracing::warn!(%error, path = %path.display(), "discarding the index file failed");
                    }
                }
            }
        }
    }
}

/// Whether a failed preparation can become "disk full" instead of fatal: no
/// gather has started the segment it was for (those commits are applied
/// and must reach the disk, so the log stops as for any write failure).
fn disk_full_is_safe<S: Storage>(shared: &Shared<S>) -> bool {
    let state = shared.state.borrow();
    state.rolls_pending.is_empty() && !state.roll_waiting
}

/// Whether the preparer should make the next segment now: a gather already
/// started it, or the segment being filled is past
/// [`LogConfig::prepare_at_bytes`]. A log without a zero-filled segment
/// prepares its first one only when an append needs it.
pub(super) fn wants_next<F: StorageFile>(state: &State<F>) -> bool {
    if !state.rolls_pending.is_empty() || state.first_segment_wanted {
        return true;
    }
    // The pages the open gather will occupy count as filled.
    let fill = state
        .open
        .as_ref()
        .map_or(state.gather_pos, |gather| gather.pos + commit_span(gather.data_bytes));
    LogConfig::prepare_at_bytes(state.gather_segment.capacity).is_some_and(|at| fill >= at)
}

/// Size of the next file to prepare: the segment the oldest pending roll
/// will name, else the planned successor of the segment being filled (a
/// commit that turns out larger zero-fills the rest at its roll).
fn next_prepare_bytes<F: StorageFile>(config: &LogConfig, state: &State<F>) -> u64 {
    match state.rolls_pending.front() {
        Some(capacity) => *capacity,
        None => config.next_segment_bytes(state.gather_segment.capacity, PAGE_BYTES),
    }
}

/// Writes a sealed segment's sparse index file (write, sync, dir sync).
pub(super) async fn persist_index<S: Storage>(
    storage: &S,
    dir: &Path,
    segment: &Segment<S::File>,
) -> Result<(), IoError> {
    let bytes = segment.index.borrow().encode(
        segment.base,
        segment.data_end.get(),
        segment.next_offset.get(),
    );
    write_index_file(storage, dir, segment.base, &bytes).await
}
