//! `spool-bench throughput` as a user runs it: the binary starts its own
//! `spoold` (no `--addr`), runs a short load with tiny sizes, stops the
//! broker and prints one JSON object. The tests check the report's shape and
//! internal consistency, never timing thresholds (the machine is shared).

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;

use common::{spoold, BENCH};

fn run_bench(dir: &Path, extra: &[&str]) -> Value {
    let output = Command::new(BENCH)
        .arg("throughput")
        .arg("--spoold")
        .arg(spoold())
        .arg("--dir")
        .arg(dir)
        .args(["--shards", "1", "--msg-bytes", "64", "--producers", "1", "--consumers", "1"])
        .args(["--slots", "16", "--window", "64", "--seconds", "2", "--warmup-ms", "300"])
        .args(["--linger-us", "1000"])
        .args(extra)
        .env_remove("SPOOL_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spool-bench failed: {stderr}");
    assert_eq!(stdout.lines().count(), 1, "expected one JSON line, got: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

fn number(report: &Value, path: &str) -> f64 {
    let mut value = report;
    for key in path.split('.') {
        value = value.get(key).unwrap_or_else(|| panic!("missing {path} in {report}"));
    }
    value.as_f64().unwrap_or_else(|| panic!("{path} is not a number: {value}"))
}

/// Percentiles exist, are positive and ordered.
fn check_latency(report: &Value, path: &str, with_max: bool) {
    let p50 = number(report, &format!("{path}.p50"));
    let p99 = number(report, &format!("{path}.p99"));
    let p999 = number(report, &format!("{path}.p999"));
    assert!(p50 > 0.0, "{path}.p50 = {p50}");
    assert!(p50 <= p99, "{path}: p50 {p50} > p99 {p99}");
    assert!(p99 <= p999, "{path}: p99 {p99} > p999 {p999}");
    if with_max {
        let max = number(report, &format!("{path}.max"));
        assert!(p999 <= max, "{path}: p999 {p999} > max {max}");
    }
}

/// Every field the README documents, with sane values.
fn check_report(report: &Value) {
    let measured_s = number(report, "measured_s");
    assert!(measured_s >= 1.9, "measured_s {measured_s}");
    let count = number(report, "enqueue.count");
    let msgs_per_s = number(report, "enqueue.msgs_per_s");
    assert!(count > 0.0);
    assert!((msgs_per_s - count / measured_s).abs() < 1e-6 * msgs_per_s.max(1.0));
    let mb_per_s = number(report, "enqueue.mb_per_s");
    assert!((mb_per_s - msgs_per_s * 64.0 / 1e6).abs() < 1e-9 + 1e-6 * mb_per_s);
    check_latency(report, "enqueue.latency_us", true);
    assert!(number(report, "claim_ack.msgs_per_s") > 0.0);
    let acked = number(report, "claim_ack.acked");
    let claimed = number(report, "claim_ack.claimed");
    assert!(acked > 0.0);
    // Everything acked was claimed: only deliveries held at the window's start (running,
    // or awaiting their Ack: slots + acks_pending per consumer) can be claimed before it and
    // acked in it.
    let slots = number(report, "config.slots");
    let acks_pending = match number(report, "config.acks_pending") {
        0.0 => slots,
        set => set,
    };
    let held = slots + acks_pending;
    let straddling = held * number(report, "config.consumers");
    assert!(claimed + straddling >= acked, "claimed {claimed} acked {acked}");
    // Only a claim in flight at shutdown is released (at most the slots).
    assert!(number(report, "claim_ack.released_total") <= 16.0);
    // Claims answered in the window: one round trip each, never more deliveries
    // than credits asked, and together what was claimed in it (give or take the claims
    // answered as the window closed: at most the slots of each consumer).
    let claim_rtts = number(report, "claim_ack.claim_rtt_us.count");
    assert!(claim_rtts > 0.0);
    check_latency(report, "claim_ack.claim_rtt_us", false);
    let deliveries = number(report, "claim_ack.claim_deliveries");
    assert!(deliveries <= number(report, "claim_ack.claim_credits_asked"));
    let edge = slots * number(report, "config.consumers");
    assert!(deliveries > 0.0 && deliveries <= claimed + edge, "{deliveries} of {claimed}");
    check_latency(report, "e2e.latency_us", false);
    assert_eq!(number(report, "metadata_rtt_us.count"), 1000.0);
    check_latency(report, "metadata_rtt_us", false);
    let errors = report["errors"].as_object().unwrap();
    assert!(errors.is_empty(), "errors on a healthy run: {errors:?}");
    let config = &report["config"];
    assert_eq!(config["spoold_started"], Value::Bool(true));
    assert_eq!(config["queue_created"], Value::Bool(true));
    assert_eq!(config["msg_bytes"], 64);
    assert_eq!(config["partitions"], 2, "default partitions = shards × 2");
    assert!(config["queue"].as_str().unwrap().starts_with("bench-"));
}

// Goal: closed-loop run without --addr reports every field sanely and cleans up.
// Method: run the binary for 2 s with 64 B messages, check the JSON and that the temp dir is empty.
#[test]
fn closed_loop_reports_every_field_and_removes_its_broker_dir() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_bench(dir.path(), &[]);
    check_report(&report);
    assert_eq!(report["config"]["rate"], Value::Null);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "spoold's temp dir left behind: {left:?}");
}

// Goal: --rate paces sends on a schedule (open loop) instead of as fast as possible.
// Method: 500 msgs/s for 2 s; completions in the window cannot exceed the schedule
// (rate × (window + warm-up)), and the report is otherwise complete.
#[test]
fn open_loop_rate_caps_the_send_count_at_the_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_bench(dir.path(), &["--rate", "500"]);
    check_report(&report);
    assert_eq!(report["config"]["rate"], 500);
    let count = number(&report, "enqueue.count");
    let scheduled = 500.0 * (number(&report, "measured_s") + 0.3);
    assert!(count <= scheduled + 1.0, "{count} sends completed, schedule allows {scheduled}");
}
