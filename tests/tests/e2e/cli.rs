//! The `spool` CLI against a live broker: every command, tables and `--json`,
//! exit codes on refusal.

use serde_json::Value;
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

    let created =
        cli(&["--json", "queue", "create", "mail", "--partitions", "2", "--max-deliveries", "1"]);
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
