//! What replication costs against plain journal appends, in one run on one
//! machine (`bench/README.md`, "replication").
//!
//! Three scenarios, each with batches (one batch = one append or one
//! proposal) of 1 record and of 16 records of 1,638 B payload (the capacity
//! model's record, `docs/capacity.md`), each on fresh shard journals
//! (O_DIRECT files under a scratch directory, spoold's journal config from
//! `LogConfig::default()`, its witness and commit delays):
//!
//! 1. `journal`: one shard journal, no Raft. 64 tasks each append a batch
//!    through a partition's view and await the ticket durable, in a loop.
//!    The reference every other rate is divided by.
//! 2. `1 voter`: a [`ReplicaDriver`] with voters `[1]` over a replicated
//!    partition of one shard journal: 64 tasks each propose and await
//!    `committed` (the local fdatasync, then the commit index).
//! 3. `3 voters`: three nodes, each a glommio executor on its own thread
//!    with its journal, vote log, driver and [`ReplicationHost`], linked by
//!    `net::peer` over loopback TCP (as `broker/tests/replication_tcp.rs`);
//!    64 tasks on the elected leader propose and await `committed`.
//!
//! Per scenario: completions per second in the measured window (an append
//! or proposal counts when it resolves inside it), records per second,
//! latency from the (successful) append or propose call to durable or
//! committed (p50 / p99 / max), each node's journal syncs per second
//! (commits + witnesses: one write and one fdatasync each), retries (a
//! propose refused `Busy`, a lane's back-pressure), and the rate as a ratio
//! to (1) of the same batch size. Also `fio` (sequential 16 KiB O_DIRECT
//! writes, fdatasync after each) as the disk's sync rate, and the load
//! average before and after (fio runs before and after the scenarios, to
//! bracket what else used the disk meanwhile).
//!
//! A plain `main`, not criterion: the workload is a closed loop of 64 tasks
//! on up to three threads with pipelined commits; its figure is a rate and a
//! latency distribution over a window, not the time of one iteration, and
//! criterion's per-iteration model and its repetitions fit neither that nor
//! a run of under ~3 minutes.
//!
//! Environment: `SPOOL_BENCH_SECS` (measured window per scenario, default
//! 8), `SPOOL_BENCH_WARMUP_SECS` (2), `SPOOL_BENCH_FIO_SECS` (10 each;
//! 0 skips fio), `SPOOL_BENCH_ROUNDS` (1: rounds of the six scenarios,
//! each ratio within its round), `SPOOL_BENCH_DIR` (the scratch's parent, default the temp dir; it
//! must take O_DIRECT). Run: `cargo bench -p spool-broker --bench
//! replication`.
// A benchmark: a failed setup is a bug to see at once (as in tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use spool_broker::clock::{instant_now, Instant};
use spool_broker::io::DmaStorage;
use spool_broker::limits::{COMMIT_DELAY_MS, WITNESS_DELAY_MS};
use spool_broker::log::journal::{
    JournalConfig, JournalError, JournalPartition, JournalPos, JournalStats, LogFloor,
    PartitionHandle, ShardJournal, ShardRecovery,
};
use spool_broker::log::vote::VoteLog;
use spool_broker::log::{LogConfig, Offset, RecordFatal, WitnessDelay};
use spool_broker::net::peer::{PeerReceiver, ReceiverLimits, SenderLimits};
use spool_broker::replica::wire::GroupId;
use spool_broker::replica::{DriverError, Members, ReplicaDriver, Timing};
use spool_broker::shard::replication::ReplicationHost;
use spool_wire::batch::{BatchKind, DataBatchBuilder, MessageId, Payload, Record};
use spool_wire::proto::PartitionId;

/// Appends or proposals in flight (one per task).
const IN_FLIGHT: usize = 64;
/// Payload bytes of one record: the capacity model's 1.6 KiB.
const RECORD_LEN: usize = 1_638;
/// Records per batch, one row each.
const BATCH_RECORDS: [usize; 2] = [1, 16];
const GROUP: GroupId = GroupId { queue: 7, partition: 0 };
const VOTERS: [u64; 3] = [1, 2, 3];
/// A bound on a wait (an election, the first completion): past it the run
/// is stuck.
const STUCK: Duration = Duration::from_secs(30);
/// How often a node's supervisor looks at its role and the phase.
const POLL: Duration = Duration::from_millis(2);

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// What the controlling thread and the nodes share.
struct Control {
    phase: AtomicU8,
    /// A first append or proposal completed (a leader is elected).
    flowing: AtomicBool,
}

impl Control {
    fn new() -> Self {
        Control { phase: AtomicU8::new(WARMUP), flowing: AtomicBool::new(false) }
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }
}

/// One node's counts (its thread only).
#[derive(Default)]
struct Tally {
    done: Cell<u64>,
    retries: Cell<u64>,
    latencies_us: RefCell<Vec<u32>>,
}

impl Tally {
    fn complete(&self, control: &Control, start: Instant) {
        control.flowing.store(true, Ordering::SeqCst);
        if control.phase() == MEASURE {
            self.done.set(self.done.get() + 1);
            let us = instant_now().duration_since(start).as_micros();
            self.latencies_us.borrow_mut().push(u32::try_from(us).unwrap_or(u32::MAX));
        }
    }

    fn retry(&self) {
        self.retries.set(self.retries.get() + 1);
    }
}

/// What one node hands back at the end.
#[derive(Default)]
struct NodeOut {
    done: u64,
    retries: u64,
    latencies_us: Vec<u32>,
    /// Journal syncs (commits + witnesses) in the window.
    syncs: u64,
    /// Whether it led at the end, and its term.
    led: bool,
    term: u64,
}

/// One scenario's figures.
struct Outcome {
    name: &'static str,
    records: usize,
    secs: f64,
    done: u64,
    retries: u64,
    latencies_us: Vec<u32>,
    /// Per node: syncs in the window; led at the end; term.
    nodes: Vec<(u64, bool, u64)>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        self.done as f64 / self.secs
    }

    fn percentile_us(&self, at: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let rank = ((self.latencies_us.len() - 1) as f64 * at).round() as usize;
        self.latencies_us[rank]
    }
}

fn env_secs(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value}: not seconds")),
        Err(_) => default,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.trim().into())
}

/// A batch of `records` records of [`RECORD_LEN`] payload bytes; `seed`
/// keeps message ids distinct per task.
fn build_batch(seed: u64, records: usize) -> Vec<u8> {
    let mut builder = DataBatchBuilder::new();
    for at in 0..records as u64 {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&seed.to_le_bytes());
        id[8..].copy_from_slice(&at.to_le_bytes());
        builder
            .push(&Record {
                message_id: MessageId(id),
                routing_key: format!("bench-{seed}").into_bytes(),
                headers: Vec::new(),
                payload: Payload::Inline(vec![(seed % 251) as u8; RECORD_LEN]),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: spool_broker::clock::now_ms(),
            })
            .unwrap();
    }
    builder.finish().unwrap().to_vec()
}

fn timer_of(ms: u64) -> WitnessDelay {
    Rc::new(move || Box::pin(async move { glommio::timer::sleep(Duration::from_millis(ms)).await }))
}

/// Opens the shard journal of `dir` as spoold does (config, delays) and
/// registers the bench's partition; its background runs detached.
async fn open_shard(dir: &Path) -> (Rc<ShardJournal<DmaStorage>>, PartitionHandle, ShardRecovery) {
    let config = JournalConfig::for_partitions(&LogConfig::default());
    let fatal = Rc::new(RecordFatal::default());
    let (shard, recovery) =
        ShardJournal::open(DmaStorage, dir, config, JournalPos(0), fatal).await.unwrap();
    shard.journal().set_witness_delay(timer_of(WITNESS_DELAY_MS));
    shard.journal().set_commit_delay(timer_of(COMMIT_DELAY_MS));
    let handle = shard.register(GROUP.queue, PartitionId(GROUP.partition)).await.unwrap();
    glommio::spawn_local(shard.background()).detach();
    (shard, handle, recovery)
}

fn syncs(stats: &JournalStats) -> u64 {
    stats.commits + stats.witnesses
}

/// Watches the phase every [`POLL`] until it is `STOP`, calling `each`
/// meanwhile; returns the journal's syncs between `MEASURE` and `STOP`.
async fn supervise(
    control: &Control,
    shard: &ShardJournal<DmaStorage>,
    mut each: impl FnMut(),
) -> u64 {
    let mut at_start = None;
    loop {
        let phase = control.phase();
        if phase == MEASURE && at_start.is_none() {
            at_start = Some(syncs(&shard.journal().stats()));
        }
        if phase == STOP {
            let now = syncs(&shard.journal().stats());
            return now - at_start.unwrap_or(now);
        }
        each();
        glommio::timer::sleep(POLL).await;
    }
}

async fn journal_worker(
    part: Rc<JournalPartition<DmaStorage>>,
    batch: Vec<u8>,
    control: Arc<Control>,
    tally: Rc<Tally>,
) {
    while control.phase() != STOP {
        let start = instant_now();
        let appended = loop {
            match part.append(&batch) {
                Ok(appended) => break appended,
                Err(JournalError::Backpressure { .. }) => {
                    tally.retry();
                    part.writable(BatchKind::Data, batch.len() as u64).await;
                }
                Err(error) => panic!("append: {error}"),
            }
        };
        appended.ticket.durable().await.unwrap();
        tally.complete(&control, start);
    }
}

/// Scenario 1: plain appends on one shard journal.
async fn journal_node(dir: PathBuf, records: usize, control: Arc<Control>) -> NodeOut {
    let (shard, handle, recovery) = open_shard(&dir).await;
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let part = Rc::new(shard.partition(handle, routed, Offset(0), 1, 0).unwrap());
    let tally = Rc::new(Tally::default());
    for task in 0..IN_FLIGHT as u64 {
        let batch = build_batch(task, records);
        let worker = journal_worker(part.clone(), batch, control.clone(), tally.clone());
        glommio::spawn_local(worker).detach();
    }
    let syncs = supervise(&control, &shard, || {}).await;
    shard.close();
    NodeOut {
        done: tally.done.get(),
        retries: tally.retries.get(),
        latencies_us: tally.latencies_us.take(),
        syncs,
        ..NodeOut::default()
    }
}

/// Proposes and awaits `committed` until the phase stops or this member
/// no longer leads.
async fn propose_worker(
    driver: Rc<ReplicaDriver<DmaStorage>>,
    batch: Vec<u8>,
    control: Arc<Control>,
    tally: Rc<Tally>,
    running: Rc<Cell<usize>>,
) {
    while control.phase() != STOP {
        let progress = driver.progress();
        let start = instant_now();
        match driver.propose(&batch) {
            Ok(proposed) => {
                drop(progress);
                match driver.committed(proposed.index, proposed.term).await {
                    Ok(()) => tally.complete(&control, start),
                    Err(DriverError::Superseded { .. }) => tally.retry(),
                    // The run stopped and closed the driver under it.
                    Err(DriverError::Stopped(_)) if control.phase() == STOP => break,
                    Err(error) => panic!("committed: {error}"),
                }
            }
            Err(DriverError::Busy) => {
                tally.retry();
                let later = glommio::timer::sleep(Duration::from_millis(1));
                futures_lite::future::or(progress, later).await;
            }
            Err(DriverError::NotLeader { .. }) => break,
            Err(DriverError::Stopped(_)) if control.phase() == STOP => break,
            Err(error) => panic!("propose: {error}"),
        }
    }
    running.set(running.get() - 1);
}

/// Folds committed entries as an owner would: reports them applied.
async fn applier(driver: Rc<ReplicaDriver<DmaStorage>>) {
    loop {
        let progress = driver.progress();
        if let Some(last) = driver.take_committed().last() {
            driver.applied(last.index);
        }
        progress.await;
    }
}

/// Node `id` of `voters` (a member of one replicated partition) with peer
/// links to `addrs` (empty for one voter); loads the group while it leads.
async fn replica_node(
    id: u64,
    voters: Vec<u64>,
    dir: PathBuf,
    addrs: BTreeMap<u64, SocketAddr>,
    records: usize,
    control: Arc<Control>,
) -> NodeOut {
    let (shard, handle, recovery) = open_shard(&dir).await;
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
    let part = Rc::new(
        shard.replicated_partition(handle, routed, log, Offset(0), 1, LogFloor::default()).unwrap(),
    );
    let (votes, _) = VoteLog::open(DmaStorage, &dir).await.unwrap();

    let host = ReplicationHost::new(id);
    let peers: Vec<u64> = voters.iter().copied().filter(|peer| *peer != id).collect();
    for peer in &peers {
        host.connect(*peer, addrs[peer], SenderLimits::default());
    }
    let receiver = if peers.is_empty() {
        None
    } else {
        let sink = host.clone();
        let listener = bind(addrs[&id]);
        let deliver = Rc::new(move |frame| sink.deliver(frame));
        Some(PeerReceiver::start(listener, peers, deliver, ReceiverLimits::default()).unwrap())
    };
    let applied = part.committed_index();
    let driver = ReplicaDriver::open(
        id,
        Members::voters(&voters),
        part.clone(),
        Rc::new(votes),
        applied,
        Timing::Randomized,
        host.sender(GROUP),
    )
    .await
    .unwrap();
    host.add(GROUP, driver.clone());
    glommio::spawn_local(driver.clone().pump()).detach();
    glommio::spawn_local(host.clone().run_ticks()).detach();
    glommio::spawn_local(applier(driver.clone())).detach();

    let tally = Rc::new(Tally::default());
    let running = Rc::new(Cell::new(0usize));
    let syncs = supervise(&control, &shard, || {
        assert!(driver.failure().is_none(), "node {id}: {:?}", driver.failure());
        if running.get() > 0 || !driver.role().0 {
            return;
        }
        for task in 0..IN_FLIGHT as u64 {
            running.set(running.get() + 1);
            let batch = build_batch(id << 32 | task, records);
            let (driver, control) = (driver.clone(), control.clone());
            let worker = propose_worker(driver, batch, control, tally.clone(), running.clone());
            glommio::spawn_local(worker).detach();
        }
    })
    .await;
    let (led, term, _) = driver.role();
    host.stop().await;
    if let Some(receiver) = receiver {
        receiver.close().await;
    }
    shard.close();
    NodeOut {
        done: tally.done.get(),
        retries: tally.retries.get(),
        latencies_us: tally.latencies_us.take(),
        syncs,
        led,
        term,
    }
}

/// Runs `node` on its own thread in a glommio executor.
fn spawn_node<F, Fut>(node: F) -> std::thread::JoinHandle<NodeOut>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = NodeOut> + 'static,
{
    std::thread::spawn(move || {
        LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(0)
            .make()
            .expect("executor")
            .run(node())
    })
}

struct Window {
    warmup: Duration,
    window: Duration,
}

/// Waits for the first completion, warms up, measures, stops, collects.
fn drive(
    name: &'static str,
    records: usize,
    timing: &Window,
    control: &Control,
    nodes: Vec<std::thread::JoinHandle<NodeOut>>,
) -> Outcome {
    let waited = instant_now();
    while !control.flowing.load(Ordering::SeqCst) {
        assert!(waited.elapsed() < STUCK, "{name}: nothing completed in {STUCK:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(timing.warmup);
    control.phase.store(MEASURE, Ordering::SeqCst);
    let start = instant_now();
    std::thread::sleep(timing.window);
    control.phase.store(STOP, Ordering::SeqCst);
    let secs = start.elapsed().as_secs_f64();
    let stopped = instant_now();
    let mut nudges = 0u64;
    for node in &nodes {
        while !node.is_finished() {
            // A node's executor has been seen parked in io_uring_enter past
            // its 2 ms timer, nothing in flight, for good (it went on when a
            // debugger's attach interrupted the wait): a lost reactor
            // wake-up. Nudge it with a signal after 1 s, count it, report.
            if stopped.elapsed() > STUCK {
                panic!("{name}: a node did not stop in {STUCK:?}; threads: {}", thread_states());
            }
            if stopped.elapsed() > Duration::from_secs(1) {
                nudge(node);
                nudges += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    if nudges > 0 {
        println!("{name}, {records} record(s): {nudges} nudge(s) to stop a parked node");
    }
    let outs: Vec<NodeOut> = nodes.into_iter().map(|node| node.join().unwrap()).collect();
    let mut latencies_us: Vec<u32> = outs.iter().flat_map(|o| o.latencies_us.clone()).collect();
    latencies_us.sort_unstable();
    Outcome {
        name,
        records,
        secs,
        done: outs.iter().map(|o| o.done).sum(),
        retries: outs.iter().map(|o| o.retries).sum(),
        latencies_us,
        nodes: outs.iter().map(|o| (o.syncs, o.led, o.term)).collect(),
    }
}

/// Binds `addr`, retrying while a listener of this port is released.
fn bind(addr: SocketAddr) -> TcpListener {
    for _ in 0..200 {
        if let Ok(listener) = TcpListener::bind(addr) {
            return listener;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("cannot bind {addr}");
}

extern "C" fn do_nothing(_: libc::c_int) {}

/// Makes SIGUSR1 interrupt a blocking system call (no `SA_RESTART`) and
/// do nothing else.
fn install_nudge() {
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct; the
    // handler does nothing, so it is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = do_nothing as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()), 0);
    }
}

/// Interrupts whatever `node`'s thread waits for in the kernel.
fn nudge(node: &std::thread::JoinHandle<NodeOut>) {
    use std::os::unix::thread::JoinHandleExt;
    // SAFETY: the handle is not joined, so its pthread_t is valid (also
    // once the thread ended); SIGUSR1's handler does nothing.
    unsafe {
        libc::pthread_kill(node.as_pthread_t(), libc::SIGUSR1);
    }
}

/// Each thread of this process: name, state and kernel wait channel.
fn thread_states() -> String {
    let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return "?".into() };
    let states: Vec<String> = tasks
        .flatten()
        .map(|task| {
            let stat = read(task.path().join("stat"));
            let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next();
            let name = read(task.path().join("comm"));
            let wchan = read(task.path().join("wchan"));
            format!("{} {} {}", name.trim(), state.unwrap_or("?"), wchan.trim())
        })
        .collect();
    states.join("; ")
}

fn free_port() -> SocketAddr {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn run_scenario(name: &'static str, records: usize, scratch: &Path, timing: &Window) -> Outcome {
    let control = Arc::new(Control::new());
    let root = scratch.join(format!("{}-{records}", name.replace(' ', "-")));
    let dir = |id: u64| root.join(format!("node-{id}")).join("shard-00");
    let nodes = match name {
        "journal" => {
            let (dir, control) = (dir(1), control.clone());
            vec![spawn_node(move || journal_node(dir, records, control))]
        }
        "1 voter" => {
            let (dir, control) = (dir(1), control.clone());
            vec![spawn_node(move || {
                replica_node(1, vec![1], dir, BTreeMap::new(), records, control)
            })]
        }
        _ => {
            let addrs: BTreeMap<u64, SocketAddr> =
                VOTERS.iter().map(|id| (*id, free_port())).collect();
            VOTERS
                .iter()
                .map(|id| {
                    let (id, dir, addrs, control) = (*id, dir(*id), addrs.clone(), control.clone());
                    let voters = VOTERS.to_vec();
                    spawn_node(move || replica_node(id, voters, dir, addrs, records, control))
                })
                .collect()
        }
    };
    let outcome = drive(name, records, timing, &control, nodes);
    std::fs::remove_dir_all(&root).unwrap();
    outcome
}

/// fio's sequential 16 KiB O_DIRECT writes with an fdatasync after each,
/// for `secs`, in `dir`: a line to print.
fn fio(dir: &Path, secs: u64) -> String {
    if secs == 0 {
        return "fio: skipped (SPOOL_BENCH_FIO_SECS=0)".into();
    }
    if std::process::Command::new("fio").arg("--version").output().is_err() {
        return "fio: not installed, no disk reference".into();
    }
    std::fs::create_dir_all(dir).unwrap();
    let output = std::process::Command::new("fio")
        .args(["--name=sync", "--rw=write", "--bs=16k", "--direct=1", "--fdatasync=1"])
        .args(["--ioengine=io_uring", "--iodepth=1", "--size=256m", "--time_based"])
        .arg(format!("--runtime={secs}"))
        .arg(format!("--directory={}", dir.display()))
        .arg("--output-format=json")
        .output();
    let _ = std::fs::remove_dir_all(dir);
    let output = match output {
        Ok(output) if output.status.success() => output,
        Ok(output) => return format!("fio: failed: {}", String::from_utf8_lossy(&output.stderr)),
        Err(error) => return format!("fio: not run: {error}"),
    };
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let job = &json["jobs"][0];
    let write_iops = job["write"]["iops"].as_f64().unwrap_or(0.0);
    let mb_per_s = job["write"]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6;
    let sync = |p: &str| job["sync"]["lat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    let clat = |p: &str| job["write"]["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    format!(
        "fio 16 KiB write + fdatasync, {secs} s: {write_iops:.0} writes+syncs/s, {mb_per_s:.1} \
         MB/s; write clat p50/p99 {:.0}/{:.0} µs; sync p50/p99 {:.0}/{:.0} µs",
        clat("50.000000"),
        clat("99.000000"),
        sync("50.000000"),
        sync("99.000000"),
    )
}

/// One row of the table: the outcome, the round, its reference's rate and
/// the 1-minute load average when it started.
struct Row {
    outcome: Outcome,
    round: u64,
    reference: f64,
    load: String,
}

fn print_row(row: &Row) {
    let outcome = &row.outcome;
    let rate = outcome.rate();
    let records_per_s = rate * outcome.records as f64;
    let per_s = |syncs: u64| format!("{:.0}", syncs as f64 / outcome.secs);
    let syncs: Vec<String> = outcome.nodes.iter().map(|(syncs, _, _)| per_s(*syncs)).collect();
    let leader = outcome.nodes.iter().position(|(_, led, _)| *led);
    let leader_syncs = outcome.nodes[leader.unwrap_or(0)].0.max(1);
    let led = match leader {
        Some(at) => format!("node {} (term {})", at + 1, outcome.nodes[at].2),
        None => "-".into(),
    };
    println!(
        "| {} | {} | {} | {rate:.0} | {records_per_s:.0} | {:.1} | **{:.2}** | {} / {} / {} | {} | \
         {:.1} | {} | {led} | {} |",
        row.round,
        outcome.name,
        outcome.records,
        records_per_s * RECORD_LEN as f64 / 1e6,
        rate / row.reference,
        outcome.percentile_us(0.50),
        outcome.percentile_us(0.99),
        outcome.latencies_us.last().copied().unwrap_or(0),
        syncs.join(" / "),
        outcome.done as f64 / leader_syncs as f64,
        outcome.retries,
        row.load,
    );
}

fn main() {
    let timing = Window {
        warmup: Duration::from_secs(env_secs("SPOOL_BENCH_WARMUP_SECS", 2)),
        window: Duration::from_secs(env_secs("SPOOL_BENCH_SECS", 8)),
    };
    let fio_secs = env_secs("SPOOL_BENCH_FIO_SECS", 10);
    install_nudge();
    let rounds = env_secs("SPOOL_BENCH_ROUNDS", 1).max(1);
    let parent = std::env::var_os("SPOOL_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let scratch = tempfile::Builder::new().prefix("spool-replication-").tempdir_in(parent).unwrap();
    let load_before = loadavg();
    println!("scratch {}; load average before: {load_before}", scratch.path().display());
    let fio_before = fio(&scratch.path().join("fio"), fio_secs);
    println!("before: {fio_before}");

    let mut rows: Vec<Row> = Vec::new();
    for round in 1..=rounds {
        for records in BATCH_RECORDS {
            let mut reference = None;
            for name in ["journal", "1 voter", "3 voters"] {
                let load = loadavg().split(' ').next().unwrap_or("?").to_string();
                let outcome = run_scenario(name, records, scratch.path(), &timing);
                let rate = outcome.rate();
                let reference = *reference.get_or_insert(rate);
                let row = Row { outcome, round, reference, load };
                print_row(&row);
                rows.push(row);
            }
        }
    }
    let fio_after = fio(&scratch.path().join("fio"), fio_secs);
    let load_after = loadavg();

    println!();
    println!(
        "| round | scenario | records/batch | batches/s | records/s | payload MB/s | ratio to journal \
         | latency p50 / p99 / max µs | syncs/s per node | batches per leader sync | retries \
         | leader | load 1m |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|---:|");
    rows.iter().for_each(print_row);
    println!();
    println!(
        "{IN_FLIGHT} in flight, records of {RECORD_LEN} B, {:?} measured after {:?} of warm-up, \
         {rounds} round(s)",
        timing.window, timing.warmup
    );
    println!("before: {fio_before}");
    println!("after: {fio_after}");
    println!("load average before: {load_before}; after: {load_after}");
}
