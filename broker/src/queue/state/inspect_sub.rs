//! What an operator sees of one subscription: its live main-lane messages
//! from an offset (Peek), its dead letters (DeadLetters) and how many of a
//! lane a purge would take (a dry-run Purge). The decisions that change
//! a subscription (`purge_sub`, `redrive_sub`) are in `decide/operator.rs`.
//!
//! Each answers `None` when the partition has no such subscription (not
//! started in its log yet, or ended): the caller decides what that means.
//! Reads only; time is not needed (a view carries its own timestamps).

use super::{MessageView, PartitionState};
use crate::queue::limits::PEEK_MAX;
use crate::queue::types::{Lane, Offset, SubscriptionId};

impl PartitionState {
    /// Subscription `sub`'s live main-lane messages (ready, scheduled,
    /// claimed) at `from` or later, in offset order, at most `max`
    /// (bounded by `PEEK_MAX`). O(live messages of `sub`): an operator's
    /// request, never the data path.
    pub fn peek_sub(
        &self,
        sub: SubscriptionId,
        from: Offset,
        max: usize,
    ) -> Option<Vec<MessageView>> {
        let messages = self.messages_of(sub)?;
        Some(
            messages
                .into_iter()
                .filter(|view| view.lane == Lane::Main && view.offset >= from)
                .take(max.min(PEEK_MAX))
                .collect(),
        )
    }

    /// [`PartitionState::peek_dead_letters`] of subscription `sub`.
    pub fn peek_dead_letters_sub(
        &self,
        sub: SubscriptionId,
        after: Option<Offset>,
        max: usize,
    ) -> Option<Vec<MessageView>> {
        let s = self.sub_index(sub)?;
        Some(self.peek_dead_letters_at(s, after, max))
    }

    /// [`PartitionState::purgeable`] of subscription `sub`.
    pub fn purgeable_sub(
        &self,
        sub: SubscriptionId,
        lane: Lane,
        durable_end: Offset,
    ) -> Option<u64> {
        let s = self.sub_index(sub)?;
        Some(self.purgeable_at(s, lane, durable_end))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a panic is the failure report
mod tests {
    use crate::queue::{
        Backoff, ClaimDecision, ClaimRequest, EnqueueMeta, EnqueueRequest, Event, Lane,
        LeaderEpoch, MessageId, MessagePhase, Offset, PartitionContext, PartitionId,
        PartitionState, QueueConfig, QueueId, Redrive, ReleaseReason, SubscriptionId, WorkerId,
    };

    const ALL_DURABLE: Offset = Offset(u64::MAX);
    const A: SubscriptionId = SubscriptionId(1);
    const B: SubscriptionId = SubscriptionId(2);

    fn state() -> PartitionState {
        let config = QueueConfig {
            max_deliveries: 1,
            backoff: Backoff::Linear { step_ms: 0, max_ms: 0 },
            ..QueueConfig::default()
        };
        let ctx = PartitionContext {
            queue: QueueId(3),
            partition: PartitionId(1),
            epoch: LeaderEpoch(1),
            secret: [7; 32],
            config,
        };
        let mut state = PartitionState::new(ctx).unwrap();
        for sub in [A, B] {
            let started = Event::SubscriptionStarted { sub, from: Offset(0), at_ms: 10 };
            state.apply(&started).unwrap();
        }
        for offset in 0..10u64 {
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&offset.to_le_bytes());
            let request = EnqueueRequest {
                message_id: MessageId(raw),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: None,
                size_bytes: 10,
            };
            let event = Event::Enqueued(EnqueueMeta::new(&request, Offset(offset), 100));
            state.apply(&event).unwrap();
        }
        state
    }

    /// Claims `credits` in `sub` at `now`; applies and returns the decision.
    fn claim(state: &mut PartitionState, sub: SubscriptionId, credits: u32) -> ClaimDecision {
        let request =
            ClaimRequest { sub, worker: WorkerId(1), credits, max_bytes: u64::MAX, lease_ms: None };
        let mut decision = ClaimDecision::default();
        state.claim_into(200, &request, ALL_DURABLE, &mut decision).unwrap();
        for event in &decision.events {
            state.apply(event).unwrap();
        }
        decision
    }

    fn offsets(views: &[crate::queue::MessageView]) -> Vec<u64> {
        views.iter().map(|view| view.offset.0).collect()
    }

    /// `a` acks its first four, `b` releases its first three (max
    /// deliveries 1: dead letters of `b` alone), the default is untouched.
    fn consumed() -> PartitionState {
        let mut state = state();
        for delivery in claim(&mut state, A, 4).deliveries {
            let event = state.ack(300, &delivery.token).unwrap();
            state.apply(&event).unwrap();
        }
        for delivery in claim(&mut state, B, 3).deliveries {
            let event = state.release(300, &delivery.token, ReleaseReason(1), None).unwrap();
            state.apply(&event).unwrap();
        }
        state.assert_invariants();
        state
    }

    // Goal: a peek of a subscription shows its own live main-lane messages
    // (not another's acks or dead letters), from an offset, bounded; an
    // unknown subscription is `None`; method: three subscriptions consumed
    // differently over one log.
    #[test]
    fn peek_shows_each_subscriptions_own_messages() {
        let mut state = consumed();
        let default = state.peek_sub(SubscriptionId::DEFAULT, Offset(0), 100).unwrap();
        assert_eq!(offsets(&default), (0..10).collect::<Vec<_>>());
        assert_eq!(default, state.messages().into_iter().collect::<Vec<_>>());
        assert_eq!(
            offsets(&state.peek_sub(A, Offset(0), 100).unwrap()),
            (4..10).collect::<Vec<_>>()
        );
        assert_eq!(
            offsets(&state.peek_sub(B, Offset(0), 100).unwrap()),
            (3..10).collect::<Vec<_>>()
        );
        assert_eq!(offsets(&state.peek_sub(B, Offset(5), 2).unwrap()), vec![5, 6]);
        assert!(state.peek_sub(A, Offset(10), 100).unwrap().is_empty());
        assert_eq!(state.peek_sub(SubscriptionId(9), Offset(0), 100), None);
        // A claimed message shows as claimed in its subscription alone.
        let claimed = claim(&mut state, A, 1);
        let offset = claimed.deliveries[0].token.claim().offset;
        let in_a = state.peek_sub(A, offset, 1).unwrap();
        assert!(matches!(in_a[0].phase, MessagePhase::Claimed { .. }));
        let in_b = state.peek_sub(B, offset, 1).unwrap();
        assert!(matches!(in_b[0].phase, MessagePhase::Ready { .. }));
    }

    // Goal: dead letters are listed per subscription, paged by `after`
    // and `max`, and a redrive of one subscription's brings them back in
    // that subscription alone; method: `b`'s three dead letters.
    #[test]
    fn dead_letters_and_redrive_are_per_subscription() {
        let mut state = consumed();
        let dead = state.peek_dead_letters_sub(B, None, 100).unwrap();
        assert_eq!(offsets(&dead), vec![0, 1, 2]);
        assert!(dead.iter().all(|view| view.lane == Lane::DeadLetter));
        assert_eq!(offsets(&state.peek_dead_letters_sub(B, Some(Offset(0)), 1).unwrap()), vec![1]);
        assert!(state.peek_dead_letters_sub(A, None, 100).unwrap().is_empty());
        assert!(state
            .peek_dead_letters_sub(SubscriptionId::DEFAULT, None, 100)
            .unwrap()
            .is_empty());
        assert_eq!(
            state.peek_dead_letters_sub(SubscriptionId::DEFAULT, None, 100).unwrap(),
            state.peek_dead_letters(None, 100)
        );
        assert_eq!(state.peek_dead_letters_sub(SubscriptionId(9), None, 100), None);
        assert_eq!(state.purgeable_sub(B, Lane::DeadLetter, ALL_DURABLE), Some(3));
        assert_eq!(state.purgeable_sub(A, Lane::DeadLetter, ALL_DURABLE), Some(0));

        let events = state.redrive_sub(B, 400, Redrive::Oldest(10)).unwrap();
        assert_eq!(events.len(), 3);
        for event in &events {
            assert_eq!(event.subscription(), Some(B));
            state.apply(event).unwrap();
        }
        state.assert_invariants();
        assert!(state.peek_dead_letters_sub(B, None, 100).unwrap().is_empty());
        assert_eq!(
            offsets(&state.peek_sub(B, Offset(0), 100).unwrap()),
            (0..10).collect::<Vec<_>>()
        );
        assert_eq!(
            offsets(&state.peek_sub(A, Offset(0), 100).unwrap()),
            (4..10).collect::<Vec<_>>()
        );
    }

    // Goal: a dry run's count per subscription is what repeated purges of
    // that subscription take, and those purges leave every other
    // subscription as it was; method: purge `a` in pages of two.
    #[test]
    fn purgeable_counts_what_purges_of_the_subscription_take() {
        let mut state = consumed();
        claim(&mut state, A, 1);
        let before_default = state.peek_sub(SubscriptionId::DEFAULT, Offset(0), 100).unwrap();
        let before_b = state.peek_sub(B, Offset(0), 100).unwrap();
        let dead_b = state.peek_dead_letters_sub(B, None, 100).unwrap();
        let counted = state.purgeable_sub(A, Lane::Main, ALL_DURABLE).unwrap();
        assert_eq!(counted, 5, "six live in `a`, one of them claimed");
        assert_eq!(state.purgeable_sub(B, Lane::Main, ALL_DURABLE), Some(7));
        assert_eq!(state.purgeable_sub(SubscriptionId(9), Lane::Main, ALL_DURABLE), None);
        // Not past the durable end: offsets 8 and 9 wait for their sync.
        assert_eq!(state.purgeable_sub(A, Lane::Main, Offset(8)), Some(3));
        let mut taken = 0;
        loop {
            let events = state.purge_sub(A, 500, Lane::Main, 2, ALL_DURABLE).unwrap();
            if events.is_empty() {
                break;
            }
            taken += events.len() as u64;
            for event in &events {
                state.apply(event).unwrap();
            }
        }
        state.assert_invariants();
        assert_eq!(taken, counted);
        assert_eq!(state.purgeable_sub(A, Lane::Main, ALL_DURABLE), Some(0));
        let left = state.peek_sub(A, Offset(0), 100).unwrap();
        assert_eq!(left.len(), 1);
        assert!(matches!(left[0].phase, MessagePhase::Claimed { .. }));
        assert_eq!(
            state.peek_sub(SubscriptionId::DEFAULT, Offset(0), 100).unwrap(),
            before_default
        );
        assert_eq!(state.peek_sub(B, Offset(0), 100).unwrap(), before_b);
        assert_eq!(state.peek_dead_letters_sub(B, None, 100).unwrap(), dead_b);
    }
}
