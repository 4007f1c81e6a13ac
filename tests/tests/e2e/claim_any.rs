//! `Client::claim_any` against a live broker: one deadline over every
//! partition, woken by whichever partition gets a message, nothing lost when
//! several partitions answer at once, the long-polls it no longer needs
//! withdrawn; `shard_address` names the owners.

use std::collections::BTreeSet;
use std::time::Duration;

use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId};
use spool_client::{shard_address, Admin, ClaimOptions, Delivery, Message, Producer};
use spool_client::{PayloadView, ProducerConfig};
use spool_tests::events::wait_for_claims_waiting;
use spool_tests::{now, test_queue_config, Spoold};

use crate::common::key_for;

const PARTITIONS: u32 = 4;

fn payload(delivery: &Delivery) -> String {
    match delivery.payload() {
        PayloadView::Inline(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        PayloadView::Reference { location, .. } => format!("<ref {location}>"),
    }
}

// Goal: claim_any's wait is one total deadline, not one per partition.
// Method: claim_any with wait_ms 1000 on 4 empty partitions (2 shards)
// returns empty after ≥ 0.9 s and < 2.5 s (waiting per partition would take
// 4 s or more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_any_waits_once_in_total() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("idle", test_queue_config(PARTITIONS, 5_000, 5))
        .await
        .unwrap();
    let started = now();
    let got = client.claim_any("idle", &ClaimOptions::new(5).wait_ms(1_000)).await.unwrap();
    let took = started.elapsed();
    assert!(got.is_empty());
    assert!(took >= Duration::from_millis(900), "returned early: {took:?}");
    assert!(took < Duration::from_millis(2_500), "waited per partition: {took:?}");
}

// Goal: a message arriving on any partition during the wait wakes
// claim_any at once. Method: for each of the 4 partitions, start a
// claim_any with a 10 s wait, send one message to that partition once its
// long-polls are parked (one per shard: the claims-waiting gauge reads 2);
// claim_any returns it well before the deadline (< 3 s), and acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_any_wakes_on_any_partition() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("wake", test_queue_config(PARTITIONS, 5_000, 5))
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for partition in 0..PARTITIONS {
        // The previous round's other long-poll is withdrawn first.
        wait_for_claims_waiting(&broker, 0).await;
        let claimer = client.clone();
        let started = now();
        let claim = tokio::spawn(async move {
            claimer.claim_any("wake", &ClaimOptions::new(3).wait_ms(10_000)).await
        });
        wait_for_claims_waiting(&broker, u64::from(broker.cores())).await;
        let body = format!("for partition {partition}");
        let key = key_for(partition, PARTITIONS, 1);
        producer.send("wake", Message::new(body.clone()).key(key)).await.unwrap();
        let got = claim.await.unwrap().unwrap();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "partition {partition}: woke after {took:?}");
        assert_eq!(got.len(), 1, "partition {partition}");
        assert_eq!((got[0].partition(), payload(&got[0])), (PartitionId(partition), body));
        client.ack("wake", got[0].partition(), &[got[0].token()]).await.unwrap();
    }
}

// Goal: deliveries beyond the credits (several partitions answering their
// long-polls at once) and long-polls still outstanding when claim_any
// returns are released, not lost. Method: claim_any for 1 credit waits on 4
// empty partitions (its long-polls parked, one per shard); one message per
// partition arrives in one burst; it
// returns exactly one; shortly after, the other three are claimable again
// (released ones on their second attempt), nothing stays claimed, and all
// four were seen exactly once as acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_any_releases_what_it_does_not_return() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("burst", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let claimer = client.clone();
    let claim = tokio::spawn(async move {
        claimer.claim_any("burst", &ClaimOptions::new(1).lease_ms(30_000).wait_ms(10_000)).await
    });
    wait_for_claims_waiting(&broker, u64::from(broker.cores())).await;
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let mut sends = Vec::new();
    for partition in 0..PARTITIONS {
        let key = key_for(partition, PARTITIONS, 2);
        let message = Message::new(format!("burst {partition}")).key(key);
        sends.push(producer.submit("burst", message).await.unwrap());
    }
    for send in sends {
        send.await.unwrap();
    }
    let first = claim.await.unwrap().unwrap();
    assert_eq!(first.len(), 1, "never more than the credits");
    client.ack("burst", first[0].partition(), &[first[0].token()]).await.unwrap();

    // The others come back (released almost at once, or never claimed).
    let mut seen = BTreeSet::from([payload(&first[0])]);
    let started = now();
    while seen.len() < PARTITIONS as usize && started.elapsed() < Duration::from_secs(10) {
        let more = client.claim_any("burst", &ClaimOptions::new(10).wait_ms(1_000)).await.unwrap();
        for delivery in &more {
            assert!(seen.insert(payload(delivery)), "delivered twice: {}", payload(delivery));
            assert!(delivery.attempt() <= 2, "one unwanted claim at most");
            client.ack("burst", delivery.partition(), &[delivery.token()]).await.unwrap();
        }
    }
    assert_eq!(seen.len(), PARTITIONS as usize, "every message came back: {seen:?}");
    let described = admin.describe_queue("burst").await.unwrap();
    let (claimed, acked) = described
        .partitions
        .iter()
        .fold((0, 0), |(claimed, acked), stats| (claimed + stats.claimed, acked + stats.acked));
    assert_eq!((claimed, acked), (0, u64::from(PARTITIONS)));
}

// Goal: a shard's address can be named from the public API and is the one
// the broker serves the partition on. Method: shard_address of each
// partition's metadata equals owner_address and is one of the broker's
// shard addresses; a connection to it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_addresses_are_public() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("where", test_queue_config(PARTITIONS, 5_000, 5))
        .await
        .unwrap();
    let shards = BTreeSet::from([broker.shard_addr(0), broker.shard_addr(1)]);
    let mut used = BTreeSet::new();
    for meta in client.partitions("where").await.unwrap() {
        let addr = shard_address(&meta);
        assert_eq!(addr, client.owner_address("where", meta.partition).await.unwrap());
        assert!(shards.contains(&addr), "{addr} is not a shard of {shards:?}");
        assert!(!client.connection(&addr).await.unwrap().is_closed());
        used.insert(addr);
    }
    assert_eq!(used, shards, "4 partitions spread over both shards");
}

// Goal: the long-polls claim_any leaves behind when it returns are withdrawn
// (CancelClaim), so a message that arrives on their partitions afterwards is
// never claimed by an orphaned wait and released (with max_deliveries = 1
// that release would dead-letter it unhandled). Method: 4 partitions on 2
// shards, max_deliveries 1; claim_any(1 credit, 60 s) waits on the empty
// queue (its two long-polls parked); one message to partition 0 wakes it;
// once it returned and no long-poll is parked any more (the other shard's
// withdrawn, not left to wait out its 60 s), one message to each of
// partitions 1..3; each must still be ready with 0 attempts (peek), no
// partition has released, claimed or dead-lettered anything, and a plain
// claim then delivers each on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_any_withdraws_its_other_long_polls() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("withdraw", test_queue_config(PARTITIONS, 30_000, 1)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let claimer = client.clone();
    let claim = tokio::spawn(async move {
        claimer.claim_any("withdraw", &ClaimOptions::new(1).lease_ms(30_000).wait_ms(60_000)).await
    });
    wait_for_claims_waiting(&broker, u64::from(broker.cores())).await;
    let key = key_for(0, PARTITIONS, 3);
    producer.send("withdraw", Message::new("first").key(key)).await.unwrap();
    let got = claim.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].partition(), payload(&got[0])), (PartitionId(0), "first".to_owned()));
    assert_eq!(got[0].attempt(), 1);
    // The other shard's long-poll is withdrawn: none is left to claim what
    // comes next (one that was not would hold the gauge for its 60 s).
    wait_for_claims_waiting(&broker, 0).await;

    for partition in 1..PARTITIONS {
        let key = key_for(partition, PARTITIONS, 3);
        producer
            .send("withdraw", Message::new(format!("late {partition}")).key(key))
            .await
            .unwrap();
    }
    for partition in 1..PARTITIONS {
        let peeked = admin.peek("withdraw", PartitionId(partition), Offset(0), 10).await.unwrap();
        assert_eq!(peeked.len(), 1, "partition {partition}: {peeked:?}");
        assert_eq!(
            (peeked[0].state, peeked[0].attempt),
            (MessageState::Ready, 0),
            "partition {partition}: the message was claimed by a withdrawn long-poll"
        );
    }
    let described = admin.describe_queue("withdraw").await.unwrap();
    for stats in &described.partitions {
        let expected_claimed = u64::from(stats.partition == PartitionId(0));
        assert_eq!(
            (stats.claimed, stats.released, stats.quarantined),
            (expected_claimed, 0, 0),
            "partition {}: {stats:?}",
            stats.partition.0
        );
    }
    client.ack("withdraw", got[0].partition(), &[got[0].token()]).await.unwrap();
    for partition in 1..PARTITIONS {
        let options = ClaimOptions::new(5).wait_ms(2_000);
        let batch = client.claim("withdraw", PartitionId(partition), &options).await.unwrap();
        assert_eq!(batch.deliveries.len(), 1, "partition {partition}");
        assert_eq!(batch.deliveries[0].attempt(), 1, "partition {partition}: first delivery");
        assert_eq!(payload(&batch.deliveries[0]), format!("late {partition}"));
        let token = batch.deliveries[0].token();
        client.ack("withdraw", PartitionId(partition), &[token]).await.unwrap();
    }
}
