//! Recovery: turn whatever a crash left in a partition directory into a log
//! whose every batch is valid, contiguous, and followed only by zeros.
//!
//! Per segment, oldest first: every batch is parsed and crc-checked and its
//! base offset must continue the previous one. The log ends at the first
//! all-zero header. What follows the end must be zeros, except in the last
//! segment within the in-flight window (`LogConfig::recovery_window_bytes`)
//! of the last non-zero byte: that is a torn group of commits that nobody was
//! told about, and it is cut — overwritten with zeros and synced, with a
//! filler closing the page where the log now ends — before any append.
//! Anything else (a bad batch further back, junk after a sealed segment, a
//! gap between segments) is corruption: `open` fails naming file and byte.
//!
//! With a scan bound (`Log::open_from`, DESIGN §2: "recovery scans forward
//! from the last checkpoint"), a sealed segment whose every offset is below
//! the bound is not read at all: its extent (data end, next offset) and its
//! sparse index come from its persisted index file, which carries its own
//! crc. Such a segment is *trusted*, not verified: its batches are
//! crc-checked when they are read (`reader.rs`), so a bit flip there is
//! reported as `LogError::Corrupt` by the read that meets it, never served.
//! A sealed segment without a valid index file, the segment holding the
//! bound, every later one and the tail get the full scan.
//!
//! With a resume point as well (`Log::open_from_resume`: the position of an
//! indexed batch below the bound in the segment holding it, recorded with
//! the checkpoint), that segment's scan starts at the point instead of at
//! position 0: the bytes before it are trusted like a sealed segment's
//! indexed part (its sparse index comes from the point; its batches are
//! crc-checked when read). The batch at the point must parse, pass both
//! crcs and carry the point's offset; otherwise the point is stale or
//! wrong and the segment is scanned from its start. From the point on the
//! scan, the torn-tail rule and the repair are those of the full scan.
//!
//! What recovery keeps it makes durable before the log serves: a process
//! killed between a write and its fdatasync leaves bytes every later read
//! sees but no sync covered, and a reply built on them (a duplicate enqueue
//! answered with its original offset) would call them durable. So every
//! scanned segment is fdatasynced and the directory synced (names created or
//! removed by a previous process, or by this recovery) before `recover`
//! returns. Trusted segments lie below a checkpoint, which is written only
//! after everything it covers was synced.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use spool_wire::batch::{write_filler, BatchHeader, BatchKind, FILLER_WATERMARK_NONE};
use spool_wire::limits::BATCH_HEADER_BYTES;
use spool_wire::WireError;

use super::config::LogConfig;
use super::disk::write_index_file;
use super::error::{CorruptDetail, LogError};
use super::index::{IndexEntry, PersistedIndex, ResumePoint, SparseIndex, INDEX_FILE_BYTES_MAX};
use super::layout::{
    index_path, page_ceil, page_floor, parse_name, segment_path, INDEX_SUFFIX, PREPARED_FILE_NAME,
    SEGMENT_SUFFIX,
};
use super::reserve::{self, Claim, RESERVE_FILE_NAME};
use super::window::Window;
use super::{Offset, RecoveryReport};
use crate::io::{create_dir_durable, Storage, StorageFile};
use crate::limits::{FILLER_BYTES_MIN, PAGE_BYTES, SCAN_CHUNK_BYTES, SEGMENTS_MAX};

pub(crate) struct RecoveredSegment<F> {
    pub base: u64,
    pub path: PathBuf,
    pub file: Rc<F>,
    pub capacity: u64,
    pub index: SparseIndex,
    pub data_end: u64,
    pub next_offset: u64,
}

pub(crate) struct Recovered<F> {
    pub segments: Vec<RecoveredSegment<F>>,
    /// The reservation file (created empty when missing) and the claim it
    /// durably records (synced before `recover` returns).
    pub reserve_file: Rc<F>,
    pub reserve_claim: Option<Claim>,
    /// Where the next commit starts in the last segment (page-aligned).
    pub next_commit_pos: u64,
    /// The last segment ends with a witness page (or holds no commit): no
    /// acknowledged commit at the tail lacks a later watermark.
    pub tail_witnessed: bool,
    pub report: RecoveryReport,
}

struct Scan {
    /// End of the valid batches.
    end: u64,
    /// End of the valid batches without the witness pages that trail them
    /// (a filler that starts on a page boundary is a commit of its own: a
    /// witness page, past the data end the log indexed).
    data_end: u64,
    next_offset: u64,
    batches: u64,
    index: SparseIndex,
    /// Exclusive end of non-zero bytes after `end`, if any.
    dirty_end: Option<u64>,
    /// Why the scan stopped at `end`, when it was not a clean zero header.
    stop: Option<CorruptDetail>,
    /// The highest leader epoch in a valid batch header (0: none).
    highest_epoch: u32,
    /// Bytes read from the segment file.
    read_bytes: u64,
    /// Where the search for non-zero bytes after `end` stopped: the
    /// reservation's bound when it held, else the capacity.
    search_end: u64,
    /// A reservation bound was given but valid batches reach past it.
    bound_rejected: bool,
}

/// Recovers the log in `dir`. `trust_below`: sealed segments whose persisted
/// index says they end at or below this offset are not scanned (see the
/// module docs); `None` scans everything. `resume`: where the scan of the
/// segment it names may start, used only with a bound above its offset.
pub(crate) async fn recover<S: Storage>(
    storage: &S,
    dir: &Path,
    config: &LogConfig,
    leader_epoch: u32,
    trust_below: Option<u64>,
    resume: Option<&ResumePoint>,
) -> Result<Recovered<S::File>, LogError> {
    create_dir_durable(storage, dir).await?;
    let mut report = RecoveryReport::default();
    let mut bases = Vec::new();
    let mut index_bases = BTreeSet::new();
    let mut stale = Vec::new();
    for name in storage.list_dir(dir).await? {
        if let Some(base) = parse_name(&name, SEGMENT_SUFFIX) {
            bases.push(base);
        } else if let Some(base) = parse_name(&name, INDEX_SUFFIX) {
            index_bases.insert(base);
        } else if name == PREPARED_FILE_NAME {
            stale.push(dir.join(name));
        }
    }
    bases.sort_unstable();
    if bases.len() > SEGMENTS_MAX {
        return Err(LogError::TooManySegments { count: bases.len() });
    }
    // A prepared file is never named in the log; an index without a sealed
    // segment is left over from retention or a crash during a roll.
    let sealed: BTreeSet<u64> = bases.iter().rev().skip(1).copied().collect();
    for base in &index_bases {
        if !sealed.contains(base) {
            stale.push(index_path(dir, *base));
        }
    }
    // The directory sync before `recover` returns makes these durable.
    for path in &stale {
        storage.remove(path).await?;
    }
    report.stale_files_removed = stale.len();
    // The reservation file: which segment holds zeros from which position
    // on (`reserve.rs`). Read as it is; synced below whatever it holds, so
    // the claim the log continues from is the durable one.
    let reserve_file = storage.open(&dir.join(RESERVE_FILE_NAME)).await?;
    let reserve_len = reserve_file.len_bytes().await?;
    let mut claim = None;
    if reserve_len > 0 {
        let bytes = reserve_file.read_at(0, PAGE_BYTES as usize).await?;
        claim = reserve::decode(&bytes);
    }
    if bases.is_empty() {
        // No zero-filled segment until the first append needs one (the
        // roll then renames the prepared file over this name): an empty
        // log costs an empty file, named durably by the directory sync
        // below.
        storage.open(&segment_path(dir, 0)).await?;
        bases.push(0);
        report.created = true;
    }

    let mut segments = Vec::with_capacity(bases.len());
    // Scanned segments: what they hold may never have been synced.
    let mut scanned: Vec<Rc<S::File>> = Vec::new();
    let mut next_commit_pos = 0;
    let mut tail_witnessed = false;
    let mut expected: Option<u64> = None;
    for (slot, base) in bases.iter().copied().enumerate() {
        let is_last = slot + 1 == bases.len();
        let path = segment_path(dir, base);
        if let Some(expected) = expected {
            if base != expected {
                return Err(LogError::Corrupt {
                    path,
                    pos: 0,
                    detail: CorruptDetail::SegmentGap { expected, found: base },
                });
            }
        }
        let file = storage.open(&path).await?;
        let capacity = page_ceil(file.len_bytes().await?);
        if let Some(bound) = trust_below.filter(|_| !is_last && index_bases.contains(&base)) {
            if let Some(trusted) = trusted_extent(storage, dir, base, capacity, bound).await? {
                expected = Some(trusted.next_offset);
                report.segments_trusted += 1;
                segments.push(RecoveredSegment {
                    base,
                    path,
                    file: Rc::new(file),
                    capacity,
                    index: trusted.index,
                    data_end: trusted.data_end,
                    next_offset: trusted.next_offset,
                });
                continue;
            }
        }
        let resume_here = resume.filter(|point| {
            point.base == base
                && trust_below.is_some_and(|bound| point.offset < bound)
                && point.pos < capacity
        });
        let zeros_from = claim.filter(|claim| claim.base == base).map(|claim| claim.bound);
        let mut scan = None;
        if let Some(point) = resume_here {
            scan = scan_segment(&file, base, capacity, config, Some(point), zeros_from).await?;
            match &scan {
                Some(_) => report.resumed_at = Some((path.clone(), point.pos)),
                None => report.resume_rejected = true,
            }
        }
        let scan = match scan {
            Some(scan) => scan,
            None => match scan_segment(&file, base, capacity, config, None, zeros_from).await? {
                Some(scan) => scan,
                None => unreachable!("a scan from the segment start is never rejected"),
            },
        };
        report.scan_bytes_read += scan.read_bytes;
        report.reserve_rejected |= scan.bound_rejected;
        if is_last && scan.search_end < capacity {
            report.reserve_bound = Some(scan.search_end);
        }
        let mut end = scan.end;
        if let Some(dirty_end) = scan.dirty_end {
            let in_window = dirty_end - scan.end <= config.recovery_window_bytes();
            if !is_last || !in_window {
                let detail = scan
                    .stop
                    .clone()
                    .unwrap_or(CorruptDetail::DataAfterEnd { nonzero_until: dirty_end });
                return Err(LogError::Corrupt { path, pos: scan.end, detail });
            }
            // Damage or a torn tail? A torn tail lies past every commit that
            // was durable; an intact later commit that recorded a watermark
            // above the stop point proves the stop point was durable.
            let (watermark, read) = highest_watermark_after(&file, scan.end, dirty_end).await?;
            report.scan_bytes_read += read;
            if let Some(watermark) = watermark.filter(|watermark| *watermark > scan.next_offset) {
                let detail = CorruptDetail::BelowWatermark {
                    offset: scan.next_offset,
                    watermark,
                    damage: scan.stop.clone().map(Box::new),
                };
                return Err(LogError::Corrupt { path, pos: scan.end, detail });
            }
            report.truncated_at = Some((path.clone(), scan.end));
            report.truncated_bytes = dirty_end - scan.end;
        }
        if is_last {
            // The repair's filler may end a page past the bound (a filler
            // lost from the last page below it): the claim moves first.
            if let Some(bound) = zeros_from.filter(|bound| *bound == scan.search_end) {
                let reach = page_ceil(scan.end + FILLER_BYTES_MIN).min(capacity);
                if !scan.end.is_multiple_of(PAGE_BYTES) && reach > bound {
                    let moved = Claim { base, bound: reach };
                    reserve::write_claim(&reserve_file, moved).await.map_err(|(_, e)| e)?;
                    claim = Some(moved);
                }
            }
            end = repair_tail(&file, &scan, capacity, leader_epoch).await?;
            // Trailing witness pages hold no acknowledged byte: the next
            // commit reuses the first one's page, as it would have before
            // the restart (one page per commit, never a page per restart).
            if end == scan.end && scan.data_end < scan.end {
                end = scan.data_end;
                tail_witnessed = true;
            }
            tail_witnessed |= scan.batches == 0;
            next_commit_pos = end;
        } else {
            let has_index = index_bases.contains(&base);
            check_index(storage, dir, base, has_index, &scan, &mut report).await?;
        }
        report.batches += scan.batches;
        report.highest_epoch = report.highest_epoch.max(scan.highest_epoch);
        expected = Some(scan.next_offset);
        let file = Rc::new(file);
        scanned.push(file.clone());
        segments.push(RecoveredSegment {
            base,
            path,
            file,
            capacity,
            index: scan.index,
            data_end: end,
            next_offset: scan.next_offset,
        });
    }
    // Durable before anything is served from it (see the module docs).
    for file in &scanned {
        file.fdatasync().await?;
    }
    if reserve_len > 0 {
        // What a killed process wrote and did not sync is readable here: the
        // log's rule (nothing past a claim that a crash could leave) must
        // hold for the claim it continues from.
        reserve_file.fdatasync().await?;
    }
    storage.sync_dir(dir).await?;
    report.segments_synced = scanned.len();
    report.segments = segments.len();
    report.next_offset = Offset(expected.unwrap_or(0));
    Ok(Recovered {
        segments,
        reserve_file: Rc::new(reserve_file),
        reserve_claim: claim,
        next_commit_pos,
        tail_witnessed,
        report,
    })
}

/// Reads every batch of one segment from position 0 (or from `resume`),
/// then finds how far non-zero bytes reach after the last valid one: up to
/// `zeros_from` (the reservation's bound for this segment) when the valid
/// batches end at or below it, else up to the capacity.
/// `None` only with `resume`, when the batch at its position is not a valid
/// data or control batch with its offset: the point is stale or wrong.
async fn scan_segment<F: StorageFile>(
    file: &F,
    base: u64,
    capacity: u64,
    config: &LogConfig,
    resume: Option<&ResumePoint>,
    zeros_from: Option<u64>,
) -> Result<Option<Scan>, LogError> {
    let header_bytes = BATCH_HEADER_BYTES as u64;
    let mut window = Window::new(file, SCAN_CHUNK_BYTES);
    if let Some(bound) = zeros_from {
        // The page at the bound is read too (the probe below).
        window = window.ahead_until(bound.min(capacity) + PAGE_BYTES);
    }
    let mut pos = 0u64;
    let mut expected = base;
    let mut index = SparseIndex::default();
    if let Some(point) = resume {
        // The prefix is trusted: its index continues from the point's, so
        // the entries placed from here are those a full scan would place.
        pos = point.pos;
        expected = point.offset;
        index = point.index.clone();
    }
    let mut last_index_pos = index.last_pos();
    let mut data_end = pos;
    let mut batches = 0;
    let mut highest_epoch = 0u32;
    let mut verify_first = resume.is_some();
    let stop = loop {
        if pos + header_bytes > capacity {
            break None;
        }
        let mut header_raw = [0u8; BATCH_HEADER_BYTES];
        let got = window.get(pos, header_bytes).await?;
        header_raw[..got.len()].copy_from_slice(got);
        if header_raw.iter().all(|byte| *byte == 0) {
            break None;
        }
        let header = match BatchHeader::parse(&header_raw) {
            Ok(header) => header,
            Err(error) => break Some(CorruptDetail::Batch(error)),
        };
        let len = u64::from(header.batch_len);
        if pos + len > capacity {
            break Some(CorruptDetail::PastSegmentEnd { batch_len: header.batch_len, capacity });
        }
        let bytes = window.get(pos, len).await?;
        if (bytes.len() as u64) < len {
            let truncated = WireError::Truncated { needed: len as usize, available: bytes.len() };
            break Some(CorruptDetail::Batch(truncated));
        }
        if let Err(error) = BatchHeader::verify(bytes) {
            break Some(CorruptDetail::Batch(error));
        }
        if header.base_offset != expected {
            break Some(CorruptDetail::OffsetGap { expected, found: header.base_offset });
        }
        if verify_first {
            if header.kind == BatchKind::Filler {
                break Some(CorruptDetail::OffsetGap { expected, found: header.base_offset });
            }
            verify_first = false;
        }
        highest_epoch = highest_epoch.max(header.leader_epoch);
        if header.kind != BatchKind::Filler {
            batches += 1;
            if header.record_count > 0
                && last_index_pos.is_none_or(|last| pos >= last + config.index_interval_bytes)
            {
                index.push(IndexEntry { offset: header.base_offset, pos });
                last_index_pos = Some(pos);
            }
        }
        let witness = header.kind == BatchKind::Filler && pos.is_multiple_of(PAGE_BYTES);
        expected = header.next_offset();
        pos += len;
        if !witness {
            data_end = pos;
        }
    };
    if verify_first {
        // The batch at the resume point did not verify (or is a filler, or
        // zeros): not the batch the point names.
        return Ok(None);
    }
    // Every byte the committers wrote lies below the bound (they extend it
    // durably first). Valid batches past it, or a non-zero byte in the page
    // at it, mean the claim is not this segment's (stale or bogus): search
    // to the capacity, as without one.
    let mut search_end = capacity;
    let mut bound_rejected = false;
    if let Some(bound) = zeros_from.map(|bound| bound.min(capacity)) {
        let probe_clean =
            bound >= capacity || window.get(bound, PAGE_BYTES).await?.iter().all(|byte| *byte == 0);
        if pos <= bound && probe_clean {
            search_end = bound;
        } else {
            bound_rejected = true;
        }
    }
    let mut dirty_end = None;
    let mut at = pos;
    while at < search_end {
        let len = SCAN_CHUNK_BYTES.min(search_end - at);
        let bytes = window.get(at, len).await?;
        if bytes.is_empty() {
            break;
        }
        if let Some(last) = bytes.iter().rposition(|byte| *byte != 0) {
            dirty_end = Some(at + last as u64 + 1);
        }
        at += bytes.len() as u64;
    }
    Ok(Some(Scan {
        end: pos,
        data_end,
        next_offset: expected,
        batches,
        index,
        dirty_end,
        stop,
        highest_epoch,
        read_bytes: window.read_bytes(),
        search_end,
        bound_rejected,
    }))
}

/// The highest durable watermark recorded by an intact filler in the pages
/// of `(from, dirty_end)`: every commit starts on a page boundary, so each
/// page boundary past `from` is tried as a commit start and the batches
/// found there are followed (crcs checked) to the commit's filler. Bytes
/// that do not verify are skipped to the next page boundary. The search
/// runs to the end of the page holding `dirty_end`, not to `dirty_end`
/// itself: a filler's body is zeros and its header may end in zero bytes,
/// so the last non-zero byte can lie inside the header of the very filler
/// that vouches (a watermark page is nothing but that filler).
/// Also returns the bytes it read.
async fn highest_watermark_after<F: StorageFile>(
    file: &F,
    from: u64,
    dirty_end: u64,
) -> Result<(Option<u64>, u64), LogError> {
    let header_bytes = BATCH_HEADER_BYTES as u64;
    let limit = page_ceil(dirty_end);
    let mut window = Window::new(file, SCAN_CHUNK_BYTES).ahead_until(limit);
    let mut highest = None;
    let mut page = page_floor(from) + PAGE_BYTES;
    while page + header_bytes <= limit {
        let mut pos = page;
        // Follow the batches of the commit that may start at `page`.
        while pos + header_bytes <= limit {
            let Ok(header) = BatchHeader::parse(window.get(pos, header_bytes).await?) else {
                break;
            };
            let len = u64::from(header.batch_len);
            let bytes = window.get(pos, len).await?;
            if (bytes.len() as u64) < len || BatchHeader::verify(bytes).is_err() {
                break;
            }
            if let Some(watermark) = header.filler_watermark() {
                highest = highest.max(Some(watermark));
            }
            pos += len;
        }
        page = page_ceil(pos.max(page + 1));
    }
    Ok((highest, window.read_bytes()))
}

/// Makes the last segment end cleanly on a page boundary: zero the torn
/// region, close the partial page at `scan.end` with a filler (the caller
/// syncs every scanned segment before the log serves). Returns
/// where the next commit starts. Only pages holding no acknowledged byte are
/// rewritten: the partial page at the end belongs to the commit that was in
/// flight (commits start on fresh pages).
async fn repair_tail<F: StorageFile>(
    file: &F,
    scan: &Scan,
    capacity: u64,
    leader_epoch: u32,
) -> Result<u64, LogError> {
    let end = scan.end;
    let aligned = end.is_multiple_of(PAGE_BYTES);
    if aligned && scan.dirty_end.is_none() {
        return Ok(end);
    }
    let mut next_commit_pos = page_ceil(end + FILLER_BYTES_MIN);
    let mut filler_end = next_commit_pos;
    if aligned {
        next_commit_pos = end;
        filler_end = end;
    } else if next_commit_pos > capacity {
        // No room for a filler: the segment is full; the next append rolls.
        next_commit_pos = capacity;
        filler_end = end;
    }
    let zero_end = page_ceil(scan.dirty_end.unwrap_or(0)).max(filler_end).min(capacity.max(end));
    let write_start = page_floor(end);
    let write_end = page_ceil(zero_end.max(end));
    if write_end <= write_start {
        return Ok(next_commit_pos);
    }
    let mut buf = file.alloc_buf((write_end - write_start) as usize);
    buf.as_mut().fill(0);
    if end > write_start {
        let mut window = Window::new(file, PAGE_BYTES);
        let prefix = window.get(write_start, end - write_start).await?;
        assert_eq!(prefix.len() as u64, end - write_start, "valid batches were just read");
        buf.as_mut()[..prefix.len()].copy_from_slice(prefix);
    }
    if filler_end > end {
        let from = (end - write_start) as usize;
        let len = (filler_end - end) as usize;
        // No watermark: what this repair keeps is made durable only by the
        // syncs at the end of `recover`, after this write.
        let filler = &mut buf.as_mut()[from..from + len];
        write_filler(filler, len, scan.next_offset, leader_epoch, FILLER_WATERMARK_NONE);
    }
    file.write_at(Rc::new(buf), write_start).await?;
    Ok(next_commit_pos)
}

/// The persisted index of sealed segment `base`, if it decodes (crc, magic,
/// base) and is structurally consistent with the segment: data end within the
/// file, next offset not before the base, every entry inside both ranges.
/// `None`: no usable index (the caller scans).
async fn read_index<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
) -> Result<Option<PersistedIndex>, LogError> {
    let file = storage.open(&index_path(dir, base)).await?;
    let len = file.len_bytes().await?;
    if len > INDEX_FILE_BYTES_MAX {
        return Ok(None);
    }
    let bytes = file.read_at(0, page_ceil(len) as usize).await?;
    Ok(SparseIndex::decode(&bytes, base))
}

/// The extent of a sealed segment taken from its index file without reading
/// the segment, when the index is usable and the whole segment lies below
/// `bound`. `None`: scan it.
async fn trusted_extent<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
    capacity: u64,
    bound: u64,
) -> Result<Option<PersistedIndex>, LogError> {
    let Some(persisted) = read_index(storage, dir, base).await? else { return Ok(None) };
    let consistent = persisted.next_offset >= base
        && persisted.next_offset <= bound
        && persisted.data_end <= capacity
        && persisted.index.entries().iter().all(|entry| {
            entry.offset >= base
                && entry.offset < persisted.next_offset
                && entry.pos < persisted.data_end
        });
    Ok(consistent.then_some(persisted))
}

/// Keeps a sealed segment's persisted index if it matches the scan; rewrites
/// it otherwise.
async fn check_index<S: Storage>(
    storage: &S,
    dir: &Path,
    base: u64,
    has_index: bool,
    scan: &Scan,
    report: &mut RecoveryReport,
) -> Result<(), LogError> {
    let mut valid = false;
    if has_index {
        // A segment sealed after a witness page ends with that page past
        // the data end the log indexed.
        valid = read_index(storage, dir, base).await?.is_some_and(|persisted| {
            persisted.index == scan.index
                && (persisted.data_end == scan.end || persisted.data_end == scan.data_end)
                && persisted.next_offset == scan.next_offset
        });
    }
    if !valid {
        let bytes = scan.index.encode(base, scan.end, scan.next_offset);
        write_index_file(storage, dir, base, &bytes).await?;
        report.indexes_rebuilt += 1;
    }
    Ok(())
}
