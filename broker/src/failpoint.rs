//! Failpoints: named places on the storage path where a test can make the
//! broker abort, fail the operation, or stall, to prove recovery at every
//! write, sync, rename and directory-sync boundary with a real process.
//!
//! Owns the list of point names ([`POINTS`]), the `SPOOL_FAILPOINTS` parser
//! and the per-point hit counters. Does not decide where points sit: the
//! [`eval`] call sites in `log/journal/` and `partition/files.rs` do, each right
//! before the operation it names (a name ending in `.after` sits right after
//! it).
//!
//! Armed only with the cargo feature `failpoints` (off by default; the
//! `spoold-failpoints` binary requires it): without it [`eval`] is an inlined
//! `Ok(())`, so release builds carry no check, no counter and no
//! environment lookup.
//!
//! Syntax: `SPOOL_FAILPOINTS="name=action[@hit];name=action..."` where action
//! is `abort` (SIGABRT: the process dies like a power cut after the point),
//! `error` (the operation fails with an injected I/O error) or `delay(ms)`
//! (the thread sleeps: the whole shard stalls, like a page fault on a slow
//! disk), and `@hit` fires from the `hit`-th time the point is reached on
//! (1-based, default 1). A name not in [`POINTS`] is refused at start-up.

/// Every failpoint, in data-path order. Names are stable: tests walk them.
pub const POINTS: &[&str] = &[
    "journal.commit.write",
    "journal.commit.write.after",
    "journal.commit.sync",
    "journal.commit.sync.after",
    "journal.witness.write",
    "journal.witness.write.after",
    "journal.witness.sync",
    "journal.witness.sync.after",
    "journal.roll.rename",
    "journal.roll.dir_sync",
    "journal.roll.dir_sync.after",
    "journal.prepare.write",
    "journal.prepare.sync",
    "journal.prepare.dir_sync",
    "journal.release.remove",
    "journal.release.dir_sync",
    "handles.write",
    "handles.sync",
    "handles.rename",
    "handles.dir_sync",
    "checkpoint.write",
    "checkpoint.sync",
    "checkpoint.rename",
    "checkpoint.dir_sync",
];

/// Environment variable holding the failpoint configuration.
pub const FAILPOINTS_ENV: &str = "SPOOL_FAILPOINTS";

/// Longest `delay(ms)` accepted: a stall, never a hang past test timeouts.
pub const DELAY_MS_MAX: u64 = 60_000;

/// Most `name=action` entries in one configuration.
pub const ENTRIES_MAX: usize = 64;

/// What a failpoint does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Abort,
    Error,
    DelayMs(u64),
}

/// One configured point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    pub point: &'static str,
    pub action: Action,
    /// Fires from this hit on (1-based).
    pub from_hit: u64,
}

/// Why a `SPOOL_FAILPOINTS` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailpointError {
    #[error("failpoint entry {entry:?}: expected name=action[@hit]")]
    Syntax { entry: String },
    #[error("unknown failpoint {name:?} (known: {})", POINTS.join(", "))]
    UnknownPoint { name: String },
    #[error("failpoint {name}: unknown action {action:?} (abort, error, delay(ms))")]
    UnknownAction { name: String, action: String },
    #[error("failpoint {name}: {what} out of range")]
    OutOfRange { name: String, what: &'static str },
    #[error("more than {ENTRIES_MAX} failpoint entries")]
    TooMany,
}

/// Parses a configuration (the value of [`FAILPOINTS_ENV`]).
///
/// # Errors
/// The first malformed entry, unknown point or out-of-range number.
pub fn parse(text: &str) -> Result<Vec<Arm>, FailpointError> {
    let mut arms = Vec::new();
    for entry in text.split(';').map(str::trim).filter(|entry| !entry.is_empty()) {
        if arms.len() == ENTRIES_MAX {
            return Err(FailpointError::TooMany);
        }
        let syntax = || FailpointError::Syntax { entry: entry.to_owned() };
        let (name, rest) = entry.split_once('=').ok_or_else(syntax)?;
        let name = name.trim();
        let point = POINTS
            .iter()
            .copied()
            .find(|known| *known == name)
            .ok_or_else(|| FailpointError::UnknownPoint { name: name.to_owned() })?;
        let (action_text, hit_text) = match rest.split_once('@') {
            Some((action, hit)) => (action.trim(), Some(hit.trim())),
            None => (rest.trim(), None),
        };
        let out_of_range = |what| FailpointError::OutOfRange { name: name.to_owned(), what };
        let from_hit = match hit_text {
            None => 1,
            Some(hit) => hit
                .parse::<u64>()
                .ok()
                .filter(|hit| *hit >= 1)
                .ok_or_else(|| out_of_range("@hit"))?,
        };
        let action = match action_text {
            "abort" => Action::Abort,
            "error" => Action::Error,
            other => {
                let millis = other
                    .strip_prefix("delay(")
                    .and_then(|rest| rest.strip_suffix(')'))
                    .ok_or_else(|| FailpointError::UnknownAction {
                    name: name.to_owned(),
                    action: other.to_owned(),
                })?;
                let millis = millis
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= DELAY_MS_MAX)
                    .ok_or_else(|| out_of_range("delay ms"))?;
                Action::DelayMs(millis)
            }
        };
        arms.push(Arm { point, action, from_hit });
    }
    Ok(arms)
}

/// Evaluates failpoints at run time (feature `failpoints` only).
#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::{parse, Action, Arm, FAILPOINTS_ENV, POINTS};

    struct Registry {
        arms: Vec<Arm>,
        hits: Vec<AtomicU64>,
    }

    fn registry() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let arms = match std::env::var(FAILPOINTS_ENV) {
                Ok(text) => match parse(&text) {
                    Ok(arms) => arms,
                    Err(error) => {
                        // Start-up only (spoold calls `init` before serving).
                        eprintln!("spoold: {FAILPOINTS_ENV}: {error}");
                        std::process::exit(2);
                    }
                },
                Err(_) => Vec::new(),
            };
            let hits = POINTS.iter().map(|_| AtomicU64::new(0)).collect();
            Registry { arms, hits }
        })
    }

    /// Parses the configuration now (exiting with status 2 when it is
    /// invalid) and returns the armed points, for the start-up log.
    pub fn init() -> Vec<Arm> {
        registry().arms.clone()
    }

    /// Counts a hit of `point` and performs its action if it fires.
    ///
    /// # Errors
    /// An injected `Other` I/O error for the `error` action.
    pub fn eval(point: &str) -> Result<(), std::io::Error> {
        let registry = registry();
        // Only names in POINTS can be armed; any other is never armed.
        let Some(slot) = POINTS.iter().position(|known| *known == point) else {
            return Ok(());
        };
        let hit = registry.hits[slot].fetch_add(1, Ordering::Relaxed) + 1;
        let Some(arm) = registry.arms.iter().find(|arm| arm.point == point) else {
            return Ok(());
        };
        if hit < arm.from_hit {
            return Ok(());
        }
        match arm.action {
            Action::Abort => {
                eprintln!("failpoint {point} fired (hit {hit}): abort");
                std::process::abort();
            }
            Action::Error => Err(std::io::Error::other(format!(
                "failpoint {point} fired (hit {hit}): injected error"
            ))),
            Action::DelayMs(millis) => {
                std::thread::sleep(std::time::Duration::from_millis(millis));
                Ok(())
            }
        }
    }
}

#[cfg(feature = "failpoints")]
pub use armed::{eval, init};

/// Without the feature no point is ever armed.
#[cfg(not(feature = "failpoints"))]
pub fn init() -> Vec<Arm> {
    Vec::new()
}

/// Without the feature no point is ever armed: always `Ok`, inlined away.
///
/// # Errors
/// Never.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn eval(_point: &str) -> Result<(), std::io::Error> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_hits_and_refuses_unknown_points() {
        // Goal: the env syntax parses every action and rejects typos by name.
        let arms = parse(
            "journal.commit.sync=abort@3; checkpoint.write=error;journal.commit.write=delay(25)",
        )
        .expect("valid");
        assert_eq!(
            arms,
            vec![
                Arm { point: "journal.commit.sync", action: Action::Abort, from_hit: 3 },
                Arm { point: "checkpoint.write", action: Action::Error, from_hit: 1 },
                Arm { point: "journal.commit.write", action: Action::DelayMs(25), from_hit: 1 },
            ]
        );
        assert!(parse("").expect("empty").is_empty());
        assert!(matches!(parse("journal.sinc=abort"), Err(FailpointError::UnknownPoint { .. })));
        // A point of the retired segment log is refused by name too.
        assert!(matches!(parse("log.append=abort"), Err(FailpointError::UnknownPoint { .. })));
        let commit = "journal.commit.write";
        assert!(matches!(
            parse(&format!("{commit}=explode")),
            Err(FailpointError::UnknownAction { .. })
        ));
        assert!(matches!(
            parse(&format!("{commit}=abort@0")),
            Err(FailpointError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse(&format!("{commit}=delay(99999999)")),
            Err(FailpointError::OutOfRange { .. })
        ));
        assert!(matches!(parse(commit), Err(FailpointError::Syntax { .. })));
    }

    #[test]
    fn point_names_are_unique() {
        // Goal: a walk over POINTS visits each point once.
        let mut names: Vec<&str> = POINTS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POINTS.len());
    }
}
