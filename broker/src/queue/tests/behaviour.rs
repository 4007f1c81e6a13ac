//! One test per contract bullet; each fails if its bullet breaks.

use super::super::*;
use super::harness::{ctx, id, request, Harness, ALL_DURABLE, SECRET};
use crate::queue::types::SubscriptionId;

fn config() -> QueueConfig {
    QueueConfig {
        lease_default_ms: 30_000,
        lease_min_ms: 1_000,
        lease_max_ms: 60_000,
        max_lease_lifetime_ms: 120_000,
        backoff: Backoff::None,
        age_promotion_ms: 1_000_000,
        ..QueueConfig::default()
    }
}

fn stale(result: Result<(), QueueError>) -> bool {
    matches!(result, Err(QueueError::StaleToken(_)))
}

// Goal: the seed's lease trace. Method: lease 30 s, work 40 s; the lease
// expires at 30 s, worker B claims generation + 1; A's ack at 40 s is
// rejected as stale, B's accepted, and the message is acked exactly once.
#[test]
fn lease_trace_late_ack_is_rejected_and_message_acked_once() {
    let mut h = Harness::new(config());
    let offset = h.enqueue_ok(0, request(1, 0));
    let a = h.claim(0, 1, 1, Some(30_000));
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].generation, Generation(1));
    assert!(h.claim(29_999, 2, 1, None).is_empty(), "claimed message is not claimable");
    let events = h.tick(30_000);
    assert_eq!(
        events,
        vec![Event::LeaseExpired {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::Main,
            offset,
            generation: Generation(1),
            at_ms: 30_000
        }]
    );
    let b = h.claim(30_000, 2, 1, Some(30_000));
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].generation, Generation(2));
    assert_eq!(b[0].attempt, 2);
    let before = h.state.snapshot(Offset(0));
    let late = h.ack(40_000, &a[0]);
    assert_eq!(
        late,
        Err(QueueError::StaleToken(StaleToken::Generation {
            token: Generation(1),
            current: Generation(2)
        }))
    );
    assert_eq!(h.state.snapshot(Offset(0)), before, "a rejected ack changes nothing");
    h.ack(40_000, &b[0]).unwrap();
    assert!(stale(h.ack(40_001, &b[0])), "a second ack of the same claim is stale");
    let counters = h.state.counters(40_001);
    assert_eq!(counters.totals.acked, 1);
    assert_eq!(counters.live_messages, 0);
    assert!(h.state.messages().is_empty());
}

// Goal: a token past its deadline is stale even before tick has run.
// Method: claim, then ack one millisecond after the deadline without ticking.
#[test]
fn token_is_stale_at_its_deadline_without_a_tick() {
    let mut h = Harness::new(config());
    h.enqueue_ok(0, request(1, 0));
    let d = h.claim(0, 1, 1, Some(5_000));
    assert_eq!(
        h.ack(5_000, &d[0]),
        Err(QueueError::StaleToken(StaleToken::LeaseExpired { deadline_ms: 5_000, now_ms: 5_000 }))
    );
    h.ack(4_999, &d[0]).unwrap();
}

// Goal: the lowest band is served under a flood of the highest. Method:
// 1000 band-0 messages ahead of one band-3 message, age promotion off;
// weighted round-robin (8,4,2,1) must serve band 3 within one round.
#[test]
fn lowest_band_is_not_starved_by_a_flood_of_the_highest() {
    let mut h = Harness::new(config());
    for n in 0..1000 {
        h.enqueue_ok(0, request(n, 0));
    }
    let low = h.enqueue_ok(0, request(5000, 3));
    let mut served_at = None;
    for i in 0..40 {
        let d = h.claim(1, 1, 1, None);
        if d[0].offset == low {
            served_at = Some(i);
            break;
        }
    }
    let served_at = served_at.expect("band 3 starved");
    assert!(served_at < 15, "band 3 served only at claim {served_at}");
}

// Goal: age promotion serves an old low-priority head before younger high
// priority work regardless of credits. Method: a band-3 message older than
// age_promotion_ms behind fresh band-0 work is the first claimed.
#[test]
fn age_promotion_serves_the_oldest_head_first() {
    let mut h = Harness::new(QueueConfig { age_promotion_ms: 10_000, ..config() });
    let low = h.enqueue_ok(0, request(1, 3));
    for n in 2..50 {
        h.enqueue_ok(9_000, request(n, 0));
    }
    let d = h.claim(10_000, 1, 1, None);
    assert_eq!(d[0].offset, low);
    let d = h.claim(10_000, 1, 1, None);
    assert_ne!(d[0].offset, low);
}

// Goal: retries draw from their own budget. Method: 50 retried messages and
// 50 new ones in band 0; of the next 20 claims, retries get no more than
// their weighted share (retry weight 1 against band weight 8).
#[test]
fn retries_cannot_crowd_out_new_work() {
    let mut h =
        Harness::new(QueueConfig { band_weights: vec![8, 1, 1, 1], retry_weight: 1, ..config() });
    for n in 0..50 {
        h.enqueue_ok(0, request(n, 0));
    }
    let first = h.claim(0, 1, 50, None);
    for d in &first {
        h.release(1, d, 0, None).unwrap();
    }
    for n in 100..150 {
        h.enqueue_ok(2, request(n, 0));
    }
    let next = h.claim(3, 1, 20, None);
    let retried = next.iter().filter(|d| d.attempt > 1).count();
    assert_eq!(next.len(), 20);
    assert!(retried <= 3, "{retried} of 20 claims went to retries");
    assert!(retried >= 1, "retries must still be served");
}

// Goal: a forged or altered token is rejected and changes nothing. Method:
// flip a MAC bit, alter the generation field, sign with another secret.
#[test]
fn forged_mac_is_rejected() {
    let mut h = Harness::new(config());
    h.enqueue_ok(0, request(1, 0));
    let d = h.claim(0, 1, 1, None)[0];
    let before = h.state.snapshot(Offset(0));
    let mut bytes = d.token.to_bytes();
    bytes[DELIVERY_TOKEN_BYTES - 1] ^= 1;
    let flipped = DeliveryToken::from_bytes(&bytes).unwrap();
    assert_eq!(h.state.ack(1, &flipped), Err(QueueError::InvalidToken(InvalidToken::BadMac)));
    let mut bytes = d.token.to_bytes();
    bytes[12] ^= 2; // generation field
    let altered = DeliveryToken::from_bytes(&bytes).unwrap();
    assert_eq!(h.state.ack(1, &altered), Err(QueueError::InvalidToken(InvalidToken::BadMac)));
    let other = TokenKey::from_secret(&[8; 32]).sign(d.token.claim());
    assert_eq!(h.state.ack(1, &other), Err(QueueError::InvalidToken(InvalidToken::BadMac)));
    assert_eq!(
        h.state.release(1, &other, ReleaseReason(1), None),
        Err(QueueError::InvalidToken(InvalidToken::BadMac))
    );
    assert_eq!(h.state.snapshot(Offset(0)), before);
    h.ack(1, &d).unwrap();
}

// Goal: a token from the previous leader epoch is stale even though its
// generation still matches. Method: claim, restart (replay under epoch+1),
// ack with the old token; after the lease ends a new claim works.
#[test]
fn token_from_previous_epoch_is_stale() {
    let mut h = Harness::new(config());
    h.enqueue_ok(0, request(1, 0));
    let old = h.claim(0, 1, 1, None)[0];
    h.restart();
    assert_eq!(
        h.ack(10, &old),
        Err(QueueError::StaleToken(StaleToken::Epoch { token: 1, current: 2 }))
    );
    assert_eq!(h.state.counters(10).claimed, 1, "the claim survives the restart");
    h.tick(30_000);
    let new = h.claim(30_000, 1, 1, None)[0];
    assert_eq!(new.generation, Generation(2));
    assert_eq!(new.token.claim().epoch, LeaderEpoch(2));
    h.ack(30_001, &new).unwrap();
}

// Goal: extend never pushes a claim past max_lease_lifetime in total.
// Method: lifetime 120 s, extend repeatedly; the deadline is clamped to
// claimed_at + 120 s, a further extend is refused, and the lease expires there.
#[test]
fn extend_is_capped_by_lease_lifetime() {
    let mut h = Harness::new(config());
    h.enqueue_ok(0, request(1, 0));
    let d = h.claim(1_000, 1, 1, Some(30_000))[0];
    let (event, deadline) = h.state.extend(20_000, &d.token, Some(60_000)).unwrap();
    assert_eq!(deadline, 80_000);
    h.apply_all(&[event]);
    let (event, deadline) = h.state.extend(70_000, &d.token, Some(60_000)).unwrap();
    assert_eq!(deadline, 121_000, "clamped to claimed_at + lifetime");
    h.apply_all(&[event]);
    assert_eq!(
        h.state.extend(100_000, &d.token, Some(60_000)),
        Err(QueueError::LeaseLifetimeExhausted { cap_ms: 121_000 })
    );
    assert_eq!(
        h.state.extend(100_000, &d.token, Some(500)),
        Err(QueueError::LeaseOutOfRange { lease_ms: 500, min_ms: 1_000, max_ms: 60_000 })
    );
    assert!(h.tick(120_999).is_empty());
    assert_eq!(h.tick(121_000).len(), 1);
    assert!(stale(h.ack(121_000, &d)));
}

// Goal: an expired message is never delivered, even if no tick ran; it is
// counted, and dead-lettered when configured. Method: claim at the expiry.
#[test]
fn expiry_is_checked_at_claim_time() {
    for dead_letter in [false, true] {
        let mut h = Harness::new(QueueConfig { dead_letter_on_expiry: dead_letter, ..config() });
        let expiring = h.enqueue_ok(0, EnqueueRequest { expiry_ms: Some(100), ..request(1, 0) });
        let keeper = h.enqueue_ok(0, request(2, 0));
        let d = h.claim(100, 1, 5, None);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].offset, keeper);
        let counters = h.state.counters(100);
        if dead_letter {
            assert_eq!(counters.quarantined, 1);
            let dead = h.state.peek_dead_letters(None, 10);
            assert_eq!(dead[0].offset, expiring);
            assert_eq!(dead[0].quarantine.unwrap().0, QuarantineCause::Expired);
            let totals = counters.totals;
            assert_eq!((totals.quarantined_by_expiry, totals.quarantined_by_deliveries), (1, 0));
        } else {
            assert_eq!(counters.totals.expired, 1);
            assert_eq!(counters.quarantined, 0);
        }
    }
}

// Goal: tick expires messages anywhere (deep in a backlog, scheduled,
// ready again after a release), and nothing not yet expired. Method: mixed
// expiries across chunk boundaries; tick just before and at the expiry.
#[test]
fn tick_expires_exactly_the_expired_messages() {
    let mut h = Harness::new(config());
    let mut expiring = Vec::new();
    for n in 0..200u64 {
        let expiry = (n % 3 == 0).then_some(5_000 + n);
        let not_before = if n % 10 == 1 { 2_000 } else { 0 };
        let o = h.enqueue_ok(
            0,
            EnqueueRequest { expiry_ms: expiry, not_before_ms: not_before, ..request(n, 0) },
        );
        if expiry.is_some() {
            expiring.push((5_000 + n, o));
        }
    }
    assert!(h.tick(4_999).iter().all(|e| matches!(e, Event::Readied { .. })));
    let events = h.tick(5_100);
    let expired: Vec<Offset> = events
        .iter()
        .filter_map(|e| match e {
            Event::Expired { offset, .. } => Some(*offset),
            _ => None,
        })
        .collect();
    let want: Vec<Offset> = expiring.iter().filter(|(t, _)| *t <= 5_100).map(|(_, o)| *o).collect();
    assert_eq!(expired, want);
    assert_eq!(h.state.counters(5_100).totals.expired, want.len() as u64);
}

// Goal: dedupe returns the original offset inside the window, accepts
// outside it, and prunes old ids. Method: same id at 0, 999, 1000 with a
// 1000 ms window; an in-batch duplicate points at the first index.
#[test]
fn dedupe_inside_and_outside_the_window() {
    let mut h = Harness::new(QueueConfig { dedupe_window_ms: 1_000, ..config() });
    let first = h.enqueue_ok(0, request(1, 0));
    assert_eq!(h.enqueue(999, request(1, 0)).0, EnqueueDecision::Duplicate { original: first });
    let log_len = h.log.len();
    assert_eq!(h.log.len(), log_len, "a duplicate appends nothing");
    let second = h.enqueue_ok(1_000, request(1, 0));
    assert_ne!(second, first);
    assert_eq!(h.enqueue(1_500, request(1, 0)).0, EnqueueDecision::Duplicate { original: second });
    let mut batch = h.state.admission(1_500);
    assert_eq!(batch.check(&request(9, 0)).unwrap(), EnqueueDecision::Accept);
    assert_eq!(
        batch.check(&request(9, 0)).unwrap(),
        EnqueueDecision::DuplicateInBatch { index: 0 }
    );
    // Bounded memory: after the window, a new enqueue prunes the old ids.
    for n in 10..20 {
        h.enqueue_ok(1_600, request(n, 0));
    }
    assert_eq!(h.state.dedupe.len(), 11);
    h.enqueue_ok(5_000, request(99, 0));
    assert_eq!(h.state.dedupe.len(), 1);
}

// Goal: after max_deliveries failed claims the message is quarantined with
// its evidence: original queue/partition/offset, attempts, last reason,
// timestamps; it is not served in the main lane but can be claimed in the
// dead-letter queue. Method: max_deliveries 3, release, lease expiry, release.
#[test]
fn quarantine_keeps_its_evidence_and_is_a_real_queue() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 3, ..config() });
    let offset = h.enqueue_ok(5, request(1, 2));
    let d = h.claim(10, 1, 1, None)[0];
    h.release(11, &d, 41, None).unwrap();
    h.claim(12, 1, 1, Some(1_000));
    h.tick(1_012);
    let d = h.claim(2_000, 1, 1, None)[0];
    assert_eq!(d.attempt, 3);
    let event = h.release(2_001, &d, 42, None).unwrap();
    assert_eq!(
        event,
        Event::Quarantined {
            sub: SubscriptionId::DEFAULT,
            offset,
            generation: Generation(3),
            cause: QuarantineCause::Deliveries,
            reason: ReleaseReason(42),
            at_ms: 2_001
        }
    );
    assert!(h.claim(3_000, 1, 10, None).is_empty(), "not served in the main lane");
    let dead = h.state.peek_dead_letters(None, 10);
    assert_eq!(dead.len(), 1);
    let v = dead[0];
    assert_eq!(
        (v.offset, v.lane, v.attempts, v.last_reason),
        (offset, Lane::DeadLetter, 3, ReleaseReason(42))
    );
    assert_eq!((v.enqueue_time_ms, v.priority), (5, 2));
    assert_eq!(v.quarantine, Some((QuarantineCause::Deliveries, 2_001)));
    assert_eq!(h.state.counters(3_000).quarantined, 1);
    let totals = h.state.counters(3_000).totals;
    assert_eq!((totals.quarantined_by_deliveries, totals.quarantined_by_expiry), (1, 0));
    assert_eq!(h.state.retention_watermark(), Some(offset), "evidence holds retention");
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(9),
        credits: 5,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let decision = h.state.claim_dead_letters(3_000, &request, ALL_DURABLE).unwrap();
    assert_eq!(decision.deliveries.len(), 1);
    let dl = decision.deliveries[0];
    assert_eq!(dl.token.claim().lane, Lane::DeadLetter);
    assert_eq!(dl.token.claim().queue, QueueId(3));
    assert_eq!(dl.token.claim().partition, PartitionId(1));
    h.apply_all(&decision.events);
    assert!(stale(h.ack(3_001, &d)), "the main-lane token is stale");
    h.ack(3_001, &dl).unwrap();
    assert_eq!(h.state.counters(3_001).totals.dead_letter_acked, 1);
    assert_eq!(h.state.retention_watermark(), None);
}

// Goal: lease expiry at the last delivery also quarantines (never a silent
// drop). Method: max_deliveries 1, let the lease run out.
#[test]
fn lease_expiry_on_last_delivery_quarantines() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    let offset = h.enqueue_ok(0, request(1, 0));
    h.claim(0, 1, 1, Some(1_000));
    let events = h.tick(1_000);
    assert!(matches!(events[0], Event::Quarantined { reason: ReleaseReason::LEASE_EXPIRED, .. }));
    assert_eq!(h.state.peek_dead_letters(None, 1)[0].offset, offset);
    assert_eq!(h.state.counters(1_000).live_messages, 0);
}

// Goal: redrive moves a dead letter back as new ready work, attempts reset,
// generation continuing so earlier tokens stay stale. Method: quarantine,
// redrive, claim again.
#[test]
fn redrive_moves_a_dead_letter_back() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    let offset = h.enqueue_ok(0, request(1, 1));
    let old = h.claim(0, 1, 1, None)[0];
    h.release(1, &old, 5, None).unwrap();
    assert_eq!(
        h.state.redrive(2, Redrive::One(Offset(999))),
        Err(QueueError::NotRedrivable(Offset(999)))
    );
    let events = h.state.redrive(2, Redrive::One(offset)).unwrap();
    h.apply_all(&events);
    assert!(h.state.peek_dead_letters(None, 10).is_empty());
    let counters = h.state.counters(2);
    assert_eq!((counters.ready, counters.quarantined, counters.totals.redriven), (1, 0, 1));
    let again = h.claim(3, 1, 1, None)[0];
    assert_eq!((again.offset, again.attempt, again.generation), (offset, 1, Generation(2)));
    assert!(stale(h.ack(4, &old)));
    h.ack(4, &again).unwrap();
    // Oldest-first bulk redrive is bounded and ordered.
    for n in 10..14 {
        h.enqueue_ok(5, request(n, 0));
    }
    for d in h.claim(6, 1, 4, None) {
        h.release(7, &d, 0, None).unwrap();
    }
    let events = h.state.redrive(8, Redrive::Oldest(3)).unwrap();
    assert_eq!(events.len(), 3);
}

// Goal: admission refuses past max_messages / max_bytes with QueueFull,
// leaves accepted work untouched, and resumes when space returns. Method:
// fill to the limit, try more, ack one, try again.
#[test]
fn admission_limits_messages_and_bytes() {
    let mut h = Harness::new(QueueConfig { max_messages: 3, max_bytes: 1_000, ..config() });
    for n in 0..3 {
        h.enqueue_ok(0, request(n, 0));
    }
    assert_eq!(
        h.enqueue(0, request(3, 0)).0,
        EnqueueDecision::QueueFull { limit: FullLimit::Messages }
    );
    assert_eq!(h.state.counters(0).live_messages, 3);
    let d = h.claim(0, 1, 1, None)[0];
    h.ack(1, &d).unwrap();
    h.enqueue_ok(2, request(3, 0));
    let big = EnqueueRequest { size_bytes: 800, ..request(4, 0) };
    let mut h2 = Harness::new(QueueConfig { max_messages: 100, max_bytes: 1_000, ..config() });
    h2.enqueue_ok(0, request(0, 0));
    let mut batch = h2.state.admission(0);
    assert_eq!(batch.check(&big).unwrap(), EnqueueDecision::Accept);
    assert_eq!(
        batch.check(&EnqueueRequest { size_bytes: 200, ..request(5, 0) }).unwrap(),
        EnqueueDecision::QueueFull { limit: FullLimit::Bytes },
        "the batch counts what it already accepted"
    );
    assert_eq!(
        h.state.enqueue_check(0, &request(9, 4)),
        Err(QueueError::PriorityOutOfRange { priority: 4, bands: 4 })
    );
}

/// Claims every ready main-lane message and quarantines it (the queue has
/// `max_deliveries` 1): by letting its 1 s lease run out and ticking, or by
/// releasing it. Returns the time after.
fn quarantine_all(h: &mut Harness, now: Millis, by_lease_expiry: bool) -> Millis {
    let deliveries = h.claim(now, 1, 100, Some(1_000));
    assert!(!deliveries.is_empty());
    if by_lease_expiry {
        let events = h.tick(now + 1_000);
        assert_eq!(events.len(), deliveries.len());
        assert!(events.iter().all(|e| matches!(e, Event::Quarantined { .. })), "{events:?}");
    } else {
        for d in &deliveries {
            let event = h.release(now + 1, d, 7, None).unwrap();
            assert!(matches!(event, Event::Quarantined { .. }), "{event:?}");
        }
    }
    now + 1_000
}

/// Admission's view of `state`: (held messages, held bytes, dead letters),
/// checked against the accessors it is made of.
fn held(state: &PartitionState, now: Millis) -> (u64, u64, u64) {
    let c = state.counters(now);
    assert_eq!(c.held_messages, state.held_messages());
    assert_eq!(c.held_bytes, state.held_bytes());
    assert_eq!(c.held_messages, c.live_messages + c.quarantined);
    (c.held_messages, c.held_bytes, c.quarantined)
}

// Goal: dead letters count toward max_messages: quarantine and redrive move
// a message inside the queue and free nothing; acking, purging or expiring
// (without dead-lettering) frees room; replay and restore agree. Method:
// max_messages 4, max_deliveries 1; fill, quarantine two by release and two
// by lease expiry, enqueue (QueueFull, single and batched), redrive one (still
// full), ack a dead letter, purge one, let a main-lane message expire; after
// a restart and a snapshot restore the totals and the refusal are the same.
#[test]
fn dead_letters_count_toward_max_messages() {
    let full = EnqueueDecision::QueueFull { limit: FullLimit::Messages };
    let mut h = Harness::new(QueueConfig { max_messages: 4, max_deliveries: 1, ..config() });
    h.enqueue_ok(0, request(0, 0));
    h.enqueue_ok(0, request(1, 0));
    let now = quarantine_all(&mut h, 10, false);
    h.enqueue_ok(now, request(2, 1));
    h.enqueue_ok(now, request(3, 1));
    let now = quarantine_all(&mut h, now, true);
    assert_eq!(held(&h.state, now), (4, 400, 4));
    assert_eq!(h.state.live_messages(), 0, "live_messages is the main lane only");
    assert_eq!(h.enqueue(now, request(4, 0)).0, full, "the dead letters fill the queue");
    let mut batch = h.state.admission(now);
    assert_eq!(batch.check(&request(5, 0)).unwrap(), full);

    // Redrive moves one back to the main lane: still four held, still full.
    let dead = h.state.peek_dead_letters(None, 10);
    let events = h.state.redrive(now, Redrive::One(dead[0].offset)).unwrap();
    h.apply_all(&events);
    assert_eq!(held(&h.state, now), (4, 400, 3));
    assert_eq!(h.enqueue(now, request(4, 0)).0, full, "redrive frees no room");

    // Acking a dead letter frees one slot.
    let request_dead = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(9),
        credits: 1,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let decision = h.state.claim_dead_letters(now, &request_dead, ALL_DURABLE).unwrap();
    h.apply_all(&decision.events);
    assert_eq!(held(&h.state, now), (4, 400, 3), "a claimed dead letter is still held");
    h.ack(now + 1, &decision.deliveries[0]).unwrap();
    assert_eq!(held(&h.state, now + 1), (3, 300, 2));
    let expiring = EnqueueRequest { expiry_ms: Some(now + 500), ..request(4, 0) };
    h.enqueue_ok(now + 1, expiring);
    assert_eq!(h.enqueue(now + 1, request(5, 0)).0, full);

    // Purging a dead letter frees one slot.
    let events = h.state.purge(now + 2, Lane::DeadLetter, 1, ALL_DURABLE);
    assert_eq!(events.len(), 1);
    h.apply_all(&events);
    assert_eq!(held(&h.state, now + 2), (3, 300, 1));
    h.enqueue_ok(now + 2, request(5, 0));
    assert_eq!(h.enqueue(now + 2, request(6, 0)).0, full);

    // Expiry without dead-lettering frees one slot.
    let events = h.tick(now + 500);
    assert!(matches!(events[..], [Event::Expired { .. }]), "{events:?}");
    assert_eq!(held(&h.state, now + 500), (3, 300, 1));
    let now = now + 500;

    // Full replay and snapshot restore count the same, and refuse the same.
    h.enqueue_ok(now, request(6, 0));
    let live = held(&h.state, now);
    assert_eq!(live, (4, 400, 1));
    let replayed = h.replay(2);
    assert_eq!(held(&replayed, now), live);
    assert_eq!(replayed.enqueue_check(now, &request(7, 0)).unwrap(), full);
    let restored =
        PartitionState::restore(&h.state.snapshot(Offset(0)), ctx(h.config.clone(), 2)).unwrap();
    assert_eq!(held(&restored.state, now), live);
    assert_eq!(restored.state.enqueue_check(now, &request(7, 0)).unwrap(), full);
}

// Goal: dead letters count toward max_bytes as well, through quarantine by
// expiry (`dead_letter_on_expiry`) and after a snapshot restore, and purging
// them gives the bytes back. Method: max_bytes 1 000; two 400-byte messages
// quarantined (one by release, one by expiry), then a 300-byte enqueue is
// refused on bytes and a 200-byte one accepted; restore; purge the dead
// letters; 800 bytes fit again.
#[test]
fn dead_letters_count_toward_max_bytes() {
    let full = EnqueueDecision::QueueFull { limit: FullLimit::Bytes };
    let config = QueueConfig {
        max_messages: 100,
        max_bytes: 1_000,
        max_deliveries: 1,
        dead_letter_on_expiry: true,
        ..config()
    };
    let mut h = Harness::new(config);
    let sized = |n: u64, size_bytes: u32| EnqueueRequest { size_bytes, ..request(n, 0) };
    h.enqueue_ok(0, sized(0, 400));
    let now = quarantine_all(&mut h, 10, false);
    h.enqueue_ok(now, EnqueueRequest { expiry_ms: Some(now + 100), ..sized(1, 400) });
    let events = h.tick(now + 100);
    assert!(
        matches!(events[..], [Event::Quarantined { cause: QuarantineCause::Expired, .. }]),
        "{events:?}"
    );
    let now = now + 100;
    assert_eq!(held(&h.state, now), (2, 800, 2));
    assert_eq!(h.state.live_bytes(), 0, "live_bytes is the main lane only");
    assert_eq!(h.enqueue(now, sized(2, 300)).0, full);
    h.enqueue_ok(now, sized(3, 200));
    assert_eq!(h.enqueue(now, sized(4, 1)).0, full);

    let restored =
        PartitionState::restore(&h.state.snapshot(Offset(0)), ctx(h.config.clone(), 2)).unwrap();
    assert_eq!(held(&restored.state, now), (3, 1_000, 2));
    assert_eq!(restored.state.enqueue_check(now, &sized(4, 1)).unwrap(), full);

    let events = h.state.purge(now, Lane::DeadLetter, 10, ALL_DURABLE);
    assert_eq!(events.len(), 2);
    h.apply_all(&events);
    assert_eq!(held(&h.state, now), (1, 200, 0));
    let mut batch = h.state.admission(now);
    assert_eq!(batch.check(&sized(4, 400)).unwrap(), EnqueueDecision::Accept);
    assert_eq!(batch.check(&sized(5, 400)).unwrap(), EnqueueDecision::Accept);
    assert_eq!(batch.check(&sized(6, 1)).unwrap(), full);
}

// Goal: a checkpoint plus tail replay equals full replay and the live state.
// Method: a busy scenario; snapshot at every event; compare canonical bytes.
#[test]
fn checkpoint_plus_replay_equals_full_replay() {
    let mut h =
        Harness::new(QueueConfig { max_deliveries: 2, dead_letter_on_expiry: true, ..config() });
    for n in 0..20 {
        let expiry = (n % 4 == 0).then_some(50_000);
        h.enqueue_ok(
            n,
            EnqueueRequest {
                expiry_ms: expiry,
                not_before_ms: n * 100,
                ..request(n, (n % 4) as u8)
            },
        );
    }
    h.tick(2_000);
    let ds = h.claim(2_000, 1, 8, None);
    for d in &ds[..4] {
        h.release(2_001, d, 3, None).unwrap();
    }
    h.ack(2_002, &ds[4]).unwrap();
    h.tick(40_000);
    h.tick(60_000);
    h.claim(60_000, 2, 3, None);
    let live = h.state.snapshot(Offset(7));
    let full = h.replay(1);
    assert_eq!(full.snapshot(Offset(7)), live);
    let mut state = PartitionState::new(ctx(h.config.clone(), 1)).unwrap();
    for (i, event) in h.log.iter().enumerate() {
        let restored =
            PartitionState::restore(&state.snapshot(Offset(i as u64)), ctx(h.config.clone(), 1))
                .unwrap();
        assert_eq!(restored.covers, Offset(i as u64));
        let mut resumed = restored.state;
        resumed.assert_invariants();
        for tail in &h.log[i..] {
            resumed.apply(tail).unwrap();
        }
        assert_eq!(resumed.snapshot(Offset(7)), live, "checkpoint at event {i}");
        state.apply(event).unwrap();
    }
}

// Goal: a checkpoint written before dead-letter moves were counted by cause
// (version 1: nine totals) still restores, its moves counted under neither
// cause; the current version keeps the causes. Method: quarantine one
// message by deliveries, snapshot, rewrite the bytes as version 1 (drop the
// two cause totals, version 1, new crc), restore both.
#[test]
fn version_1_snapshot_restores_with_its_dead_letter_causes_unknown() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    h.enqueue_ok(5, request(1, 0));
    let d = h.claim(10, 1, 1, None)[0];
    h.release(11, &d, 41, None).unwrap();
    let bytes = h.state.snapshot(Offset(3));
    let restored = PartitionState::restore(&bytes, ctx(config(), 2)).unwrap();
    let totals = restored.state.counters(20).totals;
    assert_eq!((totals.quarantined, totals.quarantined_by_deliveries), (1, 1));

    // Header: magic 4, version 2, bands 2, covers 8, highest 8, last
    // enqueue time 8; then the totals, the two cause totals last.
    const TOTALS_AT: usize = 4 + 2 + 2 + 8 + 8 + 8;
    let causes = TOTALS_AT + 9 * 8..TOTALS_AT + 11 * 8;
    // Version 3's trailing stored-counts section (two empty lists) and
    // version 4's key map and members (12 + 1 B) go too.
    // Version 5's subscriptions (the default's cursor and marks per band,
    // no others) go too.
    // Version 6's losses (the default's total and empty list, 16 B) and
    // version 7's lanes (the default's zero count, 8 B) too.
    let subs = h.state.config().bands() * 16 + 8 + 16;
    let mut body = bytes[..bytes.len() - 4 - subs - 16 - 8 - 13].to_vec();
    body[4..6].copy_from_slice(&1u16.to_le_bytes());
    // Version 3's dedupe section starts with `dead_through` (9 bytes) and
    // the count of generation references (8, here 0) before the inline list.
    let inline = 8 + h.state.dedupe.entries().count() * 32;
    let refs_at = body.len() - inline - 17;
    body.drain(refs_at..refs_at + 17);
    body.drain(causes);
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let old = PartitionState::restore(&body, ctx(config(), 2)).unwrap();
    let totals = old.state.counters(20).totals;
    assert_eq!(
        (totals.quarantined, totals.quarantined_by_deliveries, totals.quarantined_by_expiry),
        (1, 0, 0)
    );
    assert_eq!(old.state.counters(20).quarantined, 1);
}

// Goal: stored counts per principal are part of the checkpoint: a
// checkpoint taken after every event, restored and followed by the rest of
// the log, gives the live counts and runs; a checkpoint of version 2 (no
// stored section, written before attribution existed) restores with nothing
// attributed, and the log after it attributes as on the live path.
// Method: two principals' enqueues with their `Attributed` events, acks, a
// dead letter and a purge; snapshot at each event; then a version-2 rewrite.
#[test]
fn stored_counts_survive_checkpoint_and_replay() {
    use crate::queue::stored::{PrincipalId, Stored};
    let (alice, bob) = (PrincipalId(7), PrincipalId(8));
    let sized = |n: u64, size_bytes: u32| EnqueueRequest { size_bytes, ..request(n, 0) };
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    let attribute = |h: &mut Harness, first: Offset, count: u32, principal| {
        h.apply_all(&[Event::Attributed { offset: first, count, principal, at_ms: 0 }]);
    };
    let a: Vec<Offset> = (0..3).map(|n| h.enqueue_ok(0, sized(n, 100))).collect();
    attribute(&mut h, a[0], 3, alice);
    let b: Vec<Offset> = (10..12).map(|n| h.enqueue_ok(0, sized(n, 10))).collect();
    attribute(&mut h, b[0], 2, bob);
    h.enqueue_ok(0, sized(20, 1_000)); // anonymous: no event
    let claimed = h.claim(1_000, 1, 2, None);
    h.ack(1_100, &claimed[0]).unwrap();
    h.release(1_100, &claimed[1], 1, None).unwrap(); // dead-lettered: still stored
    let purged = h.state.purge(1_200, Lane::Main, 1, ALL_DURABLE);
    h.apply_all(&purged);
    let c = h.enqueue_ok(1_300, sized(30, 5));
    attribute(&mut h, c, 1, alice);
    let live = h.state.stored().clone();
    assert_eq!(live.stored(alice), Stored { messages: 2, bytes: 105 }, "one acked, one purged");
    assert_eq!(live.stored(bob), Stored { messages: 2, bytes: 20 });
    assert_eq!(live.iter().count(), 2, "the anonymous record counts for no one");
    let end = Offset(h.next_offset);
    let live_bytes = h.state.snapshot(end);

    let mut state = PartitionState::new(ctx(h.config.clone(), 1)).unwrap();
    for (i, event) in h.log.iter().enumerate() {
        let restored =
            PartitionState::restore(&state.snapshot(Offset(i as u64)), ctx(h.config.clone(), 1))
                .unwrap();
        let mut resumed = restored.state;
        for tail in &h.log[i..] {
            resumed.apply(tail).unwrap();
        }
        assert_eq!(resumed.stored(), &live, "checkpoint at event {i}");
        assert_eq!(resumed.snapshot(end), live_bytes, "checkpoint at event {i}");
        state.apply(event).unwrap();
    }

    // Version 2: the same bytes without the trailing section.
    let first_attribution =
        h.log.iter().position(|event| matches!(event, Event::Attributed { .. })).unwrap();
    let mut before = PartitionState::new(ctx(h.config.clone(), 1)).unwrap();
    for event in &h.log[..first_attribution] {
        before.apply(event).unwrap();
    }
    let bytes = before.snapshot(Offset(first_attribution as u64));
    let subs = before.config().bands() * 16 + 8 + 16;
    // (and version 7's lanes, 8 B)
    let mut body = bytes[..bytes.len() - 4 - subs - 16 - 8 - 13].to_vec();
    body[4..6].copy_from_slice(&2u16.to_le_bytes());
    // Version 3's dedupe section starts with `dead_through` (9 bytes) and
    // the count of generation references (8, here 0) before the inline list.
    let inline = 8 + before.dedupe.entries().count() * 32;
    let refs_at = body.len() - inline - 17;
    body.drain(refs_at..refs_at + 17);
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let mut old = PartitionState::restore(&body, ctx(h.config.clone(), 1)).unwrap().state;
    assert!(old.stored().is_empty());
    for event in &h.log[first_attribution..] {
        old.apply(event).unwrap();
    }
    assert_eq!(old.stored(), &live);
    // A version-2 snapshot that still carries bytes after its dedupe list
    // is refused (the section is read from version 3 on only).
    let mut trailing = bytes[..bytes.len() - 4].to_vec();
    trailing[4..6].copy_from_slice(&2u16.to_le_bytes());
    let crc = crc32c::crc32c(&trailing);
    trailing.extend_from_slice(&crc.to_le_bytes());
    assert!(PartitionState::restore(&trailing, ctx(h.config.clone(), 1)).is_err());
}

// Goal: restore refuses damaged snapshots. Method: flip a byte, truncate.
#[test]
fn corrupt_snapshot_is_refused() {
    let mut h = Harness::new(config());
    h.enqueue_ok(0, request(1, 0));
    let mut bytes = h.state.snapshot(Offset(1));
    let last = bytes.len() - 10;
    bytes[last] ^= 0x40;
    assert!(matches!(
        PartitionState::restore(&bytes, ctx(config(), 2)),
        Err(CodecError::Crc { .. })
    ));
    let bytes = h.state.snapshot(Offset(1));
    assert!(PartitionState::restore(&bytes[..bytes.len() - 1], ctx(config(), 2)).is_err());
    assert!(PartitionState::restore(&[], ctx(config(), 2)).is_err());
}

// Goal: a scheduled message becomes ready exactly at not_before, through a
// tick event, and a crash between "due" and "ready" loses nothing. Method:
// tick before/at the time; replay a log that stops before Readied.
#[test]
fn scheduled_message_becomes_ready_on_time_and_survives_a_crash() {
    let mut h = Harness::new(config());
    let offset = h.enqueue_ok(0, EnqueueRequest { not_before_ms: 5_000, ..request(1, 0) });
    assert_eq!(h.state.counters(0).scheduled, 1);
    assert_eq!(h.state.next_wakeup(), Some(5_000));
    assert!(h.tick(4_999).is_empty());
    assert!(h.claim(4_999, 1, 1, None).is_empty());
    // Crash: the log ends before any Readied; recovery still finds it due.
    h.restart();
    let events = h.tick(5_000);
    assert_eq!(
        events,
        vec![Event::Readied {
            sub: SubscriptionId::DEFAULT,
            offset,
            generation: Generation(0),
            at_ms: 5_000
        }]
    );
    let d = h.claim(5_000, 1, 1, None);
    assert_eq!(d[0].offset, offset);
}

// Goal: the backoff policy schedules releases without not_before: linear
// and exponential, capped; an explicit not_before wins. Method: release
// repeatedly and read the event's not_before.
#[test]
fn backoff_schedules_releases() {
    let cases = [
        (Backoff::Exponential { base_ms: 1_000, max_ms: 5_000 }, [1_000, 2_000, 4_000, 5_000]),
        (Backoff::Linear { step_ms: 1_500, max_ms: 4_000 }, [1_500, 3_000, 4_000, 4_000]),
        (Backoff::None, [0, 0, 0, 0]),
    ];
    for (backoff, delays) in cases {
        let mut h = Harness::new(QueueConfig { backoff, max_deliveries: 10, ..config() });
        let offset = h.enqueue_ok(0, request(1, 0));
        let mut now = 10;
        for delay in delays {
            let due = h.tick(now).is_empty();
            let _ = due;
            let d = h.claim(now, 1, 1, None);
            assert_eq!(d.len(), 1, "{backoff:?} at {now}");
            let event = h.release(now + 1, &d[0], 0, None).unwrap();
            assert_eq!(
                event,
                Event::Released {
                    sub: SubscriptionId::DEFAULT,
                    lane: Lane::Main,
                    offset,
                    generation: d[0].generation,
                    reason: ReleaseReason(0),
                    at_ms: now + 1,
                    not_before_ms: now + 1 + delay
                }
            );
            if delay > 0 {
                assert!(
                    h.claim(now + delay, 1, 1, None).is_empty(),
                    "not ready before backoff ends"
                );
            }
            now += 1 + delay;
        }
        h.tick(now);
        let d = h.claim(now, 1, 1, None)[0];
        let event = h.release(now, &d, 0, Some(now + 777)).unwrap();
        assert!(
            matches!(event, Event::Released { not_before_ms, .. } if not_before_ms == now + 777)
        );
    }
}

// Goal: claims honour credits and max_bytes, lease bounds, and credit limits.
// Method: ten 100-byte messages; ask with small budgets.
#[test]
fn claim_respects_credits_bytes_and_lease_bounds() {
    let mut h = Harness::new(config());
    for n in 0..10 {
        h.enqueue_ok(0, request(n, 0));
    }
    assert_eq!(h.claim(0, 1, 3, None).len(), 3);
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: 10,
        max_bytes: 250,
        lease_ms: None,
    };
    let decision = h.state.claim(0, &request, ALL_DURABLE).unwrap();
    assert_eq!(decision.deliveries.len(), 2);
    let lease = ClaimRequest { lease_ms: Some(60_001), ..request };
    assert!(matches!(
        h.state.claim(0, &lease, ALL_DURABLE),
        Err(QueueError::LeaseOutOfRange { .. })
    ));
    let credits = ClaimRequest { credits: 0, ..request };
    assert!(matches!(
        h.state.claim(0, &credits, ALL_DURABLE),
        Err(QueueError::CreditsOutOfRange { .. })
    ));
}

// Goal: the retention watermark is the oldest offset the state still needs.
// Method: ack from the front, then leave a claimed message behind.
#[test]
fn retention_watermark_follows_the_oldest_live_message() {
    let mut h = Harness::new(config());
    assert_eq!(h.state.retention_watermark(), None);
    let offsets: Vec<Offset> = (0..4).map(|n| h.enqueue_ok(0, request(n, 0))).collect();
    assert_eq!(h.state.retention_watermark(), Some(offsets[0]));
    let ds = h.claim(0, 1, 2, None);
    assert_eq!(h.state.retention_watermark(), Some(offsets[0]), "claimed is unacked");
    h.ack(1, &ds[1]).unwrap();
    assert_eq!(h.state.retention_watermark(), Some(offsets[0]));
    h.ack(1, &ds[0]).unwrap();
    assert_eq!(h.state.retention_watermark(), Some(offsets[2]));
}

// Goal: counters report each state and the oldest ready age. Method: one
// message in each state.
#[test]
fn counters_describe_each_state() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    h.enqueue_ok(100, request(1, 0));
    h.enqueue_ok(200, request(2, 0));
    h.enqueue_ok(300, request(3, 0));
    h.enqueue_ok(300, EnqueueRequest { not_before_ms: 9_000, ..request(4, 0) });
    let ds = h.claim(400, 1, 2, None);
    h.release(500, &ds[0], 1, None).unwrap();
    let c = h.state.counters(1_300);
    assert_eq!((c.ready, c.scheduled, c.claimed, c.quarantined), (1, 1, 1, 1));
    assert_eq!(c.oldest_ready_age_ms, Some(1_000));
    assert_eq!(c.live_messages, 3);
    assert_eq!(c.live_bytes, 300);
}

// Goal: every control event round-trips through its fixed-size encoding,
// and malformed records are refused. Method: encode/decode each kind; alter
// length, kind, lane and reserved bytes.
#[test]
fn events_round_trip_and_bad_records_are_refused() {
    let o = Offset(0x0102_0304_0506_0708);
    let g = Generation(77);
    let events = [
        Event::Claimed {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::DeadLetter,
            offset: o,
            generation: g,
            worker: WorkerId(5),
            claimed_at_ms: 1,
            deadline_ms: 2,
        },
        Event::Extended {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::Main,
            offset: o,
            generation: g,
            at_ms: 3,
            deadline_ms: 4,
        },
        Event::Acked {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::Main,
            offset: o,
            generation: g,
            at_ms: 5,
        },
        Event::Released {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::Main,
            offset: o,
            generation: g,
            reason: ReleaseReason(9),
            at_ms: 6,
            not_before_ms: 7,
        },
        Event::LeaseExpired {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::DeadLetter,
            offset: o,
            generation: g,
            at_ms: 8,
        },
        Event::Readied { sub: SubscriptionId::DEFAULT, offset: o, generation: g, at_ms: 9 },
        Event::Quarantined {
            sub: SubscriptionId::DEFAULT,
            offset: o,
            generation: g,
            cause: QuarantineCause::Expired,
            reason: ReleaseReason::EXPIRED,
            at_ms: 10,
        },
        Event::Expired { sub: SubscriptionId::DEFAULT, offset: o, generation: g, at_ms: 11 },
        Event::Redriven { sub: SubscriptionId::DEFAULT, offset: o, generation: g, at_ms: 12 },
        Event::Purged {
            sub: SubscriptionId::DEFAULT,
            lane: Lane::DeadLetter,
            offset: o,
            generation: g,
            at_ms: 13,
        },
        Event::Attributed {
            offset: o,
            count: 3,
            principal: crate::queue::stored::PrincipalId(0xFEED),
            at_ms: 14,
        },
        Event::TermStarted { term: 0x0A0B_0C0D_0E0F },
        Event::KeyMap { version: 3, partitions: 6, at_ms: 15 },
        Event::Membership { change: crate::queue::MembershipChange::Remove(7) },
    ];
    for event in events {
        let mut out = vec![0xAA];
        let written = event.encode(&mut out).unwrap();
        assert_eq!(written % 8, 0);
        assert_eq!(Event::decode(&out[1..]).unwrap(), event);
        assert!(Event::decode(&out[1..out.len() - 1]).is_err());
        let mut bad_kind = out[1..].to_vec();
        bad_kind[0] = 0;
        assert_eq!(Event::decode(&bad_kind), Err(CodecError::UnknownKind(0)));
        let mut bad_lane = out[1..].to_vec();
        bad_lane[1] = 9;
        assert!(Event::decode(&bad_lane).is_err());
    }
    let mut acked = Vec::new();
    events[2].encode(&mut acked).unwrap();
    acked[30] = 1; // unused time field
    assert_eq!(Event::decode(&acked), Err(CodecError::Reserved));
    // Attributed: a record count of 0 or the unknown principal is refused.
    let mut attributed = Vec::new();
    events[10].encode(&mut attributed).unwrap();
    assert_eq!(attributed[0], 11, "kind 11");
    let mut no_records = attributed.clone();
    no_records[4..8].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(Event::decode(&no_records), Err(CodecError::BadField("record count")));
    let mut no_one = attributed.clone();
    no_one[24..32].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(Event::decode(&no_one), Err(CodecError::BadField("principal")));
    // TermStarted: kind 12, the term alone; any other field set is refused.
    let mut started = Vec::new();
    events[11].encode(&mut started).unwrap();
    assert_eq!(started[0], 12, "kind 12");
    for at in [4, 8, 16] {
        let mut stray = started.clone();
        stray[at] = 1;
        assert_eq!(Event::decode(&stray), Err(CodecError::Reserved), "byte {at}");
    }
    // KeyMap: kind 13, version and partition count never 0, no offset.
    let mut key_map = Vec::new();
    events[12].encode(&mut key_map).unwrap();
    assert_eq!(key_map[0], 13, "kind 13");
    let mut stray = key_map.clone();
    stray[8] = 1;
    assert_eq!(Event::decode(&stray), Err(CodecError::Reserved));
    let mut no_partitions = key_map.clone();
    no_partitions[4..8].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(Event::decode(&no_partitions), Err(CodecError::BadField("key map")));
    let mut no_version = key_map.clone();
    no_version[24..32].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(Event::decode(&no_version), Err(CodecError::BadField("key map")));
    // Membership: kind 14, a known change of a node other than 0.
    let mut membership = Vec::new();
    events[13].encode(&mut membership).unwrap();
    assert_eq!(membership[0], 14, "kind 14");
    let mut unknown = membership.clone();
    unknown[2..4].copy_from_slice(&9u16.to_le_bytes());
    assert_eq!(Event::decode(&unknown), Err(CodecError::BadField("membership change")));
    let mut no_node = membership.clone();
    no_node[24..32].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(Event::decode(&no_node), Err(CodecError::BadField("membership change")));
    let meta = EnqueueMeta::new(&request(1, 0), Offset(1), 0);
    assert_eq!(Event::Enqueued(meta).encode(&mut Vec::new()), Err(CodecError::NotControl));
}

// Goal: token bytes round-trip and malformed tokens are refused; tokens for
// another queue or partition are invalid even with a good MAC.
#[test]
fn token_layout_round_trips() {
    let key = TokenKey::from_secret(&SECRET);
    let claim = TokenClaim {
        queue: QueueId(4),
        partition: PartitionId(1),
        sub: SubscriptionId::DEFAULT,
        lane: Lane::Main,
        offset: Offset(9),
        generation: Generation(2),
        epoch: LeaderEpoch(1),
        worker: WorkerId(3),
    };
    let token = key.sign(&claim);
    let parsed = DeliveryToken::from_bytes(&token.to_bytes()).unwrap();
    assert_eq!(parsed, token);
    assert!(key.verify(&parsed));
    assert!(DeliveryToken::from_bytes(&token.to_bytes()[1..]).is_err());
    let h = Harness::new(config());
    assert_eq!(h.state.ack(0, &token), Err(QueueError::InvalidToken(InvalidToken::WrongQueue)));
    let other = key.sign(&TokenClaim { queue: QueueId(3), partition: PartitionId(2), ..claim });
    assert_eq!(h.state.ack(0, &other), Err(QueueError::InvalidToken(InvalidToken::WrongPartition)));
    let unknown = key.sign(&TokenClaim { queue: QueueId(3), ..claim });
    assert_eq!(h.state.ack(0, &unknown), Err(QueueError::StaleToken(StaleToken::NotClaimed)));
}

// Goal: config validation names the bad field. Method: one bad field each.
#[test]
fn config_validation_is_typed() {
    let ok = QueueConfig::default();
    assert_eq!(ok.validate(), Ok(()));
    let bad = [
        (
            QueueConfig { band_weights: vec![1, 1, 1], ..ok.clone() },
            ConfigError::BandCount { bands: 3 },
        ),
        (
            QueueConfig { retry_weight: 0, ..ok.clone() },
            ConfigError::Weight { what: "retry", weight: 0 },
        ),
        (QueueConfig { max_deliveries: 0, ..ok.clone() }, ConfigError::MaxDeliveries),
        (QueueConfig { max_messages: 0, ..ok.clone() }, ConfigError::MaxMessages(0)),
    ];
    for (config, error) in bad {
        assert_eq!(config.validate(), Err(error));
    }
    let lease = QueueConfig { lease_max_ms: ok.max_lease_lifetime_ms + 1, ..ok };
    assert!(matches!(lease.validate(), Err(ConfigError::LeaseBounds { .. })));
}

// Goal: purge removes unclaimed messages only and counts them.
#[test]
fn purge_removes_unclaimed_messages() {
    let mut h = Harness::new(config());
    for n in 0..5 {
        h.enqueue_ok(0, request(n, (n % 4) as u8));
    }
    let claimed = h.claim(0, 1, 1, None)[0];
    let events = h.state.purge(1, Lane::Main, 100, ALL_DURABLE);
    assert_eq!(events.len(), 4);
    h.apply_all(&events);
    assert_eq!(h.state.counters(1).totals.purged, 4);
    h.ack(2, &claimed).unwrap();
    let _ = id(0);
}

// Goal: a mass expiry (more than one tick's worth) drains in bounded ticks
// and loses nothing. Method: 10 000 expiring messages across bands and
// chunks; tick until empty, checking each answer's size.
#[test]
fn mass_expiry_drains_in_bounded_ticks() {
    use super::super::limits::TICK_EVENTS_MAX;
    let config = QueueConfig { max_messages: 100_000, max_bytes: 1 << 40, ..config() };
    let mut state = PartitionState::new(ctx(config, 1)).unwrap();
    for n in 0..10_000u64 {
        let r = EnqueueRequest { expiry_ms: Some(1_000 + n % 7), ..request(n, (n % 4) as u8) };
        state.apply(&Event::Enqueued(EnqueueMeta::new(&r, Offset(n), 0))).unwrap();
    }
    let (mut calls, mut total) = (0, 0);
    loop {
        let events = state.tick(2_000, ALL_DURABLE);
        assert!(events.len() <= TICK_EVENTS_MAX);
        assert!(events.windows(2).all(|w| w[0].offset() < w[1].offset()));
        if events.is_empty() {
            break;
        }
        total += events.len();
        calls += 1;
        for event in &events {
            state.apply(event).unwrap();
        }
    }
    state.assert_invariants();
    assert_eq!(total, 10_000);
    assert_eq!(calls, 10_000usize.div_ceil(TICK_EVENTS_MAX));
    assert_eq!(state.counters(2_000).totals.expired, 10_000);
    assert_eq!(state.counters(2_000).live_messages, 0);
}

// Goal: decoding never panics on arbitrary bytes, and whatever decodes
// re-encodes to the same bytes (one encoding per event). Method: random
// records of every length around the two sizes.
#[test]
fn event_decode_is_total_and_canonical() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut decoded = 0;
    for _ in 0..200_000 {
        let len = if rng.random_bool(0.8) {
            [32, 40][rng.random_range(0..2)]
        } else {
            rng.random_range(0..48)
        };
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if len > 1 {
            bytes[0] = rng.random_range(0..12);
            bytes[1] = rng.random_range(0..3);
        }
        // Mostly-zero records reach the field checks more often.
        for b in bytes.iter_mut().skip(2) {
            if rng.random_bool(0.7) {
                *b = 0;
            }
        }
        if let Ok(event) = Event::decode(&bytes) {
            decoded += 1;
            let mut again = Vec::new();
            event.encode(&mut again).unwrap();
            assert_eq!(again, bytes);
        }
        let _ = DeliveryToken::from_bytes(&bytes);
    }
    assert!(decoded > 1_000, "the generator reaches valid records");
}

// Goal: restore never panics on damaged content that passes the crc (a bug
// or a hostile file), and what it accepts is a consistent state. Method:
// flip bytes of a busy snapshot, fix the crc, restore.
#[test]
fn restore_is_total_on_damaged_snapshots() {
    use rand::{Rng, SeedableRng};
    let mut h = Harness::new(QueueConfig { max_deliveries: 2, ..config() });
    for n in 0..150u64 {
        let expiry = (n % 3 == 0).then_some(90_000);
        h.enqueue_ok(
            n,
            EnqueueRequest {
                expiry_ms: expiry,
                not_before_ms: (n % 5) * 50,
                ..request(n, (n % 4) as u8)
            },
        );
    }
    h.tick(1_000);
    let ds = h.claim(1_000, 1, 60, None);
    for d in &ds[..30] {
        h.release(1_001, d, 4, None).unwrap();
    }
    h.claim(1_002, 2, 10, None);
    let good = h.state.snapshot(Offset(77));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut accepted = 0;
    for _ in 0..3_000 {
        let mut bytes = good.clone();
        let body = bytes.len() - 4;
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..body);
            bytes[at] ^= 1 << rng.random_range(0..8);
        }
        let crc = crc32c::crc32c(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
        if let Ok(restored) = PartitionState::restore(&bytes, ctx(config(), 2)) {
            accepted += 1;
            restored.state.assert_invariants();
        }
    }
    assert!(accepted > 0, "some flips land in values that stay valid");
}

// Goal: the oldest claim age is the age of the oldest claim still held,
// whatever its lease: an extension (a later deadline) keeps its claim time,
// a younger claim with an earlier deadline does not hide it, a dead-letter
// claim counts, and it survives a checkpoint and a replay. Method: claims
// at 1 s and 2 s with different leases; extend, release, ack; snapshot,
// restore and replay in between.
#[test]
fn oldest_claim_age_follows_the_oldest_held_claim() {
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    for n in 0..4 {
        h.enqueue_ok(0, request(n, 0));
    }
    assert_eq!(h.state.counters(500).oldest_claim_age_ms, None);
    let old = h.claim(1_000, 1, 2, Some(60_000));
    // A younger claim whose lease ends first (7 s against 61 s).
    let young = h.claim(2_000, 2, 1, Some(5_000));
    assert_eq!(h.state.counters(2_500).oldest_claim_age_ms, Some(1_500));
    let (event, _) = h.state.extend(2_600, &old[0].token, Some(60_000)).unwrap();
    h.apply_all(&[event]);
    assert_eq!(h.state.counters(3_000).oldest_claim_age_ms, Some(2_000), "extension keeps it");
    // A checkpoint and a full replay give the same oldest claim.
    let restored =
        PartitionState::restore(&h.state.snapshot(Offset(9)), ctx(h.config.clone(), 1)).unwrap();
    assert_eq!(restored.state.counters(3_000).oldest_claim_age_ms, Some(2_000));
    assert_eq!(h.replay(1).counters(3_000).oldest_claim_age_ms, Some(2_000));
    h.ack(3_000, &old[0]).unwrap();
    assert_eq!(h.state.counters(3_000).oldest_claim_age_ms, Some(2_000), "old[1] is held");
    // max_deliveries 1: the release dead-letters old[1]; the young claim
    // is now the oldest held.
    h.release(3_100, &old[1], 1, None).unwrap();
    assert_eq!(h.state.counters(3_500).oldest_claim_age_ms, Some(1_500));
    h.ack(3_500, &young[0]).unwrap();
    assert_eq!(h.state.counters(3_500).oldest_claim_age_ms, None);
    // A claim in the dead-letter lane counts too.
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(3),
        credits: 1,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let dead = h.state.claim_dead_letters(4_000, &request, ALL_DURABLE).unwrap();
    assert_eq!(dead.deliveries.len(), 1);
    h.apply_all(&dead.events);
    assert_eq!(h.state.counters(4_250).oldest_claim_age_ms, Some(250));
    h.state.assert_invariants();
}

// Goal: per-principal stored counts, fed by `PartitionState::leaving` read before
// each event, go down on an ack of either lane, an expiry and a purge, and
// stay on claims, releases and quarantine; the same events replayed on a
// fresh state give the same counts. Method: two principals' messages, one
// of each way out; then a replay of the log with the same attributions.
#[test]
fn stored_counts_follow_acks_expiry_and_purge() {
    use crate::queue::stored::{PrincipalId, Stored, StoredByPrincipal};
    fn step(h: &mut Harness, stored: &mut StoredByPrincipal, events: &[Event]) {
        for event in events {
            if let Some((offset, size)) = h.state.leaving(event) {
                stored.leave(offset, size);
            }
            h.apply_all(&[*event]);
        }
    }
    let (alice, bob) = (PrincipalId(1), PrincipalId(2));
    let mut h = Harness::new(QueueConfig { max_deliveries: 1, ..config() });
    let mut stored = StoredByPrincipal::default();
    let a: Vec<Offset> = (0..3).map(|n| h.enqueue_ok(0, request(n, 0))).collect();
    assert!(stored.attribute(a[0], &[100; 3], alice));
    let expiring = EnqueueRequest { expiry_ms: Some(5_000), ..request(10, 0) };
    let b = [h.enqueue_ok(0, expiring), h.enqueue_ok(0, request(11, 0))];
    assert!(stored.attribute(b[0], &[100; 2], bob));
    let attributed_after = h.log.len();
    let count = |messages: u64| Stored { messages, bytes: messages * 100 };
    assert_eq!((stored.stored(alice), stored.stored(bob)), (count(3), count(2)));

    // Claim alice's first two: nothing leaves. Ack one, release the other
    // (max_deliveries 1: dead-lettered, still stored).
    let claimed = h.claim(1_000, 1, 2, None);
    let ack = h.state.ack(1_100, &claimed[0].token).unwrap();
    step(&mut h, &mut stored, &[ack]);
    let release = h.state.release(1_100, &claimed[1].token, ReleaseReason(1), None).unwrap();
    step(&mut h, &mut stored, &[release]);
    assert_eq!(stored.stored(alice), count(2), "acked one; the dead letter is stored");
    // The dead letter claimed and acked: it leaves.
    let request = ClaimRequest {
        sub: SubscriptionId::DEFAULT,
        worker: WorkerId(2),
        credits: 1,
        max_bytes: u64::MAX,
        lease_ms: None,
    };
    let dead = h.state.claim_dead_letters(1_200, &request, ALL_DURABLE).unwrap();
    step(&mut h, &mut stored, &dead.events);
    let ack = h.state.ack(1_300, &dead.deliveries[0].token).unwrap();
    step(&mut h, &mut stored, &[ack]);
    assert_eq!(stored.stored(alice), count(1));
    // Bob's expiring message expires (no dead-lettering on expiry).
    let expired = h.state.tick(6_000, ALL_DURABLE);
    assert!(expired.iter().any(|event| matches!(event, Event::Expired { .. })));
    step(&mut h, &mut stored, &expired);
    assert_eq!(stored.stored(bob), count(1));
    // A purge takes the rest.
    let purged = h.state.purge(6_100, Lane::Main, 100, ALL_DURABLE);
    step(&mut h, &mut stored, &purged);
    assert_eq!(stored.iter().count(), 0, "nothing stored for anyone");
    stored.trim_below(h.state.retention_watermark());
    assert_eq!(stored.runs(), 0);

    // Replay: the same events and attributions on a fresh state.
    let mut replayed = PartitionState::new(ctx(h.config.clone(), 1)).unwrap();
    let mut again = StoredByPrincipal::default();
    for (index, event) in h.log.iter().enumerate() {
        if index == attributed_after {
            assert!(again.attribute(a[0], &[100; 3], alice));
            assert!(again.attribute(b[0], &[100; 2], bob));
            assert_eq!((again.stored(alice), again.stored(bob)), (count(3), count(2)));
        }
        if let Some((offset, size)) = replayed.leaving(event) {
            again.leave(offset, size);
        }
        replayed.apply(event).unwrap();
    }
    assert_eq!(again.iter().count(), 0);
}

// Goal: in a journal's replay an attribution can come before its records
// (the control lane is written ahead of queued data): its records count
// when they arrive, to the same counts and runs as in the live order; it
// never lets a principal's run grow over offsets not applied yet (an
// anonymous record may still land there); and an attribution whose records
// never arrive (a crash lost them, their offsets taken again later) is
// dropped, so the records that take its offsets count against no one.
// Method: one set of events applied in live order and in "attributions
// first" order, compare; then a lone attribution, the drop replay makes at
// its end or at an epoch change, and anonymous records at its offsets.
#[test]
fn an_attribution_ahead_of_its_records_counts_them_when_they_arrive() {
    use crate::queue::stored::{PrincipalId, Stored};
    let (alice, bob) = (PrincipalId(1), PrincipalId(2));
    let enqueued = |n: u64| Event::Enqueued(EnqueueMeta::new(&request(n, 0), Offset(n), 1_000 + n));
    let attributed = |offset: u64, count: u32, principal: PrincipalId| Event::Attributed {
        offset: Offset(offset),
        count,
        principal,
        at_ms: 1_000,
    };
    // Offsets 0-1 alice, 2 anonymous, 3 alice, 4 bob.
    let live = [
        enqueued(0),
        enqueued(1),
        attributed(0, 2, alice),
        enqueued(2),
        enqueued(3),
        attributed(3, 1, alice),
        enqueued(4),
        attributed(4, 1, bob),
    ];
    let journal = [
        attributed(0, 2, alice),
        attributed(3, 1, alice),
        attributed(4, 1, bob),
        enqueued(0),
        enqueued(1),
        enqueued(2),
        enqueued(3),
        enqueued(4),
    ];
    let fold = |events: &[Event]| {
        let mut h = Harness::new(config());
        for event in events {
            h.state.apply(event).unwrap();
        }
        assert_eq!(h.state.drop_pending_attributions(), 0, "every record arrived");
        h.state
    };
    let (live, journal) = (fold(&live), fold(&journal));
    let size = u64::from(request(0, 0).size_bytes);
    let count = |messages: u64| Stored { messages, bytes: messages * size };
    assert_eq!(journal.stored().stored(alice), count(3));
    assert_eq!(journal.stored().stored(bob), count(1));
    assert_eq!(journal.stored().principal_of(Offset(2)), None, "the anonymous record");
    assert_eq!(journal.stored(), live.stored());

    // Alice's records at 1-2 were lost; the next epoch appends anonymous
    // records there.
    let mut h = Harness::new(config());
    h.state.apply(&enqueued(0)).unwrap();
    h.state.apply(&attributed(1, 2, alice)).unwrap();
    assert_eq!(h.state.drop_pending_attributions(), 2);
    h.state.apply(&enqueued(1)).unwrap();
    h.state.apply(&enqueued(2)).unwrap();
    assert_eq!(h.state.stored().stored(alice), Stored::default());
    assert_eq!(h.state.stored().principal_of(Offset(1)), None);
}
