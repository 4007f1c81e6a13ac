//! `spool`: the command line client. Parses arguments (`args`), runs one
//! command through `spool_client`, prints a table or JSON (`render`), and
//! exits non-zero with the error code's name on failure. It holds no state
//! between runs.
//!
//! Exit codes: 0 success, 1 the broker refused (message names the code),
//! 2 usage error, 3 connection/timeout/protocol trouble, 4 declined at a
//! confirmation prompt.

mod acl;
mod args;
mod http;
mod metrics;
mod quota;
mod render;

use std::collections::VecDeque;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use spool_client::spool_wire::batch::{validate_record, BatchBytes, MessageId};
use spool_client::spool_wire::proto::{Offset, PartitionId, PeekedMessage, RedriveTarget};
use spool_client::{
    default_queue_config, Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig,
    Credentials, Delivery, Message, PayloadView, Producer, ProducerConfig, SendFuture,
};
use tokio::sync::mpsc;

use args::{
    AuditArgs, AuthCommand, Cli, Command, DlqCommand, PeekArgs, QueueCommand, QuotaCommand,
    RecvArgs, SendArgs,
};
use render::{escape, show_bytes, Output, StreamTable, Table};
use spool_client::limits::{LINE_BYTES_MAX, SEND_IN_FLIGHT_MAX, STDIN_READ_AHEAD_LINES};

/// The broker's audit log inside its data directory (the broker's
/// `auth::audit::AUDIT_FILE_NAME`; the client does not depend on the broker).
const AUDIT_FILE_NAME: &str = "audit.log";

pub(crate) const EXIT_REFUSED: u8 = 1;
pub(crate) const EXIT_TRANSPORT: u8 = 3;
const EXIT_DECLINED: u8 = 4;

/// A command's failure: a client error, or the user said no.
#[derive(Debug)]
pub(crate) enum Failure {
    Client(ClientError),
    Declined,
    Input(String),
    /// The admin port refused (or could not be reached): the message and
    /// the exit code.
    Admin(String, u8),
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
        Failure::Admin(_, exit) => *exit,
        Failure::Client(error) => match error {
            ClientError::Io { .. }
            | ClientError::ConnectionClosed { .. }
            | ClientError::Timeout { .. }
            | ClientError::Tls { .. }
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
                Failure::Input(message) | Failure::Admin(message, _) => {
                    eprintln!("error: {message}")
                }
            }
            ExitCode::from(exit_code(&failure))
        }
    }
}

/// The credentials from `--principal`/`--secret`, else `SPOOL_PRINCIPAL`/
/// `SPOOL_SECRET`; none when no principal is given.
fn credentials(cli: &Cli) -> Result<Option<Credentials>, Failure> {
    let principal = cli.principal.clone().or_else(|| std::env::var("SPOOL_PRINCIPAL").ok());
    let Some(principal) = principal.filter(|name| !name.is_empty()) else { return Ok(None) };
    let secret = cli.secret.clone().or_else(|| std::env::var("SPOOL_SECRET").ok());
    match secret.filter(|secret| !secret.is_empty()) {
        Some(secret) => Ok(Some(Credentials::new(principal, secret))),
        None => Err(Failure::Input(format!(
            "principal {principal} given without a secret (--secret or SPOOL_SECRET)"
        ))),
    }
}

/// The admin port's answer time: the command's timeout, plus the broker's
/// own bound on a reload's wait for every shard.
fn admin_timeout(cli: &Cli) -> Duration {
    Duration::from_millis(cli.timeout_ms.max(1)) + Duration::from_secs(10)
}

/// The TLS options from `--tls-*`, else `SPOOL_TLS_*`; none without a CA.
fn tls(cli: &Cli) -> Result<Option<spool_client::TlsConfig>, Failure> {
    let env = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    let path = |flag: &Option<std::path::PathBuf>, name: &str| {
        flag.clone().or_else(|| env(name).map(std::path::PathBuf::from))
    };
    let ca = path(&cli.tls_ca, "SPOOL_TLS_CA");
    let cert = path(&cli.tls_cert, "SPOOL_TLS_CERT");
    let key = path(&cli.tls_key, "SPOOL_TLS_KEY");
    let server_name = cli
        .tls_server_name
        .clone()
        .or_else(|| env("SPOOL_TLS_SERVER_NAME").map(|name| name.to_string_lossy().into_owned()));
    spool_client::tls::from_options(
        ca.as_deref(),
        server_name.as_deref(),
        cert.as_deref(),
        key.as_deref(),
    )
    .map_err(|error| Failure::Input(error.to_string()))
}

/// `spool auth hash-secret`: one stdin line in, its PHC string out.
fn hash_secret_from_stdin() -> Result<Output, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|error| Failure::Input(format!("cannot read the secret from stdin: {error}")))?;
    let secret = line.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(Failure::Input("empty secret on stdin".to_owned()));
    }
    let hash = spool_client::auth::hash_secret(secret)?;
    Ok(Output::message(hash.clone(), json!({ "secret_hash": hash })))
}

/// `spool audit`: the broker's audit log, oldest first.
fn audit(args: &AuditArgs) -> Result<Output, Failure> {
    let path = match (&args.file, &args.data_dir) {
        (Some(file), _) => file.clone(),
        (None, Some(dir)) => dir.join(AUDIT_FILE_NAME),
        (None, None) => return Err(Failure::Input("--data-dir or --file".to_owned())),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|error| Failure::Input(format!("cannot read {}: {error}", path.display())))?;
    let mut entries: Vec<Value> = Vec::new();
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    for (index, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(entry) => entries.push(entry),
            // A torn last line (the broker crashed mid-append) is skipped.
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(error) => {
                return Err(Failure::Input(format!(
                    "{}: line {}: {error}",
                    path.display(),
                    index + 1
                )))
            }
        }
    }
    if let Some(queue) = &args.queue {
        entries.retain(|entry| entry["queue"].as_str() == Some(queue.as_str()));
    }
    let mut table = Table::new(vec![
        "time_ms",
        "principal",
        "operation",
        "queue",
        "partition",
        "count",
        "outcome",
    ]);
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for entry in &entries {
        table.push(
            ["time_ms", "principal", "operation", "queue", "partition", "count", "outcome"]
                .iter()
                .map(|field| text(&entry[*field]))
                .collect(),
        );
    }
    Ok(Output::table(table, Value::Array(entries)))
}

async fn run(cli: &Cli) -> Result<Output, Failure> {
    match &cli.command {
        Command::Auth(AuthCommand::HashSecret) => return hash_secret_from_stdin(),
        Command::Audit(args) => return audit(args),
        Command::Auth(AuthCommand::Reload(admin)) => {
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return acl::reload(admin, tls.as_ref(), credentials.as_ref(), admin_timeout(cli))
                .await;
        }
        Command::Acl(command) => {
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return acl::run(command, tls.as_ref(), credentials.as_ref(), admin_timeout(cli)).await;
        }
        Command::Metrics(args) => {
            return metrics::run(args, tls(cli)?.as_ref(), admin_timeout(cli)).await
        }
        Command::Quota(QuotaCommand::List(admin)) => {
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return quota::list(admin, tls.as_ref(), credentials.as_ref(), admin_timeout(cli))
                .await;
        }
        _ => {}
    }
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_millis(cli.timeout_ms.max(1)),
            credentials: credentials(cli)?,
            tls: tls(cli)?,
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
            if let Some(window_ms) = create.dedupe_window_ms {
                config.dedupe_window_ms = window_ms;
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
        Command::Send(send) => run_send(client, send, cli.json).await.map(|()| Output::streamed()),
        Command::Recv(recv) => run_recv(&client, recv, cli.json).await.map(|()| Output::streamed()),
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
        Command::Auth(_)
        | Command::Audit(_)
        | Command::Acl(_)
        | Command::Metrics(_)
        | Command::Quota(_) => {
            unreachable!("answered before connecting")
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

/// Where `send`'s messages come from.
enum SendInput {
    /// One message: DATA or --file.
    One(Vec<u8>),
    /// One message per stdin line, read by a thread as they arrive.
    Lines(mpsc::Receiver<Result<Vec<u8>, String>>),
}

/// A message submitted but not yet acknowledged, in input order.
struct Pending {
    /// 1-based position in the input.
    line: u64,
    future: SendFuture,
}

/// Enqueues DATA, a file, or each stdin line, and prints one row (or JSON
/// object) per message as the broker acknowledges it, in input order, each
/// flushed at once: interrupted at any point, the output lists exactly the
/// messages the broker acknowledged so far. After a failed message it reads
/// no further input but still prints every earlier message that gets
/// acknowledged, then fails.
async fn run_send(client: Client, send: &SendArgs, json: bool) -> Result<(), Failure> {
    let mut input = if let Some(data) = &send.data {
        SendInput::One(data.clone().into_bytes())
    } else if let Some(path) = &send.file {
        let bytes = std::fs::read(path)
            .map_err(|error| Failure::Input(format!("{}: {error}", path.display())))?;
        SendInput::One(bytes)
    } else {
        SendInput::Lines(read_lines(std::io::stdin()))
    };
    let with_line = matches!(input, SendInput::Lines(_));
    let producer = Producer::new(client, ProducerConfig::default())?;
    let mut out = Printer::new(json);
    let table = StreamTable::fitting(vec!["partition", "offset"], &[]);
    out.header(&table);
    let submit = |body: Vec<u8>| {
        let mut message = Message::new(body).priority(send.priority).delay_ms(send.delay_ms);
        if let Some(key) = &send.key {
            message = message.key(key.as_bytes().to_vec());
        }
        producer.submit(&send.queue, message)
    };
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut lines_read = 0u64;
    let mut first_failure: Option<Failure> = None;
    let mut failed = 0u64;
    let mut reading = true;
    loop {
        // Input is read while fewer than SEND_IN_FLIGHT_MAX messages wait for
        // their acknowledgement and nothing has failed yet.
        let room = reading && first_failure.is_none() && pending.len() < SEND_IN_FLIGHT_MAX;
        tokio::select! {
            biased;
            result = async {
                match pending.front_mut() {
                    Some(front) => (&mut front.future).await,
                    None => std::future::pending().await,
                }
            }, if !pending.is_empty() => {
                let Some(done) = pending.pop_front() else { continue };
                match result {
                    Ok(offset) => out.sent(&table, &send.queue, done.future.partition(), offset, with_line.then_some(done.line)),
                    Err(error) => {
                        failed += 1;
                        first_failure.get_or_insert(Failure::Client(error));
                    }
                }
                // Print everything else already acknowledged, then flush once.
                while let Some(front) = pending.front_mut() {
                    let Some(result) = futures_lite::future::poll_once(&mut front.future).await else { break };
                    let Some(done) = pending.pop_front() else { break };
                    match result {
                        Ok(offset) => out.sent(&table, &send.queue, done.future.partition(), offset, with_line.then_some(done.line)),
                        Err(error) => {
                            failed += 1;
                            first_failure.get_or_insert(Failure::Client(error));
                        }
                    }
                }
                out.flush()?;
            }
            body = next_body(&mut input), if room => {
                match body {
                    None => reading = false,
                    Some(Err(message)) => {
                        reading = false;
                        first_failure.get_or_insert(Failure::Input(message));
                    }
                    Some(Ok(body)) => {
                        lines_read += 1;
                        match submit(body).await {
                            Ok(future) => pending.push_back(Pending { line: lines_read, future }),
                            Err(error) => {
                                failed += 1;
                                first_failure.get_or_insert(Failure::Client(error));
                            }
                        }
                    }
                }
            }
            else => break,
        }
    }
    out.flush()?;
    match first_failure {
        None => Ok(()),
        Some(failure) => {
            if failed > 1 {
                eprintln!("{failed} messages were not acknowledged");
            }
            Err(failure)
        }
    }
}

/// The next message body of `input`, `None` at its end.
async fn next_body(input: &mut SendInput) -> Option<Result<Vec<u8>, String>> {
    match input {
        SendInput::One(body) => {
            let body = std::mem::take(body);
            *input = SendInput::Lines(closed_channel());
            Some(Ok(body))
        }
        SendInput::Lines(lines) => lines.recv().await,
    }
}

/// A receiver that is already at its end.
fn closed_channel() -> mpsc::Receiver<Result<Vec<u8>, String>> {
    let (_, receiver) = mpsc::channel(1);
    receiver
}

/// Reads `source` line by line on a thread of its own (stdin blocks), each
/// line without its `\n` (or `\r\n`), at most [`LINE_BYTES_MAX`] bytes.
fn read_lines(
    source: impl std::io::Read + Send + 'static,
) -> mpsc::Receiver<Result<Vec<u8>, String>> {
    let (sender, receiver) = mpsc::channel(STDIN_READ_AHEAD_LINES);
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(source);
        loop {
            let mut line = Vec::new();
            let limit = (LINE_BYTES_MAX + 2) as u64;
            let read = match (&mut reader).take(limit).read_until(b'\n', &mut line) {
                Ok(read) => read,
                Err(error) => {
                    let _ = sender.blocking_send(Err(format!("stdin: {error}")));
                    return;
                }
            };
            if read == 0 {
                return;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            } else if line.len() > LINE_BYTES_MAX {
                let message = format!("stdin: a line is longer than {LINE_BYTES_MAX} bytes");
                let _ = sender.blocking_send(Err(message));
                return;
            }
            if sender.blocking_send(Ok(line)).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Prints streamed rows: table lines or JSON Lines, flushed on demand.
struct Printer {
    json: bool,
    stdout: std::io::BufWriter<std::io::Stdout>,
    /// A write failed (stdout closed): later writes are skipped, `flush`
    /// reports it.
    broken: Option<std::io::Error>,
}

impl Printer {
    fn new(json: bool) -> Self {
        Self { json, stdout: std::io::BufWriter::new(std::io::stdout()), broken: None }
    }

    fn write(&mut self, text: &str) {
        if self.broken.is_none() {
            if let Err(error) = self.stdout.write_all(text.as_bytes()) {
                self.broken = Some(error);
            }
        }
    }

    /// The table's header (nothing in JSON mode).
    fn header(&mut self, table: &StreamTable) {
        if !self.json {
            self.write(&table.header());
        }
    }

    /// One table row, or one JSON object on its own line.
    fn row(&mut self, table: &StreamTable, cells: &[String], json: &Value) {
        if self.json {
            let mut line = json.to_string();
            line.push('\n');
            self.write(&line);
        } else {
            self.write(&table.row(cells));
        }
    }

    fn sent(
        &mut self,
        table: &StreamTable,
        queue: &str,
        partition: PartitionId,
        offset: Offset,
        line: Option<u64>,
    ) {
        let mut json = json!({"queue": queue, "partition": partition.0, "offset": offset.0});
        if let (Some(line), Value::Object(map)) = (line, &mut json) {
            map.insert("line".to_owned(), Value::from(line));
        }
        self.row(table, &[partition.0.to_string(), offset.0.to_string()], &json);
    }

    fn flush(&mut self) -> Result<(), Failure> {
        if self.broken.is_none() {
            if let Err(error) = self.stdout.flush() {
                self.broken = Some(error);
            }
        }
        match &self.broken {
            None => Ok(()),
            Some(error) => Err(Failure::Input(format!("stdout: {error}"))),
        }
    }
}

/// Claims up to `count` messages from any partition, waiting at most
/// `--wait-ms` in all, then acks (or with --no-ack releases) them one
/// partition at a time, printing each delivery once the broker answered for
/// it.
async fn run_recv(client: &Client, recv: &RecvArgs, json: bool) -> Result<(), Failure> {
    let options = ClaimOptions::new(recv.count).lease_ms(recv.lease_ms).wait_ms(recv.wait_ms);
    let received = client.claim_any(&recv.queue, &options).await?;
    let rows: Vec<Vec<String>> = received
        .iter()
        .map(|delivery| {
            delivery_cells(delivery, "").into_iter().map(|cell| escape(&cell)).collect()
        })
        .collect();
    let table = StreamTable::fitting(DELIVERY_HEADERS.to_vec(), &rows);
    let mut out = Printer::new(json);
    out.header(&table);
    out.flush()?;
    let mut first_failure: Option<Failure> = None;
    let mut groups: Vec<(PartitionId, Vec<&Delivery>)> = Vec::new();
    for delivery in &received {
        match groups.iter_mut().find(|(partition, _)| *partition == delivery.partition()) {
            Some((_, group)) => group.push(delivery),
            None => groups.push((delivery.partition(), vec![delivery])),
        }
    }
    for (partition, group) in groups {
        let outcomes: Vec<String> = if recv.no_ack {
            let mut outcomes = Vec::new();
            for delivery in &group {
                let reason = "released by spool recv --no-ack";
                match client.release(&recv.queue, partition, delivery.token(), 0, reason).await {
                    Ok(_) => outcomes.push("released".to_owned()),
                    Err(error) => {
                        outcomes.push(error.code().map_or("failed", |code| code.name()).to_owned());
                        first_failure.get_or_insert(Failure::Client(error));
                    }
                }
            }
            outcomes
        } else {
            let tokens: Vec<_> = group.iter().map(|delivery| delivery.token()).collect();
            match client.ack(&recv.queue, partition, &tokens).await {
                Ok(()) => vec!["acked".to_owned(); group.len()],
                Err(ClientError::AckRefused { refused, tokens }) => {
                    let mut outcomes = vec!["acked".to_owned(); group.len()];
                    for refused in &refused {
                        if let Some(outcome) = outcomes.get_mut(refused.index) {
                            refused.code.name().clone_into(outcome);
                        }
                    }
                    first_failure.get_or_insert(Failure::Client(ClientError::AckRefused {
                        refused,
                        tokens,
                    }));
                    outcomes
                }
                Err(error) => {
                    // Nothing of this partition is known to be acked: no rows.
                    first_failure.get_or_insert(Failure::Client(error));
                    continue;
                }
            }
        };
        for (delivery, outcome) in group.iter().zip(&outcomes) {
            out.row(&table, &delivery_cells(delivery, outcome), &delivery_json(delivery, outcome));
        }
        out.flush()?;
    }
    match first_failure {
        None => Ok(()),
        Some(failure) => Err(failure),
    }
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

/// Columns of a delivery row (`recv`).
const DELIVERY_HEADERS: [&str; 6] = ["partition", "offset", "attempt", "key", "payload", "result"];

fn delivery_cells(delivery: &Delivery, outcome: &str) -> Vec<String> {
    vec![
        delivery.partition().0.to_string(),
        delivery.offset().0.to_string(),
        delivery.attempt().to_string(),
        show_bytes(delivery.routing_key()),
        payload_text(delivery.payload()),
        outcome.to_owned(),
    ]
}

fn delivery_json(delivery: &Delivery, outcome: &str) -> Value {
    json!({
        "partition": delivery.partition().0,
        "offset": delivery.offset().0,
        "attempt": delivery.attempt(),
        "generation": delivery.generation().0,
        "message_id": message_id_hex(delivery.message_id()),
        "key": show_bytes(delivery.routing_key()),
        "payload": payload_text(delivery.payload()),
        "result": outcome,
    })
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

        let cli = Cli::try_parse_from(["spool", "quota", "list"]).unwrap();
        let Command::Quota(QuotaCommand::List(list)) = cli.command else { panic!("not quota") };
        assert_eq!(list.admin, spool_client::limits::ADMIN_ADDR_DEFAULT);

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

    // Goal: streamed rows line up with their header and a streamed command
    // prints nothing more at the end. Method: a two-column stream table, a
    // row wider than the header, and Output::streamed in both modes.
    #[test]
    fn stream_table_rows_align() {
        let table = StreamTable::fitting(vec!["partition", "offset"], &[]);
        assert_eq!(table.header(), "partition  offset\n");
        assert_eq!(table.row(&["1".into(), "0".into()]), "1          0\n");
        assert_eq!(table.row(&["12345678901".into(), "7".into()]), "12345678901  7\n");
        assert_eq!(Output::streamed().render(false), "");
        assert_eq!(Output::streamed().render(true), "");
    }

    // Goal: stdin lines become message bodies as they arrive: without their
    // line ending (LF or CRLF), bytes kept as they are, a last line without
    // a newline kept, an over-long line refused. Method: feed read_lines a
    // buffer and collect what it sends.
    #[test]
    fn stdin_lines_are_read_as_bodies() {
        let input = b"one\ntwo\r\n\xff\x00binary\n\nlast".to_vec();
        let mut lines = read_lines(std::io::Cursor::new(input));
        let mut got = Vec::new();
        while let Some(line) = lines.blocking_recv() {
            got.push(line.unwrap());
        }
        let expected: Vec<Vec<u8>> = vec![
            b"one".to_vec(),
            b"two".to_vec(),
            b"\xff\x00binary".to_vec(),
            Vec::new(),
            b"last".to_vec(),
        ];
        assert_eq!(got, expected);
        let mut long = read_lines(std::io::Cursor::new(vec![b'x'; LINE_BYTES_MAX + 10]));
        let refused = long.blocking_recv().unwrap().unwrap_err();
        assert!(refused.contains("longer than"), "{refused}");
        assert!(long.blocking_recv().is_none());
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
