//! Counted, rate-limited reports of work a shard refused.
//!
//! Owns one counter per rejection reason (a connection over the shard's
//! limit, a claim over its connection's or its partition's waiter bound, …)
//! and the log line that reports them: at most one line per reason per
//! [`REJECTION_LOG_INTERVAL_MS`], carrying the running total and how many
//! rejections were not logged since the previous line, so a flood of
//! refusals is visible without flooding the log. Time arrives as an
//! argument; the caller reads the clock.

use crate::limits::REJECTION_LOG_INTERVAL_MS;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// What a rejection looks like on a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectionLine {
    pub reason: &'static str,
    /// Rejections of this reason since the shard started, this one included.
    pub total: u64,
    /// Rejections of this reason since the previous line that were not
    /// logged.
    pub suppressed: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct ReasonState {
    total: u64,
    suppressed: u64,
    last_logged_ms: Option<u64>,
}

/// Rejection counters of one shard, per reason.
#[derive(Debug, Default)]
pub struct Rejections {
    reasons: RefCell<BTreeMap<&'static str, ReasonState>>,
}

impl Rejections {
    /// Counts one rejection of `reason` at `now_ms`; returns the line to log
    /// if none was logged for this reason in the last interval.
    pub fn count(&self, reason: &'static str, now_ms: u64) -> Option<RejectionLine> {
        let mut reasons = self.reasons.borrow_mut();
        let state = reasons.entry(reason).or_default();
        state.total += 1;
        let due = state
            .last_logged_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= REJECTION_LOG_INTERVAL_MS);
        if !due {
            state.suppressed += 1;
            return None;
        }
        let line = RejectionLine { reason, total: state.total, suppressed: state.suppressed };
        state.suppressed = 0;
        state.last_logged_ms = Some(now_ms);
        Some(line)
    }

    /// Counts one rejection now and logs it if due, with `detail` (the
    /// limit that was hit) on the line.
    pub fn record(&self, reason: &'static str, detail: &dyn std::fmt::Display) {
        if let Some(line) = self.count(reason, crate::clock::now_ms()) {
            tracing::warn!(
                reason = line.reason,
                total = line.total,
                suppressed_since_last = line.suppressed,
                "rejected: {detail}"
            );
        }
    }

    /// Rejections of `reason` so far.
    pub fn total(&self, reason: &str) -> u64 {
        self.reasons.borrow().get(reason).map_or(0, |state| state.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_per_interval_with_the_suppressed_count() {
        // Goal: a flood of one reason logs once per interval and says how
        // many it did not log; another reason is not held back by it.
        // Method: count at chosen times and compare the lines.
        let rejections = Rejections::default();
        let first = rejections.count("too_many_connections", 10_000);
        assert_eq!(
            first,
            Some(RejectionLine { reason: "too_many_connections", total: 1, suppressed: 0 })
        );
        for at in 10_001..10_100 {
            assert_eq!(rejections.count("too_many_connections", at), None);
        }
        assert!(rejections.count("claim_waiters_per_connection", 10_100).is_some());
        assert_eq!(rejections.count("too_many_connections", 10_999), None);
        let next = rejections.count("too_many_connections", 11_000);
        assert_eq!(
            next,
            Some(RejectionLine { reason: "too_many_connections", total: 102, suppressed: 100 })
        );
        assert_eq!(rejections.total("too_many_connections"), 102);
        assert_eq!(rejections.total("claim_waiters_per_connection"), 1);
    }
}
