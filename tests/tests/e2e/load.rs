//! Many producers and consumers at once: nothing lost, nothing acked twice,
//! nothing redelivered unless its lease ran out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::{Admin, Consumer, ConsumerConfig, Delivery, Message, Producer, ProducerConfig};
use spool_tests::{now, test_queue_config, Spoold};

use crate::common::{eventually, id_parts, message_id, unix_ms};

/// Messages sent by default; `SPOOL_E2E_MESSAGES` overrides.
const MESSAGES_DEFAULT: u64 = 100_000;
const PRODUCERS: u32 = 2;
const CONSUMERS: usize = 4;
const CONSUMER_SLOTS: u32 = 64;
const PARTITIONS: u32 = 4;
/// Long enough that no lease should expire in this test; if one does, the
/// redelivery must be justified by it.
const LEASE_MS: u32 = 30_000;
/// How long consumers may take to ack everything after the last send.
const CONSUME_TIMEOUT: Duration = Duration::from_secs(80);

/// One delivery as a handler saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    attempt: u32,
    /// When the handler ran (Unix ms, same clock as the broker's).
    seen_ms: u64,
    lease_deadline_ms: u64,
}

fn message_count() -> u64 {
    std::env::var("SPOOL_E2E_MESSAGES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(MESSAGES_DEFAULT)
}

// Goal: with 2 producers and 4 slot-limited consumers on a 2-shard broker,
// every message is acked exactly once, none is lost, and a redelivery only
// follows an expired lease. Method: ids encode (producer, sequence); handlers
// record every delivery; after the run compare against what was sent and the
// broker's own counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_four_consumers_ack_every_message_once() {
    let total = message_count();
    let per_producer = total / u64::from(PRODUCERS);
    let total = per_producer * u64::from(PRODUCERS);
    let broker = Spoold::start(2);
    let admin = Admin::new(broker.client().await);
    admin.create_queue("load", test_queue_config(PARTITIONS, LEASE_MS, 10)).await.unwrap();

    let seen: Arc<Mutex<HashMap<MessageId, Vec<Seen>>>> = Arc::default();
    let mut consumers = Vec::new();
    for index in 0..CONSUMERS {
        let mut config = ConsumerConfig::new("load", CONSUMER_SLOTS);
        config.lease_ms = LEASE_MS;
        config.wait_ms = 200;
        config.worker = spool_client::spool_wire::proto::WorkerId(index as u64 + 1);
        let seen = Arc::clone(&seen);
        let handler = move |delivery: Delivery| {
            let record = Seen {
                attempt: delivery.attempt(),
                seen_ms: unix_ms(),
                lease_deadline_ms: delivery.lease_deadline_ms(),
            };
            seen.lock().unwrap().entry(delivery.message_id()).or_default().push(record);
            async { Ok::<(), String>(()) }
        };
        consumers.push(Consumer::start(broker.client().await, config, handler).unwrap());
    }

    let started = now();
    let mut producers = Vec::new();
    for producer_index in 0..PRODUCERS {
        let client = broker.client().await;
        producers.push(tokio::spawn(async move {
            let producer = Producer::new(client, ProducerConfig::default()).unwrap();
            let mut pending = Vec::with_capacity(per_producer as usize);
            for sequence in 0..per_producer {
                let message = Message::new(sequence.to_le_bytes().to_vec())
                    .id(message_id(producer_index, sequence));
                pending.push(producer.submit("load", message).await.unwrap());
            }
            let mut acked = 0u64;
            for future in pending {
                future.await.unwrap();
                acked += 1;
            }
            acked
        }));
    }
    for producer in producers {
        assert_eq!(producer.await.unwrap(), per_producer);
    }
    let produced_s = started.elapsed().as_secs_f64();

    let all_seen = eventually(CONSUME_TIMEOUT, || {
        let count = seen.lock().unwrap().len() as u64;
        let acked: u64 = consumers.iter().map(|consumer| consumer.stats().acked).sum();
        async move { count == total && acked >= total }
    })
    .await;
    let consumed_s = started.elapsed().as_secs_f64();
    let mut stats = Vec::new();
    for consumer in consumers {
        stats.push(consumer.shutdown().await);
    }
    eprintln!(
        "load: {total} messages, {PRODUCERS} producers, {CONSUMERS}x{CONSUMER_SLOTS} slots: \
         all enqueued after {produced_s:.1} s, all acked after {consumed_s:.1} s \
         ({:.0} msg/s end to end); consumer stats {stats:?}",
        total as f64 / consumed_s
    );
    assert!(all_seen, "not every message was delivered and acked within {CONSUME_TIMEOUT:?}");

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for producer_index in 0..PRODUCERS {
        for sequence in 0..per_producer {
            assert!(
                seen.contains_key(&message_id(producer_index, sequence)),
                "message ({producer_index}, {sequence}) was never delivered"
            );
        }
    }
    for (id, deliveries) in seen.iter() {
        let (source, sequence) = id_parts(*id);
        assert!(source < PRODUCERS && sequence < per_producer, "unknown message {id:?}");
        let mut deliveries = deliveries.clone();
        deliveries.sort_by_key(|delivery| delivery.attempt);
        for (index, delivery) in deliveries.iter().enumerate() {
            assert_eq!(delivery.attempt as usize, index + 1, "attempts of {id:?}: {deliveries:?}");
        }
        for pair in deliveries.windows(2) {
            assert!(
                pair[0].lease_deadline_ms <= pair[1].seen_ms,
                "{id:?} redelivered before its lease expired: {deliveries:?}"
            );
        }
    }
    let acked: u64 = stats.iter().map(|stats| stats.acked).sum();
    let settle_failed: u64 = stats.iter().map(|stats| stats.settle_failed).sum();
    let redelivered = seen.values().filter(|deliveries| deliveries.len() > 1).count() as u64;
    assert_eq!(acked, total, "each message acked exactly once");
    assert!(settle_failed <= redelivered, "a failed ack without a redelivery: {stats:?}");
    for stats in &stats {
        assert!(stats.outstanding_max <= u64::from(CONSUMER_SLOTS), "{stats:?}");
        assert_eq!(stats.released, 0, "{stats:?}");
    }

    let described = admin.describe_queue("load").await.unwrap();
    assert_eq!(described.partitions.len(), PARTITIONS as usize);
    let broker_acked: u64 = described.partitions.iter().map(|p| p.acked).sum();
    assert_eq!(broker_acked, total, "{described:?}");
    assert!(
        described.partitions.iter().all(|p| p.ready + p.claimed + p.scheduled + p.quarantined == 0),
        "{described:?}"
    );
    // Every partition got work (round-robin without keys).
    assert!(described.partitions.iter().all(|p| p.acked > 0), "{described:?}");
}

// Goal: a keyless stream that outruns its partitions is spread over all of
// them: a partition still busy with its earlier batch ends the sticky turn
// once its waiting batch reached `max_batch_bytes`, instead of taking every
// keyless message until the builder is full (4 MiB) while the others idle.
// Method: 4 partitions, one batch in flight per partition, 32 KiB batches,
// 8,000 messages of 1 KiB submitted before any is awaited; every partition
// gets at least a sixth of them (round robin in 32 KiB turns gives each
// about a quarter; the old rule gave the first busy partition thousands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_stream_under_load_spreads_over_every_partition() {
    const SENT: usize = 8_000;
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("spread", test_queue_config(PARTITIONS, LEASE_MS, 5))
        .await
        .unwrap();
    let config = ProducerConfig {
        max_batch_bytes: 32 * 1024,
        in_flight_per_partition: 1,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, config).unwrap();
    let mut sends = Vec::with_capacity(SENT);
    for _ in 0..SENT {
        sends.push(producer.submit("spread", Message::new(vec![7u8; 1024])).await.unwrap());
    }
    let mut per_partition: HashMap<u32, usize> = HashMap::new();
    for send in sends {
        let partition = send.partition().0;
        send.await.unwrap();
        *per_partition.entry(partition).or_default() += 1;
    }
    assert_eq!(per_partition.values().sum::<usize>(), SENT);
    for partition in 0..PARTITIONS {
        let got = per_partition.get(&partition).copied().unwrap_or(0);
        assert!(got >= SENT / 6, "partition {partition} got {got} of {SENT}: {per_partition:?}");
    }
}
