//! Sealed dedupe generations as side files: a generation that has closed
//! never changes, so it is written once, next to the checkpoint, and every
//! later checkpoint refers to it (first offset, base time, entry count,
//! crc) instead of rewriting its ids. Only the open generation's ids stay
//! inline, so a checkpoint's dedupe bytes are bounded by one generation
//! (1/8 of the window), not the whole window
//! (`docs/design/queue-semantics.md`, "Dedupe").
//!
//! A generation file is a side file ([`files`]: temporary file, fdatasync,
//! rename, directory sync; header with magic "SPDG", the value is the
//! generation's first offset, payload crc32c) named
//! `dedupe-{first offset:020}-{entries}.gen`, its payload the generation's
//! entries in record order, 32 bytes each (time, id, offset). It is written
//! in steps of [`CHECKPOINT_STEP_ENTRIES`] entries, yielding the shard
//! between them, as the checkpoint is, and before the checkpoint that
//! refers to it is renamed into place.
//!
//! The name carries the entry count because a restore may rebuild a
//! referenced generation with fewer entries (dead ones dropped, or split by
//! a changed window): such a rebuilt generation is written again under
//! another name, never over the file the checkpoint on disk refers to.
//!
//! Restore reads every referenced file and refuses (naming it) one that is
//! missing, damaged, or of another length or crc than the checkpoint
//! records: the window is never silently emptied. Files no checkpoint
//! refers to (left by a crash before the checkpoint that would have, or by
//! one during deletion, or out of the window) are removed at open and after
//! each checkpoint, once the new checkpoint is renamed and its directory
//! synced.

use std::collections::BTreeSet;
use std::path::Path;

use super::files::{self, SideFileError, SideFileWriter};
use super::{Partition, PartitionError, CHECKPOINT_STEP_ENTRIES};
use crate::io::{IoError, Storage};
use crate::queue::{
    CodecError, GenerationRef, PartitionContext, PartitionState, Restored, SnapshotEncoder,
};

/// Magic of a dedupe generation side file.
pub const GENERATION_MAGIC: u32 = u32::from_le_bytes(*b"SPDG");
const GENERATION_PREFIX: &str = "dedupe-";
const GENERATION_SUFFIX: &str = ".gen";

/// The file name of a referenced generation.
pub fn generation_file_name(reference: &GenerationRef) -> String {
    format!(
        "{GENERATION_PREFIX}{:020}-{}{GENERATION_SUFFIX}",
        reference.first_offset.0, reference.entries
    )
}

/// Whether `name` is a generation file or its temporary file.
pub(super) fn is_generation_file(name: &str) -> bool {
    name.starts_with(GENERATION_PREFIX)
        && (name.ends_with(GENERATION_SUFFIX) || name.ends_with(".gen.tmp"))
}

/// The sealed dedupe generations a checkpoint refers to, and the files
/// (and their payload bytes) it wrote for them.
pub(super) struct Referred {
    pub references: Vec<GenerationRef>,
    pub written_bytes: u64,
    pub written_files: u64,
}

impl<S: Storage + Clone> Partition<S> {
    /// Writes the file of every sealed generation of the snapshot `encoder`
    /// just began that has none yet, then refers the encoder to all of
    /// them. Each file is durable (and its directory synced) before this
    /// returns.
    ///
    /// # Errors
    /// Storage failure: the checkpoint must not be written.
    pub(super) async fn refer_dedupe_generations(
        &self,
        encoder: &mut SnapshotEncoder,
    ) -> Result<Referred, IoError> {
        let (sealed, inline_from) = self.state.borrow().dedupe_sealed(encoder);
        let mut referred = Referred {
            references: Vec::with_capacity(sealed.len()),
            written_bytes: 0,
            written_files: 0,
        };
        let mut out = Vec::new();
        for generation in sealed {
            if let Some(reference) = generation.persisted {
                referred.references.push(reference);
                continue;
            }
            let mut reference = GenerationRef {
                first_offset: generation.first_offset,
                base_time_ms: generation.base_time_ms,
                entries: generation.entries,
                crc: 0,
            };
            let name = generation_file_name(&reference);
            let mut writer = SideFileWriter::create(&self.storage, &self.dir, &name).await?;
            let mut at = 0usize;
            loop {
                out.clear();
                let done = self.state.borrow().dedupe_generation_step(
                    encoder,
                    generation.index,
                    &mut at,
                    CHECKPOINT_STEP_ENTRIES,
                    &mut out,
                );
                reference.crc = crc32c::crc32c_append(reference.crc, &out);
                writer.write(&out).await?;
                if done {
                    break;
                }
                // Let the shard serve between steps.
                futures_lite::future::yield_now().await;
            }
            referred.written_bytes += writer.payload_len();
            referred.written_files += 1;
            writer.finish(&self.storage, GENERATION_MAGIC, reference.first_offset.0).await?;
            self.state.borrow_mut().dedupe_mark_persisted(reference);
            referred.references.push(reference);
        }
        encoder.refer_generations(referred.references.clone(), inline_from);
        Ok(referred)
    }
}

/// Restores a checkpoint's snapshot, reading the generation files it
/// refers to, then removes the generation files it does not refer to.
/// The inner result is the snapshot's own decoding (the caller decides
/// whether a full replay can replace it); the outer error a referenced
/// generation file that is missing or damaged, named: the checkpoint must
/// not be used without it, nor replaced by one with an empty window.
///
/// # Errors
/// A referenced generation file missing, unreadable or not matching the
/// checkpoint's record of it; a storage failure removing the others.
pub(super) async fn restore_checkpoint<S: Storage>(
    storage: &S,
    dir: &Path,
    snapshot: &[u8],
    ctx: PartitionContext,
) -> Result<Result<Restored, CodecError>, PartitionError> {
    let pending = match PartitionState::restore_begin(snapshot, ctx) {
        Ok(pending) => pending,
        Err(error) => return Ok(Err(error)),
    };
    let mut payloads = Vec::with_capacity(pending.references().len());
    for reference in pending.references() {
        let name = generation_file_name(reference);
        let path = dir.join(&name);
        let refuse = |reason: String| PartitionError::Recovery {
            dir: path.clone(),
            reason: format!("dedupe generation file the checkpoint refers to: {reason}"),
        };
        let file = match files::read_side_file(storage, dir, &name, GENERATION_MAGIC).await {
            Ok(Some(file)) => file,
            Ok(None) => return Err(refuse("missing".to_owned())),
            Err(SideFileError::Invalid { reason, .. }) => return Err(refuse(reason)),
            Err(SideFileError::Io(error)) => return Err(refuse(error.to_string())),
        };
        if file.value != reference.first_offset.0 {
            return Err(refuse(format!(
                "first offset {} instead of {}",
                file.value, reference.first_offset.0
            )));
        }
        let expected = reference.entries.saturating_mul(32);
        if file.payload.len() as u64 != expected {
            return Err(refuse(format!(
                "{} bytes instead of {expected} ({} entries)",
                file.payload.len(),
                reference.entries
            )));
        }
        let crc = crc32c::crc32c(&file.payload);
        if crc != reference.crc {
            return Err(refuse(format!(
                "crc {crc:#010x} instead of {:#010x} recorded by the checkpoint",
                reference.crc
            )));
        }
        payloads.push(file.payload);
    }
    let references = pending.references().to_vec();
    let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let restored = pending.finish(&slices);
    drop(slices);
    drop(payloads);
    if restored.is_ok() {
        remove_unreferenced(storage, dir, &references).await.map_err(crate::log::LogError::Io)?;
    }
    Ok(restored)
}

/// Removes every generation file (and temporary file) in `dir` that
/// `references` does not name, then syncs the directory if any went.
/// Returns how many were removed.
///
/// # Errors
/// Storage failure.
pub(super) async fn remove_unreferenced<S: Storage>(
    storage: &S,
    dir: &Path,
    references: &[GenerationRef],
) -> Result<usize, IoError> {
    let keep: BTreeSet<String> = references.iter().map(generation_file_name).collect();
    let mut removed = 0;
    for name in storage.list_dir(dir).await? {
        if is_generation_file(&name) && !keep.contains(&name) {
            storage.remove(&dir.join(&name)).await?;
            removed += 1;
        }
    }
    if removed > 0 {
        storage.sync_dir(dir).await?;
    }
    Ok(removed)
}
