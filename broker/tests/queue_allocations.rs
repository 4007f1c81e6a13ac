//! Heap allocations of the queue state machine's claim and ack path,
//! counted per calling thread by a counting global allocator (its own test
//! binary, so no other test's allocations mix in). Run with `--nocapture`
//! to see the figures.
//!
//! The claim decision and `apply(Claimed)` used to build several `Vec`s
//! per claimed message (heads, pending flags, non-empty classes, class
//! heads, weights, a credits copy): 8.6 allocations a message, the
//! largest share of the broker's allocations in a profile of
//! `spool-bench throughput` (uprobes on `mi_malloc_aligned`). They are now
//! inline arrays (`queue::fairness::PerClass`), and the class cursors merge
//! concrete iterators instead of nine boxed ones a claim.

use spool_broker::queue::{
    ClaimRequest, EnqueueMeta, Event, LeaderEpoch, MessageId, Offset, PartitionContext,
    PartitionId, PartitionState, QueueConfig, QueueId, WorkerId,
};

mod counting_alloc;

use counting_alloc::{calls, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MESSAGES: u64 = 20_000;
const CREDITS: u32 = 64;

fn state() -> PartitionState {
    let ctx = PartitionContext {
        queue: QueueId(1),
        partition: PartitionId(0),
        epoch: LeaderEpoch(1),
        secret: [1; 32],
        config: QueueConfig { max_messages: 1 << 32, ..QueueConfig::default() },
    };
    PartitionState::new(ctx).expect("the default config is valid")
}

fn enqueued(n: u64) -> Event {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    Event::Enqueued(EnqueueMeta {
        offset: Offset(n),
        message_id: MessageId(id),
        // Every band has messages, so the weighted round-robin runs.
        priority: (n % 4) as u8,
        not_before_ms: 0,
        expiry_ms: None,
        enqueue_time_ms: 1_000,
        size_bytes: 1_600,
        key: None,
    })
}

// Goal: claiming and acking cost a bounded number of heap allocations per
// claim request, not several per message. Method: 20,000 messages over 4
// bands claimed 64 at a time and acked one by one, counting the
// allocations of claim + apply(Claimed) and of ack + apply(Acked) on this
// thread. Per message, the claim path may allocate only what each request
// needs (its answer's two vectors and the list of class cursors) plus the
// warm map's storage for the claimed messages; ack nothing but chunk
// bookkeeping. Before `PerClass` the claim path made 8.6 a message.
#[test]
fn claim_and_ack_allocate_per_request_not_per_message() {
    // Counted only on this thread, from here on.
    counting_alloc::set_counting(true);
    let mut state = state();
    for n in 0..MESSAGES {
        state.apply(&enqueued(n)).unwrap();
    }
    let request = ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(7),
        credits: CREDITS,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let (mut claimed, mut claim_calls, mut requests) = (0u64, 0u64, 0u64);
    let (mut acked, mut ack_calls) = (0u64, 0u64);
    let now = 2_000;
    loop {
        let before = calls();
        let decision = state.claim(now, &request, Offset(u64::MAX)).unwrap();
        for event in &decision.events {
            state.apply(event).unwrap();
        }
        claim_calls += calls() - before;
        if decision.deliveries.is_empty() {
            break;
        }
        requests += 1;
        claimed += decision.deliveries.len() as u64;
        for delivery in &decision.deliveries {
            let before = calls();
            let event = state.ack(now, &delivery.token).unwrap();
            state.apply(&event).unwrap();
            ack_calls += calls() - before;
            acked += 1;
        }
    }
    assert_eq!(claimed, MESSAGES);
    assert_eq!(acked, MESSAGES);
    let per_claimed = claim_calls as f64 / claimed as f64;
    let per_request = claim_calls as f64 / requests as f64;
    let per_ack = ack_calls as f64 / acked as f64;
    println!(
        "allocations: {per_claimed:.2} per claimed message ({per_request:.1} per claim of \
         {CREDITS}), {per_ack:.2} per ack"
    );
    // The cursor list and the answer's 2 vectors a request, plus the warm
    // map's chunks and ready-index nodes as claimed messages move in:
    // measured 12.5 a request, 0.20 a message (before `PerClass` and the
    // unboxed cursors: 548.7 and 8.59).
    assert!(per_request <= 20.0, "{per_request:.1} allocations per claim request");
    assert!(per_claimed <= 0.5, "{per_claimed:.2} allocations per claimed message");
    assert!(per_ack <= 0.1, "{per_ack:.2} allocations per ack");
}
