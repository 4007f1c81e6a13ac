//! Subscription admin over the binary protocol against a real `spoold`
//! (`docs/design/protocol.md`, CreateSubscription, DeleteSubscription and
//! DescribeQueue v2): the client's `Admin` creates subscriptions, DescribeQueue
//! lists them with counters that move as messages are sent, claimed and
//! acked, a `Consumer` of one gets exactly its messages, a deleted one is
//! refused by name, and the refusals carry their codes; with
//! authentication on, only a principal with `admin` on the queue may
//! create or delete.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::ArchivedPayload;
use spool_client::spool_wire::proto::{
    DescribeQueueRequest, DescribeQueueResponse, PartitionId, Request, Response,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, ConsumerConfig, Delivery, Message, Producer, ProducerConfig,
    SubscriptionStart, SubscriptionStats,
};
use spool_tests::auth::{
    client_as, write_auth_file, Principal, OPS, OPS_SECRET, WORKER, WORKER_SECRET,
};
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "fanout";
const PARTITIONS: u32 = 4;

async fn send(producer: &Producer, numbers: std::ops::Range<u32>) {
    let mut sends = Vec::new();
    for n in numbers {
        sends.push(producer.submit(QUEUE, Message::new(n.to_string())).await.unwrap());
    }
    for send in sends {
        send.await.unwrap();
    }
}

fn number(delivery: &Delivery) -> u32 {
    let ArchivedPayload::Inline(bytes) = &delivery.record().payload else {
        panic!("payload not inline");
    };
    std::str::from_utf8(bytes.as_slice()).unwrap().parse().unwrap()
}

fn row<'a>(described: &'a DescribeQueueResponse, name: &str) -> &'a SubscriptionStats {
    described
        .subscriptions
        .iter()
        .find(|row| row.name == name)
        .unwrap_or_else(|| panic!("no subscription {name} in {:?}", described.subscriptions))
}

/// DescribeQueue until `done` holds of it (bounded): the partitions start a
/// subscription within a turn of their watch, and counters follow the
/// claims and acks that were answered.
async fn describe_until(
    admin: &Admin,
    what: &str,
    done: impl Fn(&DescribeQueueResponse) -> bool,
) -> DescribeQueueResponse {
    let deadline = spool_tests::now() + Duration::from_secs(30);
    loop {
        let described = admin.describe_queue(QUEUE).await.unwrap();
        if done(&described) {
            return described;
        }
        assert!(
            spool_tests::now() < deadline,
            "{what}: never reached; last {:?}",
            described.subscriptions
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Claims everything `subscription` has ready on every partition (no ack).
async fn claim_all(client: &Client, subscription: &str) -> Vec<(PartitionId, Delivery)> {
    let mut claimed = Vec::new();
    for partition in (0..PARTITIONS).map(PartitionId) {
        let options = ClaimOptions::new(1000).wait_ms(0).subscription(subscription);
        let batch = client.claim(QUEUE, partition, &options).await.unwrap();
        claimed.extend(batch.deliveries.into_iter().map(|delivery| (partition, delivery)));
    }
    claimed
}

// Goal: subscriptions are made, listed, consumed from and deleted over the
// wire alone, with DescribeQueue v2's counters following what happens, the
// refusals carrying QUEUE_NOT_FOUND, INVALID_ARGUMENT and
// SUBSCRIPTION_NOT_FOUND, and a DescribeQueue v1 answer still naming no
// subscription. Method: 20 messages sent before `audit` (earliest) is
// made and 10 after `tail` (latest) is; `audit` claims all 30 without
// acking, then acks them; a Consumer of `tail` gets exactly the later 10;
// the default is left alone; then the refusals and a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_made_described_consumed_and_deleted_over_the_wire() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(QUEUE, test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    send(&producer, 0..20).await;

    // Before any subscription: the default alone, with the queue's counts.
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let names: Vec<&str> = described.subscriptions.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names, ["default"]);
    assert_eq!((row(&described, "default").id, row(&described, "default").ready), (0, 20));
    assert_eq!(row(&described, "default").partitions, PARTITIONS);

    let audit = admin.create_subscription(QUEUE, "audit", SubscriptionStart::Earliest).await;
    let audit = audit.unwrap();
    assert_eq!(audit.id, 1);
    assert!(audit.assignment_version.0 > 0);
    let tail = admin.create_subscription(QUEUE, "tail", SubscriptionStart::Latest).await.unwrap();
    assert_eq!(tail.id, 2);
    assert!(tail.assignment_version > audit.assignment_version);
    // Every partition starts both within a watch turn.
    let described = describe_until(&admin, "both started everywhere", |d| {
        d.subscriptions.len() == 3 && d.subscriptions.iter().all(|row| row.partitions == PARTITIONS)
    })
    .await;
    let names: Vec<&str> = described.subscriptions.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names, ["default", "audit", "tail"], "the default first, then by name");
    assert_eq!(row(&described, "audit").start, SubscriptionStart::Earliest);
    assert_eq!(row(&described, "tail").start, SubscriptionStart::Latest);
    assert_eq!(row(&described, "audit").ready, 20, "earliest: the backlog before it");
    assert_eq!(row(&described, "tail").ready, 0, "latest: nothing before it");

    send(&producer, 20..30).await;
    let described =
        describe_until(&admin, "30 ready in audit", |d| row(d, "audit").ready == 30).await;
    assert_eq!((row(&described, "default").ready, row(&described, "tail").ready), (30, 10));

    // `audit` claims everything and holds it: in flight there only.
    let claimed = claim_all(&client, "audit").await;
    assert_eq!(claimed.len(), 30);
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let audit_row = row(&described, "audit");
    assert_eq!((audit_row.ready, audit_row.claimed, audit_row.acked), (0, 30, 0));
    assert_eq!((row(&described, "default").ready, row(&described, "default").claimed), (30, 0));
    assert_eq!(row(&described, "tail").claimed, 0);
    // The oldest unacked delivery ages (time itself is what is measured).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let described = admin.describe_queue(QUEUE).await.unwrap();
    assert!(row(&described, "audit").oldest_claim_age_ms >= 20, "{:?}", row(&described, "audit"));
    for (partition, delivery) in &claimed {
        client.ack(QUEUE, *partition, &[delivery.token()]).await.unwrap();
    }
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let audit_row = row(&described, "audit");
    assert_eq!((audit_row.ready, audit_row.claimed, audit_row.acked), (0, 0, 30));
    assert_eq!(audit_row.oldest_claim_age_ms, 0);
    assert_eq!(row(&described, "default").acked, 0, "an ack in audit leaves the default alone");

    // A Consumer of `tail` gets exactly what came after it.
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let mut config = ConsumerConfig::new(QUEUE, 16).subscription("tail");
    config.wait_ms = 200;
    let consumer = {
        let seen = Arc::clone(&seen);
        spool_client::Consumer::start(client.clone(), config, move |delivery: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(number(&delivery));
                Ok::<(), std::convert::Infallible>(())
            }
        })
        .unwrap()
    };
    let described = describe_until(&admin, "tail consumed", |d| row(d, "tail").acked == 10).await;
    consumer.shutdown().await;
    let got: BTreeSet<u32> = seen.lock().unwrap().iter().copied().collect();
    assert_eq!(got, (20..30).collect::<BTreeSet<u32>>());
    assert_eq!(seen.lock().unwrap().len(), 10, "each once");
    assert_eq!(row(&described, "tail").ready, 0);
    assert_eq!(row(&described, "default").ready, 30, "the default still has everything");

    // Refusals, each with its code; nothing changes.
    let code = |error: spool_client::ClientError| error.code();
    let twice = admin.create_subscription(QUEUE, "audit", SubscriptionStart::Latest).await;
    assert_eq!(twice.map_err(code).unwrap_err(), Some(ErrorCode::InvalidArgument));
    let reserved = admin.create_subscription(QUEUE, "default", SubscriptionStart::Latest).await;
    assert_eq!(reserved.map_err(code).unwrap_err(), Some(ErrorCode::InvalidArgument));
    let kept = admin.delete_subscription(QUEUE, "default").await;
    assert_eq!(kept.map_err(code).unwrap_err(), Some(ErrorCode::InvalidArgument));
    let unknown = admin.delete_subscription(QUEUE, "nope").await;
    assert_eq!(unknown.map_err(code).unwrap_err(), Some(ErrorCode::SubscriptionNotFound));
    let no_queue = admin.create_subscription("absent", "audit", SubscriptionStart::Latest).await;
    assert_eq!(no_queue.map_err(code).unwrap_err(), Some(ErrorCode::QueueNotFound));
    let bad_name = admin.create_subscription(QUEUE, "a b", SubscriptionStart::Latest).await;
    assert_eq!(bad_name.map_err(code).unwrap_err(), Some(ErrorCode::InvalidArgument));
    assert_eq!(admin.describe_queue(QUEUE).await.unwrap().subscriptions.len(), 3);

    // Deleted: gone from the list, and a claim naming it is refused.
    let deleted = admin.delete_subscription(QUEUE, "audit").await.unwrap();
    assert!(deleted > tail.assignment_version);
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let names: Vec<&str> = described.subscriptions.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names, ["default", "tail"]);
    let options = ClaimOptions::new(1).wait_ms(0).subscription("audit");
    let refused = client.claim(QUEUE, PartitionId(0), &options).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SubscriptionNotFound), "{refused}");
    let again = admin.delete_subscription(QUEUE, "audit").await;
    assert_eq!(again.map_err(code).unwrap_err(), Some(ErrorCode::SubscriptionNotFound));

    // A client of DescribeQueue v1 (a plain call) gets the answer it always
    // got: partitions, no subscriptions.
    let plain = Request::DescribeQueue(DescribeQueueRequest { name: QUEUE.into() });
    let bytes = client.control(&plain).await.unwrap();
    assert_eq!(bytes.api_version(), 1);
    let Response::DescribeQueue(old) = bytes.response().unwrap() else { panic!("not it") };
    assert!(old.subscriptions.is_empty());
    assert!(!old.partitions.is_empty());
}

// Goal: with authentication on, creating and deleting a subscription over
// the wire needs `admin` on the queue, as CreateQueue and DeleteQueue do;
// describing needs `describe` only. Method: a worker (enqueue, claim,
// describe) refused PERMISSION_DENIED for both, the operator (admin)
// allowed, the worker's describe listing what the operator made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_and_deleting_needs_admin_on_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(WORKER, WORKER_SECRET, &[QUEUE], &["enqueue", "claim", "describe"]),
            Principal::new(OPS, OPS_SECRET, &["*"], &["describe", "admin"]),
        ],
    );
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);
    let ops = Admin::new(client_as(&broker, OPS, OPS_SECRET).await.unwrap());
    let worker = Admin::new(client_as(&broker, WORKER, WORKER_SECRET).await.unwrap());
    ops.create_queue(QUEUE, test_queue_config(2, 30_000, 5)).await.unwrap();

    let denied = worker.create_subscription(QUEUE, "audit", SubscriptionStart::Latest).await;
    assert_eq!(denied.unwrap_err().code(), Some(ErrorCode::PermissionDenied));
    ops.create_subscription(QUEUE, "audit", SubscriptionStart::Latest).await.unwrap();
    let described = worker.describe_queue(QUEUE).await.unwrap();
    assert!(described.subscriptions.iter().any(|row| row.name == "audit"));
    let denied = worker.delete_subscription(QUEUE, "audit").await;
    assert_eq!(denied.unwrap_err().code(), Some(ErrorCode::PermissionDenied));
    ops.delete_subscription(QUEUE, "audit").await.unwrap();
    let described = worker.describe_queue(QUEUE).await.unwrap();
    assert_eq!(described.subscriptions.len(), 1, "{:?}", described.subscriptions);
}
