//! The shard's vote log (`spool_broker::log::vote`,
//! `docs/design/shard-journal.md` §16) on the simulated disk: round trip,
//! group commit (many concurrent persists, few fdatasyncs, each answered
//! only once its record is durable), the vote rules, a torn tail cut and
//! rewritten, damage refused with file and byte, compaction, forget,
//! failures and abandoned cycles; a crash image at every storage
//! operation of a concurrent workload (every answered vote recovered, no
//! vote never submitted); a property test against a model; and a round
//! trip on real O_DIRECT files.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_lite::future::block_on;
use futures_util::future::join_all;
use proptest::prelude::*;
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::limits::PAGE_BYTES;
use spool_broker::log::journal::PartitionHandle;
use spool_broker::log::vote::{
    Vote, VoteError, VoteLog, RECORD_LEN, VOTES_FILE_NAME, VOTES_TEMP_NAME, VOTE_PARTITIONS_MAX,
};

const DIR: &str = "/data/shard-00";

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn votes_path() -> PathBuf {
    dir().join(VOTES_FILE_NAME)
}

fn h(handle: u32) -> PartitionHandle {
    PartitionHandle(handle)
}

fn v(term: u64, vote: u64) -> Vote {
    Vote { term, vote }
}

type Votes = BTreeMap<PartitionHandle, Vote>;

fn open(disk: &SimStorage) -> Result<(VoteLog<SimStorage>, Votes), VoteError> {
    block_on(VoteLog::open(disk.clone(), dir()))
}

/// What a crash right now leaves, opened.
fn reopen(disk: &SimStorage, mode: CrashMode) -> (SimStorage, VoteLog<SimStorage>, Votes) {
    let image = disk.crash_image(mode);
    let (log, votes) = open(&image).unwrap();
    (image, log, votes)
}

use spool_broker::io::SplitMix as Rng;

#[test]
fn votes_round_trip_through_a_crash() {
    // Goal: what persist answered is what a reopen returns, the last vote
    // of each partition, after a power loss; the directory holds no name
    // change left unsynced.
    let disk = SimStorage::new();
    let (log, votes) = open(&disk).unwrap();
    assert!(votes.is_empty());
    block_on(async {
        log.persist(&[(h(1), v(1, 0)), (h(2), v(3, 7))]).await.unwrap();
        log.persist(&[(h(1), v(1, 4))]).await.unwrap();
        log.persist(&[(h(1), v(2, 0)), (h(9), v(u64::MAX, u64::MAX))]).await.unwrap();
    });
    assert_eq!(log.get(h(1)), Some(v(2, 0)));
    assert_eq!(log.stats().cycles, 3);
    assert!(disk.dirty_dirs().is_empty(), "{:?}", disk.dirty_dirs());
    let expected: Votes =
        [(h(1), v(2, 0)), (h(2), v(3, 7)), (h(9), v(u64::MAX, u64::MAX))].into_iter().collect();
    for mode in [CrashMode::DurableOnly, CrashMode::PowerLoss { seed: 3 }] {
        let (image, again, votes) = reopen(&disk, mode);
        assert_eq!(votes, expected);
        assert_eq!(again.len(), 3);
        // It goes on appending where it stopped.
        block_on(again.persist(&[(h(2), v(4, 1))])).unwrap();
        let (_, _, votes) = reopen(&image, CrashMode::DurableOnly);
        assert_eq!(votes[&h(2)], v(4, 1));
    }
}

#[test]
fn concurrent_vote_persists_share_fdatasyncs() {
    // Goal: persists that arrive while a cycle is in flight are batched:
    // 64 concurrent persists cost at most two fdatasyncs (the first cycle
    // and the one that takes everyone who came meanwhile), and each is
    // answered only once its record is durable: checked on a crash image
    // taken the moment its persist returns.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    let syncs_before = disk.count(IoOp::Sync);
    let answered = Cell::new(0);
    let (log, disk_ref, answered_ref) = (&log, &disk, &answered);
    block_on(join_all((0..64u32).map(|handle| async move {
        log.persist(&[(h(handle), v(5, u64::from(handle) + 1))]).await.unwrap();
        let image = disk_ref.crash_image(CrashMode::DurableOnly);
        let (_, votes) = open(&image).unwrap();
        assert_eq!(votes.get(&h(handle)), Some(&v(5, u64::from(handle) + 1)));
        answered_ref.set(answered_ref.get() + 1);
    })));
    assert_eq!(answered.get(), 64);
    let syncs = disk.count(IoOp::Sync) - syncs_before;
    assert!(syncs <= 2, "{syncs} fdatasyncs for 64 concurrent persists");
    assert_eq!(log.stats().records, 64);
    assert_eq!(log.stats().cycles, syncs);
}

#[test]
fn vote_rules_refuse_a_lower_term_and_a_second_vote_in_a_term() {
    // Goal: a term below the last accepted one and a changed vote in a
    // term that has one are refused with typed errors, checked against
    // updates still queued too, all or none of a call; repeating the
    // durable vote costs no I/O; 0 → a vote in one term is allowed.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    block_on(async {
        log.persist(&[(h(1), v(5, 0))]).await.unwrap();
        log.persist(&[(h(1), v(5, 3))]).await.unwrap();
        let behind = log.persist(&[(h(1), v(4, 3))]).await.unwrap_err();
        assert!(matches!(behind, VoteError::TermBehind { term: 4, persisted: 5, .. }), "{behind}");
        let changed = log.persist(&[(h(1), v(5, 2))]).await.unwrap_err();
        assert!(matches!(changed, VoteError::VoteChanged { voted: 3, asked: 2, .. }), "{changed}");
        let unvoted = log.persist(&[(h(1), v(5, 0))]).await.unwrap_err();
        assert!(matches!(unvoted, VoteError::VoteChanged { asked: 0, .. }), "{unvoted}");
        // All or none: the good update of a refused call is not taken.
        let mixed = log.persist(&[(h(2), v(1, 1)), (h(1), v(1, 0))]).await;
        assert!(mixed.is_err());
        assert_eq!(log.get(h(2)), None);
        // Within one call, later updates are checked against earlier ones.
        assert!(log.persist(&[(h(3), v(2, 1)), (h(3), v(2, 2))]).await.is_err());
        let syncs = disk.count(IoOp::Sync);
        log.persist(&[(h(1), v(5, 3))]).await.unwrap();
        assert_eq!(disk.count(IoOp::Sync), syncs, "the durable vote again costs nothing");
    });
    // Against a queued update: the second of two racing votes in a term
    // is refused before anything is written.
    let (first, second) = block_on(futures_lite::future::zip(
        log.persist(&[(h(7), v(9, 1))]),
        log.persist(&[(h(7), v(9, 2))]),
    ));
    first.unwrap();
    assert!(matches!(second, Err(VoteError::VoteChanged { voted: 1, asked: 2, .. })));
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes[&h(7)], v(9, 1));
    assert_eq!(votes[&h(1)], v(5, 3));
}

/// A disk whose vote log has one cycle per entry of `cycles`, each
/// persisted and answered.
fn written(cycles: &[&[(u32, u64, u64)]]) -> SimStorage {
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    for cycle in cycles {
        let updates: Vec<_> =
            cycle.iter().map(|(handle, term, vote)| (h(*handle), v(*term, *vote))).collect();
        block_on(log.persist(&updates)).unwrap();
    }
    disk.crash_image(CrashMode::DurableOnly)
}

#[test]
fn a_torn_vote_tail_is_cut_and_the_file_rewritten() {
    // Goal: a crash inside the write of the last cycle (its record torn at
    // a byte, or sectors lost in any order) loses only that unanswered
    // cycle: the answered votes come back, the file is rewritten (cycle
    // compacted, stats say so), and the log appends after it.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    block_on(log.persist(&[(h(1), v(1, 1)), (h(2), v(1, 2))])).unwrap();
    let images = Rc::new(RefCell::new(Vec::new()));
    {
        let images = images.clone();
        disk.set_hook(move |disk, op, _| {
            if op == IoOp::Write {
                let mut images = images.borrow_mut();
                for bytes in [1, 10, RECORD_LEN as u64 - 1, RECORD_LEN as u64 + 5] {
                    images.push(disk.crash_image(CrashMode::Prefix { bytes }));
                }
                for seed in 0..40 {
                    images.push(disk.crash_image(CrashMode::PowerLoss { seed }));
                    images.push(disk.crash_image(CrashMode::Torn { seed }));
                }
            }
        });
    }
    block_on(log.persist(&[(h(3), v(2, 3)), (h(1), v(2, 0))])).unwrap();
    disk.clear_hook();
    let mut cut = 0;
    for image in images.borrow().iter() {
        let (log, votes) = open(image).unwrap();
        assert_eq!(votes[&h(2)], v(1, 2));
        let first = votes[&h(1)];
        assert!(first == v(1, 1) || first == v(2, 0), "{first:?}");
        assert!(votes.get(&h(3)).is_none_or(|vote| *vote == v(2, 3)));
        if log.stats().compactions > 0 {
            cut += 1;
            assert!(image.names_in(dir()).iter().all(|name| name != VOTES_TEMP_NAME));
        }
        assert!(image.dirty_dirs().is_empty());
        block_on(log.persist(&[(h(4), v(8, 8))])).unwrap();
        let (_, again) = open(&image.crash_image(CrashMode::DurableOnly)).unwrap();
        assert_eq!(again[&h(4)], v(8, 8));
        assert_eq!(again[&h(2)], v(1, 2));
    }
    assert!(cut >= 4, "only {cut} images held a torn tail");
    // Zeros after the last cycle are no tail to cut.
    let disk = written(&[&[(1, 1, 0)], &[(2, 1, 0)]]);
    let mut bytes = disk.file_bytes(&votes_path()).unwrap();
    bytes.extend_from_slice(&[0u8; 3 * 4096]);
    disk.set_file_bytes(&votes_path(), bytes);
    let (log, votes) = open(&disk).unwrap();
    assert_eq!(votes.len(), 2);
    assert_eq!(log.stats().compactions, 0);
}

#[test]
fn vote_damage_is_refused_naming_the_file_and_byte() {
    // Goal: damage no torn write explains is refused, never cut: a bit
    // flipped in a cycle followed by later ones, a lost page of zeros
    // between cycles, a flipped bit in the very last record (its end mark
    // intact), a record of a newer format version.
    let page = PAGE_BYTES as usize;
    let disk = written(&[&[(1, 1, 0), (2, 1, 0)], &[(3, 1, 0)], &[(4, 1, 0)]]);
    let clean = disk.file_bytes(&votes_path()).unwrap();
    let refused = |bytes: Vec<u8>| -> (u64, String) {
        let disk = disk.crash_image(CrashMode::DurableOnly);
        disk.set_file_bytes(&votes_path(), bytes);
        match open(&disk) {
            Err(error @ VoteError::Damaged { .. }) => {
                let text = error.to_string();
                let VoteError::Damaged { path, pos, .. } = error else { unreachable!() };
                assert_eq!(path, votes_path());
                assert!(text.contains(DIR) && text.contains(&format!("byte {pos}")), "{text}");
                (pos, text)
            }
            other => panic!("not refused: {:?}", other.map(|(_, votes)| votes)),
        }
    };
    let mut flipped = clean.clone();
    flipped[RECORD_LEN + 9] ^= 0x10;
    assert_eq!(refused(flipped).0, RECORD_LEN as u64);
    // A record of a synced cycle cut short (a torn write's shape, but a
    // later cycle proves the cycle was synced).
    let mut short = clean.clone();
    short[RECORD_LEN + 20..2 * RECORD_LEN].fill(0);
    assert_eq!(refused(short).0, RECORD_LEN as u64);
    let mut lost = clean.clone();
    lost[page..2 * page].fill(0);
    assert_eq!(refused(lost).0, 2 * page as u64);
    let mut last = clean.clone();
    last[2 * page + 12] ^= 1;
    assert_eq!(refused(last).0, 2 * page as u64);
    // A newer version (crc recomputed) is not a torn record either.
    let mut newer = clean.clone();
    let record = &mut newer[2 * page..2 * page + RECORD_LEN];
    record[24] = 2;
    let crc = crc32c::crc32c(&record[..27]);
    record[27..31].copy_from_slice(&crc.to_le_bytes());
    let (pos, text) = refused(newer);
    assert_eq!(pos, 2 * page as u64);
    assert!(text.contains("format version 2"), "{text}");
}

#[test]
fn vote_forget_drops_a_partition_at_the_next_compaction() {
    // Goal: a forgotten partition is no longer checked or reported, is
    // still in a recovery before the next compaction and gone after it.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    block_on(log.persist(&[(h(1), v(4, 1)), (h(2), v(4, 2))])).unwrap();
    log.forget(h(1));
    assert_eq!(log.get(h(1)), None);
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes.len(), 2, "no compaction yet");
    block_on(log.compact()).unwrap();
    assert_eq!(log.stats().compactions, 1);
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes.keys().copied().collect::<Vec<_>>(), vec![h(2)]);
    // A vote persisted after forget starts the partition afresh.
    block_on(log.persist(&[(h(1), v(1, 0))])).unwrap();
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes[&h(1)], v(1, 0));
}

#[test]
fn vote_compaction_crash_at_every_step_leaves_old_or_new() {
    // Goal: a crash at every storage operation of a compaction (temp
    // file write, sync, rename, directory sync) and of the cycles around
    // it recovers exactly the answered votes, from the old file or the new
    // one, never a half; the file stays under its bound.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    log.set_compact_bytes(2 * PAGE_BYTES).unwrap();
    let model = Rc::new(RefCell::new(Votes::new()));
    let checked = Rc::new(Cell::new(0));
    {
        let (model, checked) = (model.clone(), checked.clone());
        let mut rng = Rng(7);
        disk.set_hook(move |disk, _, _| {
            let modes = [
                CrashMode::DurableOnly,
                CrashMode::AllWritten,
                CrashMode::PowerLoss { seed: rng.next() },
                CrashMode::Torn { seed: rng.next() },
            ];
            for mode in modes {
                let image = disk.crash_image(mode);
                let (_, votes) = open(&image).unwrap();
                let model = model.borrow();
                for (handle, vote) in model.iter() {
                    let got = votes.get(handle).copied().unwrap_or_default();
                    assert!(
                        got.term >= vote.term,
                        "{handle}: answered {vote:?}, recovered {got:?}"
                    );
                }
                checked.set(checked.get() + 1);
            }
        });
    }
    for round in 0..12u64 {
        let updates: Vec<_> = (0..40).map(|handle| (h(handle), v(round + 1, 0))).collect();
        block_on(log.persist(&updates)).unwrap();
        model.borrow_mut().extend(updates);
        assert!(disk.file_bytes(&votes_path()).unwrap().len() as u64 <= 3 * PAGE_BYTES);
    }
    block_on(log.compact()).unwrap();
    disk.clear_hook();
    assert!(log.stats().compactions >= 6, "{:?}", log.stats());
    assert!(checked.get() > 100);
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes, *model.borrow());
    // A temp file a crash left is removed at open.
    let image = disk.crash_image(CrashMode::DurableOnly);
    block_on(async {
        use spool_broker::io::{Storage, StorageFile};
        let temp = image.open(&dir().join(VOTES_TEMP_NAME)).await.unwrap();
        let mut junk = temp.alloc_buf(4096);
        junk.as_mut().fill(0x5A);
        temp.write_at(Rc::new(junk), 0).await.unwrap();
        temp.fdatasync().await.unwrap();
        image.sync_dir(dir()).await.unwrap();
    });
    let (_, votes) = open(&image).unwrap();
    assert_eq!(votes, *model.borrow());
    assert!(!image.names_in(dir()).contains(&VOTES_TEMP_NAME.to_owned()));
    assert!(image.dirty_dirs().is_empty());
}

#[test]
fn a_failed_vote_sync_fails_the_log() {
    // Goal: a failed fdatasync is never retried: the caller whose cycle
    // failed gets the I/O error, the ones waiting and every later one get
    // Failed.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    disk.inject_failure(IoOp::Sync, 1);
    let updates: Vec<[(PartitionHandle, Vote); 1]> =
        (0..4u32).map(|handle| [(h(handle), v(1, 1))]).collect();
    let results = block_on(join_all(updates.iter().map(|updates| log.persist(updates))));
    assert!(matches!(results[0], Err(VoteError::Io(_))), "{:?}", results[0]);
    assert!(results[1..].iter().all(|result| matches!(result, Err(VoteError::Failed(_)))));
    assert!(log.failure().is_some());
    assert!(matches!(block_on(log.persist(&[(h(9), v(1, 1))])), Err(VoteError::Failed(_))));
}

/// Polls `future` once.
fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    let waker = futures_util::task::noop_waker();
    future.poll(&mut Context::from_waker(&waker))
}

#[test]
fn an_abandoned_vote_cycle_goes_to_a_fresh_file() {
    // Goal: a persist dropped while its cycle's write is in flight leaves
    // the log usable: its record is queued again, the next cycle starts a
    // fresh file (compaction) instead of appending after unknown bytes,
    // and both votes are durable after it.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    block_on(log.persist(&[(h(1), v(1, 1))])).unwrap();
    let gate = disk.hold(|op, _, _| op == IoOp::Sync);
    {
        let updates = [(h(2), v(2, 2))];
        let mut dropped = Box::pin(log.persist(&updates));
        for _ in 0..20 {
            assert!(poll_once(dropped.as_mut()).is_pending());
        }
        assert!(gate.reached());
    }
    gate.release();
    block_on(log.persist(&[(h(3), v(3, 3))])).unwrap();
    assert_eq!(log.stats().compactions, 1);
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    let expected: Votes = [(h(1), v(1, 1)), (h(2), v(2, 2)), (h(3), v(3, 3))].into_iter().collect();
    assert_eq!(votes, expected);
}

#[test]
fn a_vote_read_at_open_is_made_durable() {
    // Goal: a process killed after its cycle's write and before its sync
    // leaves the record in the page cache; the next open reports it, so it
    // must make it durable before returning (a vote reported and then lost
    // to a power cut could be cast again).
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    let gate = disk.hold(|op, _, _| op == IoOp::Sync);
    let updates = [(h(5), v(3, 2))];
    let mut killed = Box::pin(log.persist(&updates));
    while !gate.reached() {
        assert!(poll_once(killed.as_mut()).is_pending());
    }
    let restarted = disk.process_crash_image();
    let (_, votes) = open(&restarted).unwrap();
    assert_eq!(votes[&h(5)], v(3, 2));
    let (_, votes) = open(&restarted.crash_image(CrashMode::DurableOnly)).unwrap();
    assert_eq!(votes.get(&h(5)), Some(&v(3, 2)), "reported at open, lost at the next crash");
}

#[test]
fn vote_partitions_past_the_bound_are_refused() {
    // Goal: a shard's log holds votes of at most VOTE_PARTITIONS_MAX
    // partitions; one more is refused until one is forgotten; a full log
    // reopens within its byte bound.
    let disk = SimStorage::new();
    let (log, _) = open(&disk).unwrap();
    let all: Vec<_> = (0..VOTE_PARTITIONS_MAX as u32).map(|handle| (h(handle), v(1, 0))).collect();
    block_on(log.persist(&all)).unwrap();
    let extra = h(VOTE_PARTITIONS_MAX as u32);
    let refused = block_on(log.persist(&[(extra, v(1, 0))])).unwrap_err();
    assert!(matches!(refused, VoteError::TooManyPartitions { .. }), "{refused}");
    log.forget(h(0));
    block_on(log.persist(&[(extra, v(1, 0))])).unwrap();
    assert!(log.stats().compactions >= 1, "the file may not hold more partitions than the bound");
    let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
    assert_eq!(votes.len(), VOTE_PARTITIONS_MAX);
    assert!(!votes.contains_key(&h(0)));
    assert!(log.set_compact_bytes(1).is_err());
}

/// What the concurrent workload did to one partition.
#[derive(Default)]
struct Track {
    /// Every vote handed to persist, in order.
    submitted: Vec<Vote>,
    /// The last vote whose persist returned, while the partition is not
    /// forgotten.
    answered: Option<Vote>,
}

type Tracks = BTreeMap<PartitionHandle, Track>;

/// The order votes of one partition follow: terms rise, and in a term
/// "no vote" comes before the vote.
fn rank(vote: Vote) -> (u64, bool) {
    (vote.term, vote.vote != 0)
}

/// Every recovered vote was submitted; every answered one (or a later
/// one) is recovered.
fn check_votes(votes: &Votes, tracks: &Tracks) {
    for (handle, vote) in votes {
        let submitted = tracks.get(handle).map_or(&[][..], |track| &track.submitted[..]);
        assert!(submitted.contains(vote), "{handle}: recovered {vote:?}, never submitted");
    }
    for (handle, track) in tracks {
        if let Some(answered) = track.answered {
            let got = votes.get(handle);
            assert!(
                got.is_some_and(|got| rank(*got) >= rank(answered)),
                "{handle}: answered {answered:?}, recovered {got:?}"
            );
        }
    }
}

/// One worker of the crash workload: owns partitions `first..first + 3`.
async fn vote_worker(
    log: &VoteLog<SimStorage>,
    tracks: &RefCell<Tracks>,
    worker: u32,
    seed: u64,
    steps: usize,
) {
    let mut rng = Rng(seed ^ (u64::from(worker) << 32));
    let mine: Vec<PartitionHandle> = (0..3).map(|index| h(worker * 3 + index)).collect();
    let mut current: BTreeMap<PartitionHandle, Vote> = BTreeMap::new();
    for _ in 0..steps {
        let handle = mine[rng.below(3) as usize];
        let last = current.get(&handle).copied().unwrap_or_default();
        let node = 1 + rng.below(3);
        let updates: Vec<(PartitionHandle, Vote)> = match rng.below(10) {
            0..=4 => {
                let vote = if rng.below(2) == 0 { 0 } else { node };
                vec![(handle, v(last.term + 1, vote))]
            }
            5 | 6 if last.vote == 0 => vec![(handle, v(last.term, node))],
            7 => mine
                .iter()
                .map(|handle| {
                    let last = current.get(handle).copied().unwrap_or_default();
                    (*handle, v(last.term + 1, 0))
                })
                .collect(),
            8 if worker == 0 => {
                log.compact().await.unwrap();
                continue;
            }
            9 if rng.below(3) == 0 => {
                log.forget(handle);
                tracks.borrow_mut().entry(handle).or_default().answered = None;
                continue;
            }
            _ => vec![(handle, last)],
        };
        {
            let mut tracks = tracks.borrow_mut();
            for (handle, vote) in &updates {
                current.insert(*handle, *vote);
                tracks.entry(*handle).or_default().submitted.push(*vote);
            }
        }
        log.persist(&updates).await.unwrap();
        let mut tracks = tracks.borrow_mut();
        for (handle, vote) in &updates {
            tracks.entry(*handle).or_default().answered = Some(*vote);
        }
    }
}

#[test]
fn a_vote_crash_image_at_every_storage_operation_recovers_every_answered_vote() {
    // Goal: four concurrent workers persist, forget and compact on one
    // log with a small compaction bound; after every storage operation,
    // crash images (synced bytes only, everything written, the unsynced
    // bytes cut at a random byte, power loss sector by sector, torn pages)
    // all open, hold every answered vote or a later one and nothing never
    // submitted, and take appends after recovery.
    let mut images = 0;
    let mut cut = 0;
    for seed in 0..12u64 {
        let disk = SimStorage::new();
        let (log, _) = open(&disk).unwrap();
        log.set_compact_bytes(4 * PAGE_BYTES).unwrap();
        let tracks: Rc<RefCell<Tracks>> = Rc::default();
        let explored = Rc::new(Cell::new((0u64, 0u64)));
        {
            let (tracks, explored) = (tracks.clone(), explored.clone());
            let mut rng = Rng(seed ^ 0xC0FFEE);
            disk.set_hook(move |disk, _, _| {
                let modes = [
                    CrashMode::DurableOnly,
                    CrashMode::AllWritten,
                    // Inside a cycle's first records, where a cut tears one.
                    CrashMode::Prefix { bytes: rng.below(disk.unsynced_bytes().min(128) + 1) },
                    CrashMode::PowerLoss { seed: rng.next() },
                    CrashMode::Torn { seed: rng.next() },
                ];
                for mode in modes {
                    let image = disk.crash_image(mode);
                    let (recovered, votes) = open(&image).unwrap();
                    check_votes(&votes, &tracks.borrow());
                    let (count, cut) = explored.get();
                    let torn = u64::from(recovered.stats().compactions > 0);
                    explored.set((count + 1, cut + torn));
                    if count % 7 == 0 {
                        if let Some((handle, vote)) = votes.iter().next() {
                            let next = v(vote.term + 1, 0);
                            block_on(recovered.persist(&[(*handle, next)])).unwrap();
                            let (_, again) =
                                open(&image.crash_image(CrashMode::DurableOnly)).unwrap();
                            assert_eq!(again[handle], next);
                        }
                    }
                }
            });
        }
        let (log_ref, tracks_ref) = (&log, &*tracks);
        block_on(join_all(
            (0..4u32).map(|worker| vote_worker(log_ref, tracks_ref, worker, seed, 40)),
        ));
        disk.clear_hook();
        assert!(log.stats().compactions > 0, "seed {seed}: no compaction");
        assert!(log.stats().records > log.stats().cycles, "seed {seed}: nothing batched");
        let (_, _, votes) = reopen(&disk, CrashMode::DurableOnly);
        check_votes(&votes, &tracks.borrow());
        let (count, torn) = explored.get();
        images += count;
        cut += torn;
    }
    assert!(images > 10_000, "only {images} crash images");
    assert!(cut > 200, "only {cut} images held a torn tail");
}

/// One step of the property test. Partitions 0..6; a term step is added
/// to the partition's last term (negative ones test refusals).
#[derive(Clone, Debug)]
enum Op {
    Persist(Vec<(u32, i8, u8)>),
    Forget(u32),
    Compact,
    Crash {
        mode: u8,
        seed: u64,
    },
    /// A persist with a crash at one of its storage operations.
    CrashDuring {
        updates: Vec<(u32, i8, u8)>,
        at: u8,
        mode: u8,
        seed: u64,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let updates = proptest::collection::vec((0u32..6, -1i8..=2, 0u8..4), 1..4);
    prop_oneof![
        4 => updates.clone().prop_map(Op::Persist),
        1 => (0u32..6).prop_map(Op::Forget),
        1 => Just(Op::Compact),
        1 => (0u8..5, any::<u64>()).prop_map(|(mode, seed)| Op::Crash { mode, seed }),
        2 => (updates, any::<u8>(), 0u8..5, any::<u64>())
            .prop_map(|(updates, at, mode, seed)| Op::CrashDuring { updates, at, mode, seed }),
    ]
}

fn crash_mode(mode: u8, seed: u64, unsynced: u64) -> CrashMode {
    match mode {
        0 => CrashMode::DurableOnly,
        1 => CrashMode::AllWritten,
        2 => CrashMode::Prefix { bytes: seed % (unsynced + 1) },
        3 => CrashMode::PowerLoss { seed },
        _ => CrashMode::Torn { seed },
    }
}

/// The model: each live partition's durable vote, and the last vote of
/// each forgotten one whose record the file still holds (until a
/// compaction).
#[derive(Default)]
struct Model {
    live: Votes,
    in_file: Votes,
}

impl Model {
    /// What a recovery returns now.
    fn recovered(&self) -> Votes {
        let mut votes = self.in_file.clone();
        votes.extend(self.live.iter().map(|(handle, vote)| (*handle, *vote)));
        votes
    }

    /// The votes `updates` ask for, or None when the log must refuse them.
    fn predict(&self, updates: &[(u32, i8, u8)]) -> Option<Vec<(PartitionHandle, Vote)>> {
        let mut taken: Votes = BTreeMap::new();
        let mut out = Vec::new();
        for (partition, step, node) in updates {
            let handle = h(*partition);
            let last = taken.get(&handle).or_else(|| self.live.get(&handle)).copied();
            let base = last.map_or(0, |last| last.term);
            let vote = v(base.saturating_add_signed(i64::from(*step)), u64::from(*node));
            if let Some(last) = last {
                let changed = vote.term == last.term && last.vote != 0 && vote.vote != last.vote;
                if vote.term < last.term || changed {
                    return None;
                }
            }
            taken.insert(handle, vote);
            out.push((handle, vote));
        }
        Some(out)
    }
}

/// Runs `ops` against a log and the model; panics on any difference.
fn run_model(ops: &[Op]) {
    let mut disk = SimStorage::new();
    let (mut log, _) = open(&disk).unwrap();
    log.set_compact_bytes(3 * PAGE_BYTES).unwrap();
    let mut model = Model::default();
    for op in ops {
        let compactions = log.stats().compactions;
        let mut crash_to: Option<(SimStorage, Votes)> = None;
        match op {
            Op::Persist(updates) => {
                let result = block_on(log.persist(&predicted_or_raw(&model, updates)));
                match model.predict(updates) {
                    Some(votes) => {
                        result.unwrap();
                        model.live.extend(votes);
                    }
                    None => assert!(result.is_err(), "{updates:?} accepted"),
                }
            }
            Op::Forget(partition) => {
                log.forget(h(*partition));
                if let Some(vote) = model.live.remove(&h(*partition)) {
                    model.in_file.insert(h(*partition), vote);
                }
            }
            Op::Compact => block_on(log.compact()).unwrap(),
            Op::Crash { mode, seed } => {
                let image = disk.crash_image(crash_mode(*mode, *seed, disk.unsynced_bytes()));
                crash_to = Some((image, model.recovered()));
            }
            Op::CrashDuring { updates, at, mode, seed } => {
                let Some(votes) = model.predict(updates) else { continue };
                let images = Rc::new(RefCell::new(Vec::new()));
                {
                    let images = images.clone();
                    let (mode, seed) = (*mode, *seed);
                    disk.set_hook(move |disk, _, _| {
                        let mode = crash_mode(mode, seed, disk.unsynced_bytes());
                        images.borrow_mut().push(disk.crash_image(mode));
                    });
                }
                let before = model.recovered();
                let live_before = model.live.clone();
                block_on(log.persist(&votes)).unwrap();
                disk.clear_hook();
                model.live.extend(votes.iter().copied());
                let mut images = images.borrow_mut();
                // No image when nothing was written (no operation to crash at).
                if !images.is_empty() {
                    let index = usize::from(*at) % images.len();
                    let image = images.swap_remove(index);
                    let (_, votes_now) = open(&image).unwrap();
                    for (handle, got) in &votes_now {
                        let old = before.get(handle);
                        let new = votes.iter().rev().find(|(h, _)| h == handle).map(|(_, v)| v);
                        assert!(
                            old == Some(got) || new == Some(got),
                            "{handle}: recovered {got:?}, before {old:?}, asked {new:?}"
                        );
                    }
                    for (handle, vote) in &before {
                        let forgotten = !live_before.contains_key(handle);
                        assert!(
                            votes_now.contains_key(handle) || forgotten,
                            "{handle}: {vote:?} lost"
                        );
                    }
                    crash_to = Some((image, votes_now));
                }
            }
        }
        if log.stats().compactions > compactions {
            model.in_file.clear();
        }
        if let Some((image, expected)) = crash_to {
            let (reopened, votes) = open(&image).unwrap();
            assert_eq!(votes, expected, "after {op:?}");
            reopened.set_compact_bytes(3 * PAGE_BYTES).unwrap();
            model = Model { live: votes, in_file: Votes::new() };
            disk = image;
            log = reopened;
        } else {
            let (_, votes) = open(&disk.crash_image(CrashMode::DurableOnly)).unwrap();
            assert_eq!(votes, model.recovered(), "after {op:?}");
        }
        for (handle, vote) in &model.live {
            assert_eq!(log.get(*handle), Some(*vote));
        }
    }
}

/// The updates a persist step hands the log: as predicted when the model
/// accepts them, else as they come (the log must refuse them).
fn predicted_or_raw(model: &Model, updates: &[(u32, i8, u8)]) -> Vec<(PartitionHandle, Vote)> {
    model.predict(updates).unwrap_or_else(|| {
        let mut taken: Votes = BTreeMap::new();
        updates
            .iter()
            .map(|(partition, step, node)| {
                let handle = h(*partition);
                let base =
                    taken.get(&handle).or_else(|| model.live.get(&handle)).map_or(0, |l| l.term);
                let vote = v(base.saturating_add_signed(i64::from(*step)), u64::from(*node));
                taken.insert(handle, vote);
                (handle, vote)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Goal: random persists (some the log must refuse), forgets,
    /// compactions and crashes — between operations or at any storage
    /// operation of a persist, in any crash mode — keep the log equal to
    /// a model: a recovery returns every answered vote of a live
    /// partition, a forgotten one's only until the next compaction, and a
    /// vote caught by a crash only as before or as asked.
    #[test]
    fn vote_log_matches_its_model(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        run_model(&ops);
    }
}

#[test]
fn votes_on_real_files_through_o_direct() {
    // Goal: on O_DIRECT files (glommio DmaStorage) concurrent persists,
    // compactions and a reopen round trip; a record torn by hand at the
    // tail is cut and the file rewritten on the next open.
    use spool_broker::io::DmaStorage;
    use std::os::unix::fs::FileExt;
    let temp = tempfile::tempdir().unwrap();
    let shard = temp.path().join("shard-00");
    let run = |future: Pin<Box<dyn Future<Output = ()> + '_>>| {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            // Registered buffers make reads fail on some kernels: see io/dma.rs.
            .io_memory(0)
            .make()
            .unwrap()
            .run(future)
    };
    let mut expected = Votes::new();
    for round in 0..3u64 {
        let updates: Vec<[(PartitionHandle, Vote); 1]> =
            (0..50u32).map(|handle| [(h(handle), v(round + 1, u64::from(handle % 3)))]).collect();
        expected.extend(updates.iter().map(|update| update[0]));
        let shard = &shard;
        let expected = &expected;
        run(Box::pin(async move {
            let (log, votes) = VoteLog::open(DmaStorage, shard).await.unwrap();
            assert_eq!(votes.len(), if round == 0 { 0 } else { 50 });
            log.set_compact_bytes(2 * PAGE_BYTES).unwrap();
            join_all(updates.iter().map(|update| async { log.persist(update).await.unwrap() }))
                .await;
            assert_eq!(votes_of(&log), *expected);
        }));
    }
    assert!(std::fs::metadata(shard.join(VOTES_FILE_NAME)).unwrap().len() <= 3 * PAGE_BYTES);
    // A record cut short at the end of the file: cut, file rewritten.
    let file = std::fs::OpenOptions::new().write(true).open(shard.join(VOTES_FILE_NAME)).unwrap();
    let len = file.metadata().unwrap().len();
    file.write_all_at(&[7u8; 20], len).unwrap();
    file.set_len(len + PAGE_BYTES).unwrap();
    drop(file);
    run(Box::pin(async {
        let (log, votes) = VoteLog::open(DmaStorage, &shard).await.unwrap();
        assert_eq!(votes, expected);
        assert_eq!(log.stats().compactions, 1);
    }));
}

/// Every durable vote of partitions 0..50.
fn votes_of(log: &VoteLog<spool_broker::io::DmaStorage>) -> Votes {
    (0..50u32).filter_map(|handle| log.get(h(handle)).map(|vote| (h(handle), vote))).collect()
}
