//! The partitions a shard serves, looked up by queue name and partition
//! without allocating: every data-path request does one lookup, and a key
//! of `(String, PartitionId)` needed an owned `String` for each. Each
//! queue also has its ready rings here (`ready.rs`, one per subscription
//! claimed from), made with its first partition and closed when the queue
//! stops being served.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::ready::{ReadyRing, ReadyRings};
use super::Served;
use crate::queue::{PartitionId, SubscriptionId};

/// The partitions of one queue this shard serves, and their ready rings.
#[derive(Default)]
struct QueueServed {
    partitions: BTreeMap<PartitionId, Rc<Served>>,
    ready: Rc<ReadyRings>,
}

/// Served partitions by queue name, then partition.
#[derive(Default)]
pub struct ServedMap {
    queues: BTreeMap<String, QueueServed>,
}

impl ServedMap {
    /// The served partition `queue`/`partition`.
    pub fn get(&self, queue: &str, partition: PartitionId) -> Option<&Rc<Served>> {
        self.queues.get(queue)?.partitions.get(&partition)
    }

    /// The ready ring of subscription `sub` of `queue`, if this shard
    /// serves any of its partitions (`live`: whether the table names a
    /// subscription, see [`ReadyRings::ring`]).
    pub fn ready(
        &self,
        queue: &str,
        sub: SubscriptionId,
        live: impl Fn(SubscriptionId) -> bool,
    ) -> Option<Rc<ReadyRing>> {
        let served = self.queues.get(queue)?;
        Some(served.ready.ring(sub, served.partitions.keys().copied(), live))
    }

    /// The ready rings of every queue served here.
    pub fn rings(&self) -> impl Iterator<Item = &Rc<ReadyRings>> + '_ {
        self.queues.values().map(|served| &served.ready)
    }

    /// Partitions served, over all queues.
    pub fn len(&self) -> usize {
        self.queues.values().map(|served| served.partitions.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Every served partition, by queue name then partition.
    pub fn iter(&self) -> impl Iterator<Item = (&str, PartitionId, &Rc<Served>)> + '_ {
        self.queues.iter().flat_map(|(queue, served)| {
            served
                .partitions
                .iter()
                .map(move |(partition, served)| (queue.as_str(), *partition, served))
        })
    }

    pub fn values(&self) -> impl Iterator<Item = &Rc<Served>> + '_ {
        self.queues.values().flat_map(|served| served.partitions.values())
    }

    /// Adds (or replaces) `queue`/`partition`; returns the queue's ready rings.
    pub fn insert(
        &mut self,
        queue: &str,
        partition: PartitionId,
        served: Rc<Served>,
    ) -> Rc<ReadyRings> {
        let entry = self.queues.entry(queue.to_owned()).or_default();
        entry.partitions.insert(partition, served);
        Rc::clone(&entry.ready)
    }

    /// Removes one partition (its replica moved to another node); the
    /// queue's ready rings stay for the others.
    pub fn remove(&mut self, queue: &str, partition: PartitionId) -> Option<Rc<Served>> {
        self.queues.get_mut(queue)?.partitions.remove(&partition)
    }

    /// Removes every partition of `queue`, in partition order, and closes
    /// its ready rings (claims waiting on them answer empty).
    pub fn remove_queue(&mut self, queue: &str) -> Vec<((String, PartitionId), Rc<Served>)> {
        self.queues.remove_entry(queue).map_or_else(Vec::new, |(name, served)| {
            served.ready.close();
            served
                .partitions
                .into_iter()
                .map(|(partition, served)| ((name.clone(), partition), served))
                .collect()
        })
    }

    /// Removes and returns every served partition, closing every ring.
    pub fn take_all(&mut self) -> Vec<((String, PartitionId), Rc<Served>)> {
        std::mem::take(&mut self.queues)
            .into_iter()
            .flat_map(|(name, served)| {
                served.ready.close();
                served
                    .partitions
                    .into_iter()
                    .map(move |(partition, served)| ((name.clone(), partition), served))
            })
            .collect()
    }
}
