//! Subscriptions against their definition: a state with several
//! subscriptions must, for each of them, decide and show exactly what a
//! partition with that subscription alone would, fed the same records
//! (the shared never-claimed index is invisible), while every record is
//! held once; and a replay of its log (every event through its bytes)
//! rebuilds the same state (`docs/design/subscriptions.md`).

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::*;
use super::harness::{ctx, id, ALL_DURABLE};

fn config(rng: &mut ChaCha8Rng) -> QueueConfig {
    let bands = rng.random_range(4..=6);
    QueueConfig {
        band_weights: (0..bands).map(|_| rng.random_range(1..=4)).collect(),
        retry_weight: rng.random_range(1..=3),
        age_promotion_ms: if rng.random_bool(0.5) { rng.random_range(500..4_000) } else { 1 << 40 },
        lease_default_ms: 1_000,
        lease_min_ms: 100,
        lease_max_ms: 3_000,
        max_lease_lifetime_ms: 6_000,
        max_deliveries: rng.random_range(1..=4),
        backoff: Backoff::Linear { step_ms: rng.random_range(1..800), max_ms: 2_000 },
        dedupe_window_ms: 1_000,
        max_messages: 1 << 20,
        max_bytes: 1 << 30,
        dead_letter_on_expiry: rng.random_bool(0.5),
        retention_ms: 0,
        retention_bytes: 0,
        ordered: false,
    }
}

/// `event` as subscription `to`'s.
fn retag(mut event: Event, to: SubscriptionId) -> Event {
    match &mut event {
        Event::Claimed { sub, .. }
        | Event::Extended { sub, .. }
        | Event::Acked { sub, .. }
        | Event::Released { sub, .. }
        | Event::LeaseExpired { sub, .. }
        | Event::Readied { sub, .. }
        | Event::Quarantined { sub, .. }
        | Event::Expired { sub, .. }
        | Event::Redriven { sub, .. }
        | Event::Purged { sub, .. } => *sub = to,
        _ => {}
    }
    event
}

/// One subscription of the state under test and the lone partition it
/// must behave as.
struct Twin {
    sub: SubscriptionId,
    alone: PartitionState,
    /// Outstanding deliveries the test may ack or release: the state's
    /// (its token names the subscription) and the lone twin's.
    held: Vec<(Delivery, Delivery)>,
}

struct Run {
    config: QueueConfig,
    state: PartitionState,
    twins: Vec<Twin>,
    /// Every event applied to `state`, in order (the log to replay).
    log: Vec<Event>,
    /// After each event of `log`: one past every offset enqueued so far
    /// (what a snapshot cut there covers).
    covers_after: Vec<u64>,
    next_offset: u64,
    next_sub: u16,
    now: Millis,
    /// A checkpoint being written in steps: encoder, bytes so far, the
    /// one-shot snapshot of when it began, its cut in `log`.
    stepped: Option<(SnapshotEncoder, Vec<u8>, Vec<u8>, usize)>,
    /// Records enqueued ready (no delay) without an expiry: with a window
    /// each stays in the shared index from its enqueue until a
    /// `WindowPassed` bound passes it, whatever the subscriptions did.
    kept: Vec<Offset>,
    /// The highest `WindowPassed` bound applied.
    window_through: Offset,
}

impl Run {
    fn new(config: QueueConfig) -> Self {
        let state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
        let alone = PartitionState::new(ctx(config.clone(), 1)).unwrap();
        let twins = vec![Twin { sub: SubscriptionId::DEFAULT, alone, held: Vec::new() }];
        Self {
            config,
            state,
            twins,
            log: Vec::new(),
            covers_after: Vec::new(),
            next_offset: 0,
            next_sub: 1,
            now: 1_000,
            stepped: None,
            kept: Vec::new(),
            window_through: Offset(0),
        }
    }

    fn apply(&mut self, event: Event) {
        self.state.apply(&event).unwrap();
        self.log.push(event);
        self.covers_after.push(self.next_offset);
    }

    /// What a snapshot after the first `cut` events of the log covers.
    fn covers(&self, cut: usize) -> Offset {
        Offset(cut.checked_sub(1).map_or(0, |last| self.covers_after[last]))
    }

    fn twin(&mut self, sub: SubscriptionId) -> &mut Twin {
        self.twins.iter_mut().find(|twin| twin.sub == sub).unwrap()
    }

    /// The events of `sub` in a multi-subscription answer, as the lone
    /// partition's.
    fn of(events: &[Event], sub: SubscriptionId) -> Vec<Event> {
        events
            .iter()
            .filter(|event| event.subscription() == Some(sub))
            .map(|event| retag(*event, SubscriptionId::DEFAULT))
            .collect()
    }

    fn enqueue(&mut self, rng: &mut ChaCha8Rng) {
        let offset = Offset(self.next_offset);
        self.next_offset += rng.random_range(1..=2);
        let request = EnqueueRequest {
            message_id: id(offset.0),
            priority: rng.random_range(0..4),
            not_before_ms: if rng.random_bool(0.15) {
                self.now + rng.random_range(1..2_000)
            } else {
                0
            },
            expiry_ms: rng.random_bool(0.2).then(|| self.now + rng.random_range(0..4_000)),
            size_bytes: rng.random_range(1..500),
        };
        let event = Event::Enqueued(EnqueueMeta::new(&request, offset, self.now));
        if request.not_before_ms <= self.now && request.expiry_ms.is_none() {
            self.kept.push(offset);
        }
        self.apply(event);
        for twin in &mut self.twins {
            twin.alone.apply(&event).unwrap();
        }
    }

    fn claim(&mut self, rng: &mut ChaCha8Rng, index: usize, dead: bool) {
        let sub = self.twins[index].sub;
        let request = ClaimRequest {
            sub: SubscriptionId::DEFAULT,
            worker: WorkerId(rng.random_range(1..4)),
            credits: rng.random_range(1..6),
            max_bytes: u64::MAX,
            lease_ms: None,
        };
        let (mut got, mut want) = (ClaimDecision::default(), ClaimDecision::default());
        let now = self.now;
        if dead {
            self.state
                .claim_dead_letters_into(
                    now,
                    &ClaimRequest { sub, ..request },
                    ALL_DURABLE,
                    &mut got,
                )
                .unwrap();
            let alone = &self.twins[index].alone;
            alone.claim_dead_letters_into(now, &request, ALL_DURABLE, &mut want).unwrap();
        } else {
            let named = ClaimRequest { sub, ..request };
            self.state.claim_into(now, &named, ALL_DURABLE, &mut got).unwrap();
            let alone = &self.twins[index].alone;
            alone.claim_into(now, &request, ALL_DURABLE, &mut want).unwrap();
        }
        assert_eq!(Self::of(&got.events, sub), want.events, "claim of {sub}");
        // The same deliveries, but for the subscription the token names.
        let unnamed = |delivery: &Delivery| {
            let claim = TokenClaim { sub: SubscriptionId::DEFAULT, ..*delivery.token.claim() };
            (claim, Delivery { token: want.deliveries[0].token, ..*delivery })
        };
        assert_eq!(
            got.deliveries.iter().map(unnamed).collect::<Vec<_>>(),
            want.deliveries.iter().map(unnamed).collect::<Vec<_>>(),
            "claim of {sub}"
        );
        assert!(got.deliveries.iter().all(|delivery| delivery.token.claim().sub == sub));
        assert_eq!(got.exhausted, want.exhausted);
        for event in &got.events {
            assert_eq!(event.subscription(), Some(sub));
            self.apply(*event);
        }
        let twin = self.twin(sub);
        for event in &want.events {
            twin.alone.apply(event).unwrap();
        }
        twin.held.extend(got.deliveries.into_iter().zip(want.deliveries));
    }

    fn settle(&mut self, rng: &mut ChaCha8Rng, index: usize) {
        let sub = self.twins[index].sub;
        if self.twins[index].held.is_empty() {
            return;
        }
        let at = rng.random_range(0..self.twins[index].held.len());
        let (delivery, alone) = self.twins[index].held.swap_remove(at);
        let now = self.now;
        let (got, want) = match rng.random_range(0..3) {
            0 => (
                self.state.ack(now, &delivery.token),
                self.twins[index].alone.ack(now, &alone.token),
            ),
            1 => {
                let not_before = rng.random_bool(0.5).then(|| now + rng.random_range(0..1_000));
                let reason = ReleaseReason(7);
                (
                    self.state.release(now, &delivery.token, reason, not_before),
                    self.twins[index].alone.release(now, &alone.token, reason, not_before),
                )
            }
            _ => {
                let got = self.state.extend(now, &delivery.token, Some(500));
                let want = self.twins[index].alone.extend(now, &alone.token, Some(500));
                assert_eq!(got.map(|(e, d)| (retag(e, SubscriptionId::DEFAULT), d)), want);
                if want.is_ok() {
                    self.twins[index].held.push((delivery, alone));
                }
                (got.map(|(e, _)| e), want.map(|(e, _)| e))
            }
        };
        assert_eq!(got.map(|e| retag(e, SubscriptionId::DEFAULT)), want, "settle of {sub}");
        if let (Ok(got), Ok(want)) = (got, want) {
            self.apply(got);
            self.twins[index].alone.apply(&want).unwrap();
        }
    }

    fn tick(&mut self) {
        let got = self.state.tick(self.now, ALL_DURABLE);
        assert!(got.len() < limits::TICK_EVENTS_MAX, "the test keeps ticks unbounded");
        for event in &got {
            if let Event::WindowPassed { through, at_ms } = *event {
                self.window_passed(through, at_ms);
            } else {
                self.apply(*event);
            }
        }
        if self.config.retention_ms > 0 {
            // The window passed: no shared record older than it is left.
            let cutoff = self.now.saturating_sub(self.config.retention_ms);
            assert!(self.state.oldest_retained_ms().is_none_or(|at| at >= cutoff));
        }
        for index in 0..self.twins.len() {
            let sub = self.twins[index].sub;
            let want = self.twins[index].alone.tick(self.now, ALL_DURABLE);
            let delivery: Vec<Event> =
                want.iter().filter(|event| event.subscription().is_some()).copied().collect();
            assert_eq!(Self::of(&got, sub), delivery, "tick of {sub}");
            for event in &want {
                self.twins[index].alone.apply(event).unwrap();
            }
        }
    }

    /// Applies a `WindowPassed`: what leaves each subscription's view is
    /// exactly what it had never been given (ready, no attempt, no
    /// generation), enqueued before the window; it is counted in `lost`
    /// and reported with its offsets.
    fn window_passed(&mut self, through: Offset, at_ms: Millis) {
        let cutoff = at_ms.saturating_sub(self.config.retention_ms);
        let subs: Vec<SubscriptionId> = self.state.subscriptions().collect();
        let before: Vec<(Vec<MessageView>, u64)> = subs
            .iter()
            .map(|&sub| {
                let lost = self.state.counters_of(sub, at_ms).unwrap().totals.lost;
                (self.state.messages_of(sub).unwrap(), lost)
            })
            .collect();
        self.apply(Event::WindowPassed { through, at_ms });
        self.window_through = self.window_through.max(through);
        for (&sub, (before, lost_before)) in subs.iter().zip(before) {
            let after: BTreeSet<Offset> =
                self.state.messages_of(sub).unwrap().iter().map(|v| v.offset).collect();
            let gone: Vec<&MessageView> =
                before.iter().filter(|v| !after.contains(&v.offset)).collect();
            for view in &gone {
                assert!(view.lane == Lane::Main && view.generation.0 == 0 && view.attempts == 0);
                assert!(matches!(view.phase, MessagePhase::Ready { .. }));
                // Enqueued before the window, or below the bound (expired
                // retained records are nobody's to lose).
                assert!(view.enqueue_time_ms < cutoff && view.offset < through);
            }
            let lost = self.state.counters_of(sub, at_ms).unwrap().totals.lost;
            assert_eq!(lost - lost_before, gone.len() as u64, "lost of {sub}");
            if let Some(first) = gone.first() {
                let report = *self.state.losses_of(sub).unwrap().last().unwrap();
                let last = gone.last().unwrap();
                let want =
                    Loss { from: first.offset, to: last.offset, count: gone.len() as u64, at_ms };
                assert_eq!(report, want, "loss report of {sub}");
            }
        }
    }

    fn operate(&mut self, rng: &mut ChaCha8Rng, index: usize) {
        let sub = self.twins[index].sub;
        let now = self.now;
        let (got, want) = if rng.random_bool(0.5) {
            let lane = if rng.random_bool(0.5) { Lane::Main } else { Lane::DeadLetter };
            let max = rng.random_range(1..4);
            (
                self.state.purge_sub(sub, now, lane, max, ALL_DURABLE).unwrap(),
                self.twins[index].alone.purge(now, lane, max, ALL_DURABLE),
            )
        } else {
            let which = Redrive::Oldest(rng.random_range(1..3));
            (
                self.state.redrive_sub(sub, now, which).unwrap(),
                self.twins[index].alone.redrive(now, which).unwrap(),
            )
        };
        assert_eq!(Self::of(&got, sub), want, "operator on {sub}");
        for event in &got {
            self.apply(*event);
        }
        for event in &want {
            self.twins[index].alone.apply(event).unwrap();
        }
    }

    /// Starts a subscription at the next offset: its twin is an empty lone
    /// partition that sees the records from then on.
    fn start(&mut self) {
        let sub = SubscriptionId(self.next_sub);
        self.next_sub += 1;
        let from = Offset(self.next_offset);
        self.apply(Event::SubscriptionStarted { sub, from, at_ms: self.now });
        let alone = PartitionState::new(ctx(self.config.clone(), 1)).unwrap();
        self.twins.push(Twin { sub, alone, held: Vec::new() });
    }

    fn end(&mut self, index: usize) {
        let sub = self.twins.remove(index).sub;
        self.apply(Event::SubscriptionEnded { sub, at_ms: self.now });
        assert_eq!(
            self.state.claim_into(
                self.now,
                &ClaimRequest {
                    sub,
                    worker: WorkerId(1),
                    credits: 1,
                    max_bytes: 1,
                    lease_ms: None
                },
                ALL_DURABLE,
                &mut ClaimDecision::default(),
            ),
            Err(QueueError::UnknownSubscription(sub))
        );
    }

    /// Each subscription shows what its lone twin shows; every record is
    /// held once.
    fn check(&self) {
        self.state.assert_invariants();
        let mut union = BTreeMap::new();
        for twin in &self.twins {
            let mut got = self.state.counters_of(twin.sub, self.now).unwrap();
            let mut want = twin.alone.counters(self.now);
            (got.held_messages, got.held_bytes) = (0, 0);
            (want.held_messages, want.held_bytes) = (0, 0);
            // The shared index is the partition's, not a subscription's.
            (got.retained_messages, got.retained_bytes, got.oldest_retained_age_ms) = (0, 0, None);
            (want.retained_messages, want.retained_bytes, want.oldest_retained_age_ms) =
                (0, 0, None);
            assert_eq!(got, want, "counters of {}", twin.sub);
            let messages = twin.alone.messages();
            assert_eq!(self.state.messages_of(twin.sub).unwrap(), messages, "of {}", twin.sub);
            union.extend(messages.iter().map(|view| (view.offset, view.size_bytes)));
        }
        // With a window the shared index also holds records every
        // subscription finished, kept for replay (they hold disk).
        let index = self.state.fresh.iter().flat_map(|band| band.iter());
        let retained: Vec<_> = index.map(|view| (view.offset, view.size_bytes)).collect();
        if self.config.retention_ms == 0 {
            assert!(retained.iter().all(|(offset, _)| union.contains_key(offset)));
        } else {
            let index: BTreeSet<Offset> = retained.iter().map(|&(offset, _)| offset).collect();
            for offset in self.kept.iter().filter(|&&offset| offset >= self.window_through) {
                assert!(index.contains(offset), "{offset:?} left the index inside the window");
            }
        }
        union.extend(retained);
        assert_eq!(self.state.held_messages(), union.len() as u64);
        assert_eq!(self.state.held_bytes(), union.values().map(|&b| u64::from(b)).sum::<u64>());
        let watermark = union.keys().next().copied();
        assert_eq!(self.state.retention_watermark(), watermark);
    }

    /// A replay of the log, every event through its control-record bytes,
    /// rebuilds the same subscriptions.
    fn replay(&self) {
        let mut replayed = PartitionState::new(ctx(self.config.clone(), 1)).unwrap();
        for event in &self.log {
            let event = match event {
                Event::Enqueued(_) => *event,
                _ => {
                    let mut bytes = Vec::new();
                    event.encode(&mut bytes).unwrap();
                    let named = event.subscription().is_some_and(|s| s != SubscriptionId::DEFAULT);
                    assert_eq!(bytes[0] & 0x80 != 0, named);
                    Event::decode(&bytes).unwrap()
                }
            };
            replayed.apply(&event).unwrap();
        }
        replayed.assert_invariants();
        let subs: Vec<_> = self.state.subscriptions().collect();
        assert_eq!(replayed.subscriptions().collect::<Vec<_>>(), subs);
        for sub in subs {
            assert_eq!(replayed.messages_of(sub), self.state.messages_of(sub));
            assert_eq!(replayed.counters_of(sub, self.now), self.state.counters_of(sub, self.now));
        }
        assert_eq!(replayed.held_messages(), self.state.held_messages());
        assert_eq!(replayed.snapshot(Offset(0)), self.state.snapshot(Offset(0)));
    }

    /// A snapshot of the state at a random cut of the log, restored, plus
    /// the tail replayed, is the live state (bytes, and every
    /// subscription's view and counters, derived counts included).
    fn restore_at(&self, rng: &mut ChaCha8Rng) {
        let cut = rng.random_range(0..=self.log.len());
        let mut prefix = PartitionState::new(ctx(self.config.clone(), 1)).unwrap();
        for event in &self.log[..cut] {
            prefix.apply(event).unwrap();
        }
        let bytes = prefix.snapshot(self.covers(cut));
        self.resume(&bytes, cut);
    }

    fn resume(&self, bytes: &[u8], cut: usize) {
        let mut resumed =
            PartitionState::restore(bytes, ctx(self.config.clone(), 1)).unwrap().state;
        resumed.assert_invariants();
        for event in &self.log[cut..] {
            resumed.apply(event).unwrap();
        }
        resumed.assert_invariants();
        assert_eq!(resumed.snapshot(Offset(0)), self.state.snapshot(Offset(0)), "restore at {cut}");
        for sub in self.state.subscriptions() {
            assert_eq!(resumed.counters_of(sub, self.now), self.state.counters_of(sub, self.now));
        }
        assert_eq!(resumed.held_bytes(), self.state.held_bytes());
    }

    /// Starts a stepped checkpoint at random or advances the running one;
    /// a finished one equals the one-shot snapshot of when it began, and
    /// restores to the live state with the tail replayed.
    fn checkpoint_step(&mut self, rng: &mut ChaCha8Rng) {
        let Some((encoder, bytes, _, _)) = self.stepped.as_mut() else {
            if rng.random_bool(0.1) {
                let cut = self.log.len();
                let reference = self.state.snapshot(self.covers(cut));
                let encoder = self.state.begin_snapshot(self.covers(cut));
                self.stepped = Some((encoder, Vec::new(), reference, cut));
            }
            return;
        };
        let done = self.state.snapshot_step(encoder, rng.random_range(1..=4), bytes).unwrap();
        if !done {
            return;
        }
        let Some((_, bytes, reference, cut)) = self.stepped.take() else { return };
        self.state.end_snapshot();
        assert!(bytes == reference, "stepped checkpoint from event {cut} differs");
        self.resume(&bytes, cut);
    }
}

fn run(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut config = config(&mut rng);
    // Half the runs keep records for a retention window by time: each
    // subscription still behaves as alone (its twin has the same window
    // and loses the same records).
    if rng.random_bool(0.5) {
        config.retention_ms = rng.random_range(1_000..5_000);
    }
    let mut run = Run::new(config);
    // One or two more subscriptions from the start, sometimes one later.
    for _ in 0..rng.random_range(1..=2) {
        run.start();
    }
    for step in 0..400 {
        run.now += rng.random_range(0..150);
        let index = rng.random_range(0..run.twins.len());
        match rng.random_range(0..100) {
            0..35 => run.enqueue(&mut rng),
            35..55 => run.claim(&mut rng, index, false),
            55..58 => run.claim(&mut rng, index, true),
            58..80 => run.settle(&mut rng, index),
            80..92 => run.tick(),
            92..97 => run.operate(&mut rng, index),
            97 if run.twins.len() < 4 => run.start(),
            98 if index > 0 => run.end(index),
            _ => {}
        }
        run.check();
        run.checkpoint_step(&mut rng);
        if step % 100 == 99 {
            run.replay();
            run.restore_at(&mut rng);
        }
    }
    run.replay();
    run.restore_at(&mut rng);
}

#[test]
fn each_subscription_behaves_as_if_alone_and_replays() {
    for seed in 0..60 {
        run(seed);
    }
}

/// A subscription started at the earliest offset takes what the partition
/// still has to deliver (the shared index), not what others already
/// claimed or finished; one started at the next offset takes only later
/// records; a record leaves only with its last subscription.
#[test]
fn a_start_takes_the_shared_backlog_and_a_record_leaves_with_its_last_holder() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut config = config(&mut rng);
    config.band_weights = vec![1; 4];
    let mut state = PartitionState::new(ctx(config, 1)).unwrap();
    for offset in 0..6 {
        let request = EnqueueRequest {
            message_id: id(offset),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: None,
            size_bytes: 10,
        };
        state.apply(&Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), 100))).unwrap();
    }
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: 2,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let claimed = state.claim(200, &request, ALL_DURABLE).unwrap();
    for event in &claimed.events {
        state.apply(event).unwrap();
    }
    let early = SubscriptionId(1);
    let late = SubscriptionId(2);
    state.apply(&Event::SubscriptionStarted { sub: early, from: Offset(0), at_ms: 300 }).unwrap();
    state.apply(&Event::SubscriptionStarted { sub: late, from: Offset(6), at_ms: 300 }).unwrap();
    state.assert_invariants();
    let offsets = |state: &PartitionState, sub| -> BTreeSet<u64> {
        state.messages_of(sub).unwrap().iter().map(|v| v.offset.0).collect()
    };
    assert_eq!(offsets(&state, early), (2..6).collect());
    assert!(offsets(&state, late).is_empty());
    assert_eq!(state.held_messages(), 6);
    // The default acks what it claimed: those two leave the partition.
    for delivery in &claimed.deliveries {
        let event = state.ack(300, &delivery.token).unwrap();
        state.apply(&event).unwrap();
    }
    assert_eq!(state.held_messages(), 4);
    assert_eq!(state.retention_watermark(), Some(Offset(2)));
    // `early` claims and acks everything it has: still held by the default.
    let mut decision = ClaimDecision::default();
    let all = ClaimRequest { credits: 10, ..request };
    state.claim_into(400, &ClaimRequest { sub: early, ..all }, ALL_DURABLE, &mut decision).unwrap();
    assert_eq!(decision.deliveries.len(), 4);
    for event in &decision.events {
        state.apply(event).unwrap();
    }
    for delivery in &decision.deliveries {
        let event = state.ack(400, &delivery.token).unwrap();
        state.apply(&event).unwrap();
    }
    state.assert_invariants();
    assert_eq!(state.held_messages(), 4, "the default still has them");
    // Ending the default is refused; ending `early` changes nothing held.
    let refused = Event::SubscriptionEnded { sub: SubscriptionId::DEFAULT, at_ms: 500 };
    assert!(state.apply(&refused).is_err());
    state.apply(&Event::SubscriptionEnded { sub: early, at_ms: 500 }).unwrap();
    assert_eq!(state.held_messages(), 4);
    // A later record goes to the default and `late` alone.
    let request = EnqueueRequest {
        message_id: id(9),
        priority: 0,
        not_before_ms: 0,
        expiry_ms: None,
        size_bytes: 10,
    };
    state.apply(&Event::Enqueued(EnqueueMeta::new(&request, Offset(9), 600))).unwrap();
    assert_eq!(offsets(&state, late), BTreeSet::from([9]));
    assert_eq!(state.held_messages(), 5);
    // A token names its subscription (under the MAC): its ack acts there,
    // and once the subscription ends, a token of it names no claim.
    let mut decision = ClaimDecision::default();
    let one = ClaimRequest { sub: late, ..request_one() };
    state.claim_into(700, &one, ALL_DURABLE, &mut decision).unwrap();
    for event in &decision.events {
        state.apply(event).unwrap();
    }
    let token = decision.deliveries[0].token;
    assert_eq!(token.claim().sub, late);
    let mut forged = token.to_bytes();
    forged[2] = 0;
    let forged = DeliveryToken::from_bytes(&forged).unwrap();
    assert_eq!(state.ack(700, &forged), Err(QueueError::InvalidToken(InvalidToken::BadMac)));
    let extended = state.extend(700, &token, Some(500)).unwrap().0;
    assert_eq!(extended.subscription(), Some(late));
    state.apply(&Event::SubscriptionEnded { sub: late, at_ms: 800 }).unwrap();
    assert_eq!(state.ack(800, &token), Err(QueueError::StaleToken(StaleToken::SubscriptionEnded)));
    state.assert_invariants();
}

fn request_one() -> ClaimRequest {
    ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: 1,
        max_bytes: u64::MAX,
        lease_ms: None,
    }
}

/// A delivery event of a subscription other than the default carries it
/// in an 8-byte tail behind a flagged kind; the default's bytes are the
/// old ones; every other spelling is refused.
#[test]
fn subscription_events_have_one_encoding() {
    let sub = SubscriptionId(5);
    let acked = Event::Acked {
        sub,
        lane: Lane::Main,
        offset: Offset(9),
        generation: Generation(2),
        at_ms: 4,
    };
    let claimed = Event::Claimed {
        sub,
        lane: Lane::DeadLetter,
        offset: Offset(9),
        generation: Generation(3),
        worker: WorkerId(8),
        claimed_at_ms: 4,
        deadline_ms: 9,
    };
    for (event, len) in [(acked, EVENT_BYTES + 8), (claimed, CLAIMED_EVENT_BYTES + 8)] {
        let mut bytes = Vec::new();
        assert_eq!(event.encode(&mut bytes).unwrap(), len);
        assert_eq!(bytes[0] & 0x80, 0x80);
        assert_eq!(Event::decode(&bytes).unwrap(), event);
        let default = retag(event, SubscriptionId::DEFAULT);
        let mut plain = Vec::new();
        assert_eq!(
            default.encode(&mut plain).unwrap(),
            len - 8,
            "the default's bytes are the old ones"
        );
        assert_eq!(
            plain[..],
            bytes[..len - 8]
                .iter()
                .enumerate()
                .map(|(i, &b)| if i == 0 { b & 0x7f } else { b })
                .collect::<Vec<_>>()[..]
        );
        // The default spelled with a tail, a dirty tail, a missing tail.
        let mut zero = bytes.clone();
        zero[len - 8] = 0;
        assert_eq!(Event::decode(&zero), Err(CodecError::BadField("subscription")));
        let mut dirty = bytes.clone();
        dirty[len - 1] = 1;
        assert_eq!(Event::decode(&dirty), Err(CodecError::BadField("subscription")));
        assert!(matches!(Event::decode(&bytes[..len - 8]), Err(CodecError::Length { .. })));
    }
    // Only delivery events take the flag.
    let term = Event::TermStarted { term: 3 };
    let mut bytes = Vec::new();
    term.encode(&mut bytes).unwrap();
    bytes[0] |= 0x80;
    bytes.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]);
    assert!(matches!(Event::decode(&bytes), Err(CodecError::UnknownKind(_))));
    for event in [
        Event::SubscriptionStarted { sub, from: Offset(77), at_ms: 3 },
        Event::SubscriptionEnded { sub, at_ms: 3 },
    ] {
        let mut bytes = Vec::new();
        assert_eq!(event.encode(&mut bytes).unwrap(), EVENT_BYTES);
        assert_eq!(Event::decode(&bytes).unwrap(), event);
        bytes[2] = 0;
        assert_eq!(Event::decode(&bytes), Err(CodecError::BadField("subscription")));
    }
}

/// A checkpoint holds every subscription (version 5, trailing section);
/// one whose subscriptions section names the default again is refused.
#[test]
fn a_checkpoint_holds_the_subscriptions_and_refuses_a_bad_section() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let config = config(&mut rng);
    let bands = config.bands();
    let mut state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
    let sub = SubscriptionId(4);
    state.apply(&Event::SubscriptionStarted { sub, from: Offset(0), at_ms: 0 }).unwrap();
    for offset in 0..3 {
        let request = EnqueueRequest {
            message_id: id(offset),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: None,
            size_bytes: 10,
        };
        state.apply(&Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), 10))).unwrap();
    }
    let bytes = state.snapshot(Offset(3));
    let restored = PartitionState::restore(&bytes, ctx(config.clone(), 2)).unwrap().state;
    assert_eq!(restored.subscriptions().collect::<Vec<_>>(), [SubscriptionId::DEFAULT, sub]);
    assert_eq!(restored.messages_of(sub), state.messages_of(sub));
    assert_eq!(restored.held_messages(), 3);
    // The section: the default's marks, the count, then subscription 4:
    // id, marks, totals, credits, empty warm and dead lists.
    let other = 2 + bands * 16 + 11 * 8 + (bands + 1) * 4 + 8 + 8;
    let section = bands * 16 + 8 + other;
    // Version 6's losses follow: a total and an empty list for each, then
    // version 7's lanes: a zero count for each.
    let losses = 2 * 16 + 2 * 8;
    let id_at = bytes.len() - 4 - losses - other;
    assert_eq!(bytes[id_at..id_at + 2], 4u16.to_le_bytes());
    assert_eq!(bytes[bytes.len() - 4 - losses - section - 8..].len(), section + losses + 12);
    let mut bad = bytes[..bytes.len() - 4].to_vec();
    bad[id_at..id_at + 2].copy_from_slice(&0u16.to_le_bytes());
    let crc = crc32c::crc32c(&bad);
    bad.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(
        PartitionState::restore(&bad, ctx(config, 2)).map(|_| ()),
        Err(CodecError::Inconsistent("subscription id"))
    );
}

// Goal: a start by time gives the new subscription exactly the records of
// the shared index enqueued at or after that time, in every band, whatever
// some of them are claimed or purged elsewhere, and none older; a time
// past the newest record finds nothing (the partition then starts at its
// next offset). Method: 300 records over 4 bands at increasing times (some
// enqueue times clamped up), the default claims 40 from the front; for
// several times, `first_offset_at` must equal a scan of the index, and a
// subscription started there holds exactly the index's records from then.
#[test]
fn a_start_by_time_takes_exactly_the_records_from_then() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut config = config(&mut rng);
    config.band_weights = vec![1; 4];
    let mut state = PartitionState::new(ctx(config, 1)).unwrap();
    let mut time = 1_000u64;
    for offset in 0..300u64 {
        // Mostly rising; now and then an earlier time, clamped up by apply.
        time = if rng.random_bool(0.1) { time - 5 } else { time + rng.random_range(0..20) };
        let request = EnqueueRequest {
            message_id: id(offset),
            priority: rng.random_range(0..4),
            not_before_ms: 0,
            expiry_ms: None,
            size_bytes: 10,
        };
        state.apply(&Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), time))).unwrap();
    }
    let forty = ClaimRequest { credits: 40, ..request_one() };
    let claimed = state.claim(time, &forty, ALL_DURABLE).unwrap();
    for event in &claimed.events {
        state.apply(event).unwrap();
    }
    // The index as a list of (offset, enqueue time), every band.
    let index: Vec<(u64, u64)> = state
        .fresh
        .iter()
        .flat_map(|band| band.iter())
        .map(|view| (view.offset.0, view.enqueue_time_ms))
        .collect();
    let times: Vec<u64> = index.iter().map(|(_, at)| *at).collect();
    let (oldest, newest) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    let mut sub = 1u16;
    for at in [0, oldest, oldest + 1, (oldest + newest) / 2, newest, newest + 1] {
        let expected: BTreeSet<u64> = index
            .iter()
            .filter(|(_, enqueued)| *enqueued >= at)
            .map(|(offset, _)| *offset)
            .collect();
        let first = state.first_offset_at(at);
        assert_eq!(first.map(|offset| offset.0), expected.iter().next().copied(), "at {at}");
        let Some(from) = first else { continue };
        let started = SubscriptionId(sub);
        sub += 1;
        state.apply(&Event::SubscriptionStarted { sub: started, from, at_ms: time }).unwrap();
        let held: BTreeSet<u64> =
            state.messages_of(started).unwrap().iter().map(|view| view.offset.0).collect();
        assert_eq!(held, expected, "a subscription started at {at}");
        state.apply(&Event::SubscriptionEnded { sub: started, at_ms: time }).unwrap();
        state.assert_invariants();
    }
    assert_eq!(state.first_offset_at(newest + 1), None);
}
