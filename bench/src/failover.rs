//! `failover`: leader killed → first acknowledged enqueue, over a cluster of
//! three `spoold` processes this run starts on one host.
//!
//! What it owns: the cluster ([`Cluster`]: a run directory holding the shared
//! 32-byte secret and, per node, its TOML config with a `[cluster]` table,
//! its data directory and its log; free loopback ports below the ephemeral
//! range), one queue of one partition (replication factor 3), a closed-loop
//! producer (one 1 KiB message at a time through `spool-client`, each
//! message retried under its own id until acknowledged, rotating over the
//! nodes as bootstrap), the rounds, and the drain that checks every
//! acknowledged id came back.
//!
//! A round: the node whose member serves partition 0 is found on the admin
//! ports (`spool_partition_serving`), the instant is taken and the node is
//! SIGKILLed; the failover time runs to the first acknowledgement of a send
//! that *started* after the kill (a reply the dead leader had already sent
//! is not counted). Beside it, the instant a survivor's `/metrics` first
//! says it serves (polled every [`PROBE`]) is the election as the broker
//! sees it. The killed node is then restarted on the same config, must
//! answer `/health/ready` with 200, know the serving node as the
//! partition's leader at its term, and hold at least the ready messages the
//! leader held when it came back (its member folded the log up to there)
//! before the next round.
//!
//! What it does not do: judge the figures, or touch the broker beyond its
//! processes, its admin port and the client API. Every wait is bounded. A
//! round whose wait runs out stops the run: the rounds so far are reported,
//! the drain still runs (within one wait) and the exit code is 1. On any
//! failure every `spoold` it started is stopped or killed (by its pid) and
//! the run directory is kept with the logs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::{instant_now, Instant};
use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    default_queue_config, Admin, ClaimOptions, Client, ClientConfig, ConnectionConfig, Delivery,
    Message, Producer, ProducerConfig,
};
use spool_wire::limits::PAYLOAD_INLINE_BYTES_MAX;
use thiserror::Error;

use crate::harness::{client_runtime, error_name, sibling_spoold, HarnessError};

/// Nodes of the cluster (replication factor 3, three controller voters).
pub const NODES: usize = 3;
/// Most rounds of one run.
pub const KILLS_MAX: u64 = 10_000;
/// Longest bound of a wait (s).
pub const WAIT_S_MAX: u64 = 3_600;
const QUEUE: &str = "failover";
/// Ports of a node of one shard: client, peer, controller (peer + 1), admin.
const PORTS_PER_NODE: u16 = 4;
/// Ports are drawn from here: under Linux's ephemeral range (32768–60999),
/// so no outgoing connection of this host takes one while a node is down.
const PORTS_LOW: u16 = 20_000;
const PORTS_HIGH: u16 = 32_000;
/// Pause between two probes of a bounded wait.
const PROBE: Duration = Duration::from_millis(20);
/// Connect, read and write bound of one admin-port request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `/metrics` page read.
const METRICS_PAGE_BYTES: u64 = 16 << 20;
/// Pause between the two dumps of the survivors' replica metrics when no
/// survivor took the lead.
const STATE_AGAIN: Duration = Duration::from_secs(2);
/// Lines of each node's log quoted in an error.
const LOG_TAIL_LINES: usize = 30;
/// Bytes of the cluster secret (the broker's `SECRET_BYTES`).
const SECRET_LEN: usize = 32;
/// How long a node may take to exit after SIGTERM at the end.
const STOP_WAIT: Duration = Duration::from_secs(30);
/// Bound of one send (the client's own bounds are below it: request
/// timeout, a leader wait of ≈ 7.5 s).
const SEND_TIMEOUT: Duration = Duration::from_secs(20);
/// Request and connect timeouts of the run's clients.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Lease of the drain's claims: a claim whose ack is lost comes back.
const DRAIN_LEASE_MS: u32 = 10_000;

/// What one run does: the `failover` subcommand's flags.
#[derive(Clone, Debug, clap::Args)]
pub struct FailoverConfig {
    /// Leader kills (rounds).
    #[arg(long, default_value_t = 50)]
    pub kills: u64,
    /// Parent of the run's directory `failover-<pid>/` (configs, data, logs).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// spoold binary to start [default: spoold next to this executable].
    #[arg(long)]
    pub spoold: Option<PathBuf>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub msg_bytes: u64,
    /// Pause after a failed send before the next attempt (ms).
    #[arg(long, default_value_t = 10)]
    pub retry_pause_ms: u64,
    /// Production before each kill once the cluster is whole again (ms).
    #[arg(long, default_value_t = 1_000)]
    pub settle_ms: u64,
    /// Bound of each wait: a start, a leader, the first ack after a kill, a
    /// restarted node ready and caught up (s).
    #[arg(long, default_value_t = 60)]
    pub wait_s: u64,
    /// Bound of the final drain (s).
    #[arg(long, default_value_t = 300)]
    pub drain_s: u64,
    /// Keep the run's directory (it is always kept when the run fails).
    #[arg(long)]
    pub keep: bool,
}

/// Percentiles of a series, in ms (nearest rank).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub min: f64,
    pub mean: f64,
}

/// One kill.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// The node killed (it served partition 0).
    pub killed: u32,
    /// The node serving partition 0 after the kill.
    pub new_leader: u32,
    /// Kill → first acknowledgement of a send started after it.
    pub failover_ms: f64,
    /// Kill → a survivor's `/metrics` first said it serves.
    pub elected_ms: f64,
    /// Failed sends between the kill and that acknowledgement.
    pub failed_sends: u64,
    /// Restart → ready, knowing the leader at its term, caught up.
    pub rejoin_ms: f64,
}

/// The report: one JSON object.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub nodes: usize,
    pub rounds: u64,
    /// Kill → first acknowledged enqueue.
    pub failover_ms: Percentiles,
    /// Kill → a survivor serves (the broker's side of the failover).
    pub elected_ms: Percentiles,
    /// Restart of the killed node → ready and caught up.
    pub rejoin_ms: Percentiles,
    pub msg_bytes: u64,
    /// Enqueues acknowledged over the whole run.
    pub acked: u64,
    /// Failed send attempts by kind (each is retried).
    pub send_errors: BTreeMap<String, u64>,
    /// Distinct ids the drain received.
    pub delivered: u64,
    /// Acknowledged ids the drain did not receive (must be 0).
    pub lost: u64,
    /// Deliveries beyond the first of an id.
    pub duplicates: u64,
    /// Ids delivered whose enqueue was never acknowledged (the send in
    /// flight when production stopped).
    pub unacked_delivered: u64,
    pub drain_errors: BTreeMap<String, u64>,
    pub drain_s: f64,
    /// The machine's load averages (1, 5, 15 min) at the start and the end.
    pub load_avg_start: [f64; 3],
    pub load_avg_end: [f64; 3],
    pub seconds: f64,
    /// Why the run stopped before its last round (every wait is bounded);
    /// `None` when every round ran. When set, `lost` counts what the drain
    /// did not find within its shortened bound (`--wait-s`): maybe not lost,
    /// maybe only out of reach of a partition without a leader.
    pub stopped: Option<String>,
    pub per_round: Vec<Round>,
}

/// Why a run produced no report.
#[derive(Debug, Error)]
pub enum FailoverError {
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("--{field} {value} is outside [{min}, {max}]")]
    Range { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{action} {}: {source}", path.display())]
    Dir {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
    #[error("no {0} consecutive free ports in [{PORTS_LOW}, {PORTS_HIGH})")]
    Ports(u16),
    #[error("{what} (run directory kept: {})\n{logs}", dir.display())]
    Stuck { what: String, dir: PathBuf, logs: String },
    #[error("{lost} of {acked} acknowledged messages were not delivered (report above)")]
    Lost { lost: u64, acked: u64 },
    #[error("stopped at {0} (report above; run directory kept)")]
    Stopped(String),
}

impl FailoverConfig {
    fn validate(&self) -> Result<(), FailoverError> {
        let check = |field, value, min, max| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(FailoverError::Range { field, value, min, max })
            }
        };
        check("kills", self.kills, 1, KILLS_MAX)?;
        check("msg-bytes", self.msg_bytes, 1, PAYLOAD_INLINE_BYTES_MAX as u64)?;
        check("retry-pause-ms", self.retry_pause_ms, 0, 10_000)?;
        check("settle-ms", self.settle_ms, 0, WAIT_S_MAX * 1_000)?;
        check("wait-s", self.wait_s, 1, WAIT_S_MAX)?;
        check("drain-s", self.drain_s, 1, WAIT_S_MAX)?;
        Ok(())
    }
}

/// Runs every round, then the drain.
///
/// # Errors
/// [`FailoverError`]: a node that does not start, a wait that ran out (with
/// every node's log tail), or the client runtime.
pub fn run(config: &FailoverConfig) -> Result<FailoverReport, FailoverError> {
    config.validate()?;
    let binary = match &config.spoold {
        Some(path) => path.clone(),
        None => sibling_spoold()?,
    };
    let load_avg_start = load_avg();
    let started = instant_now();
    let dir = config.dir.join(format!("failover-{}", std::process::id()));
    let mut cluster = Cluster::lay_out(&binary, &dir)?;
    let wait = Duration::from_secs(config.wait_s);
    let outcome = cluster.start(wait).and_then(|()| measure(config, &mut cluster));
    match outcome {
        Ok(mut report) => {
            cluster.stop();
            if !config.keep && report.stopped.is_none() {
                std::fs::remove_dir_all(&dir).map_err(|source| FailoverError::Dir {
                    action: "cannot remove",
                    path: dir.clone(),
                    source,
                })?;
            }
            report.load_avg_start = load_avg_start;
            report.load_avg_end = load_avg();
            report.seconds = instant_now().duration_since(started).as_secs_f64();
            Ok(report)
        }
        Err(error) => {
            cluster.kill_all();
            Err(error)
        }
    }
}

/// One round: a kill once the producer runs, the measurement, the restart.
fn one_round(
    config: &FailoverConfig,
    cluster: &mut Cluster,
    shared: &Mutex<Shared>,
) -> Result<Round, FailoverError> {
    let wait = Duration::from_secs(config.wait_s);
    std::thread::sleep(Duration::from_millis(config.settle_ms));
    cluster.wait_progress(shared, wait)?;
    let leader = cluster.serving_node(wait)?;
    let measured = cluster.kill_and_measure(leader, shared, wait)?;
    let rejoin_started = instant_now();
    cluster.restart(leader, wait)?;
    cluster.wait_caught_up(leader, wait)?;
    Ok(Round { rejoin_ms: ms(instant_now().duration_since(rejoin_started)), ..measured })
}

/// The rounds and the drain, on a started cluster.
fn measure(
    config: &FailoverConfig,
    cluster: &mut Cluster,
) -> Result<FailoverReport, FailoverError> {
    let wait = Duration::from_secs(config.wait_s);
    let runtime = client_runtime(2).map_err(FailoverError::Runtime)?;
    let addrs = cluster.client_addrs();
    let created = runtime.block_on(create_queue(&addrs, wait));
    created.map_err(|last| cluster.stuck(format!("queue not created within {wait:?}: {last}")))?;
    cluster.serving_node(wait)?;

    let shared = Arc::new(Mutex::new(Shared::default()));
    let producer = runtime.spawn(produce(
        addrs.clone(),
        Arc::clone(&shared),
        vec![0xa5; config.msg_bytes as usize],
        Duration::from_millis(config.retry_pause_ms),
    ));
    cluster.wait_progress(&shared, wait)?;

    let mut rounds = Vec::new();
    let mut stopped = None;
    for round in 1..=config.kills {
        let done = match one_round(config, cluster, &shared) {
            Ok(done) => done,
            Err(error) => {
                // The rounds so far still count, and the drain still checks
                // what was acknowledged: the report says where it stopped.
                eprintln!("spool-bench failover: round {round} stopped the run: {error}");
                let first = error.to_string().lines().next().unwrap_or_default().to_owned();
                stopped = Some(format!("round {round}: {first}"));
                break;
            }
        };
        eprintln!(
            "failover {round}/{}: node {} killed, node {} serves after {:.0} ms, first ack after \
             {:.0} ms ({} failed sends); node {} back in {:.1} s",
            config.kills,
            done.killed,
            done.new_leader,
            done.elected_ms,
            done.failover_ms,
            done.failed_sends,
            done.killed,
            done.rejoin_ms / 1_000.0
        );
        rounds.push(done);
    }

    lock(&shared).stop = true;
    let acked_ids = runtime
        .block_on(async { tokio::time::timeout(SEND_TIMEOUT * 2, producer).await })
        .map_err(|_| cluster.stuck("the producer did not stop".to_owned()))?
        .map_err(|error| cluster.stuck(format!("the producer task failed: {error}")))?;
    let (send_errors, acked) = {
        let state = lock(&shared);
        (state.errors.clone(), state.acked)
    };
    let owed: HashSet<MessageId> = acked_ids.iter().copied().collect();
    let drain_started = instant_now();
    // After a stop the partition may have no leader: the drain gets one wait.
    let drain_limit = match stopped {
        Some(_) => Duration::from_secs(config.drain_s.min(config.wait_s)),
        None => Duration::from_secs(config.drain_s),
    };
    let drained = runtime.block_on(drain(&addrs, &owed, drain_limit));
    let drain_s = instant_now().duration_since(drain_started).as_secs_f64();
    let lost = owed.iter().filter(|id| !drained.delivered.contains_key(id)).count() as u64;
    let duplicates = drained.delivered.values().map(|&count| count.saturating_sub(1)).sum();
    let unacked_delivered = drained.delivered.keys().filter(|id| !owed.contains(id)).count() as u64;

    let series = |pick: fn(&Round) -> f64| percentiles(rounds.iter().map(pick).collect());
    Ok(FailoverReport {
        nodes: NODES,
        rounds: rounds.len() as u64,
        failover_ms: series(|round| round.failover_ms),
        elected_ms: series(|round| round.elected_ms),
        rejoin_ms: series(|round| round.rejoin_ms),
        msg_bytes: config.msg_bytes,
        acked,
        send_errors,
        delivered: drained.delivered.len() as u64,
        lost,
        duplicates,
        unacked_delivered,
        drain_errors: drained.errors,
        drain_s,
        load_avg_start: [0.0; 3],
        load_avg_end: [0.0; 3],
        seconds: 0.0,
        stopped,
        per_round: rounds,
    })
}

/// What the producer task and the rounds share.
#[derive(Debug, Default)]
struct Shared {
    stop: bool,
    /// The last kill's instant, set just before the signal.
    kill_at: Option<Instant>,
    /// The first acknowledgement of a send started after `kill_at`.
    first_ack_after_kill: Option<Instant>,
    failed_since_kill: u64,
    acked: u64,
    errors: BTreeMap<String, u64>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

fn client_config() -> ClientConfig {
    ClientConfig {
        connection: ConnectionConfig {
            request_timeout: REQUEST_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            ..ConnectionConfig::default()
        },
    }
}

/// The id of message `sequence` of this run.
fn message_id(sequence: u64) -> MessageId {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&std::process::id().to_le_bytes());
    id[4..12].copy_from_slice(&sequence.to_le_bytes());
    MessageId(id)
}

/// The closed-loop producer: message after message, each retried (same id)
/// until acknowledged, the bootstrap node rotated after every failure;
/// returns the acknowledged ids once `stop` is set.
async fn produce(
    addrs: Vec<String>,
    shared: Arc<Mutex<Shared>>,
    payload: Vec<u8>,
    retry_pause: Duration,
) -> Vec<MessageId> {
    let config = ProducerConfig {
        linger: Duration::ZERO,
        retries: 0,
        in_flight_per_partition: 1,
        ..ProducerConfig::default()
    };
    let mut producers: Vec<Option<Producer>> = addrs.iter().map(|_| None).collect();
    let mut node = 0;
    let mut sequence = 0u64;
    let mut acked = Vec::new();
    while !lock(&shared).stop {
        let id = message_id(sequence);
        let started = instant_now();
        let outcome = match &producers[node] {
            Some(producer) => {
                let message = Message::new(payload.clone()).id(id);
                match tokio::time::timeout(SEND_TIMEOUT, producer.send(QUEUE, message)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(error_name(&error).to_owned()),
                    Err(_) => Err("SEND_TIMEOUT".to_owned()),
                }
            }
            None => match Client::connect_with(&addrs[node], client_config()).await {
                Ok(client) => match Producer::new(client, config.clone()) {
                    Ok(producer) => {
                        producers[node] = Some(producer);
                        continue;
                    }
                    Err(error) => Err(format!("producer.{}", error_name(&error))),
                },
                Err(error) => Err(format!("connect.{}", error_name(&error))),
            },
        };
        let now = instant_now();
        let failed = {
            let mut state = lock(&shared);
            match outcome {
                Ok(()) => {
                    state.acked += 1;
                    if state.kill_at.is_some_and(|kill| started >= kill)
                        && state.first_ack_after_kill.is_none()
                    {
                        state.first_ack_after_kill = Some(now);
                    }
                    false
                }
                Err(kind) => {
                    *state.errors.entry(kind).or_insert(0) += 1;
                    state.failed_since_kill += 1;
                    true
                }
            }
        };
        if failed {
            node = (node + 1) % addrs.len();
            tokio::time::sleep(retry_pause).await;
        } else {
            acked.push(id);
            sequence += 1;
        }
    }
    for producer in producers.into_iter().flatten() {
        producer.close().await;
    }
    acked
}

/// Creates the queue (1 partition, replication factor 3 by default) through
/// one node after another until one succeeds or `wait` passes.
async fn create_queue(addrs: &[String], wait: Duration) -> Result<(), String> {
    let started = instant_now();
    let mut last = String::new();
    for addr in addrs.iter().cycle() {
        if instant_now().duration_since(started) > wait {
            break;
        }
        let client = match Client::connect_with(addr, client_config()).await {
            Ok(client) => client,
            Err(error) => {
                last = format!("connect {addr}: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        match Admin::new(client).create_queue(QUEUE, default_queue_config(1)).await {
            Ok(_) => return Ok(()),
            Err(error) if error.code() == Some(ErrorCode::QueueExists) => return Ok(()),
            Err(error) => {
                last = format!("create through {addr}: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Err(last)
}

struct Drained {
    delivered: HashMap<MessageId, u64>,
    errors: BTreeMap<String, u64>,
}

/// Claims and acks partition 0 until every id of `owed` came and one more
/// claim finds nothing, or `limit` passes.
async fn drain(addrs: &[String], owed: &HashSet<MessageId>, limit: Duration) -> Drained {
    let mut drained = Drained { delivered: HashMap::new(), errors: BTreeMap::new() };
    let started = instant_now();
    let mut client: Option<Client> = None;
    let mut node = 0;
    let mut missing = owed.len();
    let mut empty_after_all = 0;
    let options = ClaimOptions {
        worker: WorkerId(0xfa11),
        credits: 1024,
        max_bytes: 4 << 20,
        lease_ms: DRAIN_LEASE_MS,
        wait_ms: 300,
        subscription: None,
    };
    while instant_now().duration_since(started) < limit && empty_after_all < 2 {
        let Some(current) = &client else {
            match Client::connect_with(&addrs[node], client_config()).await {
                Ok(connected) => client = Some(connected),
                Err(error) => {
                    *drained
                        .errors
                        .entry(format!("connect.{}", error_name(&error)))
                        .or_insert(0) += 1;
                    node = (node + 1) % addrs.len();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            continue;
        };
        let batch = match current.claim(QUEUE, PartitionId(0), &options).await {
            Ok(batch) => batch,
            Err(error) => {
                *drained.errors.entry(format!("claim.{}", error_name(&error))).or_insert(0) += 1;
                client = None;
                node = (node + 1) % addrs.len();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if batch.deliveries.is_empty() {
            if missing == 0 {
                empty_after_all += 1;
            }
            continue;
        }
        empty_after_all = 0;
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        if let Err(error) = current.ack(QUEUE, PartitionId(0), &tokens).await {
            *drained.errors.entry(format!("ack.{}", error_name(&error))).or_insert(0) += 1;
        }
        for delivery in &batch.deliveries {
            let count = drained.delivered.entry(delivery.message_id()).or_insert(0);
            if *count == 0 && owed.contains(&delivery.message_id()) {
                missing -= 1;
            }
            *count += 1;
        }
    }
    drained
}

/// One node of the cluster.
struct Node {
    id: u32,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    admin_port: u16,
    child: Option<Child>,
}

impl Node {
    fn config_path(&self) -> PathBuf {
        self.dir.join("spoold.toml")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("spoold.log")
    }

    fn admin_addr(&self) -> String {
        format!("127.0.0.1:{}", self.admin_port)
    }

    /// The last [`LOG_TAIL_LINES`] lines of its log.
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let _ = file.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    /// This node's gauge `name` of partition 0, from its `/metrics`.
    fn gauge(&self, name: &str) -> Option<f64> {
        let (status, page) = http_get(&self.admin_addr(), "/metrics").ok()?;
        (status == 200).then(|| partition_gauge(&page, name, QUEUE, 0)).flatten()
    }
}

/// Three `spoold` children; every one still running is SIGKILLed on drop.
struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl Cluster {
    /// The run directory: the secret, and per node its config and data.
    fn lay_out(binary: &Path, dir: &Path) -> Result<Self, FailoverError> {
        let dir_error = |action, path: &Path| {
            let path = path.to_owned();
            move |source| FailoverError::Dir { action, path, source }
        };
        std::fs::create_dir_all(dir).map_err(dir_error("cannot create", dir))?;
        let secret = dir.join("cluster.secret");
        write_secret(&secret).map_err(dir_error("cannot write", &secret))?;
        let base = free_ports(PORTS_PER_NODE * NODES as u16)?;
        let nodes: Vec<Node> = (0..NODES as u16)
            .map(|index| {
                let block = base + index * PORTS_PER_NODE;
                Node {
                    id: u32::from(index) + 1,
                    dir: dir.join(format!("n{}", index + 1)),
                    client_port: block,
                    peer_port: block + 1,
                    admin_port: block + 3,
                    child: None,
                }
            })
            .collect();
        let mut table = String::new();
        for (node, domain) in nodes.iter().zip(["a", "b", "c"]) {
            table.push_str(&format!(
                "  {{ id = {}, client = \"127.0.0.1:{}\", peer = \"127.0.0.1:{}\", \
                 failure_domain = \"{domain}\" }},\n",
                node.id, node.client_port, node.peer_port
            ));
        }
        for node in &nodes {
            let data = node.dir.join("data");
            std::fs::create_dir_all(&data).map_err(dir_error("cannot create", &data))?;
            let text = format!(
                "listen = \"127.0.0.1:{client}\"\n\
                 admin_listen = \"127.0.0.1:{admin}\"\n\
                 data_dir = {data:?}\n\
                 cores = 1\n\
                 segment_bytes = 8388608\n\
                 memory_bytes = 536870912\n\
                 log_format = \"human\"\n\
                 \n[cluster]\n\
                 node_id = {id}\n\
                 secret_file = {secret:?}\n\
                 nodes = [\n{table}]\n",
                client = node.client_port,
                admin = node.admin_port,
                data = data.display().to_string(),
                id = node.id,
                secret = secret.display().to_string(),
            );
            let path = node.config_path();
            std::fs::write(&path, text).map_err(dir_error("cannot write", &path))?;
        }
        Ok(Self { binary: binary.to_owned(), dir: dir.to_owned(), nodes })
    }

    fn client_addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.client_port)).collect()
    }

    /// An error naming what did not happen, with every node's log tail.
    fn stuck(&self, what: String) -> FailoverError {
        let mut logs = String::new();
        for node in &self.nodes {
            logs.push_str(&format!(
                "---- node {} ({}), {} ----\n{}\n",
                node.id,
                if node.child.is_some() { "running" } else { "down" },
                node.log_path().display(),
                node.log_tail()
            ));
        }
        FailoverError::Stuck { what, dir: self.dir.clone(), logs }
    }

    /// Starts every node and waits until each answers `/health/ready`.
    fn start(&mut self, wait: Duration) -> Result<(), FailoverError> {
        for index in 0..self.nodes.len() {
            self.spawn(index)?;
        }
        for index in 0..self.nodes.len() {
            self.wait_ready(index, wait)?;
        }
        Ok(())
    }

    /// Runs node `index` (its log appended), dying with this process.
    fn spawn(&mut self, index: usize) -> Result<(), FailoverError> {
        let node = &mut self.nodes[index];
        let log_path = node.log_path();
        let log_error = |source| FailoverError::Dir {
            action: "cannot open the log",
            path: log_path.clone(),
            source,
        };
        let log =
            OpenOptions::new().create(true).append(true).open(&log_path).map_err(log_error)?;
        let mut command = Command::new(&self.binary);
        command
            .arg("--config")
            .arg(node.config_path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(log_error)?)
            .stderr(log);
        // The caller's environment must not configure the nodes.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with("SPOOL_")) {
                command.env_remove(name);
            }
        }
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only prctl(2), which is async-signal-safe. Nodes are spawned
        // from the main thread, so they die with this process.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| FailoverError::Dir {
            action: "cannot run",
            path: self.binary.clone(),
            source,
        })?;
        node.child = Some(child);
        Ok(())
    }

    /// Waits until node `index` answers `GET /health/ready` with 200.
    fn wait_ready(&mut self, index: usize, wait: Duration) -> Result<(), FailoverError> {
        let started = instant_now();
        loop {
            let node = &mut self.nodes[index];
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    node.child = None;
                    let what = format!("node {} exited with {status} while starting", node.id);
                    return Err(self.stuck(what));
                }
            }
            let last = match http_get(&node.admin_addr(), "/health/ready") {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("{status} {}", body.trim()),
                Err(error) => error,
            };
            if instant_now().duration_since(started) > wait {
                let what = format!("node {} not ready within {wait:?}: {last}", node.id);
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
    }

    /// The running nodes' indexes.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&index| self.nodes[index].child.is_some())
    }

    /// The running node whose member serves partition 0, if exactly one says so.
    fn probe_serving(&self) -> Option<usize> {
        let serving: Vec<usize> = self
            .running()
            .filter(|&index| self.nodes[index].gauge("spool_partition_serving") == Some(1.0))
            .collect();
        (serving.len() == 1).then(|| serving[0])
    }

    /// [`probe_serving`](Self::probe_serving) until it finds one (bounded).
    fn serving_node(&self, wait: Duration) -> Result<usize, FailoverError> {
        let started = instant_now();
        loop {
            if let Some(index) = self.probe_serving() {
                return Ok(index);
            }
            if instant_now().duration_since(started) > wait {
                let what = format!("no node serves {QUEUE}/0 within {wait:?}");
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
    }

    /// Waits until the producer has one more acknowledgement (bounded).
    fn wait_progress(&self, shared: &Mutex<Shared>, wait: Duration) -> Result<(), FailoverError> {
        let before = lock(shared).acked;
        let started = instant_now();
        while lock(shared).acked == before {
            if instant_now().duration_since(started) > wait {
                let errors = lock(shared).errors.clone();
                let what = format!("no enqueue acknowledged within {wait:?}; errors {errors:?}");
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
        Ok(())
    }

    /// SIGKILLs node `leader` and waits for the first acknowledgement of a
    /// send started after it and for a survivor to serve (bounded).
    fn kill_and_measure(
        &mut self,
        leader: usize,
        shared: &Mutex<Shared>,
        wait: Duration,
    ) -> Result<Round, FailoverError> {
        let killed_at = {
            let mut state = lock(shared);
            let now = instant_now();
            state.kill_at = Some(now);
            state.first_ack_after_kill = None;
            state.failed_since_kill = 0;
            now
        };
        self.kill(leader);
        let mut elected: Option<(usize, Instant)> = None;
        loop {
            if elected.is_none() {
                elected = self.probe_serving().map(|index| (index, instant_now()));
            }
            let (acked_at, failed_sends) = {
                let state = lock(shared);
                (state.first_ack_after_kill, state.failed_since_kill)
            };
            if let (Some(acked_at), Some((index, elected_at))) = (acked_at, elected) {
                return Ok(Round {
                    killed: self.nodes[leader].id,
                    new_leader: self.nodes[index].id,
                    failover_ms: ms(acked_at.duration_since(killed_at)),
                    elected_ms: ms(elected_at.duration_since(killed_at)),
                    failed_sends,
                    rejoin_ms: 0.0,
                });
            }
            if instant_now().duration_since(killed_at) > wait {
                let errors = lock(shared).errors.clone();
                let first = self.replica_state();
                std::thread::sleep(STATE_AGAIN);
                let what = format!(
                    "after node {} was killed: first ack {}, a survivor serving {} within \
                     {wait:?}; send errors so far {errors:?}\nthe survivors' replica metrics \
                     then:\n{first}and {STATE_AGAIN:?} later:\n{}",
                    self.nodes[leader].id,
                    if acked_at.is_some() { "seen" } else { "not seen" },
                    if elected.is_some() { "seen" } else { "not seen" },
                    self.replica_state(),
                );
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
    }

    /// Every running node's `spool_partition_*` and `spool_replica_*`
    /// lines, for an error.
    fn replica_state(&self) -> String {
        let mut text = String::new();
        for index in self.running() {
            let node = &self.nodes[index];
            text.push_str(&format!("  node {}:\n", node.id));
            match http_get(&node.admin_addr(), "/metrics") {
                Ok((_, page)) => {
                    let lines = page.lines().filter(|line| {
                        line.starts_with("spool_partition_")
                            || line.starts_with("spool_replica_")
                            || line.starts_with("spool_ready_messages{")
                    });
                    for line in lines {
                        text.push_str(&format!("    {line}\n"));
                    }
                }
                Err(error) => text.push_str(&format!("    /metrics: {error}\n")),
            }
        }
        text
    }

    /// SIGKILL node `index` and reap it.
    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn kill_all(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
    }

    /// Starts node `index` again on its config once its ports can be bound
    /// (a dead process's sockets go asynchronously), and waits until ready.
    fn restart(&mut self, index: usize, wait: Duration) -> Result<(), FailoverError> {
        let node = &self.nodes[index];
        let ports = node.client_port..node.client_port + PORTS_PER_NODE;
        let started = instant_now();
        while !ports.clone().all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            if instant_now().duration_since(started) > wait {
                let what = format!("ports {ports:?} of node {} still busy after {wait:?}", node.id);
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
        self.spawn(index)?;
        self.wait_ready(index, wait)
    }

    /// Waits until node `index` names as partition 0's leader the running
    /// node that serves it, at that node's term, and its member's queue
    /// state holds at least the ready messages the leader held when the
    /// wait began (no consumer runs: the count only grows), so the next
    /// kill leaves a survivor that has caught up.
    fn wait_caught_up(&self, index: usize, wait: Duration) -> Result<(), FailoverError> {
        let started = instant_now();
        let mut target: Option<f64> = None;
        let mut last = String::from("no node serves");
        loop {
            let node = &self.nodes[index];
            if let Some(serving) = self.probe_serving() {
                let leader = &self.nodes[serving];
                if target.is_none() {
                    target = leader.gauge("spool_ready_messages");
                }
                let known = node.gauge("spool_partition_leader");
                let term = node.gauge("spool_partition_term");
                let ready = node.gauge("spool_ready_messages");
                let leader_term = leader.gauge("spool_partition_term");
                let caught_up =
                    matches!((ready, target), (Some(ready), Some(target)) if ready >= target);
                if known == Some(f64::from(leader.id))
                    && term.is_some()
                    && term == leader_term
                    && caught_up
                {
                    return Ok(());
                }
                last = format!(
                    "it names leader {known:?} at term {term:?} and holds {ready:?} ready \
                     messages; node {} serves at term {leader_term:?} and held {target:?}",
                    leader.id
                );
            }
            if instant_now().duration_since(started) > wait {
                let what = format!(
                    "node {} did not catch up within {wait:?}: {last}\nreplica metrics:\n{}",
                    node.id,
                    self.replica_state()
                );
                return Err(self.stuck(what));
            }
            std::thread::sleep(PROBE);
        }
    }

    /// SIGTERM every node, a bounded wait, SIGKILL what is left.
    fn stop(&mut self) {
        for node in &self.nodes {
            if let Some(child) = &node.child {
                if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                    // SAFETY: kill(2) on the pid of our own child, not yet reaped.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
            }
        }
        let started = instant_now();
        for node in &mut self.nodes {
            let Some(mut child) = node.child.take() else { continue };
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        eprintln!("spool-bench failover: node {} exited with {status}", node.id);
                        break;
                    }
                    Ok(None) if instant_now().duration_since(started) < STOP_WAIT => {
                        std::thread::sleep(PROBE);
                    }
                    _ => {
                        eprintln!(
                            "spool-bench failover: node {} still running {STOP_WAIT:?} after \
                             SIGTERM; killed",
                            node.id
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// 32 bytes of the kernel's random source into `path` (mode 0600).
fn write_secret(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut secret = [0u8; SECRET_LEN];
    File::open("/dev/urandom")?.read_exact(&mut secret)?;
    let mut file =
        OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(&secret)
}

/// A base port whose next `count` ports can be bound now, drawn at random
/// from [`PORTS_LOW`, `PORTS_HIGH`) so parallel runs do not collide.
fn free_ports(count: u16) -> Result<u16, FailoverError> {
    const ATTEMPTS: u32 = 200;
    for _ in 0..ATTEMPTS {
        let base = rand::random_range(PORTS_LOW..PORTS_HIGH - count);
        if (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return Ok(base);
        }
    }
    Err(FailoverError::Ports(count))
}

/// `GET path` on `addr` (HTTP/1.0): the status and the (de-chunked) body,
/// or why there is none.
fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let socket: SocketAddr = addr.parse().map_err(|error| format!("{addr}: {error}"))?;
    let mut stream = TcpStream::connect_timeout(&socket, HTTP_TIMEOUT)
        .map_err(|error| format!("connect {addr}: {error}"))?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).map_err(|error| error.to_string())?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|error| format!("send: {error}"))?;
    let mut raw = Vec::new();
    stream
        .take(METRICS_PAGE_BYTES)
        .read_to_end(&mut raw)
        .map_err(|error| format!("read: {error}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no head: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    Ok((status, if chunked { dechunk(body) } else { body.to_owned() }))
}

/// The data of a chunked HTTP body (what is whole of it).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(rest.get(..size).unwrap_or_default());
        body = rest.get(size..).unwrap_or_default().trim_start_matches("\r\n");
    }
    out
}

/// The value of `name{…queue="queue",partition="partition"…}` in an
/// exposition page.
fn partition_gauge(page: &str, name: &str, queue: &str, partition: u32) -> Option<f64> {
    let queue_label = format!("queue=\"{queue}\"");
    let partition_label = format!("partition=\"{partition}\"");
    page.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.rsplit_once('}'))
        .find(|(labels, _)| {
            let has = |want: &str| labels.split(',').any(|label| label.trim() == want);
            has(&queue_label) && has(&partition_label)
        })
        .and_then(|(_, value)| value.split_whitespace().next()?.parse().ok())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// Nearest-rank percentiles of `values` (all zero when empty).
/// Nearest-rank percentiles of `values` (ms); all zero for none. Shared
/// with `takeover`.
pub fn percentiles(mut values: Vec<f64>) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    values.sort_by(f64::total_cmp);
    let rank = |quantile: f64| {
        let index = (quantile * values.len() as f64).ceil() as usize;
        values[index.clamp(1, values.len()) - 1]
    };
    Percentiles {
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        max: values[values.len() - 1],
        min: values[0],
        mean: values.iter().sum::<f64>() / values.len() as f64,
    }
}

/// The machine's load averages (1, 5, 15 min); NaN where unreadable.
fn load_avg() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text.split_whitespace().map(|field| field.parse().unwrap_or(f64::NAN));
    [(); 3].map(|()| fields.next().unwrap_or(f64::NAN))
}

/// The one-line human summary of a report.
pub fn summary(report: &FailoverReport) -> String {
    let stopped =
        report.stopped.as_ref().map_or(String::new(), |why| format!("; STOPPED at {why}"));
    format!(
        "spool-bench failover: {} kills of {} nodes: kill → first acknowledged enqueue p50 / p90 \
         / p99 / max {:.0} / {:.0} / {:.0} / {:.0} ms (a survivor serving p50 {:.0} ms); {} \
         acked, {} {}, {} duplicates; load {:.2} at the start{stopped}",
        report.rounds,
        report.nodes,
        report.failover_ms.p50,
        report.failover_ms.p90,
        report.failover_ms.p99,
        report.failover_ms.max,
        report.elected_ms.p50,
        report.acked,
        report.lost,
        if report.stopped.is_some() { "not drained (drain cut short)" } else { "lost" },
        report.duplicates,
        report.load_avg_start[0]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_gauge_reads_the_labelled_line_only() {
        // Goal: the exposition parser picks the queue's partition 0 line,
        // not another partition, another queue, or a longer metric name.
        let page = "# HELP spool_partition_serving x\n\
            spool_partition_servings{shard=\"0\",queue=\"failover\",partition=\"0\"} 7\n\
            spool_partition_serving{shard=\"0\",queue=\"other\",partition=\"0\"} 5\n\
            spool_partition_serving{shard=\"0\",queue=\"failover\",partition=\"10\"} 4\n\
            spool_partition_serving{shard=\"0\",queue=\"failover\",partition=\"0\"} 1\n";
        assert_eq!(partition_gauge(page, "spool_partition_serving", "failover", 0), Some(1.0));
        assert_eq!(partition_gauge(page, "spool_partition_serving", "failover", 10), Some(4.0));
        assert_eq!(partition_gauge(page, "spool_partition_leader", "failover", 0), None);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let figures = percentiles(values);
        assert_eq!((figures.p50, figures.p90, figures.p99, figures.max), (50.0, 90.0, 99.0, 100.0));
        let one = percentiles(vec![3.0]);
        assert_eq!((one.p50, one.p99, one.min), (3.0, 3.0, 3.0));
    }

    #[test]
    fn dechunk_joins_the_chunks() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
