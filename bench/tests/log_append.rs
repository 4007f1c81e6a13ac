//! Runs the real `spool-bench log-append` binary briefly on a temp dir and
//! checks its one JSON object: every field present, values consistent. No
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

#[test]
fn log_append_reports_every_field_with_sane_values() {
    // Goal: a 1 s run with 8 appenders over 4 partitions of one shard journal prints one JSON
    // object whose throughput, commit and latency figures are present and mutually
    // consistent, and cleans up its log directory.
    let temp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .args(["log-append", "--dir"])
        .arg(temp.path())
        .args(["--record-bytes", "1024", "--appenders", "8", "--partitions", "4", "--seconds", "1"])
        .args(["--warmup-ms", "200", "--segment-bytes", "4194304", "--commit-bytes", "65536"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spool-bench failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "exactly one JSON line: {stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();

    assert_eq!(report["scenario"], "log-append");
    for (field, expected) in [
        ("appenders", 8.0),
        ("partitions", 4.0),
        ("record_bytes", 1024.0),
        ("seconds", 1.0),
        ("segment_bytes", 4_194_304.0),
        ("commit_bytes", 65_536.0),
    ] {
        assert_eq!(number(&report, &[field]), expected, "config echo {field}");
    }
    let records_per_s = number(&report, &["records_per_s"]);
    assert!(records_per_s > 0.0);
    let records = number(&report, &["records"]);
    let measured_s = number(&report, &["measured_s"]);
    assert!(measured_s >= 1.0, "the window lasts at least --seconds");
    assert!((records / measured_s - records_per_s).abs() < 1e-6 * records_per_s);
    let batch_bytes = number(&report, &["batch_bytes"]);
    assert!(batch_bytes > 1024.0 + 64.0, "a batch is payload plus framing: {batch_bytes}");
    let mb_per_s = number(&report, &["mb_per_s"]);
    assert!((mb_per_s - records_per_s * batch_bytes / 1e6).abs() < 1e-6 * mb_per_s);
    assert!(number(&report, &["disk_mb_per_s"]) >= mb_per_s, "pages include fillers");
    let file_bytes = number(&report, &["journal_file_bytes"]);
    assert!(file_bytes >= 4_194_304.0, "journal files of at least --segment-bytes: {file_bytes}");
    assert!(number(&report, &["journal_commit_bytes"]) >= 65_536.0);
    assert!(number(&report, &["witnesses"]) >= 0.0);
    let commits_per_s = number(&report, &["commits_per_s"]);
    assert!(commits_per_s > 0.0);
    let per_commit = number(&report, &["records_per_commit_mean"]);
    assert!(per_commit >= 1.0, "a commit holds at least one record");
    assert!(per_commit <= 8.0, "8 appenders, one append each in flight: {per_commit}");

    let p50 = number(&report, &["latency_us", "p50"]);
    let p99 = number(&report, &["latency_us", "p99"]);
    let p999 = number(&report, &["latency_us", "p999"]);
    let max = number(&report, &["latency_us", "max"]);
    assert!(p50 > 0.0);
    assert!(p50 <= p99);
    assert!(p99 <= p999);
    assert!(p999 <= max);
    assert_eq!(number(&report, &["latency_us", "count"]), records);
    // Every durable append needed a sync: the storage seam saw at least one per commit.
    assert!(number(&report, &["io", "sync_us", "count"]) > 0.0);
    assert!(number(&report, &["io", "write_bytes"]) > 0.0);

    let left: Vec<_> = std::fs::read_dir(temp.path()).unwrap().collect();
    assert!(left.is_empty(), "the run removes its log directory");
}

#[test]
fn log_append_rejects_a_bad_config_with_a_message() {
    // Goal: an out-of-range knob fails fast with exit 1 and names the field.
    let temp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .args(["log-append", "--dir"])
        .arg(temp.path())
        .args(["--appenders", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("appenders"));
}
