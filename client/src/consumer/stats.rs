//! What a consumer counts: the live [`Counters`] its tasks bump (atomics,
//! relaxed) and the [`ConsumerStats`] snapshot of them that
//! [`Consumer::stats`](super::Consumer::stats) and `shutdown` return.
//!
//! It must only count: no counter here decides anything the consumer does.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a consumer's life, for tests and monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Deliveries received.
    pub claimed: u64,
    /// Acked after the handler succeeded.
    pub acked: u64,
    /// Released (handler error, panic, or shutdown).
    pub released: u64,
    /// Successful lease extensions.
    pub extended: u64,
    /// Extensions refused (the lease is lost or at its lifetime cap).
    pub extend_failed: u64,
    /// Acks or releases the broker refused or that failed in transit.
    pub settle_failed: u64,
    /// Claims that failed.
    pub claim_failed: u64,
    /// Most deliveries held at once (running or waiting for a slot); never
    /// above `slots + prefetch`.
    pub outstanding_max: u64,
    /// Most handlers running at once; never above the slots.
    pub running_max: u64,
    /// Claim requests sent.
    pub claim_requests: u64,
    /// Ack requests sent (each carries one or more tokens).
    pub ack_requests: u64,
}

impl ConsumerStats {
    /// The totals of two consumers: counts add, maxima take the larger.
    #[must_use]
    pub fn merged(self, other: Self) -> Self {
        Self {
            claimed: self.claimed + other.claimed,
            acked: self.acked + other.acked,
            released: self.released + other.released,
            extended: self.extended + other.extended,
            extend_failed: self.extend_failed + other.extend_failed,
            settle_failed: self.settle_failed + other.settle_failed,
            claim_failed: self.claim_failed + other.claim_failed,
            outstanding_max: self.outstanding_max.max(other.outstanding_max),
            running_max: self.running_max.max(other.running_max),
            claim_requests: self.claim_requests + other.claim_requests,
            ack_requests: self.ack_requests + other.ack_requests,
        }
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) claimed: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) extended: AtomicU64,
    pub(super) extend_failed: AtomicU64,
    pub(super) settle_failed: AtomicU64,
    pub(super) claim_failed: AtomicU64,
    pub(super) outstanding: AtomicU64,
    pub(super) outstanding_max: AtomicU64,
    pub(super) running: AtomicU64,
    pub(super) running_max: AtomicU64,
    pub(super) claim_requests: AtomicU64,
    pub(super) ack_requests: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> ConsumerStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            claimed: load(&self.claimed),
            acked: load(&self.acked),
            released: load(&self.released),
            extended: load(&self.extended),
            extend_failed: load(&self.extend_failed),
            settle_failed: load(&self.settle_failed),
            claim_failed: load(&self.claim_failed),
            outstanding_max: load(&self.outstanding_max),
            running_max: load(&self.running_max),
            claim_requests: load(&self.claim_requests),
            ack_requests: load(&self.ack_requests),
        }
    }
}
