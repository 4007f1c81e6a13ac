//! Subscriptions end to end on one broker (`docs/design/subscriptions.md`):
//! three subscriptions of one queue (the default, one from the earliest
//! record, one from the latest) each get every message over 4 partitions
//! on 2 shards through `Consumer`s (Claim v3 of partition ANY), across a
//! SIGKILL in the middle; acks in one leave the others' backlogs alone; a
//! subscription created later from `latest` sees only later records, one
//! from a time exactly the records enqueued since; a
//! deleted one is refused by name; the HTTP API, the per-subscription
//! metrics and `spool sub` show their counters.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::ArchivedPayload;
use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, ConsumerConfig, Delivery, Message, Producer, ProducerConfig,
};
use spool_tests::admin::{http, http_get, http_json, Exposition};
use spool_tests::{test_queue_config, Spoold};

const QUEUE: &str = "events";
const MESSAGES: u32 = 100_000;

fn number(delivery: &Delivery) -> u32 {
    let ArchivedPayload::Inline(bytes) = &delivery.record().payload else {
        panic!("payload not inline");
    };
    std::str::from_utf8(bytes.as_slice()).unwrap().parse().unwrap()
}

async fn send(producer: &Producer, numbers: std::ops::Range<u32>) {
    let mut sends = Vec::new();
    for n in numbers {
        sends.push(producer.submit(QUEUE, Message::new(n.to_string())).await.unwrap());
    }
    for send in sends {
        send.await.unwrap();
    }
}

/// A consumer of `subscription` (`None`: the default) that records what
/// it handled.
fn consume(
    client: &Client,
    subscription: Option<&str>,
    seen: &Arc<Mutex<Vec<u32>>>,
) -> spool_client::Consumer {
    let mut config = ConsumerConfig::new(QUEUE, 64);
    if let Some(name) = subscription {
        config = config.subscription(name);
    }
    config.wait_ms = 300;
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

async fn wait_for(seen: &[&Arc<Mutex<Vec<u32>>>], at_least: usize) {
    let deadline = spool_tests::now() + Duration::from_secs(120);
    while seen.iter().any(|seen| distinct(seen).len() < at_least) && spool_tests::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET /metrics, checked (exposition rules and naming conventions).
fn scrape(broker: &Spoold) -> Exposition {
    let answer = tokio::task::block_in_place(|| http_get(&broker.admin_addr(), "/metrics"));
    assert_eq!(answer.status, 200, "{}", answer.body);
    Exposition::parse(&answer.body)
        .unwrap_or_else(|error| panic!("the metrics do not parse: {error}\n{}", answer.body))
}

fn subscriptions(broker: &Spoold) -> serde_json::Value {
    let answer = tokio::task::block_in_place(|| {
        http(&broker.admin_addr(), "GET", &format!("/v1/queues/{QUEUE}/subscriptions"))
    });
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

fn row<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("no subscription {name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscriptions_each_get_every_message_across_a_sigkill() {
    let mut broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, test_queue_config(4, 30_000, 5)).await.unwrap();
    let admin_addr = broker.admin_addr();
    let create = |name: &str, from: &str| {
        let body = serde_json::json!({ "name": name, "from": from });
        let path = format!("/v1/queues/{QUEUE}/subscriptions");
        tokio::task::block_in_place(|| http_json(&admin_addr, "POST", &path, &body))
    };
    let created = create("audit", "earliest");
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(create("report", "latest").status == 201);
    let twice = create("audit", "latest");
    assert_eq!(twice.status, 400, "{}", twice.body);
    assert!(create("default", "latest").status == 400, "`default` is reserved");

    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    send(&producer, 0..MESSAGES).await;
    // Only `report` consumes at first: the others keep their backlogs.
    let report: Arc<Mutex<Vec<u32>>> = Arc::default();
    let consumer = consume(&client, Some("report"), &report);
    wait_for(&[&report], MESSAGES as usize).await;
    consumer.shutdown().await;
    assert_eq!(distinct(&report).len(), MESSAGES as usize);
    let list = subscriptions(&broker);
    assert_eq!(row(&list, "report")["backlog"], 0, "{list}");
    assert_eq!(row(&list, "default")["backlog"], MESSAGES, "{list}");
    assert_eq!(row(&list, "audit")["backlog"], MESSAGES, "{list}");
    // The same in the per-subscription metrics, summed over partitions.
    let metrics = scrape(&broker);
    let total = |family: &str, sub: &str| -> f64 {
        (0..4)
            .map(|partition| {
                let partition = partition.to_string();
                let labels = [("queue", QUEUE), ("partition", &partition), ("subscription", sub)];
                metrics.value(family, &labels).unwrap_or_else(|| panic!("no {family} {sub}"))
            })
            .sum()
    };
    assert_eq!(total("spool_subscription_live_messages", "report"), 0.0);
    assert_eq!(total("spool_subscription_live_messages", "audit"), f64::from(MESSAGES));
    assert_eq!(total("spool_subscription_live_messages", "default"), f64::from(MESSAGES));
    assert_eq!(total("spool_subscription_acked_messages_total", "report"), f64::from(MESSAGES));
    assert_eq!(total("spool_subscription_acked_messages_total", "audit"), 0.0);
    assert!(total("spool_subscription_oldest_ready_age_seconds", "audit") > 0.0);
    assert_eq!(total("spool_subscription_oldest_ready_age_seconds", "report"), 0.0);

    // Half of each of the others, then a SIGKILL.
    let default: Arc<Mutex<Vec<u32>>> = Arc::default();
    let audit: Arc<Mutex<Vec<u32>>> = Arc::default();
    let first = consume(&client, None, &default);
    let second = consume(&client, Some("audit"), &audit);
    wait_for(&[&default, &audit], MESSAGES as usize / 2).await;
    first.shutdown().await;
    second.shutdown().await;
    broker.kill();
    broker.restart();
    let client = broker.client().await;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    send(&producer, MESSAGES..MESSAGES + 100).await;
    let total = MESSAGES as usize + 100;
    let first = consume(&client, None, &default);
    let second = consume(&client, Some("audit"), &audit);
    let third = consume(&client, Some("report"), &report);
    wait_for(&[&default, &audit, &report], total).await;
    for consumer in [first, second, third] {
        consumer.shutdown().await;
    }
    let every: BTreeSet<u32> = (0..MESSAGES + 100).collect();
    assert_eq!(distinct(&default), every, "the default lost messages");
    assert_eq!(distinct(&audit), every, "audit lost messages");
    assert_eq!(distinct(&report), every, "report lost messages");
    let list = subscriptions(&broker);
    for name in ["default", "audit", "report"] {
        assert_eq!(row(&list, name)["backlog"], 0, "{list}");
    }

    // A subscription created now from `latest` sees only what comes next.
    assert_eq!(create("late", "latest").status, 201);
    let late: Arc<Mutex<Vec<u32>>> = Arc::default();
    let consumer = consume(&client, Some("late"), &late);
    tokio::time::sleep(Duration::from_millis(500)).await;
    send(&producer, 500_000..500_010).await;
    wait_for(&[&late], 10).await;
    consumer.shutdown().await;
    assert_eq!(distinct(&late), (500_000..500_010).collect::<BTreeSet<u32>>());

    // One created from a time gets exactly the records enqueued since
    // then that the partitions still hold (the default still has both
    // batches; nobody consumed them).
    send(&producer, 600_000..600_010).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let since = crate::common::unix_ms();
    tokio::time::sleep(Duration::from_millis(100)).await;
    send(&producer, 600_010..600_020).await;
    assert_eq!(create("since", &format!("time:{since}")).status, 201);
    let later: Arc<Mutex<Vec<u32>>> = Arc::default();
    let consumer = consume(&client, Some("since"), &later);
    wait_for(&[&later], 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.shutdown().await;
    assert_eq!(distinct(&later), (600_010..600_020).collect::<BTreeSet<u32>>());
    assert_eq!(later.lock().unwrap().len(), 10, "each once");

    // Deleted: refused by name, by the API and by a claim.
    let path = format!("/v1/queues/{QUEUE}/subscriptions/report");
    let deleted = tokio::task::block_in_place(|| http(&broker.admin_addr(), "DELETE", &path));
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    let gone = tokio::task::block_in_place(|| http(&broker.admin_addr(), "GET", &path));
    assert_eq!(gone.status, 404, "{}", gone.body);
    let options = ClaimOptions::new(1).subscription("report");
    let refused = client.claim(QUEUE, PartitionId(0), &options).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SubscriptionNotFound), "{refused}");
    let default_path = format!("/v1/queues/{QUEUE}/subscriptions/default");
    let kept = tokio::task::block_in_place(|| http(&broker.admin_addr(), "DELETE", &default_path));
    assert_eq!(kept.status, 400, "{}", kept.body);
}

// Goal: a subscription created at an offset gets exactly the records at
// and above it that the partition still holds, and one past the
// partition's end only what comes later. Method: a 1-partition queue with
// 10 records (offsets 0–9); `from` `offset:6` claims exactly 6–9;
// `offset:100` claims nothing until a later record, then exactly it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_from_an_offset_gets_exactly_the_records_from_there() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("offsets", test_queue_config(1, 30_000, 5))
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for n in 0..10u32 {
        producer.send("offsets", Message::new(n.to_string())).await.unwrap();
    }
    let admin_addr = broker.admin_addr();
    for (name, from) in [("six", "offset:6"), ("far", "offset:100")] {
        let body = serde_json::json!({ "name": name, "from": from });
        let answer = tokio::task::block_in_place(|| {
            http_json(&admin_addr, "POST", "/v1/queues/offsets/subscriptions", &body)
        });
        assert_eq!(answer.status, 201, "{}", answer.body);
        assert_eq!(answer.json()["from"], from);
    }
    let claim_all = |name: &'static str| {
        let client = client.clone();
        async move {
            let options = ClaimOptions::new(100).subscription(name).wait_ms(200);
            let mut numbers = BTreeSet::new();
            // Until the partition's leader has started it (one watch turn).
            for _ in 0..20 {
                let batch = client.claim("offsets", PartitionId(0), &options).await.unwrap();
                numbers.extend(batch.deliveries.iter().map(number));
                if !numbers.is_empty() {
                    break;
                }
            }
            numbers
        }
    };
    assert_eq!(claim_all("six").await, (6..10).collect::<BTreeSet<u32>>());
    // DescribeQueue v2 says where each started; one made over the wire at a
    // time starts there too.
    let admin = Admin::new(client.clone());
    let at = spool_client::SubscriptionStart::Time(1_700_000_000_000);
    admin.create_subscription("offsets", "since", at).await.unwrap();
    let described = admin.describe_queue("offsets").await.unwrap();
    let start_of = |name: &str| {
        described.subscriptions.iter().find(|row| row.name == name).map(|row| row.start)
    };
    assert_eq!(start_of("six"), Some(spool_client::SubscriptionStart::Offset(6)));
    assert_eq!(start_of("since"), Some(at));
    let options = ClaimOptions::new(100).subscription("far").wait_ms(300);
    let nothing = client.claim("offsets", PartitionId(0), &options).await.unwrap();
    assert!(nothing.deliveries.is_empty(), "nothing at or past offset 100 yet");
    producer.send("offsets", Message::new("10")).await.unwrap();
    assert_eq!(claim_all("far").await, BTreeSet::from([10]));
}

// Goal: the admin port's claim, dead-letter listing, redrive and purge act
// in the subscription they name and nowhere else. Method: a 1-partition
// queue with max_deliveries 1 and a subscription `b`; over HTTP, `b`
// claims the message and releases it (a dead letter in `b` only), lists
// it, redrives it, and purges it; the default keeps its own copy, claimed
// over HTTP at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_claims_lists_redrives_and_purges_in_a_subscription() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("lanes", test_queue_config(1, 30_000, 1)).await.unwrap();
    admin
        .create_subscription("lanes", "b", spool_client::SubscriptionStart::Earliest)
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send("lanes", Message::new("7")).await.unwrap();
    let addr = broker.admin_addr();
    let call = |method: &'static str, path: &str, body: serde_json::Value| {
        let answer = tokio::task::block_in_place(|| http_json(&addr, method, path, &body));
        assert!(answer.status < 300, "{method} {path}: {} {}", answer.status, answer.body);
        answer.json()
    };
    let claim = serde_json::json!({ "subscription": "b", "partition": 0, "wait_ms": 2000 });
    let mut claimed = call("POST", "/v1/queues/lanes/claims", claim.clone());
    for _ in 0..20 {
        if claimed["messages"].as_array().is_some_and(|messages| !messages.is_empty()) {
            break;
        }
        claimed = call("POST", "/v1/queues/lanes/claims", claim.clone());
    }
    let token = claimed["messages"][0]["token"].as_str().expect("b claims the message").to_owned();
    call("POST", "/v1/releases", serde_json::json!({ "token": token, "reason": "bad" }));
    let listed = call("GET", "/v1/queues/lanes/dead-letters?subscription=b", serde_json::json!({}));
    assert_eq!(listed["subscription"], "b");
    assert_eq!(listed["dead_letters"].as_array().map(Vec::len), Some(1), "{listed}");
    let default = call("GET", "/v1/queues/lanes/dead-letters", serde_json::json!({}));
    assert_eq!(default["dead_letters"].as_array().map(Vec::len), Some(0), "{default}");
    let redriven =
        call("POST", "/v1/queues/lanes/redrive", serde_json::json!({ "subscription": "b" }));
    assert_eq!(redriven["redriven"], 1, "{redriven}");
    let purged = call(
        "POST",
        "/v1/queues/lanes/purge",
        serde_json::json!({ "subscription": "b", "confirm": true }),
    );
    assert_eq!(purged["count"], 1, "{purged}");
    let bad = tokio::task::block_in_place(|| {
        http_json(
            &addr,
            "POST",
            "/v1/queues/lanes/claims",
            &serde_json::json!({ "subscription": "zz" }),
        )
    });
    assert_eq!(bad.status, 404, "{}", bad.body);
    // The default still has its copy.
    let mine = call("POST", "/v1/queues/lanes/claims", serde_json::json!({ "wait_ms": 1000 }));
    assert_eq!(mine["messages"].as_array().map(Vec::len), Some(1), "{mine}");
}

// Goal: a rewind starts a subscription over: its claim is fenced (the old
// token is refused), what the queue still holds is delivered again in it
// (acked records too, while another subscription holds them), it keeps
// its name under a new id, and the other subscriptions are untouched; the
// CLI does the same. Method: a 1-partition queue with 5 records and a
// subscription `re` from the earliest; `re` acks 3 and holds a 4th; `spool
// sub seek --to earliest --yes`; `re` then claims all 5 again, the held
// token's ack is STALE_TOKEN, and the default still has its 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_subscription_starts_over_and_its_old_tokens_are_refused() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("rewind", test_queue_config(1, 30_000, 5)).await.unwrap();
    let created = admin
        .create_subscription("rewind", "re", spool_client::SubscriptionStart::Earliest)
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for n in 0..5u32 {
        producer.send("rewind", Message::new(n.to_string())).await.unwrap();
    }
    let p0 = PartitionId(0);
    let claim = |credits: u32| ClaimOptions::new(credits).subscription("re").wait_ms(500);
    let mut first = client.claim("rewind", p0, &claim(3)).await.unwrap();
    for _ in 0..20 {
        if !first.deliveries.is_empty() {
            break;
        }
        first = client.claim("rewind", p0, &claim(3)).await.unwrap();
    }
    assert_eq!(first.deliveries.len(), 3);
    let tokens: Vec<_> = first.deliveries.iter().map(Delivery::token).collect();
    client.ack("rewind", p0, &tokens).await.unwrap();
    let held = client.claim("rewind", p0, &claim(1)).await.unwrap();
    assert_eq!(held.deliveries.len(), 1);

    let admin_addr = broker.admin_addr();
    let seek = ["sub", "seek", "rewind", "re", "--to", "earliest", "--yes", "--admin", &admin_addr];
    let output = broker.cli(&seek);
    let text = spool_tests::success_stdout(&output);
    assert!(text.contains("starts over at earliest"), "{text}");
    let described = admin.describe_queue("rewind").await.unwrap();
    let row = described.subscriptions.iter().find(|row| row.name == "re").unwrap();
    assert!(row.id > created.id, "a new id: {} after {}", row.id, created.id);

    let mut again = BTreeSet::new();
    for _ in 0..20 {
        let batch = client.claim("rewind", p0, &claim(10)).await.unwrap();
        again.extend(batch.deliveries.iter().map(number));
        if again.len() == 5 {
            break;
        }
    }
    assert_eq!(again, (0..5).collect::<BTreeSet<u32>>(), "everything the default still holds");
    let stale = client.ack("rewind", p0, &[held.deliveries[0].token()]).await.unwrap_err();
    assert_eq!(stale.code(), Some(ErrorCode::StaleToken), "{stale}");
    let default = client.claim("rewind", p0, &ClaimOptions::new(10).wait_ms(500)).await.unwrap();
    assert_eq!(default.deliveries.len(), 5, "the default is untouched");
    let refused =
        broker.cli(&["sub", "seek", "rewind", "default", "--yes", "--admin", &admin_addr]);
    assert!(!refused.status.success(), "the default cannot be rewound");
}
