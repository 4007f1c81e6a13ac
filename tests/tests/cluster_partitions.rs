//! A cluster of real `spoold` processes under a network partition and a
//! slow disk (`docs/design/replication.md` §7, the failure cases):
//!
//! - a leader cut off from the majority by the peer relay
//!   (`tests/src/netcut.rs`: its peer links severed, then blackholed),
//!   still running and reachable by its clients: it steps down by itself
//!   (check quorum), the others elect a leader of a higher term, sends held
//!   by the cut-off node end through redirects or fail (never acknowledged
//!   and lost), no two nodes serve a partition in the same term (sampled
//!   from every node's metrics all along), and healed it follows;
//! - a follower whose every journal sync stalls its shard for
//!   [`SLOW_SYNC_MS`] (the `journal.commit.sync` failpoint): the leader
//!   commits with the other follower, so a send's round trip stays far
//!   below the stall; restarted with a healthy disk the follower catches
//!   up, and the leader killed then loses nothing acknowledged;
//! - every node killed at once after each wrote checkpoints of a partition
//!   (70,000 messages: past the checkpoint interval), then restarted: each
//!   reopens from its checkpoint (its log says so) with its whole log
//!   still read back by index, and the queue holds every message.
//!
//! Every wait is bounded; the test runs under nextest's per-test timeout.
//! Like every end-to-end test it runs the binaries `scripts/test.sh` built
//! (`SPOOL_E2E_SPOOLD`, `SPOOL_E2E_SPOOLD_FAILPOINTS`), or builds them.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::Admin;
use spool_tests::cluster::{
    assert_all_sent, bounded, check_delivered, client_at, create_queue, drain, led, millis_since,
    produce, producer_on, start_with_queue, try_http_get, wait_for_queue, Cluster, ClusterOptions,
};
use spool_tests::{now, test_queue_config};

const QUEUE: &str = "jobs";
const PARTITIONS: u32 = 2;

const LEAD_TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);
const CREATE_BOUND: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The sends a cut-off node held end within this (the producer's retries
/// outlast an election; see `producer_on`).
const HELD_SENDS_BOUND: Duration = Duration::from_secs(60);

/// How long each journal sync of the slow follower stalls its shard.
const SLOW_SYNC_MS: u64 = 1_000;

/// Starts `options` with [`QUEUE`], every partition led.
async fn cluster_with_queue(options: ClusterOptions) -> (Cluster, Vec<usize>) {
    start_with_queue(options, QUEUE, PARTITIONS, LEAD_TIMEOUT).await
}

/// [`led`] for [`QUEUE`].
async fn wait_led(cluster: &Cluster) -> Vec<usize> {
    led(cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await
}

/// One metric of [`QUEUE`] by partition from a metrics text.
fn per_partition(metrics: &str, name: &str) -> BTreeMap<u32, f64> {
    let prefix = format!("{name}{{");
    let queue = format!("queue=\"{QUEUE}\"");
    metrics
        .lines()
        .filter_map(|line| {
            let (labels, value) = line.strip_prefix(&prefix)?.split_once("} ")?;
            if !labels.contains(&queue) {
                return None;
            }
            let partition = labels.split("partition=\"").nth(1)?.split('"').next()?.parse().ok()?;
            Some((partition, value.trim().parse().ok()?))
        })
        .collect()
}

/// Samples every node's metrics until stopped: the (partition, term) pairs
/// and the nodes that said they served them in that term.
fn sample_leaders(
    admins: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<BTreeMap<(u32, u64), BTreeSet<usize>>> {
    std::thread::spawn(move || {
        let mut seen: BTreeMap<(u32, u64), BTreeSet<usize>> = BTreeMap::new();
        while !stop.load(Ordering::SeqCst) {
            for (index, admin) in admins.iter().enumerate() {
                let Ok((200, text)) = try_http_get(admin, "/metrics") else { continue };
                let serving = per_partition(&text, "spool_partition_serving");
                let terms = per_partition(&text, "spool_partition_term");
                for (partition, value) in serving {
                    if value >= 1.0 {
                        let term = terms.get(&partition).copied().unwrap_or(0.0) as u64;
                        seen.entry((partition, term)).or_default().insert(index);
                    }
                }
            }
            // A bounded poll: every node is asked again each time.
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

/// The term node `index` reports for partition `partition`, and whether it
/// serves it.
fn role(cluster: &Cluster, index: usize, partition: u32) -> Option<(u64, bool)> {
    let text = cluster.metrics(index).ok()?;
    let term = *per_partition(&text, "spool_partition_term").get(&partition)? as u64;
    let serving = per_partition(&text, "spool_partition_serving").get(&partition)? >= &1.0;
    Some((term, serving))
}

// Goal: a leader cut off from its peers (running, reachable by clients)
// loses nothing acknowledged and never leads beside another leader in its
// term. Method: as the module doc says; 300 sends before the cut, 100
// through a client of the cut-off node during it, 300 through a survivor;
// every acknowledged send drained after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_majority_is_replaced_and_loses_nothing() {
    let (cluster, leaders) = cluster_with_queue(ClusterOptions::new(3, 1).with_peer_relay()).await;
    let victim = leaders[0];
    let survivor = (0..3).find(|&index| index != victim).unwrap();
    let admins = cluster.nodes().iter().map(|node| node.admin_addr()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_leaders(admins, stop.clone());

    let client = client_at(&cluster.node(survivor).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let producer = producer_on(client.clone());
    let (mut acked, failed) =
        bounded("produce", PRODUCE_TIMEOUT, produce(&producer, QUEUE, PARTITIONS, 1, 0..300)).await;
    assert_all_sent("before the cut", &failed);
    let (old_term, _) = tokio::task::block_in_place(|| role(&cluster, victim, 0))
        .expect("the leader reports its term");
    let cut_client = client_at(&cluster.node(victim).client_addr()).await;
    wait_for_queue(&cut_client, QUEUE, PARTITIONS).await;
    let cut_producer = producer_on(cut_client.clone());

    eprintln!("cutting node {} off (leads partition 0 in term {old_term})", victim + 1);
    let cut = now();
    cluster.cut_off(victim);
    let held = {
        let producer = cut_producer.clone();
        tokio::spawn(async move { produce(&producer, QUEUE, PARTITIONS, 1, 300..400).await })
    };
    // The cut-off node still runs and answers its metrics: the partitions
    // are led by one node each, another than it, only once it stepped
    // down by itself.
    let after = loop {
        let serving = tokio::task::block_in_place(|| cluster.serving(QUEUE, PARTITIONS));
        if serving.iter().all(|node| node.is_some_and(|node| node != victim)) {
            break serving.into_iter().flatten().collect::<Vec<_>>();
        }
        assert!(
            cut.elapsed() < LEAD_TIMEOUT,
            "{LEAD_TIMEOUT:?} after the cut the partitions are served by {serving:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("led by {after:?} {} ms after the cut", millis_since(cut));
    let (still_term, still_serving) =
        tokio::task::block_in_place(|| role(&cluster, victim, 0)).expect("the cut-off node runs");
    assert!(!still_serving, "the cut-off node serves partition 0 in term {still_term}");
    let (more, failed) =
        bounded("produce", PRODUCE_TIMEOUT, produce(&producer, QUEUE, PARTITIONS, 1, 400..700))
            .await;
    assert_all_sent("while the leader was cut off", &failed);
    acked.extend(more);

    cluster.heal();
    let healed = now();
    let new_leader = after[0];
    loop {
        let replicas = tokio::task::block_in_place(|| cluster.replicas(victim, QUEUE));
        let term = tokio::task::block_in_place(|| role(&cluster, victim, 0)).map(|(term, _)| term);
        let follows = replicas.as_ref().is_ok_and(|replicas| {
            replicas
                .get(&0)
                .is_some_and(|&(leader, serving)| !serving && leader == new_leader as u64 + 1)
        });
        if follows && term.is_some_and(|term| term > old_term) {
            eprintln!(
                "node {} follows node {} in term {term:?} {} ms after the heal",
                victim + 1,
                new_leader + 1,
                millis_since(healed)
            );
            break;
        }
        assert!(
            healed.elapsed() < LEAD_TIMEOUT,
            "node {} does not follow {LEAD_TIMEOUT:?} after the heal: {replicas:?}, term {term:?}",
            victim + 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (held_acked, held_failed) =
        bounded("the held sends", HELD_SENDS_BOUND, held).await.unwrap();
    eprintln!(
        "of the 100 sends through the cut-off node: {} acknowledged, {} failed{}",
        held_acked.len(),
        held_failed.len(),
        held_failed.first().map_or(String::new(), |first| format!(" (first: {first})"))
    );
    acked.extend(held_acked);
    cut_producer.close().await;
    producer.close().await;
    drop(cut_client);

    let owed: HashSet<MessageId> = acked.into_iter().collect();
    let (delivered, _) = drain(&client, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
    check_delivered("a leader cut off and healed", &owed, &delivered);

    stop.store(true, Ordering::SeqCst);
    let seen = sampler.join().unwrap();
    eprintln!("(partition, term) → serving nodes sampled: {seen:?}");
    for ((partition, term), nodes) in &seen {
        assert!(nodes.len() == 1, "partition {partition} served in term {term} by nodes {nodes:?}");
    }
    let victim_terms: Vec<_> =
        seen.iter().filter(|(_, nodes)| nodes.contains(&victim)).map(|(key, _)| *key).collect();
    assert!(
        seen.keys().any(|&(partition, term)| partition == 0 && term > old_term),
        "no leader of partition 0 above term {old_term} was sampled; node {} led {victim_terms:?}",
        victim + 1
    );
}

// Goal: a follower's slow disk does not hold its leader back, and once
// healthy it catches up. Method: a node that leads no partition restarted
// with every journal sync stalling its shard SLOW_SYNC_MS; 30 sends one at
// a time through a healthy node, their median round trip below half the
// stall (were the slow follower needed for a commit, every one would take
// at least the stall); then 300 more at once; the node restarted with a
// healthy disk catches up to the leaders' committed indexes; the leader of
// partition 0 killed; everything drained, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_slow_disk_does_not_hold_its_leader_back() {
    let (mut cluster, leaders) = cluster_with_queue(ClusterOptions::new(3, 1)).await;
    let slow = (0..3).find(|index| !leaders.contains(index)).unwrap();
    let healthy = (0..3).find(|&index| index != slow && index != leaders[0]).unwrap_or(leaders[0]);
    eprintln!("leaders {leaders:?}; node {} gets a slow disk", slow + 1);
    tokio::task::block_in_place(|| cluster.kill(slow));
    let failpoints = format!("journal.commit.sync=delay({SLOW_SYNC_MS})");
    cluster.set_failpoints(slow, Some(&failpoints));
    tokio::task::block_in_place(|| cluster.restart(slow))
        .unwrap_or_else(|failure| panic!("restart of node {}: {failure}", slow + 1));

    let client = client_at(&cluster.node(healthy).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let producer = producer_on(client.clone());
    let mut acked = Vec::new();
    let mut round_trips = Vec::new();
    for sequence in 0..30 {
        let sent = now();
        let (ids, failed) = bounded(
            "one send",
            PRODUCE_TIMEOUT,
            produce(&producer, QUEUE, PARTITIONS, 2, sequence..sequence + 1),
        )
        .await;
        assert_all_sent("beside the slow follower", &failed);
        round_trips.push(sent.elapsed());
        acked.extend(ids);
    }
    // The stall was armed, and held the follower back: it had not applied
    // what its leader committed.
    let log = cluster.node(slow).log();
    assert!(
        log.contains("failpoints armed") && log.contains("journal.commit.sync"),
        "node {} runs without the stall",
        slow + 1
    );
    let lag: Vec<i64> = (0..PARTITIONS)
        .map(|partition| {
            let leader = leaders[partition as usize];
            let index = |node: usize| {
                tokio::task::block_in_place(|| cluster.indexes(node, QUEUE))
                    .ok()
                    .and_then(|found| found.get(&partition).copied())
            };
            match (index(leader), index(slow)) {
                (Some(leader), Some(own)) => leader.committed as i64 - own.applied as i64,
                _ => -1,
            }
        })
        .collect();
    eprintln!("node {} behind its leaders by {lag:?} entries", slow + 1);
    assert!(lag.iter().any(|&behind| behind > 0), "the slow follower kept up: {lag:?}");
    round_trips.sort();
    let median = round_trips[round_trips.len() / 2];
    eprintln!(
        "round trips beside a follower syncing in {SLOW_SYNC_MS} ms: median {median:?}, max {:?}",
        round_trips.last().unwrap()
    );
    assert!(
        median < Duration::from_millis(SLOW_SYNC_MS / 2),
        "a send's median round trip {median:?} waits for the slow follower's {SLOW_SYNC_MS} ms sync"
    );
    let (more, failed) =
        bounded("produce", PRODUCE_TIMEOUT, produce(&producer, QUEUE, PARTITIONS, 2, 30..330))
            .await;
    assert_all_sent("a burst beside the slow follower", &failed);
    acked.extend(more);

    eprintln!("node {} restarted with a healthy disk", slow + 1);
    tokio::task::block_in_place(|| cluster.kill(slow));
    cluster.set_failpoints(slow, None);
    tokio::task::block_in_place(|| cluster.restart(slow))
        .unwrap_or_else(|failure| panic!("restart of node {}: {failure}", slow + 1));
    tokio::task::block_in_place(|| cluster.wait_ready(slow, READY_TIMEOUT))
        .unwrap_or_else(|last| panic!("node {} not ready: {last}", slow + 1));
    let caught_up = now();
    loop {
        let own = tokio::task::block_in_place(|| cluster.indexes(slow, QUEUE)).unwrap_or_default();
        let behind: Vec<u32> = (0..PARTITIONS)
            .filter(|&partition| {
                let leader = leaders[partition as usize];
                let committed = tokio::task::block_in_place(|| cluster.indexes(leader, QUEUE))
                    .ok()
                    .and_then(|found| found.get(&partition).map(|indexes| indexes.committed));
                let applied = own.get(&partition).map(|indexes| indexes.applied);
                !matches!((committed, applied), (Some(committed), Some(applied)) if applied >= committed)
            })
            .collect();
        if behind.is_empty() {
            eprintln!("node {} caught up in {} ms", slow + 1, millis_since(caught_up));
            break;
        }
        assert!(
            caught_up.elapsed() < LEAD_TIMEOUT,
            "node {} still behind on partitions {behind:?} after {LEAD_TIMEOUT:?}",
            slow + 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let victim = leaders[0];
    eprintln!("killing node {} (leads partition 0)", victim + 1);
    tokio::task::block_in_place(|| cluster.kill(victim));
    let after = wait_led(&cluster).await;
    assert!(!after.contains(&victim), "{after:?}");
    producer.close().await;
    let survivor = (0..3).find(|&index| index != victim).unwrap();
    let consumer = client_at(&cluster.node(survivor).client_addr()).await;
    let owed: HashSet<MessageId> = acked.into_iter().collect();
    let (delivered, _) = drain(&consumer, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
    check_delivered("beside a slow follower, then its leader killed", &owed, &delivered);
}

/// Messages past `CHECKPOINT_INTERVAL_OFFSETS` (65,536): every member of a
/// partition writes a checkpoint while they are sent.
const PAST_CHECKPOINT_INTERVAL: u64 = 70_000;

/// Whether node `index`'s partition 0 of [`QUEUE`] has a checkpoint file.
fn has_checkpoint(cluster: &Cluster, index: usize) -> bool {
    let partitions = cluster.node(index).data_dir().join("partitions");
    let Ok(queues) = std::fs::read_dir(partitions) else { return false };
    queues.flatten().any(|queue| queue.path().join("p00000").join("checkpoint").is_file())
}

// Goal: a cluster whose members wrote checkpoints comes back from a crash
// of every node: each reopens from its checkpoint (the shard reads its
// whole journal for a replicated log, not from the checkpoint's scan
// start) and nothing is lost. Method: one partition, 70,000 messages
// through a producer, every node's checkpoint file awaited, all nodes
// SIGKILLed at once and restarted, the queue described through a
// survivor: every message ready; each node's log reports the reopen from a
// checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_killed_after_checkpoints_reopens_from_them() {
    let mut cluster =
        tokio::task::block_in_place(|| Cluster::start_with(ClusterOptions::new(3, 1)));
    bounded(
        "create",
        CREATE_BOUND,
        create_queue(&cluster.node(1).client_addr(), QUEUE, test_queue_config(1, 30_000, 100)),
    )
    .await;
    tokio::task::block_in_place(|| cluster.wait_led(QUEUE, 1, LEAD_TIMEOUT))
        .unwrap_or_else(|last| panic!("{last}"));
    let client = client_at(&cluster.node(0).client_addr()).await;
    wait_for_queue(&client, QUEUE, 1).await;
    let producer = producer_on(client.clone());
    let sent = now();
    let (acked, failed) = bounded(
        "produce",
        PRODUCE_TIMEOUT,
        produce(&producer, QUEUE, 1, 3, 0..PAST_CHECKPOINT_INTERVAL),
    )
    .await;
    assert_all_sent("past the checkpoint interval", &failed);
    eprintln!("{} messages acknowledged in {} ms", acked.len(), millis_since(sent));
    producer.close().await;
    drop(client);
    let waited = now();
    while !(0..3).all(|index| has_checkpoint(&cluster, index)) {
        assert!(
            waited.elapsed() < LEAD_TIMEOUT,
            "checkpoints written by nodes {:?} only",
            (0..3).filter(|&index| has_checkpoint(&cluster, index)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("every node wrote a checkpoint {} ms after the sends", millis_since(waited));

    tokio::task::block_in_place(|| cluster.kill_all_at_once());
    tokio::task::block_in_place(|| cluster.restart_all())
        .unwrap_or_else(|failure| panic!("restart: {failure}"));
    tokio::task::block_in_place(|| cluster.wait_led(QUEUE, 1, LEAD_TIMEOUT))
        .unwrap_or_else(|last| panic!("no leader after the restart: {last}"));
    let admin = Admin::new(client_at(&cluster.node(2).client_addr()).await);
    let described =
        bounded("describe", PRODUCE_TIMEOUT, admin.describe_queue(QUEUE)).await.unwrap();
    let ready: u64 = described.partitions.iter().map(|p| p.ready).sum();
    assert_eq!(ready, PAST_CHECKPOINT_INTERVAL, "messages ready after the restart");
    for index in 0..3 {
        let log = cluster.node(index).log();
        let reopened = log
            .lines()
            .rev()
            .find(|line| line.contains("partition open") && line.contains("queue=jobs"))
            .unwrap_or_default()
            .to_owned();
        assert!(
            reopened.contains("checkpoint=Some("),
            "node {} did not reopen from its checkpoint: {reopened:?}",
            index + 1
        );
    }
}
