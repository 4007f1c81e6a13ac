//! `spool metrics QUEUE`: a queue's key figures from the admin port's
//! `/metrics` (Prometheus/OpenMetrics text, parsed here line by line with
//! label escapes), per partition and in total: ready, scheduled, claimed,
//! dead-lettered, oldest ready age, and — from two scrapes `--interval-ms`
//! apart — enqueue and ack rates and the predicted drain time (ready plus
//! claimed messages over the ack rate). `/metrics` needs no credentials.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use spool_client::limits::METRICS_INTERVAL_MS_DEFAULT;
use spool_client::TlsConfig;

use crate::acl::AdminAddr;
use crate::http::call;
use crate::render::{Output, Table};
use crate::{Failure, EXIT_TRANSPORT};

#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Queue name.
    pub queue: String,
    /// Time between the two scrapes that give the rates; 0: one scrape, no
    /// rates.
    #[arg(long, default_value_t = METRICS_INTERVAL_MS_DEFAULT)]
    pub interval_ms: u64,
    #[command(flatten)]
    pub admin: AdminAddr,
}

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus text or OpenMetrics text: `# HELP`/`# TYPE`/`# UNIT`/
/// `# EOF` and comments are skipped; a sample is a name, optional labels
/// (`"` values with `\\`, `\"` and `\n` escapes), a value (`+Inf`, `-Inf`,
/// `NaN` included) and an optional timestamp or exemplar, ignored.
///
/// # Errors
/// The first line that is not a sample, with its number.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(parse_line(line).map_err(|error| format!("line {}: {error}", index + 1))?);
    }
    Ok(samples)
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("no metric name in {line:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let mut consumed = None;
        loop {
            while chars.peek().is_some_and(|(_, c)| *c == ',' || c.is_whitespace()) {
                chars.next();
            }
            match chars.peek() {
                Some((at, '}')) => {
                    consumed = Some(at + 1);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut label = String::new();
            while let Some((_, c)) = chars.peek() {
                if *c == '=' {
                    break;
                }
                label.push(*c);
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('=')
                || chars.next().map(|(_, c)| c) != Some('"')
            {
                return Err(format!("label {label:?} has no quoted value"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, escaped)) => value.push(escaped),
                        None => return Err("a label value is cut".to_owned()),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err("a label value is cut".to_owned()),
                }
            }
            labels.insert(label.trim().to_owned(), value);
        }
        let consumed = consumed.ok_or("the label set is not closed")?;
        rest = &inner[consumed..];
    }
    let value_text = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value_text {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        number => number.parse::<f64>().map_err(|_| format!("bad value {number:?}"))?,
    };
    Ok(Sample { name: name.to_owned(), labels, value })
}

/// One partition's figures from one scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Figures {
    ready: f64,
    scheduled: f64,
    claimed: f64,
    dead_letter: f64,
    oldest_ready_age_s: f64,
    enqueued: f64,
    acked: f64,
}

/// The queue's figures by partition number.
fn figures_of(samples: &[Sample], queue: &str) -> BTreeMap<u32, Figures> {
    let mut partitions: BTreeMap<u32, Figures> = BTreeMap::new();
    for sample in samples {
        if sample.labels.get("queue").map(String::as_str) != Some(queue) {
            continue;
        }
        let Some(partition) = sample.labels.get("partition").and_then(|p| p.parse().ok()) else {
            continue;
        };
        let figures = partitions.entry(partition).or_default();
        let slot = match sample.name.as_str() {
            "spool_ready_messages" => &mut figures.ready,
            "spool_scheduled_messages" => &mut figures.scheduled,
            "spool_claimed_messages" => &mut figures.claimed,
            "spool_dead_letter_messages" => &mut figures.dead_letter,
            "spool_oldest_ready_age_seconds" => &mut figures.oldest_ready_age_s,
            "spool_enqueued_messages_total" => &mut figures.enqueued,
            "spool_acked_messages_total" => &mut figures.acked,
            _ => continue,
        };
        *slot = sample.value;
    }
    partitions
}

async fn scrape(
    args: &MetricsArgs,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Vec<Sample>, Failure> {
    let answer = call(&args.admin.admin, tls, "GET", "/metrics", None, None, timeout)
        .await
        .map_err(|error| Failure::Admin(error, EXIT_TRANSPORT))?;
    if answer.status != 200 {
        return Err(Failure::Admin(answer.refusal(), EXIT_TRANSPORT));
    }
    let text = String::from_utf8(answer.body)
        .map_err(|_| Failure::Admin("/metrics is not UTF-8".to_owned(), EXIT_TRANSPORT))?;
    parse(&text).map_err(|error| Failure::Admin(format!("/metrics: {error}"), EXIT_TRANSPORT))
}

/// A row's rates over the interval (`None`: one scrape only).
#[derive(Debug, Clone, Copy)]
struct Rates {
    enqueue: f64,
    ack: f64,
}

fn rates(before: &Figures, after: &Figures, seconds: f64) -> Rates {
    Rates {
        enqueue: (after.enqueued - before.enqueued).max(0.0) / seconds,
        ack: (after.acked - before.acked).max(0.0) / seconds,
    }
}

/// Seconds to drain ready and claimed messages at the ack rate.
fn drain_seconds(figures: &Figures, rates: Option<Rates>) -> Option<f64> {
    let backlog = figures.ready + figures.claimed;
    match rates {
        _ if backlog == 0.0 => Some(0.0),
        Some(rates) if rates.ack > 0.0 => Some(backlog / rates.ack),
        _ => None,
    }
}

fn cells(label: String, figures: &Figures, rates: Option<Rates>) -> (Vec<String>, Value) {
    let rate = |value: Option<f64>| value.map_or("-".to_owned(), |value| format!("{value:.1}"));
    let drain = drain_seconds(figures, rates);
    let row = vec![
        label.clone(),
        format!("{}", figures.ready),
        format!("{}", figures.scheduled),
        format!("{}", figures.claimed),
        format!("{}", figures.dead_letter),
        format!("{:.1}", figures.oldest_ready_age_s),
        rate(rates.map(|rates| rates.enqueue)),
        rate(rates.map(|rates| rates.ack)),
        match (drain, rates) {
            (Some(seconds), _) => format!("{seconds:.0}"),
            (None, Some(_)) => "never (no acks)".to_owned(),
            (None, None) => "-".to_owned(),
        },
    ];
    let json = json!({
        "partition": label,
        "ready": figures.ready,
        "scheduled": figures.scheduled,
        "claimed": figures.claimed,
        "dead_lettered": figures.dead_letter,
        "oldest_ready_age_seconds": figures.oldest_ready_age_s,
        "enqueue_per_second": rates.map(|rates| rates.enqueue),
        "ack_per_second": rates.map(|rates| rates.ack),
        "drain_seconds": drain,
    });
    (row, json)
}

/// `spool metrics QUEUE`.
pub async fn run(
    args: &MetricsArgs,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let first = figures_of(&scrape(args, tls, timeout).await?, &args.queue);
    let (last, seconds) = if args.interval_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
        (
            figures_of(&scrape(args, tls, timeout).await?, &args.queue),
            Some(args.interval_ms as f64 / 1000.0),
        )
    } else {
        (first.clone(), None)
    };
    if last.is_empty() {
        return Err(Failure::Admin(
            format!("no series for queue {} on /metrics (no such queue?)", args.queue),
            crate::EXIT_REFUSED,
        ));
    }
    let mut table = Table::new(vec![
        "partition",
        "ready",
        "scheduled",
        "claimed",
        "dead_lettered",
        "oldest_ready_s",
        "enqueue/s",
        "ack/s",
        "drain_s",
    ]);
    let mut rows = Vec::new();
    let mut total = Figures::default();
    let mut total_rates = seconds.map(|_| Rates { enqueue: 0.0, ack: 0.0 });
    for (partition, figures) in &last {
        let partition_rates =
            seconds.map(|seconds| rates(first.get(partition).unwrap_or(figures), figures, seconds));
        if let (Some(sum), Some(add)) = (total_rates.as_mut(), partition_rates) {
            sum.enqueue += add.enqueue;
            sum.ack += add.ack;
        }
        total.ready += figures.ready;
        total.scheduled += figures.scheduled;
        total.claimed += figures.claimed;
        total.dead_letter += figures.dead_letter;
        total.oldest_ready_age_s = total.oldest_ready_age_s.max(figures.oldest_ready_age_s);
        let (row, json) = cells(partition.to_string(), figures, partition_rates);
        table.push(row);
        rows.push(json);
    }
    let (row, total_json) = cells("all".to_owned(), &total, total_rates);
    table.push(row);
    Ok(Output::table(
        table,
        json!({ "queue": args.queue, "total": total_json, "partitions": rows }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the parser reads what prometheus-client writes (OpenMetrics
    // with `# EOF`, units, `_total`), label escapes, special values and
    // timestamps; the figures pick the queue's series by exact label.
    #[test]
    fn parses_exposition_and_picks_the_queue() {
        let text = "# HELP spool_ready_messages Main-lane messages ready to claim.\n\
# TYPE spool_ready_messages gauge\n\
spool_ready_messages{queue=\"jobs\",partition=\"0\"} 7\n\
spool_ready_messages{queue=\"jobs\",partition=\"1\"} 3 1700000000\n\
spool_ready_messages{queue=\"jobs2\",partition=\"0\"} 100\n\
spool_ready_messages{queue=\"we\\\"ird\\\\ q\\n\",partition=\"0\",} 1\n\
spool_acked_messages_total{queue=\"jobs\",partition=\"0\"} 1.5e3\n\
spool_oldest_ready_age_seconds{partition=\"1\",queue=\"jobs\"} 2.25\n\
spool_shard_fdatasync_duration_seconds_bucket{shard=\"0\",le=\"+Inf\"} 4\n\
spool_x NaN\n\
spool_y +Inf\n\
# EOF\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 9);
        assert_eq!(samples[3].labels["queue"], "we\"ird\\ q\n");
        assert!(samples[7].value.is_nan());
        assert_eq!(samples[8].value, f64::INFINITY);
        assert_eq!(samples[6].labels["le"], "+Inf");
        let figures = figures_of(&samples, "jobs");
        assert_eq!(figures.len(), 2);
        assert_eq!(figures[&0].ready, 7.0);
        assert_eq!(figures[&0].acked, 1500.0);
        assert_eq!(figures[&1].ready, 3.0);
        assert_eq!(figures[&1].oldest_ready_age_s, 2.25);
        assert!(parse("spool_ready_messages{queue=\"jobs\" 1\n").is_err());
        assert!(parse("{queue=\"x\"} 1\n").is_err());
        assert!(parse("spool_a{q=\"x\"} one\n").is_err());
    }

    #[test]
    fn drain_time_is_backlog_over_ack_rate() {
        let figures = Figures { ready: 90.0, claimed: 10.0, ..Figures::default() };
        assert_eq!(drain_seconds(&figures, Some(Rates { enqueue: 0.0, ack: 20.0 })), Some(5.0));
        assert_eq!(drain_seconds(&figures, Some(Rates { enqueue: 0.0, ack: 0.0 })), None);
        assert_eq!(drain_seconds(&Figures::default(), None), Some(0.0));
    }
}
