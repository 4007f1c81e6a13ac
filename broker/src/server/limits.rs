//! The server's own bounds on subscriptions (`docs/design/subscriptions.md`);
//! the broker-wide ones are in `crate::limits`.

use std::time::Duration;

/// How often a shard checks that every partition it serves has the
/// subscriptions the table names (`server/subscriptions.rs`); a table
/// change starts its queue's pass at once.
pub const SUBSCRIPTION_WATCH_INTERVAL: Duration = Duration::from_millis(250);
