//! Memory per message of the queue state machine, measured with a counting
//! global allocator (its own test binary so no other test allocates
//! concurrently). Run with `--nocapture` to see the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use spool_broker::queue::stored::PrincipalId;
use spool_broker::queue::{
    ClaimDecision, ClaimRequest, EnqueueMeta, Event, LeaderEpoch, MessageId, Offset, OrderKey,
    PartitionContext, PartitionId, PartitionState, QueueConfig, QueueId, SubscriptionId, WorkerId,
};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
/// Highest `LIVE_BYTES` since the last `reset_peak`.
static PEAK_BYTES: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE_BYTES.fetch_add(by, Ordering::Relaxed) + by;
    PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
}

fn reset_peak() -> isize {
    let now = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(now, Ordering::Relaxed);
    now
}

// SAFETY: delegates to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MESSAGES: u64 = 1_000_000;

fn state(dedupe_window_ms: u64) -> PartitionState {
    state_with(QueueConfig { max_messages: 1 << 32, dedupe_window_ms, ..QueueConfig::default() })
}

fn state_with(config: QueueConfig) -> PartitionState {
    let ctx = PartitionContext {
        queue: QueueId(1),
        partition: PartitionId(0),
        epoch: LeaderEpoch(1),
        secret: [1; 32],
        config,
    };
    PartitionState::new(ctx).expect("a valid config")
}

fn meta(n: u64, not_before_ms: u64, expiry_ms: Option<u64>) -> Event {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    Event::Enqueued(EnqueueMeta {
        offset: Offset(n * 2),
        message_id: MessageId(id),
        priority: (n % 4) as u8,
        not_before_ms,
        expiry_ms,
        enqueue_time_ms: 1_000,
        size_bytes: 1_600,
        key: None,
    })
}

/// Heap bytes per message added by `fill`.
fn per_message(
    mut fill: impl FnMut(&mut PartitionState),
    messages: u64,
    dedupe_window_ms: u64,
) -> f64 {
    let mut s = state(dedupe_window_ms);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    fill(&mut s);
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    s.assert_invariants();
    (after - before) as f64 / messages as f64
}

/// Claims every ready message (worker 1, the most credits a claim takes).
fn claim_all(s: &mut PartitionState) {
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: spool_broker::queue::limits::CLAIM_CREDITS_MAX,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    while s.counters(1_000).ready > 0 {
        for event in s.claim(1_000, &request, Offset(u64::MAX)).expect("a claim").events {
            s.apply(&event).expect("a claim applies");
        }
    }
}

// Goal: hold the memory targets (≤ 32 B per never-claimed message, ≤ 128 B
// per claimed or scheduled one, ≤ 40 B per dedupe window entry on top).
// Method: 1 M enqueues (and 100 k claims / schedules)
// under a counting allocator; bytes allocated per message.
#[test]
fn memory_per_message() {
    let fresh = per_message(
        |s| (0..MESSAGES).for_each(|n| s.apply(&meta(n, 0, None)).unwrap()),
        MESSAGES,
        0,
    );
    let fresh_expiring = per_message(
        |s| (0..MESSAGES).for_each(|n| s.apply(&meta(n, 0, Some(10_000_000))).unwrap()),
        MESSAGES,
        0,
    );
    let with_dedupe = per_message(
        |s| (0..MESSAGES).for_each(|n| s.apply(&meta(n, 0, None)).unwrap()),
        MESSAGES,
        3_600_000,
    );
    const WARM: u64 = 100_000;
    let scheduled = per_message(
        |s| (0..WARM).for_each(|n| s.apply(&meta(n, 5_000, Some(10_000_000))).unwrap()),
        WARM,
        0,
    );
    let claimed = per_message(
        |s| {
            (0..WARM).for_each(|n| s.apply(&meta(n, 0, Some(10_000_000))).unwrap());
            claim_all(s);
        },
        WARM,
        0,
    );
    println!("bytes/message: fresh {fresh:.1}, fresh with expiry {fresh_expiring:.1}, fresh + 1h dedupe window {with_dedupe:.1}, scheduled {scheduled:.1}, claimed {claimed:.1}");
    assert!(fresh <= 32.0, "fresh {fresh}");
    assert!(fresh_expiring <= 32.0, "fresh with expiry {fresh_expiring}");
    // Every one of the 1 M ids is inside the 1 h window: all held.
    assert!(with_dedupe - fresh <= 40.0, "dedupe entry {}", with_dedupe - fresh);
    assert!(scheduled <= 128.0, "scheduled {scheduled}");
    assert!(claimed <= 128.0, "claimed {claimed}");
}

/// An enqueue of record `n` at `offset` (no schedule, 1,600 bytes).
fn meta_at(n: u64, offset: u64) -> Event {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    Event::Enqueued(EnqueueMeta {
        offset: Offset(offset),
        message_id: MessageId(id),
        priority: 0,
        not_before_ms: 0,
        expiry_ms: None,
        enqueue_time_ms: 1_000,
        size_bytes: 1_600,
        key: None,
    })
}

/// `MESSAGES` records in batches of `batch`, each attributed batch followed
/// by a gap of one offset (offsets that are not dense: the harder case for
/// the state's runs), each batch attributed to `principals(batch index)`
/// when that is `Some`.
fn fill_batches(s: &mut PartitionState, batch: u64, principals: impl Fn(u64) -> Option<u64>) {
    let mut offset = 0u64;
    for index in 0..MESSAGES / batch {
        let first = offset;
        for k in 0..batch {
            s.apply(&meta_at(index * batch + k, first + k)).expect("an enqueue applies");
        }
        offset += batch;
        if let Some(principal) = principals(index) {
            s.apply(&Event::Attributed {
                offset: Offset(first),
                count: batch as u32,
                principal: PrincipalId(principal),
                at_ms: 1_000,
            })
            .expect("an attribution applies");
            // The attribution's control batch takes an offset.
            offset += 1;
        }
    }
}

// Goal: the stored quotas' bookkeeping (runs of attributed offsets, counts
// per principal) keeps a backlog of one batching producer within the 32 B
// per fresh message target, and the worst case (producers interleaving
// single-record batches, one run each) costs what the docs say. Method:
// 1 M fresh messages under a counting allocator: batches of 100 without
// attribution, the same attributed to one principal, and single-record
// batches of two principals taking turns; bytes allocated per message.
#[test]
fn memory_per_message_with_a_stored_quota() {
    let plain = per_message(|s| fill_batches(s, 100, |_| None), MESSAGES, 0);
    let attributed = per_message(|s| fill_batches(s, 100, |_| Some(7)), MESSAGES, 0);
    let interleaved = per_message(|s| fill_batches(s, 1, |index| Some(7 + index % 2)), MESSAGES, 0);
    println!(
        "bytes/message: batches of 100 {plain:.1}, attributed to one principal {attributed:.1}, \
         single-record batches of two principals taking turns {interleaved:.1}"
    );
    assert!(attributed <= 32.0, "attributed {attributed}");
    assert!(attributed - plain <= 1.0, "one producer's runs: {}", attributed - plain);
    assert!(interleaved - plain <= 64.0, "one run per batch: {}", interleaved - plain);
}

#[test]
fn a_stepped_checkpoint_holds_one_step_of_bytes_not_the_state() {
    // Goal: writing a checkpoint of a large state never holds a buffer of
    // the whole snapshot: the stepped encoder's extra heap is bounded by one
    // step's output (CHECKPOINT_STEP_BYTES_MAX) whatever the state's size,
    // where the one-shot snapshot holds all of it. Method: 300,000 fresh
    // messages with their dedupe entries; peak live heap (counting
    // allocator) above the start while encoding in steps of
    // CHECKPOINT_STEP_ENTRIES into one reused buffer (as the partition
    // does), against the one-shot snapshot, whose bytes the stepped ones
    // must equal.
    use spool_broker::partition::{CHECKPOINT_STEP_BYTES_MAX, CHECKPOINT_STEP_ENTRIES};
    const COUNT: u64 = 300_000;
    let mut s = state(3_600_000);
    for n in 0..COUNT {
        s.apply(&meta(n, 0, None)).unwrap();
    }
    let covers = Offset(COUNT * 2);
    let base = reset_peak();
    let whole = s.snapshot(covers);
    let whole_peak = PEAK_BYTES.load(Ordering::Relaxed) - base;
    assert!(whole_peak as usize >= whole.len());

    let mut crc = 0u32;
    let mut total = 0usize;
    let base = reset_peak();
    let mut encoder = s.begin_snapshot(covers);
    let mut out = Vec::with_capacity(CHECKPOINT_STEP_BYTES_MAX);
    let mut offset = 0usize;
    loop {
        out.clear();
        let done = s.snapshot_step(&mut encoder, CHECKPOINT_STEP_ENTRIES, &mut out).unwrap();
        assert!(out.len() <= CHECKPOINT_STEP_BYTES_MAX);
        assert!(out[..] == whole[offset..offset + out.len()], "step bytes at {offset}");
        offset += out.len();
        crc = crc32c::crc32c_append(crc, &out);
        total += out.len();
        if done {
            break;
        }
    }
    let stepped_peak = PEAK_BYTES.load(Ordering::Relaxed) - base;
    s.end_snapshot();
    assert_eq!(total, whole.len());
    assert_eq!(crc, crc32c::crc32c(&whole));
    println!(
        "snapshot of {COUNT} messages: {} bytes; one-shot peak {whole_peak} B, stepped peak {stepped_peak} B in {} steps",
        whole.len(),
        encoder.steps()
    );
    // One step's buffer plus the encoder and capture (header, counts,
    // empty before-image maps): a few KiB.
    assert!(
        (stepped_peak as usize) <= CHECKPOINT_STEP_BYTES_MAX + 16 * 1024,
        "stepped peak {stepped_peak} B"
    );
    assert!(encoder.max_step_entries() <= CHECKPOINT_STEP_ENTRIES);
}

/// Heap bytes `fill` adds to a fresh state, and that state's memory charge.
fn heap_and_charge(fill: impl FnOnce(&mut PartitionState), dedupe_window_ms: u64) -> (u64, u64) {
    let mut s = state(dedupe_window_ms);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    fill(&mut s);
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    s.assert_invariants();
    ((after - before).max(0) as u64, s.memory_charge())
}

// Goal: the charge a shard's state share takes for a partition
// (`PartitionState::memory_charge`) is never below what the state really
// allocates, in every phase a message can be in — never-claimed, with a
// dedupe entry, scheduled, claimed, dead-lettered, attributed in the worst
// run pattern — so a budget that admits a message can hold it whatever
// happens to it next. Method: 100 k messages per phase under the counting
// allocator; the heap growth against the charge. How it can fail: a phase
// costing more than `MESSAGE_STATE_BYTES_MAX` (a dead letter's map entry
// grown past it), or the charge forgetting the dedupe entries or runs.
#[test]
fn the_memory_charge_covers_what_the_state_allocates_in_every_phase() {
    const N: u64 = 100_000;
    let phases: Vec<(&str, (u64, u64))> = vec![
        ("fresh", heap_and_charge(|s| (0..N).for_each(|n| s.apply(&meta(n, 0, None)).unwrap()), 0)),
        (
            "fresh + 1 h dedupe window",
            heap_and_charge(
                |s| (0..N).for_each(|n| s.apply(&meta(n, 0, None)).unwrap()),
                3_600_000,
            ),
        ),
        (
            "scheduled",
            heap_and_charge(
                |s| (0..N).for_each(|n| s.apply(&meta(n, 5_000, Some(10_000_000))).unwrap()),
                0,
            ),
        ),
        (
            "claimed",
            heap_and_charge(
                |s| {
                    (0..N).for_each(|n| s.apply(&meta(n, 0, Some(10_000_000))).unwrap());
                    claim_all(s);
                },
                0,
            ),
        ),
        (
            "dead-lettered",
            heap_and_charge(
                |s| {
                    (0..N).for_each(|n| s.apply(&meta(n, 0, Some(10_000_000))).unwrap());
                    for n in 0..N {
                        s.apply(&Event::Quarantined {
                            sub: SubscriptionId::DEFAULT,
                            offset: Offset(n * 2),
                            generation: spool_broker::queue::Generation(0),
                            cause: spool_broker::queue::QuarantineCause::Deliveries,
                            reason: spool_broker::queue::ReleaseReason::NONE,
                            at_ms: 2_000,
                        })
                        .unwrap();
                    }
                },
                0,
            ),
        ),
        (
            "single-record batches of two principals taking turns",
            heap_and_charge(|s| fill_batches(s, 1, |index| Some(7 + index % 2)), 0),
        ),
    ];
    for (phase, (heap, charge)) in phases {
        println!("{phase}: heap {heap} B, charge {charge} B ({:.2}×)", charge as f64 / heap as f64);
        assert!(heap > 0, "{phase}: the fill allocated nothing");
        assert!(charge >= heap, "{phase}: charged {charge} B for {heap} B allocated");
    }
}

/// Starts subscriptions 1..count at offset 0 (the default is the first).
fn subscribe(s: &mut PartitionState, count: u16) {
    for sub in 1..count {
        let start =
            Event::SubscriptionStarted { sub: SubscriptionId(sub), from: Offset(0), at_ms: 0 };
        s.apply(&start).expect("a start applies");
    }
}

/// Claims and acks, for subscription `sub`, its oldest `count` messages.
fn consume(s: &mut PartitionState, sub: SubscriptionId, count: u64) {
    let mut left = count;
    while left > 0 {
        let credits = left.min(u64::from(spool_broker::queue::limits::CLAIM_CREDITS_MAX)) as u32;
        let request =
            ClaimRequest { sub, worker: WorkerId(1), credits, max_bytes: u64::MAX, lease_ms: None };
        let mut decision = ClaimDecision::default();
        s.claim_into(1_000, &request, Offset(u64::MAX), &mut decision).expect("a claim");
        assert!(!decision.deliveries.is_empty(), "a backlog to claim");
        for event in &decision.events {
            s.apply(event).expect("a claim applies");
        }
        for delivery in &decision.deliveries {
            let ack = s.ack(1_000, &delivery.token).expect("an ack");
            s.apply(&ack).expect("an ack applies");
        }
        left -= decision.deliveries.len() as u64;
    }
}

// Goal (docs/design/subscriptions.md §3): the backlog is shared, so a
// backlogged message costs ≤ 32 B for the first subscription and ≤ 8 B for
// each more. Method: 1, 3 and 10 subscriptions from offset 0; 1 M enqueues,
// bytes allocated per message; then the same with every subscription but
// the default having consumed (claimed and acked, in order) a different
// share of the backlog, so their cursors stand apart.
#[test]
fn memory_per_backlogged_message_with_several_subscriptions() {
    let mut line = String::from("bytes/backlogged message:");
    for count in [1u16, 3, 10] {
        let shared = per_message(
            |s| {
                subscribe(s, count);
                (0..MESSAGES).for_each(|n| s.apply(&meta(n, 0, None)).unwrap());
            },
            MESSAGES,
            0,
        );
        const SPREAD: u64 = 100_000;
        let spread = per_message(
            |s| {
                subscribe(s, count);
                (0..SPREAD).for_each(|n| s.apply(&meta(n, 0, None)).unwrap());
                for sub in 1..count {
                    consume(s, SubscriptionId(sub), SPREAD * u64::from(sub) / u64::from(count));
                }
            },
            SPREAD,
            0,
        );
        line += &format!(" {count} subscription(s): {shared:.1} (cursors apart: {spread:.1});");
        let goal = 32.0 + 8.0 * f64::from(count - 1);
        assert!(shared <= goal, "{count} subscriptions: {shared} B > {goal} B");
        assert!(spread <= goal, "{count} subscriptions, cursors apart: {spread} B > {goal} B");
    }
    println!("{line}");
}

// Goal (docs/design/subscriptions.md §5, "Step 4, concretely"): with a
// retention window a record every subscription finished stays in the
// shared index for replay at its index entry's cost, nothing per
// subscription (≤ 32 B, as a never-claimed one). Method: a queue with a
// one-minute window; 200 k enqueues, the default claims and acks them all
// (each then retained only); bytes allocated per record once done.
#[test]
fn memory_per_retained_record_after_every_subscription_finished_it() {
    const RECORDS: u64 = 200_000;
    let mut s = state_with(QueueConfig {
        max_messages: 1 << 32,
        dedupe_window_ms: 0,
        retention_ms: 60_000,
        ..QueueConfig::default()
    });
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    (0..RECORDS).for_each(|n| s.apply(&meta(n, 0, None)).unwrap());
    consume(&mut s, SubscriptionId::DEFAULT, RECORDS);
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    s.assert_invariants();
    assert_eq!(s.counters(1_000).live_messages, 0, "every record finished");
    assert_eq!(s.counters(1_000).retained_messages, RECORDS, "every record kept");
    let retained = (after - before) as f64 / RECORDS as f64;
    println!("bytes/retained record (window, every subscription finished): {retained:.1}");
    assert!(retained <= 32.0, "{retained} B per retained record > 32 B");
}

// Goal (docs/design/ordered-lanes.md, "Cost"): an ordered queue's lanes
// stay inside the per-message charge (`MESSAGE_STATE_BYTES_MAX`, so the
// memory budget covers them), and report what they cost. Method: 200 k
// records under a counting allocator, (a) each with its own key (every
// record an active key heading its lane), (b) all with one key (one
// head, every other record waiting behind it); bytes per record.
#[test]
fn memory_per_active_key_and_per_waiting_message() {
    const RECORDS: u64 = 200_000;
    let ordered = || {
        state_with(QueueConfig {
            max_messages: 1 << 32,
            dedupe_window_ms: 0,
            ordered: true,
            ..QueueConfig::default()
        })
    };
    let keyed = |n: u64, key: u64| {
        let Event::Enqueued(meta) = meta_at(n, n) else { unreachable!() };
        Event::Enqueued(meta.with_key(OrderKey::of(&key.to_le_bytes())))
    };
    let measure = |key_of: &dyn Fn(u64) -> u64| {
        let mut s = ordered();
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        (0..RECORDS).for_each(|n| s.apply(&keyed(n, key_of(n))).unwrap());
        let after = LIVE_BYTES.load(Ordering::Relaxed);
        s.assert_invariants();
        assert!(s.memory_charge() >= (after - before) as u64, "the charge covers the lanes");
        (s.counters(1_000).lanes, (after - before) as f64 / RECORDS as f64)
    };
    let (lanes, per_key) = measure(&|n| n);
    assert_eq!((lanes.active_keys, lanes.waiting), (RECORDS, 0));
    let (lanes, per_waiting) = measure(&|_| 7);
    assert_eq!((lanes.active_keys, lanes.waiting), (1, RECORDS - 1));
    println!("bytes/record heading its own key (active key): {per_key:.1}");
    println!("bytes/record waiting behind its key's head: {per_waiting:.1}");
    let charge = spool_broker::queue::limits::MESSAGE_STATE_BYTES_MAX as f64;
    assert!(per_key <= charge, "{per_key} B per active key > {charge} B");
    assert!(per_waiting <= charge, "{per_waiting} B per waiting record > {charge} B");
}
