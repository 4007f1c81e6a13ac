//! Consumer pace: holds a shard's producers back while its consumers are
//! behind them.
//!
//! Owns one per-shard decision: may the next enqueue frame a connection
//! has buffered be handed over now, or must it wait? It does not read
//! frames, count time or wake anyone: the connection loop asks
//! ([`PaceState::decide`]) before it hands over an enqueue, the handler
//! tells it what claims delivered and enqueues carried, and time arrives as
//! an argument, so the whole rule is tested without an executor.
//!
//! Why: on a saturated machine a closed loop of producers and consumers
//! settled at claim+ack ≈ 0.3 × enqueue (`docs/design/consumer-pace.md`).
//! The shard answered a claim in under 0.05 ms; the claim's round trip was
//! 2 ms, spent in the consumer's own process and in the CPU that producer
//! work took beside it. Fair turns inside the shard (`admission`) cannot
//! give that time back; taking in less producer data can: a producer whose
//! enqueues are held has its window full and costs nothing, here or in its
//! own process, until consumers have caught up.
//!
//! The rule, while the shard is **paced**:
//! - every message a claim delivers earns `percent` / 100 enqueue credits
//!   (at most [`PACE_CREDIT_MESSAGES_MAX`] kept); every enqueued message
//!   spends one; an enqueue frame goes while the credit is positive (its
//!   messages may leave a debt, paid back by later claims);
//! - an enqueue frame is never held longer than [`PACE_HOLD_MAX`]: then it
//!   goes anyway (producers slow down, they never stop).
//!
//! The shard is paced only while both sides are behind, each seen within
//! [`PACE_WINDOW`]:
//! - **consumers are hungry**: a claim came back full (as many deliveries
//!   as it had credits: messages were ready and the consumer wanted more);
//!   a consumer whose claims come back short or that does not claim (busy
//!   handlers, none connected) never paces anyone, so a burst goes into the
//!   backlog at full speed, as the capacity model wants;
//! - **intake is saturated**: at least [`PACE_INTAKE_BYTES_MIN`] of enqueue
//!   frames were being handled at once (a producer with a deep window of
//!   large batches, not the few commits a moderate rate keeps in flight).
//!
//! Outside it nothing is held and nothing is charged: at moderate rates the
//! pace costs one comparison per enqueue frame.

use std::cell::RefCell;
use std::rc::Rc;
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::limits::{PACE_CREDIT_MESSAGES_MAX, PACE_HOLD_MAX, PACE_INTAKE_BYTES_MIN, PACE_WINDOW};

/// May a held (or new) enqueue frame go now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaceDecision {
    /// Hand it over.
    Go,
    /// Wait: for a claim to earn credit, or until the hold's bound.
    Hold,
}

/// What the pace did, for the shard's report (`spool_pace_*`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PaceStats {
    /// Enqueue frames held at least once.
    pub holds: u64,
    /// Time those frames were held, in µs.
    pub held_us: u64,
    /// Held frames that went because their hold reached [`PACE_HOLD_MAX`].
    pub hold_timeouts: u64,
    /// Enqueued messages charged to the credit (while paced).
    pub paced_messages: u64,
    /// Claims that came back full (consumers hungry).
    pub full_claims: u64,
}

/// The pace of one shard. See the module docs.
#[derive(Debug, Default)]
pub struct PaceState {
    /// Enqueue credit in messages; negative after a frame larger than it.
    credit_messages: i64,
    /// Until when consumers count as hungry (a full claim + the window).
    hungry_until: Option<Instant>,
    /// Until when intake counts as saturated.
    saturated_until: Option<Instant>,
    /// Bytes of enqueue frames being handled now.
    intake_bytes: usize,
    stats: PaceStats,
}

impl PaceState {
    /// Whether enqueues are paced at `now` with the setting `percent`
    /// (0: never).
    pub fn paced(&self, now: Instant, percent: u32) -> bool {
        let within = |until: Option<Instant>| until.is_some_and(|until| now <= until);
        percent > 0 && within(self.hungry_until) && within(self.saturated_until)
    }

    /// A claim asking for `credits` delivered `delivered` messages.
    pub fn claimed(&mut self, now: Instant, credits: u32, delivered: usize, percent: u32) {
        if credits > 0 && delivered >= credits as usize {
            self.hungry_until = Some(now + PACE_WINDOW);
            self.stats.full_claims += 1;
        }
        let earned = (delivered as u64).saturating_mul(u64::from(percent)) / 100;
        let earned = i64::try_from(earned).unwrap_or(i64::MAX);
        self.credit_messages =
            self.credit_messages.saturating_add(earned).min(PACE_CREDIT_MESSAGES_MAX);
    }

    /// An enqueue frame of `bytes` carrying `messages` starts being handled.
    pub fn intake_started(&mut self, now: Instant, bytes: usize, messages: usize, percent: u32) {
        self.intake_bytes = self.intake_bytes.saturating_add(bytes);
        if self.intake_bytes >= PACE_INTAKE_BYTES_MIN {
            self.saturated_until = Some(now + PACE_WINDOW);
        }
        if self.paced(now, percent) {
            let messages = i64::try_from(messages).unwrap_or(i64::MAX);
            self.credit_messages = self.credit_messages.saturating_sub(messages);
            self.stats.paced_messages += messages as u64;
        }
    }

    /// An enqueue frame of `bytes` is answered.
    pub fn intake_finished(&mut self, bytes: usize) {
        self.intake_bytes = self.intake_bytes.saturating_sub(bytes);
    }

    /// Whether an enqueue frame that has waited since `held_since` (`None`:
    /// it has not been held yet) may go at `now`. Counts holds when the
    /// frame goes.
    pub fn decide(
        &mut self,
        now: Instant,
        held_since: Option<Instant>,
        percent: u32,
    ) -> PaceDecision {
        let held_for = held_since.map(|since| now.saturating_duration_since(since));
        let go = |state: &mut PaceState, timed_out: bool| {
            if let Some(held_for) = held_for {
                state.stats.holds += 1;
                state.stats.held_us += u64::try_from(held_for.as_micros()).unwrap_or(u64::MAX);
                state.stats.hold_timeouts += u64::from(timed_out);
            }
            PaceDecision::Go
        };
        if !self.paced(now, percent) || self.credit_messages > 0 {
            return go(self, false);
        }
        if held_for.is_some_and(|held_for| held_for >= PACE_HOLD_MAX) {
            return go(self, true);
        }
        PaceDecision::Hold
    }

    /// How long a frame held since `held_since` may still wait at `now`.
    pub fn hold_left(now: Instant, held_since: Instant) -> Duration {
        PACE_HOLD_MAX.saturating_sub(now.saturating_duration_since(held_since))
    }

    pub fn stats(&self) -> PaceStats {
        self.stats
    }
}

/// The pace of this executor's shard, shared by its connections and its
/// handler: the [`PaceState`] plus the connection loops holding a frame,
/// woken when a claim earns credit. Reads no clock.
#[derive(Debug, Default)]
pub struct Pace {
    state: RefCell<PaceState>,
    held: RefCell<Vec<Waker>>,
}

thread_local! {
    static SHARD_PACE: Rc<Pace> = Rc::default();
}

impl Pace {
    /// The pace of this executor thread (one per shard).
    pub fn of_this_shard() -> Rc<Pace> {
        SHARD_PACE.with(Rc::clone)
    }

    /// See [`PaceState::claimed`]; wakes the held loops once credit is
    /// positive again.
    pub fn claimed(&self, now: Instant, credits: u32, delivered: usize, percent: u32) {
        let mut state = self.state.borrow_mut();
        state.claimed(now, credits, delivered, percent);
        if state.credit_messages > 0 {
            drop(state);
            for waker in self.held.borrow_mut().drain(..) {
                waker.wake();
            }
        }
    }

    /// See [`PaceState::intake_started`]; the returned guard finishes it.
    pub fn intake(
        self: &Rc<Self>,
        now: Instant,
        bytes: usize,
        messages: usize,
        percent: u32,
    ) -> IntakeGuard {
        self.state.borrow_mut().intake_started(now, bytes, messages, percent);
        IntakeGuard { pace: self.clone(), bytes }
    }

    /// See [`PaceState::decide`].
    pub fn decide(&self, now: Instant, held_since: Option<Instant>, percent: u32) -> PaceDecision {
        self.state.borrow_mut().decide(now, held_since, percent)
    }

    /// Resolves at the next claim that leaves credit (or at once if there
    /// is credit); the caller races it with the hold's bound.
    pub async fn credit(&self) {
        std::future::poll_fn(|cx| {
            if self.state.borrow().credit_messages > 0 {
                return std::task::Poll::Ready(());
            }
            let mut held = self.held.borrow_mut();
            // A loop polled again while it holds (a read came in) is
            // listed once.
            if !held.iter().any(|waker| waker.will_wake(cx.waker())) {
                held.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await;
    }

    pub fn stats(&self) -> PaceStats {
        self.state.borrow().stats()
    }
}

/// An enqueue being handled: its bytes count as intake until dropped.
#[derive(Debug)]
pub struct IntakeGuard {
    pace: Rc<Pace>,
    bytes: usize,
}

impl Drop for IntakeGuard {
    fn drop(&mut self) {
        self.pace.state.borrow_mut().intake_finished(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERCENT: u32 = 110;

    fn ms(base: Instant, millis: u64) -> Instant {
        base + Duration::from_millis(millis)
    }

    /// A shard where consumers are hungry and intake saturated at `now`,
    /// with no credit left.
    fn paced_at(now: Instant) -> PaceState {
        let mut pace = PaceState::default();
        pace.claimed(now, 64, 64, PERCENT);
        pace.intake_started(now, PACE_INTAKE_BYTES_MIN, 256, PERCENT);
        assert!(pace.paced(now, PERCENT));
        assert!(pace.credit_messages <= 0);
        pace
    }

    // Goal: with nobody hungry (no claims, or claims that come back short)
    // a saturating producer is never held: a burst goes into the backlog.
    // Method: saturate intake for a long stretch with short or no claims;
    // every decision is Go and nothing is charged.
    #[test]
    fn producers_are_never_held_while_consumers_are_idle_absent_or_caught_up() {
        let base = crate::clock::instant_now();
        let mut pace = PaceState::default();
        for step in 0..10_000u64 {
            let now = ms(base, step);
            if step % 7 == 0 {
                // A caught-up consumer: asked 64, got 3.
                pace.claimed(now, 64, 3, PERCENT);
            }
            pace.intake_started(now, PACE_INTAKE_BYTES_MIN, 256, PERCENT);
            assert_eq!(pace.decide(now, None, PERCENT), PaceDecision::Go);
            pace.intake_finished(PACE_INTAKE_BYTES_MIN);
        }
        assert_eq!(pace.stats().paced_messages, 0);
        assert_eq!(pace.stats().holds, 0);
    }

    // Goal: while paced, enqueued messages stay within percent / 100 of
    // the delivered ones (plus one frame and the credit cap), whatever the
    // producers offer. Method: a producer that offers a 256-message frame
    // every step and a consumer that claims 64 every fourth step; count
    // what each got over many steps.
    #[test]
    fn paced_intake_keeps_to_the_ratio_of_deliveries() {
        let base = crate::clock::instant_now();
        let mut pace = paced_at(base);
        let (mut enqueued, mut delivered) = (0u64, 0u64);
        let mut held_since = None;
        for step in 1..20_000u64 {
            let now = base + Duration::from_micros(step * 100);
            if step % 4 == 0 {
                pace.claimed(now, 64, 64, PERCENT);
                delivered += 64;
            }
            match pace.decide(now, held_since, PERCENT) {
                PaceDecision::Go => {
                    held_since = None;
                    pace.intake_started(now, PACE_INTAKE_BYTES_MIN, 256, PERCENT);
                    pace.intake_finished(PACE_INTAKE_BYTES_MIN);
                    enqueued += 256;
                }
                PaceDecision::Hold => {
                    held_since.get_or_insert(now);
                }
            }
        }
        let bound = delivered * u64::from(PERCENT) / 100 + 256 + PACE_CREDIT_MESSAGES_MAX as u64;
        assert!(enqueued <= bound, "enqueued {enqueued}, delivered {delivered}");
        assert!(enqueued * 100 >= delivered * 95, "producers still go: {enqueued} / {delivered}");
        assert_eq!(pace.stats().hold_timeouts, 0, "claims came often enough");
        assert!(pace.stats().holds > 0);
    }

    // Goal: a held producer is never held past the bound, even when no
    // claim ever earns credit again. Method: pace, then stop the claims;
    // hold one frame and step time until it goes.
    #[test]
    fn a_hold_ends_at_the_bound_when_no_claim_comes() {
        let base = crate::clock::instant_now();
        let mut pace = paced_at(base);
        let held_since = base;
        let mut now = base;
        while pace.decide(now, Some(held_since), PERCENT) == PaceDecision::Hold {
            assert!(now - held_since < PACE_HOLD_MAX, "held past the bound");
            now += Duration::from_micros(250);
        }
        assert!(now - held_since >= PACE_HOLD_MAX);
        assert_eq!(pace.stats().hold_timeouts, 1);
        assert_eq!(pace.stats().holds, 1);
        assert!(pace.stats().held_us >= PACE_HOLD_MAX.as_micros() as u64);
        assert_eq!(PaceState::hold_left(now, held_since), Duration::ZERO);
    }

    // Goal: the pace ends on its own once either side stops being behind
    // for a window, and a setting of 0 turns it off. Method: pace at t0,
    // then ask after the window with no new full claim / no saturation.
    #[test]
    fn the_pace_lapses_after_a_quiet_window_and_zero_turns_it_off() {
        let base = crate::clock::instant_now();
        let mut pace = paced_at(base);
        assert_eq!(pace.decide(base, None, PERCENT), PaceDecision::Hold);
        assert_eq!(pace.decide(base, None, 0), PaceDecision::Go, "0 turns it off");
        let later = base + PACE_WINDOW + Duration::from_millis(1);
        assert_eq!(pace.decide(later, None, PERCENT), PaceDecision::Go, "window passed");
        // Hungry again but intake below the bound (the frame ended): no pace.
        pace.intake_finished(PACE_INTAKE_BYTES_MIN);
        pace.claimed(later, 64, 64, PERCENT);
        assert!(!pace.paced(later, PERCENT));
    }
}
