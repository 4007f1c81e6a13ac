//! A committer task of a journal: takes the next commit job, rolls to the
//! next file when the job opens one, writes the commit, syncs it and marks
//! it durable; any failure is fatal to the journal. The appender runs one
//! per in-flight commit slot; what a job holds is the appender's
//! (`appender/mod.rs`).

use std::rc::Rc;

use super::Shared;
use crate::io::{IoOp, Storage, StorageFile};
use crate::log::disk::failpoint;
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
