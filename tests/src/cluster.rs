//! A cluster of real `spoold` processes on 127.0.0.1 ([`Cluster`]): one
//! temporary root holding the shared 32-byte secret and, per node, its
//! config file (a `[cluster]` table naming every node), its data directory
//! and its log (stdout and stderr, appended across restarts).
//!
//! Ports: one run of free consecutive ports is reserved for the whole
//! cluster and cut into a block per node: its client ports (shard *i* on
//! base + *i*), its peer ports (shard *i* on base + *i*, the controller on
//! base + the shard count) and its admin port, so parallel tests do not
//! collide and every admin port is distinct. A port taken by someone else
//! between the probe and the bind (a node exits with code 5 during the
//! first start) restarts the whole cluster on other ports.
//!
//! A node is killed with SIGKILL ([`Cluster::kill`], or every node at the
//! same moment with [`Cluster::kill_all_at_once`]) and restarted on the
//! same directory, ports and config ([`Cluster::restart`],
//! [`Cluster::restart_all`]). Dropping the cluster kills every node it
//! started, and only those; a panicking test prints every node's log tail.
//! Every wait is bounded.
//!
//! [`ClusterOptions`] sets the node count, shards, replication factor and
//! controller voters, and peer TLS: a CA made at start (rcgen) and per node
//! a certificate naming it by the DNS name `node-<id>`, set as the
//! `[cluster]` table's `peer_tls_*_file`s. [`Cluster::set_peer_certificate`]
//! replaces a node's certificate by a wrong one (naming another node, or
//! signed by another CA) for the tests of refusal.
//!
//! The client side of the cluster tests is here too: a client with short
//! timeouts ([`client_at`]), who leads each partition by every node's
//! metrics ([`Cluster::serving`], [`Cluster::wait_led`]), a keyed producer
//! ([`produce`]) and a drain that claims and acks until every owed message
//! was seen ([`drain`]).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{DeliveryToken, PartitionId, QueueConfig, WorkerId};
use spool_client::{
    partition_for_key, Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig,
    Delivery, Message, Producer, ProducerConfig, SendFuture,
};
use tempfile::TempDir;

use crate::fault::message_id;

use crate::netcut::PeerRelay;
use crate::{
    now, reserve_ports, send_signal, spawn_lasting, spoold_bin, spoold_failpoints_bin,
    BROKER_STARTUP_TIMEOUT_MS, EXIT_PORT_IN_USE, FAILPOINTS_ENV, PORTS_RELEASE_TIMEOUT,
    SEGMENT_BYTES_TEST, START_TIMEOUT,
};

/// Bytes of the cluster secret (the broker's `SECRET_BYTES`).
pub const CLUSTER_SECRET_BYTES: usize = 32;

/// How many times a first start is retried on other ports.
const START_ATTEMPTS_MAX: u32 = 3;

/// Most bytes of a node's log printed when a test fails (the tail).
const LOG_PRINT_BYTES_MAX: usize = 48 * 1024;

/// Pause between two probes of a bounded wait.
const PROBE_PAUSE: Duration = Duration::from_millis(20);

/// A node's log of one partition, by its metrics
/// (`spool_partition_{first,last,committed,applied}_index`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogIndexes {
    /// The first entry its log still holds (those below were let go of).
    pub first: u64,
    pub last: u64,
    pub committed: u64,
    pub applied: u64,
}

/// How a cluster is laid out: see [`ClusterOptions::new`] for the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Nodes (ids 1..=nodes).
    pub nodes: u32,
    /// Shards of every node (`cores`).
    pub cores: u16,
    /// `cluster.replication_factor`.
    pub replication_factor: u32,
    /// `cluster.controller_voters` (3 or 5: the first nodes by id vote, the
    /// others follow the catalog as learners).
    pub controller_voters: u32,
    /// Mutual TLS on the peer links, with a CA made for the cluster.
    pub peer_tls: bool,
    /// Peer links through a relay the test can cut
    /// ([`Cluster::cut_off`], `netcut.rs`).
    pub peer_relay: bool,
    /// `journal_retain_bytes` of every node (`None`: the broker's default).
    pub journal_retain_bytes: Option<u64>,
    /// `cluster.node_down_timeout_ms` (`None`: the broker's default).
    pub node_down_timeout_ms: Option<u64>,
}

impl ClusterOptions {
    /// `nodes` nodes of `cores` shards, replication factor 3, every node a
    /// controller voter, plain TCP between peers.
    pub fn new(nodes: u32, cores: u16) -> ClusterOptions {
        ClusterOptions {
            nodes,
            cores,
            replication_factor: 3,
            controller_voters: nodes,
            peer_tls: false,
            peer_relay: false,
            journal_retain_bytes: None,
            node_down_timeout_ms: None,
        }
    }

    /// The same with every node's `journal_retain_bytes` set.
    pub fn with_journal_retain_bytes(self, bytes: u64) -> ClusterOptions {
        ClusterOptions { journal_retain_bytes: Some(bytes), ..self }
    }

    /// The same with peer TLS on.
    pub fn with_peer_tls(self) -> ClusterOptions {
        ClusterOptions { peer_tls: true, ..self }
    }

    /// The same with the peer links through a relay the test can cut.
    pub fn with_peer_relay(self) -> ClusterOptions {
        ClusterOptions { peer_relay: true, ..self }
    }
}

/// A certificate a node may be given ([`Cluster::set_peer_certificate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerCertificate {
    /// Its own: `node-<its id>`, signed by the cluster's CA.
    Own,
    /// One naming node `id` instead, signed by the cluster's CA.
    NamingNode(u32),
    /// Its own name, signed by a CA the cluster does not trust.
    ForeignCa,
}

/// The cluster's peer CA.
struct PeerCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl std::fmt::Debug for PeerCa {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("PeerCa")
    }
}

impl PeerCa {
    fn new(name: &str) -> PeerCa {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed CA");
        PeerCa { cert, key }
    }

    /// A certificate whose only DNS name is `node-<named>`, as PEM: the
    /// certificate and its key.
    fn issue(&self, named: u32) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("node key");
        let mut params =
            rcgen::CertificateParams::new(vec![format!("node-{named}")]).expect("node parameters");
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("spool node {named}"));
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("sign node certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// One node: its id, ports and process.
#[derive(Debug)]
pub struct ClusterNode {
    id: u32,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    admin_port: u16,
    child: Option<Child>,
    starts: u32,
    /// Stopped with SIGSTOP ([`Cluster::pause`]): its process exists but
    /// answers nothing, so it is not asked.
    paused: bool,
    /// Failpoints armed at its next start (`spoold-failpoints` then runs).
    failpoints: Option<String>,
}

impl ClusterNode {
    /// Its data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The node id (1-based).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `127.0.0.1:port` of shard 0's client port.
    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Shard 0's client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// `127.0.0.1:port` of the admin port.
    pub fn admin_addr(&self) -> String {
        format!("127.0.0.1:{}", self.admin_port)
    }

    /// Whether its process runs (and is not paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some() && !self.paused
    }

    /// How many times it was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("spoold.toml")
    }

    fn peer_cert_path(&self) -> PathBuf {
        self.dir.join("peer.pem")
    }

    fn peer_key_path(&self) -> PathBuf {
        self.dir.join("peer.key")
    }

    /// The log file (every start appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("spoold.log")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        crate::read_log(&self.log_path())
    }

    fn log_tail(&self) -> String {
        crate::tail(&self.log(), LOG_PRINT_BYTES_MAX)
    }
}

/// A cluster of `spoold` processes on 127.0.0.1.
#[derive(Debug)]
pub struct Cluster {
    root: TempDir,
    options: ClusterOptions,
    cores: u16,
    peer_ca: Option<PeerCa>,
    nodes: Vec<ClusterNode>,
    /// The peer links' relay when the options ask for one, and the first
    /// of its ports.
    relay: Option<(PeerRelay, u16)>,
}

/// Why a cluster did not come up: the node, how it ended, its log.
#[derive(Debug)]
pub struct ClusterStartFailed {
    pub node: u32,
    pub status: Option<ExitStatus>,
    pub log: String,
}

impl std::fmt::Display for ClusterStartFailed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(
                formatter,
                "node {} exited during start ({status}):\n{}",
                self.node, self.log
            ),
            None => write!(
                formatter,
                "node {} did not accept within {START_TIMEOUT:?}:\n{}",
                self.node, self.log
            ),
        }
    }
}

impl ClusterStartFailed {
    /// Whether the node exited because one of its ports was taken: the
    /// client port's bind exits with `EXIT_PORT_IN_USE`, a peer listener's
    /// with the start-up code, naming the port.
    fn port_taken(&self) -> bool {
        self.status.is_some()
            && (self.status.and_then(|status| status.code()) == Some(EXIT_PORT_IN_USE)
                || self.log.contains("is already in use by another process"))
    }
}

/// A base port such that `base..base + count` are all free on 127.0.0.1
/// right now, below the kernel's ephemeral range when it leaves room (a
/// run inside it can be taken between this probe and the broker's bind by
/// any outgoing connection of a test running beside this one, and a peer
/// link keeps its port as long as it lives); the kernel's pick otherwise.
fn reserve_cluster_ports(count: u16) -> u16 {
    const LOWEST: u32 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    let span = ephemeral_start.saturating_sub(LOWEST + u32::from(count));
    if span < 1_000 {
        return reserve_ports(count);
    }
    for _ in 0..200 {
        let mut random = [0u8; 4];
        File::open("/dev/urandom")
            .and_then(|mut source| source.read_exact(&mut random))
            .expect("read /dev/urandom");
        let offset = u32::from_le_bytes(random) % span;
        let base = u16::try_from(LOWEST + offset).expect("below the ephemeral range");
        let mut held = Vec::new();
        let all_free = (0..count).all(|offset| {
            TcpListener::bind(("127.0.0.1", base + offset))
                .map(|listener| held.push(listener))
                .is_ok()
        });
        if all_free {
            return base;
        }
    }
    reserve_ports(count)
}

/// Whether every port of `ports` has a listening TCP socket on 127.0.0.1
/// (by `/proc/net/tcp`).
fn listening(ports: std::ops::RangeInclusive<u16>) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else { return true };
    let listening: HashSet<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let (address, port) = local.split_once(':')?;
            (state == "0A" && (address == "0100007F" || address == "00000000"))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect();
    ports.into_iter().all(|port| listening.contains(&port))
}

/// Ports one node takes with `cores` shards: client ports, peer ports and
/// the controller's, the admin port.
fn ports_per_node(cores: u16) -> u16 {
    2 * cores + 2
}

impl Cluster {
    /// Starts `nodes` nodes of `cores` shards each (replication factor and
    /// controller voters 3), and waits until every node accepts on every
    /// client port and its admin port. Panics with the failing node's log.
    pub fn start(nodes: u32, cores: u16) -> Cluster {
        Self::start_with(ClusterOptions {
            controller_voters: 3,
            ..ClusterOptions::new(nodes, cores)
        })
    }

    /// Starts the cluster `options` describe and waits until every node
    /// accepts on every client port and its admin port. Panics with the
    /// failing node's log.
    pub fn start_with(options: ClusterOptions) -> Cluster {
        match Self::try_start_with(options) {
            Ok(cluster) => cluster,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// [`start`](Self::start) that reports a node that did not come up.
    ///
    /// # Errors
    /// The first node that exited (other than for a taken port) or did not
    /// accept in time, with its log.
    pub fn try_start(nodes: u32, cores: u16) -> Result<Cluster, ClusterStartFailed> {
        Self::try_start_with(ClusterOptions {
            controller_voters: 3,
            ..ClusterOptions::new(nodes, cores)
        })
    }

    /// [`start_with`](Self::start_with) that reports a node that did not
    /// come up.
    ///
    /// # Errors
    /// As [`try_start`](Self::try_start).
    pub fn try_start_with(options: ClusterOptions) -> Result<Cluster, ClusterStartFailed> {
        assert!(
            options.nodes >= options.replication_factor && options.nodes >= 3,
            "a cluster of replication factor {} needs as many nodes, and at least 3",
            options.replication_factor
        );
        let root = tempfile::Builder::new().prefix("spool-cluster-").tempdir().expect("tempdir");
        write_secret(&root.path().join("cluster.secret"));
        let peer_ca = options.peer_tls.then(|| {
            let ca = PeerCa::new("spool test cluster CA");
            std::fs::write(root.path().join("peer-ca.pem"), ca.cert.pem()).expect("write the CA");
            ca
        });
        let mut cluster = Cluster {
            root,
            options,
            cores: options.cores,
            peer_ca,
            nodes: Vec::new(),
            relay: None,
        };
        for attempt in 1..=START_ATTEMPTS_MAX {
            cluster.lay_out(options.nodes);
            for index in 0..cluster.nodes.len() {
                cluster.spawn(index);
            }
            match cluster.wait_all_accepting() {
                Ok(()) => return Ok(cluster),
                Err(failure) if attempt < START_ATTEMPTS_MAX && failure.port_taken() => {
                    eprintln!("{failure}\nretrying the whole cluster on other ports");
                    cluster.kill_all();
                }
                Err(failure) => return Err(failure),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Reserves ports and writes every node's directory and config.
    fn lay_out(&mut self, count: u32) {
        let per_node = ports_per_node(self.cores);
        let count_u16 = u16::try_from(count).expect("node count fits u16");
        let base = reserve_cluster_ports(per_node * count_u16);
        self.nodes = (0..count_u16)
            .map(|index| {
                let block = base + index * per_node;
                let id = u32::from(index) + 1;
                let dir = self.root.path().join(format!("node{id}"));
                std::fs::create_dir_all(dir.join("data")).expect("node directory");
                ClusterNode {
                    id,
                    dir,
                    client_port: block,
                    peer_port: block + self.cores,
                    admin_port: block + 2 * self.cores + 1,
                    child: None,
                    starts: 0,
                    paused: false,
                    failpoints: None,
                }
            })
            .collect();
        self.relay = None;
        if self.options.peer_relay {
            let ports = self.relay_ports_per_pair() * count_u16 * count_u16;
            let base = reserve_cluster_ports(ports);
            let mut routes = Vec::new();
            for from in 0..self.nodes.len() {
                for to in (0..self.nodes.len()).filter(|&to| to != from) {
                    for offset in 0..self.relay_ports_per_pair() {
                        let listen = self.relay_port(base, from, to) + offset;
                        let target = self.nodes[to].peer_port + offset;
                        routes.push((self.nodes[from].id, self.nodes[to].id, listen, target));
                    }
                }
            }
            let relay = PeerRelay::start(&routes).expect("start the peer relay");
            self.relay = Some((relay, base));
        }
        for node in &self.nodes {
            std::fs::write(node.config_path(), self.config_text(node)).expect("write config");
        }
        if self.peer_ca.is_some() {
            for index in 0..self.nodes.len() {
                self.set_peer_certificate(index, PeerCertificate::Own);
            }
        }
    }

    /// Relay ports per directed pair of nodes: one per peer port of the
    /// target (its shards' and its controller's).
    fn relay_ports_per_pair(&self) -> u16 {
        self.cores + 1
    }

    /// The first relay port of the link from node index `from` to `to`.
    fn relay_port(&self, base: u16, from: usize, to: usize) -> u16 {
        let count = self.nodes.len();
        let pair = u16::try_from(from * count + to).expect("pair index fits u16");
        base + pair * self.relay_ports_per_pair()
    }

    /// Cuts node `index` off from every other node (the cluster runs with
    /// [`ClusterOptions::with_peer_relay`]): it keeps running and serving
    /// its clients, and hears nothing from its peers nor they from it.
    pub fn cut_off(&self, index: usize) {
        let (relay, _) = self.relay.as_ref().expect("the cluster runs with a peer relay");
        relay.cut_node(self.nodes[index].id);
    }

    /// Heals every cut of [`cut_off`](Self::cut_off).
    pub fn heal(&self) {
        let (relay, _) = self.relay.as_ref().expect("the cluster runs with a peer relay");
        relay.heal();
    }

    /// Arms `failpoints` (`SPOOL_FAILPOINTS` syntax) in node `index` from
    /// its next start, which then runs `spoold-failpoints`; `None` disarms.
    pub fn set_failpoints(&mut self, index: usize, failpoints: Option<&str>) {
        self.nodes[index].failpoints = failpoints.map(str::to_owned);
    }

    /// Writes node `index`'s peer certificate and key (read at its next
    /// start). Panics when the cluster runs without peer TLS.
    pub fn set_peer_certificate(&mut self, index: usize, certificate: PeerCertificate) {
        let ca = self.peer_ca.as_ref().expect("the cluster runs with peer TLS");
        let node = &self.nodes[index];
        let (cert, key) = match certificate {
            PeerCertificate::Own => ca.issue(node.id),
            PeerCertificate::NamingNode(other) => ca.issue(other),
            PeerCertificate::ForeignCa => {
                PeerCa::new("a CA the cluster does not trust").issue(node.id)
            }
        };
        std::fs::write(node.peer_cert_path(), cert).expect("write the node certificate");
        std::fs::write(node.peer_key_path(), key).expect("write the node key");
    }

    /// The TOML config of `node`.
    fn config_text(&self, node: &ClusterNode) -> String {
        let secret = self.root.path().join("cluster.secret");
        let mut text = format!(
            "listen = \"127.0.0.1:{client}\"\n\
             admin_listen = \"127.0.0.1:{admin}\"\n\
             data_dir = {data:?}\n\
             cores = {cores}\n\
             segment_bytes = {segment}\n\
             startup_timeout_ms = {startup}\n\
             log_format = \"human\"\n\
             \n[cluster]\n\
             node_id = {id}\n\
             replication_factor = {factor}\n\
             controller_voters = {voters}\n\
             secret_file = {secret:?}\n",
            client = node.client_port,
            admin = node.admin_port,
            data = node.dir.join("data").display().to_string(),
            cores = self.cores,
            segment = SEGMENT_BYTES_TEST,
            startup = BROKER_STARTUP_TIMEOUT_MS,
            id = node.id,
            factor = self.options.replication_factor,
            voters = self.options.controller_voters,
            secret = secret.display().to_string(),
        );
        if let Some(bytes) = self.options.journal_retain_bytes {
            // Before the [cluster] table: a top-level key.
            text = text.replacen(
                "\n[cluster]\n",
                &format!("journal_retain_bytes = {bytes}\n\n[cluster]\n"),
                1,
            );
        }
        if let Some(ms) = self.options.node_down_timeout_ms {
            text.push_str(&format!("node_down_timeout_ms = {ms}\n"));
        }
        if self.peer_ca.is_some() {
            text.push_str(&format!(
                "peer_tls_cert_file = {:?}\npeer_tls_key_file = {:?}\npeer_tls_ca_file = {:?}\n",
                node.peer_cert_path().display().to_string(),
                node.peer_key_path().display().to_string(),
                self.root.path().join("peer-ca.pem").display().to_string(),
            ));
        }
        text.push_str("nodes = [\n");
        let own =
            self.nodes.iter().position(|other| other.id == node.id).expect("a node of the cluster");
        for (index, other) in self.nodes.iter().enumerate() {
            let domain = char::from(b'a' + u8::try_from(index % 26).expect("index % 26 fits"));
            // Another node's peer ports, as this node reaches them: through
            // the relay when there is one.
            let peer = match &self.relay {
                Some((_, base)) if index != own => self.relay_port(*base, own, index),
                _ => other.peer_port,
            };
            text.push_str(&format!(
                "  {{ id = {}, client = \"127.0.0.1:{}\", peer = \"127.0.0.1:{}\", failure_domain = \"{domain}\" }},\n",
                other.id, other.client_port, peer
            ));
        }
        text.push_str("]\n");
        text
    }

    fn spawn(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        assert!(node.child.is_none(), "node {} already running", node.id);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.log_path())
            .expect("open node log");
        let binary = if node.failpoints.is_some() { spoold_failpoints_bin() } else { spoold_bin() };
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(node.config_path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        // The test environment must not configure the broker behind our back.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with("SPOOL_")) {
                command.env_remove(name);
            }
        }
        if let Some(failpoints) = &node.failpoints {
            command.env(FAILPOINTS_ENV, failpoints);
        }
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only prctl(2), which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        node.child = Some(spawn_lasting(command).expect("spawn spoold"));
        node.starts += 1;
    }

    /// Waits until node `index` accepts on every client port and its admin
    /// port, or exits, or [`START_TIMEOUT`] passes.
    fn wait_accepting(&mut self, index: usize) -> Result<(), ClusterStartFailed> {
        let cores = self.cores;
        let started = now();
        loop {
            let node = &mut self.nodes[index];
            let child = node.child.as_mut().expect("node was started");
            if let Some(status) = child.try_wait().expect("try_wait") {
                node.child = None;
                return Err(ClusterStartFailed {
                    node: node.id,
                    status: Some(status),
                    log: node.log_tail(),
                });
            }
            let ports = (0..cores).map(|shard| node.client_port + shard).chain([node.admin_port]);
            let accepting = ports.clone().all(|port| {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            });
            // The peer listeners (shards' and the controller's) are looked
            // up in the kernel's table rather than connected to: a probe
            // would be logged as a broken peer connection.
            let peers = node.peer_port..=node.peer_port + cores;
            if accepting && listening(peers) {
                return Ok(());
            }
            if started.elapsed() >= START_TIMEOUT {
                return Err(ClusterStartFailed {
                    node: node.id,
                    status: None,
                    log: node.log_tail(),
                });
            }
            // A bounded poll: the ports are probed again each time.
            std::thread::sleep(PROBE_PAUSE);
        }
    }

    fn wait_all_accepting(&mut self) -> Result<(), ClusterStartFailed> {
        for index in 0..self.nodes.len() {
            self.wait_accepting(index)?;
        }
        Ok(())
    }

    /// The nodes, in id order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Node `index` (0-based: node id `index + 1`).
    pub fn node(&self, index: usize) -> &ClusterNode {
        &self.nodes[index]
    }

    /// The index of the node whose shard serves clients on `port`.
    pub fn index_of_client_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|node| (node.client_port..node.client_port + self.cores).contains(&port))
    }

    /// The shard count of every node.
    pub fn cores(&self) -> u16 {
        self.cores
    }

    /// SIGKILL node `index`: it dies with whatever is in flight.
    pub fn kill(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let mut child = node.child.take().expect("node is not running");
        send_signal(&child, libc::SIGKILL);
        let _ = child.wait();
        node.paused = false;
    }

    /// SIGSTOP node `index`: to its peers and clients it is as if cut off
    /// (its sockets stay open, nothing is answered) until
    /// [`resume`](Self::resume). [`running`](Self::running) leaves it out
    /// meanwhile.
    pub fn pause(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        send_signal(node.child.as_ref().expect("node is not running"), libc::SIGSTOP);
        node.paused = true;
    }

    /// SIGCONT a node [`pause`](Self::pause) stopped: it goes on from where
    /// it was, with its timers late and its peers moved on.
    pub fn resume(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        send_signal(node.child.as_ref().expect("node is not running"), libc::SIGCONT);
        node.paused = false;
    }

    fn kill_all(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                send_signal(&child, libc::SIGKILL);
                let _ = child.wait();
            }
        }
    }

    /// SIGKILL every running node at the same moment (every signal is sent
    /// before any exit is waited for).
    pub fn kill_all_at_once(&mut self) {
        let mut children: Vec<Child> =
            self.nodes.iter_mut().filter_map(|node| node.child.take()).collect();
        for child in &children {
            send_signal(child, libc::SIGKILL);
        }
        for child in &mut children {
            let _ = child.wait();
        }
    }

    /// Starts every node that is not running again, all before waiting for
    /// any, and waits until each accepts.
    ///
    /// # Errors
    /// The first node that failed to come up, with its log.
    pub fn restart_all(&mut self) -> Result<(), ClusterStartFailed> {
        let stopped: Vec<usize> =
            (0..self.nodes.len()).filter(|&index| !self.nodes[index].is_running()).collect();
        for &index in &stopped {
            self.wait_ports_free(index);
        }
        for &index in &stopped {
            self.spawn(index);
        }
        for &index in &stopped {
            self.wait_accepting(index)?;
        }
        Ok(())
    }

    /// Indices of the nodes whose process runs.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&index| self.nodes[index].is_running()).collect()
    }

    /// Node `index`'s `GET /metrics` body.
    ///
    /// # Errors
    /// No answer, or not a 200.
    pub fn metrics(&self, index: usize) -> Result<String, String> {
        match try_http_get(&self.nodes[index].admin_addr(), "/metrics")? {
            (200, body) => Ok(body),
            (status, body) => Err(format!("/metrics answered {status}: {body}")),
        }
    }

    /// Node `index`'s replica of each partition of `queue` by its metrics:
    /// partition → (the leader it knows, 0 for none; whether it serves).
    /// A partition it holds no replica of is absent.
    ///
    /// # Errors
    /// As [`metrics`](Self::metrics).
    pub fn replicas(&self, index: usize, queue: &str) -> Result<HashMap<u32, (u64, bool)>, String> {
        let text = self.metrics(index)?;
        let mut found: HashMap<u32, (u64, bool)> = HashMap::new();
        for (name, labels, value) in text.lines().filter_map(metric_line) {
            if label(labels, "queue") != Some(queue) {
                continue;
            }
            let Some(partition) = label(labels, "partition").and_then(|p| p.parse().ok()) else {
                continue;
            };
            let entry = found.entry(partition).or_insert((0, false));
            match name {
                "spool_partition_leader" => entry.0 = value as u64,
                "spool_partition_serving" => entry.1 = value >= 1.0,
                _ => {}
            }
        }
        Ok(found)
    }

    /// Node `index`'s log of each partition of `queue` by its metrics:
    /// partition → [`LogIndexes`]. A partition it holds no replica of is
    /// absent.
    ///
    /// # Errors
    /// As [`metrics`](Self::metrics).
    pub fn indexes(&self, index: usize, queue: &str) -> Result<HashMap<u32, LogIndexes>, String> {
        let text = self.metrics(index)?;
        let mut found: HashMap<u32, LogIndexes> = HashMap::new();
        for (name, labels, value) in text.lines().filter_map(metric_line) {
            if label(labels, "queue") != Some(queue) {
                continue;
            }
            let Some(partition) = label(labels, "partition").and_then(|p| p.parse().ok()) else {
                continue;
            };
            let entry = found.entry(partition).or_default();
            match name {
                "spool_partition_first_index" => entry.first = value as u64,
                "spool_partition_last_index" => entry.last = value as u64,
                "spool_partition_committed_index" => entry.committed = value as u64,
                "spool_partition_applied_index" => entry.applied = value as u64,
                _ => {}
            }
        }
        Ok(found)
    }

    /// Which running node serves (leads) each of `partitions` of `queue`,
    /// by every running node's metrics: `None` for a partition no node
    /// serves, or that two claim to (an election under way).
    pub fn serving(&self, queue: &str, partitions: u32) -> Vec<Option<usize>> {
        let mut leaders: Vec<Vec<usize>> = vec![Vec::new(); partitions as usize];
        for index in self.running() {
            let Ok(replicas) = self.replicas(index, queue) else { continue };
            for (partition, (_, serving)) in replicas {
                if serving && partition < partitions {
                    leaders[partition as usize].push(index);
                }
            }
        }
        leaders.into_iter().map(|nodes| (nodes.len() == 1).then(|| nodes[0])).collect()
    }

    /// Waits up to `timeout` until every one of `partitions` of `queue` is
    /// served by exactly one running node; returns those nodes and how long
    /// it took. Blocking: call it from `block_in_place` in a test on tokio.
    ///
    /// # Errors
    /// What the nodes served when the time ran out.
    pub fn wait_led(
        &self,
        queue: &str,
        partitions: u32,
        timeout: Duration,
    ) -> Result<(Vec<usize>, Duration), String> {
        let started = now();
        loop {
            let serving = self.serving(queue, partitions);
            if serving.iter().all(Option::is_some) {
                return Ok((serving.into_iter().flatten().collect(), started.elapsed()));
            }
            if started.elapsed() >= timeout {
                return Err(format!(
                    "after {timeout:?} the partitions of {queue} are served by {serving:?} \
                     (node indices, None: no single leader)"
                ));
            }
            // A bounded poll: every node's metrics are read again each time.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts node `index` again on the same directory, ports and config
    /// once its ports are free, and waits until it accepts.
    ///
    /// # Errors
    /// How it failed to come up, with its log.
    pub fn restart(&mut self, index: usize) -> Result<(), ClusterStartFailed> {
        self.wait_ports_free(index);
        self.spawn(index);
        self.wait_accepting(index)
    }

    /// Waits until every port of node `index` can be bound again: the
    /// kernel tears down a dead process's io_uring (and the sockets
    /// registered with it) asynchronously.
    fn wait_ports_free(&self, index: usize) {
        let node = &self.nodes[index];
        let first = node.client_port;
        let last = node.admin_port;
        let started = now();
        loop {
            if (first..=last).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
                return;
            }
            assert!(
                started.elapsed() < PORTS_RELEASE_TIMEOUT,
                "ports {first}..={last} of node {} still busy {PORTS_RELEASE_TIMEOUT:?} after it exited",
                node.id
            );
            // A bounded poll: the ports are probed again each time.
            std::thread::sleep(PROBE_PAUSE);
        }
    }

    /// Waits up to `timeout` until node `index` answers `GET
    /// /health/ready` with 200; returns the last answer (status and body,
    /// or why there was none) as the error.
    ///
    /// # Errors
    /// The last answer seen when the time ran out.
    pub fn wait_ready(&self, index: usize, timeout: Duration) -> Result<(), String> {
        let addr = self.nodes[index].admin_addr();
        let started = now();
        loop {
            let last = try_http_get(&addr, "/health/ready");
            match &last {
                Ok((200, _)) => return Ok(()),
                _ if started.elapsed() >= timeout => {
                    return Err(format!("after {timeout:?}: {last:?}"));
                }
                // A bounded poll: readiness is asked again each time.
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Every node's log tail, headed by its id.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            text.push_str(&format!(
                "---- node {} log ({}, {} starts) ----\n{}\n",
                node.id,
                node.log_path().display(),
                node.starts,
                node.log_tail()
            ));
        }
        text
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking() {
            eprintln!("{}---- end of the cluster's logs ----", self.logs());
        }
    }
}

/// 32 bytes from the kernel's random source into `path`.
fn write_secret(path: &Path) {
    let mut secret = [0u8; CLUSTER_SECRET_BYTES];
    File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut secret))
        .expect("read /dev/urandom");
    let mut file = File::create(path).expect("create the secret file");
    file.write_all(&secret).expect("write the secret");
}

/// `GET path` on `addr` without panicking: the status and body, or why
/// there is none (not accepting yet, a broken answer).
///
/// # Errors
/// The transport error or the unparsable answer, in words.
pub fn try_http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let socket: SocketAddr = addr.parse().map_err(|error| format!("{addr}: {error}"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))
        .map_err(|error| format!("connect {addr}: {error}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|error| error.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|error| format!("send: {error}"))?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|error| format!("read: {error}"))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no head: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// One sample line of the Prometheus text: its name, its labels (between
/// the braces) and its value. Comments and other lines give `None`.
fn metric_line(line: &str) -> Option<(&str, &str, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    match head.split_once('{') {
        Some((name, labels)) => Some((name, labels.strip_suffix('}')?, value)),
        None => Some((head, "", value)),
    }
}

/// The value of label `name` in `labels` (`a="x",b="y"`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

// ---- The client side of the cluster tests ----

/// How long a client keeps trying to connect to a node that may still be
/// joining, and how long a node's metadata may take to list a queue.
pub const CLIENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a create keeps being sent while no controller leader is known.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(45);

/// `future`'s value, or a panic naming `what` after `limit`.
pub async fn bounded<T>(
    what: &str,
    limit: Duration,
    future: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} took more than {limit:?}"),
    }
}

/// Starts `options`, creates `queue` (`partitions`, a 30 s default lease,
/// 100 deliveries) through node 2 and waits up to `lead_timeout` until
/// every partition is led; returns the cluster and the leaders (node
/// indices). Panics on a step that fails.
pub async fn start_with_queue(
    options: ClusterOptions,
    queue: &str,
    partitions: u32,
    lead_timeout: Duration,
) -> (Cluster, Vec<usize>) {
    let started = now();
    let cluster = tokio::task::block_in_place(|| Cluster::start_with(options));
    for node in cluster.nodes() {
        eprintln!("node {}: client {}, admin {}", node.id(), node.client_addr(), node.admin_addr());
    }
    let config = crate::test_queue_config(partitions, 30_000, 100);
    let addr = cluster.node(1).client_addr();
    bounded("create", CREATE_TIMEOUT + Duration::from_secs(15), create_queue(&addr, queue, config))
        .await;
    let leaders = led(&cluster, queue, partitions, lead_timeout).await;
    eprintln!(
        "{} nodes up, {queue} led by {leaders:?} after {} ms",
        options.nodes,
        millis_since(started)
    );
    (cluster, leaders)
}

/// [`Cluster::wait_led`] from a test on tokio: the leaders, or a panic
/// naming what was served when `timeout` passed.
pub async fn led(cluster: &Cluster, queue: &str, partitions: u32, timeout: Duration) -> Vec<usize> {
    tokio::task::block_in_place(|| cluster.wait_led(queue, partitions, timeout))
        .unwrap_or_else(|last| panic!("{last}"))
        .0
}

/// A client bootstrapped on `addr` with short timeouts (10 s a request,
/// 3 s a connect), retrying the bootstrap for [`CLIENT_CONNECT_TIMEOUT`].
pub async fn client_at(addr: &str) -> Client {
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            ..ConnectionConfig::default()
        },
    };
    let started = now();
    loop {
        match Client::connect_with(addr, config.clone()).await {
            Ok(client) => return client,
            Err(error) if started.elapsed() < CLIENT_CONNECT_TIMEOUT => {
                eprintln!("connect {addr}: {error}; again");
                // A bounded poll: the node may still be joining.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("connect {addr}: {error}"),
        }
    }
}

/// Creates `queue` through `addr`, sending again while the cluster has no
/// controller leader for longer than the client's own bounded wait.
pub async fn create_queue(addr: &str, queue: &str, config: QueueConfig) {
    let admin = Admin::new(client_at(addr).await);
    let started = now();
    loop {
        match admin.create_queue(queue, config.clone()).await {
            Ok(version) => {
                eprintln!("{queue} created through {addr} (assignment version {version:?})");
                return;
            }
            Err(error @ ClientError::ControlRouteExhausted { .. })
                if started.elapsed() < CREATE_TIMEOUT =>
            {
                eprintln!("create through {addr}: {error}; again");
            }
            Err(error) => panic!("create {queue} through {addr}: {error}"),
        }
    }
}

/// Waits until `client`'s node lists `queue` with `partitions` partitions.
pub async fn wait_for_queue(client: &Client, queue: &str, partitions: u32) {
    let started = now();
    loop {
        let listed = match client.refresh_metadata(&[queue]).await {
            Ok(()) => client.partitions(queue).await.map(|found| found.len()),
            Err(error) => Err(error),
        };
        match listed {
            Ok(count) if count == partitions as usize => return,
            last if started.elapsed() >= CLIENT_CONNECT_TIMEOUT => {
                panic!("{} never listed {queue}: {last:?}", client.bootstrap())
            }
            // A bounded poll: the catalog reaches every node in its time.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A key that lands on `partition` of `partitions` (the client's keyed
/// placement).
pub fn key_for(partition: u32, partitions: u32) -> Vec<u8> {
    (0u32..)
        .map(|n| format!("key-{n}").into_bytes())
        .find(|key| partition_for_key(key, partitions).0 == partition)
        .expect("some key lands on every partition")
}

/// A producer on `client` whose retries outlast an election (1–2 s) and
/// the leader board catching up: ≈ 0.1 + 0.2 + ... capped at 2 s, ≈ 17 s.
pub fn producer_on(client: Client) -> Producer {
    let config = ProducerConfig {
        retries: 12,
        retry_backoff: Duration::from_millis(100),
        ..Default::default()
    };
    Producer::new(client, config).expect("producer")
}

/// Submits the messages `sequences` of `source` (ids by
/// [`message_id`]) to `queue`, partition by partition in turn by key, and
/// waits for every answer; returns the acknowledged ids and the failures'
/// texts.
pub async fn produce(
    producer: &Producer,
    queue: &str,
    partitions: u32,
    source: u32,
    sequences: std::ops::Range<u64>,
) -> (Vec<MessageId>, Vec<String>) {
    produce_padded(producer, queue, partitions, source, sequences, 0).await
}

/// [`produce`] with `pad` more bytes in each payload.
pub async fn produce_padded(
    producer: &Producer,
    queue: &str,
    partitions: u32,
    source: u32,
    sequences: std::ops::Range<u64>,
    pad: usize,
) -> (Vec<MessageId>, Vec<String>) {
    let keys: Vec<Vec<u8>> = (0..partitions).map(|p| key_for(p, partitions)).collect();
    let mut pending: Vec<(MessageId, SendFuture)> = Vec::new();
    let mut failed = Vec::new();
    for sequence in sequences {
        let id = message_id(source, sequence);
        let key = keys[(sequence % u64::from(partitions)) as usize].clone();
        let message = Message::new(format!("message {sequence}{:>pad$}", "")).key(key).id(id);
        match producer.submit(queue, message).await {
            Ok(future) => pending.push((id, future)),
            Err(error) => failed.push(format!("submit {sequence}: {error}")),
        }
    }
    let mut acked = Vec::new();
    for (id, future) in pending {
        match future.await {
            Ok(_) => acked.push(id),
            Err(error) => failed.push(format!("{id:?}: {error}")),
        }
    }
    (acked, failed)
}

/// Panics when any send failed, naming the first few.
pub fn assert_all_sent(step: &str, failed: &[String]) {
    assert!(
        failed.is_empty(),
        "{step}: {} sends failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

/// Claim options of the tests' one worker: up to `credits` messages
/// leased for `lease_ms`, waiting up to 300 ms for one.
pub fn claim_options(credits: u32, lease_ms: u32) -> ClaimOptions {
    ClaimOptions {
        worker: WorkerId(0xd7a1),
        credits,
        max_bytes: 4 << 20,
        lease_ms,
        wait_ms: 300,
        subscription: None,
    }
}

/// Claims from `partition` through `client` until `want` deliveries were
/// gathered or `timeout` passed (claim errors are retried: a leader may be
/// being elected); returns what was claimed, not acked.
pub async fn claim_some(
    client: &Client,
    queue: &str,
    partition: u32,
    want: usize,
    lease_ms: u32,
    timeout: Duration,
) -> Vec<Delivery> {
    let started = now();
    let mut claimed = Vec::new();
    while claimed.len() < want && started.elapsed() < timeout {
        let credits = u32::try_from(want - claimed.len()).unwrap_or(u32::MAX);
        match client.claim(queue, PartitionId(partition), &claim_options(credits, lease_ms)).await {
            Ok(batch) => claimed.extend(batch.deliveries),
            Err(error) => {
                eprintln!("claim {queue}/{partition}: {error}; again");
                // A bounded pause: a leader may be being elected.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    claimed
}

/// Acks `tokens` of `partition` through `client`, sending again (for up to
/// `timeout`) while the answer is no answer at all (a leader being
/// elected, a connection to a dead node); returns the last outcome.
pub async fn ack_settled(
    client: &Client,
    queue: &str,
    partition: u32,
    tokens: &[DeliveryToken],
    timeout: Duration,
) -> Result<(), ClientError> {
    let started = now();
    loop {
        match client.ack(queue, PartitionId(partition), tokens).await {
            Ok(()) => return Ok(()),
            Err(error @ ClientError::AckRefused { .. }) => return Err(error),
            Err(error) if started.elapsed() < timeout => {
                eprintln!("ack {queue}/{partition}: {error}; again");
                // A bounded pause: a leader may be being elected.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Claims and acks everything on every partition through `client` until
/// every id of `owed` was delivered (and its ack not refused) and two more
/// sweeps find nothing, or `timeout` passes; returns those ids with their
/// counts and the errors met on the way. Leases of `lease_ms`: a claim whose ack is lost
/// comes back after it.
pub async fn drain(
    client: &Client,
    queue: &str,
    partitions: u32,
    owed: &HashSet<MessageId>,
    timeout: Duration,
) -> (HashMap<MessageId, usize>, Vec<String>) {
    let mut delivered: HashMap<MessageId, usize> = HashMap::new();
    let mut errors = Vec::new();
    let started = now();
    let mut idle_after_all = 0;
    while started.elapsed() < timeout && idle_after_all < 2 {
        let mut found = false;
        // Once every owed message was seen, the sweeps that look for more
        // wait less for one.
        let seen_all = owed.iter().all(|id| delivered.contains_key(id));
        for partition in 0..partitions {
            let mut options = claim_options(1024, DRAIN_LEASE_MS);
            if seen_all {
                options.wait_ms = 100;
            }
            let batch = match client.claim(queue, PartitionId(partition), &options).await {
                Ok(batch) => batch,
                Err(error) => {
                    errors.push(format!("claim {partition}: {error}"));
                    // A bounded pause: a leader may be being elected.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if batch.deliveries.is_empty() {
                continue;
            }
            found = true;
            let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
            // Acks the broker refused (a leader that changed since the
            // claim answers NOT_LEADER) were not applied: those messages
            // are not counted, so the drain claims them again once their
            // lease ends. An ack of unknown outcome counts as done.
            let mut refused = HashSet::new();
            match client.ack(queue, PartitionId(partition), &tokens).await {
                Ok(()) => {}
                Err(error) => {
                    errors.push(format!("ack {partition}: {error}"));
                    match &error {
                        ClientError::AckRefused { refused: tokens, .. } => {
                            refused.extend(tokens.iter().map(|ack| ack.index));
                        }
                        ClientError::NotLeader { .. } | ClientError::NotOwner { .. } => {
                            refused.extend(0..batch.deliveries.len());
                        }
                        _ => {}
                    }
                }
            }
            for (index, delivery) in batch.deliveries.iter().enumerate() {
                if !refused.contains(&index) {
                    *delivered.entry(delivery.message_id()).or_insert(0) += 1;
                }
            }
        }
        let all = owed.iter().all(|id| delivered.contains_key(id));
        idle_after_all = if all && !found { idle_after_all + 1 } else { 0 };
    }
    if !errors.is_empty() {
        eprintln!("drain met {} errors, first: {}", errors.len(), errors[0]);
    }
    (delivered, errors)
}

/// Lease of the drain's claims.
pub const DRAIN_LEASE_MS: u32 = 5_000;

/// Asserts every id of `owed` in `delivered`; prints the counts.
pub fn check_delivered(
    round: &str,
    owed: &HashSet<MessageId>,
    delivered: &HashMap<MessageId, usize>,
) {
    let lost: Vec<&MessageId> = owed.iter().filter(|id| !delivered.contains_key(id)).collect();
    let duplicates = delivered.values().filter(|&&count| count > 1).count();
    let extra = delivered.keys().filter(|id| !owed.contains(id)).count();
    eprintln!(
        "{round}: {} owed, {} delivered ids, {duplicates} delivered more than once, \
         {extra} delivered not owed, {} lost",
        owed.len(),
        delivered.len(),
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "{round}: {} acknowledged messages lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

/// Milliseconds since `since`, for reports.
pub fn millis_since(since: Instant) -> u128 {
    since.elapsed().as_millis()
}
