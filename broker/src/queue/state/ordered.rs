//! Ordered lanes in the fold (`docs/design/ordered-lanes.md`): in an
//! ordered subscription a keyed message whose key already has a message
//! here waits (`WarmPhase::Waiting`, in no claim index) until every
//! earlier message of its key finished; then it becomes ready (or
//! scheduled, if its delay has not passed). `queue/lanes.rs` keeps which
//! message heads each key.
//!
//! Everything here runs inside `apply`, so a replay, a replica and a
//! restored checkpoint order exactly as the live state did.

use super::{LaneCounters, PartitionState, Warm, WarmPhase};
use crate::queue::error::ApplyError;
use crate::queue::lanes::Place;
use crate::queue::types::{EnqueueMeta, Millis, Offset, OrderKey, SubscriptionId};

impl PartitionState {
    /// Places a new keyed record in subscription index `s`'s lanes when
    /// `s` is ordered. `true`: it waits behind its key's head (now a
    /// `Waiting` warm entry of `s`); `false`: it goes where an unordered
    /// record would (it heads its key's lane, or is unkeyed).
    pub(super) fn lane_arrive(
        &mut self,
        s: usize,
        meta: &EnqueueMeta,
        band: usize,
        enqueue_time_ms: Millis,
        expiry_ms: Millis,
    ) -> bool {
        let Some(key) = meta.key else { return false };
        let Some(lanes) = self.subs[s].lanes.as_mut() else { return false };
        if lanes.arrive(key, meta.offset) == Place::Head {
            return false;
        }
        let due_ms = if meta.not_before_ms > enqueue_time_ms { meta.not_before_ms } else { 0 };
        let phase = WarmPhase::Waiting { due_ms, key };
        let warm = Warm::arrived(enqueue_time_ms, expiry_ms, meta.size_bytes, band, phase);
        self.insert_warm(s, meta.offset, warm);
        true
    }

    /// Main-lane message `offset` of subscription index `s`, in `phase`
    /// when it left, is gone for good (acked, dead-lettered, expired,
    /// purged): a waiting one leaves its lane; a head hands its lane to
    /// the key's next message, which becomes ready at `at_ms` (scheduled
    /// if its delay is later).
    pub(super) fn lane_left(&mut self, s: usize, offset: Offset, phase: WarmPhase, at_ms: Millis) {
        let Some(lanes) = self.subs[s].lanes.as_mut() else { return };
        if let WarmPhase::Waiting { key, .. } = phase {
            lanes.waiting_left(key, offset);
            return;
        }
        let Some(next) = lanes.head_left(offset) else { return };
        let mut warm = self.take_main(s, next).expect("a waiting message is warm").warm;
        let WarmPhase::Waiting { due_ms, .. } = warm.phase else {
            panic!("lane head {next:?} was not waiting: {:?}", warm.phase)
        };
        warm.phase = if due_ms > at_ms {
            WarmPhase::Scheduled { due_ms }
        } else {
            WarmPhase::Ready { since_ms: at_ms }
        };
        self.insert_warm(s, next, warm);
    }

    /// When `key` has no lane in some ordered subscription (a message of
    /// it would make one more active key there): the most active keys of
    /// those subscriptions. `None`: the queue is unordered, or every
    /// ordered subscription has a lane of `key`. O(subscriptions).
    pub(crate) fn active_keys_without(&self, key: OrderKey) -> Option<usize> {
        self.subs
            .iter()
            .filter_map(|d| d.lanes.as_ref())
            .filter(|lanes| lanes.lane_of_head(key).is_none())
            .map(|lanes| lanes.active_keys())
            .max()
    }

    /// The lane counters of subscription index `s`. O(1).
    pub(super) fn lane_counters(&self, s: usize) -> LaneCounters {
        let d = &self.subs[s];
        let Some(lanes) = &d.lanes else { return LaneCounters::default() };
        let oldest = lanes.oldest_waiting();
        LaneCounters {
            active_keys: lanes.active_keys() as u64,
            blocked_keys: lanes.blocked_keys() as u64,
            waiting: lanes.waiting() as u64,
            oldest_waiting: oldest.and_then(|(offset, _)| {
                d.warm.get(&offset).map(|warm| (offset, warm.enqueue_time_ms))
            }),
            blocking_head: oldest.and_then(|(_, key)| lanes.lane_of_head(key)),
        }
    }

    /// Refuses a subscription start on an ordered queue: its lanes would
    /// need the keys of the shared backlog, which the shared index does
    /// not keep (`docs/design/ordered-lanes.md`, "Not yet").
    pub(super) fn refuse_ordered_start(&self, sub: SubscriptionId) -> Result<(), ApplyError> {
        if self.config.ordered {
            return Err(ApplyError::Subscription {
                sub,
                what: "an ordered queue has only its default subscription",
            });
        }
        Ok(())
    }
}
