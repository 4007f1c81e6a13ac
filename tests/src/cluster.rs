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
//! A node is killed with SIGKILL ([`Cluster::kill`]) and restarted on the
//! same directory, ports and config ([`Cluster::restart`]). Dropping the
//! cluster kills every node it started, and only those; a panicking test
//! prints every node's log tail. Every wait is bounded.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{
    now, reserve_ports, send_signal, spawn_lasting, spoold_bin, BROKER_STARTUP_TIMEOUT_MS,
    EXIT_PORT_IN_USE, PORTS_RELEASE_TIMEOUT, SEGMENT_BYTES_TEST, START_TIMEOUT,
};

/// Bytes of the cluster secret (the broker's `SECRET_BYTES`).
pub const CLUSTER_SECRET_BYTES: usize = 32;

/// How many times a first start is retried on other ports.
const START_ATTEMPTS_MAX: u32 = 3;

/// Most bytes of a node's log printed when a test fails (the tail).
const LOG_PRINT_BYTES_MAX: usize = 48 * 1024;

/// Pause between two probes of a bounded wait.
const PROBE_PAUSE: Duration = Duration::from_millis(20);

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
}

impl ClusterNode {
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

    /// Whether its process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// How many times it was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("spoold.toml")
    }

    /// The log file (every start appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("spoold.log")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    fn log_tail(&self) -> String {
        let text = self.log();
        let mut start = text.len().saturating_sub(LOG_PRINT_BYTES_MAX);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_owned()
    }
}

/// A cluster of `spoold` processes on 127.0.0.1.
#[derive(Debug)]
pub struct Cluster {
    root: TempDir,
    cores: u16,
    nodes: Vec<ClusterNode>,
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
        match Self::try_start(nodes, cores) {
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
        assert!(nodes >= 3, "a cluster of replication factor 3 needs 3 nodes");
        let root = tempfile::Builder::new().prefix("spool-cluster-").tempdir().expect("tempdir");
        write_secret(&root.path().join("cluster.secret"));
        let mut cluster = Cluster { root, cores, nodes: Vec::new() };
        for attempt in 1..=START_ATTEMPTS_MAX {
            cluster.lay_out(nodes);
            for index in 0..cluster.nodes.len() {
                cluster.spawn(index);
            }
            match cluster.wait_all_accepting() {
                Ok(()) => return Ok(cluster),
                Err(failure)
                    if attempt < START_ATTEMPTS_MAX
                        && failure.status.and_then(|status| status.code())
                            == Some(EXIT_PORT_IN_USE) =>
                {
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
        let base = reserve_ports(per_node * count_u16);
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
                }
            })
            .collect();
        for node in &self.nodes {
            std::fs::write(node.config_path(), self.config_text(node)).expect("write config");
        }
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
             replication_factor = 3\n\
             controller_voters = 3\n\
             secret_file = {secret:?}\n\
             nodes = [\n",
            client = node.client_port,
            admin = node.admin_port,
            data = node.dir.join("data").display().to_string(),
            cores = self.cores,
            segment = SEGMENT_BYTES_TEST,
            startup = BROKER_STARTUP_TIMEOUT_MS,
            id = node.id,
            secret = secret.display().to_string(),
        );
        for (index, other) in self.nodes.iter().enumerate() {
            let domain = char::from(b'a' + u8::try_from(index % 26).expect("index % 26 fits"));
            text.push_str(&format!(
                "  {{ id = {}, client = \"127.0.0.1:{}\", peer = \"127.0.0.1:{}\", failure_domain = \"{domain}\" }},\n",
                other.id, other.client_port, other.peer_port
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
        let mut command = Command::new(spoold_bin());
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
            if accepting {
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
    }

    fn kill_all(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                send_signal(&child, libc::SIGKILL);
                let _ = child.wait();
            }
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
