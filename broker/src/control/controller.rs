//! The controller: the cluster's catalog as a Raft group
//! (`docs/design/replication.md`, "Controller") — the assignment table's
//! changes are its entries, every node folds them in the same order, so
//! every node holds the same queues with the same ids, versions and
//! placement.
//!
//! **State.** [`ControllerState`]: the [`AssignmentTable`] and the next
//! queue id (ids are never reused). An entry is one [`AssignmentUpdate`]
//! (JSON in the one record of a data batch: rare, small, inspectable);
//! applying it is deterministic on every member: an update whose version
//! does not follow the table's, a create whose id is not the next one, or
//! one the table refuses is skipped by all alike (counted), so a proposal
//! planned on a state that moved meanwhile has no effect anywhere.
//!
//! **Proposals** ([`Controller::create_queue`], [`Controller::delete_queue`])
//! are made by the leader, one at a time, planned on its folded state once
//! that state covers every entry before its term; each waits for its entry
//! to commit and to fold, and reports whether it took effect (a skipped
//! one is planned again, a bounded number of times).
//!
//! **Folding** ([`Controller::fold_committed`]) applies what the member
//! committed and keeps the applied updates for the owner to hand to the
//! shards ([`Controller::take_applied`]), in order, exactly once.
//!
//! The member is a [`ReplicaDriver`] over a journal partition of its own
//! (the controller's directory holds a shard journal and a vote log of
//! their own); its group is [`CONTROLLER_GROUP`]. In a cluster the
//! coordinator runs it (`shard/controller_run.rs`) and the node's catalog
//! file is a cache of its state.

use std::cell::{Cell, Ref, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spool_wire::batch::{BatchHeader, BatchView, DataBatchBuilder, MessageId, Payload, Record};
use thiserror::Error;

use crate::control::assignment::{
    AssignmentChange, AssignmentError, AssignmentTable, AssignmentUpdate, AssignmentVersion,
    KeyPlacement, PartitionId, QueueName, ReplicaSets, ShardId, SubscriptionStart, Subscriptions,
};
use crate::io::Storage;
use crate::log::wakers::Notify;
use crate::queue::SubscriptionId;
use crate::queue::{MembershipChange, QueueConfig, QueueId};
use crate::replica::driver::{membership_batch, membership_of_batch};
use crate::replica::wire::GroupId;
use crate::replica::{DriverError, ReplicaDriver};

/// The controller's Raft group: a queue id no queue ever gets.
pub const CONTROLLER_GROUP: GroupId = GroupId { queue: u32::MAX, partition: 0 };

/// Times a proposal is planned again after a concurrent change skipped it.
const PLAN_ATTEMPTS: usize = 3;

/// Why the controller refused or failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// This member does not lead, or leads but has not folded every entry
    /// before its term yet (`leader`: the one it knows of, 0 for none).
    #[error("not the controller's leader (leader: node {leader})")]
    NotLeader { leader: u64 },
    /// The change is refused by the table (exists, not found, limits).
    #[error(transparent)]
    Refused(#[from] AssignmentError),
    /// The member refused or lost the proposal.
    #[error(transparent)]
    Replica(#[from] DriverError),
    /// Concurrent changes skipped this one every time it was planned.
    #[error("the change was planned {PLAN_ATTEMPTS} times and skipped every time")]
    Contended,
    /// A committed entry does not decode: the log is damaged.
    #[error("controller entry {index}: {reason}")]
    Entry { index: u64, reason: String },
    /// Queue ids are spent (`u32::MAX` is the controller's own group).
    #[error("queue ids are exhausted")]
    IdsExhausted,
}

/// The replicated catalog: the table and the next queue id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerState {
    pub table: AssignmentTable,
    pub next_queue_id: u32,
}

/// Why an entry was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// Its version does not follow the table's.
    Version { table: u64, update: u64 },
    /// A create whose id is not the next one.
    QueueId { expected: u32, got: u32 },
    /// The table refused it.
    Refused(AssignmentError),
}

impl ControllerState {
    /// The state of a cluster with `shard_count` shards per node and no
    /// queue yet.
    pub fn new(shard_count: u16) -> ControllerState {
        ControllerState { table: AssignmentTable::new(shard_count), next_queue_id: 1 }
    }

    /// Applies `update` as every member does (module docs).
    ///
    /// # Errors
    /// Why it was skipped; the state is unchanged.
    pub fn apply(&mut self, update: &AssignmentUpdate) -> Result<(), Skipped> {
        let expected = self.table.version().0 + 1;
        if update.version.0 != expected {
            return Err(Skipped::Version {
                table: self.table.version().0,
                update: update.version.0,
            });
        }
        if let AssignmentChange::CreateQueue { queue_id, .. } = &update.change {
            if queue_id.0 != self.next_queue_id {
                return Err(Skipped::QueueId { expected: self.next_queue_id, got: queue_id.0 });
            }
        }
        self.table.apply(update).map_err(Skipped::Refused)?;
        if let AssignmentChange::CreateQueue { queue_id, .. } = &update.change {
            self.next_queue_id = queue_id.0 + 1;
        }
        Ok(())
    }
}

/// An entry's JSON body.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    create: Option<CreateBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delete: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    grow: Option<GrowBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drained: Option<DrainedBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replicas: Option<ReplicasBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled: Option<SettledBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subscribe: Option<SubscribeBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unsubscribe: Option<UnsubscribeBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reseek: Option<SubscribeBody>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettledBody {
    queue: String,
    partition: u32,
    nodes: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicasBody {
    queue: String,
    partition: u32,
    from: Vec<u64>,
    to: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrowBody {
    queue: String,
    shards: Vec<u16>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainedBody {
    queue: String,
    key_version: u64,
    partition: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeBody {
    queue: String,
    name: String,
    id: u16,
    start: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeBody {
    queue: String,
    name: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    queue: String,
    queue_id: u32,
    shards: Vec<u16>,
    config: QueueConfig,
}

/// The stored batch of `update`: one record, its payload the JSON body.
///
/// # Errors
/// The batch cannot be built (a config too large for a record).
pub fn encode_update(update: &AssignmentUpdate) -> Result<Vec<u8>, String> {
    let mut body = EntryBody {
        version: update.version.0,
        create: None,
        delete: None,
        grow: None,
        drained: None,
        replicas: None,
        settled: None,
        subscribe: None,
        unsubscribe: None,
        reseek: None,
    };
    match &update.change {
        // A create's key map is always fresh in the controller's log (a
        // catalog's replay is local to a node).
        AssignmentChange::CreateQueue { queue, queue_id, shards, config, .. } => {
            body.create = Some(CreateBody {
                queue: queue.as_str().to_owned(),
                queue_id: queue_id.0,
                shards: shards.iter().map(|shard| shard.0).collect(),
                config: (**config).clone(),
            });
        }
        AssignmentChange::DeleteQueue { queue } => body.delete = Some(queue.as_str().to_owned()),
        AssignmentChange::GrowQueue { queue, shards } => {
            body.grow = Some(GrowBody {
                queue: queue.as_str().to_owned(),
                shards: shards.iter().map(|shard| shard.0).collect(),
            });
        }
        AssignmentChange::KeysDrained { queue, key_version, partition } => {
            body.drained = Some(DrainedBody {
                queue: queue.as_str().to_owned(),
                key_version: *key_version,
                partition: partition.0,
            });
        }
        AssignmentChange::SetReplicas { queue, partition, from, to } => {
            body.replicas = Some(ReplicasBody {
                queue: queue.as_str().to_owned(),
                partition: partition.0,
                from: from.clone(),
                to: to.clone(),
            });
        }
        AssignmentChange::ReplicasSettled { queue, partition, nodes } => {
            body.settled = Some(SettledBody {
                queue: queue.as_str().to_owned(),
                partition: partition.0,
                nodes: nodes.clone(),
            });
        }
        AssignmentChange::Subscribe { queue, name, id, start } => {
            body.subscribe = Some(SubscribeBody {
                queue: queue.as_str().to_owned(),
                name: name.clone(),
                id: id.0,
                start: start.text(),
            });
        }
        AssignmentChange::Unsubscribe { queue, name } => {
            body.unsubscribe =
                Some(UnsubscribeBody { queue: queue.as_str().to_owned(), name: name.clone() });
        }
        AssignmentChange::Reseek { queue, name, id, start } => {
            body.reseek = Some(SubscribeBody {
                queue: queue.as_str().to_owned(),
                name: name.clone(),
                id: id.0,
                start: start.text(),
            });
        }
    }
    let json = serde_json::to_vec(&body).map_err(|error| error.to_string())?;
    let mut message_id = [0u8; 16];
    message_id[..8].copy_from_slice(&update.version.0.to_le_bytes());
    let mut builder = DataBatchBuilder::new();
    builder
        .push(&Record {
            message_id: MessageId(message_id),
            routing_key: vec![],
            headers: vec![],
            payload: Payload::Inline(json),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: 0,
        })
        .map_err(|error| error.to_string())?;
    Ok(builder.finish().map_err(|error| error.to_string())?.to_vec())
}

/// The update a stored batch holds.
///
/// # Errors
/// Not a one-record data batch, or a body that does not decode.
pub fn decode_update(batch: &[u8]) -> Result<AssignmentUpdate, String> {
    BatchHeader::verify(batch).map_err(|error| error.to_string())?;
    let view = BatchView::validate(batch).map_err(|error| error.to_string())?;
    if view.len() != 1 {
        return Err(format!("{} records, not 1", view.len()));
    }
    let record = view.record(0);
    let json = match &record.payload {
        spool_wire::batch::ArchivedPayload::Inline(bytes) => bytes.as_slice(),
        _ => return Err("payload not inline".into()),
    };
    let body: EntryBody = serde_json::from_slice(json).map_err(|error| error.to_string())?;
    let name = |queue: &str| QueueName::new(queue).map_err(|error| error.to_string());
    let named = [
        body.create.is_some(),
        body.delete.is_some(),
        body.grow.is_some(),
        body.drained.is_some(),
        body.replicas.is_some(),
        body.settled.is_some(),
        body.subscribe.is_some(),
        body.unsubscribe.is_some(),
        body.reseek.is_some(),
    ];
    if named.iter().filter(|&&named| named).count() != 1 {
        return Err("an entry is one create, delete, grow, drained, replicas, settled, \
                    subscribe, unsubscribe or reseek"
            .into());
    }
    let change = if let Some(create) = body.create {
        AssignmentChange::CreateQueue {
            queue: name(&create.queue)?,
            queue_id: QueueId(create.queue_id),
            keys: KeyPlacement::fresh(u32::try_from(create.shards.len()).unwrap_or(u32::MAX)),
            replicas: ReplicaSets::new(),
            subscriptions: Subscriptions::default(),
            shards: create.shards.into_iter().map(ShardId).collect(),
            config: Arc::new(create.config),
        }
    } else if let Some(queue) = body.delete {
        AssignmentChange::DeleteQueue { queue: name(&queue)? }
    } else if let Some(grow) = body.grow {
        AssignmentChange::GrowQueue {
            queue: name(&grow.queue)?,
            shards: grow.shards.into_iter().map(ShardId).collect(),
        }
    } else if let Some(drained) = body.drained {
        AssignmentChange::KeysDrained {
            queue: name(&drained.queue)?,
            key_version: drained.key_version,
            partition: PartitionId(drained.partition),
        }
    } else if let Some(replicas) = body.replicas {
        AssignmentChange::SetReplicas {
            queue: name(&replicas.queue)?,
            partition: PartitionId(replicas.partition),
            from: replicas.from,
            to: replicas.to,
        }
    } else if let Some(settled) = body.settled {
        AssignmentChange::ReplicasSettled {
            queue: name(&settled.queue)?,
            partition: PartitionId(settled.partition),
            nodes: settled.nodes,
        }
    } else if let Some(subscribe) = body.subscribe {
        AssignmentChange::Subscribe {
            queue: name(&subscribe.queue)?,
            name: subscribe.name,
            id: SubscriptionId(subscribe.id),
            start: SubscriptionStart::parse(&subscribe.start)
                .ok_or_else(|| format!("subscription start {:?}", subscribe.start))?,
        }
    } else if let Some(unsubscribe) = body.unsubscribe {
        AssignmentChange::Unsubscribe { queue: name(&unsubscribe.queue)?, name: unsubscribe.name }
    } else if let Some(reseek) = body.reseek {
        AssignmentChange::Reseek {
            queue: name(&reseek.queue)?,
            name: reseek.name,
            id: SubscriptionId(reseek.id),
            start: SubscriptionStart::parse(&reseek.start)
                .ok_or_else(|| format!("subscription start {:?}", reseek.start))?,
        }
    } else {
        unreachable!("exactly one body is named: checked above")
    };
    Ok(AssignmentUpdate { version: AssignmentVersion(body.version), change })
}

/// The controller's member on this node. See the module docs.
pub struct Controller<S: Storage> {
    driver: Rc<ReplicaDriver<S>>,
    state: RefCell<ControllerState>,
    /// The highest entry folded, and its term.
    applied: Cell<(u64, u64)>,
    /// Updates applied, not yet taken by the owner.
    updates: RefCell<VecDeque<AssignmentUpdate>>,
    skipped: Cell<u64>,
    /// A proposal is under way (they go one at a time).
    proposing: Cell<bool>,
    folded: Notify,
}

impl<S: Storage> std::fmt::Debug for Controller<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("version", &self.state.borrow().table.version())
            .field("applied", &self.applied.get())
            .finish_non_exhaustive()
    }
}

impl<S: Storage> Controller<S> {
    /// The controller over `driver`, opened on the controller's journal
    /// partition with `applied` 0: the first
    /// [`fold_committed`](Self::fold_committed) folds every committed entry of its log, in
    /// order, from a cluster of `shard_count` shards per node and no queue.
    pub fn new(driver: Rc<ReplicaDriver<S>>, shard_count: u16) -> Rc<Self> {
        Rc::new(Controller {
            driver,
            state: RefCell::new(ControllerState::new(shard_count)),
            applied: Cell::new((0, 0)),
            updates: RefCell::default(),
            skipped: Cell::new(0),
            proposing: Cell::new(false),
            folded: Notify::default(),
        })
    }

    pub fn driver(&self) -> &Rc<ReplicaDriver<S>> {
        &self.driver
    }

    /// The replicated catalog as folded here.
    pub fn state(&self) -> Ref<'_, ControllerState> {
        self.state.borrow()
    }

    /// Entries skipped since open (stale plans).
    pub fn skipped(&self) -> u64 {
        self.skipped.get()
    }

    /// Folds what the member committed (module docs); returns how many
    /// entries it folded.
    ///
    /// # Errors
    /// [`ControllerError::Entry`] for an entry that does not decode.
    pub fn fold_committed(&self) -> Result<usize, ControllerError> {
        let committed = self.driver.take_committed();
        let Some(last) = committed.last().map(|entry| entry.index) else { return Ok(0) };
        let mut folded = 0;
        for entry in committed {
            if entry.index <= self.applied.get().0 {
                continue;
            }
            // A change of the group's own members is raft-rs's (the driver
            // applied it as it handed the entry out): nothing to fold.
            if !entry.batch.is_empty() && membership_of_batch(&entry.batch).is_none() {
                let update = decode_update(&entry.batch)
                    .map_err(|reason| ControllerError::Entry { index: entry.index, reason })?;
                match self.state.borrow_mut().apply(&update) {
                    Ok(()) => self.updates.borrow_mut().push_back(update),
                    Err(_) => self.skipped.set(self.skipped.get() + 1),
                }
            }
            self.applied.set((entry.index, entry.term));
            folded += 1;
        }
        self.driver.applied(last);
        self.folded.notify_all();
        Ok(folded)
    }

    /// The updates applied since the last call, in order: what the shards
    /// are to apply.
    pub fn take_applied(&self) -> Vec<AssignmentUpdate> {
        self.updates.borrow_mut().drain(..).collect()
    }

    /// Creates `queue` with `partitions` partitions (round-robin over the
    /// shards) and `config`, at the next queue id; returns the update once
    /// it is committed and folded here.
    ///
    /// # Errors
    /// [`ControllerError::NotLeader`], [`ControllerError::Refused`],
    /// [`ControllerError::Replica`], [`ControllerError::Contended`],
    /// [`ControllerError::IdsExhausted`].
    pub async fn create_queue(
        &self,
        queue: QueueName,
        partitions: u32,
        config: Arc<QueueConfig>,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| {
            if state.next_queue_id == CONTROLLER_GROUP.queue {
                return Err(ControllerError::IdsExhausted);
            }
            let id = QueueId(state.next_queue_id);
            Ok(state.table.plan_create_queue(queue.clone(), id, partitions, config.clone())?)
        })
        .await
    }

    /// Deletes `queue`; returns the update once committed and folded here.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn delete_queue(
        &self,
        queue: QueueName,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| Ok(state.table.plan_delete_queue(queue.clone())?)).await
    }

    /// Proposes growing `queue` to `partitions` partitions.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn grow_queue(
        &self,
        queue: QueueName,
        partitions: u32,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| Ok(state.table.plan_grow_queue(queue.clone(), partitions)?)).await
    }

    /// Proposes subscription `name` of `queue`, starting at `start`.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn subscribe(
        &self,
        queue: QueueName,
        name: String,
        start: SubscriptionStart,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| Ok(state.table.plan_subscribe(queue.clone(), name.clone(), start)?))
            .await
    }

    /// Proposes the end of subscription `name` of `queue`.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn unsubscribe(
        &self,
        queue: QueueName,
        name: String,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| Ok(state.table.plan_unsubscribe(queue.clone(), name.clone())?)).await
    }

    /// Proposes that subscription `name` of `queue` start over at `start`
    /// under a new id.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn reseek(
        &self,
        queue: QueueName,
        name: String,
        start: SubscriptionStart,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| Ok(state.table.plan_reseek(queue.clone(), name.clone(), start)?)).await
    }

    /// Proposes that `partition` of `queue` drained for `key_version`.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn keys_drained(
        &self,
        queue: QueueName,
        key_version: u64,
        partition: PartitionId,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| {
            Ok(state.table.plan_keys_drained(queue.clone(), key_version, partition)?)
        })
        .await
    }

    /// Proposes re-placing `partition` of `queue` from `from` to `to`.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn set_replicas(
        &self,
        queue: QueueName,
        partition: PartitionId,
        from: Vec<u64>,
        to: Vec<u64>,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| {
            Ok(state.table.plan_set_replicas(queue.clone(), partition, from.clone(), to.clone())?)
        })
        .await
    }

    /// Proposes that the group of `partition` of `queue` has exactly the
    /// voters `nodes`.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    pub async fn replicas_settled(
        &self,
        queue: QueueName,
        partition: PartitionId,
        nodes: Vec<u64>,
    ) -> Result<AssignmentUpdate, ControllerError> {
        self.propose(|state| {
            Ok(state.table.plan_replicas_settled(queue.clone(), partition, nodes.clone())?)
        })
        .await
    }

    /// On the leader, changes the controller group's own members by one
    /// raft-rs simple change (a learner made a voter, a voter made a
    /// learner) and returns once it is committed. Serialized with the
    /// table's changes.
    ///
    /// # Errors
    /// [`ControllerError::NotLeader`]; the driver's refusal (a change
    /// pending, one that changes nothing or leaves no voter) or loss.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), ControllerError> {
        while self.proposing.replace(true) {
            self.folded.wait().await;
        }
        let outcome = async {
            let (leads, _, leader) = self.driver.role();
            if !leads {
                return Err(ControllerError::NotLeader { leader });
            }
            let batch = membership_batch(change, 0, 0)?;
            let proposed = self.driver.propose(&batch)?;
            self.driver.committed(proposed.index, proposed.term).await?;
            Ok(())
        }
        .await;
        self.proposing.set(false);
        self.folded.notify_all();
        outcome
    }

    async fn propose(
        &self,
        plan: impl Fn(&ControllerState) -> Result<AssignmentUpdate, ControllerError>,
    ) -> Result<AssignmentUpdate, ControllerError> {
        while self.proposing.replace(true) {
            self.folded.wait().await;
        }
        let outcome = self.propose_one(plan).await;
        self.proposing.set(false);
        self.folded.notify_all();
        outcome
    }

    async fn propose_one(
        &self,
        plan: impl Fn(&ControllerState) -> Result<AssignmentUpdate, ControllerError>,
    ) -> Result<AssignmentUpdate, ControllerError> {
        for _ in 0..PLAN_ATTEMPTS {
            let (leads, term, leader) = self.driver.role();
            // Planned on a state that covers every entry before this term.
            if !leads || self.applied.get().1 != term {
                return Err(ControllerError::NotLeader { leader });
            }
            let update = plan(&self.state.borrow())?;
            let batch = encode_update(&update)
                .map_err(|reason| ControllerError::Entry { index: 0, reason })?;
            let proposed = self.driver.propose(&batch)?;
            self.driver.committed(proposed.index, proposed.term).await?;
            while self.applied.get().0 < proposed.index {
                let wait = self.folded.wait();
                self.fold_committed()?;
                if self.applied.get().0 < proposed.index {
                    wait.await;
                }
            }
            if self.state.borrow().table.version() >= update.version && self.took_effect(&update) {
                return Ok(update);
            }
        }
        Err(ControllerError::Contended)
    }

    /// Whether `update` is what the table holds at its version.
    fn took_effect(&self, update: &AssignmentUpdate) -> bool {
        let state = self.state.borrow();
        match &update.change {
            AssignmentChange::CreateQueue { queue, queue_id, .. } => {
                state.table.queue(queue).is_some_and(|entry| entry.id == *queue_id)
            }
            AssignmentChange::DeleteQueue { queue } => state.table.queue(queue).is_none(),
            // The queue's last partition was placed by this very update.
            AssignmentChange::GrowQueue { queue, .. } => state
                .table
                .queue(queue)
                .and_then(|entry| entry.partitions.last())
                .is_some_and(|last| last.assigned_at == update.version),
            AssignmentChange::KeysDrained { queue, key_version, partition } => {
                state.table.queue(queue).is_some_and(|entry| {
                    entry.keys.version > *key_version || !entry.keys.draining.contains(partition)
                })
            }
            AssignmentChange::SetReplicas { queue, partition, to, .. } => {
                state.table.queue(queue).is_some_and(|entry| {
                    entry.replicas.get(partition).is_some_and(|set| set.nodes == *to)
                })
            }
            AssignmentChange::ReplicasSettled { queue, partition, nodes } => {
                state.table.queue(queue).is_some_and(|entry| {
                    entry
                        .replicas
                        .get(partition)
                        .is_some_and(|set| set.nodes == *nodes && set.settled)
                })
            }
            AssignmentChange::Subscribe { queue, name, id, .. }
            | AssignmentChange::Reseek { queue, name, id, .. } => {
                state.table.queue(queue).is_some_and(|entry| {
                    entry.subscriptions.named.get(name).is_some_and(|sub| sub.id == *id)
                })
            }
            AssignmentChange::Unsubscribe { queue, name } => state
                .table
                .queue(queue)
                .is_none_or(|entry| !entry.subscriptions.named.contains_key(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: every kind of controller entry reads back as written, and an
    // entry naming two changes is refused. Method: encode and decode a
    // grow and a drained report; hand-build a body with both.
    #[test]
    fn key_map_entries_round_trip() {
        let queue = QueueName::new("jobs").unwrap();
        for change in [
            AssignmentChange::GrowQueue { queue: queue.clone(), shards: vec![ShardId(1)] },
            AssignmentChange::KeysDrained {
                queue: queue.clone(),
                key_version: 2,
                partition: PartitionId(3),
            },
            AssignmentChange::SetReplicas {
                queue: queue.clone(),
                partition: PartitionId(1),
                from: vec![3, 1, 2],
                to: vec![4, 1, 2],
            },
            AssignmentChange::ReplicasSettled {
                queue: queue.clone(),
                partition: PartitionId(1),
                nodes: vec![4, 1, 2],
            },
            AssignmentChange::Subscribe {
                queue: queue.clone(),
                name: "audit".to_owned(),
                id: SubscriptionId(3),
                start: SubscriptionStart::Earliest,
            },
            AssignmentChange::Subscribe {
                queue: queue.clone(),
                name: "replay".to_owned(),
                id: SubscriptionId(4),
                start: SubscriptionStart::Time(1_700_000_000_000),
            },
            AssignmentChange::Unsubscribe { queue: queue.clone(), name: "audit".to_owned() },
            AssignmentChange::Reseek {
                queue: queue.clone(),
                name: "replay".to_owned(),
                id: SubscriptionId(5),
                start: SubscriptionStart::Offset(9),
            },
        ] {
            let update = AssignmentUpdate { version: AssignmentVersion(9), change };
            let batch = encode_update(&update).unwrap();
            assert_eq!(decode_update(&batch).unwrap(), update);
        }
        let both = r#"{"version":3,"delete":"jobs","grow":{"queue":"jobs","shards":[0]}}"#;
        let mut builder = DataBatchBuilder::new();
        builder
            .push(&Record {
                message_id: MessageId([0; 16]),
                routing_key: vec![],
                headers: vec![],
                payload: Payload::Inline(both.as_bytes().to_vec()),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: 0,
            })
            .unwrap();
        let batch = builder.finish().unwrap();
        assert!(decode_update(&batch).unwrap_err().contains("one create, delete, grow"));
    }
}
