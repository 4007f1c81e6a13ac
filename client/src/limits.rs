//! Named limits and defaults of the client. Every queue, map and batch the
//! client keeps is bounded by one of these; waiting for room is how the client
//! applies backpressure to its caller, and a value that cannot fit is a typed
//! error. Protocol bounds (frame size, credits, lease ranges) live in
//! `spool_wire::proto::limits`; these are the client's own.

use std::time::Duration;

/// Most requests one [`Connection`](crate::Connection) has outstanding. A
/// caller past it waits for a response to free a slot.
pub const IN_FLIGHT_REQUESTS_MAX: usize = 1024;

/// Encoded frames queued for a connection's writer task before callers wait.
pub const WRITE_QUEUE_FRAMES_MAX: usize = 256;

/// Bytes the writer coalesces into one socket write.
pub const WRITE_COALESCE_BYTES_MAX: usize = 256 * 1024;

/// Default per-request timeout. A Claim's long-poll wait is added on top.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Default TCP connect timeout.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Default [`Liveness::idle`](crate::Liveness::idle): how long a connection
/// with requests outstanding may hear nothing at all from the broker (no
/// response, no error frame, not a byte) before it sends one Ping. A healthy
/// broker answers something within milliseconds; a long-polling Claim
/// answers only after its wait, but the Ping is answered beside it (replies
/// complete in any order), so a waiting Claim costs a Ping per `idle`, never
/// a close.
pub const LIVENESS_IDLE: Duration = Duration::from_secs(2);

/// Default [`Liveness::timeout`](crate::Liveness::timeout): how long after
/// that Ping the connection may still hear nothing before it is closed as
/// unresponsive, failing its requests with
/// [`ClientError::ConnectionClosed`](crate::ClientError::ConnectionClosed)
/// so their callers reroute. With [`LIVENESS_IDLE`] a hung broker (a
/// stopped process, a host that froze) costs about 7 s instead of the
/// request timeout; a slow one that answers anything, or the Ping, within
/// that time keeps its connection.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);

/// Shortest `idle` or `timeout` a [`Liveness`](crate::Liveness) may have:
/// below it a probe would fire between a healthy broker's answers.
pub const LIVENESS_DURATION_MIN: Duration = Duration::from_millis(10);

/// Longest `idle` or `timeout`: a day (a longer one is `liveness: None`).
pub const LIVENESS_DURATION_MAX: Duration = Duration::from_secs(24 * 3600);

/// How many times one data request follows `NOT_OWNER` (refreshing metadata
/// each time) before giving up: ownership moves rarely, so more than a few
/// hops means the cluster is reconfiguring and the caller should back off.
pub const ROUTE_ATTEMPTS_MAX: u32 = 4;

/// How many times a request is sent again after `NOT_OWNER` named no
/// owner: a catalog change (create or delete a queue) while the cluster's
/// controller has no leader, or a data request while its partition has
/// none and the metadata names the node that refused (an election runs
/// for 1–2 s). Separate from [`ROUTE_ATTEMPTS_MAX`], which bounds the hops
/// to named owners.
pub const LEADER_WAIT_ATTEMPTS_MAX: u32 = 10;

/// First pause before such a resend; doubles per resend up to
/// [`LEADER_WAIT_BACKOFF_MAX`] (≈ 7.5 s over every attempt).
pub const LEADER_WAIT_BACKOFF: Duration = Duration::from_millis(100);

/// Longest pause between two resends while no leader is known.
pub const LEADER_WAIT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Most shard connections one [`Client`](crate::Client) keeps.
pub const CONNECTIONS_MAX: usize = 1024;

/// Producer: default linger (how long a batch waits for company): none. An
/// idle producer sends each message at once; under load, messages that
/// arrive while a partition's batches are in flight
/// ([`PRODUCER_IN_FLIGHT_PER_PARTITION_DEFAULT`]) share the next batch, so
/// batches grow with the load without a timer. A linger of a few ms trades
/// enqueue latency for fewer, larger requests at moderate rates (see
/// [`ProducerConfig::linger`](crate::ProducerConfig::linger)).
pub const LINGER_DEFAULT: Duration = Duration::ZERO;

/// Producer: default target batch size; a batch is flushed once it reaches it.
pub const BATCH_BYTES_DEFAULT: usize = 256 * 1024;

/// Producer: messages accepted but not yet acknowledged by the broker. A
/// `send` past it waits.
pub const PRODUCER_PENDING_MESSAGES_MAX: usize = 64 * 1024;

/// Producer: batches being sent (or retried) at once.
pub const PRODUCER_IN_FLIGHT_BATCHES_MAX: usize = 64;

/// Producer: default batches of one partition in flight before a due batch
/// waits and keeps growing (a few overlap one group commit with the next).
pub const PRODUCER_IN_FLIGHT_PER_PARTITION_DEFAULT: usize = 4;

/// Producer: default number of retries of a batch after a retriable error.
pub const PRODUCER_RETRIES_DEFAULT: u32 = 5;

/// How old a queue's cached metadata may be before a producer's send or a
/// consumer's claim fetches it again in the background (Kafka's
/// `metadata.max.age.ms` plays this part): a resize's added partitions and
/// leaders that moved without a refusal reaching this client are found
/// within it.
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(10);

/// How many times one message is routed again after `KEY_MOVED` (its
/// queue was resized and its key maps to another partition now) before
/// the send fails: each route fetches the queue's metadata first, so one
/// is enough unless the queue keeps being resized.
pub const PRODUCER_REROUTES_MAX: u32 = 4;

/// Producer: first retry backoff; doubles per retry up to
/// [`RETRY_BACKOFF_MAX`]; each wait is jittered into the upper half.
pub const RETRY_BACKOFF_DEFAULT: Duration = Duration::from_millis(50);

/// Longest backoff between two retries.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Consumer: most execution slots (each slot is one credit).
pub const CONSUMER_SLOTS_MAX: u32 = spool_wire::proto::limits::CLAIM_CREDITS_MAX;

/// Consumer: most deliveries claimed ahead of a free slot (`prefetch`).
pub const CONSUMER_PREFETCH_MAX: u32 = CONSUMER_SLOTS_MAX;

/// Consumer: most completed deliveries waiting for their Ack answer
/// (`acks_pending_max`).
pub const CONSUMER_ACKS_PENDING_MAX: u32 = 64 * 1024;

/// Consumer: default `acks_pending_max`, four full Ack requests: enough that
/// acks in flight never hold a slot while the broker answers normally.
pub const CONSUMER_ACKS_PENDING_DEFAULT: u32 = 4 * spool_wire::proto::limits::ACK_TOKENS_MAX;

/// Default lease of a claim ([`ClaimOptions`](crate::ClaimOptions), the
/// consumer, `spool recv`).
pub const LEASE_MS_DEFAULT: u32 = 30_000;

/// Default timeout of a [`Consumer`](crate::Consumer)'s session on each
/// shard (`docs/design/sessions.md`): a consumer that dies has its claims
/// released within this, not within their lease. It heartbeats every
/// third of it.
pub const SESSION_TIMEOUT_MS_DEFAULT: u32 = 10_000;

const _: () = assert!(
    SESSION_TIMEOUT_MS_DEFAULT >= spool_wire::proto::limits::SESSION_TIMEOUT_MS_MIN
        && SESSION_TIMEOUT_MS_DEFAULT <= spool_wire::proto::limits::SESSION_TIMEOUT_MS_MAX
);

/// Default dedupe window of a new queue ([`default_queue_config`](crate::default_queue_config),
/// `spool queue create`, the admin API): 5 minutes, the broker's own
/// default and the interval peer brokers deduplicate over. A producer's
/// retries of one batch fall well inside it; a longer window costs memory
/// (≈ 30 B per id) and checkpoint bytes (32 B per id, every checkpoint) for
/// every id enqueued in it. Set per queue (`dedupe_window_ms`).
pub const DEDUPE_WINDOW_MS_DEFAULT: u64 = 5 * 60 * 1000;

/// Default deliveries one [`ClaimOptions`](crate::ClaimOptions) asks for.
pub const CLAIM_CREDITS_DEFAULT: u32 = 1;

/// Default long-poll wait of a claim ([`ClaimOptions`](crate::ClaimOptions),
/// the consumer) when nothing is ready.
pub const CLAIM_WAIT_MS_DEFAULT: u32 = 5_000;

/// Default record bytes asked for per claim ([`ClaimOptions`](crate::ClaimOptions),
/// the consumer, `spool recv`).
pub const CLAIM_BYTES_DEFAULT: u32 = 4 << 20;

/// Consumer: pause after a failed claim before the next one, so a broker that
/// is down is not hammered.
pub const CLAIM_ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// Consumer: default number of claims outstanding at once.
pub const CLAIMS_IN_FLIGHT_DEFAULT: u32 = 4;

/// Consumer: most claims outstanding at once (each holds a share of the
/// slots; more would only split the slots into smaller claims).
pub const CLAIMS_IN_FLIGHT_MAX: u32 = 64;

/// Consumer: default time a completed delivery waits for others to share its
/// Ack request.
pub const ACK_LINGER_DEFAULT: Duration = Duration::from_millis(1);

/// Consumer: Ack requests outstanding at once; deliveries completing
/// meanwhile wait for the next batch.
pub const ACK_REQUESTS_IN_FLIGHT_MAX: usize = 8;

/// Release delay of a delivery [`Client::claim_any`](crate::Client::claim_any)
/// received beyond the credits it asked for (a second partition answered its
/// long-poll in the same instant): ready again almost at once, not after the
/// queue's backoff (a release delay of 0 would mean the backoff).
pub const CLAIM_EXTRA_RELEASE_DELAY_MS: u32 = 1;

/// Release reason of such an extra delivery.
pub const CLAIM_EXTRA_RELEASE_REASON: &str = "claimed beyond the credits of a claim_any";

/// How many refused tokens a [`ClientError::AckRefused`](crate::ClientError::AckRefused)
/// message lists.
pub const REFUSED_LISTED_MAX: usize = 8;

// --- The `spool` command line ------------------------------------------------

/// Default broker address of the `spool` command line.
pub const ADDR_DEFAULT: &str = "127.0.0.1:7400";
/// Default `recv --wait-ms`: short, since a person is waiting.
pub const RECV_WAIT_MS_DEFAULT: u32 = 1_000;
/// Messages `spool send` has submitted and not yet seen acknowledged; input
/// is read no further ahead.
pub const SEND_IN_FLIGHT_MAX: usize = 16 * 1024;
/// Stdin lines read ahead of their submission.
pub const STDIN_READ_AHEAD_LINES: usize = 1024;
/// Longest stdin line `spool send` takes (the broker's record limit; the
/// record envelope makes the usable payload a little smaller).
pub const LINE_BYTES_MAX: usize = spool_wire::limits::RECORD_BYTES_MAX;

const _: () = assert!(RECV_WAIT_MS_DEFAULT <= spool_wire::proto::limits::CLAIM_WAIT_MS_MAX);
const _: () = assert!(STDIN_READ_AHEAD_LINES <= SEND_IN_FLIGHT_MAX);
const _: () = assert!(REFUSED_LISTED_MAX >= 1);

// Every default inside its bound, and inside the protocol's.
const _: () = assert!(CLAIM_CREDITS_DEFAULT >= 1);
const _: () = assert!(CLAIM_CREDITS_DEFAULT <= spool_wire::proto::limits::CLAIM_CREDITS_MAX);
const _: () = assert!(CLAIM_WAIT_MS_DEFAULT <= spool_wire::proto::limits::CLAIM_WAIT_MS_MAX);
const _: () = assert!(CLAIM_BYTES_DEFAULT <= spool_wire::proto::limits::CLAIM_BYTES_MAX);
const _: () = assert!(LEASE_MS_DEFAULT >= spool_wire::proto::limits::LEASE_MS_MIN);
const _: () = assert!(DEDUPE_WINDOW_MS_DEFAULT <= spool_wire::proto::limits::DEDUPE_WINDOW_MS_MAX);
const _: () = assert!(LEASE_MS_DEFAULT <= spool_wire::proto::limits::LEASE_MS_MAX);
const _: () = assert!(CLAIMS_IN_FLIGHT_DEFAULT <= CLAIMS_IN_FLIGHT_MAX);
const _: () = assert!(CONSUMER_PREFETCH_MAX <= CONSUMER_SLOTS_MAX);
const _: () = assert!(CONSUMER_ACKS_PENDING_DEFAULT <= CONSUMER_ACKS_PENDING_MAX);
const _: () = assert!(RETRY_BACKOFF_DEFAULT.as_millis() <= RETRY_BACKOFF_MAX.as_millis());
const _: () = assert!(LEADER_WAIT_BACKOFF.as_millis() <= LEADER_WAIT_BACKOFF_MAX.as_millis());
const _: () = assert!(LEADER_WAIT_ATTEMPTS_MAX >= 1 && ROUTE_ATTEMPTS_MAX >= 1);
const _: () = assert!(BATCH_BYTES_DEFAULT <= spool_wire::limits::BATCH_BYTES_MAX);
const _: () = assert!(PRODUCER_IN_FLIGHT_PER_PARTITION_DEFAULT <= PRODUCER_IN_FLIGHT_BATCHES_MAX);
const _: () = assert!(ACK_REQUESTS_IN_FLIGHT_MAX <= IN_FLIGHT_REQUESTS_MAX);
// The probe must close a silent connection well before its requests time
// out, or it buys nothing.
const _: () = assert!(
    LIVENESS_IDLE.as_millis() + LIVENESS_TIMEOUT.as_millis() < REQUEST_TIMEOUT_DEFAULT.as_millis()
);
const _: () = assert!(LIVENESS_DURATION_MIN.as_millis() <= LIVENESS_IDLE.as_millis());
const _: () = assert!(LIVENESS_DURATION_MIN.as_millis() <= LIVENESS_TIMEOUT.as_millis());
const _: () = assert!(LIVENESS_IDLE.as_millis() <= LIVENESS_DURATION_MAX.as_millis());
const _: () = assert!(LIVENESS_TIMEOUT.as_millis() <= LIVENESS_DURATION_MAX.as_millis());

/// CLI: most live messages `spool peek --key` reads in each partition by
/// default while it looks for its key (`--scan`).
pub const PEEK_KEY_SCAN_DEFAULT: u32 = 10_000;
/// CLI: the largest `spool peek --key --scan`: a scan is Peek pages, each
/// an O(live messages) walk on the broker, so it stays an operator's look.
pub const PEEK_KEY_SCAN_MAX: u32 = 1_000_000;
/// CLI: messages `spool peek --key` asks of one Peek: the most the
/// protocol lets one ask.
pub const PEEK_PAGE_MESSAGES_MAX: u32 = spool_wire::proto::limits::INSPECT_MESSAGES_MAX;
const _: () = assert!(PEEK_KEY_SCAN_DEFAULT <= PEEK_KEY_SCAN_MAX);

/// Bytes of random salt in a secret hash made by `spool auth hash-secret`
/// (argon2's recommended 16).
pub const SALT_BYTES: usize = 16;

/// CLI: the broker's admin port (`spool auth reload`, `spool acl`, `spool
/// metrics`, `spool quota`), the broker's own `admin_listen` default.
pub const ADMIN_ADDR_DEFAULT: &str = "127.0.0.1:7480";
/// CLI: most bytes of one admin-port answer read (a `/metrics` page of
/// 10,000 queues is a few tens of MiB).
pub const ADMIN_RESPONSE_BYTES_MAX: usize = 64 << 20;
/// CLI: `spool cluster status` warns of a node that has received nothing
/// from a peer it shares partitions with for longer than this (a leader
/// heartbeats every 200 ms: seconds of silence mean the peer is down or
/// the link between the two is cut).
pub const PEER_SILENCE_WARN_MS: u64 = 5_000;
/// CLI: `spool metrics` scrapes twice this far apart to compute rates.
pub const METRICS_INTERVAL_MS_DEFAULT: u64 = 1_000;
