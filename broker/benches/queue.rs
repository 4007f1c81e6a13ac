//! Criterion micro-benchmarks of the pure queue state machine: the costs the
//! partition pays on one core per operation, with no log and no I/O.
//!
//! - `claim_ack`: decide claim → apply → decide ack → apply, against a
//!   backlog kept at 1 M never-claimed messages (topped up outside the
//!   timed sections), for 1 and 64 credits per claim; throughput in messages.
//! - `ordered_claim_ack`: the same cycle at 64 credits on an unordered
//!   queue and on ordered ones with 1 k, 100 k and 10 M keys.
//! - `enqueue_apply`: `apply(Event::Enqueued)` with dedupe off and with the
//!   default window (clock advancing at 25,000/s); the state is replaced
//!   outside the timed sections before it passes 1 M messages.
//! - `snapshot` / `restore`: a checkpoint of a 1 M-message backlog (with its
//!   dedupe entries) and its restore.
//! - `dedupe`: the dedupe table alone through the state machine, default
//!   window, ids that look random (as a client's UUIDs): `insert_probe` is
//!   the admission check of a new id (a probe that misses) and its
//!   `apply(Enqueued)` (the insert), from an empty table so the first
//!   generation's growth is included; `probe_hit` the admission check of an
//!   id already in the window.
//!
//! Timing uses `iter_custom` over chunks so refills never count. Run with
//! `cargo bench -p spool-broker --bench queue`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spool_broker::clock::instant_now;
use spool_broker::queue::{
    ClaimRequest, EnqueueDecision, EnqueueMeta, EnqueueRequest, Event, LeaderEpoch, MessageId,
    Millis, Offset, OrderKey, PartitionContext, PartitionId, PartitionState, QueueConfig, QueueId,
    SubscriptionId, WorkerId,
};

/// The backlog every claim+ack cycle runs against.
const BACKLOG: u64 = 1_000_000;
/// Operations timed between two untimed refills.
const CHUNK: u64 = 10_000;
/// Simulated enqueue rate of the capacity model.
const RATE_PER_S: u64 = 25_000;
const START_MS: Millis = 1_700_000_000_000;

fn new_state(dedupe_window_ms: Millis) -> PartitionState {
    new_state_with(QueueConfig {
        max_messages: 1 << 32,
        dedupe_window_ms,
        ..QueueConfig::default()
    })
}

fn new_state_with(config: QueueConfig) -> PartitionState {
    let ctx = PartitionContext {
        queue: QueueId(1),
        partition: PartitionId(0),
        epoch: LeaderEpoch(1),
        secret: [0x5b; 32],
        config,
    };
    match PartitionState::new(ctx) {
        Ok(state) => state,
        Err(error) => panic!("the benchmark config is valid: {error}"),
    }
}

fn time_ms(n: u64) -> Millis {
    START_MS + n * 1000 / RATE_PER_S
}

fn enqueued(n: u64) -> Event {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    Event::Enqueued(EnqueueMeta {
        offset: Offset(n),
        message_id: MessageId(id),
        priority: (n % 4) as u8,
        not_before_ms: 0,
        expiry_ms: None,
        enqueue_time_ms: time_ms(n),
        size_bytes: 1_638,
        key: None,
    })
}

fn apply(state: &mut PartitionState, event: &Event) {
    if let Err(error) = state.apply(event) {
        panic!("{event:?} does not apply: {error}");
    }
}

/// A state holding a backlog and the offset of its next message.
struct Backlog {
    state: PartitionState,
    next: u64,
}

impl Backlog {
    fn new(dedupe_window_ms: Millis) -> Self {
        let mut backlog = Self { state: new_state(dedupe_window_ms), next: 0 };
        backlog.top_up();
        backlog
    }

    /// Enqueues until `BACKLOG` messages are live again.
    fn top_up(&mut self) {
        let live = self.state.live_messages();
        for _ in live..BACKLOG {
            apply(&mut self.state, &enqueued(self.next));
            self.next += 1;
        }
    }

    fn now(&self) -> Millis {
        time_ms(self.next)
    }
}

/// One cycle: claim `credits`, apply, ack each, apply. Returns messages done.
fn claim_ack(state: &mut PartitionState, now: Millis, request: &ClaimRequest) -> u64 {
    let decision = match state.claim(now, request, Offset(u64::MAX)) {
        Ok(decision) => decision,
        Err(error) => panic!("claim refused: {error}"),
    };
    for event in &decision.events {
        apply(state, event);
    }
    for delivery in &decision.deliveries {
        match state.ack(now, &delivery.token) {
            Ok(event) => apply(state, &event),
            Err(error) => panic!("ack refused: {error}"),
        }
    }
    decision.deliveries.len() as u64
}

fn bench_claim_ack(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_ack");
    group.measurement_time(Duration::from_secs(5));
    for credits in [1u32, 64] {
        let mut backlog = Backlog::new(0);
        let request = ClaimRequest {
            sub: SubscriptionId::DEFAULT,
            worker: WorkerId(3),
            credits,
            max_bytes: u64::MAX,
            lease_ms: None,
        };
        group.throughput(Throughput::Elements(u64::from(credits)));
        group.bench_function(BenchmarkId::new("backlog_1m_credits", credits), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    backlog.top_up();
                    let now = backlog.now();
                    let chunk = left.min(CHUNK);
                    let start = instant_now();
                    for _ in 0..chunk {
                        black_box(claim_ack(&mut backlog.state, now, &request));
                    }
                    total += instant_now().duration_since(start);
                    left -= chunk;
                }
                total
            });
        });
    }
    group.finish();
}

/// Fan-out: one log, `subs` subscriptions (the default and `subs - 1`
/// started at offset 0) each with a standing backlog of `FAN_BACKLOG`; one
/// cycle enqueues 64 records and has every subscription claim and ack 64.
/// Throughput counts the records enqueued, so the time per element is what
/// one record costs delivered to every subscription; how it grows with
/// `subs` is the cost of a subscription (`docs/design/subscriptions.md`).
const FAN_BACKLOG: u64 = 100_000;

fn bench_fan_out(c: &mut Criterion) {
    let mut group = c.benchmark_group("fan_out");
    group.measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(64));
    for subs in [1u16, 3, 10] {
        let mut state = new_state(0);
        for sub in 1..subs {
            let start =
                Event::SubscriptionStarted { sub: SubscriptionId(sub), from: Offset(0), at_ms: 0 };
            apply(&mut state, &start);
        }
        let mut next = 0u64;
        for _ in 0..FAN_BACKLOG {
            apply(&mut state, &enqueued(next));
            next += 1;
        }
        let requests: Vec<ClaimRequest> = (0..subs)
            .map(|sub| ClaimRequest {
                sub: SubscriptionId(sub),
                worker: WorkerId(3),
                credits: 64,
                max_bytes: u64::MAX,
                lease_ms: None,
            })
            .collect();
        group.bench_function(BenchmarkId::new("subscriptions", subs), |b| {
            b.iter(|| {
                for _ in 0..64 {
                    apply(&mut state, &enqueued(next));
                    next += 1;
                }
                let now = time_ms(next);
                for request in &requests {
                    black_box(claim_ack(&mut state, now, request));
                }
            });
        });
    }
    group.finish();
}

/// Ordered lanes (`docs/design/ordered-lanes.md`): the same claim+ack
/// cycle (64 credits, a standing backlog of `BACKLOG`) on a queue without
/// ordering and on an ordered one whose records' keys are `n % keys` for
/// 1 k, 100 k and 10 M keys (with 10 M every record of the backlog is its
/// own key: as many active keys as records). Every record has a key in all
/// four, so the unordered run pays the same hashing.
fn bench_ordered(c: &mut Criterion) {
    let mut group = c.benchmark_group("ordered_claim_ack");
    group.measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(64));
    for keys in [None, Some(1_000u64), Some(100_000), Some(10_000_000)] {
        let mut state = new_state_with(QueueConfig {
            max_messages: 1 << 32,
            dedupe_window_ms: 0,
            ordered: keys.is_some(),
            ..QueueConfig::default()
        });
        let key_space = keys.unwrap_or(1_000);
        let keyed = |n: u64| {
            let Event::Enqueued(meta) = enqueued(n) else { unreachable!("an enqueue") };
            Event::Enqueued(meta.with_key(OrderKey::of(&(n % key_space).to_le_bytes())))
        };
        let mut next = 0u64;
        let request = ClaimRequest {
            sub: SubscriptionId::DEFAULT,
            worker: WorkerId(3),
            credits: 64,
            max_bytes: u64::MAX,
            lease_ms: None,
        };
        let name = keys.map_or("off".to_owned(), |keys| format!("keys_{keys}"));
        group.bench_function(BenchmarkId::new("credits_64", name), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    for _ in state.live_messages()..BACKLOG {
                        apply(&mut state, &keyed(next));
                        next += 1;
                    }
                    let now = time_ms(next);
                    let chunk = left.min(CHUNK / 64);
                    let start = instant_now();
                    for _ in 0..chunk {
                        black_box(claim_ack(&mut state, now, &request));
                    }
                    total += instant_now().duration_since(start);
                    left -= chunk;
                }
                total
            });
        });
    }
    group.finish();
}

fn bench_enqueue_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue_apply");
    group.throughput(Throughput::Elements(1));
    let default_window_ms = QueueConfig::default().dedupe_window_ms;
    for (name, window_ms) in [("dedupe_off", 0), ("dedupe_default", default_window_ms)] {
        let mut state = new_state(window_ms);
        let mut next = 0u64;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    if next >= BACKLOG {
                        state = new_state(window_ms);
                        next = 0;
                    }
                    let chunk = left.min(CHUNK).min(BACKLOG - next);
                    let events: Vec<Event> = (next..next + chunk).map(enqueued).collect();
                    let start = instant_now();
                    for event in &events {
                        apply(&mut state, event);
                    }
                    total += instant_now().duration_since(start);
                    next += chunk;
                    left -= chunk;
                }
                total
            });
        });
    }
    group.finish();
}

fn bench_snapshot(c: &mut Criterion) {
    let backlog = Backlog::new(QueueConfig::default().dedupe_window_ms);
    let covers = Offset(backlog.next);
    let bytes = backlog.state.snapshot(covers);
    let mut group = c.benchmark_group("checkpoint_1m");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("snapshot", |b| {
        b.iter(|| black_box(backlog.state.snapshot(covers)));
    });
    let ctx = PartitionContext {
        queue: QueueId(1),
        partition: PartitionId(0),
        epoch: LeaderEpoch(2),
        secret: [0x5b; 32],
        config: backlog.state.config().clone(),
    };
    group.bench_function("restore", |b| {
        b.iter(|| match PartitionState::restore(&bytes, ctx.clone()) {
            Ok(restored) => black_box(restored.covers),
            Err(error) => panic!("restore failed: {error}"),
        });
    });
    group.finish();
}

/// An id that looks random (a client's UUID), distinct for each `n`.
fn random_id(n: u64) -> MessageId {
    let mix = |x: u64| {
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&mix(n).to_le_bytes());
    id[8..].copy_from_slice(&mix(n ^ 0x9e37_79b9_7f4a_7c15).to_le_bytes());
    MessageId(id)
}

fn request_of(id: MessageId) -> EnqueueRequest {
    EnqueueRequest {
        message_id: id,
        priority: 0,
        not_before_ms: 0,
        expiry_ms: None,
        size_bytes: 1_638,
    }
}

fn bench_dedupe(c: &mut Criterion) {
    let mut group = c.benchmark_group("dedupe");
    group.throughput(Throughput::Elements(1));
    let window_ms = QueueConfig::default().dedupe_window_ms;
    let mut state = new_state(window_ms);
    let mut next = 0u64;
    group.bench_function("insert_probe", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                if next >= BACKLOG {
                    state = new_state(window_ms);
                    next = 0;
                }
                let chunk = left.min(CHUNK).min(BACKLOG - next);
                let events: Vec<(EnqueueRequest, Event)> = (next..next + chunk)
                    .map(|n| {
                        let id = random_id(n);
                        let meta = EnqueueMeta::new(&request_of(id), Offset(n), time_ms(n));
                        (request_of(id), Event::Enqueued(meta))
                    })
                    .collect();
                let start = instant_now();
                for (request, event) in &events {
                    let decision = state.enqueue_check(time_ms(next), request);
                    debug_assert_eq!(decision, Ok(EnqueueDecision::Accept));
                    black_box(decision).ok();
                    apply(&mut state, event);
                }
                total += instant_now().duration_since(start);
                next += chunk;
                left -= chunk;
            }
            total
        });
    });
    let mut full = new_state(window_ms);
    for n in 0..CHUNK {
        let id = random_id(n);
        apply(
            &mut full,
            &Event::Enqueued(EnqueueMeta::new(&request_of(id), Offset(n), time_ms(n))),
        );
    }
    let now = time_ms(CHUNK);
    let mut probe = 0u64;
    group.bench_function("probe_hit", |b| {
        b.iter(|| {
            probe = (probe + 1) % CHUNK;
            black_box(full.enqueue_check(now, &request_of(random_id(probe)))).ok()
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_claim_ack,
    bench_fan_out,
    bench_ordered,
    bench_enqueue_apply,
    bench_snapshot,
    bench_dedupe
);
criterion_main!(benches);
