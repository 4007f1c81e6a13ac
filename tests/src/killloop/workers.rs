//! The load of the kill loop: producers and consumers that keep talking to
//! the broker while it is killed and restarted under them.
//!
//! Owns the workers' request loops and the state they share with the
//! orchestrator ([`Shared`]): the ledger, the process counter
//! ([`Instance`]), the gate and the stop flag. It does not kill or check
//! anything; it only records answers.
//!
//! The gate: every request holds a read guard from just before it is sent
//! until its answer (or error) is **recorded in the ledger**. The
//! orchestrator kills without the gate, so requests are in flight at the
//! kill, then takes the write side: once it has it, every request to the
//! dead process has been answered or failed and recorded, and nothing talks
//! to the new process until the post-restart check is done. Recording under
//! the guard matters: an ack answered but recorded after the check would
//! look like a lost message.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spool_client::spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
use spool_client::spool_wire::proto::{PartitionId, RecordOutcome, WorkerId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{ClaimOptions, Client, ClientError, Delivery};
use tokio::sync::{watch, RwLock};
use tokio::task::JoinSet;

use super::ledger::{Instance, Ledger, Placement, TokenUse};
use super::order::Key;
use super::rng::Rng;
use super::sessions::Sessions;
use super::{unix_ms, KillLoopConfig, KillLoopError};

/// Most delivery handlers one consumer runs at once; a claim waits for
/// room below it.
pub const CONSUMER_HANDLERS_MAX: usize = 64;

/// Most record bytes a consumer asks for per claim.
const CLAIM_BYTES: u32 = 1 << 20;

/// Pause after a failed request (the broker is usually down).
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(30);

/// Pause of a producer while the backlog is at its limit.
const BACKLOG_PAUSE: Duration = Duration::from_millis(20);

/// How long a producer keeps retrying its last batch after the stop, so the
/// run ends with every submitted id answered.
const PRODUCER_FINISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Counters of worker activity (not violations).
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Enqueue requests that failed without an answer and were resent.
    pub enqueue_retries: AtomicU64,
    /// Records refused with a non-retriable code.
    pub enqueue_rejected: AtomicU64,
    /// Claims that failed.
    pub claim_errors: AtomicU64,
    /// Acks refused with `STALE_TOKEN`/`INVALID_TOKEN` (lease lost or a
    /// kill in between).
    pub acks_refused: AtomicU64,
    /// Acks refused with any other code.
    pub acks_refused_other: AtomicU64,
    /// Releases answered with success.
    pub releases: AtomicU64,
    /// Deliveries left to expire on purpose.
    pub abandoned: AtomicU64,
    /// Extends answered with success.
    pub extends: AtomicU64,
    /// Deliveries at the queue's delivery limit that ended without an ack
    /// (released, abandoned, or their ack refused as stale): dead letters
    /// to be, by subscription (the default, the second). The producers
    /// count them out of their backlog, which would otherwise fill with
    /// dead letters and stop the load; the checks never read them.
    pub last_attempts_dropped: [AtomicU64; 2],
    /// Ordered mode: sessions opened.
    pub sessions_opened: AtomicU64,
    /// Ordered mode: consumer lives ended by dropping the client, its
    /// connections and sessions at once.
    pub connections_dropped: AtomicU64,
    /// Ordered mode: deliveries still held (neither acked nor released)
    /// when their consumer dropped its connections.
    pub held_at_drop: AtomicU64,
}

/// State shared by workers and the orchestrator.
#[derive(Debug)]
pub struct Shared {
    /// The queue under load.
    pub queue: String,
    /// The run's settings.
    pub config: KillLoopConfig,
    /// What the broker acknowledged, in the default subscription.
    pub ledger: Mutex<Ledger>,
    /// The second subscription's name ([`KillLoopConfig::subscription`]).
    pub subscription: Option<Arc<str>>,
    /// What the broker acknowledged in the second subscription: the same
    /// enqueues, its own deliveries and acks (empty without one).
    pub sub_ledger: Mutex<Ledger>,
    /// The current broker process (see [`Instance`]).
    pub instance: AtomicU64,
    /// See the module doc.
    pub gate: RwLock<()>,
    /// Set when the workers must finish.
    pub stop: AtomicBool,
    /// Latest lease deadline any claim or extend answered (broker clock,
    /// Unix ms): the drain waits for it.
    pub lease_deadline_ms_max: AtomicU64,
    /// Activity counters.
    pub counters: WorkerCounters,
}

impl Shared {
    /// New shared state for `queue`.
    pub fn new(queue: String, config: KillLoopConfig) -> Self {
        Self {
            queue,
            ledger: Mutex::new(Ledger::new()),
            subscription: config.subscription.as_deref().map(Arc::from),
            sub_ledger: Mutex::new(Ledger::new()),
            instance: AtomicU64::new(1),
            gate: RwLock::new(()),
            stop: AtomicBool::new(false),
            lease_deadline_ms_max: AtomicU64::new(0),
            counters: WorkerCounters::default(),
            config,
        }
    }

    /// The ledger, locked (a panicking worker does not hide the facts).
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ledger of the second subscription (`in_sub`) or the default's.
    pub fn ledger_in(&self, in_sub: bool) -> MutexGuard<'_, Ledger> {
        if in_sub {
            self.sub_ledger.lock().unwrap_or_else(PoisonError::into_inner)
        } else {
            self.ledger()
        }
    }

    /// The ledgers every enqueue goes into: the default's, and the second
    /// subscription's when there is one.
    fn enqueue_ledgers(&self) -> impl Iterator<Item = MutexGuard<'_, Ledger>> + '_ {
        let second = self.subscription.is_some().then(|| self.ledger_in(true));
        std::iter::once(self.ledger()).chain(second)
    }

    /// The process the next request will reach (or a later one).
    pub fn instance(&self) -> Instance {
        Instance(self.instance.load(Ordering::Acquire))
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Notes a lease deadline from an answer.
    pub fn lease_deadline(&self, deadline_ms: u64) {
        self.lease_deadline_ms_max.fetch_max(deadline_ms, Ordering::AcqRel);
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A message id naming `(producer, sequence)`, so a report can say who sent
/// a lost message.
pub fn message_id(producer: u32, sequence: u64) -> MessageId {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&producer.to_le_bytes());
    id[4..12].copy_from_slice(&sequence.to_le_bytes());
    MessageId(id)
}

/// One producer: random batches (1..=`batch_records_max` records, random
/// priority, some scheduled) to random partitions, each batch resent as the
/// same bytes until the broker answers it.
///
/// # Errors
/// A batch that cannot be built, or an answer that does not match its batch.
pub async fn producer(
    shared: std::sync::Arc<Shared>,
    client: Client,
    index: u32,
    mut rng: Rng,
) -> Result<(), KillLoopError> {
    let config = &shared.config;
    let mut sequence = 0u64;
    // The last batch every record of which was answered, and the broker
    // instance that answered it.
    let mut last_answered: Option<(PartitionId, Vec<MessageId>, Vec<u8>, Instance)> = None;
    while !shared.stopping() {
        // Once per restart, the last answered batch is sent again as the
        // same bytes: dedupe must survive the SIGKILL, so every record comes
        // back `Duplicate` naming its original offset (the ledger checks
        // it). This exercises the resend path at every kill, whether or not
        // a batch happened to be in flight when it landed.
        if let Some((partition, ids, bytes, answered_by)) = &last_answered {
            if shared.instance() != *answered_by {
                send_until_answered(&shared, &client, *partition, ids, bytes).await?;
                last_answered = None;
            }
        }
        // The deeper backlog of the subscriptions.
        let backlog = shared
            .enqueue_ledgers()
            .zip(&shared.counters.last_attempts_dropped)
            .map(|(ledger, dropped)| {
                let dead = usize::try_from(dropped.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
                ledger.enqueued_count().saturating_sub(ledger.acked_count()).saturating_sub(dead)
            })
            .max()
            .unwrap_or(0);
        if backlog >= config.backlog_max {
            // A bounded poll: the backlog is read again after the pause.
            tokio::time::sleep(BACKLOG_PAUSE).await;
            continue;
        }
        // Ordered mode: a key's records all go to the partition the broker
        // routes it to, so its order is that partition's offset order.
        let partition = if config.ordered {
            key_partition(rng.range(0, u64::from(config.keys) - 1) as Key, config)
        } else {
            PartitionId(rng.range(0, u64::from(config.partitions) - 1) as u32)
        };
        let count = rng.range(1, u64::from(config.batch_records_max));
        let mut builder = DataBatchBuilder::new();
        let mut ids = Vec::new();
        let mut keys = Vec::new();
        let now_ms = unix_ms();
        for _ in 0..count {
            let id = message_id(index, sequence);
            sequence += 1;
            let key = config.ordered.then(|| key_of(&mut rng, config, partition));
            let scheduled = rng.percent(config.scheduled_percent);
            let payload_bytes = rng.range(8, 256) as usize;
            let record = Record {
                message_id: id,
                routing_key: key.map(routing_key).unwrap_or_default(),
                headers: Vec::new(),
                payload: Payload::Inline(vec![b'k'; payload_bytes]),
                priority: rng.range(0, u64::from(config.priority_bands) - 1) as u8,
                not_before_ms: if scheduled {
                    now_ms + rng.range(50, config.schedule_delay_ms_max)
                } else {
                    0
                },
                expiry_ms: 0,
                enqueue_time_ms: now_ms,
            };
            builder.push(&record).map_err(|error| KillLoopError::Setup(error.to_string()))?;
            ids.push(id);
            keys.push(key);
        }
        let bytes = builder.finish().map_err(|error| KillLoopError::Setup(error.to_string()))?;
        for mut ledger in shared.enqueue_ledgers() {
            for (&id, &key) in ids.iter().zip(&keys) {
                match key {
                    Some(key) => ledger.submit_keyed(id, key),
                    None => ledger.submit(id),
                }
            }
        }
        send_until_answered(&shared, &client, partition, &ids, &bytes).await?;
        last_answered = Some((partition, ids, bytes.to_vec(), shared.instance()));
    }
    Ok(())
}

/// The partition `key` belongs in (the broker refuses a keyed record sent
/// elsewhere: `KEY_MOVED`).
fn key_partition(key: Key, config: &KillLoopConfig) -> PartitionId {
    spool_client::routing::partition_for_key(&routing_key(key), config.partitions)
}

/// A random key of ordered mode's key set among those routed to
/// `partition`.
fn key_of(rng: &mut Rng, config: &KillLoopConfig, partition: PartitionId) -> Key {
    let keys: Vec<Key> =
        (0..config.keys).filter(|&key| key_partition(key, config) == partition).collect();
    keys[rng.range(0, keys.len() as u64 - 1) as usize]
}

/// The routing key bytes of `key`.
pub fn routing_key(key: Key) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

/// Sends one batch until every record has an answer (appended, duplicate,
/// or refused for good). Records that were already answered come back as
/// `Duplicate` on a resend; the ledger checks they name the same offset.
async fn send_until_answered(
    shared: &Shared,
    client: &Client,
    partition: PartitionId,
    ids: &[MessageId],
    bytes: &[u8],
) -> Result<(), KillLoopError> {
    let mut finish_deadline = None;
    loop {
        let retry = {
            let _gate = shared.gate.read().await;
            match client.enqueue(&shared.queue, partition, bytes).await {
                Ok(response) if response.records.len() != ids.len() => {
                    return Err(KillLoopError::Protocol(format!(
                        "enqueue of {} records answered with {} outcomes",
                        ids.len(),
                        response.records.len()
                    )));
                }
                Ok(response) => {
                    let mut retry = false;
                    for (&id, outcome) in ids.iter().zip(&response.records) {
                        let (placement, duplicate) = match *outcome {
                            RecordOutcome::Appended { offset } => {
                                (Placement::new(partition, offset), false)
                            }
                            RecordOutcome::Duplicate { original_offset } => {
                                (Placement::new(partition, original_offset), true)
                            }
                            RecordOutcome::Rejected { code } if code.is_retriable() => {
                                retry = true;
                                continue;
                            }
                            RecordOutcome::Rejected { .. } => {
                                bump(&shared.counters.enqueue_rejected);
                                continue;
                            }
                        };
                        for mut ledger in shared.enqueue_ledgers() {
                            ledger.enqueue_acknowledged(id, placement, duplicate);
                        }
                    }
                    retry
                }
                Err(_) => true,
            }
        };
        if !retry {
            return Ok(());
        }
        bump(&shared.counters.enqueue_retries);
        if shared.stopping() {
            let deadline = *finish_deadline.get_or_insert_with(super::now);
            if deadline.elapsed() >= PRODUCER_FINISH_TIMEOUT {
                return Err(KillLoopError::Stuck(format!(
                    "a batch to partition {} got no answer for {PRODUCER_FINISH_TIMEOUT:?} after \
                     the stop",
                    partition.0
                )));
            }
        }
        // A retry pause (the broker is usually down); the loop re-checks `stop`.
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// What a consumer does with one delivery.
#[derive(Debug, Clone, Copy)]
enum Action {
    Ack,
    Release {
        delay_ms: u32,
    },
    /// Keep it and let the lease run out.
    Abandon,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    hold_ms: u64,
    /// Extend once, half-way through the hold.
    extend: bool,
    action: Action,
}

pub(super) fn plan(rng: &mut Rng, config: &KillLoopConfig) -> Plan {
    // Mostly within the lease; sometimes past it, so acks meet expired
    // leases (STALE_TOKEN) and the message comes back on its own.
    let hold_ms = if rng.percent(8) {
        u64::from(config.lease_ms) + rng.range(100, 600)
    } else {
        rng.range(0, config.hold_ms_max)
    };
    let action = match rng.range(0, 99) {
        0..=59 => Action::Ack,
        60..=84 => Action::Release { delay_ms: rng.range(0, config.release_delay_ms_max) as u32 },
        _ => Action::Abandon,
    };
    Plan { hold_ms, extend: rng.percent(20), action }
}

/// One consumer: claims with random credits, half of them from a random
/// partition and half of any partition of a random shard (Claim `ANY`,
/// whose deliveries name their partitions), and handles each delivery in
/// its own task after a random time. With `in_sub` it claims in the second
/// subscription and records in its ledger.
///
/// # Errors
/// None today; the signature matches [`producer`] so both are joined alike.
pub async fn consumer(
    shared: std::sync::Arc<Shared>,
    client: Client,
    index: u32,
    mut rng: Rng,
    in_sub: bool,
) -> Result<(), KillLoopError> {
    let config = shared.config.clone();
    let worker = WorkerId(0xC0_0000 + u64::from(index));
    let mut handlers = JoinSet::new();
    while !shared.stopping() {
        let Some((deliveries, token_instance)) =
            claim_once(&shared, &client, worker, &mut rng, &mut handlers, in_sub, None).await
        else {
            bump(&shared.counters.claim_errors);
            // A retry pause (the broker is usually down).
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        for delivery in deliveries {
            let plan = plan(&mut rng, &config);
            let shared = std::sync::Arc::clone(&shared);
            let client = client.clone();
            handlers.spawn(async move {
                handle(&shared, &client, delivery, token_instance, plan, in_sub, None).await
            });
        }
    }
    while handlers.join_next().await.is_some() {}
    Ok(())
}

/// One claim of a consumer: waits for room among its `handlers`, claims
/// with random credits (half of one random partition, half `ANY` of a
/// random shard), in ordered mode under a session of the connection it
/// goes on (`sessions`), and records the deliveries in the ledger before
/// the gate opens. Returns them with the process that issued their tokens
/// (when known); `None` when the claim failed.
pub(super) async fn claim_once(
    shared: &Shared,
    client: &Client,
    worker: WorkerId,
    rng: &mut Rng,
    handlers: &mut JoinSet<()>,
    in_sub: bool,
    sessions: Option<&Sessions>,
) -> Option<(Vec<Delivery>, Option<Instance>)> {
    let config = &shared.config;
    while handlers.len() >= CONSUMER_HANDLERS_MAX {
        handlers.join_next().await;
    }
    while handlers.try_join_next().is_some() {}
    let partition = PartitionId(rng.range(0, u64::from(config.partitions) - 1) as u32);
    let room = (CONSUMER_HANDLERS_MAX - handlers.len()) as u64;
    let options = ClaimOptions {
        worker,
        credits: rng.range(1, room.min(u64::from(config.claim_credits_max))) as u32,
        max_bytes: CLAIM_BYTES,
        lease_ms: config.lease_ms,
        wait_ms: rng.range(0, 100) as u32,
        subscription: if in_sub { shared.subscription.clone() } else { None },
    };
    let _gate = shared.gate.read().await;
    let sent_instance = shared.instance();
    let claim_sent = shared.ledger_in(in_sub).next_seq();
    let any = !rng.percent(50);
    let answer = async {
        let via = if any {
            let targets = client.claim_targets(&shared.queue).await?;
            targets[rng.range(0, targets.len() as u64 - 1) as usize]
        } else {
            partition
        };
        if let Some(sessions) = sessions {
            sessions.ensure(shared, client, via).await;
        }
        if any {
            client.claim_shard(&shared.queue, via, &options).await
        } else {
            client.claim(&shared.queue, partition, &options).await
        }
    }
    .await;
    // The answer came from the process that was current at the send only if
    // no kill happened in between.
    let same_process = shared.instance() == sent_instance;
    let batch = answer.ok()?;
    shared.lease_deadline(batch.lease_deadline_ms);
    let mut ledger = shared.ledger_in(in_sub);
    for delivery in &batch.deliveries {
        ledger.delivered(super::delivery_seen(delivery, claim_sent));
    }
    Some((batch.deliveries, same_process.then_some(sent_instance)))
}

/// Holds a delivery `ms` (time under test: the handler works on it). With
/// `dead` (ordered mode) the hold ends early when the consumer's life ends:
/// false then, and the delivery is left held where it is.
async fn hold(ms: u64, dead: &mut Option<watch::Receiver<bool>>) -> bool {
    // Time under test: the handler holds its delivery.
    let sleep = tokio::time::sleep(Duration::from_millis(ms));
    match dead {
        None => {
            sleep.await;
            true
        }
        Some(dead) => tokio::select! {
            () = sleep => true,
            _ = dead.wait_for(|dead| *dead) => false,
        },
    }
}

fn token_use(delivery: &Delivery, token_instance: Option<Instance>, sent: Instance) -> TokenUse {
    TokenUse {
        id: delivery.message_id(),
        placement: Placement::new(delivery.partition(), delivery.offset()),
        generation: delivery.generation(),
        token_instance,
        sent_instance: sent,
    }
}

fn is_token_refusal(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::StaleToken | ErrorCode::InvalidToken)
}

/// Carries out `plan` for one delivery. With `dead` (ordered mode), a
/// consumer life that ends during a hold leaves the delivery held (counted
/// in [`WorkerCounters::held_at_drop`]) for the broker to release when the
/// connection closes.
pub(super) async fn handle(
    shared: &Shared,
    client: &Client,
    delivery: Delivery,
    token_instance: Option<Instance>,
    plan: Plan,
    in_sub: bool,
    mut dead: Option<watch::Receiver<bool>>,
) {
    let queue = shared.queue.as_str();
    let (partition, token) = (delivery.partition(), delivery.token());
    let last_attempt = delivery.attempt() >= shared.config.max_deliveries;
    let dropped = || {
        if last_attempt {
            bump(&shared.counters.last_attempts_dropped[usize::from(in_sub)]);
        }
    };
    let dropped_held = || {
        bump(&shared.counters.held_at_drop);
        dropped();
    };
    if plan.extend {
        // The handler holds its delivery (half before the extend).
        if !hold(plan.hold_ms / 2, &mut dead).await {
            return dropped_held();
        }
        let _gate = shared.gate.read().await;
        let sent = shared.instance();
        if let Ok(deadline_ms) =
            client.extend(queue, partition, token, shared.config.lease_ms).await
        {
            shared.lease_deadline(deadline_ms);
            bump(&shared.counters.extends);
            shared
                .ledger_in(in_sub)
                .token_use_succeeded(token_use(&delivery, token_instance, sent), "extend");
        }
        drop(_gate);
        // The rest of the hold.
        if !hold(plan.hold_ms - plan.hold_ms / 2, &mut dead).await {
            return dropped_held();
        }
    } else if !hold(plan.hold_ms, &mut dead).await {
        return dropped_held();
    }
    match plan.action {
        Action::Ack => {
            let _gate = shared.gate.read().await;
            let sent = shared.instance();
            shared.ledger_in(in_sub).ack_sent(delivery.message_id());
            match client.ack(queue, partition, &[token]).await {
                Ok(()) => {
                    let used = token_use(&delivery, token_instance, sent);
                    shared.ledger_in(in_sub).ack_acknowledged(used);
                }
                Err(ClientError::AckRefused { refused, .. })
                    if refused.first().is_some_and(|refused| is_token_refusal(refused.code)) =>
                {
                    shared.ledger_in(in_sub).ack_refused(delivery.message_id());
                    bump(&shared.counters.acks_refused);
                    dropped();
                }
                Err(ClientError::AckRefused { .. }) => {
                    shared.ledger_in(in_sub).ack_refused(delivery.message_id());
                    bump(&shared.counters.acks_refused_other);
                }
                Err(_) => {
                    let (id, generation) = (delivery.message_id(), delivery.generation());
                    shared.ledger_in(in_sub).ack_unknown(id, generation);
                }
            }
        }
        Action::Release { delay_ms } => {
            let _gate = shared.gate.read().await;
            let sent = shared.instance();
            let answer = client.release(queue, partition, token, delay_ms, "kill loop").await;
            dropped();
            if let Ok(_not_before_ms) = answer {
                bump(&shared.counters.releases);
                shared
                    .ledger_in(in_sub)
                    .token_use_succeeded(token_use(&delivery, token_instance, sent), "release");
            }
        }
        Action::Abandon => {
            bump(&shared.counters.abandoned);
            dropped();
        }
    }
}
