// Goal: the journal layout (`--log-layout journal`: one journal per shard
// shared by its partitions, `docs/design/shard-journal.md`) serves the
// protocol end to end and keeps every promise across a crash: over 2 shards
// and several partitions, create/send/claim/ack work; after a SIGKILL in
// the middle of a stream of enqueues and acks, every acknowledged enqueue
// is there, no acknowledged ack is undone, a token from before the kill is
// STALE_TOKEN while its message is claimable at once (the epoch fence, not
// the lease); and the data directory keeps its layout and shard count: a
// restart with another `--cores` or with `--log-layout segments` is refused
// with a message naming both values. Method: real spoold processes over
// TCP, a ledger of what the broker acknowledged, compared with a drain
// after the restart.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "e2e/common.rs"]
mod common;
#[path = "e2e/stream.rs"]
mod stream;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Delivery, Message, Producer, ProducerConfig};
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

use common::{claim_options, count_by_id, drain, id_parts, message_id, unix_ms};
use stream::Stream;

const SHARDS: u16 = 2;
/// Partitions of the streamed queue: several on each shard's journal.
const PARTITIONS: u32 = 4;
/// Lease of the claims held across the kill: still unexpired when their
/// tokens are tried and their messages claimed after the restart.
const HELD_LEASE_MS: u32 = 60_000;
const ENQUEUED_BEFORE_KILL: usize = 2_000;
const ACKED_BEFORE_KILL: usize = 300;

fn journal_options() -> SpooldOptions {
    let mut options = SpooldOptions::new(SHARDS);
    options.args.extend(["--log-layout".to_owned(), "journal".to_owned()]);
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_layout_keeps_acknowledged_work_across_sigkill_and_keeps_its_shape() {
    let mut broker = Spoold::start_with(journal_options());
    let data_dir = broker.data_dir();
    let format = std::fs::read_to_string(data_dir.join("format")).unwrap();
    assert!(format.contains("log_layout = journal") && format.contains("shards = 2"), "{format}");

    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("stream", test_queue_config(PARTITIONS, 5_000, 100)).await.unwrap();
    admin.create_queue("held", test_queue_config(1, 5_000, 100)).await.unwrap();
    // Every shard applied the creates, so each recovered its journal first
    // (a shard's port accepts before that, so not earlier), and every
    // partition has a handle in its shard's table, made before its first
    // append.
    for shard in 0..SHARDS {
        let journal = data_dir.join(format!("shard-{shard:02}")).join("journal");
        assert!(journal.is_dir(), "{} missing", journal.display());
        let handles = data_dir.join(format!("shard-{shard:02}")).join("handles");
        assert!(handles.is_file(), "{} missing", handles.display());
    }

    // Send, claim and ack on every partition of both shards.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for sequence in 0..40 {
        producer.send("stream", Message::new("first").id(message_id(3, sequence))).await.unwrap();
    }
    let first = drain(&client, "stream", 200, 2).await;
    let counts = count_by_id(&first);
    assert_eq!(counts.len(), 40, "every message delivered");
    assert!(counts.values().all(|count| *count == 1), "each once: {counts:?}");
    let partitions: HashSet<PartitionId> = first.iter().map(Delivery::partition).collect();
    assert_eq!(partitions.len(), PARTITIONS as usize, "every partition served");

    for sequence in 0..5 {
        producer.send("held", Message::new("held").id(message_id(2, sequence))).await.unwrap();
    }

    let stream = Stream::start(
        broker.client().await,
        broker.client().await,
        PARTITIONS,
        (ENQUEUED_BEFORE_KILL, ACKED_BEFORE_KILL),
        Duration::from_secs(60),
    )
    .await;

    // Claims held across the kill, their leases unexpired afterwards.
    let held =
        client.claim("held", PartitionId(0), &claim_options(7, 5, HELD_LEASE_MS, 0)).await.unwrap();
    assert_eq!(held.deliveries.len(), 5);

    broker.kill();
    let ledger = Arc::clone(&stream.ledger);
    let (produced, consumed) = stream.finish().await;
    eprintln!("at the kill: producer {produced}; consumer {consumed}");
    broker.restart();

    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    let tokens: Vec<_> = held.deliveries.iter().map(Delivery::token).collect();
    let codes = client.ack("held", PartitionId(0), &tokens).await.unwrap_err().refused_codes();
    assert!(unix_ms() < held.lease_deadline_ms, "restart too slow: the held leases expired");
    assert_eq!(codes, vec![ErrorCode::StaleToken; 5], "pre-kill tokens are stale");
    let peeked = admin.peek("held", PartitionId(0), Offset(0), 10).await.unwrap();
    assert_eq!(peeked.len(), 5);
    assert!(peeked.iter().all(|message| message.state == MessageState::Ready), "{peeked:?}");
    let held_back = drain(&client, "held", 500, 1).await;
    assert!(unix_ms() < held.lease_deadline_ms, "the held messages waited for their lease");
    let mut held_ids: Vec<_> = held_back.iter().map(Delivery::message_id).collect();
    held_ids.sort_by_key(|id| id.0);
    let expected: Vec<_> = (0..5).map(|sequence| message_id(2, sequence)).collect();
    assert_eq!(held_ids, expected);

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
        "{} acknowledged enqueues lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let resurrected: Vec<_> = ledger.acked.iter().filter(|id| counts.contains_key(id)).collect();
    assert!(resurrected.is_empty(), "acked messages came back: {resurrected:?}");
    let unknown: Vec<_> = counts.keys().filter(|id| !ledger.submitted.contains(id)).collect();
    assert!(unknown.is_empty(), "delivered ids nobody sent: {unknown:?}");
    let first_again: Vec<_> = counts.keys().filter(|id| id_parts(**id).0 == 3).collect();
    assert!(first_again.is_empty(), "acked messages of the first round came back: {first_again:?}");
    eprintln!(
        "journal layout kill: {} enqueued, {} acked, {} unknown acks before the kill; {} \
         drained after",
        ledger.enqueued.len(),
        ledger.acked.len(),
        ledger.ack_unknown.len(),
        drained.len()
    );
    assert!(!drained.is_empty(), "no backlog at the kill: the test proved nothing");
    let described = admin.describe_queue("stream").await.unwrap();
    assert!(described.partitions.iter().all(|p| p.ready + p.claimed + p.scheduled == 0));
    drop(client);
    let status = broker.terminate();
    assert!(status.success(), "SIGTERM exits 0 on the journal layout, got {status}");

    // The shard count is fixed: each shard's partitions live in its journal.
    broker.options_mut().cores = 1;
    let refused = broker.try_restart().unwrap_err();
    assert!(refused.status.is_some_and(|status| !status.success()), "{refused}");
    assert!(
        refused.log.contains("for 2 shards") && refused.log.contains("with 1 shards"),
        "the refusal names both shard counts:\n{}",
        refused.log
    );
    // The layout is fixed too.
    broker.options_mut().cores = SHARDS;
    broker.options_mut().args = vec!["--log-layout".to_owned(), "segments".to_owned()];
    let refused = broker.try_restart().unwrap_err();
    assert!(refused.status.is_some_and(|status| !status.success()), "{refused}");
    assert!(
        refused.log.contains("log_layout = journal")
            && refused.log.contains("log_layout = segments"),
        "the refusal names both layouts:\n{}",
        refused.log
    );
    // With its own settings it starts, and what was drained stays drained.
    broker.options_mut().args = journal_options().args;
    broker.restart();
    let client = broker.client().await;
    let after = drain(&client, "stream", 100, 1).await;
    assert!(after.is_empty(), "acked messages came back after a clean restart: {after:?}");
}
