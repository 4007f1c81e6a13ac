//! The partitions a shard serves, looked up by queue name and partition
//! without allocating: every data-path request does one lookup, and a key
//! of `(String, PartitionId)` needed an owned `String` for each.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::Served;
use crate::queue::PartitionId;

/// Served partitions by queue name, then partition.
#[derive(Default)]
pub struct ServedMap {
    queues: BTreeMap<String, BTreeMap<PartitionId, Rc<Served>>>,
}

impl ServedMap {
    /// The served partition `queue`/`partition`.
    pub fn get(&self, queue: &str, partition: PartitionId) -> Option<&Rc<Served>> {
        self.queues.get(queue)?.get(&partition)
    }

    /// Partitions served, over all queues.
    pub fn len(&self) -> usize {
        self.queues.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Every served partition, by queue name then partition.
    pub fn iter(&self) -> impl Iterator<Item = (&str, PartitionId, &Rc<Served>)> + '_ {
        self.queues.iter().flat_map(|(queue, partitions)| {
            partitions.iter().map(move |(partition, served)| (queue.as_str(), *partition, served))
        })
    }

    pub fn values(&self) -> impl Iterator<Item = &Rc<Served>> + '_ {
        self.queues.values().flat_map(BTreeMap::values)
    }

    /// Adds (or replaces) `queue`/`partition`.
    pub fn insert(&mut self, queue: &str, partition: PartitionId, served: Rc<Served>) {
        self.queues.entry(queue.to_owned()).or_default().insert(partition, served);
    }

    /// Removes every partition of `queue`, in partition order.
    pub fn remove_queue(&mut self, queue: &str) -> Vec<((String, PartitionId), Rc<Served>)> {
        self.queues.remove_entry(queue).map_or_else(Vec::new, |(name, partitions)| {
            partitions
                .into_iter()
                .map(|(partition, served)| ((name.clone(), partition), served))
                .collect()
        })
    }

    /// Removes and returns every served partition.
    pub fn take_all(&mut self) -> Vec<((String, PartitionId), Rc<Served>)> {
        std::mem::take(&mut self.queues)
            .into_iter()
            .flat_map(|(name, partitions)| {
                partitions
                    .into_iter()
                    .map(move |(partition, served)| ((name.clone(), partition), served))
            })
            .collect()
    }
}
