//! `ResizeQueue` end to end on one broker: a queue grown 4 → 5 partitions
//! with a backlog moves about a fifth of its keys, each into the added
//! partition; a producer whose metadata predates the resize is answered
//! `KEY_MOVED` and routes again (nothing lost, nothing twice); the added
//! partition hands out nothing until the older ones finished what they
//! held, across a SIGKILL; then every message is delivered and per-key
//! order holds across the move.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool_client::spool_wire::batch::ArchivedPayload;
use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::routing::key_partition;
use spool_client::{
    Admin, ClaimOptions, ConsumerConfig, Delivery, Message, Producer, ProducerConfig,
};
use spool_tests::{test_queue_config, Spoold};

const QUEUE: &str = "orders";
const KEYS: u32 = 500;
/// Messages per key before the resize, and again after it.
const PER_KEY: u32 = 4;

/// One handled delivery: its key, sequence within the key, partition and
/// when its handler ran.
#[derive(Debug, Clone)]
struct Handled {
    key: u32,
    sequence: u32,
    partition: PartitionId,
    started: Instant,
    ended: Instant,
}

fn parse(delivery: &Delivery) -> (u32, u32) {
    let ArchivedPayload::Inline(bytes) = &delivery.record().payload else {
        panic!("payload not inline");
    };
    let text = std::str::from_utf8(bytes.as_slice()).unwrap();
    let (key, sequence) = text.split_once('/').unwrap();
    (key.parse().unwrap(), sequence.parse().unwrap())
}

/// `spool_partition_resize_state` of partitions 0..5 of the queue.
fn resize_states(broker: &Spoold) -> Vec<f64> {
    let answer = tokio::task::block_in_place(|| {
        spool_tests::admin::http_get(&broker.admin_addr(), "/metrics")
    });
    let exposition = spool_tests::admin::Exposition::parse(&answer.body).unwrap();
    (0..5)
        .map(|partition| {
            let partition = partition.to_string();
            let labels = [("queue", QUEUE), ("partition", partition.as_str())];
            exposition.value("spool_partition_resize_state", &labels).unwrap_or(-1.0)
        })
        .collect()
}

async fn send(producer: &Producer, keys: &[u32], sequences: std::ops::Range<u32>) {
    let mut sends = Vec::new();
    for sequence in sequences {
        for key in keys {
            let message = Message::new(format!("{key}/{sequence}")).key(format!("key-{key}"));
            sends.push(producer.submit(QUEUE, message).await.unwrap());
        }
    }
    for send in sends {
        send.await.unwrap();
    }
}

// Goal: a resize moves ≤ 1/5 + ε of the keys, only into the added
// partition, holds that partition until the older ones drained (across a
// SIGKILL), and keeps each moved key's order: none of its messages in the
// added partition is handed out before every earlier one (held by an older
// partition) was finished. Method: 500 keys × 4 messages on 4 partitions,
// resize to 5 with the CLI, 4 more per key: half from a producer that
// routed by 4 partitions before the resize (KEY_MOVED), half from a fresh
// one; `queue describe` shows the hold; SIGKILL and restart; a consumer
// (64 slots) whose handler takes 20 ms for a message of partitions 1 and
// 3 (shard 1) and 1 ms for the others, beside a worker long-polling the
// added partition alone, drains everything, recording when each
// handler started and ended. Without the hold the order check fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resized_queue_moves_a_fifth_of_its_keys_in_order() {
    let mut broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(QUEUE, test_queue_config(4, 30_000, 5)).await.unwrap();
    let stale = broker.client().await;
    let stale_producer = Producer::new(stale.clone(), ProducerConfig::default()).unwrap();
    // The stale client learns the queue (4 partitions) now.
    assert_eq!(stale.partition_count(QUEUE).await.unwrap(), 4);
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let all: Vec<u32> = (0..KEYS).collect();
    send(&producer, &all, 0..PER_KEY).await;

    let output = broker.cli(&["queue", "resize", QUEUE, "--partitions", "5"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let described = admin.describe_queue(QUEUE).await.unwrap();
    assert_eq!(described.partitions.len(), 5);
    assert_eq!(described.keys.version, 2);
    assert_eq!(described.keys.held_from, 4);
    assert_eq!(described.keys.draining.len(), 4, "{:?}", described.keys);

    // Half the keys from the producer that still routes by 4 partitions:
    // its moved keys come back KEY_MOVED and are routed again.
    let fresh = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let even: Vec<u32> = (0..KEYS).filter(|key| key % 2 == 0).collect();
    let odd: Vec<u32> = (0..KEYS).filter(|key| key % 2 == 1).collect();
    tokio::join!(
        send(&stale_producer, &even, PER_KEY..2 * PER_KEY),
        send(&fresh, &odd, PER_KEY..2 * PER_KEY),
    );
    let held = admin.describe_queue(QUEUE).await.unwrap();
    let added = held.partitions.iter().find(|stats| stats.partition == PartitionId(4)).unwrap();
    assert!(added.ready > 0, "nothing reached the added partition: {held:?}");

    // The hold survives a crash: the catalog keeps the key map.
    broker.kill();
    broker.restart();
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    let described = admin.describe_queue(QUEUE).await.unwrap();
    assert_eq!(described.keys.draining.len(), 4, "{:?}", described.keys);
    // The metric says which partitions drain (1) and which are held (2).
    assert_eq!(resize_states(&broker), [1.0, 1.0, 1.0, 1.0, 2.0]);

    // Held: a claim of the added partition finds nothing while the older
    // ones still hold every message from before the resize.
    let early = client.claim(QUEUE, PartitionId(4), &ClaimOptions::new(64).wait_ms(300)).await;
    assert!(early.unwrap().deliveries.is_empty(), "the added partition handed out messages");

    let handled: Arc<Mutex<Vec<Handled>>> = Arc::default();
    // A worker of the added partition alone, long-polling from the start:
    // it gets the moved keys' messages the moment the partition hands
    // them out.
    let added_worker = {
        let (client, log) = (client.clone(), Arc::clone(&handled));
        tokio::spawn(async move {
            let options = ClaimOptions::new(64).wait_ms(500);
            let mut idle = 0;
            while idle < 6 {
                let batch = client.claim(QUEUE, PartitionId(4), &options).await.unwrap();
                idle = if batch.deliveries.is_empty() { idle + 1 } else { 0 };
                let mut tokens = Vec::new();
                for delivery in &batch.deliveries {
                    let started = spool_tests::now();
                    let (key, sequence) = parse(delivery);
                    log.lock().unwrap().push(Handled {
                        key,
                        sequence,
                        partition: delivery.partition(),
                        started,
                        ended: spool_tests::now(),
                    });
                    tokens.push(delivery.token());
                }
                if !tokens.is_empty() {
                    client.ack(QUEUE, PartitionId(4), &tokens).await.unwrap();
                }
            }
        })
    };
    let mut config = ConsumerConfig::new(QUEUE, 64);
    config.wait_ms = 500;
    let log = Arc::clone(&handled);
    let consumer =
        spool_client::Consumer::start(client.clone(), config, move |delivery: Delivery| {
            let log = Arc::clone(&log);
            async move {
                let started = spool_tests::now();
                let (key, sequence) = parse(&delivery);
                // Shard 1's partitions (1 and 3) are slower to work
                // through: without the hold, the added partition (on shard
                // 0) would hand out messages while earlier ones of their
                // keys still wait or run there.
                let work = if delivery.partition().0 % 2 == 1 { 20 } else { 1 };
                tokio::time::sleep(Duration::from_millis(work)).await;
                log.lock().unwrap().push(Handled {
                    key,
                    sequence,
                    partition: delivery.partition(),
                    started,
                    ended: spool_tests::now(),
                });
                Ok::<(), std::convert::Infallible>(())
            }
        })
        .unwrap();
    let total = (KEYS * PER_KEY * 2) as usize;
    let deadline = spool_tests::now() + Duration::from_secs(90);
    while handled.lock().unwrap().len() < total && spool_tests::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = consumer.shutdown().await;
    added_worker.await.unwrap();
    let handled = handled.lock().unwrap().clone();
    assert!(handled.len() >= total, "handled {} of {total}", handled.len());
    assert!(stats.acked > 0, "{stats:?}");

    // Every (key, sequence) delivered; count each once.
    let mut seen: BTreeMap<(u32, u32), Handled> = BTreeMap::new();
    for item in &handled {
        seen.entry((item.key, item.sequence)).or_insert_with(|| item.clone());
    }
    assert_eq!(seen.len(), total, "some messages were never delivered");

    // Where each key's messages went, before and after the resize.
    let mut moved_keys = BTreeSet::new();
    for key in 0..KEYS {
        let name = format!("key-{key}");
        let before = PartitionId(key_partition(name.as_bytes(), 4));
        let after = PartitionId(key_partition(name.as_bytes(), 5));
        for sequence in 0..2 * PER_KEY {
            let expected = if sequence < PER_KEY { before } else { after };
            let got = seen[&(key, sequence)].partition;
            assert_eq!(got, expected, "key {key} seq {sequence}");
        }
        if before != after {
            assert_eq!(after, PartitionId(4), "key {key} moved between older partitions");
            moved_keys.insert(key);
        }
    }
    let fraction = moved_keys.len() as f64 / f64::from(KEYS);
    assert!((0.14..=0.26).contains(&fraction), "{} of {KEYS} keys moved", moved_keys.len());

    // Per-key order across the move: a moved key's message in the added
    // partition starts only after each earlier one ended.
    for key in &moved_keys {
        let last_before = (0..PER_KEY).map(|sequence| seen[&(*key, sequence)].ended).max().unwrap();
        for sequence in PER_KEY..2 * PER_KEY {
            let item = &seen[&(*key, sequence)];
            assert!(
                item.started > last_before,
                "key {key} seq {sequence} handed out {:?} before its earlier messages ended",
                last_before - item.started
            );
        }
    }
    let described = admin.describe_queue(QUEUE).await.unwrap();
    assert!(described.keys.draining.is_empty(), "{:?}", described.keys);
    assert_eq!(resize_states(&broker), [0.0; 5]);
    eprintln!("resize: {} of {KEYS} keys moved ({fraction:.3})", moved_keys.len());
}
