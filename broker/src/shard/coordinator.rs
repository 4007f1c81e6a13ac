//! [`CoordinatorHandle`]: how a thread other than the coordinator asks it
//! something — create, delete and describe queues, apply an assignment
//! change, collect the shards' reports — with a bounded command queue and
//! a bounded wait for the answer. The blocking methods are for threads
//! that are not executors (the admin port, tests); the `_async` ones poll
//! and never block a shard's executor. It decides nothing itself: the
//! coordinator (`executor.rs`) does.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, PoisonError};

use std::net::SocketAddr;

use super::{report, CoordinatorCommand, CoordinatorError, Shared};
use crate::control::assignment::{
    AssignmentError, AssignmentTable, AssignmentVersion, QueueName, ShardId, SubscriptionStart,
};
use crate::limits::COORDINATOR_POLL_INTERVAL;
use crate::queue::{QueueConfig, QueueId};

/// Handle to the coordinator. The plain methods block and are for
/// non-executor threads (admin endpoint, tests); the `_async` ones are for
/// a shard's frame handler and never block its executor. Every shard gets
/// one in [`ShardContext::control`](hooks::ShardContext).
#[derive(Debug, Clone)]
pub struct CoordinatorHandle {
    pub(super) commands: mpsc::SyncSender<CoordinatorCommand>,
    pub(super) shared: Arc<Shared>,
}

/// A submitted command's pending answer.
struct Pending<T>(mpsc::Receiver<Result<T, CoordinatorError>>);

impl<T> Pending<T> {
    /// The answer if it has arrived.
    fn try_take(&self) -> Option<Result<T, CoordinatorError>> {
        match self.0.try_recv() {
            Ok(answer) => Some(answer),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(CoordinatorError::Stopped)),
        }
    }
}

/// A created queue: the table version that holds it and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCreated {
    pub version: AssignmentVersion,
    pub queue_id: QueueId,
}

/// A change to a queue's key map (`docs/design/replication.md`,
/// "Resizing a queue").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyChange {
    /// Grow the queue to `partitions` partitions.
    Grow { queue: QueueName, partitions: u32 },
    /// Older partition `partition` finished what it took before key map
    /// `key_version`.
    Drained { queue: QueueName, key_version: u64, partition: crate::queue::PartitionId },
    /// In a cluster: the group of `partition` has exactly the voters
    /// `nodes`, the set the table re-placed it to (its leader reports it).
    Settled { queue: QueueName, partition: crate::queue::PartitionId, nodes: Vec<u64> },
    /// In a cluster: `partition`'s replica on node `from` moves to node
    /// `to` (an operator's move, or the controller's re-placement of a
    /// node that is down).
    Move { queue: QueueName, partition: crate::queue::PartitionId, from: u64, to: u64 },
    /// Add subscription `name` to the queue, starting at `start`.
    Subscribe { queue: QueueName, name: String, start: SubscriptionStart },
    /// Delete subscription `name` of the queue.
    Unsubscribe { queue: QueueName, name: String },
    /// Start subscription `name` of the queue over at `start` (a new id).
    Reseek { queue: QueueName, name: String, start: SubscriptionStart },
}

pub(super) fn not_leader_message(leader: u64, client: &Option<SocketAddr>) -> String {
    match (leader, client) {
        (0, _) => "this node does not lead the controller and knows no leader yet; retry".into(),
        (leader, Some(client)) => {
            format!("this node does not lead the controller; node {leader} at {client} does")
        }
        (leader, None) => format!("this node does not lead the controller; node {leader} does"),
    }
}

/// Number of [`COORDINATOR_POLL_INTERVAL`] polls that cover `timeout_ms`.
fn polls_for(timeout_ms: u64) -> u64 {
    let interval_ms = COORDINATOR_POLL_INTERVAL.as_millis().max(1) as u64;
    timeout_ms.div_ceil(interval_ms).max(1)
}

impl CoordinatorHandle {
    /// Queues a command without waiting (never blocks: `try_send`).
    fn submit<T>(
        &self,
        make: impl FnOnce(mpsc::SyncSender<Result<T, CoordinatorError>>) -> CoordinatorCommand,
    ) -> Result<Pending<T>, CoordinatorError> {
        let (reply, answer) = mpsc::sync_channel(1);
        match self.commands.try_send(make(reply)) {
            Ok(()) => Ok(Pending(answer)),
            Err(mpsc::TrySendError::Full(_)) => Err(CoordinatorError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(CoordinatorError::Stopped),
        }
    }

    fn submit_create(
        &self,
        queue: &str,
        partitions: u32,
        config: QueueConfig,
    ) -> Result<Pending<QueueCreated>, CoordinatorError> {
        let queue = QueueName::new(queue)?;
        config.validate().map_err(AssignmentError::from)?;
        let config = Arc::new(config);
        self.submit(|reply| CoordinatorCommand::CreateQueue { queue, partitions, config, reply })
    }

    fn submit_delete(
        &self,
        queue: &str,
        expect_id: Option<QueueId>,
    ) -> Result<Pending<AssignmentVersion>, CoordinatorError> {
        let queue = QueueName::new(queue)?;
        self.submit(|reply| CoordinatorCommand::DeleteQueue { queue, expect_id, reply })
    }

    /// Creates `queue` with `partitions` partitions placed round-robin over
    /// the shards and the given config; returns the table version that
    /// holds it and the queue's id. The catalog is durable when this
    /// returns; shards apply the change asynchronously: see
    /// [`wait_applied`](Self::wait_applied). Blocks: not for executors.
    ///
    /// # Errors
    /// Invalid name, count or config (`Assignment`), queue exists, ids
    /// exhausted, catalog write failed (`Catalog`: nothing changed), control
    /// stopped or busy.
    pub fn create_queue(
        &self,
        queue: &str,
        partitions: u32,
        config: QueueConfig,
    ) -> Result<QueueCreated, CoordinatorError> {
        let pending = self.submit_create(queue, partitions, config)?;
        pending.0.recv().map_err(|_| CoordinatorError::Stopped)?
    }

    /// Submits a key map change (a resize, or an older partition drained)
    /// and awaits the table version that holds it, then every shard's
    /// apply of it; on a glommio executor, bounded by `timeout_ms`.
    ///
    /// # Errors
    /// The table's refusal (`Assignment`), `NoReply`, `Timeout`,
    /// [`CoordinatorError::ResizeIncomplete`] when a shard could not open
    /// an added partition, control stopped or busy.
    pub(crate) async fn key_change_async(
        &self,
        change: KeyChange,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let queue = match &change {
            KeyChange::Grow { queue, .. }
            | KeyChange::Drained { queue, .. }
            | KeyChange::Settled { queue, .. }
            | KeyChange::Move { queue, .. }
            | KeyChange::Subscribe { queue, .. }
            | KeyChange::Unsubscribe { queue, .. }
            | KeyChange::Reseek { queue, .. } => queue.clone(),
        };
        let pending = self.submit(|reply| CoordinatorCommand::KeyChange { change, reply })?;
        let mut polls_left = polls_for(timeout_ms);
        let version = await_reply(&pending, &mut polls_left, timeout_ms).await?;
        self.await_applied(version, &mut polls_left, timeout_ms).await?;
        let failures = self.shared.take_hook_failures(version);
        if failures.is_empty() {
            return Ok(version);
        }
        Err(CoordinatorError::ResizeIncomplete {
            queue: queue.as_str().to_owned(),
            failures: failures.into_iter().map(|failure| failure.reason).collect(),
        })
    }

    /// Deletes `queue`; returns the table version without it. The owning
    /// shards' hooks remove its partitions when they apply the update.
    /// Blocks: not for executors.
    ///
    /// # Errors
    /// Unknown queue, catalog write failed, control stopped or busy.
    pub fn delete_queue(&self, queue: &str) -> Result<AssignmentVersion, CoordinatorError> {
        let pending = self.submit_delete(queue, None)?;
        pending.0.recv().map_err(|_| CoordinatorError::Stopped)?
    }

    /// [`create_queue`](Self::create_queue) then
    /// [`wait_applied_async`](Self::wait_applied_async), for a shard's
    /// frame handler: awaits glommio timers, never blocks the executor.
    /// `timeout_ms` bounds the whole call. Must run on a glommio executor,
    /// and never inside `ShardHooks::on_assignment` (the shard would wait
    /// for itself to apply the change it is applying).
    ///
    /// # Errors
    /// As `create_queue`; [`CoordinatorError::NoReply`] if the coordinator
    /// did not answer in time (the queue may or may not exist);
    /// [`CoordinatorError::Timeout`] if it was created but not every shard
    /// applied it in time; [`CoordinatorError::CreateFailed`] if a shard could
    /// not open one of its partitions: the queue is then deleted again
    /// (catalog and every shard), so the name is free for a retry once the
    /// cause is fixed. Between the create and that delete (a few ms) other
    /// clients may see the queue; what they enqueue in that window goes
    /// with it.
    pub async fn create_queue_async(
        &self,
        queue: &str,
        partitions: u32,
        config: QueueConfig,
        timeout_ms: u64,
    ) -> Result<QueueCreated, CoordinatorError> {
        let pending = self.submit_create(queue, partitions, config)?;
        let mut polls_left = polls_for(timeout_ms);
        let created = await_reply(&pending, &mut polls_left, timeout_ms).await?;
        self.await_applied(created.version, &mut polls_left, timeout_ms).await?;
        let failures = self.shared.take_hook_failures(created.version);
        if failures.is_empty() {
            return Ok(created);
        }
        tracing::warn!(queue, failures = %failures.iter().map(|failure| failure.reason.as_str()).collect::<Vec<_>>().join("; "), "create failed on a shard; deleting the queue again");
        // The rollback gets its own budget: the create may have used most
        // of the first one, and an unremoved half-created queue is worse
        // than a late answer.
        let mut polls_left = polls_for(timeout_ms);
        let rollback = async {
            let pending = self.submit_delete(queue, Some(created.queue_id))?;
            let version = await_reply(&pending, &mut polls_left, timeout_ms).await?;
            self.await_applied(version, &mut polls_left, timeout_ms).await
        }
        .await;
        if let Err(error) = &rollback {
            tracing::error!(queue, %error, "could not delete the half-created queue");
        }
        let refused = failures.iter().all(|failure| failure.refused);
        let failures: Vec<String> = failures.into_iter().map(|failure| failure.reason).collect();
        match rollback {
            Ok(_) if refused => {
                Err(CoordinatorError::CreateRefused { queue: queue.to_owned(), failures })
            }
            rollback => Err(CoordinatorError::CreateFailed {
                queue: queue.to_owned(),
                failures,
                rollback: rollback.err().map(|error| error.to_string()),
            }),
        }
    }

    /// [`delete_queue`](Self::delete_queue) then
    /// [`wait_applied_async`](Self::wait_applied_async); see
    /// [`create_queue_async`](Self::create_queue_async) for where it may run.
    ///
    /// # Errors
    /// As `delete_queue`, plus `NoReply` and `Timeout`.
    pub async fn delete_queue_async(
        &self,
        queue: &str,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let pending = self.submit_delete(queue, None)?;
        let mut polls_left = polls_for(timeout_ms);
        let version = await_reply(&pending, &mut polls_left, timeout_ms).await?;
        self.await_applied(version, &mut polls_left, timeout_ms).await?;
        Ok(version)
    }

    /// Awaits (on a glommio executor) until every shard applied `version`.
    ///
    /// # Errors
    /// [`CoordinatorError::Timeout`] after about `timeout_ms`.
    pub async fn wait_applied_async(
        &self,
        version: AssignmentVersion,
        timeout_ms: u64,
    ) -> Result<(), CoordinatorError> {
        let mut polls_left = polls_for(timeout_ms);
        self.await_applied(version, &mut polls_left, timeout_ms).await
    }

    async fn await_applied(
        &self,
        version: AssignmentVersion,
        polls_left: &mut u64,
        timeout_ms: u64,
    ) -> Result<(), CoordinatorError> {
        loop {
            if self.shared.all_applied(version) {
                return Ok(());
            }
            if *polls_left == 0 {
                return Err(CoordinatorError::Timeout { version, timeout_ms });
            }
            *polls_left -= 1;
            glommio::timer::sleep(COORDINATOR_POLL_INTERVAL).await;
        }
    }

    /// The table as of the last durable catalog write: every queue's id,
    /// config and placement, for ListQueues/Metadata from any shard. It may
    /// be ahead of a shard's own copy (that shard has not applied the newest
    /// update yet). Cheap: clones an `Arc`.
    pub fn catalog_snapshot(&self) -> Arc<AssignmentTable> {
        self.shared.committed.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shared.applied_versions.len()
    }

    /// The nodes' health as this node's controller member last published
    /// it (`control/cluster/health.rs`); none on a single node.
    pub fn cluster_health(&self) -> Option<crate::control::cluster::ClusterHealth> {
        self.shared.health.read().unwrap_or_else(PoisonError::into_inner).health.clone()
    }

    /// Every partition's replica set by the committed table (`None` on a
    /// single node).
    pub fn replica_sets(&self) -> Option<Vec<crate::control::cluster::PartitionReplicas>> {
        let node =
            self.shared.health.read().unwrap_or_else(PoisonError::into_inner).node.clone()?;
        Some(node.replica_sets(&self.catalog_snapshot()))
    }

    /// Adds subscription `name` to `queue` (starting at `start`) or, with
    /// `start` `None`, deletes it; returns the table version that holds
    /// the change once every shard of this node applied it (each
    /// partition's leader then starts or ends it in its log). Blocks (up to
    /// `timeout_ms`): not for executors.
    ///
    /// # Errors
    /// The table's refusal (`Assignment`), `NotLeader` (a cluster member
    /// that does not lead the controller), `NoReply`, `Timeout`.
    pub fn change_subscription(
        &self,
        queue: QueueName,
        name: String,
        start: Option<SubscriptionStart>,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let change = match start {
            Some(start) => KeyChange::Subscribe { queue, name, start },
            None => KeyChange::Unsubscribe { queue, name },
        };
        self.key_change_applied(change, timeout_ms)
    }

    /// Submits `change`, waits (blocking, up to `timeout_ms` each) for the
    /// controller's answer, then for every shard of this node to apply it.
    fn key_change_applied(
        &self,
        change: KeyChange,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let pending = self.submit(|reply| CoordinatorCommand::KeyChange { change, reply })?;
        let version = pending
            .0
            .recv_timeout(std::time::Duration::from_millis(timeout_ms))
            .map_err(|_| CoordinatorError::NoReply { timeout_ms })??;
        self.wait_applied(version, timeout_ms)?;
        Ok(version)
    }

    /// [`change_subscription`](Self::change_subscription) for a shard's
    /// frame handler: awaits glommio timers, never blocks the executor;
    /// `timeout_ms` bounds the whole call. Must run on a glommio executor,
    /// and never inside `ShardHooks::on_assignment` (see
    /// [`create_queue_async`](Self::create_queue_async)).
    ///
    /// # Errors
    /// As `change_subscription`: the table's refusal (`Assignment`),
    /// `NotLeader`, `NoReply` (the change may or may not be made),
    /// `Timeout` (made, not yet applied by every shard), control stopped
    /// or busy.
    pub async fn change_subscription_async(
        &self,
        queue: QueueName,
        name: String,
        start: Option<SubscriptionStart>,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let change = match start {
            Some(start) => KeyChange::Subscribe { queue, name, start },
            None => KeyChange::Unsubscribe { queue, name },
        };
        let pending = self.submit(|reply| CoordinatorCommand::KeyChange { change, reply })?;
        let mut polls_left = polls_for(timeout_ms);
        let version = await_reply(&pending, &mut polls_left, timeout_ms).await?;
        self.await_applied(version, &mut polls_left, timeout_ms).await?;
        Ok(version)
    }

    /// Starts subscription `name` of `queue` over at `start` under a new id
    /// (a rewind: its claims, retries and dead letters go, and every token
    /// of the old id is refused); returns the table version once every
    /// shard of this node applied it. Blocks (up to `timeout_ms`): not for
    /// executors.
    ///
    /// # Errors
    /// As [`change_subscription`](Self::change_subscription).
    pub fn reseek_subscription(
        &self,
        queue: QueueName,
        name: String,
        start: SubscriptionStart,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        self.key_change_applied(KeyChange::Reseek { queue, name, start }, timeout_ms)
    }

    /// Moves `partition` of `queue`'s replica off node `from` onto node
    /// `to` (`spool cluster move`); returns the table version that holds
    /// the new set, once the controller committed it. The group's leader
    /// then moves its members. Blocks (up to `timeout_ms`): not for
    /// executors.
    ///
    /// # Errors
    /// The table's refusal (`Assignment`), `NotLeader`, `NoReply`,
    /// [`CoordinatorError::NotClustered`] on a single node.
    pub fn move_replica(
        &self,
        queue: QueueName,
        partition: crate::queue::PartitionId,
        from: u64,
        to: u64,
        timeout_ms: u64,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        let change = KeyChange::Move { queue, partition, from, to };
        let pending = self.submit(|reply| CoordinatorCommand::KeyChange { change, reply })?;
        pending
            .0
            .recv_timeout(std::time::Duration::from_millis(timeout_ms))
            .map_err(|_| CoordinatorError::NoReply { timeout_ms })?
    }

    /// The broker's data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.shared.data_dir
    }

    /// Whether the broker has been asked to stop.
    pub fn stop_requested(&self) -> bool {
        self.shared.stop_requested.load(Ordering::Acquire)
    }

    /// Asks every shard for its [`report::ShardReport`] (through the control
    /// executor and the shards' channels: cross-core messages, never shared
    /// state). Never blocks: the reports arrive on the returned receiver,
    /// one per shard that answers; poll it with `try_recv` up to a deadline.
    /// A shard busy applying an assignment change answers after it.
    ///
    /// # Errors
    /// Control stopped or busy.
    pub fn request_reports(&self) -> Result<mpsc::Receiver<report::ShardReport>, CoordinatorError> {
        let (reply, reports) = mpsc::sync_channel(self.shard_count());
        match self.commands.try_send(CoordinatorCommand::Report { reply }) {
            Ok(()) => Ok(reports),
            Err(mpsc::TrySendError::Full(_)) => Err(CoordinatorError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(CoordinatorError::Stopped),
        }
    }

    /// The newest table version `shard` has applied.
    pub fn applied_version(&self, shard: ShardId) -> AssignmentVersion {
        AssignmentVersion(
            self.shared.applied_versions[usize::from(shard.0)].load(Ordering::Acquire),
        )
    }

    /// Blocks until every shard has applied `version`. Not for executors:
    /// use [`wait_applied_async`](Self::wait_applied_async) there.
    ///
    /// # Errors
    /// [`CoordinatorError::Timeout`] after about `timeout_ms`.
    pub fn wait_applied(
        &self,
        version: AssignmentVersion,
        timeout_ms: u64,
    ) -> Result<(), CoordinatorError> {
        for _ in 0..polls_for(timeout_ms) {
            if self.shared.all_applied(version) {
                return Ok(());
            }
            std::thread::sleep(COORDINATOR_POLL_INTERVAL);
        }
        if self.shared.all_applied(version) {
            return Ok(());
        }
        Err(CoordinatorError::Timeout { version, timeout_ms })
    }
}

/// Awaits a control reply on a glommio executor, spending `polls_left`.
async fn await_reply<T>(
    pending: &Pending<T>,
    polls_left: &mut u64,
    timeout_ms: u64,
) -> Result<T, CoordinatorError> {
    loop {
        if let Some(answer) = pending.try_take() {
            return answer;
        }
        if *polls_left == 0 {
            return Err(CoordinatorError::NoReply { timeout_ms });
        }
        *polls_left -= 1;
        glommio::timer::sleep(COORDINATOR_POLL_INTERVAL).await;
    }
}
