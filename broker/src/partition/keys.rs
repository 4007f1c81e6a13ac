//! The partition's place in its queue's key map (`docs/design/replication.md`,
//! "Resizing a queue"): how many partitions the queue's keys are placed
//! over, so an enqueue refuses a keyed record that a resize moved to
//! another partition (`KEY_MOVED`: the producer routes it again), and a
//! resize's hold, under which the partition hands out nothing from its
//! main lane until the older partitions drained what they took before the
//! resize. Also the drain check an older partition's owner runs.

use std::cell::Cell;

use super::Partition;
use crate::io::Storage;
use crate::queue::Offset;

/// Where a partition stands in its queue's key map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRoute {
    /// The key map's version (1 at the queue's creation, + 1 per resize).
    pub version: u64,
    /// The queue's partition count, which keys are placed over.
    pub partitions: u32,
    /// A resize holds this partition: its main lane hands out nothing.
    pub held: bool,
}

/// The partition's [`KeyRoute`]; `None` until the shard sets it (a
/// partition opened outside a queue's table: keys are not checked).
#[derive(Debug, Default)]
pub(super) struct KeyState {
    route: Cell<Option<KeyRoute>>,
}

impl<S: Storage + Clone> Partition<S> {
    /// Sets where the partition stands in its queue's key map: at open and
    /// whenever the queue's table entry changes. A hold lifted wakes the
    /// claims waiting on it and lists it for claims of any partition.
    pub fn set_key_route(&self, route: KeyRoute) {
        let was_behind = self.key_map_behind();
        let before = self.keys.route.replace(Some(route));
        let was_held = before.is_some_and(|before| before.held);
        let caught_up = was_behind && !self.key_map_behind();
        if caught_up {
            tracing::info!(partition = ?self.name, version = route.version,
                "the key map the log names is applied; serving");
        }
        if (was_held && !route.held) || caught_up {
            self.claimable.notify_all();
            self.ready(0);
            self.hint_wakeup();
        }
    }

    pub fn key_route(&self) -> Option<KeyRoute> {
        self.keys.route.get()
    }

    /// Whether the log names a newer version of the queue's key map than
    /// the one this node applied: a server that took keys by it wrote it
    /// (`Event::KeyMap`), so serving by the older map could take a key the
    /// newer one moved. Such a partition does not serve until the table
    /// catches up ([`Partition::serving`]).
    pub fn key_map_behind(&self) -> bool {
        let Some(route) = self.keys.route.get() else { return false };
        self.state.borrow().logged_key_map().is_some_and(|logged| logged.version > route.version)
    }

    /// Writes the key map this partition takes keys by into its log
    /// (`Event::KeyMap`), unless the log already names it or a newer one;
    /// returns once it is durable (committed, when replicated). A later
    /// leader that folds it does not serve before it applied that version.
    ///
    /// # Errors
    /// The log's append or its durability; [`PartitionError::NotLeader`]
    /// (replicated) when this member does not lead.
    pub async fn log_key_map(&self) -> Result<(), super::PartitionError> {
        let Some(route) = self.keys.route.get() else { return Ok(()) };
        if self.logs_key_map(route.version) {
            return Ok(());
        }
        self.log
            .writable(spool_wire::batch::BatchKind::Control, Self::control_bytes(1, false))
            .await;
        if self.logs_key_map(route.version) {
            return Ok(());
        }
        let now = (self.clock)();
        let event = crate::queue::Event::KeyMap {
            version: route.version,
            partitions: route.partitions,
            at_ms: now,
        };
        if let Some(ticket) = self.append_events(&[event], now)? {
            ticket.durable().await?;
        }
        Ok(())
    }

    /// Whether the log names version `version` of the key map, or a newer.
    pub fn logs_key_map(&self, version: u64) -> bool {
        self.state.borrow().logged_key_map().is_some_and(|logged| logged.version >= version)
    }

    /// Whether a resize holds the main lane.
    pub(super) fn held_by_keys(&self) -> bool {
        self.keys.route.get().is_some_and(|route| route.held)
    }

    /// Whether a keyed record belongs to another partition of the queue
    /// now (the queue was resized since its producer routed it).
    pub(super) fn key_moved(&self, routing_key: &[u8]) -> bool {
        let Some(route) = self.keys.route.get() else { return false };
        !routing_key.is_empty()
            && spool_wire::routing::key_partition(routing_key, route.partitions)
                != self.name.partition.0
    }

    /// Whether every main-lane message below `barrier` is finished (acked,
    /// dead-lettered or expired): nothing the partition took before
    /// `barrier` can still be delivered.
    pub fn drained_below(&self, barrier: Offset) -> bool {
        self.state.borrow().oldest_live_main().is_none_or(|oldest| oldest >= barrier)
    }

    /// Waits until everything the partition appended so far is durable
    /// (committed by a quorum, when replicated): a drain report must not
    /// rest on acks a crash or a new leader could still undo.
    ///
    /// # Errors
    /// The log failed, or (replicated) an entry was superseded: this
    /// member lost the lead.
    pub async fn appended_durable(&self) -> Result<(), super::PartitionError> {
        let barrier = self.appends.borrow().barrier();
        barrier.durable().await
    }

    /// The offset the next appended record gets: the drain barrier of a
    /// resize, taken when this partition starts refusing moved keys.
    pub fn next_offset(&self) -> Offset {
        Offset(self.log.next_offset().0)
    }
}
