//! Named bounds of cluster membership and placement (`members`,
//! `placement`, `keys`) and of the controller member the coordinator runs
//! (`shard/controller_run.rs`), with their relations checked at compile
//! time.

use crate::limits::{
    COORDINATOR_COMMANDS_PER_TICK_MAX, PARTITIONS_PER_NODE_MAX, PARTITIONS_PER_QUEUE_MAX,
};
use crate::log::journal::JOURNAL_FILE_BYTES_MIN;

/// Most nodes one cluster config may name. Placement scores every node for
/// every group (rendezvous hashing), so its cost grows with this bound;
/// 128 nodes of [`crate::limits::PARTITIONS_PER_NODE_MAX`] replicas each
/// is far beyond the clusters the cluster plan targets.
pub const CLUSTER_NODES_MAX: usize = 128;

/// Longest failure-domain name, bytes (a rack, a zone: `eu-west-1a`).
pub const FAILURE_DOMAIN_BYTES_MAX: usize = 64;

/// Replicas per partition when the `[cluster]` table names none: survives
/// the loss of any one node.
pub const REPLICATION_FACTOR_DEFAULT: usize = 3;

/// The replication factors a cluster may use: odd, so a majority of the
/// replica set is well defined (1 keeps no copy elsewhere; 5 survives two
/// losses).
pub const REPLICATION_FACTORS: [usize; 3] = [1, 3, 5];

/// Most nodes a partition's replica set may name in the table: the largest
/// replication factor (a re-placement keeps the set's size; while it is
/// carried out the group has one member more).
pub const REPLICA_SET_MAX: usize = 5;

/// Voters of the controller group when the `[cluster]` table names none.
pub const CONTROLLER_VOTERS_DEFAULT: usize = 3;

/// The voter counts the controller group may have (the cluster plan: 3
/// or 5 voters).
pub const CONTROLLER_VOTERS: [usize; 2] = [3, 5];

/// Most groups (queue partitions) one placement table holds: every group
/// has at least one replica and a node hosts at most
/// [`PARTITIONS_PER_NODE_MAX`] of them, so a cluster at
/// [`CLUSTER_NODES_MAX`] nodes cannot host more.
pub const PLACEMENT_GROUPS_MAX: usize = CLUSTER_NODES_MAX * PARTITIONS_PER_NODE_MAX;

/// Most partitions a key map spreads keys over: one queue's bound.
pub const KEY_MAP_PARTITIONS_MAX: u32 = PARTITIONS_PER_QUEUE_MAX;

const _: () = assert!(CLUSTER_NODES_MAX >= 5, "a cluster of five must fit");
const _: () = assert!(FAILURE_DOMAIN_BYTES_MAX >= 1);
const _: () = assert!(REPLICATION_FACTOR_DEFAULT == REPLICATION_FACTORS[1]);
// Every replica set a factor places fits the table's bound.
const _: () = assert!(REPLICATION_FACTORS[2] <= REPLICA_SET_MAX);
// A re-placement's group (the set and the member joining) fits a group.
const _: () = assert!(REPLICA_SET_MAX < crate::queue::limits::GROUP_MEMBERS_MAX);
const _: () = assert!(CONTROLLER_VOTERS_DEFAULT == CONTROLLER_VOTERS[0]);
// Jump consistent hash works on buckets that fit an i32 (the paper's form).
const _: () = assert!(KEY_MAP_PARTITIONS_MAX >= 1 && KEY_MAP_PARTITIONS_MAX <= i32::MAX as u32);

/// Size of each file of the controller's journal (`<data_dir>/controller/`,
/// `shard/controller_run.rs`): its entries are catalog changes, a few
/// hundred bytes each, so the partitions' 64 MiB pre-zeroed files would be
/// waste.
pub const CONTROLLER_JOURNAL_FILE_BYTES: u64 = 4 << 20;
/// Largest entry of the controller's journal: one assignment update as
/// JSON (a queue's config and one shard id per partition: about 60 KiB at
/// `PARTITIONS_MAX`).
pub const CONTROLLER_ENTRY_BYTES_MAX: u64 = 1 << 20;
/// Bytes of the controller journal's read cache and read-ahead.
pub const CONTROLLER_READ_CACHE_BYTES: u64 = 1 << 20;
/// Catalog changes the coordinator has handed to the controller and not
/// yet answered; more are answered `Busy` (each waits for a quorum).
pub const CONTROLLER_COMMANDS_IN_FLIGHT_MAX: usize = 64;

// A controller journal file holds its largest commit (entry, control lane,
// headers) several times over.
const _: () = assert!(4 * CONTROLLER_ENTRY_BYTES_MAX <= CONTROLLER_JOURNAL_FILE_BYTES);
const _: () = assert!(CONTROLLER_JOURNAL_FILE_BYTES >= JOURNAL_FILE_BYTES_MIN);
const _: () = assert!(CONTROLLER_COMMANDS_IN_FLIGHT_MAX <= COORDINATOR_COMMANDS_PER_TICK_MAX);

/// How often a shard checks whether the older partitions it leads have
/// finished what they took before their queue's resize
/// (`server/keys.rs`).
pub const KEY_DRAIN_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a shard waits before it reports a drained partition again
/// when the report did not visibly take effect (the controller's leader
/// changed, the coordinator was busy).
pub const KEY_DRAIN_REPORT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long the controller's leader waits without a frame from a node
/// before it counts the node down (`control/cluster/health.rs`), when the
/// `[cluster]` table names no `node_down_timeout_ms`: well above a restart
/// (a few seconds) and an election (1–2 s), so a node that restarts or a
/// controller that changes leader is never counted down.
pub const NODE_DOWN_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// The bounds of `node_down_timeout_ms`: at least ten controller
/// heartbeats (200 ms each), at most an hour.
pub const NODE_DOWN_TIMEOUT_MIN_MS: u64 = 2_000;
pub const NODE_DOWN_TIMEOUT_MAX_MS: u64 = 3_600_000;
/// How often the controller's member evaluates and publishes the nodes'
/// health (`spool cluster nodes`, `spool_cluster_node_*`).
pub const NODE_HEALTH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a shard looks for the groups it leads whose replica set the
/// table changed and takes their next membership step (`server/replace.rs`).
pub const REPLICA_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a shard waits before it tries a group's membership step (or
/// reports it settled) again when the last try did not visibly take effect.
pub const REPLICA_STEP_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Most re-placements the controller's leader proposes per health round
/// (each is one committed entry of the controller group): a node down with
/// thousands of replicas is re-placed over several seconds, not in one
/// burst that starves the controller's other changes.
pub const REPLACEMENTS_PER_ROUND: usize = 32;
