//! `spool cluster replicas|move`: every partition's replica set as the
//! committed table holds it, and an operator's move of one replica to
//! another node (`GET /v1/cluster/partitions`, `POST /v1/cluster/move` on
//! the admin ports given; `docs/operations.md`, "Re-placement").
//!
//! - `replicas` asks the admin ports given in order and prints the first
//!   answer: per partition its nodes (the preferred leader first), whether
//!   the controller re-placed it and whether its group's members are there
//!   yet (`settled`). Every node holds the same committed table, so any
//!   one answers for the cluster (a node that fell behind shows an older
//!   `assignment_version`).
//! - `move` sends the move to each admin port given in order until one
//!   that leads the controller takes it (the others answer `NOT_LEADER`).
//!   It returns once the new set is committed; the move itself (the new
//!   member caught up and made a voter, the old one removed) follows:
//!   `spool cluster replicas` shows it settled.

use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use spool_client::{Credentials, TlsConfig};

use crate::cluster::StatusArgs;
use crate::http::call;
use crate::render::{Output, Table};
use crate::{Failure, EXIT_REFUSED, EXIT_TRANSPORT};

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The queue.
    pub queue: String,
    /// The partition whose replica moves.
    pub partition: u32,
    /// The node whose replica moves.
    #[arg(long)]
    pub from: u64,
    /// The node that takes it.
    #[arg(long)]
    pub to: u64,
    #[command(flatten)]
    pub admin: StatusArgs,
}

/// The first admin port's answer to `method path` that is not a
/// `NOT_LEADER` refusal (when `past_followers`) or a transport failure;
/// else the last failure.
async fn first_answer(
    admins: &[String],
    tls: Option<&TlsConfig>,
    method: &str,
    path: &str,
    credentials: Option<&Credentials>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Value, Failure> {
    let mut last = Failure::Input("no admin port given (--admin)".to_owned());
    for admin in admins {
        let answer = match call(admin, tls, method, path, credentials, body, timeout).await {
            Ok(answer) => answer,
            Err(error) => {
                last = Failure::Admin(error, EXIT_TRANSPORT);
                continue;
            }
        };
        if answer.status == 200 {
            return answer.json().ok_or_else(|| {
                Failure::Admin("the admin port sent no JSON".to_owned(), EXIT_TRANSPORT)
            });
        }
        let not_leader =
            answer.json().is_some_and(|body| body["error"]["name"].as_str() == Some("NOT_LEADER"));
        let exit = if answer.status >= 500 { EXIT_TRANSPORT } else { EXIT_REFUSED };
        last = Failure::Admin(format!("{admin}: {}", answer.refusal()), exit);
        if !not_leader {
            return Err(last);
        }
    }
    Err(last)
}

/// `spool cluster replicas`.
pub async fn list(
    args: &StatusArgs,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let path = "/v1/cluster/partitions";
    let view = first_answer(&args.admin, tls, "GET", path, credentials, None, timeout).await?;
    let mut table = Table::new(vec!["queue", "partition", "replicas", "re-placed", "settled"]);
    for row in view["partitions"].as_array().into_iter().flatten() {
        let nodes: Vec<String> =
            row["replicas"].as_array().into_iter().flatten().map(|node| node.to_string()).collect();
        table.push(vec![
            row["queue"].as_str().unwrap_or("?").to_owned(),
            row["partition"].to_string(),
            nodes.join(","),
            if row["re_placed"] == true { "yes" } else { "no" }.to_owned(),
            if row["settled"] == true { "yes" } else { "moving" }.to_owned(),
        ]);
    }
    if table.rows.is_empty() {
        return Ok(Output::message("no queues".to_owned(), view));
    }
    Ok(Output::table(table, view))
}

/// `spool cluster move`.
pub async fn run_move(
    args: &MoveArgs,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let body = json!({ "queue": args.queue, "partition": args.partition,
                       "from": args.from, "to": args.to });
    let body = serde_json::to_vec(&body).map_err(|error| Failure::Input(error.to_string()))?;
    let path = "/v1/cluster/move";
    let admins = &args.admin.admin;
    let answer = first_answer(admins, tls, "POST", path, credentials, Some(&body), timeout).await?;
    let message = format!(
        "partition {}/{}: node {}'s replica moves to node {} (table version {}); \
         `spool cluster replicas` shows it settled once done",
        args.queue, args.partition, args.from, args.to, answer["assignment_version"]
    );
    Ok(Output::message(message, answer))
}
