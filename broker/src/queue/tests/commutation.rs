//! The commutation test (`docs/design/shard-journal.md` §12): in the shard
//! journal control entries may be written ahead of data entries that were
//! appended before them, because a control event only names records that
//! were durable when it was decided. Replaying the events in that "journal
//! order" must give the state the partition had at run time.
//!
//! A seeded random workload runs against the state machine. Each event is
//! recorded in run-time order, tagged data (an enqueue; offsets number data
//! records only, as in the journal) or control; a control event also records
//! how many data events were durable and how many appended when it was
//! decided. Durability is a prefix of the data events, advanced at random.
//! A journal order is then drawn: data events keep their order, control
//! events keep theirs (one control lane), and each control event lands at a
//! random place after every data event durable at its decision and before
//! every data event appended after it (a later append queues behind it).
//! Both orders are replayed into fresh states and compared: snapshot bytes
//! (every message, generation, attempt, phase, the dedupe table, totals),
//! message views and counters.
//!
//! Two exclusions, each pinned by its own test below and written down in
//! `docs/design/shard-journal.md` §12 ("Found by the commutation test"):
//!
//! - **Ticks and purges** are decided on records whose enqueue is not yet
//!   durable (an expiry, a scheduled message becoming ready, a purge of the
//!   main lane: neither takes the durable watermark). Such an event cannot be
//!   written ahead of that record's data. The workload records them as
//!   decided once every record they name is durable (the rule the journal
//!   needs), and counts how often that was needed.
//! - **Fairness credits.** `apply(Claimed)` starts a new round when no class
//!   with a message has credit left, and a class whose messages are all not
//!   yet durable counts as having one; a claim written ahead of such an
//!   enqueue replays to other credits. The comparison takes the credits out
//!   (counted; every other byte of the snapshot must agree).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::limits::TICK_EVENTS_MAX;
use super::super::*;
use super::harness::{ctx, id};

/// One event as the partition appended it.
#[derive(Clone, Copy, Debug)]
enum Recorded {
    Data(Event),
    /// `durable`/`appended`: data events durable / appended when decided.
    Control {
        event: Event,
        durable: usize,
        appended: usize,
    },
}

struct Run {
    rng: ChaCha8Rng,
    config: QueueConfig,
    state: PartitionState,
    recorded: Vec<Recorded>,
    tokens: Vec<DeliveryToken>,
    now: Millis,
    /// Data events appended (the next data offset).
    appended: usize,
    /// Data events durable: a prefix of the appended ones.
    durable: usize,
    /// Tick and purge events that named a record not yet durable (see
    /// [`Run::control`]).
    waited: u64,
}

fn random_config(rng: &mut ChaCha8Rng) -> QueueConfig {
    let bands = rng.random_range(4..=6);
    QueueConfig {
        band_weights: (0..bands).map(|_| rng.random_range(1..=4)).collect(),
        retry_weight: rng.random_range(1..=3),
        age_promotion_ms: if rng.random_bool(0.5) { rng.random_range(500..4_000) } else { 1 << 40 },
        lease_default_ms: 1_000,
        lease_min_ms: 100,
        lease_max_ms: 3_000,
        max_lease_lifetime_ms: rng.random_range(3_000..8_000),
        max_deliveries: rng.random_range(1..=4),
        backoff: Backoff::Linear { step_ms: rng.random_range(1..800), max_ms: 2_000 },
        dedupe_window_ms: rng.random_range(0..5_000),
        max_messages: rng.random_range(5..60),
        max_bytes: rng.random_range(500..20_000),
        dead_letter_on_expiry: rng.random_bool(0.5),
    }
}

impl Run {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let config = random_config(&mut rng);
        let state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
        Self {
            rng,
            config,
            state,
            recorded: Vec::new(),
            tokens: Vec::new(),
            now: 1_000,
            appended: 0,
            durable: 0,
            waited: 0,
        }
    }

    fn durable_end(&self) -> Offset {
        Offset(self.durable as u64)
    }

    fn request(&mut self) -> EnqueueRequest {
        EnqueueRequest {
            message_id: id(self.rng.random_range(0..80)),
            priority: self.rng.random_range(0..self.config.bands() as u8),
            not_before_ms: if self.rng.random_bool(0.2) {
                self.now + self.rng.random_range(0..3_000)
            } else {
                0
            },
            expiry_ms: self
                .rng
                .random_bool(0.25)
                .then(|| self.now + self.rng.random_range(0..6_000)),
            size_bytes: self.rng.random_range(1..200),
        }
    }

    /// Appends and applies one accepted enqueue at the next data offset.
    fn data(&mut self, request: &EnqueueRequest) {
        let meta = EnqueueMeta::new(request, Offset(self.appended as u64), self.now);
        let event = Event::Enqueued(meta);
        self.state.apply(&event).unwrap_or_else(|e| panic!("apply {event:?}: {e}"));
        self.recorded.push(Recorded::Data(event));
        self.appended += 1;
    }

    /// Appends and applies control events decided now.
    ///
    /// The broker's claims decide only on durable records (they take the
    /// durable watermark); ticks and purges do not take it today and can
    /// name a record whose enqueue is not yet durable (an expiry, a
    /// scheduled message becoming ready, a purge). Such an event cannot go
    /// ahead of that record's data in the journal. `wait_for_named` models
    /// the rule the journal layout needs: the decision is recorded as if
    /// made once every record it names is durable (counted in `waited`).
    fn control(&mut self, events: &[Event], wait_for_named: bool) {
        for event in events {
            let named = event.offset().0 as usize;
            if named >= self.durable {
                assert!(wait_for_named, "a claim, ack, extend, release or redrive named {named}, not durable (durable {}): {event:?}", self.durable);
                self.waited += 1;
                self.durable = named + 1;
            }
            self.state.apply(event).unwrap_or_else(|e| panic!("apply {event:?}: {e}"));
            self.recorded.push(Recorded::Control {
                event: *event,
                durable: self.durable,
                appended: self.appended,
            });
        }
    }

    fn token(&mut self) -> Option<DeliveryToken> {
        if self.tokens.is_empty() {
            return None;
        }
        let len = self.tokens.len();
        let index = if self.rng.random_bool(0.7) {
            len - 1 - self.rng.random_range(0..len.min(4))
        } else {
            self.rng.random_range(0..len)
        };
        Some(self.tokens[index])
    }

    fn step(&mut self) {
        match self.rng.random_range(0..100) {
            0..=4 => {
                let size = self.rng.random_range(1..20);
                let batch: Vec<EnqueueRequest> = (0..size).map(|_| self.request()).collect();
                let mut admission = self.state.admission(self.now);
                let decisions: Vec<_> = batch.iter().map(|r| admission.check(r)).collect();
                for (request, decision) in batch.iter().zip(decisions) {
                    if decision == Ok(EnqueueDecision::Accept) {
                        self.data(request);
                    }
                }
            }
            5..=29 => {
                let request = self.request();
                if self.state.enqueue_check(self.now, &request) == Ok(EnqueueDecision::Accept) {
                    self.data(&request);
                }
            }
            30..=44 => {
                // Commits become durable in order: the prefix grows.
                self.durable = self.rng.random_range(self.durable..=self.appended);
            }
            45..=59 => {
                let request = ClaimRequest {
                    worker: WorkerId(self.rng.random_range(1..4)),
                    credits: self.rng.random_range(1..5),
                    max_bytes: u64::MAX,
                    lease_ms: self.rng.random_bool(0.5).then(|| self.rng.random_range(100..=3_000)),
                };
                let decision = if self.rng.random_bool(0.1) {
                    self.state.claim_dead_letters(self.now, &request, self.durable_end())
                } else {
                    self.state.claim(self.now, &request, self.durable_end())
                }
                .unwrap();
                self.tokens.extend(decision.deliveries.iter().map(|d| d.token));
                self.control(&decision.events, false);
            }
            60..=67 => {
                if let Some(token) = self.token() {
                    if let Ok(event) = self.state.ack(self.now, &token) {
                        self.control(&[event], false);
                    }
                }
            }
            68..=74 => {
                if let Some(token) = self.token() {
                    let reason = ReleaseReason(self.rng.random_range(0..5));
                    let not_before = self
                        .rng
                        .random_bool(0.3)
                        .then(|| self.now + self.rng.random_range(0..2_000));
                    if let Ok(event) = self.state.release(self.now, &token, reason, not_before) {
                        self.control(&[event], false);
                    }
                }
            }
            75..=78 => {
                if let Some(token) = self.token() {
                    let lease = self.rng.random_range(50..3_500);
                    if let Ok((event, _)) = self.state.extend(self.now, &token, Some(lease)) {
                        self.control(&[event], false);
                    }
                }
            }
            79..=85 => self.now += self.rng.random_range(0..1_500),
            86..=93 => {
                self.now += self.rng.random_range(0..2_000);
                loop {
                    let events = self.state.tick(self.now);
                    self.control(&events, true);
                    if events.len() < TICK_EVENTS_MAX {
                        break;
                    }
                }
            }
            94..=96 => {
                let events = self
                    .state
                    .redrive(self.now, Redrive::Oldest(self.rng.random_range(0..3)))
                    .unwrap();
                self.control(&events, false);
            }
            _ => {
                let lane = if self.rng.random_bool(0.5) { Lane::Main } else { Lane::DeadLetter };
                let events = self.state.purge(self.now, lane, self.rng.random_range(0..3));
                self.control(&events, true);
            }
        }
    }

    /// A random journal order: see the module docs.
    fn journal_order(&mut self) -> Vec<Event> {
        let data: Vec<Event> = self
            .recorded
            .iter()
            .filter_map(|r| match r {
                Recorded::Data(event) => Some(*event),
                Recorded::Control { .. } => None,
            })
            .collect();
        let mut out = Vec::with_capacity(self.recorded.len());
        let mut placed = 0usize;
        for recorded in &self.recorded {
            let Recorded::Control { event, durable, appended } = *recorded else { continue };
            // Somewhere after the data durable at its decision and before
            // the data appended after it; never before what the control
            // events ahead of it were placed behind.
            let at = self.rng.random_range(durable.max(placed)..=appended.max(placed));
            out.extend_from_slice(&data[placed..at]);
            placed = at;
            out.push(event);
        }
        out.extend_from_slice(&data[placed..]);
        out
    }
}

fn replay(config: &QueueConfig, events: &[Event], what: &str) -> PartitionState {
    let mut state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
    for (index, event) in events.iter().enumerate() {
        state
            .apply(event)
            .unwrap_or_else(|e| panic!("{what}: event {index} {event:?} does not apply: {e}"));
    }
    state.assert_invariants();
    state
}

/// What one seed saw.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Control events decided while data appended before them was not yet
    /// durable (those a journal order may move).
    ahead: u64,
    /// Tick and purge events that named a record not yet durable.
    waited: u64,
    /// Journal orders whose fairness credits differ from the live state's.
    credits_differ: u64,
}

/// Runs one seed with `orders` random journal orders.
fn run_seed(seed: u64, steps: usize, orders: usize) -> Seen {
    let mut run = Run::new(seed);
    for _ in 0..steps {
        run.step();
    }
    let runtime: Vec<Event> = run
        .recorded
        .iter()
        .map(|r| match *r {
            Recorded::Data(event) | Recorded::Control { event, .. } => event,
        })
        .collect();
    let live = run.state.snapshot(Offset(0));
    let in_runtime = replay(&run.config, &runtime, "run-time order");
    assert!(in_runtime.snapshot(Offset(0)) == live, "run-time replay differs from the live state");
    let ahead = run
        .recorded
        .iter()
        .filter(|r| matches!(r, Recorded::Control { durable, appended, .. } if durable < appended))
        .count() as u64;
    let mut credits_differ = 0u64;
    for order in 0..orders {
        let journal = run.journal_order();
        let replayed = replay(&run.config, &journal, "journal order");
        assert_eq!(replayed.messages(), run.state.messages(), "messages, order {order}");
        assert_eq!(
            replayed.counters(run.now),
            run.state.counters(run.now),
            "counters, order {order}"
        );
        // Excluded: the fairness credits (see the module docs).
        let mut replayed = replayed;
        if replayed.credits.raw() != run.state.credits.raw() {
            credits_differ += 1;
            replayed.credits = run.state.credits;
        }
        assert!(
            replayed.snapshot(Offset(0)) == live,
            "journal order {order} replays to other snapshot bytes than the live state"
        );
    }
    Seen { ahead, waited: run.waited, credits_differ }
}

// Goal: the premise of the journal's control lane (§12): replaying control
// events ahead of data appended before them, but never ahead of data durable
// when they were decided, gives the state the partition had. Method: seeded
// workloads, several random journal orders each, compared with the live
// state; the failing seed is printed (rerun: SPOOL_COMMUTE_SEED).
#[test]
fn journal_order_replays_to_the_live_state() {
    let seeds: u64 =
        std::env::var("SPOOL_COMMUTE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000);
    let mut total = Seen::default();
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| run_seed(seed, 300, 4)) {
            Ok(seen) => {
                total.ahead += seen.ahead;
                total.waited += seen.waited;
                total.credits_differ += seen.credits_differ;
            }
            Err(panic) => {
                eprintln!(
                    "commutation failed at seed {seed}; rerun with SPOOL_COMMUTE_SEED={seed}"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    // The reorderings are not vacuous: many control events could jump.
    assert!(
        total.ahead >= seeds * 5,
        "only {total:?} control events decided ahead of appended data"
    );
    eprintln!("over {seeds} seeds: {total:?}");
}

// Goal: rerun one seed of the commutation test with more steps.
#[test]
fn journal_order_seed() {
    let seed =
        std::env::var("SPOOL_COMMUTE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(77_777);
    run_seed(seed, 2_000, 16);
}

/// A state driven by hand for the two findings below: events applied in
/// run-time order and kept, data offsets numbering data records only.
struct Driven {
    config: QueueConfig,
    state: PartitionState,
    events: Vec<Event>,
    appended: u64,
}

impl Driven {
    fn new(config: QueueConfig) -> Self {
        let state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
        Self { config, state, events: Vec::new(), appended: 0 }
    }

    fn apply(&mut self, event: Event) {
        self.state.apply(&event).unwrap();
        self.events.push(event);
    }

    /// Enqueues one message into `band` at `now`; returns its event.
    fn enqueue(&mut self, now: Millis, band: u8, expiry_ms: Option<Millis>) -> Event {
        let request = EnqueueRequest {
            message_id: id(self.appended),
            priority: band,
            not_before_ms: 0,
            expiry_ms,
            size_bytes: 10,
        };
        let event = Event::Enqueued(EnqueueMeta::new(&request, Offset(self.appended), now));
        self.appended += 1;
        self.apply(event);
        event
    }

    fn claim(&mut self, now: Millis, durable_end: u64) -> Vec<Event> {
        let request =
            ClaimRequest { worker: WorkerId(1), credits: 1, max_bytes: u64::MAX, lease_ms: None };
        let events = self.state.claim(now, &request, Offset(durable_end)).unwrap().events;
        for event in &events {
            self.apply(*event);
        }
        events
    }

    /// Replays `events` into a fresh state; the first event that does not
    /// apply is the error.
    fn replay(&self, events: &[Event]) -> Result<PartitionState, ApplyError> {
        let mut state = PartitionState::new(ctx(self.config.clone(), 1)).unwrap();
        for event in events {
            state.apply(event)?;
        }
        Ok(state)
    }
}

// Goal: pin the first finding of the commutation test (§12, "Found by the
// commutation test"): a tick (a message's expiry) and a purge are decided on
// records whose enqueue is not yet durable (neither takes the durable
// watermark, unlike a claim), so in the journal such an event must not be
// written ahead of that record's data entry; placed ahead, it does not apply.
#[test]
fn tick_and_purge_decide_on_records_not_yet_durable() {
    let mut driven = Driven::new(QueueConfig::default());
    let now = 1_000;
    // Offset 0: durable. Offset 1 (expiring) and 2: appended, not yet durable.
    let durable = driven.enqueue(now, 0, None);
    let expiring = driven.enqueue(now, 0, Some(now + 10));
    let pending = driven.enqueue(now, 0, None);
    let durable_end = 1u64;
    let expired = driven.state.tick(now + 20);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].offset(), Offset(1), "the tick expires a record not yet durable");
    assert!(expired[0].offset().0 >= durable_end);
    driven.apply(expired[0]);
    let purged = driven.state.purge(now + 20, Lane::Main, 2);
    assert_eq!(
        purged.iter().map(Event::offset).collect::<Vec<_>>(),
        [Offset(0), Offset(2)],
        "the purge takes a record not yet durable"
    );
    // A journal order that writes the control events ahead of the data that
    // was not durable when they were decided: they name unknown messages.
    let ahead = driven.replay(&[durable, expired[0], expiring, pending]);
    assert_eq!(ahead.err(), Some(ApplyError::UnknownMessage(Offset(1))));
    let ahead = driven.replay(&[durable, expiring, expired[0], purged[0], purged[1], pending]);
    assert_eq!(ahead.err(), Some(ApplyError::UnknownMessage(Offset(2))));
}

// Goal: pin the second finding: `apply(Claimed)` starts a new fairness round
// when no class with a message has credit left, and counts as "with a
// message" a class whose only messages are not yet durable (as the claim
// decision does). A journal order that writes the claim ahead of such an
// enqueue replays to other credits. Here band 1 has credit left only in the
// live state, where its undurable message makes it non-empty; an age-promoted
// band-0 message (credit 0) is claimed.
#[test]
fn claimed_credits_depend_on_records_not_yet_durable() {
    let config = QueueConfig {
        band_weights: vec![2, 2, 1, 1],
        retry_weight: 1,
        age_promotion_ms: 100,
        ..QueueConfig::default()
    };
    let mut driven = Driven::new(config);
    let now = 1_000;
    let data = vec![
        driven.enqueue(now, 1, None),
        driven.enqueue(now, 0, None),
        driven.enqueue(now, 0, None),
    ];
    let mut control = Vec::new();
    // Band 0 twice (credit 2 → 0), then band 1 (2 → 1).
    for _ in 0..3 {
        control.extend(driven.claim(now, 3));
    }
    assert_eq!(driven.state.credits.raw(), [0, 1, 1, 1, 1]);
    let durable = driven.enqueue(now, 0, None); // offset 3, made durable
    let pending = driven.enqueue(now, 1, None); // offset 4, not yet durable
    let promoted = driven.claim(now + 1_000, 4);
    assert_eq!(promoted.len(), 1);
    assert_eq!(promoted[0].offset(), Offset(3), "the age-promoted band-0 message");
    // Live (and run-time replay): band 1 is non-empty with credit: no new round.
    assert_eq!(driven.state.credits.raw(), [0, 1, 1, 1, 1]);
    let runtime = driven.replay(&driven.events).unwrap();
    assert_eq!(runtime.credits.raw(), driven.state.credits.raw());
    // Journal order: the claim ahead of the undurable enqueue starts a round.
    let mut journal = data;
    journal.extend(&control);
    journal.push(durable);
    journal.push(promoted[0]);
    journal.push(pending);
    let replayed = driven.replay(&journal).unwrap();
    assert_eq!(replayed.credits.raw(), [1, 2, 1, 1, 1]);
    assert_eq!(replayed.messages(), driven.state.messages(), "only the credits differ");
}
