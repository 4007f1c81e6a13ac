//! The subscriptions section of a snapshot (version 5,
//! `docs/design/subscriptions.md`): the default subscription's cursors and
//! skipped marks, then every other subscription's marks, totals, credits,
//! warm entries and dead letters; and the checks a restored set of
//! subscriptions must pass (a corrupt section is refused, never half
//! applied). The warm and dead-letter lists are read here for every
//! subscription, the default's included.

use std::collections::BTreeSet;

use super::{
    Reader, DEAD_ENTRY_BYTES, LANE_HEAD_BYTES, LOSS_BYTES, PHASE_CLAIMED, PHASE_READY,
    PHASE_SCHEDULED, PHASE_WAITING, WARM_ENTRY_BYTES,
};
use crate::queue::error::CodecError;
use crate::queue::fairness::Credits;
use crate::queue::lanes::Lanes;
use crate::queue::limits::{LOSS_REPORTS_MAX, SUBSCRIPTIONS_PER_QUEUE_MAX};
use crate::queue::state::delivery::Delivery;
use crate::queue::state::{
    Claim, DeadLetter, DeadPhase, Loss, PartitionState, Totals, Warm, WarmPhase,
};
use crate::queue::types::{
    Generation, Offset, OrderKey, QuarantineCause, ReleaseReason, SubscriptionId, WorkerId,
};

/// Subscription index `s`'s warm entries.
pub(super) fn read_warm_list(
    r: &mut Reader<'_>,
    state: &mut PartitionState,
    s: usize,
) -> Result<(), CodecError> {
    let mut last_warm: Option<Offset> = None;
    for _ in 0..r.count(WARM_ENTRY_BYTES)? {
        let offset = Offset(r.u64()?);
        let enqueue_time_ms = r.u64()?;
        let expiry_ms = r.u64()?;
        let size_bytes = r.u32()?;
        let priority = state.band_of(r.u8()?) as u8;
        let attempts = r.u16()?;
        let generation = Generation(r.u32()?);
        let last_reason = ReleaseReason(r.u16()?);
        let phase = match r.phase()? {
            (PHASE_WAITING, due_ms, key, 0) => WarmPhase::Waiting { due_ms, key: OrderKey(key) },
            (PHASE_SCHEDULED, due_ms, 0, 0) => WarmPhase::Scheduled { due_ms },
            (PHASE_READY, since_ms, 0, 0) => WarmPhase::Ready { since_ms },
            (PHASE_CLAIMED, worker, claimed_at_ms, deadline_ms) if generation.0 > 0 => {
                WarmPhase::Claimed(
                    Claim::new(WorkerId(worker), claimed_at_ms, deadline_ms)
                        .ok_or(CodecError::Inconsistent("deadline"))?,
                )
            }
            _ => return Err(CodecError::Inconsistent("warm phase")),
        };
        if last_warm.is_some_and(|last| offset <= last) {
            return Err(CodecError::Inconsistent("duplicate offset"));
        }
        last_warm = Some(offset);
        let warm = Warm {
            enqueue_time_ms,
            expiry_ms,
            size_bytes,
            priority,
            attempts,
            generation,
            last_reason,
            phase,
        };
        state.restore_warm(s, offset, warm);
    }
    Ok(())
}

/// Subscription index `s`'s dead letters.
pub(super) fn read_dead_list(
    r: &mut Reader<'_>,
    state: &mut PartitionState,
    s: usize,
) -> Result<(), CodecError> {
    let mut last_dead: Option<Offset> = None;
    for _ in 0..r.count(DEAD_ENTRY_BYTES)? {
        let offset = Offset(r.u64()?);
        let enqueue_time_ms = r.u64()?;
        let expiry_ms = r.u64()?;
        let size_bytes = r.u32()?;
        let priority = r.u8()?;
        let attempts = r.u16()?;
        let generation = Generation(r.u32()?);
        let last_reason = ReleaseReason(r.u16()?);
        let phase = match r.phase()? {
            (PHASE_READY, since_ms, 0, 0) => DeadPhase::Ready { since_ms },
            (PHASE_CLAIMED, worker, claimed_at_ms, deadline_ms) => DeadPhase::Claimed(
                Claim::new(WorkerId(worker), claimed_at_ms, deadline_ms)
                    .ok_or(CodecError::Inconsistent("deadline"))?,
            ),
            _ => return Err(CodecError::Inconsistent("dead-letter phase")),
        };
        let cause = QuarantineCause::from_u8(r.u8()?).ok_or(CodecError::BadField("cause"))?;
        let quarantined_at_ms = r.u64()?;
        if last_dead.is_some_and(|last| offset <= last) {
            return Err(CodecError::Inconsistent("duplicate offset"));
        }
        last_dead = Some(offset);
        let dead = DeadLetter {
            enqueue_time_ms,
            expiry_ms,
            size_bytes,
            priority,
            attempts,
            generation,
            last_reason,
            cause,
            quarantined_at_ms,
            phase,
        };
        state.restore_dead(s, offset, dead);
    }
    Ok(())
}

/// The eleven totals, refused when the dead-letter moves by cause exceed
/// the moves.
pub(super) fn read_totals(r: &mut Reader<'_>, stored: usize) -> Result<Totals, CodecError> {
    let mut totals = [0u64; 11];
    for total in &mut totals[..stored] {
        *total = r.u64()?;
    }
    let [enqueued, acked, expired, quarantined, redriven, purged, released, lease_expired, dead_letter_acked, quarantined_by_deliveries, quarantined_by_expiry] =
        totals;
    if quarantined_by_deliveries.saturating_add(quarantined_by_expiry) > quarantined {
        return Err(CodecError::Inconsistent("dead-letter moves by cause"));
    }
    Ok(Totals {
        enqueued,
        acked,
        expired,
        quarantined,
        redriven,
        purged,
        released,
        lease_expired,
        dead_letter_acked,
        quarantined_by_deliveries,
        quarantined_by_expiry,
        lost: 0,
    })
}

/// A cursor and the skipped marks of each stored band.
fn read_marks(
    r: &mut Reader<'_>,
    stored_bands: usize,
) -> Result<Vec<(Offset, BTreeSet<Offset>)>, CodecError> {
    let mut marks = Vec::with_capacity(stored_bands);
    for _ in 0..stored_bands {
        let cursor = Offset(r.u64()?);
        let mut skipped = BTreeSet::new();
        for _ in 0..r.count(8)? {
            let offset = Offset(r.u64()?);
            if offset < cursor || skipped.last().is_some_and(|&last| offset <= last) {
                return Err(CodecError::Inconsistent("skipped marks"));
            }
            skipped.insert(offset);
        }
        marks.push((cursor, skipped));
    }
    Ok(marks)
}

/// Sets subscription index `s`'s cursors and marks from the stored
/// bands'. Surplus stored bands fold into the last band (as their fresh
/// entries did): its cursor is the lowest of theirs, and a folded entry
/// its own band's cursor or marks excluded is marked skipped.
fn set_marks(
    state: &mut PartitionState,
    s: usize,
    marks: Vec<(Offset, BTreeSet<Offset>)>,
    folded_from: &[(Offset, usize)],
) {
    let bands = state.fresh.len();
    let last = bands - 1;
    let fold_cursor = marks[last.min(marks.len() - 1)..].iter().map(|(c, _)| *c).min();
    let excluded: Vec<Offset> = folded_from
        .iter()
        .filter(|&&(offset, band)| offset < marks[band].0 || marks[band].1.contains(&offset))
        .map(|&(offset, _)| offset)
        .collect();
    let d = &mut state.subs[s];
    for (band, (cursor, skipped)) in marks.into_iter().enumerate() {
        let target = band.min(last);
        if band <= last {
            d.cursors[target] = if band == last { fold_cursor.unwrap_or(cursor) } else { cursor };
        }
        d.skipped[target].extend(skipped);
    }
    let cursor = d.cursors[last];
    d.skipped[last].extend(excluded.into_iter().filter(|&offset| offset >= cursor));
}

/// The subscriptions section: the default's marks, then the others.
pub(super) fn read_subscriptions(
    r: &mut Reader<'_>,
    state: &mut PartitionState,
    stored_bands: usize,
    folded_from: &[(Offset, usize)],
) -> Result<(), CodecError> {
    let marks = read_marks(r, stored_bands)?;
    set_marks(state, 0, marks, folded_from);
    let others = r.count(2 + stored_bands * 16 + 11 * 8 + (stored_bands + 1) * 4 + 16)?;
    if others >= SUBSCRIPTIONS_PER_QUEUE_MAX {
        return Err(CodecError::Inconsistent("subscription count"));
    }
    let mut weights = state.config.band_weights.clone();
    weights.push(state.config.retry_weight);
    for _ in 0..others {
        let sub = SubscriptionId(r.u16()?);
        if sub == SubscriptionId::DEFAULT || state.subs.last().is_some_and(|d| d.id >= sub) {
            return Err(CodecError::Inconsistent("subscription id"));
        }
        let marks = read_marks(r, stored_bands)?;
        let totals = read_totals(r, 11)?;
        let mut credits = Vec::with_capacity(stored_bands + 1);
        for _ in 0..=stored_bands {
            credits.push(r.u32()?);
        }
        let mut delivery = Delivery::new(sub, Offset(0), state.fresh.len(), &weights);
        delivery.totals = totals;
        if credits.len() == state.fresh.len() + 1 {
            delivery.credits = Credits::from_raw(&credits);
        }
        state.subs.push(delivery);
        let s = state.subs.len() - 1;
        set_marks(state, s, marks, folded_from);
        read_warm_list(r, state, s)?;
        read_dead_list(r, state, s)?;
    }
    Ok(())
}

/// The losses section (version 6): every subscription's `lost` total and
/// loss reports, the default first.
pub(super) fn read_losses(
    r: &mut Reader<'_>,
    state: &mut PartitionState,
) -> Result<(), CodecError> {
    for d in &mut state.subs {
        let lost = r.u64()?;
        let count = r.count(LOSS_BYTES)?;
        if count > LOSS_REPORTS_MAX {
            return Err(CodecError::Inconsistent("loss reports"));
        }
        let mut reported = 0u64;
        for _ in 0..count {
            let loss = Loss {
                from: Offset(r.u64()?),
                to: Offset(r.u64()?),
                count: r.u64()?,
                at_ms: r.u64()?,
            };
            reported = reported.saturating_add(loss.count);
            if loss.from > loss.to || loss.count == 0 || reported > lost {
                return Err(CodecError::Inconsistent("loss reports"));
            }
            d.losses.push_back(loss);
        }
        d.totals.lost = lost;
    }
    Ok(())
}

/// Reads version 7's lanes (after the losses) and rebuilds each ordered
/// subscription's lanes: its heads, then every warm entry waiting behind
/// one. A head that is not a message of its subscription, a waiting entry
/// with no head of its key or ahead of it, or lanes in an unordered
/// subscription are refused.
pub(super) fn read_lanes(r: &mut Reader<'_>, state: &mut PartitionState) -> Result<(), CodecError> {
    let bad = || CodecError::Inconsistent("lanes");
    for s in 0..state.subs.len() {
        let count = r.count(LANE_HEAD_BYTES)?;
        let mut lanes = Lanes::default();
        for _ in 0..count {
            let offset = Offset(r.u64()?);
            let key = OrderKey(r.u64()?);
            let live = state.main_message(s, offset).ok_or_else(bad)?;
            if matches!(live.warm.phase, WarmPhase::Waiting { .. })
                || !lanes.restore_head(offset, key)
            {
                return Err(bad());
            }
        }
        let d = &mut state.subs[s];
        for (&offset, warm) in d.warm.iter() {
            if let WarmPhase::Waiting { key, .. } = warm.phase {
                if !lanes.restore_waiting(key, offset) {
                    return Err(bad());
                }
            }
        }
        match (&mut d.lanes, count) {
            (Some(live), _) => *live = lanes,
            (None, 0) if lanes.waiting() == 0 => {}
            (None, _) => return Err(bad()),
        }
    }
    Ok(())
}

/// What every restored set of subscriptions must hold: skipped marks on
/// live shared entries, and, for a queue with no retention window, every
/// shared entry some subscription's to deliver.
pub(super) fn check_subscriptions(state: &PartitionState) -> Result<(), CodecError> {
    for d in &state.subs {
        for (band, skipped) in d.skipped.iter().enumerate() {
            if skipped.iter().any(|&offset| state.fresh[band].get(offset).is_none()) {
                return Err(CodecError::Inconsistent("skipped marks"));
            }
        }
    }
    if state.config.has_window() {
        return Ok(());
    }
    for (band, fresh) in state.fresh.iter().enumerate() {
        for view in fresh.iter() {
            if !(0..state.subs.len()).any(|s| state.fresh_for(s, band, view.offset)) {
                return Err(CodecError::Inconsistent("fresh entry no subscription has"));
            }
        }
    }
    Ok(())
}
