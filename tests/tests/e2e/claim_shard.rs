//! Claim version 1 of partition `ANY` against a live broker: one claim per
//! shard gets the messages of exactly the partitions that shard leads, each
//! delivery naming its partition; one Ack carries tokens of several of
//! them; the long-poll is woken by any of them; busy partitions cannot
//! starve the others (claims serve the shard's oldest messages first); the wire's refusals (v0,
//! dead letters, unknown queue, a shard leading nothing) and v0/v1 response
//! layouts; a CancelClaim withdraws a waiting claim of `ANY`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use spool_client::spool_wire::proto::{
    decode_frame, CancelClaimRequest, CancelOutcome, ClaimRequest, CorrelationId, MessageState,
    Offset, PartitionId, Reply, Request, Response, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::ProducerConfig;
use spool_client::{Admin, ClaimOptions, Client, Delivery, Message, PayloadView, Producer};
use spool_tests::events::wait_for_claims_waiting;
use spool_tests::{now, test_queue_config, Spoold};

use crate::common::key_for;

fn payload(delivery: &Delivery) -> String {
    match delivery.payload() {
        PayloadView::Inline(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        PayloadView::Reference { location, .. } => format!("<ref {location}>"),
    }
}

fn body_of(partition: u32) -> String {
    format!("partition {partition}")
}

/// The partitions of `queue` by the address of the shard leading them.
async fn partitions_by_shard(client: &Client, queue: &str) -> BTreeMap<String, BTreeSet<u32>> {
    let mut by_shard: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let count = client.partition_count(queue).await.unwrap();
    for partition in 0..count {
        let owner = client.owner_address(queue, PartitionId(partition)).await.unwrap();
        by_shard.entry(owner).or_default().insert(partition);
    }
    by_shard
}

/// Sends one message per partition of `partitions`, its body naming it.
async fn one_per_partition(producer: &Producer, queue: &str, partitions: u32, salt: u32) {
    let mut sends = Vec::new();
    for partition in 0..partitions {
        let key = key_for(partition, partitions, salt);
        let message = Message::new(body_of(partition)).key(key);
        sends.push(producer.submit(queue, message).await.unwrap());
    }
    for send in sends {
        send.await.unwrap();
    }
}

// Goal: a claim of ANY sent to one shard gets the messages of exactly the
// partitions that shard leads, each delivery naming its own partition and
// never one of the other shard's; one Ack holding tokens of several of its
// partitions acks them all. Method: 2 shards, a queue of 8 partitions, one
// message per partition whose body names it; claim_shard via the first
// claim target (16 credits, no wait); the delivered partitions equal the
// ones owner_address puts on that shard, each body matches its delivery's
// partition; one ack of every token via that shard's first partition
// succeeds; describe_queue: those partitions acked 1 and claimed 0, the
// other shard's untouched (ready 1); then the other shard's claim gets
// exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_any_gets_exactly_its_shards_partitions() {
    const PARTITIONS: u32 = 8;
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("shards", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    one_per_partition(&producer, "shards", PARTITIONS, 11).await;

    let by_shard = partitions_by_shard(&client, "shards").await;
    assert_eq!(by_shard.len(), 2, "8 partitions spread over both shards: {by_shard:?}");
    let targets = client.claim_targets("shards").await.unwrap();
    assert_eq!(targets.len(), 2, "one claim target per shard: {targets:?}");

    let mut acked_total = 0;
    for (round, &via) in targets.iter().enumerate() {
        let shard = client.owner_address("shards", via).await.unwrap();
        let led = &by_shard[&shard];
        assert_eq!(led.first(), Some(&via.0), "a shard's target is its lowest partition");
        let options = ClaimOptions::new(16).lease_ms(30_000).wait_ms(0);
        let batch = client.claim_shard("shards", via, &options).await.unwrap();
        let delivered: BTreeSet<u32> =
            batch.deliveries.iter().map(|delivery| delivery.partition().0).collect();
        assert_eq!(batch.deliveries.len(), led.len(), "one per partition of {shard}");
        assert_eq!(&delivered, led, "exactly the partitions {shard} leads");
        for delivery in &batch.deliveries {
            assert_eq!(payload(delivery), body_of(delivery.partition().0), "named partition");
            assert_eq!(delivery.attempt(), 1);
        }

        // One Ack, tokens of every partition of the shard, sent via its first.
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack("shards", via, &tokens).await.unwrap();
        acked_total += tokens.len();

        let described = admin.describe_queue("shards").await.unwrap();
        for stats in &described.partitions {
            let p = stats.partition.0;
            let done = led.contains(&p) || (round == 1);
            let expected = if done { (1, 0, 0) } else { (0, 0, 1) };
            assert_eq!(
                (stats.acked, stats.claimed, stats.ready),
                expected,
                "round {round}, partition {p}: {stats:?}"
            );
        }
    }
    assert_eq!(acked_total, PARTITIONS as usize);
}

// Goal: a claim of ANY long-polls the whole shard: a message to any of its
// partitions wakes it at once, one to another shard's partition does not
// satisfy it; with nothing arriving it waits its wait_ms, once. Method: 2
// shards, 8 partitions; claim_shard (10 s wait) via shard A's target; once
// it is parked (the claims-waiting gauge), a message to a partition of
// shard B; 300 ms later (nothing may happen meanwhile) the claim still
// waits, and a message goes to A's last partition; the claim returns
// within 3 s with only A's message, naming that partition. Then a claim of
// ANY (1 s wait) on an empty queue returns empty after ≥ 0.9 s and < 2.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_any_long_polls_the_shards_partitions() {
    const PARTITIONS: u32 = 8;
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("poll", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    admin.create_queue("idle", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();

    let by_shard = partitions_by_shard(&client, "poll").await;
    let via = client.claim_targets("poll").await.unwrap()[0];
    let shard = client.owner_address("poll", via).await.unwrap();
    let target = *by_shard[&shard].last().unwrap();
    let elsewhere = by_shard.iter().find(|(addr, _)| **addr != shard).map(|(_, led)| led).unwrap();
    let other = *elsewhere.first().unwrap();

    let claimer = client.clone();
    let started = now();
    let claim = tokio::spawn(async move {
        let options = ClaimOptions::new(5).lease_ms(30_000).wait_ms(10_000);
        claimer.claim_shard("poll", via, &options).await
    });
    wait_for_claims_waiting(&broker, 1).await;
    let key = key_for(other, PARTITIONS, 21);
    producer.send("poll", Message::new(body_of(other)).key(key)).await.unwrap();
    // Time under test: nothing answers the claim during these 300 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claim.is_finished(), "another shard's message answered the claim");
    wait_for_claims_waiting(&broker, 1).await;
    let key = key_for(target, PARTITIONS, 21);
    producer.send("poll", Message::new(body_of(target)).key(key)).await.unwrap();
    let batch = claim.await.unwrap().unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "woke after {took:?}");
    let got: Vec<_> = batch.deliveries.iter().map(|d| (d.partition(), payload(d))).collect();
    assert_eq!(got, vec![(PartitionId(target), body_of(target))]);

    let started = now();
    let options = ClaimOptions::new(5).wait_ms(1_000);
    let idle_via = client.claim_targets("idle").await.unwrap()[0];
    let batch = client.claim_shard("idle", idle_via, &options).await.unwrap();
    let took = started.elapsed();
    assert!(batch.deliveries.is_empty());
    assert!(took >= Duration::from_millis(900), "returned early: {took:?}");
    assert!(took < Duration::from_millis(2_500), "waited too long: {took:?}");
}

// Goal: claims of ANY serve the shard's oldest messages first across its
// partitions (a visit walks the journal forward), so a busy partition
// cannot starve a quiet one: the quiet partition's message, enqueued after
// 30 of the busy one's and before 30 more, is delivered right after the
// first 30 and before any of the later ones, whatever the ring's order.
// Method: 2 shards, 8 partitions; two partitions led by shard 0; 30 sends
// to the busy one (awaited), 1 to the quiet one, 30 more to the busy one;
// claims of ANY with 10 credits and no wait until empty: the quiet message
// is the 31st delivered, every message comes once, only from those two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_any_serve_the_oldest_first_so_a_busy_partition_starves_none() {
    const PARTITIONS: u32 = 8;
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("rotate", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();

    let by_shard = partitions_by_shard(&client, "rotate").await;
    let led: Vec<u32> = by_shard[&broker.shard_addr(0)].iter().copied().collect();
    assert!(led.len() >= 2, "shard 0 leads two partitions: {by_shard:?}");
    let (busy, quiet) = (led[0], led[1]);
    let via = PartitionId(busy);
    let options = ClaimOptions::new(10).lease_ms(30_000).wait_ms(0);

    let busy_key = key_for(busy, PARTITIONS, 31);
    for group in 0..2 {
        let mut sends = Vec::new();
        for n in 0..30 {
            let message = Message::new(format!("busy {}", group * 30 + n)).key(busy_key.clone());
            sends.push(producer.submit("rotate", message).await);
        }
        for send in sends {
            send.unwrap().await.unwrap();
        }
        if group == 0 {
            let key = key_for(quiet, PARTITIONS, 31);
            producer.send("rotate", Message::new("quiet").key(key)).await.unwrap();
        }
    }

    // (body, partition, offset) in delivery order.
    let mut order: Vec<(String, u32, u64)> = Vec::new();
    let mut seen = BTreeSet::new();
    for claim in 0..20 {
        let batch = client.claim_shard("rotate", via, &options).await.unwrap();
        if batch.deliveries.is_empty() {
            break;
        }
        assert!(batch.deliveries.len() <= 10, "claim {claim}: more than the credits");
        for delivery in &batch.deliveries {
            let partition = delivery.partition().0;
            assert!(partition == busy || partition == quiet, "claim {claim}: from {partition}");
            assert!(seen.insert((partition, delivery.offset())), "delivered twice");
            order.push((payload(delivery), partition, delivery.offset().0));
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack("rotate", via, &tokens).await.unwrap();
    }
    assert_eq!(seen.len(), 61, "every message delivered once");
    let quiet_at = order.iter().position(|(body, ..)| body == "quiet").expect("the quiet message");
    assert_eq!(quiet_at, 30, "served by age across partitions");
    // The 30 before it are exactly the first group (in-flight batches of one
    // producer may reach the partition in another order inside a group).
    let mut before: Vec<&str> = order[..30].iter().map(|(body, ..)| body.as_str()).collect();
    before.sort_unstable_by_key(|body| body[5..].parse::<u32>().unwrap());
    let first: Vec<String> = (0..30).map(|n| format!("busy {n}")).collect();
    assert_eq!(before, first.iter().map(String::as_str).collect::<Vec<_>>());
    // A partition's own messages come in offset order.
    let busy_offsets: Vec<u64> =
        order.iter().filter(|(_, p, _)| *p == busy).map(|(.., offset)| *offset).collect();
    assert!(busy_offsets.windows(2).all(|pair| pair[0] < pair[1]), "{busy_offsets:?}");
}

const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// What a test needs of one response.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A Claim answered: the header's api version and each delivery's
    /// partition as decoded.
    Claim { version: u16, partitions: Vec<PartitionId> },
    /// A CancelClaim answered.
    Cancel(CancelOutcome),
    /// An error response.
    Error(ErrorCode),
}

fn claim_request(queue: &str, partition: PartitionId, wait_ms: u32) -> Request<'_> {
    Request::Claim(ClaimRequest {
        queue,
        partition,
        worker: WorkerId(7),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: 30_000,
        wait_ms,
        subscription: "",
    })
}

/// A Claim frame in `version`, encoded by the codec.
fn claim_frame(
    queue: &str,
    partition: PartitionId,
    wait_ms: u32,
    id: u64,
    version: u16,
) -> Vec<u8> {
    let mut out = Vec::new();
    let request = claim_request(queue, partition, wait_ms);
    request.encode_version(CorrelationId(id), version, &mut out).unwrap();
    out
}

/// A v1 Claim of ANY with its header's api_version patched to 0: what an
/// old or broken client could send (the codec refuses to encode it).
fn v0_claim_of_any_frame(queue: &str, id: u64) -> Vec<u8> {
    let request = claim_request(queue, PartitionId::ANY, 0);
    let mut refused = Vec::new();
    assert!(request.encode_version(CorrelationId(id), 0, &mut refused).is_err());
    let mut out = Vec::new();
    request.encode_version(CorrelationId(id), 1, &mut out).unwrap();
    assert_eq!(u16::from_le_bytes([out[6], out[7]]), 1, "Claim encodes as v1");
    out[6..8].copy_from_slice(&0u16.to_le_bytes());
    out
}

fn cancel_frame(id: u64, claim: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let request = Request::CancelClaim(CancelClaimRequest { claim: CorrelationId(claim) });
    request.encode(CorrelationId(id), &mut out).unwrap();
    out
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

/// Reads one response frame: its correlation id and what it says.
fn read_answer(stream: &mut TcpStream) -> (u64, Answer) {
    let bytes = spool_tests::read_frame_bytes(stream).unwrap();
    let frame = decode_frame(&bytes).unwrap();
    let version = frame.header.api_version;
    let reply = Response::decode(&frame).unwrap();
    let answer = match reply.reply {
        Reply::Ok(Response::Claim(claim)) => Answer::Claim {
            version,
            partitions: claim.deliveries.iter().map(|delivery| delivery.partition).collect(),
        },
        Reply::Ok(Response::CancelClaim(cancel)) => Answer::Cancel(cancel.outcome),
        Reply::Ok(other) => panic!("unexpected response {other:?}"),
        Reply::Err(error) => Answer::Error(error.code),
    };
    (reply.correlation_id.0, answer)
}

/// Sends `frame` and reads its answer, which must carry `id`.
fn ask(stream: &mut TcpStream, frame: &[u8], id: u64) -> Answer {
    stream.write_all(frame).unwrap();
    let (correlation, answer) = read_answer(stream);
    assert_eq!(correlation, id, "answer to another request: {answer:?}");
    answer
}

// Goal: the wire contract of Claim v1 and ANY: a v0 Claim naming ANY is
// refused INVALID_ARGUMENT and the connection carries on (a v1 claim of
// ANY on it then delivers); ANY on the dead-letter lane is INVALID_ARGUMENT;
// on an unknown queue QUEUE_NOT_FOUND; at a shard leading no partition of
// the queue NOT_OWNER; a v0 Claim of a partition gets a v0 response (its
// deliveries decode as partition ANY: v0 carries none) and a v1 one names
// the partition. Method: 2 shards, a queue of 1 partition (so one shard
// leads nothing), 3 messages on it; raw frames over TCP, one request at a
// time, to the leading shard and to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_v1_any_wire_contract() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue("wire", test_queue_config(1, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for n in 0..3 {
        producer.send("wire", Message::new(format!("wire {n}"))).await.unwrap();
    }
    let leader = client.owner_address("wire", PartitionId(0)).await.unwrap();
    let idle = [broker.shard_addr(0), broker.shard_addr(1)]
        .into_iter()
        .find(|addr| *addr != leader)
        .unwrap();
    let any = PartitionId::ANY;
    let p0 = PartitionId(0);

    let mut stream = connect(&leader);
    let answer = ask(&mut stream, &v0_claim_of_any_frame("wire", 1), 1);
    assert_eq!(answer, Answer::Error(ErrorCode::InvalidArgument), "v0 cannot name ANY");
    let answer = ask(&mut stream, &claim_frame("wire", any, 0, 2, 1), 2);
    assert_eq!(answer, Answer::Claim { version: 1, partitions: vec![p0] }, "connection lives");
    let answer = ask(&mut stream, &claim_frame("wire.dlq", any, 0, 3, 1), 3);
    assert_eq!(answer, Answer::Error(ErrorCode::InvalidArgument), "ANY on dead letters");
    let answer = ask(&mut stream, &claim_frame("no-such-queue", any, 0, 4, 1), 4);
    assert_eq!(answer, Answer::Error(ErrorCode::QueueNotFound));
    let answer = ask(&mut stream, &claim_frame("wire", p0, 0, 5, 0), 5);
    assert_eq!(answer, Answer::Claim { version: 0, partitions: vec![any] }, "v0 layout");
    let answer = ask(&mut stream, &claim_frame("wire", p0, 0, 6, 1), 6);
    assert_eq!(answer, Answer::Claim { version: 1, partitions: vec![p0] }, "v1 names it");
    // All three claimed: a claim of ANY now finds nothing.
    let answer = ask(&mut stream, &claim_frame("wire", any, 0, 7, 1), 7);
    assert_eq!(answer, Answer::Claim { version: 1, partitions: vec![] });

    let mut other = connect(&idle);
    let answer = ask(&mut other, &claim_frame("wire", any, 0, 1, 1), 1);
    assert_eq!(answer, Answer::Error(ErrorCode::NotOwner), "{idle} leads nothing of it");
    let answer = ask(&mut other, &claim_frame("no-such-queue", any, 0, 2, 1), 2);
    assert_eq!(answer, Answer::Error(ErrorCode::QueueNotFound));
}

// Goal: a waiting claim of ANY is withdrawn by a CancelClaim naming its
// correlation id: it answers empty at once and claims nothing afterwards.
// Method: 1 shard, a queue of 2 partitions; a raw claim of ANY (60 s wait)
// on the empty queue, cancelled on the same connection once it is parked
// (the claims-waiting gauge): both answer well under 3 s (CANCELLED,
// empty); once the gauge reads 0 (the wait is gone, not merely answered),
// one message per partition; both are Ready with 0 attempts (peek) and
// nothing is claimed; a claim of ANY on the same connection then gets one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_claim_of_any_claims_nothing_later() {
    const PARTITIONS: u32 = 2;
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("cancel", test_queue_config(PARTITIONS, 30_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();

    let mut stream = connect(&broker.addr());
    stream.write_all(&claim_frame("cancel", PartitionId::ANY, 60_000, 5, 1)).unwrap();
    wait_for_claims_waiting(&broker, 1).await;
    let started = now();
    stream.write_all(&cancel_frame(6, 5)).unwrap();
    let answers: BTreeMap<u64, Answer> = (0..2).map(|_| read_answer(&mut stream)).collect();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(answers[&6], Answer::Cancel(CancelOutcome::Cancelled));
    assert_eq!(answers[&5], Answer::Claim { version: 1, partitions: vec![] });

    // No claim is parked any more (one that went on waiting would hold the
    // gauge at 1 for its 60 s): nothing can take what comes next.
    wait_for_claims_waiting(&broker, 0).await;
    one_per_partition(&producer, "cancel", PARTITIONS, 41).await;
    for partition in 0..PARTITIONS {
        let peeked = admin.peek("cancel", PartitionId(partition), Offset(0), 10).await.unwrap();
        let states: Vec<_> =
            peeked.iter().map(|message| (message.state, message.attempt)).collect();
        assert_eq!(states, vec![(MessageState::Ready, 0)], "partition {partition}");
    }
    let described = admin.describe_queue("cancel").await.unwrap();
    assert!(described.partitions.iter().all(|stats| stats.claimed == 0), "{described:?}");

    let answer = ask(&mut stream, &claim_frame("cancel", PartitionId::ANY, 1_000, 7, 1), 7);
    let Answer::Claim { version: 1, partitions } = answer else { panic!("{answer:?}") };
    assert_eq!(partitions.len(), 1, "the connection still claims");
    assert!(partitions[0].0 < PARTITIONS);
}

// Goal: a consumer's claims go where the messages are. A shard whose last
// claim came back short (caught up) gets one claim at a time, and that claim
// long-polls, so the other claims take the busy shard's backlog instead of
// coming back empty from the idle one. Method: 2 shards, 2 partitions (one
// each), 4,000 messages all on one shard's partition; a `Consumer` (64
// slots, 4 claims in flight, 1 s long-poll) drains them while its claim
// observer counts the answers: at most a tenth are empty (the first
// claims, before the idle shard is known to be caught up, its long-polls
// timing out, and the busy shard's last ones), where sending claims to each
// shard in turn left about half of them empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_sends_its_claims_where_the_backlog_is() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const SENT: u64 = 4_000;
    let broker = Spoold::start(2);
    let client = broker.client().await;
    Admin::new(client.clone())
        .create_queue("lopsided", test_queue_config(2, 30_000, 5))
        .await
        .unwrap();
    let by_shard = partitions_by_shard(&client, "lopsided").await;
    assert_eq!(by_shard.len(), 2, "one partition per shard: {by_shard:?}");
    let busy = *by_shard.values().next().unwrap().iter().next().unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let mut sends = Vec::new();
    for sequence in 0..SENT {
        let message = Message::new(format!("m{sequence}")).key(key_for(busy, 2, 7));
        sends.push(producer.submit("lopsided", message).await.unwrap());
    }
    for send in sends {
        assert_eq!(send.partition().0, busy);
        send.await.unwrap();
    }

    let claims = Arc::new(AtomicU64::new(0));
    let empty = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let mut config = spool_client::ConsumerConfig::new("lopsided", 64);
    config.claims_in_flight = 4;
    config.wait_ms = 1_000;
    let (counted, emptied) = (Arc::clone(&claims), Arc::clone(&empty));
    config.claim_observer =
        Some(Arc::new(move |_rtt: Duration, _credits: u32, received: usize| {
            counted.fetch_add(1, Ordering::Relaxed);
            if received == 0 {
                emptied.fetch_add(1, Ordering::Relaxed);
            }
        }));
    let handled = Arc::clone(&acked);
    let consumer = spool_client::Consumer::start(client.clone(), config, move |_: Delivery| {
        handled.fetch_add(1, Ordering::Relaxed);
        async { Ok::<(), std::convert::Infallible>(()) }
    })
    .unwrap();
    let drained = crate::common::eventually(Duration::from_secs(60), || {
        let acked = Arc::clone(&acked);
        async move { acked.load(Ordering::Relaxed) >= SENT }
    })
    .await;
    let (claims_seen, empty_seen) = (claims.load(Ordering::Relaxed), empty.load(Ordering::Relaxed));
    let stats = consumer.shutdown().await;
    assert!(drained, "handled {} of {SENT}", acked.load(Ordering::Relaxed));
    assert_eq!(stats.acked, SENT);
    assert!(claims_seen >= SENT / 64, "{claims_seen} claims for {SENT} messages");
    assert!(
        empty_seen * 10 <= claims_seen,
        "{empty_seen} of {claims_seen} claims came back empty while one shard had a backlog"
    );
}
