//! The phased load engine under the `latency`, `capacity` and `omb`
//! scenarios: open-loop producers and simulated workers over the real
//! client, a one-second sampler, and the numbers every report shares.
//!
//! What it owns, for one run: the broker ([`Broker`]: started here unless an
//! address is given), the run's queues (created; deleted afterwards only on a
//! broker it did not start), one tokio runtime for every client, the pacing
//! threads (one per producer up to 16, then shared: a thread paces its
//! producers in turn at the sum of their rates), the consumers (a connection
//! each up to 256, then shared), the sampler, and an optional progress
//! bar on stderr. What it does not do: decide phases or judge results (the
//! scenarios build [`Phase`]s and compare with the planner), or touch broker
//! internals (it speaks the protocol through `spool-client`; the broker's own
//! counts come from DescribeQueue).
//!
//! - **Arrivals** are open loop: each pacing thread gives message *i* an
//!   intended send time (fixed gaps, or exponential gaps for Poisson
//!   arrivals, at the current phase's rate), submits it at or after that time
//!   (waiting for a window slot if `window` sends are in flight), and the
//!   enqueue latency counts from the intended time. A stalled broker shows up
//!   as latency, never as fewer samples (no coordinated omission).
//! - **Workers** are `spool_client::Consumer`s: each holds N execution slots
//!   and claims its free room as credits, with `prefetch_fraction × N`
//!   deliveries claimed ahead so a slot that frees starts its next delivery
//!   without a claim round trip. A handler "works" for a log-normal service
//!   time (mean, CV) and returns `Ok`; its slot frees then and the ack goes
//!   out batched. A phase's consumer capacity is its slot count ÷ mean
//!   service time; at a phase boundary slots are added by starting
//!   consumers and removed by shutting the newest down (they finish what
//!   they hold).
//! - **Service time is held to its mean**: tokio's timers have 1 ms
//!   resolution and fire late (≈0.5–1 ms on an 18 ms sleep, 3–5 % fewer
//!   completions per slot than the model). Each sleep is shortened by the
//!   running mean of the observed lateness, so the measured mean service
//!   time — reported, the figure to check — equals the configured one.
//! - **Counts**: the client's backlog is `enqueued − acked` (sends whose
//!   offset came back, minus acks the broker confirmed); the broker's is
//!   DescribeQueue `ready + scheduled + claimed`. Both are sampled every
//!   second with the interval's rates and latency percentiles.
//!
//! Files: [`config`] (what a run is asked, its limits and checks),
//! `driver` (the controller: phases, start and finish), `pacer` (producers),
//! `workers` (consumers), `recorder` (shared counters and histograms),
//! `sampler` (the one-second samples and the progress bar), [`report`]
//! (what a run returns).

mod config;
mod driver;
mod pacer;
mod recorder;
mod report;
mod sampler;
mod workers;

use std::time::Duration;

use spool_client::ClientError;
use thiserror::Error;

use crate::harness::HarnessError;

/// Bytes of the intended-send-time prefix every payload carries (one
/// encoding for every client scenario: [`crate::sends`] owns it).
pub use crate::sends::TIMESTAMP_BYTES;
pub use config::*;
pub use driver::run;
pub use report::*;

#[cfg(test)]
pub(crate) use config::tests;

/// Why a load run produced no result.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: String, value: f64, min: f64, max: f64 },
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("cannot build the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot spawn a pacing thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("client: {0}")]
    Client(#[from] ClientError),
    #[error("histogram: {0}")]
    Histogram(String),
    #[error("{0} did not finish within {1:?} after the last phase")]
    Finish(&'static str, Duration),
}
