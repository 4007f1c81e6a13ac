//! `StoredByPrincipal`: the messages and record bytes a partition holds,
//! counted per producing principal, for the stored-messages and
//! stored-bytes quotas (`docs/operations.md`, "Quotas"; the design is in
//! "Stored quotas: design").
//!
//! A principal is named here by a [`PrincipalId`], a stable 64-bit id of
//! its name ([`principal_id`]), so the log and the checkpoint carry 8 bytes
//! rather than a name, and an id written before an auth file edit still
//! means the same principal after it. [`PrincipalId::UNKNOWN`] (0) is "not
//! attributed": records appended before attribution existed, or whose
//! attribution did not become durable with them; they are counted against
//! no one.
//!
//! Cost: attribution is kept as **runs** of offsets, `first → (end,
//! principal)`: every held message with an offset in `[first, end)` was
//! appended by `principal`. An attribution that starts where the last run
//! ends, by the same principal, extends that run, so a partition written by
//! one producer (or by producers that each batch) costs a handful of
//! entries, not one per message; the worst case, producers interleaving
//! single-record batches, is one entry (≈ 40 bytes in the map) per batch.
//! Runs wholly below the oldest offset the state still holds are dropped
//! ([`StoredByPrincipal::trim_below`]).
//!
//! Pure: no clock, no I/O. The partition feeds it beside the state's own
//! fold: [`StoredByPrincipal::attribute`] for an attribution (after the
//! attributed records' `Enqueued` events), and [`StoredByPrincipal::leave`]
//! for each event that takes a held message out of the partition (ack of
//! either lane, expiry without dead-lettering, purge of either lane;
//! `PartitionState::leaving` tells which, read from the state *before* the event is
//! applied). Moves between lanes (quarantine, redrive) and claims change no
//! count: the quota bounds what is stored, as `max_messages` does.

use std::collections::BTreeMap;

use super::types::Offset;
pub use super::types::PrincipalId;

/// The id of principal `name`: the first 8 bytes of BLAKE3 of a
/// domain-separated name, little-endian; never [`PrincipalId::UNKNOWN`].
/// Stable across restarts, builds and auth file edits (a renamed principal
/// is a new one).
pub fn principal_id(name: &str) -> PrincipalId {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"spool principal id v1\0");
    hasher.update(name.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    match u64::from_le_bytes(first) {
        0 => PrincipalId(1),
        id => PrincipalId(id),
    }
}

/// Messages and record bytes held for one principal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    pub messages: u64,
    pub bytes: u64,
}

/// One run of attributed offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    /// One past the last offset of the run.
    end: u64,
    principal: PrincipalId,
}

/// Per-principal stored counts of one partition, and the runs that
/// attribute held messages to principals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredByPrincipal {
    runs: BTreeMap<u64, Run>,
    counts: BTreeMap<PrincipalId, Stored>,
}

impl StoredByPrincipal {
    /// Attributes the records `sizes` (record bytes each), appended at
    /// offsets `first`, `first + 1`, ..., to `principal`, and counts them.
    /// Offsets at or below an existing run's end are refused (`false`, no
    /// change): attributions arrive in offset order, once each.
    pub fn attribute(&mut self, first: Offset, sizes: &[u32], principal: PrincipalId) -> bool {
        if let Some((_, run)) = self.runs.last_key_value() {
            if first.0 < run.end {
                return false;
            }
        }
        let bytes = sizes.iter().map(|size| u64::from(*size)).sum::<u64>();
        self.attribute_run(first, sizes.len() as u64, principal, sizes.len() as u64, bytes, true);
        true
    }

    /// Attributes the `count` offsets from `first` on to `principal`, and
    /// counts `messages` held messages of `bytes` record bytes among them
    /// (the fold's `Attributed` event: the records it names that the state
    /// holds). Runs at or above `first` name offsets no record was applied
    /// at (an attribution whose data never became durable, its offsets
    /// appended again since): they are cut, counting nothing.
    ///
    /// `merge`: whether the offsets between the last run's end and `first`
    /// hold no message (the caller knows; only control records, or records
    /// gone already), so that the same principal's last run may grow over
    /// them. A held record there is someone else's or no one's, and must
    /// not be taken for this principal's.
    pub fn attribute_run(
        &mut self,
        first: Offset,
        count: u64,
        principal: PrincipalId,
        messages: u64,
        bytes: u64,
        merge: bool,
    ) {
        if count == 0 || principal == PrincipalId::UNKNOWN {
            return;
        }
        let end = first.0.saturating_add(count);
        while let Some(mut entry) = self.runs.last_entry() {
            if entry.get().end <= first.0 {
                break;
            }
            if *entry.key() < first.0 {
                entry.get_mut().end = first.0;
                break;
            }
            entry.remove();
        }
        match self.runs.last_key_value().map(|(start, run)| (*start, *run)) {
            // The same principal: the run grows. Offsets between two
            // batches (control records) hold no message, so a gap of them
            // does not break a run either: no other principal's records lie
            // between.
            Some((start, run)) if merge && run.principal == principal => {
                self.runs.insert(start, Run { end, principal });
            }
            _ => {
                self.runs.insert(first.0, Run { end, principal });
            }
        }
        if messages > 0 {
            let stored = self.counts.entry(principal).or_default();
            stored.messages += messages;
            stored.bytes += bytes;
        }
    }

    /// A record was applied at `offset` (of `size_bytes`) after an
    /// attribution that names it: it counts against that principal now.
    /// On the live path a batch's records are applied before its
    /// attribution, so no run names a new record yet; in a journal's
    /// replay the attribution (control lane) can come first, and its run
    /// waits for the records (a *pending* attribution, cut by
    /// [`drop_pending`](Self::drop_pending) at the end of replay and at
    /// every epoch change within it).
    pub fn arrived(&mut self, offset: Offset, size_bytes: u32) {
        if self.last_end().is_none_or(|end| end.0 <= offset.0) {
            return;
        }
        let Some(principal) = self.principal_of(offset) else { return };
        let stored = self.counts.entry(principal).or_default();
        stored.messages += 1;
        stored.bytes += u64::from(size_bytes);
    }

    /// Cuts every run at `next` (the offset the next applied record would
    /// take): attributions of records that never arrived. Their data was
    /// lost (a crash took it after its attribution became durable), and the
    /// offsets will be taken again by other records, which must not count
    /// against the old principal. They counted nothing, so no count
    /// changes. Returns how many attributed offsets were cut.
    pub fn drop_pending(&mut self, next: Offset) -> u64 {
        let mut cut = 0u64;
        while let Some(mut entry) = self.runs.last_entry() {
            let start = *entry.key();
            let run = *entry.get();
            if run.end <= next.0 {
                break;
            }
            if start < next.0 {
                cut += run.end - next.0;
                entry.get_mut().end = next.0;
                break;
            }
            cut += run.end - start;
            entry.remove();
        }
        cut
    }

    /// The principal the message at `offset` is attributed to, if any.
    pub fn principal_of(&self, offset: Offset) -> Option<PrincipalId> {
        let (_, run) = self.runs.range(..=offset.0).next_back()?;
        (offset.0 < run.end).then_some(run.principal)
    }

    /// The held message at `offset` (of `size_bytes`) left the partition:
    /// its principal's counts go down. An unattributed message changes
    /// nothing.
    pub fn leave(&mut self, offset: Offset, size_bytes: u32) {
        let Some(principal) = self.principal_of(offset) else { return };
        let Some(stored) = self.counts.get_mut(&principal) else { return };
        stored.messages = stored.messages.saturating_sub(1);
        stored.bytes = stored.bytes.saturating_sub(u64::from(size_bytes));
        if stored.messages == 0 {
            self.counts.remove(&principal);
        }
    }

    /// Drops the runs wholly below `oldest` (the lowest offset the state
    /// still holds a message at; `None`: it holds none, and every run goes).
    pub fn trim_below(&mut self, oldest: Option<Offset>) {
        let Some(oldest) = oldest else {
            self.runs.clear();
            return;
        };
        while let Some(entry) = self.runs.first_entry() {
            if entry.get().end > oldest.0 {
                break;
            }
            entry.remove();
        }
    }

    /// What `principal` holds here.
    pub fn stored(&self, principal: PrincipalId) -> Stored {
        self.counts.get(&principal).copied().unwrap_or_default()
    }

    /// Every principal holding something here, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (PrincipalId, Stored)> + '_ {
        self.counts.iter().map(|(principal, stored)| (*principal, *stored))
    }

    /// Runs kept (for memory measurements and tests).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether no run is kept (then nothing is counted either).
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.counts.is_empty()
    }

    /// One past the highest attributed offset, if any run is kept.
    pub(crate) fn last_end(&self) -> Option<Offset> {
        self.runs.last_key_value().map(|(_, run)| Offset(run.end))
    }

    /// Whether `offset` lies in the lowest run (a leave there may free it).
    pub(crate) fn in_first_run(&self, offset: Offset) -> bool {
        self.runs
            .first_key_value()
            .is_some_and(|(start, run)| *start <= offset.0 && offset.0 < run.end)
    }

    /// The runs as `(first, end, principal)`, in offset order (snapshot).
    pub(crate) fn run_list(&self) -> impl Iterator<Item = (u64, u64, PrincipalId)> + '_ {
        self.runs.iter().map(|(start, run)| (*start, run.end, run.principal))
    }

    /// Rebuilds from a snapshot's runs and counts; `None` when they do not
    /// describe a valid table (unordered or empty runs, the unknown
    /// principal, a count of no messages).
    pub(crate) fn from_parts(
        runs: impl IntoIterator<Item = (u64, u64, PrincipalId)>,
        counts: impl IntoIterator<Item = (PrincipalId, Stored)>,
    ) -> Option<StoredByPrincipal> {
        let mut table = StoredByPrincipal::default();
        let mut last_end = 0u64;
        for (first, end, principal) in runs {
            let fits = first < end && (table.runs.is_empty() || first >= last_end);
            if !fits || principal == PrincipalId::UNKNOWN {
                return None;
            }
            last_end = end;
            table.runs.insert(first, Run { end, principal });
        }
        for (principal, stored) in counts {
            if principal == PrincipalId::UNKNOWN || stored.messages == 0 {
                return None;
            }
            if table.counts.insert(principal, stored).is_some() {
                return None;
            }
        }
        Some(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: PrincipalId = PrincipalId(11);
    const BOB: PrincipalId = PrincipalId(22);

    // Goal: ids are stable, distinct for distinct names, and never the
    // unknown id. Method: a few names, twice.
    #[test]
    fn principal_ids_are_stable_and_known() {
        assert_eq!(principal_id("producer"), principal_id("producer"));
        assert_ne!(principal_id("producer"), principal_id("producer2"));
        assert_ne!(principal_id(""), PrincipalId::UNKNOWN);
    }

    // Goal: attributions count per principal; a message that leaves lowers
    // its own principal's counts only; an unattributed one lowers nothing;
    // a principal with nothing left is not listed. Method: two principals'
    // batches, interleaved, then leaves.
    #[test]
    fn counts_follow_attribution_and_leaves() {
        let mut stored = StoredByPrincipal::default();
        assert!(stored.attribute(Offset(10), &[100, 200], ALICE));
        assert!(stored.attribute(Offset(12), &[50], BOB));
        assert!(stored.attribute(Offset(14), &[7, 8, 9], ALICE));
        assert_eq!(stored.stored(ALICE), Stored { messages: 5, bytes: 324 });
        assert_eq!(stored.stored(BOB), Stored { messages: 1, bytes: 50 });
        assert_eq!(stored.principal_of(Offset(13)), None, "a control record's offset");
        assert_eq!(stored.principal_of(Offset(9)), None);
        stored.leave(Offset(11), 200);
        stored.leave(Offset(12), 50);
        stored.leave(Offset(5), 1_000);
        assert_eq!(stored.stored(ALICE), Stored { messages: 4, bytes: 124 });
        assert_eq!(stored.stored(BOB), Stored::default());
        assert_eq!(stored.iter().map(|(p, _)| p).collect::<Vec<_>>(), [ALICE]);
    }

    // Goal: one producer's consecutive batches share one run, even with
    // control records between them; another producer's batch starts a new
    // one; attributions out of order are refused; trimming drops the runs
    // below the oldest held offset. Method: count runs.
    #[test]
    fn runs_merge_and_trim() {
        let mut stored = StoredByPrincipal::default();
        for batch in 0..100u64 {
            assert!(stored.attribute(Offset(batch * 3), &[1, 1], ALICE));
        }
        assert_eq!(stored.runs(), 1);
        assert!(stored.attribute(Offset(300), &[1], BOB));
        assert!(stored.attribute(Offset(301), &[1], ALICE));
        assert_eq!(stored.runs(), 3);
        assert!(!stored.attribute(Offset(301), &[1], ALICE), "already attributed");
        stored.trim_below(Some(Offset(300)));
        assert_eq!(stored.runs(), 2);
        assert_eq!(stored.principal_of(Offset(300)), Some(BOB));
        stored.trim_below(None);
        assert_eq!(stored.runs(), 0);
    }

    // Goal: the unknown principal is never counted. Method: attribute to it.
    #[test]
    fn unknown_principal_is_not_counted() {
        let mut stored = StoredByPrincipal::default();
        assert!(stored.attribute(Offset(0), &[10], PrincipalId::UNKNOWN));
        assert_eq!(stored.iter().count(), 0);
        assert_eq!(stored.runs(), 0);
    }
}
