//! The kill loop: SIGKILL a real `spoold` again and again under mixed load
//! and prove that nothing the broker acknowledged is lost or undone.
//!
//! Owns the run ([`run`]): start a broker ([`Spoold`]), create a queue, start
//! producers and consumers ([`workers`]), and at seeded random moments kill
//! the broker with SIGKILL, restart it on the same directory and ports, and
//! check the queue against the [`ledger`] before the load resumes. At the
//! end it stops the load, waits for every lease to run out, checks again,
//! drains the queue (claim and ack everything) and accounts for every
//! acknowledged enqueue. The result is a [`KillLoopReport`].
//!
//! What is checked (violation counters in [`Violations`]):
//! 1. every acknowledged enqueue is live, acked, or a dead letter — after
//!    each restart (a full listing of every partition) and at the end;
//! 2. no message whose ack was acknowledged is delivered again or is live;
//! 3. no token issued by a killed process is accepted by a later one (the
//!    workers' own acks/releases/extends across a kill, plus witness claims
//!    with leases long enough to outlive the restart, acked after it);
//! 4. one message id, one placement; one placement, one id (dedupe and
//!    offsets hold across restarts; producers resend the same batch bytes
//!    until answered);
//! 5. dead letters name acknowledged enqueues;
//! 6. in ordered mode ([`KillLoopConfig::ordered`]), each routing key's
//!    deliveries never go back to an earlier message and never hold two of
//!    its messages at once ([`order`]).
//!
//! Requests in flight at a kill have unknown outcome: they are never counted
//! as acknowledged. Unknown acks are resolved by the next full listing.
//!
//! Failpoint mode ([`KillLoopConfig::failpoints`]): instead of a SIGKILL at
//! a random moment, each cycle SIGKILLs the broker, restarts it with one
//! failpoint armed to abort (a `spoold-failpoints` build), lets the load
//! (plus a bulk queue that forces segment rolls) run until the process
//! aborts itself — at start-up, under load, or during the SIGTERM drain the
//! loop sends if it did not — then restarts it clean and checks as after a
//! kill. [`KillLoopReport::failpoints`] says where each point fired.
//!
//! It does not reproduce a run exactly: the seed fixes every choice (batch
//! sizes, actions, kill intervals) but not how the choices interleave with a
//! real process on a real clock. It does not edit the harness; it only uses
//! [`Spoold`].
//!
//! Files: [`config`] (the settings and their checks), `driver` (the loop:
//! load, kill, restart, check, drain, report), `broker` (the `spoold`
//! process across kills: ports, restarts, failpoint cycles and their bulk
//! load), `check` (the orchestrator's own requests: the full listing of
//! every partition, witness claims, the final drain), [`report`] (what a
//! run saw), [`ledger`] (what was acknowledged, and the checks against it),
//! [`workers`] (the producers and consumers), [`rng`] (seeded choices),
//! `second` (a second subscription of the queue: made, drained and
//! accounted for with its own ledger), `sessions` (ordered mode's
//! consumers: claims under consumer sessions, connections dropped while
//! holding claims), [`order`] (the per-key order check).
//!
//! Ordered mode: the queue is ordered, producers give each record one of a
//! few routing keys (a key always to one partition), and the consumers
//! claim under consumer sessions (`docs/design/sessions.md`) and now and
//! then drop their client, connections and sessions at once while holding
//! claims, which the broker then releases (`SESSION_ENDED`).

mod broker;
mod check;
pub mod config;
mod driver;
pub mod ledger;
pub mod order;
pub mod report;
pub mod rng;
mod second;
mod sessions;
pub mod workers;

use std::time::Instant;

use spool_client::spool_wire::proto::DeliveryToken;
use spool_client::Delivery;

use ledger::{DeliverySeen, Placement, Seq};

pub use config::{FailpointArm, KillLoopConfig};
pub use driver::run;
pub use report::{FailpointOutcome, FiredAt, KillLoopReport, SubscriptionReport};

/// Name of the queue the loop runs on.
pub const QUEUE: &str = "killloop";

/// Queue of the bulk load in failpoint mode (1 partition, large records, so
/// its segments roll and, once acked, are deleted at the next checkpoint).
pub const BULK_QUEUE: &str = "killloop-bulk";

/// The leader epoch a delivery token names (bytes 24..32, little-endian;
/// `docs/design/queue-semantics.md`, "Delivery token").
pub(crate) fn token_epoch(token: &DeliveryToken) -> u64 {
    let mut epoch = [0u8; 8];
    epoch.copy_from_slice(&token.0[24..32]);
    u64::from_le_bytes(epoch)
}

/// What a claimed `delivery` tells the ledger; `claim_sent` is when its
/// claim was sent.
pub(crate) fn delivery_seen(delivery: &Delivery, claim_sent: Seq) -> DeliverySeen {
    DeliverySeen {
        id: delivery.message_id(),
        placement: Placement::new(delivery.partition(), delivery.offset()),
        generation: delivery.generation(),
        epoch: token_epoch(&delivery.token()),
        claim_sent,
    }
}

/// Wall-clock now (see [`crate::now`]).
pub fn now() -> Instant {
    crate::now()
}

/// Unix ms now, comparable with the broker's lease deadlines (same host).
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// Why a run could not finish (violations are not errors: they are in the
/// report).
#[derive(Debug)]
#[non_exhaustive]
pub enum KillLoopError {
    /// A setting is out of range.
    Config(String),
    /// The queue or a batch could not be set up.
    Setup(String),
    /// The broker answered something that does not fit the request.
    Protocol(String),
    /// A request kept failing after a restart, or the drain did not finish.
    Stuck(String),
    /// A worker task panicked or was cancelled.
    Worker(String),
}

impl std::fmt::Display for KillLoopError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(text) => write!(formatter, "invalid configuration: {text}"),
            Self::Setup(text) => write!(formatter, "setup failed: {text}"),
            Self::Protocol(text) => write!(formatter, "protocol: {text}"),
            Self::Stuck(text) => write!(formatter, "stuck: {text}"),
            Self::Worker(text) => write!(formatter, "worker failed: {text}"),
        }
    }
}

impl std::error::Error for KillLoopError {}
