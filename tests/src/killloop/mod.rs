//! The kill loop: SIGKILL a real `spoold` again and again under mixed load
//! and prove that nothing the broker acknowledged is lost or undone.
//!
//! Owns the run ([`run`]): start a broker ([`Spoold`]), create a queue, start
//! producers and consumers ([`workers`]), and at seeded random moments kill
//! the broker with SIGKILL, restart it on the same directory and ports, and
//! check the queue against the [`ledger`] before the load resumes. At the
//! end it stops the load, waits for every lease to run out, checks again,
//! drains the queue (claim and ack everything) and accounts for every
//! acknowledged enqueue. The result is a [`KillLoopReport`].
//!
//! What is checked (violation counters in [`Violations`]):
//! 1. every acknowledged enqueue is live, acked, or a dead letter — after
//!    each restart (a full listing of every partition) and at the end;
//! 2. no message whose ack was acknowledged is delivered again or is live;
//! 3. no token issued by a killed process is accepted by a later one (the
//!    workers' own acks/releases/extends across a kill, plus witness claims
//!    with leases long enough to outlive the restart, acked after it);
//! 4. one message id, one placement; one placement, one id (dedupe and
//!    offsets hold across restarts; producers resend the same batch bytes
//!    until answered);
//! 5. dead letters name acknowledged enqueues.
//!
//! Requests in flight at a kill have unknown outcome: they are never counted
//! as acknowledged. Unknown acks are resolved by the next full listing.
//!
//! Failpoint mode ([`KillLoopConfig::failpoints`]): instead of a SIGKILL at
//! a random moment, each cycle SIGKILLs the broker, restarts it with one
//! failpoint armed to abort (a `spoold-failpoints` build), lets the load
//! (plus a bulk queue that forces segment rolls) run until the process
//! aborts itself — at start-up, under load, or during the SIGTERM drain the
//! loop sends if it did not — then restarts it clean and checks as after a
//! kill. [`KillLoopReport::failpoints`] says where each point fired.
//!
//! It does not reproduce a run exactly: the seed fixes every choice (batch
//! sizes, actions, kill intervals) but not how the choices interleave with a
//! real process on a real clock. It does not edit the harness; it only uses
//! [`Spoold`].

pub mod ledger;
pub mod rng;
pub mod workers;

use std::collections::{BTreeMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spool_client::spool_wire::batch::{validate_record, BatchBytes, MessageId};
use spool_client::spool_wire::proto::{
    DeliveryToken, Generation, Offset, PartitionId, QueueConfig, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClaimOptions, Client, ClientError};

use crate::{test_queue_config, Spoold, SpooldOptions, FAILPOINTS_ENV, STOP_TIMEOUT};
use ledger::{Activity, DeliverySeen, Instance, LiveEntry, Placement, TokenUse, Violations};
use rng::Rng;
use workers::Shared;

/// Name of the queue the loop runs on.
pub const QUEUE: &str = "killloop";

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

/// Lease of the drain's claims: longer than the drain.
const DRAIN_LEASE_MS: u32 = 60_000;

/// Long-poll wait of a drain claim.
const DRAIN_WAIT_MS: u32 = 100;

/// Longest wait for a killed broker's ports to become bindable.
const PORT_FREE_TIMEOUT: Duration = Duration::from_secs(10);

/// Lines of the broker log printed when a run fails.
const LOG_TAIL_LINES: usize = 200;

/// Worker id of witness claims.
const WITNESS_WORKER: WorkerId = WorkerId(0x0057_17E5);

/// Queue of the bulk load in failpoint mode (1 partition, large records, so
/// its segments roll and, once acked, are deleted at the next checkpoint).
pub const BULK_QUEUE: &str = "killloop-bulk";

/// Payload of a bulk record: 128 of them fill an 8 MiB test segment.
const BULK_PAYLOAD_BYTES: usize = 64 * 1024;

/// Lease of bulk claims (the bulk queue's lease minimum is 50 ms).
const BULK_LEASE_MS: u32 = 500;

/// Records per bulk enqueue batch.
const BULK_BATCH: u64 = 16;

/// How long an armed broker runs under load before the loop sends SIGTERM
/// (points on the close path fire only then).
const ARMED_LOAD_WAIT: Duration = Duration::from_secs(3);

/// Worker id of the drain.
const DRAIN_WORKER: WorkerId = WorkerId(0x00D7_A1E5);

/// Most tokens one ack request carries in the drain.
const DRAIN_ACK_TOKENS_MAX: usize =
    spool_client::spool_wire::proto::limits::ACK_TOKENS_MAX as usize;

/// Wall-clock now (see [`crate::now`]).
/// The leader epoch a delivery token names (bytes 24..32, little-endian;
/// `docs/design/queue-semantics.md`, "Delivery token").
pub(crate) fn token_epoch(token: &DeliveryToken) -> u64 {
    let mut epoch = [0u8; 8];
    epoch.copy_from_slice(&token.0[24..32]);
    u64::from_le_bytes(epoch)
}

pub fn now() -> Instant {
    crate::now()
}

/// Unix ms now, comparable with the broker's lease deadlines (same host).
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// Why a run could not finish (violations are not errors: they are in the
/// report).
#[derive(Debug)]
#[non_exhaustive]
pub enum KillLoopError {
    /// A setting is out of range.
    Config(String),
    /// The queue or a batch could not be set up.
    Setup(String),
    /// The broker answered something that does not fit the request.
    Protocol(String),
    /// A request kept failing after a restart, or the drain did not finish.
    Stuck(String),
    /// A worker task panicked or was cancelled.
    Worker(String),
}

impl std::fmt::Display for KillLoopError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(text) => write!(formatter, "invalid configuration: {text}"),
            Self::Setup(text) => write!(formatter, "setup failed: {text}"),
            Self::Protocol(text) => write!(formatter, "protocol: {text}"),
            Self::Stuck(text) => write!(formatter, "stuck: {text}"),
            Self::Worker(text) => write!(formatter, "worker failed: {text}"),
        }
    }
}

impl std::error::Error for KillLoopError {}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct KillLoopConfig {
    /// Kills (and restarts) to perform.
    pub kills: u32,
    /// Seed of every random choice.
    pub seed: u64,
    /// Broker shards (`--cores`).
    pub cores: u16,
    /// Partitions of the queue.
    pub partitions: u32,
    /// Priority bands of the queue; records use all of them.
    pub priority_bands: u8,
    /// Producer tasks.
    pub producers: u32,
    /// Consumer tasks.
    pub consumers: u32,
    /// Shortest time between a restart and the next kill.
    pub kill_interval_ms_min: u64,
    /// Longest time between a restart and the next kill.
    pub kill_interval_ms_max: u64,
    /// Lease of the consumers' claims (also the queue's default).
    pub lease_ms: u32,
    /// Lease of witness claims: must outlive a restart so their refusal
    /// after it is due to the kill, not to expiry.
    pub witness_lease_ms: u32,
    /// Producers pause while this many acknowledged enqueues are unacked.
    pub backlog_max: usize,
    /// Most records per enqueue batch.
    pub batch_records_max: u32,
    /// Most credits per consumer claim.
    pub claim_credits_max: u32,
    /// Usual longest handler time (some handlers outlive the lease anyway).
    pub hold_ms_max: u64,
    /// Longest delay of a release.
    pub release_delay_ms_max: u64,
    /// Share of records enqueued with a `not_before`, in percent.
    pub scheduled_percent: u64,
    /// Longest `not_before` delay of a scheduled record.
    pub schedule_delay_ms_max: u64,
    /// `max_deliveries` of the queue: high, so nothing is quarantined unless
    /// something is wrong (dead letters are accounted for anyway).
    pub max_deliveries: u32,
    /// How long the final drain may take.
    pub drain_timeout: Duration,
    /// Print a line per kill on stderr.
    pub progress: bool,
    /// Failpoint mode: one armed point per cycle instead of a plain kill
    /// (then `kills` must equal its length). Empty: plain SIGKILLs.
    pub failpoints: Vec<FailpointArm>,
    /// The `spoold` binary (a failpoint build); `None`: the ordinary one.
    pub spoold_bin: Option<PathBuf>,
}

/// One failpoint armed for one cycle: `point=abort@from_hit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointArm {
    /// A name of `spool_broker::failpoint::POINTS`.
    pub point: String,
    /// Fires from this hit on (1-based).
    pub from_hit: u64,
}

/// Where an armed failpoint fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiredAt {
    /// While the broker was starting (recovery, epoch bump, preparing).
    Startup,
    /// While serving the load.
    Load,
    /// During the SIGTERM drain (final checkpoint, retention).
    Close,
    /// Not reached: the broker started, served and stopped cleanly.
    Missed,
}

/// What one failpoint cycle saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointOutcome {
    /// The point.
    pub point: String,
    /// Where it fired.
    pub fired_at: FiredAt,
}

impl KillLoopConfig {
    /// Settings for a long run: kills every 0.5–2 s, a 2 s lease.
    pub fn new(kills: u32, seed: u64) -> Self {
        Self {
            kills,
            seed,
            cores: 2,
            partitions: 4,
            priority_bands: 4,
            producers: 2,
            consumers: 3,
            kill_interval_ms_min: 500,
            kill_interval_ms_max: 2_000,
            lease_ms: 2_000,
            witness_lease_ms: 15_000,
            backlog_max: 4_000,
            batch_records_max: 32,
            claim_credits_max: 32,
            hold_ms_max: 300,
            release_delay_ms_max: 1_000,
            scheduled_percent: 15,
            schedule_delay_ms_max: 2_000,
            max_deliveries: 10_000,
            drain_timeout: Duration::from_secs(120),
            progress: false,
            failpoints: Vec::new(),
            spoold_bin: None,
        }
    }

    /// Settings for a quick run in a debug build (the test): kills every
    /// 0.1–0.4 s, a smaller load, shorter delays.
    pub fn quick(kills: u32, seed: u64) -> Self {
        Self {
            kill_interval_ms_min: 100,
            kill_interval_ms_max: 400,
            witness_lease_ms: 8_000,
            backlog_max: 1_000,
            batch_records_max: 16,
            claim_credits_max: 16,
            hold_ms_max: 150,
            release_delay_ms_max: 500,
            schedule_delay_ms_max: 1_000,
            drain_timeout: Duration::from_secs(60),
            ..Self::new(kills, seed)
        }
    }

    /// Checks ranges the loop relies on.
    ///
    /// # Errors
    /// [`KillLoopError::Config`] naming the bad setting.
    pub fn validate(&self) -> Result<(), KillLoopError> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(KillLoopError::Config(what.to_owned()))
            }
        };
        check(self.cores >= 1, "cores must be at least 1")?;
        check(self.partitions >= 1, "partitions must be at least 1")?;
        check(
            (1..=spool_client::spool_wire::limits::PRIORITY_BANDS_MAX)
                .contains(&self.priority_bands),
            "priority_bands out of range",
        )?;
        check(self.producers >= 1 && self.consumers >= 1, "need producers and consumers")?;
        check(self.kill_interval_ms_min <= self.kill_interval_ms_max, "kill interval min > max")?;
        check(self.lease_ms >= 50, "lease_ms below the queue's 50 ms minimum")?;
        check(
            self.witness_lease_ms > self.lease_ms && self.witness_lease_ms <= 60_000,
            "witness_lease_ms must be above lease_ms and at most 60 s",
        )?;
        check(self.batch_records_max >= 1, "batch_records_max must be at least 1")?;
        check(
            (1..=workers::CONSUMER_HANDLERS_MAX as u32).contains(&self.claim_credits_max),
            "claim_credits_max out of range",
        )?;
        check(self.schedule_delay_ms_max >= 50, "schedule_delay_ms_max below 50")?;
        check(
            self.failpoints.is_empty() || self.failpoints.len() == self.kills as usize,
            "failpoint mode needs one failpoint per kill",
        )?;
        check(
            self.failpoints.is_empty() || self.spoold_bin.is_some(),
            "failpoint mode needs a failpoint build of spoold (spoold_bin)",
        )?;
        check(self.backlog_max >= 1, "backlog_max must be at least 1")
    }

    fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            priority_bands: self.priority_bands,
            ..test_queue_config(self.partitions, self.lease_ms, self.max_deliveries)
        }
    }
}

/// What a run saw. [`violations`](Self::violations) must be all zero.
#[derive(Debug, Clone)]
pub struct KillLoopReport {
    /// The seed.
    pub seed: u64,
    /// Kills performed (each followed by a restart and a check).
    pub kills: u32,
    /// Wall time of the whole run.
    pub duration_s: f64,
    /// Acknowledged enqueues accounted for at the end.
    pub acked_enqueues_checked: u64,
    /// Acks acknowledged (workers and drain).
    pub acks_acknowledged: u64,
    /// Messages the final drain claimed and acked.
    pub drained: u64,
    /// Dead letters at the end.
    pub dead_letters: u64,
    /// Witness tokens tried after a restart.
    pub witness_tokens_tried: u64,
    /// Of those, tried while their lease had not yet run out.
    pub witness_tokens_unexpired: u64,
    /// Of those, refused with `STALE_TOKEN` or `INVALID_TOKEN`.
    pub witness_tokens_refused: u64,
    /// Restarts that had to wait for the killed broker's ports to be
    /// bindable again (see `wait_ports_free`).
    pub port_waits: u64,
    /// Restart time (kill to every shard accepting), median and maximum.
    pub restart_ms_p50: u64,
    /// See [`restart_ms_p50`](Self::restart_ms_p50).
    pub restart_ms_max: u64,
    /// Violation counts.
    pub violations: Violations,
    /// Activity counters of the ledger.
    pub activity: Activity,
    /// Enqueue resends after an unanswered request.
    pub enqueue_retries: u64,
    /// Records refused for good.
    pub enqueue_rejected: u64,
    /// Worker acks refused as stale or invalid (lease ran out or a kill).
    pub acks_refused: u64,
    /// Worker acks refused with another code.
    pub acks_refused_other: u64,
    /// Releases and extends answered with success.
    pub releases: u64,
    /// See [`releases`](Self::releases).
    pub extends: u64,
    /// Deliveries left to expire on purpose.
    pub abandoned: u64,
    /// Examples of violations.
    pub samples: Vec<String>,
    /// Failpoint mode: where each armed point fired.
    pub failpoints: Vec<FailpointOutcome>,
}

impl KillLoopReport {
    /// Sum of all violation counts.
    pub fn violations_total(&self) -> u64 {
        self.violations.total()
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let v = &self.violations;
        let a = &self.activity;
        serde_json::json!({
            "seed": self.seed,
            "kills": self.kills,
            "duration_s": (self.duration_s * 10.0).round() / 10.0,
            "acked_enqueues_checked": self.acked_enqueues_checked,
            "acks_acknowledged": self.acks_acknowledged,
            "deliveries": a.deliveries,
            "drained": self.drained,
            "dead_letters": self.dead_letters,
            "lost": v.lost,
            "redelivered_after_ack": v.redelivered_after_ack,
            "acked_but_live": v.acked_but_live,
            "stale_tokens_accepted": v.stale_tokens_accepted,
            "dedupe_conflicts": v.dedupe_conflicts,
            "offset_conflicts": v.offset_conflicts,
            "generation_reused": v.generation_reused,
            "phantom_deliveries": v.phantom_deliveries,
            "dead_letters_unaccounted": v.dead_letters_unaccounted,
            "violations_total": v.total(),
            "witness_tokens_tried": self.witness_tokens_tried,
            "witness_tokens_unexpired": self.witness_tokens_unexpired,
            "witness_tokens_refused": self.witness_tokens_refused,
            "live_checks": a.live_checks,
            "ack_unknown_applied": a.ack_unknown_applied,
            "ack_unknown_not_applied": a.ack_unknown_not_applied,
            "duplicates_answered": a.duplicates_answered,
            "enqueue_retries": self.enqueue_retries,
            "enqueue_rejected": self.enqueue_rejected,
            "acks_refused": self.acks_refused,
            "acks_refused_other": self.acks_refused_other,
            "releases": self.releases,
            "extends": self.extends,
            "abandoned": self.abandoned,
            "port_waits": self.port_waits,
            "restart_ms_p50": self.restart_ms_p50,
            "restart_ms_max": self.restart_ms_max,
            "samples": self.samples,
            "failpoints": self.failpoints.iter().map(|outcome| {
                serde_json::json!({ "point": outcome.point, "fired_at": format!("{:?}", outcome.fired_at) })
            }).collect::<Vec<_>>(),
        })
    }
}

/// Runs `operation` until it succeeds, pausing [`ORCHESTRATOR_RETRY_PAUSE`]
/// between attempts, for up to [`ORCHESTRATOR_PATIENCE`]: right after a
/// restart a cached connection may still be the dead one, and the broker may
/// still be replaying its log.
async fn retrying<T, F, Fut>(what: &str, operation: F) -> Result<T, KillLoopError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    retrying_for(what, ORCHESTRATOR_PATIENCE, operation).await
}

/// [`retrying`] with its patience as an argument (tests use a short one).
async fn retrying_for<T, F, Fut>(
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
async fn list_live(
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
struct Witness {
    partition: PartitionId,
    lease_deadline_ms: u64,
    instance: Instance,
    held: Vec<(MessageId, Generation, Offset, DeliveryToken)>,
}

async fn take_witness(
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
        ledger.delivered(DeliverySeen {
            id: delivery.message_id(),
            placement: Placement::new(partition, delivery.offset()),
            generation: delivery.generation(),
            epoch: token_epoch(&delivery.token()),
            claim_sent,
        });
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
struct WitnessTally {
    tried: u64,
    unexpired: u64,
    refused: u64,
}

/// Acks the witness tokens on the restarted broker: each must be refused.
async fn check_witness(
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
/// scheduled or claimed; returns how many were drained.
async fn drain(shared: &Shared, client: &Client, admin: &Admin) -> Result<u64, KillLoopError> {
    let config = &shared.config;
    let started = now();
    let mut drained = 0u64;
    loop {
        for partition in (0..config.partitions).map(PartitionId) {
            let options = ClaimOptions {
                worker: DRAIN_WORKER,
                credits: spool_client::spool_wire::proto::limits::CLAIM_CREDITS_MAX,
                max_bytes: 4 << 20,
                lease_ms: DRAIN_LEASE_MS,
                wait_ms: DRAIN_WAIT_MS,
            };
            let claim_sent = shared.ledger().next_seq();
            let batch =
                retrying("drain claim", || client.claim(QUEUE, partition, &options)).await?;
            {
                let mut ledger = shared.ledger();
                for delivery in &batch.deliveries {
                    ledger.delivered(DeliverySeen {
                        id: delivery.message_id(),
                        placement: Placement::new(partition, delivery.offset()),
                        generation: delivery.generation(),
                        epoch: token_epoch(&delivery.token()),
                        claim_sent,
                    });
                }
            }
            for chunk in batch.deliveries.chunks(DRAIN_ACK_TOKENS_MAX) {
                let tokens: Vec<DeliveryToken> = chunk.iter().map(|d| d.token()).collect();
                let codes = retrying("drain ack", || async {
                    crate::ack_codes(client.ack(QUEUE, partition, &tokens).await, tokens.len())
                })
                .await?;
                let sent = shared.instance();
                let mut ledger = shared.ledger();
                for (delivery, code) in chunk.iter().zip(codes) {
                    if code != ErrorCode::None {
                        return Err(KillLoopError::Protocol(format!(
                            "drain ack of offset {} refused: {}",
                            delivery.offset().0,
                            code.name()
                        )));
                    }
                    drained += 1;
                    ledger.ack_acknowledged(TokenUse {
                        id: delivery.message_id(),
                        placement: Placement::new(partition, delivery.offset()),
                        generation: delivery.generation(),
                        token_instance: Some(sent),
                        sent_instance: sent,
                    });
                }
            }
        }
        let described = retrying("describe", || admin.describe_queue(QUEUE)).await?;
        let remaining: u64 =
            described.partitions.iter().map(|p| p.ready + p.scheduled + p.claimed).sum();
        if remaining == 0 && described.partitions.len() == config.partitions as usize {
            return Ok(drained);
        }
        if started.elapsed() >= config.drain_timeout {
            return Err(KillLoopError::Stuck(format!(
                "drain: {remaining} messages still live after {:?}",
                config.drain_timeout
            )));
        }
    }
}

fn percentile_ms(sorted: &[u64], percent: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() - 1) * percent / 100]
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        // The harness panics when a broker does not come up; keep its message.
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Runs the kill loop (see the module doc) on the current tokio runtime.
///
/// # Errors
/// A bad configuration, or a broker that stops answering; contract
/// violations are not errors but counts in the report.
///
/// # Panics
/// When a broker does not start or restart (the harness panics with its
/// log).
pub async fn run(config: KillLoopConfig) -> Result<KillLoopReport, KillLoopError> {
    config.validate()?;
    let started = now();
    let mut options = SpooldOptions::new(config.cores);
    options.bin = config.spoold_bin.clone();
    let broker = blocking(move || Spoold::start_with(options)).await;
    let mut slot = Some(broker);
    let result = run_on(config, &mut slot, started).await;
    if let (Err(_), Some(broker)) = (&result, &slot) {
        // Its log says why the broker stopped answering.
        let log = broker.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        eprintln!(
            "---- spoold log tail ({}) ----\n{tail}\n---- end ----",
            broker.log_path().display()
        );
    }
    result
}

/// Waits until every shard port of `broker` can be bound again (a std
/// listener, SO_REUSEADDR like the broker's own check), up to
/// [`PORT_FREE_TIMEOUT`]; returns whether it had to wait.
///
/// Why: a killed `spoold`'s listening sockets can outlive the reaped process
/// for a moment (its io_uring, which holds them through pending accepts, is
/// torn down asynchronously after exit), and a restart in that window dies
/// with `port_in_use`. A supervisor would restart it again; this loop waits
/// instead of losing the run.
fn wait_ports_free(broker: &Spoold) -> Result<bool, KillLoopError> {
    let started = now();
    let mut waited = false;
    for shard in 0..broker.cores() {
        let addr = broker.shard_addr(shard);
        while std::net::TcpListener::bind(&addr).is_err() {
            waited = true;
            if started.elapsed() >= PORT_FREE_TIMEOUT {
                return Err(KillLoopError::Stuck(format!(
                    "{addr} still bound {PORT_FREE_TIMEOUT:?} after the kill"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(waited)
}

/// Kills (`restart` false) or restarts the broker in `slot` off the async
/// threads.
async fn cycle(slot: &mut Option<Spoold>, restart: bool) -> Result<bool, KillLoopError> {
    let mut broker =
        slot.take().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let (broker, waited) = blocking(move || {
        if restart {
            let waited = wait_ports_free(&broker);
            if waited.is_ok() {
                broker.restart();
            }
            (broker, waited)
        } else {
            broker.kill();
            (broker, Ok(false))
        }
    })
    .await;
    *slot = Some(broker);
    waited
}

async fn run_on(
    config: KillLoopConfig,
    slot: &mut Option<Spoold>,
    started: Instant,
) -> Result<KillLoopReport, KillLoopError> {
    let broker =
        slot.as_ref().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin
        .create_queue(QUEUE, config.queue_config())
        .await
        .map_err(|error| KillLoopError::Setup(format!("create queue: {error}")))?;
    let shared = Arc::new(Shared::new(QUEUE.to_owned(), config.clone()));
    if !config.failpoints.is_empty() {
        admin
            .create_queue(BULK_QUEUE, test_queue_config(1, 30_000, 10_000))
            .await
            .map_err(|error| KillLoopError::Setup(format!("create bulk queue: {error}")))?;
    }
    let mut failpoints = Vec::new();

    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..config.producers {
        let worker_client = broker.client().await;
        let rng = Rng::new(config.seed, 1000 + u64::from(index));
        tasks.spawn(workers::producer(Arc::clone(&shared), worker_client, index, rng));
    }
    for index in 0..config.consumers {
        let worker_client = broker.client().await;
        let rng = Rng::new(config.seed, 2000 + u64::from(index));
        tasks.spawn(workers::consumer(Arc::clone(&shared), worker_client, index, rng));
    }

    let mut rng = Rng::new(config.seed, 0);
    let mut restart_ms = Vec::new();
    let mut tally = WitnessTally::default();
    let mut port_waits = 0u64;
    for cycle_index in 0..config.kills {
        let pause = rng.range(config.kill_interval_ms_min, config.kill_interval_ms_max);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if let Some(finished) = tasks.try_join_next() {
            worker_result(finished)?;
        }
        let witness = take_witness(&shared, &client, &mut rng).await?;
        let killed_at = now();
        cycle(slot, false).await?;
        // After the reap, before the next start: see `Instance`.
        shared.instance.fetch_add(1, Ordering::AcqRel);
        if let Some(arm) = config.failpoints.get(cycle_index as usize) {
            let fired_at = armed_cycle(slot, arm, &client).await?;
            shared.instance.fetch_add(1, Ordering::AcqRel);
            if config.progress {
                eprintln!("killloop: failpoint {} fired at {fired_at:?}", arm.point);
            }
            failpoints.push(FailpointOutcome { point: arm.point.clone(), fired_at });
        }
        let gate = shared.gate.write().await;
        port_waits += u64::from(cycle(slot, true).await?);
        restart_ms.push(u64::try_from(killed_at.elapsed().as_millis()).unwrap_or(u64::MAX));
        let live = list_live(&admin, config.partitions).await?;
        shared.ledger().live_check(&live);
        if let Some(witness) = witness {
            check_witness(&shared, &client, witness, &mut tally).await?;
        }
        drop(gate);
        if config.progress {
            let ledger = shared.ledger();
            eprintln!(
                "killloop: kill {}/{}: restart {} ms, {} enqueues and {} acks acknowledged, \
                 {} violations",
                restart_ms.len(),
                config.kills,
                restart_ms.last().copied().unwrap_or(0),
                ledger.enqueued_count(),
                ledger.acked_count(),
                ledger.violations().total()
            );
        }
    }
    if config.progress {
        eprintln!("killloop: stopping the load and draining");
    }

    shared.stop.store(true, Ordering::Release);
    while let Some(finished) = tasks.join_next().await {
        worker_result(finished)?;
    }
    // Every lease handed out must run out before the listing can be exact
    // and the drain can claim everything.
    let deadline_ms = shared.lease_deadline_ms_max.load(Ordering::Acquire);
    let wait_ms = (deadline_ms + 100).saturating_sub(unix_ms());
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let live = list_live(&admin, config.partitions).await?;
    shared.ledger().live_check(&live);
    let drained = drain(&shared, &client, &admin).await?;
    let dead: HashSet<Placement> = list_live(&admin, config.partitions)
        .await?
        .into_iter()
        .filter(|(_, entry)| entry.dead_letter)
        .map(|(placement, _)| placement)
        .collect();
    let ledger = {
        let mut ledger = shared.ledger();
        ledger.final_check(&dead);
        std::mem::take(&mut *ledger)
    };
    restart_ms.sort_unstable();
    let counters = &shared.counters;
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    Ok(KillLoopReport {
        seed: config.seed,
        kills: config.kills,
        duration_s: started.elapsed().as_secs_f64(),
        acked_enqueues_checked: ledger.enqueued_count() as u64,
        acks_acknowledged: ledger.acked_count() as u64,
        drained,
        dead_letters: dead.len() as u64,
        witness_tokens_tried: tally.tried,
        witness_tokens_unexpired: tally.unexpired,
        witness_tokens_refused: tally.refused,
        port_waits,
        restart_ms_p50: percentile_ms(&restart_ms, 50),
        restart_ms_max: restart_ms.last().copied().unwrap_or(0),
        violations: ledger.violations(),
        activity: ledger.activity(),
        enqueue_retries: load(&counters.enqueue_retries),
        enqueue_rejected: load(&counters.enqueue_rejected),
        acks_refused: load(&counters.acks_refused),
        acks_refused_other: load(&counters.acks_refused_other),
        releases: load(&counters.releases),
        extends: load(&counters.extends),
        abandoned: load(&counters.abandoned),
        samples: ledger.samples().to_vec(),
        failpoints,
    })
}

/// Where an armed broker's exit says the point fired: SIGABRT is the
/// failpoint's abort; anything else means it was not reached.
fn fired(status: Option<ExitStatus>, stage: FiredAt) -> Option<FiredAt> {
    status.and_then(|status| (status.signal() == Some(libc::SIGABRT)).then_some(stage))
}

/// Enqueues large records to [`BULK_QUEUE`] and acks them until `stop`,
/// ignoring failures (the broker is expected to die under it): drives
/// segment rolls, index writes and, at the next checkpoint, retention.
async fn bulk_load(client: Client, stop: Arc<std::sync::atomic::AtomicBool>) {
    use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};
    let payload = vec![0x42u8; BULK_PAYLOAD_BYTES];
    let mut sequence = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut builder = DataBatchBuilder::new();
        for _ in 0..BULK_BATCH {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&sequence.to_le_bytes());
            id[8..].copy_from_slice(b"bulkload");
            sequence += 1;
            let record = Record {
                message_id: MessageId(id),
                routing_key: Vec::new(),
                headers: Vec::new(),
                payload: Payload::Inline(payload.clone()),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: unix_ms(),
            };
            if builder.push(&record).is_err() {
                break;
            }
        }
        let enqueued = match builder.finish() {
            Ok(batch) => client.enqueue(BULK_QUEUE, PartitionId(0), &batch).await.is_ok(),
            Err(_) => false,
        };
        let options = ClaimOptions {
            worker: WorkerId(0xB01C),
            credits: 64,
            max_bytes: 8 << 20,
            // Short: claims a killed broker never saw acked come back soon
            // and do not pin the retention watermark for long.
            lease_ms: BULK_LEASE_MS,
            wait_ms: 0,
        };
        if let Ok(batch) = client.claim(BULK_QUEUE, PartitionId(0), &options).await {
            let tokens: Vec<_> = batch.deliveries.iter().map(|delivery| delivery.token()).collect();
            if !tokens.is_empty() {
                let _ = client.ack(BULK_QUEUE, PartitionId(0), &tokens).await;
            }
        }
        if !enqueued {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One failpoint cycle after the kill (see the module doc): restart with
/// `arm` armed, run the load (and the bulk load) until the broker aborts
/// or [`ARMED_LOAD_WAIT`] passes, then SIGTERM and wait for the drain. The
/// broker in `slot` is stopped afterwards, ready for a clean restart.
async fn armed_cycle(
    slot: &mut Option<Spoold>,
    arm: &FailpointArm,
    client: &Client,
) -> Result<FiredAt, KillLoopError> {
    let mut broker =
        slot.take().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let spec = format!("{}=abort@{}", arm.point, arm.from_hit);
    let (mut broker, started) = blocking(move || {
        let free = wait_ports_free(&broker);
        broker.options_mut().set_env(FAILPOINTS_ENV, &spec);
        let started = free.map(|_| broker.try_restart());
        broker.options_mut().remove_env(FAILPOINTS_ENV);
        (broker, started)
    })
    .await;
    let fired_at = match started? {
        Err(failed) => fired(failed.status, FiredAt::Startup),
        Ok(()) => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let bulk = tokio::spawn(bulk_load(client.clone(), stop.clone()));
            let (returned, exited) = blocking(move || {
                let exited = broker.wait_exit(ARMED_LOAD_WAIT);
                (broker, exited)
            })
            .await;
            broker = returned;
            let mut fired_at = fired(exited, FiredAt::Load);
            if exited.is_none() {
                broker.signal(libc::SIGTERM);
                let (returned, exited) = blocking(move || {
                    let exited = broker.wait_exit(STOP_TIMEOUT);
                    (broker, exited)
                })
                .await;
                broker = returned;
                fired_at = fired(exited, FiredAt::Close);
                if exited.is_none() {
                    broker.kill();
                }
            }
            stop.store(true, Ordering::Release);
            let _ = bulk.await;
            fired_at
        }
    };
    *slot = Some(broker);
    Ok(fired_at.unwrap_or(FiredAt::Missed))
}

fn worker_result(
    finished: Result<Result<(), KillLoopError>, tokio::task::JoinError>,
) -> Result<(), KillLoopError> {
    match finished {
        Ok(result) => result,
        Err(error) => Err(KillLoopError::Worker(error.to_string())),
    }
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
