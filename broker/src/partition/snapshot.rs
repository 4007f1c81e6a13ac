//! A replicated partition's snapshots (`docs/design/replication.md` §6):
//! what a leader ships of its durable checkpoint to a member that needs
//! entries every member let go of, and the side files that member writes to
//! install it.
//!
//! - **Offer.** Each checkpoint put in place (and the one found at open)
//!   is offered to raft-rs by its (entry index, term)
//!   ([`ReplicaDriver::set_snapshot_at`]).
//! - **Source.** When a member pulls it, [`Partition::snapshot_source`]
//!   reads the checkpoint's state and every dedupe generation file beside
//!   it into memory (at most [`SNAPSHOT_FILES_BYTES_MAX`]; a newer
//!   checkpoint may replace the files while the transfer runs), and lists
//!   the data batches below the offset it covers; each batch is read when
//!   pulled ([`Partition::snapshot_batch`]): a batch the index let go of
//!   meanwhile held only records acked by committed entries after the
//!   checkpoint, which the member folds before it could serve them.
//! - **Install files.** The member stages the generation files under
//!   `install-` names (no checkpoint of the partition it replaces removes
//!   them), moves them into place once its journal holds the install, and
//!   writes the checkpoint that puts the install in effect
//!   ([`install_checkpoint`]): the leader's state after a prefix of its
//!   own (control cursor and scan start at the install's marker, the
//!   snapshot's index, and the marker as the log's start).
//!
//! [`ReplicaDriver::set_snapshot_at`]: crate::replica::ReplicaDriver::set_snapshot_at
//! [`SNAPSHOT_FILES_BYTES_MAX`]: crate::replica::limits::SNAPSHOT_FILES_BYTES_MAX

use std::path::Path;

use super::dedupe_files::{is_generation_file, GENERATION_MAGIC};
use super::files::{self, CHECKPOINT_FILE, CHECKPOINT_MAGIC};
use super::log::CheckpointPrefix;
use super::{Partition, PartitionError};
use crate::io::Storage;
use crate::log::LogError;
use crate::queue::Offset;
use crate::replica::limits::SNAPSHOT_FILES_BYTES_MAX;

/// A side file a snapshot ships: its name, header value and payload (the
/// checkpoint's without its prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    pub name: String,
    pub value: u64,
    pub payload: Vec<u8>,
}

/// What a leader ships of its checkpoint: see the module docs.
#[derive(Debug, Clone)]
pub struct SnapshotSource {
    /// The checkpoint's entry index and its term.
    pub index: u64,
    pub term: u64,
    /// The data offset its state covers.
    pub covers: u64,
    /// The checkpoint first, then the generation files.
    pub files: Vec<SnapshotFile>,
    /// First offsets of the data batches below `covers`, ascending.
    pub batches: Vec<u64>,
}

/// Prefix of a staged generation file's name.
pub const STAGED_PREFIX: &str = "install-";

impl<S: Storage + Clone> Partition<S> {
    /// Offers this partition's durable checkpoint as a snapshot when its
    /// entry's term is known (module docs, "Offer"). Nothing on one node.
    pub(super) fn offer_snapshot(&self, index: u64, term: Option<u64>) {
        let (Some(driver), Some(term)) = (self.log.driver(), term) else { return };
        driver.set_snapshot_at(index, term);
    }

    /// What a member installing the snapshot this partition offers gets
    /// (module docs, "Source").
    ///
    /// # Errors
    /// [`PartitionError::Snapshot`] when none is offered, the checkpoint on
    /// disk is another one than offered (replaced meanwhile: the member is
    /// offered the new one later), or the files are over
    /// [`SNAPSHOT_FILES_BYTES_MAX`]; the side files' read errors.
    pub async fn snapshot_source(&self) -> Result<SnapshotSource, PartitionError> {
        let refuse = |reason: String| PartitionError::Snapshot { dir: self.dir.clone(), reason };
        let Some((index, term)) = self.log.driver().and_then(|driver| driver.snapshot_at()) else {
            return Err(refuse("no checkpoint is offered".into()));
        };
        let cursor = self.checkpoint_covers.get();
        let file =
            files::read_side_file(&self.storage, &self.dir, CHECKPOINT_FILE, CHECKPOINT_MAGIC)
                .await?
                .ok_or_else(|| refuse("no checkpoint on disk".into()))?;
        let (prefix, state) = CheckpointPrefix::decode(&file.payload).map_err(refuse)?;
        if prefix.entry_index != index || cursor.entry_index() != index {
            return Err(refuse(format!(
                "the checkpoint at entry {} replaced the one offered at {index}",
                prefix.entry_index
            )));
        }
        let mut shipped =
            vec![SnapshotFile { name: CHECKPOINT_FILE.into(), value: 0, payload: state.to_vec() }];
        let mut bytes = state.len();
        let names = self.storage.list_dir(&self.dir).await.map_err(LogError::Io)?;
        for name in names.into_iter().filter(|name| name.ends_with(".gen")) {
            if !is_generation_file(&name) {
                continue;
            }
            // Removed meanwhile by a newer checkpoint: that one is not
            // this snapshot's, caught below.
            let Some(file) =
                files::read_side_file(&self.storage, &self.dir, &name, GENERATION_MAGIC).await?
            else {
                continue;
            };
            bytes += file.payload.len();
            if bytes > SNAPSHOT_FILES_BYTES_MAX {
                return Err(refuse(format!(
                    "the checkpoint and its dedupe files pass {SNAPSHOT_FILES_BYTES_MAX} bytes"
                )));
            }
            shipped.push(SnapshotFile { name, value: file.value, payload: file.payload });
        }
        if self.checkpoint_covers.get().entry_index() != index {
            return Err(refuse("a newer checkpoint replaced the one offered meanwhile".into()));
        }
        let covers = cursor.data_offset().0;
        let batches = self
            .log
            .journal()
            .index()
            .iter()
            .filter(|entry| entry.first_offset < covers)
            .map(|entry| entry.first_offset)
            .collect();
        Ok(SnapshotSource { index, term, covers, files: shipped, batches })
    }

    /// The stored bytes of the data batch starting at `first_offset`, or
    /// `None` when the index let it go of (module docs, "Source").
    ///
    /// # Errors
    /// The journal's read error.
    pub async fn snapshot_batch(
        &self,
        first_offset: u64,
    ) -> Result<Option<Vec<u8>>, PartitionError> {
        let part = self.log.journal();
        let Some(position) = part.position_of(Offset(first_offset)) else { return Ok(None) };
        let batch = part.shard().journal().read(position).await?;
        if batch.header.base_offset != first_offset {
            return Ok(None);
        }
        Ok(Some(batch.bytes.to_vec()))
    }
}

/// Whether `name` may be written by an install: the checkpoint, or a
/// dedupe generation file's exact name (never a path).
pub fn installable_name(name: &str) -> bool {
    if name == CHECKPOINT_FILE {
        return true;
    }
    let Some(middle) = name.strip_prefix("dedupe-").and_then(|rest| rest.strip_suffix(".gen"))
    else {
        return false;
    };
    let mut parts = middle.split('-');
    let (Some(first), Some(entries), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit());
    digits(first) && digits(entries)
}

/// Stages a shipped dedupe generation file in `dir` under its
/// [`STAGED_PREFIX`] name (module docs, "Install files").
///
/// # Errors
/// [`PartitionError::Snapshot`] for a name that is no generation file's;
/// the storage's errors.
pub async fn stage_generation<S: Storage>(
    storage: &S,
    dir: &Path,
    file: &SnapshotFile,
) -> Result<(), PartitionError> {
    if file.name == CHECKPOINT_FILE || !installable_name(&file.name) {
        return Err(PartitionError::Snapshot {
            dir: dir.to_path_buf(),
            reason: format!("a shipped file named {:?} is no dedupe generation file", file.name),
        });
    }
    let staged = format!("{STAGED_PREFIX}{}", file.name);
    files::write_side_file(storage, dir, &staged, GENERATION_MAGIC, file.value, &file.payload)
        .await
        .map_err(|error| PartitionError::Log(LogError::Io(error)))
}

/// Removes what an earlier install left staged in `dir`.
///
/// # Errors
/// The storage's errors.
pub async fn clear_staged<S: Storage>(storage: &S, dir: &Path) -> Result<(), PartitionError> {
    let names = storage.list_dir(dir).await.map_err(LogError::Io)?;
    for name in names.into_iter().filter(|name| name.starts_with(STAGED_PREFIX)) {
        storage.remove(&dir.join(&name)).await.map_err(LogError::Io)?;
    }
    Ok(())
}

/// Puts an install in effect in `dir`: moves the staged generation files
/// into place, then writes the checkpoint of the shipped `state` at entry
/// (`index`, `term`) whose log starts at the install's marker (`log_start`, also its
/// control cursor and scan start), renamed into place and its directory
/// synced. A crash before the rename leaves the partition as it was (its
/// old checkpoint, the install's journal entries out of effect).
///
/// # Errors
/// The storage's errors: the install is then not in effect.
pub async fn install_checkpoint<S: Storage>(
    storage: &S,
    dir: &Path,
    (index, term): (u64, u64),
    log_start: u64,
    state: &[u8],
) -> Result<(), PartitionError> {
    let io = |error| PartitionError::Log(LogError::Io(error));
    let names = storage.list_dir(dir).await.map_err(io)?;
    for staged in names.iter().filter(|name| name.starts_with(STAGED_PREFIX)) {
        let name = &staged[STAGED_PREFIX.len()..];
        if name.ends_with(".tmp") {
            continue;
        }
        storage.rename(&dir.join(staged), &dir.join(name)).await.map_err(io)?;
    }
    storage.sync_dir(dir).await.map_err(io)?;
    let mut payload = CheckpointPrefix {
        control: log_start,
        entry_index: index,
        entry_term: Some(term),
        log_start: Some(log_start),
    }
    .encode();
    payload.extend_from_slice(state);
    files::write_side_file(storage, dir, CHECKPOINT_FILE, CHECKPOINT_MAGIC, log_start, &payload)
        .await
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_generation_file_name_or_the_checkpoint_may_be_installed() {
        // Goal: a name a peer sends can never write outside the partition's directory or over
        // another of its files.
        assert!(installable_name("checkpoint"));
        assert!(installable_name("dedupe-00000000000000000010-4.gen"));
        for bad in [
            "../checkpoint",
            "dedupe-1-2.gen.tmp",
            "dedupe-/1-2.gen",
            "dedupe-1-2-3.gen",
            "dedupe--2.gen",
            "epoch",
            "dedupe-1-2.gen/x",
            "",
        ] {
            assert!(!installable_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_checkpoint_prefix_keeps_its_log_start_even_at_the_journal_s_first_byte() {
        // Goal: an install whose marker is the journal's first entry (position 0, as on a
        // member whose data directory was wiped) is still named by its checkpoint; older
        // prefixes (no log start, no entry index) still read.
        for (entry_term, log_start) in
            [(None, None), (Some(3), Some(0)), (Some(3), None), (None, Some(4_096))]
        {
            let prefix = CheckpointPrefix { control: 96, entry_index: 29, entry_term, log_start };
            let mut payload = prefix.encode();
            payload.extend_from_slice(b"state");
            assert_eq!(CheckpointPrefix::decode(&payload), Ok((prefix, &b"state"[..])));
        }
        let old = 96u64.to_le_bytes();
        let decoded = CheckpointPrefix::decode(&old).unwrap().0;
        let bare =
            CheckpointPrefix { control: 96, entry_index: 0, entry_term: None, log_start: None };
        assert_eq!(decoded, bare);
        assert!(CheckpointPrefix::decode(&[1, 2]).is_err());
    }
}
