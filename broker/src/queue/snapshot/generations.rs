//! Dedupe generation files, the snapshot's side: what a checkpoint writes
//! once per sealed generation (the encoder refers to those files instead of
//! listing their entries; the partition writes them through the steps
//! here), and the second half of a restore ([`PendingRestore`]: the
//! snapshot decoded but for its dedupe entries, finished with the files'
//! payloads).
//!
//! Must not read or write files (`partition/dedupe_files.rs` does, and
//! checks each file's crc and entry count) nor know the table's layout in
//! memory (`dedupe/checkpoint.rs` lists and rebuilds it).

use super::encode::SnapshotEncoder;
use super::{Restored, DEDUPE_ENTRY_BYTES};
use crate::queue::dedupe::{
    decode_record, GenerationRef, RestoreError, RestoreGroup, SealedGeneration,
};
use crate::queue::error::CodecError;
use crate::queue::state::PartitionState;
use crate::queue::types::{MessageId, Millis, Offset};

/// A snapshot decoded but for its dedupe entries, which wait for the
/// generation files it refers to (see [`PartitionState::restore_begin`]).
#[derive(Debug)]
pub struct PendingRestore<'a> {
    pub(super) state: PartitionState,
    pub(super) covers: Offset,
    pub(super) dead_through: Option<Millis>,
    pub(super) references: Vec<GenerationRef>,
    pub(super) inline: &'a [u8],
}

impl PendingRestore<'_> {
    /// The generation files the snapshot refers to, in order.
    pub fn references(&self) -> &[GenerationRef] {
        &self.references
    }

    /// Rebuilds the dedupe table from `generations` (the payload of each
    /// referenced file, in [`references`](Self::references) order; the
    /// caller has checked each file's crc and entry count) and the inline
    /// list.
    ///
    /// # Errors
    /// `Inconsistent` when a payload is missing or of the wrong length, or
    /// the entries are out of order or repeat an id within a generation.
    pub fn finish(self, generations: &[&[u8]]) -> Result<Restored, CodecError> {
        let Self { mut state, covers, dead_through, references, inline } = self;
        if generations.len() != references.len() {
            return Err(CodecError::Inconsistent("dedupe generation file missing"));
        }
        let mut groups = Vec::with_capacity(references.len() + 1);
        for (reference, payload) in references.iter().zip(generations) {
            let expected = usize::try_from(reference.entries)
                .ok()
                .and_then(|entries| entries.checked_mul(DEDUPE_ENTRY_BYTES));
            if expected != Some(payload.len()) {
                return Err(CodecError::Inconsistent("dedupe generation length"));
            }
            groups.push(RestoreGroup {
                base: Some(*reference),
                entries: dedupe_list(payload, dead_through),
            });
        }
        groups.push(RestoreGroup { base: None, entries: dedupe_list(inline, None) });
        state.dedupe.restore_groups(&groups, dead_through).map_err(|error| {
            CodecError::Inconsistent(match error {
                RestoreError::TimeOrder => "dedupe entry time order",
                RestoreError::OffsetOrder => "dedupe entry offset order",
                RestoreError::DuplicateId => "dedupe entry",
            })
        })?;
        Ok(Restored { state, covers })
    }
}

/// The entries of a stored dedupe list, without those at or before `dead`.
fn dedupe_list(
    bytes: &[u8],
    dead: Option<Millis>,
) -> impl Iterator<Item = (MessageId, Offset, Millis)> + Clone + '_ {
    bytes
        .chunks_exact(DEDUPE_ENTRY_BYTES)
        .map(decode_record)
        .filter(move |&(_, _, time_ms)| dead.is_none_or(|dead| time_ms > dead))
}

impl SnapshotEncoder {
    /// Refers the snapshot to generation files instead of listing those
    /// generations: `references` (oldest first) and the held-list
    /// generation the inline list starts from (from
    /// [`PartitionState::dedupe_sealed`]). Call before the first step.
    pub fn refer_generations(&mut self, references: Vec<GenerationRef>, inline_from: usize) {
        self.dedupe_refs = references;
        self.dedupe_inline_from = inline_from;
    }
}

impl PartitionState {
    /// The sealed dedupe generations of the stepped snapshot `encoder` just
    /// began (call before any change), and where its inline list starts.
    pub(crate) fn dedupe_sealed(
        &self,
        encoder: &SnapshotEncoder,
    ) -> (Vec<SealedGeneration>, usize) {
        self.dedupe.sealed(encoder.dedupe)
    }

    /// Appends at most `budget` stored entries of sealed generation
    /// `index` from `*at` to `out`; returns whether it is complete.
    pub(crate) fn dedupe_generation_step(
        &self,
        encoder: &SnapshotEncoder,
        index: usize,
        at: &mut usize,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> bool {
        self.dedupe.generation_step(encoder.dedupe, index, at, budget, out)
    }

    /// Records that a sealed generation's file is written.
    pub(crate) fn dedupe_mark_persisted(&mut self, reference: GenerationRef) {
        self.dedupe.mark_persisted(reference);
    }
}
