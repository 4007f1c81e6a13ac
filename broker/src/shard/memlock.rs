//! RLIMIT_MEMLOCK for glommio executors.
//!
//! Owns one start-up check: every glommio executor registers and pins I/O
//! memory and refuses to start below 512 KiB of RLIMIT_MEMLOCK (ARCHITECTURE.md, "Platform notes").
//! We raise the soft limit to 512 KiB per executor when the hard limit (or
//! root) allows it, and otherwise fail before any executor starts, with a
//! message that says what to change. The decision is a pure function
//! ([`plan`]) so it is tested without touching the process limits.

use crate::limits::MEMLOCK_BYTES_PER_EXECUTOR;
use thiserror::Error;

/// The limit is too low and cannot be raised.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemlockError {
    #[error(
        "RLIMIT_MEMLOCK is {soft_bytes} bytes (hard {hard_bytes}); {executors} glommio executors \
         need {required_bytes} bytes and the limit cannot be raised: run `ulimit -l {}` \
         (KiB) before spoold, or set LimitMEMLOCK= in its systemd unit",
        required_bytes.div_ceil(1024)
    )]
    TooLow { soft_bytes: u64, hard_bytes: u64, required_bytes: u64, executors: usize },
    #[error("getrlimit(RLIMIT_MEMLOCK) failed: {0}")]
    Query(String),
}

/// What to do about the current limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemlockPlan {
    /// The soft limit already suffices.
    Enough,
    /// Set soft (and hard, if it is lower) to these values.
    Raise { soft_bytes: u64, hard_bytes: u64 },
}

/// Decides how to reach `required_bytes`. `u64::MAX` stands for unlimited.
/// Raising the hard limit is planned too: it succeeds for root
/// (CAP_SYS_RESOURCE) and fails with EPERM otherwise, which [`ensure`]
/// reports as [`MemlockError::TooLow`].
pub fn plan(soft_bytes: u64, hard_bytes: u64, required_bytes: u64) -> MemlockPlan {
    if soft_bytes >= required_bytes {
        return MemlockPlan::Enough;
    }
    MemlockPlan::Raise { soft_bytes: required_bytes, hard_bytes: hard_bytes.max(required_bytes) }
}

fn limit_to_u64(limit: libc::rlim_t) -> u64 {
    if limit == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        limit
    }
}

fn u64_to_limit(value: u64) -> libc::rlim_t {
    if value == u64::MAX {
        libc::RLIM_INFINITY
    } else {
        value
    }
}

/// Makes sure `executors` glommio executors can start; returns the soft
/// limit in force afterwards.
///
/// # Errors
/// [`MemlockError::TooLow`] if the limit is too low and cannot be raised.
pub fn ensure(executors: usize) -> Result<u64, MemlockError> {
    let required_bytes = MEMLOCK_BYTES_PER_EXECUTOR * executors as u64;
    let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut current) };
    if rc != 0 {
        return Err(MemlockError::Query(std::io::Error::last_os_error().to_string()));
    }
    let soft_bytes = limit_to_u64(current.rlim_cur);
    let hard_bytes = limit_to_u64(current.rlim_max);
    match plan(soft_bytes, hard_bytes, required_bytes) {
        MemlockPlan::Enough => Ok(soft_bytes),
        MemlockPlan::Raise { soft_bytes: new_soft, hard_bytes: new_hard } => {
            let wanted =
                libc::rlimit { rlim_cur: u64_to_limit(new_soft), rlim_max: u64_to_limit(new_hard) };
            // SAFETY: setrlimit reads one rlimit from the struct we pass.
            let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &wanted) };
            if rc != 0 {
                return Err(MemlockError::TooLow {
                    soft_bytes,
                    hard_bytes,
                    required_bytes,
                    executors,
                });
            }
            tracing::info!(from_bytes = soft_bytes, to_bytes = new_soft, "raised RLIMIT_MEMLOCK");
            Ok(new_soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the plan raises only when needed and never lowers the hard limit.
    // Method: table of (soft, hard, required) cases.
    #[test]
    fn plan_raises_only_when_needed() {
        let kib = 1024;
        assert_eq!(plan(8192 * kib, 8192 * kib, 1536 * kib), MemlockPlan::Enough);
        assert_eq!(plan(u64::MAX, u64::MAX, 1536 * kib), MemlockPlan::Enough);
        assert_eq!(
            plan(64 * kib, 8192 * kib, 1536 * kib),
            MemlockPlan::Raise { soft_bytes: 1536 * kib, hard_bytes: 8192 * kib }
        );
        assert_eq!(
            plan(64 * kib, 64 * kib, 1536 * kib),
            MemlockPlan::Raise { soft_bytes: 1536 * kib, hard_bytes: 1536 * kib }
        );
    }

    // Goal: the error tells the operator the exact ulimit to set. Method:
    // format an error for 3 executors.
    #[test]
    fn error_names_the_fix() {
        let error = MemlockError::TooLow {
            soft_bytes: 65_536,
            hard_bytes: 65_536,
            required_bytes: 3 * MEMLOCK_BYTES_PER_EXECUTOR,
            executors: 3,
        };
        let text = error.to_string();
        assert!(text.contains("ulimit -l 1536"), "{text}");
        assert!(text.contains("3 glommio executors"), "{text}");
    }

    // Goal: ensure() succeeds in this environment and leaves at least the
    // required soft limit. Method: call it, read the limit back.
    #[test]
    fn ensure_leaves_enough_memlock() {
        let soft = ensure(2).unwrap();
        assert!(soft >= 2 * MEMLOCK_BYTES_PER_EXECUTOR);
        let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into our struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut current) }, 0);
        assert!(limit_to_u64(current.rlim_cur) >= 2 * MEMLOCK_BYTES_PER_EXECUTOR);
    }
}
