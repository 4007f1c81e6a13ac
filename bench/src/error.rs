//! [`BenchError`]: every way a benchmark run can fail before it reports.

use std::path::PathBuf;

use spool_broker::log::LogError;
use thiserror::Error;

/// Why a benchmark run produced no report.
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
    #[error("throughput: {0}")]
    Throughput(#[from] crate::throughput::ThroughputError),
    #[error("load: {0}")]
    Load(#[from] crate::load::LoadError),
    #[error("hostile: {0}")]
    Hostile(String),
    #[error("capacity: {0}")]
    Capacity(#[from] crate::capacity::CapacityError),
    #[error("rss: {0}")]
    Rss(#[from] crate::rss::RssError),
    #[error("idle: {0}")]
    Idle(#[from] crate::idle::IdleError),
    #[error("omb: {0}")]
    Omb(#[from] crate::omb::OmbError),
    #[error("cannot encode the report: {0}")]
    Report(#[from] serde_json::Error),
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
