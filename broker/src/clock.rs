//! The one place that reads time.
//!
//! Everything else takes `now` as an argument (a [`Millis`] or an
//! [`Instant`] handed in), so the queue and the log run under a simulated
//! clock in tests. clippy's `disallowed-methods` enforces this.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (wall clock): the broker's one time
/// unit, for timestamps that leave the process and for every deadline the
/// queue state machine keeps. A plain number with `_ms` names, not a
/// newtype: arithmetic on it is everywhere.
pub type Millis = u64;

/// Wall-clock now, in milliseconds since the Unix epoch. A clock before 1970
/// reads as 0 rather than failing: timestamps are informational.
#[allow(clippy::disallowed_methods)]
pub fn now_ms() -> Millis {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

/// A monotonic instant, for measuring durations (latency, deadlines).
pub use std::time::Instant;

/// Monotonic now.
#[allow(clippy::disallowed_methods)]
pub fn instant_now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_forward() {
        // Goal: both clocks read something plausible and the monotonic one never goes back.
        let start = instant_now();
        assert!(now_ms() > 1_600_000_000_000);
        assert!(instant_now() >= start);
    }
}
