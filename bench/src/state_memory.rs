//! `state-memory`: heap bytes per message of the queue state machine, and
//! how fast it folds enqueues.
//!
//! Pure: one [`PartitionState`], no log, no I/O, no executor. Messages are
//! fed with `apply(Event::Enqueued)` exactly as replay and the live path
//! feed them, with enqueue times advancing as they would at `rate_per_s`
//! (the capacity model's 25,000/s), so the dedupe window holds what it would
//! hold in production and no more. Heap is measured with the counting global
//! allocator the `spool-bench` binary installs ([`crate::heap`]); the run
//! refuses to start without it.
//!
//! Phases, each on its own state so one figure does not pollute another:
//! 1. the backlog with dedupe window 0: bytes per never-claimed message;
//! 2. the same backlog with the default dedupe window: the difference,
//!    divided by the dedupe entries the window still holds, is the dedupe
//!    cost per entry; this phase also gives the apply rate as production
//!    would see it;
//! 3. `warm_messages` claimed (decide claim → apply, as the partition does);
//! 4. the same then released with a backoff: scheduled retries;
//! 5. `warm_messages` enqueued with a future `not_before`: scheduled.
//!
//! Phases 3–5 start from an empty state, so their figure per message
//! includes the state's fixed overhead spread over `warm_messages` (an upper
//! bound). What this does not measure: allocator slack or RSS, the log, and
//! the partition's own buffers.

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_broker::queue::limits::{CLAIM_CREDITS_MAX, QUEUE_BYTES_MAX, QUEUE_MESSAGES_MAX};
use spool_broker::queue::{
    ClaimRequest, EnqueueMeta, Event, LeaderEpoch, MessageId, Millis, Offset, PartitionContext,
    PartitionId, PartitionState, QueueConfig, QueueId, ReleaseReason, WorkerId,
};

use crate::error::BenchError;
use crate::heap;

/// Largest backlog a run may build (≈ 5 GiB of state with dedupe).
pub const MESSAGES_MAX: u64 = 50_000_000;
/// Largest claimed/scheduled sample.
pub const WARM_MESSAGES_MAX: u64 = 10_000_000;
/// Fastest simulated enqueue rate (one message per 0.1 µs of broker time).
pub const RATE_PER_S_MAX: u64 = 10_000_000;
/// Record size counted per message (the capacity model's 1.6 KiB). The
/// state keeps it as one integer, so its value does not change the memory.
pub const RECORD_BYTES: u32 = 1_638;
/// Broker time of the first enqueue (any fixed value repeats exactly).
const START_MS: Millis = 1_700_000_000_000;
/// How far in the future scheduled and released messages become ready.
const DELAY_MS: Millis = 60_000;
/// Priority bands the messages are spread over (the default config's).
const BANDS: u64 = 4;

/// The capacity model's figures, echoed so a report is self-describing.
pub const TARGET_BYTES_PER_MESSAGE: f64 = 32.0;
pub const TARGET_BYTES_PER_WARM_MESSAGE: f64 = 128.0;

/// What to run: the `state-memory` subcommand's flags.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct StateMemoryConfig {
    /// Never-claimed backlog to build (the capacity model's burst).
    #[arg(long, default_value_t = Self::new().messages)]
    pub messages: u64,
    /// Messages claimed, released and scheduled for the per-message figures.
    #[arg(long, default_value_t = Self::new().warm_messages)]
    pub warm_messages: u64,
    /// Simulated enqueue rate: enqueue times advance 1/rate s per message.
    #[arg(long, default_value_t = Self::new().rate_per_s)]
    pub rate_per_s: u64,
}

impl StateMemoryConfig {
    /// The capacity model's burst: 7.2 M messages at 25,000/s, 100 k warm
    /// (also the subcommand's defaults).
    pub const fn new() -> Self {
        Self { messages: 7_200_000, warm_messages: 100_000, rate_per_s: 25_000 }
    }

    fn validate(&self) -> Result<(), BenchError> {
        let check = BenchError::check_range;
        check("messages", self.messages, 1, MESSAGES_MAX)?;
        check("warm_messages", self.warm_messages, 1, WARM_MESSAGES_MAX)?;
        check("rate_per_s", self.rate_per_s, 1, RATE_PER_S_MAX)?;
        Ok(())
    }

    /// Broker time at which message `n` is enqueued.
    fn enqueue_time_ms(&self, n: u64) -> Millis {
        START_MS + n * 1000 / self.rate_per_s
    }
}

impl Default for StateMemoryConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Targets the figures are compared against (not judged here).
#[derive(Clone, Debug, Serialize)]
pub struct MemoryTargets {
    pub bytes_per_message: f64,
    pub bytes_per_claimed_message: f64,
    pub bytes_per_scheduled_message: f64,
}

/// The one JSON object a run prints.
#[derive(Clone, Debug, Serialize)]
pub struct StateMemoryReport {
    pub scenario: &'static str,
    pub messages: u64,
    pub rate_per_s: u64,
    /// Heap per never-claimed FIFO message, dedupe window 0.
    pub bytes_per_message: f64,
    /// Heap of the whole backlog, dedupe window 0.
    pub backlog_heap_bytes: i64,
    /// The default config's dedupe window, used in phase 2.
    pub dedupe_window_ms: Millis,
    /// Dedupe entries the window still holds after the last enqueue.
    pub dedupe_entries: u64,
    /// (heap with the default window − heap with window 0) ÷ dedupe entries.
    pub dedupe_bytes_per_entry: f64,
    /// Heap per message with the default dedupe window (backlog + dedupe).
    pub bytes_per_message_with_dedupe: f64,
    pub backlog_heap_bytes_with_dedupe: i64,
    pub warm_messages: u64,
    /// Heap per message under a lease (claimed by decide → apply).
    pub bytes_per_claimed_message: f64,
    /// Heap per message enqueued with a future `not_before`.
    pub bytes_per_scheduled_message: f64,
    /// Heap per message claimed and released with a delay (a scheduled retry).
    pub bytes_per_released_message: f64,
    /// `apply(Enqueued)` per second with the default dedupe window (phase 2).
    pub enqueue_applies_per_s: f64,
    /// `apply(Enqueued)` per second with dedupe window 0 (phase 1).
    pub enqueue_applies_per_s_without_dedupe: f64,
    /// Wall time of the whole run (all phases, including setup).
    pub elapsed_ms: f64,
    pub targets: MemoryTargets,
}

fn new_state(dedupe_window_ms: Millis) -> Result<PartitionState, BenchError> {
    let config = QueueConfig {
        max_messages: QUEUE_MESSAGES_MAX,
        max_bytes: QUEUE_BYTES_MAX,
        dedupe_window_ms,
        ..QueueConfig::default()
    };
    let ctx = PartitionContext {
        queue: QueueId(1),
        partition: PartitionId(0),
        epoch: LeaderEpoch(1),
        secret: [0x5b; 32],
        config,
    };
    Ok(PartitionState::new(ctx)?)
}

/// The enqueue event of message `n`: offset `n` (data batches carry
/// consecutive offsets), a distinct id, bands round-robin.
fn enqueued(n: u64, enqueue_time_ms: Millis, not_before_ms: Millis) -> Event {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    id[8..].copy_from_slice(&(!n).to_le_bytes());
    Event::Enqueued(EnqueueMeta {
        offset: Offset(n),
        message_id: MessageId(id),
        priority: (n % BANDS) as u8,
        not_before_ms,
        expiry_ms: None,
        enqueue_time_ms,
        size_bytes: RECORD_BYTES,
        key: None,
    })
}

/// Heap growth while `work` runs on `state`, and what `work` returned.
fn heap_delta<T>(
    state: &mut PartitionState,
    work: impl FnOnce(&mut PartitionState) -> Result<T, BenchError>,
) -> Result<(i64, T), BenchError> {
    let before = heap::live_bytes();
    let value = work(state)?;
    let after = heap::live_bytes();
    Ok(((after - before) as i64, value))
}

/// Applies the backlog; returns the applies per second.
fn fill(
    state: &mut PartitionState,
    config: &StateMemoryConfig,
    count: u64,
) -> Result<f64, BenchError> {
    let start = instant_now();
    for n in 0..count {
        let time_ms = config.enqueue_time_ms(n);
        state.apply(&enqueued(n, time_ms, 0))?;
    }
    let seconds = instant_now().duration_since(start).as_secs_f64();
    Ok(count as f64 / seconds.max(f64::MIN_POSITIVE))
}

/// Claims every ready message at `now`, as the partition does: decide,
/// then apply each event. Returns the delivery tokens.
fn claim_all(
    state: &mut PartitionState,
    now: Millis,
) -> Result<Vec<spool_broker::queue::DeliveryToken>, BenchError> {
    let request = ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(7),
        credits: CLAIM_CREDITS_MAX,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let mut tokens = Vec::new();
    loop {
        let decision = state.claim(now, &request, Offset(u64::MAX))?;
        if decision.deliveries.is_empty() {
            return Ok(tokens);
        }
        for event in &decision.events {
            state.apply(event)?;
        }
        tokens.extend(decision.deliveries.iter().map(|delivery| delivery.token));
    }
}

/// Runs every phase and reports.
///
/// # Errors
/// [`BenchError::OutOfRange`] for a bad config, [`BenchError::NoCountingAllocator`]
/// when the binary did not install [`heap::CountingAllocator`], and any
/// queue error (a bug: the scenario only issues valid decisions).
pub fn run(config: &StateMemoryConfig) -> Result<StateMemoryReport, BenchError> {
    config.validate()?;
    if !heap::installed() {
        return Err(BenchError::NoCountingAllocator);
    }
    let run_start = instant_now();
    let messages = config.messages;
    let per = |bytes: i64, count: u64| bytes as f64 / count as f64;

    // Phase 1: the backlog alone.
    let mut state = new_state(0)?;
    let (backlog_heap_bytes, rate_without_dedupe) =
        heap_delta(&mut state, |state| fill(state, config, messages))?;
    state.assert_invariants();
    drop(state);

    // Phase 2: the backlog and the default dedupe window.
    let dedupe_window_ms = QueueConfig::default().dedupe_window_ms;
    let mut state = new_state(dedupe_window_ms)?;
    let (backlog_heap_bytes_with_dedupe, rate_with_dedupe) =
        heap_delta(&mut state, |state| fill(state, config, messages))?;
    state.assert_invariants();
    drop(state);
    // Entries are pruned when an enqueue at `now` finds them `window` old;
    // after the last enqueue the window holds those younger than that.
    let last_ms = config.enqueue_time_ms(messages - 1);
    let dedupe_entries = (0..messages)
        .filter(|&n| config.enqueue_time_ms(n) + dedupe_window_ms > last_ms)
        .count() as u64;

    // Phases 3 and 4: claimed, then released with a delay.
    let warm = config.warm_messages;
    let now = config.enqueue_time_ms(warm);
    let mut state = new_state(0)?;
    let (claimed_bytes, tokens) = heap_delta(&mut state, |state| {
        fill(state, config, warm)?;
        claim_all(state, now)
    })?;
    if tokens.len() as u64 != warm {
        return Err(BenchError::Scenario(format!("claimed {} of {warm} messages", tokens.len())));
    }
    // The tokens are the scenario's, not the state's: count them out.
    let token_bytes = (tokens.capacity() * std::mem::size_of_val(&tokens[0])) as i64;
    let claimed_bytes = claimed_bytes - token_bytes;
    state.assert_invariants();
    let (release_delta, ()) = heap_delta(&mut state, |state| {
        for token in &tokens {
            let event = state.release(now, token, ReleaseReason(1), Some(now + DELAY_MS))?;
            state.apply(&event)?;
        }
        Ok(())
    })?;
    let released_bytes = claimed_bytes + release_delta;
    state.assert_invariants();
    let counters = state.counters(now);
    if counters.scheduled != warm {
        return Err(BenchError::Scenario(format!(
            "{} of {warm} released messages are scheduled",
            counters.scheduled
        )));
    }
    drop(state);
    drop(tokens);

    // Phase 5: enqueued for later.
    let mut state = new_state(0)?;
    let (scheduled_bytes, ()) = heap_delta(&mut state, |state| {
        for n in 0..warm {
            let time_ms = config.enqueue_time_ms(n);
            state.apply(&enqueued(n, time_ms, time_ms + DELAY_MS))?;
        }
        Ok(())
    })?;
    state.assert_invariants();
    let scheduled = state.counters(config.enqueue_time_ms(warm)).scheduled;
    if scheduled != warm {
        return Err(BenchError::Scenario(format!("{scheduled} of {warm} messages are scheduled")));
    }
    drop(state);

    Ok(StateMemoryReport {
        scenario: "state-memory",
        messages,
        rate_per_s: config.rate_per_s,
        bytes_per_message: per(backlog_heap_bytes, messages),
        backlog_heap_bytes,
        dedupe_window_ms,
        dedupe_entries,
        dedupe_bytes_per_entry: per(
            backlog_heap_bytes_with_dedupe - backlog_heap_bytes,
            dedupe_entries.max(1),
        ),
        bytes_per_message_with_dedupe: per(backlog_heap_bytes_with_dedupe, messages),
        backlog_heap_bytes_with_dedupe,
        warm_messages: warm,
        bytes_per_claimed_message: per(claimed_bytes, warm),
        bytes_per_scheduled_message: per(scheduled_bytes, warm),
        bytes_per_released_message: per(released_bytes, warm),
        enqueue_applies_per_s: rate_with_dedupe,
        enqueue_applies_per_s_without_dedupe: rate_without_dedupe,
        elapsed_ms: instant_now().duration_since(run_start).as_secs_f64() * 1000.0,
        targets: MemoryTargets {
            bytes_per_message: TARGET_BYTES_PER_MESSAGE,
            bytes_per_claimed_message: TARGET_BYTES_PER_WARM_MESSAGE,
            bytes_per_scheduled_message: TARGET_BYTES_PER_WARM_MESSAGE,
        },
    })
}
