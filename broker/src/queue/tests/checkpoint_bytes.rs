//! What a checkpoint of a partition with nothing live costs: its bytes must
//! follow what the state holds now (the dedupe window × the enqueue rate),
//! not how much traffic the partition has seen.

use super::super::dedupe::GenerationRef;
use super::super::limits::DEDUPE_GENERATIONS;
use super::super::*;
use super::harness::{ctx, request, ALL_DURABLE};

/// Bytes of one dedupe entry in a snapshot (time, id, offset).
const DEDUPE_ENTRY_BYTES: usize = 32;

/// Runs `minutes` of enqueue → claim → ack at one message every
/// `interval_ms` against a fresh state, snapshotting every five minutes;
/// returns the snapshot sizes and the entries the last one listed.
fn checkpoint_sizes(config: QueueConfig, minutes: u64, interval_ms: u64) -> (Vec<usize>, usize) {
    let mut state = PartitionState::new(ctx(config, 1)).unwrap();
    let mut next_offset = 0u64;
    let mut sizes = Vec::new();
    let mut listed = 0;
    let end_ms = minutes * 60_000;
    let mut now = 1_000_000u64;
    let start = now;
    let mut next_snapshot = start + 5 * 60_000;
    let mut n = 0u64;
    while now < start + end_ms {
        let request = request(n, 0);
        assert_eq!(state.enqueue_check(now, &request).unwrap(), EnqueueDecision::Accept);
        let offset = Offset(next_offset);
        next_offset += 1;
        state.apply(&Event::Enqueued(EnqueueMeta::new(&request, offset, now))).unwrap();
        let claim = ClaimRequest {
            sub: SubscriptionId::DEFAULT,
            worker: WorkerId(1),
            credits: 1,
            max_bytes: u64::MAX,
            lease_ms: None,
        };
        let decision = state.claim(now, &claim, ALL_DURABLE).unwrap();
        for event in &decision.events {
            state.apply(event).unwrap();
            next_offset += 1;
        }
        let [delivery] = decision.deliveries.as_slice() else {
            panic!("one delivery per claim, got {}", decision.deliveries.len());
        };
        let ack = state.ack(now, &delivery.token).unwrap();
        state.apply(&ack).unwrap();
        next_offset += 1;
        n += 1;
        now += interval_ms;
        if now >= next_snapshot {
            next_snapshot += 5 * 60_000;
            sizes.push(state.snapshot(Offset(next_offset)).len());
            listed = state.dedupe.entries().count();
        }
    }
    (sizes, listed)
}

// Goal: with nothing live, a checkpoint's bytes stay bounded by the dedupe
// window × the enqueue rate (plus one generation the table drops whole),
// whatever the history: two hours of enqueue + ack at 10 messages/s write
// the same checkpoint size at the end as after the first window. And the
// default window (5 min, the interval peer brokers dedupe over) keeps that
// bound at 1/12 of what the former 1 h default of new queues held.
// Method: snapshot every 5 simulated minutes; compare sizes with the bound.
#[test]
fn checkpoint_bytes_follow_the_window_not_the_history() {
    const INTERVAL_MS: u64 = 100;
    let config = QueueConfig { max_messages: 1 << 32, ..QueueConfig::default() };
    let window_ms = config.dedupe_window_ms;
    assert_eq!(window_ms, 5 * 60_000, "the default dedupe window");
    let (sizes, listed) = checkpoint_sizes(config, 120, INTERVAL_MS);
    assert_eq!(sizes.len(), 24);
    let in_window = (window_ms / INTERVAL_MS) as usize;
    // The snapshot lists live entries only: at most the window's worth.
    assert!(listed <= in_window, "{listed} dedupe entries listed, {in_window} in the window");
    let empty = PartitionState::new(ctx(QueueConfig::default(), 1)).unwrap();
    let header = empty.snapshot(Offset(0)).len();
    let bound = header + in_window * DEDUPE_ENTRY_BYTES;
    for (at, size) in sizes.iter().enumerate() {
        assert!(*size <= bound, "checkpoint {at}: {size} B over the bound {bound} B");
    }
    let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
    assert!(
        last <= first + DEDUPE_ENTRY_BYTES,
        "after 2 h the checkpoint ({last} B) is no larger than after 5 min ({first} B)"
    );
    // The former default (1 h) at the same rate: each checkpoint rewrites
    // twelve times as many ids.
    let hour = QueueConfig {
        dedupe_window_ms: 60 * 60_000,
        max_messages: 1 << 32,
        ..QueueConfig::default()
    };
    let (hour_sizes, _) = checkpoint_sizes(hour, 65, INTERVAL_MS);
    let hour_last = hour_sizes[hour_sizes.len() - 1];
    assert!(hour_last > 11 * (last - header), "1 h window: {hour_last} B, 5 min: {last} B");
}

/// A generation file as a test keeps it: its reference and payload.
type GenerationFiles = std::collections::BTreeMap<(u64, u64), (GenerationRef, Vec<u8>)>;

/// One stepped checkpoint as the partition writes it
/// (`partition/dedupe_files.rs`): every sealed generation without a file
/// gets one (kept in `files`), the snapshot refers to them and lists the
/// open generation inline. Returns the snapshot, its references and the
/// generation bytes written.
fn checkpoint_with_files(
    state: &mut PartitionState,
    covers: Offset,
    files: &mut GenerationFiles,
) -> (Vec<u8>, Vec<GenerationRef>, u64) {
    let mut encoder = state.begin_snapshot(covers);
    let (sealed, inline_from) = state.dedupe_sealed(&encoder);
    let mut references = Vec::new();
    let mut written = 0u64;
    for generation in sealed {
        if let Some(reference) = generation.persisted {
            references.push(reference);
            continue;
        }
        let (mut out, mut at) = (Vec::new(), 0usize);
        while !state.dedupe_generation_step(&encoder, generation.index, &mut at, 500, &mut out) {}
        let reference = GenerationRef {
            first_offset: generation.first_offset,
            base_time_ms: generation.base_time_ms,
            entries: generation.entries,
            crc: crc32c::crc32c(&out),
        };
        assert_eq!(out.len() as u64, reference.entries * DEDUPE_ENTRY_BYTES as u64);
        written += out.len() as u64;
        let key = (reference.first_offset.0, reference.entries);
        assert!(files.insert(key, (reference, out)).is_none(), "generation {key:?} written twice");
        state.dedupe_mark_persisted(reference);
        references.push(reference);
    }
    encoder.refer_generations(references.clone(), inline_from);
    let mut bytes = Vec::new();
    loop {
        let mut out = Vec::new();
        let done = state.snapshot_step(&mut encoder, 500, &mut out).unwrap();
        bytes.extend_from_slice(&out);
        if done {
            break;
        }
    }
    state.end_snapshot();
    (bytes, references, written)
}

/// Restores `bytes` with the generation files it refers to.
fn restore_with_files(
    bytes: &[u8],
    config: QueueConfig,
    files: &GenerationFiles,
) -> PartitionState {
    let pending = PartitionState::restore_begin(bytes, ctx(config, 2)).unwrap();
    let payloads: Vec<&[u8]> = pending
        .references()
        .iter()
        .map(|r| files[&(r.first_offset.0, r.entries)].1.as_slice())
        .collect();
    pending.finish(&payloads).unwrap().state
}

/// Enqueues and acks one message at `now` (three offsets).
fn enqueue_ack(state: &mut PartitionState, n: u64, now: Millis, next_offset: &mut u64) {
    let request = request(n, 0);
    assert_eq!(state.enqueue_check(now, &request).unwrap(), EnqueueDecision::Accept);
    state.apply(&Event::Enqueued(EnqueueMeta::new(&request, Offset(*next_offset), now))).unwrap();
    *next_offset += 1;
    let claim = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: 1,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let decision = state.claim(now, &claim, ALL_DURABLE).unwrap();
    for event in &decision.events {
        state.apply(event).unwrap();
        *next_offset += 1;
    }
    let ack = state.ack(now, &decision.deliveries[0].token).unwrap();
    state.apply(&ack).unwrap();
    *next_offset += 1;
}

// Goal: with sealed generations written once as side files, a checkpoint's
// own bytes stay bounded by one generation (the open one) plus a reference
// per sealed one, not by the window; each id is written to a generation
// file at most once over many checkpoints (also after a restore, whose
// generations keep their files); and a restore from the checkpoint plus
// its files gives back exactly the live window. Method: 8 s window (1 s
// generations), one enqueue + ack every 5 ms for 60 s with a checkpoint
// every 700 ms; restore halfway and go on from the restored state.
#[test]
fn sealed_generations_are_written_once_and_checkpoints_list_only_the_open_one() {
    const INTERVAL_MS: u64 = 5;
    const WINDOW_MS: u64 = 8_000;
    let config = QueueConfig {
        max_messages: 1 << 32,
        dedupe_window_ms: WINDOW_MS,
        ..QueueConfig::default()
    };
    let mut state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
    let mut files = GenerationFiles::new();
    let empty = PartitionState::new(ctx(config.clone(), 1)).unwrap().snapshot(Offset(0)).len();
    let span_ids = (WINDOW_MS / DEDUPE_GENERATIONS as u64 / INTERVAL_MS) as usize;
    let window_ids = (WINDOW_MS / INTERVAL_MS) as usize;
    let (mut now, mut next_offset, mut n) = (1_000_000u64, 0u64, 0u64);
    let (mut written_total, mut checkpoints, mut largest) = (0u64, 0, 0usize);
    let mut restored_once = false;
    while n < 12_000 {
        enqueue_ack(&mut state, n, now, &mut next_offset);
        n += 1;
        now += INTERVAL_MS;
        if n % 140 != 0 {
            continue;
        }
        let (bytes, references, written) =
            checkpoint_with_files(&mut state, Offset(next_offset), &mut files);
        checkpoints += 1;
        written_total += written;
        // The open generation inline, one reference per sealed generation.
        let bound = empty + (span_ids + 1) * DEDUPE_ENTRY_BYTES + references.len() * 28;
        assert!(bytes.len() <= bound, "checkpoint {checkpoints}: {} B over {bound} B", bytes.len());
        assert!(references.len() <= DEDUPE_GENERATIONS + 1);
        largest = largest.max(bytes.len());
        let restored = restore_with_files(&bytes, config.clone(), &files);
        restored.assert_invariants();
        let want: Vec<_> = state.dedupe.entries().collect();
        if n as usize >= window_ids {
            assert!(want.len() >= window_ids - 1, "{} ids live in the window", want.len());
        }
        assert_eq!(restored.dedupe.entries().collect::<Vec<_>>(), want, "checkpoint {checkpoints}");
        if !restored_once && n >= 6_000 {
            // Go on from the restored state: its generations keep their files.
            state = restored;
            restored_once = true;
        }
    }
    assert!(restored_once);
    // Every id went to a generation file at most once (the open generation
    // at the end has none yet).
    assert!(written_total <= n * DEDUPE_ENTRY_BYTES as u64, "{written_total} B for {n} ids");
    assert!(written_total >= (n as usize - 2 * span_ids) as u64 * DEDUPE_ENTRY_BYTES as u64);
    // All inline, a checkpoint would list the whole window.
    assert!(largest * 4 < window_ids * DEDUPE_ENTRY_BYTES, "largest checkpoint {largest} B");
    // A resent id of the window is still a duplicate after the restore.
    let bytes = checkpoint_with_files(&mut state, Offset(next_offset), &mut files).0;
    let restored = restore_with_files(&bytes, config, &files);
    let resent = request(n - window_ids as u64 / 2, 0);
    assert!(matches!(
        restored.enqueue_check(now, &resent).unwrap(),
        EnqueueDecision::Duplicate { .. }
    ));
}

// Goal: a checkpoint of version 2 (every dedupe id inline, no generation
// files) still loads, with its window. Method: a version-3 snapshot of a
// state holding only dedupe entries, rewritten in the version-2 layout
// (no `dead_through`, no references, no stored counts; version field 2;
// crc recomputed).
#[test]
fn a_version_2_checkpoint_with_ids_inline_still_loads() {
    let config = QueueConfig { max_messages: 1 << 32, ..QueueConfig::default() };
    let mut state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
    let (mut now, mut next_offset) = (1_000_000u64, 0u64);
    for n in 0..50 {
        enqueue_ack(&mut state, n, now, &mut next_offset);
        now += 10;
    }
    let v3 = state.snapshot(Offset(next_offset));
    let list = 8 + 50 * DEDUPE_ENTRY_BYTES;
    let section = 9 + 8 + list;
    // Before the crc: the stored-counts section (two empty lists, 16 B)
    // and the key map and members (12 + 1 B), which version 2 does not
    // have either.
    // and version 5's subscriptions (the default's cursor and marks per
    // band, no others).
    // Version 6's losses (16 B for the default alone) and version 7's
    // lanes (8 B) come last.
    let subs = state.config().bands() * 16 + 8 + 16;
    let body_end = v3.len() - 4 - subs - 16 - 8 - 13;
    let mut v2 = v3[..body_end - section].to_vec();
    v2.extend_from_slice(&v3[body_end - list..body_end]);
    v2[4..6].copy_from_slice(&2u16.to_le_bytes());
    let crc = crc32c::crc32c(&v2);
    v2.extend_from_slice(&crc.to_le_bytes());
    let restored = PartitionState::restore(&v2, ctx(config, 2)).unwrap();
    assert_eq!(restored.covers, Offset(next_offset));
    assert_eq!(
        restored.state.dedupe.entries().collect::<Vec<_>>(),
        state.dedupe.entries().collect::<Vec<_>>()
    );
    assert!(matches!(
        restored.state.enqueue_check(now, &request(7, 0)).unwrap(),
        EnqueueDecision::Duplicate { .. }
    ));
    // The same bytes with version 3 do not decode: the layouts differ.
    let mut wrong = v2[..v2.len() - 4].to_vec();
    wrong[4..6].copy_from_slice(&3u16.to_le_bytes());
    let crc = crc32c::crc32c(&wrong);
    wrong.extend_from_slice(&crc.to_le_bytes());
    assert!(PartitionState::restore(&wrong, ctx(QueueConfig::default(), 2)).is_err());
}

// Goal: the key map and the group members the log names survive a
// checkpoint (version 4), and a version-3 checkpoint (no such section)
// still loads, naming neither. Method: a state that applied two `KeyMap`
// events (the older one after the newer: the newer stays) and, seeded with
// voters 1..=3, a replacement of 3 by 4; snapshotted and restored; the
// bytes without the section, version field 3, crc recomputed; a section
// naming a version with no partition count, or members with no voter, is
// refused; a change before any seed does not apply.
#[test]
fn the_logged_key_map_and_members_survive_a_checkpoint_and_version_3_loads_without() {
    use crate::queue::{Event, LoggedKeyMap, Members, MembershipChange};
    let config = QueueConfig::default();
    let mut state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
    let (now, mut next_offset) = (1_000_000u64, 0u64);
    enqueue_ack(&mut state, 1, now, &mut next_offset);
    let add = Event::Membership { change: MembershipChange::AddLearner(4) };
    assert!(state.apply(&add).is_err(), "a change applied with no members seeded");
    state.seed_members(Members::voters(&[3, 1, 2]));
    for change in [
        MembershipChange::AddLearner(4),
        MembershipChange::AddVoter(4),
        MembershipChange::Remove(3),
    ] {
        state.apply(&Event::Membership { change }).unwrap();
    }
    state.apply(&Event::KeyMap { version: 3, partitions: 6, at_ms: now }).unwrap();
    state.apply(&Event::KeyMap { version: 2, partitions: 5, at_ms: now }).unwrap();
    let expected = Some(LoggedKeyMap { version: 3, partitions: 6 });
    assert_eq!(state.logged_key_map(), expected);
    assert_eq!(state.members(), Some(&Members::voters(&[1, 2, 4])));
    let v4 = state.snapshot(Offset(next_offset));
    let restored = PartitionState::restore(&v4, ctx(config.clone(), 2)).unwrap();
    assert_eq!(restored.state.logged_key_map(), expected);
    assert_eq!(restored.state.members(), Some(&Members::voters(&[1, 2, 4])));
    // A seed after a checkpoint that named members changes nothing.
    let mut seeded = restored.state;
    seeded.seed_members(Members::voters(&[1, 2, 3]));
    assert_eq!(seeded.members(), Some(&Members::voters(&[1, 2, 4])));

    // Members: flag 1, three voters (u64 count + ids), no learners.
    let members_bytes = 1 + 8 + 3 * 8 + 8;
    let section = 12 + members_bytes;
    // Version 5's subscriptions follow: the default's marks, no others.
    // Version 6's losses (16 B for the default alone) and version 7's
    // lanes (8 B) come last.
    let subs = state.config().bands() * 16 + 8 + 16 + 8;
    let mut v3 = v4[..v4.len() - 4 - subs - section].to_vec();
    v3[4..6].copy_from_slice(&3u16.to_le_bytes());
    let crc = crc32c::crc32c(&v3);
    v3.extend_from_slice(&crc.to_le_bytes());
    let old = PartitionState::restore(&v3, ctx(config.clone(), 2)).unwrap();
    assert_eq!(old.state.logged_key_map(), None);
    assert_eq!(old.state.members(), None);
    assert_eq!(old.covers, Offset(next_offset));

    let rewrite = |at_from_end: usize, bytes: &[u8]| {
        let mut bad = v4[..v4.len() - 4].to_vec();
        let at = bad.len() - subs - at_from_end;
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        let crc = crc32c::crc32c(&bad);
        bad.extend_from_slice(&crc.to_le_bytes());
        bad
    };
    let no_partitions = rewrite(members_bytes + 4, &0u32.to_le_bytes());
    assert!(PartitionState::restore(&no_partitions, ctx(config.clone(), 2)).is_err());
    let no_voters = rewrite(members_bytes - 1, &0u64.to_le_bytes());
    assert!(PartitionState::restore(&no_voters, ctx(config, 2)).is_err());
}
