//! What a checkpoint of a partition with nothing live costs: its bytes must
//! follow what the state holds now (the dedupe window × the enqueue rate),
//! not how much traffic the partition has seen.

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
        let claim =
            ClaimRequest { worker: WorkerId(1), credits: 1, max_bytes: u64::MAX, lease_ms: None };
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
