//! `spool recv`: claims up to `-n` messages from any partition (for the
//! queue's default subscription, or the one `--sub` names), acks them
//! (or with `--no-ack` releases them) one partition at a time, and prints
//! each delivery once the broker answered for it, with the outcome.
//!
//! With `--session-timeout-ms` it claims in a consumer session on each
//! shard (closed once everything is settled); `--hold-ms` holds the claims
//! before settling them.
//!
//! It must not print a delivery as acked before the broker said so: a
//! partition whose ack failed prints no rows, a refused token prints its
//! code.

use serde_json::{json, Value};
use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::PartitionId;
use spool_client::{ClaimOptions, Client, ClientError, Delivery, PayloadView, Session};

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
    let sessions = open_sessions(client, recv).await?;
    let received = client.claim_any(&recv.queue, &options).await?;
    if recv.hold_ms > 0 {
        // Said before the wait, so a caller knows the claims are held.
        eprintln!("holding {} claims for {} ms", received.len(), recv.hold_ms);
        hold(&sessions, recv.hold_ms).await;
    }
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
    for session in &sessions {
        // Everything is settled: nothing for the close to release.
        let _ = session.close().await;
    }
    match first_failure {
        None => Ok(()),
        Some(failure) => Err(failure),
    }
}

/// With `--session-timeout-ms`, a session on every shard that leads
/// partitions of the queue, before anything is claimed there.
async fn open_sessions(client: &Client, recv: &RecvArgs) -> Result<Vec<Session>, Failure> {
    let Some(timeout_ms) = recv.session_timeout_ms else { return Ok(Vec::new()) };
    let member = recv.member.clone().unwrap_or_else(|| format!("recv-{}", std::process::id()));
    let mut sessions = Vec::new();
    for &via in client.claim_targets(&recv.queue).await?.iter() {
        let sub = recv.sub.as_deref();
        sessions.push(client.open_session(&recv.queue, via, sub, &member, timeout_ms).await?);
    }
    Ok(sessions)
}

/// Waits `hold_ms`, heartbeating the sessions every third of their
/// timeout meanwhile.
async fn hold(sessions: &[Session], hold_ms: u64) {
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(hold_ms);
    let every = sessions
        .iter()
        .map(|session| u64::from(session.timeout_ms().div_ceil(3)))
        .min()
        .map_or(std::time::Duration::from_millis(hold_ms), std::time::Duration::from_millis);
    loop {
        let next = (tokio::time::Instant::now() + every).min(until);
        tokio::time::sleep_until(next).await;
        if next >= until {
            return;
        }
        for session in sessions {
            if let Err(error) = session.heartbeat().await {
                tracing::warn!(session = session.id(), %error, "session heartbeat refused");
            }
        }
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
