//! The leader epoch side file of a partition directory.
//!
//! A partition's leader epoch lives in its shard's handles table
//! (`log/journal/handles.rs`), bumped durably for every partition opened
//! together in one write. A partition opened before the table held epochs
//! kept its epoch in this side file; the table's epoch starts above it
//! ([`super::Partition::journal_epoch_floor`]), so an epoch never goes
//! backwards across that change.

use std::path::Path;

use super::files::{self, EPOCH_FILE, EPOCH_MAGIC};
use super::PartitionError;
use crate::io::Storage;

/// The epoch the epoch file holds, 0 without one.
pub(super) async fn stored<S: Storage>(storage: &S, dir: &Path) -> Result<u64, PartitionError> {
    let previous = files::read_side_file(storage, dir, EPOCH_FILE, EPOCH_MAGIC).await?;
    Ok(previous.map_or(0, |file| file.value))
}
