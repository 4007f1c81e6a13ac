//! `hostile`: a well-behaved producer's enqueue latency, alone and then
//! beside hostile connections on the same shard.
//!
//! What it owns: one run of two phases against one `spoold` (started here on
//! loopback unless `--addr`): `unloaded` (the producer alone) and `hostile`
//! (the producer while `connections` raw TCP connections each pipeline up
//! to `claims_per_connection` 60 s long-poll claims on the producer's
//! partition and keep `requests_in_flight` DescribeQueue requests
//! outstanding for the whole phase). The producer sends one 1 KiB message
//! every `interval_ms` (linger 0) and records each send's latency; the
//! hostile connections run on their own runtime threads. Bounded:
//! the connection count, the requests per connection and the phase length
//! are all fixed by the command line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::instant_now;
use spool_client::{Admin, Client, Message, Producer, ProducerConfig};
use spool_wire::proto::{
    ClaimRequest, CorrelationId, DescribeQueueRequest, PartitionId, Request, WorkerId,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::histogram::Latency;
use crate::load::PercentilesMs;
use crate::BenchError;

/// Queue the scenario creates (one partition: the producer and the hostile
/// claims meet there).
pub const HOSTILE_QUEUE: &str = "bench-hostile";

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct HostileConfig {
    pub connections: u32,
    pub claims_per_connection: u32,
    pub requests_in_flight: u32,
    pub phase_s: f64,
    pub interval_ms: u64,
}

/// Counts of what the hostile connections got back.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostileTraffic {
    pub replies: u64,
    pub error_replies: u64,
    pub connections_closed_by_broker: u64,
}

/// One run, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct HostileReport {
    pub scenario: &'static str,
    pub unloaded_enqueue_ms: PercentilesMs,
    pub hostile_enqueue_ms: PercentilesMs,
    /// hostile p99 / unloaded p99.
    pub p99_ratio: f64,
    pub producer_errors: u64,
    pub traffic: HostileTraffic,
    pub config: HostileConfig,
    pub addr: String,
}

fn claim_frame(correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let request = Request::Claim(ClaimRequest {
        queue: HOSTILE_QUEUE,
        partition: PartitionId(0),
        worker: WorkerId(9),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: 30_000,
        wait_ms: 60_000,
        subscription: "",
    });
    // The fields are constants inside every range: encoding cannot fail.
    let _ = request.encode(CorrelationId(correlation), &mut out);
    out
}

fn describe_frame(correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let request = Request::DescribeQueue(DescribeQueueRequest { name: HOSTILE_QUEUE.to_owned() });
    let _ = request.encode(CorrelationId(correlation), &mut out);
    out
}

/// One hostile connection until `stop`: its long-polls, then one new
/// DescribeQueue for every reply, so `requests_in_flight` stay outstanding.
async fn hostile_connection(
    addr: String,
    config: HostileConfig,
    stop: Arc<AtomicBool>,
    replies: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
) {
    let Ok(mut stream) = TcpStream::connect(&addr).await else {
        closed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut correlation = 1u64;
    let mut opening = Vec::new();
    for _ in 0..config.claims_per_connection {
        opening.extend(claim_frame(correlation));
        correlation += 1;
    }
    for _ in 0..config.requests_in_flight {
        opening.extend(describe_frame(correlation));
        correlation += 1;
    }
    if stream.write_all(&opening).await.is_err() {
        closed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut buffer = vec![0u8; 1 << 20];
    let mut filled = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let read =
            tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buffer[filled..]))
                .await;
        let read = match read {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(Ok(read)) => read,
        };
        filled += read;
        let mut consumed = 0;
        let mut answered = 0u64;
        while filled - consumed >= 24 {
            let at = consumed;
            let len =
                u32::from_le_bytes([buffer[at], buffer[at + 1], buffer[at + 2], buffer[at + 3]])
                    as usize;
            if len < 24 || len > buffer.len() {
                closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if filled - consumed < len {
                break;
            }
            let error_code = u16::from_le_bytes([buffer[at + 18], buffer[at + 19]]);
            if error_code != 0 {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            consumed += len;
            answered += 1;
        }
        buffer.copy_within(consumed..filled, 0);
        filled -= consumed;
        replies.fetch_add(answered, Ordering::Relaxed);
        let mut more = Vec::new();
        for _ in 0..answered {
            more.extend(describe_frame(correlation));
            correlation += 1;
        }
        if !more.is_empty() && stream.write_all(&more).await.is_err() {
            closed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
}

/// Sends one message every `interval_ms` for `phase_s`; returns the
/// latency percentiles and the number of failed sends.
async fn produce(
    producer: &Producer,
    config: &HostileConfig,
    phase: &str,
) -> Result<(PercentilesMs, u64), BenchError> {
    let mut latency = Latency::new()?;
    let mut errors = 0;
    let started = instant_now();
    let mut sequence = 0u64;
    let payload = vec![b'x'; 1024];
    while started.elapsed().as_secs_f64() < config.phase_s {
        let send_started = instant_now();
        let message = Message::new(payload.clone()).key(format!("{phase}-{sequence}"));
        match producer.send(HOSTILE_QUEUE, message).await {
            Ok(_) => latency
                .record_ns(u64::try_from(send_started.elapsed().as_nanos()).unwrap_or(u64::MAX)),
            Err(_) => errors += 1,
        }
        sequence += 1;
        let spent = send_started.elapsed();
        let interval = Duration::from_millis(config.interval_ms);
        if spent < interval {
            tokio::time::sleep(interval - spent).await;
        }
    }
    Ok((latency.summary().into(), errors))
}

/// Runs both phases against `addr`. The hostile connections run on
/// `hostile_runtime` (their own threads, as separate clients would), so the
/// producer's latency is the broker's, not its own runtime's queue behind
/// 200 busy connections.
///
/// # Errors
/// The client cannot connect, the queue cannot be created, or the
/// histogram cannot be built.
pub async fn run(
    addr: &str,
    config: &HostileConfig,
    hostile_runtime: &tokio::runtime::Handle,
) -> Result<HostileReport, BenchError> {
    let client =
        Client::connect(addr).await.map_err(|error| BenchError::Hostile(error.to_string()))?;
    let admin = Admin::new(client.clone());
    admin
        .create_queue(HOSTILE_QUEUE, spool_client::default_queue_config(1))
        .await
        .map_err(|error| BenchError::Hostile(error.to_string()))?;
    let producer_config = ProducerConfig { linger: Duration::ZERO, ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), producer_config)
        .map_err(|error| BenchError::Hostile(error.to_string()))?;
    // Warm the path once so the first phase does not pay connection set-up.
    let _ = producer.send(HOSTILE_QUEUE, Message::new("warm")).await;
    let (unloaded, unloaded_errors) = produce(&producer, config, "unloaded").await?;

    let stop = Arc::new(AtomicBool::new(false));
    let replies = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..config.connections {
        tasks.push(hostile_runtime.spawn(hostile_connection(
            addr.to_owned(),
            config.clone(),
            stop.clone(),
            replies.clone(),
            errors.clone(),
            closed.clone(),
        )));
    }
    // Let the hostile connections open and fill their pipelines.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (hostile, hostile_errors) = produce(&producer, config, "hostile").await?;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let p99_ratio = if unloaded.p99 > 0.0 { hostile.p99 / unloaded.p99 } else { 0.0 };
    Ok(HostileReport {
        scenario: "hostile",
        unloaded_enqueue_ms: unloaded,
        hostile_enqueue_ms: hostile,
        p99_ratio,
        producer_errors: unloaded_errors + hostile_errors,
        traffic: HostileTraffic {
            replies: replies.load(Ordering::Relaxed),
            error_replies: errors.load(Ordering::Relaxed),
            connections_closed_by_broker: closed.load(Ordering::Relaxed),
        },
        config: config.clone(),
        addr: addr.to_owned(),
    })
}
