//! Reading a snapshot back: [`PartitionState::restore`] and its first half
//! [`PartitionState::restore_begin`], which check the crc, magic and
//! version, decode the header and every table (folding surplus priority
//! bands into the last one) and refuse what no state could have written:
//! entries out of order, an offset in two tables or above the highest
//! enqueued, impossible phases or counts.
//!
//! Owns those checks; must not trust a count or a field before checking it
//! (a corrupt snapshot is refused, never half-applied), nor read files: the
//! caller hands the bytes, and the generation files, to
//! [`PendingRestore::finish`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::generations::PendingRestore;
use super::subs::{
    check_subscriptions, read_dead_list, read_lanes, read_losses, read_subscriptions, read_totals,
    read_warm_list,
};
use super::{
    Reader, Restored, DEDUPE_ENTRY_BYTES, DEDUPE_REF_BYTES, FRESH_ENTRY_BYTES, SNAPSHOT_MAGIC,
    SNAPSHOT_VERSION, SNAPSHOT_VERSION_V1, SNAPSHOT_VERSION_V2, SNAPSHOT_VERSION_V3,
    SNAPSHOT_VERSION_V4, SNAPSHOT_VERSION_V5, SNAPSHOT_VERSION_V6, STORED_COUNT_BYTES,
    STORED_RUN_BYTES,
};
use crate::queue::dedupe::GenerationRef;
use crate::queue::error::CodecError;
use crate::queue::fairness::Credits;
use crate::queue::fresh::FreshView;
use crate::queue::limits::GROUP_MEMBERS_MAX;
use crate::queue::limits::SNAPSHOT_BYTES_MAX;
use crate::queue::members::Members;
use crate::queue::state::LoggedKeyMap;
use crate::queue::state::{PartitionContext, PartitionState};
use crate::queue::stored::{PrincipalId, Stored, StoredByPrincipal};
use crate::queue::types::{Millis, Offset};

/// Checks that no offset is in two of subscription index `s`'s restored
/// lists (its fresh entries per band, warm, dead letters; each already in
/// increasing order) by merging them; returns the highest offset. One non-empty list, the common case, costs
/// nothing.
fn distinct_offsets(state: &PartitionState, s: usize) -> Result<Option<Offset>, &'static str> {
    let d = &state.subs[s];
    let mut lists: Vec<Box<dyn Iterator<Item = Offset> + '_>> = Vec::new();
    for band in (0..state.fresh.len()).filter(|&band| d.fresh_len[band] > 0) {
        lists.push(Box::new(state.fresh_iter(s, band).map(|view| view.offset)));
    }
    if d.warm.len() > 0 {
        lists.push(Box::new(d.warm.iter().map(|(&offset, _)| offset)));
    }
    if !d.dlq.is_empty() {
        lists.push(Box::new(d.dlq.keys().copied()));
    }
    let mut highest = None;
    if lists.len() <= 1 {
        for list in lists {
            highest = list.last();
        }
        return Ok(highest);
    }
    let mut heads: BinaryHeap<Reverse<(Offset, usize)>> = BinaryHeap::new();
    for (slot, list) in lists.iter_mut().enumerate() {
        if let Some(offset) = list.next() {
            heads.push(Reverse((offset, slot)));
        }
    }
    while let Some(Reverse((offset, slot))) = heads.pop() {
        if highest == Some(offset) {
            return Err("duplicate offset");
        }
        highest = Some(offset);
        if let Some(next) = lists[slot].next() {
            heads.push(Reverse((next, slot)));
        }
    }
    Ok(highest)
}

/// The stored-counts section: runs within the offsets enqueued
/// ([`check_stored`] checks the counts against what the state holds).
fn read_stored(
    r: &mut Reader<'_>,
    state: &PartitionState,
) -> Result<StoredByPrincipal, CodecError> {
    let bad = || CodecError::Inconsistent("stored counts");
    let run_count = r.count(STORED_RUN_BYTES)?;
    let mut runs = Vec::with_capacity(run_count);
    for _ in 0..run_count {
        runs.push((r.u64()?, r.u64()?, PrincipalId(r.u64()?)));
    }
    let highest_end = state.highest_enqueued.map_or(0, |highest| highest.0 + 1);
    if runs.last().is_some_and(|(_, end, _)| *end > highest_end) {
        return Err(bad());
    }
    let count_count = r.count(STORED_COUNT_BYTES)?;
    let mut counts = Vec::with_capacity(count_count);
    for _ in 0..count_count {
        let principal = PrincipalId(r.u64()?);
        counts.push((principal, Stored { messages: r.u64()?, bytes: r.u64()? }));
    }
    StoredByPrincipal::from_parts(runs, counts).ok_or_else(bad)
}

/// The stored counts add up to at most what the state holds (checked once
/// every subscription is restored: a record is held while any holds it).
fn check_stored(state: &PartitionState) -> Result<(), CodecError> {
    let counts = || state.stored.iter().map(|(_, stored)| stored);
    let messages = counts().try_fold(0u64, |sum, stored| sum.checked_add(stored.messages));
    let bytes = counts().try_fold(0u64, |sum, stored| sum.checked_add(stored.bytes));
    let within = messages.is_some_and(|messages| messages <= state.held_messages())
        && bytes.is_some_and(|bytes| bytes <= state.held_bytes());
    if within {
        Ok(())
    } else {
        Err(CodecError::Inconsistent("stored counts"))
    }
}

impl PartitionState {
    /// Rebuilds a state from `snapshot` bytes under `ctx` (the current
    /// config, secret and the new leader epoch). A snapshot taken with a
    /// different number of bands is folded into the current bands.
    ///
    /// # Errors
    /// [`CodecError`] on a bad crc, magic, version, length or inconsistent
    /// content; a config error is reported as `Inconsistent("config")`.
    pub fn restore(bytes: &[u8], ctx: PartitionContext) -> Result<Restored, CodecError> {
        Self::restore_begin(bytes, ctx)?.finish(&[])
    }

    /// The first half of [`restore`](Self::restore): decodes everything
    /// but the dedupe entries, and names the generation files the snapshot
    /// refers to ([`PendingRestore::references`]), which the caller reads
    /// and hands to [`PendingRestore::finish`].
    ///
    /// # Errors
    /// As [`restore`](Self::restore).
    pub fn restore_begin(
        bytes: &[u8],
        ctx: PartitionContext,
    ) -> Result<PendingRestore<'_>, CodecError> {
        if bytes.len() > SNAPSHOT_BYTES_MAX {
            return Err(CodecError::TooLarge(SNAPSHOT_BYTES_MAX));
        }
        let body_len = bytes.len().checked_sub(4).ok_or(CodecError::Truncated)?;
        let (body, crc_bytes) = bytes.split_at(body_len);
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(CodecError::Crc { stored, computed });
        }
        let mut r = Reader { bytes: body, at: 0 };
        if r.u32()? != SNAPSHOT_MAGIC {
            return Err(CodecError::Magic);
        }
        let version = r.u16()?;
        let known = [
            SNAPSHOT_VERSION,
            SNAPSHOT_VERSION_V6,
            SNAPSHOT_VERSION_V5,
            SNAPSHOT_VERSION_V4,
            SNAPSHOT_VERSION_V3,
            SNAPSHOT_VERSION_V2,
            SNAPSHOT_VERSION_V1,
        ];
        if !known.contains(&version) {
            return Err(CodecError::Version(version));
        }
        let mut state = PartitionState::new(ctx).map_err(|_| CodecError::Inconsistent("config"))?;
        let stored_bands = usize::from(r.u16()?);
        if stored_bands == 0 {
            return Err(CodecError::Inconsistent("zero bands"));
        }
        let covers = Offset(r.u64()?);
        let highest = r.u64()?;
        state.highest_enqueued = highest.checked_sub(1).map(Offset);
        state.last_enqueue_time_ms = r.u64()?;
        if state.last_enqueue_time_ms == Millis::MAX {
            return Err(CodecError::Inconsistent("last enqueue time"));
        }
        let stored_totals = if version == SNAPSHOT_VERSION_V1 { 9 } else { 11 };
        state.subs[0].totals = read_totals(&mut r, stored_totals)?;
        let mut credits = Vec::with_capacity(stored_bands + 1);
        for _ in 0..=stored_bands {
            credits.push(r.u32()?);
        }
        if credits.len() == state.fresh.len() + 1 {
            state.subs[0].credits = Credits::from_raw(&credits);
        }
        // Fresh entries go straight into their band's chunks (each stored
        // band is in offset order: checked, not sorted). Only when the
        // snapshot has more bands than the config are the surplus bands
        // folded into the last one, which then needs a sort.
        let bands = state.fresh.len();
        let mut folded: Vec<FreshView> = Vec::new();
        // The stored band of each folded entry: its subscriptions' cursors
        // and marks are per stored band (`subs::read_subscriptions`).
        let mut folded_from: Vec<(Offset, usize)> = Vec::new();
        for band in 0..stored_bands {
            let count = r.count(FRESH_ENTRY_BYTES)?;
            let target = band.min(bands - 1);
            let folds = stored_bands > bands && target == bands - 1;
            if !folds {
                state.fresh[target].reserve(count);
            }
            let mut last: Option<Offset> = None;
            for _ in 0..count {
                let view = FreshView {
                    offset: Offset(r.u64()?),
                    enqueue_time_ms: r.u64()?,
                    size_bytes: r.u32()?,
                    expiry_ms: r.u64()?,
                };
                let valid =
                    view.enqueue_time_ms < Millis::MAX && view.expiry_ms >= view.enqueue_time_ms;
                if !valid || last.is_some_and(|last| view.offset <= last) {
                    return Err(CodecError::Inconsistent("fresh entry"));
                }
                last = Some(view.offset);
                if folds {
                    folded.push(view);
                    folded_from.push((view.offset, band));
                } else {
                    state.insert_fresh(target, view);
                }
            }
        }
        if !folded.is_empty() {
            folded.sort_unstable_by_key(|view| view.offset);
            if folded.windows(2).any(|pair| pair[0].offset == pair[1].offset) {
                return Err(CodecError::Inconsistent("fresh entry"));
            }
            state.fresh[bands - 1].reserve(folded.len());
            for view in folded {
                state.insert_fresh(bands - 1, view);
            }
        }
        read_warm_list(&mut r, &mut state, 0)?;
        read_dead_list(&mut r, &mut state, 0)?;
        // --- Dedupe section (generation files: version 3) ---
        let mut dead_through = None;
        let mut references = Vec::new();
        if version >= SNAPSHOT_VERSION_V3 {
            let flag = r.u8()?;
            let time = r.u64()?;
            dead_through = match flag {
                0 => None,
                1 => Some(time),
                _ => return Err(CodecError::BadField("dedupe dead_through")),
            };
            let count = r.count(DEDUPE_REF_BYTES)?;
            references.reserve_exact(count);
            for _ in 0..count {
                let reference = GenerationRef {
                    first_offset: Offset(r.u64()?),
                    base_time_ms: r.u64()?,
                    entries: r.u64()?,
                    crc: r.u32()?,
                };
                let ordered = references
                    .last()
                    .is_none_or(|last: &GenerationRef| reference.first_offset > last.first_offset);
                if !ordered || reference.entries == 0 {
                    return Err(CodecError::Inconsistent("dedupe generation reference"));
                }
                references.push(reference);
            }
        }
        let count = r.count(DEDUPE_ENTRY_BYTES)?;
        let inline = r.take_slice(count * DEDUPE_ENTRY_BYTES)?;
        // --- End of the dedupe section ---
        if version >= SNAPSHOT_VERSION_V3 {
            state.stored = read_stored(&mut r, &state)?;
        }
        if version >= SNAPSHOT_VERSION_V4 {
            let key_version = r.u64()?;
            let partitions = r.u32()?;
            state.key_map = match (key_version, partitions) {
                (0, 0) => None,
                (0, _) | (_, 0) => return Err(CodecError::Inconsistent("key map")),
                (version, partitions) => Some(LoggedKeyMap { version, partitions }),
            };
            state.members = match r.u8()? {
                0 => None,
                1 => {
                    let mut lists = [Vec::new(), Vec::new()];
                    for list in &mut lists {
                        let count = r.count(8)?;
                        if count > GROUP_MEMBERS_MAX {
                            return Err(CodecError::Inconsistent("members"));
                        }
                        for _ in 0..count {
                            list.push(r.u64()?);
                        }
                    }
                    let [voters, learners] = lists;
                    let members = Members { voters, learners };
                    let sorted = |list: &[u64]| list.windows(2).all(|pair| pair[0] < pair[1]);
                    let valid = !members.voters.is_empty()
                        && sorted(&members.voters)
                        && sorted(&members.learners)
                        && members.all().all(|id| id != 0)
                        && !members.learners.iter().any(|id| members.voters.contains(id));
                    if !valid {
                        return Err(CodecError::Inconsistent("members"));
                    }
                    Some(members)
                }
                _ => return Err(CodecError::BadField("members")),
            };
        }
        if version >= SNAPSHOT_VERSION_V5 {
            read_subscriptions(&mut r, &mut state, stored_bands, &folded_from)?;
        }
        if version >= SNAPSHOT_VERSION_V6 {
            read_losses(&mut r, &mut state)?;
        }
        if version >= SNAPSHOT_VERSION {
            read_lanes(&mut r, &mut state)?;
        } else if state.config.ordered {
            // No version before 7 was written for an ordered queue.
            return Err(CodecError::Inconsistent("ordered queue without lanes"));
        }
        if r.at != body.len() {
            return Err(CodecError::Inconsistent("trailing bytes"));
        }
        state.recount_fresh();
        state.recount_held();
        check_subscriptions(&state)?;
        // Each list above is in offset order; no offset may be in two of
        // one subscription's.
        let mut highest = None;
        for s in 0..state.subs.len() {
            highest = highest.max(distinct_offsets(&state, s).map_err(CodecError::Inconsistent)?);
        }
        if highest.is_some_and(|last| state.highest_enqueued.is_none_or(|h| last > h)) {
            return Err(CodecError::Inconsistent("offset above the highest enqueued"));
        }
        check_stored(&state)?;
        Ok(PendingRestore { state, covers, dead_through, references, inline })
    }
}
