//! Retention windows (`state/window.rs`, `docs/design/subscriptions.md`
//! §5): records every subscription finished stay for replay until the
//! window passes them; the window drops records a subscription had not
//! delivered, counts and reports exactly them, and never drops a record a
//! subscription holds claimed; replay and restore give the same state.

use std::collections::BTreeSet;

use super::super::*;
use super::harness::{ctx, request, Harness};

fn windowed(retention_ms: Millis, retention_bytes: u64) -> QueueConfig {
    QueueConfig { retention_ms, retention_bytes, ..QueueConfig::default() }
}

fn offsets(state: &PartitionState, sub: SubscriptionId) -> BTreeSet<u64> {
    state.messages_of(sub).unwrap().iter().map(|view| view.offset.0).collect()
}

/// Replaying the log, and restoring a snapshot of the state, give the
/// same state (bytes, counters and losses of every subscription).
fn assert_replays(h: &Harness, now: Millis) {
    let replayed = h.replay(1);
    assert_eq!(replayed.snapshot(Offset(0)), h.state.snapshot(Offset(0)));
    let restored = PartitionState::restore(&h.state.snapshot(Offset(0)), ctx(h.config.clone(), 1))
        .unwrap()
        .state;
    restored.assert_invariants();
    for sub in h.state.subscriptions() {
        for other in [&replayed, &restored] {
            assert_eq!(other.counters_of(sub, now), h.state.counters_of(sub, now));
            let losses: Vec<Loss> = other.losses_of(sub).unwrap().copied().collect();
            assert_eq!(losses, h.state.losses_of(sub).unwrap().copied().collect::<Vec<_>>());
        }
    }
    assert_eq!(restored.held_messages(), h.state.held_messages());
}

#[test]
fn finished_records_stay_for_replay_until_the_window_passes_them() {
    let mut h = Harness::new(windowed(10_000, 0));
    for n in 0..10 {
        h.enqueue_ok(1_000 + n * 100, request(n, 0));
    }
    // The default finishes everything: the records stay (they hold disk).
    for delivery in h.claim(2_000, 1, 10, None) {
        h.ack(2_000, &delivery).unwrap();
    }
    assert_eq!(h.state.messages().len(), 0);
    assert_eq!(h.state.held_messages(), 10);
    let counters = h.state.counters(2_000);
    assert_eq!((counters.retained_messages, counters.retained_bytes), (10, 1_000));
    assert_eq!(counters.oldest_retained_age_ms, Some(1_000));
    // A subscription from the earliest offset replays all ten; one from
    // a time replays exactly the records enqueued at or after it.
    let (early, late) = (SubscriptionId(1), SubscriptionId(2));
    h.apply_all(&[Event::SubscriptionStarted { sub: early, from: Offset(0), at_ms: 2_000 }]);
    let from = h.state.first_offset_at(1_500).unwrap();
    assert_eq!(from, Offset(5));
    h.apply_all(&[Event::SubscriptionStarted { sub: late, from, at_ms: 2_000 }]);
    assert_eq!(offsets(&h.state, early), (0..10).collect());
    assert_eq!(offsets(&h.state, late), (5..10).collect());
    // Nothing is due before the oldest record's window ends.
    assert_eq!(h.state.next_wakeup(), Some(11_000));
    assert!(h.tick(10_999).is_empty());
    // The window passes the five records enqueued before 1_450: `early`
    // had not delivered them and loses exactly them; `late` never had
    // them and the default finished them.
    let events = h.tick(11_450);
    assert_eq!(events, vec![Event::WindowPassed { through: Offset(5), at_ms: 11_450 }]);
    assert_eq!(offsets(&h.state, early), (5..10).collect());
    assert_eq!(h.state.counters_of(early, 11_450).unwrap().totals.lost, 5);
    let losses: Vec<Loss> = h.state.losses_of(early).unwrap().copied().collect();
    assert_eq!(losses, [Loss { from: Offset(0), to: Offset(4), count: 5, at_ms: 11_450 }]);
    for sub in [SubscriptionId::DEFAULT, late] {
        assert_eq!(h.state.counters_of(sub, 11_450).unwrap().totals.lost, 0);
        assert_eq!(h.state.losses_of(sub).unwrap().count(), 0);
    }
    assert_eq!(h.state.held_messages(), 5);
    assert_eq!(h.state.retention_watermark(), Some(Offset(5)));
    assert_eq!(h.state.next_wakeup(), Some(11_500));
    assert_replays(&h, 11_450);
}

#[test]
fn a_claimed_record_outlives_the_window_and_its_ack_still_counts() {
    let mut h = Harness::new(windowed(1_000, 0));
    h.enqueue_ok(1_000, request(0, 0));
    h.enqueue_ok(1_000, request(1, 0));
    let delivery = h.claim(1_100, 1, 1, Some(30_000)).remove(0);
    assert_eq!(delivery.offset, Offset(0));
    let events = h.tick(5_000);
    assert_eq!(events, vec![Event::WindowPassed { through: Offset(2), at_ms: 5_000 }]);
    // The unclaimed record is lost; the claimed one is still the worker's.
    assert_eq!(h.state.counters(5_000).totals.lost, 1);
    assert_eq!(h.state.messages().len(), 1);
    assert_eq!(h.state.held_messages(), 1);
    h.ack(5_100, &delivery).unwrap();
    assert_eq!(h.state.counters(5_100).totals.acked, 1);
    assert_eq!(h.state.held_messages(), 0);
    assert_eq!(h.state.retention_watermark(), None);
    assert_replays(&h, 5_100);
}

#[test]
fn a_size_window_drops_the_oldest_records_over_its_bytes() {
    let mut h = Harness::new(windowed(0, 1 << 20));
    for n in 0..5 {
        h.enqueue_ok(1_000, EnqueueRequest { size_bytes: 300_000, ..request(n, (n % 2) as u8) });
    }
    // 1.5 MB against 1 MiB: due at once, and the two oldest go.
    assert_eq!(h.state.next_wakeup(), Some(0));
    let events = h.tick(1_001);
    assert_eq!(events, vec![Event::WindowPassed { through: Offset(2), at_ms: 1_001 }]);
    assert_eq!(h.state.counters(1_001).retained_bytes, 900_000);
    let losses: Vec<Loss> = h.state.losses_of(SubscriptionId::DEFAULT).unwrap().copied().collect();
    assert_eq!(losses, [Loss { from: Offset(0), to: Offset(1), count: 2, at_ms: 1_001 }]);
    assert_eq!(h.state.next_wakeup(), None);
    assert!(h.tick(2_000).is_empty());
    assert_replays(&h, 2_000);
}

#[test]
fn a_retained_record_whose_expiry_passed_leaves_without_a_loss() {
    let mut h = Harness::new(windowed(60_000, 0));
    h.enqueue_ok(1_000, EnqueueRequest { expiry_ms: Some(2_000), ..request(0, 0) });
    h.enqueue_ok(1_000, request(1, 0));
    for delivery in h.claim(1_100, 1, 2, None) {
        h.ack(1_100, &delivery).unwrap();
    }
    assert_eq!(h.state.held_messages(), 2);
    // Its expiry makes the tick due; the window event drops it alone
    // (nothing below the bound, no one lost it), and the tick is not due
    // again until the window.
    assert_eq!(h.state.next_wakeup(), Some(2_000));
    let events = h.tick(2_000);
    assert_eq!(events, vec![Event::WindowPassed { through: Offset(0), at_ms: 2_000 }]);
    assert_eq!(h.state.held_messages(), 1);
    assert_eq!(h.state.counters(2_000).totals.lost, 0);
    assert_eq!(h.state.next_wakeup(), Some(61_000));
    // A subscription from the earliest offset is not given it.
    let sub = SubscriptionId(1);
    h.apply_all(&[Event::SubscriptionStarted { sub, from: Offset(0), at_ms: 2_100 }]);
    assert_eq!(offsets(&h.state, sub), BTreeSet::from([1]));
    assert_replays(&h, 2_100);
}

#[test]
fn the_window_decides_only_on_durable_records_and_drops_a_bounded_number() {
    let mut h = Harness::new(windowed(1_000, 0));
    let count = limits::WINDOW_DROP_MAX as u64 + 10;
    for n in 0..count {
        h.enqueue_ok(1_000, request(n, 0));
    }
    // Nothing durable: nothing decided.
    assert!(h.state.tick(10_000, Offset(0)).is_empty());
    let events = h.state.tick(10_000, Offset(3));
    assert_eq!(events, vec![Event::WindowPassed { through: Offset(3), at_ms: 10_000 }]);
    h.apply_all(&events);
    let events = h.tick(10_000);
    let through = Offset(3 + limits::WINDOW_DROP_MAX as u64);
    assert_eq!(events, vec![Event::WindowPassed { through, at_ms: 10_000 }]);
    // More is due at once; the next tick drops the rest.
    assert!(h.state.next_wakeup().is_some_and(|at| at <= 10_000));
    h.tick(10_000);
    assert_eq!(h.state.held_messages(), 0);
    assert_eq!(h.state.counters(10_000).totals.lost, count);
    assert_eq!(h.state.losses_of(SubscriptionId::DEFAULT).unwrap().count(), 3);
    assert_replays(&h, 10_000);
}

#[test]
fn a_queue_without_a_window_refuses_the_event_and_never_decides_it() {
    let mut h = Harness::new(QueueConfig::default());
    h.enqueue_ok(1_000, request(0, 0));
    assert!(h.tick(1 << 40).is_empty());
    let event = Event::WindowPassed { through: Offset(1), at_ms: 2_000 };
    assert!(matches!(h.state.apply(&event), Err(ApplyError::WrongState { .. })));
    assert_eq!(h.state.held_messages(), 1);
}

#[test]
fn window_passed_round_trips_through_its_control_record() {
    let event = Event::WindowPassed { through: Offset(1 << 40), at_ms: 123_456 };
    let mut bytes = Vec::new();
    assert_eq!(event.encode(&mut bytes).unwrap(), EVENT_BYTES);
    assert_eq!(bytes[0], EventKind::WindowPassed as u8);
    assert_eq!(Event::decode(&bytes).unwrap(), event);
    // Unused fields must be zero; the kind takes no subscription tail.
    let mut bad = bytes.clone();
    bad[4] = 1;
    assert!(Event::decode(&bad).is_err());
    let mut named = bytes.clone();
    named[0] |= 0x80;
    named.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    assert!(Event::decode(&named).is_err());
}

#[test]
fn window_bounds_are_validated() {
    let ok = |ms, bytes| windowed(ms, bytes).validate();
    assert!(ok(0, 0).is_ok());
    assert!(ok(limits::RETENTION_MS_MIN, 0).is_ok());
    assert_eq!(ok(10, 0), Err(ConfigError::RetentionMs(10)));
    assert!(ok(limits::RETENTION_MS_MAX + 1, 0).is_err());
    assert!(ok(0, limits::RETENTION_BYTES_MIN).is_ok());
    assert!(ok(0, 1_000).is_err());
    let over = QueueConfig { max_bytes: 2 << 20, ..windowed(0, 3 << 20) };
    assert!(matches!(over.validate(), Err(ConfigError::RetentionBytes { .. })));
}
