//! The peer: Redis Streams driven with `throughput`'s shape, so the two
//! brokers can be run side by side in one sitting (`bench/scripts/peer.sh`).
//!
//! Producers keep `window` XADDs in flight on one pipelined connection each
//! (closed loop), or send on a fixed schedule (`rate`, open loop: latency
//! from the intended send time); consumers read at most `count` entries per
//! XREADGROUP (blocking 100 ms when none are ready) and XACK each batch
//! before reading again. The payload's first 8 bytes carry the send time,
//! so end-to-end latency is send → read, as `throughput` measures it.
//! `producers 0` drains a backlog an earlier run left; `consumers 0` only
//! produces.
//!
//! Redis keeps acked entries in the stream (XACK only forgets the pending
//! entry): the scenario does not trim, so the server's memory grows with
//! what is produced, as its durability (AOF) is what is compared.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use spool_broker::clock::{instant_now, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};

use crate::harness::client_runtime;
use crate::histogram::{Latency, LatencySummary};
use crate::resp::{self, RespError, Value};
use crate::sends::TIMESTAMP_BYTES;

/// Consumer group every consumer reads in.
pub const GROUP: &str = "spool-bench";
/// How long one XREADGROUP waits for entries (ms).
const BLOCK_MS: &str = "100";
/// Bytes read from a socket at once.
const READ_CHUNK_BYTES: usize = 256 << 10;
/// XADDs written to a producer's socket in one write, at most.
const WRITE_BATCH_COMMANDS: usize = 64;
/// How long after the window producers' sends may take to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The load; defaults are `throughput`'s where the two share a flag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, clap::Args)]
pub struct RedisLoad {
    /// Redis server address.
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub addr: String,
    /// Stream key.
    #[arg(long, default_value = "spool-bench")]
    pub stream: String,
    /// Delete the stream and create the group before the run.
    #[arg(long)]
    pub fresh: bool,
    /// Payload bytes per message (the first 8 carry the send time).
    #[arg(long, default_value_t = 1024)]
    pub msg_bytes: u64,
    #[arg(long, default_value_t = 2)]
    pub producers: u64,
    #[arg(long, default_value_t = 2)]
    pub consumers: u64,
    /// XADDs in flight per producer.
    #[arg(long, default_value_t = 256)]
    pub window: u64,
    /// Entries per XREADGROUP, at most.
    #[arg(long, default_value_t = 64)]
    pub count: u64,
    /// Open loop: total msgs/s on a fixed schedule.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Length of the measured window.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Warm-up before the window (not measured).
    #[arg(long, default_value_t = 2000)]
    pub warmup_ms: u64,
    /// tokio worker threads for all clients.
    #[arg(long, default_value_t = 2)]
    pub client_threads: u64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisStreamsError {
    #[error("{field} = {value} is outside {min}..={max}")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("redis at {addr}: {source}")]
    Io { addr: String, source: std::io::Error },
    #[error("redis reply: {0}")]
    Resp(#[from] RespError),
    #[error("redis refused {command}: {message}")]
    Refused { command: &'static str, message: String },
    #[error("redis closed the connection")]
    Closed,
    #[error("sends still unanswered {0:?} after the window")]
    Drain(Duration),
    #[error("cannot start the client runtime: {0}")]
    Runtime(std::io::Error),
    #[error("histogram: {0}")]
    Histogram(String),
}

#[derive(Clone, Debug, Serialize)]
pub struct RedisEnqueue {
    /// XADDs answered inside the window ÷ its length.
    pub msgs_per_s: f64,
    pub count: u64,
    /// Send (or intended send) → XADD answered (with `appendfsync always`:
    /// durable).
    pub latency_us: LatencySummary,
}

#[derive(Clone, Debug, Serialize)]
pub struct RedisConsume {
    /// Entries whose XACK was answered inside the window ÷ its length.
    pub msgs_per_s: f64,
    pub acked: u64,
    pub read_requests: u64,
    /// XACK sent → answered.
    pub ack_rtt_us: LatencySummary,
}

/// One run's result.
#[derive(Clone, Debug, Serialize)]
pub struct RedisStreamsReport {
    pub enqueue: RedisEnqueue,
    pub consume: RedisConsume,
    /// Send (or intended send) → read by a consumer; empty when this run
    /// had no producers (a backlog's send times are another process's).
    pub e2e_latency_us: LatencySummary,
    pub errors: BTreeMap<String, u64>,
    pub measured_s: f64,
    pub config: RedisLoad,
}

struct Recorder {
    base: Instant,
    measuring: AtomicBool,
    stopping: AtomicBool,
    /// Whether payload times are this process's (it has producers).
    timed: bool,
    enqueued: AtomicU64,
    acked: AtomicU64,
    reads: AtomicU64,
    enqueue_latency: Mutex<Latency>,
    e2e_latency: Mutex<Latency>,
    ack_rtt: Mutex<Latency>,
    errors: Mutex<BTreeMap<String, u64>>,
}

fn lock(latency: &Mutex<Latency>) -> std::sync::MutexGuard<'_, Latency> {
    latency.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder {
    fn now_ns(&self) -> u64 {
        u64::try_from(instant_now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
    fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Acquire)
    }
    fn error(&self, name: &str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.into())
            .or_insert(0) += 1;
    }
}

/// One connection: writes commands, reads whole replies.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    addr: String,
}

impl Conn {
    async fn open(addr: &str) -> Result<Self, RedisStreamsError> {
        let stream = TcpStream::connect(addr).await.map_err(|source| io(addr, source))?;
        stream.set_nodelay(true).map_err(|source| io(addr, source))?;
        Ok(Self { stream, buf: Vec::with_capacity(READ_CHUNK_BYTES), addr: addr.to_owned() })
    }

    async fn call(&mut self, args: &[&[u8]]) -> Result<Value, RedisStreamsError> {
        let mut out = Vec::new();
        resp::encode(&mut out, args);
        self.stream.write_all(&out).await.map_err(|source| io(&self.addr, source))?;
        self.reply().await
    }

    async fn reply(&mut self) -> Result<Value, RedisStreamsError> {
        loop {
            if let Some((value, used)) = resp::decode(&self.buf)? {
                self.buf.drain(..used);
                return Ok(value);
            }
            let mut chunk = vec![0u8; READ_CHUNK_BYTES];
            let read =
                self.stream.read(&mut chunk).await.map_err(|source| io(&self.addr, source))?;
            if read == 0 {
                return Err(RedisStreamsError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..read]);
        }
    }
}

fn io(addr: &str, source: std::io::Error) -> RedisStreamsError {
    RedisStreamsError::Io { addr: addr.to_owned(), source }
}

fn refused(command: &'static str, value: &Value) -> Option<RedisStreamsError> {
    match value {
        Value::Error(message) => {
            Some(RedisStreamsError::Refused { command, message: message.clone() })
        }
        _ => None,
    }
}

fn validate(load: &RedisLoad) -> Result<(), RedisStreamsError> {
    let check = |field, value: u64, min: u64, max: u64| {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(RedisStreamsError::OutOfRange { field, value, min, max })
        }
    };
    check("msg_bytes", load.msg_bytes, TIMESTAMP_BYTES as u64, 1 << 20)?;
    check("producers", load.producers, 0, 64)?;
    check("consumers", load.consumers, 0, 64)?;
    check("producers + consumers", load.producers + load.consumers, 1, 128)?;
    check("window", load.window, 1, 65_536)?;
    check("count", load.count, 1, 65_536)?;
    if let Some(rate) = load.rate {
        check("rate", rate, load.producers.max(1), 10_000_000)?;
        check("producers (with --rate)", load.producers, 1, 64)?;
    }
    check("seconds", load.seconds, 1, 3_600)?;
    check("warmup_ms", load.warmup_ms, 0, 600_000)?;
    check("client_threads", load.client_threads, 1, 64)
}

/// Runs the scenario against the Redis at `load.addr`.
///
/// # Errors
/// A bad load, a server that cannot be reached or refuses the setup, a
/// reply that is not RESP2, or sends unanswered after the window.
pub fn run(load: &RedisLoad) -> Result<RedisStreamsReport, RedisStreamsError> {
    validate(load)?;
    let runtime = client_runtime(load.client_threads).map_err(RedisStreamsError::Runtime)?;
    let result = runtime.block_on(drive(load.clone()));
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn drive(load: RedisLoad) -> Result<RedisStreamsReport, RedisStreamsError> {
    let histogram =
        || Latency::new().map_err(|error| RedisStreamsError::Histogram(error.to_string()));
    let recorder = Arc::new(Recorder {
        base: instant_now(),
        measuring: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        timed: load.producers > 0,
        enqueued: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        enqueue_latency: Mutex::new(histogram()?),
        e2e_latency: Mutex::new(histogram()?),
        ack_rtt: Mutex::new(histogram()?),
        errors: Mutex::new(BTreeMap::new()),
    });
    let mut setup = Conn::open(&load.addr).await?;
    if load.fresh {
        setup.call(&[b"DEL", load.stream.as_bytes()]).await?;
    }
    let created = setup
        .call(&[b"XGROUP", b"CREATE", load.stream.as_bytes(), GROUP.as_bytes(), b"0", b"MKSTREAM"])
        .await?;
    if let Value::Error(message) = &created {
        if !message.starts_with("BUSYGROUP") {
            return Err(RedisStreamsError::Refused {
                command: "XGROUP CREATE",
                message: message.clone(),
            });
        }
    }

    let mut tasks = Vec::new();
    for index in 0..load.consumers {
        let conn = Conn::open(&load.addr).await?;
        tasks.push(tokio::spawn(consume(conn, load.clone(), index, Arc::clone(&recorder))));
    }
    for index in 0..load.producers {
        let conn = Conn::open(&load.addr).await?;
        let interval_ns = load.rate.map(|rate| {
            let share = rate / load.producers + u64::from(index < rate % load.producers);
            1_000_000_000 / share.max(1)
        });
        tasks.push(tokio::spawn(produce(conn, load.clone(), interval_ns, Arc::clone(&recorder))));
    }

    tokio::time::sleep(Duration::from_millis(load.warmup_ms)).await;
    let started = instant_now();
    recorder.measuring.store(true, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(load.seconds)).await;
    recorder.measuring.store(false, Ordering::Release);
    let measured_s = instant_now().duration_since(started).as_secs_f64();
    recorder.stopping.store(true, Ordering::Release);
    for task in tasks {
        match tokio::time::timeout(DRAIN_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(_)) => recorder.error("task_panicked"),
            Err(_) => return Err(RedisStreamsError::Drain(DRAIN_TIMEOUT)),
        }
    }
    let enqueued = recorder.enqueued.load(Ordering::Relaxed);
    let acked = recorder.acked.load(Ordering::Relaxed);
    let errors = recorder.errors.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let enqueue_latency = lock(&recorder.enqueue_latency).summary();
    let ack_rtt = lock(&recorder.ack_rtt).summary();
    let e2e_latency = lock(&recorder.e2e_latency).summary();
    Ok(RedisStreamsReport {
        enqueue: RedisEnqueue {
            msgs_per_s: enqueued as f64 / measured_s,
            count: enqueued,
            latency_us: enqueue_latency,
        },
        consume: RedisConsume {
            msgs_per_s: acked as f64 / measured_s,
            acked,
            read_requests: recorder.reads.load(Ordering::Relaxed),
            ack_rtt_us: ack_rtt,
        },
        e2e_latency_us: e2e_latency,
        errors,
        measured_s,
        config: load,
    })
}

/// One producer: XADDs pipelined on its connection, `window` unanswered at
/// most; closed loop, or one every `interval_ns` from the start.
async fn produce(
    conn: Conn,
    load: RedisLoad,
    interval_ns: Option<u64>,
    recorder: Arc<Recorder>,
) -> Result<(), RedisStreamsError> {
    let window = Arc::new(Semaphore::new(usize::try_from(load.window).unwrap_or(1)));
    let (times_tx, times_rx) = mpsc::unbounded_channel::<u64>();
    let Conn { stream, buf, addr } = conn;
    let (reader, mut writer) = stream.into_split();
    let replies = tokio::spawn(read_xadd_replies(
        reader,
        buf,
        addr.clone(),
        times_rx,
        Arc::clone(&window),
        Arc::clone(&recorder),
    ));
    let msg_bytes = usize::try_from(load.msg_bytes).unwrap_or(TIMESTAMP_BYTES);
    let mut payload = vec![b'r'; msg_bytes];
    let mut out = Vec::new();
    let mut sent = 0u64;
    let schedule_start = recorder.now_ns();
    while !recorder.stopping.load(Ordering::Acquire) {
        let Ok(permit) = Arc::clone(&window).acquire_owned().await else { break };
        permit.forget();
        let mut granted = 1;
        while granted < WRITE_BATCH_COMMANDS {
            match window.try_acquire() {
                Ok(permit) => {
                    permit.forget();
                    granted += 1;
                }
                Err(_) => break,
            }
        }
        out.clear();
        let mut batch = 0;
        while batch < granted {
            let start_ns = match interval_ns {
                None => recorder.now_ns(),
                Some(interval) => {
                    let due = schedule_start + sent * interval;
                    let now = recorder.now_ns();
                    if due > now {
                        if batch > 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_nanos(due - now)).await;
                    }
                    due
                }
            };
            payload[..TIMESTAMP_BYTES].copy_from_slice(&start_ns.to_le_bytes());
            resp::encode(&mut out, &[b"XADD", load.stream.as_bytes(), b"*", b"p", &payload]);
            if times_tx.send(start_ns).is_err() {
                return Err(RedisStreamsError::Closed);
            }
            sent += 1;
            batch += 1;
        }
        window.add_permits(granted - batch);
        writer.write_all(&out).await.map_err(|source| io(&addr, source))?;
    }
    drop(times_tx);
    match replies.await {
        Ok(result) => result,
        Err(_) => Err(RedisStreamsError::Closed),
    }
}

/// Answers to one producer's XADDs, in order: each frees a window slot and
/// gives a latency sample from its send time.
async fn read_xadd_replies(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    mut buf: Vec<u8>,
    addr: String,
    mut times: mpsc::UnboundedReceiver<u64>,
    window: Arc<Semaphore>,
    recorder: Arc<Recorder>,
) -> Result<(), RedisStreamsError> {
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut waiting: VecDeque<u64> = VecDeque::new();
    loop {
        while let Some((value, used)) = resp::decode(&buf)? {
            buf.drain(..used);
            let start_ns = match waiting.pop_front() {
                Some(start) => start,
                None => times.recv().await.ok_or(RedisStreamsError::Closed)?,
            };
            if let Some(error) = refused("XADD", &value) {
                recorder.error(&format!("xadd.{error}"));
            } else if recorder.measuring() {
                recorder.enqueued.fetch_add(1, Ordering::Relaxed);
                lock(&recorder.enqueue_latency)
                    .record_ns(recorder.now_ns().saturating_sub(start_ns));
            }
            window.add_permits(1);
        }
        while let Ok(start) = times.try_recv() {
            waiting.push_back(start);
        }
        if waiting.is_empty() {
            // Nothing unanswered: wait for the next send or the end.
            match times.recv().await {
                Some(start) => waiting.push_back(start),
                None => return Ok(()),
            }
        }
        let read = reader.read(&mut chunk).await.map_err(|source| io(&addr, source))?;
        if read == 0 {
            return Err(RedisStreamsError::Closed);
        }
        buf.extend_from_slice(&chunk[..read]);
    }
}

/// One consumer: XREADGROUP ≤ `count`, then XACK the batch, until the end.
async fn consume(
    mut conn: Conn,
    load: RedisLoad,
    index: u64,
    recorder: Arc<Recorder>,
) -> Result<(), RedisStreamsError> {
    let name = format!("c{index}");
    let count = load.count.to_string();
    while !recorder.stopping.load(Ordering::Acquire) {
        let reply = conn
            .call(&[
                b"XREADGROUP",
                b"GROUP",
                GROUP.as_bytes(),
                name.as_bytes(),
                b"COUNT",
                count.as_bytes(),
                b"BLOCK",
                BLOCK_MS.as_bytes(),
                b"STREAMS",
                load.stream.as_bytes(),
                b">",
            ])
            .await?;
        if let Some(error) = refused("XREADGROUP", &reply) {
            return Err(error);
        }
        recorder.reads.fetch_add(1, Ordering::Relaxed);
        let ids = entries(&reply, &recorder);
        if ids.is_empty() {
            continue;
        }
        let mut args: Vec<&[u8]> = vec![b"XACK", load.stream.as_bytes(), GROUP.as_bytes()];
        args.extend(ids.iter().map(Vec::as_slice));
        let sent = instant_now();
        let answer = conn.call(&args).await?;
        if let Some(error) = refused("XACK", &answer) {
            return Err(error);
        }
        if recorder.measuring() {
            let acked = match answer {
                Value::Integer(acked) => u64::try_from(acked).unwrap_or(0),
                _ => 0,
            };
            recorder.acked.fetch_add(acked, Ordering::Relaxed);
            lock(&recorder.ack_rtt).record_ns(
                u64::try_from(instant_now().duration_since(sent).as_nanos()).unwrap_or(u64::MAX),
            );
        }
    }
    Ok(())
}

/// The entry ids of an XREADGROUP reply; records each entry's end-to-end
/// latency from its payload.
fn entries(reply: &Value, recorder: &Recorder) -> Vec<Vec<u8>> {
    let mut ids = Vec::new();
    let Value::Array(Some(streams)) = reply else { return ids };
    let now = recorder.now_ns();
    for stream in streams {
        let Value::Array(Some(pair)) = stream else { continue };
        let Some(Value::Array(Some(items))) = pair.get(1) else { continue };
        for item in items {
            let Value::Array(Some(entry)) = item else { continue };
            let (Some(Value::Bulk(id)), Some(Value::Array(Some(fields)))) =
                (entry.first(), entry.get(1))
            else {
                recorder.error("e2e.bad_entry");
                continue;
            };
            ids.push(id.clone());
            if !(recorder.timed && recorder.measuring()) {
                continue;
            }
            match fields.get(1) {
                Some(Value::Bulk(payload)) if payload.len() >= TIMESTAMP_BYTES => {
                    let mut sent = [0u8; TIMESTAMP_BYTES];
                    sent.copy_from_slice(&payload[..TIMESTAMP_BYTES]);
                    lock(&recorder.e2e_latency)
                        .record_ns(now.saturating_sub(u64::from_le_bytes(sent)));
                }
                _ => recorder.error("e2e.bad_payload"),
            }
        }
    }
    ids
}
