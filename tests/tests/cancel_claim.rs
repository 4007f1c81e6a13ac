// Goal: CancelClaim (api key 6) withdraws a long-polling Claim of the same
// connection and nothing else. A waiting claim that is cancelled answers
// empty at once and claims nothing, so a message arriving afterwards stays
// ready with 0 attempts; a cancel for an unknown or already answered id is
// harmless (NOT_PENDING, the connection carries on); a cancel from another
// connection cannot touch a claim. Method: a real spoold; claims and cancels
// sent as raw frames over plain TCP, so each test controls which connection
// sends what; messages sent and inspected with the client library.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use spool_client::spool_wire::proto::{
    decode_frame, CancelClaimRequest, CancelOutcome, ClaimRequest, CorrelationId, MessageState,
    Offset, PartitionId, Reply, Request, Response, WorkerId,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Message, Producer, ProducerConfig};
use spool_tests::events::wait_for_claims_waiting;
use spool_tests::{now, test_queue_config, Spoold};

const QUEUE: &str = "cancels";
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How soon a cancelled claim must answer: far below its wait.
const ANSWER_BOUND: Duration = Duration::from_secs(3);

fn encode(request: &Request<'_>, correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(CorrelationId(correlation), &mut out).unwrap();
    out
}

fn claim_frame(correlation: u64, wait_ms: u32) -> Vec<u8> {
    let request = Request::Claim(ClaimRequest {
        queue: QUEUE,
        partition: PartitionId(0),
        worker: WorkerId(7),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: 10_000,
        wait_ms,
        subscription: "",
    });
    encode(&request, correlation)
}

fn cancel_frame(correlation: u64, claim: u64) -> Vec<u8> {
    encode(&Request::CancelClaim(CancelClaimRequest { claim: CorrelationId(claim) }), correlation)
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

/// What a test needs of one response.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A Claim answered with this many deliveries.
    Claim(usize),
    /// A CancelClaim answered.
    Cancel(CancelOutcome),
    /// An error response.
    Error(ErrorCode),
}

/// Reads one response frame: its correlation id and what it says.
fn read_answer(stream: &mut TcpStream) -> (u64, Answer) {
    let bytes = spool_tests::read_frame_bytes(stream).unwrap();
    let frame = decode_frame(&bytes).unwrap();
    let reply = Response::decode(&frame).unwrap();
    let answer = match reply.reply {
        Reply::Ok(Response::Claim(claim)) => Answer::Claim(claim.deliveries.len()),
        Reply::Ok(Response::CancelClaim(cancel)) => Answer::Cancel(cancel.outcome),
        Reply::Ok(other) => panic!("unexpected response {other:?}"),
        Reply::Err(error) => Answer::Error(error.code),
    };
    (reply.correlation_id.0, answer)
}

/// Reads `count` answers, by correlation id.
fn read_answers(stream: &mut TcpStream, count: usize) -> HashMap<u64, Answer> {
    (0..count).map(|_| read_answer(stream)).collect()
}

async fn broker_with_queue() -> (Spoold, Admin, Producer) {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue(QUEUE, test_queue_config(1, 10_000, 10)).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default()).unwrap();
    (broker, admin, producer)
}

/// The partition's messages as (state, attempt).
async fn peek(admin: &Admin) -> Vec<(MessageState, u32)> {
    let peeked = admin.peek(QUEUE, PartitionId(0), Offset(0), 10).await.unwrap();
    peeked.iter().map(|message| (message.state, message.attempt)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_long_poll_answers_empty_at_once_and_claims_nothing_later() {
    // Goal: a waiting claim named by a CancelClaim answers empty at once and
    // no longer claims: the message sent afterwards is ready, 0 attempts.
    // Cancelling it again, or an id never used, is NOT_PENDING and harmless.
    // Method: claim (60 s wait) on an empty partition, cancel it once it is
    // parked (the claims-waiting gauge), read both answers within the bound;
    // once the gauge reads 0 (the wait is gone, not merely answered), send
    // a message; peek.
    let (broker, admin, producer) = broker_with_queue().await;
    let mut stream = connect(&broker.addr());
    stream.write_all(&claim_frame(5, 60_000)).unwrap();
    wait_for_claims_waiting(&broker, 1).await;
    let started = now();
    stream.write_all(&cancel_frame(6, 5)).unwrap();
    let answers = read_answers(&mut stream, 2);
    assert!(started.elapsed() < ANSWER_BOUND, "answered after {:?}", started.elapsed());
    assert_eq!(answers[&6], Answer::Cancel(CancelOutcome::Cancelled));
    assert_eq!(answers[&5], Answer::Claim(0), "a cancelled claim answers empty");

    // No claim is parked any more (a cancelled claim that went on waiting
    // would hold the gauge at 1 for its 60 s): nothing can take the message.
    wait_for_claims_waiting(&broker, 0).await;
    producer.send(QUEUE, Message::new("after the cancel")).await.unwrap();
    assert_eq!(peek(&admin).await, vec![(MessageState::Ready, 0)]);

    // Already answered, and never used: nothing to cancel, no error.
    stream.write_all(&cancel_frame(7, 5)).unwrap();
    stream.write_all(&cancel_frame(8, 999)).unwrap();
    let answers = read_answers(&mut stream, 2);
    assert_eq!(answers[&7], Answer::Cancel(CancelOutcome::NotPending));
    assert_eq!(answers[&8], Answer::Cancel(CancelOutcome::NotPending));
    // The connection carries on: a claim on it gets the message.
    stream.write_all(&claim_frame(9, 1_000)).unwrap();
    assert_eq!(read_answer(&mut stream), (9, Answer::Claim(1)));
    let states: Vec<_> = peek(&admin).await.into_iter().map(|(state, _)| state).collect();
    assert_eq!(states, vec![MessageState::Claimed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cannot_touch_another_connections_claim() {
    // Goal: a connection reaches only its own claims: a CancelClaim naming
    // another connection's waiting claim is NOT_PENDING and that claim goes
    // on waiting, then gets the message; cancelling it after it claimed is
    // NOT_PENDING and its delivery stands. Method: connection A long-polls
    // (id 5) until it is parked, connection B cancels id 5, A's claim is
    // still parked (the gauge), a message is sent, A's claim answers with
    // it; A cancels id 5 afterwards; peek shows it claimed once.
    let (broker, admin, producer) = broker_with_queue().await;
    let mut waiting = connect(&broker.addr());
    let mut other = connect(&broker.addr());
    waiting.write_all(&claim_frame(5, 20_000)).unwrap();
    wait_for_claims_waiting(&broker, 1).await;
    other.write_all(&cancel_frame(5, 5)).unwrap();
    assert_eq!(read_answer(&mut other), (5, Answer::Cancel(CancelOutcome::NotPending)));

    // B's cancel was answered: A's claim is still the one parked.
    wait_for_claims_waiting(&broker, 1).await;
    let started = now();
    producer.send(QUEUE, Message::new("for the waiting claim")).await.unwrap();
    assert_eq!(read_answer(&mut waiting), (5, Answer::Claim(1)), "still waiting, then woken");
    assert!(started.elapsed() < ANSWER_BOUND, "woken after {:?}", started.elapsed());

    waiting.write_all(&cancel_frame(6, 5)).unwrap();
    assert_eq!(read_answer(&mut waiting), (6, Answer::Cancel(CancelOutcome::NotPending)));
    let states: Vec<_> = peek(&admin).await.into_iter().map(|(state, _)| state).collect();
    assert_eq!(states, vec![MessageState::Claimed], "claimed once, not released");
    let stats = admin.describe_queue(QUEUE).await.unwrap().partitions[0].clone();
    assert_eq!((stats.claimed, stats.released), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_with_claim_id_zero_is_refused_and_the_connection_stays() {
    // Goal: the reserved id 0 is refused as INVALID_ARGUMENT (a field out of
    // range), and the connection stays usable. Method: hand-patch a valid
    // CancelClaim's id to 0, send it, then a good cancel on the same socket.
    let (broker, _admin, _producer) = broker_with_queue().await;
    let mut stream = connect(&broker.addr());
    let mut bad = cancel_frame(4, 1);
    bad[24..32].copy_from_slice(&0u64.to_le_bytes());
    stream.write_all(&bad).unwrap();
    assert_eq!(read_answer(&mut stream), (4, Answer::Error(ErrorCode::InvalidArgument)));
    stream.write_all(&cancel_frame(5, 1)).unwrap();
    assert_eq!(read_answer(&mut stream), (5, Answer::Cancel(CancelOutcome::NotPending)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_pipelined_right_behind_its_claim_finds_it() {
    // Goal: a claim is cancellable from the moment it is read, so a
    // CancelClaim sent right behind it (same write) withdraws it rather
    // than missing it and leaving it to wait out its 60 s. Method: one
    // write holding both frames; both answers arrive within the bound, the
    // cancel CANCELLED and the claim empty.
    let (broker, admin, _producer) = broker_with_queue().await;
    let mut stream = connect(&broker.addr());
    let mut both = claim_frame(5, 60_000);
    both.extend_from_slice(&cancel_frame(6, 5));
    let started = now();
    stream.write_all(&both).unwrap();
    let answers = read_answers(&mut stream, 2);
    assert!(started.elapsed() < ANSWER_BOUND, "answered after {:?}", started.elapsed());
    assert_eq!(answers[&6], Answer::Cancel(CancelOutcome::Cancelled));
    assert_eq!(answers[&5], Answer::Claim(0));
    assert!(peek(&admin).await.is_empty());
}
