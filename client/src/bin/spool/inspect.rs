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
use spool_client::limits::PEEK_PAGE_MESSAGES_MAX;
use spool_client::spool_wire::batch::{validate_record, BatchBytes};
use spool_client::spool_wire::proto::{
    KeyMapStats, Offset, PartitionId, PeekedMessage, RedriveTarget,
};
use spool_client::{partition_for_key, Admin, Client};

use crate::args::{DlqCommand, PeekArgs, PeekKeyArgs, PurgeArgs};
use crate::render::{show_bytes, Output, Table};
use crate::{confirm, Failure};

/// `spool peek`: messages from an offset on, in every partition asked for,
/// without claiming them; with `--key`, one routing key's lane
/// ([`peek_key`]).
pub async fn peek(client: &Client, admin: &Admin, args: &PeekKeyArgs) -> Result<Output, Failure> {
    let peek = &args.peek;
    if let Some(key) = &args.key {
        return peek_key(admin, peek, key.as_bytes(), args.scan).await;
    }
    let mut rows = Vec::new();
    for partition in partitions_of(client, &peek.queue, peek.partition).await? {
        let messages = admin
            .peek_in(&peek.queue, sub_of(&peek.sub), partition, Offset(peek.from), peek.count)
            .await?;
        rows.extend(messages.into_iter().map(|message| (partition, message)));
    }
    Ok(render_peek(&rows))
}

/// How far `spool peek --key` read one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scan {
    partition: PartitionId,
    /// Live messages read (the key's and the others').
    scanned: u32,
    /// Whether it read to the partition's last live message.
    complete: bool,
    /// Where a further look would start (`--from`).
    next: Offset,
}

/// `spool peek --key`: the messages of one routing key, in offset order
/// with their state, found client-side over the Peek API: the CLI reads
/// the partition the key routes to (during a resize also the draining
/// partition it routed to before, first: its messages there are older)
/// in pages from `--from`, keeps the key's, and stops at the partition's
/// end, after `--count` of the key's, or after `scan` messages read,
/// saying which. No wire field: a key's lane lives in one partition, and
/// a bounded scan keeps the broker's side an ordinary Peek.
async fn peek_key(
    admin: &Admin,
    args: &PeekArgs,
    key: &[u8],
    scan: u32,
) -> Result<Output, Failure> {
    if key.is_empty() {
        return Err(Failure::Input("--key: an empty routing key has no lane".to_owned()));
    }
    let partitions = match args.partition {
        Some(partition) => vec![PartitionId(partition)],
        None => key_partitions(admin, &args.queue, key).await?,
    };
    let sub = sub_of(&args.sub);
    let mut rows = Vec::new();
    let mut scans = Vec::new();
    for partition in partitions {
        let mut at = Scan { partition, scanned: 0, complete: false, next: Offset(args.from) };
        'pages: while at.scanned < scan {
            let ask = (scan - at.scanned).min(PEEK_PAGE_MESSAGES_MAX);
            let page = admin.peek_in(&args.queue, sub, partition, at.next, ask).await?;
            if page.is_empty() {
                at.complete = true;
                break;
            }
            for message in page {
                if at.scanned >= scan {
                    break 'pages;
                }
                at.scanned += 1;
                at.next = Offset(message.offset.0 + 1);
                if record_key(&message.record).as_deref() == Some(key) {
                    rows.push((partition, message));
                    if rows.len() >= args.count as usize {
                        break 'pages;
                    }
                }
            }
        }
        scans.push(at);
        if rows.len() >= args.count as usize {
            break;
        }
    }
    let mut output = render_peek(&rows);
    output.message = Some(scan_text(key, &scans, rows.len()));
    output.json = json!({
        "queue": args.queue,
        "key": show_bytes(key),
        "messages": output.json,
        "scans": scans.iter().map(|at| json!({
            "partition": at.partition.0,
            "scanned": at.scanned,
            "complete": at.complete,
            "next_offset": at.next.0,
        })).collect::<Vec<_>>(),
    });
    Ok(output)
}

/// The partitions that may hold `key`'s messages, oldest first: the one it
/// routes to now, after the one it routed to before the last resize if
/// that one is still draining.
async fn key_partitions(
    admin: &Admin,
    queue: &str,
    key: &[u8],
) -> Result<Vec<PartitionId>, Failure> {
    let described = admin.describe_queue(queue).await?;
    Ok(routed(key, described.config.partitions, &described.keys))
}

/// [`key_partitions`] from the queue's partition count and key map.
fn routed(key: &[u8], count: u32, keys: &KeyMapStats) -> Vec<PartitionId> {
    let now = partition_for_key(key, count);
    let mut partitions = Vec::new();
    if (1..count).contains(&keys.held_from) {
        let before = partition_for_key(key, keys.held_from);
        if before != now && keys.draining.contains(&before) {
            partitions.push(before);
        }
    }
    partitions.push(now);
    partitions
}

/// What `spool peek --key` read, for the text output.
fn scan_text(key: &[u8], scans: &[Scan], found: usize) -> String {
    let read: Vec<String> = scans
        .iter()
        .map(|at| {
            let end = if at.complete {
                "to its end".to_owned()
            } else {
                format!("stopped: more from --from {}", at.next.0)
            };
            format!("partition {}: read {} messages, {end}", at.partition.0, at.scanned)
        })
        .collect();
    format!("key {}: {found} messages; {}", show_bytes(key), read.join("; "))
}

/// The routing key of an archived record (`None` when it does not
/// validate).
fn record_key(record: &[u8]) -> Option<Vec<u8>> {
    // Peeked records arrive as plain bytes; rkyv needs them 8-aligned.
    let mut aligned = BatchBytes::with_capacity(record.len());
    aligned.extend_from_slice(record);
    validate_record(&aligned).ok().map(|record| record.routing_key.to_vec())
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

    // Goal: `peek --key` reads the partition a key routes to, and during a
    // resize first the draining one it routed to before (not one that is
    // done draining, nor the same one twice). Method: route keys over a
    // queue grown from 2 to 4 partitions.
    #[test]
    fn key_routes_to_its_partitions() {
        let grown = KeyMapStats { version: 2, draining: vec![PartitionId(0)], held_from: 2 };
        let steady = KeyMapStats { version: 1, draining: Vec::new(), held_from: 4 };
        let mut moved = 0;
        for n in 0..64 {
            let key = format!("k{n}");
            let (before, now) =
                (partition_for_key(key.as_bytes(), 2), partition_for_key(key.as_bytes(), 4));
            assert_eq!(routed(key.as_bytes(), 4, &steady), vec![now]);
            let expected = if before != now && before == PartitionId(0) {
                moved += 1;
                vec![before, now]
            } else {
                vec![now]
            };
            assert_eq!(routed(key.as_bytes(), 4, &grown), expected, "{key}");
        }
        assert!(moved > 0);
    }

    // Goal: the text says how far each partition was read and where to go
    // on. Method: render two scans.
    #[test]
    fn scan_text_says_how_far() {
        let scans = [
            Scan { partition: PartitionId(1), scanned: 7, complete: true, next: Offset(9) },
            Scan { partition: PartitionId(2), scanned: 5, complete: false, next: Offset(40) },
        ];
        assert_eq!(
            scan_text(b"user-1", &scans, 3),
            "key user-1: 3 messages; partition 1: read 7 messages, to its end; partition 2: \
             read 5 messages, stopped: more from --from 40"
        );
    }

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
