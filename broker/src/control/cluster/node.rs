//! This node in its cluster, as the running broker sees it
//! ([`ClusterNode`]): the validated `[cluster]` table, the placer every
//! node computes the same replica sets with, the cluster's token secret,
//! the peer TLS identity, and the [`LeaderBoard`] where each shard
//! publishes the leaders of the partitions it hosts (read by Metadata and
//! `NOT_OWNER` answers on every shard of the node).
//!
//! Addresses: shard `i` of a node listens for clients on its `client`
//! address's port + `i` and for peers on its `peer` port + `i`; the
//! controller (on the coordinator) on `peer` port + the shard count. Every
//! node of a cluster runs the same shard count, so a partition's group
//! lives on the same shard index on each of its replicas
//! (`shard/replication.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{PoisonError, RwLock};

use std::sync::Arc;

use super::members::ClusterConfig;
use super::placement::{GroupId, NodeId, Placer};
use crate::control::assignment::AssignmentTable;
use crate::control::data_dir::{BrokerSecret, DataDirError};
use crate::net::peer::{PeerTls, PeerTlsFiles};
use crate::replica::Members;

/// Why the node could not take its place in the cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterStartError {
    #[error("cluster.secret_file: {0}")]
    Secret(#[from] DataDirError),
    #[error("cluster peer TLS: {0}")]
    PeerTls(String),
    #[error("cluster placement: {0}")]
    Placement(String),
    #[error("cluster: {0}")]
    Config(String),
}

/// The leaders this node knows, by (queue id, partition): published by the
/// shard hosting the partition's member whenever its view changes.
#[derive(Debug, Default)]
pub struct LeaderBoard {
    leaders: RwLock<HashMap<(u32, u32), NodeId>>,
}

impl LeaderBoard {
    /// Records `leader` (0: none known) for the group.
    pub fn publish(&self, queue_id: u32, partition: u32, leader: NodeId) {
        let mut leaders = self.leaders.write().unwrap_or_else(PoisonError::into_inner);
        if leader == 0 {
            leaders.remove(&(queue_id, partition));
        } else {
            leaders.insert((queue_id, partition), leader);
        }
    }

    /// The leader known for the group, if any.
    pub fn leader(&self, queue_id: u32, partition: u32) -> Option<NodeId> {
        let leaders = self.leaders.read().unwrap_or_else(PoisonError::into_inner);
        leaders.get(&(queue_id, partition)).copied()
    }

    /// Forgets every group of `queue_id` (the queue was deleted).
    pub fn forget_queue(&self, queue_id: u32) {
        let mut leaders = self.leaders.write().unwrap_or_else(PoisonError::into_inner);
        leaders.retain(|(queue, _), _| *queue != queue_id);
    }
}

/// What the controller's member publishes for the admin port: the nodes'
/// health (each [`NODE_HEALTH_INTERVAL`](super::limits::NODE_HEALTH_INTERVAL))
/// and the node itself, to show replica sets with. Empty on one node.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub health: Option<super::ClusterHealth>,
    pub node: Option<Arc<ClusterNode>>,
}

/// One partition's replica set as the table holds it
/// (`GET /v1/cluster/partitions`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionReplicas {
    pub queue: String,
    pub partition: u32,
    /// The nodes, the preferred leader first.
    pub replicas: Vec<NodeId>,
    /// The table re-placed it off the placer's set.
    pub re_placed: bool,
    /// Its group's voters are `replicas` (always, unless re-placed and not
    /// reported settled yet).
    pub settled: bool,
    /// The leader this node knows (only of the partitions it holds).
    pub leader: Option<NodeId>,
}

/// This node in its cluster. Shared by every executor of the node.
#[derive(Debug)]
pub struct ClusterNode {
    config: ClusterConfig,
    placer: Placer,
    secret: BrokerSecret,
    tls: Option<PeerTls>,
    shard_count: u16,
    leaders: LeaderBoard,
}

impl ClusterNode {
    /// Reads what the table names (the secret, the peer TLS files) and
    /// builds the placer.
    ///
    /// # Errors
    /// [`ClusterStartError`] naming the file or value that does not fit.
    pub fn load(
        config: &ClusterConfig,
        shard_count: u16,
    ) -> Result<ClusterNode, ClusterStartError> {
        config.validate().map_err(|error| ClusterStartError::Config(error.to_string()))?;
        let secret_file = config.secret_file.as_deref().ok_or_else(|| {
            ClusterStartError::Config("cluster.secret_file is required".to_owned())
        })?;
        let secret = BrokerSecret::load_cluster(secret_file)?;
        let tls = match config.peer_tls_files() {
            Some((cert_file, key_file, ca_file)) => {
                let files = PeerTlsFiles {
                    cert_file: cert_file.to_owned(),
                    key_file: key_file.to_owned(),
                    ca_file: ca_file.to_owned(),
                };
                Some(
                    PeerTls::load(config.node_id, &files)
                        .map_err(|error| ClusterStartError::PeerTls(error.to_string()))?,
                )
            }
            None => None,
        };
        let placer = Placer::new(&config.members(), config.replication_factor)
            .map_err(|error| ClusterStartError::Placement(error.to_string()))?;
        Ok(ClusterNode {
            config: config.clone(),
            placer,
            secret,
            tls,
            shard_count,
            leaders: LeaderBoard::default(),
        })
    }

    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The key delivery tokens are MACed with on every node.
    pub fn secret(&self) -> &BrokerSecret {
        &self.secret
    }

    /// Mutual TLS for peer links (`None`: plain TCP).
    pub fn tls(&self) -> Option<&PeerTls> {
        self.tls.as_ref()
    }

    pub fn leaders(&self) -> &LeaderBoard {
        &self.leaders
    }

    /// The replica set of partition `partition` of queue `queue_id`, the
    /// preferred leader first.
    pub fn replicas(&self, queue_id: u32, partition: u32) -> Vec<NodeId> {
        self.placer.place(GroupId::new(queue_id, partition))
    }

    /// The node to take a replica of partition `partition` of queue
    /// `queue_id` in place of one that left `keep`, outside `excluded`
    /// ([`Placer::replacement`]).
    pub fn replacement(
        &self,
        queue_id: u32,
        partition: u32,
        keep: &[NodeId],
        excluded: &[NodeId],
    ) -> Option<NodeId> {
        self.placer.replacement(GroupId::new(queue_id, partition), keep, excluded)
    }

    /// Every partition of `table` with its replica set (queues by name,
    /// partitions in order).
    pub fn replica_sets(&self, table: &AssignmentTable) -> Vec<PartitionReplicas> {
        let mut rows = Vec::new();
        for (name, entry) in table.queues() {
            for index in 0..entry.partitions.len() {
                let partition = u32::try_from(index).unwrap_or(u32::MAX);
                let set = entry.replicas.get(&crate::queue::PartitionId(partition));
                rows.push(PartitionReplicas {
                    queue: name.as_str().to_owned(),
                    partition,
                    replicas: set.map_or_else(
                        || self.replicas(entry.id.0, partition),
                        |set| set.nodes.clone(),
                    ),
                    re_placed: set.is_some(),
                    settled: set.is_none_or(|set| set.settled),
                    leader: self.leaders.leader(entry.id.0, partition),
                });
            }
        }
        rows
    }

    /// The controller group's voters.
    pub fn controller_voters(&self) -> Vec<NodeId> {
        self.config.controller_voter_ids()
    }

    /// The controller group's members: its voters, and every other node
    /// as a learner (ascending).
    pub fn controller_members(&self) -> Members {
        let voters = self.controller_voters();
        let mut learners: Vec<NodeId> = self
            .config
            .nodes
            .iter()
            .map(|node| node.id)
            .filter(|id| !voters.contains(id))
            .collect();
        learners.sort_unstable();
        Members { voters, learners }
    }

    /// The other nodes' ids.
    pub fn peers(&self) -> Vec<NodeId> {
        let own = self.config.node_id;
        self.config.nodes.iter().map(|node| node.id).filter(|id| *id != own).collect()
    }

    /// Node `node`'s peer address for shard index `index` (the shards,
    /// then the controller at index `shard_count`).
    pub fn peer_addr(&self, node: NodeId, index: u16) -> Option<SocketAddr> {
        let spec = self.config.node(node)?;
        let port = spec.peer.port().checked_add(index)?;
        Some(SocketAddr::new(spec.peer.ip(), port))
    }

    /// Node `node`'s client address of shard `shard`.
    pub fn client_addr(&self, node: NodeId, shard: u16) -> Option<SocketAddr> {
        let spec = self.config.node(node)?;
        let port = spec.client.port().checked_add(shard)?;
        Some(SocketAddr::new(spec.client.ip(), port))
    }

    /// The peer index of the controller: after the shards.
    pub fn controller_index(&self) -> u16 {
        self.shard_count
    }

    /// This node's own peer address for `index`.
    pub fn own_peer_addr(&self, index: u16) -> Option<SocketAddr> {
        self.peer_addr(self.config.node_id, index)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    // Goal: the board keeps one leader per group and forgets a deleted
    // queue's; method: publish, replace, clear, forget.
    #[test]
    fn the_board_holds_one_leader_per_group() {
        let board = LeaderBoard::default();
        board.publish(1, 0, 2);
        board.publish(1, 1, 3);
        board.publish(2, 0, 1);
        assert_eq!(board.leader(1, 0), Some(2));
        board.publish(1, 0, 3);
        assert_eq!(board.leader(1, 0), Some(3));
        board.publish(1, 0, 0);
        assert_eq!(board.leader(1, 0), None);
        board.forget_queue(1);
        assert_eq!(board.leader(1, 1), None);
        assert_eq!(board.leader(2, 0), Some(1));
    }
}
