//! End-to-end tests against real `spoold` processes (see `spool_tests`).
//!
//! One test binary with a module per area, so the client and tokio are
//! linked once; nextest still runs every test in its own process.
//!
//! - `admin`: the admin port: metrics that move as operations happen and
//!   parse, health live/ready (not ready with a refused partition).
//! - `http_api`: the JSON HTTP API of the admin port: every route, the
//!   stable codes of its refusals, the OpenAPI document against the routes.
//! - `ops`: every protocol operation through the client library.
//! - `cli`: every `spool` command against a live broker; streamed output
//!   that matches what the broker stored after a mid-stream stop; the total
//!   `recv --wait-ms`; terminal-safe tables.
//! - `claim_any`: one deadline over every partition, woken by any of them,
//!   nothing lost to unwanted deliveries; public shard addresses.
//! - `claim_shard`: Claim v1 of partition ANY: one claim per shard gets its
//!   partitions' messages, long-polls, oldest first; its wire refusals; cancel.
//! - `lagging`: a consumer behind the commit cache over 100 partitions
//!   reads the shard's journal about once, not once per partition.
//! - `pace`: a saturating producer is held to its consumers' pace; a burst
//!   alone, the pace turned off, or a connection that also claims never is.
//! - `lease`: the lease trace over the network (expiry, generation, stale ack).
//! - `routing`: `NOT_OWNER` on the wrong shard and the client following it.
//! - `load`: 2 producers, 4 consumers, exactly-once acks of every message.
//! - `restart`: SIGTERM and SIGKILL mid-stream keep every acknowledged change.
//! - `faults`: bad frames close only their connection; one broker per data dir.
//! - `inputs`: refused inputs get clear answers and leave nothing behind.
//! - `memory`: RSS after a drained backlog is the baseline plus the caches.
//! - `scale`: a 256-partition queue is small on disk; partition limits are typed errors.
//! - `sub_admin`: subscriptions created, described (DescribeQueue v2), consumed
//!   and deleted over the wire with the client's `Admin`; refusals and rights.
//! - `inspect_sub`: peek, dead letters, redrive and purge in one subscription
//!   (v2 of the four, the CLI's `--sub`), the others untouched; audit lines.
//! - `sessions`: consumer sessions: a SIGKILLed worker's claims (60 s
//!   lease, 2 s session) come back at once, a quiet session times out, a
//!   close releases at once with its reason, a rejoin fences, a dead
//!   `Consumer` releases through its default session; no session, no change.
//! - `ordered`: 100 keys × 1,000 messages of an ordered queue through
//!   releases, SIGKILLed session workers and broker SIGKILLs; a (key,
//!   sequence) checker finds no message delivered before an earlier one of
//!   its key finished.
//! - `ordered_admin`: an ordered queue over HTTP, its lane figures in
//!   describe and metrics, `spool peek --key`.
//! - `window`: a retention window drops exactly the unread records it
//!   passed (by offset, in the loss reports, across a SIGKILL); `earliest`
//!   replays the records still inside it.

// Helpers outside `#[test]` functions unwrap too: a failed step is a failed
// test.
#![allow(clippy::unwrap_used)]

mod admin;
mod claim_any;
mod claim_shard;
mod cli;
mod common;
mod faults;
mod http_api;
mod inputs;
mod inspect_sub;
mod lagging;
mod lease;
mod load;
mod memory;
mod ops;
mod ordered;
mod ordered_admin;
mod pace;
mod resize;
mod restart;
mod routing;
mod scale;
mod sessions;
mod stream;
mod sub_admin;
mod subscriptions;
mod window;
