//! `spool`: the command line client. Parses arguments (`args`), runs one
//! command through `spool_client`, prints a table or JSON (`render`), and
//! exits non-zero with the error code's name on failure. It holds no state
//! between runs.
//!
//! Exit codes: 0 success, 1 the broker refused (message names the code),
//! 2 usage error, 3 connection/timeout/protocol trouble, 4 declined at a
//! confirmation prompt, 5 `cluster status` found a node unreachable or a
//! partition without a leader (its report is printed all the same).
//!
//! This file holds the failures and exit codes, the connection options
//! (credentials, TLS) and the dispatch; each command group is a module:
//! `queue` (`queue create|list|describe|delete`, `stats`), `send`, `recv`,
//! `inspect` (`peek`, `purge`, `dlq`), `offline` (`auth hash-secret`,
//! `audit`), `cluster` (`cluster partitions|status`), and the admin port's
//! `acl`, `metrics`, `quota` and `sub` (`sub create|list|describe|delete`).

mod acl;
mod args;
mod cluster;
mod http;
mod inspect;
mod metrics;
mod nodes;
mod offline;
mod queue;
mod quota;
mod recv;
mod render;
mod replicas;
mod send;
mod sub;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use spool_client::{Admin, Client, ClientConfig, ClientError, ConnectionConfig, Credentials};

use args::{AuthCommand, Cli, Command, QuotaCommand};
use cluster::ClusterCommand;
use render::Output;

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
    /// A report to print that still fails the command (`cluster status`
    /// with a node unreachable or a partition without a leader): the
    /// report and the failures, for stderr.
    Unhealthy(Box<Output>, String),
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
        Failure::Unhealthy(..) => cluster::EXIT_UNHEALTHY,
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
                Failure::Unhealthy(output, failures) => {
                    print!("{}", output.render(cli.json));
                    eprintln!("error: {failures}")
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

async fn run(cli: &Cli) -> Result<Output, Failure> {
    match &cli.command {
        Command::Auth(AuthCommand::HashSecret) => return offline::hash_secret_from_stdin(),
        Command::Audit(args) => return offline::audit(args),
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
        Command::Cluster(ClusterCommand::Status(args)) => {
            let timeout = Duration::from_millis(cli.timeout_ms.max(1));
            return cluster::status(args, tls(cli)?.as_ref(), timeout).await;
        }
        Command::Cluster(ClusterCommand::Nodes(args)) => {
            let timeout = Duration::from_millis(cli.timeout_ms.max(1));
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return nodes::run(args, tls.as_ref(), credentials.as_ref(), timeout).await;
        }
        Command::Cluster(ClusterCommand::Replicas(args)) => {
            let timeout = Duration::from_millis(cli.timeout_ms.max(1));
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return replicas::list(args, tls.as_ref(), credentials.as_ref(), timeout).await;
        }
        Command::Cluster(ClusterCommand::Move(args)) => {
            let timeout = Duration::from_millis(cli.timeout_ms.max(1));
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return replicas::run_move(args, tls.as_ref(), credentials.as_ref(), timeout).await;
        }
        Command::Sub(command) => {
            let (credentials, tls) = (credentials(cli)?, tls(cli)?);
            return sub::run(command, tls.as_ref(), credentials.as_ref(), admin_timeout(cli)).await;
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
        Command::Queue(command) => queue::run(&admin, command).await,
        Command::Send(send) => send::run(client, send, cli.json).await.map(|()| Output::streamed()),
        Command::Recv(recv) => {
            recv::run(&client, recv, cli.json).await.map(|()| Output::streamed())
        }
        Command::Peek(peek) => inspect::peek(&client, &admin, peek).await,
        Command::Purge(purge) => inspect::purge(&client, &admin, purge).await,
        Command::Dlq(command) => inspect::dlq(&client, &admin, command).await,
        Command::Stats(stats) => queue::stats(&admin, stats).await,
        Command::Cluster(ClusterCommand::Partitions(args)) => {
            cluster::partitions(&client, args).await
        }
        Command::Auth(_)
        | Command::Audit(_)
        | Command::Acl(_)
        | Command::Metrics(_)
        | Command::Sub(_)
        | Command::Cluster(
            ClusterCommand::Status(_)
            | ClusterCommand::Nodes(_)
            | ClusterCommand::Replicas(_)
            | ClusterCommand::Move(_),
        )
        | Command::Quota(_) => {
            unreachable!("answered before connecting")
        }
    }
}

/// Asks on the terminal unless `yes`; refuses without a terminal.
pub(crate) fn confirm(yes: bool, question: &str) -> Result<(), Failure> {
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

#[cfg(test)]
mod tests {
    use clap::Parser;
    use spool_client::spool_wire::ErrorCode;

    use super::*;
    use crate::args::{DlqCommand, QueueCommand};

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
        assert_eq!(recv.sub, None, "the default subscription");
        let cli = Cli::try_parse_from(["spool", "recv", "jobs", "--sub", "audit"]).unwrap();
        let Command::Recv(recv) = cli.command else { panic!("not recv") };
        assert_eq!(recv.sub.as_deref(), Some("audit"));

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

    // Goal: `cluster status` takes admin addresses comma-separated or
    // repeated (default the local admin port); `cluster partitions` takes
    // queue names. Method: parse them.
    #[test]
    fn parses_cluster_commands() {
        let cli = Cli::try_parse_from(["spool", "cluster", "status"]).unwrap();
        let Command::Cluster(ClusterCommand::Status(status)) = cli.command else {
            panic!("not cluster status")
        };
        assert_eq!(status.admin, vec![spool_client::limits::ADMIN_ADDR_DEFAULT.to_owned()]);
        let cli = Cli::try_parse_from([
            "spool", "cluster", "status", "--admin", "a:1,a:2", "--admin", "a:3", "--json",
        ])
        .unwrap();
        assert!(cli.json);
        let Command::Cluster(ClusterCommand::Status(status)) = cli.command else {
            panic!("not cluster status")
        };
        assert_eq!(status.admin, vec!["a:1", "a:2", "a:3"]);
        let cli = Cli::try_parse_from(["spool", "cluster", "partitions", "jobs", "mail"]).unwrap();
        let Command::Cluster(ClusterCommand::Partitions(partitions)) = cli.command else {
            panic!("not cluster partitions")
        };
        assert_eq!(partitions.queues, vec!["jobs", "mail"]);
        assert_eq!(exit_code(&Failure::Unhealthy(Box::new(Output::streamed()), String::new())), 5);
    }

    // Goal: invalid command lines are rejected by the parser. Method: DATA
    // together with --file, a redrive offset without a partition, a
    // missing queue.
    #[test]
    fn rejects_bad_command_lines() {
        assert!(Cli::try_parse_from(["spool", "send", "q", "data", "--file", "f"]).is_err());
        assert!(Cli::try_parse_from(["spool", "dlq", "redrive", "q", "--offset", "3"]).is_err());
        assert!(Cli::try_parse_from(["spool", "recv"]).is_err());
        assert!(Cli::try_parse_from(["spool", "recv", "q", "--sub"]).is_err());
        assert!(Cli::try_parse_from(["spool", "frobnicate"]).is_err());
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
