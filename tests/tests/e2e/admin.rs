//! The admin port of a real `spoold`: `/metrics` moves as operations happen
//! and parses as Prometheus text; `/health/live` and `/health/ready`,
//! including not-ready with a refused partition.

use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClientError, Message, Producer, ProducerConfig};
use spool_tests::admin::{http, http_get, Exposition};
use spool_tests::{test_queue_config, Spoold};

use crate::common::{claim_options, key_for, message_id};

/// GET /metrics, checked (exposition rules and naming conventions).
fn scrape(broker: &Spoold) -> Exposition {
    let answer = tokio::task::block_in_place(|| http_get(&broker.admin_addr(), "/metrics"));
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.content_type.starts_with("application/openmetrics-text"), "{answer:?}");
    Exposition::parse(&answer.body)
        .unwrap_or_else(|error| panic!("the metrics do not parse: {error}\n{}", answer.body))
}

fn at(exposition: &Exposition, name: &str, queue: &str, partition: u32) -> f64 {
    let partition = partition.to_string();
    exposition
        .value(name, &[("queue", queue), ("partition", &partition)])
        .unwrap_or_else(|| panic!("no {name}{{queue={queue},partition={partition}}}"))
}

// Goal: the per-partition and per-shard metrics count what happened, and
// nothing else: enqueues, claims, deliveries, acks, extends, releases, stale
// tokens, redeliveries, admission refusals; ready/claimed/scheduled gauges;
// commits, bytes written and fdatasync latencies per shard. Method: a
// 2-shard broker, a 2-partition queue with max_messages 6; scrape, act,
// scrape, and compare each value with what the test did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_operations_happen() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    let mut config = test_queue_config(2, 5_000, 5);
    config.max_messages = 6;
    admin.create_queue("orders", config).await.unwrap();

    let before = scrape(&broker);
    for partition in 0..2 {
        assert_eq!(at(&before, "spool_enqueued_messages_total", "orders", partition), 0.0);
        assert_eq!(at(&before, "spool_ready_messages", "orders", partition), 0.0);
    }
    let commits_before = before.sum("spool_shard_commits_total");

    // Five messages on partition 0, one on partition 1, then one too many
    // on partition 0 (max_messages 6 counts per partition).
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let p0 = PartitionId(0);
    let key0 = key_for(0, 2, 1);
    for sequence in 0..5 {
        let message =
            Message::new(format!("m{sequence}")).key(key0.clone()).id(message_id(0, sequence));
        producer.send("orders", message).await.unwrap();
    }
    let key1 = key_for(1, 2, 1);
    producer.send("orders", Message::new("other").key(key1).id(message_id(1, 0))).await.unwrap();
    let mut small = test_queue_config(1, 5_000, 5);
    small.max_messages = 1;
    admin.create_queue("tiny", small).await.unwrap();
    producer.send("tiny", Message::new("fits").id(message_id(2, 0))).await.unwrap();
    // No retries: each refused send is one refused request.
    let once =
        Producer::new(client.clone(), ProducerConfig { retries: 0, ..ProducerConfig::default() })
            .unwrap();
    let full = once.send("tiny", Message::new("does not").id(message_id(2, 1))).await;
    assert_eq!(full.unwrap_err().code(), Some(ErrorCode::QueueFull));

    // Claim 3 on partition 0; ack 1, extend 1, release 1 (redelivered later).
    let claimed = client.claim("orders", p0, &claim_options(1, 3, 5_000, 0)).await.unwrap();
    assert_eq!(claimed.deliveries.len(), 3);
    let [first, second, third] =
        [&claimed.deliveries[0], &claimed.deliveries[1], &claimed.deliveries[2]];
    client.ack("orders", p0, &[first.token()]).await.unwrap();
    let stale = client.ack("orders", p0, &[first.token()]).await.unwrap_err();
    assert!(matches!(stale, ClientError::AckRefused { .. }), "{stale}");
    client.extend("orders", p0, second.token(), 10_000).await.unwrap();
    client.release("orders", p0, third.token(), 0, "later").await.unwrap();
    // Claim the rest: the two never claimed and, after its backoff, the
    // released one again (a redelivery). Every claim call counts.
    let mut claim_calls = 1u64;
    let mut later = Vec::new();
    while later.len() < 3 {
        let batch = client.claim("orders", p0, &claim_options(1, 10, 5_000, 2_000)).await.unwrap();
        claim_calls += 1;
        assert!(claim_calls < 10, "the released message came back");
        later.extend(batch.deliveries);
    }
    let redelivered = later.iter().filter(|delivery| delivery.attempt() > 1).count();
    assert_eq!(redelivered, 1, "the released message, delivered a second time");

    let after = scrape(&broker);
    let value = |name: &str, partition: u32| at(&after, name, "orders", partition);
    assert_eq!(value("spool_enqueued_messages_total", 0), 5.0);
    assert_eq!(value("spool_enqueued_messages_total", 1), 1.0);
    assert_eq!(value("spool_claims_total", 0), claim_calls as f64);
    assert_eq!(value("spool_claims_total", 1), 0.0);
    assert_eq!(value("spool_delivered_messages_total", 0), 6.0);
    assert_eq!(value("spool_redeliveries_total", 0), 1.0);
    assert_eq!(value("spool_acked_messages_total", 0), 1.0);
    assert_eq!(value("spool_extends_total", 0), 1.0);
    assert_eq!(value("spool_released_messages_total", 0), 1.0);
    assert_eq!(value("spool_stale_token_rejections_total", 0), 1.0);
    assert_eq!(value("spool_lease_expirations_total", 0), 0.0);
    let moves = |reason: &str| {
        after.value(
            "spool_dead_letter_moves_total",
            &[("queue", "orders"), ("partition", "0"), ("reason", reason)],
        )
    };
    assert_eq!(moves("max_deliveries"), Some(0.0));
    assert_eq!(moves("expired"), Some(0.0));
    assert_eq!(moves("unknown"), None, "shown only while nonzero");
    // 5 enqueued − 1 acked: the other four under a lease on partition 0,
    // none ready or scheduled; partition 1 has its one ready.
    assert_eq!(value("spool_claimed_messages", 0), 4.0);
    assert_eq!(value("spool_ready_messages", 0), 0.0);
    assert_eq!(value("spool_scheduled_messages", 0), 0.0);
    assert_eq!(value("spool_ready_messages", 1), 1.0);
    assert_eq!(value("spool_stored_messages", 1), 1.0);
    assert!(value("spool_stored_bytes", 1) > 0.0);
    assert!(value("spool_oldest_ready_age_seconds", 1) >= 0.0);
    assert_eq!(value("spool_dead_letter_messages", 0), 0.0);
    let tiny_full = after
        .value(
            "spool_admission_rejections_total",
            &[("queue", "tiny"), ("partition", "0"), ("cause", "max_messages")],
        )
        .unwrap();
    assert_eq!(tiny_full, 1.0);
    let orders_full = after
        .value(
            "spool_admission_rejections_total",
            &[("queue", "orders"), ("partition", "0"), ("cause", "max_messages")],
        )
        .unwrap();
    assert_eq!(orders_full, 0.0);

    // Per shard: both shards report; commits, bytes and syncs grew.
    for shard in ["0", "1"] {
        assert_eq!(after.value("spool_shard_reporting", &[("shard", shard)]), Some(1.0));
    }
    assert!(after.sum("spool_shard_commits_total") > commits_before);
    assert!(after.sum("spool_shard_commit_bytes_total") >= 4096.0);
    assert!(
        after.sum("spool_shard_written_bytes_total") >= after.sum("spool_shard_commit_bytes_total")
    );
    let syncs = after.sum("spool_shard_fdatasync_duration_seconds_count");
    assert!(syncs >= after.sum("spool_shard_commits_total").min(1.0), "syncs {syncs}");
    assert_eq!(after.sum("spool_shard_partitions_open"), 3.0);
    // The test's client holds a connection to each shard it used.
    assert!(after.sum("spool_shard_connections") >= 1.0);
    assert!(
        after.sum("spool_shard_connections_accepted_total") >= after.sum("spool_shard_connections")
    );
    assert_eq!(after.sum("spool_shard_connections_refused_total"), 0.0);
    assert_eq!(after.sum("spool_shard_partitions_refused"), 0.0);

    // Labels are queue, partition, shard, cause, operation, outcome (and a
    // memory pool's name) only: no payload, no routing key.
    for sample in &after.samples {
        for (name, value) in &sample.labels {
            assert!([
                "queue",
                "partition",
                "shard",
                "cause",
                "operation",
                "outcome",
                "le",
                "op",
                "reason",
                "dir",
                "pool"
            ]
            .contains(&name.as_str()));
            assert!(!value.starts_with("key-") && !value.starts_with("m0"), "{sample:?}");
        }
    }

    // A deleted queue's series go with it.
    admin.delete_queue("tiny").await.unwrap();
    let gone = scrape(&broker);
    assert!(gone.samples.iter().all(|s| s.labels.get("queue").map(String::as_str) != Some("tiny")));
}

/// `spool_request_duration_seconds_count{queue,op}`.
fn requests(exposition: &Exposition, queue: &str, op: &str) -> f64 {
    exposition
        .value("spool_request_duration_seconds_count", &[("queue", queue), ("op", op)])
        .unwrap_or_else(|| panic!("no request duration for {queue} {op}"))
}

// Goal: the latency histograms count each data request once under its
// queue and op; a claim of records just written is a read-cache hit; group
// commits land in the commit size and commit duration histograms; the
// executor's busy time and tasks grow; the oldest claim age follows the
// claim still held; the disk figures are there; a release at
// max_deliveries is a dead-letter move with reason max_deliveries; the
// drain time appears once an ack rate is measured. Method: a 1-shard broker; scrape, act, scrape,
// and compare with what the test did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_cache_executor_disk_dead_letter_and_drain_metrics_move() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("timed", test_queue_config(1, 5_000, 2)).await.unwrap();
    admin.create_queue("once", test_queue_config(1, 5_000, 1)).await.unwrap();

    let before = scrape(&broker);
    for op in ["enqueue", "claim", "ack", "release", "extend"] {
        assert_eq!(requests(&before, "timed", op), 0.0, "{op}");
    }
    let hits_before = before.sum("spool_shard_read_cache_hits_total");
    let commits_before = before.sum("spool_shard_commit_size_bytes_count");
    let commit_time_before = before.sum("spool_shard_commit_duration_seconds_sum");
    assert_eq!(
        before.sum("spool_shard_commit_duration_seconds_count"),
        commits_before,
        "every durable commit is timed once"
    );
    let busy_before = before.sum("spool_shard_busy_seconds_total");
    let tasks_before = before.sum("spool_shard_tasks_total");
    let claim_age =
        |exposition: &Exposition| at(exposition, "spool_oldest_claim_age_seconds", "timed", 0);
    assert_eq!(claim_age(&before), 0.0, "no claim held yet");

    // Ten enqueue requests (no linger: one message per request).
    let p0 = PartitionId(0);
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for sequence in 0..10 {
        let message = Message::new(format!("t{sequence}")).id(message_id(4, sequence));
        producer.send("timed", message).await.unwrap();
    }
    // One claim of four (read back from the tail cache: just written), one
    // ack of two, one extend, one release.
    let claim_sent = spool_tests::now();
    let claimed = client.claim("timed", p0, &claim_options(1, 4, 5_000, 0)).await.unwrap();
    assert_eq!(claimed.deliveries.len(), 4);
    let tokens = [claimed.deliveries[0].token(), claimed.deliveries[1].token()];
    client.ack("timed", p0, &tokens).await.unwrap();
    client.extend("timed", p0, claimed.deliveries[2].token(), 10_000).await.unwrap();
    client.release("timed", p0, claimed.deliveries[3].token(), 0, "later").await.unwrap();
    // max_deliveries 1: a release of the first delivery dead-letters it.
    producer.send("once", Message::new("doomed").id(message_id(5, 0))).await.unwrap();
    let doomed = client.claim("once", p0, &claim_options(1, 1, 5_000, 0)).await.unwrap();
    assert_eq!(doomed.deliveries.len(), 1);
    client.release("once", p0, doomed.deliveries[0].token(), 0, "give up").await.unwrap();

    let after = scrape(&broker);
    // The extended claim is still held: its age is at most the time since
    // the claim was sent (+1 ms: the broker counts whole milliseconds).
    let held = claim_age(&after);
    assert!(held <= claim_sent.elapsed().as_secs_f64() + 0.001, "{held}");
    assert_eq!(at(&after, "spool_oldest_claim_age_seconds", "once", 0), 0.0);
    assert_eq!(requests(&after, "timed", "enqueue"), 10.0);
    assert_eq!(requests(&after, "timed", "claim"), 1.0);
    assert_eq!(requests(&after, "timed", "ack"), 1.0);
    assert_eq!(requests(&after, "timed", "extend"), 1.0);
    assert_eq!(requests(&after, "timed", "release"), 1.0);
    assert_eq!(requests(&after, "once", "release"), 1.0);
    let sum = after
        .value("spool_request_duration_seconds_sum", &[("queue", "timed"), ("op", "enqueue")])
        .unwrap();
    assert!(sum > 0.0, "ten enqueues took some time: {sum}");
    assert!(after.sum("spool_shard_read_cache_hits_total") > hits_before);
    // Ten enqueues, each durable before its answer: at least ten commits.
    let commits = after.sum("spool_shard_commit_size_bytes_count") - commits_before;
    assert!(commits >= 10.0, "{commits} commits");
    assert!(after.sum("spool_shard_commit_size_bytes_sum") >= 4096.0 * commits);
    // The same commits are timed from write to durable: each took a write
    // and an fdatasync, so the time grew.
    assert_eq!(
        after.sum("spool_shard_commit_duration_seconds_count"),
        after.sum("spool_shard_commit_size_bytes_count"),
    );
    let commit_time = after.sum("spool_shard_commit_duration_seconds_sum") - commit_time_before;
    assert!(commit_time > 0.0, "{commits} commits took {commit_time} s");
    assert!(after.sum("spool_shard_busy_seconds_total") > busy_before);
    assert!(after.sum("spool_shard_tasks_total") > tasks_before);
    let available = after.sum("spool_disk_available_bytes");
    assert!(available > 0.0 && after.sum("spool_disk_size_bytes") >= available);
    let moved = |exposition: &Exposition, queue: &str, reason: &str| {
        exposition
            .value(
                "spool_dead_letter_moves_total",
                &[("queue", queue), ("partition", "0"), ("reason", reason)],
            )
            .unwrap()
    };
    assert_eq!(moved(&after, "once", "max_deliveries"), 1.0);
    assert_eq!(moved(&after, "once", "expired"), 0.0);
    assert_eq!(moved(&after, "timed", "max_deliveries"), 0.0);

    // The held claim ages as time passes (polled, bounded), and its ack
    // takes the age back to 0.
    let aged_at = spool_tests::now();
    loop {
        let age = claim_age(&scrape(&broker));
        if age >= 0.05 {
            assert!(age <= claim_sent.elapsed().as_secs_f64() + 0.001, "{age}");
            break;
        }
        assert!(
            aged_at.elapsed() < std::time::Duration::from_secs(10),
            "the claim's age stays {age}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    client.ack("timed", p0, &[claimed.deliveries[2].token()]).await.unwrap();
    assert_eq!(claim_age(&scrape(&broker)), 0.0, "no claim held after the ack");

    // Drain time: 0 for the drained queue "once"; for "timed" (7 left)
    // absent until an ack rate is measured between two reports, then
    // positive. Each scrape is a report; ack one more message between
    // scrapes until the rate shows (bounded).
    let drain = |exposition: &Exposition, queue: &str| {
        exposition.value("spool_drain_time_seconds", &[("queue", queue)])
    };
    assert_eq!(drain(&after, "once"), Some(0.0));
    let mut acked_more = 0;
    let seconds = loop {
        let batch = client.claim("timed", p0, &claim_options(1, 1, 5_000, 0)).await.unwrap();
        assert_eq!(batch.deliveries.len(), 1, "messages left to ack");
        client.ack("timed", p0, &[batch.deliveries[0].token()]).await.unwrap();
        acked_more += 1;
        if let Some(seconds) = drain(&scrape(&broker), "timed") {
            break seconds;
        }
        assert!(acked_more < 6, "no drain time after {acked_more} acks between scrapes");
    };
    assert!(seconds > 0.0 && seconds.is_finite(), "{seconds}");
}

// Goal: live and ready answer 200 on a healthy broker; unknown paths and
// other methods are refused. Method: one broker, one queue, raw requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_live_and_ready() {
    let broker = Spoold::start(2);
    let admin = Admin::new(broker.client().await);
    admin.create_queue("jobs", test_queue_config(3, 5_000, 3)).await.unwrap();
    let addr = broker.admin_addr();
    tokio::task::block_in_place(|| {
        let live = http_get(&addr, "/health/live");
        assert_eq!(live.status, 200, "{live:?}");
        let ready = http_get(&addr, "/health/ready");
        assert_eq!(ready.status, 200, "{ready:?}");
        assert!(ready.body.contains("3 partitions open"), "{ready:?}");
        assert_eq!(http_get(&addr, "/nope").status, 404);
        assert_eq!(http(&addr, "POST", "/metrics").status, 405);
    });
}

// Goal: a partition that refuses to open makes the broker not ready, and
// the answer names the partition and the reason; live stays 200. Method:
// create a queue, stop the broker, put a file where partition 1's
// directory was, restart: that partition is refused, the rest serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_partition_makes_the_broker_not_ready() {
    let mut broker = Spoold::start(1);
    let admin = Admin::new(broker.client().await);
    admin.create_queue("fragile", test_queue_config(2, 5_000, 3)).await.unwrap();
    drop(admin);
    assert!(broker.terminate().success());
    let dirs = spool_tests::fault::partition_dirs(&broker.data_dir());
    let victim = dirs.iter().find(|dir| dir.ends_with("p00001")).expect("partition 1's directory");
    std::fs::remove_dir_all(victim).unwrap();
    std::fs::write(victim, b"not a directory").unwrap();
    broker.restart();

    let addr = broker.admin_addr();
    tokio::task::block_in_place(|| {
        assert_eq!(http_get(&addr, "/health/live").status, 200);
        let ready = http_get(&addr, "/health/ready");
        assert_eq!(ready.status, 503, "{ready:?}");
        assert!(ready.body.contains("partition fragile/1"), "{}", ready.body);
        assert!(ready.body.contains("refused to open"), "{}", ready.body);
        assert!(!ready.body.contains("fragile/0"), "partition 0 is fine: {}", ready.body);
    });
    let metrics = scrape(&broker);
    assert_eq!(metrics.value("spool_shard_partitions_refused", &[("shard", "0")]), Some(1.0));
    assert_eq!(metrics.value("spool_shard_partitions_open", &[("shard", "0")]), Some(1.0));
}

// Goal: the process gauges tell live heap from the resident set: both are
// exported by a real spoold, the live heap grows with a backlog, and it
// never exceeds the resident set. Method: scrape, enqueue 20,000 messages
// (tokio tasks sending at once, so the producer batches them), scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_live_bytes_grow_with_the_backlog_and_stay_below_the_resident_set() {
    const MESSAGES: u64 = 20_000;
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("heap", test_queue_config(1, 5_000, 5)).await.unwrap();
    let before = scrape(&broker);
    let live_before = before.value("spool_heap_live_bytes", &[]).expect("live heap gauge");
    let resident = before.value("spool_process_resident_bytes", &[]).expect("resident gauge");
    assert!(live_before > 0.0 && live_before <= resident, "{live_before} of {resident}");

    let producer =
        std::sync::Arc::new(Producer::new(client.clone(), ProducerConfig::default()).unwrap());
    let mut sends = tokio::task::JoinSet::new();
    for sequence in 0..MESSAGES {
        let producer = producer.clone();
        sends.spawn(async move {
            let message = Message::new(format!("m{sequence}")).id(message_id(3, sequence));
            producer.send("heap", message).await
        });
    }
    while let Some(sent) = sends.join_next().await {
        sent.unwrap().unwrap();
    }

    let after = scrape(&broker);
    let live_after = after.value("spool_heap_live_bytes", &[]).expect("live heap gauge");
    let resident = after.value("spool_process_resident_bytes", &[]).expect("resident gauge");
    // At least the queue state's share of each message (≥ 16 B; ≈ 25 B
    // plus its dedupe id, broker/tests/queue_memory.rs).
    assert!(
        live_after - live_before >= (MESSAGES * 16) as f64,
        "live heap {live_before} -> {live_after} for {MESSAGES} messages"
    );
    assert!(live_after <= resident, "{live_after} of {resident}");
}
