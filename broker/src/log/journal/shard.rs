//! [`ShardJournal`]: one shard's journal and handles table, the journal as
//! a shard holds it (`docs/design/shard-journal.md` §12).
//!
//! One `ShardJournal` per shard owns the [`Journal`] and the
//! [`HandlesTable`]; opening it loads the table, then recovers the journal
//! with a [`RecoveryRouter`], so every entry lands in its partition's list.
//! It registers partitions' handles and runs and closes the journal.
//!
//! What it must not do: know a partition's offsets, index or reads — a
//! partition's view of the journal, and its opening from the entries
//! recovery routed to it (`ShardJournal::partition`), are `partition.rs`'s.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::proto::PartitionId;

use super::appender::Journal;
use super::config::JournalConfig;
use super::error::JournalError;
use super::handles::{HandleTarget, HandlesTable};
use super::recovery::RecoveryReport;
use super::route::{RecoveryRouter, Routed};
use super::{JournalPos, PartitionHandle};
use crate::io::Storage;
use crate::log::FatalHandler;

/// Name of the journal directory inside a shard directory.
pub const JOURNAL_DIR_NAME: &str = "journal";

/// One shard's journal and handles table.
pub struct ShardJournal<S: Storage> {
    pub(super) journal: Journal<S>,
    pub(super) handles: HandlesTable<S>,
    dir: PathBuf,
}

/// What opening a shard recovered.
#[derive(Debug)]
pub struct ShardRecovery {
    pub report: RecoveryReport,
    /// Each known partition's entries, both lanes, in journal order.
    pub routed: Routed,
}

impl<S: Storage + Clone> ShardJournal<S> {
    /// Loads the handles table of `shard_dir`, then recovers its journal
    /// (`shard_dir/journal`) from `start`, routing every entry to its
    /// partition.
    ///
    /// # Errors
    /// Those of [`HandlesTable::load`] and [`Journal::open`].
    pub async fn open(
        storage: S,
        shard_dir: &Path,
        config: JournalConfig,
        start: JournalPos,
        fatal: Rc<dyn FatalHandler>,
    ) -> Result<(Rc<Self>, ShardRecovery), JournalError> {
        let handles = HandlesTable::load(storage.clone(), shard_dir).await?;
        let mut router =
            RecoveryRouter::new(handles.entries().into_iter().map(|(handle, _)| handle));
        let dir = shard_dir.join(JOURNAL_DIR_NAME);
        let (journal, report) =
            Journal::open(storage, &dir, config, start, &mut router, fatal).await?;
        let shard = Rc::new(Self { journal, handles, dir: shard_dir.to_path_buf() });
        Ok((shard, ShardRecovery { report, routed: router.finish() }))
    }
}

impl<S: Storage> ShardJournal<S> {
    pub fn journal(&self) -> &Journal<S> {
        &self.journal
    }

    pub fn handles(&self) -> &HandlesTable<S> {
        &self.handles
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The journal's committers and preparer (see [`Journal::background`]).
    pub fn background(&self) -> impl Future<Output = ()> + 'static {
        self.journal.background()
    }

    pub fn close(&self) {
        self.journal.close();
    }

    /// Opens the partitions `opening` (queue id, partition, epoch floor)
    /// together: as [`HandlesTable::open_epochs`], one durable table write
    /// for all of them. Call before their first append and before they
    /// serve anything: the returned epochs are durable.
    ///
    /// # Errors
    /// As [`HandlesTable::open_epochs`].
    pub async fn open_partitions(
        &self,
        opening: &[(u32, PartitionId, u64)],
    ) -> Result<Vec<(PartitionHandle, u32)>, JournalError> {
        let opening: Vec<(HandleTarget, u64)> = opening
            .iter()
            .map(|(queue_id, partition, floor)| {
                (HandleTarget { queue_id: *queue_id, partition: *partition }, *floor)
            })
            .collect();
        self.handles.open_epochs(&opening).await
    }

    /// The handle of (`queue_id`, `partition`), allocated and made durable
    /// in the handles table first if it has none: call before the
    /// partition's first append.
    ///
    /// # Errors
    /// As [`HandlesTable::register`].
    pub async fn register(
        &self,
        queue_id: u32,
        partition: PartitionId,
    ) -> Result<PartitionHandle, JournalError> {
        self.handles.register(HandleTarget { queue_id, partition }).await
    }
}
