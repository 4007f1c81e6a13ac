//! Inspection and repair in one subscription against a real `spoold`
//! (`docs/design/protocol.md`, Peek, DeadLetters, Purge and Redrive v2):
//! a queue with subscriptions `a` and `b` consumed differently, each
//! seen, listed, redriven and purged on its own through the client's
//! `Admin` and the CLI's `--sub`, the others left as they were, unknown
//! names refused, and the audit log naming the subscription.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use spool_client::spool_wire::batch::{validate_record, ArchivedPayload, BatchBytes};
use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId, RedriveTarget};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, Delivery, Message, Producer, ProducerConfig, SubscriptionStart,
};
use spool_tests::{spool_bin, test_queue_config, Spoold};

const QUEUE: &str = "inspected";
const PARTITIONS: u32 = 2;
const MESSAGES: u32 = 20;

fn number_of(payload: &ArchivedPayload) -> u32 {
    let ArchivedPayload::Inline(bytes) = payload else { panic!("payload not inline") };
    std::str::from_utf8(bytes.as_slice()).unwrap().parse().unwrap()
}

fn number(delivery: &Delivery) -> u32 {
    number_of(&delivery.record().payload)
}

/// Claims up to `total` messages of `sub`, partition after partition.
async fn claim_up_to(client: &Client, sub: &str, total: u32) -> Vec<(PartitionId, Delivery)> {
    let mut claimed = Vec::new();
    for partition in (0..PARTITIONS).map(PartitionId) {
        let left = total - claimed.len() as u32;
        if left == 0 {
            break;
        }
        let options = ClaimOptions::new(left).wait_ms(0).subscription(sub);
        let batch = client.claim(QUEUE, partition, &options).await.unwrap();
        claimed.extend(batch.deliveries.into_iter().map(|delivery| (partition, delivery)));
    }
    assert_eq!(claimed.len() as u32, total, "claimed in {sub}");
    claimed
}

/// What a peek of `sub` shows over every partition: number → (state,
/// attempt).
async fn peeked(admin: &Admin, sub: &str) -> Vec<(u32, MessageState, u32)> {
    let mut seen = Vec::new();
    for partition in (0..PARTITIONS).map(PartitionId) {
        for message in admin.peek_in(QUEUE, sub, partition, Offset(0), 100).await.unwrap() {
            let mut aligned = BatchBytes::with_capacity(message.record.len());
            aligned.extend_from_slice(&message.record);
            let record = validate_record(&aligned).unwrap();
            seen.push((number_of(&record.payload), message.state, message.attempt));
        }
    }
    seen.sort_unstable_by_key(|&(number, _, _)| number);
    seen
}

fn numbers(seen: &[(u32, MessageState, u32)]) -> BTreeSet<u32> {
    seen.iter().map(|&(number, _, _)| number).collect()
}

/// `(partition, original offset)` of every dead letter of `sub`.
async fn dead_letters(admin: &Admin, sub: &str) -> BTreeSet<(u32, u64)> {
    let mut dead = BTreeSet::new();
    for partition in (0..PARTITIONS).map(PartitionId) {
        for letter in admin.dead_letters_in(QUEUE, sub, partition, Offset(0), 100).await.unwrap() {
            dead.insert((partition.0, letter.original_offset.0));
        }
    }
    dead
}

/// `spool --json ARGS…`, which must succeed; its JSON answer.
fn cli_json(broker: &Spoold, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = broker.cli(&all);
    assert!(output.status.success(), "spool {args:?}: {output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

// Goal: Peek, DeadLetters, Redrive and Purge naming a subscription see and
// change that subscription alone, through the client and the CLI's
// `--sub`; an unknown name is SUBSCRIPTION_NOT_FOUND; the audit log names
// the subscription of a purge and a redrive, and the subscriptions made.
// Method: 20 messages under a default, `a` and `b` (earliest), one
// delivery each; `a` acks 8, `b` releases 6 (dead letters of `b`); each
// view checked, then `b`'s redriven and `a` purged by the CLI, and every
// subscription looked at again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscription_is_inspected_and_repaired_on_its_own() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(QUEUE, test_queue_config(PARTITIONS, 30_000, 1)).await.unwrap();
    for sub in ["a", "b"] {
        admin.create_subscription(QUEUE, sub, SubscriptionStart::Earliest).await.unwrap();
    }
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for n in 0..MESSAGES {
        producer.send(QUEUE, Message::new(n.to_string())).await.unwrap();
    }
    // Every partition starts both subscriptions within a watch turn: until
    // then a peek of one there is empty.
    let deadline = spool_tests::now() + Duration::from_secs(30);
    while peeked(&admin, "a").await.len() < MESSAGES as usize
        || peeked(&admin, "b").await.len() < MESSAGES as usize
    {
        assert!(spool_tests::now() < deadline, "subscriptions never started everywhere");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // `a` finishes 8; `b` gives 6 back, which with one delivery allowed
    // are dead letters of `b` alone.
    let mut acked = BTreeSet::new();
    for (partition, delivery) in claim_up_to(&client, "a", 8).await {
        acked.insert(number(&delivery));
        client.ack(QUEUE, partition, &[delivery.token()]).await.unwrap();
    }
    let mut released = BTreeSet::new();
    let mut released_at = BTreeSet::new();
    for (partition, delivery) in claim_up_to(&client, "b", 6).await {
        released.insert(number(&delivery));
        released_at.insert((partition.0, delivery.offset().0));
        client.release(QUEUE, partition, delivery.token(), 0, "bad").await.unwrap();
    }
    let all: BTreeSet<u32> = (0..MESSAGES).collect();

    // Each peek shows its subscription's live messages only.
    let default = peeked(&admin, "").await;
    assert_eq!(numbers(&default), all, "the default consumed nothing");
    assert!(default
        .iter()
        .all(|&(_, state, attempt)| state == MessageState::Ready && attempt == 0));
    let in_a = peeked(&admin, "a").await;
    assert_eq!(numbers(&in_a), &all - &acked);
    assert!(in_a.iter().all(|&(_, state, _)| state == MessageState::Ready));
    assert_eq!(numbers(&peeked(&admin, "b").await), &all - &released);
    // The old call is the default's.
    let old = admin.peek(QUEUE, PartitionId(0), Offset(0), 100).await.unwrap();
    let named = admin.peek_in(QUEUE, "default", PartitionId(0), Offset(0), 100).await.unwrap();
    assert_eq!(old, named);

    // Dead letters: `b`'s six, none elsewhere.
    assert_eq!(dead_letters(&admin, "b").await, released_at);
    assert!(dead_letters(&admin, "a").await.is_empty());
    assert!(dead_letters(&admin, "").await.is_empty());
    let listed = cli_json(&broker, &["dlq", "list", QUEUE, "--sub", "b", "-n", "100"]);
    assert_eq!(listed.as_array().unwrap().len(), released.len(), "{listed}");
    let listed = cli_json(&broker, &["dlq", "list", QUEUE, "-n", "100"]);
    assert!(listed.as_array().unwrap().is_empty(), "{listed}");
    let peek_a = cli_json(&broker, &["peek", QUEUE, "--sub", "a", "-n", "100"]);
    let shown: BTreeSet<u32> = peek_a
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["payload"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(shown, &all - &acked);

    // Unknown names: SUBSCRIPTION_NOT_FOUND to the client, a failed CLI.
    let refused = admin.peek_in(QUEUE, "nope", PartitionId(0), Offset(0), 10).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SubscriptionNotFound), "{refused:?}");
    let refused = admin.purge_in(QUEUE, "nope", PartitionId(0), true).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SubscriptionNotFound), "{refused:?}");
    let refused = admin.redrive_in(QUEUE, "nope", PartitionId(0), RedriveTarget::All).await;
    assert_eq!(refused.unwrap_err().code(), Some(ErrorCode::SubscriptionNotFound));
    let refused = admin.dead_letters_in(QUEUE, "nope", PartitionId(0), Offset(0), 10).await;
    assert_eq!(refused.unwrap_err().code(), Some(ErrorCode::SubscriptionNotFound));
    let output = broker.cli(&["peek", QUEUE, "--sub", "nope"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("SUBSCRIPTION_NOT_FOUND"));

    // Redrive in `b`: its six are ready there again; `a` and the default
    // are as they were.
    let redriven = cli_json(&broker, &["dlq", "redrive", QUEUE, "--sub", "b"]);
    assert_eq!(redriven["redriven"], released.len(), "{redriven}");
    assert!(dead_letters(&admin, "b").await.is_empty());
    let in_b = peeked(&admin, "b").await;
    assert_eq!(numbers(&in_b), all);
    assert!(in_b.iter().all(|&(_, state, _)| state == MessageState::Ready));
    assert_eq!(peeked(&admin, "a").await, in_a);
    assert_eq!(peeked(&admin, "").await, default);

    // Purge in `a`: empty there, the default and `b` untouched.
    let mut counted = 0;
    for partition in (0..PARTITIONS).map(PartitionId) {
        counted += admin.purge_in(QUEUE, "a", partition, true).await.unwrap();
    }
    assert_eq!(counted, (MESSAGES as usize - acked.len()) as u64);
    let purged = cli_json(&broker, &["purge", QUEUE, "--sub", "a", "--yes"]);
    assert_eq!(purged["purged"], counted, "{purged}");
    assert!(peeked(&admin, "a").await.is_empty());
    assert_eq!(peeked(&admin, "").await, default);
    assert_eq!(peeked(&admin, "b").await, in_b);
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let ready = |name: &str| {
        let row = described.subscriptions.iter().find(|row| row.name == name).unwrap();
        (row.ready, row.dead_letters)
    };
    assert_eq!(ready("a"), (0, 0));
    assert_eq!(ready("b"), (u64::from(MESSAGES), 0));
    assert_eq!(ready("default"), (u64::from(MESSAGES), 0));

    // The audit log names the subscription of each purge and redrive and
    // the subscriptions made; `spool audit` shows it.
    let audit = std::process::Command::new(spool_bin())
        .args(["--json", "audit", "--data-dir"])
        .arg(broker.data_dir())
        .output()
        .unwrap();
    assert!(audit.status.success(), "{audit:?}");
    let entries: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let entries = entries.as_array().unwrap();
    let of = |operation: &str| -> Vec<&Value> {
        entries.iter().filter(|entry| entry["operation"] == operation).collect()
    };
    let made: Vec<&Value> = of("create_subscription");
    assert_eq!(made.len(), 2, "{entries:?}");
    assert_eq!((&made[0]["subscription"], &made[1]["subscription"]), (&"a".into(), &"b".into()));
    let redrives = of("redrive");
    assert_eq!(redrives.len(), PARTITIONS as usize + 1, "{entries:?}");
    // The refused one first, naming what it asked for.
    assert_eq!(redrives[0]["subscription"], "nope");
    assert_eq!(redrives[0]["outcome"], "SUBSCRIPTION_NOT_FOUND");
    let redrives = &redrives[1..];
    assert!(redrives.iter().all(|entry| entry["subscription"] == "b" && entry["outcome"] == "ok"));
    let moved: u64 = redrives.iter().map(|entry| entry["count"].as_u64().unwrap()).sum();
    assert_eq!(moved, released.len() as u64);
    let purges = of("purge");
    assert_eq!(purges.len(), PARTITIONS as usize, "dry runs are not audited: {entries:?}");
    assert!(purges.iter().all(|entry| entry["subscription"] == "a"));
    let table = std::process::Command::new(spool_bin())
        .args(["audit", "--data-dir"])
        .arg(broker.data_dir())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("subscription") && table.contains("create_subscription"), "{table}");
}
