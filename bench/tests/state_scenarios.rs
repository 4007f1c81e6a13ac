//! Runs the real `spool-bench state-memory` and `spool-bench recovery`
//! binaries at small sizes and checks their one JSON object: every field
//! present, values consistent with each other and with what was asked. No
//! timing thresholds: this proves the harness measures, not how fast.
// Tests may unwrap (ARCHITECTURE.md, "Errors"); clippy only exempts #[test] fns, not helpers.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

fn number(report: &Value, path: &[&str]) -> f64 {
    let mut value = report;
    for key in path {
        value = value.get(key).unwrap_or_else(|| panic!("missing field {path:?} in {report}"));
    }
    value.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number: {value}"))
}

/// Runs the binary and parses its single stdout line.
fn run_bench(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_spool-bench")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spool-bench {args:?} failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "exactly one JSON line: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn state_memory_reports_every_figure_with_sane_values() {
    // Goal: a 200 k-message run reports heap per message for every phase, each within a
    // physically plausible range (a fresh entry is 24 B of payload; a heap figure of 0
    // or of kilobytes means the counting or the phases are broken), and the echo fields.
    let report = run_bench(&["state-memory", "--messages", "200000", "--warm-messages", "20000"]);
    assert_eq!(report["scenario"], "state-memory");
    assert_eq!(number(&report, &["messages"]), 200_000.0);
    assert_eq!(number(&report, &["warm_messages"]), 20_000.0);
    assert_eq!(number(&report, &["rate_per_s"]), 25_000.0);

    let fresh = number(&report, &["bytes_per_message"]);
    assert!((16.0..=64.0).contains(&fresh), "bytes_per_message {fresh}");
    let backlog = number(&report, &["backlog_heap_bytes"]);
    assert!((backlog / 200_000.0 - fresh).abs() < 1e-9, "per message = total / messages");

    // 200 k at 25,000/s span 8 s: the default 5-minute window still holds every id.
    assert_eq!(number(&report, &["dedupe_window_ms"]), 300_000.0);
    assert_eq!(number(&report, &["dedupe_entries"]), 200_000.0);
    let dedupe = number(&report, &["dedupe_bytes_per_entry"]);
    assert!((16.0..=512.0).contains(&dedupe), "a dedupe entry holds a 16 B id: {dedupe}");
    let with_dedupe = number(&report, &["bytes_per_message_with_dedupe"]);
    assert!((with_dedupe - (fresh + dedupe)).abs() < 1e-6, "with = fresh + dedupe");

    for field in
        ["bytes_per_claimed_message", "bytes_per_scheduled_message", "bytes_per_released_message"]
    {
        let bytes = number(&report, &[field]);
        assert!((fresh..=1024.0).contains(&bytes), "{field} {bytes}: warm costs more than fresh");
    }
    assert!(number(&report, &["enqueue_applies_per_s"]) > 0.0);
    assert!(number(&report, &["enqueue_applies_per_s_without_dedupe"]) > 0.0);
    assert!(number(&report, &["elapsed_ms"]) > 0.0);
    assert_eq!(number(&report, &["targets", "bytes_per_message"]), 32.0);
    assert_eq!(number(&report, &["targets", "bytes_per_claimed_message"]), 128.0);
}

#[test]
fn recovery_reopens_with_and_without_a_checkpoint_and_cleans_up() {
    // Goal: a 20 k-message partition reopens with every message both ways; with a
    // checkpoint nothing (or next to nothing) is replayed, without one every enqueue is,
    // the figures are present, and the run directory is removed afterwards. At 100
    // messages/s of broker time the backlog spans 200 s of the 5-minute dedupe window, so
    // the checkpoint refers to sealed dedupe generation files, which the reopen (spoold's
    // ordered replay and open) must restore: the bench once restored the checkpoint
    // without them and refused its own backlog from 1 M messages on.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().to_str().unwrap();
    let report = run_bench(&[
        "recovery",
        "--messages",
        "20000",
        "--record-bytes",
        "256",
        "--segment-bytes",
        "4194304",
        "--rate-per-s",
        "100",
        "--dir",
        dir,
    ]);
    assert_eq!(report["scenario"], "recovery");
    assert_eq!(number(&report, &["messages"]), 20_000.0);
    assert_eq!(number(&report, &["record_bytes"]), 256.0);
    assert_eq!(number(&report, &["batch_records"]), 100.0);
    let batch_bytes = number(&report, &["batch_bytes"]);
    assert!(batch_bytes > 100.0 * 256.0, "a batch is its payloads plus framing: {batch_bytes}");
    let on_disk = number(&report, &["bytes_on_disk"]);
    assert!(on_disk >= 200.0 * batch_bytes, "200 batches are on disk: {on_disk}");
    assert!(number(&report, &["checkpoint_bytes"]) > 0.0);
    let generations = number(&report, &["dedupe_generations"]);
    assert!(generations >= 1.0, "the checkpoint refers to sealed generations: {report}");
    assert_eq!(number(&report, &["dedupe_generation_files"]), generations, "one file each");
    assert!(number(&report, &["dedupe_generation_bytes"]) > 0.0);
    assert!(number(&report, &["build_ms"]) > 0.0);
    for field in ["log_scan_ms", "checkpoint_read_ms", "checkpoint_restore_ms"] {
        assert!(number(&report, &[field]) > 0.0, "{field}");
    }
    assert!(number(&report, &["build_messages_per_s"]) > 0.0);

    let with = &report["with_checkpoint"];
    let without = &report["without_checkpoint"];
    for reopen in [with, without] {
        assert!(number(reopen, &["recovery_ms"]) > 0.0);
        assert_eq!(number(reopen, &["live_messages"]), 20_000.0, "{reopen}");
        assert!(number(reopen, &["journal_files_scanned"]) >= 1.0);
        assert_eq!(reopen["shard_replayed"], true, "spoold's ordered replay took it: {reopen}");
        for part in ["journal_open_ms", "shard_replay_ms", "partition_open_ms"] {
            assert!(number(reopen, &[part]) <= number(reopen, &["recovery_ms"]), "{part}");
        }
    }
    // Without a checkpoint the shard journal is scanned from its start, every
    // entry; with one from the checkpoint's scan start (here the oldest live
    // record's entry, as nothing was acked), never more.
    assert!(number(without, &["journal_entries"]) >= 200.0, "{without}");
    assert!(number(with, &["journal_entries"]) <= number(without, &["journal_entries"]), "{with}");
    assert_eq!(number(with, &["checkpoint_covers"]), 20_000.0, "covers every enqueue");
    assert_eq!(number(with, &["replayed_events"]), 0.0, "the checkpoint covers the whole log");
    assert!(without["checkpoint_covers"].is_null());
    assert_eq!(number(without, &["replayed_events"]), 20_000.0, "every enqueue replayed");
    assert!(number(without, &["replayed_batches"]) >= 200.0);
    assert_eq!(number(&report, &["target_recovery_ms_with_checkpoint"]), 10_000.0);

    let left: Vec<_> = std::fs::read_dir(temp.path()).unwrap().collect();
    assert!(left.is_empty(), "the run removes its partition directory");
}

#[test]
fn recovery_refuses_a_run_that_does_not_fit_the_disk() {
    // Goal: the statvfs check refuses, before writing anything, a run far larger than any
    // disk (50 M records of 900 kB ≈ 45 TB), with exit 1 and a message saying why.
    let temp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .args(["recovery", "--messages", "50000000", "--record-bytes", "900000"])
        .args(["--batch-records", "1", "--dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bytes free but the run needs"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(temp.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing written");
}
