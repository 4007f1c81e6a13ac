//! Snapshot transfer and install on a cluster of real `spoold` processes
//! (`docs/design/replication.md` §6, "Snapshots"): a member whose data
//! directory is lost needs entries every other member let go of; the
//! leader ships it the partition's checkpoint and the live records the
//! checkpoint still holds, the member installs them and catches up, and
//! from then on it can be in every quorum without a message lost.
//!
//! Every wait is bounded; the test runs under nextest's per-test timeout.
//! Like every end-to-end test it runs the binaries `scripts/test.sh` built
//! (`SPOOL_E2E_SPOOLD`), or builds `spoold` itself.

#![allow(clippy::unwrap_used)] // a failed step is a failed test

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_tests::admin::Exposition;
use spool_tests::cluster::{
    assert_all_sent, bounded, check_delivered, client_at, create_queue, drain, led, produce_padded,
    producer_on, start_with_queue, wait_for_queue, Cluster, ClusterOptions, LogIndexes,
};
use spool_tests::fault::journal_files;
use spool_tests::{now, SEGMENT_BYTES_TEST};

const QUEUE: &str = "jobs";
/// The queue whose messages are never claimed before the wipe.
const KEPT_QUEUE: &str = "kept";
const QUEUES: [&str; 2] = [QUEUE, KEPT_QUEUE];
const PARTITIONS: u32 = 2;
/// Payload padding: ≈ 4 KiB a message.
const PAD: usize = 4_000;
/// Messages of the burst sent and acked: ≈ 48 MiB, six of the test's
/// 8 MiB journal files.
const BURST: u64 = 12_000;
/// Messages sent and never claimed before the wipe: ≈ 8 MiB of live
/// records the snapshot must carry.
const KEPT: u64 = 2_000;
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
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// Node `node`'s log of each partition of `queue` (empty when it does
/// not answer).
fn indexes(cluster: &Cluster, node: usize, queue: &str) -> HashMap<u32, LogIndexes> {
    tokio::task::block_in_place(|| cluster.indexes(node, queue)).unwrap_or_default()
}

/// Node `node`'s log of each partition of both queues, `jobs` first.
fn all_indexes(cluster: &Cluster, node: usize) -> Vec<Option<LogIndexes>> {
    QUEUES
        .iter()
        .flat_map(|queue| {
            let found = indexes(cluster, node, queue);
            (0..PARTITIONS).map(move |p| found.get(&p).copied())
        })
        .collect()
}

/// What a failed wait needs: each running node's journal and partition
/// figures, and the warnings and errors of its log (every node's log tail
/// is printed when the cluster is dropped in the panic).
fn report(cluster: &Cluster) {
    for node in cluster.running() {
        let text = cluster.metrics(node).unwrap_or_else(|error| {
            eprintln!("node {}: no metrics ({error}): exited?", node + 1);
            String::new()
        });
        let wanted = ["spool_journal_files", "spool_partition_"];
        for line in text.lines().filter(|l| wanted.iter().any(|w| l.starts_with(w))) {
            eprintln!("node {}: {line}", node + 1);
        }
        let log = cluster.node(node).log();
        for line in log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
            eprintln!("node {} log: {line}", node + 1);
        }
    }
}

/// (batches, bytes) of record batches each `snapshot installed` line of a
/// node's log reports.
fn installed_batch_bytes(log: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, name: &str| -> u64 {
        let start = line.find(name).map_or(line.len(), |at| at + name.len());
        let digits: String = line[start..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or(0)
    };
    log.lines()
        .filter(|line| line.contains("snapshot installed") && !line.contains("by a member"))
        .map(|line| (field(line, "batches="), field(line, "batch_bytes=")))
        .collect()
}

/// Waits until every node holds at most [`FILES_RELEASED_MAX`] journal
/// files and its log of each partition starts past entry 1.
async fn wait_released(cluster: &Cluster) {
    let started = now();
    loop {
        let files: Vec<usize> =
            (0..3).map(|node| journal_files(&cluster.node(node).data_dir(), 0).len()).collect();
        let firsts: Vec<Vec<u64>> = (0..3)
            .map(|node| {
                all_indexes(cluster, node)
                    .iter()
                    .map(|log| log.map_or(0, |log| log.first))
                    .collect()
            })
            .collect();
        let let_go = firsts.iter().flatten().all(|&first| first > 1);
        if files.iter().all(|&count| count <= FILES_RELEASED_MAX) && let_go {
            eprintln!(
                "released: files {files:?}, first indexes {firsts:?} after {} ms",
                started.elapsed().as_millis()
            );
            return;
        }
        if started.elapsed() >= RELEASE_TIMEOUT {
            report(cluster);
            panic!(
                "after {RELEASE_TIMEOUT:?} the nodes hold {files:?} journal files, their logs \
                 start at {firsts:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// Goal: a member whose data directory is lost, once every member let go
// of the start of the partition's log, is caught up by a snapshot (the
// checkpoint and the live records it holds) and its installed state is
// right: in every quorum, it loses no message and brings back no ack.
// Method: three nodes, one shard each, two partitions on all three; a
// KEPT messages sent and never claimed, then a burst of ≈ 48 MiB sent and
// acked: every node must come down to FILES_RELEASED_MAX files with its
// logs starting past entry 1. A node that leads nothing SIGKILLed, its
// whole data directory deleted (its controller member's journal and votes
// with it), restarted empty: within CATCH_UP_TIMEOUT its
// `spool_partition_applied_index` of each partition must reach the
// others' `spool_partition_committed_index`, and its log must start past
// entry 1 (no member held those entries: only a snapshot brings them),
// and its log must report the kept records shipped as record batches.
// Then the old node leading the most partitions is killed (the wiped node
// is in every quorum, and votes in the elections) and the queue drained
// through the wiped node: every kept message delivered, and, when the
// first drain met no error, none of the acked burst again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_data_is_caught_up_by_a_snapshot() {
    wipe_and_catch_up(None).await;
}

// Goal: an install cut short by a crash right before its checkpoint's
// rename leaves the member as it was (its journal's install marker and
// copies out of effect, its staged files ignored), and it installs again.
// Method: as above, with the wiped node's first checkpoint rename (its
// first install's) aborting the process; it is started again unarmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_cut_before_its_checkpoint_leaves_no_trace_and_is_done_again() {
    wipe_and_catch_up(Some("checkpoint.rename=abort")).await;
}

// Goal: an install cut right after its checkpoint's rename is in effect
// at the next start: the log starts at its marker, its copies hold the
// records. Method: as above, aborting at the directory sync after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_cut_after_its_checkpoint_is_in_effect_at_the_next_start() {
    wipe_and_catch_up(Some("checkpoint.dir_sync=abort")).await;
}

/// The test above, the wiped node's first start armed with `crash`
/// (`SPOOL_FAILPOINTS` syntax), when given: once it died there, it is
/// started again unarmed.
async fn wipe_and_catch_up(crash: Option<&str>) {
    let options = ClusterOptions::new(3, 1).with_journal_retain_bytes(RETAIN_BYTES);
    let (mut cluster, leaders) = start_with_queue(options, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let config = spool_tests::test_queue_config(PARTITIONS, 30_000, 100);
    create_queue(&cluster.node(leaders[0]).client_addr(), KEPT_QUEUE, config).await;
    led(&cluster, KEPT_QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    let client = client_at(&cluster.node(leaders[0]).client_addr()).await;
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    wait_for_queue(&client, KEPT_QUEUE, PARTITIONS).await;
    let producer = producer_on(client.clone());

    // Sent and kept first: live records the snapshot must carry (its
    // checkpoint is taken after them).
    let (kept, failed) = bounded(
        "produce",
        PRODUCE_TIMEOUT,
        produce_padded(&producer, KEPT_QUEUE, PARTITIONS, 8, 0..KEPT, PAD),
    )
    .await;
    assert_all_sent("the kept burst", &failed);
    let kept: HashSet<MessageId> = kept.into_iter().collect();

    // Sent and acked: every node lets go of the start of its logs (the
    // kept records relocated past the files released).
    let (acked, failed) = bounded(
        "produce",
        PRODUCE_TIMEOUT,
        produce_padded(&producer, QUEUE, PARTITIONS, 7, 0..BURST, PAD),
    )
    .await;
    assert_all_sent("the acked burst", &failed);
    let acked: HashSet<MessageId> = acked.into_iter().collect();
    let (delivered, first_errors) = drain(&client, QUEUE, PARTITIONS, &acked, DRAIN_TIMEOUT).await;
    check_delivered("the acked burst", &acked, &delivered);
    wait_released(&cluster).await;

    // The node leading the fewest partitions loses its data directory and
    // comes back as a new replica.
    let mut leaders = led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    leaders.extend(led(&cluster, KEPT_QUEUE, PARTITIONS, LEAD_TIMEOUT).await);
    let leads = |node: &usize, leaders: &[usize]| leaders.iter().filter(|&l| l == node).count();
    let wiped = (0..3).min_by_key(|node| leads(node, &leaders)).unwrap();
    let old: Vec<usize> = (0..3).filter(|&node| node != wiped).collect();
    tokio::task::block_in_place(|| cluster.kill(wiped));
    let data = cluster.node(wiped).data_dir();
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    cluster.set_failpoints(wiped, crash);
    let restarted = tokio::task::block_in_place(|| cluster.restart(wiped));
    if let Some(crash) = crash {
        // It may die before it accepts: an install starts at its first
        // heartbeat.
        let started = now();
        while cluster.metrics(wiped).is_ok() {
            assert!(started.elapsed() < CATCH_UP_TIMEOUT, "node {} never hit {crash}", wiped + 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = cluster.node(wiped).log();
        assert!(log.contains("install"), "node {} died before installing: {crash}", wiped + 1);
        tokio::task::block_in_place(|| cluster.kill(wiped));
        cluster.set_failpoints(wiped, None);
        eprintln!("node {} died at {crash}; started again", wiped + 1);
        tokio::task::block_in_place(|| cluster.restart(wiped))
    } else {
        restarted
    }
    .unwrap_or_else(|failure| panic!("restart of node {}: {failure}", wiped + 1));
    let back = now();
    let ids = |nodes: &[usize]| nodes.iter().map(|node| node + 1).collect::<Vec<_>>();
    eprintln!("node {} wiped and restarted; led by nodes {:?}", wiped + 1, ids(&leaders));

    // It catches up: its state holds every committed entry of the others.
    let committed = |node: usize| -> Vec<u64> {
        all_indexes(&cluster, node).iter().map(|log| log.map_or(0, |log| log.committed)).collect()
    };
    let (a, b) = (committed(old[0]), committed(old[1]));
    let target: Vec<u64> = a.iter().zip(&b).map(|(a, b)| *a.max(b)).collect();
    assert!(target.iter().all(|&index| index > 1), "the others' committed indexes: {target:?}");
    let found = loop {
        let found = all_indexes(&cluster, wiped);
        let caught = found
            .iter()
            .zip(&target)
            .all(|(log, target)| log.is_some_and(|log| log.applied >= *target));
        if caught {
            break found;
        }
        if back.elapsed() >= CATCH_UP_TIMEOUT {
            report(&cluster);
            panic!(
                "node {} (wiped) holds {found:?} after {CATCH_UP_TIMEOUT:?}, the others \
                 committed {target:?}",
                wiped + 1
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("node {} caught up after {} ms: {found:?}", wiped + 1, back.elapsed().as_millis());
    // No member held the entries below the others' first indexes: its log
    // starts where the snapshot it installed ends.
    assert!(found.iter().flatten().all(|log| log.first > 1), "node {}: {found:?}", wiped + 1);
    // The kept records came with the snapshots, as record batches.
    let log = cluster.node(wiped).log();
    // The installs of its last start (an armed start died before any took
    // effect, or right after one).
    let last_start = log.rfind("spoold started").map_or(0, |at| at);
    let shipped = installed_batch_bytes(&log[last_start..]);
    for line in log[last_start..].lines().filter(|line| line.contains("snapshot")) {
        eprintln!("node {} log: {line}", wiped + 1);
    }
    eprintln!("node {} installed {shipped:?} (batches, bytes) per snapshot", wiped + 1);
    let installs = QUEUES.len() * PARTITIONS as usize;
    if crash.is_none() {
        assert_eq!(shipped.len(), installs, "installs: {shipped:?}");
        let bytes: u64 = shipped.iter().map(|(_, bytes)| bytes).sum();
        assert!(bytes >= KEPT * PAD as u64, "{bytes} record bytes shipped for {KEPT} kept");
    }
    // And the metrics say so: installs here, transfers served by the others.
    let transfers = |node: usize, outcome: &str| -> f64 {
        let text = cluster.metrics(node).unwrap();
        let metrics = Exposition::parse(&text).unwrap();
        let labels = [("shard", "0"), ("outcome", outcome)];
        metrics.value("spool_snapshot_transfers_total", &labels).unwrap_or(0.0)
    };
    let installed = transfers(wiped, "installed");
    if crash.is_none() {
        assert_eq!(installed, installs as f64, "installs on node {}", wiped + 1);
    }
    let served: f64 = old.iter().map(|&node| transfers(node, "served")).sum();
    assert!(served >= installs as f64, "transfers served by the others: {served}");

    // The old node leading the most partitions goes: the wiped node is in
    // every quorum from now on.
    producer.close().await;
    drop(client);
    let mut leaders = led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    leaders.extend(led(&cluster, KEPT_QUEUE, PARTITIONS, LEAD_TIMEOUT).await);
    let victim = old.iter().copied().max_by_key(|node| leads(node, &leaders)).unwrap();
    tokio::task::block_in_place(|| cluster.kill(victim));
    let mut after = led(&cluster, QUEUE, PARTITIONS, LEAD_TIMEOUT).await;
    after.extend(led(&cluster, KEPT_QUEUE, PARTITIONS, LEAD_TIMEOUT).await);
    eprintln!(
        "node {} killed; led by nodes {:?}, then {:?}",
        victim + 1,
        ids(&leaders),
        ids(&after)
    );

    let client = client_at(&cluster.node(wiped).client_addr()).await;
    wait_for_queue(&client, KEPT_QUEUE, PARTITIONS).await;
    let (delivered, _) = drain(&client, KEPT_QUEUE, PARTITIONS, &kept, DRAIN_TIMEOUT).await;
    check_delivered("the wiped node in every quorum", &kept, &delivered);
    let nothing = HashSet::new();
    wait_for_queue(&client, QUEUE, PARTITIONS).await;
    let (delivered, _) = drain(&client, QUEUE, PARTITIONS, &nothing, DRAIN_TIMEOUT).await;
    // Every ack of the first burst answered is in the state it installed.
    if first_errors.is_empty() {
        let again: Vec<&MessageId> = delivered.keys().filter(|id| acked.contains(id)).collect();
        assert!(
            again.is_empty(),
            "{} acked messages delivered again, e.g. {:?}",
            again.len(),
            &again[..again.len().min(5)]
        );
    }
}
