//! The assignment table: which shard owns each queue partition.
//!
//! Owns the versioned map queue → partitions → shard, the message that
//! changes it ([`AssignmentUpdate`]) and placement (round-robin of partitions
//! over shards). Every shard holds its own copy and applies the same updates
//! in the same order, so copies agree by construction; an update whose
//! version is not exactly `current + 1` is refused, so a lost or reordered
//! message is detected instead of silently diverging. Pure: no I/O, no
//! clock, no glommio. It does not open partitions (the shard's hooks do that
//! when an update names them) and it does not persist itself (yet).

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

/// Longest queue name, in bytes.
pub const QUEUE_NAME_BYTES_MAX: usize = 128;
/// Most partitions one queue may have.
pub const PARTITIONS_PER_QUEUE_MAX: u32 = 1_024;
/// Most queues one table may hold.
pub const QUEUES_MAX: usize = 10_000;

/// A shard: one executor, one core, one port (`base_port + ShardId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u16);

/// A partition's index within its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionId(pub u32);

/// Version of the whole table; increases by one with every update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AssignmentVersion(pub u64);

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

/// One change to the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignmentChange {
    /// A new queue whose partition `i` lives on `shards[i]`.
    CreateQueue { queue: QueueName, shards: Vec<ShardId> },
    /// Remove a queue and all its partitions.
    DeleteQueue { queue: QueueName },
}

/// The message the control path sends to every shard: a change and the
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
    #[error("update version {got:?} does not follow table version {current:?}")]
    VersionGap { current: AssignmentVersion, got: AssignmentVersion },
    #[error("queue {0} already exists")]
    QueueExists(QueueName),
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("invalid queue name {name:?}: 1..={QUEUE_NAME_BYTES_MAX} bytes of [A-Za-z0-9._-]")]
    InvalidQueueName { name: String },
    #[error("partition count {count} is out of range 1..={PARTITIONS_PER_QUEUE_MAX}")]
    PartitionCount { count: u32 },
    #[error("shard {shard:?} does not exist (table has {shard_count} shards)")]
    ShardOutOfRange { shard: ShardId, shard_count: u16 },
    #[error("table already holds {QUEUES_MAX} queues")]
    TooManyQueues,
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
    queues: BTreeMap<QueueName, Vec<PartitionAssignment>>,
    /// Where the next queue's partition 0 goes: total partitions ever
    /// created, mod shard count. Derived from applied updates only, so every
    /// copy agrees, and consecutive queues start on different shards.
    placement_cursor: u16,
}

impl AssignmentTable {
    /// An empty table (version 0) for `shard_count` shards.
    pub fn new(shard_count: u16) -> AssignmentTable {
        assert!(shard_count > 0);
        AssignmentTable {
            version: AssignmentVersion(0),
            shard_count,
            queues: BTreeMap::new(),
            placement_cursor: 0,
        }
    }

    pub fn version(&self) -> AssignmentVersion {
        self.version
    }

    pub fn shard_count(&self) -> u16 {
        self.shard_count
    }

    /// The update that creates `queue` with `partition_count` partitions
    /// placed round-robin. Does not change the table: apply the update.
    ///
    /// # Errors
    /// `QueueExists`, `PartitionCount`, `TooManyQueues`.
    pub fn plan_create_queue(
        &self,
        queue: QueueName,
        partition_count: u32,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        if !(1..=PARTITIONS_PER_QUEUE_MAX).contains(&partition_count) {
            return Err(AssignmentError::PartitionCount { count: partition_count });
        }
        if self.queues.contains_key(&queue) {
            return Err(AssignmentError::QueueExists(queue));
        }
        if self.queues.len() >= QUEUES_MAX {
            return Err(AssignmentError::TooManyQueues);
        }
        let shards = place_round_robin(self.placement_cursor, partition_count, self.shard_count);
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::CreateQueue { queue, shards },
        })
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
            AssignmentChange::CreateQueue { queue, shards } => {
                let count = u32::try_from(shards.len()).unwrap_or(u32::MAX);
                if !(1..=PARTITIONS_PER_QUEUE_MAX).contains(&count) {
                    return Err(AssignmentError::PartitionCount { count });
                }
                if let Some(&shard) = shards.iter().find(|shard| shard.0 >= self.shard_count) {
                    return Err(AssignmentError::ShardOutOfRange {
                        shard,
                        shard_count: self.shard_count,
                    });
                }
                if self.queues.contains_key(queue) {
                    return Err(AssignmentError::QueueExists(queue.clone()));
                }
                if self.queues.len() >= QUEUES_MAX {
                    return Err(AssignmentError::TooManyQueues);
                }
                let partitions = shards
                    .iter()
                    .map(|&shard| PartitionAssignment { shard, assigned_at: update.version })
                    .collect();
                self.queues.insert(queue.clone(), partitions);
                let cursor = (u64::from(self.placement_cursor) + u64::from(count))
                    % u64::from(self.shard_count);
                self.placement_cursor = cursor as u16;
            }
            AssignmentChange::DeleteQueue { queue } => {
                if self.queues.remove(queue).is_none() {
                    return Err(AssignmentError::QueueNotFound(queue.clone()));
                }
            }
        }
        self.version = update.version;
        Ok(())
    }

    /// Where `partition` of `queue` lives, if both exist.
    pub fn owner(&self, queue: &QueueName, partition: PartitionId) -> Option<PartitionAssignment> {
        let partitions = self.queues.get(queue)?;
        partitions.get(usize::try_from(partition.0).ok()?).copied()
    }

    /// All partitions of `queue`, indexed by partition id.
    pub fn partitions(&self, queue: &QueueName) -> Option<&[PartitionAssignment]> {
        self.queues.get(queue).map(Vec::as_slice)
    }

    /// Every (queue, partition) owned by `shard`, in queue-name order.
    pub fn owned_by(&self, shard: ShardId) -> impl Iterator<Item = (&QueueName, PartitionId)> {
        self.queues.iter().flat_map(move |(queue, partitions)| {
            partitions
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
            let update = table.plan_create_queue(name(queue), 1).unwrap();
            table.apply(&update).unwrap();
        }
        assert_eq!(table.owner(&name("a"), PartitionId(0)).unwrap().shard, ShardId(0));
        assert_eq!(table.owner(&name("b"), PartitionId(0)).unwrap().shard, ShardId(1));
        assert_eq!(table.owner(&name("c"), PartitionId(0)).unwrap().shard, ShardId(0));
        let update = table.plan_create_queue(name("d"), 3).unwrap();
        table.apply(&update).unwrap();
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
        let create = leader.plan_create_queue(name("jobs"), 4).unwrap();
        leader.apply(&create).unwrap();
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
            table.plan_create_queue(name("q"), 0),
            Err(AssignmentError::PartitionCount { count: 0 })
        );
        assert_eq!(
            table.plan_create_queue(name("q"), PARTITIONS_PER_QUEUE_MAX + 1),
            Err(AssignmentError::PartitionCount { count: PARTITIONS_PER_QUEUE_MAX + 1 })
        );
        assert_eq!(
            table.plan_delete_queue(name("q")),
            Err(AssignmentError::QueueNotFound(name("q")))
        );
        let bad_shard = AssignmentUpdate {
            version: AssignmentVersion(1),
            change: AssignmentChange::CreateQueue { queue: name("q"), shards: vec![ShardId(2)] },
        };
        assert_eq!(
            table.apply(&bad_shard),
            Err(AssignmentError::ShardOutOfRange { shard: ShardId(2), shard_count: 2 })
        );
        assert_eq!(table.version(), AssignmentVersion(0));
        let create = table.plan_create_queue(name("q"), 1).unwrap();
        table.apply(&create).unwrap();
        assert_eq!(
            table.plan_create_queue(name("q"), 1),
            Err(AssignmentError::QueueExists(name("q")))
        );
        assert!(table.owner(&name("q"), PartitionId(1)).is_none());
        for bad in ["", ".", "..", "a/b", "with space", &"x".repeat(QUEUE_NAME_BYTES_MAX + 1)] {
            assert!(QueueName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(QueueName::new(&"x".repeat(QUEUE_NAME_BYTES_MAX)).is_ok());
    }
}
