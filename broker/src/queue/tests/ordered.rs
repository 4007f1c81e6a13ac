//! Ordered lanes (`state/ordered.rs`, `docs/design/ordered-lanes.md`): in
//! an ordered queue at most one message per routing key is claimed at a
//! time, a key's messages are delivered in offset order through releases,
//! lease expiries, dead letters, expiries and purges, unkeyed messages
//! are unaffected, and replay and restore give the same lanes.

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::*;
use super::harness::{ctx, request, Harness, ALL_DURABLE};

fn ordered() -> QueueConfig {
    QueueConfig {
        ordered: true,
        backoff: Backoff::Linear { step_ms: 100, max_ms: 100 },
        ..QueueConfig::default()
    }
}

fn claimed(h: &mut Harness, now: Millis, credits: u32) -> Vec<u64> {
    let deliveries = h.claim(now, 1, credits, None);
    deliveries.iter().map(|d| d.offset.0).collect()
}

/// Replaying the log and restoring a snapshot give the same state, lanes
/// included (the snapshot bytes carry them).
fn assert_replays(h: &Harness) -> PartitionState {
    let replayed = h.replay(1);
    let live = h.state.snapshot(Offset(0));
    assert!(replayed.snapshot(Offset(0)) == live, "replay differs from the live state");
    let restored = PartitionState::restore(&h.state.snapshot(Offset(0)), ctx(h.config.clone(), 1))
        .unwrap()
        .state;
    restored.assert_invariants();
    assert!(restored.snapshot(Offset(0)) == live, "restore differs from the live state");
    assert_eq!(restored.counters(0), h.state.counters(0));
    restored
}

// Goal: the scenario of the issue — a key's messages one at a time, in
// order through a release with backoff (the released message goes first
// again, the key waits out the backoff), a lease expiry and a dead
// letter; other keys and unkeyed messages flow past a blocked key.
#[test]
fn a_key_is_delivered_one_at_a_time_in_order_and_blocks_only_itself() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 2, ..ordered() });
    let a: &[u8] = b"chair-4";
    let b: &[u8] = b"chair-5";
    for (n, key) in [Some(a), Some(b), Some(a), Some(a), None, Some(b)].into_iter().enumerate() {
        h.enqueue_keyed(1_000, request(n as u64, 0), key).unwrap();
    }
    let c = h.state.counters(1_000);
    assert_eq!((c.lanes.active_keys, c.lanes.blocked_keys, c.lanes.waiting), (2, 2, 3));
    assert_eq!(c.lanes.oldest_waiting, Some((Offset(2), 1_000)));
    // Heads of a and b and the unkeyed message; a's and b's followers wait.
    let first = h.claim(1_000, 1, 10, Some(1_000));
    assert_eq!(first.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [0, 1, 4]);
    assert!(claimed(&mut h, 1_000, 10).is_empty(), "nothing else is claimable");
    // b's head acked: b's next is claimable at once.
    h.ack(1_010, &first[1]).unwrap();
    assert_eq!(claimed(&mut h, 1_010, 10), [5]);
    // a's head released with a backoff: it goes first again after it,
    // and a's followers wait meanwhile.
    h.release(1_020, &first[0], 7, Some(1_500)).unwrap();
    assert!(claimed(&mut h, 1_400, 10).is_empty());
    h.tick(1_500);
    let again = h.claim(1_500, 1, 10, Some(1_000));
    assert_eq!(again.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [0]);
    h.ack(1_600, &again[0]).unwrap();
    // Offset 2 heads a now; its lease runs out and it is retried before 3;
    // its second failure dead-letters it and hands the lane to 3.
    let second = h.claim(1_600, 1, 10, Some(200));
    assert_eq!(second.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [2]);
    h.tick(1_800);
    let retried = h.claim(1_800, 1, 10, Some(200));
    let retried: Vec<u64> = retried.iter().map(|d| d.offset.0).collect();
    assert_eq!(retried, [2], "the expired head is retried, not 3");
    let events = h.tick(2_100);
    // (The unkeyed message's lease ends too.)
    assert!(events.iter().any(|e| matches!(e, Event::Quarantined { offset: Offset(2), .. })));
    assert_eq!(claimed(&mut h, 2_100, 10), [3, 4]);
    let c = h.state.counters(2_100);
    // b's last message (5) is still claimed.
    assert_eq!((c.lanes.active_keys, c.lanes.blocked_keys, c.lanes.waiting), (2, 0, 0));
    assert_replays(&h);
}

// Goal: the rules for priorities and delays are the stated ones — a key's
// order is offset order whatever the band, and a delayed message holds
// its key's later messages until it is delivered and finished; the
// message behind it keeps its own delay.
#[test]
fn priorities_and_delays_never_reorder_a_key() {
    let mut h = Harness::new(ordered());
    let k: &[u8] = b"user-42";
    // Offset 0: low priority, delayed to 2_000. Offset 1: top priority.
    let mut delayed = request(0, 3);
    delayed.not_before_ms = 2_000;
    h.enqueue_keyed(1_000, delayed, Some(k)).unwrap();
    h.enqueue_keyed(1_000, request(1, 0), Some(k)).unwrap();
    // Offset 2: same key, delayed to 5_000 (behind the others).
    let mut later = request(2, 0);
    later.not_before_ms = 5_000;
    h.enqueue_keyed(1_000, later, Some(k)).unwrap();
    h.enqueue_keyed(1_000, request(3, 0), Some(b"other")).unwrap();
    assert_eq!(claimed(&mut h, 1_000, 10), [3], "the top-priority message waits for the delayed");
    h.tick(2_000);
    let head = h.claim(2_000, 1, 10, None);
    assert_eq!(head.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [0]);
    h.ack(2_100, &head[0]).unwrap();
    let next = h.claim(2_100, 1, 10, None);
    assert_eq!(next.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [1]);
    h.ack(2_200, &next[0]).unwrap();
    // Offset 2 is the head now but keeps its own delay.
    assert!(claimed(&mut h, 2_200, 10).is_empty());
    let views = h.state.messages();
    assert!(views
        .iter()
        .any(|v| v.offset == Offset(2) && v.phase == MessagePhase::Scheduled { due_ms: 5_000 }));
    h.tick(5_000);
    assert_eq!(claimed(&mut h, 5_000, 10), [2]);
    assert_replays(&h);
}

// Goal: a purge takes waiting messages out of their lanes (the rest keep
// their order), an expiry of a head hands its lane on, and an unordered
// queue ignores keys.
#[test]
fn purge_and_expiry_keep_lanes_whole_and_unordered_queues_ignore_keys() {
    let mut h = Harness::new(ordered());
    let k: &[u8] = b"k";
    let mut expiring = request(0, 0);
    expiring.expiry_ms = Some(1_500);
    h.enqueue_keyed(1_000, expiring, Some(k)).unwrap();
    for n in 1..4 {
        h.enqueue_keyed(1_000, request(n, 0), Some(k)).unwrap();
    }
    let events = h.tick(1_500);
    assert!(matches!(events[..], [Event::Expired { offset: Offset(0), .. }]));
    let head = h.claim(1_500, 1, 10, None);
    assert_eq!(head.iter().map(|d| d.offset.0).collect::<Vec<_>>(), [1]);
    // Purge the unclaimed: offsets 2 and 3 (waiting) go; the claimed head stays.
    let purged = h.state.purge(1_600, Lane::Main, 100, ALL_DURABLE);
    h.apply_all(&purged);
    assert_eq!(purged.len(), 2);
    let c = h.state.counters(1_600);
    assert_eq!((c.lanes.active_keys, c.lanes.waiting), (1, 0));
    h.ack(1_700, &head[0]).unwrap();
    assert_eq!(h.state.counters(1_700).lanes.active_keys, 0);
    assert_replays(&h);

    let mut plain = Harness::new(QueueConfig::default());
    for n in 0..3 {
        plain.enqueue_keyed(1_000, request(n, 0), Some(k)).unwrap();
    }
    assert_eq!(claimed(&mut plain, 1_000, 10), [0, 1, 2]);
    assert_eq!(plain.state.counters(1_000).lanes, LaneCounters::default());
}

// Goal: an ordered queue refuses a second subscription and a retention
// window (what this version does not order yet), with a clear error.
#[test]
fn an_ordered_queue_has_one_subscription_and_no_window() {
    let mut h = Harness::new(ordered());
    let started = Event::SubscriptionStarted { sub: SubscriptionId(1), from: Offset(0), at_ms: 1 };
    assert!(matches!(h.state.apply(&started), Err(ApplyError::Subscription { .. })));
    let windowed = QueueConfig { retention_ms: 60_000, ..ordered() };
    assert_eq!(windowed.validate(), Err(ConfigError::OrderedWithWindow));
}

// Goal: the active keys of an ordered partition are bounded: at the limit
// a record of a new key is refused (ACTIVE_KEYS_FULL) and nothing else is —
// an active key's next message, an unkeyed one, a key repeated within the
// batch, an unordered queue; once a key has no message left, a new key is
// accepted again. Method: the admission with its limit lowered to 2.
#[test]
fn active_keys_are_bounded_and_a_finished_key_makes_room() {
    let key = |name: &[u8]| OrderKey::of(name);
    let check = |h: &Harness, n: u64, keys: &[Option<OrderKey>]| -> Vec<EnqueueDecision> {
        let mut admission = h.state.admission(1_000).with_active_keys_max(2);
        (0..keys.len())
            .map(|i| admission.check_keyed(&request(n + i as u64, 0), keys[i]).unwrap())
            .collect()
    };
    let full = EnqueueDecision::ActiveKeysFull { max: 2 };
    let mut h = Harness::new(ordered());
    // Within one batch: a, a again, b fill the limit; c is refused.
    let decisions = check(&h, 0, &[key(b"a"), key(b"a"), key(b"b"), key(b"c"), None]);
    assert_eq!(decisions[..3], [EnqueueDecision::Accept; 3]);
    assert_eq!(decisions[3], full);
    assert_eq!(decisions[4], EnqueueDecision::Accept, "an unkeyed record is never refused");
    h.enqueue_keyed(1_000, request(0, 0), Some(b"a")).unwrap();
    h.enqueue_keyed(1_000, request(1, 0), Some(b"a")).unwrap();
    h.enqueue_keyed(1_000, request(2, 0), Some(b"b")).unwrap();
    assert_eq!(h.state.counters(1_000).lanes.active_keys, 2);
    // Applied: a new key is refused, an active key's next is not.
    assert_eq!(check(&h, 10, &[key(b"c")]), [full]);
    assert_eq!(check(&h, 11, &[key(b"b")]), [EnqueueDecision::Accept]);
    // The limit is the real one unless lowered, and never raised past it.
    assert_eq!(
        h.state.admission(1_000).check_keyed(&request(12, 0), key(b"c")).unwrap(),
        EnqueueDecision::Accept
    );
    let raised = h.state.admission(1_000).with_active_keys_max(usize::MAX);
    assert_eq!(raised.active_keys_max(), crate::queue::limits::ORDERED_ACTIVE_KEYS_MAX);
    // b's only message acked: b has no message left, c gets its place.
    let claimed = h.claim(1_000, 1, 10, None);
    let b_head = *claimed.iter().find(|d| d.offset == Offset(2)).unwrap();
    h.ack(1_010, &b_head).unwrap();
    assert_eq!(h.state.counters(1_010).lanes.active_keys, 1);
    assert_eq!(check(&h, 20, &[key(b"c")]), [EnqueueDecision::Accept]);
    // An unordered queue has no active keys to bound.
    let plain = Harness::new(QueueConfig::default());
    let keys: Vec<Option<OrderKey>> = (0..5u8).map(|n| key(&[n])).collect();
    assert_eq!(check(&plain, 0, &keys), [EnqueueDecision::Accept; 5]);
}

/// What the random test remembers of each enqueued record.
struct Record {
    key: Option<u8>,
}

// Goal: under random enqueues (keys, no keys, priorities, delays,
// expiries), claims, acks, releases with and without backoff, lease
// expiries, dead letters, purges and checkpoint restores, no key ever has
// two messages claimed at once, and a message is only ever claimed once
// every earlier message of its key finished; at the end everything
// drains and replay and restore equal the live state.
#[test]
fn random_histories_keep_every_key_in_order() {
    for seed in 0..40u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let config = QueueConfig {
            max_deliveries: rng.random_range(1..4),
            lease_min_ms: 50,
            backoff: Backoff::Linear { step_ms: rng.random_range(0..200), max_ms: 300 },
            ..ordered()
        };
        let mut h = Harness::new(config);
        let mut now: Millis = 1_000;
        let mut records: BTreeMap<u64, Record> = BTreeMap::new();
        let mut finished: BTreeSet<u64> = BTreeSet::new();
        let mut held: BTreeMap<u64, Delivery> = BTreeMap::new();
        let mut n = 0u64;
        for _ in 0..600 {
            match rng.random_range(0..100) {
                0..40 => {
                    let key = (rng.random_range(0..5) > 0).then(|| rng.random_range(0..6u8));
                    let mut req = request(n, rng.random_range(0..4));
                    if rng.random_range(0..6) == 0 {
                        req.not_before_ms = now + rng.random_range(0..600);
                    }
                    if rng.random_range(0..8) == 0 {
                        req.expiry_ms = Some(now + rng.random_range(0..3_000));
                    }
                    let bytes = key.map(|k| vec![b'k', k]);
                    if let Some(offset) = h.enqueue_keyed(now, req, bytes.as_deref()) {
                        records.insert(offset.0, Record { key });
                    }
                    n += 1;
                }
                40..60 => {
                    let lease = rng.random_range(50..800);
                    let logged = h.log.len();
                    let deliveries = h.claim(now, 1, rng.random_range(1..5), Some(lease));
                    // A claim may decide expiries on its way.
                    for event in &h.log[logged..] {
                        note(event, &mut finished, &mut held);
                    }
                    for d in deliveries {
                        let key = records[&d.offset.0].key;
                        if let Some(key) = key {
                            let earlier =
                                records.range(..d.offset.0).filter(|(_, r)| r.key == Some(key));
                            for (offset, _) in earlier {
                                assert!(
                                    finished.contains(offset),
                                    "seed {seed}: {:?} claimed before {offset} of its key finished",
                                    d.offset
                                );
                            }
                            assert!(
                                !held.keys().any(|o| records[o].key == Some(key)),
                                "seed {seed}: two messages of key {key} claimed at once"
                            );
                        }
                        held.insert(d.offset.0, d);
                    }
                }
                60..75 => {
                    if let Some(&offset) = held.keys().nth(rng.random_range(0..held.len().max(1))) {
                        if h.ack(now, &held[&offset]).is_ok() {
                            finished.insert(offset);
                            held.remove(&offset);
                        }
                    }
                }
                75..85 => {
                    if let Some(&offset) = held.keys().next() {
                        let not_before = (rng.random_range(0..2) == 0).then(|| now + 150);
                        if let Ok(event) = h.release(now, &held[&offset], 1, not_before) {
                            note(&event, &mut finished, &mut held);
                            held.remove(&offset);
                        }
                    }
                }
                85..98 => {
                    now += rng.random_range(0..400);
                    for event in h.tick(now) {
                        note(&event, &mut finished, &mut held);
                    }
                }
                98 => {
                    let events = h.state.purge(now, Lane::Main, 5, ALL_DURABLE);
                    h.apply_all(&events);
                    for event in &events {
                        note(event, &mut finished, &mut held);
                    }
                }
                _ => {
                    // Continue from a restored checkpoint: its lanes must
                    // carry on exactly as the live ones would.
                    h.state = assert_replays(&h);
                }
            }
        }
        // Drain: everything enqueued finishes, in order per key.
        for _ in 0..200 {
            now += 1_000;
            for event in h.tick(now) {
                note(&event, &mut finished, &mut held);
            }
            let logged = h.log.len();
            let deliveries = h.claim(now, 1, 100, Some(500));
            for event in &h.log[logged..] {
                note(event, &mut finished, &mut held);
            }
            for d in deliveries {
                if let Some(key) = records[&d.offset.0].key {
                    let earlier = records.range(..d.offset.0).filter(|(_, r)| r.key == Some(key));
                    assert!(earlier.map(|(o, _)| o).all(|o| finished.contains(o)), "seed {seed}");
                }
                h.ack(now, &d).unwrap();
                finished.insert(d.offset.0);
            }
            held.clear();
            if h.state.messages().iter().all(|v| v.lane == Lane::DeadLetter) {
                break;
            }
        }
        assert!(
            h.state.messages().iter().all(|v| v.lane == Lane::DeadLetter),
            "seed {seed}: main lane drained"
        );
        assert_eq!(finished.len(), records.len(), "seed {seed}: every record finished once");
        assert_eq!(h.state.counters(now).lanes, LaneCounters::default());
        assert_replays(&h);
    }
}

fn note(event: &Event, finished: &mut BTreeSet<u64>, held: &mut BTreeMap<u64, Delivery>) {
    match *event {
        Event::Expired { offset, .. } | Event::Quarantined { offset, .. } => {
            finished.insert(offset.0);
            held.remove(&offset.0);
        }
        Event::Purged { lane: Lane::Main, offset, .. } => {
            finished.insert(offset.0);
        }
        Event::LeaseExpired { offset, lane: Lane::Main, .. } => {
            held.remove(&offset.0);
        }
        _ => {}
    }
}
