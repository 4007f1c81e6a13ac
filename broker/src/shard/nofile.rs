//! RLIMIT_NOFILE at start.
//!
//! Owns one start-up step: the soft limit on open files is raised to the
//! hard limit, and both are logged. A shard keeps one journal whatever its
//! partition count, but it holds a descriptor per connection (up to
//! `connections_per_shard_max`), per journal file and per side file being
//! written, and the common soft default of 1,024 is far below what a
//! broker with several shards may need, while the hard limit is usually
//! far above. The decision is a pure function ([`plan`]) so it is tested
//! without touching the process limits; a failure to raise is logged, not
//! fatal (the broker still serves within the soft limit, and every open
//! that fails says why).

/// What to do about the current limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NofilePlan {
    /// The soft limit already equals the hard one.
    Keep,
    /// Set the soft limit to this value (the hard limit).
    Raise { soft: u64 },
}

/// Decides the soft limit: the hard limit, unless it is unlimited, in which
/// case `NR_OPEN`'s usual ceiling (`1 << 20`): the kernel refuses a soft
/// limit above `fs.nr_open` even when the hard limit is infinite.
pub fn plan(soft: u64, hard: u64) -> NofilePlan {
    let target = if hard == u64::MAX { NR_OPEN_DEFAULT.max(soft) } else { hard };
    if soft >= target {
        NofilePlan::Keep
    } else {
        NofilePlan::Raise { soft: target }
    }
}

/// The kernel's default `fs.nr_open`.
const NR_OPEN_DEFAULT: u64 = 1 << 20;

fn to_u64(limit: libc::rlim_t) -> u64 {
    if limit == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        limit
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit and logs both. Returns
/// the soft limit in force afterwards (`None` if it could not be read).
pub fn raise_to_hard() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(%error, "getrlimit(RLIMIT_NOFILE) failed; keeping the open-file limit");
        return None;
    }
    let (soft, hard) = (to_u64(limit.rlim_cur), to_u64(limit.rlim_max));
    match plan(soft, hard) {
        NofilePlan::Keep => {
            tracing::info!(soft, hard, "open-file limit (RLIMIT_NOFILE) already at its hard limit");
            Some(soft)
        }
        NofilePlan::Raise { soft: target } => {
            let raised =
                libc::rlimit { rlim_cur: target as libc::rlim_t, rlim_max: limit.rlim_max };
            // SAFETY: setrlimit reads the struct we own.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                tracing::info!(
                    soft_before = soft,
                    soft = target,
                    hard,
                    "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
                );
                Some(target)
            } else {
                let error = std::io::Error::last_os_error();
                tracing::warn!(soft, hard, %error,
                    "could not raise the open-file limit (RLIMIT_NOFILE); serving within it");
                Some(soft)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_and_never_down() {
        // Goal: a low soft limit is raised to the hard one; an unlimited hard limit is
        // capped at the kernel's default nr_open; a soft limit at or above the target is
        // kept. Method: the pure plan.
        assert_eq!(plan(1024, 524_288), NofilePlan::Raise { soft: 524_288 });
        assert_eq!(plan(524_288, 524_288), NofilePlan::Keep);
        assert_eq!(plan(1024, u64::MAX), NofilePlan::Raise { soft: 1 << 20 });
        assert_eq!(plan(2 << 20, u64::MAX), NofilePlan::Keep);
    }
}
