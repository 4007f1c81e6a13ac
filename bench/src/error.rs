//! [`BenchError`]: the ways the in-process scenarios (`log_append`,
//! `state_memory`, `recovery`, `hostile`) and the shared measuring pieces
//! (`latency`, `timed`) fail before they report.
//!
//! It names nothing of the client scenarios: `throughput`, the load engine
//! and the scenarios on it keep their own error enums (they depend on this
//! module's pieces, never the other way round), and the binary's `Failure`
//! (`main.rs`) is the one place that gathers them all.

use std::path::PathBuf;

use spool_broker::log::LogError;
use thiserror::Error;

/// Why an in-process scenario produced no report.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("cannot build the benchmark record: {0}")]
    Record(#[from] spool_wire::WireError),
    #[error("cannot start the glommio executor: {0}")]
    Executor(String),
    #[error("{action} {}: {source}", path.display())]
    Dir {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("histogram: {0}")]
    Histogram(String),
    #[error("hostile: {0}")]
    Hostile(String),
    #[error(
        "heap is not being counted: run this scenario from the spool-bench binary, which \
         installs spool_bench::heap::CountingAllocator as the global allocator"
    )]
    NoCountingAllocator,
    #[error(
        "{} has {available_bytes} bytes free but the run needs about {needed_bytes}; \
         pass a smaller --messages or --record-bytes, or another --dir",
        dir.display()
    )]
    InsufficientSpace { dir: PathBuf, needed_bytes: u64, available_bytes: u64 },
    #[error("queue config: {0}")]
    Config(#[from] spool_broker::queue::ConfigError),
    #[error("queue decision refused: {0}")]
    Queue(#[from] spool_broker::queue::QueueError),
    #[error("queue event does not apply: {0}")]
    Apply(#[from] spool_broker::queue::ApplyError),
    #[error("partition: {0}")]
    Partition(Box<spool_broker::partition::PartitionError>),
    #[error("scenario went wrong: {0}")]
    Scenario(String),
}

impl BenchError {
    /// `Ok` when `value` is in `[min, max]`, else [`BenchError::OutOfRange`]
    /// naming `field`: the one range check of every in-process scenario's
    /// settings.
    ///
    /// # Errors
    /// [`BenchError::OutOfRange`] when `value` is outside `[min, max]`.
    pub fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), Self> {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(Self::OutOfRange { field, value, min, max })
        }
    }
}
