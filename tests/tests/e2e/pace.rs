//! The consumer pace over the network (`docs/design/consumer-pace.md`): a
//! producer that saturates a shard's intake while its consumer's claims come
//! back full is held to the consumer's pace; the same producer with no
//! consumer (a burst going into the backlog) or with the pace turned off is
//! never held, and one run with the pace off beside it.
//!
//! The shard is made the bottleneck on purpose: every journal sync of the
//! failpoint build stalls the shard 2 ms (`journal.commit.sync=delay(2)`),
//! so a producer with a deep window of large batches keeps more than
//! `PACE_INTAKE_BYTES_MIN` of enqueues in the shard's hands on any machine,
//! however fast its disk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_client::{Admin, ClaimOptions, Client, Delivery, Message, Producer, ProducerConfig};
use spool_tests::{
    spoold_failpoints_bin, test_queue_config, Spoold, SpooldOptions, FAILPOINTS_ENV,
};

use crate::common::{eventually, metric_sum};

const QUEUE: &str = "paced";
const BODY: usize = 1_024;
/// Sends a producer keeps unanswered: 16 MiB of 1 KiB messages.
const WINDOW: usize = 16_384;

/// A broker of one shard whose journal syncs each stall it 2 ms, with
/// `args` appended, and the test queue on it (4 partitions).
async fn paced_broker(args: &[&str]) -> (Spoold, Client) {
    let mut options = SpooldOptions::new(1);
    options.bin = Some(spoold_failpoints_bin());
    options.set_env(FAILPOINTS_ENV, "journal.commit.sync=delay(2)");
    options.args.extend(args.iter().map(|arg| (*arg).to_owned()));
    let broker = Spoold::start_with(options);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, test_queue_config(4, 60_000, 5)).await.unwrap();
    (broker, client)
}

/// Enqueues 1 KiB messages in batches of 256 KiB, 8 batches in flight per
/// partition, until `stop`; every send must be acknowledged. Returns the
/// messages acknowledged.
async fn produce(client: Client, stop: Arc<AtomicBool>, enqueued: Arc<AtomicU64>) -> u64 {
    let config = ProducerConfig {
        linger: Duration::from_millis(1),
        max_batch_bytes: 256 << 10,
        in_flight_per_partition: 8,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, config).unwrap();
    let mut pending = VecDeque::with_capacity(WINDOW);
    let mut acked = 0u64;
    while !stop.load(Ordering::Relaxed) {
        pending.push_back(producer.submit(QUEUE, Message::new(vec![b'p'; BODY])).await.unwrap());
        if pending.len() >= WINDOW {
            pending.pop_front().unwrap().await.expect("a paced enqueue is answered, not refused");
            acked += 1;
            enqueued.fetch_add(1, Ordering::Relaxed);
        }
    }
    producer.flush().await;
    for send in pending {
        send.await.expect("a paced enqueue is answered, not refused");
        acked += 1;
        enqueued.fetch_add(1, Ordering::Relaxed);
    }
    acked
}

/// Claims 64 at a time from the shard and acks each batch until `stop`.
/// Returns the messages acked.
async fn consume(client: Client, stop: Arc<AtomicBool>) -> u64 {
    let targets = client.claim_targets(QUEUE).await.unwrap();
    assert_eq!(targets.len(), 1);
    let options = ClaimOptions::new(64).lease_ms(60_000).wait_ms(50);
    let mut acked = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let batch = client.claim_shard(QUEUE, targets[0], &options).await.unwrap();
        if batch.deliveries.is_empty() {
            continue;
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack(QUEUE, targets[0], &tokens).await.unwrap();
        acked += tokens.len() as u64;
    }
    acked
}

/// Runs a producer until it has `messages` acknowledged.
async fn burst(client: &Client, messages: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let enqueued = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(client.clone(), stop.clone(), enqueued.clone()));
    let reached = eventually(Duration::from_secs(60), || {
        let enqueued = enqueued.clone();
        async move { enqueued.load(Ordering::Relaxed) >= messages }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let acked = producer.await.unwrap();
    assert!(reached, "{acked} of {messages} enqueued within 60 s");
}

/// Runs a producer and a consumer (each on its own client, or sharing
/// one) together until `until` holds of the
/// broker (or 60 s pass); returns (enqueued, consumed, whether it held).
async fn closed_loop(
    broker: &Spoold,
    (producing, consuming): (&Client, &Client),
    until: impl Fn(&Spoold) -> bool,
) -> (u64, u64, bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let enqueued = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(producing.clone(), stop.clone(), enqueued.clone()));
    let consumer = tokio::spawn(consume(consuming.clone(), stop.clone()));
    let held = eventually(Duration::from_secs(60), || {
        let holds = until(broker);
        async move { holds }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    (producer.await.unwrap(), consumer.await.unwrap(), held)
}

// Goal: the pace holds producers only while consumers are behind them. A
// burst with no consumer (the capacity model's burst into the backlog) is
// never held, however saturated the intake; once a consumer claims full
// batches beside the saturating producer, enqueue frames are held, their
// messages charged to the consumer's credit, and the producer runs far
// less ahead of the consumer than with `--consumer-pace-percent 0` (which
// holds nothing and counts nothing) — and every held enqueue is still
// answered (held, never refused). A connection that also carries claims is
// never held: its claims and acks would wait behind the held enqueue (a
// shared client once ran 4× further ahead paced than unpaced). Method: on
// each broker a 32 MiB burst alone, then producer and consumer together
// until the consumer acked 8,000; `spool_pace_*` from /metrics; enqueued
// ÷ consumed of the runs. The consumer here is slow (each ack waits for a
// stalled sync), so the hold's 50 ms bound, not the credit, sets the paced
// producer's rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturating_producer_is_held_to_its_consumers_pace_and_a_burst_alone_never_is() {
    const ACKED: f64 = 8_000.0;
    let mut ratios = Vec::new();
    let runs: [(&[&str], bool); 3] =
        [(&[], false), (&["--consumer-pace-percent", "0"], false), (&[], true)];
    for (args, shared) in runs {
        let (broker, client) = paced_broker(args).await;
        burst(&client, 32_768).await;
        assert_eq!(metric_sum(&broker, "spool_pace_holds_total"), 0.0, "a burst alone was held");
        assert_eq!(metric_sum(&broker, "spool_pace_paced_messages_total"), 0.0);
        assert_eq!(metric_sum(&broker, "spool_pace_full_claims_total"), 0.0);

        let consuming = if shared { client.clone() } else { broker.client().await };
        let (enqueued, consumed, done) = closed_loop(&broker, (&client, &consuming), |broker| {
            metric_sum(broker, "spool_acked_messages_total") >= ACKED
        })
        .await;
        let holds = metric_sum(&broker, "spool_pace_holds_total");
        let paced = metric_sum(&broker, "spool_pace_paced_messages_total");
        let full_claims = metric_sum(&broker, "spool_pace_full_claims_total");
        let timeouts = metric_sum(&broker, "spool_pace_hold_timeouts_total");
        println!(
            "{args:?} shared {shared}: enqueued {enqueued}, consumed {consumed}; holds {holds}, \
             paced messages {paced}, full claims {full_claims}, let go at the bound {timeouts}"
        );
        assert!(done, "the consumer took {consumed} messages in 60 s");
        match (args.is_empty(), shared) {
            (true, false) => {
                assert!(holds > 0.0, "nothing held: {full_claims} full claims");
                assert!(full_claims > 0.0);
                assert!(paced > 0.0, "held frames' messages are charged to the credit");
                assert!(timeouts <= holds);
            }
            (true, true) => assert_eq!(holds, 0.0, "a connection carrying claims was held"),
            (false, _) => {
                assert_eq!(holds, 0.0);
                assert_eq!(paced, 0.0);
                assert_eq!(full_claims, 0.0);
            }
        }
        ratios.push(enqueued as f64 / consumed.max(1) as f64);
    }
    println!("enqueued per consumed: paced {:.1}, unpaced {:.1}", ratios[0], ratios[1]);
    assert!(ratios[0] * 3.0 <= ratios[1], "paced {:.1} vs unpaced {:.1}", ratios[0], ratios[1]);
}
