//! A partition's log as replication uses it, on the simulated disk
//! (`docs/design/shard-journal.md` §14): leader appends, follower appends
//! at (index, term), truncation of an uncommitted suffix and commit
//! markers across several partitions of one shard journal, with a crash
//! image recovered and checked at every write, sync, open, rename, remove
//! and directory-sync boundary. Each recovered partition holds a dense
//! log from index 1, every entry that was answered and not cancelled, never
//! an entry whose truncation marker was answered, and a committed index at
//! least what an answered commit marker recorded. Reads by entry index
//! (`read_entries`, §14.5) are checked against the model live and on every
//! recovered image, and on their own: bounds, typed errors, entries not yet
//! durable, truncation, reopen and released files.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

mod journal_common;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use journal_common::{drive, open_shard, payload, Rng, SHARD};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::journal::{
    journal_file_path, write_filler, EntryHeader, HeaderForm, IndexedEntry, JournalError,
    JournalPartition, JournalPos, JournalTicket, LogFloor, LogMode, PartitionHandle, ShardJournal,
    ShardRecovery, V1_HEADER_BYTES,
};
use spool_broker::log::Offset;
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;
use spool_wire::proto::PartitionId;

const EPOCH: u32 = 2;
const PARTITIONS: u32 = 3;

/// One entry ever appended to a partition's log.
struct Appended {
    index: u64,
    term: u64,
    /// The batch body (what stamping offsets never changes).
    body: Vec<u8>,
    ticket: JournalTicket,
    /// The truncation that cancels it, once one started: set once the
    /// truncation returned (its marker answered durable).
    cancelled_by: Option<Rc<Cell<bool>>>,
}

/// What the workload did to one partition.
#[derive(Default)]
struct Model {
    appended: Vec<Appended>,
    /// Committed indexes whose marker was answered durable.
    commits: Vec<u64>,
}

type Models = Rc<RefCell<BTreeMap<PartitionHandle, Model>>>;

fn answered(ticket: &JournalTicket) -> bool {
    matches!(ticket.status(), Some(Ok(())))
}

fn open_partitions(
    shard: &Rc<ShardJournal<SimStorage>>,
    recovery: &ShardRecovery,
) -> BTreeMap<PartitionHandle, JournalPartition<SimStorage>> {
    shard
        .handles()
        .entries()
        .into_iter()
        .map(|(handle, _)| {
            let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
            let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
            let part = shard
                .replicated_partition(handle, routed, log, Offset(0), EPOCH, LogFloor::default())
                .unwrap();
            (handle, part)
        })
        .collect()
}

/// Recovers `image` and checks every partition against the model.
/// Returns the entries recovered in all.
fn check_image(image: &SimStorage, models: &Models) -> u64 {
    let (shard, recovery) = open_shard(image, JournalPos(0));
    let parts = open_partitions(&shard, &recovery);
    let models = models.borrow();
    let mut total = 0;
    for (handle, part) in &parts {
        let model = models.get(handle).map_or(&[][..], |model| &model.appended[..]);
        let mut routed = recovery.routed.partitions.get(handle).cloned().unwrap_or_default();
        routed.sort_by_key(|entry| entry.entry_index);
        // Dense from 1, each index once.
        for (at, entry) in routed.iter().enumerate() {
            assert_eq!(entry.entry_index, at as u64 + 1, "partition {handle}: dense indexes");
        }
        assert_eq!(part.last_index(), routed.len() as u64);
        // Each recovered entry is one the workload appended at that index,
        // byte for byte in its body, and not one an answered marker cancelled.
        let positions: Vec<JournalPos> = routed.iter().map(|entry| entry.position).collect();
        let batches = block_on(shard.journal().read_entries(&positions, 1 << 20)).unwrap();
        for (entry, batch) in routed.iter().zip(&batches) {
            let body = &batch.bytes[BATCH_HEADER_BYTES..];
            let candidates: Vec<&Appended> = model
                .iter()
                .filter(|appended| appended.index == entry.entry_index && appended.body == body)
                .collect();
            assert_eq!(candidates.len(), 1, "partition {handle} index {}", entry.entry_index);
            let found = candidates[0];
            assert_eq!(found.term, entry.term);
            if let Some(marker) = &found.cancelled_by {
                assert!(
                    !marker.get(),
                    "partition {handle}: entry {} was cancelled by an answered truncation",
                    entry.entry_index
                );
            }
        }
        // Every answered entry nothing cancelled is there.
        for appended in model.iter().filter(|a| a.cancelled_by.is_none() && answered(&a.ticket)) {
            let at = (appended.index - 1) as usize;
            assert!(
                at < routed.len() && batches[at].bytes[BATCH_HEADER_BYTES..] == appended.body[..],
                "partition {handle}: answered entry {} lost",
                appended.index
            );
        }
        // Read by index, the reopened log is the same entries, byte for byte.
        assert_eq!(part.first_index(), 1, "partition {handle}: nothing released");
        let read = read_all(part);
        assert_eq!(read.len(), routed.len(), "partition {handle}: read by index");
        for ((read, entry), batch) in read.iter().zip(&routed).zip(&batches) {
            assert_eq!((read.index, read.term), (entry.entry_index, entry.term));
            assert_eq!(&read.batch.bytes[..], &batch.bytes[..], "partition {handle}");
        }
        // The committed index is at least what an answered marker said.
        let answered_commit =
            models.get(handle).and_then(|model| model.commits.iter().max().copied()).unwrap_or(0);
        let committed = part.committed_index();
        assert!(committed >= answered_commit, "partition {handle}: committed {committed}");
        assert!(committed <= part.last_index());
        total += routed.len() as u64;
    }
    total
}

/// Every entry of `part` from its first index on, read by index in reads
/// of at most 4 KiB.
fn read_all(part: &JournalPartition<SimStorage>) -> Vec<IndexedEntry> {
    let mut all = Vec::new();
    let mut low = part.first_index();
    while low <= part.last_index() {
        let read = block_on(part.read_entries(low, u64::MAX, 4096)).unwrap();
        assert!(!read.is_empty());
        low += read.len() as u64;
        all.extend(read);
    }
    all
}

/// Checks a live read by index of `part` against its model: each entry is
/// the one appended last at its index (not cancelled), body and term.
fn check_live_read(
    part: &JournalPartition<SimStorage>,
    model: Option<&Model>,
    read: &[IndexedEntry],
) {
    let appended = model.map_or(&[][..], |model| &model.appended[..]);
    for entry in read {
        let found = appended
            .iter()
            .rev()
            .find(|a| a.index == entry.index && a.cancelled_by.is_none())
            .unwrap_or_else(|| panic!("entry {} read, never appended", entry.index));
        assert_eq!(found.term, entry.term, "entry {}", entry.index);
        assert_eq!(
            found.body[..],
            entry.batch.bytes[BATCH_HEADER_BYTES..],
            "entry {}",
            entry.index
        );
        assert!(entry.index <= part.last_index());
    }
}

/// The bytes of a `kind` batch with body `tag`, stamped to continue `part`.
fn follower_batch(part: &JournalPartition<SimStorage>, kind: BatchKind, tag: u64) -> Vec<u8> {
    let mut bytes = payload(kind, 40 + (tag as usize * 29) % 600, tag);
    BatchHeader::assign(&mut bytes, part.next_offset().0, EPOCH);
    bytes
}

/// Runs one seeded workload with the crash checker installed; returns
/// (images checked, truncations done).
fn explore(seed: u64, steps: usize) -> (u64, u64) {
    let disk = SimStorage::new();
    let (shard, recovery) = open_shard(&disk, JournalPos(0));
    for p in 0..PARTITIONS {
        block_on(shard.register(7, PartitionId(p))).unwrap();
    }
    let parts = open_partitions(&shard, &recovery);
    assert!(parts.values().all(|part| part.log_mode() == LogMode::Replicated));
    let models: Models = Rc::new(RefCell::new(BTreeMap::new()));
    let explored = Rc::new(Cell::new(0u64));
    {
        let models = models.clone();
        let explored = explored.clone();
        let mut rng = Rng(seed ^ 0x5151);
        disk.set_hook(move |disk, _op, _count| {
            let mut modes = vec![CrashMode::DurableOnly, CrashMode::AllWritten];
            if rng.below(3) == 0 {
                modes.push(CrashMode::PowerLoss { seed: rng.next() });
            }
            for mode in modes {
                check_image(&disk.crash_image(mode), &models);
                explored.set(explored.get() + 1);
            }
        });
    }
    let handles: Vec<PartitionHandle> = parts.keys().copied().collect();
    let truncations = Cell::new(0u64);
    let reads = Cell::new(0u64);
    block_on(drive(shard.journal(), async {
        let mut rng = Rng(seed);
        let mut tag = seed * 1_000_000;
        let mut terms: BTreeMap<PartitionHandle, u64> =
            handles.iter().map(|handle| (*handle, u64::from(EPOCH))).collect();
        // The highest commit index given to each (the committed index may
        // lag it until the entries are durable; truncation stays above it).
        let mut targets: BTreeMap<PartitionHandle, u64> = BTreeMap::new();
        for _ in 0..steps {
            let handle = handles[rng.below(handles.len() as u64) as usize];
            let part = &parts[&handle];
            tag += 1;
            let kind = if rng.below(3) == 0 { BatchKind::Control } else { BatchKind::Data };
            match rng.below(12) {
                0..=3 => {
                    // A leader's own append.
                    let bytes = payload(kind, 40 + (tag as usize * 31) % 900, tag);
                    let appended = part.append(&bytes).unwrap();
                    let index = part.last_index();
                    let mut models = models.borrow_mut();
                    models.entry(handle).or_default().appended.push(Appended {
                        index,
                        term: terms[&handle],
                        body: bytes[BATCH_HEADER_BYTES..].to_vec(),
                        ticket: appended.ticket,
                        cancelled_by: None,
                    });
                }
                4..=6 => {
                    // A follower's append at (last + 1, term), sometimes a new term.
                    if rng.below(4) == 0 {
                        *terms.get_mut(&handle).unwrap() += 1;
                    }
                    let term = terms[&handle];
                    let bytes = follower_batch(part, kind, tag);
                    let index = part.last_index() + 1;
                    let appended = part.append_at(index, term, &bytes, rng.below(2) == 0).unwrap();
                    models.borrow_mut().entry(handle).or_default().appended.push(Appended {
                        index,
                        term,
                        body: bytes[BATCH_HEADER_BYTES..].to_vec(),
                        ticket: appended.ticket,
                        cancelled_by: None,
                    });
                }
                7..=8 => {
                    // Cancel an uncommitted suffix.
                    let target = targets.get(&handle).copied().unwrap_or(0);
                    let (committed, last) = (part.committed_index().max(target), part.last_index());
                    if last <= committed {
                        continue;
                    }
                    let from = committed + 1 + rng.below(last - committed);
                    let marker = Rc::new(Cell::new(false));
                    {
                        let mut models = models.borrow_mut();
                        let model = models.entry(handle).or_default();
                        for appended in model.appended.iter_mut() {
                            if appended.index >= from && appended.cancelled_by.is_none() {
                                appended.cancelled_by = Some(marker.clone());
                            }
                        }
                    }
                    // The call's return is its marker's answer.
                    let cancelled = part.truncate_from(from).await.unwrap();
                    assert_eq!(cancelled.entries, last - from + 1);
                    assert_eq!(part.last_index(), from - 1);
                    marker.set(true);
                    truncations.set(truncations.get() + 1);
                    // Terms never go back along a log: the next append's
                    // term is at least the kept last entry's.
                    let kept_term = part.term_at(from - 1).unwrap_or(0);
                    let term = terms.get_mut(&handle).unwrap();
                    *term = (*term).max(kept_term);
                }
                9 => {
                    // A commit index from the "quorum": anywhere up to the last.
                    let last = part.last_index();
                    let committed = part.committed_index();
                    if last > committed {
                        let index = committed + 1 + rng.below(last - committed);
                        part.set_committed(index).unwrap();
                        let target = targets.entry(handle).or_default();
                        *target = (*target).max(index);
                    }
                }
                10 => {
                    let committed = part.persist_committed().await.unwrap();
                    models.borrow_mut().entry(handle).or_default().commits.push(committed);
                }
                _ => {
                    let last = models
                        .borrow()
                        .get(&handle)
                        .and_then(|model| model.appended.last().map(|a| a.ticket.clone()));
                    if let Some(ticket) = last {
                        ticket.durable().await.unwrap();
                        // Now every entry is durable: a read by index from a few below
                        // the committed index serves them all, committed or not.
                        let low = part.committed_index().saturating_sub(4).max(1);
                        let read = part.read_entries(low, u64::MAX, 1 << 20).await.unwrap();
                        assert_eq!(read.len() as u64, part.last_index() + 1 - low);
                        check_live_read(part, models.borrow().get(&handle), &read);
                        reads.set(reads.get() + 1);
                    }
                }
            }
        }
        for part in parts.values() {
            let (data, control) = part.last_tickets();
            for ticket in data.into_iter().chain(control) {
                ticket.durable().await.unwrap();
            }
        }
    }));
    disk.clear_hook();
    let total = check_image(&disk.crash_image(CrashMode::DurableOnly), &models);
    assert!(total > 0);
    assert!(reads.get() > 0, "no live read by index");
    (explored.get(), truncations.get())
}

#[test]
fn every_crash_point_keeps_the_committed_prefix_and_no_cancelled_entry() {
    // Goal: across leader appends, follower appends at (index, term), truncations and
    // commit markers of three partitions sharing one journal, a crash at any storage
    // boundary (durable bytes only, every write landed, or sectors at random) recovers
    // per partition a dense log from 1 holding every answered, uncancelled entry byte for
    // byte at its index and term, never an entry whose truncation was answered, with a
    // committed index at least the last answered commit marker's.
    let (mut total, mut truncated) = (0, 0);
    for seed in [3, 8] {
        let (explored, truncations) = explore(seed, 140);
        total += explored;
        truncated += truncations;
    }
    println!("explored {total} crash images over {truncated} truncations");
    assert!(total > 300, "explored {total}");
    assert!(truncated >= 10, "truncations exercised: {truncated}");
}

#[test]
fn follower_appends_and_truncations_keep_their_rules() {
    // Goal: a follower append must continue the log (index, term, data offset); nothing
    // at or below the committed index is cancelled; after a truncation the next append
    // takes the cancelled index and data offsets again; a reopened log keeps it all.
    let disk = SimStorage::new();
    let (shard, recovery) = open_shard(&disk, JournalPos(0));
    let handle = block_on(shard.register(3, PartitionId(0))).unwrap();
    let parts = open_partitions(&shard, &recovery);
    let part = &parts[&handle];
    block_on(drive(shard.journal(), async {
        for tag in 1..=4u64 {
            let bytes = follower_batch(part, BatchKind::Data, tag);
            part.append_at(tag, 5, &bytes, true).unwrap().ticket.durable().await.unwrap();
        }
        assert_eq!((part.last_index(), part.next_offset()), (4, Offset(4)));
        let gap = part.append_at(6, 5, &follower_batch(part, BatchKind::Data, 9), true);
        assert!(matches!(gap, Err(JournalError::IndexGap { expected: 5, got: 6 })));
        let behind = part.append_at(5, 4, &follower_batch(part, BatchKind::Data, 9), true);
        assert!(matches!(behind, Err(JournalError::TermBehind { last_term: 5, got: 4 })));
        let mut skewed = payload(BatchKind::Data, 40, 9);
        BatchHeader::assign(&mut skewed, 7, EPOCH);
        let skew = part.append_at(5, 5, &skewed, true);
        assert!(matches!(skew, Err(JournalError::OffsetMismatch { expected: 4, got: 7 })));
        assert_eq!(part.set_committed(2).unwrap(), 2);
        assert!(matches!(
            part.truncate_from(2).await,
            Err(JournalError::TruncateCommitted { from: 2, committed: 2 })
        ));
        assert!(matches!(part.set_committed(9), Err(JournalError::CommitPastLog { .. })));
        let cancelled = part.truncate_from(3).await.unwrap();
        assert_eq!((cancelled.entries, cancelled.data_from), (2, Some(2)));
        assert_eq!((part.last_index(), part.next_offset()), (2, Offset(2)));
        assert!(part.read(Offset(2), 1 << 20).await.unwrap().is_empty());
        let bytes = follower_batch(part, BatchKind::Data, 30);
        let appended = part.append_at(3, 6, &bytes, true).unwrap();
        assert_eq!(appended.base_offset, Offset(2));
        appended.ticket.durable().await.unwrap();
        assert_eq!(part.persist_committed().await.unwrap(), 2);
    }));
    let (shard, recovery) = open_shard(&disk.crash_image(CrashMode::DurableOnly), JournalPos(0));
    let parts = open_partitions(&shard, &recovery);
    let part = &parts[&handle];
    assert_eq!(recovery.routed.logs[&handle].cancelled, 2);
    assert_eq!((part.last_index(), part.committed_index()), (3, 2));
    assert_eq!((part.term_at(2), part.term_at(3)), (Some(5), Some(6)));
    assert_eq!(part.next_offset(), Offset(3));
}

#[test]
fn a_local_log_numbers_both_lanes_and_commits_by_durability() {
    // Goal: on one node every entry, data and control, takes the next index; the
    // committed index follows the durable prefix; a reopened log continues the numbering
    // (from the recovered entries, or from a checkpoint's floor when none survives).
    let disk = SimStorage::new();
    let (shard, _) = open_shard(&disk, JournalPos(0));
    let handle = block_on(shard.register(4, PartitionId(0))).unwrap();
    let part = shard.partition(handle, Vec::new(), Offset(0), EPOCH, 0).unwrap();
    block_on(drive(shard.journal(), async {
        let data = part.append(&payload(BatchKind::Data, 64, 1)).unwrap();
        let control = part.append(&payload(BatchKind::Control, 16, 2)).unwrap();
        assert_eq!(part.last_index(), 2);
        // A control entry takes no offset: its base is the next data offset.
        assert_eq!(control.base_offset, data.next_offset);
        data.ticket.durable().await.unwrap();
        control.ticket.durable().await.unwrap();
        assert_eq!(part.committed_index(), 2);
        assert!(matches!(part.set_committed(2), Err(JournalError::NotReplicated)));
        assert!(matches!(part.truncate_from(2).await, Err(JournalError::TruncateCommitted { .. })));
    }));
    let (shard, recovery) = open_shard(&disk.crash_image(CrashMode::DurableOnly), JournalPos(0));
    let routed = recovery.routed.partitions[&handle].clone();
    let indexes: Vec<u64> = routed.iter().map(|entry| entry.entry_index).collect();
    let mut sorted = indexes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![1, 2]);
    let part = shard.partition(handle, routed, Offset(0), EPOCH, 0).unwrap();
    assert_eq!((part.last_index(), part.committed_index()), (2, 2));
    let floored = shard.partition(handle, Vec::new(), Offset(1), EPOCH, 40).unwrap();
    assert_eq!(floored.last_index(), 40);
}

#[test]
fn an_older_journal_of_v1_entries_reopens_and_continues_in_v2() {
    // Goal: a data directory written before entry indexes (32-byte "SPJ1" headers) still
    // opens: its entries are routed and read by offset as before, outside the entry log
    // (index 0); new appends take v2 headers from index 1, and a reopen reads both forms.
    // Method: a shard journal whose first file is replaced by a hand-made v1 image (one
    // data entry of the registered partition, a v1 filler to the page end, zeros after).
    let disk = SimStorage::new();
    let (shard, _) = open_shard(&disk, JournalPos(0));
    let handle = block_on(shard.register(5, PartitionId(0))).unwrap();
    block_on(drive(shard.journal(), async {}));
    let file = journal_file_path(&Path::new(SHARD).join("journal"), 0);
    let mut image = vec![0u8; disk.file_bytes(&file).unwrap().len()];
    let mut old = payload(BatchKind::Data, 200, 77);
    BatchHeader::assign(&mut old, 0, 1);
    let entry_len = (V1_HEADER_BYTES + old.len()) as u32;
    EntryHeader {
        partition: handle,
        position: JournalPos(0),
        watermark: JournalPos(0),
        entry_len,
        entry_index: 0,
        term: 0,
        form: HeaderForm::V1,
    }
    .write_to(&mut image);
    image[V1_HEADER_BYTES..entry_len as usize].copy_from_slice(&old);
    write_filler(
        &mut image[entry_len as usize..4096],
        JournalPos(u64::from(entry_len)),
        JournalPos(0),
    );
    let disk = disk.crash_image(CrashMode::DurableOnly);
    disk.set_file_bytes(&file, image);
    let (shard, recovery) = open_shard(&disk, JournalPos(0));
    let routed = recovery.routed.partitions[&handle].clone();
    assert_eq!(routed.len(), 1);
    assert_eq!((routed[0].entry_index, routed[0].entry_len), (0, entry_len));
    let part = shard.partition(handle, routed, Offset(0), EPOCH, 0).unwrap();
    assert_eq!((part.last_index(), part.next_offset()), (0, Offset(1)));
    block_on(drive(shard.journal(), async {
        let new = part.append(&payload(BatchKind::Data, 100, 78)).unwrap();
        assert_eq!((new.base_offset, part.last_index()), (Offset(1), 1));
        new.ticket.durable().await.unwrap();
    }));
    let (shard, recovery) = open_shard(&disk.crash_image(CrashMode::DurableOnly), JournalPos(0));
    let routed = recovery.routed.partitions[&handle].clone();
    let indexes: Vec<u64> = routed.iter().map(|entry| entry.entry_index).collect();
    assert_eq!(indexes, vec![0, 1]);
    let part = shard.partition(handle, routed, Offset(0), EPOCH, 0).unwrap();
    block_on(drive(shard.journal(), async {
        let batches = part.read(Offset(0), 1 << 20).await.unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(&batches[0].bytes[BATCH_HEADER_BYTES..], &old[BATCH_HEADER_BYTES..]);
        assert_eq!(batches[1].header.base_offset, 1);
    }));
}

/// The batch `bytes` as a leader's own append stores it: stamped with its
/// base offset and the partition's epoch.
fn stamped(bytes: &[u8], base_offset: Offset) -> Vec<u8> {
    let mut stamped = bytes.to_vec();
    BatchHeader::assign(&mut stamped, base_offset.0, EPOCH);
    stamped
}

/// Reads `low..high` of `part` and checks it against `want` ((index, term,
/// bytes), dense from `low`).
fn assert_reads(part: &JournalPartition<SimStorage>, low: u64, want: &[(u64, u64, Vec<u8>)]) {
    let read = block_on(part.read_entries(low, u64::MAX, 1 << 20)).unwrap();
    let got: Vec<(u64, u64, Vec<u8>)> =
        read.iter().map(|e| (e.index, e.term, e.batch.bytes.to_vec())).collect();
    let want: Vec<(u64, u64, Vec<u8>)> =
        want.iter().filter(|(index, _, _)| *index >= low).cloned().collect();
    assert_eq!(got, want);
}

#[test]
fn entries_read_by_index_are_the_bytes_appended_at_their_index_and_term() {
    // Goal: a replicated partition serves its log by entry index — data and control,
    // committed and not, leader and follower appends — byte for byte at (index, term);
    // bounded by bytes with one entry at least; an entry not yet durable is refused with
    // a typed retry error (a read running into one stops before it); after a truncation
    // the cancelled entries are never returned and the new ones at the same indexes are;
    // a reopen from a crash image serves the same; out-of-range reads get typed errors.
    let disk = SimStorage::new();
    let (shard, recovery) = open_shard(&disk, JournalPos(0));
    let handle = block_on(shard.register(6, PartitionId(0))).unwrap();
    let parts = open_partitions(&shard, &recovery);
    let part = &parts[&handle];
    // What the log holds: (index, term, batch bytes).
    let mut log: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    block_on(drive(shard.journal(), async {
        for tag in 1..=6u64 {
            let kind = if tag % 3 == 0 { BatchKind::Control } else { BatchKind::Data };
            let bytes = payload(kind, 40 + tag as usize * 24, tag);
            let appended = part.append(&bytes).unwrap();
            log.push((part.last_index(), u64::from(EPOCH), stamped(&bytes, appended.base_offset)));
        }
        part.raise_term(3);
        for tag in 7..=10u64 {
            let kind = if tag == 8 { BatchKind::Control } else { BatchKind::Data };
            let bytes = follower_batch(part, kind, tag);
            let index = part.last_index() + 1;
            part.append_at(index, 3, &bytes, true).unwrap();
            log.push((index, 3, bytes));
        }
        // Nothing durable yet: a typed retry error.
        assert!(matches!(
            part.read_entries(1, 11, 1 << 20).await,
            Err(JournalError::EntryNotDurable { index: 1, durable_index: 0 })
        ));
        let (data, control) = part.last_tickets();
        for ticket in data.into_iter().chain(control) {
            ticket.durable().await.unwrap();
        }
        part.set_committed(4).unwrap();
        assert_eq!(part.committed_index(), 4);
        assert_reads(part, 1, &log);
        assert_reads(part, 3, &log);
        // Queued, not written: refused; a read running into it stops before it.
        let bytes = follower_batch(part, BatchKind::Data, 11);
        let queued = part.append_at(11, 3, &bytes, false).unwrap();
        assert!(matches!(
            part.read_entries(11, 12, 1 << 20).await,
            Err(JournalError::EntryNotDurable { index: 11, durable_index: 10 })
        ));
        assert_eq!(part.read_entries(9, 12, 1 << 20).await.unwrap().len(), 2);
        queued.ticket.durable().await.unwrap();
        log.push((11, 3, bytes));
        assert_reads(part, 1, &log);
        // Bounds: the first entry whatever its size, then as many as fit.
        let one = part.read_entries(2, 11, 1).await.unwrap();
        assert_eq!(one.len(), 1);
        let two = (log[1].2.len() + log[2].2.len()) as u64;
        assert_eq!(part.read_entries(2, 11, two).await.unwrap().len(), 2);
        assert_eq!(part.read_entries(2, 11, two - 1).await.unwrap().len(), 1);
        assert_eq!(part.read_entries(2, 5, 1 << 20).await.unwrap().len(), 3);
        assert!(part.read_entries(5, 5, 1 << 20).await.unwrap().is_empty());
        assert!(matches!(
            part.read_entries(0, 3, 1 << 20).await,
            Err(JournalError::Compacted { index: 0, first_index: 1 })
        ));
        assert!(matches!(
            part.read_entries(12, 13, 1 << 20).await,
            Err(JournalError::IndexPastLog { index: 12, last_index: 11 })
        ));
        assert!(matches!(
            part.read_entries(1, 2, u64::MAX).await,
            Err(JournalError::ReadTooLarge { .. })
        ));
        // A truncation: entries 7.. are cancelled, new ones take 7 and 8.
        let cancelled = part.truncate_from(7).await.unwrap();
        assert_eq!(cancelled.entries, 5);
        log.truncate(6);
        assert!(matches!(
            part.read_entries(7, 8, 1 << 20).await,
            Err(JournalError::IndexPastLog { index: 7, last_index: 6 })
        ));
        for tag in 20..=21u64 {
            let kind = if tag == 21 { BatchKind::Control } else { BatchKind::Data };
            let bytes = follower_batch(part, kind, tag);
            let index = part.last_index() + 1;
            part.append_at(index, 4, &bytes, true).unwrap().ticket.durable().await.unwrap();
            log.push((index, 4, bytes));
        }
        assert_reads(part, 1, &log);
        part.set_committed(7).unwrap();
        assert_eq!(part.persist_committed().await.unwrap(), 7);
        assert_reads(part, 5, &log);
        assert_eq!((part.term_at(2), part.term_at(7)), (Some(u64::from(EPOCH)), Some(4)));
    }));
    // Reopened from each crash image: the same entries, read the same way.
    for mode in [CrashMode::DurableOnly, CrashMode::AllWritten, CrashMode::PowerLoss { seed: 9 }] {
        let (shard, recovery) = open_shard(&disk.crash_image(mode), JournalPos(0));
        let parts = open_partitions(&shard, &recovery);
        let part = &parts[&handle];
        assert_eq!((part.first_index(), part.committed_index(), part.last_index()), (1, 7, 8));
        assert_reads(part, 1, &log);
        assert_reads(part, 6, &log);
        assert_eq!(part.term_at(3), Some(u64::from(EPOCH)));
    }
    // A partition in local mode keeps no positions by index: refused.
    let local = shard.partition(handle, Vec::new(), Offset(0), EPOCH, 0).unwrap();
    assert!(matches!(
        block_on(local.read_entries(1, 2, 1 << 20)),
        Err(JournalError::NotReplicated)
    ));
}

#[test]
fn entries_in_released_files_answer_compacted_naming_the_first_held() {
    // Goal: once the shard releases the journal files holding a replicated partition's
    // oldest committed entries, a read below what is left is a typed "compacted" error
    // naming the first index still held, and from that index on the log reads as
    // appended — also after a reopen from the oldest file left.
    let disk = SimStorage::new();
    let (shard, recovery) = open_shard(&disk, JournalPos(0));
    let handle = block_on(shard.register(8, PartitionId(0))).unwrap();
    let parts = open_partitions(&shard, &recovery);
    let part = &parts[&handle];
    let mut log: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let first = block_on(drive(shard.journal(), async {
        for tag in 1..=300u64 {
            let kind = if tag % 4 == 0 { BatchKind::Control } else { BatchKind::Data };
            let bytes = follower_batch(part, kind, tag);
            part.append_at(tag, 2, &bytes, tag % 50 == 0).unwrap();
            log.push((tag, 2, bytes));
        }
        let (data, _) = part.last_tickets();
        data.unwrap().durable().await.unwrap();
        part.set_committed(290).unwrap();
        part.persist_committed().await.unwrap();
        let journal = shard.journal();
        let released = journal.release_below(journal.newest_file()).await.unwrap();
        assert!(released.files >= 1, "the workload spans several files");
        let first = part.first_index();
        assert!(first > 1 && first <= 290, "first held {first}");
        assert!(matches!(
            part.read_entries(first - 1, 300, 1 << 20).await,
            Err(JournalError::Compacted { first_index, .. }) if first_index == first
        ));
        assert!(matches!(
            part.read_entries(1, 2, 1 << 20).await,
            Err(JournalError::Compacted { index: 1, first_index }) if first_index == first
        ));
        first
    }));
    assert_reads(part, first, &log);
    let image = disk.crash_image(CrashMode::DurableOnly);
    let (shard, recovery) = open_shard(&image, shard.journal().oldest_position());
    let parts = open_partitions(&shard, &recovery);
    let part = &parts[&handle];
    assert_eq!((part.first_index(), part.committed_index(), part.last_index()), (first, 290, 300));
    assert_reads(part, first, &log);
}
