//! `spool-bench capacity`, `omb` and `latency` as a user runs them: the
//! binary starts its own `spoold` (no `--addr`), runs a short load at small
//! rates, stops the broker and prints one JSON document. The tests check the
//! report's shape and its internal consistency (and the client's backlog
//! against the broker's own count), never timing thresholds: the machine is
//! shared.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{spoold, BENCH};

fn bench(dir: &Path, args: &[&str]) -> Output {
    Command::new(BENCH)
        .args(args)
        .arg("--spoold")
        .arg(spoold())
        .arg("--dir")
        .arg(dir)
        .args(["--shards", "1", "--quiet"])
        .env_remove("SPOOL_CONFIG")
        .output()
        .unwrap()
}

fn one_json(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spool-bench failed: {stderr}");
    assert_eq!(stdout.lines().count(), 1, "expected one JSON line, got: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

fn field<'a>(report: &'a Value, path: &str) -> &'a Value {
    let mut value = report;
    for key in path.split('.') {
        value = value.get(key).unwrap_or_else(|| panic!("missing {path} in report"));
    }
    value
}

fn number(report: &Value, path: &str) -> f64 {
    let value = field(report, path);
    value.as_f64().unwrap_or_else(|| panic!("{path} is not a number: {value}"))
}

/// Ordered, non-negative percentiles.
fn check_percentiles(report: &Value, prefix: &str, suffixes: [&str; 4]) {
    let values: Vec<f64> =
        suffixes.iter().map(|suffix| number(report, &format!("{prefix}{suffix}"))).collect();
    assert!(values[0] >= 0.0, "{prefix}: {values:?}");
    for pair in values.windows(2) {
        assert!(pair[0] <= pair[1], "{prefix} percentiles out of order: {values:?}");
    }
}

/// The OMB result fields and queue fields every load report carries.
fn check_common(report: &Value, omb_prefix: &str) {
    for name in ["publishRate", "consumeRate", "backlog"] {
        number(report, &format!("{omb_prefix}{name}"));
    }
    assert!(number(report, &format!("{omb_prefix}publishRate")) > 0.0);
    assert!(number(report, &format!("{omb_prefix}consumeRate")) > 0.0);
    check_percentiles(
        report,
        &format!("{omb_prefix}publishLatency"),
        ["50pct", "99pct", "999pct", "Max"],
    );
    check_percentiles(
        report,
        &format!("{omb_prefix}endToEndLatency"),
        ["50pct", "99pct", "999pct", "Max"],
    );
    for name in [
        "claim_to_ack_mean_ms",
        "redeliveries",
        "lease_expiries",
        "released",
        "extend_failed",
        "broker_final.backlog",
        "broker_final.acked",
    ] {
        number(report, &format!("queue.{name}"));
    }
    // A healthy run with leases far above the service time: nothing expires.
    assert_eq!(number(report, "queue.lease_expiries"), 0.0);
    assert_eq!(number(report, "queue.redeliveries"), 0.0);
    let errors = field(report, "errors").as_object().unwrap();
    assert!(errors.is_empty(), "errors on a healthy run: {errors:?}");
    let series = field(report, "series").as_array().unwrap();
    assert!(series.len() >= 2, "one sample per second: {}", series.len());
    for sample in series {
        for name in [
            "t_s",
            "publish_rate",
            "consume_rate",
            "backlog_client",
            "ready_client",
            "backlog_broker",
            "oldest_ready_age_ms",
            "busy_slots",
            "held_slots",
            "slots",
            "publish_latency_ms.p99",
            "e2e_latency_ms.p99",
            "errors",
        ] {
            number(sample, name);
        }
    }
    let times: Vec<f64> = series.iter().map(|sample| number(sample, "t_s")).collect();
    assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "samples in time order: {times:?}");
}

// Goal: `capacity --host` reads the host file before it starts anything, and a
// file without measurements (`spool-plan host --no-measure`) is refused with
// the reason. Method: such a file and a missing one; nothing appears in --dir.
#[test]
fn capacity_host_file_is_checked_before_any_load() {
    let dir = tempfile::tempdir().unwrap();
    let host_file = dir.path().join("host.json");
    std::fs::write(&host_file, r#"{"host": {}, "applied": null, "model": null}"#).unwrap();
    let run_dir = dir.path().join("runs");
    std::fs::create_dir(&run_dir).unwrap();
    for (file, needle) in [
        (host_file.to_str().unwrap(), "--no-measure"),
        ("/nonexistent/host.json", "cannot read the host file"),
    ] {
        let output = Command::new(BENCH)
            .args(["capacity", "--host", file, "--dir", run_dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{stderr}");
    }
    assert_eq!(std::fs::read_dir(&run_dir).unwrap().count(), 0, "a broker was started");
}

// Goal: a short capacity run completes, its JSON has every documented field, the client's
// backlog estimate matches the broker's own count within 1 % at the end of the burst, and
// --json / --plot write the same report and an SVG. Method: --time-scale 0.01 of a 600 s
// burst (6 s) at 1,000/s in against 500/s of workers, drain at 500/s in, 1,000/s out.
// "Within 1 %": |mean(client enqueued − acked read just before and just after one
// DescribeQueue) − broker (ready + scheduled + claimed)| ≤ 1 % of the broker's count.
#[test]
fn capacity_short_run_reports_every_field_and_its_backlog_matches_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let json_path = out.path().join("capacity.json");
    let svg_path = out.path().join("capacity.svg");
    let output = bench(
        dir.path(),
        &[
            "capacity",
            "--time-scale",
            "0.01",
            "--burst-s",
            "600",
            "--burst-rate",
            "1000",
            "--burst-consumer-rate",
            "500",
            "--drain-ingress-rate",
            "500",
            "--drain-consumer-rate",
            "1000",
            "--msg-bytes",
            "256",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
    );
    let report = one_json(&output);
    assert_eq!(report["scenario"], "capacity");

    // The planner's numbers for the scaled model: (1000 − 500) × 6 s, ÷ (1000 − 500).
    assert!((number(&report, "predicted.peak_backlog") - 3000.0).abs() < 1e-6);
    assert!((number(&report, "predicted.drain_s") - 6.0).abs() < 1e-9);
    assert!((number(&report, "predicted.burst_s") - 6.0).abs() < 1e-9);
    assert_eq!(number(&report, "config.slots_burst"), 9.0, "500/s × 18 ms");
    assert_eq!(number(&report, "config.slots_drain"), 18.0, "1000/s × 18 ms");
    for name in [
        "predicted.oldest_ready_age_s",
        "predicted.busy_slots_burst",
        "predicted.slots_planned",
        "predicted.peak_backlog_at_measured_rates",
        "predicted.drain_s_at_measured_rates",
        "measured.peak_backlog_broker",
        "measured.oldest_ready_age_s_max",
        "measured.busy_slots_burst_mean",
        "measured.busy_slots_drain_mean",
        "measured.burst_consume_rate",
        "measured.drain_consume_rate",
        "measured.enqueue_p99_ms_worst_interval",
        "deviation.peak_backlog",
        "deviation.drain_s",
        "plan.backlog_msgs",
    ] {
        number(&report, name);
    }
    // Workers slower than ingress: a backlog built up, and it was measured.
    let peak = number(&report, "measured.peak_backlog");
    assert!(peak > 0.0);
    assert!(number(&report, "measured.drain_s") > 0.0);
    assert!(field(&report, "measured.drained").is_boolean());
    assert_eq!(number(&report, "measured.errors_total"), 0.0);
    check_percentiles(&report, "measured.enqueue_latency_ms.", ["p50", "p99", "p999", "max"]);
    let deviation = number(&report, "deviation.peak_backlog");
    let predicted = number(&report, "predicted.peak_backlog");
    assert!((deviation - (peak / predicted - 1.0)).abs() < 1e-9);

    // The client's count against the broker's at the end of the burst.
    let broker = number(&report, "backlog_check.broker");
    let estimate = number(&report, "backlog_check.client_estimate");
    let before = number(&report, "backlog_check.client_before");
    let after = number(&report, "backlog_check.client_after");
    assert!(broker > 0.0, "a backlog exists at the end of the burst");
    assert!((estimate - (before + after) / 2.0).abs() < 1e-9);
    let error = (estimate - broker).abs() / broker;
    assert!(error <= 0.01, "client {estimate} vs broker {broker}: {:.3} %", error * 100.0);
    assert!((number(&report, "backlog_check.relative_error") - error).abs() < 1e-9);

    let phases = field(&report, "phases").as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["name"], "burst");
    assert_eq!(phases[1]["name"], "drain");
    check_common(&report, "omb.");
    // The model's curve rides along every sample.
    let series = field(&report, "series").as_array().unwrap();
    assert!(series.iter().all(|sample| sample["predicted_backlog"].is_number()));
    assert!(series.iter().any(|sample| sample["phase"] == "drain"));

    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(written, report, "--json writes the report printed on stdout");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "spoold's temp dir left behind: {left:?}");
}

// Goal: an OMB workload runs, its result has OMB's fields, and a field the runner does not
// support is reported on stderr and in the JSON (not silently ignored). Method: a workload
// file with an extra `fooBar` field, 2 s at 400 msgs/s over 2 topics.
#[test]
fn omb_workload_runs_and_reports_an_unknown_field() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("w.yaml");
    std::fs::write(
        &workload,
        "name: test\ntopics: 2\npartitionsPerTopic: 2\nmessageSize: 128\nproducersPerTopic: 1\n\
         consumerPerSubscription: 1\nproducerRate: 400\ntestDurationMinutes: 10\nfooBar: 7\n",
    )
    .unwrap();
    let broker_dir = dir.path().join("broker");
    std::fs::create_dir(&broker_dir).unwrap();
    let output = bench(
        &broker_dir,
        &["omb", "--workload", workload.to_str().unwrap(), "--duration-s", "2", "--slots", "8"],
    );
    let report = one_json(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unsupported workload field `fooBar`"), "stderr: {stderr}");
    assert_eq!(report["unsupported"]["fooBar"], 7);
    assert_eq!(report["scenario"], "omb");
    assert_eq!(report["workload"]["topics"], 2);
    assert_eq!(report["queues"].as_array().unwrap().len(), 2);
    check_common(&report, "");
}

// Goal: the latency scenario runs a fixed rate and reports percentiles over time.
// Method: 2 s at 500 msgs/s with 2 ms of service time; the open-loop schedule bounds the
// confirmed sends by rate × duration.
#[test]
fn latency_fixed_rate_reports_percentiles_every_second() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &["latency", "--rate", "500", "--seconds", "2", "--slots", "16", "--service-ms", "2"],
    );
    let report = one_json(&output);
    assert_eq!(report["scenario"], "latency");
    check_common(&report, "omb.");
    check_percentiles(&report, "enqueue_latency_ms.", ["p50", "p99", "p999", "max"]);
    let sent = number(&report, "enqueue_latency_ms.count");
    let duration = number(&report, "duration_s");
    assert!(sent > 0.0);
    assert!(sent <= 500.0 * duration + 2.0, "{sent} sends in {duration} s at 500/s");
    assert!((number(&report, "queue.service_ms.mean") - 2.0).abs() < 2.0, "≈ 2 ms service");
}
