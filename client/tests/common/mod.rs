//! An in-process fake broker for the client tests: a tokio TCP server that
//! speaks the real codec (`spool_wire::proto`), hands every decoded request to
//! a test-supplied handler together with an [`Outbox`] for that connection, so
//! a test decides what to answer, when, in which order, or to close. Pings
//! (the client's liveness probe) are answered at once by the server itself,
//! as the broker does, unless the test asks to see them
//! ([`FakeServer::start_seeing_pings`]).
//! [`MiniBroker`] is a handler with just enough queue semantics (dedupe,
//! claim/extend/ack/release with tokens, metadata) for producer and consumer
//! tests. It is a test double, not a model of the real broker.

#![allow(dead_code, clippy::unwrap_used)] // test support: a failure here is a test failure

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_client::spool_wire::batch::{BatchBytes, BatchView, MessageId};
use spool_client::spool_wire::proto::{
    AckResponse, ApiKey, AssignmentVersion, ClaimResponse, CorrelationId, Delivery, DeliveryToken,
    EnqueueResponse, ErrorResponse, ExtendResponse, FrameDecoder, Generation, LeaderEpoch,
    MetadataResponse, NodeAddress, Offset, PartitionId, PartitionMetadata, PingResponse,
    QueueMetadata, RecordOutcome, ReleaseResponse, Request, Response, DELIVERY_TOKEN_BYTES,
};
use spool_client::spool_wire::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Where a handler's answers go: one connection's writer.
#[derive(Clone)]
pub struct Outbox {
    sender: mpsc::UnboundedSender<Option<Vec<u8>>>,
}

impl Outbox {
    /// Queues encoded frame bytes.
    pub fn send(&self, bytes: Vec<u8>) {
        let _ = self.sender.send(Some(bytes));
    }

    /// Sends `bytes` after `delay`, from a spawned task.
    pub fn send_after(&self, delay: Duration, bytes: Vec<u8>) {
        let outbox = self.clone();
        tokio::spawn(async move {
            // Time under test: the fake broker answers late.
            tokio::time::sleep(delay).await;
            outbox.send(bytes);
        });
    }

    /// Closes the connection after what was queued so far.
    pub fn close(&self) {
        let _ = self.sender.send(None);
    }
}

/// Encodes a success response.
pub fn ok(id: CorrelationId, response: &Response<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    response.encode(id, &mut out).unwrap();
    out
}

/// Encodes an error response.
pub fn err(
    id: CorrelationId,
    key: ApiKey,
    code: ErrorCode,
    message: &str,
    owner: Option<NodeAddress>,
) -> Vec<u8> {
    let mut out = Vec::new();
    ErrorResponse { code, message: message.to_owned(), owner }
        .encode(id, key.as_u16(), 0, &mut out)
        .unwrap();
    out
}

pub type Handler = Arc<dyn Fn(&Request<'_>, CorrelationId, &Outbox) + Send + Sync>;

/// A listening fake server.
pub struct FakeServer {
    pub addr: String,
    pub port: u16,
}

impl FakeServer {
    /// Binds 127.0.0.1 on a free port and serves every connection with
    /// `handler`; Pings are answered without it.
    pub async fn start(handler: Handler) -> Self {
        Self::start_serving(handler, true).await
    }

    /// [`start`](Self::start) whose handler also gets the Pings, to answer
    /// or not.
    pub async fn start_seeing_pings(handler: Handler) -> Self {
        Self::start_serving(handler, false).await
    }

    async fn start_serving(handler: Handler, answer_pings: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&handler), answer_pings));
            }
        });
        Self { addr: format!("127.0.0.1:{port}"), port }
    }
}

async fn serve(socket: tokio::net::TcpStream, handler: Handler, answer_pings: bool) {
    let (mut reader, mut writer) = socket.into_split();
    let (sender, mut queue) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    let outbox = Outbox { sender };
    tokio::spawn(async move {
        while let Some(Some(bytes)) = queue.recv().await {
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut decoder = FrameDecoder::new();
    loop {
        while let Some(frame) = decoder.next_frame().unwrap() {
            let request = Request::decode(&frame).unwrap();
            let id = frame.header.correlation_id;
            if answer_pings && matches!(request, Request::Ping(_)) {
                outbox.send(ok(id, &Response::Ping(PingResponse {})));
                continue;
            }
            handler(&request, id, &outbox);
        }
        let buffer = decoder.read_buf().unwrap();
        match reader.read(buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => decoder.advance(read),
        }
    }
}

// ------------------------------------------------------------ MiniBroker

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredState {
    Ready,
    Claimed,
    Acked,
    Released,
}

pub struct Stored {
    pub id: MessageId,
    pub record: BatchBytes,
    pub state: StoredState,
    pub generation: u64,
    pub attempt: u32,
    /// Extensions of its current claim's lease the broker granted.
    pub extends: u32,
    /// When its current claim was answered.
    pub claimed_at: Option<tokio::time::Instant>,
}

/// What a test scripts for one Enqueue attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueFault {
    /// Append, then close the connection without answering.
    AppendThenClose,
    /// Answer with this error code without appending.
    Refuse(ErrorCode),
}

#[derive(Default)]
pub struct BrokerState {
    /// Where metadata says each partition lives (`host`, `port`).
    pub owners: Vec<(String, u16)>,
    pub queue: String,
    pub partitions: Vec<Vec<Stored>>,
    /// Message ids of every Enqueue request received, in arrival order.
    pub enqueue_attempts: Vec<Vec<MessageId>>,
    /// The partition of every Enqueue request received, in arrival order.
    pub enqueue_partitions: Vec<u32>,
    /// Faults for the next Enqueue attempts, first first.
    pub enqueue_faults: Vec<EnqueueFault>,
    /// When set, every Enqueue is answered only after this long.
    pub enqueue_delay: Option<Duration>,
    pub metadata_requests: usize,
    /// Credits of every claim.
    pub claims: Vec<u32>,
    /// The subscription every claim named (`""`: the default).
    pub claim_subscriptions: Vec<String>,
    pub outstanding: usize,
    pub outstanding_max: usize,
    /// Room the consumer under test may hold (its slots + prefetch). A
    /// claim is a credit violation when it asks for more than this minus
    /// the deliveries it still holds: claimed, not settled, and not counted
    /// in `finished` (a finished handler frees its slot before its Ack is
    /// answered).
    pub slots: usize,
    /// Handlers that returned `Ok` and whose Ack has not arrived; the
    /// tests' handlers count it up, Acks count it down.
    pub finished: usize,
    pub credit_violations: usize,
    pub extends: usize,
    pub acked: Vec<u64>,
    pub released: Vec<(u64, String)>,
    /// Ack requests received, and the most tokens one carried.
    pub ack_requests: usize,
    pub ack_tokens_max: usize,
    /// Ack tokens refused (already acked, or never claimed).
    pub ack_refused: usize,
    /// When set, every claim is answered only after this long.
    pub claim_delay: Option<Duration>,
    /// When set, every Ack is answered only after this long.
    pub ack_delay: Option<Duration>,
    /// Arrival time of every claim.
    pub claim_times: Vec<tokio::time::Instant>,
    /// Claims of partition ANY received (served over every partition, from
    /// a rotating start).
    pub any_claims: usize,
    any_cursor: usize,
}

impl BrokerState {
    pub fn stored(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }
}

fn token(partition: u32, offset: u64, generation: u64) -> DeliveryToken {
    let mut bytes = [0u8; DELIVERY_TOKEN_BYTES];
    bytes[..4].copy_from_slice(&partition.to_le_bytes());
    bytes[4..12].copy_from_slice(&offset.to_le_bytes());
    bytes[12..20].copy_from_slice(&generation.to_le_bytes());
    DeliveryToken(bytes)
}

fn untoken(token: &DeliveryToken) -> (usize, usize, u64) {
    let partition = u32::from_le_bytes(token.0[..4].try_into().unwrap()) as usize;
    let offset = u64::from_le_bytes(token.0[4..12].try_into().unwrap()) as usize;
    let generation = u64::from_le_bytes(token.0[12..20].try_into().unwrap());
    (partition, offset, generation)
}

/// A handler with minimal queue semantics over shared [`BrokerState`].
pub fn mini_broker(state: Arc<Mutex<BrokerState>>) -> Handler {
    Arc::new(move |request, id, outbox| {
        let mut state = state.lock().unwrap();
        let state = &mut *state;
        match request {
            Request::Metadata(_) => {
                state.metadata_requests += 1;
                let partitions = state
                    .owners
                    .iter()
                    .enumerate()
                    .map(|(index, (host, port))| PartitionMetadata {
                        partition: PartitionId(index as u32),
                        host: host.clone(),
                        shard_port: *port,
                        leader_epoch: LeaderEpoch(1),
                    })
                    .collect();
                let response = MetadataResponse {
                    assignment_version: AssignmentVersion(1),
                    queues: vec![QueueMetadata {
                        name: state.queue.clone(),
                        partitions,
                        key_version: 1,
                    }],
                };
                outbox.send(ok(id, &Response::Metadata(response)));
            }
            Request::Enqueue(enqueue) => {
                let view = BatchView::validate(enqueue.batch).unwrap();
                let ids: Vec<MessageId> =
                    view.records().map(|record| MessageId(record.message_id.0)).collect();
                state.enqueue_attempts.push(ids.clone());
                state.enqueue_partitions.push(enqueue.partition.0);
                let fault = if state.enqueue_faults.is_empty() {
                    None
                } else {
                    Some(state.enqueue_faults.remove(0))
                };
                if let Some(EnqueueFault::Refuse(code)) = fault {
                    outbox.send(err(id, ApiKey::Enqueue, code, "scripted refusal", None));
                    return;
                }
                let log = &mut state.partitions[enqueue.partition.0 as usize];
                let mut records = Vec::new();
                for (index, message_id) in ids.iter().enumerate() {
                    if let Some(offset) = log.iter().position(|stored| stored.id == *message_id) {
                        records.push(RecordOutcome::Duplicate {
                            original_offset: Offset(offset as u64),
                        });
                        continue;
                    }
                    let mut record = BatchBytes::new();
                    record.extend_from_slice(view.record_bytes(index));
                    log.push(Stored {
                        id: *message_id,
                        record,
                        state: StoredState::Ready,
                        generation: 0,
                        attempt: 0,
                        extends: 0,
                        claimed_at: None,
                    });
                    records.push(RecordOutcome::Appended { offset: Offset(log.len() as u64 - 1) });
                }
                if fault == Some(EnqueueFault::AppendThenClose) {
                    outbox.close();
                    return;
                }
                let base_offset = Offset(0);
                let bytes = ok(id, &Response::Enqueue(EnqueueResponse { base_offset, records }));
                match state.enqueue_delay {
                    Some(delay) => outbox.send_after(delay, bytes),
                    None => outbox.send(bytes),
                }
            }
            Request::Claim(claim) => {
                state.claims.push(claim.credits);
                state.claim_subscriptions.push(claim.subscription.to_owned());
                state.claim_times.push(tokio::time::Instant::now());
                let held = state.outstanding.saturating_sub(state.finished);
                if state.slots > 0 && held + claim.credits as usize > state.slots {
                    state.credit_violations += 1;
                }
                let count = state.partitions.len();
                let order: Vec<usize> = if claim.partition == PartitionId::ANY {
                    state.any_claims += 1;
                    state.any_cursor += 1;
                    (0..count).map(|n| (state.any_cursor + n) % count).collect()
                } else {
                    vec![claim.partition.0 as usize]
                };
                let mut picked = Vec::new();
                for partition in order {
                    let log = &mut state.partitions[partition];
                    for (offset, stored) in log.iter_mut().enumerate() {
                        if picked.len() == claim.credits as usize {
                            break;
                        }
                        if stored.state == StoredState::Ready {
                            stored.state = StoredState::Claimed;
                            stored.generation += 1;
                            stored.attempt += 1;
                            stored.claimed_at = Some(tokio::time::Instant::now());
                            picked.push((partition, offset));
                        }
                    }
                }
                let partitions = &state.partitions;
                let deliveries = picked
                    .iter()
                    .map(|&(partition, offset)| {
                        let stored = &partitions[partition][offset];
                        Delivery {
                            token: token(partition as u32, offset as u64, stored.generation),
                            partition: PartitionId(partition as u32),
                            offset: Offset(offset as u64),
                            attempt: stored.attempt,
                            generation: Generation(stored.generation),
                            record: stored.record.as_slice(),
                        }
                    })
                    .collect::<Vec<_>>();
                let count = deliveries.len();
                let bytes =
                    ok(id, &Response::Claim(ClaimResponse { lease_deadline_ms: 99, deliveries }));
                state.outstanding += count;
                state.outstanding_max = state.outstanding_max.max(state.outstanding);
                if let Some(delay) = state.claim_delay {
                    outbox.send_after(delay, bytes);
                } else if count == 0 {
                    // A short long-poll: answer empty after a while.
                    outbox
                        .send_after(Duration::from_millis(u64::from(claim.wait_ms.min(20))), bytes);
                } else {
                    outbox.send(bytes);
                }
            }
            Request::Extend(extend) => {
                let (partition, offset, generation) = untoken(&extend.token);
                let stored = &mut state.partitions[partition][offset];
                if stored.state == StoredState::Claimed && stored.generation == generation {
                    stored.extends += 1;
                    state.extends += 1;
                    let response = ExtendResponse { lease_deadline_ms: 1000 };
                    outbox.send(ok(id, &Response::Extend(response)));
                } else {
                    outbox.send(err(id, ApiKey::Extend, ErrorCode::StaleToken, "stale", None));
                }
            }
            Request::Ack(ack) => {
                state.ack_requests += 1;
                state.ack_tokens_max = state.ack_tokens_max.max(ack.tokens.len());
                let mut results = Vec::new();
                for token in &ack.tokens {
                    let (partition, offset, generation) = untoken(token);
                    let stored = &mut state.partitions[partition][offset];
                    if stored.state == StoredState::Claimed && stored.generation == generation {
                        stored.state = StoredState::Acked;
                        state.outstanding -= 1;
                        state.finished = state.finished.saturating_sub(1);
                        state.acked.push(offset as u64);
                        results.push(ErrorCode::None);
                    } else {
                        state.ack_refused += 1;
                        results.push(ErrorCode::StaleToken);
                    }
                }
                let bytes = ok(id, &Response::Ack(AckResponse { results }));
                match state.ack_delay {
                    Some(delay) => outbox.send_after(delay, bytes),
                    None => outbox.send(bytes),
                }
            }
            Request::Release(release) => {
                let (partition, offset, generation) = untoken(&release.token);
                let stored = &mut state.partitions[partition][offset];
                if stored.state == StoredState::Claimed && stored.generation == generation {
                    // Released messages stay out of the way so tests end.
                    stored.state = StoredState::Released;
                    state.outstanding -= 1;
                    state.released.push((offset as u64, release.reason.to_owned()));
                    let response = ReleaseResponse { not_before_ms: 5 };
                    outbox.send(ok(id, &Response::Release(response)));
                } else {
                    outbox.send(err(id, ApiKey::Release, ErrorCode::StaleToken, "stale", None));
                }
            }
            other => {
                outbox.send(err(
                    id,
                    other.api_key(),
                    ErrorCode::InvalidArgument,
                    "unsupported",
                    None,
                ));
            }
        }
    })
}

/// Starts a [`MiniBroker`] serving one queue with `partitions` partitions, all
/// owned by itself.
pub async fn start_broker(queue: &str, partitions: u32) -> (FakeServer, Arc<Mutex<BrokerState>>) {
    let state = Arc::new(Mutex::new(BrokerState {
        queue: queue.to_owned(),
        partitions: (0..partitions).map(|_| Vec::new()).collect(),
        ..BrokerState::default()
    }));
    let server = FakeServer::start(mini_broker(Arc::clone(&state))).await;
    state.lock().unwrap().owners =
        (0..partitions).map(|_| ("127.0.0.1".to_owned(), server.port)).collect();
    (server, state)
}

/// Extensions the broker granted to the lease of `delivery`'s message.
pub fn extends_of(state: &Mutex<BrokerState>, delivery: &spool_client::Delivery) -> u32 {
    stored_of(state, delivery).0
}

/// The extensions of `delivery`'s lease and how long ago it was claimed.
pub fn stored_of(state: &Mutex<BrokerState>, delivery: &spool_client::Delivery) -> (u32, Duration) {
    let state = state.lock().unwrap();
    let stored = &state.partitions[delivery.partition().0 as usize][delivery.offset().0 as usize];
    (stored.extends, stored.claimed_at.map_or(Duration::ZERO, |at| at.elapsed()))
}

/// Polls `condition` every 5 ms until it holds or `limit` passes.
pub async fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let polls = limit.as_millis() / 5;
    for _ in 0..polls {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

pub type Shared<T> = Arc<Mutex<T>>;
pub type Counts = HashMap<u32, u64>;
