//! `omb`: runs an OpenMessaging Benchmark workload file against Spool.
//!
//! What it owns: reading an OMB workload YAML, mapping it onto the load
//! engine (a topic is a queue, a subscription's consumers are workers), and
//! the list of fields it does not support. What it does not do: OMB's
//! driver files, warm-up phase, max-rate discovery (`producerRate: 0`) or
//! consumer-backlog builds; every field it does not map is **reported**
//! (stderr and the JSON's `unsupported`), never silently dropped.
//!
//! Mapping: `topics` queues of `partitionsPerTopic` partitions;
//! `producersPerTopic` open-loop producers per queue sharing `producerRate`
//! (msgs/s over all topics, as in OMB) at `messageSize` bytes;
//! `consumerPerSubscription` consumers per queue, each with `--slots` slots
//! and the given service time (default 0: ack at once, as OMB consumers
//! do); `testDurationMinutes` of load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::load::{
    self, LoadConfig, LoadError, OmbResult, PercentilesMs, Phase, PhaseEnd, QueueResult, Sample,
};

/// Largest workload file read.
pub const WORKLOAD_BYTES_MAX: u64 = 1 << 20;
/// Longest test duration accepted (minutes).
pub const DURATION_MINUTES_MAX: f64 = 24.0 * 60.0;
/// The fields this runner maps (OMB's names).
pub const SUPPORTED_FIELDS: [&str; 8] = [
    "name",
    "topics",
    "partitionsPerTopic",
    "messageSize",
    "producersPerTopic",
    "consumerPerSubscription",
    "producerRate",
    "testDurationMinutes",
];

/// Why a workload cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OmbError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is {len_bytes} bytes, more than {WORKLOAD_BYTES_MAX}", path.display())]
    TooLarge { path: PathBuf, len_bytes: u64 },
    #[error("not an OMB workload (YAML mapping): {0}")]
    Yaml(String),
    #[error("workload field {field}: {problem}")]
    Field { field: &'static str, problem: String },
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// The supported part of an OMB workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    pub name: Option<String>,
    pub topics: u32,
    pub partitions_per_topic: u32,
    pub message_size: u64,
    pub producers_per_topic: u32,
    pub consumer_per_subscription: u32,
    /// msgs/s over all topics.
    pub producer_rate: f64,
    pub test_duration_minutes: f64,
}

/// A parsed file: what runs, and what does not.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedWorkload {
    pub workload: Workload,
    /// Every other top-level field with its value.
    pub unsupported: BTreeMap<String, Value>,
}

fn field_error(field: &'static str, problem: impl Into<String>) -> OmbError {
    OmbError::Field { field, problem: problem.into() }
}

/// The file as written: the supported fields typed (absent is `None`), every
/// other top-level field kept with its value. Ranges, defaults and the
/// relations between fields are checked by [`parse`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawWorkload {
    #[serde(default, deserialize_with = "scalar_as_string")]
    name: Option<String>,
    topics: Option<u64>,
    partitions_per_topic: Option<u64>,
    message_size: Option<u64>,
    producers_per_topic: Option<u64>,
    consumer_per_subscription: Option<u64>,
    producer_rate: Option<f64>,
    test_duration_minutes: Option<f64>,
    #[serde(flatten)]
    unsupported: BTreeMap<String, Value>,
}

/// A `name` of any scalar (`name: 100` is a number in YAML) as its text.
fn scalar_as_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::Null => None,
        Value::String(name) => Some(name),
        other => Some(other.to_string()),
    })
}

fn required<T>(value: Option<T>, field: &'static str) -> Result<T, OmbError> {
    value.ok_or_else(|| field_error(field, "missing"))
}

fn in_range(value: u64, field: &'static str, max: u32) -> Result<u32, OmbError> {
    match u32::try_from(value) {
        Ok(value) if (1..=max).contains(&value) => Ok(value),
        _ => Err(field_error(field, format!("{value} is outside 1..={max}"))),
    }
}

/// Parses workload YAML.
///
/// # Errors
/// Not a YAML mapping, a supported field missing, of the wrong type or out of
/// range (each names the field), or `producerRate: 0` (OMB's max-rate
/// discovery, which this runner lacks).
pub fn parse(text: &str) -> Result<ParsedWorkload, OmbError> {
    let deserializer = serde_norway::Deserializer::from_str(text);
    let raw: RawWorkload = serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match SUPPORTED_FIELDS.iter().find(|field| **field == path) {
            Some(field) => field_error(field, inner.to_string()),
            None => OmbError::Yaml(inner.to_string()),
        }
    })?;
    let producer_rate = required(raw.producer_rate, "producerRate")?;
    if !(producer_rate > 0.0 && producer_rate <= load::RATE_MAX) {
        return Err(field_error(
            "producerRate",
            format!(
                "{producer_rate}: must be in (0, {}]; OMB's 0 (find the max rate) is not \
                 supported, use `spool-bench throughput` for that",
                load::RATE_MAX
            ),
        ));
    }
    let test_duration_minutes = required(raw.test_duration_minutes, "testDurationMinutes")?;
    if !(test_duration_minutes > 0.0 && test_duration_minutes <= DURATION_MINUTES_MAX) {
        return Err(field_error(
            "testDurationMinutes",
            format!("{test_duration_minutes} is outside (0, {DURATION_MINUTES_MAX}]"),
        ));
    }
    let workload = Workload {
        name: raw.name,
        topics: in_range(required(raw.topics, "topics")?, "topics", load::QUEUES_MAX)?,
        partitions_per_topic: in_range(
            required(raw.partitions_per_topic, "partitionsPerTopic")?,
            "partitionsPerTopic",
            spool_client::spool_wire::proto::limits::PARTITIONS_MAX,
        )?,
        message_size: required(raw.message_size, "messageSize")?,
        producers_per_topic: in_range(
            raw.producers_per_topic.unwrap_or(1),
            "producersPerTopic",
            load::PRODUCERS_MAX,
        )?,
        consumer_per_subscription: in_range(
            raw.consumer_per_subscription.unwrap_or(1),
            "consumerPerSubscription",
            load::CONSUMERS_PER_QUEUE_MAX,
        )?,
        producer_rate,
        test_duration_minutes,
    };
    let total = u64::from(workload.topics) * u64::from(workload.partitions_per_topic);
    if total > load::PARTITIONS_TOTAL_MAX {
        return Err(field_error(
            "partitionsPerTopic",
            format!(
                "{} topics × {} partitions = {total} partitions, over the broker's {} per node",
                workload.topics,
                workload.partitions_per_topic,
                load::PARTITIONS_TOTAL_MAX
            ),
        ));
    }
    Ok(ParsedWorkload { workload, unsupported: raw.unsupported })
}

/// Reads and parses a workload file.
///
/// # Errors
/// See [`parse`]; also an unreadable or oversized file.
pub fn read(path: &Path) -> Result<ParsedWorkload, OmbError> {
    let read_error = |source| OmbError::Read { path: path.to_owned(), source };
    let len_bytes = std::fs::metadata(path).map_err(read_error)?.len();
    if len_bytes > WORKLOAD_BYTES_MAX {
        return Err(OmbError::TooLarge { path: path.to_owned(), len_bytes });
    }
    parse(&std::fs::read_to_string(path).map_err(read_error)?)
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct OmbConfig {
    /// Engine settings; queues, partitions, producers, consumers, message
    /// size and phases come from the workload.
    pub load: LoadConfig,
    pub workload_file: PathBuf,
    pub parsed: ParsedWorkload,
    /// Slots per consumer.
    pub slots_per_consumer: u32,
    /// Replaces `testDurationMinutes` (e.g. for a short check).
    pub duration_s: Option<f64>,
}

/// One OMB run, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct OmbReport {
    pub scenario: &'static str,
    pub workload_file: PathBuf,
    pub workload: Workload,
    /// Fields of the file this runner does not map, with their values.
    pub unsupported: BTreeMap<String, Value>,
    pub duration_s: f64,
    /// OMB's result fields (ms, msgs/s).
    #[serde(flatten)]
    pub omb: OmbResult,
    pub publish_latency_ms: PercentilesMs,
    pub e2e_latency_ms: PercentilesMs,
    pub queue: QueueResult,
    pub errors: BTreeMap<String, u64>,
    pub queues: Vec<String>,
    pub slots_per_consumer: u32,
    pub addr: String,
    pub spoold_started: bool,
    pub series: Vec<Sample>,
}

/// Runs the workload.
///
/// # Errors
/// A workload the engine cannot run (e.g. `messageSize` below 8 bytes: the
/// send-time prefix) or a failed load run.
pub fn run(config: &OmbConfig) -> Result<OmbReport, OmbError> {
    let workload = &config.parsed.workload;
    let seconds = config.duration_s.unwrap_or(workload.test_duration_minutes * 60.0);
    let mut load = config.load.clone();
    load.queues = workload.topics;
    load.partitions = Some(workload.partitions_per_topic);
    load.msg_bytes = workload.message_size;
    load.producers_per_queue = workload.producers_per_topic;
    load.consumers_per_queue = workload.consumer_per_subscription;
    load.expected_s = seconds;
    load.phases = vec![Phase {
        name: "omb".to_owned(),
        seconds,
        rate_per_s: workload.producer_rate,
        slots: workload
            .topics
            .saturating_mul(workload.consumer_per_subscription)
            .saturating_mul(config.slots_per_consumer),
        end: PhaseEnd::Elapsed,
    }];
    let outcome = load::run(&load)?;
    Ok(OmbReport {
        scenario: "omb",
        workload_file: config.workload_file.clone(),
        workload: workload.clone(),
        unsupported: config.parsed.unsupported.clone(),
        duration_s: outcome.duration_s,
        omb: outcome.omb(),
        publish_latency_ms: outcome.publish_latency_ms,
        e2e_latency_ms: outcome.e2e_latency_ms,
        queue: outcome.queue(),
        errors: outcome.errors.clone(),
        queues: outcome.queues.clone(),
        slots_per_consumer: config.slots_per_consumer,
        addr: outcome.addr.clone(),
        spoold_started: outcome.spoold_started,
        series: outcome.series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "\
name: 1 topic / 4 partitions / 1kb
topics: 1
partitionsPerTopic: 4
messageSize: 1024
payloadFile: payload/payload-1Kb.data
subscriptionsPerTopic: 1
consumerPerSubscription: 2
producersPerTopic: 2
producerRate: 5000
consumerBacklogSizeGB: 0
testDurationMinutes: 5
";

    #[test]
    fn supported_fields_map_and_the_rest_are_listed() {
        // Goal: the seven OMB fields (plus name) are read with their values and every other
        // field is kept, with its value, in `unsupported`. Method: a file like OMB's own.
        let parsed = parse(FULL).unwrap();
        let workload = &parsed.workload;
        assert_eq!(workload.name.as_deref(), Some("1 topic / 4 partitions / 1kb"));
        assert_eq!(workload.topics, 1);
        assert_eq!(workload.partitions_per_topic, 4);
        assert_eq!(workload.message_size, 1024);
        assert_eq!(workload.producers_per_topic, 2);
        assert_eq!(workload.consumer_per_subscription, 2);
        assert_eq!(workload.producer_rate, 5000.0);
        assert_eq!(workload.test_duration_minutes, 5.0);
        let unsupported: Vec<&str> = parsed.unsupported.keys().map(String::as_str).collect();
        assert_eq!(unsupported, ["consumerBacklogSizeGB", "payloadFile", "subscriptionsPerTopic"]);
        assert_eq!(parsed.unsupported["payloadFile"], "payload/payload-1Kb.data");
    }

    #[test]
    fn missing_zero_and_malformed_fields_are_errors() {
        // Goal: a workload that cannot be run as written fails with the field's name.
        let without = |field: &str| {
            FULL.lines().filter(|line| !line.starts_with(field)).collect::<Vec<_>>().join("\n")
        };
        for field in ["topics", "partitionsPerTopic", "messageSize", "producerRate"] {
            match parse(&without(field)) {
                Err(OmbError::Field { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Defaults where OMB has them.
        let parsed = parse(&without("producersPerTopic")).unwrap();
        assert_eq!(parsed.workload.producers_per_topic, 1);
        let zero_rate = FULL.replace("producerRate: 5000", "producerRate: 0");
        assert!(matches!(parse(&zero_rate), Err(OmbError::Field { field: "producerRate", .. })));
        let bad = FULL.replace("topics: 1", "topics: many");
        assert!(matches!(parse(&bad), Err(OmbError::Field { field: "topics", .. })));
        assert!(matches!(parse("- a\n- b\n"), Err(OmbError::Yaml(_))));
    }

    #[test]
    fn type_errors_name_the_field_and_what_was_found() {
        // Goal: a wrongly typed field fails with its name and the parser's description of
        // the value (and where it is), a numeric `name` is kept as text, and a nested
        // unsupported field keeps its structure. Method: FULL with one field changed.
        let bad = FULL.replace("producerRate: 5000", "producerRate: fast");
        let error = parse(&bad).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, OmbError::Field { field: "producerRate", .. }), "{message}");
        assert!(message.contains("invalid type") && message.contains("fast"), "{message}");
        assert!(message.contains("line 9"), "{message}");
        let numeric_name = FULL.replace("name: 1 topic / 4 partitions / 1kb", "name: 100");
        assert_eq!(parse(&numeric_name).unwrap().workload.name.as_deref(), Some("100"));
        let nested = format!("{FULL}extra:\n  a: [1, 2]\n");
        assert_eq!(parse(&nested).unwrap().unsupported["extra"], serde_json::json!({"a": [1, 2]}));
        match parse("topics: [1]\n") {
            Err(OmbError::Field { field: "topics", problem }) => {
                assert!(problem.contains("invalid type"), "{problem}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn topic_counts_up_to_the_broker_limits_are_accepted() {
        // Goal: OMB's 100- and 1k-topic workloads parse (`topics: 100` was refused as outside
        // 1..=64), and counts past the broker's queues-per-node or partitions-per-node limits
        // are refused naming the field. Method: FULL with its topic and partition counts changed.
        for topics in [100, 1_000] {
            let text = FULL
                .replace("topics: 1\n", &format!("topics: {topics}\n"))
                .replace("partitionsPerTopic: 4", "partitionsPerTopic: 1");
            assert_eq!(parse(&text).unwrap().workload.topics, topics);
        }
        let over_queues =
            FULL.replace("topics: 1\n", &format!("topics: {}\n", load::QUEUES_MAX + 1));
        assert!(matches!(parse(&over_queues), Err(OmbError::Field { field: "topics", .. })));
        let over_partitions = FULL.replace("topics: 1\n", "topics: 2501\n");
        assert!(matches!(
            parse(&over_partitions),
            Err(OmbError::Field { field: "partitionsPerTopic", .. })
        ));
    }

    #[test]
    fn committed_sample_workloads_parse() {
        // Goal: every file under bench/workloads/ is a runnable workload; method: parse each.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|ext| ext.to_str()) != Some("yaml") {
                continue;
            }
            let parsed = read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            assert!(parsed.workload.message_size >= load::TIMESTAMP_BYTES as u64);
            count += 1;
        }
        assert!(count >= 2, "expected the sample workloads in {}", dir.display());
    }
}
