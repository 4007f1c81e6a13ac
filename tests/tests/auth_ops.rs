//! Operations around authentication against a real `spoold`: the auth
//! file reloaded without a restart (HTTP, SIGHUP and `spool auth reload`;
//! sessions take the new rights, a removed principal is cut off, a broken
//! file keeps the old policy), the failed-login lockout per source address
//! on the shard port and the admin port, the ACL as the broker has it
//! (`GET /v1/acl`, `spool acl`), `spool metrics`, and the Grafana dashboard
//! held to the names a real scrape exports.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use spool_client::spool_wire::proto::{
    decode_frame, AuthenticateRequest, CorrelationId, ListQueuesRequest, Reply, Request, Response,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClaimOptions, Client, ClientError, Message, Producer, ProducerConfig};
use spool_tests::admin::{http_get, http_raw, Exposition, HttpAnswer};
use spool_tests::auth::{
    client_as, spool_as, write_auth_file, write_auth_file_rehashing, Principal, OPS, OPS_SECRET,
    VIEWER, VIEWER_SECRET, WORKER, WORKER_SECRET, WRONG_SECRET,
};
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "jobs";
const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a test waits for a condition it polls (a lockout window is 10 s).
const CONDITION_WAIT: Duration = Duration::from_secs(30);

const OPS_ENTRY: Principal<'static> =
    Principal::new(OPS, OPS_SECRET, &["*"], &["admin", "describe", "peek", "purge", "redrive"]);
const VIEWER_ENTRY: Principal<'static> =
    Principal::new(VIEWER, VIEWER_SECRET, &["*"], &["describe"]);

fn worker_entry(operations: &'static [&'static str]) -> Principal<'static> {
    Principal::new(WORKER, WORKER_SECRET, &[QUEUE], operations)
}

/// A 1-shard broker with the auth file `entries`, and the file's path.
fn start_with(entries: &[Principal<'_>]) -> (Spoold, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    write_auth_file(&path, entries);
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    (Spoold::start_with(options), dir, path)
}

fn http_as(broker: &Spoold, token: Option<&str>, method: &str, path: &str) -> HttpAnswer {
    let addr = broker.admin_addr();
    let authorization =
        token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    http_raw(&addr, head.as_bytes())
}

fn frame(request: &Request<'_>, correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(CorrelationId(correlation), &mut out).unwrap();
    out
}

/// Reads exactly one answer from `stream`: (correlation id, code, message).
fn read_answer(stream: &mut TcpStream) -> (u64, ErrorCode, String) {
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let aligned = spool_tests::read_frame_aligned(stream).unwrap();
    let decoded = decode_frame(&aligned).unwrap();
    let reply = Response::decode(&decoded).unwrap();
    match reply.reply {
        Reply::Ok(_) => (reply.correlation_id.0, ErrorCode::None, String::new()),
        Reply::Err(error) => (reply.correlation_id.0, error.code, error.message.to_string()),
    }
}

/// Whether the broker closed `stream` (EOF within the read timeout).
fn closed_by_broker(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).is_ok() && rest.is_empty()
}

/// A raw connection that authenticated as `principal`.
fn authenticated_stream(broker: &Spoold, principal: &str, secret: &str) -> TcpStream {
    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    stream
        .write_all(&frame(&Request::Authenticate(AuthenticateRequest { principal, secret }), 1))
        .unwrap();
    let (_, code, message) = read_answer(&mut stream);
    assert_eq!(code, ErrorCode::None, "{principal}: {message}");
    stream
}

/// One handshake on a fresh connection: its code and message.
fn handshake(broker: &Spoold, principal: &str, secret: &str) -> (ErrorCode, String) {
    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    stream
        .write_all(&frame(&Request::Authenticate(AuthenticateRequest { principal, secret }), 1))
        .unwrap();
    let (_, code, message) = read_answer(&mut stream);
    (code, message)
}

fn scrape(broker: &Spoold) -> Exposition {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{page:?}");
    Exposition::parse(&page.body).unwrap()
}

fn reloads(broker: &Spoold, outcome: &str) -> f64 {
    scrape(broker).value("spool_auth_reloads_total", &[("outcome", outcome)]).unwrap()
}

/// Polls `condition` every 100 ms until it holds, for at most
/// [`CONDITION_WAIT`]; panics with `what` if it never does.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = spool_tests::now();
    while !condition() {
        assert!(start.elapsed() < CONDITION_WAIT, "not within {CONDITION_WAIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn enqueue(client: &Client) -> Result<(), ClientError> {
    let producer =
        Producer::new(client.clone(), ProducerConfig { retries: 0, ..ProducerConfig::default() })
            .unwrap();
    producer.send(QUEUE, Message::new("m")).await.map(drop)
}

// Goal: a reload changes the rights of connections that are already open
// on their next request (no reconnect), a principal removed by a reload is
// answered UNAUTHENTICATED on its next request and its connection closed,
// a broken file is refused naming the file and the problem while the old
// policy stays in force, only a principal with the admin right on `*` may
// reload, and every reload is counted by outcome. Reloads come through
// `POST /v1/auth/reload`, SIGHUP and `spool auth reload`.
// Method: a worker client and a raw authenticated connection kept open
// across reloads of a rewritten auth file; metrics scraped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_changes_rights_of_open_sessions_and_cuts_off_removed_principals() {
    let worker_all = worker_entry(&["enqueue", "claim", "describe"]);
    let (broker, _dir, path) = start_with(&[OPS_ENTRY, VIEWER_ENTRY, worker_all]);
    let ops_token = format!("{OPS}:{OPS_SECRET}");
    let ops = client_as(&broker, OPS, OPS_SECRET).await.unwrap();
    Admin::new(ops).create_queue(QUEUE, test_queue_config(1, 1_000, 3)).await.unwrap();
    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    enqueue(&worker).await.unwrap();
    assert_eq!(reloads(&broker, "ok"), 0.0);

    // 1. The worker loses enqueue; its open connection sees it at once.
    write_auth_file(&path, &[OPS_ENTRY, VIEWER_ENTRY, worker_entry(&["claim", "describe"])]);
    let answer = http_as(&broker, Some(&ops_token), "POST", "/v1/auth/reload");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["generation"], 1, "{answer:?}");
    assert_eq!(answer.json()["principals"], 3, "{answer:?}");
    let refused = enqueue(&worker).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused:?}");
    let claimed = worker.claim_any(QUEUE, &ClaimOptions::new(1).wait_ms(0)).await.unwrap();
    assert_eq!(claimed.len(), 1, "the rights it kept still work on the same connection");
    assert_eq!(reloads(&broker, "ok"), 1.0);

    // 2. Only the admin right on every queue may reload.
    let viewer_token = format!("{VIEWER}:{VIEWER_SECRET}");
    let answer = http_as(&broker, Some(&viewer_token), "POST", "/v1/auth/reload");
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.json()["error"]["name"], "PERMISSION_DENIED");

    // 3. A broken file: refused with its name and the problem; old policy kept.
    std::fs::write(&path, "[[principals]]\nname = \"ops\"\nsecret_hash = \"plain\"\n").unwrap();
    let answer = http_as(&broker, Some(&ops_token), "POST", "/v1/auth/reload");
    assert_eq!(answer.status, 400, "{answer:?}");
    let message = answer.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("auth.toml") && message.contains("PHC"), "{message}");
    assert!(message.contains("kept"), "{message}");
    assert_eq!(reloads(&broker, "invalid"), 1.0);
    let claimed = worker.claim_any(QUEUE, &ClaimOptions::new(1).wait_ms(0)).await.unwrap();
    assert!(claimed.is_empty(), "the worker still acts under the kept policy");
    assert_eq!(handshake(&broker, OPS, OPS_SECRET).0, ErrorCode::None);

    // 4. The worker is removed, by SIGHUP: its open connections are cut off.
    let mut raw = authenticated_stream(&broker, WORKER, WORKER_SECRET);
    write_auth_file(&path, &[OPS_ENTRY, VIEWER_ENTRY]);
    broker.signal(libc::SIGHUP);
    wait_until("the SIGHUP reload is counted", || reloads(&broker, "ok") == 2.0);
    raw.write_all(&frame(&Request::ListQueues(ListQueuesRequest {}), 2)).unwrap();
    let (correlation, code, message) = read_answer(&mut raw);
    assert_eq!((correlation, code), (2, ErrorCode::Unauthenticated), "{message}");
    assert!(message.contains("no longer in the auth file"), "{message}");
    assert!(closed_by_broker(&mut raw), "the connection of a removed principal is closed");
    let cut = Admin::new(worker.clone()).list_queues().await.unwrap_err();
    assert!(
        cut.code() == Some(ErrorCode::Unauthenticated)
            || matches!(cut, ClientError::ConnectionClosed { .. }),
        "{cut:?}"
    );
    assert_eq!(handshake(&broker, WORKER, WORKER_SECRET).0, ErrorCode::Unauthenticated);

    // 5. `spool auth reload` puts the worker back.
    write_auth_file(&path, &[OPS_ENTRY, VIEWER_ENTRY, worker_entry(&["enqueue"])]);
    let admin = broker.admin_addr();
    let output = spool_as(&broker, Some((OPS, OPS_SECRET)), &["auth", "reload", "--admin", &admin]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("generation 3"), "{output:?}");
    let denied =
        spool_as(&broker, Some((VIEWER, VIEWER_SECRET)), &["auth", "reload", "--admin", &admin]);
    assert_eq!(denied.status.code(), Some(1), "{denied:?}");
    assert!(String::from_utf8_lossy(&denied.stderr).contains("PERMISSION_DENIED"), "{denied:?}");
    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    enqueue(&worker).await.unwrap();
    let exposition = scrape(&broker);
    assert_eq!(exposition.value("spool_auth_policy_generation", &[]), Some(3.0));

    // 6. A changed secret hash ends the principal's open sessions too; the
    // secret that matches the new hash authenticates again.
    let mut raw = authenticated_stream(&broker, VIEWER, VIEWER_SECRET);
    let entries = [OPS_ENTRY, VIEWER_ENTRY, worker_entry(&["enqueue"])];
    write_auth_file_rehashing(&path, &entries, Some(VIEWER));
    let answer = http_as(&broker, Some(&ops_token), "POST", "/v1/auth/reload");
    assert_eq!(answer.status, 200, "{answer:?}");
    raw.write_all(&frame(&Request::ListQueues(ListQueuesRequest {}), 2)).unwrap();
    let (_, code, message) = read_answer(&mut raw);
    assert_eq!(code, ErrorCode::Unauthenticated, "{message}");
    assert!(message.contains("secret of principal viewer changed"), "{message}");
    assert!(closed_by_broker(&mut raw));
    assert_eq!(handshake(&broker, VIEWER, VIEWER_SECRET).0, ErrorCode::None);

    let log = broker.log();
    assert!(log.contains("auth file reloaded"), "{log}");
    assert!(log.contains("auth file reload refused"), "{log}");
    for secret in [WORKER_SECRET, OPS_SECRET, VIEWER_SECRET] {
        assert!(!log.contains(secret), "a secret is in the broker's log");
    }
}

// Goal: a reload reaches every shard before it is answered: a removed
// principal's connections on each shard port are cut off on their next
// request, and a principal added by the reload authenticates on each.
// Method: a 2-shard broker, one raw connection per shard, one reload.
#[test]
fn reload_reaches_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    write_auth_file(&path, &[OPS_ENTRY, worker_entry(&["enqueue"])]);
    let mut options = SpooldOptions::new(2);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);
    let mut streams: Vec<TcpStream> = (0..2)
        .map(|shard| {
            let mut stream = TcpStream::connect(broker.shard_addr(shard)).unwrap();
            let handshake = Request::Authenticate(AuthenticateRequest {
                principal: WORKER,
                secret: WORKER_SECRET,
            });
            stream.write_all(&frame(&handshake, 1)).unwrap();
            assert_eq!(read_answer(&mut stream).1, ErrorCode::None, "shard {shard}");
            stream
        })
        .collect();
    write_auth_file(&path, &[OPS_ENTRY, VIEWER_ENTRY]);
    let answer = http_as(&broker, Some(&format!("{OPS}:{OPS_SECRET}")), "POST", "/v1/auth/reload");
    assert_eq!(answer.status, 200, "{answer:?}");
    for (shard, stream) in streams.iter_mut().enumerate() {
        stream.write_all(&frame(&Request::ListQueues(ListQueuesRequest {}), 2)).unwrap();
        let (_, code, message) = read_answer(stream);
        assert_eq!(code, ErrorCode::Unauthenticated, "shard {shard}: {message}");
        assert!(closed_by_broker(stream), "shard {shard}");
        let mut fresh = TcpStream::connect(broker.shard_addr(shard as u16)).unwrap();
        let handshake =
            Request::Authenticate(AuthenticateRequest { principal: VIEWER, secret: VIEWER_SECRET });
        fresh.write_all(&frame(&handshake, 1)).unwrap();
        assert_eq!(
            read_answer(&mut fresh).1,
            ErrorCode::None,
            "the new principal on shard {shard}"
        );
    }
}

// Goal: after AUTH_FAILURES_MAX (5) refused handshakes from one address
// within the window, the next ones — even with the right secret — are
// refused at once saying there were too many failed attempts, and counted
// in `spool_auth_lockouts_total`; the same holds for bearer tokens on the
// admin port; both work again once the window (10 s) has passed.
// Method: raw handshakes and HTTP requests from 127.0.0.1; the end of the
// lockout is polled (bounded), not slept for.
#[test]
fn failed_logins_lock_the_address_out_for_a_window() {
    let (broker, _dir, _path) = start_with(&[OPS_ENTRY]);
    for attempt in 0..5 {
        let (code, message) = handshake(&broker, OPS, WRONG_SECRET);
        assert_eq!(code, ErrorCode::Unauthenticated, "attempt {attempt}");
        assert!(message.contains("secret wrong"), "attempt {attempt}: {message}");
    }
    let (code, message) = handshake(&broker, OPS, OPS_SECRET);
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(message.contains("too many failed attempts"), "{message}");

    let wrong = format!("{OPS}:{WRONG_SECRET}");
    let right = format!("{OPS}:{OPS_SECRET}");
    for attempt in 0..5 {
        let answer = http_as(&broker, Some(&wrong), "GET", "/v1/queues");
        assert_eq!(answer.status, 401, "attempt {attempt}: {answer:?}");
    }
    let answer = http_as(&broker, Some(&right), "GET", "/v1/queues");
    assert_eq!(answer.status, 401, "{answer:?}");
    let message = answer.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("too many failed attempts"), "{message}");

    let lockouts = scrape(&broker).value("spool_auth_lockouts_total", &[]).unwrap();
    assert!(lockouts >= 2.0, "{lockouts}");

    wait_until("the shard port's lockout ends", || {
        handshake(&broker, OPS, OPS_SECRET).0 == ErrorCode::None
    });
    wait_until("the admin port's lockout ends", || {
        http_as(&broker, Some(&right), "GET", "/v1/queues").status == 200
    });
    let log = broker.log();
    assert!(log.contains("too many failed attempts"), "{log}");
    assert!(!log.contains(OPS_SECRET) && !log.contains(WRONG_SECRET), "a secret is in the log");
}

// Goal: the broker shows the ACL it has in force — every principal's
// compiled rules, and one principal's rights on one queue by the broker's
// own matching — over `GET /v1/acl` and `spool acl list|check`, to a
// principal with the admin right on `*` only, and never a secret or hash.
#[test]
fn acl_list_and_check_show_the_rules_in_force() {
    let worker = worker_entry(&["enqueue", "claim"]);
    let (broker, _dir, _path) = start_with(&[OPS_ENTRY, VIEWER_ENTRY, worker]);
    let ops_token = format!("{OPS}:{OPS_SECRET}");
    let listed = http_as(&broker, Some(&ops_token), "GET", "/v1/acl");
    assert_eq!(listed.status, 200, "{listed:?}");
    assert!(!listed.body.contains("argon2"), "{listed:?}");
    let principals = listed.json()["principals"].as_array().unwrap().clone();
    let names: Vec<&str> = principals.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec![OPS, VIEWER, WORKER]);
    assert_eq!(
        principals[2]["rules"],
        json!([{"queues": QUEUE, "operations": ["enqueue", "claim"]}])
    );

    let checked = http_as(&broker, Some(&ops_token), "GET", "/v1/acl?principal=worker&queue=jobs");
    assert_eq!(checked.json()["operations"], json!(["enqueue", "claim"]), "{checked:?}");
    let other = http_as(&broker, Some(&ops_token), "GET", "/v1/acl?principal=worker&queue=jobs2");
    assert_eq!(other.json()["operations"], json!([]), "exact means exact: {other:?}");
    let viewer_token = format!("{VIEWER}:{VIEWER_SECRET}");
    assert_eq!(http_as(&broker, Some(&viewer_token), "GET", "/v1/acl").status, 403);
    assert_eq!(http_as(&broker, None, "GET", "/v1/acl").status, 401);

    let admin = broker.admin_addr();
    let output = spool_as(&broker, Some((OPS, OPS_SECRET)), &["acl", "list", "--admin", &admin]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(text.contains("worker") && text.contains("enqueue,claim"), "{text}");
    assert!(!text.contains("argon2"), "{text}");
    let output = spool_as(
        &broker,
        Some((OPS, OPS_SECRET)),
        &["acl", "check", "--of", WORKER, "--queue", QUEUE, "--admin", &admin],
    );
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(text.contains("enqueue, claim"), "{text}");
}

/// Runs `spool --json metrics QUEUE` against `broker`.
fn spool_metrics(broker: &Spoold, interval_ms: &str) -> Value {
    let admin = broker.admin_addr();
    let output = spool_as(
        broker,
        None,
        &["--json", "metrics", QUEUE, "--interval-ms", interval_ms, "--admin", &admin],
    );
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

// Goal: `spool metrics QUEUE` shows the queue's figures as /metrics has
// them (ready, claimed, dead-lettered, oldest ready age, per partition and
// in total) and rates between its two scrapes; the live-message gauges
// move as messages are acked.
// Method: a 2-partition queue with known contents; the table and JSON
// forms read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_metrics_prints_a_queues_key_figures() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, test_queue_config(2, 30_000, 3)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for index in 0..6 {
        producer
            .send(QUEUE, Message::new(format!("m{index}")).key(format!("k{index}")))
            .await
            .unwrap();
    }
    let claimed = client.claim_any(QUEUE, &ClaimOptions::new(2).wait_ms(0)).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let figures = spool_metrics(&broker, "0");
    assert_eq!(figures["total"]["ready"], 4.0, "{figures}");
    assert_eq!(figures["total"]["claimed"], 2.0, "{figures}");
    assert_eq!(figures["total"]["dead_lettered"], 0.0, "{figures}");
    assert_eq!(figures["partitions"].as_array().unwrap().len(), 2, "{figures}");
    assert!(figures["total"]["oldest_ready_age_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(figures["total"]["ack_per_second"], Value::Null, "one scrape has no rates");
    let exposition = scrape(&broker);
    assert_eq!(exposition.sum("spool_live_messages"), 6.0, "ready 4 + claimed 2");
    assert!(
        exposition.sum("spool_live_bytes") >= 6.0 * 2.0,
        "two payload bytes a message at least"
    );
    assert_eq!(exposition.sum("spool_dead_letter_claimed_messages"), 0.0);
    assert_eq!(exposition.sum("spool_dead_letter_acked_messages_total"), 0.0);

    // Two scrapes give rates (the arithmetic of rates and drain time is
    // unit-tested in the CLI): nothing was acked between them, so the ack
    // rate is 0 and the backlog never drains at it.
    let figures = spool_metrics(&broker, "200");
    assert_eq!(figures["total"]["ack_per_second"], 0.0, "{figures}");
    assert_eq!(figures["total"]["enqueue_per_second"], 0.0, "{figures}");
    assert_eq!(figures["total"]["drain_seconds"], Value::Null, "{figures}");
    for delivery in &claimed {
        client.ack(QUEUE, delivery.partition(), &[delivery.token()]).await.unwrap();
    }
    let figures = spool_metrics(&broker, "0");
    assert_eq!(figures["total"]["claimed"], 0.0, "{figures}");
    assert_eq!(figures["total"]["ready"], 4.0, "{figures}");
    assert_eq!(scrape(&broker).sum("spool_live_messages"), 4.0, "the acked ones left");

    let admin = broker.admin_addr();
    let table =
        spool_as(&broker, None, &["metrics", QUEUE, "--interval-ms", "0", "--admin", &admin]);
    let text = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(text.contains("ready") && text.contains("all"), "{text}");
    let missing =
        spool_as(&broker, None, &["metrics", "nope", "--interval-ms", "0", "--admin", &admin]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
}

/// Every `spool_*` name in the dashboard's queries.
fn dashboard_metric_names() -> BTreeSet<String> {
    let text = include_str!("../../docs/grafana/spool.json");
    let dashboard: Value = serde_json::from_str(text).unwrap();
    let mut expressions = Vec::new();
    collect_expressions(&dashboard, &mut expressions);
    assert!(expressions.len() >= 10, "the dashboard has queries: {expressions:?}");
    let mut names = BTreeSet::new();
    for expression in expressions {
        let mut rest = expression.as_str();
        while let Some(start) = rest.find("spool_") {
            let before = rest[..start].chars().last();
            let tail = &rest[start..];
            let end =
                tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                names.insert(tail[..end].to_owned());
            }
            rest = &tail[end..];
        }
    }
    names
}

fn collect_expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query", Value::String(text)) => out.push(text.clone()),
                    _ => collect_expressions(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_expressions(item, out)),
        _ => {}
    }
}

// Goal: the Grafana dashboard cannot drift from the broker: every metric
// name its queries use is exported by a running spoold (with a queue that
// has seen traffic, so per-partition series exist).
// Method: docs/grafana/spool.json's `expr`s against one real scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_uses_only_exported_metric_names() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, test_queue_config(1, 30_000, 3)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send(QUEUE, Message::new("m")).await.unwrap();
    let claimed = client.claim_any(QUEUE, &ClaimOptions::new(1).wait_ms(0)).await.unwrap();
    for delivery in &claimed {
        client.ack(QUEUE, delivery.partition(), &[delivery.token()]).await.unwrap();
    }
    let exposition = scrape(&broker);
    let exported: BTreeSet<String> = exposition
        .samples
        .iter()
        .map(|sample| sample.name.clone())
        .chain(exposition.types.keys().cloned())
        .collect();
    let used = dashboard_metric_names();
    let missing: Vec<&String> = used.iter().filter(|name| !exported.contains(*name)).collect();
    assert!(missing.is_empty(), "the dashboard uses names /metrics does not export: {missing:?}");
    for name in
        ["spool_ready_messages", "spool_oldest_ready_age_seconds", "spool_auth_reloads_total"]
    {
        assert!(used.contains(name), "the dashboard shows {name}");
    }
}
