//! An ordered queue seen from outside against a real `spoold`: created
//! over the admin port's HTTP API, its lanes in `GET /v1/queues/{q}` and
//! in the `spool_queue_ordered_*` metrics, and one key's lane in `spool
//! peek --key`, each following the lane as its head is acked.

use serde_json::{json, Value};
use spool_tests::admin::{http, http_get, http_json, Exposition, HttpAnswer};
use spool_tests::{json_stdout, success_stdout, Spoold};

use crate::common::key_for;

fn ok(answer: &HttpAnswer) -> Value {
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()
}

/// Sends `payload` with `key` (none when empty) over HTTP; its partition
/// and offset.
fn send(broker: &Spoold, payload: &str, key: &str) -> (u64, u64) {
    let mut body = json!({ "payload": payload });
    if !key.is_empty() {
        body["key"] = key.into();
    }
    let sent = ok(&http_json(&broker.admin_addr(), "POST", "/v1/queues/orders/messages", &body));
    (sent["partition"].as_u64().unwrap(), sent["offset"].as_u64().unwrap())
}

/// Claims over HTTP until `want` messages came, then checks that no more
/// comes within 300 ms.
fn claim_exactly(broker: &Spoold, want: usize) -> Vec<Value> {
    let mut claimed = Vec::new();
    for _ in 0..20 {
        if claimed.len() >= want {
            break;
        }
        let body = json!({ "credits": 10, "lease_ms": 60_000, "wait_ms": 1_000 });
        let answer = http_json(&broker.admin_addr(), "POST", "/v1/queues/orders/claims", &body);
        claimed.extend(ok(&answer)["messages"].as_array().cloned().unwrap_or_default());
    }
    assert_eq!(claimed.len(), want, "{claimed:?}");
    let body = json!({ "credits": 10, "lease_ms": 60_000, "wait_ms": 300 });
    let more = ok(&http_json(&broker.admin_addr(), "POST", "/v1/queues/orders/claims", &body));
    assert_eq!(more["messages"], json!([]), "nothing else is claimable");
    claimed
}

fn ack(broker: &Spoold, message: &Value) {
    let body = json!({ "tokens": [message["token"].clone()] });
    let acked = ok(&http_json(&broker.admin_addr(), "POST", "/v1/acks", &body));
    assert_eq!(acked["acked"], 1, "{acked}");
}

/// The `spool_queue_ordered_*` gauge `name` of `queue`, summed over its
/// two partitions (`None`: no series).
fn gauge(metrics: &Exposition, name: &str, queue: &str) -> Option<f64> {
    let values: Vec<f64> = ["0", "1"]
        .into_iter()
        .filter_map(|partition| metrics.value(name, &[("queue", queue), ("partition", partition)]))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn scrape(broker: &Spoold) -> (Exposition, String) {
    let scraped = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(scraped.status, 200, "{scraped:?}");
    (Exposition::parse(&scraped.body).unwrap(), scraped.body)
}

/// `(state, payload)` of each message `spool --json peek orders --key
/// KEY` shows, and its JSON.
fn peek_key(broker: &Spoold, key: &str, extra: &[&str]) -> (Vec<(String, String)>, Value) {
    let mut args = vec!["--json", "peek", "orders", "--key", key];
    args.extend(extra);
    let peeked = json_stdout(&broker.cli(&args));
    let rows = peeked["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages: {peeked}"))
        .iter()
        .map(|row| {
            assert_eq!(row["key"], key, "{peeked}");
            (row["state"].as_str().unwrap().to_owned(), row["payload"].as_str().unwrap().to_owned())
        })
        .collect();
    (rows, peeked)
}

// Goal: the operator's three views of an ordered queue say the same thing
// and follow the lane: created over HTTP with `ordered: true` (the config
// says so; a queue created without it says false), one key with a claimed
// head and two messages behind it is one active and one blocked key with
// two waiting in GET /v1/queues/{q} (per partition and over the queue, the
// blocked key named), in the four spool_queue_ordered_* gauges (the
// oldest blocked age above 0; an unordered queue has no series), and in
// `spool peek --key` (the key's three messages in offset order: claimed,
// waiting, waiting; none of the other key's; how much it read; a --scan of
// 1 stops and says where to go on). After the head's ack each view shows
// the next message ready and one waiting. Method: one 2-shard broker; the
// lane's key and a second key on the same partition, a keyless message;
// 60 s leases so no claim lapses while the test looks.
#[test]
fn ordered_queue_over_http_metrics_and_peek_key() {
    let broker = Spoold::start(2);
    let admin = broker.admin_addr();
    let create = json!({ "name": "orders", "partitions": 2, "ordered": true, "lease_min_ms": 50 });
    let created = http_json(&admin, "POST", "/v1/queues", &create);
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.json()["config"]["ordered"], true, "{created:?}");
    let plain = http_json(&admin, "POST", "/v1/queues", &json!({ "name": "plain" }));
    assert_eq!(plain.status, 201, "{plain:?}");
    assert_eq!(plain.json()["config"]["ordered"], false, "{plain:?}");
    assert_eq!(ok(&http(&admin, "GET", "/v1/queues/plain"))["config"]["ordered"], false);

    // user-1's lane on partition 0: three messages; another key there
    // (its lane ends with its ack) and a keyless message.
    let lane_key = key_for(0, 2, 1);
    let other_key = key_for(0, 2, 2);
    let mut offsets = Vec::new();
    for payload in ["a1", "a2", "a3"] {
        let (partition, offset) = send(&broker, payload, &lane_key);
        assert_eq!(partition, 0);
        offsets.push(offset);
    }
    send(&broker, "b1", &other_key);
    send(&broker, "free", "");

    // The heads of both keys and the keyless message are claimable; a2
    // and a3 wait behind a1.
    let claimed = claim_exactly(&broker, 3);
    let payload_of = |message: &Value| message["payload"].as_str().unwrap().to_owned();
    let mut payloads: Vec<String> = claimed.iter().map(payload_of).collect();
    payloads.sort();
    assert_eq!(payloads, ["a1", "b1", "free"]);
    let head = claimed.iter().find(|message| message["payload"] == "a1").unwrap().clone();
    for message in claimed.iter().filter(|message| message["payload"] != "a1") {
        ack(&broker, message);
    }

    // GET /v1/queues/orders: one active key, blocked, two waiting.
    let described = ok(&http(&admin, "GET", "/v1/queues/orders"));
    assert_eq!(described["config"]["ordered"], true, "{described}");
    let partition = &described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|stats| stats["partition"] == 0)
        .unwrap_or_else(|| panic!("no partition 0: {described}"))["lanes"];
    assert_eq!(partition["active_keys"], 1, "{described}");
    assert_eq!(partition["blocked_keys"], 1, "{described}");
    assert_eq!(partition["waiting"], 2, "{described}");
    assert_eq!(partition["blocked_longest_key"], lane_key.as_str(), "{described}");
    let lanes = &described["lanes"];
    assert_eq!(
        (lanes["active_keys"].as_u64(), lanes["blocked_keys"].as_u64(), lanes["waiting"].as_u64()),
        (Some(1), Some(1), Some(2)),
        "{described}"
    );
    assert_eq!(lanes["blocked_longest_key"], lane_key.as_str(), "{described}");
    assert!(lanes["oldest_waiting_age_ms"].is_u64(), "{described}");

    // The metrics.
    let (metrics, body) = scrape(&broker);
    let orders = |name: &str| gauge(&metrics, name, "orders");
    assert_eq!(orders("spool_queue_ordered_active_keys"), Some(1.0), "{body}");
    assert_eq!(orders("spool_queue_ordered_blocked_keys"), Some(1.0), "{body}");
    assert_eq!(orders("spool_queue_ordered_waiting_messages"), Some(2.0), "{body}");
    let age = metrics
        .value(
            "spool_queue_ordered_oldest_blocked_age_seconds",
            &[("queue", "orders"), ("partition", "0")],
        )
        .unwrap_or_else(|| panic!("no age series: {body}"));
    assert!(age > 0.0 && age < 600.0, "{age}: {body}");
    assert_eq!(gauge(&metrics, "spool_queue_ordered_active_keys", "plain"), None, "{body}");

    // spool peek --key: the lane alone, in offset order, read to its end.
    let (rows, peeked) = peek_key(&broker, &lane_key, &[]);
    let expected = [("claimed", "a1"), ("waiting", "a2"), ("waiting", "a3")];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(state, payload)| ((*state).to_owned(), (*payload).to_owned()))
        .collect();
    assert_eq!(rows, expected, "{peeked}");
    let shown: Vec<u64> = peeked["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(shown, offsets, "{peeked}");
    let scans = &peeked["scans"];
    assert_eq!(scans.as_array().map(Vec::len), Some(1), "{peeked}");
    assert_eq!(
        (scans[0]["partition"].as_u64(), scans[0]["complete"].as_bool()),
        (Some(0), Some(true))
    );
    assert_eq!(scans[0]["scanned"], 3, "the other key's message was acked: {peeked}");
    let text = success_stdout(&broker.cli(&["peek", "orders", "--key", &lane_key]));
    assert!(text.contains(&format!("key {lane_key}: 3 messages")), "{text}");
    assert!(text.contains("partition 0: read 3 messages, to its end"), "{text}");
    assert!(!text.contains("b1") && !text.contains("free"), "{text}");
    // A scan of one message stops after the head and says where to go on.
    let (rows, peeked) = peek_key(&broker, &lane_key, &["--scan", "1"]);
    assert_eq!(rows, expected[..1], "{peeked}");
    assert_eq!(peeked["scans"][0]["complete"], false, "{peeked}");
    assert_eq!(peeked["scans"][0]["next_offset"], offsets[0] + 1, "{peeked}");
    let (rows, _) = peek_key(&broker, &other_key, &[]);
    assert!(rows.is_empty(), "the other key's lane ended with its ack: {rows:?}");

    // The head's ack hands the lane on: a2 ready, a3 waiting.
    ack(&broker, &head);
    let lanes = ok(&http(&admin, "GET", "/v1/queues/orders"))["lanes"].clone();
    assert_eq!(
        (lanes["active_keys"].as_u64(), lanes["blocked_keys"].as_u64(), lanes["waiting"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{lanes}"
    );
    let (metrics, body) = scrape(&broker);
    assert_eq!(
        gauge(&metrics, "spool_queue_ordered_waiting_messages", "orders"),
        Some(1.0),
        "{body}"
    );
    let (rows, peeked) = peek_key(&broker, &lane_key, &[]);
    let handed_on =
        [("ready".to_owned(), "a2".to_owned()), ("waiting".to_owned(), "a3".to_owned())];
    assert_eq!(rows, handed_on, "{peeked}");
    let next = claim_exactly(&broker, 1);
    assert_eq!(next[0]["payload"], "a2");
    ack(&broker, &next[0]);
    let last = claim_exactly(&broker, 1);
    assert_eq!(last[0]["payload"], "a3");
    ack(&broker, &last[0]);
    let (metrics, body) = scrape(&broker);
    for name in ["spool_queue_ordered_active_keys", "spool_queue_ordered_waiting_messages"] {
        assert_eq!(gauge(&metrics, name, "orders"), Some(0.0), "{name}: {body}");
    }
}
