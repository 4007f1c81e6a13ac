//! The assignment table: which queues exist and which shard owns each
//! queue partition.
//!
//! Owns the versioned map queue → (queue id, config, partitions → shard), the
//! reverse index queue id → name, the message that changes it
//! ([`AssignmentUpdate`]) and placement (round-robin of partitions over
//! shards). Every shard holds its own copy and applies the same updates
//! in the same order, so copies agree by construction; an update whose
//! version is not exactly `current + 1` is refused, so a lost or reordered
//! message is detected instead of silently diverging. Pure: no I/O, no
//! clock, no glommio. It does not open partitions (the shard's hooks do that
//! when an update names them), it does not allocate queue ids (the control
//! executor does, so ids survive deletes) and it does not persist itself
//! (`control::catalog` does, on the coordinator).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use thiserror::Error;

use crate::queue::{ConfigError, QueueConfig, QueueId, SubscriptionId};

/// Suffix that names a queue's dead-letter lane (`jobs.dlq` is the lane of
/// `jobs` in a Claim), so no new queue may end with it.
pub use spool_wire::proto::DEAD_LETTER_SUFFIX;

/// A shard: one executor, one core, one port (`base_port + ShardId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u16);

/// The table's bounds, defined in [`crate::limits`] (and the queue name's in
/// the wire's limits); re-exported for their existing paths.
pub use crate::limits::{PARTITIONS_PER_NODE_MAX, PARTITIONS_PER_QUEUE_MAX, QUEUES_MAX};

mod replicas;
mod subscriptions;
use replicas::check_replica_sets;
use spool_wire::proto::limits::QUEUE_NAME_BYTES_MAX;
/// A partition's index within its queue, and the version of the whole table
/// (it increases by one with every update): the wire's types, one definition
/// each in the workspace.
pub use spool_wire::proto::{AssignmentVersion, PartitionId};
pub use subscriptions::{
    SubscriptionEntry, SubscriptionStart, Subscriptions, DEFAULT_SUBSCRIPTION,
};

/// A validated queue name: 1..=128 bytes of `[A-Za-z0-9._-]`, so it is safe
/// as a directory name and in logs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName(String);

impl QueueName {
    /// # Errors
    /// [`AssignmentError::InvalidQueueName`] if empty, too long or with a
    /// character outside `[A-Za-z0-9._-]` (or `.`/`..`).
    pub fn new(name: &str) -> Result<QueueName, AssignmentError> {
        let valid_chars = name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
        let valid = !name.is_empty()
            && name.len() <= QUEUE_NAME_BYTES_MAX
            && valid_chars
            && name != "."
            && name != "..";
        if !valid {
            return Err(AssignmentError::InvalidQueueName { name: name.to_owned() });
        }
        Ok(QueueName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// Where one partition lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionAssignment {
    pub shard: ShardId,
    /// Table version at which the partition got this shard. Later moves will
    /// bump it; the partition's leader epoch is separate (bumped on open).
    pub assigned_at: AssignmentVersion,
}

/// Everything the table knows of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// Allocated by the coordinator; never reused in this data dir.
    pub id: QueueId,
    /// Validated; shared with the update that created the queue.
    pub config: Arc<QueueConfig>,
    /// Table version whose update created the queue (replay order).
    pub created_at: AssignmentVersion,
    /// Indexed by partition id.
    pub partitions: Vec<PartitionAssignment>,
    /// How keys are placed over the partitions, and a resize's hold.
    pub keys: KeyPlacement,
    /// In a cluster, the replica set of each partition re-placed since its
    /// creation (its nodes, the preferred leader first); a partition not
    /// named here keeps the placer's set. Empty on one node.
    pub replicas: ReplicaSets,
    /// Its subscriptions besides the default.
    pub subscriptions: Subscriptions,
}

/// Replica sets that differ from the placer's, by partition.
pub type ReplicaSets = BTreeMap<PartitionId, ReplicaSet>;

/// A partition's replica set in the table: where it is being re-placed to,
/// and whether its group's members are that set yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSet {
    /// The nodes, the preferred leader first.
    pub nodes: Vec<u64>,
    /// The group's leader reported its voters are exactly `nodes` (no
    /// learner left): a node no longer named may remove its replica.
    pub settled: bool,
}

/// A queue's key map (`docs/design/replication.md`, "Resizing a queue"):
/// keys are placed over all its partitions by jump consistent hash, so a
/// resize from `n` to `m` moves a key only into a partition `n..m`. While
/// an older partition has not finished the records it took before the
/// resize (`draining`), the partitions from `held_from` on hand out
/// nothing, so a moved key's new messages never go out before its earlier
/// ones are finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlacement {
    /// 1 at creation, + 1 per resize.
    pub version: u64,
    /// The first partition the last resize added (the partition count when
    /// the queue never grew).
    pub held_from: u32,
    /// Older partitions still finishing what they took before the resize.
    pub draining: BTreeSet<PartitionId>,
}

impl KeyPlacement {
    /// The key map of a queue created with `partitions` partitions.
    pub fn fresh(partitions: u32) -> KeyPlacement {
        KeyPlacement { version: 1, held_from: partitions, draining: BTreeSet::new() }
    }

    /// Whether `partition` hands out nothing until the older partitions
    /// drain.
    pub fn holds(&self, partition: PartitionId) -> bool {
        !self.draining.is_empty() && partition.0 >= self.held_from
    }
}

/// One change to the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignmentChange {
    /// A new queue whose partition `i` lives on `shards[i]`: everything a
    /// shard needs to open the partitions it owns.
    CreateQueue {
        queue: QueueName,
        queue_id: QueueId,
        shards: Vec<ShardId>,
        config: Arc<QueueConfig>,
        /// [`KeyPlacement::fresh`] for a new queue; a catalog's replay
        /// carries the map the queue had.
        keys: KeyPlacement,
        /// Empty for a new queue; a catalog's replay carries the sets the
        /// queue's partitions were re-placed to.
        replicas: ReplicaSets,
        /// Empty for a new queue; a catalog's replay carries the queue's
        /// subscriptions.
        subscriptions: Subscriptions,
    },
    /// Remove a queue and all its partitions.
    DeleteQueue { queue: QueueName },
    /// Add partitions to a queue: partition `n + i` (for the queue's `n`
    /// partitions) lives on `shards[i]`. The key map's version grows by
    /// one and every older partition starts draining.
    GrowQueue { queue: QueueName, shards: Vec<ShardId> },
    /// Older partition `partition` of `queue` finished every record it took
    /// before the resize that made key map `key_version`.
    KeysDrained { queue: QueueName, key_version: u64, partition: PartitionId },
    /// In a cluster, partition `partition` of `queue` is re-placed from the
    /// replica set `from` (what the table holds for it, or the placer's set
    /// when the table holds none) to `to`, which differs from it by one
    /// member at most each way. Naming `from` makes a late or repeated
    /// proposal refused instead of applied twice.
    SetReplicas { queue: QueueName, partition: PartitionId, from: Vec<u64>, to: Vec<u64> },
    /// The group of partition `partition` of `queue` has exactly the
    /// voters `nodes` (the set the table re-placed it to) and no learner.
    ReplicasSettled { queue: QueueName, partition: PartitionId, nodes: Vec<u64> },
    /// `queue` gains subscription `name` with id `id` (the queue's next),
    /// starting at `start` on each partition.
    Subscribe { queue: QueueName, name: String, id: SubscriptionId, start: SubscriptionStart },
    /// `queue` loses subscription `name`.
    Unsubscribe { queue: QueueName, name: String },
    /// Subscription `name` of `queue` starts over at `start` under a new id
    /// `id` (the queue's next): each partition ends the old id and starts
    /// the new, so every token of the old one is refused.
    Reseek { queue: QueueName, name: String, id: SubscriptionId, start: SubscriptionStart },
}

/// The message the coordinator sends to every shard: a change and the
/// table version it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentUpdate {
    pub version: AssignmentVersion,
    pub change: AssignmentChange,
}

/// Why an update or a plan was refused. The table is unchanged after any.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AssignmentError {
    #[error("update version {} does not follow table version {}", got.0, current.0)]
    VersionGap { current: AssignmentVersion, got: AssignmentVersion },
    #[error("queue {0} already exists")]
    QueueExists(QueueName),
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("invalid queue name {name:?}: 1..={QUEUE_NAME_BYTES_MAX} bytes of [A-Za-z0-9._-]")]
    InvalidQueueName { name: String },
    #[error("partition count {count} is out of range 1..={PARTITIONS_PER_QUEUE_MAX}")]
    PartitionCount { count: u32 },
    #[error("shard {} does not exist (table has {shard_count} shards)", shard.0)]
    ShardOutOfRange { shard: ShardId, shard_count: u16 },
    #[error("table already holds {QUEUES_MAX} queues")]
    TooManyQueues,
    #[error(
        "the node hosts {hosted} partitions; {adding} more would pass its limit of {max} \
         partitions (partitions_max)"
    )]
    TooManyPartitions { hosted: usize, adding: usize, max: usize },
    #[error("queue id {} is already used by queue {queue}", id.0)]
    QueueIdInUse { id: QueueId, queue: QueueName },
    #[error("invalid queue config: {0}")]
    InvalidConfig(#[from] ConfigError),
    #[error(
        "queue name {0} is reserved: a name ending in {DEAD_LETTER_SUFFIX} addresses the \
         dead-letter lane of the queue without it"
    )]
    ReservedQueueName(QueueName),
    #[error("queue {queue} has {from} partitions: a resize only adds partitions, not {to}")]
    NotGrowing { queue: QueueName, from: u32, to: u32 },
    #[error(
        "queue {queue} is still finishing its last resize: {draining} older partitions have \
         records from before it; resize again once `queue describe` shows none draining"
    )]
    ResizeInProgress { queue: QueueName, draining: usize },
    #[error("queue {queue} has key map version {current}, not {got}")]
    StaleKeyVersion { queue: QueueName, current: u64, got: u64 },
    #[error("partition {} of queue {queue} is not draining", partition.0)]
    NotDraining { queue: QueueName, partition: PartitionId },
    #[error("queue {queue} has no partition {}", partition.0)]
    NoSuchPartition { queue: QueueName, partition: PartitionId },
    #[error(
        "partition {} of queue {queue} is not on replicas {from:?} any more (it is on \
         {current:?}): the change was planned on an older table",
        partition.0
    )]
    StaleReplicas { queue: QueueName, partition: PartitionId, from: Vec<u64>, current: Vec<u64> },
    #[error("replica set {to:?} of partition {} of queue {queue}: {reason}", partition.0)]
    InvalidReplicas { queue: QueueName, partition: PartitionId, to: Vec<u64>, reason: String },
    #[error("subscription {name:?} of queue {queue}: {reason}")]
    InvalidSubscription { queue: QueueName, name: String, reason: String },
    #[error("queue {queue} already has subscription {name}")]
    SubscriptionExists { queue: QueueName, name: String },
    #[error("queue {queue} has no subscription {name}")]
    SubscriptionNotFound { queue: QueueName, name: String },
}

/// Partitions `0..partition_count` placed round-robin over `shard_count`
/// shards, starting at `first_shard`.
pub fn place_round_robin(first_shard: u16, partition_count: u32, shard_count: u16) -> Vec<ShardId> {
    assert!(shard_count > 0);
    assert!(first_shard < shard_count);
    (0..partition_count)
        .map(|partition| {
            let shard = (u64::from(first_shard) + u64::from(partition)) % u64::from(shard_count);
            ShardId(shard as u16)
        })
        .collect()
}

/// The versioned map queue → partitions → shard. See the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentTable {
    version: AssignmentVersion,
    shard_count: u16,
    queues: BTreeMap<QueueName, QueueEntry>,
    /// Reverse index of `queues`: always the same set of queues.
    names_by_id: BTreeMap<QueueId, QueueName>,
    /// Where the next queue's partition 0 goes: total partitions ever
    /// created, mod shard count. Derived from applied updates only, so every
    /// copy agrees, and consecutive queues start on different shards.
    placement_cursor: u16,
}

impl AssignmentTable {
    /// An empty table (version 0) for `shard_count` shards.
    pub fn new(shard_count: u16) -> AssignmentTable {
        AssignmentTable::starting_at(shard_count, AssignmentVersion(0), 0)
    }

    /// An empty table at `version` whose next placement starts on shard
    /// `placement_cursor`: the starting point a restart replays the catalog
    /// onto, so versions keep increasing across restarts.
    pub fn starting_at(
        shard_count: u16,
        version: AssignmentVersion,
        placement_cursor: u16,
    ) -> AssignmentTable {
        assert!(shard_count > 0);
        assert!(placement_cursor < shard_count);
        AssignmentTable {
            version,
            shard_count,
            queues: BTreeMap::new(),
            names_by_id: BTreeMap::new(),
            placement_cursor,
        }
    }

    pub fn version(&self) -> AssignmentVersion {
        self.version
    }

    pub fn shard_count(&self) -> u16 {
        self.shard_count
    }

    /// The shard the next created queue's partition 0 goes to.
    pub fn placement_cursor(&self) -> u16 {
        self.placement_cursor
    }

    /// The update that creates `queue` (id `queue_id`, allocated by the
    /// caller) with `partition_count` partitions placed round-robin. Does
    /// not change the table: apply the update.
    ///
    /// # Errors
    /// `ReservedQueueName` (ends in [`DEAD_LETTER_SUFFIX`]),
    /// `PartitionCount`, `InvalidConfig`, `QueueExists`, `QueueIdInUse`,
    /// `TooManyQueues`.
    pub fn plan_create_queue(
        &self,
        queue: QueueName,
        queue_id: QueueId,
        partition_count: u32,
        config: Arc<QueueConfig>,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        // Refused for new queues only (not in `check_create`), so a catalog
        // written before the rule still replays.
        if queue.as_str().ends_with(DEAD_LETTER_SUFFIX) {
            return Err(AssignmentError::ReservedQueueName(queue));
        }
        // Checked before placing, so a huge count never allocates.
        if !(1..=PARTITIONS_PER_QUEUE_MAX).contains(&partition_count) {
            return Err(AssignmentError::PartitionCount { count: partition_count });
        }
        let shards = place_round_robin(self.placement_cursor, partition_count, self.shard_count);
        self.check_create(
            &queue,
            queue_id,
            &shards,
            &config,
            &KeyPlacement::fresh(partition_count),
        )?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::CreateQueue {
                queue,
                queue_id,
                keys: KeyPlacement::fresh(partition_count),
                replicas: ReplicaSets::new(),
                subscriptions: Subscriptions::default(),
                shards,
                config,
            },
        })
    }

    /// The update that grows `queue` to `partition_count` partitions, the
    /// new ones placed round-robin from the placement cursor. Does not
    /// change the table: apply the update.
    ///
    /// # Errors
    /// `QueueNotFound`, `NotGrowing`, `PartitionCount`, `ResizeInProgress`,
    /// `TooManyPartitions`.
    pub fn plan_grow_queue(
        &self,
        queue: QueueName,
        partition_count: u32,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        let entry =
            self.queues.get(&queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        let from = u32::try_from(entry.partitions.len()).unwrap_or(u32::MAX);
        if partition_count <= from {
            return Err(AssignmentError::NotGrowing { queue, from, to: partition_count });
        }
        if partition_count > PARTITIONS_PER_QUEUE_MAX {
            return Err(AssignmentError::PartitionCount { count: partition_count });
        }
        let shards =
            place_round_robin(self.placement_cursor, partition_count - from, self.shard_count);
        self.check_grow(&queue, &shards)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::GrowQueue { queue, shards },
        })
    }

    /// Every check a grow must pass, for plans and for applies alike.
    fn check_grow(&self, queue: &QueueName, shards: &[ShardId]) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        let from = u32::try_from(entry.partitions.len()).unwrap_or(u32::MAX);
        let to = u32::try_from(entry.partitions.len() + shards.len()).unwrap_or(u32::MAX);
        if shards.is_empty() {
            return Err(AssignmentError::NotGrowing { queue: queue.clone(), from, to });
        }
        if to > PARTITIONS_PER_QUEUE_MAX {
            return Err(AssignmentError::PartitionCount { count: to });
        }
        if let Some(&shard) = shards.iter().find(|shard| shard.0 >= self.shard_count) {
            return Err(AssignmentError::ShardOutOfRange { shard, shard_count: self.shard_count });
        }
        if !entry.keys.draining.is_empty() {
            return Err(AssignmentError::ResizeInProgress {
                queue: queue.clone(),
                draining: entry.keys.draining.len(),
            });
        }
        self.check_room(shards.len())
    }

    /// The update recording that `partition` of `queue` finished what it
    /// took before key map `key_version`.
    ///
    /// # Errors
    /// `QueueNotFound`, `StaleKeyVersion`, `NotDraining`.
    pub fn plan_keys_drained(
        &self,
        queue: QueueName,
        key_version: u64,
        partition: PartitionId,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        self.check_drained(&queue, key_version, partition)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::KeysDrained { queue, key_version, partition },
        })
    }

    fn check_drained(
        &self,
        queue: &QueueName,
        key_version: u64,
        partition: PartitionId,
    ) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        if entry.keys.version != key_version {
            return Err(AssignmentError::StaleKeyVersion {
                queue: queue.clone(),
                current: entry.keys.version,
                got: key_version,
            });
        }
        if !entry.keys.draining.contains(&partition) {
            return Err(AssignmentError::NotDraining { queue: queue.clone(), partition });
        }
        Ok(())
    }

    /// Every check a create must pass, for plans and for applies alike.
    fn check_create(
        &self,
        queue: &QueueName,
        queue_id: QueueId,
        shards: &[ShardId],
        config: &QueueConfig,
        keys: &KeyPlacement,
    ) -> Result<(), AssignmentError> {
        let count = u32::try_from(shards.len()).unwrap_or(u32::MAX);
        if !(1..=PARTITIONS_PER_QUEUE_MAX).contains(&count) {
            return Err(AssignmentError::PartitionCount { count });
        }
        if let Some(&shard) = shards.iter().find(|shard| shard.0 >= self.shard_count) {
            return Err(AssignmentError::ShardOutOfRange { shard, shard_count: self.shard_count });
        }
        config.validate()?;
        let count = u32::try_from(shards.len()).unwrap_or(u32::MAX);
        let keys_fit = keys.version >= 1
            && keys.held_from <= count
            && keys.draining.iter().all(|partition| partition.0 < keys.held_from);
        if !keys_fit {
            return Err(AssignmentError::PartitionCount { count });
        }
        if self.queues.contains_key(queue) {
            return Err(AssignmentError::QueueExists(queue.clone()));
        }
        if let Some(holder) = self.names_by_id.get(&queue_id) {
            return Err(AssignmentError::QueueIdInUse { id: queue_id, queue: holder.clone() });
        }
        if self.queues.len() >= QUEUES_MAX {
            return Err(AssignmentError::TooManyQueues);
        }
        self.check_room(shards.len())
    }

    /// `adding` more partitions fit the node's [`PARTITIONS_PER_NODE_MAX`].
    fn check_room(&self, adding: usize) -> Result<(), AssignmentError> {
        self.check_room_within(adding, PARTITIONS_PER_NODE_MAX)
    }

    /// `adding` more partitions keep the table within `max` (the
    /// broker's `partitions_max`, checked before a create or a grow is
    /// planned).
    ///
    /// # Errors
    /// `TooManyPartitions`.
    pub fn check_room_within(&self, adding: usize, max: usize) -> Result<(), AssignmentError> {
        let hosted = self.partition_count();
        if hosted.saturating_add(adding) > max {
            return Err(AssignmentError::TooManyPartitions { hosted, adding, max });
        }
        Ok(())
    }

    /// The partitions a grow of `queue` to `partitions` would add (0 for
    /// an unknown queue or a count that does not grow it).
    pub fn partitions_added(&self, queue: &QueueName, partitions: u32) -> usize {
        let current = self.partitions(queue).map_or(0, <[_]>::len);
        (partitions as usize).saturating_sub(current)
    }

    /// Partitions of every queue in the table.
    pub fn partition_count(&self) -> usize {
        self.queues.values().map(|queue| queue.partitions.len()).sum()
    }

    /// The update that deletes `queue`.
    ///
    /// # Errors
    /// `QueueNotFound`.
    pub fn plan_delete_queue(&self, queue: QueueName) -> Result<AssignmentUpdate, AssignmentError> {
        if !self.queues.contains_key(&queue) {
            return Err(AssignmentError::QueueNotFound(queue));
        }
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::DeleteQueue { queue },
        })
    }

    fn next_version(&self) -> AssignmentVersion {
        AssignmentVersion(self.version.0 + 1)
    }

    /// Applies `update`; all-or-nothing.
    ///
    /// # Errors
    /// `VersionGap` unless `update.version == version + 1`; the plan errors
    /// if the change does not fit this table.
    pub fn apply(&mut self, update: &AssignmentUpdate) -> Result<(), AssignmentError> {
        if update.version != self.next_version() {
            return Err(AssignmentError::VersionGap { current: self.version, got: update.version });
        }
        match &update.change {
            AssignmentChange::CreateQueue {
                queue,
                queue_id,
                shards,
                config,
                keys,
                replicas,
                subscriptions,
            } => {
                self.check_create(queue, *queue_id, shards, config, keys)?;
                check_replica_sets(queue, shards.len(), replicas)?;
                subscriptions.check(queue)?;
                let partitions = shards
                    .iter()
                    .map(|&shard| PartitionAssignment { shard, assigned_at: update.version })
                    .collect();
                let entry = QueueEntry {
                    id: *queue_id,
                    config: config.clone(),
                    created_at: update.version,
                    partitions,
                    keys: keys.clone(),
                    replicas: replicas.clone(),
                    subscriptions: subscriptions.clone(),
                };
                self.queues.insert(queue.clone(), entry);
                self.names_by_id.insert(*queue_id, queue.clone());
                let cursor = (u64::from(self.placement_cursor) + shards.len() as u64)
                    % u64::from(self.shard_count);
                self.placement_cursor = cursor as u16;
            }
            AssignmentChange::DeleteQueue { queue } => {
                let Some(entry) = self.queues.remove(queue) else {
                    return Err(AssignmentError::QueueNotFound(queue.clone()));
                };
                let removed = self.names_by_id.remove(&entry.id);
                assert!(removed.as_ref() == Some(queue), "queue id index out of step");
            }
            AssignmentChange::GrowQueue { queue, shards } => {
                self.check_grow(queue, shards)?;
                let cursor = (u64::from(self.placement_cursor) + shards.len() as u64)
                    % u64::from(self.shard_count);
                let Some(entry) = self.queues.get_mut(queue) else {
                    return Err(AssignmentError::QueueNotFound(queue.clone()));
                };
                let from = u32::try_from(entry.partitions.len()).unwrap_or(u32::MAX);
                entry.partitions.extend(
                    shards
                        .iter()
                        .map(|&shard| PartitionAssignment { shard, assigned_at: update.version }),
                );
                entry.keys = KeyPlacement {
                    version: entry.keys.version + 1,
                    held_from: from,
                    draining: (0..from).map(PartitionId).collect(),
                };
                self.placement_cursor = cursor as u16;
            }
            AssignmentChange::KeysDrained { queue, key_version, partition } => {
                self.check_drained(queue, *key_version, *partition)?;
                if let Some(entry) = self.queues.get_mut(queue) {
                    entry.keys.draining.remove(partition);
                }
            }
            AssignmentChange::SetReplicas { queue, partition, from, to } => {
                self.check_set_replicas(queue, *partition, from, to)?;
                if let Some(entry) = self.queues.get_mut(queue) {
                    let set = ReplicaSet { nodes: to.clone(), settled: false };
                    entry.replicas.insert(*partition, set);
                }
            }
            AssignmentChange::ReplicasSettled { queue, partition, nodes } => {
                self.check_settled(queue, *partition, nodes)?;
                if let Some(set) =
                    self.queues.get_mut(queue).and_then(|entry| entry.replicas.get_mut(partition))
                {
                    set.settled = true;
                }
            }
            AssignmentChange::Subscribe { queue, name, id, .. } => {
                self.check_subscribe(queue, name, *id)?;
                self.apply_subscription(&update.change);
            }
            AssignmentChange::Unsubscribe { queue, name } => {
                self.check_unsubscribe(queue, name)?;
                self.apply_subscription(&update.change);
            }
            AssignmentChange::Reseek { queue, name, id, .. } => {
                self.check_reseek(queue, name, *id)?;
                self.apply_subscription(&update.change);
            }
        }
        self.version = update.version;
        Ok(())
    }

    /// Where `partition` of `queue` lives, if both exist.
    pub fn owner(&self, queue: &QueueName, partition: PartitionId) -> Option<PartitionAssignment> {
        let entry = self.queues.get(queue)?;
        entry.partitions.get(usize::try_from(partition.0).ok()?).copied()
    }

    /// All partitions of `queue`, indexed by partition id.
    pub fn partitions(&self, queue: &QueueName) -> Option<&[PartitionAssignment]> {
        self.queues.get(queue).map(|entry| entry.partitions.as_slice())
    }

    /// Id, config, creation version and placement of `queue`.
    pub fn queue(&self, queue: &QueueName) -> Option<&QueueEntry> {
        self.queues.get(queue)
    }

    /// The queue with id `id`, if it exists.
    pub fn queue_by_id(&self, id: QueueId) -> Option<(&QueueName, &QueueEntry)> {
        let name = self.names_by_id.get(&id)?;
        let entry = self.queues.get(name);
        assert!(entry.is_some(), "queue id index names a missing queue");
        entry.map(|entry| (name, entry))
    }

    /// Every queue, in name order.
    pub fn queues(&self) -> impl Iterator<Item = (&QueueName, &QueueEntry)> {
        self.queues.iter()
    }

    /// Every (queue, partition) owned by `shard`, in queue-name order.
    pub fn owned_by(&self, shard: ShardId) -> impl Iterator<Item = (&QueueName, PartitionId)> {
        self.queues.iter().flat_map(move |(queue, entry)| {
            entry
                .partitions
                .iter()
                .enumerate()
                .filter(move |(_, assignment)| assignment.shard == shard)
                .map(move |(index, _)| (queue, PartitionId(index as u32)))
        })
    }

    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> QueueName {
        QueueName::new(text).unwrap()
    }

    fn config() -> Arc<QueueConfig> {
        Arc::new(QueueConfig::default())
    }

    /// Plans and applies a create with id = table version + 1 (unique here).
    fn create(table: &mut AssignmentTable, queue: &str, partitions: u32) -> AssignmentUpdate {
        let id = QueueId(table.version().0 as u32 + 1);
        let update = table.plan_create_queue(name(queue), id, partitions, config()).unwrap();
        table.apply(&update).unwrap();
        update
    }

    // Goal: a new queue cannot take a name that addresses another queue's
    // dead-letter lane, while a catalog that already holds one still
    // replays. Method: plan `jobs.dlq` (refused, table unchanged, message
    // names the rule), plan `jobs.dlq2` and `dlq` (fine), then apply a
    // create of `old.dlq` made without the plan, as a replay does.
    #[test]
    fn dead_letter_suffix_is_reserved_for_new_queues() {
        let mut table = AssignmentTable::new(1);
        create(&mut table, "jobs", 1);
        let before = table.clone();
        let refused = table.plan_create_queue(name("jobs.dlq"), QueueId(9), 1, config());
        assert_eq!(refused, Err(AssignmentError::ReservedQueueName(name("jobs.dlq"))));
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("jobs.dlq") && message.contains("dead-letter lane"), "{message}");
        assert_eq!(table, before);
        for allowed in ["jobs.dlq2", "dlq", "jobs-dlq"] {
            assert!(table.plan_create_queue(name(allowed), QueueId(9), 1, config()).is_ok());
        }
        let replayed = AssignmentUpdate {
            version: AssignmentVersion(2),
            change: AssignmentChange::CreateQueue {
                subscriptions: crate::control::assignment::Subscriptions::default(),
                queue: name("old.dlq"),
                queue_id: QueueId(2),
                shards: vec![ShardId(0)],
                config: config(),
                keys: KeyPlacement::fresh(1),
                replicas: Default::default(),
            },
        };
        table.apply(&replayed).unwrap();
        assert!(table.queue(&name("old.dlq")).is_some());
    }

    // Goal: a replica set changes only from the set the table holds (a late
    // or repeated change is refused and changes nothing), by one member
    // each way, to a valid set; it settles once, for the set it holds.
    // Method: plan/apply a sequence of changes and refusals on one
    // partition.
    #[test]
    fn replica_sets_change_from_the_current_set_and_settle_once() {
        let mut table = AssignmentTable::new(1);
        create(&mut table, "jobs", 2);
        let p = PartitionId(1);
        let set = |from: &[u64], to: &[u64]| (from.to_vec(), to.to_vec());
        let plan = |table: &AssignmentTable, (from, to): (Vec<u64>, Vec<u64>)| {
            table.plan_set_replicas(name("jobs"), p, from, to)
        };
        // No set in the table: the caller's `from` (the placer's) is taken.
        let first = plan(&table, set(&[1, 2, 3], &[1, 2, 4])).unwrap();
        table.apply(&first).unwrap();
        let before = table.clone();
        // The same change again: planned on the old set, refused.
        assert!(matches!(
            table.apply(&AssignmentUpdate { version: AssignmentVersion(3), ..first.clone() }),
            Err(AssignmentError::StaleReplicas { .. })
        ));
        assert_eq!(table, before);
        for (bad, why) in [
            (set(&[1, 2, 4], &[1, 5, 6]), "more than one"),
            (set(&[1, 2, 4], &[1, 2, 4]), "current set"),
            (set(&[1, 2, 4], &[1, 2, 2]), "twice"),
            (set(&[1, 2, 4], &[1, 2, 0]), "node id 0"),
            (set(&[1, 2, 4], &[]), "0 nodes"),
        ] {
            let error = plan(&table, bad).unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
        assert!(matches!(
            table.plan_set_replicas(name("jobs"), PartitionId(2), vec![1], vec![2]),
            Err(AssignmentError::NoSuchPartition { .. })
        ));
        // Settled only for the set the table holds, once.
        assert!(table.plan_replicas_settled(name("jobs"), p, vec![1, 2, 3]).is_err());
        let settled = table.plan_replicas_settled(name("jobs"), p, vec![1, 2, 4]).unwrap();
        table.apply(&settled).unwrap();
        assert!(table.queue(&name("jobs")).unwrap().replicas[&p].settled);
        assert!(table.plan_replicas_settled(name("jobs"), p, vec![1, 2, 4]).is_err());
        // A later change starts unsettled again.
        let next = plan(&table, set(&[1, 2, 4], &[1, 4, 5])).unwrap();
        table.apply(&next).unwrap();
        let entry = table.queue(&name("jobs")).unwrap();
        assert_eq!(entry.replicas[&p], ReplicaSet { nodes: vec![1, 4, 5], settled: false });
        assert!(!entry.replicas.contains_key(&PartitionId(0)));
    }

    // Goal: round-robin spreads partitions evenly and wraps. Method: compare
    // explicit placements.
    #[test]
    fn round_robin_placement_wraps_from_first_shard() {
        let shards = |ids: &[u16]| ids.iter().map(|&id| ShardId(id)).collect::<Vec<_>>();
        assert_eq!(place_round_robin(0, 5, 2), shards(&[0, 1, 0, 1, 0]));
        assert_eq!(place_round_robin(2, 4, 3), shards(&[2, 0, 1, 2]));
        assert_eq!(place_round_robin(0, 1, 1), shards(&[0]));
    }

    // Goal: consecutive queues continue where the previous placement ended,
    // so single-partition queues do not all land on shard 0. Method: create
    // three 1-partition queues on 2 shards, then a 3-partition queue.
    #[test]
    fn consecutive_queues_rotate_their_first_shard() {
        let mut table = AssignmentTable::new(2);
        for queue in ["a", "b", "c"] {
            create(&mut table, queue, 1);
        }
        assert_eq!(table.owner(&name("a"), PartitionId(0)).unwrap().shard, ShardId(0));
        assert_eq!(table.owner(&name("b"), PartitionId(0)).unwrap().shard, ShardId(1));
        assert_eq!(table.owner(&name("c"), PartitionId(0)).unwrap().shard, ShardId(0));
        create(&mut table, "d", 3);
        let owners: Vec<u16> =
            table.partitions(&name("d")).unwrap().iter().map(|p| p.shard.0).collect();
        assert_eq!(owners, vec![1, 0, 1]);
        assert_eq!(table.version(), AssignmentVersion(4));
        let on_shard_1: Vec<_> =
            table.owned_by(ShardId(1)).map(|(queue, p)| (queue.as_str().to_owned(), p.0)).collect();
        assert_eq!(on_shard_1, vec![("b".to_owned(), 0), ("d".to_owned(), 0), ("d".to_owned(), 2)]);
    }

    // Goal: copies that apply the same updates agree, and out-of-order or
    // repeated updates are refused without changing the table. Method: plan
    // on a leader copy, apply to a follower, replay/skip versions.
    #[test]
    fn copies_agree_and_version_gaps_are_refused() {
        let mut leader = AssignmentTable::new(3);
        let mut follower = AssignmentTable::new(3);
        let create = create(&mut leader, "jobs", 4);
        follower.apply(&create).unwrap();
        let delete = leader.plan_delete_queue(name("jobs")).unwrap();
        leader.apply(&delete).unwrap();

        let before = follower.clone();
        let replay = follower.apply(&create);
        assert_eq!(
            replay,
            Err(AssignmentError::VersionGap {
                current: AssignmentVersion(1),
                got: AssignmentVersion(1)
            })
        );
        assert_eq!(follower, before);
        follower.apply(&delete).unwrap();
        assert_eq!(follower, leader);
        assert_eq!(follower.queue_count(), 0);
    }

    // Goal: invalid changes are typed errors and leave the table untouched.
    // Method: one bad input per error.
    #[test]
    fn invalid_changes_are_refused() {
        let mut table = AssignmentTable::new(2);
        assert_eq!(
            table.plan_create_queue(name("q"), QueueId(1), 0, config()),
            Err(AssignmentError::PartitionCount { count: 0 })
        );
        assert_eq!(
            table.plan_create_queue(name("q"), QueueId(1), PARTITIONS_PER_QUEUE_MAX + 1, config()),
            Err(AssignmentError::PartitionCount { count: PARTITIONS_PER_QUEUE_MAX + 1 })
        );
        let mut full = AssignmentTable::new(2);
        let per_queue = PARTITIONS_PER_QUEUE_MAX as usize;
        for id in 0..PARTITIONS_PER_NODE_MAX / per_queue {
            let queue = name(&format!("q{id}"));
            let update = full
                .plan_create_queue(
                    queue,
                    QueueId(u32::try_from(id).unwrap() + 1),
                    PARTITIONS_PER_QUEUE_MAX,
                    config(),
                )
                .unwrap();
            full.apply(&update).unwrap();
        }
        let room = PARTITIONS_PER_NODE_MAX - full.partition_count();
        let over = u32::try_from(room + 1).unwrap();
        assert_eq!(
            full.plan_create_queue(name("over"), QueueId(999), over, config()),
            Err(AssignmentError::TooManyPartitions {
                hosted: full.partition_count(),
                adding: room + 1,
                max: PARTITIONS_PER_NODE_MAX
            })
        );
        if room > 0 {
            let fits = u32::try_from(room).unwrap();
            assert!(full.plan_create_queue(name("fits"), QueueId(999), fits, config()).is_ok());
        }
        let bad_config = QueueConfig { max_deliveries: 0, ..QueueConfig::default() };
        assert_eq!(
            table.plan_create_queue(name("q"), QueueId(1), 1, Arc::new(bad_config)),
            Err(AssignmentError::InvalidConfig(ConfigError::MaxDeliveries))
        );
        assert_eq!(
            table.plan_delete_queue(name("q")),
            Err(AssignmentError::QueueNotFound(name("q")))
        );
        let bad_shard = AssignmentUpdate {
            version: AssignmentVersion(1),
            change: AssignmentChange::CreateQueue {
                subscriptions: crate::control::assignment::Subscriptions::default(),
                queue: name("q"),
                queue_id: QueueId(1),
                shards: vec![ShardId(2)],
                config: config(),
                keys: KeyPlacement::fresh(1),
                replicas: Default::default(),
            },
        };
        assert_eq!(
            table.apply(&bad_shard),
            Err(AssignmentError::ShardOutOfRange { shard: ShardId(2), shard_count: 2 })
        );
        assert_eq!(table.version(), AssignmentVersion(0));
        create(&mut table, "q", 1);
        assert_eq!(
            table.plan_create_queue(name("q"), QueueId(9), 1, config()),
            Err(AssignmentError::QueueExists(name("q")))
        );
        assert_eq!(
            table.plan_create_queue(name("r"), QueueId(1), 1, config()),
            Err(AssignmentError::QueueIdInUse { id: QueueId(1), queue: name("q") })
        );
        assert!(table.owner(&name("q"), PartitionId(1)).is_none());
        for bad in ["", ".", "..", "a/b", "with space", &"x".repeat(QUEUE_NAME_BYTES_MAX + 1)] {
            assert!(QueueName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(QueueName::new(&"x".repeat(QUEUE_NAME_BYTES_MAX)).is_ok());
    }
}

#[cfg(test)]
mod grow_tests {
    use super::*;

    fn name(text: &str) -> QueueName {
        QueueName::new(text).unwrap()
    }

    // Goal: a resize adds partitions after the old ones, gives the key map
    // a new version and holds the added partitions until every older one
    // reported drained, once each; replicas applying the same updates
    // agree; stale or repeated reports and a second resize while draining
    // are refused without changing the table. Method: create 4 on 2
    // shards, grow to 5, report out of order, repeat one, grow again.
    #[test]
    fn grow_holds_the_added_partitions_until_the_older_ones_drain() {
        let mut table = AssignmentTable::new(2);
        let create = table
            .plan_create_queue(name("jobs"), QueueId(1), 4, Arc::new(QueueConfig::default()))
            .unwrap();
        table.apply(&create).unwrap();
        let mut replica = table.clone();
        let entry = table.queue(&name("jobs")).unwrap();
        assert_eq!(entry.keys, KeyPlacement::fresh(4));
        assert!(!entry.keys.holds(PartitionId(3)));

        assert_eq!(
            table.plan_grow_queue(name("jobs"), 4),
            Err(AssignmentError::NotGrowing { queue: name("jobs"), from: 4, to: 4 })
        );
        assert_eq!(
            table.plan_grow_queue(name("nope"), 5),
            Err(AssignmentError::QueueNotFound(name("nope")))
        );
        let grow = table.plan_grow_queue(name("jobs"), 5).unwrap();
        table.apply(&grow).unwrap();
        replica.apply(&grow).unwrap();
        let entry = table.queue(&name("jobs")).unwrap();
        assert_eq!(entry.partitions.len(), 5);
        // Round-robin continues where the create ended (4 partitions on 2
        // shards: the cursor is back at shard 0).
        assert_eq!(entry.partitions[4].shard, ShardId(0));
        assert_eq!(entry.keys.version, 2);
        assert_eq!(entry.keys.held_from, 4);
        assert_eq!(entry.keys.draining.len(), 4);
        assert!(entry.keys.holds(PartitionId(4)) && !entry.keys.holds(PartitionId(3)));
        assert!(matches!(
            table.plan_grow_queue(name("jobs"), 6),
            Err(AssignmentError::ResizeInProgress { draining: 4, .. })
        ));
        assert!(matches!(
            table.plan_keys_drained(name("jobs"), 1, PartitionId(0)),
            Err(AssignmentError::StaleKeyVersion { current: 2, got: 1, .. })
        ));
        assert!(matches!(
            table.plan_keys_drained(name("jobs"), 2, PartitionId(4)),
            Err(AssignmentError::NotDraining { .. })
        ));
        for partition in [2, 0, 3] {
            let drained = table.plan_keys_drained(name("jobs"), 2, PartitionId(partition)).unwrap();
            table.apply(&drained).unwrap();
            replica.apply(&drained).unwrap();
            assert!(table.queue(&name("jobs")).unwrap().keys.holds(PartitionId(4)));
        }
        let before = table.clone();
        let repeated = AssignmentUpdate {
            version: AssignmentVersion(table.version().0 + 1),
            change: AssignmentChange::KeysDrained {
                queue: name("jobs"),
                key_version: 2,
                partition: PartitionId(0),
            },
        };
        assert!(matches!(table.apply(&repeated), Err(AssignmentError::NotDraining { .. })));
        assert_eq!(table, before);
        let last = table.plan_keys_drained(name("jobs"), 2, PartitionId(1)).unwrap();
        table.apply(&last).unwrap();
        replica.apply(&last).unwrap();
        assert!(!table.queue(&name("jobs")).unwrap().keys.holds(PartitionId(4)));
        assert_eq!(table, replica);
        let again = table.plan_grow_queue(name("jobs"), 8).unwrap();
        table.apply(&again).unwrap();
        let entry = table.queue(&name("jobs")).unwrap();
        assert_eq!((entry.keys.version, entry.keys.held_from, entry.partitions.len()), (3, 5, 8));
        assert_eq!(
            table.plan_grow_queue(name("jobs"), PARTITIONS_PER_QUEUE_MAX + 1),
            Err(AssignmentError::PartitionCount { count: PARTITIONS_PER_QUEUE_MAX + 1 })
        );
    }
}

#[cfg(test)]
mod lookup_tests {
    use super::*;

    // Goal: the table answers queue → (id, config, placement) and id → name,
    // and both lookups forget a deleted queue; a resumed table continues the
    // version and placement it was started at. Method: create two queues
    // with distinct configs on a table started at version 10, delete one.
    #[test]
    fn lookups_by_name_and_id_follow_creates_and_deletes() {
        let mut table = AssignmentTable::starting_at(3, AssignmentVersion(10), 2);
        let slow = Arc::new(QueueConfig { lease_default_ms: 60_000, ..QueueConfig::default() });
        let jobs = QueueName::new("jobs").unwrap();
        let mail = QueueName::new("mail").unwrap();
        let update = table.plan_create_queue(jobs.clone(), QueueId(7), 2, slow.clone()).unwrap();
        assert_eq!(update.version, AssignmentVersion(11));
        table.apply(&update).unwrap();
        let update = table
            .plan_create_queue(mail.clone(), QueueId(8), 1, Arc::new(QueueConfig::default()))
            .unwrap();
        table.apply(&update).unwrap();

        let entry = table.queue(&jobs).unwrap();
        assert_eq!(entry.id, QueueId(7));
        assert_eq!(*entry.config, *slow);
        assert_eq!(entry.created_at, AssignmentVersion(11));
        let shards: Vec<u16> = entry.partitions.iter().map(|p| p.shard.0).collect();
        assert_eq!(shards, vec![2, 0]);
        assert_eq!(table.queue(&mail).unwrap().partitions[0].shard, ShardId(1));
        assert_eq!(table.queue_by_id(QueueId(8)).unwrap().0, &mail);
        assert!(table.queue_by_id(QueueId(9)).is_none());

        let delete = table.plan_delete_queue(jobs.clone()).unwrap();
        table.apply(&delete).unwrap();
        assert!(table.queue(&jobs).is_none());
        assert!(table.queue_by_id(QueueId(7)).is_none());
        let names: Vec<&str> = table.queues().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, vec!["mail"]);
        assert_eq!(table.version(), AssignmentVersion(13));
    }
}
