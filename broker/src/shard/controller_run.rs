//! The controller group on the coordinator (`docs/design/replication.md`,
//! "Controller on the coordinator"): in a cluster the node's catalog is
//! the controller's Raft group (`control/controller.rs`), not the
//! coordinator's own plan.
//!
//! - **Open** ([`ClusterCatalog::open`]): the controller's journal and vote
//!   log under `<data_dir>/controller/` (O_DIRECT files of
//!   [`CONTROLLER_JOURNAL_FILE_BYTES`]), its journal partition
//!   ([`CONTROLLER_GROUP`]) and [`ReplicaDriver`] with the cluster's
//!   controller's members (the first `controller_voters` nodes vote, every
//!   other node is a learner: it gets the catalog's every entry and never
//!   votes), a [`ReplicationHost`] for that one group with a link to every
//!   other node's controller peer port (the node's peer port + the shard
//!   count; mutual TLS when the cluster has it) and a [`PeerReceiver`] on
//!   this node's. A learner answers changes as any non-leader does, with
//!   the leader's address.
//! - **Fold**: at every progress of the member (and when a change of this
//!   node folded), the committed entries are folded; updates whose version
//!   the catalog file already holds are skipped (applied before a
//!   restart), the rest go to a copy of the table, the catalog file (now a
//!   durable cache of the controller's state: at start the shards open
//!   their partitions from it before the controller caught up), the shared
//!   committed table, and every shard, in order. An entry that does not
//!   decode, or an update the table refuses, stops the coordinator.
//! - **Changes**: CreateQueue and DeleteQueue become proposals of this
//!   member, each a task of its own, answered once the fold has handed
//!   the update to every shard (so a creator's wait for every shard's
//!   applied version works as on a single node). A member that does not
//!   lead answers [`CoordinatorError::NotLeader`] with the leader's client
//!   address.
//! - **Stop** ([`ClusterCatalog::stop`]): the host (ticks, links, the
//!   driver), the receiver, then the journal, its queued entries made
//!   durable.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures_lite::future::or;
use glommio::channels::shared_channel::ConnectedSender;
use glommio::Task;

use crate::control::assignment::{
    AssignmentChange, AssignmentError, AssignmentTable, AssignmentUpdate, AssignmentVersion,
    QueueName,
};
use crate::control::catalog::{self, Catalog};
use crate::control::cluster::health::{evaluate, Heard};
use crate::control::cluster::limits::{
    CONTROLLER_COMMANDS_IN_FLIGHT_MAX, CONTROLLER_ENTRY_BYTES_MAX, CONTROLLER_JOURNAL_FILE_BYTES,
    CONTROLLER_READ_CACHE_BYTES, NODE_HEALTH_INTERVAL,
};
use crate::control::cluster::{ClusterHealth, ClusterNode};
use crate::control::controller::{Controller, ControllerError, CONTROLLER_GROUP};
use crate::io::DmaStorage;
use crate::limits::PORT_IN_USE_RETRY_MS;
use crate::log::journal::{JournalConfig, JournalPos, LogFloor, ShardJournal};
use crate::log::vote::VoteLog;
use crate::log::wakers::Notify;
use crate::log::{ExitOnFatal, Offset};
use crate::net::listener::{bind_listener, wait_port_free, NetError};
use crate::net::peer::{PeerReceiver, ReceiverLimits, SenderLimits};
use crate::queue::{PartitionId, QueueConfig, QueueId};
use crate::replica::{DriverError, ReplicaDriver, Timing};
use crate::shard::replication::ReplicationHost;
use crate::shard::{
    broadcast, CoordinatorCommand, CoordinatorError, KeyChange, QueueCreated, ShardError,
    ShardMessage, Shared,
};

mod replacement;

/// A drain report (or, with `settled`, a settled replica set) forwarded
/// to the controller's leader.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ForwardedDrain {
    queue: String,
    key_version: u64,
    partition: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled: Option<Vec<u64>>,
}

/// The controller's directory under the data dir.
pub(crate) const CONTROLLER_DIR_NAME: &str = "controller";

/// The controller journal's settings: small files, small entries.
fn journal_config() -> JournalConfig {
    JournalConfig {
        file_bytes: CONTROLLER_JOURNAL_FILE_BYTES,
        entry_bytes_max: CONTROLLER_ENTRY_BYTES_MAX,
        read_cache_bytes: CONTROLLER_READ_CACHE_BYTES,
        read_ahead_bytes: CONTROLLER_READ_CACHE_BYTES,
        ..JournalConfig::default()
    }
}

/// The updates of `taken` the shards do not hold yet: those above
/// `holds`, the version of the table they were given (the catalog file's
/// at start, then each batch's last). The controller hands out every
/// update from its log's first entry after a restart; those the catalog
/// file already held were applied before it.
pub(crate) fn fresh_updates(
    holds: AssignmentVersion,
    taken: Vec<AssignmentUpdate>,
) -> Vec<AssignmentUpdate> {
    taken.into_iter().filter(|update| update.version > holds).collect()
}

/// The coordinator's answer for a controller's refusal; `client` gives a
/// node's first client address.
pub(crate) fn coordinator_error(
    error: ControllerError,
    client: impl Fn(u64) -> Option<SocketAddr>,
) -> CoordinatorError {
    match error {
        ControllerError::NotLeader { leader }
        | ControllerError::Replica(DriverError::NotLeader { leader }) => {
            CoordinatorError::NotLeader {
                leader,
                client: (leader != 0).then(|| client(leader)).flatten(),
            }
        }
        ControllerError::Refused(error) => CoordinatorError::Assignment(error),
        ControllerError::IdsExhausted => CoordinatorError::QueueIdsExhausted,
        other => CoordinatorError::Controller(other.to_string()),
    }
}

/// The controller's member on this node and what carries it. See the
/// module docs.
pub(crate) struct ClusterCatalog {
    node: Arc<ClusterNode>,
    controller: Rc<Controller<DmaStorage>>,
    host: Rc<ReplicationHost<DmaStorage>>,
    receiver: PeerReceiver,
    journal: Rc<ShardJournal<DmaStorage>>,
    journal_task: RefCell<Option<Task<()>>>,
    fold_task: RefCell<Option<Task<()>>>,
    partitions_max: usize,
    data_dir: PathBuf,
    shared: Arc<Shared>,
    connected: Rc<Vec<ConnectedSender<ShardMessage>>>,
    /// The version every shard was handed (the catalog file's at start).
    handed: Cell<AssignmentVersion>,
    handed_notify: Notify,
    /// Rung when a change of this node folded: its update may wait in the
    /// controller for the fold task.
    kick: Notify,
    in_flight: Cell<usize>,
    stopping: Cell<bool>,
    /// A round of re-placements is under way (`replace_down`).
    replacing: Cell<bool>,
    failure: RefCell<Option<ShardError>>,
}

fn start_error(what: &str, error: impl std::fmt::Display) -> ShardError {
    ShardError::Start(format!("controller: {what}: {error}"))
}

fn peer_listen_error(error: NetError) -> ShardError {
    match error {
        NetError::PortInUse { .. } => ShardError::Net(error),
        error => start_error("peer listener", error),
    }
}

impl ClusterCatalog {
    /// Opens this node's controller member (module docs, "Open") and
    /// spawns its fold task. `table`: what the shards were given (the
    /// catalog file's table).
    ///
    /// # Errors
    /// [`ShardError::Start`]: a or vote log that does not open, a peer port that does not
    /// bind.
    pub(crate) async fn open(
        node: Arc<ClusterNode>,
        data_dir: &Path,
        partitions_max: usize,
        table: AssignmentTable,
        connected: Rc<Vec<ConnectedSender<ShardMessage>>>,
        shared: Arc<Shared>,
    ) -> Result<Rc<ClusterCatalog>, ShardError> {
        let id = node.node_id();
        // The first `controller_voters` nodes vote; every other node follows
        // the catalog as a learner (it gets every entry, votes in no
        // election and counts for no commit).
        let members = node.controller_members();
        let index = node.controller_index();
        let listen = node.own_peer_addr(index).ok_or_else(|| {
            start_error("peer port", "this node's peer port + shard count overflows")
        })?;
        let mut links = Vec::new();
        for member in members.all().filter(|member| *member != id) {
            let addr = node.peer_addr(member, index).ok_or_else(|| {
                start_error(
                    "peer port",
                    format!("node {member}'s peer port + shard count overflows"),
                )
            })?;
            links.push((member, addr));
        }

        let dir = data_dir.join(CONTROLLER_DIR_NAME);
        crate::io::create_dir_durable(&DmaStorage, &dir)
            .await
            .map_err(|error| start_error(&dir.display().to_string(), error))?;
        let journal_dir = dir.join(crate::log::journal::JOURNAL_DIR_NAME);
        let start = JournalPos(crate::log::journal::oldest_journal_file(&journal_dir));
        let journal_error = |error: &dyn std::fmt::Display| start_error("journal", error);
        let (journal, recovery) =
            ShardJournal::open(DmaStorage, &dir, journal_config(), start, Rc::new(ExitOnFatal))
                .await
                .map_err(|error| journal_error(&error))?;
        let journal_task = glommio::spawn_local(journal.background());
        let handle = journal
            .register(CONTROLLER_GROUP.queue, PartitionId(CONTROLLER_GROUP.partition))
            .await
            .map_err(|error| journal_error(&error))?;
        let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
        let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
        let part = Rc::new(
            journal
                .replicated_partition(handle, routed, log, Offset(0), 0, LogFloor::default())
                .map_err(|error| journal_error(&error))?,
        );
        let (votes, _) = VoteLog::open(DmaStorage, &dir)
            .await
            .map_err(|error| start_error("vote log", error))?;

        let host = match node.tls() {
            Some(tls) => ReplicationHost::new_tls(tls.clone()),
            None => ReplicationHost::new(id),
        };
        // The controller folds from its log's first entry (applied 0).
        let driver = ReplicaDriver::open(
            id,
            members.clone(),
            part,
            Rc::new(votes),
            0,
            Timing::Randomized,
            host.sender(CONTROLLER_GROUP),
        )
        .await
        .map_err(|error| start_error("member", error))?;
        host.add(CONTROLLER_GROUP, driver.clone());
        glommio::spawn_local(driver.clone().pump()).detach();

        // A taken port exits as the client port's does (`ShardError::Net`).
        wait_port_free(listen, Duration::from_millis(PORT_IN_USE_RETRY_MS))
            .map_err(peer_listen_error)?;
        let listener = bind_listener(listen).map_err(peer_listen_error)?;
        let sink = host.clone();
        let allowed: Vec<u64> = links.iter().map(|(member, _)| *member).collect();
        let deliver: Rc<dyn Fn(crate::replica::wire::Frame)> =
            Rc::new(move |frame| sink.deliver(frame));
        let limits = ReceiverLimits::default();
        let receiver = match node.tls() {
            Some(tls) => PeerReceiver::start_tls(listener, allowed, deliver, limits, tls),
            None => PeerReceiver::start(listener, allowed, deliver, limits),
        }
        .map_err(|error| start_error("peer listener", error))?;
        for (member, addr) in &links {
            host.connect(*member, *addr, SenderLimits::default());
        }
        glommio::spawn_local(host.clone().run_ticks()).detach();
        tracing::info!(node = id, voters = ?members.voters, learners = ?members.learners, peer = %listen, dir = %dir.display(),
            catalog_version = table.version().0, "controller member open");

        let catalog = Rc::new(ClusterCatalog {
            // The controller's peer index is the shard count.
            controller: Controller::new(driver, node.controller_index()),
            node,
            host,
            receiver,
            journal,
            journal_task: RefCell::new(Some(journal_task)),
            fold_task: RefCell::new(None),
            partitions_max,
            data_dir: data_dir.to_owned(),
            shared,
            connected,
            handed: Cell::new(table.version()),
            handed_notify: Notify::default(),
            kick: Notify::default(),
            in_flight: Cell::new(0),
            stopping: Cell::new(false),
            replacing: Cell::new(false),
            failure: RefCell::new(None),
        });
        let task = glommio::spawn_local(catalog.clone().fold_loop(table));
        *catalog.fold_task.borrow_mut() = Some(task);
        glommio::spawn_local(Self::health_loop(Rc::downgrade(&catalog))).detach();
        // Drain reports other members forward while this one leads.
        let weak = Rc::downgrade(&catalog);
        catalog.host.set_snapshot_hook(Rc::new(move |_, message| {
            if let Some(catalog) = weak.upgrade() {
                catalog.forwarded(&message);
            }
        }));
        Ok(catalog)
    }

    /// Evaluates the nodes' health every [`NODE_HEALTH_INTERVAL`] and
    /// publishes it for the admin port (`control/cluster/health.rs`),
    /// until the catalog stops.
    async fn health_loop(catalog: std::rc::Weak<Self>) {
        let weak = catalog;
        let mut led_since: Option<crate::clock::Instant> = None;
        loop {
            let Some(catalog) = weak.upgrade() else { return };
            if catalog.stopping.get() {
                return;
            }
            let health = catalog.health(&mut led_since);
            let down: Vec<u64> = health.down().collect();
            {
                let mut view =
                    catalog.shared.health.write().unwrap_or_else(PoisonError::into_inner);
                view.node = Some(catalog.node.clone());
                view.health = Some(health);
            }
            if !down.is_empty() && !catalog.replacing.replace(true) {
                let this = catalog.clone();
                glommio::spawn_local(async move {
                    this.replace_down_voter(&down).await;
                    this.replace_down(&down).await;
                    this.replacing.set(false);
                })
                .detach();
            }
            drop(catalog);
            glommio::timer::sleep(NODE_HEALTH_INTERVAL).await;
        }
    }

    /// This member's view of the nodes' health; `led_since`: when it took
    /// the lead it holds (kept across calls).
    fn health(&self, led_since: &mut Option<crate::clock::Instant>) -> ClusterHealth {
        let now = crate::clock::instant_now();
        let (leads, term, leader) = self.controller.driver().role();
        let config = self.node.config();
        let down_after_ms = config.node_down_timeout_ms;
        let mut health = ClusterHealth {
            node: self.node.node_id(),
            controller_leader: (leader != 0).then_some(leader),
            leads,
            term,
            down_after_ms,
            nodes: Vec::new(),
            re_placed: 0,
            moving: 0,
        };
        for (_, entry) in self.controller.state().table.queues() {
            for set in entry.replicas.values() {
                health.re_placed += 1;
                health.moving += u64::from(!set.settled);
            }
        }
        if !leads {
            *led_since = None;
            return health;
        }
        let since = *led_since.get_or_insert(now);
        let led_for_ms = u64::try_from(now.duration_since(since).as_millis()).unwrap_or(u64::MAX);
        let peers: Vec<Heard> = self
            .host
            .peers()
            .into_iter()
            .map(|peer| Heard { node: peer.node, silent_ms: peer.silent_ms, heard: peer.heard })
            .collect();
        let all: Vec<_> = config.nodes.iter().map(|node| node.id).collect();
        health.nodes = evaluate(
            self.node.node_id(),
            &all,
            &self.controller.driver().membership().voters,
            &peers,
            led_for_ms,
            down_after_ms,
        );
        health
    }

    /// Why the fold stopped the coordinator, once.
    pub(crate) fn take_failure(&self) -> Option<ShardError> {
        self.failure.borrow_mut().take()
    }

    /// Folds at every progress of the member until stopped or failed.
    async fn fold_loop(self: Rc<Self>, mut table: AssignmentTable) {
        let driver = self.controller.driver().clone();
        loop {
            let progress = driver.progress();
            let kick = self.kick.wait();
            if self.stopping.get() {
                return;
            }
            if let Err(error) = self.fold_once(&mut table).await {
                tracing::error!(%error, "controller fold failed; stopping the coordinator");
                *self.failure.borrow_mut() = Some(error);
                self.handed_notify.notify_all();
                return;
            }
            or(progress, kick).await;
        }
    }

    /// Folds what committed and hands the new updates to every shard.
    async fn fold_once(&self, table: &mut AssignmentTable) -> Result<(), ShardError> {
        if let Some(reason) = self.controller.driver().failure() {
            return Err(ShardError::Controller(format!("member stopped: {reason}")));
        }
        self.controller
            .fold_committed()
            .map_err(|error| ShardError::Controller(error.to_string()))?;
        let fresh = fresh_updates(table.version(), self.controller.take_applied());
        if fresh.is_empty() {
            return Ok(());
        }
        for update in &fresh {
            table.apply(update).map_err(|error| {
                ShardError::Controller(format!(
                    "update {} does not apply to this node's catalog ({error}): the catalog \
                     file and the controller's log disagree",
                    update.version.0
                ))
            })?;
        }
        let next_queue_id = QueueId(self.controller.state().next_queue_id);
        // The file is a cache of the controller's state: a write refused
        // (its temporary file) leaves the older copy, and a restart folds
        // the missing updates again from the controller's log. One whose
        // outcome is unknown stops the coordinator, as on a single node.
        // Blocking std::fs: this executor serves nothing else.
        match catalog::store(&self.data_dir, &Catalog::from_table(table, next_queue_id)) {
            Ok(()) => {}
            Err(error) if !error.outcome_unknown() => {
                tracing::error!(%error, "catalog cache write failed; kept the older copy");
            }
            Err(error) => return Err(ShardError::Catalog(error.to_string())),
        }
        *self.shared.committed.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(table.clone());
        let last = table.version();
        broadcast(&self.connected, Arc::new(fresh)).await?;
        self.handed.set(last);
        self.handed_notify.notify_all();
        Ok(())
    }

    /// Waits until every shard was handed `version`.
    async fn handed_out(&self, version: AssignmentVersion) -> Result<(), CoordinatorError> {
        self.kick.notify_all();
        loop {
            let wait = self.handed_notify.wait();
            if self.handed.get() >= version {
                return Ok(());
            }
            if self.stopping.get() || self.failure.borrow().is_some() {
                return Err(CoordinatorError::Stopped);
            }
            wait.await;
        }
    }

    fn refused(&self, error: ControllerError) -> CoordinatorError {
        coordinator_error(error, |leader| self.node.client_addr(leader, 0))
    }

    /// Runs `command` as a task of its own (module docs, "Changes").
    pub(crate) fn handle(self: &Rc<Self>, command: CoordinatorCommand) {
        if self.in_flight.get() >= CONTROLLER_COMMANDS_IN_FLIGHT_MAX {
            match command {
                CoordinatorCommand::CreateQueue { reply, .. } => {
                    let _ = reply.send(Err(CoordinatorError::Busy));
                }
                CoordinatorCommand::DeleteQueue { reply, .. }
                | CoordinatorCommand::KeyChange { reply, .. } => {
                    let _ = reply.send(Err(CoordinatorError::Busy));
                }
                CoordinatorCommand::Report { .. } | CoordinatorCommand::Policy { .. } => {}
            }
            return;
        }
        let this = self.clone();
        this.in_flight.set(this.in_flight.get() + 1);
        glommio::spawn_local(async move {
            match command {
                CoordinatorCommand::CreateQueue { queue, partitions, config, reply } => {
                    let outcome = this.create(queue, partitions, config).await;
                    // The asker may have given up waiting.
                    let _ = reply.send(outcome);
                }
                CoordinatorCommand::DeleteQueue { queue, expect_id, reply } => {
                    let outcome = this.delete(queue, expect_id).await;
                    let _ = reply.send(outcome);
                }
                CoordinatorCommand::KeyChange { change, reply } => {
                    let outcome = this.key_change(change).await;
                    let _ = reply.send(outcome);
                }
                CoordinatorCommand::Report { .. } | CoordinatorCommand::Policy { .. } => {}
            }
            this.in_flight.set(this.in_flight.get() - 1);
        })
        .detach();
    }

    async fn create(
        &self,
        queue: QueueName,
        partitions: u32,
        config: Arc<QueueConfig>,
    ) -> Result<QueueCreated, CoordinatorError> {
        {
            // As on a single node: an existing name first, then the room.
            let state = self.controller.state();
            if state.table.queue(&queue).is_some() {
                return Err(AssignmentError::QueueExists(queue).into());
            }
            state.table.check_room_within(partitions as usize, self.partitions_max)?;
        }
        let update = self
            .controller
            .create_queue(queue, partitions, config)
            .await
            .map_err(|error| self.refused(error))?;
        let AssignmentChange::CreateQueue { queue_id, .. } = &update.change else {
            return Err(CoordinatorError::Controller("a create folded as a delete".into()));
        };
        let created = QueueCreated { version: update.version, queue_id: *queue_id };
        self.handed_out(update.version).await?;
        Ok(created)
    }

    async fn delete(
        &self,
        queue: QueueName,
        expect_id: Option<QueueId>,
    ) -> Result<AssignmentVersion, CoordinatorError> {
        if let Some(expected) = expect_id {
            let current = self.controller.state().table.queue(&queue).map(|entry| entry.id);
            if current != Some(expected) {
                return Err(AssignmentError::QueueNotFound(queue).into());
            }
        }
        let update =
            self.controller.delete_queue(queue).await.map_err(|error| self.refused(error))?;
        self.handed_out(update.version).await?;
        Ok(update.version)
    }

    async fn key_change(&self, change: KeyChange) -> Result<AssignmentVersion, CoordinatorError> {
        let update = match change {
            KeyChange::Grow { queue, partitions } => {
                {
                    let table = &self.controller.state().table;
                    let adding = table.partitions_added(&queue, partitions);
                    table.check_room_within(adding, self.partitions_max)?;
                }
                self.controller.grow_queue(queue, partitions).await
            }
            KeyChange::Drained { queue, key_version, partition } => {
                let outcome =
                    self.controller.keys_drained(queue.clone(), key_version, partition).await;
                let body = ForwardedDrain {
                    queue: queue.as_str().to_owned(),
                    key_version,
                    partition: partition.0,
                    settled: None,
                };
                self.forward_refused(&outcome, &body);
                outcome
            }
            KeyChange::Settled { queue, partition, nodes } => {
                let outcome =
                    self.controller.replicas_settled(queue.clone(), partition, nodes.clone()).await;
                let body = ForwardedDrain {
                    queue: queue.as_str().to_owned(),
                    key_version: 0,
                    partition: partition.0,
                    settled: Some(nodes),
                };
                self.forward_refused(&outcome, &body);
                outcome
            }
            KeyChange::Move { queue, partition, from, to } => {
                let (current, next) = self.moved_set(&queue, partition, from, to)?;
                self.controller.set_replicas(queue, partition, current, next).await
            }
            KeyChange::Subscribe { queue, name, start } => {
                self.controller.subscribe(queue, name, start).await
            }
            KeyChange::Unsubscribe { queue, name } => {
                self.controller.unsubscribe(queue, name).await
            }
            KeyChange::Reseek { queue, name, start } => {
                self.controller.reseek(queue, name, start).await
            }
        }
        .map_err(|error| self.refused(error))?;
        self.handed_out(update.version).await?;
        Ok(update.version)
    }

    /// Forwards `body` to the controller's leader when `outcome` says this
    /// member does not lead (it cannot propose the report itself).
    fn forward_refused<T>(&self, outcome: &Result<T, ControllerError>, body: &ForwardedDrain) {
        if let Err(
            ControllerError::NotLeader { leader }
            | ControllerError::Replica(DriverError::NotLeader { leader }),
        ) = outcome
        {
            self.forward(*leader, body);
        }
    }

    /// Sends a drain report (or a settled replica set) to the controller's
    /// leader `leader` (a member that does not lead cannot propose it): a
    /// tagged message on the controller's peer link, which the leader
    /// proposes as its own. No answer comes back; the reporting shard sees
    /// the table change, or reports again.
    fn forward(&self, leader: u64, body: &ForwardedDrain) {
        if leader == 0 || leader == self.node.node_id() {
            return;
        }
        let Ok(json) = serde_json::to_vec(body) else { return };
        let mut message = raft::eraftpb::Message::default();
        message.set_msg_type(raft::eraftpb::MessageType::MsgUnreachable);
        message.from = self.node.node_id();
        message.to = leader;
        let mut context = vec![crate::replica::snapshot::FORWARD_TAG];
        context.extend_from_slice(&json);
        message.context = context.into();
        (self.host.sender(CONTROLLER_GROUP))(message);
    }

    /// A drain report another member forwarded: proposed here as a
    /// change of this node's (bounded as every change is).
    fn forwarded(self: &Rc<Self>, message: &raft::eraftpb::Message) {
        if !crate::replica::snapshot::is_forward(message) {
            return;
        }
        let body: ForwardedDrain = match serde_json::from_slice(&message.get_context()[1..]) {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(from = message.from, %error, "forwarded controller change does not decode");
                return;
            }
        };
        let Ok(queue) = QueueName::new(&body.queue) else { return };
        let partition = PartitionId(body.partition);
        let change = match body.settled {
            Some(nodes) => KeyChange::Settled { queue, partition, nodes },
            None => KeyChange::Drained { queue, key_version: body.key_version, partition },
        };
        // Nobody waits for the answer: the reporter watches its table.
        let (reply, _) = std::sync::mpsc::sync_channel(1);
        self.handle(CoordinatorCommand::KeyChange { change, reply });
    }

    /// Stops the member and what carries it (module docs, "Stop").
    pub(crate) async fn stop(&self) {
        self.stopping.set(true);
        self.kick.notify_all();
        self.handed_notify.notify_all();
        let fold = self.fold_task.borrow_mut().take();
        if let Some(fold) = fold {
            fold.cancel().await;
        }
        self.host.stop().await;
        self.receiver.close().await;
        self.controller.driver().log().close();
        self.journal.close();
        let task = self.journal_task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
        if let Some(reason) = self.journal.journal().failure() {
            tracing::error!(%reason, "controller journal failed");
        }
        tracing::info!(node = self.node.node_id(), "controller member stopped");
    }
}

impl std::fmt::Debug for ClusterCatalog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ClusterCatalog")
            .field("node", &self.node.node_id())
            .field("controller", &self.controller)
            .field("handed", &self.handed.get())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::control::assignment::ShardId;

    fn name(text: &str) -> QueueName {
        QueueName::new(text).unwrap()
    }

    fn create(version: u64, queue: &str, id: u32) -> AssignmentUpdate {
        AssignmentUpdate {
            version: AssignmentVersion(version),
            change: AssignmentChange::CreateQueue {
                subscriptions: crate::control::assignment::Subscriptions::default(),
                queue: name(queue),
                queue_id: QueueId(id),
                shards: vec![ShardId(0)],
                config: Arc::new(QueueConfig::default()),
                keys: crate::control::assignment::KeyPlacement::fresh(1),
                replicas: Default::default(),
            },
        }
    }

    // Goal: after a restart the controller hands out every update of its
    // log again; those the catalog file held are not given to the shards
    // twice, the rest are, in order. Method: filter a run of updates at
    // the file's version, at 0 and past the end.
    #[test]
    fn updates_the_catalog_file_holds_are_skipped() {
        let taken: Vec<AssignmentUpdate> = (1..=5)
            .map(|version| create(version, &format!("q{version}"), version as u32))
            .collect();
        let versions = |updates: Vec<AssignmentUpdate>| {
            updates.into_iter().map(|update| update.version.0).collect::<Vec<_>>()
        };
        assert_eq!(versions(fresh_updates(AssignmentVersion(3), taken.clone())), vec![4, 5]);
        assert_eq!(
            versions(fresh_updates(AssignmentVersion(0), taken.clone())),
            vec![1, 2, 3, 4, 5]
        );
        assert!(fresh_updates(AssignmentVersion(5), taken.clone()).is_empty());
        assert!(fresh_updates(AssignmentVersion(9), taken).is_empty());
    }

    // Goal: a refusal of the controller reaches the client as the error it
    // means: the leader's address when another node leads, none when no
    // leader is known, the table's refusal as is. Method: map each.
    #[test]
    fn controller_refusals_map_to_coordinator_errors() {
        let client = |node: u64| Some(SocketAddr::from(([127, 0, 0, 1], 7400 + node as u16 * 10)));
        let error = coordinator_error(ControllerError::NotLeader { leader: 2 }, client);
        let CoordinatorError::NotLeader { leader: 2, client: Some(addr) } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(addr.port(), 7420);
        assert_eq!(
            error.to_string(),
            "this node does not lead the controller; node 2 at 127.0.0.1:7420 does"
        );
        let error = coordinator_error(ControllerError::NotLeader { leader: 0 }, client);
        assert!(matches!(error, CoordinatorError::NotLeader { leader: 0, client: None }));
        assert!(error.to_string().contains("knows no leader"), "{error}");
        let error = coordinator_error(
            ControllerError::Replica(DriverError::NotLeader { leader: 3 }),
            client,
        );
        assert!(matches!(error, CoordinatorError::NotLeader { leader: 3, client: Some(_) }));
        let error = coordinator_error(
            ControllerError::Refused(AssignmentError::QueueExists(name("a"))),
            client,
        );
        assert!(matches!(error, CoordinatorError::Assignment(AssignmentError::QueueExists(_))));
        let error = coordinator_error(ControllerError::IdsExhausted, client);
        assert!(matches!(error, CoordinatorError::QueueIdsExhausted));
        let error = coordinator_error(ControllerError::Contended, client);
        assert!(matches!(error, CoordinatorError::Controller(_)), "{error:?}");
    }

    // Goal: the controller's journal settings pass the journal's own
    // checks (small files that still hold the largest commit).
    #[test]
    fn the_controller_journal_config_is_valid() {
        let config = journal_config();
        config.validate().unwrap();
        assert!(config.commit_span_max() <= config.file_bytes);
    }
}
