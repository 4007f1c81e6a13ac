//! Three `spoold` nodes in one cluster (`docs/design/replication.md`): a
//! queue created through a node that is not the controller's leader, a
//! producer bootstrapped on one node that follows `NOT_OWNER` to each
//! partition's leader, the leader of partition 0 SIGKILLed mid-stream,
//! production going on against the survivors, and a drain that must find
//! every acknowledged message (at least once: duplicates are counted and
//! reported, not refused). The killed node then restarts, must report
//! ready on its admin port, and a second small round must go through.
//!
//! Every wait is bounded; the test runs under nextest's per-test timeout.
//! Like every end-to-end test it runs the binaries `scripts/test.sh` built
//! (`SPOOL_E2E_SPOOLD`), or builds `spoold` itself when that is unset.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{
    partition_for_key, Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig,
    Delivery, Message, Producer, ProducerConfig, SendFuture,
};
use spool_tests::cluster::Cluster;
use spool_tests::fault::message_id;
use spool_tests::{now, test_queue_config};

const QUEUE: &str = "jobs";
const PARTITIONS: u32 = 2;
/// Messages acknowledged before the kill.
const BEFORE_KILL: u64 = 2_000;
/// Messages submitted after the kill (some may fail while a leader is
/// elected: only the acknowledged ones are owed).
const AFTER_KILL: u64 = 300;
/// Messages of the round after the restart.
const SECOND_ROUND: u64 = 50;

/// Bounds of the steps (each far above what it takes on a loaded 2-core
/// machine; their sum stays under nextest's per-test timeout in practice).
const CREATE_TIMEOUT: Duration = Duration::from_secs(45);
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Lease of the drain's claims: a claim whose ack is lost comes back after it.
const DRAIN_LEASE_MS: u32 = 5_000;

async fn bounded<T>(what: &str, limit: Duration, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} took more than {limit:?}"),
    }
}

/// A client bootstrapped on `addr` with short timeouts.
async fn client_at(addr: &str) -> Client {
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
            Err(error) if started.elapsed() < METADATA_TIMEOUT => {
                eprintln!("connect {addr}: {error}; again");
                // A bounded poll: the node may still be joining.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("connect {addr}: {error}"),
        }
    }
}

/// A key that lands on `partition` (the client's keyed placement).
fn key_for(partition: u32) -> Vec<u8> {
    (0u32..)
        .map(|n| format!("key-{n}").into_bytes())
        .find(|key| partition_for_key(key, PARTITIONS).0 == partition)
        .expect("some key lands on every partition")
}

/// Creates the queue through `addr`, retrying while the cluster has no
/// controller leader for longer than the client's own bounded wait.
async fn create_queue(addr: &str) {
    let admin = Admin::new(client_at(addr).await);
    let started = now();
    loop {
        match admin.create_queue(QUEUE, test_queue_config(PARTITIONS, 30_000, 100)).await {
            Ok(version) => {
                eprintln!("queue created through {addr} (assignment version {version:?})");
                return;
            }
            Err(error @ ClientError::ControlRouteExhausted { .. })
                if started.elapsed() < CREATE_TIMEOUT =>
            {
                eprintln!("create through {addr}: {error}; again");
            }
            Err(error) => panic!("create queue through {addr}: {error}"),
        }
    }
}

/// The index of the node each partition's metadata names (its leader, or
/// its preferred replica while none is known), as `client` sees it now.
async fn leaders(cluster: &Cluster, client: &Client) -> Result<Vec<usize>, String> {
    client.refresh_metadata(&[QUEUE]).await.map_err(|error| error.to_string())?;
    let partitions = client.partitions(QUEUE).await.map_err(|error| error.to_string())?;
    partitions
        .iter()
        .map(|meta| {
            cluster.index_of_client_port(meta.shard_port).ok_or_else(|| {
                format!("partition {} on unknown port {}", meta.partition.0, meta.shard_port)
            })
        })
        .collect()
}

/// Waits until `client`'s node lists the queue, then its leaders.
async fn wait_for_queue(cluster: &Cluster, client: &Client) -> Vec<usize> {
    let started = now();
    loop {
        match leaders(cluster, client).await {
            Ok(found) if found.len() == PARTITIONS as usize => return found,
            last if started.elapsed() >= METADATA_TIMEOUT => {
                panic!("{} never listed {QUEUE}: {last:?}", client.bootstrap())
            }
            // A bounded poll: the catalog reaches every node in its time.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The node every node's metadata names for `partition`, once they agree
/// (their leader boards converge within an election's time).
async fn agreed_leader(cluster: &Cluster, partition: usize) -> usize {
    let mut clients = Vec::new();
    for node in cluster.nodes() {
        clients.push(client_at(&node.client_addr()).await);
    }
    let started = now();
    loop {
        let mut named = Vec::new();
        for client in &clients {
            named.push(leaders(cluster, client).await.map(|found| found[partition]));
        }
        match named.first() {
            Some(Ok(first)) if named.iter().all(|other| other.as_ref() == Ok(first)) => {
                return *first
            }
            _ if started.elapsed() >= METADATA_TIMEOUT => {
                panic!("the nodes never agreed on partition {partition}'s leader: {named:?}")
            }
            // A bounded poll: each node learns the leader from its group.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Submits `count` messages from `sequence` on, alternating partitions by
/// key, and waits for every answer; returns the acknowledged ids and the
/// failures' texts.
async fn produce(
    producer: &Producer,
    source: u32,
    sequences: std::ops::Range<u64>,
) -> (Vec<MessageId>, Vec<String>) {
    let keys: Vec<Vec<u8>> = (0..PARTITIONS).map(key_for).collect();
    let mut pending: Vec<(MessageId, SendFuture)> = Vec::new();
    let mut failed = Vec::new();
    for sequence in sequences {
        let id = message_id(source, sequence);
        let key = keys[(sequence % u64::from(PARTITIONS)) as usize].clone();
        let message = Message::new(format!("message {sequence}")).key(key).id(id);
        match producer.submit(QUEUE, message).await {
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

fn producer_on(client: Client) -> Producer {
    // Retries long enough to outlast an election (1–2 s) and the leader
    // board catching up: ≈ 0.1 + 0.2 + ... capped at 2 s, ≈ 17 s in all.
    let config = ProducerConfig {
        retries: 12,
        retry_backoff: Duration::from_millis(100),
        ..Default::default()
    };
    Producer::new(client, config).unwrap()
}

/// Claims and acks everything on every partition through `client` until
/// every id of `owed` was delivered and one more sweep finds nothing, or
/// [`DRAIN_TIMEOUT`] passes; returns the delivered ids with their counts
/// and the errors met on the way.
async fn drain(
    client: &Client,
    owed: &HashSet<MessageId>,
) -> (HashMap<MessageId, usize>, Vec<String>) {
    let mut delivered: HashMap<MessageId, usize> = HashMap::new();
    let mut errors = Vec::new();
    let started = now();
    let mut idle_after_all = 0;
    while started.elapsed() < DRAIN_TIMEOUT && idle_after_all < 2 {
        let mut found = false;
        for partition in 0..PARTITIONS {
            let options = ClaimOptions {
                worker: WorkerId(0xd7a1),
                credits: 1024,
                max_bytes: 4 << 20,
                lease_ms: DRAIN_LEASE_MS,
                wait_ms: 300,
            };
            let batch = match client.claim(QUEUE, PartitionId(partition), &options).await {
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
            if let Err(error) = client.ack(QUEUE, PartitionId(partition), &tokens).await {
                errors.push(format!("ack {partition}: {error}"));
            }
            for delivery in &batch.deliveries {
                *delivered.entry(delivery.message_id()).or_insert(0) += 1;
            }
        }
        let all = owed.iter().all(|id| delivered.contains_key(id));
        idle_after_all = if all && !found { idle_after_all + 1 } else { 0 };
    }
    (delivered, errors)
}

/// Asserts every id of `owed` in `delivered`; prints the counts.
fn check_delivered(round: &str, owed: &HashSet<MessageId>, delivered: &HashMap<MessageId, usize>) {
    let lost: Vec<&MessageId> = owed.iter().filter(|id| !delivered.contains_key(id)).collect();
    let duplicates = delivered.values().filter(|&&count| count > 1).count();
    let extra = delivered.keys().filter(|id| !owed.contains(id)).count();
    eprintln!(
        "{round}: {} acknowledged, {} delivered ids, {duplicates} delivered more than once, \
         {extra} delivered whose enqueue was not acknowledged, {} lost",
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

// Goal: a three-node cluster loses no acknowledged enqueue when a
// partition's leader is SIGKILLed, and the killed node comes back.
// Method: as the module doc says; the producer's client is bootstrapped on
// a node that does not lead partition 0 (so it survives the kill and every
// send to another leader is a redirect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_loses_no_acknowledged_message() {
    let mut cluster = tokio::task::block_in_place(|| Cluster::start(3, 1));
    for node in cluster.nodes() {
        eprintln!("node {}: client {}, admin {}", node.id(), node.client_addr(), node.admin_addr());
    }

    // The create goes to node 2: a follower of the controller two times in
    // three, so the client follows NOT_OWNER to the leader.
    bounded("create", CREATE_TIMEOUT, create_queue(&cluster.node(1).client_addr())).await;

    let probe = client_at(&cluster.node(0).client_addr()).await;
    let placed = wait_for_queue(&cluster, &probe).await;
    // Bootstrap the producer on a node leading neither partition when one
    // does, else one not leading partition 0.
    let bootstrap = (0..3)
        .find(|index| !placed.contains(index))
        .or_else(|| (0..3).find(|&index| index != placed[0]))
        .unwrap();
    eprintln!(
        "leaders (or preferred replicas): {placed:?}; producing through node {}",
        bootstrap + 1
    );
    let client = client_at(&cluster.node(bootstrap).client_addr()).await;
    wait_for_queue(&cluster, &client).await;
    let producer = producer_on(client.clone());

    let (mut acked, failed) =
        bounded("produce before the kill", PRODUCE_TIMEOUT, produce(&producer, 1, 0..BEFORE_KILL))
            .await;
    assert!(
        failed.is_empty(),
        "{} sends failed before the kill, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert_eq!(acked.len() as u64, BEFORE_KILL);

    let victim = agreed_leader(&cluster, 0).await;
    eprintln!("killing node {} (every node names it leader of partition 0)", victim + 1);
    tokio::task::block_in_place(|| cluster.kill(victim));

    // Go on producing at once: the client finds the new leader itself.
    let producer = if victim == bootstrap {
        let survivor = (0..3).find(|&index| index != victim).unwrap();
        eprintln!("the producer's node was killed: producing on through node {}", survivor + 1);
        producer_on(client_at(&cluster.node(survivor).client_addr()).await)
    } else {
        producer
    };
    let (after, failed) = bounded(
        "produce after the kill",
        PRODUCE_TIMEOUT,
        produce(&producer, 1, BEFORE_KILL..BEFORE_KILL + AFTER_KILL),
    )
    .await;
    eprintln!(
        "after the kill: {} of {AFTER_KILL} acknowledged, {} failed{}",
        after.len(),
        failed.len(),
        failed.first().map_or(String::new(), |first| format!(" (first: {first})"))
    );
    assert!(
        !after.is_empty(),
        "no send acknowledged after the kill: {:?}",
        &failed[..failed.len().min(5)]
    );
    acked.extend(after);
    producer.close().await;

    let survivor = (0..3).find(|&index| index != victim).unwrap();
    let consumer = client_at(&cluster.node(survivor).client_addr()).await;
    let owed: HashSet<MessageId> = acked.iter().copied().collect();
    let (delivered, errors) = drain(&consumer, &owed).await;
    if !errors.is_empty() {
        eprintln!("drain met {} errors, first: {}", errors.len(), errors[0]);
    }
    check_delivered("before and after the kill", &owed, &delivered);

    // The killed node comes back and reports ready.
    let restarted = tokio::task::block_in_place(|| cluster.restart(victim));
    if let Err(failure) = restarted {
        panic!("restart of node {}: {failure}", victim + 1);
    }
    let ready = tokio::task::block_in_place(|| cluster.wait_ready(victim, READY_TIMEOUT));
    if let Err(last) = ready {
        panic!("node {} not ready after its restart: {last}", victim + 1);
    }
    eprintln!("node {} restarted and ready", victim + 1);

    // A second round: produced through the restarted node, drained
    // through another.
    let client = client_at(&cluster.node(victim).client_addr()).await;
    wait_for_queue(&cluster, &client).await;
    let producer = producer_on(client);
    let (second, failed) = bounded(
        "produce after the restart",
        PRODUCE_TIMEOUT,
        produce(&producer, 2, 0..SECOND_ROUND),
    )
    .await;
    assert!(
        failed.is_empty(),
        "sends failed after the restart: {:?}",
        &failed[..failed.len().min(5)]
    );
    producer.close().await;
    let owed: HashSet<MessageId> = second.into_iter().collect();
    let (delivered, _) = drain(&consumer, &owed).await;
    check_delivered("after the restart", &owed, &delivered);
}
