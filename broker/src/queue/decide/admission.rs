//! Enqueue decisions: an [`Admission`] checks the enqueues of one data
//! batch, in order, against the dedupe window, the ids accepted earlier in
//! the batch, the queue's `max_messages` and `max_bytes` (dead letters
//! count) and, in an ordered queue, its most active keys
//! ([`ORDERED_ACTIVE_KEYS_MAX`]), counting what it accepted so far.
//!
//! Changes nothing: the partition appends the accepted records and applies
//! their `Enqueued` events (`state/apply.rs` records the ids in the dedupe
//! table). A batch checked with ids the caller lends ([`AdmissionIds`],
//! `admission_with`) must allocate nothing once those have room for it.

use std::collections::{HashMap, HashSet};

use crate::queue::error::QueueError;
use crate::queue::limits::{ADMISSION_BATCH_MAX, ORDERED_ACTIVE_KEYS_MAX};
use crate::queue::state::PartitionState;
use crate::queue::types::{EnqueueRequest, MessageId, Millis, Offset, OrderKey};

/// Outcome of an admission check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnqueueDecision {
    /// Append it; then apply `Event::Enqueued` with the assigned offset.
    Accept,
    /// Seen within the dedupe window: reply with the original offset, append nothing.
    Duplicate { original: Offset },
    /// The same id appeared earlier in this admission batch (not yet
    /// appended): reply with that record's offset once it has one.
    DuplicateInBatch { index: usize },
    /// The queue's held messages (main lane plus dead letters) would pass
    /// `max_messages` or `max_bytes`: reply QUEUE_FULL, append nothing.
    QueueFull { limit: FullLimit },
    /// The queue is ordered, the record's key has no message here and the
    /// partition already has `max` active keys: reply ACTIVE_KEYS_FULL,
    /// append nothing.
    ActiveKeysFull { max: usize },
}

/// Which admission limit refused an enqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullLimit {
    Messages,
    Bytes,
}

impl std::fmt::Display for FullLimit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            FullLimit::Messages => "max_messages",
            FullLimit::Bytes => "max_bytes",
        })
    }
}

/// Ids accepted earlier in one admission batch, with their index in it. An
/// owner that checks many batches (a partition) keeps one and lends it to
/// each ([`PartitionState::admission_with`]), so a batch allocates nothing
/// for it. Ids are client-chosen: the map hashes them with std's keyed
/// SipHash (`RandomState`).
#[derive(Debug, Default)]
pub struct AdmissionIds {
    ids: HashMap<MessageId, usize>,
    /// Keys of an ordered queue this batch makes active (accepted, and
    /// with no lane yet): they count against the active-keys limit once.
    new_keys: HashSet<OrderKey>,
}

impl AdmissionIds {
    /// Forgets every id, keeping the allocation.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.new_keys.clear();
    }

    /// Ids it has room for without allocating.
    pub fn capacity(&self) -> usize {
        self.ids.capacity()
    }
}

/// An admission's in-batch ids: its own, or lent by the caller.
#[derive(Debug)]
enum BatchIds<'a> {
    Own(AdmissionIds),
    Lent(&'a mut AdmissionIds),
}

impl BatchIds<'_> {
    fn get(&mut self) -> &mut AdmissionIds {
        match self {
            BatchIds::Own(ids) => ids,
            BatchIds::Lent(ids) => ids,
        }
    }

    fn ids(&mut self) -> &mut HashMap<MessageId, usize> {
        &mut self.get().ids
    }
}

/// Checks the enqueues of one data batch against dedupe and admission,
/// counting the ones it accepted so far (they are not applied yet).
#[derive(Debug)]
pub struct Admission<'a> {
    state: &'a PartitionState,
    now: Millis,
    checked: usize,
    accepted_messages: u64,
    accepted_bytes: u64,
    /// Ids accepted earlier in this batch, and their index in it.
    batch_ids: BatchIds<'a>,
    /// Most active keys of an ordered subscription: the queue's limit
    /// ([`ORDERED_ACTIVE_KEYS_MAX`]) unless a test lowered it.
    active_keys_max: usize,
}

impl Admission<'_> {
    /// The same admission with the active-keys limit at `max` instead of
    /// [`ORDERED_ACTIVE_KEYS_MAX`] (for tests: reaching the real limit
    /// takes millions of keys). A value above the limit is clamped to it.
    #[must_use]
    pub fn with_active_keys_max(mut self, max: usize) -> Self {
        self.active_keys_max = max.min(ORDERED_ACTIVE_KEYS_MAX);
        self
    }

    /// The active-keys limit this admission applies.
    pub fn active_keys_max(&self) -> usize {
        self.active_keys_max
    }

    /// Decides one enqueue of the batch (of a record without a routing
    /// key, or where its key does not matter).
    ///
    /// # Errors
    /// [`QueueError::PriorityOutOfRange`], [`QueueError::AdmissionBatchFull`].
    pub fn check(&mut self, request: &EnqueueRequest) -> Result<EnqueueDecision, QueueError> {
        self.check_keyed(request, None)
    }

    /// Decides one enqueue of the batch whose record has `key`
    /// (`OrderKey::of` its routing key): in an ordered queue a key with no
    /// message here makes one more active key, refused past
    /// [`ORDERED_ACTIVE_KEYS_MAX`].
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn check_keyed(
        &mut self,
        request: &EnqueueRequest,
        key: Option<OrderKey>,
    ) -> Result<EnqueueDecision, QueueError> {
        let bands = self.state.config.bands();
        if usize::from(request.priority) >= bands {
            return Err(QueueError::PriorityOutOfRange { priority: request.priority, bands });
        }
        if self.checked >= ADMISSION_BATCH_MAX {
            return Err(QueueError::AdmissionBatchFull { max: ADMISSION_BATCH_MAX });
        }
        let index = self.checked;
        self.checked += 1;
        if let Some(original) = self.state.dedupe_hit(self.now, &request.message_id) {
            return Ok(EnqueueDecision::Duplicate { original });
        }
        if let Some(&first) = self.batch_ids.ids().get(&request.message_id) {
            return Ok(EnqueueDecision::DuplicateInBatch { index: first });
        }
        // Dead letters count: a quarantine is a move inside the queue, not a
        // departure, so failing workers cannot make room for more work.
        let config = &self.state.config;
        if self.state.held_messages() + self.accepted_messages + 1 > config.max_messages {
            return Ok(EnqueueDecision::QueueFull { limit: FullLimit::Messages });
        }
        let bytes = u64::from(request.size_bytes);
        if self.state.held_bytes() + self.accepted_bytes + bytes > config.max_bytes {
            return Ok(EnqueueDecision::QueueFull { limit: FullLimit::Bytes });
        }
        if let Some(key) = key {
            if let Some(active) = self.state.active_keys_without(key) {
                let new_keys = &mut self.batch_ids.get().new_keys;
                if !new_keys.contains(&key) {
                    if active + new_keys.len() >= self.active_keys_max {
                        return Ok(EnqueueDecision::ActiveKeysFull { max: self.active_keys_max });
                    }
                    new_keys.insert(key);
                }
            }
        }
        self.accepted_messages += 1;
        self.accepted_bytes += bytes;
        self.batch_ids.ids().insert(request.message_id, index);
        Ok(EnqueueDecision::Accept)
    }
}

impl PartitionState {
    /// Starts checking one data batch's enqueues.
    pub fn admission(&self, now: Millis) -> Admission<'_> {
        self.dedupe.begin_admission();
        Admission {
            state: self,
            now,
            checked: 0,
            accepted_messages: 0,
            accepted_bytes: 0,
            batch_ids: BatchIds::Own(AdmissionIds::default()),
            active_keys_max: ORDERED_ACTIVE_KEYS_MAX,
        }
    }

    /// [`PartitionState::admission`] with the in-batch ids kept in `ids`
    /// (cleared here), so checking a batch allocates nothing once `ids` has
    /// room for it.
    pub fn admission_with<'a>(&'a self, now: Millis, ids: &'a mut AdmissionIds) -> Admission<'a> {
        ids.clear();
        self.dedupe.begin_admission();
        Admission {
            state: self,
            now,
            checked: 0,
            accepted_messages: 0,
            accepted_bytes: 0,
            batch_ids: BatchIds::Lent(ids),
            active_keys_max: ORDERED_ACTIVE_KEYS_MAX,
        }
    }

    /// Checks a single enqueue (an admission batch of one).
    ///
    /// # Errors
    /// As [`Admission::check`].
    pub fn enqueue_check(
        &self,
        now: Millis,
        request: &EnqueueRequest,
    ) -> Result<EnqueueDecision, QueueError> {
        self.admission(now).check(request)
    }

    /// The original offset if `id` was enqueued within the dedupe window.
    pub(crate) fn dedupe_hit(&self, now: Millis, id: &MessageId) -> Option<Offset> {
        self.dedupe.hit(now, id)
    }
}
