//! Ack batching: the acker task collects deliveries whose handler returned
//! `Ok` and sends one Ack request per shard for what completed within
//! `ack_linger` (or as soon as `ack_batch_max` wait), at most
//! [`ACK_REQUESTS_IN_FLIGHT_MAX`] requests at once, and counts what the
//! broker acked or refused.
//!
//! It must not release: a refused or failed ack is counted and logged, and
//! the lease runs out on the broker. Each item holds its room in the ack
//! pipeline until its Ack is answered.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use spool_wire::proto::{DeliveryToken, PartitionId};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::{SettleTarget, Shared};
use crate::error::{ClientError, RefusedAck};
use crate::limits::ACK_REQUESTS_IN_FLIGHT_MAX;

/// A delivery whose handler succeeded, waiting for its Ack.
pub(super) struct AckItem {
    pub(super) target: SettleTarget,
    /// Dropped with the item once the Ack is answered: room in the pipeline.
    pub(super) _pending: OwnedSemaphorePermit,
}

/// Collects completed deliveries and acks them in batches (module doc).
/// Returns when the queue closed and every Ack request has an answer.
pub(super) async fn ack_loop(shared: Arc<Shared>, mut queue: mpsc::Receiver<AckItem>) {
    let config = &shared.config;
    let batch_max = config.ack_batch_max as usize;
    let requests_in_flight = Arc::new(Semaphore::new(ACK_REQUESTS_IN_FLIGHT_MAX));
    let mut requests = JoinSet::new();
    let mut pending: Vec<AckItem> = Vec::with_capacity(batch_max);
    // Armed when the first item of a batch arrives.
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            item = queue.recv() => {
                let Some(item) = item else { break };
                pending.push(item);
                // Take whatever else is already waiting without a wake-up each.
                while pending.len() < batch_max {
                    match queue.try_recv() {
                        Ok(item) => pending.push(item),
                        Err(_) => break,
                    }
                }
                if pending.len() >= batch_max || config.ack_linger.is_zero() {
                    linger = None;
                    flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
                } else if linger.is_none() {
                    linger = Some(Box::pin(tokio::time::sleep(config.ack_linger)));
                }
            }
            () = async { if let Some(timer) = linger.as_mut() { timer.await } }, if linger.is_some() => {
                linger = None;
                flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
        }
    }
    flush_acks(&shared, &mut pending, &requests_in_flight, &mut requests).await;
    while requests.join_next().await.is_some() {}
}

/// Sends `pending` as Ack requests: one per shard (the broker acks the
/// tokens of each partition of a request together), each at most
/// `ack_batch_max` tokens, each waiting for a request slot first.
async fn flush_acks(
    shared: &Arc<Shared>,
    pending: &mut Vec<AckItem>,
    requests_in_flight: &Arc<Semaphore>,
    requests: &mut JoinSet<()>,
) {
    let batch_max = shared.config.ack_batch_max as usize;
    let mut items = std::mem::take(pending);
    while !items.is_empty() {
        // Split off the first item's shard (order within it kept); a
        // partition whose shard the cache does not know goes alone.
        let (queue, partition) = (Arc::clone(&items[0].target.queue), items[0].target.partition);
        let shard = shared.client.cached_owner(&queue, partition);
        let (mut group, rest): (Vec<AckItem>, Vec<AckItem>) = items.into_iter().partition(|item| {
            item.target.queue == queue
                && (item.target.partition == partition
                    || shard.is_some()
                        && shared.client.cached_owner(&queue, item.target.partition) == shard)
        });
        items = rest;
        while !group.is_empty() {
            let tail = group.split_off(group.len().min(batch_max));
            let chunk = std::mem::replace(&mut group, tail);
            // Never closed, so this only waits.
            let Ok(permit) = Arc::clone(requests_in_flight).acquire_owned().await else {
                unreachable!("the ack request semaphore is never closed");
            };
            requests.spawn(ack_request(Arc::clone(shared), chunk, permit));
        }
    }
}

/// One Ack request for `items` (all of one shard), sent to the shard of the
/// first; frees their room in the pipeline when the broker answered.
async fn ack_request(shared: Arc<Shared>, items: Vec<AckItem>, _permit: OwnedSemaphorePermit) {
    let counters = &shared.counters;
    let Some(first) = items.first() else { return };
    let (queue, partition) = (Arc::clone(&first.target.queue), first.target.partition);
    let tokens: Vec<DeliveryToken> = items.iter().map(|item| item.target.token).collect();
    counters.ack_requests.fetch_add(1, Ordering::Relaxed);
    let sent = tokio::time::Instant::now();
    let answer = shared.client.ack(&queue, partition, &tokens).await;
    if let Some(observer) = &shared.config.ack_observer {
        observer(sent.elapsed(), tokens.len());
    }
    match answer {
        Ok(()) => {
            counters.acked.fetch_add(items.len() as u64, Ordering::Relaxed);
        }
        Err(ClientError::AckRefused { refused, tokens }) => {
            counters.acked.fetch_add((tokens - refused.len()) as u64, Ordering::Relaxed);
            // Tokens of several partitions went to one owner, and some
            // partition's leader is elsewhere (NOT_LEADER, retried by `ack`
            // only through the first partition's owner): sent again
            // partition by partition, each to its own leader.
            let (moved, failed): (Vec<&RefusedAck>, Vec<&RefusedAck>) =
                refused.iter().partition(|refused| crate::client::is_redirect(refused.code));
            for refused in &failed {
                let offset = items.get(refused.index).map_or(0, |item| item.target.offset.0);
                tracing::warn!(%queue, offset, code = %refused.code, "ack refused");
            }
            counters.settle_failed.fetch_add(failed.len() as u64, Ordering::Relaxed);
            let moved: Vec<&AckItem> =
                moved.iter().filter_map(|refused| items.get(refused.index)).collect();
            reack_by_partition(&shared, &queue, &moved).await;
        }
        Err(error) => {
            tracing::warn!(%queue, partition = partition.0, count = items.len(), %error, "ack failed");
            counters.settle_failed.fetch_add(items.len() as u64, Ordering::Relaxed);
        }
    }
    // Dropping the items drops their permits: room in the pipeline.
    drop(items);
}

/// Acks `items` again, one request per partition (each routed to that
/// partition's leader), counting what is acked and what is refused.
async fn reack_by_partition(shared: &Arc<Shared>, queue: &str, items: &[&AckItem]) {
    let counters = &shared.counters;
    let mut partitions: Vec<PartitionId> = items.iter().map(|item| item.target.partition).collect();
    partitions.sort_unstable_by_key(|partition| partition.0);
    partitions.dedup();
    for partition in partitions {
        let tokens: Vec<DeliveryToken> = items
            .iter()
            .filter(|item| item.target.partition == partition)
            .map(|item| item.target.token)
            .collect();
        counters.ack_requests.fetch_add(1, Ordering::Relaxed);
        match shared.client.ack(queue, partition, &tokens).await {
            Ok(()) => {
                counters.acked.fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
            Err(ClientError::AckRefused { refused, tokens }) => {
                counters.acked.fetch_add((tokens - refused.len()) as u64, Ordering::Relaxed);
                for refused in &refused {
                    tracing::warn!(%queue, partition = partition.0, code = %refused.code, "ack refused");
                }
                counters.settle_failed.fetch_add(refused.len() as u64, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(%queue, partition = partition.0, count = tokens.len(), %error, "ack failed");
                counters.settle_failed.fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
        }
    }
}
