//! Named bounds of the HTTP API. Every value a request names that the
//! binary protocol also bounds (credits, waits, tokens per ack) is bounded
//! here too, lower where an HTTP answer is held in memory as JSON; the
//! broker then applies its own rules to whatever passes.

use std::time::Duration;

use spool_wire::proto::limits::{ACK_TOKENS_MAX, CLAIM_CREDITS_MAX, CLAIM_WAIT_MS_MAX};
use spool_wire::proto::limits::{INSPECT_MESSAGES_MAX, QUEUE_NAME_BYTES_MAX};

/// Largest request body: an inline payload at its limit
/// (`PAYLOAD_INLINE_BYTES_MAX`, just under 1 MiB) sent as base64 (4/3 of
/// it) with room for the other fields. A longer body is refused with 413
/// `FRAME_TOO_LARGE` before it is read.
pub const BODY_BYTES_MAX: usize = 2 << 20;

/// A request body must arrive within this once its headers have.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an API request waits in line for its body's bytes from the
/// admin port's memory pool (`admin/memory.rs`) before it is answered 503
/// `THROTTLED` with the pool's figures. Half of [`BODY_READ_TIMEOUT`]: a
/// stalled body holds its bytes up to that long, and a caller behind
/// stalled bodies is better told to retry (`Retry-After`) than held for
/// the whole stall; still long enough to ride out a burst of large answers
/// being written.
pub const MEMORY_WAIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer the admin pool's floor plans for: a claim's
/// [`CLAIM_BYTES_MAX_HTTP`] of binary records as base64 (4/3 of them) with
/// [`CLAIM_CREDITS_MAX_HTTP`] deliveries' other fields (a token and
/// ≤ 256 bytes of numbers and names each). Answers past it (text payloads
/// escaped to JSON, listings of thousands of queues, a metrics page of
/// thousands of partitions) are charged all the same, over the pool's size.
pub const ANSWER_BYTES_PLANNED: usize = 2 << 20;

/// API requests served at once over all admin connections; one more is
/// answered 429 `THROTTLED` at once. Below the broker's default bound on
/// waiting claims per connection (64), since the gateway's claims share
/// one connection per shard.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 32;

/// Most deliveries one HTTP claim asks for: each is held as JSON in the
/// answer.
pub const CLAIM_CREDITS_MAX_HTTP: u32 = 256;

/// Most record bytes one HTTP claim asks for (also its default).
pub const CLAIM_BYTES_MAX_HTTP: u32 = 1 << 20;

/// Longest long-poll of an HTTP claim.
pub const CLAIM_WAIT_MS_MAX_HTTP: u32 = 30_000;

/// Most tokens in one `POST /v1/acks` (the protocol's own bound).
pub const ACK_TOKENS_MAX_HTTP: usize = ACK_TOKENS_MAX as usize;

/// Most dead letters one `GET .../dead-letters` lists (the protocol's
/// bound on one inspect request), and its default.
pub const DEAD_LETTERS_MAX_HTTP: u32 = INSPECT_MESSAGES_MAX;

/// Dead letters listed when the request names no `max`.
pub const DEAD_LETTERS_DEFAULT_HTTP: u32 = 100;

/// Most loss reports a subscription's row lists
/// (`/v1/queues/{q}/subscriptions[/{name}]`): the newest over its
/// partitions; each partition keeps its own newest `LOSS_REPORTS_MAX`, and
/// the row's `lost` counts every record lost.
pub const LOSSES_LISTED_MAX_HTTP: usize = crate::queue::limits::LOSS_REPORTS_MAX;

/// Longest token string accepted: the base64 of the largest token layout
/// (format byte, partition, name length, the longest name, the token).
pub const TOKEN_TEXT_BYTES_MAX: usize =
    (1 + 4 + 1 + QUEUE_NAME_BYTES_MAX + spool_wire::proto::DELIVERY_TOKEN_BYTES).div_ceil(3) * 4;

/// How long the gateway waits for a shard's answer (a claim adds its wait).
pub const SHARD_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

const _: () = assert!(CLAIM_CREDITS_MAX_HTTP <= CLAIM_CREDITS_MAX);
const _: () = assert!(CLAIM_WAIT_MS_MAX_HTTP <= CLAIM_WAIT_MS_MAX);
const _: () = assert!(DEAD_LETTERS_DEFAULT_HTTP <= DEAD_LETTERS_MAX_HTTP);
const _: () = assert!(BODY_BYTES_MAX > spool_wire::limits::PAYLOAD_INLINE_BYTES_MAX / 3 * 4);

/// Callers (principal and secret) whose shard connections the gateway keeps
/// open at once; each holds one connection per shard, counted against
/// `connections_per_shard_max`.
pub const GATEWAY_CALLERS_MAX: usize = 64;
// The gateway's claims share one connection per shard: all of them may wait
// at once without reaching that connection's default bound on waiting claims.
const _: () =
    assert!(REQUESTS_IN_FLIGHT_MAX as u32 <= crate::limits::CLAIM_WAITERS_PER_CONNECTION_DEFAULT);
const _: () = assert!(CLAIM_BYTES_MAX_HTTP <= spool_wire::proto::limits::CLAIM_BYTES_MAX);
const _: () = assert!(
    ANSWER_BYTES_PLANNED
        >= (CLAIM_BYTES_MAX_HTTP as usize).div_ceil(3) * 4
            + CLAIM_CREDITS_MAX_HTTP as usize * (TOKEN_TEXT_BYTES_MAX + 256)
);
// The admin pool is carved in `control/` (below this layer) from the
// broker's limits: tie them to the bounds they are planned from here.
const _: () = assert!(
    crate::limits::MEMORY_ADMIN_REQUEST_BYTES >= (BODY_BYTES_MAX + ANSWER_BYTES_PLANNED) as u64
);
const _: () = assert!(crate::limits::MEMORY_ADMIN_REQUESTS_MAX == REQUESTS_IN_FLIGHT_MAX as u64);
const _: () = assert!(MEMORY_WAIT_TIMEOUT.as_millis() < BODY_READ_TIMEOUT.as_millis());
