//! `assert_invariants`: every index agrees with the messages it indexes (the
//! model tests call it after each step).

use std::collections::{BTreeMap, BTreeSet};

use super::{DeadPhase, PartitionState, WarmPhase};
use crate::queue::fresh::NEVER;
use crate::queue::limits::LEASE_LIFETIME_MS_MAX;
use crate::queue::types::SubscriptionId;

impl PartitionState {
    /// Read-only consistency check of every structure against the others.
    /// Called after every step in tests; cheap enough for debug assertions.
    pub fn assert_invariants(&self) {
        assert!(self.fresh.len() == self.config.bands());
        assert!(!self.subs.is_empty() && self.subs[0].id == SubscriptionId::DEFAULT);
        assert!(self.subs.windows(2).all(|pair| pair[0].id < pair[1].id));
        for fresh in &self.fresh {
            fresh.assert_invariants();
        }
        // Every shared offset is in exactly one band and, without a
        // retention window, fresh for at least one subscription.
        let mut seen = BTreeSet::new();
        let window = self.config.has_window();
        for (band, fresh) in self.fresh.iter().enumerate() {
            for view in fresh.iter() {
                assert!(seen.insert(view.offset));
                assert!(window || self.fresh_for_any(band, view.offset));
                assert!(self.highest_enqueued.is_some_and(|h| view.offset <= h));
                assert!(view.expiry_ms >= view.enqueue_time_ms);
            }
        }
        for s in 0..self.subs.len() {
            self.assert_delivery(s);
        }
        let held = self.held;
        let mut recounted = std::collections::BTreeMap::new();
        for (band, fresh) in self.fresh.iter().enumerate() {
            let _ = band;
            for view in fresh.iter() {
                recounted.insert(view.offset, view.size_bytes);
            }
        }
        for d in &self.subs {
            recounted.extend(d.warm.iter().map(|(&offset, warm)| (offset, warm.size_bytes)));
            recounted.extend(d.dlq.iter().map(|(&offset, dead)| (offset, dead.size_bytes)));
        }
        assert!(held.messages == recounted.len() as u64);
        assert!(held.bytes == recounted.values().map(|&size| u64::from(size)).sum::<u64>());
        self.dedupe.assert_invariants();
    }

    /// The invariants of subscription index `s`'s delivery state.
    fn assert_delivery(&self, s: usize) {
        let d = &self.subs[s];
        d.warm.assert_invariants();
        assert!(d.losses.len() <= crate::queue::limits::LOSS_REPORTS_MAX);
        assert!(d.losses.iter().map(|loss| loss.count).sum::<u64>() <= d.totals.lost);
        assert!(d.losses.iter().all(|loss| loss.from <= loss.to && loss.count > 0));
        assert!(d.band_ready.len() == self.fresh.len());
        assert!(d.credits.raw().len() == self.fresh.len() + 1);
        assert!(d.cursors.len() == self.fresh.len() && d.skipped.len() == self.fresh.len());
        for (band, fresh) in self.fresh.iter().enumerate() {
            // Skipped marks are at or above the cursor, on live entries.
            for &offset in &d.skipped[band] {
                assert!(offset >= d.cursors[band]);
                assert!(fresh.get(offset).is_some());
            }
            let (mut count, mut bytes) = (0u64, 0u64);
            for view in self.fresh_iter(s, band) {
                assert!(!d.warm.contains_key(&view.offset));
                assert!(!d.dlq.contains_key(&view.offset));
                count += 1;
                bytes += u64::from(view.size_bytes);
            }
            assert!(count == d.fresh_len[band] && bytes == d.fresh_bytes[band]);
        }
        let (mut ready, mut retry, mut scheduled, mut claims, mut expiry) = (0, 0, 0, 0, 0);
        let mut waiting_count = 0usize;
        // Live claims by claim time, to check `claim_ages` against.
        let mut claim_times: BTreeMap<u64, u32> = BTreeMap::new();
        let mut bytes = 0u64;
        for (&offset, warm) in d.warm.iter() {
            assert!(!d.dlq.contains_key(&offset));
            assert!(usize::from(warm.priority) < self.fresh.len());
            bytes += u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Waiting { key, .. } => {
                    // Behind a head of its key, in no claim index.
                    let lanes = d.lanes.as_ref().expect("a waiting message in an ordered sub");
                    assert!(lanes.is_waiting(key, offset));
                    // Only an arrival waits, so it was never claimed.
                    assert!(warm.generation.0 == 0 && warm.attempts == 0);
                    waiting_count += 1;
                }
                WarmPhase::Scheduled { due_ms } => {
                    assert!(d.scheduled.contains(&(due_ms.min(warm.expiry_ms), offset)));
                    scheduled += 1;
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(d.warm_expiry.contains(&(warm.expiry_ms, offset)));
                        expiry += 1;
                    }
                    if warm.attempts == 0 {
                        assert!(
                            d.band_ready[usize::from(warm.priority)].contains(&(since_ms, offset))
                        );
                        ready += 1;
                    } else {
                        assert!(d.retry.contains(&(since_ms, offset)));
                        retry += 1;
                    }
                }
                WarmPhase::Claimed(claim) => {
                    assert!(warm.generation.0 > 0);
                    assert!(d.claims.contains(&(claim.deadline_ms(), offset)));
                    // The config's lifetime cap may shrink across restarts; the
                    // absolute limit may not.
                    assert!(claim.deadline_ms() - claim.claimed_at_ms <= LEASE_LIFETIME_MS_MAX);
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(bytes == d.warm_bytes);
        if let Some(lanes) = &d.lanes {
            lanes.check().unwrap_or_else(|error| panic!("lanes: {error}"));
            assert!(waiting_count == lanes.waiting());
            // Every head is a live main-lane message of this subscription,
            // not itself waiting.
            for (head, _) in lanes.heads() {
                let main = self.main_message(s, head).expect("a head is held");
                assert!(!matches!(main.warm.phase, WarmPhase::Waiting { .. }));
            }
        } else {
            assert!(waiting_count == 0);
        }
        assert!(ready == d.band_ready.iter().map(BTreeSet::len).sum::<usize>());
        assert!(retry == d.retry.len());
        assert!(scheduled == d.scheduled.len());
        assert!(expiry == d.warm_expiry.len());
        let mut dead_ready = 0;
        let mut dead_bytes = 0u64;
        for (&offset, dead) in &d.dlq {
            dead_bytes += u64::from(dead.size_bytes);
            match dead.phase {
                DeadPhase::Ready { since_ms } => {
                    assert!(d.dlq_ready.contains(&(since_ms, offset)));
                    dead_ready += 1;
                }
                DeadPhase::Claimed(claim) => {
                    assert!(d.claims.contains(&(claim.deadline_ms(), offset)));
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(dead_ready == d.dlq_ready.len());
        assert!(dead_bytes == d.dlq_bytes);
        assert!(claims == d.claims.len());
        assert!(d.claim_ages.len() == claims as u64);
        assert!(d.claim_ages.times() == claim_times.len());
        for (time, count) in &claim_times {
            assert!(d.claim_ages.count_at(*time) == *count);
        }
        assert!(d.claim_ages.oldest() == claim_times.keys().next().copied());
    }
}
