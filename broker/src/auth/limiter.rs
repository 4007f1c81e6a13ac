//! The failed-login limiter: after [`AUTH_FAILURES_MAX`] refused logins
//! from one source IP within [`AUTH_FAILURE_WINDOW`], that address is locked
//! out for one window from the failure that reached the bound. While it is,
//! its attempts are refused at once, before any argon2 runs, so a guesser
//! gets five tries per window instead of as many as the CPU allows.
//!
//! Each shard keeps its own table (in `server::auth`), and the admin port
//! one for bearer tokens: an address is counted per shard port it tries,
//! not across them (no state shared between cores). A table remembers at
//! most [`AUTH_FAILURE_TABLE_MAX`] addresses; past it the address whose
//! last failure is oldest is forgotten (after the ones whose window and
//! lockout have both passed). A success does not clear an address's
//! failures: one valid secret must not buy a guesser more tries.
//!
//! Pure: the caller passes the time (milliseconds on the broker clock).

pub use crate::limits::{AUTH_FAILURES_MAX, AUTH_FAILURE_TABLE_MAX, AUTH_FAILURE_WINDOW};
use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;

/// One address's recent failures.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the current counting window began.
    window_start_ms: u64,
    /// Failures in the current window.
    failures: u32,
    /// Attempts are refused until then.
    locked_until_ms: u64,
    /// The last failure (what eviction orders by).
    last_ms: u64,
}

/// An address is locked out: its attempt is refused without verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedOut {
    /// Milliseconds until attempts are verified again.
    pub retry_after_ms: u64,
}

impl LockedOut {
    /// The refusal's message (no principal, no secret).
    pub fn message(&self) -> String {
        format!(
            "too many failed attempts from this address ({AUTH_FAILURES_MAX} within {} s): \
             refused without verification; retry in {} s",
            AUTH_FAILURE_WINDOW.as_secs(),
            self.retry_after_ms.div_ceil(1000).max(1)
        )
    }
}

/// Failed logins by source address, bounded.
#[derive(Debug)]
pub struct FailureLimiter {
    entries: HashMap<IpAddr, Entry>,
    failures_max: u32,
    window_ms: u64,
    table_max: usize,
}

impl Default for FailureLimiter {
    fn default() -> Self {
        let window_ms = u64::try_from(AUTH_FAILURE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        Self::new(AUTH_FAILURES_MAX, window_ms, AUTH_FAILURE_TABLE_MAX)
    }
}

impl FailureLimiter {
    /// A limiter with its own bounds (tests); brokers use `default()`.
    pub fn new(failures_max: u32, window_ms: u64, table_max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            failures_max: failures_max.max(1),
            window_ms: window_ms.max(1),
            table_max: table_max.max(1),
        }
    }

    /// Whether an attempt from `ip` at `now_ms` may be verified.
    ///
    /// # Errors
    /// [`LockedOut`] while the address is locked out.
    pub fn check(&self, ip: IpAddr, now_ms: u64) -> Result<(), LockedOut> {
        match self.entries.get(&ip) {
            Some(entry) if entry.locked_until_ms > now_ms => {
                Err(LockedOut { retry_after_ms: entry.locked_until_ms - now_ms })
            }
            _ => Ok(()),
        }
    }

    /// Counts a refused login from `ip`; returns whether the address is now
    /// locked out.
    pub fn record_failure(&mut self, ip: IpAddr, now_ms: u64) -> bool {
        if !self.entries.contains_key(&ip) && self.entries.len() >= self.table_max {
            self.evict(now_ms);
        }
        let window_ms = self.window_ms;
        let entry = self.entries.entry(ip).or_insert(Entry {
            window_start_ms: now_ms,
            failures: 0,
            locked_until_ms: 0,
            last_ms: now_ms,
        });
        if now_ms >= entry.window_start_ms.saturating_add(window_ms) {
            entry.window_start_ms = now_ms;
            entry.failures = 0;
        }
        entry.failures = entry.failures.saturating_add(1);
        entry.last_ms = now_ms;
        if entry.failures >= self.failures_max {
            entry.locked_until_ms = now_ms.saturating_add(window_ms);
            entry.window_start_ms = now_ms;
            entry.failures = 0;
            return true;
        }
        false
    }

    /// Addresses remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no address is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Makes room for one address: forgets every address whose window and
    /// lockout have passed, else the one not locked out whose last failure
    /// is oldest, else the oldest of all.
    fn evict(&mut self, now_ms: u64) {
        let window_ms = self.window_ms;
        self.entries.retain(|_, entry| {
            entry.locked_until_ms > now_ms
                || now_ms < entry.window_start_ms.saturating_add(window_ms)
        });
        if self.entries.len() < self.table_max {
            return;
        }
        // A locked-out address goes last: flooding the table from other
        // addresses must not lift a lockout early.
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(_, entry)| (entry.locked_until_ms > now_ms, entry.last_ms))
            .map(|(ip, _)| *ip);
        if let Some(ip) = oldest {
            self.entries.remove(&ip);
        }
    }
}

thread_local! {
    /// Attempts this executor refused because their address was locked out.
    static LOCKOUTS: Cell<u64> = const { Cell::new(0) };
}

/// Counts one attempt refused for a lockout on this executor.
pub fn count_lockout() {
    LOCKOUTS.with(|count| count.set(count.get() + 1));
}

/// This executor's lockout refusals so far.
pub fn lockouts() -> u64 {
    LOCKOUTS.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    // Goal: the bound-th failure in a window locks the address out for one
    // window from that failure, other addresses are untouched, and the
    // lockout ends when the window passes. Method: a 3-per-1000 ms limiter
    // driven by hand-set times.
    #[test]
    fn locks_out_after_the_bound_until_the_window_passes() {
        let mut limiter = FailureLimiter::new(3, 1000, 16);
        assert!(!limiter.record_failure(ip(1), 0));
        assert!(!limiter.record_failure(ip(1), 10));
        assert_eq!(limiter.check(ip(1), 20), Ok(()));
        assert!(limiter.record_failure(ip(1), 500));
        assert_eq!(limiter.check(ip(1), 500), Err(LockedOut { retry_after_ms: 1000 }));
        assert_eq!(limiter.check(ip(1), 1499), Err(LockedOut { retry_after_ms: 1 }));
        assert_eq!(limiter.check(ip(2), 600), Ok(()), "another address is not locked");
        assert_eq!(limiter.check(ip(1), 1500), Ok(()), "the lockout ends with its window");
        let message = LockedOut { retry_after_ms: 1 }.message();
        assert!(message.contains("too many failed attempts"), "{message}");
    }

    // Goal: failures spread wider than the window never lock out.
    #[test]
    fn failures_in_different_windows_do_not_add_up() {
        let mut limiter = FailureLimiter::new(3, 1000, 16);
        for round in 0..10u64 {
            assert!(!limiter.record_failure(ip(1), round * 600));
        }
        assert_eq!(limiter.check(ip(1), 6000), Ok(()));
    }

    // Goal: the table never holds more than its bound; it forgets expired
    // addresses first, then the unlocked one whose last failure is oldest,
    // so a locked-out address survives a flood of new ones.
    #[test]
    fn the_table_is_bounded_and_evicts_the_oldest() {
        let mut limiter = FailureLimiter::new(2, 1000, 3);
        assert!(!limiter.record_failure(ip(1), 0));
        assert!(limiter.record_failure(ip(1), 1));
        assert!(!limiter.record_failure(ip(2), 5));
        assert!(!limiter.record_failure(ip(3), 6));
        assert!(!limiter.record_failure(ip(4), 7));
        assert_eq!(limiter.len(), 3);
        assert!(limiter.check(ip(1), 8).is_err(), "the locked-out address is kept");
        // ip 2 went (oldest unlocked): its next failure is its first again.
        assert!(!limiter.record_failure(ip(2), 9));
        assert_eq!(limiter.len(), 3);
        for last in 10..=200u8 {
            limiter.record_failure(ip(last), 500 + u64::from(last));
            assert!(limiter.len() <= 3);
            assert!(limiter.check(ip(1), 500 + u64::from(last)).is_err());
        }
        // Past every window, the expired addresses are dropped first.
        limiter.record_failure(ip(250), 10_000);
        assert_eq!(limiter.len(), 1);
    }

    #[test]
    fn lockouts_count_per_executor() {
        let before = lockouts();
        count_lockout();
        assert_eq!(lockouts(), before + 1);
    }
}
