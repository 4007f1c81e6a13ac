//! Authentication, authorization and audit against a real `spoold` with an
//! auth file: the handshake (a request before it, a wrong secret and an
//! unknown principal are refused and the connection closed), every cell of
//! a two-principal ACL matrix on the binary protocol and on the HTTP API,
//! the denials metric, the audit log of purges (allowed and refused) read
//! with `spool audit`, the CLI's credentials, and secrets never in the
//! broker's log.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use spool_client::spool_wire::proto::{
    decode_frame, AuthenticateRequest, CorrelationId, ListQueuesRequest, MetadataRequest, Offset,
    PartitionId, RedriveTarget, Reply, Request, Response,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClaimOptions, Client, ClientError, Message, Producer, ProducerConfig};
use spool_tests::admin::{http_get, http_raw, HttpAnswer};
use spool_tests::auth::{
    client_as, spool_as, write_auth_file, Principal, OPS, OPS_SECRET, WORKER, WORKER_SECRET,
    WRONG_SECRET,
};
use spool_tests::{spool_bin, test_queue_config, Spoold, SpooldOptions};

const QUEUE: &str = "jobs";
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// The ACL operations, in the order of the matrix below.
const OPERATIONS: [&str; 7] = ["enqueue", "claim", "peek", "describe", "admin", "purge", "redrive"];

/// Whether `principal` may do `operation` on [`QUEUE`] under [`auth_file`].
fn expected(principal: &str, operation: &str) -> bool {
    match principal {
        WORKER => matches!(operation, "enqueue" | "claim" | "describe"),
        OPS => matches!(operation, "peek" | "describe" | "admin" | "purge" | "redrive"),
        _ => false,
    }
}

/// The auth file: the worker may enqueue, claim and describe `jobs` (and
/// only `jobs`); ops may peek, describe, administer, purge and redrive
/// every queue, and neither enqueue nor claim.
fn auth_file(dir: &Path) -> PathBuf {
    let path = dir.join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(WORKER, WORKER_SECRET, &[QUEUE], &["enqueue", "claim", "describe"]),
            Principal::new(
                OPS,
                OPS_SECRET,
                &["*"],
                &["peek", "describe", "admin", "purge", "redrive"],
            ),
        ],
    );
    path
}

/// A 1-shard broker with authentication on, and the directory holding its
/// auth file.
fn start_with_auth() -> (Spoold, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = auth_file(dir.path());
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    (Spoold::start_with(options), dir)
}

fn frame(request: &Request<'_>, correlation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(CorrelationId(correlation), &mut out).unwrap();
    out
}

/// Every answer on `stream` until the broker closes it: (correlation id,
/// error code).
fn answers_until_closed(mut stream: TcpStream) -> Vec<(u64, ErrorCode)> {
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut bytes = Vec::new();
    // Ends at EOF: a broker that kept the connection open fails the read
    // timeout instead.
    stream.read_to_end(&mut bytes).expect("the broker closes the connection");
    let mut answers = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let length = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        let mut aligned = spool_client::spool_wire::batch::BatchBytes::with_capacity(length);
        aligned.extend_from_slice(&rest[..length]);
        let decoded = decode_frame(&aligned).unwrap();
        let reply = Response::decode(&decoded).unwrap();
        let code = match reply.reply {
            Reply::Ok(_) => ErrorCode::None,
            Reply::Err(error) => error.code,
        };
        answers.push((reply.correlation_id.0, code));
        rest = &rest[length..];
    }
    answers
}

// Goal: with authentication on, a request before the handshake is answered
// UNAUTHENTICATED and the connection closed (the request pipelined behind
// it is not served); a wrong secret and an unknown principal are refused
// the same way, and requests pipelined behind a refused handshake are
// refused too; the right secret works; the broker logs the refusals
// without any secret, and says at start that authentication is on.
// Method: raw frames over TCP (so the test sees the close itself), then the
// client library; the broker's log read at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_wrong_secrets_are_refused_and_closed() {
    let (broker, _dir) = start_with_auth();

    let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
    let mut pipelined = frame(&Request::ListQueues(ListQueuesRequest {}), 1);
    pipelined.extend(frame(&Request::Metadata(MetadataRequest { queues: Vec::new() }), 2));
    stream.write_all(&pipelined).unwrap();
    assert_eq!(answers_until_closed(stream), vec![(1, ErrorCode::Unauthenticated)]);

    for (principal, secret) in [(WORKER, WRONG_SECRET), ("nobody", WORKER_SECRET)] {
        let mut stream = TcpStream::connect(broker.shard_addr(0)).unwrap();
        let handshake = Request::Authenticate(AuthenticateRequest { principal, secret });
        let mut pipelined = frame(&handshake, 1);
        pipelined.extend(frame(&Request::ListQueues(ListQueuesRequest {}), 2));
        stream.write_all(&pipelined).unwrap();
        let mut answers = answers_until_closed(stream);
        answers.sort_unstable();
        assert_eq!(
            answers,
            vec![(1, ErrorCode::Unauthenticated), (2, ErrorCode::Unauthenticated)],
            "{principal}"
        );
        let refused = client_as(&broker, principal, secret).await.unwrap_err();
        assert_eq!(refused.code(), Some(ErrorCode::Unauthenticated), "{refused:?}");
    }

    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    let listed = Admin::new(worker).list_queues().await.unwrap();
    assert!(listed.is_empty());

    let log = broker.log();
    assert!(log.contains("authentication ON"), "{log}");
    assert!(log.contains("authentication failed for principal"), "{log}");
    for secret in [WORKER_SECRET, OPS_SECRET, WRONG_SECRET] {
        assert!(!log.contains(secret), "a secret is in the broker's log:\n{log}");
    }
}

// Goal: the single-node default has authentication off and says so loudly
// at start; a client that sends credentials anyway is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_is_off_by_default_and_says_so() {
    let broker = Spoold::start(1);
    assert!(broker.log().contains("AUTHENTICATION IS OFF"), "{}", broker.log());
    let client = client_as(&broker, "anyone", "anything").await.unwrap();
    Admin::new(client).list_queues().await.unwrap();
}

/// Runs `operation` on [`QUEUE`] as `client` (partition 0) and says
/// whether the broker let it through: `PERMISSION_DENIED` is a refusal;
/// anything else must be a success (or `QUEUE_EXISTS` for the create that
/// stands for `admin`).
async fn try_operation(client: &Client, operation: &str) -> bool {
    let admin = Admin::new(client.clone());
    let partition = PartitionId(0);
    let outcome: Result<(), ClientError> = match operation {
        "enqueue" => {
            let producer = Producer::new(
                client.clone(),
                ProducerConfig { retries: 0, ..ProducerConfig::default() },
            )
            .unwrap();
            producer.send(QUEUE, Message::new("m")).await.map(drop)
        }
        "claim" => client.claim_any(QUEUE, &ClaimOptions::new(1).wait_ms(0)).await.map(drop),
        "peek" => admin.peek(QUEUE, partition, Offset(0), 10).await.map(drop),
        "describe" => admin.describe_queue(QUEUE).await.map(drop),
        "admin" => admin.create_queue(QUEUE, test_queue_config(1, 1_000, 3)).await.map(drop),
        "purge" => admin.purge(QUEUE, partition, true).await.map(drop),
        "redrive" => admin.redrive(QUEUE, partition, RedriveTarget::All).await.map(drop),
        other => panic!("no operation {other}"),
    };
    match outcome {
        Ok(()) => true,
        Err(error) if error.code() == Some(ErrorCode::QueueExists) => true,
        Err(error) if error.code() == Some(ErrorCode::PermissionDenied) => false,
        Err(error) => panic!("{operation}: unexpected {error:?}"),
    }
}

fn scrape_denials(broker: &Spoold) -> Vec<f64> {
    let page = http_get(&broker.admin_addr(), "/metrics");
    let exposition = spool_tests::admin::Exposition::parse(&page.body).unwrap();
    OPERATIONS
        .iter()
        .map(|operation| {
            exposition.value("spool_auth_denials_total", &[("operation", *operation)]).unwrap()
        })
        .collect()
}

// Goal: every cell of the matrix (2 principals × 7 operations) is allowed
// or denied on the binary protocol exactly as the auth file says, each
// denial is PERMISSION_DENIED on a connection that stays usable, and
// `spool_auth_denials_total{operation}` counts each one. Method: ops
// creates the queue; each principal tries each operation through the
// client library; the metric is scraped before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_matrix_on_the_binary_protocol() {
    let (broker, _dir) = start_with_auth();
    let ops = client_as(&broker, OPS, OPS_SECRET).await.unwrap();
    Admin::new(ops.clone()).create_queue(QUEUE, test_queue_config(1, 1_000, 3)).await.unwrap();
    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    let before = scrape_denials(&broker);
    let mut denied = [0f64; OPERATIONS.len()];
    for (principal, client) in [(WORKER, &worker), (OPS, &ops)] {
        for (index, operation) in OPERATIONS.iter().enumerate() {
            let allowed = try_operation(client, operation).await;
            assert_eq!(allowed, expected(principal, operation), "{principal} {operation}");
            if !allowed {
                denied[index] += 1.0;
            }
        }
    }
    let after = scrape_denials(&broker);
    for (index, operation) in OPERATIONS.iter().enumerate() {
        assert_eq!(after[index] - before[index], denied[index], "denials of {operation}");
    }
    // Rights on `jobs` only: the worker may not even describe another queue,
    // and the listing shows it only what it has a right on.
    Admin::new(ops.clone()).create_queue("other", test_queue_config(1, 1_000, 3)).await.unwrap();
    let refused = Admin::new(worker.clone()).describe_queue("other").await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied));
    let listed: Vec<String> =
        Admin::new(worker).list_queues().await.unwrap().into_iter().map(|q| q.name).collect();
    assert_eq!(listed, vec![QUEUE.to_owned()]);
}

/// `method path` with a JSON body and an optional bearer token.
fn http_as(
    broker: &Spoold,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &Value,
) -> HttpAnswer {
    let addr = broker.admin_addr();
    let body = body.to_string();
    let authorization =
        token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_raw(&addr, head.as_bytes())
}

/// The HTTP request that stands for `operation` on [`QUEUE`].
fn http_operation(operation: &str) -> (&'static str, String, Value) {
    let queue = format!("/v1/queues/{QUEUE}");
    match operation {
        "enqueue" => ("POST", format!("{queue}/messages"), json!({ "payload": "m" })),
        "claim" => ("POST", format!("{queue}/claims"), json!({ "credits": 1, "wait_ms": 0 })),
        "peek" => ("GET", format!("{queue}/dead-letters"), json!({})),
        "describe" => ("GET", queue, json!({})),
        "admin" => ("POST", "/v1/queues".to_owned(), json!({ "name": QUEUE, "partitions": 1 })),
        "purge" => ("POST", format!("{queue}/purge"), json!({})),
        "redrive" => ("POST", format!("{queue}/redrive"), json!({})),
        other => panic!("no operation {other}"),
    }
}

// Goal: the HTTP API applies the same matrix through the caller's bearer
// token (the gateway acts with the caller's rights, not its own): each
// cell allowed (2xx, or 409 QUEUE_EXISTS for the create) or 403
// PERMISSION_DENIED as configured; no token, a malformed one and a wrong
// secret are 401 UNAUTHENTICATED with a Bearer challenge. Method: raw HTTP
// requests with and without `Authorization`.
#[test]
fn acl_matrix_on_the_http_api() {
    let (broker, _dir) = start_with_auth();
    let ops_token = format!("{OPS}:{OPS_SECRET}");
    let worker_token = format!("{WORKER}:{WORKER_SECRET}");
    let created = http_as(
        &broker,
        Some(&ops_token),
        "POST",
        "/v1/queues",
        &json!({ "name": QUEUE, "partitions": 1 }),
    );
    assert_eq!(created.status, 201, "{created:?}");

    for token in [None, Some("no-colon"), Some(&*format!("{WORKER}:{WRONG_SECRET}"))] {
        let answer = http_as(&broker, token, "GET", "/v1/queues", &json!({}));
        assert_eq!(answer.status, 401, "{token:?}: {answer:?}");
        assert_eq!(answer.json()["error"]["name"], "UNAUTHENTICATED", "{answer:?}");
        assert_eq!(answer.header("www-authenticate"), Some("Bearer realm=\"spool\""));
    }

    for (principal, token) in [(WORKER, &worker_token), (OPS, &ops_token)] {
        for operation in OPERATIONS {
            let (method, path, body) = http_operation(operation);
            let answer = http_as(&broker, Some(token), method, &path, &body);
            if expected(principal, operation) {
                let allowed = (200..300).contains(&answer.status)
                    || (operation == "admin" && answer.status == 409);
                assert!(allowed, "{principal} {operation}: {answer:?}");
            } else {
                assert_eq!(answer.status, 403, "{principal} {operation}: {answer:?}");
                assert_eq!(answer.json()["error"]["name"], "PERMISSION_DENIED", "{answer:?}");
            }
        }
    }
    // Metrics and health need no token.
    assert_eq!(http_get(&broker.admin_addr(), "/health/live").status, 200);
    let log = broker.log();
    for secret in [WORKER_SECRET, OPS_SECRET, WRONG_SECRET] {
        assert!(!log.contains(secret), "a secret is in the broker's log:\n{log}");
    }
}

// Goal: a worker allowed to claim is denied purge; a purge with the right
// privilege drops the messages; both land in the audit log (principal,
// operation, queue, partition, count, outcome) and `spool audit` shows
// them; the CLI authenticates with --principal and SPOOL_SECRET and is
// refused without them. Method: messages sent by the worker, a purge by
// each principal through the CLI, then `spool audit --data-dir`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_needs_its_privilege_and_is_audited() {
    let (broker, _dir) = start_with_auth();
    let ops = client_as(&broker, OPS, OPS_SECRET).await.unwrap();
    Admin::new(ops).create_queue(QUEUE, test_queue_config(1, 1_000, 3)).await.unwrap();
    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    let producer = Producer::new(worker.clone(), ProducerConfig::default()).unwrap();
    for index in 0..5 {
        producer.send(QUEUE, Message::new(format!("m{index}"))).await.unwrap();
    }
    // The worker may claim...
    let claimed = worker.claim_any(QUEUE, &ClaimOptions::new(1).wait_ms(0)).await.unwrap();
    assert_eq!(claimed.len(), 1);

    let anonymous = spool_as(&broker, None, &["queue", "list"]);
    assert!(!anonymous.status.success());
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("UNAUTHENTICATED"));

    // ...but not purge.
    let refused = spool_as(&broker, Some((WORKER, WORKER_SECRET)), &["purge", QUEUE, "--yes"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("PERMISSION_DENIED"), "{refused:?}");

    let purged = spool_as(&broker, Some((OPS, OPS_SECRET)), &["--json", "purge", QUEUE, "--yes"]);
    assert!(purged.status.success(), "{purged:?}");
    let described = Admin::new(worker).describe_queue(QUEUE).await.unwrap();
    assert_eq!(described.partitions[0].ready, 0, "the four unclaimed messages are gone");

    let audit = Command::new(spool_bin())
        .args(["--json", "audit", "--data-dir"])
        .arg(broker.data_dir())
        .output()
        .unwrap();
    assert!(audit.status.success(), "{audit:?}");
    let entries: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let entries = entries.as_array().unwrap();
    let purges: Vec<&Value> = entries.iter().filter(|e| e["operation"] == "purge").collect();
    assert_eq!(purges.len(), 2, "{entries:?}");
    assert_eq!(purges[0]["principal"], WORKER);
    assert_eq!(purges[0]["outcome"], "PERMISSION_DENIED");
    assert_eq!(purges[0]["count"], 0);
    assert_eq!(purges[1]["principal"], OPS);
    assert_eq!(purges[1]["outcome"], "ok");
    assert_eq!(purges[1]["queue"], QUEUE);
    assert_eq!(purges[1]["partition"], 0);
    assert_eq!(purges[1]["count"], 4);
    assert!(purges[1]["time_ms"].as_u64().is_some_and(|time| time > 0));

    let table = Command::new(spool_bin())
        .args(["audit", "--data-dir"])
        .arg(broker.data_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("PERMISSION_DENIED") && text.contains("ops"), "{text}");

    // Redrive and queue deletion are audited too; the worker's refused
    // delete as well.
    let redriven = spool_as(&broker, Some((OPS, OPS_SECRET)), &["dlq", "redrive", QUEUE]);
    assert!(redriven.status.success(), "{redriven:?}");
    let refused =
        spool_as(&broker, Some((WORKER, WORKER_SECRET)), &["queue", "delete", QUEUE, "--yes"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("PERMISSION_DENIED"), "{refused:?}");
    let deleted = spool_as(&broker, Some((OPS, OPS_SECRET)), &["queue", "delete", QUEUE, "--yes"]);
    assert!(deleted.status.success(), "{deleted:?}");
    let audit = Command::new(spool_bin())
        .args(["--json", "audit", "--queue", QUEUE, "--data-dir"])
        .arg(broker.data_dir())
        .output()
        .unwrap();
    let entries: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let tail: Vec<(String, String, String)> = entries.as_array().unwrap()[2..]
        .iter()
        .map(|entry| {
            let field = |name: &str| entry[name].as_str().unwrap_or_default().to_owned();
            (field("principal"), field("operation"), field("outcome"))
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        (OPS, "redrive", "ok"),
        (WORKER, "delete_queue", "PERMISSION_DENIED"),
        (OPS, "delete_queue", "ok"),
    ]
    .iter()
    .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(tail, expected);
    assert_eq!(entries[4]["count"], 1, "partitions of the deleted queue");
}

// Goal: `spool auth hash-secret` prints an argon2id PHC string a broker
// accepts for that secret. Method: hash on stdin, write the auth file with
// it, start a broker, authenticate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_secret_makes_a_hash_the_broker_accepts() {
    let mut child = Command::new(spool_bin())
        .args(["auth", "hash-secret"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"cli-made secret\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let hash = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, format!("[[principals]]\nname = \"cli\"\nsecret_hash = \"{hash}\"\n"))
        .unwrap();
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);
    client_as(&broker, "cli", "cli-made secret").await.unwrap();
    let wrong = client_as(&broker, "cli", "cli-made secreT").await.unwrap_err();
    assert_eq!(wrong.code(), Some(ErrorCode::Unauthenticated));
}

// Goal: an ACL rule naming a subscription (`queue/sub`) grants claim in
// that subscription only: the worker claims and acks in `report`, and is
// refused PERMISSION_DENIED a claim in the default subscription, in
// another subscription and an ack of a default delivery's token; a rule
// naming a subscription that grants more than claim keeps the broker from
// starting. Method: a 1-shard broker with an auth file in which ops may do
// everything everywhere and the worker has only `jobs/report` claim; the
// subscriptions are made over the wire by ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_naming_a_subscription_grants_claim_in_it_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(WORKER, WORKER_SECRET, &["jobs/report"], &["claim"]),
            Principal::new(OPS, OPS_SECRET, &["*"], &OPERATIONS),
        ],
    );
    let mut options = SpooldOptions::new(1);
    options.args.push(format!("--auth-file={}", path.display()));
    let broker = Spoold::start_with(options);
    let ops = client_as(&broker, OPS, OPS_SECRET).await.unwrap();
    let admin = Admin::new(ops.clone());
    admin.create_queue(QUEUE, test_queue_config(1, 30_000, 5)).await.unwrap();
    for name in ["report", "billing"] {
        admin
            .create_subscription(QUEUE, name, spool_client::SubscriptionStart::Earliest)
            .await
            .unwrap();
    }
    // Started in the partition's log (every subscription listed with it).
    let deadline = spool_tests::now() + Duration::from_secs(10);
    while admin.describe_queue(QUEUE).await.unwrap().subscriptions.iter().any(|s| s.partitions < 1)
    {
        assert!(spool_tests::now() < deadline, "subscriptions not started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let producer = Producer::new(ops.clone(), ProducerConfig::default()).unwrap();
    for n in 0..3 {
        producer.send(QUEUE, Message::new(format!("m{n}"))).await.unwrap();
    }

    let worker = client_as(&broker, WORKER, WORKER_SECRET).await.unwrap();
    let in_report = ClaimOptions::new(3).subscription("report");
    let batch = worker.claim(QUEUE, PartitionId(0), &in_report).await.unwrap();
    assert_eq!(batch.deliveries.len(), 3, "the worker claims in report");
    let tokens: Vec<_> = batch.deliveries.iter().map(|d| d.token()).collect();
    worker.ack(QUEUE, PartitionId(0), &tokens).await.expect("and acks there");

    let denied = |result: Result<_, ClientError>| match result {
        Err(error) => assert_eq!(error.code(), Some(ErrorCode::PermissionDenied), "{error}"),
        Ok(_) => panic!("allowed"),
    };
    denied(worker.claim(QUEUE, PartitionId(0), &ClaimOptions::new(1)).await.map(|_| ()));
    let in_billing = ClaimOptions::new(1).subscription("billing");
    denied(worker.claim(QUEUE, PartitionId(0), &in_billing).await.map(|_| ()));
    let default = ops.claim(QUEUE, PartitionId(0), &ClaimOptions::new(1)).await.unwrap();
    let token = default.deliveries[0].token();
    match worker.ack(QUEUE, PartitionId(0), &[token]).await {
        Err(ClientError::AckRefused { refused, .. }) => {
            assert_eq!(refused[0].code, ErrorCode::PermissionDenied, "{refused:?}");
        }
        Err(error) => assert_eq!(error.code(), Some(ErrorCode::PermissionDenied), "{error}"),
        Ok(()) => panic!("the worker acked a default delivery"),
    }
    drop(broker);

    // A rule naming a subscription may grant only claim.
    write_auth_file(
        &path,
        &[
            Principal::new(WORKER, WORKER_SECRET, &["jobs/report"], &["claim", "peek"]),
            Principal::new(OPS, OPS_SECRET, &["*"], &OPERATIONS),
        ],
    );
    let output = Command::new(spool_tests::spoold_bin())
        .args(["--data-dir", &dir.path().join("refused").display().to_string()])
        .arg(format!("--auth-file={}", path.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("may grant only claim"), "{stderr}");
}
