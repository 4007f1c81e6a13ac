//! Cluster membership: the `[cluster]` table of the broker's TOML config
//! ([`ClusterConfig`]), its validation ([`ClusterConfig::validate`]) and
//! the typed error naming what is wrong ([`ClusterError`]).
//!
//! Pure: it parses and checks values, it does not resolve names, bind ports
//! or reach the other nodes. Every node of a cluster carries the same list
//! of nodes and its own `node_id`; the controller group will take the list
//! over once it runs (`docs/design/replication.md`, "Membership and
//! placement"). A table looks like:
//!
//! ```toml
//! [cluster]
//! node_id = 1
//! replication_factor = 3   # 1, 3 or 5; default 3
//! controller_voters = 3    # 3 or 5; default 3
//! secret_file = "/etc/spool/cluster.secret"   # required: 32 bytes, on every node
//! # peer_tls_cert_file, peer_tls_key_file, peer_tls_ca_file: mutual TLS between nodes
//! node_down_timeout_ms = 30000   # silence before the controller counts a node down
//! nodes = [
//!   { id = 1, client = "10.0.0.1:7400", peer = "10.0.0.1:7500", failure_domain = "rack-a" },
//!   { id = 2, client = "10.0.0.2:7400", peer = "10.0.0.2:7500", failure_domain = "rack-b" },
//!   { id = 3, client = "10.0.0.3:7400", peer = "10.0.0.3:7500", failure_domain = "rack-c" },
//! ]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use super::limits::{
    CLUSTER_NODES_MAX, CONTROLLER_VOTERS, CONTROLLER_VOTERS_DEFAULT, FAILURE_DOMAIN_BYTES_MAX,
    NODE_DOWN_TIMEOUT_DEFAULT_MS, NODE_DOWN_TIMEOUT_MAX_MS, NODE_DOWN_TIMEOUT_MIN_MS,
    REPLICATION_FACTORS, REPLICATION_FACTOR_DEFAULT,
};
use super::placement::{Member, NodeId};

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub id: NodeId,
    /// Address of the node's shard 0 for clients; shard `i` listens on the
    /// same IP, port + `i` (as `listen` on one node).
    pub client: SocketAddr,
    /// Address of the node's shard 0 for replication between nodes; shard
    /// `i` on port + `i`.
    pub peer: SocketAddr,
    /// What fails together with this node (a host, a rack, a zone): replicas
    /// of one partition go to distinct domains whenever there are enough.
    pub failure_domain: String,
}

/// The `[cluster]` table. Deserialized as written, then checked by
/// [`validate`](Self::validate) (or both at once by
/// [`from_toml`](Self::from_toml)).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id: one of `nodes`.
    pub node_id: NodeId,
    /// Every node of the cluster, this one included.
    pub nodes: Vec<NodeSpec>,
    /// Replicas per partition: one of [`REPLICATION_FACTORS`], at most the
    /// node count.
    #[serde(default = "replication_factor_default")]
    pub replication_factor: usize,
    /// Voters of the controller group: one of [`CONTROLLER_VOTERS`], at
    /// most the node count.
    #[serde(default = "controller_voters_default")]
    pub controller_voters: usize,
    /// The cluster's secret (exactly
    /// [`SECRET_BYTES`](crate::control::data_dir::SECRET_BYTES) bytes, the
    /// same file on every node): delivery tokens are MACed with it, so a
    /// token a leader issued verifies on the replica that leads next.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Mutual TLS on the peer links: this node's PEM certificate chain
    /// (its certificate names `node-<id>` as a DNS name), its key, and the
    /// CA every node's certificate chains to. All three or none; none
    /// means plain TCP between nodes, for a private network only.
    #[serde(default)]
    pub peer_tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub peer_tls_key_file: Option<PathBuf>,
    #[serde(default)]
    pub peer_tls_ca_file: Option<PathBuf>,
    /// How long the controller's leader hears nothing from a node before
    /// it counts it down (`health.rs`), milliseconds, within
    /// [`NODE_DOWN_TIMEOUT_MIN_MS`]..=[`NODE_DOWN_TIMEOUT_MAX_MS`].
    #[serde(default = "node_down_timeout_default")]
    pub node_down_timeout_ms: u64,
}

fn replication_factor_default() -> usize {
    REPLICATION_FACTOR_DEFAULT
}

fn controller_voters_default() -> usize {
    CONTROLLER_VOTERS_DEFAULT
}

fn node_down_timeout_default() -> u64 {
    NODE_DOWN_TIMEOUT_DEFAULT_MS
}

/// What is wrong with a `[cluster]` table; each message names the value.
#[derive(Debug, Error)]
pub enum ClusterError {
    #[error("cluster config is not valid TOML: {0}")]
    Parse(#[source] Box<toml::de::Error>),
    #[error("the config has no [cluster] table")]
    MissingTable,
    #[error("cluster.nodes names {nodes} nodes, more than the {max} allowed")]
    TooManyNodes { nodes: usize, max: usize },
    #[error("cluster.nodes[{index}] has id 0: node ids start at 1")]
    NodeIdZero { index: usize },
    #[error("node id {id} appears more than once in cluster.nodes")]
    DuplicateNodeId { id: NodeId },
    #[error("cluster.node_id = {node_id} is not one of cluster.nodes")]
    OwnIdMissing { node_id: NodeId },
    #[error("address {address} is used twice (by node {first} and node {second})")]
    DuplicateAddress { address: SocketAddr, first: NodeId, second: NodeId },
    #[error("node {id} has an empty failure_domain")]
    FailureDomainEmpty { id: NodeId },
    #[error("node {id}'s failure_domain {domain:?} is {bytes} bytes, more than {max}")]
    FailureDomainTooLong { id: NodeId, domain: String, bytes: usize, max: usize },
    #[error("cluster.replication_factor = {factor} is not one of {allowed:?}")]
    ReplicationFactor { factor: usize, allowed: [usize; 3] },
    #[error("cluster.replication_factor = {factor} is more than the {nodes} nodes")]
    ReplicationFactorAboveNodes { factor: usize, nodes: usize },
    #[error("cluster.controller_voters = {voters} is not one of {allowed:?}")]
    ControllerVoters { voters: usize, allowed: [usize; 2] },
    #[error("cluster.controller_voters = {voters} is more than the {nodes} nodes")]
    ControllerVotersAboveNodes { voters: usize, nodes: usize },
    #[error(
        "cluster.secret_file is required: delivery tokens must verify on every replica, so \
         every node MACs them with the same secret"
    )]
    SecretFileMissing,
    #[error(
        "cluster.peer_tls_cert_file, peer_tls_key_file and peer_tls_ca_file go together: \
         {missing} is missing"
    )]
    PeerTlsIncomplete { missing: &'static str },
    #[error("cluster.node_down_timeout_ms = {ms} is outside {min}..={max}")]
    NodeDownTimeout { ms: u64, min: u64, max: u64 },
}

/// A config file holding (among other tables) `[cluster]`.
#[derive(Deserialize)]
struct WithCluster {
    cluster: Option<ClusterConfig>,
}

impl ClusterConfig {
    /// The `[cluster]` table of a TOML document (the other keys are not
    /// looked at), validated.
    ///
    /// # Errors
    /// [`ClusterError::Parse`] if the text or the table does not parse,
    /// [`ClusterError::MissingTable`] without a table, and every error of
    /// [`validate`](Self::validate).
    pub fn from_toml(text: &str) -> Result<ClusterConfig, ClusterError> {
        let document: WithCluster =
            toml::from_str(text).map_err(|error| ClusterError::Parse(Box::new(error)))?;
        let config = document.cluster.ok_or(ClusterError::MissingTable)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule of the table; the first broken one is returned, in
    /// this order: node count, ids, own id, addresses, failure domains,
    /// replication factor, controller voters.
    ///
    /// # Errors
    /// A [`ClusterError`] naming the offending value.
    pub fn validate(&self) -> Result<(), ClusterError> {
        let nodes = self.nodes.len();
        if nodes > CLUSTER_NODES_MAX {
            return Err(ClusterError::TooManyNodes { nodes, max: CLUSTER_NODES_MAX });
        }
        let mut ids = BTreeMap::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if node.id == 0 {
                return Err(ClusterError::NodeIdZero { index });
            }
            if ids.insert(node.id, index).is_some() {
                return Err(ClusterError::DuplicateNodeId { id: node.id });
            }
        }
        if !ids.contains_key(&self.node_id) {
            return Err(ClusterError::OwnIdMissing { node_id: self.node_id });
        }
        let mut addresses: BTreeMap<SocketAddr, NodeId> = BTreeMap::new();
        for node in &self.nodes {
            for address in [node.client, node.peer] {
                if let Some(&first) = addresses.get(&address) {
                    return Err(ClusterError::DuplicateAddress { address, first, second: node.id });
                }
                addresses.insert(address, node.id);
            }
        }
        for node in &self.nodes {
            let bytes = node.failure_domain.len();
            if bytes == 0 {
                return Err(ClusterError::FailureDomainEmpty { id: node.id });
            }
            if bytes > FAILURE_DOMAIN_BYTES_MAX {
                return Err(ClusterError::FailureDomainTooLong {
                    id: node.id,
                    domain: node.failure_domain.clone(),
                    bytes,
                    max: FAILURE_DOMAIN_BYTES_MAX,
                });
            }
        }
        let factor = self.replication_factor;
        if !REPLICATION_FACTORS.contains(&factor) {
            return Err(ClusterError::ReplicationFactor { factor, allowed: REPLICATION_FACTORS });
        }
        if factor > nodes {
            return Err(ClusterError::ReplicationFactorAboveNodes { factor, nodes });
        }
        let voters = self.controller_voters;
        if !CONTROLLER_VOTERS.contains(&voters) {
            return Err(ClusterError::ControllerVoters { voters, allowed: CONTROLLER_VOTERS });
        }
        if voters > nodes {
            return Err(ClusterError::ControllerVotersAboveNodes { voters, nodes });
        }
        if self.secret_file.is_none() {
            return Err(ClusterError::SecretFileMissing);
        }
        let ms = self.node_down_timeout_ms;
        if !(NODE_DOWN_TIMEOUT_MIN_MS..=NODE_DOWN_TIMEOUT_MAX_MS).contains(&ms) {
            return Err(ClusterError::NodeDownTimeout {
                ms,
                min: NODE_DOWN_TIMEOUT_MIN_MS,
                max: NODE_DOWN_TIMEOUT_MAX_MS,
            });
        }
        let tls = [
            ("peer_tls_cert_file", self.peer_tls_cert_file.is_some()),
            ("peer_tls_key_file", self.peer_tls_key_file.is_some()),
            ("peer_tls_ca_file", self.peer_tls_ca_file.is_some()),
        ];
        if tls.iter().any(|(_, set)| *set) {
            if let Some((missing, _)) = tls.iter().find(|(_, set)| !*set) {
                return Err(ClusterError::PeerTlsIncomplete { missing });
            }
        }
        Ok(())
    }

    /// This node's entry, if `node_id` names one (always, once validated).
    pub fn this_node(&self) -> Option<&NodeSpec> {
        self.nodes.iter().find(|node| node.id == self.node_id)
    }

    /// The node with `id`.
    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.iter().find(|node| node.id == id)
    }

    /// The controller group's voters: the first
    /// [`controller_voters`](Self::controller_voters) node ids, ascending.
    pub fn controller_voter_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.nodes.iter().map(|node| node.id).collect();
        ids.sort_unstable();
        ids.truncate(self.controller_voters);
        ids
    }

    /// The peer TLS files, when all three are set.
    pub fn peer_tls_files(&self) -> Option<(&Path, &Path, &Path)> {
        match (&self.peer_tls_cert_file, &self.peer_tls_key_file, &self.peer_tls_ca_file) {
            (Some(cert), Some(key), Some(ca)) => Some((cert, key, ca)),
            _ => None,
        }
    }

    /// What placement needs of each node: its id and failure domain.
    pub fn members(&self) -> Vec<Member> {
        self.nodes
            .iter()
            .map(|node| Member { id: node.id, failure_domain: node.failure_domain.clone() })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn node(id: NodeId, domain: &str) -> NodeSpec {
        NodeSpec {
            id,
            client: format!("10.0.0.{id}:7400").parse().unwrap(),
            peer: format!("10.0.0.{id}:7500").parse().unwrap(),
            failure_domain: domain.to_owned(),
        }
    }

    fn three() -> ClusterConfig {
        ClusterConfig {
            node_id: 2,
            nodes: vec![node(1, "a"), node(2, "b"), node(3, "c")],
            replication_factor: 3,
            controller_voters: 3,
            secret_file: Some(PathBuf::from("cluster.secret")),
            peer_tls_cert_file: None,
            peer_tls_key_file: None,
            peer_tls_ca_file: None,
            node_down_timeout_ms: NODE_DOWN_TIMEOUT_DEFAULT_MS,
        }
    }

    // Goal: the documented table parses, with its defaults; method: the
    // module doc's example, then one without the optional keys.
    #[test]
    fn a_table_parses_with_its_defaults() {
        let text = r#"
            listen = "127.0.0.1:7400"
            [cluster]
            node_id = 1
            replication_factor = 3
            controller_voters = 3
            secret_file = "cluster.secret"
            nodes = [
              { id = 1, client = "10.0.0.1:7400", peer = "10.0.0.1:7500", failure_domain = "rack-a" },
              { id = 2, client = "10.0.0.2:7400", peer = "10.0.0.2:7500", failure_domain = "rack-b" },
              { id = 3, client = "10.0.0.3:7400", peer = "10.0.0.3:7500", failure_domain = "rack-c" },
            ]
        "#;
        let config = ClusterConfig::from_toml(text).unwrap();
        assert_eq!(config.node_id, 1);
        assert_eq!(config.nodes.len(), 3);
        assert_eq!(config.this_node().unwrap().failure_domain, "rack-a");
        assert_eq!(config.node(3).unwrap().peer, "10.0.0.3:7500".parse::<SocketAddr>().unwrap());
        assert_eq!(config.members()[1], Member { id: 2, failure_domain: "rack-b".into() });

        let text = r#"
            [cluster]
            node_id = 3
            secret_file = "cluster.secret"
            [[cluster.nodes]]
            id = 1
            client = "10.0.0.1:7400"
            peer = "10.0.0.1:7500"
            failure_domain = "a"
            [[cluster.nodes]]
            id = 2
            client = "10.0.0.2:7400"
            peer = "10.0.0.2:7500"
            failure_domain = "b"
            [[cluster.nodes]]
            id = 3
            client = "10.0.0.3:7400"
            peer = "10.0.0.3:7500"
            failure_domain = "c"
        "#;
        let config = ClusterConfig::from_toml(text).unwrap();
        assert_eq!(config.replication_factor, REPLICATION_FACTOR_DEFAULT);
        assert_eq!(config.controller_voters, CONTROLLER_VOTERS_DEFAULT);
        assert_eq!(config.node_down_timeout_ms, NODE_DOWN_TIMEOUT_DEFAULT_MS);
    }

    // Goal: the node-down timeout is bounded; method: each bound, one
    // below and one above.
    #[test]
    fn the_node_down_timeout_is_bounded() {
        for (ms, ok) in [
            (NODE_DOWN_TIMEOUT_MIN_MS - 1, false),
            (NODE_DOWN_TIMEOUT_MIN_MS, true),
            (NODE_DOWN_TIMEOUT_MAX_MS, true),
            (NODE_DOWN_TIMEOUT_MAX_MS + 1, false),
        ] {
            let config = ClusterConfig { node_down_timeout_ms: ms, ..three() };
            match config.validate() {
                Ok(()) => assert!(ok, "{ms} ms accepted"),
                Err(error) => {
                    assert!(!ok, "{ms} ms refused: {error}");
                    assert!(error.to_string().contains("node_down_timeout_ms"), "{error}");
                }
            }
        }
    }

    // Goal: what does not parse is an error, not a default; method: no
    // table, an unknown key, a bad address.
    #[test]
    fn malformed_tables_are_refused() {
        assert!(matches!(ClusterConfig::from_toml("listen = 1"), Err(ClusterError::MissingTable)));
        let unknown = "[cluster]\nnode_id = 1\nnodes = []\nreplicas = 3\n";
        let error = ClusterConfig::from_toml(unknown).unwrap_err();
        assert!(matches!(error, ClusterError::Parse(_)), "{error}");
        assert!(error.to_string().contains("replicas"), "{error}");
        let bad_address = "[cluster]\nnode_id = 1\nnodes = [{ id = 1, client = \"nowhere\", \
                           peer = \"10.0.0.1:1\", failure_domain = \"a\" }]\n";
        assert!(matches!(ClusterConfig::from_toml(bad_address), Err(ClusterError::Parse(_))));
    }

    // Goal: every rule is enforced and its message names the offending
    // value; method: break one rule at a time on a valid table.
    #[test]
    fn each_rule_is_refused_with_its_value() {
        assert!(three().validate().is_ok());
        let check = |config: ClusterConfig, needle: &str| {
            let error = config.validate().unwrap_err();
            assert!(error.to_string().contains(needle), "`{error}` lacks `{needle}`");
            error
        };

        let mut config = three();
        config.nodes[1].id = 0;
        config.node_id = 0;
        assert!(matches!(check(config, "nodes[1]"), ClusterError::NodeIdZero { index: 1 }));

        let mut config = three();
        config.nodes[2].id = 1;
        assert!(matches!(check(config, "1"), ClusterError::DuplicateNodeId { id: 1 }));

        let mut config = three();
        config.node_id = 9;
        assert!(matches!(check(config, "9"), ClusterError::OwnIdMissing { node_id: 9 }));

        let mut config = three();
        config.nodes[2].client = config.nodes[0].peer;
        let error = check(config, "10.0.0.1:7500");
        assert!(matches!(error, ClusterError::DuplicateAddress { first: 1, second: 3, .. }));
        let mut config = three();
        config.nodes[1].peer = config.nodes[1].client;
        assert!(matches!(check(config, "10.0.0.2:7400"), ClusterError::DuplicateAddress { .. }));

        let mut config = three();
        config.nodes[0].failure_domain.clear();
        assert!(matches!(check(config, "node 1"), ClusterError::FailureDomainEmpty { id: 1 }));
        let mut config = three();
        config.nodes[2].failure_domain = "z".repeat(FAILURE_DOMAIN_BYTES_MAX + 1);
        let error = check(config, &format!("{} bytes", FAILURE_DOMAIN_BYTES_MAX + 1));
        assert!(matches!(error, ClusterError::FailureDomainTooLong { id: 3, .. }));
        let mut config = three();
        config.nodes[2].failure_domain = "z".repeat(FAILURE_DOMAIN_BYTES_MAX);
        assert!(config.validate().is_ok());

        for factor in [0, 2, 4, 6] {
            let mut config = three();
            config.replication_factor = factor;
            let error = check(config, &format!("= {factor}"));
            assert!(matches!(error, ClusterError::ReplicationFactor { .. }));
        }
        let mut config = three();
        config.replication_factor = 5;
        assert!(matches!(check(config, "= 5"), ClusterError::ReplicationFactorAboveNodes { .. }));
        let mut config = three();
        config.replication_factor = 1;
        assert!(config.validate().is_ok());

        for voters in [1, 4, 7] {
            let mut config = three();
            config.controller_voters = voters;
            let error = check(config, &format!("= {voters}"));
            assert!(matches!(error, ClusterError::ControllerVoters { .. }));
        }
        let mut config = three();
        config.controller_voters = 5;
        let error = check(config, "5 is more than the 3 nodes");
        assert!(matches!(error, ClusterError::ControllerVotersAboveNodes { voters: 5, nodes: 3 }));

        let mut config = three();
        config.secret_file = None;
        assert!(matches!(check(config, "secret_file"), ClusterError::SecretFileMissing));
        let mut config = three();
        config.peer_tls_cert_file = Some("node.crt".into());
        config.peer_tls_ca_file = Some("ca.crt".into());
        let error = check(config, "peer_tls_key_file is missing");
        assert!(matches!(error, ClusterError::PeerTlsIncomplete { .. }));
        let mut config = three();
        config.peer_tls_cert_file = Some("node.crt".into());
        config.peer_tls_key_file = Some("node.key".into());
        config.peer_tls_ca_file = Some("ca.crt".into());
        assert!(config.validate().is_ok());
        assert!(config.peer_tls_files().is_some());
        assert_eq!(three().controller_voter_ids(), vec![1, 2, 3]);

        let mut config = three();
        config.nodes = (1..=CLUSTER_NODES_MAX as u64 + 1).map(|id| node(id, "a")).collect();
        let error = check(config, &(CLUSTER_NODES_MAX + 1).to_string());
        assert!(matches!(error, ClusterError::TooManyNodes { .. }));
    }

    // Goal: a table of the largest size with distinct addresses passes;
    // method: CLUSTER_NODES_MAX nodes, five voters, factor 5.
    #[test]
    fn the_largest_cluster_is_valid() {
        let nodes: Vec<NodeSpec> = (1..=CLUSTER_NODES_MAX as u64)
            .map(|id| NodeSpec {
                id,
                client: SocketAddr::from(([10, 1, 0, id as u8], 7400)),
                peer: SocketAddr::from(([10, 1, 0, id as u8], 7500)),
                failure_domain: format!("rack-{}", id % 7),
            })
            .collect();
        let config = ClusterConfig {
            node_id: CLUSTER_NODES_MAX as u64,
            nodes,
            replication_factor: 5,
            controller_voters: 5,
            secret_file: Some(PathBuf::from("cluster.secret")),
            peer_tls_cert_file: None,
            peer_tls_key_file: None,
            peer_tls_ca_file: None,
            node_down_timeout_ms: NODE_DOWN_TIMEOUT_DEFAULT_MS,
        };
        config.validate().unwrap();
    }
}
