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
    #[error("cannot encode the report: {0}")]
    Report(#[from] serde_json::Error),
}
