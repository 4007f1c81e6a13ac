//! Cluster membership and placement: pure functions of a config (no I/O,
//! no clock) and, in [`node`], what the running node loads from it (the cluster plan:
//! `docs/design/replication.md`, "Membership and placement (built)").
//!
//! - [`members`]: the `[cluster]` table ([`ClusterConfig`]: this node, every
//!   node with its client and peer addresses and failure domain, the
//!   replication factor, the controller's voters) and its validation.
//! - [`placement`]: which nodes hold each group's replicas, the preferred
//!   leader first: rendezvous hashing spread over failure domains, in a
//!   versioned [`PlacementTable`] with a [`diff`].
//! - [`keys`]: which partition a routing key goes to, by jump consistent
//!   hash in a versioned [`KeyMap`], so growing a queue moves few keys.
//! - [`node`]: this node in its cluster at run time ([`ClusterNode`]: the
//!   table, the placer, the token secret, the peer TLS, the leaders it
//!   knows).
//! - [`health`]: which nodes the controller's leader counts up or down.
//! - [`hash`]: the fixed 64-bit hashes both stand on.
//! - [`limits`]: their bounds.

pub mod hash;
pub mod health;
pub mod keys;
pub mod limits;
pub mod members;
pub mod node;
pub mod placement;

pub use health::{ClusterHealth, NodeHealth, NodeState};
pub use keys::{KeyMap, KeyMapError};
pub use members::{ClusterConfig, ClusterError, NodeSpec};
pub use node::{ClusterNode, ClusterStartError, ClusterView, LeaderBoard, PartitionReplicas};
pub use placement::{
    diff, GroupId, GroupMove, Member, NodeId, PlacementError, PlacementTable, Placer,
};
