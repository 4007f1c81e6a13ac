// Goal: the queue state draws from the memory budget like the connection
// pools do — what does not fit is refused, never allocated:
// 1. enqueues into a shard whose state share is spent are answered
//    THROTTLED with the figures (counted in
//    `spool_shard_memory_refusals_total{pool="state"}`), the charge never
//    passes the share, every message acknowledged before is kept, and once
//    consumers ack, producers are admitted again;
// 2. a queue whose partitions' fixed part does not fit what is left is
//    refused at create (INVALID_ARGUMENT, with the figures) and does not
//    exist afterwards;
// 3. a broker restarted with a budget below what its open queues need
//    refuses to start (exit code of a config error), naming the queue.
//
// Method: a real spoold with one shard and a 32 MiB budget (the admin
// port's 8 MiB pool off the top leaves the shard 24 MiB: a queue-state
// share of ≈ 14 MiB once the journal's two 1 MiB caches are set aside);
// batches of 500 small records with ids until one is refused; the figures
// from /metrics; the restart with 20 MiB (12 MiB for the shard).
//
// How it can fail: without the charge the backlog grows to the queue's own
// max_messages (10 M) and no enqueue is refused (the loop's bound trips);
// a charge that forgets a partition's messages lets `used` pass `budget`;
// without the create check the 2,000-partition queue is created; without
// the start check the restart with 20 MiB serves.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};
use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Client, ClientError};
use spool_tests::admin::{http_get, Exposition};
use spool_tests::fault::{claim_options, message_id};
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "state-budget";
/// The shard's 24 MiB and the admin port's pool (its 8 MiB floor) off the
/// top.
const MEMORY_BYTES: u64 = 32 << 20;
/// The shard's 12 MiB and the admin pool.
const SMALLER_MEMORY_BYTES: u64 = 20 << 20;
const TAIL_CACHE_BYTES: u64 = 1 << 20;
const FRAME_BYTES_MAX: u64 = (1 << 20) + (64 << 10);
const BATCH_RECORDS: u64 = 500;
/// Far more batches than the share holds (≈ 14 MiB ÷ 296 B per record ÷
/// 500): the bound of the fill loop.
const BATCHES_MAX: u64 = 400;
/// Exit code of a configuration refusal (`broker/src/fatal.rs`).
const EXIT_CONFIG: i32 = 2;
/// How long a refused start may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(20);

fn options(memory_bytes: u64) -> SpooldOptions {
    let mut options = SpooldOptions::new(1);
    options.args = vec![
        "--memory-bytes".into(),
        memory_bytes.to_string(),
        "--tail-cache-bytes".into(),
        TAIL_CACHE_BYTES.to_string(),
        "--frame-bytes-max".into(),
        FRAME_BYTES_MAX.to_string(),
    ];
    options
}

fn state_pool(broker: &Spoold, figure: &str) -> f64 {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{}", page.body);
    let exposition = Exposition::parse(&page.body).unwrap();
    exposition
        .value(figure, &[("shard", "0"), ("pool", "state")])
        .unwrap_or_else(|| panic!("{figure} {{pool=\"state\"}} not in /metrics"))
}

async fn enqueue_batch(client: &Client, batch: u64) -> Result<(), ClientError> {
    // The record's time must lie near the broker's clock (one host).
    #[allow(clippy::disallowed_methods)]
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as u64;
    let mut builder = DataBatchBuilder::new();
    for index in 0..BATCH_RECORDS {
        let record = Record {
            message_id: message_id(7, batch * BATCH_RECORDS + index),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(b"state".to_vec()),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: now_ms,
        };
        builder.push(&record).unwrap();
    }
    client.enqueue(QUEUE, PartitionId(0), &builder.finish().unwrap()).await.map(|_| ())
}

/// Claims and acks up to `messages`; returns how many were acked.
async fn ack_some(client: &Client, messages: u64) -> u64 {
    let mut acked = 0;
    while acked < messages {
        let batch =
            client.claim(QUEUE, PartitionId(0), &claim_options(3, 1_000, 30_000, 0)).await.unwrap();
        if batch.deliveries.is_empty() {
            break;
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(|delivery| delivery.token()).collect();
        client.ack(QUEUE, PartitionId(0), &tokens).await.unwrap();
        acked += tokens.len() as u64;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_state_beyond_its_share_is_refused_at_enqueue_create_and_start() {
    let mut broker = Spoold::start_with(options(MEMORY_BYTES));
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(QUEUE, test_queue_config(1, 30_000, 10)).await.unwrap();
    let budget = state_pool(&broker, "spool_shard_memory_budget_bytes");
    assert!(budget > 8.0 * 1048576.0 && budget < MEMORY_BYTES as f64, "state share {budget}");

    // 1. Fill until the share refuses a batch.
    let mut admitted = 0u64;
    let refusal = loop {
        assert!(admitted < BATCHES_MAX, "{admitted} batches admitted and none refused");
        match enqueue_batch(&client, admitted).await {
            Ok(()) => admitted += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(refusal.code(), Some(ErrorCode::Throttled), "{refusal}");
    let text = refusal.to_string();
    assert!(text.contains("memory for queue state") && text.contains("memory_bytes"), "{text}");
    let used = state_pool(&broker, "spool_shard_memory_used_bytes");
    let peak = state_pool(&broker, "spool_shard_memory_peak_bytes");
    eprintln!("state share {budget} B: {admitted} batches admitted, used {used}, peak {peak}");
    assert!(admitted >= 10, "only {admitted} batches fit a {budget} B share");
    assert!(peak <= budget, "charged {peak} B, over the {budget} B share");
    assert!(state_pool(&broker, "spool_shard_memory_refusals_total") >= 1.0);
    // Nothing admitted is lost to the refusal.
    let counters = admin.describe_queue(QUEUE).await.unwrap();
    let ready: u64 = counters.partitions.iter().map(|partition| partition.ready).sum();
    assert_eq!(ready, admitted * BATCH_RECORDS, "messages held after the refusal");

    // Acks return the charge: the refused batch is admitted after them.
    let acked = ack_some(&client, 4 * BATCH_RECORDS).await;
    assert_eq!(acked, 4 * BATCH_RECORDS);
    // A dedupe entry stays charged for its window: four batches acked make
    // room for one more of new ids.
    enqueue_batch(&client, admitted).await.unwrap_or_else(|error| {
        panic!("after {acked} acks the next batch is still refused: {error}")
    });
    admitted += 1;

    // 2. A queue whose partitions do not fit what is left.
    let wide = admin.create_queue("too-wide", test_queue_config(2_000, 30_000, 10)).await;
    let error = wide.expect_err("2,000 partitions fit a spent share");
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");
    assert!(error.to_string().contains("memory_bytes"), "{error}");
    let queues = admin.list_queues().await.unwrap();
    assert!(queues.iter().all(|queue| queue.name != "too-wide"), "the refused queue exists");

    // 3. A restart with half the budget cannot hold the backlog.
    broker.terminate();
    *broker.options_mut() = options(SMALLER_MEMORY_BYTES);
    // The shard ports are bound (connections wait in their backlog) before
    // the check runs, so the harness may see the start as accepting: the
    // exit is what tells.
    let (status, log) = match broker.try_restart() {
        Err(failed) => (failed.status, failed.log),
        Ok(()) => (broker.wait_exit(EXIT_WITHIN), broker.log()),
    };
    assert_eq!(status.and_then(|status| status.code()), Some(EXIT_CONFIG), "{log}");
    assert!(log.contains(QUEUE) && log.contains("raise memory_bytes"), "{log}");

    // With the budget back, everything admitted is still there.
    *broker.options_mut() = options(MEMORY_BYTES);
    broker.restart();
    let client = broker.client().await;
    let counters = Admin::new(client.clone()).describe_queue(QUEUE).await.unwrap();
    let ready: u64 = counters.partitions.iter().map(|partition| partition.ready).sum();
    assert_eq!(ready, (admitted - 4) * BATCH_RECORDS, "messages held after the restarts");
}
