//! The JSON HTTP API of the admin port against a real `spoold` over real
//! TCP: every route, its answers and its refusals (stable codes, HTTP
//! statuses), and the OpenAPI document against what is served.

use serde_json::{json, Value};
use spool_tests::admin::{http, http_json, http_raw, http_with_body, HttpAnswer};
use spool_tests::events::wait_for_claims_waiting_blocking;
use spool_tests::Spoold;

/// `method path` with a JSON body, from a test that may run on tokio.
fn call(broker: &Spoold, method: &str, path: &str, body: Value) -> HttpAnswer {
    http_json(&broker.admin_addr(), method, path, &body)
}

/// Asserts `answer` is the error `status` / `code` / `name` and returns
/// its `error` object.
fn refused(answer: &HttpAnswer, status: u16, code: u64, name: &str) -> Value {
    assert_eq!(answer.status, status, "{answer:?}");
    assert!(answer.content_type.starts_with("application/json"), "{answer:?}");
    let error = answer.json()["error"].clone();
    assert_eq!(error["code"], code, "{answer:?}");
    assert_eq!(error["name"], name, "{answer:?}");
    assert!(error["message"].as_str().is_some_and(|text| !text.is_empty()), "{answer:?}");
    error
}

fn ok(answer: &HttpAnswer) -> Value {
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()
}

/// Claims up to `credits` from `queue`, waiting up to `wait_ms`.
fn claim(broker: &Spoold, queue: &str, credits: u32, lease_ms: u32, wait_ms: u32) -> Vec<Value> {
    let body = json!({ "credits": credits, "lease_ms": lease_ms, "wait_ms": wait_ms });
    let answer = call(broker, "POST", &format!("/v1/queues/{queue}/claims"), body);
    ok(&answer)["messages"].as_array().cloned().unwrap_or_default()
}

fn token(message: &Value) -> String {
    message["token"].as_str().expect("token is a string").to_owned()
}

// Goal: the whole life of a queue over HTTP does what the binary protocol
// does: create (and a second create refused QUEUE_EXISTS), list, describe,
// send text, bytes and keyed messages, claim with tokens, ack, extend,
// release and get it again, a stale ack refused STALE_TOKEN, purge as a
// dry run (nothing dropped) then confirmed, a resize (and one that does
// not grow refused INVALID_ARGUMENT), delete, and the queue gone
// (404 QUEUE_NOT_FOUND). Method: one 2-shard broker, raw HTTP requests.
#[test]
fn http_api_queue_lifecycle() {
    let broker = Spoold::start(2);
    let create = json!({ "name": "web", "partitions": 2, "lease_min_ms": 50,
                         "backoff": { "kind": "linear", "base_ms": 50, "cap_ms": 50 } });
    let created = call(&broker, "POST", "/v1/queues", create.clone());
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.json()["config"]["partitions"], 2);
    refused(&call(&broker, "POST", "/v1/queues", create), 409, 7, "QUEUE_EXISTS");

    let listed = ok(&http(&broker.admin_addr(), "GET", "/v1/queues"));
    assert_eq!(listed["queues"], json!([{ "name": "web", "partitions": 2 }]));

    // Three messages: text, bytes (not UTF-8), keyed with a header.
    let sent = ok(&call(&broker, "POST", "/v1/queues/web/messages", json!({ "payload": "hello" })));
    assert_eq!(sent["offset"], 0);
    assert_eq!(sent["message_id"].as_str().map(str::len), Some(32));
    let bytes = json!({ "payload_base64": "/wD+", "priority": 1 });
    ok(&call(&broker, "POST", "/v1/queues/web/messages", bytes));
    let keyed = json!({ "payload": "keyed", "key": "user-7", "headers": { "trace": "t1" },
                        "id": "000102030405060708090a0b0c0d0e0f" });
    let keyed_sent = ok(&call(&broker, "POST", "/v1/queues/web/messages", keyed.clone()));
    // The same id again is the same message (the broker's dedupe).
    let again = ok(&call(&broker, "POST", "/v1/queues/web/messages", keyed));
    assert_eq!(again["offset"], keyed_sent["offset"]);
    assert_eq!(again["partition"], keyed_sent["partition"]);

    let described = ok(&http(&broker.admin_addr(), "GET", "/v1/queues/web"));
    let ready: u64 = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|partition| partition["ready"].as_u64().unwrap())
        .sum();
    assert_eq!(ready, 3, "{described}");

    let claimed = claim(&broker, "web", 10, 10_000, 1_000);
    assert_eq!(claimed.len(), 3, "{claimed:?}");
    let find = |field: &str, value: &str| {
        claimed.iter().find(|message| message[field] == value).cloned().unwrap_or_else(|| {
            panic!("no message with {field} = {value}: {claimed:?}");
        })
    };
    let text = find("payload", "hello");
    let binary = find("payload_base64", "/wD+");
    let with_key = find("key", "user-7");
    assert_eq!(binary["priority"], 1);
    assert_eq!(with_key["message_id"], "000102030405060708090a0b0c0d0e0f");
    assert_eq!(with_key["headers"], json!([{ "key": "trace", "value": "t1" }]));
    assert_eq!(text["attempt"], 1);

    // Ack one; a second ack of it is STALE_TOKEN (409) and says nothing acked.
    let acked = ok(&call(&broker, "POST", "/v1/acks", json!({ "tokens": [token(&text)] })));
    assert_eq!(acked["acked"], 1);
    let stale = call(&broker, "POST", "/v1/acks", json!({ "tokens": [token(&text)] }));
    let error = refused(&stale, 409, 12, "STALE_TOKEN");
    assert_eq!(error["acked"], 0);
    assert_eq!(error["refused"][0]["index"], 0);

    // Extend one; release the other and claim it again (attempt 2).
    let extended = ok(&call(
        &broker,
        "POST",
        "/v1/extends",
        json!({ "token": token(&with_key), "lease_ms": 20_000 }),
    ));
    assert!(
        extended["lease_deadline_ms"].as_u64().unwrap()
            > with_key["lease_deadline_ms"].as_u64().unwrap()
    );
    let released = call(
        &broker,
        "POST",
        "/v1/releases",
        json!({ "token": token(&binary), "delay_ms": 1, "reason": "later" }),
    );
    assert!(ok(&released)["not_before_ms"].as_u64().is_some());
    let again = claim(&broker, "web", 10, 10_000, 5_000);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["payload_base64"], "/wD+");
    assert_eq!(again[0]["attempt"], 2);
    // Its old token is stale now.
    let old = call(&broker, "POST", "/v1/extends", json!({ "token": token(&binary) }));
    refused(&old, 409, 12, "STALE_TOKEN");
    let both = json!({ "tokens": [token(&with_key), token(&again[0])] });
    assert_eq!(ok(&call(&broker, "POST", "/v1/acks", both))["acked"], 2);

    // Purge: two more messages; a dry run counts them and drops nothing.
    for payload in ["a", "b"] {
        ok(&call(&broker, "POST", "/v1/queues/web/messages", json!({ "payload": payload })));
    }
    let dry = ok(&call(&broker, "POST", "/v1/queues/web/purge", json!({})));
    assert_eq!((dry["dry_run"].clone(), dry["count"].clone()), (json!(true), json!(2)), "{dry}");
    let dry_again = ok(&call(&broker, "POST", "/v1/queues/web/purge", json!({ "confirm": false })));
    assert_eq!(dry_again["count"], 2);
    let purged = ok(&call(&broker, "POST", "/v1/queues/web/purge", json!({ "confirm": true })));
    assert_eq!((purged["dry_run"].clone(), purged["count"].clone()), (json!(false), json!(2)));
    assert!(claim(&broker, "web", 10, 10_000, 0).is_empty());

    // Resize: the empty queue grows 2 → 3, its key map reads back, a
    // count that does not grow it is INVALID_ARGUMENT.
    let resized = ok(&call(&broker, "POST", "/v1/queues/web/resize", json!({ "partitions": 3 })));
    assert_eq!(resized["key_version"], 2, "{resized}");
    let described = ok(&http(&broker.admin_addr(), "GET", "/v1/queues/web"));
    assert_eq!(described["partitions"].as_array().unwrap().len(), 3, "{described}");
    assert_eq!(described["keys"]["version"], 2, "{described}");
    let shrink = call(&broker, "POST", "/v1/queues/web/resize", json!({ "partitions": 2 }));
    refused(&shrink, 400, 5, "INVALID_ARGUMENT");

    let deleted = ok(&http(&broker.admin_addr(), "DELETE", "/v1/queues/web"));
    assert_eq!(deleted["deleted"], true);
    refused(&http(&broker.admin_addr(), "GET", "/v1/queues/web"), 404, 6, "QUEUE_NOT_FOUND");
    let listed = ok(&http(&broker.admin_addr(), "GET", "/v1/queues"));
    assert_eq!(listed["queues"], json!([]));
}

// Goal: a message released past max_deliveries is a dead letter, listed by
// the API, and redrive makes it claimable again. Method: max_deliveries 1,
// send, claim, release; list (all partitions, then one); redrive; claim.
#[test]
fn http_api_dead_letters_and_redrive() {
    let broker = Spoold::start(1);
    let create = json!({ "name": "dlq", "partitions": 2, "max_deliveries": 1, "lease_min_ms": 50 });
    assert_eq!(call(&broker, "POST", "/v1/queues", create).status, 201);
    ok(&call(
        &broker,
        "POST",
        "/v1/queues/dlq/messages",
        json!({ "payload": "poison", "key": "k" }),
    ));
    let claimed = claim(&broker, "dlq", 1, 10_000, 1_000);
    assert_eq!(claimed.len(), 1);
    let partition = claimed[0]["partition"].as_u64().unwrap();
    let release = json!({ "token": token(&claimed[0]), "reason": "cannot parse" });
    ok(&call(&broker, "POST", "/v1/releases", release));

    let listed = ok(&http(&broker.admin_addr(), "GET", "/v1/queues/dlq/dead-letters"));
    let letters = listed["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{listed}");
    assert_eq!(letters[0]["partition"], partition);
    assert_eq!(letters[0]["offset"], claimed[0]["offset"]);
    assert_eq!(letters[0]["key"], "k");
    let reason = letters[0]["last_reason"].as_str().unwrap();
    assert!(reason.contains("max deliveries"), "{reason}");
    let one = format!("/v1/queues/dlq/dead-letters?partition={partition}&max=5");
    assert_eq!(
        ok(&http(&broker.admin_addr(), "GET", &one))["dead_letters"],
        listed["dead_letters"]
    );
    let other = format!("/v1/queues/dlq/dead-letters?partition={}", 1 - partition);
    assert_eq!(ok(&http(&broker.admin_addr(), "GET", &other))["dead_letters"], json!([]));
    assert!(claim(&broker, "dlq", 1, 10_000, 0).is_empty(), "a dead letter is not claimable");

    let redriven = ok(&call(&broker, "POST", "/v1/queues/dlq/redrive", json!({})));
    assert_eq!(redriven["redriven"], 1, "{redriven}");
    let listed = ok(&http(&broker.admin_addr(), "GET", "/v1/queues/dlq/dead-letters"));
    assert_eq!(listed["dead_letters"], json!([]));
    let again = claim(&broker, "dlq", 1, 10_000, 2_000);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["payload"], "poison");
}

// Goal: refusals carry the binary protocol's stable codes and a sensible
// status: unknown queue 404 QUEUE_NOT_FOUND, a body over the limit 413
// FRAME_TOO_LARGE naming the limit, bad JSON 400 MALFORMED_FRAME with
// serde's message, an unknown field 400 INVALID_ARGUMENT, a junk token 400
// INVALID_TOKEN, credits over the limit 400, an unknown route 404
// UNKNOWN_API, a wrong method 405 with Allow. Method: one broker, raw
// requests.
#[test]
fn http_api_refusals_use_the_stable_codes() {
    let broker = Spoold::start(1);
    let addr = broker.admin_addr();
    assert_eq!(call(&broker, "POST", "/v1/queues", json!({ "name": "q" })).status, 201);

    let missing = call(&broker, "POST", "/v1/queues/nope/messages", json!({ "payload": "x" }));
    refused(&missing, 404, 6, "QUEUE_NOT_FOUND");
    refused(&http(&addr, "GET", "/v1/queues/nope"), 404, 6, "QUEUE_NOT_FOUND");
    refused(&call(&broker, "POST", "/v1/queues/nope/claims", json!({})), 404, 6, "QUEUE_NOT_FOUND");
    refused(&call(&broker, "POST", "/v1/queues/nope/purge", json!({})), 404, 6, "QUEUE_NOT_FOUND");
    refused(&http(&addr, "DELETE", "/v1/queues/nope"), 404, 6, "QUEUE_NOT_FOUND");
    let partition = call(&broker, "POST", "/v1/queues/q/purge", json!({ "partition": 5 }));
    refused(&partition, 404, 8, "PARTITION_NOT_FOUND");

    // A declared body over the limit is refused before it is read.
    let head = format!(
        "POST /v1/queues/q/messages HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        3 << 20
    );
    let error = refused(&http_raw(&addr, head.as_bytes()), 413, 4, "FRAME_TOO_LARGE");
    assert_eq!(error["limit_bytes"], 2 << 20);

    let bad = http_with_body(&addr, "POST", "/v1/queues/q/messages", b"{\"payload\": \"x\"");
    let error = refused(&bad, 400, 1, "MALFORMED_FRAME");
    assert!(error["message"].as_str().unwrap().contains("EOF"), "{error}");
    let unknown = call(&broker, "POST", "/v1/queues/q/messages", json!({ "body": "x" }));
    let error = refused(&unknown, 400, 5, "INVALID_ARGUMENT");
    assert!(error["message"].as_str().unwrap().contains("body"), "{error}");
    let both = json!({ "payload": "x", "payload_base64": "eA==" });
    refused(&call(&broker, "POST", "/v1/queues/q/messages", both), 400, 5, "INVALID_ARGUMENT");
    let junk = call(&broker, "POST", "/v1/acks", json!({ "tokens": ["not-a-token"] }));
    refused(&junk, 400, 13, "INVALID_TOKEN");
    let many = call(&broker, "POST", "/v1/queues/q/claims", json!({ "credits": 100_000 }));
    let error = refused(&many, 400, 5, "INVALID_ARGUMENT");
    assert_eq!(error["limit"], 256);
    let long_wait = call(&broker, "POST", "/v1/queues/q/claims", json!({ "wait_ms": 3_600_000 }));
    refused(&long_wait, 400, 5, "INVALID_ARGUMENT");
    // A lease outside the queue's range is the broker's own refusal.
    let lease = call(&broker, "POST", "/v1/queues/q/claims", json!({ "lease_ms": 1 }));
    refused(&lease, 400, 14, "LEASE_OUT_OF_RANGE");

    refused(&http(&addr, "GET", "/v1/nothing"), 404, 3, "UNKNOWN_API");
    let wrong = http(&addr, "PUT", "/v1/queues/q");
    refused(&wrong, 405, 3, "UNKNOWN_API");
    assert_eq!(wrong.header("allow"), Some("GET, DELETE"));
}

// Goal: every operation docs/openapi.json lists is served (routed, not
// UNKNOWN_API / 405), the document is OpenAPI 3, and each documented
// operation names its error schema. (The unit test in the broker checks
// the reverse: the router serves nothing the document does not list.)
// Method: call each documented method and path on a live broker with an
// empty body and a queue that does not exist.
#[test]
fn every_documented_route_is_served() {
    let document: Value = serde_json::from_str(include_str!("../../../docs/openapi.json"))
        .expect("docs/openapi.json parses");
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let broker = Spoold::start(1);
    let addr = broker.admin_addr();
    let mut operations = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            operations += 1;
            assert!(operation["responses"].is_object(), "{method} {path} has no responses");
            let concrete =
                path.replace("{queue}", "no-such-queue").replace("{name}", "no-such-sub");
            let answer = http(&addr, &method.to_uppercase(), &concrete);
            assert_ne!(answer.status, 405, "{method} {path}: {answer:?}");
            if answer.content_type.starts_with("application/json") && answer.status >= 400 {
                assert_ne!(answer.json()["error"]["code"], 3, "{method} {path}: {answer:?}");
            } else {
                assert_ne!(answer.status, 404, "{method} {path}: {answer:?}");
            }
        }
    }
    assert_eq!(operations, 27);
}

// Goal: the API bounds its requests in flight: with 32 long-poll claims
// waiting, one more request is answered at once 429 THROTTLED with
// Retry-After, and the port serves again once they end. Method: 32 threads
// claim an empty queue with wait_ms 3 s; a 33rd request once all 32 are
// parked on the shard (the claims-waiting gauge).
#[test]
fn requests_in_flight_are_bounded() {
    let broker = Spoold::start(1);
    let addr = broker.admin_addr();
    assert_eq!(call(&broker, "POST", "/v1/queues", json!({ "name": "idle" })).status, 201);
    let waiting: Vec<_> = (0..32)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = json!({ "wait_ms": 3_000 });
                http_json(&addr, "POST", "/v1/queues/idle/claims", &body).status
            })
        })
        .collect();
    wait_for_claims_waiting_blocking(&broker, 32);
    let started = spool_tests::now();
    let over = http(&addr, "GET", "/v1/queues");
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "answered at once");
    let error = refused(&over, 429, 19, "THROTTLED");
    assert_eq!(error["limit"], 32);
    assert_eq!(over.header("retry-after"), Some("1"));
    for thread in waiting {
        assert_eq!(thread.join().unwrap(), 200);
    }
    assert_eq!(http(&addr, "GET", "/v1/queues").status, 200);
}

// Goal: a send's schedule fields reach the broker: `delay_ms` and a future
// `not_before_ms` make a message scheduled (not claimable), a past one is
// ready at once, and giving both forms is refused. Method: send each,
// read the counts from GET /v1/queues/{q}, claim what is ready.
#[test]
fn http_api_send_schedules() {
    let broker = Spoold::start(1);
    assert_eq!(call(&broker, "POST", "/v1/queues", json!({ "name": "later" })).status, 201);
    let now_ms = crate::common::unix_ms();
    let send = |body: Value| call(&broker, "POST", "/v1/queues/later/messages", body);
    ok(&send(json!({ "payload": "in a minute", "delay_ms": 60_000 })));
    ok(&send(
        json!({ "payload": "in an hour", "not_before_ms": now_ms + 3_600_000, "ttl_ms": 7_200_000 }),
    ));
    ok(&send(json!({ "payload": "now", "not_before_ms": now_ms - 1_000 })));
    let both = json!({ "payload": "x", "delay_ms": 1, "not_before_ms": now_ms });
    refused(&send(both), 400, 5, "INVALID_ARGUMENT");
    let described = ok(&http(&broker.admin_addr(), "GET", "/v1/queues/later"));
    let partition = &described["partitions"][0];
    assert_eq!((partition["scheduled"].clone(), partition["ready"].clone()), (json!(2), json!(1)));
    let claimed = claim(&broker, "later", 10, 10_000, 0);
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["payload"], "now");
}
