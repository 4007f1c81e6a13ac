//! `spool sub create|list|describe|delete`: a queue's subscriptions (its
//! independent consumer groups, `docs/design/subscriptions.md`), through
//! the broker's admin port (`/v1/queues/{queue}/subscriptions`, as `spool
//! acl` and `spool quota` use it: the same credentials, TLS options and
//! exit codes). Consuming one is `spool recv --sub NAME`.
//!
//! It must check the names before it sends them (they go into the path),
//! and asks before it deletes (`confirm`, or `--yes`).

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use spool_client::spool_wire::proto::{validate_queue_name, validate_subscription_name};
use spool_client::{Credentials, TlsConfig};

use crate::acl::{admin_send, AdminAddr};
use crate::render::{Output, Table};
use crate::{confirm, Failure};

#[derive(Debug, Subcommand)]
pub enum SubCommand {
    /// Create a subscription: a complete work queue over the queue's stored
    /// records (its own claims, acks, retries and dead letters), consumed
    /// with `spool recv --sub NAME`.
    Create(CreateArgs),
    /// List a queue's subscriptions (the default one too) with their
    /// backlog, messages in flight, dead letters, oldest ready age and the
    /// records a retention window dropped before they delivered them
    /// (lost).
    List(QueueArgs),
    /// Show one subscription's counts and its newest loss reports (the
    /// offsets a retention window dropped before it delivered them).
    Describe(NameArgs),
    /// Delete a subscription and its delivery state (asks first unless
    /// --yes). Records only it still held become releasable. The default
    /// subscription cannot be deleted.
    Delete(DeleteArgs),
    /// Start a subscription over (a rewind): its claims, retries and dead
    /// letters go, every token of it is refused, and it starts again at
    /// --to over the records the queue still holds (asks first unless
    /// --yes).
    Seek(SeekArgs),
}

/// Where a new subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Start {
    /// Only records enqueued after it was created.
    Latest,
    /// Every record the queue still holds.
    Earliest,
}

impl Start {
    fn as_str(self) -> &'static str {
        match self {
            Self::Latest => "latest",
            Self::Earliest => "earliest",
        }
    }
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Queue name.
    pub queue: String,
    /// The subscription's name (`[A-Za-z0-9._-]`, at most 128 bytes).
    pub name: String,
    /// Where it starts.
    #[arg(long, value_enum, default_value_t = Start::Latest)]
    pub from: Start,
    /// Start at the records enqueued at or after this time (Unix ms) that
    /// each partition still has, instead of --from.
    #[arg(long, conflicts_with = "from", value_name = "UNIX_MS")]
    pub from_time_ms: Option<u64>,
    /// Start at the records at or above this offset, in every partition,
    /// that the partition still has, instead of --from.
    #[arg(long, conflicts_with_all = ["from", "from_time_ms"], value_name = "N")]
    pub from_offset: Option<u64>,
    #[command(flatten)]
    pub admin: AdminAddr,
}

#[derive(Debug, Args)]
pub struct QueueArgs {
    /// Queue name.
    pub queue: String,
    #[command(flatten)]
    pub admin: AdminAddr,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// Queue name.
    pub queue: String,
    /// The subscription's name.
    pub name: String,
    #[command(flatten)]
    pub admin: AdminAddr,
}

#[derive(Debug, Args)]
pub struct SeekArgs {
    #[command(flatten)]
    pub target: NameArgs,
    /// Where it starts over.
    #[arg(long, value_enum, default_value_t = Start::Earliest)]
    pub to: Start,
    /// Start over at the records enqueued at or after this time (Unix ms),
    /// instead of --to.
    #[arg(long, conflicts_with = "to", value_name = "UNIX_MS")]
    pub to_time_ms: Option<u64>,
    /// Start over at the records at or above this offset in every
    /// partition, instead of --to.
    #[arg(long, conflicts_with_all = ["to", "to_time_ms"], value_name = "N")]
    pub to_offset: Option<u64>,
    /// Do not ask.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub target: NameArgs,
    /// Do not ask.
    #[arg(long)]
    pub yes: bool,
}

/// `/v1/queues/{queue}/subscriptions`, the queue's name checked first.
fn subscriptions_path(queue: &str) -> Result<String, Failure> {
    validate_queue_name(queue).map_err(|error| Failure::Input(error.to_string()))?;
    Ok(format!("/v1/queues/{queue}/subscriptions"))
}

/// `/v1/queues/{queue}/subscriptions/{name}`, both names checked first.
fn subscription_path(queue: &str, name: &str) -> Result<String, Failure> {
    let base = subscriptions_path(queue)?;
    validate_subscription_name(name).map_err(|error| Failure::Input(error.to_string()))?;
    Ok(format!("{base}/{name}"))
}

/// `spool sub create|list|describe|delete`.
pub async fn run(
    command: &SubCommand,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    match command {
        SubCommand::Create(create) => {
            let path = subscriptions_path(&create.queue)?;
            validate_subscription_name(&create.name)
                .map_err(|error| Failure::Input(error.to_string()))?;
            let from = match (create.from_time_ms, create.from_offset) {
                (Some(time_ms), _) => format!("time:{time_ms}"),
                (None, Some(offset)) => format!("offset:{offset}"),
                (None, None) => create.from.as_str().to_owned(),
            };
            let body = json!({"name": create.name, "from": from});
            let body =
                serde_json::to_vec(&body).map_err(|error| Failure::Input(error.to_string()))?;
            let created =
                admin_send(&create.admin, tls, "POST", &path, credentials, Some(&body), timeout)
                    .await?;
            let message = format!(
                "created subscription {} of queue {} (id {}, from {})",
                create.name,
                create.queue,
                created["id"],
                created["from"].as_str().unwrap_or(&from)
            );
            Ok(Output::message(message, created))
        }
        SubCommand::List(list) => {
            let path = subscriptions_path(&list.queue)?;
            let body =
                admin_send(&list.admin, tls, "GET", &path, credentials, None, timeout).await?;
            Ok(render_list(body))
        }
        SubCommand::Describe(describe) => {
            let path = subscription_path(&describe.queue, &describe.name)?;
            let body =
                admin_send(&describe.admin, tls, "GET", &path, credentials, None, timeout).await?;
            Ok(render_describe(&describe.queue, body))
        }
        SubCommand::Seek(seek) => {
            let target = &seek.target;
            let path = format!("{}/seek", subscription_path(&target.queue, &target.name)?);
            let to = match (seek.to_time_ms, seek.to_offset) {
                (Some(time_ms), _) => format!("time:{time_ms}"),
                (None, Some(offset)) => format!("offset:{offset}"),
                (None, None) => seek.to.as_str().to_owned(),
            };
            confirm(
                seek.yes,
                &format!(
                    "start subscription {} of queue {} over at {to}, dropping its claims, \
                     retries and dead letters?",
                    target.name, target.queue
                ),
            )?;
            let body = serde_json::to_vec(&json!({ "to": to }))
                .map_err(|error| Failure::Input(error.to_string()))?;
            let answer =
                admin_send(&target.admin, tls, "POST", &path, credentials, Some(&body), timeout)
                    .await?;
            let message = format!(
                "subscription {} of queue {} starts over at {to} (id {})",
                target.name, target.queue, answer["id"]
            );
            Ok(Output::message(message, answer))
        }
        SubCommand::Delete(delete) => {
            let target = &delete.target;
            let path = subscription_path(&target.queue, &target.name)?;
            confirm(
                delete.yes,
                &format!(
                    "delete subscription {} of queue {} and its delivery state?",
                    target.name, target.queue
                ),
            )?;
            let body =
                admin_send(&target.admin, tls, "DELETE", &path, credentials, None, timeout).await?;
            let message = format!("deleted subscription {} of queue {}", target.name, target.queue);
            Ok(Output::message(message, body))
        }
    }
}

/// A number of the API's answer as a cell; `-` when absent or null (an age
/// with nothing to measure).
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

const LIST_HEADERS: [&str; 7] =
    ["subscription", "id", "ready", "claimed", "dead_letters", "oldest_ready_age_ms", "lost"];

fn list_row(subscription: &Value) -> Vec<String> {
    ["name", "id", "ready", "claimed", "dead_letters", "oldest_ready_age_ms", "lost"]
        .iter()
        .map(|field| cell(&subscription[*field]))
        .collect()
}

/// One row per subscription; `--json` prints the API's answer.
fn render_list(body: Value) -> Output {
    let mut table = Table::new(LIST_HEADERS.to_vec());
    for subscription in body["subscriptions"].as_array().into_iter().flatten() {
        table.push(list_row(subscription));
    }
    Output::table(table, body)
}

const DESCRIBE_FIELDS: [&str; 9] = [
    "id",
    "ready",
    "scheduled",
    "claimed",
    "dead_letters",
    "acked",
    "oldest_ready_age_ms",
    "oldest_claim_age_ms",
    "lost",
];

/// One loss report of the API's answer as a cell: which offsets of which
/// partition a retention window dropped before the subscription delivered
/// them, how many, and when.
fn loss_cell(loss: &Value) -> String {
    format!(
        "partition {}: offsets {}..={}, {} records, at {} ms",
        cell(&loss["partition"]),
        cell(&loss["from"]),
        cell(&loss["to"]),
        cell(&loss["count"]),
        cell(&loss["at_ms"])
    )
}

/// One subscription's counts, one field a row, then its newest loss
/// reports (oldest first), one a row.
fn render_describe(queue: &str, body: Value) -> Output {
    let mut table = Table::new(vec!["field", "value"]);
    for field in DESCRIBE_FIELDS {
        table.push(vec![field.to_owned(), cell(&body[field])]);
    }
    for loss in body["losses"].as_array().into_iter().flatten() {
        table.push(vec!["loss".to_owned(), loss_cell(loss)]);
    }
    let message = format!("subscription {} of queue {queue}", cell(&body["name"]));
    Output { message: Some(message), ..Output::table(table, body) }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn parse(line: &[&str]) -> SubCommand {
        let cli = Cli::try_parse_from(line).unwrap();
        let Command::Sub(command) = cli.command else { panic!("not sub: {line:?}") };
        command
    }

    // Goal: every `spool sub` command parses as documented (`--from`
    // latest by default, `--admin` the local admin port by default) and bad
    // lines are refused. Method: parse each form.
    #[test]
    fn parses_sub_commands() {
        let SubCommand::Create(create) = parse(&["spool", "sub", "create", "jobs", "audit"]) else {
            panic!("not create")
        };
        assert_eq!((create.queue.as_str(), create.name.as_str()), ("jobs", "audit"));
        assert_eq!(create.from, Start::Latest);
        assert_eq!(create.admin.admin, spool_client::limits::ADMIN_ADDR_DEFAULT);
        let line =
            ["spool", "sub", "create", "jobs", "audit", "--from", "earliest", "--admin", "h:1"];
        let SubCommand::Create(create) = parse(&line) else { panic!("not create") };
        assert_eq!((create.from, create.admin.admin.as_str()), (Start::Earliest, "h:1"));
        let SubCommand::List(list) = parse(&["spool", "sub", "list", "jobs", "--json"]) else {
            panic!("not list")
        };
        assert_eq!(list.queue, "jobs");
        let SubCommand::Describe(describe) = parse(&["spool", "sub", "describe", "jobs", "audit"])
        else {
            panic!("not describe")
        };
        assert_eq!(describe.name, "audit");
        let SubCommand::Delete(delete) = parse(&["spool", "sub", "delete", "jobs", "a", "--yes"])
        else {
            panic!("not delete")
        };
        assert!(delete.yes);
        assert_eq!(delete.target.name, "a");
        for bad in [
            &["spool", "sub", "create", "jobs"][..],
            &["spool", "sub", "create", "jobs", "a", "--from", "middle"],
            &["spool", "sub", "describe", "jobs"],
            &["spool", "sub", "list"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    // Goal: names go into the path only when they keep the rule (nothing
    // a name holds can change the path). Method: good and bad names.
    #[test]
    fn paths_carry_checked_names_only() {
        assert_eq!(subscriptions_path("jobs").unwrap(), "/v1/queues/jobs/subscriptions");
        assert_eq!(subscription_path("jobs", "a.b").unwrap(), "/v1/queues/jobs/subscriptions/a.b");
        for (queue, name) in [("jobs", "../x"), ("jobs", "a?b=c"), ("a/b", "x"), ("jobs", "")] {
            let refused = subscription_path(queue, name);
            assert!(matches!(refused, Err(Failure::Input(_))), "{queue} {name}: {refused:?}");
        }
    }

    // Goal: the list prints one row per subscription with the documented
    // columns (a null age as `-`) and --json the API's answer unchanged.
    // Method: render an answer with the default and one more subscription.
    #[test]
    fn the_list_shows_one_row_per_subscription() {
        let body = json!({"queue": "jobs", "subscriptions": [
            {"name": "default", "id": 0, "ready": 5, "scheduled": 1, "claimed": 2,
             "dead_letters": 0, "oldest_ready_age_ms": 1200, "oldest_claim_age_ms": 30,
             "acked": 9, "lost": 0, "losses": []},
            {"name": "audit", "id": 1, "ready": 0, "scheduled": 0, "claimed": 0,
             "dead_letters": 3, "oldest_ready_age_ms": null, "oldest_claim_age_ms": null,
             "acked": 0, "lost": 12, "losses": [
                {"partition": 0, "from": 0, "to": 9, "count": 10, "at_ms": 1700},
                {"partition": 1, "from": 4, "to": 5, "count": 2, "at_ms": 1800}]}
        ]});
        let output = render_list(body.clone());
        assert_eq!(
            output.render(false),
            "subscription  id  ready  claimed  dead_letters  oldest_ready_age_ms  lost\n\
             default       0   5      2        0             1200                 0\n\
             audit         1   0      0        3             -                    12\n"
        );
        let printed: Value = serde_json::from_str(&output.render(true)).unwrap();
        assert_eq!(printed, body);
        let described = render_describe("jobs", body["subscriptions"][1].clone()).render(false);
        assert!(described.contains("dead_letters         3\n"), "{described}");
        assert!(described.contains("oldest_claim_age_ms  -\n"), "{described}");
        assert!(described.contains("lost                 12\n"), "{described}");
        let first = "loss                 partition 0: offsets 0..=9, 10 records, at 1700 ms\n";
        let second = "loss                 partition 1: offsets 4..=5, 2 records, at 1800 ms\n";
        let at = |line: &str| described.find(line).unwrap_or_else(|| panic!("{described}"));
        assert!(at(first) < at(second), "oldest first: {described}");
        assert!(described.ends_with("subscription audit of queue jobs\n"), "{described}");
    }

    /// Serves one HTTP request on a loopback port with `answer` (status
    /// line and body); hands back the port and the request as received.
    async fn admin_port(
        status: &'static str,
        answer: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Read the head, then the body its Content-Length announces.
            loop {
                let read = socket.read(&mut buffer).await.unwrap();
                if read == 0 {
                    break;
                }
                request.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&request).into_owned();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|line| line.strip_prefix("Content-Length: "))
                        .map_or(0, |length| length.trim().parse::<usize>().unwrap());
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
            socket.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (addr, served)
    }

    // Goal: create sends the documented request (POST, path, JSON body)
    // and takes the 201; a refusal maps onto the admin commands' exit
    // codes (409: refused, 1). Method: a one-request admin port per call.
    #[tokio::test]
    async fn create_posts_the_documented_body() {
        let answer = r#"{"queue":"jobs","name":"audit","id":1,"from":"earliest"}"#;
        let (addr, served) = admin_port("201 Created", answer).await;
        let create = SubCommand::Create(CreateArgs {
            queue: "jobs".to_owned(),
            name: "audit".to_owned(),
            from: Start::Earliest,
            from_time_ms: None,
            from_offset: None,
            admin: AdminAddr { admin: addr },
        });
        let output = run(&create, None, None, Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            output.render(false),
            "created subscription audit of queue jobs (id 1, from earliest)\n"
        );
        let request = served.await.unwrap();
        assert!(
            request.starts_with("POST /v1/queues/jobs/subscriptions HTTP/1.1\r\n"),
            "{request}"
        );
        let body: Value = serde_json::from_str(request.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body, json!({"name": "audit", "from": "earliest"}));
        // By time: the API's `time:<unix ms>`.
        let answer = r#"{"queue":"jobs","name":"late","id":2,"from":"time:1700"}"#;
        let (addr, served) = admin_port("201 Created", answer).await;
        let by_time = SubCommand::Create(CreateArgs {
            queue: "jobs".to_owned(),
            name: "late".to_owned(),
            from: Start::Latest,
            from_time_ms: Some(1_700),
            from_offset: None,
            admin: AdminAddr { admin: addr },
        });
        let output = run(&by_time, None, None, Duration::from_secs(5)).await.unwrap();
        assert!(output.render(false).ends_with("(id 2, from time:1700)\n"));
        let request = served.await.unwrap();
        let body: Value = serde_json::from_str(request.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body, json!({"name": "late", "from": "time:1700"}));

        let exists = r#"{"error":{"code":5,"name":"INVALID_ARGUMENT","message":"exists"}}"#;
        let (addr, served) = admin_port("409 Conflict", exists).await;
        let delete = SubCommand::Delete(DeleteArgs {
            target: NameArgs {
                queue: "jobs".to_owned(),
                name: "audit".to_owned(),
                admin: AdminAddr { admin: addr },
            },
            yes: true,
        });
        let failure = run(&delete, None, None, Duration::from_secs(5)).await.unwrap_err();
        let Failure::Admin(message, exit) = failure else { panic!("{failure:?}") };
        assert_eq!((message.as_str(), exit), ("INVALID_ARGUMENT: exists", crate::EXIT_REFUSED));
        let request = served.await.unwrap();
        assert!(request.starts_with("DELETE /v1/queues/jobs/subscriptions/audit "), "{request}");
    }
}
