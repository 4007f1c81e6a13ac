//! [`Latency`]: an hdrhistogram of durations in nanoseconds, and the
//! percentile summary the reports print in microseconds.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::BenchError;

/// Longest duration a histogram distinguishes; longer ones are recorded as
/// this (saturating) so one stall cannot fail a run.
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Significant decimal digits kept: 0.1 % value resolution.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Durations in nanoseconds.
#[derive(Clone, Debug)]
pub struct Latency {
    histogram: Histogram<u64>,
}

/// Percentiles of a [`Latency`], in microseconds (fractional: ns resolution).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// An empty histogram covering 1 ns ..= [`LATENCY_NS_MAX`].
    ///
    /// # Errors
    /// [`BenchError::Histogram`] if hdrhistogram rejects the bounds.
    pub fn new() -> Result<Self, BenchError> {
        let histogram = Histogram::new_with_bounds(1, LATENCY_NS_MAX, SIGNIFICANT_DIGITS)
            .map_err(|error| BenchError::Histogram(error.to_string()))?;
        Ok(Self { histogram })
    }

    pub fn record_ns(&mut self, duration_ns: u64) {
        self.histogram.saturating_record(duration_ns.clamp(1, LATENCY_NS_MAX));
    }

    pub fn reset(&mut self) {
        self.histogram.reset();
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn summary(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1000.0;
        let histogram = &self.histogram;
        if histogram.is_empty() {
            return LatencySummary { count: 0, p50: 0.0, p99: 0.0, p999: 0.0, max: 0.0, mean: 0.0 };
        }
        LatencySummary {
            count: histogram.len(),
            p50: us(histogram.value_at_quantile(0.50)),
            p99: us(histogram.value_at_quantile(0.99)),
            p999: us(histogram.value_at_quantile(0.999)),
            max: us(histogram.max()),
            mean: histogram.mean() / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_orders_percentiles_and_converts_to_microseconds() {
        // Goal: percentiles come out ordered and in µs; outliers saturate instead of failing.
        let mut latency = Latency::new().unwrap();
        for ns in 1..=1000u64 {
            latency.record_ns(ns * 1000);
        }
        latency.record_ns(u64::MAX);
        let summary = latency.summary();
        assert_eq!(summary.count, 1001);
        // hdrhistogram reports the top of a bucket: within 0.5 % at 3 significant digits.
        assert!((summary.p50 - 500.0).abs() < 2.5, "p50 {}", summary.p50);
        assert!(summary.p50 <= summary.p99);
        assert!(summary.p99 <= summary.p999);
        assert!(summary.p999 <= summary.max);
        assert!((summary.max - LATENCY_NS_MAX as f64 / 1000.0).abs() / summary.max < 0.001);
        latency.reset();
        assert_eq!(latency.summary().count, 0);
    }
}
