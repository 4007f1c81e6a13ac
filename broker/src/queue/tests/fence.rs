//! Claims that reply before their sync: the durable bound of the claim
//! decision and the epoch fence at open, alone and under seeded crash/replay
//! runs where claims (and extends, releases, ticks) may be lost in a crash but
//! acks never (an ack replies only once durable).

use crate::queue::types::SubscriptionId;
use std::collections::BTreeSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::*;
use super::harness::{ctx, request, Harness, ALL_DURABLE};

fn config() -> QueueConfig {
    QueueConfig {
        lease_default_ms: 30_000,
        lease_min_ms: 1_000,
        lease_max_ms: 60_000,
        max_lease_lifetime_ms: 120_000,
        backoff: Backoff::Linear { step_ms: 5_000, max_ms: 20_000 },
        age_promotion_ms: 1_000_000,
        ..QueueConfig::default()
    }
}

fn claim_request(credits: u32) -> ClaimRequest {
    ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits,
        max_bytes: u64::MAX,
        lease_ms: None,
    }
}

/// Applies the fence the way open does (in chunks of `limit`), returning
/// every event it produced.
fn fence_all(h: &mut Harness, now: Millis, limit: usize) -> Vec<Event> {
    let mut all = Vec::new();
    loop {
        let events = h.state.fence(now, limit);
        if events.is_empty() {
            return all;
        }
        h.apply_all(&events);
        all.extend(events);
    }
}

// Goal: a claim never hands out a message at or past the durable watermark
// it is given, in either lane. Method: enqueue offsets 0..3; claim with the
// bound at 0, 1 and 3 and check exactly the durable prefix is delivered;
// then a message quarantined (expiry, dead_letter_on_expiry) before its
// enqueue is durable is not claimable from the dead-letter lane either.
#[test]
fn claim_delivers_only_below_the_durable_watermark() {
    let mut h = Harness::new(config());
    for n in 0..3 {
        h.enqueue_ok(0, request(n, 0));
    }
    let none = h.state.claim(1, &claim_request(10), Offset(0)).unwrap();
    assert!(none.deliveries.is_empty() && none.events.is_empty(), "nothing is durable yet");
    let first = h.state.claim(1, &claim_request(10), Offset(1)).unwrap();
    let offsets: Vec<Offset> = first.deliveries.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, vec![Offset(0)], "only the durable record");
    h.apply_all(&first.events);
    let rest = h.state.claim(1, &claim_request(10), Offset(3)).unwrap();
    let offsets: Vec<Offset> = rest.deliveries.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, vec![Offset(1), Offset(2)]);

    let mut h = Harness::new(QueueConfig { dead_letter_on_expiry: true, ..config() });
    let mut expiring = request(9, 0);
    expiring.expiry_ms = Some(10);
    let offset = h.enqueue_ok(0, expiring);
    h.tick(20);
    assert_eq!(h.state.counters(20).quarantined, 1);
    let dead = h.state.claim_dead_letters(20, &claim_request(1), offset).unwrap();
    assert!(dead.deliveries.is_empty(), "a dead letter whose enqueue is not durable");
    let dead = h.state.claim_dead_letters(20, &claim_request(1), Offset(offset.0 + 1)).unwrap();
    assert_eq!(dead.deliveries.len(), 1);
}

// Goal: a class whose head is not durable counts as empty, and the round
// bookkeeping stays what apply computes, so a replay of the events gives
// the same credits. Method: band 1 durable, band 0 enqueued
// after it and not durable; the claim serves band 1; the state after the
// claim equals a replay of its log byte for byte.
#[test]
fn claim_skips_a_class_whose_head_is_not_durable() {
    let mut h = Harness::new(config());
    let low = h.enqueue_ok(0, request(1, 1));
    let high = h.enqueue_ok(0, request(2, 0));
    let decision = h.state.claim(1, &claim_request(2), Offset(high.0)).unwrap();
    let offsets: Vec<Offset> = decision.deliveries.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, vec![low], "the durable band serves; the other waits for its sync");
    h.apply_all(&decision.events);
    assert_eq!(h.replay(1).snapshot(Offset(0)), h.state.snapshot(Offset(0)));
    let next = h.state.claim(2, &claim_request(2), ALL_DURABLE).unwrap();
    assert_eq!(next.deliveries.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![high]);
}

// Goal: the fence ends every claim at once and as a release would: ready
// now (no lease wait, no backoff), attempts + 1, quarantined at the
// max_deliveries-th attempt, expired when its expiry passed, dead letters
// ready again; old tokens are stale; a second restart finds nothing to fence.
// Method: four claims of each kind, restart under epoch 2, fence; check
// every message's phase and reason, then claim them all at the same instant.
#[test]
fn fence_releases_every_claim_of_an_older_epoch() {
    let config = QueueConfig { max_deliveries: 2, ..config() };
    let mut h = Harness::new(config);
    let plain = h.enqueue_ok(0, request(1, 0));
    let mut expiring = request(2, 0);
    expiring.expiry_ms = Some(5_000);
    let expires = h.enqueue_ok(0, expiring);
    let last_try = h.enqueue_ok(0, request(3, 0));
    let dead = h.enqueue_ok(0, request(4, 0));
    // `last_try` and `dead` fail once; `dead` twice, so it is a dead letter.
    let first = h.claim(10, 1, 4, Some(60_000));
    for d in first.iter().filter(|d| d.offset == last_try || d.offset == dead) {
        h.release(11, d, 7, Some(11)).unwrap();
    }
    let again = h.claim(12, 1, 2, Some(60_000));
    for d in again.iter().filter(|d| d.offset == dead) {
        h.release(13, d, 7, None).unwrap();
    }
    assert_eq!(h.state.counters(13).quarantined, 1);
    let dead_claim = h.state.claim_dead_letters(14, &claim_request(1), ALL_DURABLE).unwrap();
    h.apply_all(&dead_claim.events);
    assert_eq!(h.state.claims_outstanding(), 4);
    let old_tokens: Vec<DeliveryToken> =
        first.iter().chain(&again).chain(&dead_claim.deliveries).map(|d| d.token).collect();

    h.restart();
    let now = 6_000;
    let events = fence_all(&mut h, now, 3);
    assert_eq!(events.len(), 4);
    assert_eq!(h.state.claims_outstanding(), 0);
    let views: std::collections::BTreeMap<Offset, MessageView> =
        h.state.messages().into_iter().map(|v| (v.offset, v)).collect();
    let ready_now = |v: &MessageView| v.phase == MessagePhase::Ready { since_ms: now };
    assert!(ready_now(&views[&plain]) && views[&plain].lane == Lane::Main);
    assert_eq!(views[&plain].attempts, 1);
    assert_eq!(views[&plain].last_reason, ReleaseReason::EPOCH_FENCED);
    assert!(!views.contains_key(&expires), "expired while claimed: gone, never redelivered");
    assert_eq!(views[&last_try].lane, Lane::DeadLetter, "second attempt of max 2");
    assert_eq!(views[&last_try].last_reason, ReleaseReason::EPOCH_FENCED);
    assert!(ready_now(&views[&dead]) && views[&dead].lane == Lane::DeadLetter);
    for token in &old_tokens {
        assert!(
            matches!(
                h.state.ack(now, token),
                Err(QueueError::StaleToken(StaleToken::Epoch { token: 1, current: 2 }))
            ),
            "an older epoch's token is stale"
        );
    }
    let main = h.claim(now, 2, 10, None);
    assert_eq!(main.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![plain]);
    assert_eq!(main[0].attempt, 2);
    let dead_again = h.state.claim_dead_letters(now, &claim_request(10), ALL_DURABLE).unwrap();
    let dead_offsets: BTreeSet<Offset> = dead_again.deliveries.iter().map(|d| d.offset).collect();
    assert_eq!(dead_offsets, BTreeSet::from([last_try, dead]));
    // The fence's events are ordinary log events: replay folds them.
    assert_eq!(h.replay(2).snapshot(Offset(0)), h.state.snapshot(Offset(0)));
}

// Goal: the fence needs no new record format: its `Released` with reason
// EPOCH_FENCED is the 32-byte kind-4 record every version decodes, and it
// round-trips exactly. Method: encode, check kind and reason bytes, decode.
#[test]
fn fence_events_use_the_existing_released_record() {
    let event = Event::Released {
        sub: SubscriptionId::DEFAULT,
        lane: Lane::Main,
        offset: Offset(77),
        generation: Generation(3),
        reason: ReleaseReason::EPOCH_FENCED,
        at_ms: 5_000,
        not_before_ms: 5_000,
    };
    let mut bytes = Vec::new();
    event.encode(&mut bytes).unwrap();
    assert_eq!(bytes.len(), EVENT_BYTES);
    assert_eq!(bytes[0], 4, "kind Released");
    assert_eq!(u16::from_le_bytes([bytes[2], bytes[3]]), 0xFFFD);
    assert_eq!(Event::decode(&bytes).unwrap(), event);
}

/// One seeded run of a partition's log with a durable watermark.
struct CrashRun {
    rng: ChaCha8Rng,
    config: QueueConfig,
    state: PartitionState,
    /// Every appended event; index = offset.
    log: Vec<Event>,
    /// Events below this index are durable.
    durable: usize,
    epoch: u64,
    now: Millis,
    next_id: u64,
    issued: Vec<DeliveryToken>,
    /// Offsets whose ack was answered (so durable): never delivered again.
    acked: BTreeSet<Offset>,
    claims_lost: u64,
    fenced: u64,
}

impl CrashRun {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let config = QueueConfig {
            max_deliveries: rng.random_range(2..5),
            dead_letter_on_expiry: rng.random_bool(0.3),
            ..config()
        };
        Self {
            state: PartitionState::new(ctx(config.clone(), 1)).unwrap(),
            rng,
            config,
            log: Vec::new(),
            durable: 0,
            epoch: 1,
            now: 1_000,
            next_id: 0,
            issued: Vec::new(),
            acked: BTreeSet::new(),
            claims_lost: 0,
            fenced: 0,
        }
    }

    fn append(&mut self, events: &[Event]) {
        for event in events {
            self.state.apply(event).unwrap_or_else(|e| panic!("apply {event:?}: {e}"));
            self.log.push(*event);
        }
    }

    fn sync(&mut self) {
        self.durable = self.log.len();
    }

    fn replay(&self) -> PartitionState {
        let mut state = PartitionState::new(ctx(self.config.clone(), self.epoch)).unwrap();
        for event in &self.log {
            state.apply(event).unwrap_or_else(|e| panic!("replay {event:?}: {e}"));
        }
        state
    }

    fn token(&mut self) -> Option<DeliveryToken> {
        if self.issued.is_empty() {
            return None;
        }
        let len = self.issued.len();
        let back = self.rng.random_range(0..len.min(6));
        Some(self.issued[len - 1 - back])
    }

    fn step(&mut self, step: usize) {
        match self.rng.random_range(0..100) {
            0..=24 => {
                for _ in 0..self.rng.random_range(1..4) {
                    let mut r = request(self.next_id, self.rng.random_range(0..2));
                    self.next_id += 1;
                    if self.rng.random_bool(0.2) {
                        r.expiry_ms = Some(self.now + self.rng.random_range(0..60_000));
                    }
                    if self.rng.random_bool(0.1) {
                        r.not_before_ms = self.now + self.rng.random_range(0..3_000);
                    }
                    let meta = EnqueueMeta::new(&r, Offset(self.log.len() as u64), self.now);
                    self.append(&[Event::Enqueued(meta)]);
                }
            }
            25..=34 => self.sync(),
            35..=54 => {
                let req = ClaimRequest {
                    sub: SubscriptionId::DEFAULT,
                    worker: WorkerId(self.rng.random_range(1..3)),
                    credits: self.rng.random_range(1..5),
                    max_bytes: u64::MAX,
                    lease_ms: Some(self.rng.random_range(1_000..=60_000)),
                };
                let bound = Offset(self.durable as u64);
                let decision = if self.rng.random_bool(0.15) {
                    self.state.claim_dead_letters(self.now, &req, bound)
                } else {
                    self.state.claim(self.now, &req, bound)
                }
                .unwrap();
                for d in &decision.deliveries {
                    assert!(
                        d.offset < bound,
                        "step {step}: delivered {d:?} past durable {bound:?}"
                    );
                    assert!(
                        !self.acked.contains(&d.offset),
                        "step {step}: {:?} delivered again after its ack was answered",
                        d.offset
                    );
                    assert_eq!(d.token.claim().epoch, LeaderEpoch(self.epoch));
                    self.issued.push(d.token);
                }
                // Replies now; its events are durable only at a later sync.
                self.append(&decision.events);
            }
            55..=69 => {
                if let Some(token) = self.token() {
                    let result = self.state.ack(self.now, &token);
                    let claim = *token.claim();
                    if claim.epoch != LeaderEpoch(self.epoch) {
                        assert!(
                            matches!(result, Err(QueueError::StaleToken(StaleToken::Epoch { .. }))),
                            "step {step}: older epoch's token answered {result:?}"
                        );
                    }
                    if let Ok(event) = result {
                        self.append(&[event]);
                        // The ack replies only once durable.
                        self.sync();
                        self.acked.insert(claim.offset);
                    }
                }
            }
            70..=77 => {
                if let Some(token) = self.token() {
                    let not_before =
                        self.rng.random_bool(0.5).then(|| self.now + self.rng.random_range(0..500));
                    let result = self.state.release(self.now, &token, ReleaseReason(3), not_before);
                    if token.claim().epoch != LeaderEpoch(self.epoch) {
                        assert!(result.is_err(), "step {step}: older epoch's release accepted");
                    }
                    if let Ok(event) = result {
                        self.append(&[event]);
                    }
                }
            }
            78..=82 => {
                if let Some(token) = self.token() {
                    let lease = self.rng.random_range(1_000..=60_000);
                    let result = self.state.extend(self.now, &token, Some(lease));
                    if token.claim().epoch != LeaderEpoch(self.epoch) {
                        assert!(result.is_err(), "step {step}: older epoch's extend accepted");
                    }
                    if let Ok((event, _)) = result {
                        self.append(&[event]);
                    }
                }
            }
            83..=91 => {
                self.now += self.rng.random_range(0..4_000);
                loop {
                    let events = self.state.tick(self.now, Offset(self.durable as u64));
                    if events.is_empty() {
                        break;
                    }
                    self.append(&events);
                }
            }
            _ => self.crash(step),
        }
    }

    /// Power loss: the log keeps its durable prefix and any part of what
    /// followed, then open replays it under the next epoch and fences.
    fn crash(&mut self, step: usize) {
        let cut = self.rng.random_range(self.durable..=self.log.len());
        let lost_claims =
            self.log[cut..].iter().filter(|event| matches!(event, Event::Claimed { .. })).count();
        self.claims_lost += lost_claims as u64;
        self.log.truncate(cut);
        self.durable = cut;
        self.epoch += 1;
        self.state = self.replay();
        let claimed: Vec<MessageView> = self
            .state
            .messages()
            .into_iter()
            .filter(|v| matches!(v.phase, MessagePhase::Claimed { .. }))
            .collect();
        // Sometimes time passes before the open (leases may have run out).
        if self.rng.random_bool(0.3) {
            self.now += self.rng.random_range(0..90_000);
        }
        let limit = self.rng.random_range(1..4);
        loop {
            let events = self.state.fence(self.now, limit);
            if events.is_empty() {
                break;
            }
            assert!(events.len() <= limit);
            self.fenced += events.len() as u64;
            self.append(&events);
        }
        // The fence is durable before the partition serves.
        self.sync();
        assert_eq!(self.state.claims_outstanding(), 0, "step {step}: a claim survived the fence");
        let after: std::collections::BTreeMap<Offset, MessageView> =
            self.state.messages().into_iter().map(|v| (v.offset, v)).collect();
        for before in &claimed {
            match after.get(&before.offset) {
                Some(view) => {
                    assert_eq!(
                        view.phase,
                        MessagePhase::Ready { since_ms: self.now },
                        "step {step}: {:?} not ready at once after the fence",
                        before.offset
                    );
                    assert_eq!(view.attempts, before.attempts + 1, "the fenced claim counts");
                }
                None => {
                    let expired = before.expiry_ms.is_some_and(|expiry| expiry <= self.now);
                    assert!(expired, "step {step}: fenced {:?} vanished", before.offset);
                }
            }
        }
        // Every token issued so far names an older epoch now.
        for token in self.issued.clone() {
            assert!(
                matches!(
                    self.state.ack(self.now, &token),
                    Err(QueueError::StaleToken(StaleToken::Epoch { .. }))
                ),
                "step {step}: a token of an older epoch is accepted"
            );
        }
        // A second crash right after the fence folds to the same state.
        assert_eq!(
            self.replay().snapshot(Offset(0)),
            self.state.snapshot(Offset(0)),
            "step {step}: replay after the fence differs"
        );
    }

    fn check(&self, step: usize) {
        self.state.assert_invariants();
        assert_eq!(
            self.replay().snapshot(Offset(0)),
            self.state.snapshot(Offset(0)),
            "step {step}: replay of the log differs from the live state"
        );
        for view in self.state.messages() {
            assert!(!self.acked.contains(&view.offset), "step {step}: acked {view:?} is live");
        }
    }
}

// Goal: with claims, extends, releases and ticks replying before their sync
// and acks only after it, no crash can make the queue break its contract:
// no acked message is delivered again, no token of an older epoch is
// accepted, every message whose claim survived replay is ready at the
// instant of open (or dead-lettered/expired as a release would), nothing is
// delivered past the durable watermark, and replay of the log (fence events
// included) equals the live state after every step. Method: seeded random
// runs; a crash keeps the durable prefix plus a random part of the tail,
// replays under the next epoch and fences in random chunk sizes. The run
// must actually lose claims and fence claims, or the test proves nothing.
#[test]
fn crash_loses_claims_but_never_acks() {
    let seeds: u64 =
        std::env::var("SPOOL_FENCE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let (mut lost, mut fenced) = (0, 0);
    for seed in 0..seeds {
        let mut run = CrashRun::new(seed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for step in 0..200 {
                run.step(step);
                run.check(step);
            }
        }));
        if let Err(panic) = result {
            eprintln!("fence model failed at seed {seed}");
            std::panic::resume_unwind(panic);
        }
        lost += run.claims_lost;
        fenced += run.fenced;
    }
    assert!(lost > 0 && fenced > 0, "lost {lost} claims, fenced {fenced}: the runs did not bite");
}
