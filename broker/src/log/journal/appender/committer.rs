//! A committer task of a journal: takes the next commit job (`build.rs`
//! builds it), rolls to the next file when the job opens one — once every
//! earlier commit is durable, naming the prepared `next.prep` — writes the
//! commit, syncs it and marks it synced, advancing the durable watermark
//! over the contiguous synced prefix and resolving those tickets; any
//! failure is fatal to the journal. The appender runs one per in-flight
//! commit slot; what a job holds is the appender's (`appender/mod.rs`).
//!
//! What it must not do: choose what a commit holds or where it goes (the
//! builder did), make the next file (the preparer's, `preparer.rs`), or
//! resolve a ticket before every commit before it is durable.

use std::rc::Rc;

use super::{Job, JournalFile, Shared};
use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::log::disk::failpoint;
use crate::log::journal::layout::journal_file_path;
use crate::log::journal::prepare::name_prepared;
use crate::log::journal::read_cache::{CachedCommit, FileSlot};
use crate::log::journal::EntryStatus;
use crate::log::FatalCode;

/// Failpoints around a commit's write and sync (`crate::failpoint`).
const COMMIT_POINTS: [&str; 4] = [
    "journal.commit.write",
    "journal.commit.write.after",
    "journal.commit.sync",
    "journal.commit.sync.after",
];
/// Failpoints around a witness entry's write and sync.
const WITNESS_POINTS: [&str; 4] = [
    "journal.witness.write",
    "journal.witness.write.after",
    "journal.witness.sync",
    "journal.witness.sync.after",
];

/// One committer: build a commit, (roll,) write it, sync it, mark it synced.
pub(super) async fn committer<S: Storage>(shared: Rc<Shared<S>>) {
    loop {
        let Some(job) = shared.next_job().await else { break };
        if job.opens_file && !shared.roll(&job).await {
            break;
        }
        let Some(file) = shared.wait_named(&job.file).await else { break };
        let offset = job.pos - job.file.base;
        // A witness and a commit have failpoints of their own around the
        // write and the sync; a failure is fatal either way.
        let names = if job.witness { WITNESS_POINTS } else { COMMIT_POINTS };
        let point = |index: usize, op: IoOp, pos: Option<u64>| {
            failpoint(names[index], op, file.path(), pos)
        };
        let written = async {
            point(0, IoOp::Write, Some(offset))?;
            file.write_at(job.buf.clone(), offset).await?;
            point(1, IoOp::Write, Some(offset))
        };
        if let Err(error) = written.await {
            shared.fail(FatalCode::WriteFailed, &error);
            break;
        }
        if shared.is_failed() {
            break;
        }
        let synced = async {
            point(2, IoOp::Sync, None)?;
            file.fdatasync().await?;
            point(3, IoOp::Sync, None)
        };
        if let Err(error) = synced.await {
            shared.fail(FatalCode::SyncFailed, &error);
            break;
        }
        shared.mark_synced(job.seq);
    }
    shared.state.borrow_mut().workers_running -= 1;
    shared.prepare.notify_all();
}

impl<S: Storage> Shared<S> {
    /// Marks `seq` synced and advances the durable watermark over the
    /// contiguous synced prefix, resolving those entries' tickets.
    fn mark_synced(&self, seq: u64) {
        let mut resolved = Vec::new();
        {
            let mut state = self.state.borrow_mut();
            if state.failed.is_some() {
                return;
            }
            match state.inflight.get_mut(&seq) {
                Some(commit) => commit.synced = true,
                None => unreachable!("synced commit {seq} is not in flight"),
            }
            while let Some(entry) = state.inflight.first_entry() {
                if !entry.get().synced {
                    break;
                }
                let (seq, done) = entry.remove_entry();
                assert_eq!(seq, state.durable_seq + 1, "durable watermark must be contiguous");
                assert!(done.end_pos > state.durable_pos);
                state.durable_seq = seq;
                state.durable_pos = done.end_pos;
                if done.witness {
                    // Holds no entry: not cached, not a commit to observe.
                    state.stats.witnesses += 1;
                    continue;
                }
                state.entries_end = done.end_pos;
                state.stats.commits += 1;
                state.stats.control_entries += done.control_entries;
                state.stats.data_entries += done.data_entries;
                state.stats.commit_bytes += done.span;
                if let Some(observer) = &*self.observer.borrow() {
                    observer.durable(seq, done.span);
                }
                resolved.extend(done.cells);
                let cache_max = self.config.read_cache_bytes;
                if done.span <= cache_max {
                    state.cache.push_back(CachedCommit { pos: done.pos, buf: done.buf });
                    state.cache_bytes += done.span;
                    while state.cache_bytes > cache_max {
                        let Some(old) = state.cache.pop_front() else { break };
                        state.cache_bytes -= old.buf.as_ref().as_ref().len() as u64;
                    }
                }
            }
        }
        for cell in resolved {
            cell.resolve(EntryStatus::Durable);
        }
        self.durable.notify_all();
        // Commits left the in-flight map: a committer held by the bound may
        // build the next one.
        self.wants.work.notify_all();
    }

    /// Names the prepared file for `job`'s new file once every earlier
    /// commit is durable. False when the journal failed.
    async fn roll(&self, job: &Job<S::File>) -> bool {
        loop {
            {
                let state = self.state.borrow();
                if state.failed.is_some() {
                    return false;
                }
                if state.durable_seq + 1 == job.seq {
                    break;
                }
            }
            self.durable.wait().await;
        }
        let prepared = loop {
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return false;
                }
                if let Some((file, len_bytes)) = state.prepared.take() {
                    state.roll_waiting = false;
                    state.renaming = true;
                    let placed = state.placed.pop_front();
                    if placed != Some(len_bytes) || len_bytes != job.file.len_bytes {
                        drop(state);
                        let reason = format!(
                            "the prepared journal file has {len_bytes} bytes, the commit was \
                             placed in one of {} (placed {placed:?}): not rolled",
                            job.file.len_bytes
                        );
                        let error = IoError::new(
                            IoOp::Rename,
                            &self.dir,
                            None,
                            std::io::Error::other(reason),
                        );
                        self.fail(FatalCode::RollFailed, &error);
                        return false;
                    }
                    // The file after this one: as placed, else the full size.
                    state.next_len =
                        state.placed.front().copied().unwrap_or(self.config.file_bytes);
                    break file;
                }
                state.roll_waiting = true;
            }
            self.prepare.notify_all();
            self.prepared.wait().await;
        };
        let named = async {
            let path = name_prepared(&self.storage, &self.dir, job.file.base).await?;
            drop(prepared);
            self.storage.open(&path).await
        };
        let file = match named.await {
            Ok(file) => Rc::new(file),
            Err(error) => {
                self.fail(FatalCode::RollFailed, &error);
                return false;
            }
        };
        {
            let mut state = self.state.borrow_mut();
            state.renaming = false;
            let path = journal_file_path(&self.dir, job.file.base);
            state.files.insert(
                job.file.base,
                FileSlot { path, file: Some(file.clone()), len_bytes: Some(job.file.len_bytes) },
            );
            *job.file.file.borrow_mut() = Some(file.clone());
            state.alloc_file = file;
            state.stats.files_rolled += 1;
        }
        self.named.notify_all();
        self.prepare.notify_all();
        true
    }

    async fn wait_named(&self, file: &JournalFile<S::File>) -> Option<Rc<S::File>> {
        loop {
            if self.is_failed() {
                return None;
            }
            if let Some(file) = file.file.borrow().clone() {
                return Some(file);
            }
            self.named.wait().await;
        }
    }
}
