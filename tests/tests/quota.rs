//! Quotas per principal against a real `spoold` with an auth file: an
//! enqueue past the rate is refused `QUOTA_EXCEEDED` (binary protocol and
//! HTTP API alike), counted, and passes again after the broker's hint; a
//! principal without quota is not limited; claims past
//! `claims_in_flight_max` are clamped, then refused, and an ack or an
//! expired lease frees the allowance; `spool quota list` and the metrics
//! show the use.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig, Credentials, Message,
    Producer, ProducerConfig,
};
use spool_tests::admin::{http_get, http_raw, Exposition, HttpAnswer};
use spool_tests::auth::{write_auth_file, Principal};
use spool_tests::{now, spool_bin, test_queue_config, Spoold, SpooldOptions};

const OPS: &str = "ops";
const LIMITED: &str = "limited";
const BYTES: &str = "bytes";
const FREE: &str = "free";
const SECRET: &str = "quota-test-secret";
const QUEUE: &str = "jobs";
/// How long a test polls for an event before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// `limited` may send one message a second and hold two claims;
/// `bytes` may send one byte a second (any batch passes on a full bucket,
/// then none for minutes); `free` has no quota; `ops` administers.
fn auth_file(dir: &Path) -> PathBuf {
    let path = dir.join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(OPS, SECRET, &["*"], &["admin", "describe"]),
            Principal::new(LIMITED, SECRET, &["*"], &["enqueue", "claim", "describe"])
                .with_quota(&[("enqueue_messages_per_sec", 1), ("claims_in_flight_max", 2)]),
            Principal::new(BYTES, SECRET, &["*"], &["enqueue"])
                .with_quota(&[("enqueue_bytes_per_sec", 1)]),
            Principal::new(FREE, SECRET, &["*"], &["enqueue", "claim"]),
        ],
    );
    path
}

/// A 1-shard broker (so each share is the whole figure) with the quotas of
/// [`auth_file`] and the queue [`QUEUE`].
async fn start() -> (Spoold, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = auth_file(dir.path());
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);
    let ops = client_as(&broker, OPS).await;
    Admin::new(ops).create_queue(QUEUE, test_queue_config(1, 60_000, 100)).await.unwrap();
    (broker, dir)
}

async fn client_as(broker: &Spoold, principal: &str) -> Client {
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_secs(15),
            ..ConnectionConfig::default()
        },
    }
    .with_credentials(Credentials::new(principal, SECRET));
    Client::connect_with(&broker.addr(), config).await.unwrap()
}

/// Enqueues one batch of `records` small records on partition 0.
async fn enqueue_batch(
    client: &Client,
    records: u8,
) -> Result<spool_client::spool_wire::proto::EnqueueResponse, ClientError> {
    use spool_client::spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
    // The record's time must lie near the broker's clock (one host).
    #[allow(clippy::disallowed_methods)]
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as u64;
    let mut builder = DataBatchBuilder::new();
    for index in 0..records {
        let mut id = [0xB7; 16];
        id[0] = index;
        let record = Record {
            message_id: MessageId(id),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(b"batched".to_vec()),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: now_ms,
        };
        builder.push(&record).unwrap();
    }
    client.enqueue(QUEUE, PartitionId(0), &builder.finish().unwrap()).await
}

/// A producer that does not retry, so a refusal reaches the test.
fn producer(client: &Client) -> Producer {
    Producer::new(client.clone(), ProducerConfig { retries: 0, ..ProducerConfig::default() })
        .unwrap()
}

fn scrape(broker: &Spoold) -> Exposition {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{page:?}");
    Exposition::parse(&page.body).unwrap()
}

fn rejections(broker: &Spoold, principal: &str, quota: &str) -> f64 {
    scrape(broker)
        .value("spool_quota_rejections_total", &[("principal", principal), ("quota", quota)])
        .unwrap_or(0.0)
}

fn in_use(broker: &Spoold, principal: &str, quota: &str) -> Option<f64> {
    scrape(broker).value("spool_quota_in_use", &[("principal", principal), ("quota", quota)])
}

/// The retry hint of a `QUOTA_EXCEEDED`, which must name `quota`.
fn quota_refusal(error: &ClientError, quota: &str) -> Duration {
    assert_eq!(error.code(), Some(ErrorCode::QuotaExceeded), "{error}");
    assert!(matches!(error, ClientError::QuotaExceeded { .. }), "{error:?}");
    assert!(error.is_retriable());
    assert!(error.to_string().contains(quota), "{error}");
    error.retry_after().unwrap_or_else(|| panic!("no retry hint in {error}"))
}

fn http_send(broker: &Spoold, principal: &str) -> HttpAnswer {
    let addr = broker.admin_addr();
    let body = json!({ "payload": "over http" }).to_string();
    let head = format!(
        "POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {principal}:{SECRET}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_raw(&addr, head.as_bytes())
}

fn spool_quota_list(broker: &Spoold, principal: &str) -> std::process::Output {
    Command::new(spool_bin())
        .args(["--json", "--addr", &broker.addr(), "--principal", principal])
        .args(["quota", "list", "--admin", &broker.admin_addr()])
        .env_remove("SPOOL_PRINCIPAL")
        .env("SPOOL_SECRET", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

// Goal: an enqueue past the principal's rate is refused QUOTA_EXCEEDED
// naming the quota with a retry hint, counted in
// spool_quota_rejections_total, and passes once the hint has passed; the
// HTTP API (bearer token) draws on the same bucket (429, Retry-After); a
// byte rate refuses by bytes; a principal without quota sends freely.
// Method: a rate of 1 message/s on one shard: a first batch of 4 records
// passes on the full bucket and leaves it 3 messages in debt, so the next
// send is refused for the next 3 seconds whatever the machine's pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_past_the_rate_is_refused_counted_and_passes_after_the_hint() {
    let (broker, _dir) = start().await;
    let limited = client_as(&broker, LIMITED).await;
    let limited_producer = producer(&limited);
    let before = rejections(&broker, LIMITED, "enqueue_messages_per_sec");

    let charged = now();
    enqueue_batch(&limited, 4).await.unwrap();
    let refused = limited_producer.send(QUEUE, Message::new("second")).await.unwrap_err();
    let hint = quota_refusal(&refused, "enqueue_messages_per_sec");
    assert!(hint <= Duration::from_secs(4), "{hint:?}");
    assert_eq!(rejections(&broker, LIMITED, "enqueue_messages_per_sec") - before, 1.0);

    // The HTTP API is the same principal on the same shard: same bucket
    // (judged only while the debt surely lasts).
    let answer = http_send(&broker, LIMITED);
    if charged.elapsed() < Duration::from_secs(3) {
        assert_eq!(answer.status, 429, "{answer:?}");
        assert_eq!(answer.json()["error"]["name"], "QUOTA_EXCEEDED", "{answer:?}");
        assert!(answer.json()["error"]["retry_after_ms"].as_u64().is_some(), "{answer:?}");
        let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=4).contains(&retry_after), "{answer:?}");
        assert_eq!(rejections(&broker, LIMITED, "enqueue_messages_per_sec") - before, 2.0);
    }

    // After the hint the bucket has room again (time under test: it refills).
    tokio::time::sleep(hint).await;
    let deadline = now() + PATIENCE;
    loop {
        match limited_producer.send(QUEUE, Message::new("after the hint")).await {
            Ok(_) => break,
            // The HTTP send above may have taken the room first.
            Err(error) if now() < deadline => {
                let wait = quota_refusal(&error, "enqueue_messages_per_sec");
                // Time under test: the bucket refills after the refusal's hint.
                tokio::time::sleep(wait).await;
            }
            Err(error) => panic!("still refused after {PATIENCE:?}: {error}"),
        }
    }

    // A byte rate: the first batch passes on the full bucket and leaves it
    // in debt for as many seconds as it had bytes.
    let bytes = client_as(&broker, BYTES).await;
    let bytes_producer = producer(&bytes);
    bytes_producer.send(QUEUE, Message::new("a few bytes")).await.unwrap();
    let refused = bytes_producer.send(QUEUE, Message::new("more")).await.unwrap_err();
    let hint = quota_refusal(&refused, "enqueue_bytes_per_sec");
    assert!(hint > Duration::from_secs(10), "{hint:?}");
    assert_eq!(rejections(&broker, BYTES, "enqueue_bytes_per_sec"), 1.0);

    // No quota, no limit.
    let free = client_as(&broker, FREE).await;
    let free_producer = producer(&free);
    for index in 0..20 {
        free_producer.send(QUEUE, Message::new(format!("free {index}"))).await.unwrap();
    }
    assert_eq!(rejections(&broker, FREE, "enqueue_messages_per_sec"), 0.0);
    assert!(in_use(&broker, FREE, "enqueue_messages_per_sec").is_none(), "free has no series");
}

/// Claims `credits` on partition 0 as `client` with `lease_ms`.
async fn claim(
    client: &Client,
    credits: u32,
    lease_ms: u32,
) -> Result<Vec<spool_client::Delivery>, ClientError> {
    let options = ClaimOptions::new(credits).lease_ms(lease_ms).wait_ms(0);
    client.claim(QUEUE, PartitionId(0), &options).await.map(|batch| batch.deliveries)
}

// Goal: a principal with claims_in_flight_max = 2 gets a claim for more
// clamped to 2, the next claim refused QUOTA_EXCEEDED (counted), room
// again after an ack, and again when a short lease runs out; `spool quota
// list` and spool_quota_in_use show the claims in flight; a principal
// without quota claims freely. Method: messages sent by `free`, claims by
// `limited` on the one partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_past_the_allowance_are_clamped_refused_and_freed() {
    let (broker, _dir) = start().await;
    let free = client_as(&broker, FREE).await;
    let free_producer = producer(&free);
    for index in 0..20 {
        free_producer.send(QUEUE, Message::new(format!("m{index}"))).await.unwrap();
    }
    let limited = client_as(&broker, LIMITED).await;

    let first = claim(&limited, 5, 60_000).await.unwrap();
    assert_eq!(first.len(), 2, "clamped to the allowance");
    let refused = claim(&limited, 1, 60_000).await.unwrap_err();
    let hint = quota_refusal(&refused, "claims_in_flight_max");
    assert!(hint > Duration::from_secs(30), "the hint is the earliest lease: {hint:?}");
    assert_eq!(rejections(&broker, LIMITED, "claims_in_flight_max"), 1.0);
    assert_eq!(in_use(&broker, LIMITED, "claims_in_flight_max"), Some(2.0));

    let listed = spool_quota_list(&broker, OPS);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let principals = listed["principals"].as_array().unwrap();
    let entry = principals.iter().find(|p| p["principal"] == LIMITED).unwrap();
    let claims = entry["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["quota"] == "claims_in_flight_max")
        .unwrap();
    assert_eq!(claims["limit"], 2);
    assert_eq!(claims["in_use"], 2);
    assert_eq!(claims["rejections"], 1);
    assert!(principals.iter().all(|p| p["principal"] != FREE), "{listed}");
    // Listing needs admin on `*`.
    let denied = spool_quota_list(&broker, LIMITED);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("PERMISSION_DENIED"), "{denied:?}");

    // An ack frees one.
    limited.ack(QUEUE, PartitionId(0), &[first[0].token()]).await.unwrap();
    let short = claim(&limited, 5, 300).await.unwrap();
    assert_eq!(short.len(), 1, "one freed by the ack");
    let refused = claim(&limited, 1, 60_000).await.unwrap_err();
    let hint = quota_refusal(&refused, "claims_in_flight_max");
    assert!(hint <= Duration::from_millis(300), "the short lease is the earliest: {hint:?}");

    // The short lease running out frees another, with no ack.
    let leased_at = now();
    let deadline = leased_at + PATIENCE;
    let freed = loop {
        match claim(&limited, 1, 60_000).await {
            Ok(freed) => break freed,
            Err(error) if now() < deadline => {
                let wait = quota_refusal(&error, "claims_in_flight_max");
                // Time under test: the short lease runs out (retried by the hint).
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
            }
            Err(error) => panic!("no room after {PATIENCE:?}: {error}"),
        }
    };
    assert_eq!(freed.len(), 1);
    assert_eq!(in_use(&broker, LIMITED, "claims_in_flight_max"), Some(2.0));

    // No quota, no clamp.
    let many = claim(&free, 10, 60_000).await.unwrap();
    assert_eq!(many.len(), 10);
}
