//! The one place this crate reads a clock.
//!
//! Only the probes in [`crate::measure`] time anything (a sync, a writer's
//! pace, a broker run). The planner, the verdict and the reports take their
//! figures as arguments and never call this, so they stay pure and testable.

pub use std::time::Instant;

/// Now, for timing a probe.
#[allow(clippy::disallowed_methods)] // This module is the crate's one clock.
pub fn instant_now() -> Instant {
    Instant::now()
}
