//! Journal release on a cluster of real `spoold` processes
//! (`docs/design/replication.md` §6, "Release"): a member lets its journal
//! files go below what every member of each group holds and its own
//! checkpoint covers — never what a member that is down still lacks — and
//! reopens from the files it kept.
//!
//! Every wait is bounded; the test runs under nextest's per-test timeout.
//! Like every end-to-end test it runs the binaries `scripts/test.sh` built
//! (`SPOOL_E2E_SPOOLD`), or builds `spoold` itself.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::{Producer, ProducerConfig};
use spool_tests::admin::Exposition;
use spool_tests::cluster::{
    assert_all_sent, bounded, check_delivered, client_at, drain, produce_padded, start_with_queue,
    wait_for_queue, Cluster, ClusterOptions,
};
use spool_tests::{now, SEGMENT_BYTES_TEST};

const QUEUE: &str = "jobs";
const PARTITIONS: u32 = 2;
/// Payload padding: ≈ 4 KiB a message.
const PAD: usize = 4_000;
/// Messages of one burst: ≈ 48 MiB, six of the test's 8 MiB files.
const BURST: u64 = 12_000;
/// The shards ask their partitions for checkpoints past this much journal
/// (the broker's default, 512 MiB, is more than the test writes).
const RETAIN_BYTES: u64 = 2 * SEGMENT_BYTES_TEST;
/// Files a node may hold once released: the one being written, the next
/// one prepared, and one a checkpoint or relocation still pins.
const FILES_RELEASED_MAX: usize = 4;

const LEAD_TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(120);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// Release passes run every second: five of them.
const PASSES_WAIT: Duration = Duration::from_secs(5);

fn journal_dir(cluster: &Cluster, index: usize) -> PathBuf {
    cluster.node(index).data_dir().join("shard-00").join("journal")
}

/// Journal files (`*.wal`) of node `index`'s shard.
fn wal_files(cluster: &Cluster, index: usize) -> usize {
    std::fs::read_dir(journal_dir(cluster, index))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".wal"))
        .count()
}

fn released_files(cluster: &Cluster, index: usize) -> f64 {
    let text = cluster.metrics(index).unwrap();
    Exposition::parse(&text).unwrap().sum("spool_journal_released_files_total")
}

/// Node `index`'s `spool_partition_first_index` of each partition.
fn first_indexes(cluster: &Cluster, index: usize) -> Vec<f64> {
    let metrics = Exposition::parse(&cluster.metrics(index).unwrap()).unwrap();
    (0..PARTITIONS)
        .map(|partition| {
            let partition = partition.to_string();
            let labels = [("queue", QUEUE), ("partition", partition.as_str())];
            metrics.value("spool_partition_first_index", &labels).unwrap_or(0.0)
        })
        .collect()
}

/// Waits until each node of `nodes` holds at most [`FILES_RELEASED_MAX`]
/// journal files.
async fn wait_released(cluster: &Cluster, nodes: &[usize], round: &str) {
    let started = now();
    loop {
        let files: Vec<usize> = nodes.iter().map(|&node| wal_files(cluster, node)).collect();
        if files.iter().all(|&count| count <= FILES_RELEASED_MAX) {
            eprintln!("{round}: files {files:?} after {} ms", started.elapsed().as_millis());
            return;
        }
        if started.elapsed() >= RELEASE_TIMEOUT {
            // What the failure needs: each node's log figures, and what its
            // log says of partitions refused or stopped.
            for &node in nodes {
                let text = cluster.metrics(node).unwrap_or_default();
                let wanted = [
                    "spool_journal_files",
                    "spool_partition_first",
                    "spool_partition_group",
                    "spool_partition_applied",
                    "spool_partition_committed",
                    "spool_partition_last",
                ];
                for line in text.lines().filter(|l| wanted.iter().any(|w| l.starts_with(w))) {
                    eprintln!("node {}: {line}", node + 1);
                }
                let log = cluster.node(node).log();
                for line in log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
                    eprintln!("node {} log: {line}", node + 1);
                }
            }
        }
        assert!(
            started.elapsed() < RELEASE_TIMEOUT,
            "{round}: nodes {nodes:?} still hold {files:?} journal files after {RELEASE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A producer that retries a send 12 times, 100 ms apart (a burst meets
/// elections and full journals).
fn retrying_producer(client: &spool_client::Client) -> Producer {
    let config = ProducerConfig {
        retries: 12,
        retry_backoff: Duration::from_millis(100),
        ..ProducerConfig::default()
    };
    Producer::new(client.clone(), config).unwrap()
}

/// Sends a burst of `sequences` and acks every message of it.
async fn burst_and_drain(
    cluster: &Cluster,
    through: usize,
    producer: &Producer,
    sequences: std::ops::Range<u64>,
    round: &str,
) {
    let (acked, failed) = bounded(
        "produce",
        PRODUCE_TIMEOUT,
        produce_padded(producer, QUEUE, PARTITIONS, 7, sequences, PAD),
    )
    .await;
    assert_all_sent(round, &failed);
    let client = client_at(&cluster.node(through).client_addr()).await;
    let owed: HashSet<MessageId> = acked.into_iter().collect();
    let (delivered, _) = drain(&client, QUEUE, PARTITIONS, &owed, DRAIN_TIMEOUT).await;
    check_delivered(round, &owed, &delivered);
}

// Goal: a replicated partition's journal files go once every member holds
// their entries and a checkpoint covers them, not while a member that is
// down lacks them, and a member reopens from what it kept.
// Method: three nodes, one shard each, two partitions on all three; a
// burst of ≈ 48 MiB sent and acked: every node must come down to
// FILES_RELEASED_MAX files and count releases. A node killed, a second
// burst sent and acked: for PASSES_WAIT the two others must keep the files
// holding what it lacks (a burst is six files). It restarts (its log
// begins past a released prefix), must catch up, and then every node comes
// down again. Finally a node that leads is killed and restarted (reopened
// from released files) and a last burst is sent and drained through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_journals_release_what_every_member_holds_and_reopen() {
    let options = ClusterOptions::new(3, 1).with_journal_retain_bytes(RETAIN_BYTES);
    let (mut cluster, leaders) = start_with_queue(options, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let client = client_at(&cluster.node(leaders[0]).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let producer = retrying_producer(&client);
    let all = [0, 1, 2];

    burst_and_drain(&cluster, leaders[0], &producer, 0..BURST, "all up").await;
    wait_released(&cluster, &all, "all up").await;
    for node in all {
        assert!(released_files(&cluster, node) >= 1.0, "node {} released nothing", node + 1);
        // Its logs start past the entries let go of.
        let firsts = first_indexes(&cluster, node);
        assert!(firsts.iter().all(|&first| first > 1.0), "node {}: {firsts:?}", node + 1);
    }

    // A node down: what it lacks stays on the others.
    let down = (0..3).find(|node| !leaders.contains(node)).unwrap_or(2);
    let up: Vec<usize> = all.iter().copied().filter(|&node| node != down).collect();
    tokio::task::block_in_place(|| cluster.kill(down));
    let led = spool_tests::cluster::led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let through = led[0];
    burst_and_drain(&cluster, through, &producer, BURST..2 * BURST, "a node down").await;
    tokio::time::sleep(PASSES_WAIT).await;
    for &node in &up {
        // Its peer health: silence from the node down, frames from the other.
        let metrics = Exposition::parse(&cluster.metrics(node).unwrap()).unwrap();
        let silence = |peer: usize| {
            let peer = (peer + 1).to_string();
            metrics.value("spool_peer_silence_seconds", &[("shard", "0"), ("peer", peer.as_str())])
        };
        let other = up.iter().copied().find(|&other| other != node).unwrap();
        let (from_down, from_other) = (silence(down), silence(other));
        assert!(
            from_down.is_some_and(|s| s >= 3.0),
            "node {}: {from_down:?} from the node down",
            node + 1
        );
        assert!(
            from_other.is_some_and(|s| s < 3.0),
            "node {}: {from_other:?} from a live peer",
            node + 1
        );
        let files = wal_files(&cluster, node);
        assert!(
            files >= 6,
            "node {} holds {files} journal files with node {} down: it let go of entries that \
             node lacks",
            node + 1,
            down + 1
        );
    }

    // Back: it reopens past its released prefix, catches up, and the
    // files go everywhere.
    tokio::task::block_in_place(|| cluster.restart(down))
        .unwrap_or_else(|failure| panic!("restart of node {}: {failure}", down + 1));
    wait_released(&cluster, &all, "the node back").await;

    // A leader restarted from its released journal still serves.
    let led = spool_tests::cluster::led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let restarted = led[0];
    tokio::task::block_in_place(|| cluster.kill(restarted));
    tokio::task::block_in_place(|| cluster.restart(restarted))
        .unwrap_or_else(|failure| panic!("restart of node {}: {failure}", restarted + 1));
    let led = spool_tests::cluster::led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    eprintln!("node {} restarted; led by {led:?}", restarted + 1);
    burst_and_drain(&cluster, restarted, &producer, 2 * BURST..2 * BURST + 500, "restarted").await;
    producer.close().await;
}

// Goal: in a cluster of more nodes than the replication factor, a node
// that holds replicas of only some of a shard's partitions still releases
// its journal (the release counted every partition placed on the shard
// index, held here or not, and waited for ever for the ones it does not
// hold). Method: four nodes, factor 3, two partitions (a node holds one or
// two of them); a burst of ≈ 48 MiB sent and acked: every node must come
// down to FILES_RELEASED_MAX files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_some_partitions_releases_its_journal() {
    let options = ClusterOptions {
        controller_voters: 3,
        ..ClusterOptions::new(4, 1).with_journal_retain_bytes(RETAIN_BYTES)
    };
    let (cluster, leaders) = start_with_queue(options, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let held: Vec<usize> =
        (0..4).map(|node| cluster.replicas(node, QUEUE).map_or(0, |held| held.len())).collect();
    assert!(
        held.iter().any(|&count| count > 0 && count < PARTITIONS as usize),
        "no node holds only some partitions: {held:?}"
    );
    let client = client_at(&cluster.node(leaders[0]).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let producer = retrying_producer(&client);
    burst_and_drain(&cluster, leaders[0], &producer, 0..BURST, "four nodes").await;
    wait_released(&cluster, &[0, 1, 2, 3], "four nodes").await;
    producer.close().await;
}
