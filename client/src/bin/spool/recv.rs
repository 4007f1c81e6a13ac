//! `spool recv`: claims up to `-n` messages from any partition (for the
//! queue's default subscription, or the one `--sub` names), acks them
//! (or with `--no-ack` releases them) one partition at a time, and prints
//! each delivery once the broker answered for it, with the outcome.
//!
//! It must not print a delivery as acked before the broker said so: a
//! partition whose ack failed prints no rows, a refused token prints its
//! code.

use serde_json::{json, Value};
use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::PartitionId;
use spool_client::{ClaimOptions, Client, ClientError, Delivery, PayloadView};

use crate::args::RecvArgs;
use crate::render::{escape, show_bytes, Printer, StreamTable};
use crate::Failure;

/// Claims up to `count` messages from any partition, waiting at most
/// `--wait-ms` in all, then acks (or with --no-ack releases) them one
/// partition at a time, printing each delivery once the broker answered for
/// it.
pub async fn run(client: &Client, recv: &RecvArgs, json: bool) -> Result<(), Failure> {
    let mut options = ClaimOptions::new(recv.count).lease_ms(recv.lease_ms).wait_ms(recv.wait_ms);
    if let Some(sub) = &recv.sub {
        options = options.subscription(sub.as_str());
    }
    let received = client.claim_any(&recv.queue, &options).await?;
    let rows: Vec<Vec<String>> = received
        .iter()
        .map(|delivery| {
            delivery_cells(delivery, "").into_iter().map(|cell| escape(&cell)).collect()
        })
        .collect();
    let table = StreamTable::fitting(DELIVERY_HEADERS.to_vec(), &rows);
    let mut out = Printer::new(json);
    out.header(&table);
    out.flush()?;
    let mut first_failure: Option<Failure> = None;
    let mut groups: Vec<(PartitionId, Vec<&Delivery>)> = Vec::new();
    for delivery in &received {
        match groups.iter_mut().find(|(partition, _)| *partition == delivery.partition()) {
            Some((_, group)) => group.push(delivery),
            None => groups.push((delivery.partition(), vec![delivery])),
        }
    }
    for (partition, group) in groups {
        let outcomes: Vec<String> = if recv.no_ack {
            let mut outcomes = Vec::new();
            for delivery in &group {
                let reason = "released by spool recv --no-ack";
                match client.release(&recv.queue, partition, delivery.token(), 0, reason).await {
                    Ok(_) => outcomes.push("released".to_owned()),
                    Err(error) => {
                        outcomes.push(error.code().map_or("failed", |code| code.name()).to_owned());
                        first_failure.get_or_insert(Failure::Client(error));
                    }
                }
            }
            outcomes
        } else {
            let tokens: Vec<_> = group.iter().map(|delivery| delivery.token()).collect();
            match client.ack(&recv.queue, partition, &tokens).await {
                Ok(()) => vec!["acked".to_owned(); group.len()],
                Err(ClientError::AckRefused { refused, tokens }) => {
                    let mut outcomes = vec!["acked".to_owned(); group.len()];
                    for refused in &refused {
                        if let Some(outcome) = outcomes.get_mut(refused.index) {
                            refused.code.name().clone_into(outcome);
                        }
                    }
                    first_failure.get_or_insert(Failure::Client(ClientError::AckRefused {
                        refused,
                        tokens,
                    }));
                    outcomes
                }
                Err(error) => {
                    // Nothing of this partition is known to be acked: no rows.
                    first_failure.get_or_insert(Failure::Client(error));
                    continue;
                }
            }
        };
        for (delivery, outcome) in group.iter().zip(&outcomes) {
            out.row(&table, &delivery_cells(delivery, outcome), &delivery_json(delivery, outcome));
        }
        out.flush()?;
    }
    match first_failure {
        None => Ok(()),
        Some(failure) => Err(failure),
    }
}

/// Text for a payload: inline bytes as text (or hex), a reference by location.
fn payload_text(payload: PayloadView<'_>) -> String {
    match payload {
        PayloadView::Inline(bytes) => show_bytes(bytes),
        PayloadView::Reference { location, len_bytes, .. } => {
            format!("<ref {location} {len_bytes} bytes>")
        }
    }
}

fn message_id_hex(id: MessageId) -> String {
    id.0.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Columns of a delivery row (`recv`).
const DELIVERY_HEADERS: [&str; 6] = ["partition", "offset", "attempt", "key", "payload", "result"];

fn delivery_cells(delivery: &Delivery, outcome: &str) -> Vec<String> {
    vec![
        delivery.partition().0.to_string(),
        delivery.offset().0.to_string(),
        delivery.attempt().to_string(),
        show_bytes(delivery.routing_key()),
        payload_text(delivery.payload()),
        outcome.to_owned(),
    ]
}

fn delivery_json(delivery: &Delivery, outcome: &str) -> Value {
    json!({
        "partition": delivery.partition().0,
        "offset": delivery.offset().0,
        "attempt": delivery.attempt(),
        "generation": delivery.generation().0,
        "message_id": message_id_hex(delivery.message_id()),
        "key": show_bytes(delivery.routing_key()),
        "payload": payload_text(delivery.payload()),
        "result": outcome,
    })
}
