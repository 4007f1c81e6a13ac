//! The server's own bounds on subscriptions (`docs/design/subscriptions.md`)
//! and consumer sessions (`docs/design/sessions.md`);
//! the broker-wide ones are in `crate::limits`.

use std::time::Duration;

/// How often a shard checks that every partition it serves has the
/// subscriptions the table names (`server/subscriptions.rs`); a table
/// change starts its queue's pass at once.
pub const SUBSCRIPTION_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Most consumer sessions open at once on one shard
/// (`docs/design/sessions.md`); an open past it is refused `THROTTLED`.
pub const SESSIONS_PER_SHARD_MAX: usize = 4_096;

/// Most consumer sessions open at once on one connection (one per queue
/// and subscription it consumes); an open past it is refused
/// `INVALID_ARGUMENT`.
pub const SESSIONS_PER_CONNECTION_MAX: usize = 64;

/// Most claims one session tracks: a claim on a connection whose session
/// holds this many asks for at most the room left (`THROTTLED` with none).
pub const SESSION_CLAIMS_MAX: usize = 8_192;

/// Most claims all sessions of one shard track together (≈ 120 B each).
pub const SESSION_CLAIMS_PER_SHARD_MAX: usize = 262_144;

/// How many sessions replaced by a rejoin a shard remembers, to answer
/// their heartbeats `SESSION_FENCED` rather than `SESSION_NOT_FOUND`.
pub const SESSIONS_FENCED_REMEMBERED_MAX: usize = 4_096;

/// How often a shard looks for sessions past their heartbeat timeout
/// while any is open: a dead consumer's claims wait at most this past its
/// timeout.
pub const SESSION_SWEEP_INTERVAL: Duration = Duration::from_millis(100);

const _: () = assert!(SESSION_CLAIMS_MAX <= SESSION_CLAIMS_PER_SHARD_MAX);
const _: () = assert!(SESSIONS_PER_CONNECTION_MAX <= SESSIONS_PER_SHARD_MAX);
