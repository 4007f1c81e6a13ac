//! A stream of enqueues and acks for the tests that stop or kill the broker
//! in its middle (`restart.rs`, `journal_layout.rs`), and the ledger of
//! what the broker acknowledged, to compare with a drain after the restart.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::PartitionId;
use spool_client::{Client, Delivery, Message, Producer, ProducerConfig};

use super::common::{claim_options, eventually, message_id};

/// Lease of the streaming consumer.
pub const STREAM_LEASE_MS: u32 = 2_000;
/// Pause of the streaming consumer after each acked claim: slower than the
/// producer, so a backlog is on disk at the stop.
pub const CONSUMER_PAUSE: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct Ledger {
    /// Every id a producer submitted.
    pub submitted: HashSet<MessageId>,
    /// Ids whose enqueue the broker acknowledged.
    pub enqueued: HashSet<MessageId>,
    /// Ids whose ack the broker acknowledged.
    pub acked: HashSet<MessageId>,
    /// Ids whose ack was sent but got no answer (outcome unknown).
    pub ack_unknown: HashSet<MessageId>,
}

/// Streams enqueues to queue `stream` until `stop` or the first failure;
/// returns that failure.
pub async fn produce(client: Client, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) -> String {
    let config = ProducerConfig { retries: 1, ..ProducerConfig::default() };
    let producer = Producer::new(client, config).unwrap();
    let mut sequence = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut pending = Vec::new();
        for _ in 0..200 {
            let id = message_id(1, sequence);
            sequence += 1;
            ledger.lock().unwrap().submitted.insert(id);
            match producer.submit("stream", Message::new("work").id(id)).await {
                Ok(future) => pending.push((id, future)),
                Err(error) => return format!("submit: {error}"),
            }
        }
        let mut failed = None;
        for (id, future) in pending {
            match future.await {
                Ok(_) => {
                    ledger.lock().unwrap().enqueued.insert(id);
                }
                Err(error) => failed = Some(format!("enqueue: {error}")),
            }
        }
        if let Some(error) = failed {
            return error;
        }
    }
    "stopped".to_owned()
}

/// Claims and acks round the `partitions` of queue `stream` until `stop`
/// or the first failure; returns that failure.
pub async fn consume(
    client: Client,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    partitions: u32,
) -> String {
    let mut partition = 0u32;
    while !stop.load(Ordering::Acquire) {
        let options = claim_options(0x5eed, 50, STREAM_LEASE_MS, 50);
        let batch = match client.claim("stream", PartitionId(partition), &options).await {
            Ok(batch) => batch,
            Err(error) => return format!("claim: {error}"),
        };
        partition = (partition + 1) % partitions;
        if batch.deliveries.is_empty() {
            continue;
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        let ids: Vec<_> = batch.deliveries.iter().map(Delivery::message_id).collect();
        match client.ack("stream", batch.deliveries[0].partition(), &tokens).await {
            Ok(()) => {
                // Ok: the broker acked every token of the fresh claim.
                ledger.lock().unwrap().acked.extend(ids);
                // Time under test: a consumer slower than the producer.
                tokio::time::sleep(CONSUMER_PAUSE).await;
            }
            Err(error) => {
                ledger.lock().unwrap().ack_unknown.extend(ids);
                return format!("ack: {error}");
            }
        }
    }
    "stopped".to_owned()
}

/// A producer and a consumer streaming against the broker, and the ledger
/// of what it acknowledged.
pub struct Stream {
    pub ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    producing: tokio::task::JoinHandle<String>,
    consuming: tokio::task::JoinHandle<String>,
}

impl Stream {
    /// Starts streaming on `producer` and `consumer` (queue `stream` of
    /// `partitions`) and returns once at least `enqueued` enqueues and
    /// `acked` acks were acknowledged; panics with both sides' errors if
    /// that does not happen within `patience` or either side stops first.
    pub async fn start(
        producer: Client,
        consumer: Client,
        partitions: u32,
        (enqueued, acked): (usize, usize),
        patience: Duration,
    ) -> Stream {
        let ledger: Arc<Mutex<Ledger>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let producing = tokio::spawn(produce(producer, Arc::clone(&ledger), Arc::clone(&stop)));
        let consuming =
            tokio::spawn(consume(consumer, Arc::clone(&ledger), Arc::clone(&stop), partitions));
        let streaming = eventually(patience, || {
            let ledger = ledger.lock().unwrap();
            let ready = (ledger.enqueued.len() >= enqueued && ledger.acked.len() >= acked)
                || producing.is_finished()
                || consuming.is_finished();
            async move { ready }
        })
        .await;
        let stream = Stream { ledger, stop, producing, consuming };
        if !streaming || stream.producing.is_finished() || stream.consuming.is_finished() {
            let (enqueued, acked) = {
                let ledger = stream.ledger.lock().unwrap();
                (ledger.enqueued.len(), ledger.acked.len())
            };
            let (producer, consumer) = stream.finish().await;
            panic!(
                "the stream did not get going: {enqueued} enqueued, {acked} acked; producer: \
                 {producer}; consumer: {consumer}"
            );
        }
        stream
    }

    /// Stops both sides and returns how each ended.
    pub async fn finish(self) -> (String, String) {
        self.stop.store(true, Ordering::Release);
        (self.producing.await.unwrap(), self.consuming.await.unwrap())
    }
}
