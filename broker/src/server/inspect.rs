//! Inspection and repair of one partition on a shard's port: Peek,
//! DeadLetters, Purge and Redrive, each in one subscription (v2 names it;
//! an older request, or an empty name, acts in the queue's default).
//!
//! The name is resolved through the table as a claim's is
//! (`SpoolHandler::subscription_of`: `QUEUE_NOT_FOUND`,
//! `SUBSCRIPTION_NOT_FOUND`), then the request goes to the partition this
//! shard owns (`NOT_OWNER`, `NOT_LEADER` otherwise). A partition whose log
//! has not started the subscription yet has nothing of it: a peek or a
//! listing is empty, a purge or a redrive moves nothing, as a claim of it
//! finds nothing (`partition/operator.rs`). The rights are checked before
//! (`server/auth.rs`: peek for Peek and DeadLetters, purge, redrive) and
//! purges and redrives are audited around this (`server/handler.rs`).

use std::rc::Rc;

use spool_wire::batch::{validate_record, BatchBytes};
use spool_wire::proto::{
    DeadLetter, DeadLettersRequest, DeadLettersResponse, MessageState, PeekRequest, PeekResponse,
    PeekedMessage, PurgeRequest, PurgeResponse, RedriveRequest, RedriveResponse, RedriveTarget,
    Response,
};

use super::handler::{partition_error, Answer, SpoolHandler, RELEASE_REASON_WORKER};
use super::Served;
use crate::partition::CONTROL_BATCH_EVENTS_MAX;
use crate::queue::limits::PEEK_MAX;
use crate::queue::{
    Lane, MessagePhase, Offset, PartitionId, QuarantineCause, Redrive, ReleaseReason,
    SubscriptionId,
};

/// A release reason and quarantine cause as text for DeadLetters.
fn reason_text(reason: ReleaseReason, cause: Option<QuarantineCause>) -> String {
    let why = match reason {
        ReleaseReason::NONE => "none".to_owned(),
        ReleaseReason::LEASE_EXPIRED => "lease expired".to_owned(),
        ReleaseReason::EXPIRED => "expired".to_owned(),
        ReleaseReason::EPOCH_FENCED => "claimed when the partition restarted".to_owned(),
        ReleaseReason::SESSION_ENDED => "session ended".to_owned(),
        RELEASE_REASON_WORKER => "released by worker".to_owned(),
        ReleaseReason(code) => format!("code {code}"),
    };
    match cause {
        Some(QuarantineCause::Deliveries) => {
            format!("max deliveries reached; last: {why}")
        }
        Some(QuarantineCause::Expired) => format!("expired; last: {why}"),
        None => why,
    }
}

impl SpoolHandler {
    /// The subscription a request names and the partition it goes to.
    fn inspected(
        &self,
        queue: &str,
        subscription: &str,
        partition: PartitionId,
    ) -> Result<(SubscriptionId, Rc<Served>), spool_wire::proto::ErrorResponse> {
        let sub = self.subscription_of(queue, subscription)?;
        let served = self.route(queue, partition)?;
        if sub != SubscriptionId::DEFAULT && !served.partition.has_subscription(sub) {
            // Its leader has yet to start it here: nudge the watch, as a
            // claim does.
            self.state.subscriptions_changed_by_name(queue);
        }
        Ok((sub, served))
    }

    /// Peek: a subscription's live messages from an offset, unclaimed.
    pub(super) async fn peek(&self, peek: &PeekRequest) -> Answer {
        let (sub, partition) = self.inspected(&peek.queue, &peek.subscription, peek.partition)?;
        let max = (peek.max as usize).min(PEEK_MAX);
        let peeked =
            partition.peek(sub, peek.from_offset, max).await.map_err(|e| partition_error(&e))?;
        let messages = peeked
            .into_iter()
            .map(|message| PeekedMessage {
                offset: message.view.offset,
                state: match message.view.phase {
                    MessagePhase::Ready { .. } => MessageState::Ready,
                    MessagePhase::Scheduled { .. } => MessageState::Scheduled,
                    MessagePhase::Claimed { .. } => MessageState::Claimed,
                    MessagePhase::Waiting { .. } => MessageState::Waiting,
                },
                attempt: u32::from(message.view.attempts),
                record: message.record,
            })
            .collect();
        Ok(Response::Peek(PeekResponse { messages }))
    }

    /// Purge: a subscription's unclaimed main-lane messages, or their count.
    pub(super) async fn purge(&self, purge: &PurgeRequest) -> Answer {
        let (sub, partition) =
            self.inspected(&purge.queue, &purge.subscription, purge.partition)?;
        let mut total = 0u64;
        loop {
            let count = partition
                .purge(sub, Lane::Main, CONTROL_BATCH_EVENTS_MAX, purge.dry_run)
                .await
                .map_err(|e| partition_error(&e))?;
            total += count as u64;
            if purge.dry_run || count < CONTROL_BATCH_EVENTS_MAX {
                break;
            }
        }
        // A dry run counts, at any size, what the loop above removes:
        // every unclaimed main-lane message whose enqueue is durable.
        Ok(Response::Purge(PurgeResponse { count: total }))
    }

    /// DeadLetters: a subscription's dead letters from an offset, with
    /// their evidence.
    pub(super) async fn dead_letters(&self, list: &DeadLettersRequest) -> Answer {
        let (sub, partition) = self.inspected(&list.queue, &list.subscription, list.partition)?;
        let max = (list.max as usize).min(PEEK_MAX);
        let after = list.from_offset.0.checked_sub(1).map(Offset);
        let views = partition.dead_letters(sub, after, max);
        let records = partition.records_of_views(&views).await.map_err(|e| partition_error(&e))?;
        let mut entries = Vec::with_capacity(views.len());
        for (view, record) in views.into_iter().zip(records) {
            let claimed_at = match view.phase {
                MessagePhase::Claimed { claimed_at_ms, .. } => claimed_at_ms,
                _ => 0,
            };
            let routing_key = record
                .and_then(|bytes| {
                    let mut aligned = BatchBytes::with_capacity(bytes.len());
                    aligned.extend_from_slice(&bytes);
                    validate_record(&aligned)
                        .ok()
                        .map(|record| String::from_utf8_lossy(&record.routing_key).into_owned())
                })
                .unwrap_or_default();
            entries.push(DeadLetter {
                original_offset: view.offset,
                routing_key,
                attempts: u32::from(view.attempts),
                last_reason: reason_text(view.last_reason, view.quarantine.map(|(c, _)| c)),
                enqueued_at_ms: view.enqueue_time_ms,
                last_claimed_at_ms: claimed_at,
                quarantined_at_ms: view.quarantine.map_or(0, |(_, at)| at),
            });
        }
        Ok(Response::DeadLetters(DeadLettersResponse { entries }))
    }

    /// Redrive: a subscription's dead letters back to its ready work.
    pub(super) async fn redrive(&self, redrive: &RedriveRequest) -> Answer {
        let (sub, partition) =
            self.inspected(&redrive.queue, &redrive.subscription, redrive.partition)?;
        let count = match &redrive.target {
            RedriveTarget::All => {
                let mut total = 0usize;
                loop {
                    let moved = partition
                        .redrive(sub, Redrive::Oldest(CONTROL_BATCH_EVENTS_MAX))
                        .await
                        .map_err(|e| partition_error(&e))?;
                    total += moved;
                    if moved < CONTROL_BATCH_EVENTS_MAX {
                        break total;
                    }
                }
            }
            RedriveTarget::Offsets(offsets) => {
                let mut total = 0usize;
                for offset in offsets {
                    total += partition
                        .redrive(sub, Redrive::One(*offset))
                        .await
                        .map_err(|e| partition_error(&e))?;
                }
                total
            }
        };
        Ok(Response::Redrive(RedriveResponse { count: count as u64 }))
    }
}
