//! One partition replicated on three nodes over real TCP and real files
//! (`docs/design/replication.md` §4–§5): each node a glommio executor on
//! its own thread with its own shard journal and vote log (O_DIRECT, in a
//! temp dir), its [`ReplicaDriver`], and a [`ReplicationHost`] with peer
//! links to the other two and a peer listener, all mutual TLS with a
//! certificate naming the node (a CA made at test time).
//!
//! The leader (whichever node is elected) proposes data batches with up to
//! 64 in flight; a proposal is acknowledged when `committed` resolves.
//! Once 1,500 are acknowledged the leader's thread stops at once (its
//! executor dropped mid-flight, as a killed process stops), the other two
//! elect a new leader and acknowledge 1,000 more, then the stopped node
//! restarts from its directory and catches up. Checked: every
//! acknowledged batch is in every node's log at its index and term, byte
//! for byte; the three logs are equal up to the committed index; a new
//! leader with a higher term took over; the restarted node catches up
//! over the network.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod journal_common;
mod pki;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use journal_common::{payload, small_config};
use spool_broker::io::DmaStorage;
use spool_broker::log::journal::{JournalPos, LogFloor, ShardJournal};
use spool_broker::log::vote::VoteLog;
use spool_broker::log::{Offset, RecordFatal};
use spool_broker::net::peer::{PeerReceiver, PeerTls, ReceiverLimits, SenderLimits};
use spool_broker::replica::wire::GroupId;
use spool_broker::replica::{DriverError, Members, ReplicaDriver, Timing};
use spool_broker::shard::replication::ReplicationHost;
use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::proto::PartitionId;

const VOTERS: [u64; 3] = [1, 2, 3];
const GROUP: GroupId = GroupId { queue: 7, partition: 0 };
const IN_FLIGHT_MAX: usize = 64;
const FIRST: usize = 1_500;
const SECOND: usize = 1_000;
/// A bound on every phase: a run past it is stuck.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// An entry: index, term, stored bytes.
type Stored = (u64, u64, Vec<u8>);

/// What the nodes and the test share.
#[derive(Default)]
struct Shared {
    /// Proposals acknowledged committed: (index, term, stamped bytes).
    acked: Mutex<Vec<Stored>>,
    /// Proposals to make in all (the leader stops at it).
    wanted: AtomicU64,
    proposed: AtomicU64,
    /// Per node: stop now (as a kill), (leads, term), committed index.
    stop: [AtomicBool; 3],
    role: [Mutex<(bool, u64)>; 3],
    committed: [AtomicU64; 3],
    /// Per node, at a clean stop: its log up to its committed index.
    logs: Mutex<BTreeMap<u64, Vec<Stored>>>,
    /// Stop cleanly and publish the log.
    finish: AtomicBool,
}

fn free_port() -> SocketAddr {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// Binds `addr`, retrying while a previous listener of this port is
/// still being released.
fn bind(addr: SocketAddr) -> TcpListener {
    for _ in 0..200 {
        if let Ok(listener) = TcpListener::bind(addr) {
            return listener;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("cannot bind {addr}");
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = spool_broker::clock::instant_now();
    while !done() {
        assert!(start.elapsed() < PHASE_TIMEOUT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs node `id` on its own thread until it is told to stop.
fn start_node(
    tls: PeerTls,
    dir: PathBuf,
    addrs: BTreeMap<u64, SocketAddr>,
    shared: Arc<Shared>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(0)
            .make()
            .expect("executor")
            .run(node(tls, dir, addrs, shared));
    })
}

async fn node(tls: PeerTls, dir: PathBuf, addrs: BTreeMap<u64, SocketAddr>, shared: Arc<Shared>) {
    let id = tls.node();
    let at = id as usize - 1;
    let fatal = Rc::new(RecordFatal::default());
    let (shard, recovery) =
        ShardJournal::open(DmaStorage, &dir, small_config(), JournalPos(0), fatal).await.unwrap();
    let handle = shard.register(GROUP.queue, PartitionId(GROUP.partition)).await.unwrap();
    let routed = recovery.routed.partitions.get(&handle).cloned().unwrap_or_default();
    let log = recovery.routed.logs.get(&handle).copied().unwrap_or_default();
    let part = Rc::new(
        shard.replicated_partition(handle, routed, log, Offset(0), 1, LogFloor::default()).unwrap(),
    );
    glommio::spawn_local(shard.background()).detach();
    let (votes, _) = VoteLog::open(DmaStorage, &dir).await.unwrap();

    let host = ReplicationHost::new_tls(tls.clone());
    let peers: Vec<u64> = VOTERS.iter().copied().filter(|peer| *peer != id).collect();
    for peer in &peers {
        host.connect(*peer, addrs[peer], SenderLimits::default());
    }
    let sink_host = host.clone();
    let receiver = PeerReceiver::start_tls(
        bind(addrs[&id]),
        peers.clone(),
        Rc::new(move |frame| sink_host.deliver(frame)),
        ReceiverLimits::default(),
        &tls,
    )
    .unwrap();
    let applied = part.committed_index();
    let driver = ReplicaDriver::open(
        id,
        Members::voters(&VOTERS),
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

    let in_flight = Rc::new(std::cell::Cell::new(0usize));
    let mut tag = id * 1_000_000_000;
    loop {
        if shared.stop[at].load(Ordering::SeqCst) {
            // As a kill: nothing is closed or synced on the way out.
            return;
        }
        if shared.finish.load(Ordering::SeqCst) {
            break;
        }
        assert!(driver.failure().is_none(), "node {id}: {:?}", driver.failure());
        if let Some(last) = driver.take_committed().last() {
            driver.applied(last.index);
        }
        let (leads, term, _) = driver.role();
        *shared.role[at].lock().unwrap() = (leads, term);
        shared.committed[at].store(part.committed_index(), Ordering::SeqCst);
        while leads
            && in_flight.get() < IN_FLIGHT_MAX
            && shared.proposed.load(Ordering::SeqCst) < shared.wanted.load(Ordering::SeqCst)
        {
            tag += 1;
            let batch = payload(BatchKind::Data, 200 + (tag % 1400) as usize, tag);
            let proposed = match driver.propose(&batch) {
                Ok(proposed) => proposed,
                Err(DriverError::NotLeader { .. } | DriverError::Busy) => break,
                Err(error) => panic!("node {id}: propose: {error}"),
            };
            shared.proposed.fetch_add(1, Ordering::SeqCst);
            in_flight.set(in_flight.get() + 1);
            let mut stamped = batch;
            BatchHeader::assign(&mut stamped, proposed.base_offset.0, proposed.term as u32);
            let (driver, shared, in_flight) = (driver.clone(), shared.clone(), in_flight.clone());
            glommio::spawn_local(async move {
                let outcome = driver.committed(proposed.index, proposed.term).await;
                in_flight.set(in_flight.get() - 1);
                match outcome {
                    Ok(()) => {
                        let entry = (proposed.index, proposed.term, stamped);
                        shared.acked.lock().unwrap().push(entry);
                    }
                    // Not acknowledged: a later leader decides its fate.
                    Err(_) => {
                        shared.proposed.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            })
            .detach();
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    // A clean stop: make the committed index durable, publish the log.
    part.persist_committed().await.unwrap();
    let committed = part.committed_index();
    let mut entries = Vec::new();
    let mut next = part.first_index();
    while next <= committed {
        let read = part.read_entries(next, committed + 1, 1 << 20).await.unwrap();
        assert!(!read.is_empty(), "node {id}: entries from {next} are durable");
        next += read.len() as u64;
        entries.extend(read.into_iter().map(|e| (e.index, e.term, e.batch.bytes.to_vec())));
    }
    shared.logs.lock().unwrap().insert(id, entries);
    host.stop().await;
    receiver.close().await;
}

fn leader(shared: &Shared) -> Option<(usize, u64)> {
    (0..3).find_map(|at| {
        let (leads, term) = *shared.role[at].lock().unwrap();
        (leads && !shared.stop[at].load(Ordering::SeqCst)).then_some((at, term))
    })
}

#[test]
fn three_nodes_replicate_over_tcp_through_a_leader_kill_and_a_restart() {
    let temp = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> =
        VOTERS.iter().map(|id| temp.path().join(format!("node-{id}")).join("shard-00")).collect();
    let addrs: BTreeMap<u64, SocketAddr> = VOTERS.iter().map(|id| (*id, free_port())).collect();
    let shared = Arc::new(Shared::default());
    shared.wanted.store(FIRST as u64, Ordering::SeqCst);
    // The links are mutual TLS: each node's certificate names it.
    let pki = pki::Pki::new("spool test cluster CA");
    let mut threads: Vec<Option<std::thread::JoinHandle<()>>> = VOTERS
        .iter()
        .map(|id| {
            let dir = dirs[*id as usize - 1].clone();
            Some(start_node(pki.node(*id), dir, addrs.clone(), shared.clone()))
        })
        .collect();

    wait_for("the first acknowledgements", || shared.acked.lock().unwrap().len() >= FIRST);
    let (old, old_term) = leader(&shared).expect("a leader");
    shared.stop[old].store(true, Ordering::SeqCst);
    threads[old].take().unwrap().join().unwrap();
    // Proposals the killed leader had in flight are not acknowledged.
    shared.proposed.store(shared.acked.lock().unwrap().len() as u64, Ordering::SeqCst);
    shared.wanted.store((FIRST + SECOND) as u64, Ordering::SeqCst);
    wait_for("a new leader", || {
        leader(&shared).is_some_and(|(at, term)| at != old && term > old_term)
    });
    wait_for("the second acknowledgements", || {
        shared.acked.lock().unwrap().len() >= FIRST + SECOND
    });

    // The killed node restarts from its directory and catches up.
    shared.stop[old].store(false, Ordering::SeqCst);
    *shared.role[old].lock().unwrap() = (false, 0);
    let restarted =
        start_node(pki.node(old as u64 + 1), dirs[old].clone(), addrs.clone(), shared.clone());
    threads[old] = Some(restarted);
    let top = shared.acked.lock().unwrap().iter().map(|(index, _, _)| *index).max().unwrap();
    wait_for("every node to commit every acknowledged entry", || {
        (0..3).all(|at| shared.committed[at].load(Ordering::SeqCst) >= top)
    });
    shared.finish.store(true, Ordering::SeqCst);
    for thread in threads.iter_mut() {
        thread.take().unwrap().join().unwrap();
    }

    let logs = shared.logs.lock().unwrap();
    let acked = shared.acked.lock().unwrap();
    assert!(acked.len() >= FIRST + SECOND);
    for (id, log) in logs.iter() {
        let by_index: BTreeMap<u64, (u64, &Vec<u8>)> =
            log.iter().map(|(index, term, bytes)| (*index, (*term, bytes))).collect();
        for (index, term, bytes) in acked.iter() {
            let found = by_index.get(index);
            assert_eq!(found, Some(&(*term, bytes)), "node {id}: acknowledged entry {index}");
        }
    }
    let shortest = logs.values().map(Vec::len).min().unwrap();
    let first = logs.values().next().unwrap();
    for log in logs.values() {
        assert_eq!(log[..shortest], first[..shortest], "the logs agree up to the commit");
    }
    println!(
        "acknowledged {} entries, committed index ≥ {top}, leader {} of term {old_term} killed",
        acked.len(),
        old + 1
    );
}
