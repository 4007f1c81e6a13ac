//! The partition tests' fixture: a partition opened as a `JournalPartition`
//! of its own `ShardJournal` (`docs/design/shard-journal.md` §12), either
//! replaying on its own or restored by the shard's ordered pass first, with
//! the same test bodies. `both_layouts!` turns each test body (a function of
//! a `Layout`) into one `#[test]` per way of opening.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use spool_broker::io::{create_dir_durable, Storage};
use spool_broker::log::journal::{JournalConfig, ShardJournal};
use spool_broker::log::{FatalHandler, LogConfig};
use spool_broker::partition::{
    replay_journal_shard, Clock, JournalOpen, OpenReport, Partition, PartitionError, PartitionName,
    ShardReplayTarget,
};
use spool_broker::queue::QueueConfig;

/// How a partition is opened on its shard's journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Its shard's journal (here one shard per partition directory, in
    /// `journal_shard_dir`).
    Journal,
    /// As `Journal`, its checkpoint restored and its entries replayed by
    /// the shard's ordered pass (`replay_journal_shard`) before the open,
    /// as spoold opens the partitions it finds at start.
    JournalOrdered,
}

/// The shard directory of the journal a test partition in `dir` uses.
pub fn journal_shard_dir(dir: &Path) -> PathBuf {
    dir.join("shard")
}

/// A future the test spawns.
type Task = Pin<Box<dyn Future<Output = ()>>>;

/// The background work of an opened partition: the partition's own future
/// and the shard journal and its future.
pub struct Background<S: Storage> {
    partition: Task,
    shard: Option<(Rc<ShardJournal<S>>, Task)>,
}

impl<S: Storage + 'static> Background<S> {
    /// One future running all of it: completes once the partition was
    /// closed, its appends are durable and (journal) the shard journal was
    /// closed and drained.
    pub fn into_future(self) -> impl Future<Output = ()> + 'static {
        let Background { partition, shard } = self;
        async move {
            match shard {
                None => partition.await,
                Some((shard, journal)) => {
                    let journal = std::pin::pin!(journal);
                    let mut journal = journal;
                    let mut partition = partition;
                    let mut partition_done = false;
                    // The journal's committers run beside the partition's
                    // future; once the partition is closed and durable, the
                    // journal is closed and drained.
                    std::future::poll_fn(|cx| {
                        if !partition_done && partition.as_mut().poll(cx).is_ready() {
                            partition_done = true;
                            shard.close();
                        }
                        match journal.as_mut().poll(cx) {
                            std::task::Poll::Ready(()) if partition_done => {
                                std::task::Poll::Ready(())
                            }
                            std::task::Poll::Ready(()) => {
                                // The journal stopped (failed): the partition's
                                // appends fail; nothing more to drive.
                                std::task::Poll::Ready(())
                            }
                            std::task::Poll::Pending => std::task::Poll::Pending,
                        }
                    })
                    .await;
                }
            }
        }
    }
}

/// Opens the partition in `dir` as `layout` says: the shard journal (in
/// [`journal_shard_dir`]) is recovered from the partition's
/// checkpoint scan start, the partition's handle registered, and its routed
/// entries handed to it — what `shard/` does for each partition of a shard.
/// The returned background must be driven (spawned) for appends to become
/// durable; the open itself drives what it needs.
#[allow(clippy::too_many_arguments)]
pub async fn open_partition<S: Storage + Clone + 'static>(
    layout: Layout,
    storage: S,
    dir: &Path,
    name: PartitionName,
    config: QueueConfig,
    log_config: LogConfig,
    fatal: Rc<dyn FatalHandler>,
    clock: Clock,
) -> Result<(Rc<Partition<S>>, Background<S>, OpenReport), PartitionError> {
    match layout {
        Layout::Journal | Layout::JournalOrdered => {
            create_dir_durable(&storage, dir).await.map_err(spool_broker::log::LogError::Io)?;
            let shard_dir = journal_shard_dir(dir);
            create_dir_durable(&storage, &shard_dir)
                .await
                .map_err(spool_broker::log::LogError::Io)?;
            let start = Partition::<S>::journal_scan_start(&storage, dir)
                .await?
                .unwrap_or(spool_broker::log::journal::JournalPos(0));
            let journal_config = JournalConfig::for_partitions(&log_config);
            let (shard, mut recovery) = ShardJournal::open(
                storage.clone(),
                &shard_dir,
                journal_config,
                start,
                fatal.clone(),
            )
            .await?;
            let floor = Partition::<S>::journal_epoch_floor(&storage, dir).await?;
            let opened = shard.open_partitions(&[(name.queue_id.0, name.partition, floor)]).await?;
            let (handle, epoch) = opened[0];
            let replayed = if layout == Layout::JournalOrdered {
                let target = ShardReplayTarget {
                    handle,
                    dir: dir.to_path_buf(),
                    queue: name.queue_id,
                    partition: name.partition,
                    config: config.clone(),
                };
                let (mut replayed, report) = replay_journal_shard(
                    &storage,
                    shard.journal(),
                    &recovery.routed.partitions,
                    vec![target],
                    [7u8; 32],
                )
                .await;
                assert_eq!(report.read_failed, None, "{report:?}");
                replayed.remove(&handle)
            } else {
                None
            };
            let routed = recovery.routed.partitions.remove(&handle).unwrap_or_default();
            let journal_future: Task = Box::pin(shard.background());
            let journal_future = std::cell::RefCell::new(Some(journal_future));
            // The open waits for its fence to be durable: the journal's
            // committers must run meanwhile.
            let open = Partition::open_journal(
                storage,
                dir,
                name,
                config,
                JournalOpen { shard: shard.clone(), handle, epoch, routed, replayed },
                [7u8; 32],
                fatal,
                clock,
            );
            let mut open = std::pin::pin!(open);
            let opened = std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(result) = open.as_mut().poll(cx) {
                    return std::task::Poll::Ready(result);
                }
                if let Some(journal) = journal_future.borrow_mut().as_mut() {
                    if journal.as_mut().poll(cx).is_ready() {
                        return std::task::Poll::Ready(Err(PartitionError::Journal(
                            spool_broker::log::journal::JournalError::Failed(
                                shard.journal().failure().unwrap_or_else(|| "closed".into()),
                            ),
                        )));
                    }
                }
                std::task::Poll::Pending
            })
            .await;
            let (partition, background, report) = opened?;
            let journal_future = journal_future.borrow_mut().take().expect("journal future");
            Ok((
                partition,
                Background {
                    partition: Box::pin(background),
                    shard: Some((shard, journal_future)),
                },
                report,
            ))
        }
    }
}

/// One `#[test]` per way of opening for each listed test body (`fn
/// name(layout: Layout)`), in modules `journal` and `journal_ordered`.
#[macro_export]
macro_rules! both_layouts {
    ($($name:ident),* $(,)?) => {
        mod journal {
            $(#[test] fn $name() { super::$name($crate::partition_layout::Layout::Journal) })*
        }
        mod journal_ordered {
            $(#[test] fn $name() {
                super::$name($crate::partition_layout::Layout::JournalOrdered)
            })*
        }
    };
}
