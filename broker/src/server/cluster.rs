//! A shard's part of a cluster (`[cluster]` in the config;
//! `docs/design/replication.md`, "Running a cluster"): the shard's
//! [`ReplicationHost`] and vote log, its peer listener, and how a
//! partition of this shard opens as the member of its Raft group.
//!
//! - **Which partitions.** A partition the table places on this shard
//!   index is hosted here only when this node is one of its replicas
//!   ([`ClusterNode::replicas`], the same on every node); the others are
//!   answered `NOT_OWNER` with their leader's address.
//! - **Start.** Before the catalog's replay opens anything: the vote log
//!   (`shard-NN/votes`), the peer listener on the node's peer port + the
//!   shard index (mutual TLS when the table names certificates), a link to
//!   the same shard index of every other node, and the tick timer.
//! - **Open.** [`Partition::open_replicated`] over the shard journal's
//!   partition with its recovered entries and committed index; then the
//!   member is hosted (messages stepped into it), its pump, its role loop
//!   (`run_replica`: fold, lead, rebuild) and a watcher that publishes its
//!   leader and term for Metadata and redirects are spawned.
//! - **Stop.** Links and listener closed after the partitions (the flush).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use spool_wire::proto::{ErrorResponse, NodeAddress};
use spool_wire::ErrorCode;

use super::{BackgroundTask, ServerError, ShardPartition};
use crate::control::assignment::{QueueEntry, ShardId};
use crate::control::cluster::ClusterNode;
use crate::io::DmaStorage;
use crate::log::journal::{JournalError, PartitionHandle, RecoveredLog, RoutedEntry, ShardJournal};
use crate::log::vote::VoteLog;
use crate::log::ExitOnFatal;
use crate::net::peer::{PeerReceiver, ReceiverLimits, SenderLimits};
use crate::partition::{
    Clock, OpenReport, Partition, PartitionError, PartitionName, ReplicatedOpen,
};
use crate::queue::{LeaderEpoch, PartitionId, QueueConfig, QueueId};
use crate::replica::wire::GroupId;
use crate::replica::Timing;
use crate::shard::replication::ReplicationHost;
use crate::shard::report::ReplicationReport;

/// A shard's replication: see the module docs.
pub struct ShardCluster {
    pub node: Arc<ClusterNode>,
    pub host: Rc<ReplicationHost<DmaStorage>>,
    votes: RefCell<Option<Rc<VoteLog<DmaStorage>>>>,
    receiver: RefCell<Option<PeerReceiver>>,
    shard: ShardId,
}

impl std::fmt::Debug for ShardCluster {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ShardCluster")
            .field("node", &self.node.node_id())
            .field("shard", &self.shard.0)
            .finish_non_exhaustive()
    }
}

/// A journal partition's recovered pieces, for its open.
pub(super) struct Recovered {
    pub handle: PartitionHandle,
    pub routed: Vec<RoutedEntry>,
    pub log: RecoveredLog,
}

fn start_error(what: &str, error: impl std::fmt::Display) -> ServerError {
    ServerError::Cluster(format!("{what}: {error}"))
}

/// The peer port taken is told apart (the broker exits as for its client
/// port); any other bind error is a start error.
fn peer_listen_error(error: crate::net::listener::NetError) -> ServerError {
    match error {
        crate::net::listener::NetError::PortInUse { addr } => ServerError::PeerPortInUse { addr },
        error => start_error("peer listener", error),
    }
}

impl ShardCluster {
    /// The shard's replication host (links TLS when the node's are).
    pub fn new(node: Arc<ClusterNode>, shard: ShardId) -> Rc<ShardCluster> {
        let host = match node.tls() {
            Some(tls) => ReplicationHost::new_tls(tls.clone()),
            None => ReplicationHost::new(node.node_id()),
        };
        Rc::new(ShardCluster {
            node,
            host,
            votes: RefCell::new(None),
            receiver: RefCell::new(None),
            shard,
        })
    }

    /// The replica set of `partition` of the queue `entry`: the table's
    /// when it re-placed the partition, else the placer's (the preferred
    /// leader first).
    pub fn replicas(&self, entry: &QueueEntry, partition: PartitionId) -> Vec<u64> {
        match entry.replicas.get(&partition) {
            Some(set) => set.nodes.clone(),
            None => self.node.replicas(entry.id.0, partition.0),
        }
    }

    /// Whether this node holds a replica of `partition` of the queue
    /// `entry`.
    pub fn hosts(&self, entry: &QueueEntry, partition: PartitionId) -> bool {
        self.replicas(entry, partition).contains(&self.node.node_id())
    }

    /// The address a client should send the requests of `partition` of
    /// the queue `entry` to (the partition placed on shard index `shard`):
    /// its known leader's, else its preferred replica's.
    pub fn leader_addr(
        &self,
        entry: &QueueEntry,
        partition: PartitionId,
        shard: ShardId,
    ) -> Option<SocketAddr> {
        let leader = self
            .node
            .leaders()
            .leader(entry.id.0, partition.0)
            .or_else(|| self.replicas(entry, partition).first().copied())?;
        self.node.client_addr(leader, shard.0)
    }

    /// The known leader of `queue_id`/`partition` (None: no leader known).
    pub fn known_leader(&self, queue_id: QueueId, partition: PartitionId) -> Option<u64> {
        self.node.leaders().leader(queue_id.0, partition.0)
    }

    /// NOT_LEADER (NOT_OWNER to an older client: `ApiKey::answerable`) for
    /// a partition open here whose member does not serve:
    /// the leader's address when another node leads, none while no leader
    /// is known or this member is still taking the lead.
    pub(super) fn not_leader(&self, name: &PartitionName) -> ErrorResponse {
        let (queue, partition) = (&name.queue, name.partition.0);
        let leader = self
            .known_leader(name.queue_id, name.partition)
            .filter(|leader| *leader != self.node.node_id())
            .and_then(|leader| self.node.client_addr(leader, self.shard.0));
        match leader {
            Some(owner) => {
                let message = format!("partition {queue}/{partition} is led at {owner}");
                let mut reply = ErrorResponse::new(ErrorCode::NotLeader, message);
                reply.owner =
                    Some(NodeAddress { host: owner.ip().to_string(), port: owner.port() });
                reply
            }
            None => ErrorResponse::new(
                ErrorCode::NotLeader,
                format!("partition {queue}/{partition} has no leader serving yet; retry shortly"),
            ),
        }
    }

    /// Opens the vote log in `shard_dir`, listens for peers and links to
    /// them, and starts the ticks (module docs, "Start").
    ///
    /// # Errors
    /// The vote log's open, the peer port's bind.
    pub async fn start(&self, shard_dir: &Path) -> Result<(), ServerError> {
        let (votes, _) = VoteLog::open(DmaStorage, shard_dir)
            .await
            .map_err(|error| start_error(&shard_dir.display().to_string(), error))?;
        *self.votes.borrow_mut() = Some(Rc::new(votes));
        let index = self.shard.0;
        let listen = self
            .node
            .own_peer_addr(index)
            .ok_or_else(|| start_error("cluster", "this node's peer port + shard overflows"))?;
        let patience = Duration::from_millis(crate::limits::PORT_IN_USE_RETRY_MS);
        crate::net::listener::wait_port_free(listen, patience).map_err(peer_listen_error)?;
        // Exclusive, and bindable over our previous run's TIME_WAIT
        // sockets (`net/listener.rs`), as the client port.
        let listener = crate::net::listener::bind_listener(listen).map_err(peer_listen_error)?;
        let host = Rc::downgrade(&self.host);
        let sink: Rc<dyn Fn(crate::replica::wire::Frame)> = Rc::new(move |frame| {
            if let Some(host) = host.upgrade() {
                host.deliver(frame);
            }
        });
        let peers = self.node.peers();
        let receiver = match self.node.tls() {
            Some(tls) => PeerReceiver::start_tls(
                listener,
                peers.clone(),
                sink,
                ReceiverLimits::default(),
                tls,
            ),
            None => PeerReceiver::start(listener, peers.clone(), sink, ReceiverLimits::default()),
        }
        .map_err(|error| start_error("peer listener", error))?;
        *self.receiver.borrow_mut() = Some(receiver);
        for peer in peers {
            if let Some(addr) = self.node.peer_addr(peer, index) {
                self.host.connect(peer, addr, SenderLimits::default());
            }
        }
        glommio::spawn_local(self.host.clone().run_ticks()).detach();
        tracing::info!(shard = index, node = self.node.node_id(), %listen,
            tls = self.node.tls().is_some(), "replication started");
        Ok(())
    }

    /// Opens `name` as the member of its group (module docs, "Open").
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn open_partition(
        &self,
        shard: &Rc<ShardJournal<DmaStorage>>,
        dir: &Path,
        name: PartitionName,
        config: &QueueConfig,
        recovered: Recovered,
        secret: [u8; 32],
        clock: Clock,
    ) -> Result<(Rc<ShardPartition>, BackgroundTask, OpenReport), PartitionError> {
        let votes = self.votes.borrow().clone().ok_or_else(|| {
            PartitionError::Journal(JournalError::Failed("the vote log is not open".into()))
        })?;
        let group = GroupId { queue: name.queue_id.0, partition: name.partition.0 };
        let voters = self.node.replicas(name.queue_id.0, name.partition.0);
        let open = ReplicatedOpen {
            shard: shard.clone(),
            handle: recovered.handle,
            routed: recovered.routed,
            log: recovered.log,
            votes,
            member: self.node.node_id(),
            voters,
            timing: Timing::Randomized,
            send: self.host.sender(group),
        };
        let (partition, background, report) = Partition::open_replicated(
            DmaStorage,
            dir,
            name,
            config.clone(),
            open,
            secret,
            Rc::new(ExitOnFatal),
            clock,
        )
        .await?;
        Ok((partition, Box::pin(background) as BackgroundTask, report))
    }

    /// Hosts an opened partition's member and spawns what drives it
    /// (module docs, "Open"); `epochs` gets its term whenever it changes.
    pub(super) fn serve(&self, partition: &Rc<ShardPartition>, epochs: Arc<super::EpochBoard>) {
        let Some(driver) = partition.log().driver().cloned() else { return };
        let name = partition.name().clone();
        let group = GroupId { queue: name.queue_id.0, partition: name.partition.0 };
        if let Some(old) = self.host.add(group, driver.clone()) {
            old.close();
        }
        glommio::spawn_local(driver.clone().pump()).detach();
        glommio::spawn_local(partition.clone().run_replica()).detach();
        let node = self.node.clone();
        let weak = Rc::downgrade(partition);
        glommio::spawn_local(async move {
            let mut shown = (u64::MAX, u64::MAX);
            loop {
                let progress = driver.progress();
                let Some(partition) = weak.upgrade() else { break };
                if partition.is_closed() || driver.failure().is_some() {
                    break;
                }
                drop(partition);
                let (_, term, leader) = driver.role();
                if (term, leader) != shown {
                    shown = (term, leader);
                    node.leaders().publish(name.queue_id.0, name.partition.0, leader);
                    epochs.publish(name.queue_id, name.partition, LeaderEpoch(term));
                }
                progress.await;
            }
            node.leaders().publish(name.queue_id.0, name.partition.0, 0);
        })
        .detach();
    }

    /// Stops hosting `queue_id`/`partition` (its queue was deleted).
    pub(super) fn forget(&self, queue_id: QueueId, partition: PartitionId) {
        let group = GroupId { queue: queue_id.0, partition: partition.0 };
        if let Some(driver) = self.host.remove(group) {
            driver.close();
        }
        self.node.leaders().publish(queue_id.0, partition.0, 0);
    }

    /// What the shard heard from each peer node (`ShardReport::peers`).
    pub(super) fn peers(&self) -> Vec<crate::shard::replication::PeerHeard> {
        self.host.peers()
    }

    /// The shard's replication figures (`ReplicationReport`).
    pub(super) fn report(&self, partitions: &super::served::ServedMap) -> ReplicationReport {
        let mut report = ReplicationReport {
            node: self.node.node_id(),
            stats: self.host.stats(),
            ..ReplicationReport::default()
        };
        for served in partitions.values() {
            let partition = &served.partition;
            if partition.log().driver().is_none() {
                continue;
            }
            if partition.serving() {
                report.leading += 1;
            } else {
                report.following += 1;
            }
            let roles = partition.role_stats();
            report.leaderships += roles.leaderships;
            report.step_downs += roles.step_downs;
            report.rebuilds += roles.rebuilds;
            report.folded += roles.folded;
        }
        report
    }

    /// Closes the links, the listener and every hosted member (after the
    /// partitions closed).
    pub async fn stop(&self) {
        self.host.stop().await;
        let receiver = self.receiver.borrow_mut().take();
        if let Some(receiver) = receiver {
            receiver.close().await;
        }
    }
}
