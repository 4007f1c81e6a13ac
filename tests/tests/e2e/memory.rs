//! The broker's resident memory follows its work: after a backlog is built
//! and drained, what stays is the configured caches, not the history.

use spool_client::spool_wire::proto::PartitionId;
use spool_client::{Admin, Delivery, Message, Producer, ProducerConfig};
use spool_tests::events::wait_for_metric;
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

use crate::common::claim_options;

const QUEUE: &str = "memory";
const PARTITIONS: u32 = 4;
const MESSAGES: u64 = 20_000;
/// The capacity model's record size (1.6 KiB).
const PAYLOAD_BYTES: usize = 1_638;
/// Sends in flight: enough for group commits of a few records each.
const SEND_WINDOW: usize = 256;
/// Deliveries per claim: small, so claims and acks make many small commits
/// (the case in which a cached commit used to pin a buffer 16× its size).
const CLAIM_CREDITS: u32 = 16;
/// The tail cache each partition may keep.
const TAIL_CACHE_BYTES: u64 = 4 << 20;
/// Room for what is neither the baseline nor the caches: the queue state of
/// the drained messages (dedupe ids stay for the window, ≈ 30 B each),
/// connection buffers and allocator slack.
const SLACK_BYTES: u64 = 48 << 20;
/// How long RSS may take to come down to the bound after the drain: memory
/// the broker freed leaves RSS within the allocator's purge delay plus the
/// shards' heap collection interval (≈ 1.25 s; `broker/src/alloc.rs`).
const RSS_SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

// Goal: RSS after a drained backlog comes back to within the configured tail
// caches of what the broker held with the empty queue; on the code before the
// tail cache counted its buffers' allocation, each small commit pinned a
// 64 KiB buffer and 4 partitions kept ≈ 4 × 128 MiB. Method: one shard, 4
// partitions with a 4 MiB tail cache each; sample RSS with the queue created
// and empty; enqueue 20k 1.6 KiB messages, claim and ack them 16 at a time
// (thousands of one-page commits per partition), then poll RSS (bounded)
// until it is at most baseline + 4 × 4 MiB + 48 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_after_a_drain_is_the_baseline_plus_the_configured_caches() {
    let mut options = SpooldOptions::new(1);
    options.set_env("SPOOL_TAIL_CACHE_BYTES", &TAIL_CACHE_BYTES.to_string());
    let broker = Spoold::start_with(options);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue(QUEUE, test_queue_config(PARTITIONS, 30_000, 10))
        .await
        .unwrap();
    let open = f64::from(PARTITIONS);
    wait_for_metric(&broker, "spool_shard_partitions_open", "the queue's partitions open", |n| {
        n == open
    })
    .await;
    let baseline_bytes = broker.rss_kib().unwrap() * 1024;

    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let mut sends = std::collections::VecDeque::new();
    for _ in 0..MESSAGES {
        if sends.len() == SEND_WINDOW {
            let send: spool_client::SendFuture = sends.pop_front().unwrap();
            send.await.unwrap();
        }
        sends.push_back(
            producer.submit(QUEUE, Message::new(vec![0x5A; PAYLOAD_BYTES])).await.unwrap(),
        );
    }
    for send in sends {
        send.await.unwrap();
    }
    let loaded_bytes = broker.rss_kib().unwrap() * 1024;

    let mut acked = 0u64;
    while acked < MESSAGES {
        let before = acked;
        for partition in 0..PARTITIONS {
            let options = claim_options(7, CLAIM_CREDITS, 30_000, 0);
            let batch = client.claim(QUEUE, PartitionId(partition), &options).await.unwrap();
            if batch.deliveries.is_empty() {
                continue;
            }
            let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
            client.ack(QUEUE, PartitionId(partition), &tokens).await.unwrap();
            acked += tokens.len() as u64;
        }
        assert!(acked > before, "nothing claimable with {acked} of {MESSAGES} acked");
    }
    let bound_bytes = baseline_bytes + u64::from(PARTITIONS) * TAIL_CACHE_BYTES + SLACK_BYTES;
    let settling = spool_tests::now();
    let drained_bytes = loop {
        let drained_bytes = broker.rss_kib().unwrap() * 1024;
        if drained_bytes <= bound_bytes || settling.elapsed() >= RSS_SETTLE_TIMEOUT {
            break drained_bytes;
        }
        // A bounded poll: RSS is read again until it is under the bound.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    eprintln!(
        "rss: baseline {} MiB, loaded {} MiB, drained {} MiB, bound {} MiB",
        baseline_bytes >> 20,
        loaded_bytes >> 20,
        drained_bytes >> 20,
        bound_bytes >> 20
    );
    assert!(
        drained_bytes <= bound_bytes,
        "RSS {} MiB after the drain, above baseline {} MiB + caches + slack = {} MiB",
        drained_bytes >> 20,
        baseline_bytes >> 20,
        bound_bytes >> 20
    );
}
