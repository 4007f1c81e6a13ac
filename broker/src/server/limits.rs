//! The server's own bounds on subscriptions (`docs/design/subscriptions.md`);
//! the broker-wide ones are in `crate::limits`.

use std::time::Duration;

/// How often a shard checks that every partition it serves has the
/// subscriptions the table names (`server/subscriptions.rs`); a table
/// change starts its queue's pass at once.
pub const SUBSCRIPTION_WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// How often a Claim of partition ANY in a subscription other than the
/// default looks again while it waits (`server/claim_sub.rs`).
pub const SUBSCRIPTION_CLAIM_POLL: Duration = Duration::from_millis(20);
