//! Lease extension: [`LeaseKeeper`] extends one delivery's lease every
//! `extend_interval` while the delivery waits for a slot and while its
//! handler runs, and stops for good once the lease is lost or at its
//! lifetime cap.
//!
//! It must not settle the delivery (ack or release): its task does.

use std::future::Future;
use std::sync::atomic::Ordering;

use super::{SettleTarget, Shared};

/// Extends one delivery's lease every `extend_interval` while it waits for a
/// slot and while its handler runs.
pub(super) struct LeaseKeeper<'a> {
    shared: &'a Shared,
    target: &'a SettleTarget,
    /// Cleared once an extension failed for good (lost lease, lifetime cap).
    extending: bool,
    /// When the next extension is due; kept across the wait for a slot and
    /// the handler, so the interval counts from the claim.
    next: tokio::time::Instant,
}

impl<'a> LeaseKeeper<'a> {
    pub(super) fn new(shared: &'a Shared, target: &'a SettleTarget) -> Self {
        let next = tokio::time::Instant::now() + shared.config.extend_every();
        Self { shared, target, extending: true, next }
    }

    /// Drives `work` to completion, extending the lease meanwhile. The work
    /// is polled first, so work that is done at once never arms a timer.
    pub(super) async fn keep_while<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                biased;
                output = &mut work => return output,
                () = tokio::time::sleep_until(self.next), if self.extending => {
                    self.extend_once().await;
                    self.next = tokio::time::Instant::now() + self.shared.config.extend_every();
                }
            }
        }
    }

    async fn extend_once(&mut self) {
        let (shared, target) = (self.shared, self.target);
        let counters = &shared.counters;
        let lease_ms = shared.config.lease_ms;
        match shared.client.extend(&target.queue, target.partition, target.token, lease_ms).await {
            Ok(_) => {
                counters.extended.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.extend_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(queue = %target.queue, offset = target.offset.0, %error, "extend failed");
                // A lost lease or a lifetime cap will not come back; a
                // transient failure is tried again next interval.
                self.extending = error.is_retriable();
            }
        }
    }
}
