//! `spool queue create|list|describe|resize|delete` and `spool stats`: a queue's
//! life and its counts, through [`Admin`], and their tables and JSON.
//!
//! It must not touch messages (that is `send`, `recv` and `inspect`) and
//! asks before it deletes (`confirm`, or `--yes`).

use serde_json::{json, Value};
use spool_client::spool_wire::proto::{LaneStats, PartitionId, PartitionStats, QueueConfig};
use spool_client::{default_queue_config, Admin};

use crate::args::{QueueCommand, StatsArgs};
use crate::render::{Output, Table};
use crate::{confirm, Failure};

/// `spool queue create|list|describe|resize|delete`.
pub async fn run(admin: &Admin, command: &QueueCommand) -> Result<Output, Failure> {
    match command {
        QueueCommand::Create(create) => {
            let mut config = default_queue_config(create.partitions);
            if let Some(bands) = create.priority_bands {
                config.priority_bands = bands;
            }
            if let Some(lease_ms) = create.lease_ms {
                config.lease_default_ms = lease_ms;
                config.lease_max_ms = config.lease_max_ms.max(lease_ms);
                config.lease_min_ms = config.lease_min_ms.min(lease_ms);
            }
            if let Some(max) = create.max_deliveries {
                config.max_deliveries = max;
            }
            if let Some(max) = create.max_messages {
                config.max_messages = max;
            }
            if let Some(window_ms) = create.dedupe_window_ms {
                config.dedupe_window_ms = window_ms;
            }
            config.retention_ms = create.retention_ms.unwrap_or(0);
            config.retention_bytes = create.retention_bytes.unwrap_or(0);
            config.ordered = create.ordered;
            let window = window_text(&config);
            let ordered = if config.ordered { ", ordered" } else { "" };
            let version = admin.create_queue(&create.queue, config.clone()).await?;
            Ok(Output::message(
                format!(
                    "created queue {} ({} partitions{ordered}{window})",
                    create.queue, create.partitions
                ),
                json!({
                    "queue": create.queue,
                    "partitions": create.partitions,
                    "retention_ms": config.retention_ms,
                    "retention_bytes": config.retention_bytes,
                    "ordered": config.ordered,
                    "assignment_version": version.0,
                }),
            ))
        }
        QueueCommand::List => Ok(render_queue_list(&admin.list_queues().await?)),
        QueueCommand::Describe { queue } => {
            Ok(render_describe(&admin.describe_queue(queue).await?))
        }
        QueueCommand::Resize { queue, partitions } => {
            let key_version = admin.resize_queue(queue, *partitions).await?;
            Ok(Output::message(
                format!(
                    "resized queue {queue} to {partitions} partitions (key map version \
                     {key_version}); the added partitions hand out their messages once the \
                     older ones finished what they held (`spool queue describe {queue}`)"
                ),
                json!({"queue": queue, "partitions": partitions, "key_version": key_version}),
            ))
        }
        QueueCommand::Delete { queue, yes } => {
            confirm(*yes, &format!("delete queue {queue} and all its messages?"))?;
            admin.delete_queue(queue).await?;
            Ok(Output::message(format!("deleted queue {queue}"), json!({"deleted": queue})))
        }
    }
}

/// `spool stats`: each queue's counts, summed over its partitions.
pub async fn stats(admin: &Admin, stats: &StatsArgs) -> Result<Output, Failure> {
    let names = match &stats.queue {
        Some(queue) => vec![queue.clone()],
        None => admin.list_queues().await?.into_iter().map(|queue| queue.name).collect(),
    };
    let mut described = Vec::new();
    for name in names {
        described.push(admin.describe_queue(&name).await?);
    }
    Ok(render_stats(&described))
}

fn render_queue_list(queues: &[spool_client::spool_wire::proto::QueueSummary]) -> Output {
    let mut table = Table::new(vec!["queue", "partitions"]);
    for queue in queues {
        table.push(vec![queue.name.clone(), queue.partitions.to_string()]);
    }
    let json = queues
        .iter()
        .map(|queue| json!({"queue": queue.name, "partitions": queue.partitions}))
        .collect();
    Output::table(table, Value::Array(json))
}

fn partition_row_json(stats: &spool_client::spool_wire::proto::PartitionStats) -> Value {
    json!({
        "partition": stats.partition.0,
        "ready": stats.ready,
        "scheduled": stats.scheduled,
        "claimed": stats.claimed,
        "quarantined": stats.quarantined,
        "expired": stats.expired,
        "acked": stats.acked,
        "bytes": stats.bytes,
        "oldest_ready_age_ms": stats.oldest_ready_age_ms,
        "released": stats.released,
        "lease_expired": stats.lease_expired,
        "retained_messages": stats.retained.messages,
        "retained_bytes": stats.retained.bytes,
        "oldest_retained_age_ms": stats.retained.oldest_age_ms,
        "lane_active_keys": stats.lanes.active_keys,
        "lane_blocked_keys": stats.lanes.blocked_keys,
        "lane_waiting": stats.lanes.waiting,
        "lane_oldest_waiting_age_ms": stats.lanes.oldest_waiting_age_ms,
        "lane_blocked_longest_key": String::from_utf8_lossy(&stats.lanes.blocked_longest_key),
        "replication": stats.replication.map(|replication| json!({
            "leader_node": replication.leader_node,
            "term": replication.term,
            "committed_index": replication.committed_index,
            "lag_entries": replication.lag_entries,
        })),
    })
}

const COUNT_HEADERS: [&str; 7] =
    ["ready", "scheduled", "claimed", "quarantined", "expired", "acked", "bytes"];

fn count_cells(stats: &spool_client::spool_wire::proto::PartitionStats) -> Vec<String> {
    [
        stats.ready,
        stats.scheduled,
        stats.claimed,
        stats.quarantined,
        stats.expired,
        stats.acked,
        stats.bytes,
    ]
    .iter()
    .map(u64::to_string)
    .collect()
}

/// `, retention window …` for a queue with one, else nothing.
fn window_text(config: &QueueConfig) -> String {
    match (config.retention_ms, config.retention_bytes) {
        (0, 0) => String::new(),
        (ms, 0) => format!(", retention window {ms} ms"),
        (0, bytes) => format!(", retention window {bytes} bytes"),
        (ms, bytes) => format!(", retention window {ms} ms / {bytes} bytes"),
    }
}

/// What a queue with a window keeps for replay, over its partitions.
fn retained_text(partitions: &[PartitionStats]) -> String {
    let messages: u64 = partitions.iter().map(|stats| stats.retained.messages).sum();
    let bytes: u64 = partitions.iter().map(|stats| stats.retained.bytes).sum();
    let oldest = partitions.iter().map(|stats| stats.retained.oldest_age_ms).max().unwrap_or(0);
    format!("; retained {messages} messages ({bytes} bytes), oldest {oldest} ms")
}

/// An ordered queue's lanes over its partitions: keys, waiting messages,
/// and the key blocked longest (the rendering escapes its control
/// characters).
fn lanes_text(partitions: &[PartitionStats]) -> String {
    let mut lanes = LaneStats::default();
    for stats in partitions {
        lanes.merge(&stats.lanes);
    }
    let mut text = format!(
        "; lanes: {} active keys, {} blocked, {} waiting",
        lanes.active_keys, lanes.blocked_keys, lanes.waiting
    );
    if lanes.waiting > 0 {
        let key = String::from_utf8_lossy(&lanes.blocked_longest_key);
        text.push_str(&format!(", oldest waiting {} ms (key {key})", lanes.oldest_waiting_age_ms));
    }
    text
}

fn render_describe(described: &spool_client::spool_wire::proto::DescribeQueueResponse) -> Output {
    let window = described.config.has_window();
    let ordered = described.config.ordered;
    let mut headers = vec!["partition"];
    headers.extend(COUNT_HEADERS);
    if window {
        headers.push("retained");
    }
    if ordered {
        headers.extend(["keys", "blocked", "waiting"]);
    }
    // A cluster's partitions: who leads, in which term, how far behind the
    // slowest replica is.
    let replicated = described.partitions.iter().any(|stats| stats.replication.is_some());
    if replicated {
        headers.extend(["leader", "term", "lag"]);
    }
    let mut table = Table::new(headers);
    for stats in &described.partitions {
        let mut row = vec![stats.partition.0.to_string()];
        row.extend(count_cells(stats));
        if window {
            row.push(stats.retained.messages.to_string());
        }
        if ordered {
            row.extend(
                [stats.lanes.active_keys, stats.lanes.blocked_keys, stats.lanes.waiting]
                    .iter()
                    .map(u64::to_string),
            );
        }
        if replicated {
            row.extend(match stats.replication {
                Some(replication) => [
                    replication.leader_node.to_string(),
                    replication.term.to_string(),
                    replication.lag_entries.to_string(),
                ],
                None => ["-".to_owned(), "-".to_owned(), "-".to_owned()],
            });
        }
        table.push(row);
    }
    let config = &described.config;
    let keys = &described.keys;
    let holding = if keys.draining.is_empty() {
        String::new()
    } else {
        let draining: Vec<String> =
            keys.draining.iter().map(|partition| partition.0.to_string()).collect();
        format!(
            "; resized: partitions {}.. held until partitions {} drain",
            keys.held_from,
            draining.join(",")
        )
    };
    let retained = if window { retained_text(&described.partitions) } else { String::new() };
    let lanes = if ordered { lanes_text(&described.partitions) } else { String::new() };
    let message = format!(
        "queue {}: {}{} partitions, {} priority bands, lease {} ms ({}..{}), max deliveries {}{}, \
         key map v{}{holding}{retained}{lanes}",
        described.name,
        if ordered { "ordered, " } else { "" },
        config.partitions,
        config.priority_bands,
        config.lease_default_ms,
        config.lease_min_ms,
        config.lease_max_ms,
        config.max_deliveries,
        window_text(config),
        keys.version,
    );
    let json = json!({
        "queue": described.name,
        "config": {
            "partitions": config.partitions,
            "priority_bands": config.priority_bands,
            "lease_default_ms": config.lease_default_ms,
            "lease_min_ms": config.lease_min_ms,
            "lease_max_ms": config.lease_max_ms,
            "max_lease_lifetime_ms": config.max_lease_lifetime_ms,
            "max_deliveries": config.max_deliveries,
            "dedupe_window_ms": config.dedupe_window_ms,
            "max_messages": config.max_messages,
            "max_bytes": config.max_bytes,
            "dead_letter_on_expiry": config.dead_letter_on_expiry,
            "retention_ms": config.retention_ms,
            "retention_bytes": config.retention_bytes,
            "ordered": config.ordered,
        },
        "partitions": described.partitions.iter().map(partition_row_json).collect::<Vec<_>>(),
        "keys": {
            "version": keys.version,
            "held_from": keys.held_from,
            "draining": keys.draining.iter().map(|partition| partition.0).collect::<Vec<_>>(),
        },
    });
    Output { message: Some(message), ..Output::table(table, json) }
}

fn render_stats(described: &[spool_client::spool_wire::proto::DescribeQueueResponse]) -> Output {
    let mut headers = vec!["queue"];
    headers.extend(COUNT_HEADERS);
    let mut table = Table::new(headers);
    let mut json = Vec::new();
    for queue in described {
        let mut total = spool_client::spool_wire::proto::PartitionStats {
            partition: PartitionId(0),
            ready: 0,
            scheduled: 0,
            claimed: 0,
            quarantined: 0,
            expired: 0,
            acked: 0,
            bytes: 0,
            oldest_ready_age_ms: 0,
            released: 0,
            lease_expired: 0,
            replication: None,
            retained: spool_client::spool_wire::proto::RetainedStats::default(),
            lanes: LaneStats::default(),
        };
        for stats in &queue.partitions {
            total.ready += stats.ready;
            total.scheduled += stats.scheduled;
            total.claimed += stats.claimed;
            total.quarantined += stats.quarantined;
            total.expired += stats.expired;
            total.acked += stats.acked;
            total.bytes += stats.bytes;
            total.oldest_ready_age_ms = total.oldest_ready_age_ms.max(stats.oldest_ready_age_ms);
            total.released += stats.released;
            total.lease_expired += stats.lease_expired;
            total.retained.messages += stats.retained.messages;
            total.retained.bytes += stats.retained.bytes;
            total.retained.oldest_age_ms =
                total.retained.oldest_age_ms.max(stats.retained.oldest_age_ms);
            total.lanes.merge(&stats.lanes);
        }
        let mut row = vec![queue.name.clone()];
        row.extend(count_cells(&total));
        table.push(row);
        let mut value = partition_row_json(&total);
        if let Value::Object(map) = &mut value {
            map.remove("partition");
            map.insert("queue".to_owned(), Value::String(queue.name.clone()));
        }
        json.push(value);
    }
    Output::table(table, Value::Array(json))
}

#[cfg(test)]
mod tests {
    use spool_client::spool_wire::proto::QueueSummary;

    use super::*;
    use crate::render::{escape, StreamTable};

    // Goal: tables align columns and carry no trailing spaces. Method: render
    // a two-row table and compare with the exact text.
    #[test]
    fn table_rendering_is_aligned() {
        let output = render_queue_list(&[
            QueueSummary { name: "jobs".into(), partitions: 4 },
            QueueSummary { name: "emails-high".into(), partitions: 12 },
        ]);
        assert_eq!(
            output.render(false),
            "queue        partitions\njobs         4\nemails-high  12\n"
        );
    }

    // Goal: --json prints one machine-readable value with the same content.
    // Method: parse the JSON rendering back and check fields.
    #[test]
    fn json_rendering_matches_the_table() {
        let output = render_queue_list(&[QueueSummary { name: "jobs".into(), partitions: 4 }]);
        let value: Value = serde_json::from_str(&output.render(true)).unwrap();
        assert_eq!(value, json!([{"queue": "jobs", "partitions": 4}]));
    }
    fn partition(index: u32, retained: u64) -> PartitionStats {
        PartitionStats {
            partition: PartitionId(index),
            ready: 1,
            scheduled: 0,
            claimed: 0,
            quarantined: 0,
            expired: 0,
            acked: 0,
            bytes: 8,
            oldest_ready_age_ms: 0,
            released: 0,
            lease_expired: 0,
            replication: None,
            retained: spool_client::spool_wire::proto::RetainedStats {
                messages: retained,
                bytes: retained * 100,
                oldest_age_ms: retained * 1000,
            },
            lanes: LaneStats::default(),
        }
    }

    fn described(config: QueueConfig) -> spool_client::spool_wire::proto::DescribeQueueResponse {
        spool_client::spool_wire::proto::DescribeQueueResponse {
            name: "events".into(),
            config,
            partitions: vec![partition(0, 3), partition(1, 5)],
            keys: spool_client::spool_wire::proto::KeyMapStats {
                version: 1,
                draining: vec![],
                held_from: 2,
            },
            subscriptions: vec![],
        }
    }

    // Goal: `spool queue describe` of a queue with a retention window shows
    // the window, the records retained per partition and over the queue
    // (the oldest's age the largest), and --json carries the window; a
    // queue without one shows neither. Method: render both.
    #[test]
    fn describe_shows_the_retention_window() {
        let config = QueueConfig {
            retention_ms: 60_000,
            retention_bytes: 1 << 20,
            ..default_queue_config(2)
        };
        let output = render_describe(&described(config));
        let text = output.render(false);
        assert!(text.contains("retention window 60000 ms / 1048576 bytes"), "{text}");
        assert!(text.contains("retained 8 messages (800 bytes), oldest 5000 ms"), "{text}");
        let header = text.lines().next().unwrap();
        assert!(header.ends_with("retained"), "{header}");
        assert!(text.lines().nth(2).unwrap().ends_with(" 5"), "{text}");
        let json: Value = serde_json::from_str(&output.render(true)).unwrap();
        assert_eq!(json["config"]["retention_ms"], 60_000);
        assert_eq!(json["config"]["retention_bytes"], 1 << 20);
        assert_eq!(json["partitions"][1]["retained_messages"], 5);
        assert_eq!(json["partitions"][1]["oldest_retained_age_ms"], 5000);

        let plain = render_describe(&described(default_queue_config(2))).render(false);
        assert!(!plain.contains("retention") && !plain.contains("retained"), "{plain}");
        let by_time = QueueConfig { retention_ms: 2_000, ..default_queue_config(1) };
        assert_eq!(window_text(&by_time), ", retention window 2000 ms");
    }

    // Goal: `spool queue describe` of an ordered queue says so, shows each
    // partition's keys, blocked keys and waiting messages, and over the
    // queue the key blocked longest (the oldest waiting message's, escaped)
    // with its age; --json carries `ordered` and the lane fields; an
    // unordered queue shows none of it; `--ordered` parses. Method: render
    // both, parse the flag.
    #[test]
    fn describe_shows_ordered_lanes() {
        use clap::Parser;
        let mut answer = described(QueueConfig { ordered: true, ..default_queue_config(2) });
        answer.partitions[0].lanes = LaneStats {
            active_keys: 4,
            blocked_keys: 2,
            waiting: 6,
            oldest_waiting_age_ms: 300,
            blocked_longest_key: b"chair-2".to_vec(),
        };
        answer.partitions[1].lanes = LaneStats {
            active_keys: 1,
            blocked_keys: 1,
            waiting: 1,
            oldest_waiting_age_ms: 900,
            blocked_longest_key: b"chair\x1b4".to_vec(),
        };
        let output = render_describe(&answer);
        let text = output.render(false);
        assert!(text.contains("events: ordered, 2 partitions"), "{text}");
        assert!(
            text.contains("lanes: 5 active keys, 3 blocked, 7 waiting, oldest waiting 900 ms"),
            "{text}"
        );
        assert!(text.contains("(key chair\\x1b4)") && !text.contains('\x1b'), "{text}");
        assert!(text.lines().next().unwrap().ends_with("keys  blocked  waiting"), "{text}");
        let json: Value = serde_json::from_str(&output.render(true)).unwrap();
        assert_eq!(json["config"]["ordered"], true);
        assert_eq!(json["partitions"][0]["lane_blocked_keys"], 2);
        assert_eq!(json["partitions"][0]["lane_blocked_longest_key"], "chair-2");
        let plain = render_describe(&described(default_queue_config(2))).render(false);
        assert!(!plain.contains("ordered") && !plain.contains("lanes"), "{plain}");
        let cli = crate::args::Cli::try_parse_from(["spool", "queue", "create", "q", "--ordered"]);
        let crate::args::Command::Queue(QueueCommand::Create(create)) = cli.unwrap().command else {
            panic!("not queue create")
        };
        assert!(create.ordered);
    }

    // Goal: `spool queue create` takes the window as --retention-ms and
    // --retention-bytes (none when absent); method: parse both forms.
    #[test]
    fn create_takes_a_retention_window() {
        use clap::Parser;
        let create = |line: &[&str]| {
            let cli = crate::args::Cli::try_parse_from(line).unwrap();
            let crate::args::Command::Queue(QueueCommand::Create(create)) = cli.command else {
                panic!("not queue create: {line:?}")
            };
            create
        };
        let line = ["spool", "queue", "create", "events", "--retention-ms", "60000"];
        let windowed = create(&line);
        assert_eq!((windowed.retention_ms, windowed.retention_bytes), (Some(60_000), None));
        let line = ["spool", "queue", "create", "events", "--retention-bytes", "1048576"];
        assert_eq!(create(&line).retention_bytes, Some(1 << 20));
        let plain = create(&["spool", "queue", "create", "events"]);
        assert_eq!((plain.retention_ms, plain.retention_bytes), (None, None));
    }

    // Goal: no control character of a payload, key, reason or queue name
    // reaches the terminal through a table; JSON keeps the exact text.
    // Method: render a dead-letter row and a queue list holding an OSC title
    // sequence, a clear-screen sequence, CR, backspace, a C1 control and a
    // bidi override; check the visible escapes and the JSON.
    #[test]
    fn tables_escape_control_characters() {
        let nasty = "\x1b]0;title\x07|\x1b[2J|\r\x08|\u{9b}|\u{202e}|a\\b";
        let visible = r"\x1b]0;title\x07|\x1b[2J|\r\x08|\u{9b}|\u{202e}|a\\b";
        assert_eq!(escape(nasty), visible);
        assert_eq!(escape("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
        let mut table = Table::new(vec!["routing_key", "last_reason"]);
        table.push(vec![nasty.to_owned(), format!("reason {nasty}")]);
        let text = Output::table(table, json!([{"reason": nasty}])).render(false);
        assert!(
            text.chars().all(|character| character == '\n' || !character.is_control()),
            "{text:?}"
        );
        assert!(!text.contains('\u{202e}'));
        assert!(text.contains(visible), "{text}");
        let queues = render_queue_list(&[QueueSummary { name: nasty.into(), partitions: 1 }]);
        assert!(queues.render(false).contains(visible));
        let value: Value = serde_json::from_str(&queues.render(true)).unwrap();
        assert_eq!(value[0]["queue"], nasty, "JSON is exact");
        let row = StreamTable::fitting(vec!["payload"], &[]).row(&[nasty.to_owned()]);
        assert_eq!(row, format!("{visible}\n"));
    }
}
