//! `spool cluster partitions|status|nodes`: where a cluster's partitions
//! are led and how its nodes are doing (`nodes` lives in `nodes.rs`).
//!
//! - `partitions` asks one node (`--addr`, any node of the cluster, or a
//!   single broker) for Metadata over the wire: per partition the address
//!   of its leader (its preferred replica's while no leader is known) and
//!   its term (the leader epoch).
//! - `status` scrapes the admin port's `/metrics` of every node given
//!   (`--admin A,B,C`, at once, each bounded by `--timeout-ms`) and
//!   aggregates the `spool_replica_*` and `spool_partition_*` series
//!   (`docs/metrics.md`, "Cluster"): per node its id, partitions led and
//!   followed, leaderships, step-downs, Raft messages by outcome and the
//!   journal it holds (all of it and the live records' share); per
//!   partition the nodes that claim to serve it, flagging one served by no
//!   node ("no leader") or by several ("two serving", legitimate only
//!   during a term change), its lag and how many committed entries every
//!   journal keeps for a member not known to hold them ("unreleased": a
//!   member down holds it growing). An unreachable node or a partition with no
//!   leader makes the command exit with [`EXIT_UNHEALTHY`] after printing
//!   the report. A node without those series is not in a cluster.
//!
//! The aggregation ([`aggregate`]) is pure, over parsed samples; the I/O is
//! the CLI's admin-port client (`http.rs`) and its exposition parser
//! (`metrics.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use spool_client::limits::{ADMIN_ADDR_DEFAULT, PEER_SILENCE_WARN_MS};
use spool_client::spool_wire::proto::{MetadataRequest, Request, Response};
use spool_client::{shard_address, Client, ClientError, TlsConfig};

use crate::http::call;
use crate::metrics::{parse, Sample};
use crate::render::{Output, Table};
use crate::Failure;

/// Exit code of `spool cluster status` when a node is unreachable or a
/// partition has no leader (the report is printed all the same).
pub(crate) const EXIT_UNHEALTHY: u8 = 5;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Each partition's leader address and term, from one node's Metadata
    /// (`--addr`: any node of the cluster).
    Partitions(PartitionsArgs),
    /// Every node's replication figures and who serves each partition,
    /// from the nodes' admin ports (/metrics). Exits 5 when a node is
    /// unreachable or a partition has no leader.
    Status(StatusArgs),
    /// Every node's health as the controller's leader sees it (up, or down
    /// after node_down_timeout_ms of silence), from the admin ports given
    /// (`GET /v1/cluster/nodes`). Exits 5 when a node is down or no node
    /// given leads the controller.
    Nodes(StatusArgs),
    /// Every partition's replica set (the preferred leader first), whether
    /// the controller re-placed it and whether its members are there yet,
    /// from the first admin port given that answers.
    Replicas(StatusArgs),
    /// Moves one replica of a partition to another node (the controller's
    /// leader, among the admin ports given, takes it); returns once the new
    /// set is committed. `cluster replicas` shows it settled once done.
    Move(crate::replicas::MoveArgs),
}

#[derive(Debug, Args)]
pub struct PartitionsArgs {
    /// Only these queues (default: all).
    pub queues: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The admin ports of the cluster's nodes (their `admin_listen`),
    /// comma-separated or repeated; give every node, or partitions led by
    /// a node left out show as without a leader.
    #[arg(long = "admin", value_name = "ADDR[,ADDR...]", value_delimiter = ',',
          default_value = ADMIN_ADDR_DEFAULT)]
    pub admin: Vec<String>,
}

// ------------------------------------------------------------- partitions

/// `spool cluster partitions`.
pub async fn partitions(client: &Client, args: &PartitionsArgs) -> Result<Output, Failure> {
    let request = MetadataRequest { queues: args.queues.clone() };
    let bytes = client.control(&Request::Metadata(request)).await?;
    let Response::Metadata(mut response) = bytes.response()? else {
        return Err(ClientError::Protocol("metadata answered with another response".into()).into());
    };
    if let Some(missing) =
        args.queues.iter().find(|name| !response.queues.iter().any(|queue| &queue.name == *name))
    {
        return Err(ClientError::UnknownQueue(missing.clone()).into());
    }
    response.queues.sort_by(|a, b| a.name.cmp(&b.name));
    let mut table = Table::new(vec!["queue", "partition", "leader", "term"]);
    let mut rows = Vec::new();
    for queue in &mut response.queues {
        queue.partitions.sort_by_key(|partition| partition.partition);
        for partition in &queue.partitions {
            let leader = shard_address(partition);
            table.push(vec![
                queue.name.clone(),
                partition.partition.0.to_string(),
                leader.clone(),
                partition.leader_epoch.0.to_string(),
            ]);
            rows.push(json!({
                "queue": queue.name,
                "partition": partition.partition.0,
                "leader": leader,
                "term": partition.leader_epoch.0,
            }));
        }
    }
    let json = json!({
        "assignment_version": response.assignment_version.0,
        "partitions": rows,
    });
    if table.rows.is_empty() {
        return Ok(Output::message("no queues".to_owned(), json));
    }
    Ok(Output::table(table, json))
}

// ----------------------------------------------------------------- status

/// One node's replication figures, summed over its shards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFigures {
    /// `cluster.node_id` (`spool_replica_node`).
    pub node: u64,
    /// Partitions whose member here leads and serves.
    pub leading: u64,
    pub following: u64,
    pub leaderships: u64,
    pub step_downs: u64,
    pub sent: u64,
    pub delivered: u64,
    pub refused: u64,
    pub no_link: u64,
    pub unknown_group: u64,
    /// Journal bytes its shards hold (`spool_journal_file_bytes`, an upper
    /// bound) and of them the live records' (`spool_journal_live_bytes`).
    pub journal_bytes: u64,
    pub live_bytes: u64,
    /// Per peer node it shares partitions with: milliseconds since the
    /// last replication frame from it reached any shard of this node
    /// (`spool_peer_silence_seconds` where `spool_peer_shared_groups` > 0).
    pub peer_silence_ms: BTreeMap<u64, u64>,
}

/// What one admin address gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// The scrape failed: why.
    Unreachable(String),
    /// Reachable, without `spool_replica_*` series: a single node.
    NotInCluster,
    Member(NodeFigures),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub admin: String,
    pub state: NodeState,
}

impl NodeStatus {
    /// The node's id when known, else its admin address.
    fn label(&self) -> String {
        match &self.state {
            NodeState::Member(figures) => figures.node.to_string(),
            _ => self.admin.clone(),
        }
    }
}

/// How many nodes serve a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Exactly one.
    Ok,
    /// None of the nodes scraped.
    NoLeader,
    /// More than one: only while a term changes.
    TwoServing,
}

impl Served {
    fn text(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NoLeader => "no leader",
            Self::TwoServing => "two serving",
        }
    }
}

/// One partition as the scraped nodes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStatus {
    pub queue: String,
    pub partition: u32,
    /// The nodes (ids) whose member reports it serves.
    pub serving: Vec<String>,
    /// The leaders the replicas know (`spool_partition_leader`, 0 left
    /// out), with how many replicas name each.
    pub leaders: BTreeMap<u64, usize>,
    /// The highest term any replica reports.
    pub term: u64,
    /// Replicas that reported the partition.
    pub replicas: usize,
    pub state: Served,
    /// The highest committed index a replica reports, and how far the
    /// furthest-behind replica's queue state is from it (entries; `None`
    /// from brokers without `spool_partition_*_index`).
    pub committed: u64,
    pub lag: Option<u64>,
    /// Committed entries every member's journal keeps because some member
    /// is not known to hold them: the committed index less the highest
    /// group floor a replica reports (`spool_partition_group_floor_index`;
    /// `None` from brokers without it). A member down holds it growing.
    pub unreleased: Option<u64>,
}

/// The cluster as scraped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub nodes: Vec<NodeStatus>,
    pub partitions: Vec<PartitionStatus>,
}

impl Status {
    /// Whether any node answered with cluster series.
    fn in_cluster(&self) -> bool {
        self.nodes.iter().any(|node| matches!(node.state, NodeState::Member(_)))
    }

    /// What fails the command: unreachable nodes and partitions without a
    /// leader.
    pub fn failures(&self) -> Vec<String> {
        let mut failures: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|node| match &node.state {
                NodeState::Unreachable(why) => Some(format!("{} unreachable ({why})", node.admin)),
                _ => None,
            })
            .collect();
        failures.extend(
            self.partitions
                .iter()
                .filter(|partition| partition.state == Served::NoLeader)
                .map(|partition| format!("{}/{}: no leader", partition.queue, partition.partition)),
        );
        failures
    }

    /// The failures counted in one line, for stderr (the report lists
    /// them); `None` when there is none.
    pub fn failure_summary(&self) -> Option<String> {
        let unreachable = self
            .nodes
            .iter()
            .filter(|node| matches!(node.state, NodeState::Unreachable(_)))
            .count();
        let leaderless =
            self.partitions.iter().filter(|partition| partition.state == Served::NoLeader).count();
        if unreachable + leaderless == 0 {
            return None;
        }
        Some(format!(
            "cluster status: {unreachable} of {} nodes unreachable, {leaderless} of {} \
             partitions without a leader",
            self.nodes.len(),
            self.partitions.len()
        ))
    }

    /// What is worth a look but does not fail the command.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self
            .partitions
            .iter()
            .filter(|partition| partition.state == Served::TwoServing)
            .map(|partition| {
                format!(
                    "{}/{}: served by nodes {} (two serving: only during a term change)",
                    partition.queue,
                    partition.partition,
                    partition.serving.join(",")
                )
            })
            .collect();
        if self.in_cluster() {
            warnings.extend(
                self.nodes
                    .iter()
                    .filter(|node| node.state == NodeState::NotInCluster)
                    .map(|node| format!("{} is not in a cluster", node.admin)),
            );
        }
        for node in &self.nodes {
            let NodeState::Member(figures) = &node.state else { continue };
            for (peer, ms) in silent_peers(figures) {
                warnings.push(format!(
                    "node {} has received nothing from node {peer} for {:.1} s (node {peer} \
                     down, or the link between them cut)",
                    figures.node,
                    ms as f64 / 1e3
                ));
            }
        }
        warnings
    }
}

/// The peers a node has not heard from for over [`PEER_SILENCE_WARN_MS`].
fn silent_peers(figures: &NodeFigures) -> Vec<(u64, u64)> {
    figures
        .peer_silence_ms
        .iter()
        .filter(|(_, &ms)| ms > PEER_SILENCE_WARN_MS)
        .map(|(&peer, &ms)| (peer, ms))
        .collect()
}

/// A counter's or gauge's value as a count (NaN and negatives as 0).
fn count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

/// One node's figures, or `None` without `spool_replica_node` (no cluster).
fn node_figures(samples: &[Sample]) -> Option<NodeFigures> {
    let mut figures = NodeFigures::default();
    let mut member = false;
    for sample in samples {
        let label = |name: &str| sample.labels.get(name).map(String::as_str);
        let value = count(sample.value);
        match sample.name.as_str() {
            "spool_replica_node" => {
                member = true;
                figures.node = value;
            }
            "spool_replica_members" => match label("role") {
                Some("leader") => figures.leading += value,
                Some("follower") => figures.following += value,
                _ => {}
            },
            "spool_replica_leaderships_total" => figures.leaderships += value,
            "spool_journal_file_bytes" => figures.journal_bytes += value,
            "spool_journal_live_bytes" => figures.live_bytes += value,
            "spool_peer_silence_seconds" | "spool_peer_shared_groups" => {}
            "spool_replica_step_downs_total" => figures.step_downs += value,
            "spool_replica_messages_total" => match label("outcome") {
                Some("sent") => figures.sent += value,
                Some("delivered") => figures.delivered += value,
                Some("refused") => figures.refused += value,
                Some("no_link") => figures.no_link += value,
                Some("unknown_group") => figures.unknown_group += value,
                _ => {}
            },
            _ => {}
        }
    }
    figures.peer_silence_ms = peer_silence(samples);
    member.then_some(figures)
}

/// Per peer node this node shares partitions with, the shortest silence
/// over its shards (milliseconds).
fn peer_silence(samples: &[Sample]) -> BTreeMap<u64, u64> {
    let key = |sample: &Sample| {
        let shard = sample.labels.get("shard")?.clone();
        let peer = sample.labels.get("peer")?.parse::<u64>().ok()?;
        Some((shard, peer))
    };
    let mut shared: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut silence: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for sample in samples {
        let Some(at) = key(sample) else { continue };
        match sample.name.as_str() {
            "spool_peer_shared_groups" => {
                shared.insert(at, count(sample.value));
            }
            "spool_peer_silence_seconds" => {
                silence.insert(at, count(sample.value * 1e3));
            }
            _ => {}
        }
    }
    let mut peers: BTreeMap<u64, u64> = BTreeMap::new();
    for ((shard, peer), ms) in silence {
        if shared.get(&(shard, peer)).copied().unwrap_or(0) == 0 {
            continue;
        }
        let shortest = peers.entry(peer).or_insert(ms);
        *shortest = (*shortest).min(ms);
    }
    peers
}

/// One replica's view of a partition.
#[derive(Debug, Default, Clone, Copy)]
struct Replica {
    leader: u64,
    term: u64,
    serving: bool,
    committed: u64,
    applied: Option<u64>,
    group_floor: Option<u64>,
}

/// The partitions a node reports, by (queue, partition).
fn replicas(samples: &[Sample]) -> BTreeMap<(String, u32), Replica> {
    let mut replicas: BTreeMap<(String, u32), Replica> = BTreeMap::new();
    for sample in samples {
        let slot = match sample.name.as_str() {
            "spool_partition_leader"
            | "spool_partition_term"
            | "spool_partition_serving"
            | "spool_partition_committed_index"
            | "spool_partition_applied_index"
            | "spool_partition_group_floor_index" => sample.name.as_str(),
            _ => continue,
        };
        let (Some(queue), Some(partition)) = (
            sample.labels.get("queue"),
            sample.labels.get("partition").and_then(|number| number.parse::<u32>().ok()),
        ) else {
            continue;
        };
        let replica = replicas.entry((queue.clone(), partition)).or_default();
        match slot {
            "spool_partition_leader" => replica.leader = count(sample.value),
            "spool_partition_term" => replica.term = count(sample.value),
            "spool_partition_committed_index" => replica.committed = count(sample.value),
            "spool_partition_applied_index" => replica.applied = Some(count(sample.value)),
            "spool_partition_group_floor_index" => {
                replica.group_floor = Some(count(sample.value));
            }
            _ => replica.serving = sample.value >= 1.0,
        }
    }
    replicas
}

/// The status from each admin address's scrape (parsed samples, or why it
/// failed), in the order given.
pub fn aggregate(scrapes: Vec<(String, Result<Vec<Sample>, String>)>) -> Status {
    let mut nodes = Vec::new();
    let mut partitions: BTreeMap<(String, u32), PartitionStatus> = BTreeMap::new();
    // The lowest applied index a replica of each partition reports, and
    // the highest group floor.
    let mut behind: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let mut floors: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for (admin, scraped) in scrapes {
        let samples = match scraped {
            Ok(samples) => samples,
            Err(why) => {
                nodes.push(NodeStatus { admin, state: NodeState::Unreachable(why) });
                continue;
            }
        };
        let Some(figures) = node_figures(&samples) else {
            nodes.push(NodeStatus { admin, state: NodeState::NotInCluster });
            continue;
        };
        let node = NodeStatus { admin, state: NodeState::Member(figures) };
        for ((queue, partition), replica) in replicas(&samples) {
            let status =
                partitions.entry((queue.clone(), partition)).or_insert_with(|| PartitionStatus {
                    queue,
                    partition,
                    serving: Vec::new(),
                    leaders: BTreeMap::new(),
                    term: 0,
                    replicas: 0,
                    state: Served::NoLeader,
                    committed: 0,
                    lag: None,
                    unreleased: None,
                });
            status.replicas += 1;
            status.term = status.term.max(replica.term);
            status.committed = status.committed.max(replica.committed);
            if let Some(applied) = replica.applied {
                let lowest = behind.entry((status.queue.clone(), partition)).or_insert(applied);
                *lowest = (*lowest).min(applied);
            }
            if let Some(floor) = replica.group_floor {
                let highest = floors.entry((status.queue.clone(), partition)).or_insert(floor);
                *highest = (*highest).max(floor);
            }
            if replica.leader != 0 {
                *status.leaders.entry(replica.leader).or_default() += 1;
            }
            if replica.serving {
                status.serving.push(node.label());
            }
        }
        nodes.push(node);
    }
    let partitions = partitions
        .into_values()
        .map(|mut partition| {
            partition.lag = behind
                .get(&(partition.queue.clone(), partition.partition))
                .map(|applied| partition.committed.saturating_sub(*applied));
            partition.unreleased = floors
                .get(&(partition.queue.clone(), partition.partition))
                .map(|floor| partition.committed.saturating_sub(*floor));
            partition.state = match partition.serving.len() {
                0 => Served::NoLeader,
                1 => Served::Ok,
                _ => Served::TwoServing,
            };
            partition
        })
        .collect();
    Status { nodes, partitions }
}

/// Bytes as MiB, one decimal.
fn mib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // a figure for people
    let mib = bytes as f64 / f64::from(1u32 << 20);
    format!("{mib:.1}")
}

/// Scrapes one admin port.
async fn scrape(
    admin: &str,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Vec<Sample>, String> {
    let answer = call(admin, tls, "GET", "/metrics", None, None, timeout).await?;
    if answer.status != 200 {
        return Err(answer.refusal());
    }
    let text = String::from_utf8(answer.body).map_err(|_| "/metrics is not UTF-8".to_owned())?;
    parse(&text).map_err(|error| format!("/metrics: {error}"))
}

/// The report in both forms.
fn render(status: &Status) -> Output {
    let failures = status.failures();
    let warnings = status.warnings();
    let node_json: Vec<Value> = status
        .nodes
        .iter()
        .map(|node| match &node.state {
            NodeState::Unreachable(why) => {
                json!({"admin": node.admin, "reachable": false, "error": why})
            }
            NodeState::NotInCluster => {
                json!({"admin": node.admin, "reachable": true, "in_cluster": false})
            }
            NodeState::Member(figures) => json!({
                "admin": node.admin,
                "reachable": true,
                "in_cluster": true,
                "node": figures.node,
                "leading": figures.leading,
                "following": figures.following,
                "leaderships": figures.leaderships,
                "step_downs": figures.step_downs,
                "messages": {
                    "sent": figures.sent,
                    "delivered": figures.delivered,
                    "refused": figures.refused,
                    "no_link": figures.no_link,
                    "unknown_group": figures.unknown_group,
                },
                "journal_bytes": figures.journal_bytes,
                "live_bytes": figures.live_bytes,
                "peer_silence_ms": figures
                    .peer_silence_ms
                    .iter()
                    .map(|(peer, ms)| (peer.to_string(), json!(ms)))
                    .collect::<serde_json::Map<String, Value>>(),
            }),
        })
        .collect();
    let partition_json: Vec<Value> = status
        .partitions
        .iter()
        .map(|partition| {
            json!({
                "queue": partition.queue,
                "partition": partition.partition,
                "serving": partition.serving,
                "leaders_known": partition.leaders.keys().collect::<Vec<_>>(),
                "term": partition.term,
                "replicas_reporting": partition.replicas,
                "state": partition.state.text(),
                "committed_index": partition.committed,
                "lag_entries": partition.lag,
                "unreleased_entries": partition.unreleased,
            })
        })
        .collect();
    let json = json!({
        "in_cluster": status.in_cluster(),
        "healthy": failures.is_empty(),
        "nodes": node_json,
        "partitions": partition_json,
        "failures": failures,
        "warnings": warnings,
    });
    if !status.in_cluster() && failures.is_empty() {
        let admins: Vec<&str> = status.nodes.iter().map(|node| node.admin.as_str()).collect();
        return Output::message(
            format!(
                "{}: not in a cluster (no [cluster] table); `spool cluster partitions` shows \
                 where its partitions are",
                admins.join(", ")
            ),
            json,
        );
    }
    let mut table = Table::new(vec![
        "admin",
        "node",
        "state",
        "leading",
        "following",
        "leaderships",
        "step_downs",
        "sent",
        "delivered",
        "refused",
        "no_link",
        "journal_mib",
        "live_mib",
        "silent_peers",
    ]);
    for node in &status.nodes {
        let mut row = vec![node.admin.clone()];
        match &node.state {
            NodeState::Member(figures) => row.extend([
                figures.node.to_string(),
                "reachable".to_owned(),
                figures.leading.to_string(),
                figures.following.to_string(),
                figures.leaderships.to_string(),
                figures.step_downs.to_string(),
                figures.sent.to_string(),
                figures.delivered.to_string(),
                figures.refused.to_string(),
                figures.no_link.to_string(),
                mib(figures.journal_bytes),
                mib(figures.live_bytes),
                {
                    let silent: Vec<String> = silent_peers(figures)
                        .into_iter()
                        .map(|(peer, ms)| format!("{peer} ({:.1} s)", ms as f64 / 1e3))
                        .collect();
                    if silent.is_empty() {
                        "-".to_owned()
                    } else {
                        silent.join(",")
                    }
                },
            ]),
            other => {
                row.push("-".to_owned());
                row.push(
                    if matches!(other, NodeState::NotInCluster) {
                        "not in a cluster"
                    } else {
                        "unreachable"
                    }
                    .to_owned(),
                );
                row.extend(vec!["-".to_owned(); 11]);
            }
        }
        table.push(row);
    }
    let mut partition_table = Table::new(vec![
        "queue",
        "partition",
        "serving",
        "leader_known",
        "term",
        "replicas",
        "state",
        "committed",
        "lag",
        "unreleased",
    ]);
    for partition in &status.partitions {
        let join = |ids: Vec<String>| if ids.is_empty() { "-".to_owned() } else { ids.join(",") };
        partition_table.push(vec![
            partition.queue.clone(),
            partition.partition.to_string(),
            join(partition.serving.clone()),
            join(partition.leaders.keys().map(u64::to_string).collect()),
            partition.term.to_string(),
            partition.replicas.to_string(),
            partition.state.text().to_owned(),
            partition.committed.to_string(),
            partition.lag.map_or_else(|| "-".to_owned(), |lag| lag.to_string()),
            partition.unreleased.map_or_else(|| "-".to_owned(), |held| held.to_string()),
        ]);
    }
    let summary = if failures.is_empty() && warnings.is_empty() {
        format!(
            "ok: {} nodes reachable, {} partitions each served by one node",
            status.nodes.len(),
            status.partitions.len()
        )
    } else {
        let mut lines: Vec<String> = failures.iter().map(|line| format!("FAIL {line}")).collect();
        lines.extend(warnings.iter().map(|line| format!("WARN {line}")));
        lines.join("; ")
    };
    let mut output = Output::table(table, json);
    if !status.partitions.is_empty() {
        output.more.push(partition_table);
    }
    output.message = Some(summary);
    output
}

/// Asks every admin port of `args` at once (`ask`, each bounded by the
/// caller), in the order given with duplicates dropped; a port whose task
/// did not finish reads as an error.
///
/// # Errors
/// An empty address; a task that panicked.
pub(crate) async fn ask_each<T, Ask, Asked>(
    args: &StatusArgs,
    ask: Ask,
) -> Result<Vec<(String, Result<T, String>)>, Failure>
where
    T: Send + 'static,
    Ask: Fn(String) -> Asked,
    Asked: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let mut admins: Vec<String> = Vec::new();
    for admin in &args.admin {
        let admin = admin.trim();
        if admin.is_empty() {
            return Err(Failure::Input("--admin: an empty address".to_owned()));
        }
        if !admins.iter().any(|known| known == admin) {
            admins.push(admin.to_owned());
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (index, admin) in admins.iter().enumerate() {
        let asked = ask(admin.clone());
        tasks.spawn(async move { (index, asked.await) });
    }
    let mut answers: Vec<Option<Result<T, String>>> = (0..admins.len()).map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        let (index, answer) =
            joined.map_err(|error| Failure::Input(format!("a request failed: {error}")))?;
        answers[index] = Some(answer);
    }
    Ok(admins
        .into_iter()
        .zip(answers)
        .map(|(admin, answer)| (admin, answer.unwrap_or_else(|| Err("not asked".to_owned()))))
        .collect())
}

/// `spool cluster status`: the report, or [`Failure::Unhealthy`] holding
/// it when a node is unreachable or a partition has no leader.
pub async fn status(
    args: &StatusArgs,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let scrapes = ask_each(args, |admin| {
        let tls = tls.cloned();
        async move { scrape(&admin, tls.as_ref(), timeout).await }
    })
    .await?;
    let status = aggregate(scrapes);
    let output = render(&status);
    match status.failure_summary() {
        None => Ok(output),
        Some(summary) => Err(Failure::Unhealthy(Box::new(output), summary)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's exposition: its id, members by role, counters and the
    /// partitions it replicates as (queue, partition, leader, term,
    /// serving).
    fn node(
        id: u64,
        leading: u64,
        following: u64,
        partitions: &[(&str, u32, u64, u64, bool)],
    ) -> String {
        let mut text = format!(
            "# HELP spool_replica_node This node's id in its cluster.\n\
             # TYPE spool_replica_node gauge\n\
             spool_replica_node{{shard=\"0\"}} {id}\n\
             spool_replica_members{{shard=\"0\",role=\"leader\"}} {leading}\n\
             spool_replica_members{{shard=\"0\",role=\"follower\"}} {following}\n\
             # TYPE spool_replica_messages counter\n\
             spool_replica_messages_total{{shard=\"0\",outcome=\"sent\"}} 100\n\
             spool_replica_messages_total{{shard=\"0\",outcome=\"delivered\"}} 90\n\
             spool_replica_messages_total{{shard=\"0\",outcome=\"refused\"}} 2\n\
             spool_replica_messages_total{{shard=\"0\",outcome=\"no_link\"}} 1\n\
             spool_replica_messages_total{{shard=\"0\",outcome=\"unknown_group\"}} 0\n\
             spool_replica_leaderships_total{{shard=\"0\"}} {leading}\n\
             spool_replica_step_downs_total{{shard=\"0\"}} 1\n\
             spool_ready_messages{{queue=\"jobs\",partition=\"0\"}} 5\n"
        );
        for (queue, partition, leader, term, serving) in partitions {
            let labels = format!("queue=\"{queue}\",partition=\"{partition}\"");
            text.push_str(&format!("spool_partition_leader{{{labels}}} {leader}\n"));
            text.push_str(&format!("spool_partition_term{{{labels}}} {term}\n"));
            text.push_str(&format!("spool_partition_serving{{{labels}}} {}\n", u8::from(*serving)));
        }
        text.push_str("# EOF\n");
        text
    }

    fn scraped(admin: &str, text: &str) -> (String, Result<Vec<Sample>, String>) {
        (admin.to_owned(), Ok(parse(text).unwrap()))
    }

    // Goal: three healthy nodes aggregate into per-node figures summed over
    // shards and one server per partition, with no failure or warning.
    // Method: inline exposition text of three nodes (node 1 with two
    // shards) replicating two partitions, each led by one node.
    #[test]
    fn healthy_cluster_has_one_server_per_partition() {
        let mut first = node(1, 1, 1, &[("jobs", 0, 1, 4, true), ("jobs", 1, 2, 3, false)]);
        first.push_str(
            "spool_replica_node{shard=\"1\"} 1\n\
             spool_replica_members{shard=\"1\",role=\"follower\"} 2\n\
             spool_replica_messages_total{shard=\"1\",outcome=\"sent\"} 11\n",
        );
        let status = aggregate(vec![
            scraped("a:1", &first),
            scraped("a:2", &node(2, 1, 1, &[("jobs", 0, 1, 4, false), ("jobs", 1, 2, 3, true)])),
            scraped("a:3", &node(3, 0, 2, &[("jobs", 0, 1, 4, false), ("jobs", 1, 2, 3, false)])),
        ]);
        let NodeState::Member(one) = &status.nodes[0].state else { panic!("not a member") };
        assert_eq!((one.node, one.leading, one.following, one.sent), (1, 1, 3, 111));
        assert_eq!((one.delivered, one.refused, one.no_link, one.step_downs), (90, 2, 1, 1));
        assert_eq!(status.partitions.len(), 2);
        let zero = &status.partitions[0];
        assert_eq!((zero.queue.as_str(), zero.partition), ("jobs", 0));
        assert_eq!(zero.serving, vec!["1".to_owned()]);
        assert_eq!(zero.leaders, BTreeMap::from([(1, 3)]));
        assert_eq!((zero.term, zero.replicas, zero.state), (4, 3, Served::Ok));
        assert_eq!(status.partitions[1].serving, vec!["2".to_owned()]);
        assert!(status.failures().is_empty());
        assert!(status.warnings().is_empty());
        assert_eq!(status.failure_summary(), None);
        let text = render(&status).render(false);
        assert!(text.contains("ok: 3 nodes reachable, 2 partitions"), "{text}");
        assert!(text.contains("jobs   0          1        1"), "{text}");
    }

    // Goal: an unreachable node and a partition no node serves fail the
    // status; a partition two nodes serve is only a warning. Method: node 3
    // unreachable, jobs/0 served by nobody (its leader was node 3), jobs/1
    // served by nodes 1 and 2 in the middle of a term change.
    #[test]
    fn flags_unreachable_no_leader_and_two_serving() {
        let status = aggregate(vec![
            scraped("a:1", &node(1, 1, 1, &[("jobs", 0, 3, 4, false), ("jobs", 1, 1, 6, true)])),
            scraped("a:2", &node(2, 1, 1, &[("jobs", 0, 0, 5, false), ("jobs", 1, 2, 7, true)])),
            ("a:3".to_owned(), Err("cannot reach the admin port a:3: refused".to_owned())),
        ]);
        assert_eq!(
            status.nodes[2].state,
            NodeState::Unreachable("cannot reach the admin port a:3: refused".to_owned())
        );
        let (zero, one) = (&status.partitions[0], &status.partitions[1]);
        assert_eq!((zero.state, zero.term), (Served::NoLeader, 5));
        assert_eq!(zero.leaders, BTreeMap::from([(3, 1)]));
        assert_eq!(one.state, Served::TwoServing);
        assert_eq!(one.serving, vec!["1".to_owned(), "2".to_owned()]);
        let failures = status.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures[0].starts_with("a:3 unreachable"));
        assert_eq!(failures[1], "jobs/0: no leader");
        assert_eq!(
            status.failure_summary().as_deref(),
            Some("cluster status: 1 of 3 nodes unreachable, 1 of 2 partitions without a leader")
        );
        let warnings = status.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("jobs/1: served by nodes 1,2"), "{warnings:?}");
        let output = render(&status);
        assert_eq!(output.json["healthy"], false);
        assert_eq!(output.json["nodes"][2]["reachable"], false);
        assert_eq!(output.json["partitions"][0]["state"], "no leader");
        let text = output.render(false);
        assert!(text.contains("unreachable"), "{text}");
        assert!(text.contains("FAIL jobs/0: no leader"), "{text}");
        assert!(text.contains("WARN jobs/1"), "{text}");
    }

    // Goal: the lag of a partition is the highest committed index any
    // replica reports minus the lowest applied index: a restarted follower
    // catching up shows it. Method: three nodes' index series for jobs/0,
    // node 3 folded to 400 of 1,000; jobs/1 without index series (an older
    // broker) has no lag.
    #[test]
    fn lag_is_the_highest_committed_minus_the_lowest_applied() {
        let indexes = |committed: u64, applied: u64| {
            format!(
                "spool_partition_committed_index{{queue=\"jobs\",partition=\"0\"}} {committed}\n\
                 spool_partition_applied_index{{queue=\"jobs\",partition=\"0\"}} {applied}\n"
            )
        };
        let with = |id: u64, serving: bool, committed: u64, applied: u64| {
            let text = node(id, 1, 1, &[("jobs", 0, 1, 2, serving), ("jobs", 1, 1, 2, false)]);
            text.replace("# EOF\n", &format!("{}# EOF\n", indexes(committed, applied)))
        };
        let status = aggregate(vec![
            scraped("a:1", &with(1, true, 1_000, 1_000)),
            scraped("a:2", &with(2, false, 990, 990)),
            scraped("a:3", &with(3, false, 400, 400)),
        ]);
        let (zero, one) = (&status.partitions[0], &status.partitions[1]);
        assert_eq!((zero.committed, zero.lag), (1_000, Some(600)));
        assert_eq!((one.committed, one.lag), (0, None));
        let output = render(&status);
        assert_eq!(output.json["partitions"][0]["lag_entries"], 600);
        assert!(output.json["partitions"][1]["lag_entries"].is_null());
        let text = output.render(false);
        assert!(text.contains("1000       600"), "{text}");
    }

    // Goal: `unreleased` is the committed index less the highest group
    // floor a replica reports (what every journal keeps for a member not
    // known to hold it), and a node's journal bytes sum over its shards.
    // Method: node 3 down (unreachable), the leader's group floor stuck at
    // 300 of 1,000 committed, a follower that heard 250; a node without
    // the series (an older broker) leaves it unknown.
    #[test]
    fn unreleased_is_the_committed_index_less_the_highest_group_floor() {
        let with = |id: u64, serving: bool, floor: Option<u64>| {
            let mut text = node(id, 1, 1, &[("jobs", 0, 1, 2, serving)]);
            let mut more = String::from(
                "spool_partition_committed_index{queue=\"jobs\",partition=\"0\"} 1000\n\
                 spool_journal_file_bytes{shard=\"0\"} 67108864\n\
                 spool_journal_file_bytes{shard=\"1\"} 33554432\n\
                 spool_journal_live_bytes{shard=\"0\"} 1048576\n",
            );
            if let Some(floor) = floor {
                more.push_str(&format!(
                    "spool_partition_group_floor_index{{queue=\"jobs\",partition=\"0\"}} {floor}\n"
                ));
            }
            text = text.replace("# EOF\n", &format!("{more}# EOF\n"));
            text
        };
        let status = aggregate(vec![
            scraped("a:1", &with(1, true, Some(300))),
            scraped("a:2", &with(2, false, Some(250))),
            ("a:3".to_owned(), Err("refused".to_owned())),
        ]);
        assert_eq!(status.partitions[0].unreleased, Some(700));
        let NodeState::Member(one) = &status.nodes[0].state else { panic!("not a member") };
        assert_eq!((one.journal_bytes, one.live_bytes), (96 << 20, 1 << 20));
        let output = render(&status);
        assert_eq!(output.json["partitions"][0]["unreleased_entries"], 700);
        assert_eq!(output.json["nodes"][0]["journal_bytes"], 96u64 << 20);
        let text = output.render(false);
        assert!(text.contains("96.0"), "{text}");
        assert!(text.contains("700"), "{text}");
        let older = aggregate(vec![scraped("a:1", &with(1, true, None))]);
        assert_eq!(older.partitions[0].unreleased, None);
    }

    // Goal: a node that has heard nothing for seconds from a peer it shares
    // partitions with is warned of (a peer down, or the peer link cut while
    // both admin ports answer); silence from a peer sharing nothing is
    // normal. Method: node 1 heard node 2 0.1 s ago and node 3 12.3 s ago
    // on shard 0 (4 groups each), node 3 0.2 s ago on shard 1 for nothing
    // (no group there); node 2 never heard node 4, which shares no group.
    #[test]
    fn a_silent_peer_sharing_partitions_is_warned_of() {
        let peers = |entries: &[(u32, u64, f64, u64)]| {
            let mut text = String::new();
            for (shard, peer, seconds, shared) in entries {
                let labels = format!("shard=\"{shard}\",peer=\"{peer}\"");
                text.push_str(&format!("spool_peer_silence_seconds{{{labels}}} {seconds}\n"));
                text.push_str(&format!("spool_peer_shared_groups{{{labels}}} {shared}\n"));
            }
            text
        };
        let one = node(1, 1, 1, &[]).replace(
            "# EOF\n",
            &format!("{}# EOF\n", peers(&[(0, 2, 0.1, 4), (0, 3, 12.3, 4), (1, 3, 0.2, 0)])),
        );
        let two = node(2, 1, 1, &[])
            .replace("# EOF\n", &format!("{}# EOF\n", peers(&[(0, 1, 0.1, 4), (0, 4, 100.0, 0)])));
        let status = aggregate(vec![scraped("a:1", &one), scraped("a:2", &two)]);
        let NodeState::Member(first) = &status.nodes[0].state else { panic!("not a member") };
        assert_eq!(first.peer_silence_ms, BTreeMap::from([(2, 100), (3, 12_300)]));
        let warnings = status.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("node 1 has received nothing from node 3 for 12.3 s"));
        assert!(status.failures().is_empty(), "silence alone fails nothing");
        let output = render(&status);
        assert_eq!(output.json["nodes"][0]["peer_silence_ms"]["3"], 12_300);
        let text = output.render(false);
        assert!(text.contains("3 (12.3 s)"), "{text}");
    }

    // Goal: a single node (no cluster series) says so and fails nothing;
    // an empty cluster (no partitions) is healthy. Method: a scrape with
    // only queue series, then a member with no partitions.
    #[test]
    fn single_node_is_not_in_a_cluster() {
        let single = "spool_ready_messages{queue=\"jobs\",partition=\"0\"} 5\n# EOF\n";
        let status = aggregate(vec![scraped("127.0.0.1:7480", single)]);
        assert_eq!(status.nodes[0].state, NodeState::NotInCluster);
        assert!(status.partitions.is_empty());
        assert!(status.failures().is_empty());
        assert!(status.warnings().is_empty());
        let output = render(&status);
        assert_eq!(output.json["in_cluster"], false);
        assert!(output.render(false).contains("not in a cluster"));

        let empty = aggregate(vec![scraped("a:1", &node(1, 0, 0, &[])), scraped("a:2", single)]);
        assert!(empty.failures().is_empty());
        assert_eq!(empty.warnings(), vec!["a:2 is not in a cluster".to_owned()]);
    }
}
