//! A tiny driver shared by the queue tests: plays the partition's role
//! (decide → "append" with offsets → apply) and keeps the applied events so
//! tests can replay them.

use super::super::*;

pub const SECRET: [u8; 32] = [7; 32];

/// A durable watermark past every offset: for tests of decisions that do
/// not model the log's durability.
pub const ALL_DURABLE: Offset = Offset(u64::MAX);

pub fn ctx(config: QueueConfig, epoch: u64) -> PartitionContext {
    PartitionContext {
        queue: QueueId(3),
        partition: PartitionId(1),
        epoch: LeaderEpoch(epoch),
        secret: SECRET,
        config,
    }
}

pub fn id(n: u64) -> MessageId {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&n.to_le_bytes());
    MessageId(raw)
}

pub fn request(n: u64, priority: u8) -> EnqueueRequest {
    EnqueueRequest {
        message_id: id(n),
        priority,
        not_before_ms: 0,
        expiry_ms: None,
        size_bytes: 100,
    }
}

pub struct Harness {
    pub state: PartitionState,
    pub log: Vec<Event>,
    pub next_offset: u64,
    pub config: QueueConfig,
    pub epoch: u64,
}

impl Harness {
    pub fn new(config: QueueConfig) -> Self {
        let state = PartitionState::new(ctx(config.clone(), 1)).unwrap();
        Self { state, log: Vec::new(), next_offset: 0, config, epoch: 1 }
    }

    /// Applies events as the partition would, checking invariants after each.
    pub fn apply_all(&mut self, events: &[Event]) {
        for event in events {
            self.state.apply(event).unwrap();
            self.state.assert_invariants();
            self.log.push(*event);
            // Control records take log offsets too; leave a gap like the log does.
            self.next_offset += 1;
        }
    }

    /// Checks and (if accepted) appends + applies one enqueue.
    pub fn enqueue(
        &mut self,
        now: Millis,
        request: EnqueueRequest,
    ) -> (EnqueueDecision, Option<Offset>) {
        let decision = self.state.enqueue_check(now, &request).unwrap();
        if decision != EnqueueDecision::Accept {
            return (decision, None);
        }
        let offset = Offset(self.next_offset);
        self.apply_all(&[Event::Enqueued(EnqueueMeta::new(&request, offset, now))]);
        (decision, Some(offset))
    }

    /// Checks and (if accepted) appends + applies one enqueue of a record
    /// with routing key `key` (`None`: no key).
    pub fn enqueue_keyed(
        &mut self,
        now: Millis,
        request: EnqueueRequest,
        key: Option<&[u8]>,
    ) -> Option<Offset> {
        let decision = self.state.enqueue_check(now, &request).unwrap();
        if decision != EnqueueDecision::Accept {
            return None;
        }
        let offset = Offset(self.next_offset);
        let meta = EnqueueMeta::new(&request, offset, now).with_key(key.and_then(OrderKey::of));
        self.apply_all(&[Event::Enqueued(meta)]);
        Some(offset)
    }

    pub fn enqueue_ok(&mut self, now: Millis, request: EnqueueRequest) -> Offset {
        let (decision, offset) = self.enqueue(now, request);
        assert_eq!(decision, EnqueueDecision::Accept);
        offset.unwrap()
    }

    pub fn claim(
        &mut self,
        now: Millis,
        worker: u64,
        credits: u32,
        lease_ms: Option<Millis>,
    ) -> Vec<Delivery> {
        let request = ClaimRequest {
            sub: SubscriptionId::DEFAULT,
            worker: WorkerId(worker),
            credits,
            max_bytes: u64::MAX,
            lease_ms,
        };
        let decision = self.state.claim(now, &request, ALL_DURABLE).unwrap();
        self.apply_all(&decision.events);
        decision.deliveries
    }

    pub fn tick(&mut self, now: Millis) -> Vec<Event> {
        let events = self.state.tick(now, ALL_DURABLE);
        self.apply_all(&events);
        events
    }

    pub fn ack(&mut self, now: Millis, delivery: &Delivery) -> Result<(), QueueError> {
        let event = self.state.ack(now, &delivery.token)?;
        self.apply_all(&[event]);
        Ok(())
    }

    pub fn release(
        &mut self,
        now: Millis,
        delivery: &Delivery,
        reason: u16,
        not_before: Option<Millis>,
    ) -> Result<Event, QueueError> {
        let event = self.state.release(now, &delivery.token, ReleaseReason(reason), not_before)?;
        self.apply_all(&[event]);
        Ok(event)
    }

    /// A state rebuilt by replaying every applied event under `epoch`.
    pub fn replay(&self, epoch: u64) -> PartitionState {
        let mut state = PartitionState::new(ctx(self.config.clone(), epoch)).unwrap();
        for event in &self.log {
            state.apply(event).unwrap();
        }
        state.assert_invariants();
        state
    }

    /// Simulates a restart: replay everything under the next epoch.
    pub fn restart(&mut self) {
        self.epoch += 1;
        self.state = self.replay(self.epoch);
    }
}
