//! Decisions no client asks for: what time does (`tick`: lease expiries,
//! scheduled messages becoming ready, message expiries; `next_wakeup` for
//! the shard's timer) and what a new leader epoch does to the claims left
//! from the old one (`fence`, at open).
//!
//! Changes nothing and reads no clock (`now` is an argument). A tick must
//! decide only on records below the durable watermark it is given; a tick
//! or a fence answers at most a bounded number of events (the caller
//! applies them and asks again while the answer is full).

use std::collections::BTreeSet;

use crate::queue::event::Event;
use crate::queue::fresh::NEVER;
use crate::queue::limits::TICK_EVENTS_MAX;
use crate::queue::state::{DeadPhase, PartitionState, WarmPhase};
use crate::queue::types::{Lane, Millis, Offset, QuarantineCause, ReleaseReason};

impl PartitionState {
    /// The epoch fence: what opening the partition under a new leader
    /// epoch does to every claim still outstanding after replay. Those
    /// claims were made under an older epoch (open bumps the epoch before
    /// anything is issued), so no token can ack, extend or release them any
    /// more; each ends at once as a release with reason
    /// [`ReleaseReason::EPOCH_FENCED`] would at `now`: ready again now (no
    /// backoff), attempts + 1 (its `Claimed` event is durable, so the
    /// delivery happened), quarantined when that was attempt
    /// `max_deliveries`, expired (or quarantined, per config) when its
    /// expiry has passed; a dead letter is simply ready again. At most
    /// `limit` events, in offset order; the caller applies them and asks
    /// again while the answer is full.
    ///
    /// Every subscription's claims, by subscription then offset.
    pub fn fence(&self, now: Millis, limit: usize) -> Vec<Event> {
        let mut out = Vec::new();
        for s in 0..self.subs.len() {
            if out.len() >= limit {
                break;
            }
            let mut offsets: Vec<Offset> =
                self.subs[s].claims.iter().map(|&(_, offset)| offset).collect();
            offsets.sort_unstable();
            let room = limit - out.len();
            out.extend(
                offsets
                    .into_iter()
                    .take(room)
                    .filter_map(|offset| self.fence_event(s, offset, now)),
            );
        }
        out
    }

    fn fence_event(&self, s: usize, offset: Offset, now: Millis) -> Option<Event> {
        let reason = ReleaseReason::EPOCH_FENCED;
        let sub = self.subs[s].id;
        if let Some(dead) = self.subs[s].dlq.get(&offset) {
            return matches!(dead.phase, DeadPhase::Claimed(_)).then_some(Event::Released {
                sub,
                lane: Lane::DeadLetter,
                offset,
                generation: dead.generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            });
        }
        let message = self.main_message(s, offset)?.warm;
        if !matches!(message.phase, WarmPhase::Claimed(_)) {
            return None;
        }
        let generation = message.generation;
        Some(if message.expiry_ms <= now {
            self.expiry_event(s, offset, generation, now)
        } else if message.attempts.saturating_add(1) >= self.config.max_deliveries {
            Event::Quarantined {
                sub,
                offset,
                generation,
                cause: QuarantineCause::Deliveries,
                reason,
                at_ms: now,
            }
        } else {
            Event::Released {
                sub,
                lane: Lane::Main,
                offset,
                generation,
                reason,
                at_ms: now,
                not_before_ms: now,
            }
        })
    }

    /// What time does to one message at `now`, if anything.
    fn tick_event(&self, s: usize, offset: Offset, now: Millis) -> Option<Event> {
        let sub = self.subs[s].id;
        if let Some(dead) = self.subs[s].dlq.get(&offset) {
            return match dead.phase {
                DeadPhase::Claimed(claim) if claim.deadline_ms() <= now => {
                    Some(Event::LeaseExpired {
                        sub,
                        lane: Lane::DeadLetter,
                        offset,
                        generation: dead.generation,
                        at_ms: now,
                    })
                }
                _ => None,
            };
        }
        let message = self.main_message(s, offset)?.warm;
        let expired = message.expiry_ms <= now;
        let generation = message.generation;
        match message.phase {
            WarmPhase::Claimed(claim) => {
                if claim.deadline_ms() > now {
                    None
                } else if expired {
                    Some(self.expiry_event(s, offset, generation, now))
                } else if message.attempts.saturating_add(1) >= self.config.max_deliveries {
                    Some(Event::Quarantined {
                        sub,
                        offset,
                        generation,
                        cause: QuarantineCause::Deliveries,
                        reason: ReleaseReason::LEASE_EXPIRED,
                        at_ms: now,
                    })
                } else {
                    Some(Event::LeaseExpired {
                        sub,
                        lane: Lane::Main,
                        offset,
                        generation,
                        at_ms: now,
                    })
                }
            }
            _ if expired => Some(self.expiry_event(s, offset, generation, now)),
            WarmPhase::Scheduled { due_ms } if due_ms <= now => {
                Some(Event::Readied { sub, offset, generation, at_ms: now })
            }
            _ => None,
        }
    }

    /// Everything time has made due at `now`: lease expiries, scheduled
    /// messages becoming ready, message expiries, and last the queue's
    /// retention window passing (`state/window.rs`). At most one event per
    /// message and at most `TICK_EVENTS_MAX`, in offset order; when more are
    /// due, each source contributes its earliest `TICK_EVENTS_MAX` and the
    /// caller ticks again (after applying) while the answer is full, so a
    /// mass expiry costs bounded work per call. Because readiness is derived
    /// from the log this way, a crash between "due" and "ready" loses
    /// nothing: the next tick after recovery finds the same message due.
    ///
    /// `durable_end` as for [`PartitionState::claim`]: a tick decides only on
    /// records below it. The expiry (or quarantine on expiry) or readiness of
    /// a message whose enqueue is not yet durable waits for its sync (the
    /// next tick after it finds it due), so every event a tick returns names
    /// a durable record and may be written ahead of data appended before it
    /// (the shard journal's control lane, `docs/design/shard-journal.md`
    /// §12). Claimed messages and dead letters are durable already.
    ///
    /// Every subscription's, by subscription (each finds the expiry of a
    /// shared record it still has to deliver on its own): the bound holds
    /// for the whole answer.
    pub fn tick(&self, now: Millis, durable_end: Offset) -> Vec<Event> {
        let mut out = Vec::new();
        let mut expired = Vec::new();
        for band in 0..self.fresh.len() {
            self.fresh[band].expired(now, durable_end, TICK_EVENTS_MAX, &mut expired);
        }
        for s in 0..self.subs.len() {
            if out.len() >= TICK_EVENTS_MAX {
                break;
            }
            out.extend(self.tick_sub(s, now, durable_end, &expired));
        }
        out.truncate(TICK_EVENTS_MAX);
        // Last: the subscriptions' own events name entries the window may
        // drop, and apply in this order.
        out.extend(self.window_event(now, durable_end, &expired));
        out
    }

    fn tick_sub(
        &self,
        s: usize,
        now: Millis,
        durable_end: Offset,
        expired: &[crate::queue::fresh::FreshView],
    ) -> Vec<Event> {
        let due = ..=(now, Offset(u64::MAX));
        let durable = |&(_, offset): &(Millis, Offset)| (offset < durable_end).then_some(offset);
        let mut candidates = BTreeSet::new();
        // Every candidate below yields an event: claims past their deadline,
        // scheduled messages past min(due, expiry), ready ones past expiry.
        // Records not yet durable are passed over before the bound, so they
        // never hide durable ones behind them; there are at most as many as
        // appended records awaiting their sync.
        let d = &self.subs[s];
        candidates.extend(d.claims.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        candidates.extend(d.scheduled.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        candidates.extend(d.warm_expiry.range(due).filter_map(durable).take(TICK_EVENTS_MAX));
        // Shared records past their expiry that this subscription still
        // has to deliver (`tick_event` finds them fresh for it or not).
        candidates.extend(expired.iter().map(|v| v.offset));
        candidates
            .into_iter()
            .filter_map(|offset| self.tick_event(s, offset, now))
            .take(TICK_EVENTS_MAX)
            .collect()
    }

    /// The earliest time at which `tick` will have something to do, for the
    /// shard's timer. `None`: nothing is pending on time.
    pub fn next_wakeup(&self) -> Option<Millis> {
        let subs = self.subs.iter().flat_map(|d| {
            let claims = d.claims.first().map(|&(t, _)| t);
            let scheduled = d.scheduled.first().map(|&(t, _)| t);
            // Claimed messages' expiry only matters at their lease end,
            // which `claims` covers; a stale earlier wake-up is harmless.
            let warm = d.warm_expiry.first().map(|&(t, _)| t);
            [claims, scheduled, warm].into_iter().flatten()
        });
        let fresh = self.fresh.iter().map(|f| f.min_expiry_ms()).filter(|&t| t != NEVER);
        subs.chain(fresh).chain(self.window_wakeup()).min()
    }
}
