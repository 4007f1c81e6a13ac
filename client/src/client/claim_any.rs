//! [`Client::claim_any`]: a claim of whichever partitions of a queue have
//! messages, over every shard that leads some of them, with one deadline.
//! Owns the sweep, the long-polls and their withdrawal (CancelClaim on the
//! connection each went out on), and the background release of deliveries
//! beyond the credits or left when the caller's future is dropped.
//!
//! It must never drop a delivery silently: whatever it does not return is
//! released. The claim itself (one request to one shard) is `claim`'s.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use spool_wire::proto::{
    CancelClaimRequest, CancelOutcome, CorrelationId, PartitionId, Request, Response,
};

use super::claim::{ClaimBatch, ClaimOptions};
use super::Client;
use crate::connection::Connection;
use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::limits::{CLAIM_EXTRA_RELEASE_DELAY_MS, CLAIM_EXTRA_RELEASE_REASON};

impl Client {
    /// Leases up to `options.credits` messages from whichever partitions of
    /// `queue` have them, waiting at most `options.wait_ms` **in total**.
    ///
    /// It sends claims of any partition ([`claim_shard`](Self::claim_shard)),
    /// one per shard that leads partitions of the queue, not one per
    /// partition. First it asks the shards in turn without waiting
    /// (starting at a different shard each call, so none is always asked
    /// first) and returns what it found. When every shard had nothing it
    /// long-polls all of them at once, each claim with the time left of the
    /// one deadline, and returns as soon as one of them answers with
    /// deliveries, so a message arriving on any partition wakes it.
    ///
    /// The long-polls still outstanding are then withdrawn (the protocol's
    /// CancelClaim) before it returns: a withdrawn claim has claimed
    /// nothing, so a message arriving on its partition afterwards is left
    /// for the next claim, its delivery attempts untouched. Only a claim
    /// that the broker had already decided when the cancel arrived (the
    /// message came in within that round trip) still delivers; its
    /// deliveries are kept up to the credits, like those of answers that
    /// arrive together, and the ones beyond the credits are released, ready
    /// again after
    /// [`CLAIM_EXTRA_RELEASE_DELAY_MS`].
    /// Such a released message has used one delivery attempt (it counts
    /// towards the queue's `max_deliveries`). When a cancel cannot be
    /// delivered (the connection broke, or a broker without CancelClaim), or
    /// the returned future is dropped while it waits, a background task
    /// withdraws what it can and releases whatever the claims still bring.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), spool_client::ClientError> {
    /// use spool_client::{ClaimOptions, Client, PayloadView};
    /// let client = Client::connect("127.0.0.1:7400").await?;
    /// // Up to 10 messages from any partition of "jobs", waiting at most 2 s in all.
    /// let deliveries = client.claim_any("jobs", &ClaimOptions::new(10).wait_ms(2_000)).await?;
    /// for delivery in &deliveries {
    ///     if let PayloadView::Inline(body) = delivery.payload() {
    ///         println!("{}/{}: {}", delivery.partition().0, delivery.offset().0, String::from_utf8_lossy(body));
    ///     }
    ///     client.ack("jobs", delivery.partition(), &[delivery.token()]).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::UnknownQueue`]; a partition's claim error when no
    /// partition delivered anything (with deliveries from another
    /// partition, the error is logged and the deliveries are returned).
    pub async fn claim_any(
        &self,
        queue: &str,
        options: &ClaimOptions,
    ) -> Result<Vec<Delivery>, ClientError> {
        let targets = self.claim_targets(queue).await?;
        let count = targets.len();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(options.wait_ms.into());
        let first = self.inner.next_sweep.fetch_add(1, Ordering::Relaxed) as usize % count;
        let mut received: Vec<Delivery> = Vec::new();
        let mut failed: Option<ClientError> = None;
        let mut waitable = Vec::new();
        for partition in (0..count).map(|n| targets[(first + n) % count]) {
            let remaining = options.credits.saturating_sub(received.len() as u32);
            if remaining == 0 {
                break;
            }
            let sweep = ClaimOptions { credits: remaining, wait_ms: 0, ..options.clone() };
            match self.claim_shard(queue, partition, &sweep).await {
                Ok(batch) => {
                    received.extend(batch.deliveries);
                    waitable.push(partition);
                }
                Err(error) => {
                    tracing::warn!(%queue, partition = partition.0, %error, "claim failed");
                    failed.get_or_insert(error);
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let wait_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
        if !received.is_empty() || wait_ms == 0 || waitable.is_empty() {
            return match failed {
                Some(error) if received.is_empty() => Err(error),
                _ => Ok(received),
            };
        }
        let mut waits = PendingClaims::new(self.clone(), queue);
        let long_poll = ClaimOptions { wait_ms, ..options.clone() };
        for partition in waitable {
            let (client, queue) = (self.clone(), Arc::clone(&waits.queue));
            let (sent, long_poll) = (Arc::clone(&waits.sent), long_poll.clone());
            waits.outstanding.insert(partition);
            waits.claims.spawn(async move {
                let on_sent = |connection: &Connection, id| sent.record(partition, connection, id);
                let any = PartitionId::ANY;
                let result =
                    client.claim_observed(&queue, partition, any, &long_poll, on_sent).await;
                (partition, result)
            });
        }
        let credits = options.credits as usize;
        let mut take = |joined: Result<ClaimAnswer, tokio::task::JoinError>,
                        received: &mut Vec<Delivery>,
                        waits: &mut PendingClaims| {
            match joined {
                Ok((partition, Ok(batch))) => {
                    waits.outstanding.remove(&partition);
                    for delivery in batch.deliveries {
                        if received.len() < credits {
                            received.push(delivery);
                        } else {
                            waits.extras.push(delivery);
                        }
                    }
                }
                Ok((partition, Err(error))) => {
                    waits.outstanding.remove(&partition);
                    tracing::warn!(%queue, partition = partition.0, %error, "claim failed");
                    failed.get_or_insert(error);
                }
                // A claim task ends only by answering, or by being
                // cancelled when the runtime shuts down.
                Err(_) => {
                    failed.get_or_insert(ClientError::Shutdown);
                }
            }
        };
        while received.is_empty() {
            let Some(joined) = waits.claims.join_next().await else { break };
            take(joined, &mut received, &mut waits);
        }
        // Answers that arrived in the same instant join up to the credits.
        while let Some(joined) = waits.claims.try_join_next() {
            take(joined, &mut received, &mut waits);
        }
        // Withdraw the long-polls still waiting. Once every cancel is
        // answered, each outstanding claim answers promptly: empty if the
        // cancel withdrew it, with deliveries if it had already claimed
        // (those join up to the credits too).
        if waits.withdraw().await {
            while let Some(joined) = waits.claims.join_next().await {
                take(joined, &mut received, &mut waits);
            }
        }
        // Dropping `waits` hands what is still outstanding to the release task.
        drop(waits);
        match failed {
            Some(error) if received.is_empty() => Err(error),
            _ => Ok(received),
        }
    }
}

/// Where each long-poll of a [`Client::claim_any`] was sent, so it can be
/// withdrawn with a CancelClaim on the same connection.
#[derive(Default)]
struct SentClaims(Mutex<HashMap<PartitionId, SentClaim>>);

enum SentClaim {
    /// On this connection, under this correlation id.
    Sent(Connection, CorrelationId),
    /// Withdrawn before it was sent: cancel it as soon as it is.
    Withdrawn,
}

impl SentClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, SentClaim>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A long-poll was sent; if it is already withdrawn, cancels it now.
    fn record(&self, partition: PartitionId, connection: &Connection, id: CorrelationId) {
        let mut sent = self.lock();
        if let Some(SentClaim::Withdrawn) = sent.get(&partition) {
            let (connection, timeout) = (connection.clone(), connection.request_timeout());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = cancel_claim(&connection, id, timeout).await;
                });
            }
            return;
        }
        sent.insert(partition, SentClaim::Sent(connection.clone(), id));
    }

    /// Marks the long-polls of `partitions` withdrawn and returns those
    /// already sent, to cancel.
    fn withdraw(
        &self,
        partitions: &HashSet<PartitionId>,
    ) -> Vec<(PartitionId, Connection, CorrelationId)> {
        let mut sent = self.lock();
        let mut to_cancel = Vec::new();
        for &partition in partitions {
            if let Some(SentClaim::Sent(connection, id)) =
                sent.insert(partition, SentClaim::Withdrawn)
            {
                to_cancel.push((partition, connection, id));
            }
        }
        to_cancel
    }
}

/// Sends a CancelClaim for the claim `claim` sent earlier on `connection`.
async fn cancel_claim(
    connection: &Connection,
    claim: CorrelationId,
    timeout: Duration,
) -> Result<CancelOutcome, ClientError> {
    let request = Request::CancelClaim(CancelClaimRequest { claim });
    let bytes = connection.call_with_timeout(&request, timeout).await?;
    match bytes.response()? {
        Response::CancelClaim(response) => Ok(response.outcome),
        _ => Err(ClientError::Protocol("cancel claim answered with another response".into())),
    }
}

/// Sends a CancelClaim for each of `to_cancel`, all at once; true when
/// every one was answered (whatever the outcome).
async fn cancel_claims(
    to_cancel: Vec<(PartitionId, Connection, CorrelationId)>,
    timeout: Duration,
    queue: &str,
) -> bool {
    let mut cancels = tokio::task::JoinSet::new();
    for (partition, connection, id) in to_cancel {
        cancels.spawn(async move { (partition, cancel_claim(&connection, id, timeout).await) });
    }
    let mut all_answered = true;
    while let Some(joined) = cancels.join_next().await {
        match joined {
            Ok((_, Ok(_))) => {}
            Ok((partition, Err(error))) => {
                tracing::warn!(%queue, partition = partition.0, %error, "cancel of a long-poll claim failed");
                all_answered = false;
            }
            Err(_) => all_answered = false,
        }
    }
    all_answered
}

/// A partition's answer to one of [`Client::claim_any`]'s long-polls.
type ClaimAnswer = (PartitionId, Result<ClaimBatch, ClientError>);

/// The long-polls of a [`Client::claim_any`] and the deliveries it received
/// beyond its credits. Whatever is left when it is dropped (on return, or
/// when the caller drops the claim's future) goes to a task that withdraws
/// the outstanding claims, waits for them and releases every delivery they
/// bring, so no message stays leased to a caller that never sees it.
struct PendingClaims {
    client: Client,
    queue: Arc<str>,
    claims: tokio::task::JoinSet<ClaimAnswer>,
    /// Partitions whose long-poll has not answered yet.
    outstanding: HashSet<PartitionId>,
    sent: Arc<SentClaims>,
    extras: Vec<Delivery>,
}

impl PendingClaims {
    fn new(client: Client, queue: &str) -> Self {
        Self {
            client,
            queue: Arc::from(queue),
            claims: tokio::task::JoinSet::new(),
            outstanding: HashSet::new(),
            sent: Arc::default(),
            extras: Vec::new(),
        }
    }

    /// Withdraws every outstanding long-poll; true when each was sent and
    /// its cancel answered, so each will answer promptly.
    async fn withdraw(&mut self) -> bool {
        if self.outstanding.is_empty() {
            return true;
        }
        let to_cancel = self.sent.withdraw(&self.outstanding);
        let all_sent = to_cancel.len() == self.outstanding.len();
        let timeout = self.client.request_timeout();
        cancel_claims(to_cancel, timeout, &self.queue).await && all_sent
    }
}

impl Drop for PendingClaims {
    fn drop(&mut self) {
        if self.claims.is_empty() && self.extras.is_empty() {
            return;
        }
        let claims = std::mem::take(&mut self.claims);
        let extras = std::mem::take(&mut self.extras);
        let to_cancel = self.sent.withdraw(&self.outstanding);
        let (client, queue) = (self.client.clone(), Arc::clone(&self.queue));
        // Without a runtime (it is shutting down) the claims are aborted with
        // the set; their leases run out on the broker.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release_unwanted(client, queue, claims, to_cancel, extras));
        }
    }
}

/// Withdraws `to_cancel`, then releases `extras` and every delivery the
/// outstanding `claims` still bring.
async fn release_unwanted(
    client: Client,
    queue: Arc<str>,
    mut claims: tokio::task::JoinSet<ClaimAnswer>,
    to_cancel: Vec<(PartitionId, Connection, CorrelationId)>,
    extras: Vec<Delivery>,
) {
    cancel_claims(to_cancel, client.request_timeout(), &queue).await;
    let release = |delivery: Delivery| {
        let client = client.clone();
        let queue = Arc::clone(&queue);
        async move {
            let released = client
                .release(
                    &queue,
                    delivery.partition(),
                    delivery.token(),
                    CLAIM_EXTRA_RELEASE_DELAY_MS,
                    CLAIM_EXTRA_RELEASE_REASON,
                )
                .await;
            if let Err(error) = released {
                tracing::warn!(%queue, offset = delivery.offset().0, %error, "release of an unwanted delivery failed");
            }
        }
    };
    for delivery in extras {
        release(delivery).await;
    }
    while let Some(joined) = claims.join_next().await {
        if let Ok((_, Ok(batch))) = joined {
            for delivery in batch.deliveries {
                release(delivery).await;
            }
        }
    }
}
