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
        self.warm.assert_invariants();
        assert!(self.band_ready.len() == self.fresh.len());
        assert!(self.credits.raw().len() == self.fresh.len() + 1);
        for fresh in &self.fresh {
            fresh.assert_invariants();
        }
        // Every fresh offset is in exactly one band, never in warm or dlq.
        let mut seen = BTreeSet::new();
        for fresh in &self.fresh {
            for view in fresh.iter() {
                assert!(seen.insert(view.offset));
                assert!(!self.warm.contains_key(&view.offset));
                assert!(!self.dlq.contains_key(&view.offset));
                assert!(self.highest_enqueued.is_some_and(|h| view.offset <= h));
                assert!(view.expiry_ms >= view.enqueue_time_ms);
            }
        }
        let (mut ready, mut retry, mut scheduled, mut claims, mut expiry) = (0, 0, 0, 0, 0);
        // Live claims by claim time, to check `claim_ages` against.
        let mut claim_times: BTreeMap<u64, u32> = BTreeMap::new();
        let mut bytes = 0u64;
        for (&offset, warm) in self.warm.iter() {
            assert!(!self.dlq.contains_key(&offset));
            assert!(usize::from(warm.priority) < self.fresh.len());
            bytes += u64::from(warm.size_bytes);
            match warm.phase {
                WarmPhase::Scheduled { due_ms } => {
                    assert!(self.scheduled.contains(&(due_ms.min(warm.expiry_ms), offset)));
                    scheduled += 1;
                }
                WarmPhase::Ready { since_ms } => {
                    if warm.expiry_ms != NEVER {
                        assert!(self.warm_expiry.contains(&(warm.expiry_ms, offset)));
                        expiry += 1;
                    }
                    if warm.attempts == 0 {
                        assert!(self.band_ready[usize::from(warm.priority)]
                            .contains(&(since_ms, offset)));
                        ready += 1;
                    } else {
                        assert!(self.retry.contains(&(since_ms, offset)));
                        retry += 1;
                    }
                }
                WarmPhase::Claimed(claim) => {
                    assert!(warm.generation.0 > 0);
                    assert!(self.claims.contains(&(claim.deadline_ms(), offset)));
                    // The config's lifetime cap may shrink across restarts; the
                    // absolute limit may not.
                    assert!(claim.deadline_ms() - claim.claimed_at_ms <= LEASE_LIFETIME_MS_MAX);
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(bytes == self.warm_bytes);
        assert!(ready == self.band_ready.iter().map(BTreeSet::len).sum::<usize>());
        assert!(retry == self.retry.len());
        assert!(scheduled == self.scheduled.len());
        assert!(expiry == self.warm_expiry.len());
        let mut dead_ready = 0;
        let mut dead_bytes = 0u64;
        for (&offset, dead) in &self.dlq {
            dead_bytes += u64::from(dead.size_bytes);
            match dead.phase {
                DeadPhase::Ready { since_ms } => {
                    assert!(self.dlq_ready.contains(&(since_ms, offset)));
                    dead_ready += 1;
                }
                DeadPhase::Claimed(claim) => {
                    assert!(self.claims.contains(&(claim.deadline_ms(), offset)));
                    *claim_times.entry(claim.claimed_at_ms).or_default() += 1;
                    claims += 1;
                }
            }
        }
        assert!(dead_ready == self.dlq_ready.len());
        assert!(dead_bytes == self.dlq_bytes);
        assert!(claims == self.claims.len());
        assert!(self.claim_ages.len() == claims as u64);
        assert!(self.claim_ages.times() == claim_times.len());
        for (time, count) in &claim_times {
            assert!(self.claim_ages.count_at(*time) == *count);
        }
        assert!(self.claim_ages.oldest() == claim_times.keys().next().copied());
        self.dedupe.assert_invariants();
    }
}
