//! The second subscription of a kill-loop run
//! ([`KillLoopConfig::subscription`](super::KillLoopConfig::subscription)):
//! made before any load, consumed by its own workers into its own ledger,
//! and accounted for at the end.
//!
//! What its ledger checks during the run: no delivery after an
//! acknowledged ack, no token of a killed process accepted, one id per
//! placement and one generation per (epoch, generation) — the checks that
//! need no listing. The listing after each restart reads the default
//! subscription only (peek and the dead-letter listing name no
//! subscription); the second one's full accounting comes at the end: once
//! every lease ran out, [`drain`] claims and acks everything the
//! subscription still holds until the admin API counts nothing ready,
//! scheduled or claimed in it, then claims its dead letters, and the
//! ledger's live check runs on exactly those (nothing else is live in the
//! subscription then): every acknowledged enqueue must have been acked or
//! be a dead letter, and an ack whose answer a kill swallowed counts as
//! applied only because the message is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{ClaimOptions, Client};

use super::broker::blocking;
use super::check::{ack_drained, retrying};
use super::ledger::{LiveEntry, Placement};
use super::workers::Shared;
use super::{now, KillLoopError, QUEUE};
use crate::admin::{http, http_json};

/// How long the subscription may take to start in every partition.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two looks at the subscription's counts.
const POLL: Duration = Duration::from_millis(50);
/// Lease of the drain's claims: longer than the drain.
const DRAIN_LEASE_MS: u32 = 60_000;
/// Long-poll wait of a drain claim.
const DRAIN_WAIT_MS: u32 = 50;
/// Worker id of the subscription's drain.
const DRAIN_WORKER: WorkerId = WorkerId(0x00D7_A1E6);

/// The subscription's counts from the admin API: (partitions reporting it,
/// messages ready + scheduled + claimed).
async fn counts(admin_addr: &str, name: &str) -> Result<(u64, u64), KillLoopError> {
    let (addr, path) = (admin_addr.to_owned(), format!("/v1/queues/{QUEUE}/subscriptions/{name}"));
    let answer = blocking(move || http(&addr, "GET", &path)).await;
    if answer.status != 200 {
        return Err(KillLoopError::Protocol(format!(
            "describe subscription {name}: {} {}",
            answer.status, answer.body
        )));
    }
    let row = answer.json();
    let field = |name: &str| row[name].as_u64().unwrap_or(0);
    Ok((field("partitions_reporting"), field("ready") + field("scheduled") + field("claimed")))
}

/// The subscription's dead letters, from the admin API.
async fn dead_letters(admin_addr: &str, name: &str) -> Result<u64, KillLoopError> {
    let (addr, path) = (admin_addr.to_owned(), format!("/v1/queues/{QUEUE}/subscriptions/{name}"));
    let answer = blocking(move || http(&addr, "GET", &path)).await;
    answer.json()["dead_letters"].as_u64().ok_or_else(|| {
        KillLoopError::Protocol(format!("describe subscription {name}: {}", answer.body))
    })
}

/// Creates subscription `name` (from the earliest record) and waits until
/// every partition's log has started it, so it sees every later enqueue.
pub(super) async fn create(
    admin_addr: &str,
    name: &str,
    partitions: u32,
) -> Result<(), KillLoopError> {
    let (addr, path) = (admin_addr.to_owned(), format!("/v1/queues/{QUEUE}/subscriptions"));
    let body = serde_json::json!({ "name": name, "from": "earliest" });
    let answer = blocking(move || http_json(&addr, "POST", &path, &body)).await;
    if answer.status != 201 {
        return Err(KillLoopError::Setup(format!(
            "create subscription {name}: {} {}",
            answer.status, answer.body
        )));
    }
    let started = now();
    while counts(admin_addr, name).await?.0 < u64::from(partitions) {
        if started.elapsed() >= START_TIMEOUT {
            return Err(KillLoopError::Setup(format!(
                "subscription {name} not started in every partition after {START_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Claims and acks everything the subscription holds (every lease has run
/// out), then checks its ledger against its dead letters (see the module
/// doc); returns (messages drained, dead letters).
pub(super) async fn drain(
    shared: &Shared,
    client: &Client,
    admin_addr: &str,
    name: &str,
) -> Result<(u64, u64), KillLoopError> {
    let config = &shared.config;
    let draining = ClaimOptions {
        worker: DRAIN_WORKER,
        credits: spool_client::spool_wire::proto::limits::CLAIM_CREDITS_MAX,
        max_bytes: 4 << 20,
        lease_ms: DRAIN_LEASE_MS,
        wait_ms: DRAIN_WAIT_MS,
        subscription: shared.subscription.clone(),
    };
    let started = now();
    let mut drained = 0u64;
    loop {
        let (reporting, holding) = counts(admin_addr, name).await?;
        if holding == 0 && reporting == u64::from(config.partitions) {
            break;
        }
        if started.elapsed() >= config.drain_timeout {
            return Err(KillLoopError::Stuck(format!(
                "drain of subscription {name}: {holding} messages still live after {:?}",
                config.drain_timeout
            )));
        }
        for partition in (0..config.partitions).map(PartitionId) {
            let claim_sent = shared.ledger_in(true).next_seq();
            let batch =
                retrying("subscription drain claim", || client.claim(QUEUE, partition, &draining))
                    .await?;
            drained +=
                ack_drained(shared, client, partition, &batch.deliveries, claim_sent, true).await?;
        }
    }
    // Its dead letters, claimed (not acked) from each partition's
    // dead-letter lane in the subscription (`<queue>.dlq`): with nothing
    // else held in it, they are all it still has, and the admin API's count
    // must agree.
    let listing = ClaimOptions { wait_ms: 0, ..draining.clone() };
    let dead_lane = format!("{QUEUE}.dlq");
    let mut live = BTreeMap::new();
    for partition in (0..config.partitions).map(PartitionId) {
        loop {
            let batch = retrying("subscription dead letters", || {
                client.claim(&dead_lane, partition, &listing)
            })
            .await?;
            if batch.deliveries.is_empty() {
                break;
            }
            for delivery in &batch.deliveries {
                let entry = LiveEntry { id: Some(delivery.message_id()), dead_letter: true };
                live.insert(Placement::new(partition, delivery.offset()), entry);
            }
        }
    }
    let dead = dead_letters(admin_addr, name).await?;
    if dead != live.len() as u64 {
        return Err(KillLoopError::Protocol(format!(
            "subscription {name}: {} dead letters claimed, the admin API counts {dead}",
            live.len()
        )));
    }
    let mut ledger = shared.ledger_in(true);
    ledger.live_check(&live);
    ledger.final_check(&live.keys().copied().collect());
    Ok((drained, dead))
}
