//! `spool`: the command line client. Parses arguments (`args`), runs one
//! command through `spool_client`, prints a table or JSON (`render`), and
//! exits non-zero with the error code's name on failure. It holds no state
//! between runs.
//!
//! Exit codes: 0 success, 1 the broker refused (message names the code),
//! 2 usage error, 3 connection/timeout/protocol trouble, 4 declined at a
//! confirmation prompt.

mod args;
mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use spool_client::spool_wire::batch::{validate_record, BatchBytes, MessageId};
use spool_client::spool_wire::proto::{
    Offset, PartitionId, PeekedMessage, RedriveTarget, WorkerId,
};
use spool_client::{
    default_queue_config, Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig,
    Delivery, Message, PayloadView, Producer, ProducerConfig,
};

use args::{Cli, Command, DlqCommand, PeekArgs, QueueCommand, RecvArgs, SendArgs};
use render::{show_bytes, Output, Table};

const EXIT_REFUSED: u8 = 1;
const EXIT_TRANSPORT: u8 = 3;
const EXIT_DECLINED: u8 = 4;

/// Most stdin lines one `spool send` reads, so a runaway pipe is bounded.
const STDIN_MESSAGES_MAX: usize = 1_000_000;

/// A command's failure: a client error, or the user said no.
#[derive(Debug)]
enum Failure {
    Client(ClientError),
    Declined,
    Input(String),
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        Self::Client(error)
    }
}

fn exit_code(failure: &Failure) -> u8 {
    match failure {
        Failure::Declined => EXIT_DECLINED,
        Failure::Input(_) => 2,
        Failure::Client(error) => match error {
            ClientError::Io { .. }
            | ClientError::ConnectionClosed { .. }
            | ClientError::Timeout { .. }
            | ClientError::Protocol(_) => EXIT_TRANSPORT,
            _ => EXIT_REFUSED,
        },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::from(EXIT_TRANSPORT);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(output) => {
            print!("{}", output.render(cli.json));
            ExitCode::SUCCESS
        }
        Err(failure) => {
            match &failure {
                Failure::Client(error) => eprintln!("error: {error}"),
                Failure::Declined => eprintln!("aborted"),
                Failure::Input(message) => eprintln!("error: {message}"),
            }
            ExitCode::from(exit_code(&failure))
        }
    }
}

async fn run(cli: &Cli) -> Result<Output, Failure> {
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_millis(cli.timeout_ms.max(1)),
            ..ConnectionConfig::default()
        },
    };
    let client = Client::connect_with(&cli.addr, config).await?;
    let admin = Admin::new(client.clone());
    match &cli.command {
        Command::Queue(QueueCommand::Create(create)) => {
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
            let version = admin.create_queue(&create.queue, config).await?;
            Ok(Output::message(
                format!("created queue {} ({} partitions)", create.queue, create.partitions),
                json!({"queue": create.queue, "partitions": create.partitions, "assignment_version": version.0}),
            ))
        }
        Command::Queue(QueueCommand::List) => Ok(render_queue_list(&admin.list_queues().await?)),
        Command::Queue(QueueCommand::Describe { queue }) => {
            Ok(render_describe(&admin.describe_queue(queue).await?))
        }
        Command::Queue(QueueCommand::Delete { queue, yes }) => {
            confirm(*yes, &format!("delete queue {queue} and all its messages?"))?;
            admin.delete_queue(queue).await?;
            Ok(Output::message(format!("deleted queue {queue}"), json!({"deleted": queue})))
        }
        Command::Send(send) => run_send(client, send).await,
        Command::Recv(recv) => run_recv(&client, recv).await,
        Command::Peek(peek) => {
            let mut rows = Vec::new();
            for partition in partitions_of(&client, &peek.queue, peek.partition).await? {
                let messages =
                    admin.peek(&peek.queue, partition, Offset(peek.from), peek.count).await?;
                rows.extend(messages.into_iter().map(|message| (partition, message)));
            }
            Ok(render_peek(&rows))
        }
        Command::Purge(purge) => {
            let partitions = partitions_of(&client, &purge.queue, purge.partition).await?;
            let mut count = 0u64;
            for &partition in &partitions {
                count += admin.purge(&purge.queue, partition, true).await?;
            }
            confirm(purge.yes, &format!("purge {count} messages from {}?", purge.queue))?;
            let mut purged = 0u64;
            for &partition in &partitions {
                purged += admin.purge(&purge.queue, partition, false).await?;
            }
            Ok(Output::message(
                format!("purged {purged} messages from {} (dry run counted {count})", purge.queue),
                json!({"queue": purge.queue, "dry_run_count": count, "purged": purged}),
            ))
        }
        Command::Dlq(DlqCommand::List(list)) => run_dlq_list(&client, &admin, list).await,
        Command::Dlq(DlqCommand::Redrive { queue, partition, offsets }) => {
            let mut count = 0u64;
            for partition in partitions_of(&client, queue, *partition).await? {
                let target = if offsets.is_empty() {
                    RedriveTarget::All
                } else {
                    RedriveTarget::Offsets(offsets.iter().map(|&offset| Offset(offset)).collect())
                };
                count += admin.redrive(queue, partition, target).await?;
            }
            Ok(Output::message(
                format!("redrove {count} dead letters of {queue}"),
                json!({"queue": queue, "redriven": count}),
            ))
        }
        Command::Stats(stats) => {
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
    }
}

/// Asks on the terminal unless `yes`; refuses without a terminal.
fn confirm(yes: bool, question: &str) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::Input(format!("{question} (not a terminal: pass --yes)")));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer).map_err(|error| Failure::Input(error.to_string()))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure::Declined)
    }
}

async fn partitions_of(
    client: &Client,
    queue: &str,
    only: Option<u32>,
) -> Result<Vec<PartitionId>, Failure> {
    if let Some(partition) = only {
        return Ok(vec![PartitionId(partition)]);
    }
    let count = client.partitions(queue).await?.len();
    Ok((0..count).map(|partition| PartitionId(partition as u32)).collect())
}

async fn run_send(client: Client, send: &SendArgs) -> Result<Output, Failure> {
    let bodies: Vec<Vec<u8>> = if let Some(data) = &send.data {
        vec![data.clone().into_bytes()]
    } else if let Some(path) = &send.file {
        let bytes = std::fs::read(path)
            .map_err(|error| Failure::Input(format!("{}: {error}", path.display())))?;
        vec![bytes]
    } else {
        let mut lines = Vec::new();
        for line in std::io::stdin().lock().lines() {
            let line = line.map_err(|error| Failure::Input(format!("stdin: {error}")))?;
            if lines.len() == STDIN_MESSAGES_MAX {
                return Err(Failure::Input(format!("more than {STDIN_MESSAGES_MAX} lines")));
            }
            lines.push(line.into_bytes());
        }
        lines
    };
    let producer = Producer::new(client, ProducerConfig::default())?;
    let mut pending = Vec::new();
    for body in bodies {
        let mut message = Message::new(body).priority(send.priority).delay_ms(send.delay_ms);
        if let Some(key) = &send.key {
            message = message.key(key.as_bytes().to_vec());
        }
        pending.push(producer.submit(&send.queue, message).await?);
    }
    let mut table = Table::new(vec!["offset"]);
    let mut offsets = Vec::new();
    for future in pending {
        let offset = future.await?;
        table.push(vec![offset.0.to_string()]);
        offsets.push(offset.0);
    }
    Ok(Output::table(table, json!({"queue": send.queue, "offsets": offsets})))
}

async fn run_recv(client: &Client, recv: &RecvArgs) -> Result<Output, Failure> {
    let partitions = partitions_of(client, &recv.queue, None).await?;
    let mut received: Vec<Delivery> = Vec::new();
    let worker = WorkerId(rand_worker());
    // One sweep over the partitions without waiting, then one waiting sweep.
    for wait_ms in [0, recv.wait_ms] {
        for &partition in &partitions {
            let remaining = recv.count.saturating_sub(received.len() as u32);
            if remaining == 0 {
                break;
            }
            let options = ClaimOptions {
                worker,
                credits: remaining,
                max_bytes: spool_client::limits::CLAIM_BYTES_DEFAULT,
                lease_ms: recv.lease_ms,
                wait_ms: if partitions.len() == 1 { recv.wait_ms } else { wait_ms },
            };
            received.extend(client.claim(&recv.queue, partition, &options).await?.deliveries);
        }
        if !received.is_empty() {
            break;
        }
    }
    let mut outcomes = Vec::new();
    for delivery in &received {
        let outcome = if recv.no_ack {
            let reason = "released by spool recv --no-ack";
            client
                .release(delivery.queue(), delivery.partition(), delivery.token(), 0, reason)
                .await?;
            "released"
        } else {
            let codes =
                client.ack(delivery.queue(), delivery.partition(), &[delivery.token()]).await?;
            match codes.first() {
                Some(code) if *code == spool_client::spool_wire::ErrorCode::None => "acked",
                Some(code) => code.name(),
                None => "no result",
            }
        };
        outcomes.push(outcome);
    }
    Ok(render_deliveries(&received, &outcomes))
}

fn rand_worker() -> u64 {
    // A per-process worker id: std's RandomState is seeded randomly per process.
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

async fn run_dlq_list(client: &Client, admin: &Admin, list: &PeekArgs) -> Result<Output, Failure> {
    let mut table =
        Table::new(vec!["partition", "offset", "attempts", "routing_key", "last_reason"]);
    let mut entries = Vec::new();
    for partition in partitions_of(client, &list.queue, list.partition).await? {
        for letter in
            admin.dead_letters(&list.queue, partition, Offset(list.from), list.count).await?
        {
            table.push(vec![
                partition.0.to_string(),
                letter.original_offset.0.to_string(),
                letter.attempts.to_string(),
                letter.routing_key.clone(),
                letter.last_reason.clone(),
            ]);
            entries.push(json!({
                "partition": partition.0,
                "offset": letter.original_offset.0,
                "attempts": letter.attempts,
                "routing_key": letter.routing_key,
                "last_reason": letter.last_reason,
                "enqueued_at_ms": letter.enqueued_at_ms,
                "quarantined_at_ms": letter.quarantined_at_ms,
            }));
        }
    }
    Ok(Output::table(table, Value::Array(entries)))
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

fn render_describe(described: &spool_client::spool_wire::proto::DescribeQueueResponse) -> Output {
    let mut headers = vec!["partition"];
    headers.extend(COUNT_HEADERS);
    let mut table = Table::new(headers);
    for stats in &described.partitions {
        let mut row = vec![stats.partition.0.to_string()];
        row.extend(count_cells(stats));
        table.push(row);
    }
    let config = &described.config;
    let message = format!(
        "queue {}: {} partitions, {} priority bands, lease {} ms ({}..{}), max deliveries {}",
        described.name,
        config.partitions,
        config.priority_bands,
        config.lease_default_ms,
        config.lease_min_ms,
        config.lease_max_ms,
        config.max_deliveries
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
        },
        "partitions": described.partitions.iter().map(partition_row_json).collect::<Vec<_>>(),
    });
    Output { table: Some(table), message: Some(message), json }
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

/// Text for a payload: inline bytes as text (or hex), a reference by location.
fn payload_text(payload: PayloadView<'_>) -> String {
    match payload {
        PayloadView::Inline(bytes) => show_bytes(bytes),
        PayloadView::Reference { location, len_bytes, .. } => {
            format!("<ref {location} {len_bytes} bytes>")
        }
    }
}

fn message_id_hex(id: MessageId) -> String {
    id.0.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn render_deliveries(deliveries: &[Delivery], outcomes: &[&str]) -> Output {
    let mut table = Table::new(vec!["partition", "offset", "attempt", "key", "payload", "result"]);
    let mut json = Vec::new();
    for (delivery, outcome) in deliveries.iter().zip(outcomes) {
        let payload = payload_text(delivery.payload());
        let key = show_bytes(delivery.routing_key());
        table.push(vec![
            delivery.partition().0.to_string(),
            delivery.offset().0.to_string(),
            delivery.attempt().to_string(),
            key.clone(),
            payload.clone(),
            (*outcome).to_owned(),
        ]);
        json.push(json!({
            "partition": delivery.partition().0,
            "offset": delivery.offset().0,
            "attempt": delivery.attempt(),
            "generation": delivery.generation().0,
            "message_id": message_id_hex(delivery.message_id()),
            "key": key,
            "payload": payload,
            "result": outcome,
        }));
    }
    Output::table(table, Value::Array(json))
}

fn render_peek(messages: &[(PartitionId, PeekedMessage)]) -> Output {
    let mut table = Table::new(vec!["partition", "offset", "state", "attempt", "key", "payload"]);
    let mut json = Vec::new();
    for (partition, message) in messages {
        // Peeked records arrive as plain bytes; rkyv needs them 8-aligned.
        let mut aligned = BatchBytes::with_capacity(message.record.len());
        aligned.extend_from_slice(&message.record);
        let (key, payload) = match validate_record(&aligned) {
            Ok(record) => (
                show_bytes(record.routing_key.as_slice()),
                match &record.payload {
                    spool_client::spool_wire::batch::ArchivedPayload::Inline(bytes) => {
                        show_bytes(bytes.as_slice())
                    }
                    spool_client::spool_wire::batch::ArchivedPayload::Reference(reference) => {
                        format!("<ref {}>", reference.location.as_str())
                    }
                },
            ),
            Err(error) => (String::new(), format!("<invalid record: {error}>")),
        };
        let state = format!("{:?}", message.state).to_lowercase();
        table.push(vec![
            partition.0.to_string(),
            message.offset.0.to_string(),
            state.clone(),
            message.attempt.to_string(),
            key.clone(),
            payload.clone(),
        ]);
        json.push(json!({
            "partition": partition.0,
            "offset": message.offset.0,
            "state": state,
            "attempt": message.attempt,
            "key": key,
            "payload": payload,
        }));
    }
    Output::table(table, Value::Array(json))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};
    use spool_client::spool_wire::proto::{MessageState, QueueSummary};
    use spool_client::spool_wire::ErrorCode;

    use super::*;

    // Goal: global flags, defaults and subcommands parse as documented.
    // Method: parse representative command lines and inspect the result.
    #[test]
    fn parses_commands_and_defaults() {
        let cli = Cli::try_parse_from(["spool", "queue", "list"]).unwrap();
        assert_eq!(cli.addr, "127.0.0.1:7400");
        assert!(!cli.json);
        assert!(matches!(cli.command, Command::Queue(QueueCommand::List)));

        let cli = Cli::try_parse_from([
            "spool",
            "send",
            "jobs",
            "hello",
            "--key",
            "k1",
            "--priority",
            "2",
            "--delay-ms",
            "500",
            "--addr",
            "10.0.0.1:7401",
            "--json",
        ])
        .unwrap();
        assert_eq!(cli.addr, "10.0.0.1:7401");
        assert!(cli.json);
        let Command::Send(send) = cli.command else { panic!("not send") };
        assert_eq!(send.queue, "jobs");
        assert_eq!(send.data.as_deref(), Some("hello"));
        assert_eq!(send.key.as_deref(), Some("k1"));
        assert_eq!((send.priority, send.delay_ms), (2, 500));

        let cli = Cli::try_parse_from(["spool", "recv", "jobs", "-n", "5", "--no-ack"]).unwrap();
        let Command::Recv(recv) = cli.command else { panic!("not recv") };
        assert_eq!((recv.count, recv.no_ack, recv.lease_ms), (5, true, 30_000));

        let cli = Cli::try_parse_from(["spool", "purge", "jobs", "--yes"]).unwrap();
        let Command::Purge(purge) = cli.command else { panic!("not purge") };
        assert!(purge.yes);
        assert_eq!(purge.partition, None);

        let cli = Cli::try_parse_from([
            "spool",
            "dlq",
            "redrive",
            "jobs",
            "--partition",
            "1",
            "--offset",
            "4",
            "--offset",
            "9",
        ])
        .unwrap();
        let Command::Dlq(DlqCommand::Redrive { offsets, partition, .. }) = cli.command else {
            panic!("not redrive")
        };
        assert_eq!((offsets, partition), (vec![4, 9], Some(1)));
    }

    // Goal: invalid command lines are rejected by the parser. Method: DATA
    // together with --file, a redrive offset without a partition, a
    // missing queue.
    #[test]
    fn rejects_bad_command_lines() {
        assert!(Cli::try_parse_from(["spool", "send", "q", "data", "--file", "f"]).is_err());
        assert!(Cli::try_parse_from(["spool", "dlq", "redrive", "q", "--offset", "3"]).is_err());
        assert!(Cli::try_parse_from(["spool", "recv"]).is_err());
        assert!(Cli::try_parse_from(["spool", "frobnicate"]).is_err());
    }

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

    // Goal: peek shows key, payload and state from the archived record, hex
    // for binary payloads. Method: archive two records and render them.
    #[test]
    fn peek_rendering_reads_records() {
        let record = |payload: Vec<u8>| {
            let mut builder = DataBatchBuilder::new();
            builder
                .push(&Record {
                    message_id: MessageId([3; 16]),
                    routing_key: b"user-1".to_vec(),
                    headers: Vec::new(),
                    payload: Payload::Inline(payload),
                    priority: 0,
                    not_before_ms: 0,
                    expiry_ms: 0,
                    enqueue_time_ms: 1,
                })
                .unwrap();
            let batch = builder.finish().unwrap();
            let view = spool_client::spool_wire::batch::BatchView::validate(&batch).unwrap();
            view.record_bytes(0).to_vec()
        };
        let messages = vec![
            (
                PartitionId(0),
                PeekedMessage {
                    offset: Offset(7),
                    state: MessageState::Ready,
                    attempt: 0,
                    record: record(b"hi".to_vec()),
                },
            ),
            (
                PartitionId(1),
                PeekedMessage {
                    offset: Offset(8),
                    state: MessageState::Claimed,
                    attempt: 2,
                    record: record(vec![0xff, 0x00]),
                },
            ),
        ];
        let output = render_peek(&messages);
        let table = output.table.clone().unwrap();
        assert_eq!(table.rows[0], ["0", "7", "ready", "0", "user-1", "hi"]);
        assert_eq!(table.rows[1], ["1", "8", "claimed", "2", "user-1", "0xff00"]);
        assert_eq!(output.json[1]["state"], "claimed");
    }

    // Goal: failures map onto the documented exit codes and messages name the
    // error code. Method: classify representative errors.
    #[test]
    fn exit_codes_and_messages() {
        let refused =
            ClientError::Server { code: ErrorCode::QueueNotFound, message: "no q".into() };
        assert_eq!(refused.to_string(), "QUEUE_NOT_FOUND: no q");
        assert_eq!(exit_code(&Failure::Client(refused)), EXIT_REFUSED);
        assert_eq!(
            exit_code(&Failure::Client(ClientError::Timeout { timeout_ms: 5 })),
            EXIT_TRANSPORT
        );
        assert_eq!(exit_code(&Failure::Declined), EXIT_DECLINED);
        let unknown = ClientError::UnknownQueue("q".into());
        assert!(unknown.to_string().starts_with("QUEUE_NOT_FOUND"));
        assert_eq!(exit_code(&Failure::Client(unknown)), EXIT_REFUSED);
    }
}
