//! A family of histograms that the shards already bucketed: each series is
//! the counts per bucket and the sum a report carries, encoded as an
//! OpenMetrics histogram (cumulative) without observing anything here.

use std::fmt;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Histograms counted elsewhere (the shards), encoded as they are: one
/// series per label set, buckets not cumulative, the last one `+Inf`.
#[derive(Debug)]
pub(super) struct Histograms<L> {
    pub(super) series: Vec<HistogramSeries<L>>,
}

impl<L> Default for Histograms<L> {
    fn default() -> Self {
        Self { series: Vec::new() }
    }
}

/// One histogram: its labels, sum, count and `(bound, count)` buckets (not
/// cumulative; the encoder adds them up).
#[derive(Debug)]
pub(super) struct HistogramSeries<L> {
    pub(super) labels: L,
    pub(super) sum: f64,
    pub(super) count: u64,
    pub(super) buckets: Vec<(f64, u64)>,
}

impl<L> HistogramSeries<L> {
    /// A series from per-bucket `counts` of `bounds` (the last count is the
    /// `+Inf` bucket), each bound and the sum divided by `scale` (µs → s: 1e6).
    pub(super) fn new(labels: L, bounds: &[u64], counts: &[u64], sum: u64, scale: f64) -> Self {
        let buckets = counts
            .iter()
            .enumerate()
            .map(|(index, count)| {
                let bound = bounds.get(index).map_or(f64::MAX, |bound| *bound as f64 / scale);
                (bound, *count)
            })
            .collect();
        Self { labels, sum: sum as f64 / scale, count: counts.iter().sum(), buckets }
    }
}

impl<L: fmt::Debug + Send + Sync> TypedMetric for Histograms<L> {
    const TYPE: MetricType = MetricType::Histogram;
}

impl<L: EncodeLabelSet + fmt::Debug + Send + Sync> EncodeMetric for Histograms<L> {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), fmt::Error> {
        for series in &self.series {
            encoder.encode_family(&series.labels)?.encode_histogram::<NoLabelSet>(
                series.sum,
                series.count,
                &series.buckets,
                None,
            )?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}
