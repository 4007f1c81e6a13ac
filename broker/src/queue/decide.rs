//! Decisions: read the state, return the events to append. Nothing here
//! changes state; the caller appends the events to the log and then feeds
//! each one to `PartitionState::apply`, in order, before the next decision.
//!
//! Files, one kind of decision each, named as the partition's files that
//! ask for them where they can be: `admission.rs` (enqueue checks: dedupe,
//! in-batch repeats, queue limits; asked by `partition/enqueue.rs`),
//! `claim.rs` (claims of either lane), `delivery.rs` (extend, ack,
//! release: what a token asks of its claim), `operator.rs` (redrive,
//! purge, dead-letter peeks), `tick.rs` (what time and a new epoch do:
//! tick and next wake-up for `partition/housekeeping.rs`, the fence for
//! `partition/open.rs`). This file keeps the rules several of them share:
//! the lease bounds and what expiry does.

mod admission;
mod claim;
mod delivery;
mod operator;
mod tick;

use super::error::QueueError;
use super::event::Event;
use super::state::PartitionState;
use super::types::{Generation, Millis, Offset, QuarantineCause, ReleaseReason, SubscriptionId};
pub use admission::{Admission, AdmissionIds, EnqueueDecision, FullLimit};
pub use claim::{ClaimDecision, ClaimRequest, Delivery};
pub use operator::Redrive;

impl PartitionState {
    fn lease(&self, lease_ms: Option<Millis>) -> Result<Millis, QueueError> {
        let lease_ms = lease_ms.unwrap_or(self.config.lease_default_ms);
        let (min_ms, max_ms) = (self.config.lease_min_ms, self.config.lease_max_ms);
        if (min_ms..=max_ms).contains(&lease_ms) {
            Ok(lease_ms)
        } else {
            Err(QueueError::LeaseOutOfRange { lease_ms, min_ms, max_ms })
        }
    }

    /// Where subscription `sub`'s delivery state is, or the refusal.
    fn sub_at(&self, sub: SubscriptionId) -> Result<usize, QueueError> {
        self.sub_index(sub).ok_or(QueueError::UnknownSubscription(sub))
    }

    /// What happens to a main-lane message whose expiry has passed.
    fn expiry_event(&self, s: usize, offset: Offset, generation: Generation, now: Millis) -> Event {
        let sub = self.subs[s].id;
        if self.config.dead_letter_on_expiry {
            Event::Quarantined {
                sub,
                offset,
                generation,
                cause: QuarantineCause::Expired,
                reason: ReleaseReason::EXPIRED,
                at_ms: now,
            }
        } else {
            Event::Expired { sub, offset, generation, at_ms: now }
        }
    }
}
