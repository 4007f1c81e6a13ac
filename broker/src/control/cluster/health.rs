//! Node health as the controller's leader sees it
//! (`docs/design/replication.md` §9, "Re-placement (plan)", step 1).
//!
//! Every node is a voter or a learner of the controller group and links to
//! every other node's controller port, so the controller's leader hears
//! from every node: the answers to its appends and heartbeats (every
//! 200 ms). A node whose last frame is older than the node-down timeout
//! (`[cluster] node_down_timeout_ms`, 30 s by default) is **down**; a
//! younger one is **up**. Only the leader's view is complete (a follower
//! hears the leader alone), so only the leader evaluates; a leader that has
//! led for less than the timeout counts silence from when it took the lead
//! (what it heard as a follower says nothing of the others), so a new
//! leader never counts a node down sooner than the timeout after its
//! election.
//!
//! Pure: silence and lead time come in as milliseconds; the controller's
//! member (`shard/controller_run.rs`) measures them and publishes the
//! result for the admin port (`spool cluster nodes`, the
//! `spool_cluster_node_*` metrics). Nothing acts on a down node yet: the
//! re-placement of its replicas is the next step of the plan.

use serde::Serialize;

use super::placement::NodeId;

/// A node's health by the controller leader's last frame from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heard from within the timeout (or this node itself).
    Up,
    /// Silent for the timeout or longer.
    Down,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
        }
    }
}

/// One node in the leader's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeHealth {
    pub node: NodeId,
    pub state: NodeState,
    /// Milliseconds of silence counted (0 for the leader itself): since the
    /// node's last frame, at most since the leader took the lead.
    pub silent_ms: u64,
    /// Whether the leader has had a frame from it since it started.
    pub heard: bool,
    /// A voter of the controller group (else a learner).
    pub voter: bool,
}

/// What one node knows of the cluster's health: the whole view on the
/// controller's leader, only who leads elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClusterHealth {
    /// The node that published this.
    pub node: NodeId,
    /// The controller's leader this node knows of (none while an election
    /// runs).
    pub controller_leader: Option<NodeId>,
    /// This node leads the controller: `nodes` is the cluster's view.
    pub leads: bool,
    /// The controller's term.
    pub term: u64,
    /// The timeout the states are judged by, milliseconds.
    pub down_after_ms: u64,
    /// Every node of the cluster, by id (empty unless `leads`).
    pub nodes: Vec<NodeHealth>,
    /// Partitions the controller re-placed off the placer's sets (by this
    /// node's copy of the table), and how many of those are still moving
    /// (their groups' members not there yet).
    pub re_placed: u64,
    pub moving: u64,
}

impl ClusterHealth {
    /// The nodes counted down.
    pub fn down(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().filter(|node| node.state == NodeState::Down).map(|node| node.node)
    }
}

/// What the leader measured of one other node: milliseconds since its last
/// frame (since the link started when none came), and whether one came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    pub node: NodeId,
    pub silent_ms: u64,
    pub heard: bool,
}

/// The leader's view of every node (module docs): `own` is the leader,
/// `voters` the controller's voters, `peers` what it measured of the
/// others, `led_for_ms` how long it has led. A node of `all` with no
/// measurement counts as silent for as long as it has led.
pub fn evaluate(
    own: NodeId,
    all: &[NodeId],
    voters: &[NodeId],
    peers: &[Heard],
    led_for_ms: u64,
    down_after_ms: u64,
) -> Vec<NodeHealth> {
    let mut nodes: Vec<NodeHealth> = all
        .iter()
        .map(|&node| {
            let voter = voters.contains(&node);
            if node == own {
                return NodeHealth { node, state: NodeState::Up, silent_ms: 0, heard: true, voter };
            }
            let measured = peers.iter().find(|peer| peer.node == node);
            let silent_ms = measured.map_or(led_for_ms, |peer| peer.silent_ms.min(led_for_ms));
            let state = if silent_ms >= down_after_ms { NodeState::Down } else { NodeState::Up };
            NodeHealth { node, state, silent_ms, heard: measured.is_some_and(|p| p.heard), voter }
        })
        .collect();
    nodes.sort_by_key(|node| node.node);
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(node: NodeId, silent_ms: u64) -> Heard {
        Heard { node, silent_ms, heard: true }
    }

    // Goal: a node is down once silent for the timeout, up before; the
    // leader is up; method: four nodes, silences around the timeout.
    #[test]
    fn silence_of_the_timeout_or_more_is_down() {
        let peers = [heard(2, 29_999), heard(3, 30_000), heard(4, 120_000)];
        let nodes = evaluate(1, &[4, 3, 2, 1], &[1, 2, 3], &peers, 600_000, 30_000);
        let states: Vec<_> = nodes.iter().map(|node| (node.node, node.state)).collect();
        assert_eq!(
            states,
            [(1, NodeState::Up), (2, NodeState::Up), (3, NodeState::Down), (4, NodeState::Down)]
        );
        assert!(nodes[0].voter && nodes[2].voter && !nodes[3].voter);
        assert_eq!(nodes[3].silent_ms, 120_000);
    }

    // Goal: a new leader never counts a node down before it has led for the
    // timeout (what it heard as a follower says nothing); method: a node
    // silent for minutes by the follower-era clock, the leader 5 s old,
    // then 30 s old; a node never measured counts as silent since the lead.
    #[test]
    fn a_new_leader_counts_silence_from_its_election() {
        let peers = [heard(2, 300_000)];
        let young = evaluate(1, &[1, 2, 3], &[1, 2, 3], &peers, 5_000, 30_000);
        assert!(young.iter().all(|node| node.state == NodeState::Up), "{young:?}");
        assert_eq!(young[1].silent_ms, 5_000);
        assert!(!young[2].heard);
        let grown = evaluate(1, &[1, 2, 3], &[1, 2, 3], &peers, 30_000, 30_000);
        assert_eq!(grown[1].state, NodeState::Down);
        assert_eq!(grown[2].state, NodeState::Down);
        let health = ClusterHealth { leads: true, nodes: grown, ..ClusterHealth::default() };
        assert_eq!(health.down().collect::<Vec<_>>(), [2, 3]);
    }
}
