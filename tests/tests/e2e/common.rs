//! Helpers shared by the end-to-end tests: message ids that encode who sent
//! what, draining a queue, keys that land on a chosen partition, the broker's
//! wall clock.

use std::collections::HashMap;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{partition_for_key, ClaimOptions, Client, Delivery};
use spool_tests::admin::{http_get, Exposition};
use spool_tests::Spoold;

/// Unix ms now, comparable with the broker's lease deadlines (same host).
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since.as_millis()).expect("ms fit u64")
}

/// A message id naming `(source, sequence)`.
pub fn message_id(source: u32, sequence: u64) -> MessageId {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&source.to_le_bytes());
    id[4..12].copy_from_slice(&sequence.to_le_bytes());
    MessageId(id)
}

/// The `(source, sequence)` of an id built by [`message_id`].
pub fn id_parts(id: MessageId) -> (u32, u64) {
    let source = u32::from_le_bytes(id.0[..4].try_into().expect("4 bytes"));
    let sequence = u64::from_le_bytes(id.0[4..12].try_into().expect("8 bytes"));
    (source, sequence)
}

/// A routing key that lands on `partition` of a queue with `partitions`.
pub fn key_for(partition: u32, partitions: u32, salt: u32) -> String {
    (0u32..)
        .map(|n| format!("key-{salt}-{n}"))
        .find(|key| partition_for_key(key.as_bytes(), partitions).0 == partition)
        .expect("some key hashes onto every partition")
}

/// Claim options for a test worker.
pub fn claim_options(worker: u64, credits: u32, lease_ms: u32, wait_ms: u32) -> ClaimOptions {
    ClaimOptions {
        worker: WorkerId(worker),
        credits,
        max_bytes: 4 << 20,
        lease_ms,
        wait_ms,
        subscription: None,
    }
}

/// Claims everything claimable from every partition of `queue` and acks it,
/// until `idle_sweeps` consecutive sweeps (each long-polling `wait_ms` per
/// partition) find nothing. Returns the deliveries in claim order.
pub async fn drain(client: &Client, queue: &str, wait_ms: u32, idle_sweeps: u32) -> Vec<Delivery> {
    let partitions = client.partitions(queue).await.expect("queue metadata").len() as u32;
    let mut drained = Vec::new();
    let mut idle = 0;
    while idle < idle_sweeps {
        let mut found = false;
        for partition in 0..partitions {
            let options = claim_options(0xd7a1, 1024, 30_000, wait_ms);
            let batch =
                client.claim(queue, PartitionId(partition), &options).await.expect("drain claim");
            if batch.deliveries.is_empty() {
                continue;
            }
            found = true;
            let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
            client
                .ack(queue, PartitionId(partition), &tokens)
                .await
                .expect("drain acks every token");
            drained.extend(batch.deliveries);
        }
        idle = if found { 0 } else { idle + 1 };
    }
    drained
}

/// Counts deliveries per message id.
pub fn count_by_id(deliveries: &[Delivery]) -> HashMap<MessageId, usize> {
    let mut counts = HashMap::new();
    for delivery in deliveries {
        *counts.entry(delivery.message_id()).or_insert(0) += 1;
    }
    counts
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = spool_tests::now();
    loop {
        if condition().await {
            return true;
        }
        if started.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `name` summed over the shards (`/metrics`).
pub fn metric_sum(broker: &Spoold, name: &str) -> f64 {
    let answer = tokio::task::block_in_place(|| http_get(&broker.admin_addr(), "/metrics"));
    assert_eq!(answer.status, 200, "{}", answer.body);
    Exposition::parse(&answer.body).unwrap().sum(name)
}
