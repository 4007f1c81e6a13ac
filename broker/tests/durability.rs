//! Durability rules of the partition's files on the simulated disk: every
//! name change is followed by a sync of its directory, a failed checkpoint
//! sync is fatal and never retried, and a close waits for a running
//! checkpoint. (What journal recovery keeps is synced before it is served:
//! `journal_crash.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod common;
mod partition_layout;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::{FatalCode, LogConfig, RecordFatal};
use spool_broker::partition::{Clock, OpenReport, Partition, PartitionName};
use spool_broker::queue::{PartitionId, QueueConfig, QueueId};
use spool_wire::batch::BatchBytes;

const START_MS: u64 = 1_700_000_000_000;
const DIR: &str = "/data/q1/p0";

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    common::run_glommio(future)
}

fn small_log() -> LogConfig {
    LogConfig { segment_bytes: 8 << 20, ..LogConfig::default() }
}

fn clock() -> Clock {
    Rc::new(|| START_MS)
}

fn batch(first: u8, count: u8) -> BatchBytes {
    common::id_batch(&(first..first + count).collect::<Vec<u8>>(), START_MS)
}

type Opened = (Rc<Partition<SimStorage>>, glommio::task::JoinHandle<()>, OpenReport);

async fn open(disk: &SimStorage, fatal: Rc<RecordFatal>) -> Opened {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let (partition, background, report) = open_partition(
        Layout::Journal,
        disk.clone(),
        Path::new(DIR),
        name,
        QueueConfig::default(),
        small_log(),
        fatal,
        clock(),
    )
    .await
    .expect("open");
    let task = glommio::spawn_local(background.into_future()).detach();
    (partition, task, report)
}

async fn close((partition, task, _): Opened) {
    partition.close().await.expect("close");
    task.await;
}

/// Waits until the partition's shard journal has prepared its next file
/// and, after `commits` commits, written the witness entry of the idle
/// journal: no sync of the journal's own is pending.
async fn settle(partition: &Partition<SimStorage>, commits: bool) {
    let journal = partition.log().journal().shard().journal();
    while (commits && journal.stats().witnesses < 1) || !journal.next_file_prepared() {
        futures_lite::future::yield_now().await;
    }
}

fn messages(partition: &Partition<SimStorage>) -> usize {
    partition.with_state(|state| state.messages()).len()
}

// Goal (issue 14, item 4): every create, rename and remove of a partition's
// files and directories is followed by a sync of its parent, so a power
// loss cannot drop a name an acknowledged write lives under — the
// partition directory (and the directories above it that its open
// created) included. Method: open a partition on an empty disk, enqueue,
// checkpoint; after each step no directory may have unsynced name changes
// (the simulator tracks them); the directories above the partition were
// synced; a power-loss image opens with every acknowledged message.
#[test]
fn every_name_change_is_followed_by_a_sync_of_its_directory() {
    run(async {
        let disk = SimStorage::new();
        let opened = open(&disk, Rc::new(RecordFatal::default())).await;
        // The journal's next file is zero-filled in the background under
        // `next.prep`, a name it syncs once the file is whole: a name that
        // is never part of the journal (recovery deletes it).
        settle(&opened.0, false).await;
        assert_eq!(disk.dirty_dirs(), Vec::<PathBuf>::new(), "after open");
        let synced = disk.synced_dirs();
        for parent in ["/", "/data", "/data/q1", "/data/q1/p0/shard"] {
            assert!(synced.contains(&PathBuf::from(parent)), "{parent} never synced: {synced:?}");
        }
        opened.0.enqueue(&batch(1, 3)).await.unwrap();
        assert_eq!(disk.dirty_dirs(), Vec::<PathBuf>::new(), "after the first enqueue");
        opened.0.checkpoint().await.unwrap().expect("written");
        assert_eq!(disk.dirty_dirs(), Vec::<PathBuf>::new(), "after a checkpoint");
        let image = disk.crash_image(CrashMode::DurableOnly);
        let reopened = open(&image, Rc::new(RecordFatal::default())).await;
        assert_eq!(messages(&reopened.0), 3, "acknowledged messages after a power loss");
        close(reopened).await;
        close(opened).await;
    });
}

// Goal (issue 14, item 5): a failed fdatasync of a checkpoint is never
// retried — after it the kernel may have dropped the pages, so a later
// "successful" sync proves nothing: the fatal handler is told (production
// exits) and the partition tries no checkpoint again, neither on the
// housekeeping tick (`checkpoint_due`) nor on demand. Method: fail the
// checkpoint's fdatasync on the simulator, then check the handler, the due
// flag and that a second checkpoint touches the disk no more.
#[test]
fn a_failed_checkpoint_sync_is_fatal_and_never_retried() {
    run(async {
        let disk = SimStorage::new();
        let fatal = Rc::new(RecordFatal::default());
        let opened = open(&disk, fatal.clone()).await;
        opened.0.enqueue(&batch(1, 3)).await.unwrap();
        // The idle journal's witness entry and its next file are synced
        // first: the sync that fails is the checkpoint's.
        settle(&opened.0, true).await;
        disk.inject_failure(IoOp::Sync, 1);
        let error = opened.0.checkpoint().await.expect_err("the sync failed");
        let reasons = fatal.reasons();
        assert_eq!(reasons.len(), 1, "{error}: {reasons:?}");
        assert_eq!(reasons[0].code, FatalCode::SideFileSyncFailed);
        opened.0.enqueue(&batch(10, 3)).await.unwrap();
        assert!(!opened.0.checkpoint_due(), "a failed checkpoint is due again");
        let (writes, syncs) = (disk.count(IoOp::Write), disk.count(IoOp::Sync));
        assert!(opened.0.checkpoint().await.is_err());
        assert_eq!((disk.count(IoOp::Write), disk.count(IoOp::Sync)), (writes, syncs));
        assert_eq!(fatal.reasons().len(), 1);
    });
}

// Goal: a partition's close (a queue delete, a shutdown) must not return
// while a checkpoint a tick started is still writing: the delete removes the
// directory next, and the checkpoint's sync of that directory then failed
// and stopped the broker (`side_file_sync`, exit 74: seen when a benchmark
// deleted its queue). And no checkpoint may start once the partition is
// closed. Method: hold the running checkpoint's first sync, close the
// partition beside it: close must still be pending while the sync is held,
// and end (with its own final checkpoint) once it is released; a checkpoint
// asked for afterwards does no I/O, and nothing is fatal. On the old code
// close returned at once (the final checkpoint saw one running and skipped).
#[test]
fn close_waits_for_a_running_checkpoint_and_none_starts_after_it() {
    run(async {
        let disk = SimStorage::new();
        let fatal = Rc::new(RecordFatal::default());
        let (partition, background, _) = open(&disk, fatal.clone()).await;
        partition.enqueue(&batch(1, 3)).await.unwrap();
        settle(&partition, true).await;
        let gate = disk.hold(|op, _, _| op == IoOp::Sync);
        let running = {
            let partition = partition.clone();
            glommio::spawn_local(async move { partition.checkpoint().await }).detach()
        };
        while !gate.reached() {
            futures_lite::future::yield_now().await;
        }
        let closed = Rc::new(std::cell::Cell::new(false));
        let closing = {
            let (partition, closed) = (partition.clone(), closed.clone());
            glommio::spawn_local(async move {
                let result = partition.close().await;
                closed.set(true);
                result
            })
            .detach()
        };
        for _ in 0..100 {
            futures_lite::future::yield_now().await;
        }
        assert!(!closed.get(), "close returned while a checkpoint was still writing");
        gate.release();
        let first = running.await.expect("task").expect("the running checkpoint");
        assert!(first.is_some(), "the running checkpoint completed");
        closing.await.expect("task").expect("close");
        background.await;
        let (writes, syncs) = (disk.count(IoOp::Write), disk.count(IoOp::Sync));
        assert_eq!(partition.checkpoint().await.unwrap(), None, "a closed partition checkpointed");
        assert!(!partition.checkpoint_due());
        assert_eq!((disk.count(IoOp::Write), disk.count(IoOp::Sync)), (writes, syncs));
        assert!(fatal.reasons().is_empty(), "{:?}", fatal.reasons());
    });
}
