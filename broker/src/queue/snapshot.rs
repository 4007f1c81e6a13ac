//! Checkpoints of the fold: `snapshot` writes the state's canonical bytes
//! with a crc32c and the log offset they cover; `restore` rebuilds the state
//! (and every derived index) from them. Replaying the log after `covers`
//! onto a restored state gives the same state as replaying all of it; the
//! model test checks exactly that. File I/O is the caller's.
//!
//! Layout (little-endian): header (magic "SPQS", version, bands, covers,
//! highest enqueued + 1, last enqueue time, totals, credits), then fresh
//! entries per band, warm entries, dead letters, the dedupe section (each
//! list preceded by its u64 count), the stored counts per principal (the
//! attribution runs, then the counts, each list preceded by its u64 count),
//! then crc32c of everything before it. Derived indexes (phase sets, expiry
//! index, chunk headers) are not stored.
//!
//! The dedupe section (version 3): `dead_through` (u8 flag, u64 ms: entries
//! of the referenced generation files at or before it are dead), the
//! sealed generations written once as side files (count, then first
//! offset, base time, entry count, crc32c of each: `GenerationRef`), then
//! the open generation's live entries inline (count, 32 B each). Versions 1
//! and 2 hold every live entry inline and nothing else, and no stored
//! counts (nothing attributed).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Bound;

use super::dedupe::{
    decode_record, DedupeCapture, DedupeCursor, DedupeTable, GenerationRef, RestoreError,
    RestoreGroup, SealedGeneration, DEDUPE_RECORD_BYTES,
};
use super::error::CodecError;
use super::fairness::Credits;
use super::fresh::{FreshBand, FreshView};
use super::limits::SNAPSHOT_BYTES_MAX;
use super::state::capture::Capture;
use super::state::{
    Claim, DeadLetter, DeadPhase, PartitionContext, PartitionState, Totals, Warm, WarmPhase,
};
use super::stored::{PrincipalId, Stored, StoredByPrincipal};
use super::types::{
    Generation, MessageId, Millis, Offset, QuarantineCause, ReleaseReason, WorkerId,
};

const SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"SPQS");
/// Version 3 refers to sealed dedupe generations in side files (the
/// dedupe section, module docs) and adds the stored counts per principal
/// (a trailing section); version 2 adds the dead-letter moves by cause to
/// the totals; versions 2 and 1 (nine totals) are still read, version 1's
/// moves' causes unknown.
const SNAPSHOT_VERSION: u16 = 3;
/// The version before dedupe generation files and stored counts.
const SNAPSHOT_VERSION_V2: u16 = 2;
/// The oldest version `restore` reads.
const SNAPSHOT_VERSION_V1: u16 = 1;

/// A restored state and the log offset its snapshot covers: replay resumes
/// after it.
#[derive(Debug)]
pub struct Restored {
    pub state: PartitionState,
    pub covers: Offset,
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Phase tag and three time/identity fields.
    fn phase(&mut self, tag: u8, a: u64, b: u64, c: u64) {
        self.u8(tag);
        self.u64(a);
        self.u64(b);
        self.u64(c);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let end = self.at.checked_add(N).ok_or(CodecError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(CodecError::Truncated)?;
        self.at = end;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A list count, bounded by the bytes left so a corrupt count cannot
    /// make the reader allocate or loop beyond the input.
    fn count(&mut self, entry_bytes: usize) -> Result<usize, CodecError> {
        let count = usize::try_from(self.u64()?).map_err(|_| CodecError::Truncated)?;
        let left = self.bytes.len() - self.at;
        if count.checked_mul(entry_bytes).is_none_or(|need| need > left) {
            return Err(CodecError::Truncated);
        }
        Ok(count)
    }
    /// The next `len` bytes as one slice.
    fn take_slice(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        let end = self.at.checked_add(len).ok_or(CodecError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(CodecError::Truncated)?;
        self.at = end;
        Ok(slice)
    }
    fn phase(&mut self) -> Result<(u8, u64, u64, u64), CodecError> {
        Ok((self.u8()?, self.u64()?, self.u64()?, self.u64()?))
    }
}

const FRESH_ENTRY_BYTES: usize = 28;
const PHASE_BYTES: usize = 25;
const WARM_ENTRY_BYTES: usize = 8 + 8 + 8 + 4 + 1 + 2 + 4 + 2 + PHASE_BYTES;
const DEAD_ENTRY_BYTES: usize = WARM_ENTRY_BYTES + 1 + 8;
const DEDUPE_ENTRY_BYTES: usize = DEDUPE_RECORD_BYTES;
/// One generation reference: first offset, base time, entries, crc.
const DEDUPE_REF_BYTES: usize = 8 + 8 + 8 + 4;
/// A run: first offset, end, principal.
const STORED_RUN_BYTES: usize = 8 + 8 + 8;
/// A count: principal, messages, bytes.
const STORED_COUNT_BYTES: usize = 8 + 8 + 8;

const PHASE_SCHEDULED: u8 = 1;
const PHASE_READY: u8 = 2;
const PHASE_CLAIMED: u8 = 3;

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

/// Checks that no offset is in two of the restored lists (fresh bands,
/// warm, dead letters; each already in increasing order) by merging them;
/// returns the highest offset. One non-empty list, the common case, costs
/// nothing.
fn distinct_offsets(state: &PartitionState) -> Result<Option<Offset>, &'static str> {
    let mut lists: Vec<Box<dyn Iterator<Item = Offset> + '_>> = Vec::new();
    for band in state.fresh.iter().filter(|band| !band.is_empty()) {
        lists.push(Box::new(band.iter().map(|view| view.offset)));
    }
    if state.warm.len() > 0 {
        lists.push(Box::new(state.warm.iter().map(|(&offset, _)| offset)));
    }
    if !state.dlq.is_empty() {
        lists.push(Box::new(state.dlq.keys().copied()));
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

/// Which part of the snapshot a [`SnapshotEncoder`] writes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Header,
    Fresh(usize),
    Warm,
    Dead,
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
    dedupe: DedupeCapture,
    dedupe_cursor: DedupeCursor,
    dedupe_count: u64,
    /// Sealed generations the snapshot refers to instead of listing them,
    /// and the held-list generation the inline listing starts from.
    dedupe_refs: Vec<GenerationRef>,
    dedupe_inline_from: usize,
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

/// The stored-counts section: runs within the offsets enqueued, counts
/// that add up to at most what the state holds.
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
    let messages =
        counts.iter().try_fold(0u64, |sum, (_, stored)| sum.checked_add(stored.messages));
    let bytes = counts.iter().try_fold(0u64, |sum, (_, stored)| sum.checked_add(stored.bytes));
    let within = messages.is_some_and(|messages| messages <= state.held_messages())
        && bytes.is_some_and(|bytes| bytes <= state.held_bytes());
    if !within {
        return Err(bad());
    }
    StoredByPrincipal::from_parts(runs, counts).ok_or_else(bad)
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
            + self.warm.len() * WARM_ENTRY_BYTES
            + self.dlq.len() * DEAD_ENTRY_BYTES
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
        for total in totals_list(&self.totals) {
            w.u64(total);
        }
        for &credit in self.credits.raw() {
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
        SnapshotEncoder {
            covers,
            limit: limit.unwrap_or(Offset(u64::MAX)),
            captured: limit.is_some(),
            header,
            stored: w.0,
            fresh_counts: self.fresh.iter().map(FreshBand::len).collect(),
            warm_count: self.warm.len() as u64,
            dead_count: self.dlq.len() as u64,
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
        let warm = self.warm.get(&offset).copied();
        let dead = self.dlq.get(&offset).copied();
        let fresh = self
            .fresh
            .iter()
            .enumerate()
            .find_map(|(band, fresh)| fresh.get(offset).map(|view| (band, view)));
        let Some(capture) = self.capture.as_deref_mut() else { return };
        capture.touched.insert(offset);
        if let Some(warm) = warm {
            capture.warm.insert(offset, warm);
        } else if let Some(dead) = dead {
            capture.dead.insert(offset, dead);
        } else if let Some((band, view)) = fresh {
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
                        self.warm.iter_after(encoder.after).map(|(k, v)| (*k, v)),
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
                        self.dlq.range((lower, Bound::Unbounded)).map(|(k, v)| (*k, v)),
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
                Section::Dedupe => Some(encoder.dedupe_count),
                Section::Header
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
                Section::Stored | Section::Done => Section::Done,
            };
            encoder.after = None;
            encoder.emitted = 0;
            encoder.started = false;
        }
        Ok(())
    }

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
        if ![SNAPSHOT_VERSION, SNAPSHOT_VERSION_V2, SNAPSHOT_VERSION_V1].contains(&version) {
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
        let mut totals = [0u64; 11];
        let stored_totals = if version == SNAPSHOT_VERSION_V1 { 9 } else { totals.len() };
        for total in &mut totals[..stored_totals] {
            *total = r.u64()?;
        }
        let [enqueued, acked, expired, quarantined, redriven, purged, released, lease_expired, dead_letter_acked, quarantined_by_deliveries, quarantined_by_expiry] =
            totals;
        if quarantined_by_deliveries.saturating_add(quarantined_by_expiry) > quarantined {
            return Err(CodecError::Inconsistent("dead-letter moves by cause"));
        }
        state.totals = Totals {
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
        };
        let mut credits = Vec::with_capacity(stored_bands + 1);
        for _ in 0..=stored_bands {
            credits.push(r.u32()?);
        }
        if credits.len() == state.fresh.len() + 1 {
            state.credits = Credits::from_raw(&credits);
        }
        // Fresh entries go straight into their band's chunks (each stored
        // band is in offset order: checked, not sorted). Only when the
        // snapshot has more bands than the config are the surplus bands
        // folded into the last one, which then needs a sort.
        let bands = state.fresh.len();
        let mut folded: Vec<FreshView> = Vec::new();
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
            state.restore_warm(offset, warm);
        }
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
            state.restore_dead(offset, dead);
        }
        // Each list above is in offset order; no offset may be in two of them.
        let highest = distinct_offsets(&state).map_err(CodecError::Inconsistent)?;
        if highest.is_some_and(|last| state.highest_enqueued.is_none_or(|h| last > h)) {
            return Err(CodecError::Inconsistent("offset above the highest enqueued"));
        }
        // --- Dedupe section (generation files: version 3) ---
        let mut dead_through = None;
        let mut references = Vec::new();
        if version >= SNAPSHOT_VERSION {
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
        if version >= SNAPSHOT_VERSION {
            state.stored = read_stored(&mut r, &state)?;
        }
        if r.at != body.len() {
            return Err(CodecError::Inconsistent("trailing bytes"));
        }
        Ok(PendingRestore { state, covers, dead_through, references, inline })
    }
}

// --- Dedupe generation files: what a checkpoint writes once per sealed
// generation, and the second half of a restore. ---

/// A snapshot decoded but for its dedupe entries, which wait for the
/// generation files it refers to (see [`PartitionState::restore_begin`]).
#[derive(Debug)]
pub struct PendingRestore<'a> {
    state: PartitionState,
    covers: Offset,
    dead_through: Option<Millis>,
    references: Vec<GenerationRef>,
    inline: &'a [u8],
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
// --- End of dedupe generation files. ---
