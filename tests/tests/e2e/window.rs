//! A retention window end to end (`docs/design/queue-semantics.md`,
//! "Retention: until acked, or a window"): on a queue with a 5 s window
//! over 2 partitions on 2 shards, a subscription that does not consume
//! loses exactly the records the window passed (checked by partition and
//! offset against the enqueue answers, in the admin API's loss reports),
//! the default (which acked them) loses none, the losses survive a
//! SIGKILL, and a subscription created from `earliest` after the default
//! acked everything replays exactly the records still inside the window.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::ArchivedPayload;
use spool_client::{Admin, Client, ConsumerConfig, Delivery, Message, Producer, ProducerConfig};
use spool_tests::admin::{http, http_json};
use spool_tests::{test_queue_config, Spoold};

const QUEUE: &str = "stream";
const WINDOW_MS: u64 = 5_000;

fn number(delivery: &Delivery) -> u32 {
    let ArchivedPayload::Inline(bytes) = &delivery.record().payload else {
        panic!("payload not inline");
    };
    std::str::from_utf8(bytes.as_slice()).unwrap().parse().unwrap()
}

/// Sends `numbers`; returns each one's (partition, offset).
async fn send(producer: &Producer, numbers: std::ops::Range<u32>) -> BTreeMap<u32, (u32, u64)> {
    let mut sends = Vec::new();
    for n in numbers {
        let send = producer.submit(QUEUE, Message::new(n.to_string())).await.unwrap();
        sends.push((n, send.partition().0, send));
    }
    let mut placed = BTreeMap::new();
    for (n, partition, send) in sends {
        placed.insert(n, (partition, send.await.unwrap().0));
    }
    placed
}

fn consume(
    client: &Client,
    subscription: Option<&str>,
    seen: &Arc<Mutex<Vec<u32>>>,
) -> spool_client::Consumer {
    let mut config = ConsumerConfig::new(QUEUE, 64);
    if let Some(name) = subscription {
        config = config.subscription(name);
    }
    config.wait_ms = 200;
    let seen = Arc::clone(seen);
    spool_client::Consumer::start(client.clone(), config, move |delivery: Delivery| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock().unwrap().push(number(&delivery));
            Ok::<(), std::convert::Infallible>(())
        }
    })
    .unwrap()
}

fn distinct(seen: &Arc<Mutex<Vec<u32>>>) -> BTreeSet<u32> {
    seen.lock().unwrap().iter().copied().collect()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = spool_tests::now() + Duration::from_secs(60);
    while !done() {
        assert!(spool_tests::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn subscriptions(broker: &Spoold) -> serde_json::Value {
    let answer = tokio::task::block_in_place(|| {
        http(&broker.admin_addr(), "GET", &format!("/v1/queues/{QUEUE}/subscriptions"))
    });
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

fn row(list: &serde_json::Value, name: &str) -> serde_json::Value {
    list["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("no subscription {name} in {list}"))
        .clone()
}

fn create(broker: &Spoold, name: &str, from: &str) {
    let body = serde_json::json!({ "name": name, "from": from });
    let path = format!("/v1/queues/{QUEUE}/subscriptions");
    let answer =
        tokio::task::block_in_place(|| http_json(&broker.admin_addr(), "POST", &path, &body));
    assert_eq!(answer.status, 201, "{}", answer.body);
}

/// Per partition: (lowest, highest, count) of the loss reports of `row`.
fn reported(row: &serde_json::Value) -> BTreeMap<u32, (u64, u64, u64)> {
    let mut out: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for loss in row["losses"].as_array().unwrap_or_else(|| panic!("no losses in {row}")) {
        let partition = u32::try_from(loss["partition"].as_u64().unwrap()).unwrap();
        let (from, to, count) = (
            loss["from"].as_u64().unwrap(),
            loss["to"].as_u64().unwrap(),
            loss["count"].as_u64().unwrap(),
        );
        let entry = out.entry(partition).or_insert((u64::MAX, 0, 0));
        *entry = (entry.0.min(from), entry.1.max(to), entry.2 + count);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_drops_exactly_the_unread_records_it_passed_and_earliest_replays_the_rest() {
    let mut broker = Spoold::start(2);
    let client = broker.client().await;
    let config = spool_client::spool_wire::proto::QueueConfig {
        retention_ms: WINDOW_MS,
        ..test_queue_config(2, 30_000, 5)
    };
    Admin::new(client.clone()).create_queue(QUEUE, config).await.unwrap();
    // `idle` never consumes; wait until both partitions started it.
    create(&broker, "idle", "latest");
    wait_until("idle on both partitions", || {
        row(&subscriptions(&broker), "idle")["partitions_reporting"] == 2
    })
    .await;

    // Batch A: the default acks it all; `idle` reads none of it.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let first = send(&producer, 0..200).await;
    let default_seen = Arc::new(Mutex::new(Vec::new()));
    let default = consume(&client, None, &default_seen);
    wait_until("the default to ack batch A", || distinct(&default_seen).len() == 200).await;

    // The window passes batch A: `idle` loses exactly it, by offset.
    wait_until("idle to lose batch A", || row(&subscriptions(&broker), "idle")["lost"] == 200)
        .await;
    let list = subscriptions(&broker);
    let mut want: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for &(partition, offset) in first.values() {
        let entry = want.entry(partition).or_insert((u64::MAX, 0, 0));
        *entry = (entry.0.min(offset), entry.1.max(offset), entry.2 + 1);
    }
    assert_eq!(want.len(), 2, "batch A covers both partitions");
    assert_eq!(reported(&row(&list, "idle")), want, "{list}");
    assert_eq!(row(&list, "default")["lost"], 0, "{list}");
    assert_eq!(row(&list, "idle")["backlog"], 0, "{list}");

    // The losses are state: they survive a SIGKILL.
    default.shutdown().await;
    drop(producer);
    drop(client);
    broker.kill();
    broker.restart();
    let list = subscriptions(&broker);
    assert_eq!(row(&list, "idle")["lost"], 200, "{list}");
    assert_eq!(reported(&row(&list, "idle")), want, "{list}");

    // Batch B: the default acks it all too, yet it stays for the window:
    // a subscription from `earliest` replays exactly batch B.
    let client = broker.client().await;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    send(&producer, 200..300).await;
    let default_seen = Arc::new(Mutex::new(Vec::new()));
    let default = consume(&client, None, &default_seen);
    wait_until("the default to ack batch B", || distinct(&default_seen).len() == 100).await;
    create(&broker, "replay", "earliest");
    let replay_seen = Arc::new(Mutex::new(Vec::new()));
    let replay = consume(&client, Some("replay"), &replay_seen);
    wait_until("replay to get batch B", || distinct(&replay_seen).len() >= 100).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(distinct(&replay_seen), (200..300).collect::<BTreeSet<u32>>());
    let list = subscriptions(&broker);
    assert_eq!(row(&list, "replay")["lost"], 0, "{list}");
    replay.shutdown().await;
    default.shutdown().await;
}
