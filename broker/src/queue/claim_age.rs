//! `ClaimAges`: the live claims of a partition (both lanes) counted by
//! claim time, so the age of the oldest claim still held
//! (`spool_oldest_claim_age_seconds`, "claimed, not yet acked") is read
//! without a scan.
//!
//! The state's `claims` index is ordered by lease deadline, which leases of
//! different lengths and extensions make unrelated to claim time. This is a
//! multiset of claim times: one entry per distinct claim millisecond that
//! still has a live claim, with how many. A claim request hands out all its
//! deliveries at one `claimed_at_ms`, so a batch costs one entry; the worst
//! case (every live claim made in its own millisecond) is one entry per live
//! claim. Adding and removing are O(log n) in the entries, reading the
//! oldest O(log n) (the map's first key); an extension keeps the claim time,
//! so it does not touch this. Derived from the claims the state holds
//! (`PartitionState::insert_warm`/`take_main`/`insert_dead`/`take_dead`,
//! which restore goes through too), so it is neither logged nor part of a
//! checkpoint.

use std::collections::BTreeMap;

use super::types::Millis;

/// Live claims by claim time: claim time → how many.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ClaimAges {
    by_time: BTreeMap<Millis, u32>,
}

impl ClaimAges {
    /// One more live claim made at `claimed_at_ms`.
    pub(crate) fn add(&mut self, claimed_at_ms: Millis) {
        let count = self.by_time.entry(claimed_at_ms).or_insert(0);
        // Live claims are messages of one partition, far fewer than 2^32.
        *count = count.checked_add(1).expect("live claims of one claim time fit in u32");
    }

    /// A live claim made at `claimed_at_ms` ended (ack, release, expiry,
    /// quarantine, purge, fence).
    ///
    /// # Panics
    /// If no live claim of that time was counted: the caller's indexes and
    /// this one disagree.
    pub(crate) fn remove(&mut self, claimed_at_ms: Millis) {
        match self.by_time.get_mut(&claimed_at_ms) {
            Some(count) if *count > 1 => *count -= 1,
            Some(_) => {
                self.by_time.remove(&claimed_at_ms);
            }
            None => unreachable!("no live claim made at {claimed_at_ms}"),
        }
    }

    /// Claim time of the oldest live claim, if any.
    pub(crate) fn oldest(&self) -> Option<Millis> {
        self.by_time.first_key_value().map(|(time, _)| *time)
    }

    /// Live claims counted (for the invariant checks).
    pub(crate) fn len(&self) -> u64 {
        self.by_time.values().map(|count| u64::from(*count)).sum()
    }

    /// How many live claims were made at `claimed_at_ms` (for the invariant
    /// checks).
    pub(crate) fn count_at(&self, claimed_at_ms: Millis) -> u32 {
        self.by_time.get(&claimed_at_ms).copied().unwrap_or(0)
    }

    /// Distinct claim times with a live claim (for the invariant checks).
    pub(crate) fn times(&self) -> usize {
        self.by_time.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the oldest is the earliest claim time still counted, claims of
    // one time share an entry, and the oldest moves on only when the last
    // claim of its time ends, in whatever order claims end. Method: add,
    // remove out of order, read.
    #[test]
    fn oldest_follows_the_earliest_live_claim() {
        let mut ages = ClaimAges::default();
        assert_eq!(ages.oldest(), None);
        ages.add(200);
        ages.add(100);
        ages.add(100);
        ages.add(300);
        assert_eq!((ages.oldest(), ages.len(), ages.times()), (Some(100), 4, 3));
        ages.remove(200);
        ages.remove(100);
        assert_eq!(ages.oldest(), Some(100), "one claim of time 100 is still held");
        ages.remove(100);
        assert_eq!(ages.oldest(), Some(300));
        assert_eq!(ages.count_at(100), 0);
        ages.remove(300);
        assert_eq!((ages.oldest(), ages.len(), ages.times()), (None, 0, 0));
    }

    // Goal: removing a claim that was never added is caught, not absorbed.
    #[test]
    #[should_panic(expected = "no live claim")]
    fn removing_an_unknown_claim_panics() {
        ClaimAges::default().remove(5);
    }
}
