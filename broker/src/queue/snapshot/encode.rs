//! Writing a snapshot: the [`SnapshotEncoder`] and the steps of bounded
//! work that write the state's canonical bytes while it keeps serving (a
//! one-shot `snapshot` is the same steps run to the end). Owns the order of
//! the sections, the counts taken when a snapshot begins, the
//! copy-on-write record of what a message held before its first change
//! since (`note`, into `state/capture.rs`), and the merge of those
//! before-images with the live tables.
//!
//! Must not change the state's messages (a step only reads them), nor
//! define the layout (`snapshot.rs` does) or the bytes of a dedupe entry
//! (`dedupe.rs`); does no I/O: the caller writes the bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use super::{
    Writer, DEAD_ENTRY_BYTES, DEDUPE_ENTRY_BYTES, FRESH_ENTRY_BYTES, LOSS_BYTES, PHASE_CLAIMED,
    PHASE_READY, PHASE_SCHEDULED, PHASE_WAITING, SNAPSHOT_MAGIC, SNAPSHOT_VERSION,
    STORED_COUNT_BYTES, STORED_RUN_BYTES, WARM_ENTRY_BYTES,
};
use crate::queue::dedupe::{DedupeCapture, DedupeCursor, DedupeTable, GenerationRef};
use crate::queue::error::CodecError;
use crate::queue::fresh::{FreshBand, FreshView};
use crate::queue::state::capture::Capture;
use crate::queue::state::delivery::Delivery;
use crate::queue::state::{
    Claim, DeadLetter, DeadPhase, LoggedKeyMap, PartitionState, Totals, Warm, WarmPhase,
};
use crate::queue::types::{Offset, SubscriptionId};

/// A subscription's cursor and skipped marks, per band.
fn write_marks(w: &mut Writer, d: &Delivery) {
    for (cursor, skipped) in d.cursors.iter().zip(&d.skipped) {
        w.u64(cursor.0);
        w.u64(skipped.len() as u64);
        for offset in skipped {
            w.u64(offset.0);
        }
    }
}

fn claim_fields(claim: &Claim) -> (u64, u64, u64) {
    (claim.worker.0, claim.claimed_at_ms, claim.deadline_ms())
}

fn totals_list(t: &Totals) -> [u64; 11] {
    [
        t.enqueued,
        t.acked,
        t.expired,
        t.quarantined,
        t.redriven,
        t.purged,
        t.released,
        t.lease_expired,
        t.dead_letter_acked,
        t.quarantined_by_deliveries,
        t.quarantined_by_expiry,
    ]
}

/// Which part of the snapshot a [`SnapshotEncoder`] writes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Header,
    Fresh(usize),
    Warm,
    Dead,
    /// The default subscription's cursors and skipped marks, and the
    /// count of the others (version 5).
    Subscriptions,
    /// Subscription `i` of `sub_ids` (not the default): its head, then
    /// its warm entries, then its dead letters.
    SubWarm(usize),
    SubDead(usize),
    /// Every subscription's `lost` total and loss reports (version 6),
    /// taken whole when the snapshot began.
    Losses,
    DedupeRefs,
    DedupeCount,
    Dedupe,
    Stored,
    Done,
}

/// A snapshot written in steps of bounded work (see
/// [`PartitionState::begin_snapshot`]). Holds the cursor, the counts of the
/// moment the snapshot stands for, and the running crc; never the bytes.
#[derive(Debug)]
pub struct SnapshotEncoder {
    covers: Offset,
    /// Entries at or above this offset were enqueued after the snapshot
    /// began (`Offset(u64::MAX)` for a one-shot snapshot).
    limit: Offset,
    /// Whether the state's before-images belong to this snapshot (a
    /// one-shot snapshot taken while a stepped one runs ignores them).
    captured: bool,
    header: Vec<u8>,
    /// The stored-counts section, taken whole when the snapshot began (a
    /// few runs per producer: small next to the message tables).
    stored: Vec<u8>,
    fresh_counts: Vec<u64>,
    warm_count: u64,
    dead_count: u64,
    /// The default subscription's cursors and skipped marks and the count
    /// of the others, taken whole when the snapshot began.
    subs_head: Vec<u8>,
    /// The other subscriptions when the snapshot began: id, head bytes
    /// (id, cursors, skipped marks, totals, credits), warm and dead counts.
    sub_ids: Vec<SubscriptionId>,
    sub_heads: Vec<Vec<u8>>,
    sub_counts: Vec<(u64, u64)>,
    /// The losses section, taken whole when the snapshot began.
    losses: Vec<u8>,
    pub(super) dedupe: DedupeCapture,
    dedupe_cursor: DedupeCursor,
    dedupe_count: u64,
    /// Sealed generations the snapshot refers to instead of listing them,
    /// and the held-list generation the inline listing starts from.
    pub(super) dedupe_refs: Vec<GenerationRef>,
    pub(super) dedupe_inline_from: usize,
    section: Section,
    /// Whether the current section's count has been written.
    started: bool,
    /// Last offset written (or skipped) in the current section.
    after: Option<Offset>,
    emitted: u64,
    crc: u32,
    bytes: u64,
    steps: u64,
    max_step_entries: usize,
}

impl SnapshotEncoder {
    /// The log offset the snapshot covers.
    pub fn covers(&self) -> Offset {
        self.covers
    }

    /// Whether every byte (crc included) has been written.
    pub fn is_done(&self) -> bool {
        self.section == Section::Done
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Most entries any one step visited (the bound a step's work has).
    pub fn max_step_entries(&self) -> usize {
        self.max_step_entries
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

fn write_fresh(w: &mut Writer, v: &FreshView) {
    w.u64(v.offset.0);
    w.u64(v.enqueue_time_ms);
    w.u32(v.size_bytes);
    w.u64(v.expiry_ms);
}

fn write_warm(w: &mut Writer, offset: Offset, warm: &Warm) {
    w.u64(offset.0);
    w.u64(warm.enqueue_time_ms);
    w.u64(warm.expiry_ms);
    w.u32(warm.size_bytes);
    w.u8(warm.priority);
    w.u16(warm.attempts);
    w.u32(warm.generation.0);
    w.u16(warm.last_reason.0);
    match warm.phase {
        WarmPhase::Waiting { due_ms, key } => w.phase(PHASE_WAITING, due_ms, key.0, 0),
        WarmPhase::Scheduled { due_ms } => w.phase(PHASE_SCHEDULED, due_ms, 0, 0),
        WarmPhase::Ready { since_ms } => w.phase(PHASE_READY, since_ms, 0, 0),
        WarmPhase::Claimed(c) => {
            let (a, b, d) = claim_fields(&c);
            w.phase(PHASE_CLAIMED, a, b, d);
        }
    }
}

fn write_dead(w: &mut Writer, offset: Offset, dead: &DeadLetter) {
    w.u64(offset.0);
    w.u64(dead.enqueue_time_ms);
    w.u64(dead.expiry_ms);
    w.u32(dead.size_bytes);
    w.u8(dead.priority);
    w.u16(dead.attempts);
    w.u32(dead.generation.0);
    w.u16(dead.last_reason.0);
    match dead.phase {
        DeadPhase::Ready { since_ms } => w.phase(PHASE_READY, since_ms, 0, 0),
        DeadPhase::Claimed(c) => {
            let (a, b, d) = claim_fields(&c);
            w.phase(PHASE_CLAIMED, a, b, d);
        }
    }
    w.u8(dead.cause as u8);
    w.u64(dead.quarantined_at_ms);
}

/// One step of one offset-ordered table: merges the live entries above
/// `after` (below `limit`, skipping every offset changed since the snapshot
/// began) with the recorded before-images of the offsets changed since
/// that were in this table then. Visits at most `budget` entries (counted
/// down); returns whether the table is complete.
fn merge_step<V>(
    live: impl Iterator<Item = (Offset, V)>,
    before: impl Iterator<Item = (Offset, V)>,
    touched: Option<&BTreeSet<Offset>>,
    limit: Offset,
    budget: &mut usize,
    after: &mut Option<Offset>,
    mut emit: impl FnMut(Offset, V),
) -> bool {
    let mut live = live.take_while(|(offset, _)| *offset < limit).peekable();
    let mut before = before.peekable();
    // Live offsets come in ascending order above `after`, so the touched
    // offsets are walked beside them (one search per step, not per entry).
    let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut touched = touched.map(|touched| touched.range((lower, Bound::Unbounded)).peekable());
    loop {
        if *budget == 0 {
            return false;
        }
        let take_before = match (live.peek(), before.peek()) {
            (None, None) => return true,
            (Some((l, _)), Some((b, _))) => b <= l,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        *budget -= 1;
        if take_before {
            let Some((offset, value)) = before.next() else { return true };
            if live.peek().is_some_and(|(l, _)| *l == offset) {
                live.next();
            }
            emit(offset, value);
            *after = Some(offset);
        } else {
            let Some((offset, value)) = live.next() else { return true };
            let changed = touched.as_mut().is_some_and(|touched| {
                while touched.next_if(|touched| **touched < offset).is_some() {}
                touched.peek().is_some_and(|touched| **touched == offset)
            });
            if !changed {
                emit(offset, value);
            }
            *after = Some(offset);
        }
    }
}

fn range_after<V>(
    map: Option<&BTreeMap<Offset, V>>,
    after: Option<Offset>,
) -> impl Iterator<Item = (Offset, &V)> {
    let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
    map.into_iter().flat_map(move |map| map.range((lower, Bound::Unbounded))).map(|(k, v)| (*k, v))
}

impl PartitionState {
    /// The canonical bytes of this state, covering the log through `covers`,
    /// in one buffer (tests, benches and small states; the partition
    /// writes checkpoints in steps, through the same encoder).
    pub fn snapshot(&self, covers: Offset) -> Vec<u8> {
        let mut encoder = self.encoder(covers, None, self.dedupe.capture_now());
        // Reserved up front (the dedupe count is O(entries); the table's
        // generations are a close bound): doubling a Vec of a large
        // backlog's snapshot would copy it several times.
        let fresh: u64 = self.fresh.iter().map(FreshBand::len).sum();
        let estimate = 256
            + fresh as usize * FRESH_ENTRY_BYTES
            + self.subs[0].warm.len() * WARM_ENTRY_BYTES
            + self.subs[0].dlq.len() * DEAD_ENTRY_BYTES
            + self.dedupe.held_len() * DEDUPE_ENTRY_BYTES;
        let mut out = Vec::with_capacity(estimate);
        while !encoder.is_done() {
            // Nothing changes between these steps, so the counts hold.
            if let Err(error) = self.snapshot_step(&mut encoder, usize::MAX, &mut out) {
                unreachable!("a snapshot of an unchanged state is consistent: {error}");
            }
        }
        out
    }

    /// `limit`: `Some(covers)` for a stepped snapshot that owns the capture.
    fn encoder(
        &self,
        covers: Offset,
        limit: Option<Offset>,
        dedupe: DedupeCapture,
    ) -> SnapshotEncoder {
        let mut w = Writer(Vec::with_capacity(256));
        w.u32(SNAPSHOT_MAGIC);
        w.u16(SNAPSHOT_VERSION);
        // Bands are at most PRIORITY_BANDS_MAX.
        w.u16(self.fresh.len() as u16);
        w.u64(covers.0);
        w.u64(self.highest_enqueued.map_or(0, |o| o.0 + 1));
        w.u64(self.last_enqueue_time_ms);
        for total in totals_list(&self.subs[0].totals) {
            w.u64(total);
        }
        for &credit in self.subs[0].credits.raw() {
            w.u32(credit);
        }
        let header = w.0;
        let mut w = Writer(Vec::with_capacity(
            16 + self.stored.runs() * STORED_RUN_BYTES
                + self.stored.iter().count() * STORED_COUNT_BYTES,
        ));
        w.u64(self.stored.runs() as u64);
        for (first, end, principal) in self.stored.run_list() {
            w.u64(first);
            w.u64(end);
            w.u64(principal.0);
        }
        w.u64(self.stored.iter().count() as u64);
        for (principal, stored) in self.stored.iter() {
            w.u64(principal.0);
            w.u64(stored.messages);
            w.u64(stored.bytes);
        }
        let key_map = self.key_map.unwrap_or(LoggedKeyMap { version: 0, partitions: 0 });
        w.u64(key_map.version);
        w.u32(key_map.partitions);
        match &self.members {
            None => w.u8(0),
            Some(members) => {
                w.u8(1);
                for list in [&members.voters, &members.learners] {
                    w.u64(list.len() as u64);
                    for id in list {
                        w.u64(*id);
                    }
                }
            }
        }
        let mut head = Writer(Vec::new());
        write_marks(&mut head, &self.subs[0]);
        head.u64(self.subs.len() as u64 - 1);
        let others = &self.subs[1..];
        let sub_heads = others
            .iter()
            .map(|d| {
                let mut w = Writer(Vec::new());
                w.u16(d.id.0);
                write_marks(&mut w, d);
                for total in totals_list(&d.totals) {
                    w.u64(total);
                }
                for &credit in d.credits.raw() {
                    w.u32(credit);
                }
                w.0
            })
            .collect();
        let mut losses = Writer(Vec::with_capacity(self.subs.len() * 16));
        for d in &self.subs {
            losses.u64(d.totals.lost);
            losses.u64(d.losses.len() as u64);
            for loss in &d.losses {
                losses.u64(loss.from.0);
                losses.u64(loss.to.0);
                losses.u64(loss.count);
                losses.u64(loss.at_ms);
            }
        }
        debug_assert!(losses.0.len() >= self.subs.len() * 16);
        debug_assert!((losses.0.len() - self.subs.len() * 16).is_multiple_of(LOSS_BYTES));
        // Version 7's lanes follow the losses in the same trailing section.
        for d in &self.subs {
            // By offset: the same state gives the same bytes.
            let mut heads: Vec<_> = d.lanes.iter().flat_map(|lanes| lanes.heads()).collect();
            heads.sort_unstable();
            losses.u64(heads.len() as u64);
            for (offset, key) in heads {
                losses.u64(offset.0);
                losses.u64(key.0);
            }
        }
        SnapshotEncoder {
            losses: losses.0,
            subs_head: head.0,
            sub_ids: others.iter().map(|d| d.id).collect(),
            sub_heads,
            sub_counts: others.iter().map(|d| (d.warm.len() as u64, d.dlq.len() as u64)).collect(),
            covers,
            limit: limit.unwrap_or(Offset(u64::MAX)),
            captured: limit.is_some(),
            header,
            stored: w.0,
            fresh_counts: self.fresh.iter().map(FreshBand::len).collect(),
            warm_count: self.subs[0].warm.len() as u64,
            dead_count: self.subs[0].dlq.len() as u64,
            dedupe,
            dedupe_cursor: DedupeCursor::default(),
            dedupe_count: 0,
            dedupe_refs: Vec::new(),
            dedupe_inline_from: 0,
            section: Section::Header,
            started: false,
            after: None,
            emitted: 0,
            crc: 0,
            bytes: 0,
            steps: 0,
            max_step_entries: 0,
        }
    }

    /// Starts a snapshot of the state as it is now, covering the log
    /// through `covers` (the log's next offset: every event below it is
    /// applied, none above it). The state keeps serving while the snapshot
    /// is written in [`snapshot_step`](Self::snapshot_step)s: the first
    /// change to a message below `covers` records what it was
    /// (copy-on-write of that message), entries enqueued later are above
    /// `covers`, and the dedupe table holds the generations it drops. The
    /// header (counts, totals, credits) is taken now. O(bands).
    ///
    /// Call [`end_snapshot`](Self::end_snapshot) when done or abandoned.
    pub fn begin_snapshot(&mut self, covers: Offset) -> SnapshotEncoder {
        self.end_snapshot();
        let dedupe = self.dedupe.begin_capture();
        self.capture = Some(Box::new(Capture {
            covers,
            fresh: vec![BTreeMap::new(); self.fresh.len()],
            ..Capture::default()
        }));
        self.encoder(covers, Some(covers), dedupe)
    }

    /// Stops recording changes for a snapshot and frees what it held.
    pub fn end_snapshot(&mut self) {
        self.capture = None;
        self.dedupe.end_capture();
    }

    /// Messages changed since the running snapshot began (their before
    /// images are held until it ends); 0 when none runs.
    pub fn snapshot_touched(&self) -> usize {
        self.capture.as_ref().map_or(0, |capture| capture.touched.len())
    }

    /// Records what `offset` holds before its first change while a snapshot
    /// runs. Every change to `fresh`, `warm` or `dlq` calls this first.
    pub(crate) fn note(&mut self, offset: Offset) {
        let Some(capture) = self.capture.as_deref() else { return };
        if offset >= capture.covers || capture.touched.contains(&offset) {
            return;
        }
        let warm = self.subs[0].warm.get(&offset).copied();
        let dead = self.subs[0].dlq.get(&offset).copied();
        let fresh = self
            .fresh
            .iter()
            .enumerate()
            .find_map(|(band, fresh)| fresh.get(offset).map(|view| (band, view)));
        let others: Vec<_> = self.subs[1..]
            .iter()
            .map(|d| (d.id, d.warm.get(&offset).copied(), d.dlq.get(&offset).copied()))
            .filter(|(_, warm, dead)| warm.is_some() || dead.is_some())
            .collect();
        let Some(capture) = self.capture.as_deref_mut() else { return };
        capture.touched.insert(offset);
        for (sub, warm, dead) in others {
            if let Some(warm) = warm {
                capture.sub_warm.entry(sub).or_default().insert(offset, warm);
            }
            if let Some(dead) = dead {
                capture.sub_dead.entry(sub).or_default().insert(offset, dead);
            }
        }
        // With several subscriptions one offset may be in the shared
        // index and in the default's warm map or dead letters at once.
        if let Some(warm) = warm {
            capture.warm.insert(offset, warm);
        }
        if let Some(dead) = dead {
            capture.dead.insert(offset, dead);
        }
        if let Some((band, view)) = fresh {
            capture.fresh[band].insert(offset, view);
        }
    }

    /// Appends the next part of the snapshot to `out`, visiting at most
    /// `budget` table entries (the header and counts are free). Returns
    /// whether the snapshot is complete (its crc written). Between steps
    /// the state may change through `apply`; the bytes still describe it
    /// as it was at `begin_snapshot`.
    ///
    /// # Errors
    /// `Inconsistent` if a table listed other than the count taken at the
    /// start (a change that bypassed the copy-on-write record): the bytes
    /// must then not be used.
    pub fn snapshot_step(
        &self,
        encoder: &mut SnapshotEncoder,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, CodecError> {
        let start = out.len();
        let mut w = Writer(std::mem::take(out));
        let mut left = budget;
        let result = self.snapshot_sections(encoder, &mut left, &mut w);
        encoder.crc = crc32c::crc32c_append(encoder.crc, &w.0[start..]);
        if result.is_ok() && encoder.section == Section::Done {
            let crc = encoder.crc;
            w.u32(crc);
        }
        encoder.bytes += (w.0.len() - start) as u64;
        encoder.steps += 1;
        encoder.max_step_entries = encoder.max_step_entries.max(budget - left);
        *out = w.0;
        result.map(|()| encoder.section == Section::Done)
    }

    fn snapshot_sections(
        &self,
        encoder: &mut SnapshotEncoder,
        left: &mut usize,
        w: &mut Writer,
    ) -> Result<(), CodecError> {
        let capture = self.capture.as_deref().filter(|_| encoder.captured);
        let touched = capture.map(|capture| &capture.touched);
        let limit = encoder.limit;
        while *left > 0 && encoder.section != Section::Done {
            let section = encoder.section;
            let starts = !encoder.started;
            encoder.started = true;
            let mut emitted = 0u64;
            let complete = match section {
                Section::Header => {
                    w.0.extend_from_slice(&encoder.header);
                    true
                }
                Section::Fresh(band) => {
                    if starts {
                        w.u64(encoder.fresh_counts[band]);
                    }
                    merge_step(
                        self.fresh[band].iter_after(encoder.after).map(|view| (view.offset, view)),
                        range_after(capture.map(|c| &c.fresh[band]), encoder.after)
                            .map(|(offset, view)| (offset, *view)),
                        touched,
                        limit,
                        left,
                        &mut encoder.after,
                        |_, view| {
                            write_fresh(w, &view);
                            emitted += 1;
                        },
                    )
                }
                Section::Warm => {
                    if starts {
                        w.u64(encoder.warm_count);
                    }
                    merge_step(
                        self.subs[0].warm.iter_after(encoder.after).map(|(k, v)| (*k, v)),
                        range_after(capture.map(|c| &c.warm), encoder.after),
                        touched,
                        limit,
                        left,
                        &mut encoder.after,
                        |offset, warm| {
                            write_warm(w, offset, warm);
                            emitted += 1;
                        },
                    )
                }
                Section::Dead => {
                    if starts {
                        w.u64(encoder.dead_count);
                    }
                    let lower = encoder.after.map_or(Bound::Unbounded, Bound::Excluded);
                    merge_step(
                        self.subs[0].dlq.range((lower, Bound::Unbounded)).map(|(k, v)| (*k, v)),
                        range_after(capture.map(|c| &c.dead), encoder.after),
                        touched,
                        limit,
                        left,
                        &mut encoder.after,
                        |offset, dead| {
                            write_dead(w, offset, dead);
                            emitted += 1;
                        },
                    )
                }
                Section::Subscriptions => {
                    w.0.extend_from_slice(&encoder.subs_head);
                    true
                }
                Section::SubWarm(i) => {
                    if starts {
                        w.0.extend_from_slice(&encoder.sub_heads[i]);
                        w.u64(encoder.sub_counts[i].0);
                    }
                    let sub = encoder.sub_ids[i];
                    let after = encoder.after;
                    let live = self
                        .sub_index(sub)
                        .into_iter()
                        .flat_map(|s| self.subs[s].warm.iter_after(after).map(|(k, v)| (*k, v)));
                    let before = capture.and_then(|c| c.sub_warm.get(&sub));
                    merge_step(
                        live,
                        range_after(before, after),
                        touched,
                        limit,
                        left,
                        &mut encoder.after,
                        |offset, warm| {
                            write_warm(w, offset, warm);
                            emitted += 1;
                        },
                    )
                }
                Section::SubDead(i) => {
                    if starts {
                        w.u64(encoder.sub_counts[i].1);
                    }
                    let sub = encoder.sub_ids[i];
                    let after = encoder.after;
                    let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
                    let live = self.sub_index(sub).into_iter().flat_map(|s| {
                        self.subs[s].dlq.range((lower, Bound::Unbounded)).map(|(k, v)| (*k, v))
                    });
                    let before = capture.and_then(|c| c.sub_dead.get(&sub));
                    merge_step(
                        live,
                        range_after(before, after),
                        touched,
                        limit,
                        left,
                        &mut encoder.after,
                        |offset, dead| {
                            write_dead(w, offset, dead);
                            emitted += 1;
                        },
                    )
                }
                Section::DedupeRefs => {
                    let dead_through = DedupeTable::capture_dead_through(encoder.dedupe);
                    w.u8(u8::from(dead_through.is_some()));
                    w.u64(dead_through.unwrap_or(0));
                    w.u64(encoder.dedupe_refs.len() as u64);
                    for reference in &encoder.dedupe_refs {
                        w.u64(reference.first_offset.0);
                        w.u64(reference.base_time_ms);
                        w.u64(reference.entries);
                        w.u32(reference.crc);
                    }
                    true
                }
                Section::DedupeCount | Section::Dedupe => {
                    // The list's count comes first, but counting it is as
                    // long as listing it: one pass counts, a second writes.
                    let counting = section == Section::DedupeCount;
                    let (visited, complete) = self.dedupe.capture_step(
                        encoder.dedupe,
                        limit,
                        &mut encoder.dedupe_cursor,
                        *left,
                        |id, offset, time_ms| {
                            if !counting {
                                w.u64(time_ms);
                                w.0.extend_from_slice(&id.0);
                                w.u64(offset.0);
                            }
                            emitted += 1;
                        },
                    );
                    *left -= visited;
                    complete
                }
                Section::Stored => {
                    w.0.extend_from_slice(&encoder.stored);
                    true
                }
                Section::Losses => {
                    w.0.extend_from_slice(&encoder.losses);
                    true
                }
                Section::Done => true,
            };
            encoder.emitted += emitted;
            if !complete {
                continue;
            }
            let expected = match section {
                Section::Fresh(band) => Some(encoder.fresh_counts[band]),
                Section::Warm => Some(encoder.warm_count),
                Section::Dead => Some(encoder.dead_count),
                Section::SubWarm(i) => Some(encoder.sub_counts[i].0),
                Section::SubDead(i) => Some(encoder.sub_counts[i].1),
                Section::Dedupe => Some(encoder.dedupe_count),
                Section::Header
                | Section::Losses
                | Section::Subscriptions
                | Section::DedupeRefs
                | Section::DedupeCount
                | Section::Stored
                | Section::Done => None,
            };
            if expected.is_some_and(|expected| expected != encoder.emitted) {
                return Err(CodecError::Inconsistent("snapshot table changed while written"));
            }
            if section == Section::DedupeCount {
                encoder.dedupe_count = encoder.emitted;
                w.u64(encoder.dedupe_count);
                encoder.dedupe_cursor = DedupeCursor::at_generation(encoder.dedupe_inline_from);
            }
            encoder.section = match section {
                Section::Header => Section::Fresh(0),
                Section::Fresh(band) if band + 1 < self.fresh.len() => Section::Fresh(band + 1),
                Section::Fresh(_) => Section::Warm,
                Section::Warm => Section::Dead,
                Section::Dead => Section::DedupeRefs,
                Section::DedupeRefs => {
                    encoder.dedupe_cursor = DedupeCursor::at_generation(encoder.dedupe_inline_from);
                    Section::DedupeCount
                }
                Section::DedupeCount => Section::Dedupe,
                Section::Dedupe => Section::Stored,
                Section::Stored => Section::Subscriptions,
                Section::Subscriptions if encoder.sub_ids.is_empty() => Section::Losses,
                Section::Subscriptions => Section::SubWarm(0),
                Section::SubWarm(i) => Section::SubDead(i),
                Section::SubDead(i) if i + 1 < encoder.sub_ids.len() => Section::SubWarm(i + 1),
                Section::SubDead(_) => Section::Losses,
                Section::Losses | Section::Done => Section::Done,
            };
            encoder.after = None;
            encoder.emitted = 0;
            encoder.started = false;
        }
        Ok(())
    }
}
