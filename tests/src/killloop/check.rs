//! The loop's own requests to the broker, each retried while a restarted
//! broker settles: the full listing of every partition that the ledger's
//! live check reads, the witness claims held across a kill (their tokens
//! must be refused after it), and the final drain.

use std::collections::BTreeMap;
use std::time::Duration;

use spool_client::spool_wire::batch::{validate_record, BatchBytes, MessageId};
use spool_client::spool_wire::proto::{DeliveryToken, Generation, Offset, PartitionId, WorkerId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClaimOptions, Client, ClientError};

use super::ledger::{Instance, LiveEntry, Placement, TokenUse};
use super::rng::Rng;
use super::workers::Shared;
use super::{delivery_seen, now, unix_ms, KillLoopError, QUEUE};

/// Messages per peek or dead-letter page (the protocol's maximum).
const LIST_PAGE_MAX: u32 = spool_client::spool_wire::proto::limits::INSPECT_MESSAGES_MAX;

/// How long one orchestrator request keeps being retried while a restarted
/// broker settles: as long as the harness waits for a broker to start
/// ([`crate::START_TIMEOUT`], the broker's own start-up timeout plus a
/// margin). A broker replaying a large log after SIGKILL only starts
/// answering once replay is done (a 5 s budget ran out at kill 254 of a long
/// run); a broker that is truly stuck exits on its own start-up timeout and
/// still fails the run.
const ORCHESTRATOR_PATIENCE: Duration = crate::START_TIMEOUT;
const _: () = assert!(ORCHESTRATOR_PATIENCE.as_millis() >= crate::START_TIMEOUT.as_millis());
const _: () = assert!(crate::START_TIMEOUT.as_millis() > crate::BROKER_STARTUP_TIMEOUT_MS as u128);

/// Pause between orchestrator attempts.
const ORCHESTRATOR_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Deliveries a witness claim takes before each kill.
const WITNESS_CREDITS: u32 = 4;

/// Worker id of witness claims.
const WITNESS_WORKER: WorkerId = WorkerId(0x0057_17E5);

/// Lease of the drain's claims: longer than the drain.
const DRAIN_LEASE_MS: u32 = 60_000;

/// Long-poll wait of a drain claim.
const DRAIN_WAIT_MS: u32 = 100;

/// Worker id of the drain.
const DRAIN_WORKER: WorkerId = WorkerId(0x00D7_A1E5);

/// Most tokens one ack request carries in the drain.
const DRAIN_ACK_TOKENS_MAX: usize =
    spool_client::spool_wire::proto::limits::ACK_TOKENS_MAX as usize;

/// Runs `operation` until it succeeds, pausing [`ORCHESTRATOR_RETRY_PAUSE`]
/// between attempts, for up to [`ORCHESTRATOR_PATIENCE`]: right after a
/// restart a cached connection may still be the dead one, and the broker may
/// still be replaying its log.
pub(super) async fn retrying<T, F, Fut>(what: &str, operation: F) -> Result<T, KillLoopError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    retrying_for(what, ORCHESTRATOR_PATIENCE, operation).await
}

/// [`retrying`] with its patience as an argument (tests use a short one).
pub(super) async fn retrying_for<T, F, Fut>(
    what: &str,
    patience: Duration,
    mut operation: F,
) -> Result<T, KillLoopError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let started = now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last = match operation().await {
            Ok(value) => return Ok(value),
            Err(error) => error.to_string(),
        };
        let waited = started.elapsed();
        if waited >= patience {
            return Err(KillLoopError::Stuck(format!(
                "{what}: waited {:.1} s ({attempts} attempts, patience {:.1} s), last: {last}",
                waited.as_secs_f64(),
                patience.as_secs_f64()
            )));
        }
        tokio::time::sleep(ORCHESTRATOR_RETRY_PAUSE).await;
    }
}

/// The message id in archived record bytes (copied to an aligned buffer).
fn record_id(bytes: &[u8]) -> Result<MessageId, KillLoopError> {
    let mut aligned = BatchBytes::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    let record = validate_record(&aligned)
        .map_err(|error| KillLoopError::Protocol(format!("peeked record: {error}")))?;
    Ok(MessageId(record.message_id.0))
}

/// Every live message of every partition (main lane via peek, dead letters
/// via their listing), paged.
pub(super) async fn list_live(
    admin: &Admin,
    partitions: u32,
) -> Result<BTreeMap<Placement, LiveEntry>, KillLoopError> {
    let mut live = BTreeMap::new();
    for partition in (0..partitions).map(PartitionId) {
        let mut from = Offset(0);
        loop {
            let page =
                retrying("peek", || admin.peek(QUEUE, partition, from, LIST_PAGE_MAX)).await?;
            for message in &page {
                let entry = LiveEntry { id: Some(record_id(&message.record)?), dead_letter: false };
                live.insert(Placement::new(partition, message.offset), entry);
            }
            match page.last() {
                Some(last) if page.len() == LIST_PAGE_MAX as usize => {
                    from = Offset(last.offset.0 + 1)
                }
                _ => break,
            }
        }
        let mut from = Offset(0);
        loop {
            let page = retrying("dead letters", || {
                admin.dead_letters(QUEUE, partition, from, LIST_PAGE_MAX)
            })
            .await?;
            for letter in &page {
                let entry = LiveEntry { id: None, dead_letter: true };
                live.insert(Placement::new(partition, letter.original_offset), entry);
            }
            match page.last() {
                Some(last) if page.len() == LIST_PAGE_MAX as usize => {
                    from = Offset(last.original_offset.0 + 1);
                }
                _ => break,
            }
        }
    }
    Ok(live)
}

/// Claims held across a kill; acked after the restart, they must be refused.
pub(super) struct Witness {
    partition: PartitionId,
    lease_deadline_ms: u64,
    instance: Instance,
    held: Vec<(MessageId, Generation, Offset, DeliveryToken)>,
}

pub(super) async fn take_witness(
    shared: &Shared,
    client: &Client,
    rng: &mut Rng,
) -> Result<Option<Witness>, KillLoopError> {
    let config = &shared.config;
    let partition = PartitionId(rng.range(0, u64::from(config.partitions) - 1) as u32);
    let options = ClaimOptions {
        worker: WITNESS_WORKER,
        credits: WITNESS_CREDITS,
        max_bytes: 1 << 20,
        lease_ms: config.witness_lease_ms,
        wait_ms: 0,
        subscription: None,
    };
    let _gate = shared.gate.read().await;
    let instance = shared.instance();
    let claim_sent = shared.ledger().next_seq();
    // The broker is up here (nobody else kills it), so a failure is real.
    let batch = retrying("witness claim", || client.claim(QUEUE, partition, &options)).await?;
    shared.lease_deadline(batch.lease_deadline_ms);
    let mut ledger = shared.ledger();
    let mut held = Vec::new();
    for delivery in &batch.deliveries {
        ledger.delivered(delivery_seen(delivery, claim_sent));
        held.push((
            delivery.message_id(),
            delivery.generation(),
            delivery.offset(),
            delivery.token(),
        ));
    }
    Ok((!held.is_empty()).then_some(Witness {
        partition,
        lease_deadline_ms: batch.lease_deadline_ms,
        instance,
        held,
    }))
}

#[derive(Debug, Default)]
pub(super) struct WitnessTally {
    pub(super) tried: u64,
    pub(super) unexpired: u64,
    pub(super) refused: u64,
}

/// Acks the witness tokens on the restarted broker: each must be refused.
pub(super) async fn check_witness(
    shared: &Shared,
    client: &Client,
    witness: Witness,
    tally: &mut WitnessTally,
) -> Result<(), KillLoopError> {
    let tokens: Vec<DeliveryToken> = witness.held.iter().map(|held| held.3).collect();
    let sent = shared.instance();
    let unexpired = unix_ms() < witness.lease_deadline_ms;
    let codes = retrying("witness ack", || async {
        crate::ack_codes(client.ack(QUEUE, witness.partition, &tokens).await, tokens.len())
    })
    .await?;
    if codes.len() != tokens.len() {
        return Err(KillLoopError::Protocol("witness ack answered a wrong count".into()));
    }
    let mut ledger = shared.ledger();
    for (&(id, generation, offset, _), code) in witness.held.iter().zip(codes) {
        tally.tried += 1;
        tally.unexpired += u64::from(unexpired);
        if matches!(code, ErrorCode::StaleToken | ErrorCode::InvalidToken) {
            tally.refused += 1;
        } else if code == ErrorCode::None {
            // The ledger counts the stale token accepted (sent to a later
            // process than the one that issued it) and records the ack.
            ledger.ack_acknowledged(TokenUse {
                id,
                placement: Placement::new(witness.partition, offset),
                generation,
                token_instance: Some(witness.instance),
                sent_instance: sent,
            });
        }
    }
    Ok(())
}

/// Claims and acks everything live until the queue reports nothing ready,
/// scheduled, claimed or (ordered) waiting behind its key; returns how many were drained. Each pass claims
/// only from the partitions the queue reports as holding something, so a
/// wide queue is not walked partition by partition with a long poll each.
pub(super) async fn drain(
    shared: &Shared,
    client: &Client,
    admin: &Admin,
) -> Result<u64, KillLoopError> {
    let config = &shared.config;
    let started = now();
    let mut drained = 0u64;
    loop {
        let described = retrying("describe", || admin.describe_queue(QUEUE)).await?;
        let holding: Vec<PartitionId> = described
            .partitions
            .iter()
            .filter(|p| p.ready + p.scheduled + p.claimed + p.lanes.waiting > 0)
            .map(|p| p.partition)
            .collect();
        if holding.is_empty() && described.partitions.len() == config.partitions as usize {
            return Ok(drained);
        }
        if started.elapsed() >= config.drain_timeout {
            let remaining: u64 = described
                .partitions
                .iter()
                .map(|p| p.ready + p.scheduled + p.claimed + p.lanes.waiting)
                .sum();
            return Err(KillLoopError::Stuck(format!(
                "drain: {remaining} messages still live in {} partitions after {:?}",
                holding.len(),
                config.drain_timeout
            )));
        }
        if holding.is_empty() {
            // Not every partition was described yet: ask again shortly.
            tokio::time::sleep(ORCHESTRATOR_RETRY_PAUSE).await;
            continue;
        }
        for partition in holding {
            let options = ClaimOptions {
                worker: DRAIN_WORKER,
                credits: spool_client::spool_wire::proto::limits::CLAIM_CREDITS_MAX,
                max_bytes: 4 << 20,
                lease_ms: DRAIN_LEASE_MS,
                wait_ms: DRAIN_WAIT_MS,
                subscription: None,
            };
            let claim_sent = shared.ledger().next_seq();
            let batch =
                retrying("drain claim", || client.claim(QUEUE, partition, &options)).await?;
            drained += ack_drained(shared, client, partition, &batch.deliveries, claim_sent, false)
                .await?;
        }
    }
}

/// Records a drain claim's deliveries in the ledger of the default (or,
/// with `in_sub`, the second subscription), acks them, and records each
/// ack; every one must be accepted. Returns how many were acked.
pub(super) async fn ack_drained(
    shared: &Shared,
    client: &Client,
    partition: PartitionId,
    deliveries: &[spool_client::Delivery],
    claim_sent: super::ledger::Seq,
    in_sub: bool,
) -> Result<u64, KillLoopError> {
    {
        let mut ledger = shared.ledger_in(in_sub);
        for delivery in deliveries {
            ledger.delivered(delivery_seen(delivery, claim_sent));
        }
    }
    let mut acked = 0u64;
    for chunk in deliveries.chunks(DRAIN_ACK_TOKENS_MAX) {
        let tokens: Vec<DeliveryToken> = chunk.iter().map(|d| d.token()).collect();
        let codes = retrying("drain ack", || async {
            crate::ack_codes(client.ack(QUEUE, partition, &tokens).await, tokens.len())
        })
        .await?;
        let sent = shared.instance();
        let mut ledger = shared.ledger_in(in_sub);
        for (delivery, code) in chunk.iter().zip(codes) {
            if code != ErrorCode::None {
                return Err(KillLoopError::Protocol(format!(
                    "drain ack of offset {} refused: {}",
                    delivery.offset().0,
                    code.name()
                )));
            }
            acked += 1;
            ledger.ack_acknowledged(TokenUse {
                id: delivery.message_id(),
                placement: Placement::new(partition, delivery.offset()),
                generation: delivery.generation(),
                token_instance: Some(sent),
                sent_instance: sent,
            });
        }
    }
    Ok(acked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> ClientError {
        ClientError::Server { code: ErrorCode::ShuttingDown, message: "replaying".into() }
    }

    // Goal: an orchestrator request is retried for the whole patience, not a
    // fixed number of attempts, and the "stuck" error says how long it
    // waited and why. Method: an operation that always fails, a 300 ms
    // patience; the error comes no sooner, after several 50 ms pauses, and
    // names the wait, the attempts and the last error.
    #[tokio::test]
    async fn retrying_waits_out_its_patience_and_says_how_long() {
        let patience = Duration::from_millis(300);
        let started = now();
        let mut calls = 0u32;
        let result: Result<(), KillLoopError> = retrying_for("describe", patience, || {
            calls += 1;
            std::future::ready(Err(refused()))
        })
        .await;
        assert!(started.elapsed() >= patience, "gave up after {:?}", started.elapsed());
        assert!(calls >= 4, "{calls} attempts in {patience:?}");
        let Err(KillLoopError::Stuck(text)) = result else { panic!("{result:?}") };
        assert!(text.starts_with("describe: waited 0."), "{text}");
        assert!(text.contains(&format!("({calls} attempts, patience 0.3 s)")), "{text}");
        assert!(text.ends_with("last: SHUTTING_DOWN: replaying"), "{text}");
    }

    // Goal: a request that succeeds within the patience returns its value.
    // Method: fail twice, then answer; exactly three attempts are made.
    #[tokio::test]
    async fn retrying_returns_the_first_success() {
        let mut calls = 0u32;
        let result = retrying_for("peek", Duration::from_secs(5), || {
            calls += 1;
            std::future::ready(if calls < 3 { Err(refused()) } else { Ok(calls) })
        })
        .await;
        assert_eq!(result.unwrap(), 3);
        assert_eq!(calls, 3);
    }
}
