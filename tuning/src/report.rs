//! Human-readable rendering: aligned tables with units.
//!
//! This module owns presentation only: it turns a [`Plan`] (and its inputs)
//! into rows of label, value and unit and aligns them. It computes nothing the
//! JSON output would lack, so scripts and people see the same numbers.

use crate::host::{ApplyHow, Check, HostReport};
use crate::measure::{Probe, SyncProbe, WriteMode};
use crate::plan::{Plan, PlanInputs, MIB_BYTES};
use crate::verdict::{Carries, ModelCheck, Status};

/// One table line.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub value: String,
    pub unit: String,
}

impl Row {
    pub fn new(label: &str, value: String, unit: &str) -> Self {
        Self { label: label.to_owned(), value, unit: unit.to_owned() }
    }
}

/// A titled group of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub title: String,
    pub rows: Vec<Row>,
}

/// How the value column is aligned: numbers right, free text left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueAlign {
    Right,
    Left,
}

/// Renders sections with labels left-aligned, values right-aligned and units
/// after them, all columns the same width across sections.
pub fn render(sections: &[Section]) -> String {
    render_aligned(sections, ValueAlign::Right)
}

/// [`render`] with a chosen value alignment.
pub fn render_aligned(sections: &[Section], align: ValueAlign) -> String {
    let rows = sections.iter().flat_map(|section| section.rows.iter());
    let label_width = rows.clone().map(|row| row.label.chars().count()).max().unwrap_or(0);
    let value_width = rows.map(|row| row.value.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (index, section) in sections.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        out.push_str(&section.title);
        out.push('\n');
        for row in &section.rows {
            let line = match align {
                ValueAlign::Right => format!(
                    "  {:<label_width$}  {:>value_width$}  {}",
                    row.label, row.value, row.unit
                ),
                ValueAlign::Left => format!(
                    "  {:<label_width$}  {:<value_width$}  {}",
                    row.label, row.value, row.unit
                ),
            };
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

/// The planner's table.
pub fn plan_sections(inputs: &PlanInputs, plan: &Plan) -> Vec<Section> {
    let settings = &plan.settings;
    vec![
        Section {
            title: "inputs".to_owned(),
            rows: vec![
                Row::new("rate", grouped(inputs.rate_msgs_per_s, 0), "msgs/s"),
                Row::new("record size", grouped(inputs.record_bytes, 1), "bytes"),
                Row::new("replicas", inputs.replicas.to_string(), ""),
                Row::new("nodes", plan.nodes.to_string(), ""),
                Row::new("retention", grouped(inputs.retention_s, 0), "s"),
                Row::new(
                    "burst",
                    format!(
                        "{} for {}",
                        grouped(inputs.burst_rate_msgs_per_s, 0),
                        grouped(inputs.burst_s, 0)
                    ),
                    "msgs/s for s",
                ),
                Row::new(
                    "consumers during burst",
                    grouped(inputs.burst_consumer_msgs_per_s, 0),
                    "msgs/s",
                ),
                Row::new(
                    "drain: consumers vs ingress",
                    format!(
                        "{} vs {}",
                        grouped(inputs.drain_consumer_msgs_per_s, 0),
                        grouped(inputs.drain_ingress_msgs_per_s, 0)
                    ),
                    "msgs/s",
                ),
                Row::new(
                    "service time mean, CV",
                    format!("{}, {}", grouped(inputs.service_ms_mean, 1), inputs.service_cv),
                    "ms, -",
                ),
                Row::new("target utilization", grouped(inputs.utilization_target * 100.0, 1), "%"),
                Row::new(
                    "per partition: produce, consume",
                    format!(
                        "{}, {}",
                        grouped(inputs.partition_produce_msgs_per_s, 0),
                        grouped(inputs.partition_consume_msgs_per_s, 0)
                    ),
                    "msgs/s",
                ),
                Row::new("disk reserve", grouped(inputs.disk_reserve_fraction * 100.0, 1), "%"),
            ],
        },
        Section {
            title: "capacity".to_owned(),
            rows: vec![
                Row::new("logical ingress", grouped(plan.ingress_logical_mib_per_s, 2), "MiB/s"),
                Row::new(
                    "replicated ingress",
                    grouped(plan.ingress_replicated_mib_per_s, 2),
                    "MiB/s",
                ),
                Row::new("ingress per node", grouped(plan.node_ingress_mib_per_s, 2), "MiB/s"),
                Row::new("messages per node (peak)", grouped(plan.node_msgs_per_s, 0), "msgs/s"),
                Row::new(
                    "unreclaimed per day (replicated)",
                    grouped(plan.unreclaimed_tib_per_day, 2),
                    "TiB/day",
                ),
                Row::new("burst backlog", grouped(plan.backlog_msgs, 0), "msgs"),
                Row::new("burst backlog bytes", grouped(plan.backlog_bytes / MIB_BYTES, 1), "MiB"),
                Row::new("drain time", grouped(plan.drain_s, 0), "s"),
                Row::new("busy slots (rate x service)", grouped(plan.slots_busy, 1), "slots"),
                Row::new("planned slots (busy / util)", grouped(plan.slots_planned, 1), "slots"),
                Row::new(
                    "partitions (produce, consume)",
                    format!(
                        "{} ({}, {})",
                        plan.partitions, plan.partitions_for_produce, plan.partitions_for_consume
                    ),
                    "",
                ),
                Row::new("retained per replica", gib(plan.retained_bytes), "GiB"),
                Row::new("disk per replica (+reserve)", gib(plan.disk_bytes_per_replica), "GiB"),
                Row::new("disk total (all replicas)", gib(plan.disk_bytes_total), "GiB"),
            ],
        },
        Section {
            title: "broker settings".to_owned(),
            rows: vec![
                Row::new("commit_window", settings.commit_window_us.to_string(), "us"),
                Row::new("commit_bytes", kib(settings.commit_bytes), "KiB"),
                Row::new("segment_bytes", kib(settings.segment_bytes), "KiB"),
                Row::new("queue max_messages", grouped(settings.queue_max_messages as f64, 0), ""),
                Row::new("queue max_bytes", gib(settings.queue_max_bytes as f64), "GiB"),
                Row::new("disk reserve", gib(settings.disk_reserve_bytes as f64), "GiB"),
                Row::new(
                    "backlog index memory",
                    grouped(settings.backlog_index_bytes as f64 / MIB_BYTES, 1),
                    "MiB",
                ),
                Row::new(
                    "service p99.9 (log-normal)",
                    grouped(settings.lease.service_p999_ms, 1),
                    "ms",
                ),
                Row::new("lease", grouped(settings.lease.lease_ms as f64, 0), "ms"),
            ],
        },
    ]
}

/// The planner's whole human output: the table and the lease formula.
pub fn render_plan(inputs: &PlanInputs, plan: &Plan) -> String {
    let mut out = render(&plan_sections(inputs, plan));
    out.push_str("\nlease formula: ");
    out.push_str(&plan.settings.lease.formula);
    out.push('\n');
    out
}

/// The host report's table: one row per check, then the changes.
pub fn render_host(report: &HostReport) -> String {
    fn check<T>(check: &Check<T>, show: impl Fn(&T) -> String) -> String {
        match check {
            Check::Ok { value } => show(value),
            Check::Unknown { reason } => format!("unknown ({reason})"),
        }
    }
    let yes_no = |flag: bool| if flag { "yes" } else { "no" }.to_owned();
    let mut rows = vec![
        Row::new("running as root", yes_no(report.is_root), ""),
        Row::new(
            "io_uring",
            format!("{} - {}", yes_no(report.io_uring.available), report.io_uring.detail),
            "",
        ),
        Row::new(
            "kernel.io_uring_disabled",
            check(&report.io_uring.disabled_sysctl, u64::to_string),
            "",
        ),
        Row::new(
            "RLIMIT_MEMLOCK soft",
            check(&report.memlock, |memlock| {
                let soft = memlock.soft_bytes.map_or("unlimited".to_owned(), |b| b.to_string());
                format!(
                    "{soft} (need {} unless root: {})",
                    memlock.required_bytes,
                    if memlock.sufficient { "ok" } else { "TOO LOW" }
                )
            }),
            "bytes",
        ),
        Row::new("CPUs", check(&report.cpu_count, usize::to_string), ""),
        Row::new(
            "CPU governors",
            check(&report.governors, |governors| {
                let mut names: Vec<&str> =
                    governors.iter().map(|cpu| cpu.governor.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                names.join(",")
            }),
            "",
        ),
        Row::new("data dir (probed)", report.probed_path.clone(), ""),
        Row::new(
            "filesystem",
            check(&report.filesystem, |fs| {
                format!("{} on {} at {}", fs.fstype, fs.source, fs.mount_point)
            }),
            "",
        ),
        Row::new(
            "block device",
            check(&report.block_device, |dev| format!("{} ({})", dev.name, dev.dev)),
            "",
        ),
        Row::new(
            "I/O scheduler",
            check(&report.block_device, |dev| check(&dev.scheduler, |s| s.active.clone())),
            "",
        ),
        Row::new(
            "logical block size",
            check(&report.block_device, |dev| check(&dev.logical_block_bytes, u64::to_string)),
            "bytes",
        ),
        Row::new(
            "free space",
            report.disk.free_bytes.map_or("unknown".to_owned(), |free| gib(free as f64)),
            "GiB",
        ),
        Row::new("plan needs (one replica)", gib(report.disk.needed_bytes as f64), "GiB"),
        Row::new("free space sufficient", check(&report.disk.sufficient, |ok| yes_no(*ok)), ""),
    ];
    for sysctl in &report.sysctls {
        rows.push(Row::new(&sysctl.name, check(&sysctl.value, u64::to_string), ""));
    }
    // Host values are sentences, not numbers: left-aligned and units folded in.
    for row in &mut rows {
        if !row.unit.is_empty() {
            row.value = format!("{} {}", row.value, row.unit);
            row.unit.clear();
        }
    }
    let mut out = render_aligned(&[Section { title: "host".to_owned(), rows }], ValueAlign::Left);
    out.push_str("\nchanges");
    if report.changes.is_empty() {
        out.push_str(": none\n");
    }
    out.push('\n');
    for change in &report.changes {
        let how = match change.how {
            ApplyHow::Write => "with --apply",
            ApplyHow::Manual => "manual",
        };
        out.push_str(&format!(
            "  {}: {} -> {} [{how}]\n    why: {}\n",
            change.setting, change.current, change.desired, change.reason
        ));
        for path in &change.paths {
            out.push_str(&format!("    write: {path}\n"));
        }
    }
    out
}

/// The measured limits beside the model's need, then the verdict, one line per check.
pub fn render_model(model: &ModelCheck) -> String {
    fn probe<T>(probe: &Probe<T>, show: impl Fn(&T) -> String) -> String {
        match probe {
            Probe::Measured { value } => show(value),
            Probe::Skipped { reason } => format!("skipped ({reason})"),
            Probe::Failed { reason } => format!("failed ({reason})"),
        }
    }
    let sync = |sync: &SyncProbe| {
        let mode = match sync.mode {
            WriteMode::Direct => "O_DIRECT",
            WriteMode::Buffered => "buffered",
        };
        format!(
            "p50 {:.2} / p99 {:.2} / max {:.2} ms ({} syncs, {mode})",
            sync.latency.p50_us / 1000.0,
            sync.latency.p99_us / 1000.0,
            sync.latency.max_us / 1000.0,
            sync.latency.samples
        )
    };
    let need = &model.need;
    let measurements = &model.measurements;
    let rows = vec![
        Row::new(
            "node's share (nodes, replicas)",
            format!(
                "{} MiB/s, {} msgs/s ({}, {})",
                grouped(need.node_ingress_bytes_per_s / MIB_BYTES, 2),
                grouped(need.node_msgs_per_s, 0),
                need.nodes,
                need.replicas
            ),
            "",
        ),
        Row::new("sync the model sizes for", format!("{} ms", need.sync_slow_ms), ""),
        Row::new("4 KiB write+fdatasync alone", probe(&measurements.sync_alone, sync), ""),
        Row::new("the same beside the writer", probe(&measurements.sync_beside_writer, sync), ""),
        Row::new(
            "writer",
            probe(&measurements.writer, |writer| {
                format!(
                    "{} of {} MiB/s",
                    grouped(writer.achieved_bytes_per_s / MIB_BYTES, 1),
                    grouped(writer.target_bytes_per_s / MIB_BYTES, 1)
                )
            }),
            "",
        ),
        Row::new(
            "broker CPU per message",
            probe(&measurements.cpu, |cpu| {
                format!(
                    "{:.1} us (client {:.1} us) at {} msgs/s for {} s, {} shards, {} msgs",
                    cpu.broker_cpu_us_per_msg,
                    cpu.client_cpu_us_per_msg,
                    grouped(cpu.rate_msgs_per_s as f64, 0),
                    cpu.seconds,
                    cpu.shards,
                    grouped(cpu.enqueued as f64, 0)
                )
            }),
            "",
        ),
        Row::new(
            "broker msgs/s, all CPUs / at headroom",
            match (
                model.limits.broker_msgs_per_s_saturated,
                model.limits.broker_msgs_per_s_at_headroom,
            ) {
                (Some(all), Some(headroom)) => {
                    format!("{} / {}", grouped(all, 0), grouped(headroom, 0))
                }
                _ => "unknown".to_owned(),
            },
            "",
        ),
    ];
    let title = format!("model on this host (probes in {})", measurements.dir);
    let mut out = render_aligned(&[Section { title, rows }], ValueAlign::Left);
    let verdict = &model.verdict;
    let answer = match verdict.carries {
        Carries::Yes => "yes",
        Carries::No => "NO",
        Carries::Unknown => "unknown",
    };
    out.push_str(&format!("\ncarries the model: {answer}\n"));
    for check in &verdict.checks {
        let status = match check.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Unknown => "unknown",
        };
        out.push_str(&format!("  [{status}] {}\n", check.detail));
    }
    for note in [&measurements.sync_alone, &measurements.sync_beside_writer]
        .into_iter()
        .filter_map(|probe| probe.value().and_then(|sync| sync.note.clone()))
        .take(1)
    {
        out.push_str(&format!("  note: {note}\n"));
    }
    out
}

fn gib(bytes: f64) -> String {
    grouped(bytes / (MIB_BYTES * 1024.0), 1)
}

fn kib(bytes: u64) -> String {
    grouped(bytes as f64 / 1024.0, 0)
}

/// Formats `value` with `decimals` places and thousands separators.
pub fn grouped(value: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, value.abs());
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text.as_str(), None),
    };
    let mut out = String::new();
    if value < 0.0 && text.chars().any(|ch| ch != '0' && ch != '.') {
        out.push('-');
    }
    for (index, ch) in whole.chars().enumerate() {
        if index > 0 && (whole.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if let Some(fraction) = fraction {
        out.push('.');
        out.push_str(fraction);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: numbers read like the seed's ("7,200,000", "39.06").
    // Method: format a few values, including rounding and negatives.
    #[test]
    fn grouped_inserts_separators() {
        assert_eq!(grouped(7_200_000.0, 0), "7,200,000");
        assert_eq!(grouped(39.0625, 2), "39.06");
        assert_eq!(grouped(999.96, 1), "1,000.0");
        assert_eq!(grouped(12.0, 0), "12");
        assert_eq!(grouped(-1234.5, 1), "-1,234.5");
        assert_eq!(grouped(-0.01, 1), "0.0");
    }

    // Goal: columns line up across sections. Method: the unit column of every
    // row starts at the same character offset.
    #[test]
    fn render_aligns_columns() {
        let sections = vec![
            Section {
                title: "a".to_owned(),
                rows: vec![
                    Row::new("x", "1".to_owned(), "s"),
                    Row::new("longer", "1,000".to_owned(), "ms"),
                ],
            },
            Section { title: "b".to_owned(), rows: vec![Row::new("y", "22".to_owned(), "MiB")] },
        ];
        let text = render(&sections);
        let unit_offsets: Vec<usize> = text
            .lines()
            .filter(|line| line.starts_with("  "))
            .map(|line| line.rfind(' ').map(|at| at + 1).unwrap_or(0))
            .collect();
        assert_eq!(unit_offsets.len(), 3);
        assert!(unit_offsets.iter().all(|offset| *offset == unit_offsets[0]), "{text}");
        assert!(text.contains("\nb\n"), "{text}");
    }
}
