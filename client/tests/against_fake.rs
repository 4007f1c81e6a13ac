//! Client behaviour against the in-process fake broker (`common`): pipelining,
//! timeouts, NOT_OWNER routing, producer batching and retries, consumer slots,
//! extension, ack/release and drain. Every test runs under a timeout well
//! below 20 s.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    err, extends_of, ok, start_broker, stored_of, wait_for, EnqueueFault, FakeServer, Handler,
};
use spool_client::spool_wire::proto::{
    ApiKey, CorrelationId, DeadLettersRequest, EnqueueResponse, MetadataResponse, NodeAddress,
    Offset, PartitionId, PeekRequest, PurgeRequest, PurgeResponse, RecordOutcome, RedriveRequest,
    RedriveTarget, Request, Response, INSPECT_VERSION_SUBSCRIPTION,
};
use spool_client::spool_wire::proto::{
    CreateQueueRequest, QueueConfig, CREATE_QUEUE_VERSION_ORDERED, CREATE_QUEUE_VERSION_RETENTION,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    request_version, Client, ClientError, Connection, ConnectionConfig, Consumer, ConsumerConfig,
    Delivery, Message, PayloadView, Producer, ProducerConfig,
};

const TEST_LIMIT: Duration = Duration::from_secs(15);

async fn bounded<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_LIMIT, future).await.expect("test exceeded its time limit")
}

fn purge(partition: u32) -> Request<'static> {
    Request::Purge(PurgeRequest {
        queue: "q".into(),
        partition: PartitionId(partition),
        dry_run: true,
        subscription: String::new(),
    })
}

// Goal: Peek, DeadLetters, Purge and Redrive go out as v1 (what brokers
// from before subscriptions speak) unless they name a subscription, which
// only v2 carries; method: `request_version` of each, default and named.
#[test]
fn inspection_requests_name_a_subscription_in_version_2_only() {
    let of = |sub: &str| {
        let (queue, partition, subscription) = ("q".to_owned(), PartitionId(0), sub.to_owned());
        let (from_offset, max) = (Offset(0), 10);
        [
            Request::Peek(PeekRequest {
                queue: queue.clone(),
                partition,
                from_offset,
                max,
                subscription: subscription.clone(),
            }),
            Request::DeadLetters(DeadLettersRequest {
                queue: queue.clone(),
                partition,
                from_offset,
                max,
                subscription: subscription.clone(),
            }),
            Request::Purge(PurgeRequest {
                queue: queue.clone(),
                partition,
                dry_run: true,
                subscription: subscription.clone(),
            }),
            Request::Redrive(RedriveRequest {
                queue,
                partition,
                target: RedriveTarget::All,
                subscription,
            }),
        ]
    };
    for request in of("") {
        assert_eq!(request_version(&request), 1, "{request:?}");
    }
    for request in of("audit") {
        assert_eq!(request_version(&request), INSPECT_VERSION_SUBSCRIPTION, "{request:?}");
    }
}

// Goal: a CreateQueue goes as v1 (what brokers from before retention
// windows speak) unless its queue has a window, which only v2 carries (an
// old broker then refuses it instead of creating the queue without it);
// method: `request_version` without a window, with each kind of window.
#[test]
fn create_queue_carries_a_window_in_version_2_only() {
    let create = |retention_ms, retention_bytes| {
        let config =
            QueueConfig { retention_ms, retention_bytes, ..spool_client::default_queue_config(2) };
        Request::CreateQueue(CreateQueueRequest { name: "q".into(), config })
    };
    assert_eq!(request_version(&create(0, 0)), 1);
    for (ms, bytes) in [(60_000, 0), (0, 1 << 20), (60_000, 1 << 20)] {
        assert_eq!(request_version(&create(ms, bytes)), CREATE_QUEUE_VERSION_RETENTION);
    }
}

// Goal: an ordered queue's CreateQueue goes as v3, the only version that
// carries `ordered` (an old broker refuses it instead of creating the queue
// unordered), with or without a window; an unordered queue keeps v1 or v2;
// method: `request_version` over the four combinations.
#[test]
fn create_queue_carries_ordered_in_version_3_only() {
    let create = |ordered, retention_ms| {
        let config = QueueConfig { ordered, retention_ms, ..spool_client::default_queue_config(2) };
        Request::CreateQueue(CreateQueueRequest { name: "q".into(), config })
    };
    assert_eq!(request_version(&create(false, 0)), 1);
    assert_eq!(request_version(&create(false, 60_000)), CREATE_QUEUE_VERSION_RETENTION);
    assert_eq!(request_version(&create(true, 0)), CREATE_QUEUE_VERSION_ORDERED);
    assert_eq!(request_version(&create(true, 60_000)), CREATE_QUEUE_VERSION_ORDERED);
}

// Goal: requests are pipelined and responses matched by id, not position.
// Method: the server holds every answer until all five requests arrived (a
// client that waited per request would deadlock), then answers in reverse
// order; each caller must get the count equal to its own partition number.
#[tokio::test]
async fn pipelining_with_out_of_order_responses() {
    let held: Arc<Mutex<Vec<(CorrelationId, u32)>>> = Arc::default();
    let handler: Handler = {
        let held = Arc::clone(&held);
        Arc::new(move |request, id, outbox| {
            let Request::Purge(purge) = request else { panic!("unexpected {request:?}") };
            let mut held = held.lock().unwrap();
            held.push((id, purge.partition.0));
            if held.len() == 5 {
                for &(id, partition) in held.iter().rev() {
                    let response = Response::Purge(PurgeResponse { count: partition.into() });
                    outbox.send(ok(id, &response));
                }
            }
        })
    };
    let server = FakeServer::start(handler).await;
    let connection = Connection::connect(&server.addr, ConnectionConfig::default()).await.unwrap();
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let calls = (0..5u32).map(|partition| {
        let (connection, order) = (connection.clone(), Arc::clone(&order));
        async move {
            let bytes = connection.call(&purge(partition)).await.unwrap();
            let Response::Purge(response) = bytes.response().unwrap() else { panic!() };
            order.lock().unwrap().push(partition);
            assert_eq!(response.count, u64::from(partition));
        }
    });
    bounded(futures_join(calls.collect())).await;
    assert_eq!(*order.lock().unwrap(), [4, 3, 2, 1, 0]);
    assert_eq!(connection.in_flight(), 0);
}

async fn futures_join(futures: Vec<impl std::future::Future<Output = ()> + Send + 'static>) {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    for handle in handles {
        handle.await.unwrap();
    }
}

// Goal: a request without an answer fails with TIMEOUT after the configured
// time, leaves nothing pending, and the connection keeps working (a late
// answer to the abandoned id is ignored). Method: timeout 150 ms; the server
// holds its answer to partition 0 and writes it only when the next request
// (partition 1) comes, just before that one's answer on the same stream, so
// the client reads the late answer first (no sleep to wait for it).
#[tokio::test]
async fn per_request_timeout() {
    let held: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let late = Arc::clone(&held);
    let handler: Handler = Arc::new(move |request, id, outbox| {
        let Request::Purge(purge) = request else { panic!() };
        let bytes = ok(id, &Response::Purge(PurgeResponse { count: 7 }));
        if purge.partition.0 == 0 {
            *late.lock().unwrap() = Some(bytes);
        } else {
            if let Some(late) = late.lock().unwrap().take() {
                outbox.send(late);
            }
            outbox.send(bytes);
        }
    });
    let server = FakeServer::start(handler).await;
    let config = ConnectionConfig {
        request_timeout: Duration::from_millis(150),
        ..ConnectionConfig::default()
    };
    let connection = Connection::connect(&server.addr, config).await.unwrap();
    bounded(async {
        let error = connection.call(&purge(0)).await.unwrap_err();
        assert!(matches!(error, ClientError::Timeout { timeout_ms: 150 }), "{error:?}");
        assert_eq!(error.code(), Some(ErrorCode::Timeout));
        assert!(error.is_retriable());
        assert_eq!(connection.in_flight(), 0);
        assert!(held.lock().unwrap().is_some(), "the server holds the unanswered request");
        let bytes = connection.call(&purge(1)).await.unwrap();
        assert!(held.lock().unwrap().is_none(), "the late answer went out first");
        assert!(matches!(bytes.response().unwrap(), Response::Purge(PurgeResponse { count: 7 })));
        assert!(!connection.is_closed());
    })
    .await;
}

#[derive(Default)]
struct RouteState {
    bootstrap_port: u16,
    owner_port: u16,
    with_hint: bool,
    metadata_requests: usize,
    bootstrap_enqueues: usize,
    owner_enqueues: usize,
}

fn metadata_naming(port: u16) -> MetadataResponse {
    use spool_client::spool_wire::proto::{
        AssignmentVersion, LeaderEpoch, PartitionMetadata, QueueMetadata,
    };
    MetadataResponse {
        assignment_version: AssignmentVersion(1),
        queues: vec![QueueMetadata {
            name: "q".into(),
            partitions: vec![PartitionMetadata {
                partition: PartitionId(0),
                host: "127.0.0.1".into(),
                shard_port: port,
                leader_epoch: LeaderEpoch(1),
            }],
            key_version: 1,
        }],
    }
}

/// The bootstrap first claims partition 0 itself and refuses enqueues with
/// NOT_OWNER. Without a hint its metadata moves to the owner on refresh; with
/// a hint (the owner's address in the error) its metadata stays stale.
fn bootstrap_handler(state: Arc<Mutex<RouteState>>) -> Handler {
    Arc::new(move |request, id, outbox| {
        let mut state = state.lock().unwrap();
        match request {
            Request::Metadata(_) => {
                state.metadata_requests += 1;
                let moved = !state.with_hint && state.metadata_requests > 1;
                let port = if moved { state.owner_port } else { state.bootstrap_port };
                outbox.send(ok(id, &Response::Metadata(metadata_naming(port))));
            }
            Request::Enqueue(_) => {
                state.bootstrap_enqueues += 1;
                let hint = state
                    .with_hint
                    .then(|| NodeAddress { host: "127.0.0.1".into(), port: state.owner_port });
                outbox.send(err(id, ApiKey::Enqueue, ErrorCode::NotOwner, "moved", hint));
            }
            _ => panic!("unexpected {request:?}"),
        }
    })
}

fn owner_handler(state: Arc<Mutex<RouteState>>) -> Handler {
    Arc::new(move |request, id, outbox| {
        let Request::Enqueue(_) = request else { panic!("unexpected {request:?}") };
        state.lock().unwrap().owner_enqueues += 1;
        let records = vec![RecordOutcome::Appended { offset: Offset(41) }];
        outbox
            .send(ok(id, &Response::Enqueue(EnqueueResponse { base_offset: Offset(41), records })));
    })
}

async fn run_not_owner(with_hint: bool) {
    let state = Arc::new(Mutex::new(RouteState { with_hint, ..RouteState::default() }));
    let bootstrap = FakeServer::start(bootstrap_handler(Arc::clone(&state))).await;
    let owner = FakeServer::start(owner_handler(Arc::clone(&state))).await;
    {
        let mut state = state.lock().unwrap();
        state.bootstrap_port = bootstrap.port;
        state.owner_port = owner.port;
    }
    let client = Client::connect(&bootstrap.addr).await.unwrap();
    let batch = one_record_batch();
    let response = bounded(client.enqueue("q", PartitionId(0), &batch)).await.unwrap();
    assert_eq!(response.records, [RecordOutcome::Appended { offset: Offset(41) }]);
    let state = state.lock().unwrap();
    assert_eq!(state.bootstrap_enqueues, 1);
    assert_eq!(state.owner_enqueues, 1);
    assert_eq!(state.metadata_requests, 2, "initial fetch plus one refresh");
}

fn one_record_batch() -> spool_client::spool_wire::batch::BatchBytes {
    use spool_client::spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
    let mut builder = DataBatchBuilder::new();
    builder
        .push(&Record {
            message_id: MessageId([1; 16]),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(b"x".to_vec()),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: 1,
        })
        .unwrap();
    builder.finish().unwrap()
}

// Goal: NOT_OWNER refreshes metadata and retries at the refreshed owner.
// Method: the bootstrap refuses with NOT_OWNER (no owner named) and its
// refreshed metadata names a second server, which must get the retry.
#[tokio::test]
async fn not_owner_refreshes_metadata_and_retries() {
    run_not_owner(false).await;
}

// Goal: the owner named in NOT_OWNER wins over stale metadata. Method: the
// bootstrap's metadata keeps naming itself; only the error's owner hint
// points at the second server, which must get the retry.
#[tokio::test]
async fn not_owner_follows_the_owner_hint() {
    run_not_owner(true).await;
}

// Goal: NOT_OWNER forever ends with RouteExhausted, not a loop. Method: both
// metadata and the hint keep naming the refusing bootstrap.
#[tokio::test]
async fn not_owner_retries_are_bounded() {
    let state = Arc::new(Mutex::new(RouteState::default()));
    let bootstrap = FakeServer::start(bootstrap_handler(Arc::clone(&state))).await;
    {
        let mut state = state.lock().unwrap();
        state.bootstrap_port = bootstrap.port;
        state.owner_port = bootstrap.port;
        state.with_hint = true;
    }
    let client = Client::connect(&bootstrap.addr).await.unwrap();
    let error =
        bounded(client.enqueue("q", PartitionId(0), &one_record_batch())).await.unwrap_err();
    assert!(matches!(error, ClientError::RouteExhausted { attempts: 4, .. }), "{error:?}");
    assert_eq!(state.lock().unwrap().bootstrap_enqueues, 4);
}

// Goal: a request whose owner cannot be reached (a leader that died) goes
// to the owner fresh metadata names, once it names another: nothing was
// sent, so any request may go again (an ack after a failover used to be
// dropped here). Method: the first metadata names a closed port, the
// refreshed one a live server, which must get the enqueue.
#[tokio::test]
async fn an_unreachable_owner_is_replaced_by_the_refreshed_one() {
    let dead_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let state = Arc::new(Mutex::new(RouteState::default()));
    let owner = FakeServer::start(owner_handler(Arc::clone(&state))).await;
    let owner_port = owner.port;
    let metadata = Arc::clone(&state);
    let bootstrap = FakeServer::start(Arc::new(move |request, id, outbox| {
        let Request::Metadata(_) = request else { panic!("unexpected {request:?}") };
        let mut state = metadata.lock().unwrap();
        state.metadata_requests += 1;
        let port = if state.metadata_requests == 1 { dead_port } else { owner_port };
        outbox.send(ok(id, &Response::Metadata(metadata_naming(port))));
    }))
    .await;
    let client = Client::connect(&bootstrap.addr).await.unwrap();
    let response = bounded(client.enqueue("q", PartitionId(0), &one_record_batch())).await.unwrap();
    assert_eq!(response.records, [RecordOutcome::Appended { offset: Offset(41) }]);
    let state = state.lock().unwrap();
    assert_eq!(state.owner_enqueues, 1);
    assert_eq!(state.metadata_requests, 2, "initial fetch plus one after the failed connect");
}

// Goal: a cached queue's metadata older than METADATA_MAX_AGE is fetched
// again in the background, so a producer finds a resize's added partition
// without an error first. Method: the first metadata names 1 partition,
// later ones 2; once the age has passed, the next call answers from the
// cache and starts the fetch, after which the count is 2 (≈ 10 s).
#[tokio::test]
async fn old_metadata_is_fetched_again_in_the_background() {
    let fetches = Arc::new(Mutex::new(0u32));
    let counted = Arc::clone(&fetches);
    let bootstrap = FakeServer::start(Arc::new(move |request, id, outbox| {
        let Request::Metadata(_) = request else { panic!("unexpected {request:?}") };
        let mut fetches = counted.lock().unwrap();
        *fetches += 1;
        let mut metadata = metadata_naming(1);
        if *fetches > 1 {
            let mut second = metadata.queues[0].partitions[0].clone();
            second.partition = PartitionId(1);
            metadata.queues[0].partitions.push(second);
        }
        outbox.send(ok(id, &Response::Metadata(metadata)));
    }))
    .await;
    let client = Client::connect(&bootstrap.addr).await.unwrap();
    assert_eq!(client.partition_count("q").await.unwrap(), 1);
    assert_eq!(*fetches.lock().unwrap(), 1, "a young cache is not fetched again");
    // Real time (tokio's paused clock needs a feature the workspace does
    // not build): the age is 10 s.
    tokio::time::sleep(spool_client::limits::METADATA_MAX_AGE + Duration::from_millis(200)).await;
    assert_eq!(client.partition_count("q").await.unwrap(), 1, "answered from the cache");
    let refreshed = bounded(async {
        loop {
            if client.partition_count("q").await.unwrap() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    refreshed.await;
    assert_eq!(*fetches.lock().unwrap(), 2);
}

// ------------------------------------------------------------ producer

// Goal: messages sent within the linger window travel in one batch, flushed
// by the linger timer. Method: 3 concurrent sends, linger 300 ms, a batch
// limit far above their size; the broker must see exactly one Enqueue of 3.
#[tokio::test]
async fn producer_linger_flush_batches_concurrent_sends() {
    let (server, state) = start_broker("q", 1).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let config = ProducerConfig { linger: Duration::from_millis(300), ..ProducerConfig::default() };
    let producer = Producer::new(client, config).unwrap();
    let mut pending = Vec::new();
    for n in 0..3u8 {
        pending.push(producer.submit("q", Message::new(vec![n; 10])).await.unwrap());
    }
    assert!(state.lock().unwrap().enqueue_attempts.is_empty(), "sent before the linger passed");
    let mut offsets = Vec::new();
    for future in pending {
        offsets.push(bounded(future).await.unwrap().0);
    }
    assert_eq!(offsets, [0, 1, 2]);
    let state = state.lock().unwrap();
    assert_eq!(state.enqueue_attempts.len(), 1);
    assert_eq!(state.enqueue_attempts[0].len(), 3);
}

// Goal: a batch that reaches max_batch_bytes is sent at once, without
// waiting for the linger. Method: linger 60 s (longer than the test limit),
// 1 KiB payloads, max_batch_bytes 2500: six sends must resolve, in batches of
// 3 records (the one that crosses the limit goes with it).
#[tokio::test]
async fn producer_size_flush_does_not_wait_for_linger() {
    let (server, state) = start_broker("q", 1).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let config = ProducerConfig {
        linger: Duration::from_secs(60),
        max_batch_bytes: 2500,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, config).unwrap();
    let mut pending = Vec::new();
    for n in 0..6u8 {
        pending.push(producer.submit("q", Message::new(vec![n; 1024])).await.unwrap());
    }
    for future in pending {
        bounded(future).await.unwrap();
    }
    let state = state.lock().unwrap();
    let sizes: Vec<usize> = state.enqueue_attempts.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3]);
    assert_eq!(state.stored(), 6);
}

// Goal: a retried batch reuses its message ids, so a retry of a batch the
// broker already appended never duplicates. Method: attempt 1 appends and
// drops the connection (outcome unknown), attempt 2 is refused QUEUE_FULL,
// attempt 3 succeeds via dedupe; the ids of all three attempts must match,
// three records stored, and the offsets are the originals.
#[tokio::test]
async fn producer_retries_reuse_message_ids() {
    let (server, state) = start_broker("q", 1).await;
    state.lock().unwrap().enqueue_faults =
        vec![EnqueueFault::AppendThenClose, EnqueueFault::Refuse(ErrorCode::QueueFull)];
    let client = Client::connect(&server.addr).await.unwrap();
    let config = ProducerConfig {
        linger: Duration::from_millis(20),
        retry_backoff: Duration::from_millis(10),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, config).unwrap();
    let mut pending = Vec::new();
    for n in 0..3u8 {
        pending.push(producer.submit("q", Message::new(vec![n; 8]).key("k")).await.unwrap());
    }
    let mut offsets = Vec::new();
    for future in pending {
        offsets.push(bounded(future).await.unwrap().0);
    }
    assert_eq!(offsets, [0, 1, 2]);
    let state = state.lock().unwrap();
    assert_eq!(state.enqueue_attempts.len(), 3);
    assert_eq!(state.enqueue_attempts[0], state.enqueue_attempts[1]);
    assert_eq!(state.enqueue_attempts[1], state.enqueue_attempts[2]);
    assert_eq!(state.stored(), 3, "a retry must not duplicate");
}

// Goal: a non-retriable error fails the sends without retrying. Method: the
// broker refuses with INVALID_ARGUMENT once; exactly one attempt is made.
#[tokio::test]
async fn producer_does_not_retry_non_retriable_errors() {
    let (server, state) = start_broker("q", 1).await;
    state.lock().unwrap().enqueue_faults = vec![EnqueueFault::Refuse(ErrorCode::InvalidArgument)];
    let client = Client::connect(&server.addr).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    let error = bounded(producer.send("q", Message::new("x"))).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument));
    assert_eq!(state.lock().unwrap().enqueue_attempts.len(), 1);
}

// Goal: with zero linger a message leaves at once (no timer), and messages
// submitted while the partition's batch is in flight wait and go together
// in the next batch. Method: one partition, in_flight_per_partition 1, the
// fake answers each Enqueue after 300 ms; send one message, then 99 more
// while the first is in flight: exactly two Enqueues, of 1 and 99 records,
// the first one arriving well before any linger could have passed.
#[tokio::test]
async fn producer_zero_linger_sends_at_once_and_batches_while_in_flight() {
    let (server, state) = start_broker("q", 1).await;
    state.lock().unwrap().enqueue_delay = Some(Duration::from_millis(300));
    let client = Client::connect(&server.addr).await.unwrap();
    let config = ProducerConfig {
        linger: Duration::ZERO,
        in_flight_per_partition: 1,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, config).unwrap();
    let first = producer.submit("q", Message::new(b"first".to_vec())).await.unwrap();
    assert!(
        wait_for(Duration::from_millis(200), || state.lock().unwrap().enqueue_attempts.len() == 1)
            .await,
        "a zero-linger message must be sent at once"
    );
    let mut rest = Vec::new();
    for n in 0..99 {
        rest.push(producer.submit("q", Message::new(format!("m-{n}"))).await.unwrap());
    }
    assert_eq!(state.lock().unwrap().enqueue_attempts.len(), 1, "the rest waits for the slot");
    bounded(first).await.unwrap();
    for send in rest {
        bounded(send).await.unwrap();
    }
    let sizes: Vec<usize> = state.lock().unwrap().enqueue_attempts.iter().map(Vec::len).collect();
    assert_eq!(sizes, [1, 99]);
}

// Goal: keyless messages go round robin while each batch leaves at once
// (low load). Method: 8 keyless sends, each awaited before the next, to a
// 4-partition queue: the Enqueues name partitions 0, 1, 2, 3, 0, 1, 2, 3.
#[tokio::test]
async fn producer_keyless_messages_go_round_robin_at_low_load() {
    let (server, state) = start_broker("q", 4).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    for n in 0..8u8 {
        let send = producer.submit("q", Message::new(vec![n; 8])).await.unwrap();
        assert_eq!(send.partition(), PartitionId(u32::from(n) % 4));
        bounded(send).await.unwrap();
    }
    assert_eq!(state.lock().unwrap().enqueue_partitions, [0, 1, 2, 3, 0, 1, 2, 3]);
}

// Goal: when the producer has PRODUCER_IN_FLIGHT_BATCHES_MAX batches in
// flight, a due batch waits and grows instead of queueing as a one-record
// request, and keyless messages stick to one partition's open batch meanwhile
// (a wide queue under load gets full batches, not one record per partition).
// Method: a 128-partition queue whose Enqueues are answered after 300 ms;
// 64 keyless messages leave at once, one per partition 0..63; 100 more
// submitted while those are in flight must all join partition 64's batch and
// go as one Enqueue of 100 once a slot frees (before: 100 more requests of 1
// record, spread over partitions 64..127 and 0..35).
#[tokio::test]
async fn producer_keyless_batches_grow_on_one_partition_while_the_producer_is_at_its_bound() {
    let (server, state) = start_broker("q", 128).await;
    state.lock().unwrap().enqueue_delay = Some(Duration::from_millis(300));
    let client = Client::connect(&server.addr).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    let bound = spool_client::limits::PRODUCER_IN_FLIGHT_BATCHES_MAX;
    let mut sends = Vec::new();
    for _ in 0..bound {
        sends.push(producer.submit("q", Message::new(vec![1u8; 8])).await.unwrap());
    }
    assert!(
        wait_for(Duration::from_millis(250), || state.lock().unwrap().enqueue_attempts.len()
            == bound)
        .await,
        "the first {bound} messages leave at once"
    );
    for _ in 0..100 {
        let send = producer.submit("q", Message::new(vec![2u8; 8])).await.unwrap();
        assert_eq!(send.partition(), PartitionId(bound as u32), "keyless messages stick");
        sends.push(send);
    }
    assert_eq!(state.lock().unwrap().enqueue_attempts.len(), bound, "the rest waits for a slot");
    for send in sends {
        bounded(send).await.unwrap();
    }
    let state = state.lock().unwrap();
    let sizes: Vec<usize> = state.enqueue_attempts.iter().map(Vec::len).collect();
    let mut expected = vec![1; bound];
    expected.push(100);
    assert_eq!(sizes, expected);
    let expected_partitions: Vec<u32> = (0..=bound as u32).collect();
    assert_eq!(state.enqueue_partitions, expected_partitions);
    assert_eq!(state.stored(), bound + 100);
}

// Goal: a slot freed under the producer-wide bound goes to the batch that
// waited longest, not to the partition that just finished (a busy partition
// cannot keep the slots to itself while another's batch waits). Method: a
// 2-partition queue whose Enqueues are answered after 300 ms,
// in_flight_per_partition at the bound; 64 one-record batches of key A fill
// the bound; then one message of key B, then 10 more of key A, all waiting;
// the 65th Enqueue must be B's, the 66th A's batch of 10.
#[tokio::test]
async fn producer_gives_a_freed_slot_to_the_batch_that_waited_longest() {
    let (server, state) = start_broker("q", 2).await;
    state.lock().unwrap().enqueue_delay = Some(Duration::from_millis(300));
    let client = Client::connect(&server.addr).await.unwrap();
    let bound = spool_client::limits::PRODUCER_IN_FLIGHT_BATCHES_MAX;
    let config = ProducerConfig { in_flight_per_partition: bound, ..ProducerConfig::default() };
    let producer = Producer::new(client, config).unwrap();
    let key_of = |partition: u32| {
        (0..)
            .map(|n| format!("key-{n}"))
            .find(|key| spool_client::partition_for_key(key.as_bytes(), 2).0 == partition)
            .unwrap()
    };
    let (key_a, key_b) = (key_of(0), key_of(1));
    let mut sends = Vec::new();
    for _ in 0..bound {
        sends.push(
            producer.submit("q", Message::new(vec![1u8; 8]).key(key_a.clone())).await.unwrap(),
        );
    }
    assert!(
        wait_for(Duration::from_millis(250), || state.lock().unwrap().enqueue_attempts.len()
            == bound)
        .await,
        "the first {bound} batches leave at once"
    );
    sends.push(producer.submit("q", Message::new(vec![2u8; 8]).key(key_b.clone())).await.unwrap());
    for _ in 0..10 {
        sends.push(
            producer.submit("q", Message::new(vec![3u8; 8]).key(key_a.clone())).await.unwrap(),
        );
    }
    for send in sends {
        bounded(send).await.unwrap();
    }
    let state = state.lock().unwrap();
    let sizes: Vec<usize> = state.enqueue_attempts.iter().map(Vec::len).collect();
    assert_eq!(sizes.len(), bound + 2, "{sizes:?}");
    assert_eq!(
        state.enqueue_partitions[bound],
        1,
        "B's batch waited longest: {:?}",
        &state.enqueue_partitions[bound..]
    );
    assert_eq!((state.enqueue_partitions[bound + 1], sizes[bound + 1]), (0, 10));
}

// ------------------------------------------------------------ consumer

async fn fill(state: &Arc<Mutex<common::BrokerState>>, server: &FakeServer, payloads: &[&str]) {
    let client = Client::connect(&server.addr).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    for payload in payloads {
        producer.submit("q", Message::new(payload.as_bytes().to_vec())).await.unwrap();
    }
    producer.flush().await;
    assert_eq!(state.lock().unwrap().stored(), payloads.len());
}

/// An instant handler that succeeds and counts itself in the fake's
/// `finished` (so its slot may be claimed again before the Ack arrives).
fn counting_handler(
    state: &Arc<Mutex<common::BrokerState>>,
) -> impl Fn(Delivery) -> std::future::Ready<Result<(), String>> + Send + Sync + 'static {
    let state = Arc::clone(state);
    move |_delivery: Delivery| {
        state.lock().unwrap().finished += 1;
        std::future::ready(Ok(()))
    }
}

fn payload_text(delivery: &Delivery) -> String {
    match delivery.payload() {
        PayloadView::Inline(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
        PayloadView::Reference { .. } => panic!("inline expected"),
    }
}

// Goal: the consumer never runs more handlers than slots, asks exactly its
// free slots as credits, extends leases while handlers run, acks successes
// and releases failures with the error text. Method: 12 messages over 2
// partitions (3 fail), 3 slots, a 40 ms extend interval; each handler runs
// until the broker has granted an extension of its own lease (the event,
// not a sleep); the broker checks every claim against the deliveries the
// consumer still holds (claimed, not settled, handler not finished).
#[tokio::test]
async fn consumer_respects_slots_extends_acks_and_releases() {
    let (server, state) = start_broker("q", 2).await;
    state.lock().unwrap().slots = 3;
    let payloads: Vec<String> =
        (0..12).map(|n| if n % 4 == 1 { format!("fail-{n}") } else { format!("ok-{n}") }).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    fill(&state, &server, &refs).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 3);
    config.lease_ms = 1000;
    config.wait_ms = 20;
    config.extend_interval = Some(Duration::from_millis(40));
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let running_max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let (running, running_max) = (Arc::clone(&running), Arc::clone(&running_max));
        let state = Arc::clone(&state);
        move |delivery: Delivery| {
            let (running, running_max) = (Arc::clone(&running), Arc::clone(&running_max));
            let state = Arc::clone(&state);
            async move {
                use std::sync::atomic::Ordering;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                running_max.fetch_max(now, Ordering::SeqCst);
                let extended = wait_for(TEST_LIMIT, || extends_of(&state, &delivery) >= 1).await;
                assert!(extended, "the lease of a running handler is extended");
                running.fetch_sub(1, Ordering::SeqCst);
                let text = payload_text(&delivery);
                assert_eq!(delivery.attempt(), 1);
                if text.starts_with("fail") {
                    Err(format!("boom: {text}"))
                } else {
                    state.lock().unwrap().finished += 1;
                    Ok(())
                }
            }
        }
    };
    let consumer = Consumer::start(client, config, handler).unwrap();
    let done = wait_for(TEST_LIMIT, || {
        let state = state.lock().unwrap();
        state.acked.len() + state.released.len() == 12
    })
    .await;
    assert!(done, "not every message was settled");
    let stats = bounded(consumer.shutdown()).await;
    let state = state.lock().unwrap();
    assert_eq!(state.credit_violations, 0, "claimed more than free slots: {:?}", state.claims);
    assert!(stats.outstanding_max <= 3);
    assert!(stats.running_max <= 3);
    assert!(running_max.load(std::sync::atomic::Ordering::SeqCst) <= 3);
    assert!(state.claims.iter().all(|&credits| (1..=3).contains(&credits)));
    assert_eq!(state.acked.len(), 9);
    let mut reasons: Vec<String> =
        state.released.iter().map(|(_, reason)| reason.clone()).collect();
    reasons.sort();
    assert_eq!(reasons, ["boom: fail-1", "boom: fail-5", "boom: fail-9"]);
    assert!(state.extends >= 12, "each handler's lease was extended: {}", state.extends);
    assert_eq!(stats.acked, 9);
    assert_eq!(stats.released, 3);
    assert_eq!(stats.settle_failed, 0);
}

// Goal: a consumer given a subscription claims for it, every claim, and
// one without claims for the default (an empty name); a name outside the
// rule is refused at start. Method: 6 messages consumed by a consumer of
// subscription "audit", and by one without on a second fake; the fake
// records each claim's subscription (a v2 claim, which cannot carry one,
// reads as "").
#[tokio::test]
async fn consumer_claims_for_its_subscription() {
    for subscription in [Some("audit"), None] {
        let (server, state) = start_broker("q", 2).await;
        fill(&state, &server, &["a", "b", "c", "d", "e", "f"]).await;
        let client = Client::connect(&server.addr).await.unwrap();
        let mut config = ConsumerConfig::new("q", 2);
        if let Some(name) = subscription {
            config = config.subscription(name);
        }
        config.wait_ms = 10;
        let consumer = Consumer::start(client.clone(), config, counting_handler(&state)).unwrap();
        let done = wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() == 6).await;
        assert!(done, "not every message was acked");
        bounded(consumer.shutdown()).await;
        let named = state.lock().unwrap().claim_subscriptions.clone();
        assert!(!named.is_empty());
        let expected = subscription.unwrap_or_default();
        assert!(named.iter().all(|name| name == expected), "{subscription:?}: {named:?}");

        for bad in ["", "a b", "sub/1"] {
            let config = ConsumerConfig::new("q", 1).subscription(bad);
            let refused = Consumer::start(client.clone(), config, counting_handler(&state));
            assert!(matches!(refused, Err(ClientError::Encode(_))), "{bad:?}: {refused:?}");
        }
    }
}

// Goal: shutdown stops claiming and drains running handlers (acking them).
// Method: 2 slots, 5 messages; handlers wait on a gate the test opens only
// once shutdown has begun, so both run across it: both are acked, the
// other three never claimed.
#[tokio::test]
async fn consumer_shutdown_drains_in_flight_work() {
    let (server, state) = start_broker("q", 1).await;
    fill(&state, &server, &["a", "b", "c", "d", "e"]).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 2);
    config.wait_ms = 10;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let consumer = Consumer::start(client, config, {
        let gate = Arc::clone(&gate);
        move |_delivery: Delivery| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.expect("the gate is never closed").forget();
                Ok::<(), String>(())
            }
        }
    })
    .unwrap();
    // Both deliveries reached their handlers (with pipelined claims they
    // may come from two claims; a claim answered after shutdown began is
    // released instead, as documented).
    assert!(wait_for(TEST_LIMIT, || consumer.stats().claimed == 2).await);
    // `join!` polls the shutdown first (it stops the claim loop at once),
    // then lets the two running handlers finish.
    let (stats, ()) = bounded(async {
        tokio::join!(consumer.shutdown(), async {
            gate.add_permits(2);
        })
    })
    .await;
    let state = state.lock().unwrap();
    assert_eq!(state.outstanding, 0);
    assert_eq!(state.acked.len(), 2);
    assert_eq!(stats.claimed, 2);
    assert_eq!(stats.acked, 2);
    let ready = state.partitions[0]
        .iter()
        .filter(|stored| stored.state == common::StoredState::Ready)
        .count();
    assert_eq!(ready, 3);
}

// Goal: a panicking handler's delivery is released with the panic reason and
// the slot is freed. Method: one slot, two messages, the handler panics on
// the first; the second must still be handled and acked.
#[tokio::test]
async fn consumer_releases_on_handler_panic() {
    let (server, state) = start_broker("q", 1).await;
    fill(&state, &server, &["panic", "fine"]).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 1);
    config.wait_ms = 10;
    let consumer = Consumer::start(client, config, |delivery: Delivery| async move {
        assert_ne!(payload_text(&delivery), "panic", "scripted panic");
        Ok::<(), String>(())
    })
    .unwrap();
    assert!(wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() == 1).await);
    bounded(consumer.shutdown()).await;
    let state = state.lock().unwrap();
    assert_eq!(state.released, [(0, spool_client::PANIC_REASON.to_owned())]);
}

// Goal: the consumer acks in batches (far fewer Ack requests than
// deliveries), acks every delivery exactly once, and never asks for more
// credits than free slots. Method: 2,000 messages on 2 partitions, 256
// slots, an instant handler; the fake counts Ack requests and refuses (as
// STALE_TOKEN) any token it already acked.
#[tokio::test]
async fn consumer_batches_acks_and_acks_each_delivery_once() {
    const MESSAGES: usize = 2_000;
    let (server, state) = start_broker("q", 2).await;
    state.lock().unwrap().slots = 256;
    let payloads: Vec<String> = (0..MESSAGES).map(|n| format!("m-{n}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    fill(&state, &server, &refs).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 256);
    config.wait_ms = 20;
    let consumer = Consumer::start(client, config, counting_handler(&state)).unwrap();
    let done = wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() >= MESSAGES).await;
    assert!(done, "not every message was acked");
    let stats = bounded(consumer.shutdown()).await;
    let state = state.lock().unwrap();
    assert_eq!(state.acked.len(), MESSAGES, "each delivery acked once");
    assert_eq!(state.ack_refused, 0, "no token acked twice or stale");
    assert_eq!(state.credit_violations, 0);
    assert_eq!(stats.acked, MESSAGES as u64);
    assert_eq!(stats.settle_failed, 0);
    assert_eq!(stats.ack_requests, state.ack_requests as u64);
    assert!(
        state.ack_requests * 4 <= MESSAGES,
        "acks must be batched: {} Ack requests for {MESSAGES} deliveries",
        state.ack_requests
    );
    assert!(state.ack_tokens_max > 1, "some Ack carried several tokens");
}

// Goal: several claims are outstanding at once (not one claim per round
// trip). Method: 8 slots, claims_in_flight 4 (a share of 2 slots each), and
// a fake that answers every claim only after 300 ms; claims that arrive
// before the first answer was sent were in flight together.
#[tokio::test]
async fn consumer_keeps_several_claims_in_flight() {
    let (server, state) = start_broker("q", 2).await;
    let payloads: Vec<String> = (0..64).map(|n| format!("m-{n}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    fill(&state, &server, &refs).await;
    {
        let mut state = state.lock().unwrap();
        state.slots = 8;
        state.claim_delay = Some(Duration::from_millis(300));
    }
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 8);
    config.claims_in_flight = 4;
    let consumer = Consumer::start(client, config, counting_handler(&state)).unwrap();
    assert!(wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() >= 8).await);
    let stats = bounded(consumer.shutdown()).await;
    let state = state.lock().unwrap();
    let first = state.claim_times[0];
    let together =
        state.claim_times.iter().filter(|&&at| at < first + Duration::from_millis(250)).count();
    assert_eq!(together, 4, "claims sent before the first answer: {:?}", state.claims);
    assert!(state.claims.iter().all(|&credits| credits <= 2), "each claim asks a share");
    assert_eq!(state.credit_violations, 0);
    assert!(stats.outstanding_max <= 8);
}

// Goal: a slot frees when its handler returns, not when the Ack is answered,
// and the ack pipeline is bounded on its own. Method: one slot, 6 messages,
// instant handlers, a fake that answers every Ack after 400 ms: well before
// the first answer could arrive every handler has run one after another in
// the single slot; with acks_pending_max 2, at most 2 deliveries wait for
// an answer, so the third handler's slot is held until one arrives.
#[tokio::test]
async fn consumer_frees_slots_before_acks_are_answered() {
    let (times, stats, credit_violations) =
        run_with_slow_acks(&["a", "b", "c", "d", "e", "f"], None).await;
    assert_eq!(times.len(), 6);
    assert!(
        times[5] < Duration::from_millis(350),
        "all six handlers ran before the first Ack answer: {times:?}"
    );
    assert_eq!(stats.running_max, 1);
    assert_eq!(credit_violations, 0);

    // The same with two acks pending at most: the third handler waits.
    let (times, _, _) = run_with_slow_acks(&["g", "h", "i", "j"], Some(2)).await;
    assert_eq!(times.len(), 4);
    assert!(times[1] < Duration::from_millis(350), "two ran at once");
    assert!(
        times[3] >= Duration::from_millis(380),
        "the fourth handler started only after an Ack answer made room: {times:?}"
    );
}

/// One slot, zero ack linger, a fake answering every Ack after 400 ms;
/// consumes `payloads` (with `acks_pending_max` if given) and returns when
/// each handler ran (from the consumer's start), the stats, and the fake's
/// credit violations.
async fn run_with_slow_acks(
    payloads: &[&str],
    acks_pending_max: Option<u32>,
) -> (Vec<Duration>, spool_client::ConsumerStats, usize) {
    let (server, state) = start_broker("q", 1).await;
    fill(&state, &server, payloads).await;
    {
        let mut state = state.lock().unwrap();
        state.slots = 1;
        state.ack_delay = Some(Duration::from_millis(400));
    }
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 1);
    config.wait_ms = 10;
    config.ack_linger = Duration::ZERO;
    if let Some(max) = acks_pending_max {
        config.acks_pending_max = max;
    }
    let handled = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let (count, handled) = (counting_handler(&state), Arc::clone(&handled));
        move |delivery: Delivery| {
            handled.lock().unwrap().push(tokio::time::Instant::now());
            count(delivery)
        }
    };
    let started = tokio::time::Instant::now();
    let consumer = Consumer::start(client, config, handler).unwrap();
    let all = payloads.len();
    assert!(wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() == all).await);
    let stats = bounded(consumer.shutdown()).await;
    let times = handled.lock().unwrap().iter().map(|at| *at - started).collect();
    let credit_violations = state.lock().unwrap().credit_violations;
    (times, stats, credit_violations)
}

// Goal: prefetch claims ahead of free slots (hiding the claim round trip)
// without running more handlers than slots, and prefetched deliveries keep
// their leases alive while they wait. Method: 1 slot, prefetch 3, 12
// messages, extend every 40 ms; each handler runs until the broker has
// granted three extensions of its own lease (the event, not a sleep); the
// fake checks each claim against slots + prefetch. Each handler notes how
// long its delivery had been held and its lease's extensions when it
// began: one held two extend intervals or more must have been extended
// meanwhile, and (the prefetch at work) some must have been held that long.
#[tokio::test]
async fn consumer_prefetches_without_running_more_than_slots() {
    let (server, state) = start_broker("q", 1).await;
    let payloads: Vec<String> = (0..12).map(|n| format!("m-{n}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    fill(&state, &server, &refs).await;
    state.lock().unwrap().slots = 4;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 1);
    config.prefetch = 3;
    config.wait_ms = 10;
    config.lease_ms = 1000;
    config.extend_interval = Some(Duration::from_millis(40));
    // (extensions, time held) of each delivery when its handler began.
    let at_start: Arc<Mutex<Vec<(u32, Duration)>>> = Arc::default();
    let handler = {
        let (state, at_start) = (Arc::clone(&state), Arc::clone(&at_start));
        move |delivery: Delivery| {
            let (state, at_start) = (Arc::clone(&state), Arc::clone(&at_start));
            async move {
                at_start.lock().unwrap().push(stored_of(&state, &delivery));
                let extended = wait_for(TEST_LIMIT, || extends_of(&state, &delivery) >= 3).await;
                assert!(extended, "the lease of a running handler is extended");
                state.lock().unwrap().finished += 1;
                Ok::<(), String>(())
            }
        }
    };
    let consumer = Consumer::start(client, config, handler).unwrap();
    // While the first runs, the prefetched three wait.
    assert!(wait_for(TEST_LIMIT, || consumer.stats().claimed >= 4).await);
    let stats = consumer.stats();
    assert!(stats.running_max <= 1, "{stats:?}");
    assert!(wait_for(TEST_LIMIT, || state.lock().unwrap().acked.len() == 12).await);
    let stats = bounded(consumer.shutdown()).await;
    let state = state.lock().unwrap();
    assert_eq!(state.credit_violations, 0, "claims: {:?}", state.claims);
    assert_eq!(stats.running_max, 1);
    assert!(stats.outstanding_max > 1 && stats.outstanding_max <= 4, "{stats:?}");
    let at_start = at_start.lock().unwrap();
    assert_eq!(at_start.len(), 12);
    let waited: Vec<u32> = at_start
        .iter()
        .filter(|(_, held)| *held >= Duration::from_millis(2 * 40))
        .map(|(extends, _)| *extends)
        .collect();
    assert!(!waited.is_empty(), "no delivery waited for the slot: {at_start:?}");
    assert!(waited.iter().all(|&extends| extends >= 1), "waited unextended: {at_start:?}");
    assert_eq!(stats.acked, 12);
}

// Goal: a graceful shutdown flushes acks still waiting for their batch, and
// does not wait out the linger. Method: ack_linger 60 s and a batch size
// above the message count, so no ack would go out on its own; once every
// handler finished, shut down: all 5 must be acked, well within 60 s.
#[tokio::test]
async fn consumer_shutdown_flushes_pending_acks() {
    let (server, state) = start_broker("q", 1).await;
    fill(&state, &server, &["a", "b", "c", "d", "e"]).await;
    let client = Client::connect(&server.addr).await.unwrap();
    let mut config = ConsumerConfig::new("q", 8);
    config.wait_ms = 10;
    config.ack_linger = Duration::from_secs(60);
    config.ack_batch_max = 100;
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let consumer = Consumer::start(client, config, {
        let handled = Arc::clone(&handled);
        move |_delivery: Delivery| {
            let handled = Arc::clone(&handled);
            async move {
                handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<(), String>(())
            }
        }
    })
    .unwrap();
    assert!(wait_for(TEST_LIMIT, || handled.load(std::sync::atomic::Ordering::SeqCst) == 5).await);
    // Every settled delivery has reached the ack pipeline.
    assert!(wait_for(TEST_LIMIT, || consumer.acks_pending() == 5).await);
    assert_eq!(state.lock().unwrap().acked.len(), 0, "the linger holds the acks back");
    let started = tokio::time::Instant::now();
    let stats = bounded(consumer.shutdown()).await;
    assert!(started.elapsed() < Duration::from_secs(10), "shutdown waited out the linger");
    let state = state.lock().unwrap();
    assert_eq!(state.acked.len(), 5);
    assert_eq!(state.ack_requests, 1, "one Ack for the five");
    assert_eq!(stats.acked, 5);
}

// Goal: the client surfaces typed server errors with the code name. Method:
// the server refuses a purge with QUEUE_NOT_FOUND.
#[tokio::test]
async fn server_errors_are_typed() {
    let handler: Handler = Arc::new(|request, id, outbox| {
        outbox.send(err(id, request.api_key(), ErrorCode::QueueNotFound, "no queue 'q'", None));
    });
    let server = FakeServer::start(handler).await;
    let connection = Connection::connect(&server.addr, ConnectionConfig::default()).await.unwrap();
    let error = bounded(connection.call(&purge(0))).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::QueueNotFound));
    assert_eq!(error.to_string(), "QUEUE_NOT_FOUND: no queue 'q'");
    assert!(!error.is_retriable());
}
