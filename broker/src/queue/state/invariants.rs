//! `assert_invariants`: every index agrees with the messages it indexes (the
//! model tests call it after each step).

use std::collections::{BTreeMap, BTreeSet};

use super::{DeadPhase, PartitionState, WarmPhase};
use crate::queue::fresh::NEVER;
use crate::queue::limits::LEASE_LIFETIME_MS_MAX;

impl PartitionState {
    /// Read-only consistency check of every structure against the others.
    /// Called after every step in tests; cheap enough for debug assertions.
    pub fn assert_invariants(&self) {
        assert!(self.fresh.len() == self.config.bands());
        self.sub.warm.assert_invariants();
        assert!(self.sub.band_ready.len() == self.fresh.len());
        assert!(self.sub.credits.raw().len() == self.fresh.len() + 1);
        for fresh in &self.fresh {
            fresh.assert_invariants();
        }
        // Every fresh offset is in exactly one band, never in warm or dlq.
        let mut seen = BTreeSet::new();
        for fresh in &self.fresh {
            for view in fresh.iter() {
                assert!(seen.insert(view.offset));
                assert!(!self.sub.warm.contains_key(&view.offset));
                assert!(!self.sub.dlq.contains_key(&view.offset));
                assert!(self.highest_enqueued.is_some_and(|h| view.offset <= h));
                assert!(view.expiry_ms >= view.enqueue_time_ms);
            }
        }
        let (mut ready, mut retry, mut scheduled, mut claims, mut expiry) = (0, 0, 0, 0, 0);
        // Live claims by claim time, to check `claim_ages` against.
        let mut claim_times: BTreeMap<u64, u32> = BTreeMap::new();
        let mut bytes = 0u64;
        for (&offset, warm) in self.sub.warm.iter() {
            assert!(!self.sub.dlq.contains_key(&offset));
            assert!(usize::from(warm.priority) < self.fresh.len());
            bytes += u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Scheduled { due_ms } => {
                    assert!(self.sub.scheduled.contains(&(due_ms.min(warm.expiry_ms), offset)));
                    scheduled += 1;
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(self.sub.warm_expiry.contains(&(warm.expiry_ms, offset)));
                        expiry += 1;
                    }
                    if warm.attempts == 0 {
                        assert!(self.sub.band_ready[usize::from(warm.priority)]
                            .contains(&(since_ms, offset)));
                        ready += 1;
                    } else {
                        assert!(self.sub.retry.contains(&(since_ms, offset)));
                        retry += 1;
                    }
                }
                WarmPhase::Claimed(claim) => {
                    assert!(warm.generation.0 > 0);
                    assert!(self.sub.claims.contains(&(claim.deadline_ms(), offset)));
                    // The config's lifetime cap may shrink across restarts; the
                    // absolute limit may not.
                    assert!(claim.deadline_ms() - claim.claimed_at_ms <= LEASE_LIFETIME_MS_MAX);
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(bytes == self.sub.warm_bytes);
        assert!(ready == self.sub.band_ready.iter().map(BTreeSet::len).sum::<usize>());
        assert!(retry == self.sub.retry.len());
        assert!(scheduled == self.sub.scheduled.len());
        assert!(expiry == self.sub.warm_expiry.len());
        let mut dead_ready = 0;
        let mut dead_bytes = 0u64;
        for (&offset, dead) in &self.sub.dlq {
            dead_bytes += u64::from(dead.size_bytes);
            match dead.phase {
                DeadPhase::Ready { since_ms } => {
                    assert!(self.sub.dlq_ready.contains(&(since_ms, offset)));
                    dead_ready += 1;
                }
                DeadPhase::Claimed(claim) => {
                    assert!(self.sub.claims.contains(&(claim.deadline_ms(), offset)));
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(dead_ready == self.sub.dlq_ready.len());
        assert!(dead_bytes == self.sub.dlq_bytes);
        assert!(claims == self.sub.claims.len());
        assert!(self.sub.claim_ages.len() == claims as u64);
        assert!(self.sub.claim_ages.times() == claim_times.len());
        for (time, count) in &claim_times {
            assert!(self.sub.claim_ages.count_at(*time) == *count);
        }
        assert!(self.sub.claim_ages.oldest() == claim_times.keys().next().copied());
        self.dedupe.assert_invariants();
    }
}
