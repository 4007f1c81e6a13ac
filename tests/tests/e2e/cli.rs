//! The `spool` CLI against a live broker: every command, tables and `--json`,
//! exit codes on refusal; streamed `send`/`recv` output against what the
//! broker stored; the total `recv --wait-ms`; control characters escaped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use spool_client::PayloadView;
use spool_tests::events::wait_for_claims_waiting_blocking;
use spool_tests::{json_lines_stdout, json_stdout, success_stdout, Spoold};

fn sum(rows: &Value, field: &str) -> u64 {
    rows.as_array()
        .unwrap_or_else(|| panic!("not an array: {rows}"))
        .iter()
        .map(|row| row[field].as_u64().unwrap_or_else(|| panic!("no {field} in {row}")))
        .sum()
}

// Goal: every CLI command works end to end and its --json output parses
// with the right content. Method: one queue through create, list, send
// (argument and stdin), describe, stats, peek, recv (ack and --no-ack into
// the DLQ), dlq list/redrive, purge, delete; then refusals and exit codes.
#[test]
fn cli_commands_against_a_live_broker() {
    let broker = Spoold::start(2);
    let cli = |args: &[&str]| json_stdout(&broker.cli(args));

    let created = cli(&[
        "--json",
        "queue",
        "create",
        "mail",
        "--partitions",
        "2",
        "--max-deliveries",
        "1",
        "--dedupe-window-ms",
        "60000",
    ]);
    assert_eq!(
        (created["queue"].as_str(), created["partitions"].as_u64()),
        (Some("mail"), Some(2))
    );
    let table = success_stdout(&broker.cli(&["queue", "list"]));
    assert!(table.starts_with("queue") && table.contains("mail"), "{table}");
    let listed = cli(&["--json", "queue", "list"]);
    assert_eq!(listed, serde_json::json!([{"queue": "mail", "partitions": 2}]));

    // send and recv print JSON Lines: one object per acknowledged message.
    let sent =
        json_lines_stdout(&broker.cli(&["--json", "send", "mail", "hello", "--key", "alice"]));
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["queue"], "mail");
    assert!(sent[0]["partition"].as_u64().is_some_and(|partition| partition < 2), "{sent:?}");
    assert!(sent[0]["offset"].is_u64(), "{sent:?}");
    let from_stdin = json_lines_stdout(
        &broker.cli_with_stdin(&["--json", "send", "mail"], Some("one\ntwo\nthree\n")),
    );
    let lines: Vec<u64> = from_stdin.iter().map(|row| row["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, vec![1, 2, 3], "one object per stdin line, in order: {from_stdin:?}");

    let described = cli(&["--json", "queue", "describe", "mail"]);
    assert_eq!(described["config"]["partitions"], 2);
    assert_eq!(described["config"]["max_deliveries"], 1);
    assert_eq!(described["config"]["dedupe_window_ms"], 60000);
    let partitions = &described["partitions"];
    assert_eq!(partitions.as_array().map(Vec::len), Some(2), "both shards: {described}");
    assert_eq!(sum(partitions, "ready"), 4, "{described}");
    let stats = cli(&["--json", "stats"]);
    assert_eq!(stats[0]["queue"], "mail");
    assert_eq!(stats[0]["ready"], 4, "stats counts every partition: {stats}");
    let stats_table = success_stdout(&broker.cli(&["stats", "mail"]));
    assert!(stats_table.lines().nth(1).is_some_and(|row| row.starts_with("mail")), "{stats_table}");

    let peeked = cli(&["--json", "peek", "mail"]);
    let mut payloads: Vec<&str> =
        peeked.as_array().unwrap().iter().map(|row| row["payload"].as_str().unwrap()).collect();
    payloads.sort_unstable();
    assert_eq!(payloads, vec!["hello", "one", "three", "two"]);
    assert!(peeked.as_array().unwrap().iter().all(|row| row["state"] == "ready"));

    let received =
        json_lines_stdout(&broker.cli(&["--json", "recv", "mail", "-n", "2", "--wait-ms", "500"]));
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|row| row["result"] == "acked" && row["attempt"] == 1));

    // --no-ack releases; with max_deliveries 1 that is a dead letter.
    let released =
        json_lines_stdout(&broker.cli(&["--json", "recv", "mail", "-n", "1", "--no-ack"]));
    assert_eq!(released.len(), 1);
    assert_eq!(released[0]["result"], "released");
    let letters = cli(&["--json", "dlq", "list", "mail"]);
    assert_eq!(letters.as_array().map(Vec::len), Some(1), "{letters}");
    assert_eq!(letters[0]["offset"], released[0]["offset"]);
    assert_eq!(letters[0]["partition"], released[0]["partition"]);
    assert_eq!(letters[0]["attempts"], 1);
    let stats = cli(&["--json", "stats", "mail"]);
    assert_eq!((stats[0]["ready"].as_u64(), stats[0]["quarantined"].as_u64()), (Some(1), Some(1)));
    let redriven = cli(&["--json", "dlq", "redrive", "mail"]);
    assert_eq!(redriven["redriven"], 1);
    assert_eq!(cli(&["--json", "dlq", "list", "mail"]), serde_json::json!([]));

    // Purge asks first; without a terminal and without --yes it refuses.
    let refused = broker.cli(&["purge", "mail"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert_eq!(cli(&["--json", "stats", "mail"])[0]["ready"], 2, "nothing purged");
    let purged = cli(&["--json", "purge", "mail", "--yes"]);
    assert_eq!((purged["purged"].as_u64(), purged["dry_run_count"].as_u64()), (Some(2), Some(2)));
    let empty = json_lines_stdout(&broker.cli(&["--json", "recv", "mail", "--wait-ms", "200"]));
    assert!(empty.is_empty(), "nothing to receive prints no line: {empty:?}");
    let stats = cli(&["--json", "stats", "mail"]);
    assert_eq!((stats[0]["ready"].as_u64(), stats[0]["acked"].as_u64()), (Some(0), Some(2)));

    let deleted = cli(&["--json", "queue", "delete", "mail", "--yes"]);
    assert_eq!(deleted["deleted"], "mail");
    assert_eq!(cli(&["--json", "queue", "list"]), serde_json::json!([]));

    // Refusals: exit code 1 and the error code's name on stderr.
    let missing = broker.cli(&["queue", "describe", "mail"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("QUEUE_NOT_FOUND"), "{stderr}");
    let send_missing = broker.cli(&["send", "mail", "x"]);
    assert_eq!(send_missing.status.code(), Some(1), "{send_missing:?}");
    // No broker at all: exit code 3.
    let port = spool_tests::reserve_ports(1);
    let output = std::process::Command::new(spool_tests::spool_bin())
        .args(["--addr", &format!("127.0.0.1:{port}"), "queue", "list"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
}

/// What one `spool --json send` printed before and after its broker was
/// stopped, and how it ended.
struct StreamedSend {
    rows: Vec<Value>,
    status: std::process::ExitStatus,
    stderr: String,
}

/// Pipes `lines` stdin lines (`line-1`, `line-2`, ...) into `spool --json
/// send QUEUE`, reads its JSON Lines as they come, and calls `stop` once
/// `stop_after` rows were printed; then reads the rest until the CLI exits.
fn send_and_stop(
    broker: &mut Spoold,
    queue: &str,
    lines: usize,
    stop_after: usize,
    stop: impl FnOnce(&mut Spoold),
) -> StreamedSend {
    use std::io::{BufRead, Read, Write};
    use std::process::{Command, Stdio};
    let mut child = Command::new(spool_tests::spool_bin())
        .args(["--addr", &broker.addr(), "--json", "send", queue])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let mut text = String::new();
        for line in 1..=lines {
            text.push_str(&format!("line-{line}\n"));
            // Write in chunks; the CLI stops reading once the broker is gone.
            if text.len() >= 64 * 1024
                && stdin.write_all(std::mem::take(&mut text).as_bytes()).is_err()
            {
                return;
            }
        }
        let _ = stdin.write_all(text.as_bytes());
    });
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });
    let mut rows = Vec::new();
    let mut stop = Some(stop);
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        rows.push(
            serde_json::from_str::<Value>(&line).unwrap_or_else(|error| panic!("{error}: {line}")),
        );
        if rows.len() == stop_after {
            if let Some(stop) = stop.take() {
                stop(broker);
            }
        }
    }
    let status = child.wait().unwrap();
    writer.join().unwrap();
    assert!(stop.is_none(), "the CLI printed only {} rows before it ended", rows.len());
    StreamedSend { rows, status, stderr: stderr_reader.join().unwrap() }
}

/// Messages named by (partition, offset).
type Placements = BTreeSet<(u64, u64)>;

/// Checks the rows a stopped `spool send` printed against what the
/// restarted broker stored; returns (printed, stored) as (partition, offset)
/// sets.
fn printed_and_stored(
    broker: &Spoold,
    queue: &str,
    streamed: &StreamedSend,
) -> (Placements, Placements) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stored: BTreeMap<(u64, u64), String> = runtime.block_on(async {
        let client = broker.client().await;
        crate::common::drain(&client, queue, 0, 2)
            .await
            .iter()
            .map(|delivery| {
                let PayloadView::Inline(body) = delivery.payload() else { panic!("inline") };
                (
                    (u64::from(delivery.partition().0), delivery.offset().0),
                    String::from_utf8_lossy(body).into_owned(),
                )
            })
            .collect()
    });
    let mut printed = BTreeSet::new();
    let mut lines = BTreeSet::new();
    for row in &streamed.rows {
        let key = (row["partition"].as_u64().unwrap(), row["offset"].as_u64().unwrap());
        let line = row["line"].as_u64().unwrap();
        assert!(lines.insert(line), "line {line} printed twice");
        assert!(printed.insert(key), "{key:?} printed twice");
        assert_eq!(
            stored.get(&key).map(String::as_str),
            Some(format!("line-{line}").as_str()),
            "printed {row} but the broker stored {:?} there",
            stored.get(&key)
        );
    }
    (printed, stored.keys().copied().collect())
}

// Goal: `spool send` prints each offset as it is acknowledged, so after a
// SIGTERM mid-stream its output is exactly what the broker stored. Method:
// pipe 300k lines into `spool --json send`, SIGTERM the broker (it drains:
// in-flight requests get their replies) after 20k printed rows, restart it
// and drain the queue: every printed (partition, offset) holds the printed
// line, and the stored set equals the printed set; the CLI fails.
#[test]
fn streamed_send_matches_the_store_after_sigterm() {
    let mut broker = Spoold::start(2);
    success_stdout(&broker.cli(&["queue", "create", "lines", "--partitions", "2"]));
    let streamed = send_and_stop(&mut broker, "lines", 300_000, 20_000, |broker| {
        let status = broker.terminate();
        assert!(status.success(), "SIGTERM exit {status}");
    });
    assert!(!streamed.status.success(), "the send cannot have finished: {}", streamed.stderr);
    assert!(streamed.rows.len() >= 20_000);
    broker.restart();
    let (printed, stored) = printed_and_stored(&broker, "lines", &streamed);
    assert_eq!(
        printed.len(),
        stored.len(),
        "printed {} rows, stored {}",
        printed.len(),
        stored.len()
    );
    assert_eq!(printed, stored, "a clean stop leaves an exact record");
}

// Goal: after a SIGKILL mid-stream, nothing `spool send` printed is missing
// or wrong (messages in flight at the kill may be stored unprinted).
// Method: as above with SIGKILL: printed ⊆ stored, each with its line.
#[test]
fn streamed_send_never_prints_what_was_not_stored_sigkill() {
    let mut broker = Spoold::start(2);
    success_stdout(&broker.cli(&["queue", "create", "lines", "--partitions", "2"]));
    let streamed = send_and_stop(&mut broker, "lines", 300_000, 20_000, Spoold::kill);
    assert!(!streamed.status.success(), "the send cannot have finished: {}", streamed.stderr);
    broker.restart();
    let (printed, stored) = printed_and_stored(&broker, "lines", &streamed);
    assert!(printed.is_subset(&stored), "printed offsets the broker does not have");
    assert!(printed.len() >= 20_000);
}

// Goal: `recv` prints each delivery (JSON Lines) only once its ack was
// answered, and the rows stream: the first ones are readable before the
// CLI exits. Method: 5 messages, `recv -n 5`: 5 rows, each `acked`, the
// broker's acked count is 5 and nothing is left claimed.
#[test]
fn recv_prints_acked_deliveries() {
    let broker = Spoold::start(2);
    success_stdout(&broker.cli(&["queue", "create", "few", "--partitions", "2"]));
    let body = "a\nb\nc\nd\ne\n";
    success_stdout(&broker.cli_with_stdin(&["send", "few"], Some(body)));
    let rows = json_lines_stdout(&broker.cli(&["--json", "recv", "few", "-n", "5"]));
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(rows.iter().all(|row| row["result"] == "acked"), "{rows:?}");
    let stats = json_stdout(&broker.cli(&["--json", "stats", "few"]));
    assert_eq!((stats[0]["acked"].as_u64(), stats[0]["claimed"].as_u64()), (Some(5), Some(0)));
}

// Goal: `recv --wait-ms N` waits N ms in total over all partitions, and a
// message sent to any partition during the wait is received promptly.
// Method: on a 4-partition empty queue, `recv --wait-ms 1000` returns in
// ≥ 0.9 s and < 2.5 s (waiting per partition took 4 s); then `recv
// --wait-ms 10000` gets a message sent to partition 3 once its long-polls
// are parked (one per shard: the claims-waiting gauge) and exits well
// before its deadline.
#[test]
fn recv_wait_is_a_total_over_all_partitions() {
    let broker = Spoold::start(2);
    success_stdout(&broker.cli(&["queue", "create", "quiet", "--partitions", "4"]));
    let started = spool_tests::now();
    let empty = json_lines_stdout(&broker.cli(&["--json", "recv", "quiet", "--wait-ms", "1000"]));
    let took = started.elapsed();
    assert!(empty.is_empty());
    assert!(took >= Duration::from_millis(900), "returned early: {took:?}");
    assert!(took < Duration::from_millis(2_500), "waited per partition: {took:?}");

    let key = crate::common::key_for(3, 4, 7);
    let started = spool_tests::now();
    let recv = std::process::Command::new(spool_tests::spool_bin())
        .args(["--addr", &broker.addr(), "--json", "recv", "quiet", "--wait-ms", "10000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_claims_waiting_blocking(&broker, u64::from(broker.cores()));
    success_stdout(&broker.cli(&["send", "quiet", "--key", &key, "late"]));
    let output = recv.wait_with_output().unwrap();
    let took = started.elapsed();
    let rows = json_lines_stdout(&output);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0]["partition"].as_u64(), rows[0]["payload"].as_str()),
        (Some(3), Some("late"))
    );
    assert!(took < Duration::from_secs(3), "received after {took:?} of a 10 s wait");
}

// Goal: table output cannot drive the terminal: control characters in
// payloads and keys print as visible escapes; JSON keeps the exact text.
// Method: send a payload holding an OSC title sequence and a clear-screen
// sequence, with a key holding CR and backspace; `peek` and `recv` tables
// carry no control byte but the visible escapes; `peek --json` returns the
// exact payload.
#[test]
fn tables_escape_control_characters() {
    let broker = Spoold::start(1);
    success_stdout(&broker.cli(&["queue", "create", "tty"]));
    let payload = "\x1b]0;title\x07 and \x1b[2J";
    success_stdout(&broker.cli(&["send", "tty", "--key", "k\r\x08", payload]));
    let no_controls = |text: &str| {
        assert!(
            text.chars().all(|character| character == '\n' || !character.is_control()),
            "a control character reached the terminal: {text:?}"
        );
    };
    let visible = r"\x1b]0;title\x07 and \x1b[2J";
    let peeked = success_stdout(&broker.cli(&["peek", "tty"]));
    no_controls(&peeked);
    assert!(peeked.contains(visible) && peeked.contains(r"k\r\x08"), "{peeked}");
    let json = json_stdout(&broker.cli(&["--json", "peek", "tty"]));
    assert_eq!(json[0]["payload"], payload, "JSON keeps the exact payload");
    assert_eq!(json[0]["key"], "k\r\x08");
    let received = success_stdout(&broker.cli(&["recv", "tty"]));
    no_controls(&received);
    assert!(received.contains(visible), "{received}");
}

// Goal: a stream-style queue is made with a retention window from the CLI
// and over HTTP, and every outer layer shows it: `spool queue describe`
// (table and --json) and GET /v1/queues/{q} the window and the records
// kept for replay (acked ones too), the subscription rows `lost` 0 and no
// loss reports, the metrics the retained families and a lost series for
// the default subscription. Windows outside their bounds are refused with
// a message naming the field: 10 ms by the CLI (exit 1, nothing created)
// and over HTTP (400 INVALID_ARGUMENT), and a size window above the
// queue's max_bytes by the broker's own check (400 INVALID_ARGUMENT naming
// max_bytes). Method: one 2-shard broker; 60 s windows, so none passes
// while the test runs.
#[test]
fn retention_window_is_created_described_and_checked() {
    use serde_json::json;
    use spool_tests::admin::{http, http_json};

    let broker = Spoold::start(2);
    let cli = |args: &[&str]| json_stdout(&broker.cli(args));
    let admin = broker.admin_addr();

    let created = cli(&[
        "--json",
        "queue",
        "create",
        "events",
        "--partitions",
        "2",
        "--retention-ms",
        "60000",
    ]);
    assert_eq!(
        (created["retention_ms"].as_u64(), created["retention_bytes"].as_u64()),
        (Some(60_000), Some(0))
    );
    let sized =
        success_stdout(&broker.cli(&["queue", "create", "sized", "--retention-bytes", "1048576"]));
    assert!(sized.contains("retention window 1048576 bytes"), "{sized}");

    // Three records, received and acked: the window keeps them for replay.
    success_stdout(&broker.cli_with_stdin(&["send", "events"], Some("a\nb\nc\n")));
    let received = json_lines_stdout(&broker.cli(&[
        "--json",
        "recv",
        "events",
        "-n",
        "3",
        "--wait-ms",
        "2000",
    ]));
    assert_eq!(received.len(), 3, "{received:?}");

    let described = cli(&["--json", "queue", "describe", "events"]);
    assert_eq!(described["config"]["retention_ms"], 60_000, "{described}");
    assert_eq!(described["config"]["retention_bytes"], 0, "{described}");
    let partitions = &described["partitions"];
    assert_eq!(sum(partitions, "ready"), 0, "{described}");
    assert_eq!(sum(partitions, "retained_messages"), 3, "acked and still retained: {described}");
    let table = success_stdout(&broker.cli(&["queue", "describe", "events"]));
    assert!(table.contains("retention window 60000 ms"), "{table}");
    assert!(table.contains("retained 3 messages"), "{table}");
    assert!(table.lines().next().is_some_and(|header| header.contains("retained")), "{table}");
    let plain = success_stdout(&broker.cli(&["queue", "describe", "sized"]));
    assert!(plain.contains("retention window 1048576 bytes"), "{plain}");

    let over_http = http(&admin, "GET", "/v1/queues/events");
    assert_eq!(over_http.status, 200, "{over_http:?}");
    let over_http = over_http.json();
    assert_eq!(over_http["config"]["retention_ms"], 60_000, "{over_http}");
    assert_eq!(over_http["retained_messages"], 3, "{over_http}");
    assert!(over_http["oldest_retained_age_ms"].is_u64(), "{over_http}");
    let rows = http(&admin, "GET", "/v1/queues/events/subscriptions").json();
    let default = &rows["subscriptions"][0];
    assert_eq!((default["name"].as_str(), default["lost"].as_u64()), (Some("default"), Some(0)));
    assert_eq!(default["losses"], json!([]), "{rows}");
    let listed = success_stdout(&broker.cli(&["sub", "list", "events", "--admin", &admin]));
    assert!(listed.lines().next().is_some_and(|header| header.ends_with("lost")), "{listed}");

    let web = json!({"name": "web-stream", "retention_ms": 5000, "retention_bytes": 2_097_152});
    let made = http_json(&admin, "POST", "/v1/queues", &web);
    assert_eq!(made.status, 201, "{made:?}");
    let made = made.json();
    assert_eq!(
        (made["config"]["retention_ms"].as_u64(), made["config"]["retention_bytes"].as_u64()),
        (Some(5000), Some(2_097_152))
    );
    let shown = http(&admin, "GET", "/v1/queues/web-stream").json();
    assert_eq!(shown["config"]["retention_bytes"], 2_097_152, "{shown}");

    let scraped = spool_tests::admin::http_get(&admin, "/metrics");
    let metrics = spool_tests::admin::Exposition::parse(&scraped.body).unwrap();
    let retained: f64 = ["0", "1"]
        .into_iter()
        .map(|partition| {
            let labels = [("queue", "events"), ("partition", partition)];
            metrics.value("spool_queue_retained_messages", &labels).unwrap_or(0.0)
        })
        .sum();
    assert_eq!(retained, 3.0, "{}", scraped.body);
    let lost = metrics.value(
        "spool_subscription_lost_messages_total",
        &[("queue", "events"), ("partition", "0"), ("subscription", "default")],
    );
    assert_eq!(lost, Some(0.0), "a window's default subscription has its lost series");
    assert!(metrics
        .value("spool_queue_retained_messages", &[("queue", "web-stream"), ("partition", "0")])
        .is_some());

    // Refusals, each naming the field.
    let refused = broker.cli(&["queue", "create", "bad", "--retention-ms", "10"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("retention_ms = 10 outside 1000..=2592000000"), "{stderr}");
    let queues = cli(&["--json", "queue", "list"]);
    assert!(!queues.to_string().contains("\"bad\""), "nothing created: {queues}");
    let short =
        http_json(&admin, "POST", "/v1/queues", &json!({"name": "bad", "retention_ms": 10}));
    assert_eq!(short.status, 400, "{short:?}");
    let error = &short.json()["error"];
    assert_eq!(error["name"], "INVALID_ARGUMENT", "{short:?}");
    assert!(
        error["message"].as_str().is_some_and(|text| text.contains("retention_ms")),
        "{short:?}"
    );
    let too_big = json!({"name": "bad", "max_bytes": 2_097_152, "retention_bytes": 4_194_304});
    let too_big = http_json(&admin, "POST", "/v1/queues", &too_big);
    assert_eq!(too_big.status, 400, "{too_big:?}");
    let error = &too_big.json()["error"];
    assert_eq!(error["name"], "INVALID_ARGUMENT", "{too_big:?}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("retention window") && message.contains("max_bytes"), "{message}");
    assert_eq!(http(&admin, "GET", "/v1/queues/bad").status, 404);
}
