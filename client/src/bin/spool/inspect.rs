//! `spool peek`, `spool purge` and `spool dlq list|redrive`: a queue's
//! stored messages, one partition after another (all of them unless
//! `--partition` names one), through [`Admin`]; peeked records are read
//! from their archived bytes for the table.
//!
//! It must not claim: peek and the dead-letter list leave every message as
//! it is, and purge asks before it drops (`confirm`, or `--yes`). Each
//! acts in the queue's default subscription, or in the one `--sub` names
//! (the client then sends the request's v2).

use serde_json::{json, Value};
use spool_client::spool_wire::batch::{validate_record, BatchBytes};
use spool_client::spool_wire::proto::{Offset, PartitionId, PeekedMessage, RedriveTarget};
use spool_client::{Admin, Client};

use crate::args::{DlqCommand, PeekArgs, PurgeArgs};
use crate::render::{show_bytes, Output, Table};
use crate::{confirm, Failure};

/// `spool peek`: messages from an offset on, in every partition asked for,
/// without claiming them.
pub async fn peek(client: &Client, admin: &Admin, peek: &PeekArgs) -> Result<Output, Failure> {
    let mut rows = Vec::new();
    for partition in partitions_of(client, &peek.queue, peek.partition).await? {
        let messages = admin
            .peek_in(&peek.queue, sub_of(&peek.sub), partition, Offset(peek.from), peek.count)
            .await?;
        rows.extend(messages.into_iter().map(|message| (partition, message)));
    }
    Ok(render_peek(&rows))
}

/// `spool purge`: counts what a purge would drop, asks, then purges.
pub async fn purge(client: &Client, admin: &Admin, purge: &PurgeArgs) -> Result<Output, Failure> {
    let partitions = partitions_of(client, &purge.queue, purge.partition).await?;
    let sub = sub_of(&purge.sub);
    let mut count = 0u64;
    for &partition in &partitions {
        count += admin.purge_in(&purge.queue, sub, partition, true).await?;
    }
    let from = described(&purge.queue, sub);
    confirm(purge.yes, &format!("purge {count} messages from {from}?"))?;
    let mut purged = 0u64;
    for &partition in &partitions {
        purged += admin.purge_in(&purge.queue, sub, partition, false).await?;
    }
    Ok(Output::message(
        format!("purged {purged} messages from {from} (dry run counted {count})"),
        json!({
            "queue": purge.queue,
            "subscription": sub,
            "dry_run_count": count,
            "purged": purged,
        }),
    ))
}

/// `spool dlq list|redrive`.
pub async fn dlq(client: &Client, admin: &Admin, command: &DlqCommand) -> Result<Output, Failure> {
    match command {
        DlqCommand::List(list) => dlq_list(client, admin, list).await,
        DlqCommand::Redrive { queue, partition, offsets, sub } => {
            let sub = sub_of(sub);
            let mut count = 0u64;
            for partition in partitions_of(client, queue, *partition).await? {
                let target = if offsets.is_empty() {
                    RedriveTarget::All
                } else {
                    RedriveTarget::Offsets(offsets.iter().map(|&offset| Offset(offset)).collect())
                };
                count += admin.redrive_in(queue, sub, partition, target).await?;
            }
            Ok(Output::message(
                format!("redrove {count} dead letters of {}", described(queue, sub)),
                json!({"queue": queue, "subscription": sub, "redriven": count}),
            ))
        }
    }
}

async fn dlq_list(client: &Client, admin: &Admin, list: &PeekArgs) -> Result<Output, Failure> {
    let mut table =
        Table::new(vec!["partition", "offset", "attempts", "routing_key", "last_reason"]);
    let mut entries = Vec::new();
    for partition in partitions_of(client, &list.queue, list.partition).await? {
        let sub = sub_of(&list.sub);
        for letter in admin
            .dead_letters_in(&list.queue, sub, partition, Offset(list.from), list.count)
            .await?
        {
            table.push(vec![
                partition.0.to_string(),
                letter.original_offset.0.to_string(),
                letter.attempts.to_string(),
                letter.routing_key.clone(),
                letter.last_reason.clone(),
            ]);
            entries.push(json!({
                "partition": partition.0,
                "offset": letter.original_offset.0,
                "attempts": letter.attempts,
                "routing_key": letter.routing_key,
                "last_reason": letter.last_reason,
                "enqueued_at_ms": letter.enqueued_at_ms,
                "quarantined_at_ms": letter.quarantined_at_ms,
            }));
        }
    }
    Ok(Output::table(table, Value::Array(entries)))
}

/// The subscription `--sub` names; `""` (the default) without it.
fn sub_of(sub: &Option<String>) -> &str {
    sub.as_deref().unwrap_or_default()
}

/// `queue`, or `queue/sub` when a subscription is named.
fn described(queue: &str, sub: &str) -> String {
    if sub.is_empty() {
        queue.to_owned()
    } else {
        format!("{queue}/{sub}")
    }
}

async fn partitions_of(
    client: &Client,
    queue: &str,
    only: Option<u32>,
) -> Result<Vec<PartitionId>, Failure> {
    if let Some(partition) = only {
        return Ok(vec![PartitionId(partition)]);
    }
    let count = client.partitions(queue).await?.len();
    Ok((0..count).map(|partition| PartitionId(partition as u32)).collect())
}

fn render_peek(messages: &[(PartitionId, PeekedMessage)]) -> Output {
    let mut table = Table::new(vec!["partition", "offset", "state", "attempt", "key", "payload"]);
    let mut json = Vec::new();
    for (partition, message) in messages {
        // Peeked records arrive as plain bytes; rkyv needs them 8-aligned.
        let mut aligned = BatchBytes::with_capacity(message.record.len());
        aligned.extend_from_slice(&message.record);
        let (key, payload) = match validate_record(&aligned) {
            Ok(record) => (
                show_bytes(record.routing_key.as_slice()),
                match &record.payload {
                    spool_client::spool_wire::batch::ArchivedPayload::Inline(bytes) => {
                        show_bytes(bytes.as_slice())
                    }
                    spool_client::spool_wire::batch::ArchivedPayload::Reference(reference) => {
                        format!("<ref {}>", reference.location.as_str())
                    }
                },
            ),
            Err(error) => (String::new(), format!("<invalid record: {error}>")),
        };
        let state = format!("{:?}", message.state).to_lowercase();
        table.push(vec![
            partition.0.to_string(),
            message.offset.0.to_string(),
            state.clone(),
            message.attempt.to_string(),
            key.clone(),
            payload.clone(),
        ]);
        json.push(json!({
            "partition": partition.0,
            "offset": message.offset.0,
            "state": state,
            "attempt": message.attempt,
            "key": key,
            "payload": payload,
        }));
    }
    Output::table(table, Value::Array(json))
}

#[cfg(test)]
mod tests {
    use spool_client::spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
    use spool_client::spool_wire::proto::MessageState;

    use super::*;

    // Goal: peek shows key, payload and state from the archived record, hex
    // for binary payloads. Method: archive two records and render them.
    #[test]
    fn peek_rendering_reads_records() {
        let record = |payload: Vec<u8>| {
            let mut builder = DataBatchBuilder::new();
            builder
                .push(&Record {
                    message_id: MessageId([3; 16]),
                    routing_key: b"user-1".to_vec(),
                    headers: Vec::new(),
                    payload: Payload::Inline(payload),
                    priority: 0,
                    not_before_ms: 0,
                    expiry_ms: 0,
                    enqueue_time_ms: 1,
                })
                .unwrap();
            let batch = builder.finish().unwrap();
            let view = spool_client::spool_wire::batch::BatchView::validate(&batch).unwrap();
            view.record_bytes(0).to_vec()
        };
        let messages = vec![
            (
                PartitionId(0),
                PeekedMessage {
                    offset: Offset(7),
                    state: MessageState::Ready,
                    attempt: 0,
                    record: record(b"hi".to_vec()),
                },
            ),
            (
                PartitionId(1),
                PeekedMessage {
                    offset: Offset(8),
                    state: MessageState::Claimed,
                    attempt: 2,
                    record: record(vec![0xff, 0x00]),
                },
            ),
        ];
        let output = render_peek(&messages);
        let table = output.table.clone().unwrap();
        assert_eq!(table.rows[0], ["0", "7", "ready", "0", "user-1", "hi"]);
        assert_eq!(table.rows[1], ["1", "8", "claimed", "2", "user-1", "0xff00"]);
        assert_eq!(output.json[1]["state"], "claimed");
    }
}
