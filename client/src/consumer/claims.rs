//! The claim loop: claims only free room (slots plus prefetch) as credits,
//! keeps up to `claims_in_flight` claims out, each a claim of any partition
//! sent to the next shard in turn ([`ClaimSpread`] gives a caught-up shard
//! one long-polling claim at a time), starts one task per delivery, and on
//! shutdown waits for the claims in flight and releases what they bring.
//!
//! It must never ask for more than the free room, nor abandon a claim in
//! flight; running a delivery is the parent module's, acking `acks`'.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use spool_wire::proto::limits::CLAIM_CREDITS_MAX;
use spool_wire::proto::PartitionId;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::acks::{ack_loop, AckItem};
use super::{release, run_delivery, CreditGuard, SettleTarget, Shared, SHUTDOWN_REASON};
use crate::client::{ClaimBatch, ClaimOptions};
use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::limits::CLAIM_ERROR_BACKOFF;

/// What a finished claim task reports back to the loop.
struct ClaimOutcome {
    /// The claim target it went to (`None`: no target was known).
    target: Option<PartitionId>,
    /// Credits the claim asked for (taken from the free room).
    credits: u32,
    result: Result<ClaimBatch, ClientError>,
}

/// One claim of any partition of the shard leading `partition` (one of the
/// queue's claim targets), with `credits` slots already taken.
/// A failed claim pauses [`CLAIM_ERROR_BACKOFF`] (less if shutdown begins)
/// before it reports, so a broker that is down sees at most
/// `claims_in_flight` attempts per backoff.
async fn claim_once(
    shared: Arc<Shared>,
    partition: Option<PartitionId>,
    options: ClaimOptions,
    mut stopped: watch::Receiver<bool>,
) -> ClaimOutcome {
    let config = &shared.config;
    let credits = options.credits;
    let result = match partition {
        Some(partition) => {
            // The claim is the session's there (opened first, if need be).
            shared.sessions.ensure(&shared, partition).await;
            shared.counters.claim_requests.fetch_add(1, Ordering::Relaxed);
            let sent = tokio::time::Instant::now();
            let result = shared.client.claim_shard(&config.queue, partition, &options).await;
            if let (Some(observer), Ok(batch)) = (&config.claim_observer, &result) {
                observer(sent.elapsed(), credits, batch.deliveries.len());
            }
            if let Err(error) = &result {
                tracing::warn!(queue = %config.queue, partition = partition.0, %error, "claim failed");
            }
            result
        }
        None => Err(ClientError::UnknownQueue(config.queue.clone())),
    };
    if result.is_err() {
        // The credits are free while this claim waits out its backoff.
        shared.credits.add_permits(credits as usize);
        shared.counters.claim_failed.fetch_add(1, Ordering::Relaxed);
        pause(&mut stopped).await;
        return ClaimOutcome { target: partition, credits: 0, result };
    }
    ClaimOutcome { target: partition, credits, result }
}

pub(super) async fn claim_loop<H, F, E>(
    shared: Arc<Shared>,
    handler: Arc<H>,
    mut stopped: watch::Receiver<bool>,
) where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let config = &shared.config;
    // Every item holds an `acks_pending` permit, so a send never waits.
    let (acks, ack_queue) = mpsc::channel(config.acks_pending_max as usize);
    let acker = tokio::spawn(ack_loop(Arc::clone(&shared), ack_queue));
    let mut tasks = JoinSet::new();
    let mut claims: JoinSet<ClaimOutcome> = JoinSet::new();
    let mut next_target = 0usize;
    // Claims in a row that came back empty: a full sweep of the shards
    // turns on the long-poll.
    let mut empty_claims = 0usize;
    // Where claims go (module doc, "caught-up shards"): the last targets
    // known, and which of them are caught up and how many claims each has.
    let mut targets: Arc<[PartitionId]> = Arc::from(Vec::new());
    let mut spread = ClaimSpread::default();
    let share = config.claim_share();
    let credits_max = config.window().min(CLAIM_CREDITS_MAX);
    loop {
        if *stopped.borrow() {
            break;
        }
        // The first claim goes out for one free credit; while others are
        // out, wait for a share, so credits coming back one by one are
        // batched. None goes out while every known shard is caught up and
        // has its claim: one of those answers first.
        let wanted = match claims.len() {
            _ if !claims.is_empty() && !spread.any_open(&targets) => 0,
            0 => 1,
            outstanding if outstanding < config.claims_in_flight as usize => share,
            _ => 0,
        };
        tokio::select! {
            // Answered claims first: their deliveries run rather than being
            // released because shutdown began in the same instant.
            biased;
            Some(joined) = claims.join_next(), if !claims.is_empty() => {
                let Ok(outcome) = joined else {
                    // A claim task cannot panic short of a bug in this crate;
                    // its slots are lost, which only lowers concurrency.
                    tracing::error!(queue = %config.queue, "claim task failed");
                    continue;
                };
                spread.answered(outcome.target);
                let Ok(batch) = outcome.result else { continue };
                let received = batch.deliveries.len();
                if let Some(target) = outcome.target {
                    spread.set_caught_up(target, received < outcome.credits as usize);
                }
                shared.credits.add_permits(outcome.credits as usize - received);
                empty_claims = if received == 0 { empty_claims + 1 } else { 0 };
                let stopping = *stopped.borrow();
                spawn_deliveries(&shared, &handler, &acks, &mut tasks, batch, stopping, &stopped);
            }
            credit = Arc::clone(&shared.credits).acquire_many_owned(wanted), if wanted > 0 => {
                let Ok(credit) = credit else { break };
                credit.forget();
                targets = match shared.client.claim_targets(&config.queue).await {
                    Ok(known) => {
                        if !Arc::ptr_eq(&known, &targets) {
                            spread.keep_only(&known);
                        }
                        known
                    }
                    Err(error) => {
                        tracing::warn!(queue = %config.queue, %error, "no metadata for the consumer's queue");
                        Arc::from(Vec::new())
                    }
                };
                // Each claim asks for at most a share, so the credits are
                // spread over `claims_in_flight` claims (and partitions).
                let limit = share.min(credits_max).max(wanted);
                let mut credits = wanted;
                while credits < limit {
                    match shared.credits.try_acquire() {
                        Ok(credit) => {
                            credit.forget();
                            credits += 1;
                        }
                        Err(_) => break,
                    }
                }
                // The next shard in turn that is open: not caught up, or
                // caught up without a claim.
                let pick = (0..targets.len())
                    .map(|step| next_target.wrapping_add(step))
                    .find(|at| spread.open(targets[at % targets.len()]))
                    .unwrap_or(next_target);
                let partition = (!targets.is_empty()).then(|| targets[pick % targets.len()]);
                next_target = pick.wrapping_add(1);
                // A caught-up shard's claim waits there for messages; so
                // does any claim after a full sweep of empty answers.
                let long_poll = !targets.is_empty()
                    && (empty_claims >= targets.len()
                        || partition.is_some_and(|target| spread.is_caught_up(target)));
                spread.sent(partition);
                let options = ClaimOptions {
                    worker: config.worker,
                    credits,
                    max_bytes: config.max_bytes,
                    lease_ms: config.lease_ms,
                    wait_ms: if long_poll { config.wait_ms } else { 0 },
                    subscription: shared.subscription.clone(),
                };
                claims.spawn(claim_once(Arc::clone(&shared), partition, options, stopped.clone()));
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = stopped.changed() => break,
        }
    }
    // A claim in flight is never abandoned: its deliveries would sit leased
    // to nobody until their leases expired. They are released at once.
    while let Some(joined) = claims.join_next().await {
        let Ok(outcome) = joined else { continue };
        let Ok(batch) = outcome.result else { continue };
        shared.credits.add_permits(outcome.credits as usize - batch.deliveries.len());
        spawn_deliveries(&shared, &handler, &acks, &mut tasks, batch, true, &stopped);
    }
    while tasks.join_next().await.is_some() {}
    // Every delivery task has ended, so this was the last sender: the acker
    // flushes what is pending and returns once every Ack has an answer.
    drop(acks);
    if let Err(error) = acker.await {
        tracing::error!(%error, "consumer acker failed");
    }
    // Nothing is held any more: the sessions end cleanly.
    shared.sessions.close_all().await;
}

/// Where a consumer's claims go: which claim targets (shards) are caught
/// up, their last claim having come back with fewer deliveries than it had
/// credits (they were drained to what is durable there), and how many
/// claims each target has outstanding. A caught-up target gets one claim
/// at a time, and that claim long-polls; the rest of the claims go to the
/// targets that still fill them (module doc). At most one entry per claim
/// target, and the targets are the queue's shards.
#[derive(Debug, Default)]
struct ClaimSpread {
    /// (target, caught up, claims outstanding).
    targets: Vec<(PartitionId, bool, usize)>,
}

impl ClaimSpread {
    fn entry(&mut self, target: PartitionId) -> &mut (PartitionId, bool, usize) {
        let at = match self.targets.iter().position(|(known, _, _)| *known == target) {
            Some(at) => at,
            None => {
                self.targets.push((target, false, 0));
                self.targets.len() - 1
            }
        };
        &mut self.targets[at]
    }

    fn is_caught_up(&self, target: PartitionId) -> bool {
        self.targets.iter().any(|(known, caught_up, _)| *known == target && *caught_up)
    }

    /// Whether `target` may get a claim now: not caught up, or caught up
    /// with no claim outstanding.
    fn open(&self, target: PartitionId) -> bool {
        self.targets
            .iter()
            .find(|(known, _, _)| *known == target)
            .is_none_or(|(_, caught_up, outstanding)| !*caught_up || *outstanding == 0)
    }

    /// Whether any of `targets` may get a claim now (true when none is
    /// known yet: the claim fetches them).
    fn any_open(&self, targets: &[PartitionId]) -> bool {
        targets.is_empty() || targets.iter().any(|target| self.open(*target))
    }

    fn sent(&mut self, target: Option<PartitionId>) {
        if let Some(target) = target {
            self.entry(target).2 += 1;
        }
    }

    fn answered(&mut self, target: Option<PartitionId>) {
        if let Some(target) = target {
            let entry = self.entry(target);
            entry.2 = entry.2.saturating_sub(1);
        }
    }

    fn set_caught_up(&mut self, target: PartitionId, caught_up: bool) {
        self.entry(target).1 = caught_up;
    }

    /// The targets changed (metadata refreshed): forgets the ones gone that
    /// have no claim outstanding.
    fn keep_only(&mut self, targets: &[PartitionId]) {
        self.targets.retain(|(known, _, outstanding)| *outstanding > 0 || targets.contains(known));
    }
}

/// Starts one task per delivery of `batch`: the handler, or (when
/// `stopping`) an immediate release.
fn spawn_deliveries<H, F, E>(
    shared: &Arc<Shared>,
    handler: &Arc<H>,
    acks: &mpsc::Sender<AckItem>,
    tasks: &mut JoinSet<()>,
    batch: ClaimBatch,
    stopping: bool,
    stopped: &watch::Receiver<bool>,
) where
    H: Fn(Delivery) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let received = batch.deliveries.len() as u64;
    let counters = &shared.counters;
    counters.claimed.fetch_add(received, Ordering::Relaxed);
    let outstanding = counters.outstanding.fetch_add(received, Ordering::AcqRel) + received;
    counters.outstanding_max.fetch_max(outstanding, Ordering::AcqRel);
    assert!(outstanding <= u64::from(shared.config.window()));
    for delivery in batch.deliveries {
        let held = CreditGuard { shared: Arc::clone(shared) };
        if stopping {
            let target = SettleTarget::of(&delivery);
            tasks.spawn(release(held, None, target, SHUTDOWN_REASON.to_owned()));
        } else {
            let (handler, acks, stopped) = (Arc::clone(handler), acks.clone(), stopped.clone());
            tasks.spawn(run_delivery(held, handler, delivery, acks, stopped));
        }
    }
}

/// Waits [`CLAIM_ERROR_BACKOFF`], or less if shutdown begins.
async fn pause(stopped: &mut watch::Receiver<bool>) {
    if *stopped.borrow() {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(CLAIM_ERROR_BACKOFF) => {}
        _ = stopped.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_up_target_gets_one_claim_at_a_time() {
        // Goal: a target is open while it is not caught up whatever its claims,
        // and once caught up only while it has no claim outstanding; a full answer
        // opens it again; the spread forgets targets gone that have no claim.
        // Method: the bookkeeping alone, driven as the claim loop drives it.
        let (a, b) = (PartitionId(0), PartitionId(5));
        let mut spread = ClaimSpread::default();
        assert!(spread.open(a) && spread.any_open(&[a, b]) && spread.any_open(&[]));
        spread.sent(Some(a));
        spread.sent(Some(a));
        assert!(spread.open(a), "a busy target takes any number of claims");
        spread.answered(Some(a));
        spread.set_caught_up(a, true);
        assert!(spread.is_caught_up(a) && !spread.open(a), "one claim still out");
        spread.answered(Some(a));
        assert!(spread.open(a), "caught up, no claim out");
        spread.sent(Some(a));
        spread.sent(Some(b));
        spread.answered(Some(b));
        spread.set_caught_up(b, true);
        spread.sent(Some(b));
        assert!(!spread.any_open(&[a, b]), "both caught up, each with its claim");
        spread.answered(Some(a));
        spread.set_caught_up(a, false);
        assert!(spread.open(a) && !spread.is_caught_up(a), "a full answer opens it again");
        spread.keep_only(&[a]);
        assert!(!spread.open(b), "b keeps its entry while its claim is out");
        spread.answered(Some(b));
        spread.keep_only(&[a]);
        assert!(spread.open(b) && !spread.is_caught_up(b), "b forgotten");
        assert_eq!(spread.targets.len(), 1);
    }
}
