//! The queue state machine of one partition: pure, deterministic, replayable.
//!
//! Owns: message states (ready, scheduled, claimed, acked, quarantined,
//! expired), leases and claim generations, delivery tokens, the dead-letter
//! queue, scheduling and expiry, priority fairness, dedupe, admission,
//! checkpoints and the retention watermark. Does not own: record bytes (they
//! stay in the log), I/O of any kind, clocks (`now: Millis` is an argument),
//! async, or glommio. State uses ordered maps only, so a replay repeats
//! exactly. Semantics are defined once in `docs/design/queue-semantics.md`.
//!
//! # Interface for the partition (decide → append → apply)
//!
//! ```text
//! PartitionState::new(PartitionContext { queue, partition, epoch, secret, config }) -> Result<Self, ConfigError>
//! PartitionState::restore(bytes, ctx) -> Result<Restored { state, covers }, CodecError>
//! state.snapshot(covers: Offset) -> Vec<u8>
//! state.begin_snapshot(covers) -> SnapshotEncoder       // the same bytes, in steps, while serving:
//! state.snapshot_step(&mut encoder, budget, &mut out) -> Result<done, CodecError>
//! state.end_snapshot()
//!
//! // decisions: read-only, return events to append (nothing changes)
//! state.admission(now) -> Admission;  admission.check(&EnqueueRequest) -> Result<EnqueueDecision, QueueError>
//! state.enqueue_check(now, &EnqueueRequest) -> Result<EnqueueDecision, QueueError>
//! state.claim(now, &ClaimRequest, durable_end: Offset) -> Result<ClaimDecision { events, deliveries }, QueueError>
//! state.claim_dead_letters(now, &ClaimRequest, durable_end: Offset) -> Result<ClaimDecision, QueueError>
//! state.extend(now, &DeliveryToken, lease_ms: Option<Millis>) -> Result<(Event, deadline_ms), QueueError>
//! state.ack(now, &DeliveryToken) -> Result<Event, QueueError>
//! state.release(now, &DeliveryToken, ReleaseReason, not_before_ms: Option<Millis>) -> Result<Event, QueueError>
//! state.tick(now, durable_end) -> Vec<Event>  // lease expiry, scheduled → ready, expiry of durable records; call at next_wakeup()
//! state.fence(now, limit) -> Vec<Event>  // at open: end every claim of an older epoch at once
//! state.redrive(now, Redrive) -> Result<Vec<Event>, QueueError>
//! state.purge(now, Lane, max, durable_end) -> Vec<Event>;  state.purgeable(Lane, durable_end) -> u64
//! state.peek_dead_letters(after, max) -> Vec<MessageView>
//!
//! // the only mutation, live and on replay
//! state.apply(&Event) -> Result<(), ApplyError>
//!
//! // reads
//! state.counters(now) -> QueueCounters;  state.retention_watermark() -> Option<Offset>
//! state.next_wakeup() -> Option<Millis>;  state.assert_invariants()
//! ```
//!
//! Enqueue: the partition extracts an [`EnqueueRequest`] from each data
//! record, checks it (`Accept` / `Duplicate { original }` / `QueueFull`),
//! appends the accepted records, and applies `Event::Enqueued(EnqueueMeta)`
//! with the offset and enqueue time the log assigned. Every other event is
//! encoded with [`Event::encode`] into a control-batch record and decoded on
//! replay with [`Event::decode`].
//!
//! Ordering rule: apply a decision's events (in order) before making the
//! next decision. The log assigns offsets synchronously at append, so the
//! partition can apply right after appending and reply after the sync (or,
//! for claims, extends and releases, before it: claims hand out only
//! records below the durable watermark they are given, and the epoch fence
//! ends at open every claim a crash may have lost). Claims, ticks and purges
//! decide only on records below that watermark, and no event's effect depends
//! on records above it, so a control event may also be written ahead of data
//! appended before it (the shard journal's control lane). Two
//! decisions made on the same state without applying between them may
//! conflict; `apply` then refuses the second with an `ApplyError` and
//! changes nothing.

mod chunk_map;
mod claim_age;
pub mod config;
mod decide;
mod dedupe;
pub mod error;
pub mod event;
mod fairness;
mod fresh;
mod lanes;
pub mod limits;
pub mod members;
mod snapshot;
mod state;
pub mod stored;
pub mod token;
pub mod types;

#[cfg(test)]
mod tests;

pub use config::{Backoff, ConfigError, QueueConfig};
pub use decide::{
    Admission, AdmissionIds, ClaimDecision, ClaimRequest, Delivery, EnqueueDecision, FullLimit,
    Redrive,
};
pub use dedupe::GenerationRef;
pub use error::{ApplyError, CodecError, InvalidToken, QueueError, StaleToken};
pub use event::{Event, EventKind, CLAIMED_EVENT_BYTES, EVENT_BYTES};
pub use members::{MemberStep, Members, MembershipChange};
pub use snapshot::{PendingRestore, Restored, SnapshotEncoder};
pub use state::{
    LaneCounters, LoggedKeyMap, Loss, MessagePhase, MessageView, PartitionContext, PartitionState,
    QueueCounters, Totals,
};
pub use token::{DeliveryToken, TokenClaim, TokenKey, DELIVERY_TOKEN_BYTES};
pub use types::{
    EnqueueMeta, EnqueueRequest, Generation, Lane, LeaderEpoch, MessageId, Millis, Offset,
    OrderKey, PartitionId, QuarantineCause, QueueId, ReleaseReason, SubscriptionId, WorkerId,
};
