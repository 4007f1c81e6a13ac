//! The cluster's metric families (`spool_replica_*`): each shard's members
//! by role, its peer links' Raft messages by outcome, the members' leader
//! changes, what each shard heard from each peer node (`spool_peer_*`),
//! and per partition the leader this node knows, the term and the log's
//! last, committed, applied, group floor and first indexes.
//! Absent on a single node (no shard reports replication).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::{gauge_value, Counters, FloatGauges, Gauges, PartitionLabels, ShardLabels};
use crate::control::cluster::{ClusterHealth, NodeState};
use crate::shard::report::ShardReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeStateLabels {
    node: String,
    state: String,
}

/// Registers the controller's view of the nodes (`control/cluster/health.rs`):
/// on every member whether it leads the controller and which node does; on
/// the leader each node's state and silence. Nothing on a single node.
pub(super) fn register_health(registry: &mut Registry, health: Option<&ClusterHealth>) {
    let Some(health) = health else { return };
    let leads = Gauges::<NodeLabels>::default();
    leads.get_or_create(&NodeLabels { node: health.node.to_string() }).set(i64::from(health.leads));
    registry.register(
        "spool_controller_leading",
        "1 when this node leads the controller group (its spool_cluster_node_* series are the \
         cluster's view), else 0",
        leads,
    );
    let leader = Gauges::<NodeLabels>::default();
    leader
        .get_or_create(&NodeLabels { node: health.node.to_string() })
        .set(gauge_value(health.controller_leader.unwrap_or(0)));
    registry.register(
        "spool_controller_leader",
        "The controller group's leader this node knows of (0: none, an election runs)",
        leader,
    );
    let replaced = Gauges::<StateLabels>::default();
    replaced
        .get_or_create(&StateLabels { state: "settled".into() })
        .set(gauge_value(health.re_placed - health.moving.min(health.re_placed)));
    replaced.get_or_create(&StateLabels { state: "moving".into() }).set(gauge_value(health.moving));
    registry.register(
        "spool_cluster_partitions_re_placed",
        "Partitions the controller re-placed off the placer's replica sets (a node down, an \
         operator's move), by state: moving while the group's members are not there yet",
        replaced,
    );
    if !health.leads {
        return;
    }
    let states = Gauges::<NodeStateLabels>::default();
    let silence = FloatGauges::<NodeLabels>::default();
    for node in &health.nodes {
        for state in [NodeState::Up, NodeState::Down] {
            let labels =
                NodeStateLabels { node: node.node.to_string(), state: state.as_str().to_owned() };
            states.get_or_create(&labels).set(i64::from(node.state == state));
        }
        #[allow(clippy::cast_precision_loss)] // milliseconds as seconds: exact enough
        silence
            .get_or_create(&NodeLabels { node: node.node.to_string() })
            .set(node.silent_ms as f64 / 1e3);
    }
    registry.register(
        "spool_cluster_node_state",
        "Each node's state as the controller's leader sees it (1 for the state it is in): down \
         after node_down_timeout_ms without a frame from it; only the controller's leader reports",
        states,
    );
    registry.register(
        "spool_cluster_node_silence_seconds",
        "Seconds since the controller's leader last heard from the node (at most since it took \
         the lead); only the controller's leader reports",
        silence,
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    shard: String,
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    shard: String,
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    shard: String,
    outcome: String,
}

/// Registers the families; nothing when no shard replicates.
pub(super) fn register_replication(registry: &mut Registry, reports: &[ShardReport]) {
    if reports.iter().all(|report| report.replication.is_none()) {
        return;
    }
    let members = Gauges::<RoleLabels>::default();
    let messages = Counters::<OutcomeLabels>::default();
    let leaderships = Counters::<ShardLabels>::default();
    let step_downs = Counters::<ShardLabels>::default();
    let rebuilds = Counters::<ShardLabels>::default();
    let folded = Counters::<ShardLabels>::default();
    let snapshots = Counters::<OutcomeLabels>::default();
    let snapshot_bytes = Counters::<OutcomeLabels>::default();
    let node = Gauges::<ShardLabels>::default();
    let leader = Gauges::<PartitionLabels>::default();
    let term = Gauges::<PartitionLabels>::default();
    let serving = Gauges::<PartitionLabels>::default();
    let last = Gauges::<PartitionLabels>::default();
    let committed = Gauges::<PartitionLabels>::default();
    let applied = Gauges::<PartitionLabels>::default();
    let group_floor = Gauges::<PartitionLabels>::default();
    let first_index = Gauges::<PartitionLabels>::default();
    let silence = FloatGauges::<PeerLabels>::default();
    let heard = Gauges::<PeerLabels>::default();
    let shared = Gauges::<PeerLabels>::default();
    for report in reports {
        let Some(replication) = &report.replication else { continue };
        let shard = report.shard.0.to_string();
        for peer in &report.peers {
            let labels = PeerLabels { shard: shard.clone(), peer: peer.node.to_string() };
            #[allow(clippy::cast_precision_loss)] // milliseconds as seconds: exact enough
            silence.get_or_create(&labels).set(peer.silent_ms as f64 / 1e3);
            heard.get_or_create(&labels).set(i64::from(peer.heard));
            shared.get_or_create(&labels).set(gauge_value(peer.shared_groups));
        }
        let labels = ShardLabels { shard: shard.clone() };
        node.get_or_create(&labels).set(gauge_value(replication.node));
        for (role, count) in [("leader", replication.leading), ("follower", replication.following)]
        {
            let labels = RoleLabels { shard: shard.clone(), role: role.to_owned() };
            members.get_or_create(&labels).set(gauge_value(count));
        }
        let stats = replication.stats;
        for (outcome, count) in [
            ("sent", stats.sent),
            ("delivered", stats.delivered),
            ("refused", stats.refused),
            ("no_link", stats.no_link),
            ("unknown_group", stats.unknown_group),
            ("installing", stats.installing),
        ] {
            let labels = OutcomeLabels { shard: shard.clone(), outcome: outcome.to_owned() };
            messages.get_or_create(&labels).inc_by(count);
        }
        leaderships.get_or_create(&labels).inc_by(replication.leaderships);
        step_downs.get_or_create(&labels).inc_by(replication.step_downs);
        rebuilds.get_or_create(&labels).inc_by(replication.rebuilds);
        folded.get_or_create(&labels).inc_by(replication.folded);
        let transfers = replication.snapshots;
        for (outcome, count) in [
            ("served", transfers.served),
            ("offer_failed", transfers.offers_failed),
            ("installed", transfers.installed),
            ("install_failed", transfers.install_failures),
        ] {
            let labels = OutcomeLabels { shard: shard.clone(), outcome: outcome.to_owned() };
            snapshots.get_or_create(&labels).inc_by(count);
        }
        for (outcome, count) in
            [("sent", transfers.served_bytes), ("installed", transfers.installed_bytes)]
        {
            let labels = OutcomeLabels { shard: shard.clone(), outcome: outcome.to_owned() };
            snapshot_bytes.get_or_create(&labels).inc_by(count);
        }
        for partition in &report.partitions {
            let Some(role) = partition.replica else { continue };
            let labels = PartitionLabels::of(partition);
            leader.get_or_create(&labels).set(gauge_value(role.leader));
            term.get_or_create(&labels).set(gauge_value(role.term));
            serving.get_or_create(&labels).set(i64::from(role.serving));
            last.get_or_create(&labels).set(gauge_value(role.last));
            committed.get_or_create(&labels).set(gauge_value(role.committed));
            applied.get_or_create(&labels).set(gauge_value(role.applied));
            group_floor.get_or_create(&labels).set(gauge_value(role.group_floor));
            first_index.get_or_create(&labels).set(gauge_value(role.first_index));
        }
    }
    registry.register("spool_replica_node", "This node's id in its cluster", node);
    registry.register(
        "spool_replica_members",
        "Replicated partitions open on the shard, by role: leader (leads and serves) or follower",
        members,
    );
    registry.register(
        "spool_replica_messages",
        "Raft messages of the shard's peer links by outcome: sent (handed to a link), delivered \
         (stepped into a member), refused (a full or closed link), no_link, unknown_group, \
         installing (dropped while the partition installs a snapshot)",
        messages,
    );
    registry.register(
        "spool_replica_leaderships",
        "Terms the shard's open members took the lead in (fence run, serving)",
        leaderships,
    );
    registry.register(
        "spool_replica_step_downs",
        "Times the shard's open members stopped serving (another member leads)",
        step_downs,
    );
    registry.register(
        "spool_replica_rebuilds",
        "Diverged partition states rebuilt from the log on the shard",
        rebuilds,
    );
    registry.register(
        "spool_replica_folded_entries",
        "Committed entries the shard's followers folded into their queue state",
        folded,
    );
    registry.register(
        "spool_snapshot_transfers",
        "Snapshot transfers of the shard by outcome: served (a member pulled this node's \
         checkpoint), offer_failed (raft-rs told an offer failed: not pulled in time, or \
         replaced), installed (this node installed one), install_failed",
        snapshots,
    );
    registry.register(
        "spool_snapshot_bytes",
        "Snapshot bytes of the shard: sent (pieces served) and installed (side files and \
         record batches installed here)",
        snapshot_bytes,
    );
    registry.register(
        "spool_partition_leader",
        "The node this node knows to lead the partition (0: none known)",
        leader,
    );
    registry.register("spool_partition_term", "The partition member's Raft term", term);
    registry.register(
        "spool_partition_serving",
        "1 if this node's member of the partition leads and serves requests",
        serving,
    );
    registry.register(
        "spool_partition_last_index",
        "The index of the last entry in this node's log of the partition",
        last,
    );
    registry.register(
        "spool_partition_committed_index",
        "The partition's committed index as this node knows it (durable here and on a quorum)",
        committed,
    );
    registry.register(
        "spool_partition_applied_index",
        "The highest entry of the partition folded into this node's queue state (a follower's \
         lag: the leader's committed index minus this)",
        applied,
    );
    registry.register(
        "spool_peer_silence_seconds",
        "Seconds since the shard last received a replication frame from the peer node (since \
         the shard started, when it has received none): a leader heartbeats every 200 ms, so \
         seconds of silence mean the peer is down or the link between the two is cut",
        silence,
    );
    registry.register(
        "spool_peer_heard",
        "1 if the shard has received a replication frame from the peer node since it started",
        heard,
    );
    registry.register(
        "spool_peer_shared_groups",
        "Replicated partitions on the shard the peer node is a member of (with none, silence \
         from it is normal)",
        shared,
    );
    registry.register(
        "spool_partition_group_floor_index",
        "The highest entry of the partition every member is known to hold: this node's journal \
         keeps every entry above it (a member down holds it back)",
        group_floor,
    );
    registry.register(
        "spool_partition_first_index",
        "The first entry of the partition this node's log still holds (those below were let go \
         of with their journal files)",
        first_index,
    );
}
