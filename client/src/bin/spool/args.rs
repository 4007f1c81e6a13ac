//! The `spool` command line, declared with clap. Parsing only: what each
//! command does is in its command module (`main.rs` dispatches), how
//! results look is in `render.rs`.

use clap::{Args, Parser, Subcommand};
use spool_client::limits::{ADDR_DEFAULT, RECV_WAIT_MS_DEFAULT};
use spool_client::spool_wire::limits::SCHEDULE_HORIZON_MS;

/// Spool command line client.
#[derive(Debug, Parser)]
#[command(name = "spool", version, about = "Talk to a Spool broker")]
pub struct Cli {
    /// Broker (bootstrap shard) address.
    #[arg(long, global = true, default_value = ADDR_DEFAULT)]
    pub addr: String,
    /// Print JSON instead of tables: one JSON value, except `send` and `recv`,
    /// which print JSON Lines (one object per message, as each is acknowledged).
    #[arg(long, global = true)]
    pub json: bool,
    /// Per-request timeout.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Principal to authenticate as (a broker with authentication on).
    /// Env: SPOOL_PRINCIPAL.
    #[arg(long, global = true, value_name = "NAME")]
    pub principal: Option<String>,
    /// The principal's secret. Prefer SPOOL_SECRET: a flag is visible to
    /// other users in the process list.
    #[arg(long, global = true, value_name = "SECRET")]
    pub secret: Option<String>,
    /// Speak TLS, trusting the CA certificates of this PEM file.
    /// Env: SPOOL_TLS_CA.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Check the broker's certificate against this name instead of the
    /// host in the address. Env: SPOOL_TLS_SERVER_NAME.
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Client certificate (PEM) to present; a broker that verifies client
    /// certificates authenticates as the principal of its subject CN.
    /// Env: SPOOL_TLS_CERT.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert. Env: SPOOL_TLS_KEY.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, list, describe or delete queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Enqueue messages: DATA, --file, or one message per stdin line. Prints
    /// each message's partition and offset as the broker acknowledges it.
    Send(SendArgs),
    /// Claim messages from any partition and ack them (or release them with
    /// --no-ack). Prints each message once the broker answered its ack.
    Recv(RecvArgs),
    /// Show messages without claiming them (--key: one routing key's lane).
    Peek(PeekKeyArgs),
    /// Drop a queue's messages (asks first unless --yes).
    Purge(PurgeArgs),
    /// Dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// A queue's subscriptions: independent consumer groups over its stored
    /// records (admin port; `spool recv --sub NAME` consumes one).
    #[command(subcommand)]
    Sub(crate::sub::SubCommand),
    /// Per-queue message counts.
    Stats(StatsArgs),
    /// Authentication helpers.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Show the broker's audit log (purges, redrives, queue deletions):
    /// reads `audit.log` from the broker's data directory, so it works with
    /// the broker stopped too.
    Audit(AuditArgs),
    /// The ACL rules the broker has in force, and what a principal may do
    /// on a queue (admin port; needs the admin right on every queue).
    #[command(subcommand)]
    Acl(crate::acl::AclCommand),
    /// A queue's key figures from the admin port's /metrics: counts, oldest
    /// ready age, enqueue and ack rates, predicted drain time.
    Metrics(crate::metrics::MetricsArgs),
    /// Quotas per principal (from the admin port).
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// A cluster's partitions (leader, term) and its nodes' replication
    /// status (from their admin ports).
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Each principal's quotas and what it uses now, summed over the
    /// shards (`GET /v1/quotas`; needs `admin` on `*` with authentication on).
    List(crate::acl::AdminAddr),
}

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Read a secret from stdin (one line) and print its argon2id hash
    /// (PHC string) for the `secret_hash` of a principal in the auth file.
    HashSecret,
    /// Make the broker read its auth file again (admin port, `POST
    /// /v1/auth/reload`; needs the admin right on every queue). A file that
    /// does not load is refused with the reason and the old policy kept.
    Reload(crate::acl::AdminAddr),
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The broker's data directory (its `audit.log` is read).
    #[arg(long, value_name = "DIR", conflicts_with = "file", required_unless_present = "file")]
    pub data_dir: Option<std::path::PathBuf>,
    /// The audit file itself.
    #[arg(long, value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// Only entries about this queue.
    #[arg(long)]
    pub queue: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue.
    Create(CreateArgs),
    /// List queues.
    List,
    /// Show a queue's configuration and per-partition counts.
    Describe {
        /// Queue name.
        queue: String,
    },
    /// Grow a queue to more partitions. About added/partitions of the
    /// routing keys move, each into an added partition, whose messages wait
    /// until the older partitions finished what they held before the
    /// resize (per-key order holds across it).
    Resize {
        /// Queue name.
        queue: String,
        /// The partition count after the resize (more than it has).
        #[arg(long)]
        partitions: u32,
    },
    /// Delete a queue and its messages (asks first unless --yes).
    Delete {
        /// Queue name.
        queue: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Queue name.
    pub queue: String,
    /// Partitions.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Priority bands.
    #[arg(long)]
    pub priority_bands: Option<u8>,
    /// Default lease.
    #[arg(long)]
    pub lease_ms: Option<u32>,
    /// Deliveries before a message is dead-lettered.
    #[arg(long)]
    pub max_deliveries: Option<u32>,
    /// Admission limit on messages.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// How long an enqueue's message id is remembered for deduplication
    /// (ms; the broker refuses a value past its bound) [default: 300000].
    #[arg(long)]
    pub dedupe_window_ms: Option<u64>,
    /// Retention window by time (ms): keep each record for replay this long
    /// after its enqueue, even once every subscription finished it, and
    /// drop it then even if one had not (that subscription lost it; `spool
    /// sub list`). 1000..=2592000000 (30 days) [default: none, a record
    /// leaves once every subscription finished it].
    #[arg(long)]
    pub retention_ms: Option<u64>,
    /// Retention window by size (bytes): drop the oldest records while the
    /// retained ones exceed this. At least 1048576 (1 MiB) and at most the
    /// queue's max_bytes [default: none].
    #[arg(long)]
    pub retention_bytes: Option<u64>,
    /// Ordered lanes: per routing key at most one message at a time, in
    /// enqueue order (the next one only after the previous is acked,
    /// dead-lettered or expired; a release keeps it first). Messages
    /// without a key are unordered. Not with a retention window.
    #[arg(long)]
    pub ordered: bool,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Queue name.
    pub queue: String,
    /// Message body; without it (and without --file) each stdin line is one message.
    pub data: Option<String>,
    /// Read the body from this file.
    #[arg(long, conflicts_with = "data")]
    pub file: Option<std::path::PathBuf>,
    /// Routing key (chooses the partition).
    #[arg(long)]
    pub key: Option<String>,
    /// Priority band (0 highest).
    #[arg(long, default_value_t = 0)]
    pub priority: u8,
    /// Delay before the message becomes ready; at most 365 days
    /// (31536000000 ms, the broker's schedule horizon).
    #[arg(long, default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(..=SCHEDULE_HORIZON_MS))]
    pub delay_ms: u64,
}

#[derive(Debug, Args)]
pub struct RecvArgs {
    /// Queue name.
    pub queue: String,
    /// Most messages to receive.
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    pub count: u32,
    /// Lease while printing.
    #[arg(long, default_value_t = spool_client::limits::LEASE_MS_DEFAULT)]
    pub lease_ms: u32,
    /// Longest wait, in total over all partitions, when nothing is ready.
    #[arg(long, default_value_t = RECV_WAIT_MS_DEFAULT)]
    pub wait_ms: u32,
    /// Release instead of ack.
    #[arg(long)]
    pub no_ack: bool,
    /// Claim for this subscription of the queue (`spool sub list`) instead
    /// of its default one.
    #[arg(long = "sub", value_name = "NAME")]
    pub sub: Option<String>,
    /// Claim in a consumer session with this timeout on each shard
    /// (`docs/design/sessions.md`): if this process dies, its claims are
    /// released within the timeout instead of their lease. None by
    /// default (recv settles what it claims at once).
    #[arg(long, value_name = "MS")]
    pub session_timeout_ms: Option<u32>,
    /// The session's member id (default `recv-<pid>`).
    #[arg(long, value_name = "ID", requires = "session_timeout_ms")]
    pub member: Option<String>,
    /// Hold the claimed messages this long before settling them (a worker
    /// busy with them); the session, if any, heartbeats meanwhile.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub hold_ms: u64,
}

/// `spool peek`: [`PeekArgs`], or one routing key's lane.
#[derive(Debug, Args)]
pub struct PeekKeyArgs {
    #[command(flatten)]
    pub peek: PeekArgs,
    /// Only the messages of this routing key, in offset order with their
    /// state (an ordered queue's lane: the head ready, scheduled or
    /// claimed, the rest waiting). Reads the partition the key routes to
    /// (and, during a resize, the draining one it routed to before), page
    /// by page, and says how many messages it read; --count bounds the
    /// messages shown.
    #[arg(long)]
    pub key: Option<String>,
    /// With --key: most messages read in each partition looking for the
    /// key.
    #[arg(
        long,
        value_name = "N",
        default_value_t = spool_client::limits::PEEK_KEY_SCAN_DEFAULT,
        value_parser = clap::value_parser!(u32)
            .range(1..=i64::from(spool_client::limits::PEEK_KEY_SCAN_MAX))
    )]
    pub scan: u32,
}

#[derive(Debug, Args)]
pub struct PeekArgs {
    /// Queue name.
    pub queue: String,
    /// Only this partition (default: all).
    #[arg(long)]
    pub partition: Option<u32>,
    /// First offset.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Most messages per partition.
    #[arg(short = 'n', long = "count", default_value_t = 10)]
    pub count: u32,
    /// In this subscription of the queue (`spool sub list`) instead of
    /// its default one.
    #[arg(long = "sub", value_name = "NAME")]
    pub sub: Option<String>,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Queue name.
    pub queue: String,
    /// Only this partition (default: all).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Do not ask.
    #[arg(long)]
    pub yes: bool,
    /// In this subscription of the queue (`spool sub list`) instead of
    /// its default one.
    #[arg(long = "sub", value_name = "NAME")]
    pub sub: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List dead letters.
    List(PeekArgs),
    /// Move dead letters back to ready.
    Redrive {
        /// Queue name.
        queue: String,
        /// Only this partition (default: all).
        #[arg(long)]
        partition: Option<u32>,
        /// Only these original offsets (needs --partition); default: all.
        #[arg(long = "offset", requires = "partition")]
        offsets: Vec<u64>,
        /// The dead letters of this subscription of the queue instead of
        /// its default one's.
        #[arg(long = "sub", value_name = "NAME")]
        sub: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Only this queue (default: all).
    pub queue: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: `send --delay-ms` past the schedule horizon is refused before
    // anything is sent, with a message naming the allowed range, while the
    // horizon itself is accepted. Method: parse both.
    #[test]
    fn send_delay_beyond_the_horizon_is_refused() {
        let parse =
            |delay: &str| Cli::try_parse_from(["spool", "send", "jobs", "x", "--delay-ms", delay]);
        let at_horizon = parse(&SCHEDULE_HORIZON_MS.to_string()).unwrap();
        let Command::Send(send) = at_horizon.command else { panic!("not a send") };
        assert_eq!(send.delay_ms, SCHEDULE_HORIZON_MS);
        let error = parse(&(SCHEDULE_HORIZON_MS + 1).to_string()).unwrap_err().to_string();
        assert!(error.contains("--delay-ms"), "{error}");
        assert!(error.contains(&SCHEDULE_HORIZON_MS.to_string()), "{error}");
    }
}
