//! Restart mid-stream: every acknowledged enqueue survives a SIGTERM or a
//! SIGKILL, no acknowledged ack is undone, tokens from before the restart
//! are stale (the leader epoch moved), and what was claimed at the stop is
//! claimable again at once (the epoch fence), not after its lease.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Delivery, Message, Producer, ProducerConfig};
use spool_tests::events::wait_for_metric;
use spool_tests::{test_queue_config, Spoold};

use crate::common::{claim_options, count_by_id, drain, message_id, metric_sum, unix_ms};
use crate::stream::Stream;

/// Lease of the claims held across the restart; long enough that they are
/// still unexpired when the old tokens are tried after the restart and when
/// the fenced messages are claimed again.
const HELD_LEASE_MS: u32 = 60_000;
/// Messages enqueued (acknowledged) before the broker is stopped.
const ENQUEUED_BEFORE_STOP: usize = 3_000;
/// Messages acked by the consumer before the broker is stopped.
const ACKED_BEFORE_STOP: usize = 500;
const PARTITIONS: u32 = 2;

#[derive(Clone, Copy, Debug)]
enum Stop {
    Term,
    Kill,
}

async fn restart_mid_stream(how: Stop) {
    let mut broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("stream", test_queue_config(PARTITIONS, 5_000, 100)).await.unwrap();
    admin.create_queue("held", test_queue_config(1, 5_000, 100)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for sequence in 0..5 {
        producer.send("held", Message::new("held").id(message_id(2, sequence))).await.unwrap();
    }

    let stream = Stream::start(
        broker.client().await,
        broker.client().await,
        PARTITIONS,
        (ENQUEUED_BEFORE_STOP, ACKED_BEFORE_STOP),
        Duration::from_secs(40),
    )
    .await;

    // Claims held across the restart, still unexpired afterwards.
    let held = client.claim("held", PartitionId(0), &claim_options(7, 5, HELD_LEASE_MS, 0)).await;
    let held = held.unwrap();
    assert_eq!(held.deliveries.len(), 5);

    match how {
        Stop::Term => {
            let status = broker.terminate();
            assert!(status.success(), "SIGTERM drain exits 0, got {status}");
        }
        Stop::Kill => broker.kill(),
    }
    let ledger = Arc::clone(&stream.ledger);
    let (produced, consumed) = stream.finish().await;
    eprintln!("at the stop: producer {produced}; consumer {consumed}");
    broker.restart();

    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    // Old tokens: stale although their leases have not run out.
    let tokens: Vec<_> = held.deliveries.iter().map(Delivery::token).collect();
    let codes = client.ack("held", PartitionId(0), &tokens).await.unwrap_err().refused_codes();
    assert!(
        unix_ms() < held.lease_deadline_ms,
        "restart took too long to test the epoch: the held leases expired"
    );
    assert_eq!(codes, vec![ErrorCode::StaleToken; 5], "pre-restart tokens are stale");
    let extend = client.extend("held", PartitionId(0), tokens[0], 5_000).await.unwrap_err();
    assert_eq!(extend.code(), Some(ErrorCode::StaleToken), "{extend}");
    // ...and the stale acks changed nothing. The epoch fence released the
    // old epoch's claims at open: the messages are ready, leases unexpired.
    let peeked = admin.peek("held", PartitionId(0), Offset(0), 10).await.unwrap();
    assert_eq!(peeked.len(), 5);
    assert!(peeked.iter().all(|message| message.state == MessageState::Ready), "{peeked:?}");

    // Claims lost with the broker (acked or not) are claimable at once.
    let drained = drain(&client, "stream", 300, 2).await;
    let counts: HashMap<MessageId, usize> = count_by_id(&drained);

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let duplicates: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(duplicates.is_empty(), "delivered twice after the restart: {duplicates:?}");
    let missing: Vec<_> = ledger
        .enqueued
        .iter()
        .filter(|id| !ledger.acked.contains(id) && !ledger.ack_unknown.contains(id))
        .filter(|id| !counts.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged enqueues lost ({how:?}), e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let resurrected: Vec<_> = ledger.acked.iter().filter(|id| counts.contains_key(id)).collect();
    assert!(resurrected.is_empty(), "acked messages came back: {resurrected:?}");
    let unknown: Vec<_> = counts.keys().filter(|id| !ledger.submitted.contains(id)).collect();
    assert!(unknown.is_empty(), "delivered ids nobody sent: {unknown:?}");
    eprintln!(
        "restart ({how:?}): {} enqueued, {} acked, {} unknown acks before the stop; \
         {} drained after",
        ledger.enqueued.len(),
        ledger.acked.len(),
        ledger.ack_unknown.len(),
        drained.len()
    );
    assert!(!drained.is_empty(), "no backlog at the stop: the test proved nothing");
    let described = admin.describe_queue("stream").await.unwrap();
    assert!(described.partitions.iter().all(|p| p.ready + p.claimed + p.scheduled == 0));

    // The held messages are back long before their (pre-restart) lease ends.
    let held_back = drain(&client, "held", 500, 1).await;
    assert!(unix_ms() < held.lease_deadline_ms, "the held messages waited for their lease");
    let mut held_ids: Vec<_> = held_back.iter().map(Delivery::message_id).collect();
    held_ids.sort_by_key(|id| id.0);
    let expected: Vec<_> = (0..5).map(|sequence| message_id(2, sequence)).collect();
    assert_eq!(held_ids, expected);
    // A durable claim counts as an attempt. Only a SIGKILL can lose one (a
    // claim replies before its sync), and a lost claim is not counted.
    for delivery in &held_back {
        match how {
            Stop::Term => assert_eq!(delivery.attempt(), 2),
            Stop::Kill => assert!((1..=2).contains(&delivery.attempt())),
        }
    }
}

// Goal: a claim of the previous epoch never holds its message past a crash:
// after SIGKILL and restart the claimed messages are claimable at once (not
// after their 60 s lease), each old token gets STALE_TOKEN, and the new
// deliveries carry a newer epoch so a worker can tell the duplicate.
// Method: real spoold over TCP; enqueue 20, claim 12 with a 60 s lease,
// wait for the claim's commit to be durable (the shard's durable commits
// counter moves past its value before the claim), SIGKILL, restart, ack the
// old tokens, claim everything with no wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_a_killed_broker_are_claimable_at_once() {
    let mut broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("fenced", test_queue_config(1, 5_000, 100)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for sequence in 0..20 {
        producer.send("fenced", Message::new("job").id(message_id(3, sequence))).await.unwrap();
    }
    // Every send's commit is counted before its reply: the next commit made
    // durable is the claim's (nothing else writes on this idle shard).
    let commits_before = metric_sum(&broker, "spool_shard_commits_total");
    let claimed = client
        .claim("fenced", PartitionId(0), &claim_options(11, 12, HELD_LEASE_MS, 0))
        .await
        .unwrap();
    assert_eq!(claimed.deliveries.len(), 12);
    // The claim answers before its commit is durable: this test is about
    // durable claims of an older epoch, so wait for that commit.
    let durable = "the claim's commit made durable";
    wait_for_metric(&broker, "spool_shard_commits_total", durable, |commits| {
        commits > commits_before
    })
    .await;
    broker.kill();
    broker.restart();

    let client = broker.client().await;
    let tokens: Vec<_> = claimed.deliveries.iter().map(Delivery::token).collect();
    let codes = client.ack("fenced", PartitionId(0), &tokens).await.unwrap_err().refused_codes();
    assert_eq!(codes, vec![ErrorCode::StaleToken; 12], "old tokens are stale");
    let again = client
        .claim("fenced", PartitionId(0), &claim_options(12, 100, HELD_LEASE_MS, 0))
        .await
        .unwrap();
    assert!(unix_ms() < claimed.lease_deadline_ms, "claimed again only after the old lease");
    assert_eq!(again.deliveries.len(), 20, "all 20, the 12 fenced ones included");
    let old: HashMap<MessageId, &Delivery> =
        claimed.deliveries.iter().map(|delivery| (delivery.message_id(), delivery)).collect();
    let epoch = |delivery: &Delivery| {
        let bytes = delivery.token().0;
        u64::from_le_bytes(bytes[24..32].try_into().unwrap())
    };
    for delivery in &again.deliveries {
        if let Some(before) = old.get(&delivery.message_id()) {
            assert_eq!(delivery.attempt(), 2, "the durable claim counted as an attempt");
            assert!(epoch(delivery) > epoch(before), "a duplicate shows a newer epoch");
        } else {
            assert_eq!(delivery.attempt(), 1);
        }
    }
    let tokens: Vec<_> = again.deliveries.iter().map(Delivery::token).collect();
    client.ack("fenced", PartitionId(0), &tokens).await.unwrap();
}

// Goal: a graceful stop (SIGTERM) mid-stream loses no acknowledged enqueue,
// undoes no acknowledged ack, and stales old tokens. Method: stream enqueues
// and acks, SIGTERM, restart, drain, compare ids with the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_keeps_acknowledged_work() {
    restart_mid_stream(Stop::Term).await;
}

// Goal: as above for a crash (SIGKILL): acknowledged means durable.
// Method: the same stream, SIGKILL instead of SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_keeps_acknowledged_work() {
    restart_mid_stream(Stop::Kill).await;
}
