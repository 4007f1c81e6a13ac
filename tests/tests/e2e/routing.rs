//! Routing: a data request on a shard that does not own the partition is
//! answered `NOT_OWNER` with the owner's address and never forwarded; the
//! client follows that answer to the owner.

use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};
use spool_client::spool_wire::proto::{
    ClaimRequest, EnqueueRequest, PartitionId, Request, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::ProducerConfig;
use spool_client::{Admin, ClientError, Connection, ConnectionConfig, Message, Producer};
use spool_tests::{test_queue_config, Spoold};

use crate::common::{claim_options, drain, message_id};

fn one_record_batch(sequence: u64) -> Vec<u8> {
    let mut builder = DataBatchBuilder::new();
    builder
        .push(&Record {
            message_id: message_id(42, sequence),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(b"routed".to_vec()),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: crate::common::unix_ms(),
        })
        .unwrap();
    builder.finish().unwrap().as_slice().to_vec()
}

// Goal: the wrong shard answers NOT_OWNER naming the owner, stores nothing,
// and the client reaches the owner. Method: a raw Enqueue and Claim for
// partition 0 on shard 1's port; then the same Enqueue through `Client`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_shard_answers_not_owner_and_client_reaches_owner() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("routed", test_queue_config(2, 5_000, 5)).await.unwrap();
    let partitions = client.partitions("routed").await.unwrap();
    let owner_port = partitions[0].shard_port;
    let wrong_shard = if owner_port == broker.port(0) { 1 } else { 0 };
    let wrong = Connection::connect(&broker.shard_addr(wrong_shard), ConnectionConfig::default())
        .await
        .unwrap();

    let batch = one_record_batch(0);
    let enqueue = Request::Enqueue(EnqueueRequest {
        queue: "routed",
        partition: PartitionId(0),
        batch: &batch,
    });
    match wrong.call(&enqueue).await {
        Err(ClientError::NotOwner { owner: Some(owner), message }) => {
            assert_eq!((owner.host.as_str(), owner.port), ("127.0.0.1", owner_port), "{message}");
        }
        other => panic!("expected NOT_OWNER with the owner, got {other:?}"),
    }
    let claim = Request::Claim(ClaimRequest {
        queue: "routed",
        partition: PartitionId(0),
        credits: 1,
        worker: WorkerId(1),
        max_bytes: 1 << 20,
        lease_ms: 5_000,
        wait_ms: 0,
        subscription: "",
    });
    let claim_error = wrong.call(&claim).await.unwrap_err();
    assert_eq!(claim_error.code(), Some(ErrorCode::NotOwner), "{claim_error}");
    // The connection stays usable after a NOT_OWNER.
    assert!(!wrong.is_closed());

    let stats = admin.describe_queue("routed").await.unwrap();
    assert!(stats.partitions.iter().all(|p| p.ready == 0), "NOT_OWNER stored nothing: {stats:?}");

    let response = client.enqueue("routed", PartitionId(0), &batch).await.unwrap();
    assert_eq!(response.records.len(), 1);
    let drained = drain(&client, "routed", 200, 1).await;
    assert_eq!(drained.len(), 1);
    assert_eq!(drained[0].message_id(), message_id(42, 0));
}

// Goal: a client whose cached metadata is stale follows NOT_OWNER to the new
// owner without the caller noticing. Method: client A caches a 1-partition
// queue's owner; client B deletes and recreates it (round-robin placement puts
// it on the other shard); A enqueues and claims through its stale cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_follows_not_owner_after_the_queue_moved() {
    let broker = Spoold::start(2);
    let stale = broker.client().await;
    let fresh = broker.client().await;
    let admin = Admin::new(fresh.clone());
    admin.create_queue("mover", test_queue_config(1, 5_000, 5)).await.unwrap();
    let before = stale.partitions("mover").await.unwrap()[0].shard_port;

    admin.delete_queue("mover").await.unwrap();
    admin.create_queue("mover", test_queue_config(1, 5_000, 5)).await.unwrap();
    let after = fresh.partitions("mover").await.unwrap()[0].shard_port;
    assert_ne!(before, after, "recreating placed the partition on the other shard");
    // The stale client still believes the old owner.
    assert_eq!(stale.partitions("mover").await.unwrap()[0].shard_port, before);

    let producer = Producer::new(stale.clone(), ProducerConfig::default()).unwrap();
    producer.send("mover", Message::new("follow me").id(message_id(5, 0))).await.unwrap();
    assert_eq!(stale.partitions("mover").await.unwrap()[0].shard_port, after, "metadata refreshed");
    let claimed = fresh.claim("mover", PartitionId(0), &claim_options(1, 1, 5_000, 1_000)).await;
    let claimed = claimed.unwrap();
    assert_eq!(claimed.deliveries.len(), 1);
    assert_eq!(claimed.deliveries[0].message_id(), message_id(5, 0));
}

/// Every partition's leader epoch as Metadata on `addr` reports it.
async fn epochs_seen_from(addr: &str, queue: &str) -> Vec<(u16, u64)> {
    use spool_client::spool_wire::proto::{MetadataRequest, Response};
    let connection = Connection::connect(addr, ConnectionConfig::default()).await.unwrap();
    let request = Request::Metadata(MetadataRequest { queues: vec![queue.to_owned()] });
    let bytes = connection.call(&request).await.unwrap();
    let Response::Metadata(metadata) = bytes.response().unwrap() else {
        panic!("metadata answered with another response")
    };
    let mut partitions = metadata.queues[0].partitions.clone();
    partitions.sort_by_key(|partition| partition.partition);
    partitions.iter().map(|meta| (meta.shard_port, meta.leader_epoch.0)).collect()
}

// Goal: Metadata reports every partition's real leader epoch whichever shard
// answers, including partitions owned by the other shard, and the epoch
// grows across a restart. Method: a 2-partition queue on a 2-shard broker
// (one partition per shard); ask each shard; restart and ask again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_reports_real_epochs_from_every_shard() {
    let mut broker = Spoold::start(2);
    let admin = Admin::new(broker.client().await);
    admin.create_queue("epochs", test_queue_config(2, 5_000, 3)).await.unwrap();
    let from_0 = epochs_seen_from(&broker.shard_addr(0), "epochs").await;
    let from_1 = epochs_seen_from(&broker.shard_addr(1), "epochs").await;
    assert_eq!(from_0, from_1, "both shards must agree");
    let ports: Vec<u16> = from_0.iter().map(|(port, _)| *port).collect();
    assert_eq!(ports, [broker.port(0), broker.port(1)], "one partition per shard");
    assert!(from_0.iter().all(|(_, epoch)| *epoch == 1), "first open is epoch 1: {from_0:?}");

    drop(admin);
    assert!(broker.terminate().success());
    broker.restart();
    // Shards accept before their partitions finish recovering; until then
    // Metadata reports epoch 0 for them (documented), so wait that out.
    let mut after_0 = epochs_seen_from(&broker.shard_addr(0), "epochs").await;
    for _ in 0..200 {
        if after_0.iter().all(|(_, epoch)| *epoch != 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        after_0 = epochs_seen_from(&broker.shard_addr(0), "epochs").await;
    }
    let after_1 = epochs_seen_from(&broker.shard_addr(1), "epochs").await;
    assert_eq!(after_0, after_1);
    assert!(after_0.iter().all(|(_, epoch)| *epoch == 2), "reopen bumps the epoch: {after_0:?}");
}
