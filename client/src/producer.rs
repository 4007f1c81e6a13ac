//! [`Producer`]: batched, routed, retried enqueues.
//!
//! Owns the open batches (one per queue partition), their linger timers and
//! the tasks that send them. A message is archived into its partition's open
//! batch as soon as it is submitted. A batch becomes **due** when it reaches
//! `max_batch_bytes` or when `linger` has passed since its first message (at
//! once when `linger` is zero: no timer is involved). A due batch is sent as
//! soon as its partition has fewer than `in_flight_per_partition` batches in
//! flight; until then it keeps collecting messages, so under load batches
//! grow by themselves while the previous ones are on their way (natural
//! batching), and an idle producer with zero linger sends each message at
//! once. A batch whose builder is completely full is sent regardless.
//! A due batch also waits (and grows) while the producer as a whole has
//! [`PRODUCER_IN_FLIGHT_BATCHES_MAX`] batches in flight: the first to finish
//! sends the longest-waiting one. So on a queue of thousands of partitions
//! batches still grow under load instead of queueing as one-record requests.
//!
//! Partition choice: jump consistent hash of the routing key's FNV-1a 64
//! ([`partition_for_key`]).
//! Without a key, **sticky round robin**: the queue's keyless messages join
//! one partition's open batch as long as that batch is open and smaller than
//! `max_batch_bytes`, and move to the next partition (round robin) once it
//! is taken for sending or has reached that size. At low load every message
//! finds its batch already sent and the choice is plain round robin; under
//! load (or with a linger) a keyless stream fills one batch at a time instead
//! of one record into each of the queue's partitions. A batch that is due
//! but waits for its partition's in-flight room ends the turn once it has
//! reached `max_batch_bytes`: the stream moves on to the other partitions
//! instead of piling onto the one that is slowest to take it.
//!
//! Retries: a batch whose send fails with a retriable error (broken
//! connection, timeout, `QUEUE_FULL`, ...) is sent again **as the same bytes**,
//! so every message keeps its message id and the broker's dedupe turns a retry
//! of an already-appended record into `Duplicate` with the original offset: a
//! retry never duplicates. Message ids are 16 random bytes unless the caller
//! names one.
//!
//! Bounds: at most [`PRODUCER_PENDING_MESSAGES_MAX`] messages submitted but
//! unresolved (a further `send` waits), [`PRODUCER_IN_FLIGHT_BATCHES_MAX`]
//! batches being sent in all, and (except full batches and `flush`)
//! `in_flight_per_partition` per partition.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use spool_wire::batch::{DataBatchBuilder, HeaderField, MessageId, Payload, Record};
use spool_wire::proto::{validate_queue_name, Offset, PartitionId, RecordOutcome};
use spool_wire::{ErrorCode, WireError};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::client::Client;
use crate::clock::unix_ms;
use crate::error::ClientError;
use crate::limits::{
    BATCH_BYTES_DEFAULT, LINGER_DEFAULT, PRODUCER_IN_FLIGHT_BATCHES_MAX,
    PRODUCER_IN_FLIGHT_PER_PARTITION_DEFAULT, PRODUCER_PENDING_MESSAGES_MAX,
    PRODUCER_RETRIES_DEFAULT, RETRY_BACKOFF_DEFAULT, RETRY_BACKOFF_MAX,
};
use crate::routing::partition_for_key;

mod reroute;
use reroute::{batch_record, Moved};

/// Settings of a [`Producer`].
///
/// **Linger** is the one to choose deliberately. The default is zero
/// ([`LINGER_DEFAULT`]): a message goes out at once, and messages arriving
/// while a partition already has `in_flight_per_partition` batches on their
/// way share the next batch, so under heavy load batches still grow without
/// a timer. At moderate rates that means about one Enqueue request (and one
/// broker commit) per message. A linger of a few milliseconds makes batches
/// of whatever arrives within it: fewer requests and commits for the broker,
/// paid for in enqueue latency. Measured at 5,000 msgs/s on a 2-vCPU host,
/// a 5 ms linger adds ≈ 3.5 ms to the enqueue p50 and halves the broker's
/// CPU. Pick a linger when broker CPU is the constraint and a few ms of
/// enqueue latency do not matter; keep zero when latency matters.
///
/// ```
/// use std::time::Duration;
/// use spool_client::ProducerConfig;
///
/// let low_latency = ProducerConfig::default();
/// assert_eq!(low_latency.linger, Duration::ZERO);
/// let frugal = ProducerConfig { linger: Duration::from_millis(5), ..ProducerConfig::default() };
/// assert!(frugal.linger > low_latency.linger);
/// ```
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How long an open batch waits for more messages before it is sent
    /// (default zero: see the type's doc for the trade).
    pub linger: Duration,
    /// A batch is sent as soon as its encoded size reaches this
    /// (`1..=BATCH_BYTES_MAX`; it may pass it by the last record).
    pub max_batch_bytes: usize,
    /// Retries of a batch after a retriable error.
    pub retries: u32,
    /// First retry backoff; doubles per retry up to [`RETRY_BACKOFF_MAX`].
    /// Each wait is drawn between half of that and all of it (jitter).
    pub retry_backoff: Duration,
    /// Batches of one partition being sent at once before a due batch
    /// waits (and keeps growing), `1..=PRODUCER_IN_FLIGHT_BATCHES_MAX`.
    pub in_flight_per_partition: usize,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            linger: LINGER_DEFAULT,
            max_batch_bytes: BATCH_BYTES_DEFAULT,
            retries: PRODUCER_RETRIES_DEFAULT,
            retry_backoff: RETRY_BACKOFF_DEFAULT,
            in_flight_per_partition: PRODUCER_IN_FLIGHT_PER_PARTITION_DEFAULT,
        }
    }
}

/// One message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The body.
    pub payload: Payload,
    /// Chooses the partition; empty = round robin.
    pub routing_key: Vec<u8>,
    /// The dedupe identity; random when `None`.
    pub message_id: Option<MessageId>,
    /// Application headers.
    pub headers: Vec<HeaderField>,
    /// Priority band, 0 highest.
    pub priority: u8,
    /// Not deliverable for this long after the send (0 = now).
    pub delay_ms: u64,
    /// Absolute expiry (Unix ms), 0 = never.
    pub expiry_ms: u64,
}

impl Message {
    /// A message with an inline payload and every other field defaulted.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            payload: Payload::Inline(payload.into()),
            routing_key: Vec::new(),
            message_id: None,
            headers: Vec::new(),
            priority: 0,
            delay_ms: 0,
            expiry_ms: 0,
        }
    }

    /// Sets the routing key.
    #[must_use]
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.routing_key = key.into();
        self
    }

    /// Sets the message id.
    #[must_use]
    pub fn id(mut self, id: MessageId) -> Self {
        self.message_id = Some(id);
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push(HeaderField { key: key.into(), value: value.into() });
        self
    }

    /// Sets the priority band.
    #[must_use]
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Delays delivery.
    #[must_use]
    pub fn delay_ms(mut self, delay_ms: u64) -> Self {
        self.delay_ms = delay_ms;
        self
    }

    fn into_record(self, now_ms: u64) -> Record {
        Record {
            message_id: self.message_id.unwrap_or_else(|| MessageId(rand::random())),
            routing_key: self.routing_key,
            headers: self.headers,
            payload: self.payload,
            priority: self.priority,
            not_before_ms: if self.delay_ms == 0 {
                0
            } else {
                now_ms.saturating_add(self.delay_ms)
            },
            expiry_ms: self.expiry_ms,
            enqueue_time_ms: now_ms,
        }
    }
}

/// Resolves to the message's offset once the broker has it durably (or to
/// the offset of the original when the message id was a duplicate). An
/// offset counts within one partition: [`partition`](Self::partition) says
/// which.
#[derive(Debug)]
pub struct SendFuture {
    receiver: oneshot::Receiver<Result<Offset, ClientError>>,
    partition: PartitionId,
}

impl SendFuture {
    /// The partition the message was routed to.
    pub fn partition(&self) -> PartitionId {
        self.partition
    }
}

impl Future for SendFuture {
    type Output = Result<Offset, ClientError>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver)
            .poll(context)
            .map(|result| result.unwrap_or(Err(ClientError::Shutdown)))
    }
}

struct Waiter {
    sender: oneshot::Sender<Result<Offset, ClientError>>,
    /// Holds one of the pending-message slots until the message resolves.
    _slot: OwnedSemaphorePermit,
    /// Times the broker answered `KEY_MOVED` and the message was routed
    /// again (at most `PRODUCER_REROUTES_MAX`: `reroute.rs`).
    reroutes: u32,
}

struct OpenBatch {
    /// Distinguishes this batch from a later one for the same partition, so
    /// a stale linger timer does not flush its successor early.
    id: u64,
    builder: DataBatchBuilder,
    waiters: Vec<Waiter>,
    /// Full enough or lingered long enough: sent once its partition has an
    /// in-flight slot and the producer is under its in-flight bound.
    due: bool,
    /// Listed in [`Accumulator::blocked`].
    blocked: bool,
}

type BatchKey = (String, PartitionId);

/// Open batches, in-flight counts and each queue's keyless partition. `open`,
/// `in_flight` and `sticky` hold one entry per partition (or queue) written
/// to, so they are bounded by the queues' partitions; `blocked` holds at most
/// one live entry per open batch (stale ones, whose batch went another way,
/// are dropped as they reach the front).
#[derive(Default)]
struct Accumulator {
    open: HashMap<BatchKey, OpenBatch>,
    in_flight: HashMap<BatchKey, usize>,
    /// Batches taken and not yet finished, over every partition.
    in_flight_total: usize,
    /// Partitions whose due batch waits for the producer-wide bound, oldest
    /// first.
    blocked: VecDeque<BatchKey>,
    /// Where each queue's keyless messages go while that batch is open.
    sticky: HashMap<String, PartitionId>,
    /// Turns of the keyless round robin (over every queue).
    round_robin: u32,
    next_batch_id: u64,
}

impl Accumulator {
    /// The partition of a keyless message to `queue` (of `partitions`): the
    /// queue's sticky partition while its batch is open and smaller than
    /// `batch_bytes`, else the next one in round robin.
    fn keyless_partition(
        &mut self,
        queue: &str,
        partitions: u32,
        batch_bytes: usize,
    ) -> PartitionId {
        let next = PartitionId(self.round_robin % partitions.max(1));
        match self.sticky.get_mut(queue) {
            Some(sticky)
                if sticky.0 < partitions
                    && self
                        .open
                        .get(&(queue.to_owned(), *sticky))
                        .is_some_and(|batch| batch.builder.encoded_len_bytes() < batch_bytes) =>
            {
                *sticky
            }
            Some(sticky) => {
                *sticky = next;
                self.round_robin = self.round_robin.wrapping_add(1);
                next
            }
            None => {
                self.sticky.insert(queue.to_owned(), next);
                self.round_robin = self.round_robin.wrapping_add(1);
                next
            }
        }
    }

    /// Takes `key`'s open batch if it is due, its partition has room and the
    /// producer has fewer than [`PRODUCER_IN_FLIGHT_BATCHES_MAX`] batches in
    /// flight, counting it in flight. A due batch held back by the
    /// producer-wide bound joins `blocked` (once); one held back by its
    /// partition's bound is taken when that partition's batch finishes.
    fn take_due(&mut self, key: &BatchKey, in_flight_max: usize) -> Option<OpenBatch> {
        let partition_busy = self.in_flight.get(key).copied().unwrap_or(0) >= in_flight_max;
        let producer_busy = self.in_flight_total >= PRODUCER_IN_FLIGHT_BATCHES_MAX;
        let batch = self.open.get_mut(key)?;
        if !batch.due || partition_busy {
            return None;
        }
        if producer_busy {
            if !batch.blocked {
                batch.blocked = true;
                self.blocked.push_back(key.clone());
            }
            return None;
        }
        self.take(key)
    }

    /// Takes `key`'s open batch unconditionally, counting it in flight.
    fn take(&mut self, key: &BatchKey) -> Option<OpenBatch> {
        let batch = self.open.remove(key)?;
        *self.in_flight.entry(key.clone()).or_insert(0) += 1;
        self.in_flight_total += 1;
        Some(batch)
    }

    /// A batch of `key` finished sending: returns what may go now, those
    /// waiting longest for the producer-wide bound first, then `key`'s next
    /// batch (which queues behind them when the bound is still reached, so
    /// a busy partition cannot keep the freed slots to itself).
    fn sent(&mut self, key: &BatchKey, in_flight_max: usize) -> Vec<(BatchKey, OpenBatch)> {
        let count = self.in_flight.get_mut(key);
        assert!(count.as_ref().is_some_and(|count| **count > 0), "sent a batch never taken");
        if let Some(count) = count {
            *count -= 1;
            if *count == 0 {
                self.in_flight.remove(key);
            }
        }
        self.in_flight_total = self.in_flight_total.saturating_sub(1);
        let mut ready = Vec::new();
        while self.in_flight_total < PRODUCER_IN_FLIGHT_BATCHES_MAX {
            let Some(waiting) = self.blocked.pop_front() else { break };
            match self.open.get_mut(&waiting) {
                Some(batch) if batch.blocked => batch.blocked = false,
                // Taken another way (flush, full, its partition's turn).
                _ => continue,
            }
            if let Some(batch) = self.take_due(&waiting, in_flight_max) {
                ready.push((waiting, batch));
            }
        }
        if let Some(batch) = self.take_due(key, in_flight_max) {
            ready.push((key.clone(), batch));
        }
        ready
    }
}

struct Inner {
    client: Client,
    config: ProducerConfig,
    accumulator: Mutex<Accumulator>,
    pending: Arc<Semaphore>,
    in_flight: Arc<Semaphore>,
    closed: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Accumulator> {
        self.accumulator.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sends messages in batches. Cheap to clone; clones share batches.
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// use spool_client::{Client, Message, Producer, ProducerConfig};
///
/// let client = Client::connect("127.0.0.1:7400").await?;
/// let producer = Producer::new(client, ProducerConfig::default())?;
/// let offset = producer.send("jobs", Message::new("resize 42.png").key("user-7")).await?;
/// println!("stored at {}", offset.0);
/// producer.flush().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Producer").field("config", &self.inner.config).finish()
    }
}

impl Producer {
    /// A producer sending through `client`.
    ///
    /// # Errors
    /// [`ClientError::Config`] for an out-of-range setting.
    pub fn new(client: Client, config: ProducerConfig) -> Result<Self, ClientError> {
        if config.max_batch_bytes == 0
            || config.max_batch_bytes > spool_wire::limits::BATCH_BYTES_MAX
        {
            return Err(ClientError::Config(format!(
                "max_batch_bytes {} outside 1..={}",
                config.max_batch_bytes,
                spool_wire::limits::BATCH_BYTES_MAX
            )));
        }
        if !(1..=PRODUCER_IN_FLIGHT_BATCHES_MAX).contains(&config.in_flight_per_partition) {
            return Err(ClientError::Config(format!(
                "in_flight_per_partition {} outside 1..={PRODUCER_IN_FLIGHT_BATCHES_MAX}",
                config.in_flight_per_partition
            )));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                config,
                accumulator: Mutex::new(Accumulator::default()),
                pending: Arc::new(Semaphore::new(PRODUCER_PENDING_MESSAGES_MAX)),
                in_flight: Arc::new(Semaphore::new(PRODUCER_IN_FLIGHT_BATCHES_MAX)),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Sends one message and waits until the broker has it; returns its
    /// offset. Concurrent `send`s share batches.
    ///
    /// # Errors
    /// As [`submit`](Self::submit), or the batch's final error after retries.
    pub async fn send(&self, queue: &str, message: Message) -> Result<Offset, ClientError> {
        self.submit(queue, message).await?.await
    }

    /// Adds one message to its partition's batch and returns a future for
    /// its offset, so a caller can submit many before awaiting any.
    ///
    /// # Errors
    /// Bad queue name, unknown queue, a record over its limits, or
    /// [`ClientError::Shutdown`] after [`close`](Self::close).
    pub async fn submit(&self, queue: &str, message: Message) -> Result<SendFuture, ClientError> {
        validate_queue_name(queue)?;
        let inner = &self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(ClientError::Shutdown);
        }
        let slot =
            Arc::clone(&inner.pending).acquire_owned().await.map_err(|_| ClientError::Shutdown)?;
        let record = message.into_record(unix_ms());
        let (sender, receiver) = oneshot::channel();
        let waiter = Waiter { sender, _slot: slot, reroutes: 0 };
        let partition = self.place(queue, record, waiter).await?;
        Ok(SendFuture { receiver, partition })
    }

    /// Routes `record` (by its key, or sticky round robin) into its
    /// partition's open batch, with `waiter` told its outcome; sends what
    /// became due. Returns the partition.
    async fn place(
        &self,
        queue: &str,
        record: Record,
        waiter: Waiter,
    ) -> Result<PartitionId, ClientError> {
        let inner = &self.inner;
        let partitions = inner.client.partition_count(queue).await?;
        let keyed = (!record.routing_key.is_empty())
            .then(|| partition_for_key(&record.routing_key, partitions));
        let config = &inner.config;
        let mut ready = Vec::new();
        let mut new_batch_id = None;
        let key = {
            let mut accumulator = inner.lock();
            let accumulator = &mut *accumulator;
            let partition = keyed.unwrap_or_else(|| {
                accumulator.keyless_partition(queue, partitions, config.max_batch_bytes)
            });
            let key = (queue.to_owned(), partition);
            if !accumulator.open.contains_key(&key) {
                new_batch_id = Some(open_batch(accumulator, &key));
            }
            let batch = accumulator.open.get_mut(&key).ok_or(ClientError::Shutdown)?;
            match batch.builder.push(&record) {
                Ok(()) => {}
                Err(WireError::BatchBytesFull { .. } | WireError::BatchRecordsFull { .. })
                    if !batch.builder.is_empty() =>
                {
                    // The open batch cannot take one more record: send it
                    // whatever is in flight, and start another.
                    if let Some(full) = accumulator.take(&key) {
                        ready.push(full);
                    }
                    new_batch_id = Some(open_batch(accumulator, &key));
                    let batch = accumulator.open.get_mut(&key).ok_or(ClientError::Shutdown)?;
                    batch.builder.push(&record)?;
                }
                Err(error) => return Err(error.into()),
            }
            let batch = accumulator.open.get_mut(&key).ok_or(ClientError::Shutdown)?;
            batch.waiters.push(waiter);
            batch.due |= config.linger.is_zero()
                || batch.builder.encoded_len_bytes() >= config.max_batch_bytes;
            if let Some(due) = accumulator.take_due(&key, config.in_flight_per_partition) {
                ready.push(due);
            }
            key
        };
        let partition = key.1;
        for batch in ready {
            self.spawn_send(key.clone(), batch);
        }
        if let Some(batch_id) = new_batch_id.filter(|_| !config.linger.is_zero()) {
            self.spawn_linger(key, batch_id);
        }
        Ok(partition)
    }

    /// Sends every open batch now (whatever is in flight) and waits until
    /// every message submitted so far has resolved.
    pub async fn flush(&self) {
        let open: Vec<(BatchKey, OpenBatch)> = {
            let mut accumulator = self.inner.lock();
            let keys: Vec<BatchKey> = accumulator.open.keys().cloned().collect();
            keys.into_iter()
                .filter_map(|key| accumulator.take(&key).map(|batch| (key, batch)))
                .collect()
        };
        for (key, batch) in open {
            self.spawn_send(key, batch);
        }
        let all = u32::try_from(PRODUCER_PENDING_MESSAGES_MAX).unwrap_or(u32::MAX);
        // Holding every slot at once means no message is unresolved.
        if let Ok(slots) = self.inner.pending.acquire_many(all).await {
            drop(slots);
        }
    }

    /// Refuses new messages, then [`flush`](Self::flush)es.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.flush().await;
    }

    fn spawn_linger(&self, key: BatchKey, batch_id: u64) {
        let producer = self.clone();
        let linger = self.inner.config.linger;
        tokio::spawn(async move {
            tokio::time::sleep(linger).await;
            let batch = {
                let mut accumulator = producer.inner.lock();
                match accumulator.open.get_mut(&key) {
                    Some(batch) if batch.id == batch_id => {
                        batch.due = true;
                        accumulator.take_due(&key, producer.inner.config.in_flight_per_partition)
                    }
                    _ => None,
                }
            };
            if let Some(batch) = batch {
                producer.spawn_send(key, batch);
            }
        });
    }

    /// Sends `batch` (already counted in flight for `key`); when it is done,
    /// sends the partition's next batch if that one is due by then.
    fn spawn_send(&self, key: BatchKey, batch: OpenBatch) {
        let producer = self.clone();
        tokio::spawn(async move {
            let inner = &producer.inner;
            let moved = {
                let _flight = Arc::clone(&inner.in_flight).acquire_owned().await;
                send_batch(inner, &key.0, key.1, batch).await
            };
            if !moved.is_empty() {
                producer.reroute(&key.0, moved).await;
            }
            let next = inner.lock().sent(&key, inner.config.in_flight_per_partition);
            for (key, batch) in next {
                producer.spawn_send(key, batch);
            }
        });
    }
}

fn open_batch(accumulator: &mut Accumulator, key: &BatchKey) -> u64 {
    let id = accumulator.next_batch_id;
    accumulator.next_batch_id += 1;
    accumulator.open.insert(
        key.clone(),
        OpenBatch {
            id,
            builder: DataBatchBuilder::new(),
            waiters: Vec::new(),
            due: false,
            blocked: false,
        },
    );
    id
}

/// Sends one batch, retrying the same bytes, and resolves every waiter but
/// those of records refused with `KEY_MOVED`, which it returns to be
/// routed again.
async fn send_batch(
    inner: &Inner,
    queue: &str,
    partition: PartitionId,
    batch: OpenBatch,
) -> Vec<Moved> {
    let mut waiters: Vec<Option<Waiter>> = batch.waiters.into_iter().map(Some).collect();
    let resolve = |waiters: &mut Vec<Option<Waiter>>, index: usize, result| {
        if let Some(waiter) = waiters[index].take() {
            // The caller may have dropped its future; the send still counts.
            let _ = waiter.sender.send(result);
        }
    };
    let bytes = match batch.builder.finish() {
        Ok(bytes) => bytes,
        Err(error) => {
            for index in 0..waiters.len() {
                resolve(&mut waiters, index, Err(ClientError::Record(error.clone())));
            }
            return Vec::new();
        }
    };
    let mut moved = Vec::new();
    let mut attempt = 0u32;
    loop {
        let may_retry = attempt < inner.config.retries;
        let mut retry = false;
        // The broker's own hint (QUOTA_EXCEEDED), when it gave one.
        let mut hint = None;
        match inner.client.enqueue(queue, partition, &bytes).await {
            Ok(response) if response.records.len() != waiters.len() => {
                let message = format!(
                    "enqueue of {} records answered with {} outcomes",
                    waiters.len(),
                    response.records.len()
                );
                for index in 0..waiters.len() {
                    resolve(&mut waiters, index, Err(ClientError::Protocol(message.clone())));
                }
            }
            Ok(response) => {
                for (index, outcome) in response.records.iter().enumerate() {
                    match *outcome {
                        RecordOutcome::Appended { offset }
                        | RecordOutcome::Duplicate { original_offset: offset } => {
                            resolve(&mut waiters, index, Ok(offset));
                        }
                        RecordOutcome::Rejected { code: ErrorCode::KeyMoved } => {
                            if let Some(waiter) = waiters[index].take() {
                                match batch_record(&bytes, index) {
                                    Ok(record) => moved.push(Moved { record, waiter }),
                                    Err(error) => {
                                        let _ = waiter.sender.send(Err(error));
                                    }
                                }
                            }
                        }
                        RecordOutcome::Rejected { code } if code.is_retriable() && may_retry => {
                            retry |= waiters[index].is_some();
                        }
                        RecordOutcome::Rejected { code } => {
                            let error = ClientError::Server {
                                code,
                                message: format!("record {index} of the batch rejected"),
                            };
                            resolve(&mut waiters, index, Err(error));
                        }
                    }
                }
            }
            Err(error) if error.is_retriable() && may_retry => {
                tracing::debug!(%queue, partition = partition.0, attempt, %error, "retrying batch");
                hint = error.retry_after();
                retry = true;
            }
            Err(error) => {
                for index in 0..waiters.len() {
                    resolve(&mut waiters, index, Err(duplicate_error(&error)));
                }
            }
        }
        if !retry {
            break;
        }
        attempt += 1;
        let wait = backoff(inner.config.retry_backoff, attempt, rand::random::<f64>());
        tokio::time::sleep(hint.map_or(wait, |hint| wait.max(hint))).await;
    }
    // Every path above resolves each record, retries, or hands it back
    // moved; the last attempt (`may_retry` false) resolves all of them.
    assert!(waiters.iter().all(Option::is_none));
    moved
}

/// The wait before retry `attempt` (1-based): a ceiling of `base` doubled per
/// retry up to [`RETRY_BACKOFF_MAX`], and a wait drawn in
/// `[ceiling / 2, ceiling]` by `unit` (uniform in `[0, 1)`), so producers
/// that failed together do not retry together, yet each still backs off.
fn backoff(base: Duration, attempt: u32, unit: f64) -> Duration {
    let ceiling =
        base.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(RETRY_BACKOFF_MAX);
    let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.0 };
    let half = ceiling / 2;
    half + (ceiling - half).mul_f64(unit)
}

/// One error per waiter: `ClientError` holds an `io::Error`, which is not
/// `Clone`, so the copy keeps its kind and text.
fn duplicate_error(error: &ClientError) -> ClientError {
    match error {
        ClientError::Server { code, message } => {
            ClientError::Server { code: *code, message: message.clone() }
        }
        ClientError::NotOwner { message, owner } => {
            ClientError::NotOwner { message: message.clone(), owner: owner.clone() }
        }
        ClientError::NotLeader { message, leader } => {
            ClientError::NotLeader { message: message.clone(), leader: leader.clone() }
        }
        ClientError::Io { addr, source } => ClientError::Io {
            addr: addr.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        ClientError::ConnectionClosed { addr, reason } => {
            ClientError::ConnectionClosed { addr: addr.clone(), reason: reason.clone() }
        }
        ClientError::Timeout { timeout_ms } => ClientError::Timeout { timeout_ms: *timeout_ms },
        ClientError::QuotaExceeded { message, retry_after } => {
            ClientError::QuotaExceeded { message: message.clone(), retry_after: *retry_after }
        }
        ClientError::Encode(error) => ClientError::Encode(error.clone()),
        ClientError::Record(error) => ClientError::Record(error.clone()),
        ClientError::UnknownQueue(queue) => ClientError::UnknownQueue(queue.clone()),
        ClientError::RouteExhausted { queue, partition, attempts } => ClientError::RouteExhausted {
            queue: queue.clone(),
            partition: *partition,
            attempts: *attempts,
        },
        other => ClientError::Protocol(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
        // Goal: the wait grows per retry, stops at RETRY_BACKOFF_MAX, and is spread over
        // [ceiling / 2, ceiling] by the random draw (two producers that failed together
        // wait differently). Method: the pure function at the draw's extremes and middle.
        let base = Duration::from_millis(50);
        for (attempt, ceiling_ms) in [(1, 50), (2, 100), (3, 200), (7, 2_000), (40, 2_000)] {
            let ceiling = Duration::from_millis(ceiling_ms);
            assert_eq!(backoff(base, attempt, 0.0), ceiling / 2, "attempt {attempt}");
            assert_eq!(backoff(base, attempt, 1.0), ceiling, "attempt {attempt}");
            let middle = backoff(base, attempt, 0.5);
            assert!(ceiling / 2 < middle && middle < ceiling, "attempt {attempt}: {middle:?}");
        }
        assert_ne!(backoff(base, 2, 0.1), backoff(base, 2, 0.9));
        assert_eq!(backoff(base, 1, f64::NAN), Duration::from_millis(25));
    }

    fn push_kib(accumulator: &mut Accumulator, key: &BatchKey) {
        let message = Message::new(vec![1u8; 1024]);
        let batch = accumulator.open.get_mut(key).unwrap();
        batch.builder.push(&message.into_record(1)).unwrap();
    }

    #[test]
    fn a_keyless_turn_ends_when_its_batch_reaches_the_batch_size() {
        // Goal: keyless messages stay on the sticky partition while its batch is
        // open and under the batch size, and move on (round robin) once it reached
        // that size even though it is still open (due, waiting for in-flight room),
        // or once it was taken. Method: the accumulator alone, batches filled by hand.
        let mut accumulator = Accumulator::default();
        let batch_bytes = 8 * 1024;
        let first = accumulator.keyless_partition("q", 3, batch_bytes);
        assert_eq!(first, PartitionId(0));
        let key = ("q".to_owned(), first);
        open_batch(&mut accumulator, &key);
        push_kib(&mut accumulator, &key);
        assert_eq!(accumulator.keyless_partition("q", 3, batch_bytes), first, "turn continues");
        while accumulator.open[&key].builder.encoded_len_bytes() < batch_bytes {
            push_kib(&mut accumulator, &key);
        }
        assert!(accumulator.open.contains_key(&key), "the full batch is still open");
        let second = accumulator.keyless_partition("q", 3, batch_bytes);
        assert_eq!(second, PartitionId(1), "a batch of the batch size ends the turn");
        let key = ("q".to_owned(), second);
        open_batch(&mut accumulator, &key);
        push_kib(&mut accumulator, &key);
        assert_eq!(accumulator.keyless_partition("q", 3, batch_bytes), second);
        assert!(accumulator.take(&key).is_some());
        assert_eq!(accumulator.keyless_partition("q", 3, batch_bytes), PartitionId(2));
    }
}
