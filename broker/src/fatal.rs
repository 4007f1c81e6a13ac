//! Process exit for failures the process cannot answer.
//!
//! Owns the list of reasons `spoold` stops on its own and the exit code each
//! one maps to. It does not decide *when* to stop: callers do, after deciding
//! there is no in-process answer (an unusable config, a locked data dir, a
//! failed `fdatasync`, a shard that died). A panic is not an option for these:
//! with several executor threads, unwinding one leaves its siblings serving
//! half a broker, so we log and `exit` the whole process instead.

use std::fmt::Display;
use std::io::Write;

/// Why the process stops. Each reason has a stable exit code so supervisors
/// and tests can tell them apart without parsing logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FatalReason {
    /// The configuration (file, environment or flags) is invalid.
    Config,
    /// Another process holds the data-directory lock.
    DataDirLocked,
    /// The data directory, its lock or its secret could not be used.
    DataDir,
    /// A shard port is already bound by another process.
    PortInUse,
    /// RLIMIT_MEMLOCK is too low and cannot be raised.
    Memlock,
    /// Logging could not be initialised.
    Logging,
    /// Signal handlers could not be installed.
    Signals,
    /// A shard or the coordinator did not come up.
    Startup,
    /// A shard or the coordinator stopped while the broker was running.
    ShardFailed,
    /// In-flight work did not drain within the shutdown timeout.
    ShutdownTimeout,
    /// Durable storage failed (for example `fdatasync`); never retried.
    Storage,
    /// A partition log's write failed (the log's `FatalCode::WriteFailed`).
    LogWrite,
    /// A partition log's fdatasync failed.
    LogSync,
    /// Preparing (zero-filling, syncing) the next segment failed.
    LogPrepare,
    /// Naming the next segment (rename, directory sync) failed.
    LogRoll,
    /// A partition side file (checkpoint, epoch) failed to sync after its
    /// bytes were written: its durability is unknown, so it is not retried.
    SideFileSync,
}

impl FatalReason {
    /// The process exit code for this reason. Codes are stable: a retired
    /// reason's code is never reused. 2 matches clap's usage-error code.
    pub fn exit_code(self) -> i32 {
        match self {
            FatalReason::Config => 2,
            FatalReason::DataDirLocked => 3,
            FatalReason::DataDir => 4,
            FatalReason::PortInUse => 5,
            FatalReason::Memlock => 6,
            FatalReason::Logging => 7,
            FatalReason::Signals => 8,
            FatalReason::Startup => 9,
            FatalReason::ShardFailed => 10,
            FatalReason::ShutdownTimeout => 11,
            FatalReason::Storage => 12,
            // The log's codes, kept from when the log exited on its own.
            FatalReason::LogWrite => 70,
            FatalReason::LogSync => 71,
            FatalReason::LogPrepare => 72,
            FatalReason::LogRoll => 73,
            FatalReason::SideFileSync => 74,
        }
    }

    /// A short stable name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FatalReason::Config => "config",
            FatalReason::DataDirLocked => "data_dir_locked",
            FatalReason::DataDir => "data_dir",
            FatalReason::PortInUse => "port_in_use",
            FatalReason::Memlock => "memlock",
            FatalReason::Logging => "logging",
            FatalReason::Signals => "signals",
            FatalReason::Startup => "startup",
            FatalReason::ShardFailed => "shard_failed",
            FatalReason::ShutdownTimeout => "shutdown_timeout",
            FatalReason::Storage => "storage",
            FatalReason::LogWrite => "log_write",
            FatalReason::LogSync => "log_sync",
            FatalReason::LogPrepare => "log_prepare",
            FatalReason::LogRoll => "log_roll",
            FatalReason::SideFileSync => "side_file_sync",
        }
    }
}

/// Logs `detail` with `reason` and exits the process with the reason's code.
///
/// The message also goes straight to stderr, because a fatal error can come
/// before logging is initialised (or be a logging failure itself).
pub fn fatal(reason: FatalReason, detail: impl Display) -> ! {
    tracing::error!(reason = reason.as_str(), exit_code = reason.exit_code(), "fatal: {detail}");
    let mut stderr = std::io::stderr().lock();
    // Nothing useful to do if stderr is gone; we are exiting either way.
    let _ = writeln!(stderr, "spoold: fatal ({}): {detail}", reason.as_str());
    let _ = stderr.flush();
    let _ = std::io::stdout().flush();
    std::process::exit(reason.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: exit codes are distinct and never 0/1 (0 = clean stop, 1 = Rust's
    // default for an escaped error). Method: collect every reason's code.
    #[test]
    fn exit_codes_are_distinct_and_reserved_codes_unused() {
        let reasons = [
            FatalReason::Config,
            FatalReason::DataDirLocked,
            FatalReason::DataDir,
            FatalReason::PortInUse,
            FatalReason::Memlock,
            FatalReason::Logging,
            FatalReason::Signals,
            FatalReason::Startup,
            FatalReason::ShardFailed,
            FatalReason::ShutdownTimeout,
            FatalReason::Storage,
            FatalReason::LogWrite,
            FatalReason::LogSync,
            FatalReason::LogPrepare,
            FatalReason::LogRoll,
            FatalReason::SideFileSync,
        ];
        let mut codes: Vec<i32> = reasons.iter().map(|reason| reason.exit_code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), reasons.len());
        assert!(codes.iter().all(|&code| code >= 2));
    }

    // Goal: the log's fatal codes exit through this table with the codes
    // they always had, 70..=74 (supervisors match on them). Method: map
    // every code.
    #[test]
    fn log_fatal_codes_map_to_reasons_with_the_same_exit_code() {
        use crate::log::FatalCode;
        for (code, exit) in [
            (FatalCode::WriteFailed, 70),
            (FatalCode::SyncFailed, 71),
            (FatalCode::PrepareFailed, 72),
            (FatalCode::RollFailed, 73),
            (FatalCode::SideFileSyncFailed, 74),
        ] {
            assert_eq!(FatalReason::from(code).exit_code(), exit, "{code:?}");
        }
    }
}
