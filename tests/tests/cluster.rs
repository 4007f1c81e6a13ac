//! Three `spoold` nodes in one cluster (`docs/design/replication.md`): a
//! queue created through a node that is not the controller's leader, a
//! producer bootstrapped on one node that follows `NOT_OWNER` to each
//! partition's leader, the leader of partition 0 SIGKILLed mid-stream,
//! production going on against the survivors, and a drain that must find
//! every acknowledged message (at least once: duplicates are counted and
//! reported, not refused). The killed node then restarts, must report
//! ready on its admin port, and a second small round must go through;
//! `spool cluster status` over the three admin ports then reports the
//! cluster healthy with every partition's lag 0.
//!
//! Every wait is bounded; the test runs under nextest's per-test timeout.
//! Like every end-to-end test it runs the binaries `scripts/test.sh` built
//! (`SPOOL_E2E_SPOOLD`), or builds `spoold` itself when that is unset.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::HashSet;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::Client;
use spool_tests::cluster::{
    bounded, check_delivered, client_at, create_queue, drain, produce, producer_on, Cluster,
    CREATE_TIMEOUT,
};
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
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);

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
    bounded(
        "create",
        CREATE_TIMEOUT,
        create_queue(
            &cluster.node(1).client_addr(),
            QUEUE,
            test_queue_config(PARTITIONS, 30_000, 100),
        ),
    )
    .await;

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

    let (mut acked, failed) = bounded(
        "produce before the kill",
        PRODUCE_TIMEOUT,
        produce(&producer, QUEUE, PARTITIONS, 1, 0..BEFORE_KILL),
    )
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
        produce(&producer, QUEUE, PARTITIONS, 1, BEFORE_KILL..BEFORE_KILL + AFTER_KILL),
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
    let (delivered, _) = drain(&consumer, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
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
        produce(&producer, QUEUE, PARTITIONS, 2, 0..SECOND_ROUND),
    )
    .await;
    assert!(
        failed.is_empty(),
        "sends failed after the restart: {:?}",
        &failed[..failed.len().min(5)]
    );
    producer.close().await;
    let owed: HashSet<MessageId> = second.into_iter().collect();
    let (delivered, _) = drain(&consumer, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
    check_delivered("after the restart", &owed, &delivered);

    // `spool cluster status` over the three admin ports: healthy, and every
    // replica (the restarted one too) folded up to the committed index.
    let admins: Vec<String> = cluster.nodes().iter().map(|node| node.admin_addr()).collect();
    let started = now();
    loop {
        let output = std::process::Command::new(spool_tests::spool_bin())
            .args(["cluster", "status", "--json", "--admin", &admins.join(",")])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("cluster status --json: {error}: {output:?}"));
        let lags: Vec<Option<u64>> = report["partitions"]
            .as_array()
            .map(|partitions| partitions.iter().map(|p| p["lag_entries"].as_u64()).collect())
            .unwrap_or_default();
        let caught_up = lags.len() == PARTITIONS as usize && lags.iter().all(|lag| *lag == Some(0));
        if output.status.success() && report["healthy"] == true && caught_up {
            eprintln!("cluster status: healthy, lags {lags:?}");
            break;
        }
        assert!(
            started.elapsed() < METADATA_TIMEOUT,
            "cluster status not healthy and caught up after {METADATA_TIMEOUT:?}: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
