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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{DescribeQueueResponse, PartitionId};
use spool_client::spool_wire::routing::key_partition;
use spool_client::{
    Admin, ClaimOptions, Client, Consumer, ConsumerConfig, Delivery, Message, PayloadView, Producer,
};
use spool_tests::cluster::{
    bounded, check_delivered, client_at, create_queue, drain, led, produce, producer_on, Cluster,
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

// ---- A queue resized under load; the leader of a draining partition killed ----

/// The queue the resize test grows from 4 partitions to 5.
const RESIZED: &str = "orders";
/// Keys of the resize test (`key-<n>`): one message each per round.
const RESIZE_KEYS: u32 = 300;
/// Rounds acknowledged before the resize is sent.
const ROUNDS_BEFORE_RESIZE: u32 = 3;
/// Rounds started after the resize was answered.
const ROUNDS_AFTER_RESIZE: u32 = 5;
/// Most rounds in all: production ends there however slow the resize.
const ROUNDS_MAX: u32 = 60;
/// Lease of the messages the holder keeps (the queue's longest): longer
/// than the test, so only their leader's death gives them back.
const HOLD_LEASE_MS: u32 = 60_000;
/// Lease of the consumer's and the added partition's worker's claims: an
/// ack whose answer the kill cut off costs one lease before its message
/// comes back (and holds the drain that long).
const WORK_LEASE_MS: u32 = 5_000;
/// Bound of the wait until every acknowledged message was handled.
const RESIZE_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// One handled delivery of the resize test: its key, its sequence within
/// the key, its partition, and when its handling started and ended (the
/// end is before its ack is sent).
#[derive(Debug, Clone, Copy)]
struct Handled {
    key: u32,
    sequence: u32,
    partition: PartitionId,
    started: Instant,
    ended: Instant,
}

/// The routing key of key `key`.
fn key_name(key: u32) -> String {
    format!("key-{key}")
}

/// Whether growing 4 → 5 partitions moves `key`.
fn moved_by_resize(key: u32) -> bool {
    let name = key_name(key);
    key_partition(name.as_bytes(), 4) != key_partition(name.as_bytes(), 5)
}

/// The key and sequence of a resize-test payload (`<key>/<sequence>`).
fn key_and_sequence(delivery: &Delivery) -> (u32, u32) {
    let PayloadView::Inline(bytes) = delivery.payload() else { panic!("payload not inline") };
    let text = std::str::from_utf8(bytes).unwrap();
    let (key, sequence) = text.split_once('/').unwrap();
    (key.parse().unwrap(), sequence.parse().unwrap())
}

/// What one producer of the resize test sent.
#[derive(Debug, Default)]
struct Sent {
    /// Every acknowledged (key, sequence), with the partition the producer
    /// routed it to when it was submitted (a `KEY_MOVED` routes it again).
    acked: BTreeMap<(u32, u32), PartitionId>,
    /// The failed sends, in words.
    failed: Vec<String>,
}

/// Sends round `sequence` (one message per key of `keys`) through
/// `producer` and waits for every answer.
async fn send_round(producer: &Producer, keys: &[u32], sequence: u32, sent: &mut Sent) {
    let mut pending = Vec::new();
    for &key in keys {
        let message = Message::new(format!("{key}/{sequence}")).key(key_name(key));
        match producer.submit(RESIZED, message).await {
            Ok(future) => pending.push((key, future.partition(), future)),
            Err(error) => sent.failed.push(format!("submit {key}/{sequence}: {error}")),
        }
    }
    for (key, routed, future) in pending {
        match future.await {
            Ok(_) => {
                sent.acked.insert((key, sequence), routed);
            }
            Err(error) => sent.failed.push(format!("{key}/{sequence}: {error}")),
        }
    }
}

/// [`RESIZED`] as `admin` describes it once `wanted` holds, asked again
/// (errors included: a partition's owner may be dead or being elected)
/// until [`METADATA_TIMEOUT`] passes.
async fn describe_when(
    admin: &Admin,
    what: &str,
    wanted: impl Fn(&DescribeQueueResponse) -> bool,
) -> DescribeQueueResponse {
    let started = now();
    loop {
        let last = admin.describe_queue(RESIZED).await;
        match &last {
            Ok(described) if wanted(described) => return described.clone(),
            _ if started.elapsed() >= METADATA_TIMEOUT => {
                panic!("{what}: not so after {METADATA_TIMEOUT:?}: {last:?}")
            }
            // A bounded poll: the key map and the leaders settle in time.
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The first answered claim of `partition` through `client` (errors are
/// asked again: a new partition's leader may not be elected yet), for up
/// to [`METADATA_TIMEOUT`].
async fn claim_answered(
    client: &Client,
    partition: PartitionId,
    options: &ClaimOptions,
) -> Vec<Delivery> {
    let started = now();
    loop {
        match client.claim(RESIZED, partition, options).await {
            Ok(batch) => return batch.deliveries,
            Err(error) if started.elapsed() < METADATA_TIMEOUT => {
                eprintln!("claim {RESIZED}/{}: {error}; again", partition.0);
                // A bounded pause: a leader may be being elected.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("claim {RESIZED}/{}: {error}", partition.0),
        }
    }
}

/// Claims from `partition` through `client` with leases of
/// [`HOLD_LEASE_MS`] until it holds a message of a key the resize moves;
/// returns what it claimed, which it never acks: the partition cannot
/// drain while they are held.
async fn hold_some(client: &Client, partition: PartitionId) -> Vec<Delivery> {
    let options = ClaimOptions::new(16).lease_ms(HOLD_LEASE_MS).wait_ms(1_000);
    let started = now();
    let mut held: Vec<Delivery> = Vec::new();
    while !held.iter().any(|delivery| moved_by_resize(key_and_sequence(delivery).0)) {
        assert!(
            started.elapsed() < METADATA_TIMEOUT,
            "no message of a moved key of partition {} held after {METADATA_TIMEOUT:?} ({} held)",
            partition.0,
            held.len()
        );
        held.extend(claim_answered(client, partition, &options).await);
    }
    held
}

/// Long-polls partition 4 alone through `client` until `stop`, recording
/// each delivery in `log` and acking each batch (a failed ack is only
/// reported: its messages come back).
async fn work_added_partition(
    client: Client,
    log: Arc<Mutex<Vec<Handled>>>,
    stop: Arc<AtomicBool>,
) {
    let options = ClaimOptions::new(64).lease_ms(WORK_LEASE_MS).wait_ms(500);
    while !stop.load(Ordering::Acquire) {
        let batch = match client.claim(RESIZED, PartitionId(4), &options).await {
            Ok(batch) => batch,
            Err(error) => {
                eprintln!("the added partition's worker: claim: {error}; again");
                // A bounded pause: its leader may be being elected.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut tokens = Vec::new();
        for delivery in &batch.deliveries {
            let started = now();
            let (key, sequence) = key_and_sequence(delivery);
            let partition = delivery.partition();
            log.lock().unwrap().push(Handled { key, sequence, partition, started, ended: now() });
            tokens.push(delivery.token());
        }
        if !tokens.is_empty() {
            if let Err(error) = client.ack(RESIZED, PartitionId(4), &tokens).await {
                eprintln!("the added partition's worker: ack of {}: {error}", tokens.len());
            }
        }
    }
}

// Goal: a replicated queue grown 4 → 5 partitions while producers and a
// consumer run moves ≤ 1/5 + 0.07 of its keys, each only into the added
// partition; the added partition hands out nothing until every older
// partition finished what it held before the resize, one of them drained
// only after its leader was SIGKILLed (so its new leader reports the
// drain); nothing acknowledged is lost and each moved key's order holds
// across the move.
// Method: 3 nodes of 1 shard, a queue of 4 partitions (replication factor
// 3); 300 keys, one message per key a round, rounds back to back from two
// producers: even keys from one whose client learned the queue before the
// resize and is never told of it (its moved keys come back KEY_MOVED and
// are routed again), odd keys from one on the admin's client. A Consumer
// (64 slots, 2 ms a message, 5 s leases) runs throughout. After 3 rounds
// a holder claims messages of partition 0 with 60 s leases (at least one
// of a moved key) and never acks them, so partition 0 cannot drain while
// its leader lives. Then the resize, production going on: the key map shows the hold,
// a direct claim of partition 4 finds nothing, and a worker long-polls
// partition 4 alone from then on. 5 rounds after the resize production
// ends; partition 0 still drains; its leader is SIGKILLed (the new
// leader's term fences the holder's tokens, the messages come back, the
// Consumer finishes them and the new leader reports the drain). Every
// acknowledged message must then be handled; the killed node restarts and
// the key map shows nothing draining over 5 partitions. The checks are
// `e2e/resize.rs`'s, plus: no message of partition 4 handed out before the
// kill, and partition 0's drain reported by a survivor (node logs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_resized_under_load_holds_its_added_partition_across_a_leader_kill() {
    let test_started = now();
    let mut cluster = tokio::task::block_in_place(|| Cluster::start(3, 1));
    for node in cluster.nodes() {
        eprintln!("node {}: client {}, admin {}", node.id(), node.client_addr(), node.admin_addr());
    }
    bounded(
        "create",
        CREATE_TIMEOUT,
        create_queue(&cluster.node(1).client_addr(), RESIZED, test_queue_config(4, 30_000, 100)),
    )
    .await;
    let held_partition = PartitionId(0);
    let leaders = led(&cluster, RESIZED, 4, METADATA_TIMEOUT).await;
    // Every client but the stale producer's talks to a node that does not
    // lead partition 0 (it survives the kill); the stale one to the third.
    let planned_victim = leaders[held_partition.0 as usize];
    let home = (planned_victim + 1) % 3;
    let elsewhere = (planned_victim + 2) % 3;
    eprintln!(
        "leaders {leaders:?}: partition 0 led by node {}; clients on node {}, the stale producer \
         on node {}",
        planned_victim + 1,
        home + 1,
        elsewhere + 1
    );
    let client = client_at(&cluster.node(home).client_addr()).await;
    spool_tests::cluster::wait_for_queue(&client, RESIZED, 4).await;
    let admin = Admin::new(client.clone());
    let stale = client_at(&cluster.node(elsewhere).client_addr()).await;
    // The stale client learns the queue (4 partitions) now.
    spool_tests::cluster::wait_for_queue(&stale, RESIZED, 4).await;
    let stale_producer = producer_on(stale.clone());
    let fresh_producer = producer_on(client.clone());

    let handled: Arc<Mutex<Vec<Handled>>> = Arc::default();
    let mut config = ConsumerConfig::new(RESIZED, 64);
    config.wait_ms = 500;
    config.lease_ms = WORK_LEASE_MS;
    let log = Arc::clone(&handled);
    let consumer = Consumer::start(client.clone(), config, move |delivery: Delivery| {
        let log = Arc::clone(&log);
        async move {
            let started = now();
            let (key, sequence) = key_and_sequence(&delivery);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let partition = delivery.partition();
            log.lock().unwrap().push(Handled { key, sequence, partition, started, ended: now() });
            Ok::<(), std::convert::Infallible>(())
        }
    })
    .unwrap();

    // Production: rounds back to back until `last_round`, which the
    // resize's answer sets.
    let last_round = Arc::new(AtomicU32::new(ROUNDS_MAX));
    let (rounds_done, mut rounds) = tokio::sync::watch::channel(0u32);
    let production = {
        let last_round = Arc::clone(&last_round);
        tokio::spawn(async move {
            let even: Vec<u32> = (0..RESIZE_KEYS).filter(|key| key % 2 == 0).collect();
            let odd: Vec<u32> = (0..RESIZE_KEYS).filter(|key| key % 2 == 1).collect();
            let (mut stale_sent, mut fresh_sent) = (Sent::default(), Sent::default());
            let mut sequence = 0;
            while sequence < last_round.load(Ordering::Acquire) {
                tokio::join!(
                    send_round(&stale_producer, &even, sequence, &mut stale_sent),
                    send_round(&fresh_producer, &odd, sequence, &mut fresh_sent),
                );
                sequence += 1;
                let _ = rounds_done.send(sequence);
            }
            stale_producer.close().await;
            fresh_producer.close().await;
            (stale_sent, fresh_sent)
        })
    };
    bounded(
        "the rounds before the resize",
        PRODUCE_TIMEOUT,
        rounds.wait_for(|done| *done >= ROUNDS_BEFORE_RESIZE),
    )
    .await
    .unwrap();
    let held = bounded("the hold", PRODUCE_TIMEOUT, hold_some(&client, held_partition)).await;
    let held_keys: BTreeSet<u32> =
        held.iter().map(|delivery| key_and_sequence(delivery).0).collect();
    eprintln!(
        "holding {} messages of partition 0 (keys {held_keys:?}); resizing after {} rounds",
        held.len(),
        *rounds.borrow()
    );

    let key_version =
        bounded("the resize", CREATE_TIMEOUT, admin.resize_queue(RESIZED, 5)).await.unwrap();
    let resized_round = *rounds.borrow();
    last_round.store(resized_round + 1 + ROUNDS_AFTER_RESIZE, Ordering::Release);
    eprintln!(
        "resized at {} ms (key map version {key_version}) during round {resized_round}",
        test_started.elapsed().as_millis()
    );
    assert_eq!(key_version, 2);
    let described =
        describe_when(&admin, "the resize in the key map", |described| described.keys.version == 2)
            .await;
    assert_eq!(described.keys.held_from, 4, "{:?}", described.keys);
    assert!(described.keys.draining.contains(&held_partition), "{:?}", described.keys);
    // Held: partition 0 still holds messages from before the resize.
    let early = claim_answered(&client, PartitionId(4), &ClaimOptions::new(64).wait_ms(300)).await;
    assert!(early.is_empty(), "the added partition handed out {} messages", early.len());
    let stop_worker = Arc::new(AtomicBool::new(false));
    let added_worker = tokio::spawn(work_added_partition(
        client.clone(),
        Arc::clone(&handled),
        Arc::clone(&stop_worker),
    ));

    let (stale_sent, fresh_sent) =
        bounded("production", PRODUCE_TIMEOUT, production).await.unwrap();
    let failed: Vec<&String> = stale_sent.failed.iter().chain(&fresh_sent.failed).collect();
    assert!(
        failed.is_empty(),
        "{} sends failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let mut sent: BTreeMap<(u32, u32), PartitionId> = stale_sent.acked.clone();
    sent.extend(&fresh_sent.acked);
    eprintln!(
        "produced {} messages in {} rounds by {} ms",
        sent.len(),
        last_round.load(Ordering::Acquire),
        test_started.elapsed().as_millis()
    );

    // Partition 0 still drains: the holder holds messages of it.
    let described = describe_when(&admin, "the key map before the kill", |_| true).await;
    assert!(described.keys.draining.contains(&held_partition), "{:?}", described.keys);
    let leaders = led(&cluster, RESIZED, 5, METADATA_TIMEOUT).await;
    let victim = leaders[held_partition.0 as usize];
    assert_ne!(victim, home, "partition 0's lead moved to the clients' node: {leaders:?}");
    eprintln!(
        "draining {:?}; killing node {} (leaders {leaders:?})",
        described.keys.draining,
        victim + 1
    );
    let killed_at = now();
    tokio::task::block_in_place(|| cluster.kill(victim));
    drop(held);

    let started = now();
    let mut missing: Vec<(u32, u32)>;
    loop {
        let seen: HashSet<(u32, u32)> =
            handled.lock().unwrap().iter().map(|item| (item.key, item.sequence)).collect();
        missing = sent.keys().filter(|id| !seen.contains(id)).copied().collect();
        if missing.is_empty() || started.elapsed() >= RESIZE_DRAIN_TIMEOUT {
            break;
        }
        // A bounded poll: the consumer and the worker record as they go.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !missing.is_empty() {
        let keys = admin.describe_queue(RESIZED).await.map(|described| described.keys);
        panic!(
            "{} acknowledged messages not handled {RESIZE_DRAIN_TIMEOUT:?} after the kill, e.g. \
             {:?}; key map {keys:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
    eprintln!(
        "every acknowledged message handled {} ms after the kill",
        killed_at.elapsed().as_millis()
    );

    let restarted = tokio::task::block_in_place(|| cluster.restart(victim));
    if let Err(failure) = restarted {
        panic!("restart of node {}: {failure}", victim + 1);
    }
    let ready = tokio::task::block_in_place(|| cluster.wait_ready(victim, READY_TIMEOUT));
    if let Err(last) = ready {
        panic!("node {} not ready after its restart: {last}", victim + 1);
    }
    let described = describe_when(&admin, "nothing draining over 5 partitions", |described| {
        described.keys.draining.is_empty() && described.partitions.len() == 5
    })
    .await;
    eprintln!("after the restart: key map {:?}", described.keys);
    stop_worker.store(true, Ordering::Release);
    let stats = bounded("the consumer's shutdown", DRAIN_TIMEOUT, consumer.shutdown()).await;
    bounded("the added partition's worker", DRAIN_TIMEOUT, added_worker).await.unwrap();
    let handled = handled.lock().unwrap().clone();
    eprintln!("consumer: {stats:?}; {} deliveries handled in all", handled.len());

    // Nothing acknowledged lost (a message may come twice after the kill).
    let mut by_message: BTreeMap<(u32, u32), Vec<Handled>> = BTreeMap::new();
    for item in &handled {
        by_message.entry((item.key, item.sequence)).or_default().push(*item);
    }
    let lost: Vec<&(u32, u32)> = sent.keys().filter(|id| !by_message.contains_key(id)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged messages lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let twice = by_message.values().filter(|deliveries| deliveries.len() > 1).count();

    // Placement: a key's messages in its partition by 4; a key the resize
    // moves (≈ 1/5 of them, only into partition 4) has messages in both.
    let moved: BTreeSet<u32> = (0..RESIZE_KEYS).filter(|&key| moved_by_resize(key)).collect();
    for key in &moved {
        let name = key_name(*key);
        assert_eq!(
            key_partition(name.as_bytes(), 5),
            4,
            "key {key} moved between older partitions"
        );
    }
    let fraction = moved.len() as f64 / f64::from(RESIZE_KEYS);
    assert!(
        (0.2 - 0.07..=0.2 + 0.07).contains(&fraction),
        "{} of {RESIZE_KEYS} keys moved",
        moved.len()
    );
    let mut in_added: BTreeSet<u32> = BTreeSet::new();
    for ((key, sequence), deliveries) in &by_message {
        let before = PartitionId(key_partition(key_name(*key).as_bytes(), 4));
        for item in deliveries {
            if item.partition == PartitionId(4) {
                assert!(moved.contains(key), "key {key} seq {sequence} in the added partition");
                in_added.insert(*key);
            } else {
                assert_eq!(item.partition, before, "key {key} seq {sequence}");
            }
        }
    }
    assert_eq!(in_added, moved, "the keys with messages in the added partition");

    // The added partition handed out nothing before the kill: partition 0
    // could not drain while its first leader lived.
    let added: Vec<&Handled> =
        handled.iter().filter(|item| item.partition == PartitionId(4)).collect();
    let first_added = added.iter().map(|item| item.started).min().unwrap();
    assert!(
        first_added > killed_at,
        "the added partition handed out a message {:?} before the kill",
        killed_at - first_added
    );

    // Per-key order across the move. A moved key's messages of its old
    // partition must all be earlier (by sequence) than those of partition
    // 4: rounds are acknowledged one after the other, and a partition
    // refuses moved keys from the resize on. And no message of partition 4
    // may be handed out before each earlier one of its key was finished
    // (acked). Its start is compared with the LAST end among every
    // delivery of those earlier messages, redeliveries included: the hold
    // lifts only once each of them was acked, and an acked message is not
    // delivered again, so each delivery of them was handed out before the
    // lift; the delivery whose ack took ended before it (ends are taken
    // before the ack is sent), and one whose ack did not take (its leader
    // died) ended within its 2 ms handler, long before the new leader
    // handed the message out again — also before the lift.
    for key in &moved {
        let deliveries: Vec<&Handled> =
            by_message.range((*key, 0)..(*key + 1, 0)).flat_map(|(_, all)| all).collect();
        let (old, new): (Vec<&Handled>, Vec<&Handled>) =
            deliveries.into_iter().partition(|item| item.partition != PartitionId(4));
        let Some(last_end) = old.iter().map(|item| item.ended).max() else { continue };
        let last_old = old.iter().map(|item| item.sequence).max().unwrap();
        let first_new = new.iter().map(|item| item.sequence).min().unwrap();
        assert!(
            last_old < first_new,
            "key {key}: seq {last_old} in its old partition, seq {first_new} already in the added one"
        );
        for item in new {
            assert!(
                item.started > last_end,
                "key {key} seq {} handed out {:?} before its earlier messages ended",
                item.sequence,
                last_end - item.started
            );
        }
    }

    // KEY_MOVED: the stale producer routed some messages by 4 partitions
    // that were taken by partition 4.
    let rerouted = |sent: &Sent| {
        sent.acked.iter().filter(|(id, routed)| by_message[*id][0].partition != **routed).count()
    };
    let (stale_rerouted, fresh_rerouted) = (rerouted(&stale_sent), rerouted(&fresh_sent));
    assert!(stale_rerouted > 0, "the stale producer never had a key moved");

    // Partition 0's drain was reported by a survivor (its new leader),
    // never by the node killed while it drained.
    let reports: Vec<usize> = cluster
        .nodes()
        .iter()
        .map(|node| {
            let text = node.log();
            text.lines()
                .filter(|line| {
                    line.contains("older partition drained")
                        && line.contains(&format!("queue={RESIZED} partition=0 key_version=2"))
                })
                .count()
        })
        .collect();
    eprintln!("drain reports of partition 0 by node: {reports:?}");
    assert_eq!(reports[victim], 0, "the killed node reported partition 0 drained");
    assert!(reports.iter().sum::<usize>() > 0, "no node reported partition 0 drained");
    eprintln!(
        "resize under load: {} of {RESIZE_KEYS} keys moved ({fraction:.3}); {} messages, {twice} \
         handled more than once; rerouted after KEY_MOVED: {stale_rerouted} (stale producer), \
         {fresh_rerouted} (fresh); first message of partition 4 {} ms after the kill; {} ms in all",
        moved.len(),
        sent.len(),
        (first_added - killed_at).as_millis(),
        test_started.elapsed().as_millis()
    );
}
