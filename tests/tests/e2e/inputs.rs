//! What a user gets wrong gets a clear answer, and a refused change leaves
//! nothing behind: a queue whose partition cannot open is not created (and
//! not half-created), reserved names, schedules past the horizon, oversized
//! payloads, unknown `SPOOL_*` variables; errors print plain values; logs
//! written to a file carry no colour codes.

use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};
use spool_client::spool_wire::limits::{PAYLOAD_INLINE_BYTES_MAX, SCHEDULE_HORIZON_MS};
use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::Admin;
use spool_tests::{
    json_lines_stdout, json_stdout, success_stdout, test_queue_config, Spoold, SpooldOptions,
};

use crate::common::{message_id, unix_ms};

/// `spoold`'s exit code for a configuration error (`FatalReason::Config`).
const EXIT_CONFIG: i32 = 2;

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

// Goal: CreateQueue never answers success for a queue whose partition did
// not open; the queue is removed again on every shard and in the catalog,
// so a retry succeeds once the cause is gone. Method: a 2-shard broker; a
// regular file where partition 1 of the first queue (id 1) goes, so shard
// 1 cannot create that directory while shard 0 opens partition 0; `spool
// queue create` must exit non-zero naming the partition and the OS error;
// `queue list` is empty and partition 0's directory is gone; after a
// restart (catalog re-read) the queue is still absent; remove the file,
// create again (the name is free), send and receive through it.
#[test]
fn create_queue_with_an_unopenable_partition_fails_and_rolls_back() {
    let mut broker = Spoold::start(2);
    let queue_dir = broker.data_dir().join("partitions").join("q0000000001");
    std::fs::create_dir_all(&queue_dir).unwrap();
    let obstacle = queue_dir.join("p00001");
    std::fs::write(&obstacle, b"in the way").unwrap();

    let refused = broker.cli(&["queue", "create", "jobs", "--partitions", "2"]);
    let message = stderr(&refused);
    assert!(!refused.status.success(), "create must fail: {message}");
    assert!(message.contains("STORAGE_FAILED"), "{message}");
    assert!(message.contains("jobs/1"), "names the partition: {message}");
    // The OS error is named (which one depends on the step that met the
    // file: creating the directory, or listing it).
    assert!(
        message.contains("Not a directory") || message.contains("File exists"),
        "names the OS error: {message}"
    );
    assert!(message.contains("p00001"), "names the path: {message}");
    assert!(message.contains("removed again"), "{message}");
    assert!(String::from_utf8_lossy(&refused.stdout).trim().is_empty(), "no success line");

    assert_eq!(json_stdout(&broker.cli(&["--json", "queue", "list"])), serde_json::json!([]));
    assert!(!queue_dir.join("p00000").exists(), "partition 0 was removed on shard 0");
    assert!(obstacle.is_file(), "the obstacle is not ours to remove");

    broker.terminate();
    broker.restart();
    assert_eq!(json_stdout(&broker.cli(&["--json", "queue", "list"])), serde_json::json!([]));

    std::fs::remove_file(&obstacle).unwrap();
    let created = success_stdout(&broker.cli(&["queue", "create", "jobs", "--partitions", "2"]));
    assert!(created.contains("created queue jobs (2 partitions)"), "{created}");
    let listed = json_stdout(&broker.cli(&["--json", "queue", "list"]));
    assert_eq!(listed, serde_json::json!([{"queue": "jobs", "partitions": 2}]));
    success_stdout(&broker.cli(&["send", "jobs", "after-the-fix"]));
    let received = json_lines_stdout(&broker.cli(&["--json", "recv", "jobs", "--wait-ms", "2000"]));
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0]["payload"], "after-the-fix", "{received:?}");
}

// Goal: a queue name ending in `.dlq` cannot be created (it addresses the
// dead-letter lane of the queue without the suffix). Method: create `jobs`,
// then `jobs.dlq` through the CLI: non-zero exit, INVALID_ARGUMENT, the
// rule in the message, and only `jobs` listed.
#[test]
fn dead_letter_suffix_is_reserved() {
    let broker = Spoold::start(1);
    success_stdout(&broker.cli(&["queue", "create", "jobs"]));
    let refused = broker.cli(&["queue", "create", "jobs.dlq"]);
    let message = stderr(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("INVALID_ARGUMENT"), "{message}");
    assert!(message.contains("jobs.dlq is reserved"), "{message}");
    assert!(message.contains("dead-letter lane"), "{message}");
    let listed = json_stdout(&broker.cli(&["--json", "queue", "list"]));
    assert_eq!(listed, serde_json::json!([{"queue": "jobs", "partitions": 1}]));
}

fn record(sequence: u64, not_before_ms: u64, expiry_ms: u64) -> Vec<u8> {
    let mut builder = DataBatchBuilder::new();
    builder
        .push(&Record {
            message_id: message_id(7, sequence),
            routing_key: Vec::new(),
            headers: Vec::new(),
            payload: Payload::Inline(b"x".to_vec()),
            priority: 0,
            not_before_ms,
            expiry_ms,
            enqueue_time_ms: unix_ms(),
        })
        .unwrap();
    builder.finish().unwrap().as_slice().to_vec()
}

// Goal: a not_before or expiry past the schedule horizon (365 days), or an
// expiry not after the not_before, is refused by the broker with
// INVALID_ARGUMENT and a message naming the field and the horizon, and
// nothing is stored; the CLI refuses `--delay-ms` past the horizon before
// sending. Method: raw enqueues of single records just inside and past
// the horizon; `spool send --delay-ms` past it; count what was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_beyond_the_horizon_are_refused() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue("later", test_queue_config(1, 5_000, 3)).await.unwrap();
    let p0 = PartitionId(0);
    let now = unix_ms();
    // A minute inside the horizon, for clock movement between here and the
    // broker's check.
    let inside = now + SCHEDULE_HORIZON_MS - 60_000;
    let beyond = now + SCHEDULE_HORIZON_MS + 60_000;

    client.enqueue("later", p0, &record(1, inside, 0)).await.unwrap();
    client.enqueue("later", p0, &record(2, 0, inside)).await.unwrap();
    for (sequence, not_before, expiry, field) in [
        (3, beyond, 0, "not_before_ms"),
        (4, 0, beyond, "expiry_ms"),
        (5, 0, u64::MAX, "expiry_ms"),
    ] {
        let error =
            client.enqueue("later", p0, &record(sequence, not_before, expiry)).await.unwrap_err();
        let text = error.to_string();
        assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{text}");
        assert!(text.contains(field) && text.contains("horizon is 365 days"), "{text}");
    }
    let error =
        client.enqueue("later", p0, &record(6, now + 10_000, now + 5_000)).await.unwrap_err();
    let text = error.to_string();
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{text}");
    assert!(text.contains("would expire before it could be delivered"), "{text}");

    let delay = (SCHEDULE_HORIZON_MS + 1).to_string();
    let refused = broker.cli(&["send", "later", "x", "--delay-ms", &delay]);
    let message = stderr(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("--delay-ms") && message.contains("31536000000"), "{message}");

    let described = json_stdout(&broker.cli(&["--json", "queue", "describe", "later"]));
    let partition = &described["partitions"][0];
    assert_eq!(partition["scheduled"], 1, "only the in-horizon delay: {described}");
    assert_eq!(partition["ready"], 1, "the in-horizon expiry: {described}");
}

// Goal: the payload-size refusal states the limit and the size given.
// Method: `spool send --file` with a payload one byte over the inline
// limit: non-zero exit, both numbers in the message.
#[test]
fn oversized_payload_error_states_the_limit() {
    let broker = Spoold::start(1);
    success_stdout(&broker.cli(&["queue", "create", "big"]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payload");
    std::fs::write(&path, vec![b'x'; PAYLOAD_INLINE_BYTES_MAX + 1]).unwrap();
    let refused = broker.cli(&["send", "big", "--file", path.to_str().unwrap()]);
    let message = stderr(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains(&(PAYLOAD_INLINE_BYTES_MAX + 1).to_string()), "size: {message}");
    assert!(message.contains(&format!("limit of {PAYLOAD_INLINE_BYTES_MAX} bytes")), "{message}");
}

// Goal: errors print plain values, never Rust debug formatting of a
// newtype (the redrive of an unknown offset printed `Offset(99)`). Method:
// redrive offset 99 of an empty queue through the CLI; the message names
// "offset 99" and holds no `Offset(`.
#[test]
fn errors_print_plain_values() {
    let broker = Spoold::start(1);
    success_stdout(&broker.cli(&["queue", "create", "plain"]));
    let refused = broker.cli(&["dlq", "redrive", "plain", "--partition", "0", "--offset", "99"]);
    let message = stderr(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("offset 99 "), "{message}");
    assert!(!message.contains("Offset("), "{message}");
}

// Goal: an unknown SPOOL_* variable stops spoold with the config exit code
// and a log line naming the closest setting; a known non-setting
// (SPOOL_FAILPOINTS) does not. Method: start with SPOOL_DATADIR set, then
// with SPOOL_FAILPOINTS set.
#[test]
fn unknown_spool_env_var_is_a_config_error() {
    let mut options = SpooldOptions::new(1);
    options.set_env("SPOOL_DATADIR", "/tmp/spool-typo");
    let failed = Spoold::try_start_with(options).expect_err("must not start");
    assert_eq!(failed.status.and_then(|status| status.code()), Some(EXIT_CONFIG), "{failed}");
    assert!(failed.log.contains("unknown environment variable SPOOL_DATADIR"), "{failed}");
    assert!(failed.log.contains("did you mean SPOOL_DATA_DIR?"), "{failed}");

    let mut options = SpooldOptions::new(1);
    options.set_env("SPOOL_FAILPOINTS", "");
    drop(Spoold::start_with(options));
}

// Goal: log lines written to a file (not a terminal) carry no ANSI escape
// codes even when NO_COLOR is empty (the broker decides from the terminal,
// not only from NO_COLOR). Method: start with NO_COLOR="" (the harness
// sets it to 1 otherwise), make the broker log, search the log for ESC.
#[test]
fn log_written_to_a_file_has_no_colour() {
    let mut options = SpooldOptions::new(1);
    options.set_env("NO_COLOR", "");
    let broker = Spoold::start_with(options);
    success_stdout(&broker.cli(&["queue", "create", "colourless"]));
    let log = broker.log();
    assert!(log.contains("spoold started"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in a file log: {log:?}");
}
