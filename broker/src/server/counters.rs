//! Per-partition request counters the handler keeps beside each served
//! partition: what the queue state does not count because it folds events,
//! not requests (claims answered, redeliveries handed out, extends granted,
//! stale tokens, refusals by cause).
//!
//! Plain `Cell`s on the shard that owns the partition: one increment per
//! answered request, no atomics, nothing shared. The admin port reads them
//! through the shard's report ([`crate::shard::report`]).
//!
//! Also per partition: the latency of each data request (enqueue, claim,
//! ack, release, extend), from the request decoded to its reply built, in
//! the fixed buckets of [`REQUEST_LATENCY_BUCKETS_US`](crate::shard::report::REQUEST_LATENCY_BUCKETS_US) (a bucket search and
//! two adds per request, no allocation), and the ack rate's moving average
//! behind the predicted drain time ([`DRAIN_RATE_WINDOW_MS`]).

use std::cell::Cell;
use std::time::Duration;

use spool_wire::ErrorCode;

use crate::clock::{Instant, Millis};
use crate::log::journal::JournalError;
use crate::log::LogError;
use crate::partition::{Claimed, PartitionError};
use crate::queue::FullLimit;
use crate::shard::report::{
    AdmissionCause, LatencyCounts, RequestCounts, RequestOp, REQUEST_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS_US,
};

/// Time constant of the ack rate's exponentially weighted moving average
/// (the predicted drain time's "recent ack rate"): a sample `dt` after the
/// previous one weighs `1 - exp(-dt / window)`.
pub const DRAIN_RATE_WINDOW_MS: u64 = 60_000;

/// One operation's latency histogram (buckets not cumulative).
#[derive(Debug, Default)]
struct LatencyHistogram {
    buckets: [Cell<u64>; REQUEST_LATENCY_BUCKETS],
    sum_us: Cell<u64>,
}

impl LatencyHistogram {
    fn observe(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = REQUEST_LATENCY_BUCKETS_US
            .iter()
            .position(|bound| micros <= *bound)
            .unwrap_or(REQUEST_LATENCY_BUCKETS_US.len());
        bump(&self.buckets[bucket], 1);
        bump(&self.sum_us, micros);
    }

    fn snapshot(&self) -> LatencyCounts {
        LatencyCounts {
            buckets: std::array::from_fn(|index| self.buckets[index].get()),
            sum_us: self.sum_us.get(),
        }
    }
}

/// The ack rate's moving average and the sample it was last updated from.
#[derive(Debug, Default, Clone, Copy)]
struct AckRate {
    /// `(time, acks total)` of the last sample.
    last: Option<(Millis, u64)>,
    /// Acks per second; `None` until two samples were seen.
    per_sec: Option<f64>,
}

/// Counters of one served partition, since it opened.
#[derive(Debug, Default)]
pub struct RequestCounters {
    claims: Cell<u64>,
    deliveries: Cell<u64>,
    redeliveries: Cell<u64>,
    extends: Cell<u64>,
    stale_tokens: Cell<u64>,
    rejections: [Cell<u64>; AdmissionCause::ALL.len()],
    latency: [LatencyHistogram; RequestOp::ALL.len()],
    ack_rate: Cell<AckRate>,
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get().wrapping_add(by));
}

impl RequestCounters {
    /// A claim answered with `claimed` (possibly none).
    pub fn claimed(&self, claimed: &[Claimed]) {
        bump(&self.claims, 1);
        bump(&self.deliveries, claimed.len() as u64);
        let again = claimed.iter().filter(|item| item.delivery.attempt > 1).count();
        bump(&self.redeliveries, again as u64);
    }

    /// A lease extension granted.
    pub fn extended(&self) {
        bump(&self.extends, 1);
    }

    /// A token refused with `code` (acks report codes, not errors).
    pub fn token_refused(&self, code: ErrorCode) {
        if code == ErrorCode::StaleToken {
            bump(&self.stale_tokens, 1);
        }
    }

    /// A request of this partition failed with `error`: counted if it is a
    /// stale token or an admission refusal, ignored otherwise.
    pub fn failed(&self, error: &PartitionError) {
        let cause = match error {
            PartitionError::QueueFull { limit: FullLimit::Messages } => AdmissionCause::MaxMessages,
            PartitionError::QueueFull { limit: FullLimit::Bytes } => AdmissionCause::MaxBytes,
            PartitionError::Log(LogError::DiskFull)
            | PartitionError::Journal(JournalError::DiskFull { .. }) => AdmissionCause::DiskFull,
            PartitionError::ActiveKeysFull { .. } => AdmissionCause::ActiveKeys,
            PartitionError::TooManyWaiters => AdmissionCause::ClaimWaitersPerPartition,
            PartitionError::TooManyWaitersOnConnection { .. } => {
                AdmissionCause::ClaimWaitersPerConnection
            }
            other => return self.token_refused(other.code()),
        };
        bump(&self.rejections[cause.index()], 1);
    }

    /// A request of operation `op` for this partition, decoded at
    /// `started`, has its reply.
    pub fn observe(&self, op: RequestOp, started: Instant) {
        let took = crate::clock::instant_now().saturating_duration_since(started);
        self.latency[op.index()].observe(took);
    }

    /// Feeds the ack rate's moving average with the partition's acks total
    /// at `now`, and returns the average (acks per second), `None` until two
    /// samples a millisecond or more apart were seen. Called when a report
    /// is built (a scrape), never on the data path; the weight of a sample
    /// follows the time since the previous one, so irregular scrapes
    /// average correctly.
    pub fn sample_acks(&self, now: Millis, acked: u64) -> Option<f64> {
        let mut rate = self.ack_rate.get();
        match rate.last {
            Some((at, before)) if now > at => {
                let dt_ms = (now - at) as f64;
                let sample = acked.saturating_sub(before) as f64 * 1000.0 / dt_ms;
                let weight = 1.0 - (-dt_ms / DRAIN_RATE_WINDOW_MS as f64).exp();
                rate.per_sec = Some(match rate.per_sec {
                    Some(average) => average + weight * (sample - average),
                    None => sample,
                });
                rate.last = Some((now, acked));
            }
            Some(_) => {}
            None => rate.last = Some((now, acked)),
        }
        self.ack_rate.set(rate);
        rate.per_sec
    }

    /// The counts now.
    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            claims: self.claims.get(),
            deliveries: self.deliveries.get(),
            redeliveries: self.redeliveries.get(),
            extends: self.extends.get(),
            stale_tokens: self.stale_tokens.get(),
            rejections: std::array::from_fn(|index| self.rejections[index].get()),
            latency: std::array::from_fn(|index| self.latency[index].snapshot()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{QueueError, StaleToken};

    // Goal: each refusal lands under its own cause and stale tokens are told
    // apart from other failures. Method: feed one error of each kind.
    #[test]
    fn refusals_are_counted_by_cause() {
        let counters = RequestCounters::default();
        counters.failed(&PartitionError::QueueFull { limit: FullLimit::Bytes });
        counters.failed(&PartitionError::QueueFull { limit: FullLimit::Bytes });
        counters.failed(&PartitionError::TooManyWaiters);
        counters.failed(&PartitionError::Queue(QueueError::StaleToken(StaleToken::NotClaimed)));
        counters.failed(&PartitionError::NotData);
        counters.token_refused(ErrorCode::StaleToken);
        counters.token_refused(ErrorCode::InvalidToken);
        counters.extended();
        let counts = counters.snapshot();
        assert_eq!(counts.rejections[AdmissionCause::MaxBytes.index()], 2);
        assert_eq!(counts.rejections[AdmissionCause::ClaimWaitersPerPartition.index()], 1);
        assert_eq!(counts.rejections[AdmissionCause::MaxMessages.index()], 0);
        assert_eq!(counts.stale_tokens, 2);
        assert_eq!(counts.extends, 1);
    }

    // Goal: each observation lands in the first bucket whose bound covers
    // it, under its own op. Method: three enqueue latencies, one ack.
    #[test]
    fn latency_lands_in_its_bucket_under_its_op() {
        let counters = RequestCounters::default();
        let enqueue = &counters.latency[RequestOp::Enqueue.index()];
        enqueue.observe(Duration::from_micros(50));
        enqueue.observe(Duration::from_micros(51));
        enqueue.observe(Duration::from_secs(60));
        counters.observe(RequestOp::Ack, crate::clock::instant_now());
        let counts = counters.snapshot();
        let enqueued = counts.latency[RequestOp::Enqueue.index()];
        assert_eq!(enqueued.buckets[0], 1);
        assert_eq!(enqueued.buckets[1], 1);
        assert_eq!(enqueued.buckets[REQUEST_LATENCY_BUCKETS - 1], 1);
        assert_eq!(enqueued.sum_us, 50 + 51 + 60_000_000);
        assert_eq!(counts.latency[RequestOp::Ack.index()].count(), 1);
        assert_eq!(counts.latency[RequestOp::Claim.index()].count(), 0);
    }

    // Goal: the ack rate is unknown after one sample, the measured rate
    // after the second, and then moves toward new rates by the weight of
    // the time that passed. Method: samples at chosen times.
    #[test]
    fn ack_rate_is_a_time_weighted_moving_average() {
        let counters = RequestCounters::default();
        assert_eq!(counters.sample_acks(1_000, 0), None);
        assert_eq!(counters.sample_acks(1_000, 5), None, "no time passed");
        assert_eq!(counters.sample_acks(2_000, 100), Some(100.0));
        // A whole window later at rate 0: weight 1 - 1/e.
        let decayed = counters.sample_acks(2_000 + DRAIN_RATE_WINDOW_MS, 100).unwrap();
        assert!((decayed - 100.0 / std::f64::consts::E).abs() < 1e-9, "{decayed}");
    }
}
