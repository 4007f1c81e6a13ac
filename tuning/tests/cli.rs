//! The `spool-plan` binary end to end: table, JSON, input errors and `host --json`.

// A test binary: a failed unwrap in a helper is a failed test, as in #[test] bodies.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn spool_plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spool-plan")).args(args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

// Goal: the default table shows the seed's numbers with units.
// Method: run with no arguments and look for each figure on its row.
#[test]
fn default_table_shows_seed_numbers() {
    let output = spool_plan(&[]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    for (label, value, unit) in [
        ("logical ingress", "39.06", "MiB/s"),
        ("replicated ingress", "117.19", "MiB/s"),
        ("unreclaimed per day", "9.66", "TiB/day"),
        ("burst backlog", "7,200,000", "msgs"),
        ("drain time", "1,800", "s"),
        ("busy slots", "450.0", "slots"),
        ("planned slots", "750.0", "slots"),
    ] {
        let row = text.lines().find(|line| line.trim_start().starts_with(label)).unwrap();
        assert!(row.contains(value) && row.trim_end().ends_with(unit), "{row}");
    }
    assert!(text.contains("lease formula: lease = max(p99.9 x k"), "{text}");
}

// Goal: --json prints one object scripts can read, flags override defaults.
// Method: parse stdout; the seed's values, then a changed rate doubles ingress.
#[test]
fn json_output_and_flag_overrides() {
    let output = spool_plan(&["--json"]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(value["plan"]["backlog_msgs"], 7_200_000.0);
    assert_eq!(value["plan"]["drain_s"], 1_800.0);
    assert_eq!(value["plan"]["slots_busy"], 450.0);
    assert_eq!(value["inputs"]["replicas"], 3);

    let output = spool_plan(&["--json", "--rate", "50000", "--replicas", "2"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(value["plan"]["ingress_logical_mib_per_s"], 78.125);
    assert_eq!(value["plan"]["ingress_replicated_mib_per_s"], 156.25);
}

// Goal: an inputs file is read, and flags win over it.
// Method: a partial JSON file plus one flag.
#[test]
fn inputs_file_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inputs.json");
    std::fs::write(&path, r#"{"burst_s": 600, "service_ms_mean": 36}"#).unwrap();
    let output =
        spool_plan(&["--json", "--inputs", path.to_str().unwrap(), "--utilization", "0.9"]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(value["plan"]["backlog_msgs"], 3_600_000.0);
    assert_eq!(value["plan"]["slots_busy"], 900.0);
    assert_eq!(value["plan"]["slots_planned"], 1000.0);

    std::fs::write(&path, r#"{"nonsense": 1}"#).unwrap();
    let output = spool_plan(&["--inputs", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
}

// Goal: invalid inputs exit 2 with a clear message and no table.
// Method: utilization out of range, drain impossible, zero rate, negative CV.
#[test]
fn invalid_inputs_exit_2() {
    for (args, needle) in [
        (&["--utilization", "1.5"][..], "utilization_target must be in (0, 1]"),
        (&["--drain-consumer-rate", "19000"][..], "can never drain"),
        (&["--rate", "0"][..], "rate_msgs_per_s must be greater than zero"),
        (&["--service-cv", "-1"][..], "service_cv"),
    ] {
        let output = spool_plan(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty());
    }
}

// Goal: `host --json` succeeds on this machine and reports every check.
// Method: run it against a temp data dir; each check is either a value or
// "unknown" with a reason, and the disk need is the plan's.
#[test]
fn host_json_runs_here() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("not-created-yet");
    let output =
        spool_plan(&["host", "--json", "--no-measure", "--data-dir", data_dir.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let host = &value["host"];
    assert!(host["io_uring"]["available"].is_boolean());
    for check in ["memlock", "cpu_count", "governors", "filesystem", "block_device"] {
        let status = host[check]["status"].as_str().unwrap();
        assert!(status == "ok" || host[check]["reason"].is_string(), "{check}: {host}");
    }
    assert_eq!(host["probed_path"], dir.path().canonicalize().unwrap().to_str().unwrap());
    let expected_need = (40_960_000.0 * 86_400.0 / 0.8_f64).ceil();
    assert_eq!(host["disk"]["needed_bytes"].as_f64().unwrap(), expected_need);
    assert!(host["changes"].is_array());
    assert!(value["applied"].is_null());
    assert!(value["model"].is_null());
}

// Goal: `host` measures by default, briefly when told, in a directory it
// removes; without spoold and spool-bench the CPU probe is a skip and the
// verdict cannot be "yes". Method: 0.2 s probes, an empty --bin-dir.
#[test]
fn host_measures_briefly_and_skips_cpu_without_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = tempfile::tempdir().unwrap();
    let output = spool_plan(&[
        "host",
        "--json",
        "--measure-seconds",
        "0.2",
        "--rate",
        "2000",
        "--burst-rate",
        "2000",
        "--burst-consumer-rate",
        "1500",
        "--drain-ingress-rate",
        "1000",
        "--drain-consumer-rate",
        "1800",
        "--bin-dir",
        bin_dir.path().to_str().unwrap(),
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let model = &value["model"];
    let measurements = &model["measurements"];
    for probe in ["sync_alone", "sync_beside_writer", "writer"] {
        assert_eq!(measurements[probe]["status"], "measured", "{probe}: {model}");
    }
    let latency = &measurements["sync_beside_writer"]["value"]["latency"];
    let (p50, p99, max) = (
        latency["p50_us"].as_f64().unwrap(),
        latency["p99_us"].as_f64().unwrap(),
        latency["max_us"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{latency}");
    // 2,000 msgs/s × 1,638.4 B × 3 replicas / 3 nodes.
    let target = measurements["writer"]["value"]["target_bytes_per_s"].as_f64().unwrap();
    assert!((target - 3_276_800.0).abs() < 1e-6, "{target}");
    assert_eq!(measurements["cpu"]["status"], "skipped");
    assert!(measurements["cpu"]["reason"].as_str().unwrap().contains("not found"));
    let carries = model["verdict"]["carries"].as_str().unwrap();
    assert!(carries == "unknown" || carries == "no", "{carries}");
    assert_eq!(model["verdict"]["checks"][2]["status"], "unknown");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "probe files left behind");

    let output = spool_plan(&["host", "--measure-seconds", "61"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("--measure-seconds 61"));
}
