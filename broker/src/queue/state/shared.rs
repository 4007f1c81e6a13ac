//! The shared never-claimed index and the subscriptions over it
//! (`docs/design/subscriptions.md` §3).
//!
//! `fresh[band]` holds each ready, never-claimed record once, whatever
//! number of subscriptions still have it to deliver. A record is *fresh for*
//! subscription `s` when it is live in `fresh`, at or above `s`'s cursor of
//! its band, and not in `s`'s skipped set. A subscription that takes its
//! front entry (the common case: claims go in band order) moves its cursor;
//! one that takes an entry deeper in (a purge, an expiry, another band's
//! promotion) records it as skipped. An entry no subscription has fresh any
//! more leaves `fresh` (and every skipped set), so with one subscription the
//! index behaves, and costs, exactly as a plain per-band FIFO.
//!
//! Everything else a subscription holds (claimed, scheduled, retried and
//! dead-lettered messages) is its own (`Delivery::warm`, `Delivery::dlq`).

use super::{DeadLetter, DeadPhase, Held, MainMessage, PartitionState, Warm, WarmPhase};
use crate::queue::fresh::{FreshView, NEVER};
use crate::queue::types::{Generation, Offset, ReleaseReason};

impl PartitionState {
    /// Whether a live shared entry of `band` at `offset` is fresh for
    /// subscription index `s`.
    pub(crate) fn fresh_for(&self, s: usize, band: usize, offset: Offset) -> bool {
        let d = &self.subs[s];
        offset >= d.cursors[band] && !d.skipped[band].contains(&offset)
    }

    /// The entries of `band` fresh for subscription index `s`, in offset
    /// order. O(log chunks) to the first; skipped entries are stepped over.
    pub(crate) fn fresh_iter(&self, s: usize, band: usize) -> impl Iterator<Item = FreshView> + '_ {
        let d = &self.subs[s];
        let after = d.cursors[band].0.checked_sub(1).map(Offset);
        self.fresh[band]
            .iter_after(after)
            .filter(move |view| !d.skipped[band].contains(&view.offset))
    }

    /// A record fresh for subscription index `s`, with its band.
    pub(crate) fn fresh_get(&self, s: usize, offset: Offset) -> Option<(usize, FreshView)> {
        self.fresh.iter().enumerate().find_map(|(band, fresh)| {
            fresh.get(offset).filter(|_| self.fresh_for(s, band, offset)).map(|view| (band, view))
        })
    }

    /// Whether any subscription other than index `s` still holds the
    /// message at `offset` (fresh, warm or dead-lettered), or the queue's
    /// retention window does (its shared entry stays once `s` let go).
    pub(crate) fn held_by_other(&self, s: usize, offset: Offset) -> bool {
        if self.config.has_window() && self.fresh.iter().any(|band| band.get(offset).is_some()) {
            return true;
        }
        (0..self.subs.len()).filter(|&t| t != s).any(|t| {
            let d = &self.subs[t];
            d.warm.contains_key(&offset)
                || d.dlq.contains_key(&offset)
                || self.fresh.iter().enumerate().any(|(band, fresh)| {
                    fresh.get(offset).is_some() && self.fresh_for(t, band, offset)
                })
        })
    }

    /// A message held by subscription index `s` leaves it for good (ack,
    /// expiry, purge, the subscription's end): it leaves the held counts
    /// unless another subscription still holds it. Call after `s` let go.
    pub(crate) fn left(&mut self, s: usize, offset: Offset, size_bytes: u32) {
        if !self.held_by_other(s, offset) {
            self.held.messages -= 1;
            self.held.bytes -= u64::from(size_bytes);
        }
    }

    /// Takes a record out of subscription index `s`'s fresh set (it must be
    /// fresh for `s`): the shared entry leaves when no other subscription
    /// has it fresh and the queue has no retention window (`window.rs`),
    /// else `s`'s cursor moves past it or `s` skips it.
    fn take_fresh(&mut self, s: usize, band: usize, offset: Offset) -> FreshView {
        let keep = self.config.has_window()
            || (0..self.subs.len()).any(|t| t != s && self.fresh_for(t, band, offset));
        let front = self.fresh_iter(s, band).next().map(|view| view.offset);
        let view = if keep {
            let view = self.fresh[band].get(offset).expect("fresh for the subscription");
            if front == Some(offset) {
                let d = &mut self.subs[s];
                d.cursors[band] = Offset(offset.0 + 1);
                // Marks below the cursor are implied by it.
                d.skipped[band] = d.skipped[band].split_off(&d.cursors[band]);
                // Skipped entries the cursor now reaches need no mark.
                loop {
                    let cursor = self.subs[s].cursors[band];
                    let next = self.fresh[band]
                        .iter_after(cursor.0.checked_sub(1).map(Offset))
                        .next()
                        .map(|view| view.offset);
                    match next {
                        Some(next) if self.subs[s].skipped[band].remove(&next) => {
                            self.subs[s].cursors[band] = Offset(next.0 + 1);
                        }
                        _ => break,
                    }
                }
            } else {
                assert!(self.subs[s].skipped[band].insert(offset));
            }
            view
        } else {
            let view = self.fresh[band].remove(offset).expect("fresh for the subscription");
            for d in &mut self.subs {
                if !d.skipped[band].is_empty() {
                    d.skipped[band].remove(&offset);
                }
            }
            view
        };
        let d = &mut self.subs[s];
        d.fresh_len[band] -= 1;
        d.fresh_bytes[band] -= u64::from(view.size_bytes);
        view
    }

    /// Finds a main-lane message of subscription index `s` without
    /// changing anything.
    pub(crate) fn main_message(&self, s: usize, offset: Offset) -> Option<MainMessage> {
        if let Some(warm) = self.subs[s].warm.get(&offset) {
            return Some(MainMessage { warm: *warm });
        }
        self.fresh_get(s, offset)
            .map(|(band, view)| MainMessage { warm: Self::warm_from_fresh(&view, band) })
    }

    pub(crate) fn warm_from_fresh(view: &FreshView, band: usize) -> Warm {
        Warm {
            enqueue_time_ms: view.enqueue_time_ms,
            expiry_ms: view.expiry_ms,
            size_bytes: view.size_bytes,
            // Bands are at most PRIORITY_BANDS_MAX (a u8).
            priority: band as u8,
            attempts: 0,
            generation: Generation(0),
            last_reason: ReleaseReason::NONE,
            phase: WarmPhase::Ready { since_ms: view.enqueue_time_ms },
        }
    }

    /// Removes a main-lane message from every structure of subscription
    /// index `s` that holds it.
    pub(crate) fn take_main(&mut self, s: usize, offset: Offset) -> Option<MainMessage> {
        self.note(offset);
        let d = &mut self.subs[s];
        if let Some(warm) = d.warm.remove(&offset) {
            d.warm_bytes -= u64::from(warm.size_bytes);
            match warm.phase {
                // In no claim index (`ordered.rs`).
                WarmPhase::Waiting { .. } => {}
                WarmPhase::Scheduled { due_ms } => {
                    assert!(d.scheduled.remove(&(due_ms.min(warm.expiry_ms), offset)));
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(d.warm_expiry.remove(&(warm.expiry_ms, offset)));
                    }
                    let set = if warm.attempts == 0 {
                        &mut d.band_ready[usize::from(warm.priority)]
                    } else {
                        &mut d.retry
                    };
                    assert!(set.remove(&(since_ms, offset)));
                }
                WarmPhase::Claimed(claim) => {
                    assert!(d.claims.remove(&(claim.deadline_ms(), offset)));
                    d.claim_ages.remove(claim.claimed_at_ms);
                }
            }
            return Some(MainMessage { warm });
        }
        let (band, _) = self.fresh_get(s, offset)?;
        let view = self.take_fresh(s, band, offset);
        Some(MainMessage { warm: Self::warm_from_fresh(&view, band) })
    }

    /// Puts a main-lane message into subscription index `s`'s `warm` and
    /// its phase index.
    pub(crate) fn insert_warm(&mut self, s: usize, offset: Offset, warm: Warm) {
        self.note(offset);
        assert!(usize::from(warm.priority) < self.fresh.len());
        let d = &mut self.subs[s];
        match warm.phase {
            WarmPhase::Waiting { .. } => {}
            WarmPhase::Scheduled { due_ms } => {
                assert!(d.scheduled.insert((due_ms.min(warm.expiry_ms), offset)));
            }
            WarmPhase::Ready { since_ms } => {
                if warm.expiry_ms != NEVER {
                    assert!(d.warm_expiry.insert((warm.expiry_ms, offset)));
                }
                let set = if warm.attempts == 0 {
                    &mut d.band_ready[usize::from(warm.priority)]
                } else {
                    &mut d.retry
                };
                assert!(set.insert((since_ms, offset)));
            }
            WarmPhase::Claimed(claim) => {
                assert!(d.claims.insert((claim.deadline_ms(), offset)));
                d.claim_ages.add(claim.claimed_at_ms);
            }
        }
        d.warm_bytes += u64::from(warm.size_bytes);
        assert!(d.warm.insert(offset, warm).is_none());
    }

    pub(crate) fn take_dead(&mut self, s: usize, offset: Offset) -> Option<DeadLetter> {
        self.note(offset);
        let d = &mut self.subs[s];
        let dead = d.dlq.remove(&offset)?;
        d.dlq_bytes -= u64::from(dead.size_bytes);
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(d.dlq_ready.remove(&(since_ms, offset))),
            DeadPhase::Claimed(claim) => {
                assert!(d.claims.remove(&(claim.deadline_ms(), offset)));
                d.claim_ages.remove(claim.claimed_at_ms);
            }
        }
        Some(dead)
    }

    pub(crate) fn insert_dead(&mut self, s: usize, offset: Offset, dead: DeadLetter) {
        self.note(offset);
        let d = &mut self.subs[s];
        match dead.phase {
            DeadPhase::Ready { since_ms } => assert!(d.dlq_ready.insert((since_ms, offset))),
            DeadPhase::Claimed(claim) => {
                assert!(d.claims.insert((claim.deadline_ms(), offset)));
                d.claim_ages.add(claim.claimed_at_ms);
            }
        }
        d.dlq_bytes += u64::from(dead.size_bytes);
        assert!(d.dlq.insert(offset, dead).is_none());
    }

    /// Inserts a fresh (never claimed, ready) message for every
    /// subscription whose cursor of its band it is at or above; used by
    /// apply and restore. Returns whether any subscription took it.
    pub(crate) fn insert_fresh(&mut self, band: usize, view: FreshView) -> bool {
        let mut taken = false;
        for d in &mut self.subs {
            if view.offset >= d.cursors[band] {
                d.fresh_len[band] += 1;
                d.fresh_bytes[band] += u64::from(view.size_bytes);
                taken = true;
            }
        }
        if taken {
            self.note(view.offset);
            self.fresh[band].push(view);
            self.held.messages += 1;
            self.held.bytes += u64::from(view.size_bytes);
        }
        taken
    }

    /// Inserts a warm message of subscription index `s`; used by restore
    /// (which then recounts the held messages and fresh counts).
    pub(crate) fn restore_warm(&mut self, s: usize, offset: Offset, warm: Warm) {
        self.insert_warm(s, offset, warm);
    }

    /// Inserts a dead letter of subscription index `s`; used by restore.
    pub(crate) fn restore_dead(&mut self, s: usize, offset: Offset, dead: DeadLetter) {
        self.insert_dead(s, offset, dead);
    }

    /// Counts every subscription's fresh entries and bytes per band again
    /// from the shared index and its cursors and marks (restore, where the
    /// marks arrive after the entries). O(entries × subscriptions).
    pub(crate) fn recount_fresh(&mut self) {
        for s in 0..self.subs.len() {
            for band in 0..self.fresh.len() {
                let (mut count, mut bytes) = (0u64, 0u64);
                for view in self.fresh_iter(s, band) {
                    count += 1;
                    bytes += u64::from(view.size_bytes);
                }
                self.subs[s].fresh_len[band] = count;
                self.subs[s].fresh_bytes[band] = bytes;
            }
        }
    }

    /// Counts the held messages again: every shared entry once, then every
    /// warm entry and dead letter of any subscription not counted yet
    /// (restore). O(messages × log(messages)) with several subscriptions
    /// or a retention window (a retained entry may also be a warm one).
    pub(crate) fn recount_held(&mut self) {
        let mut held = Held::default();
        let several = self.subs.len() > 1 || self.config.has_window();
        let mut seen = std::collections::BTreeSet::new();
        for view in self.fresh.iter().flat_map(|band| band.iter()) {
            held.messages += 1;
            held.bytes += u64::from(view.size_bytes);
            if several {
                seen.insert(view.offset);
            }
        }
        for d in &self.subs {
            let warm = d.warm.iter().map(|(&offset, warm)| (offset, warm.size_bytes));
            let dead = d.dlq.iter().map(|(&offset, dead)| (offset, dead.size_bytes));
            for (offset, size) in warm.chain(dead) {
                if !several || seen.insert(offset) {
                    held.messages += 1;
                    held.bytes += u64::from(size);
                }
            }
        }
        self.held = held;
    }
}
