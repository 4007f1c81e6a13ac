//! The settings of a kill-loop run ([`KillLoopConfig`]), their checks, and
//! the queue they describe.

use std::path::PathBuf;
use std::time::Duration;

use spool_client::spool_wire::proto::QueueConfig;

use super::{workers, KillLoopError};
use crate::test_queue_config;

/// Lowest delivery limit of ordered mode: high enough that no message is
/// dead-lettered in a run.
const ORDERED_MAX_DELIVERIES_MIN: u32 = 1_000;

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct KillLoopConfig {
    /// Kills (and restarts) to perform.
    pub kills: u32,
    /// Seed of every random choice.
    pub seed: u64,
    /// Broker shards (`--cores`).
    pub cores: u16,
    /// Partitions of the queue.
    pub partitions: u32,
    /// Priority bands of the queue; records use all of them.
    pub priority_bands: u8,
    /// Producer tasks.
    pub producers: u32,
    /// Consumer tasks.
    pub consumers: u32,
    /// Shortest time between a restart and the next kill.
    pub kill_interval_ms_min: u64,
    /// Longest time between a restart and the next kill.
    pub kill_interval_ms_max: u64,
    /// Lease of the consumers' claims (also the queue's default).
    pub lease_ms: u32,
    /// Lease of witness claims: must outlive a restart so their refusal
    /// after it is due to the kill, not to expiry.
    pub witness_lease_ms: u32,
    /// Producers pause while this many acknowledged enqueues are unacked.
    pub backlog_max: usize,
    /// Most records per enqueue batch.
    pub batch_records_max: u32,
    /// Most credits per consumer claim.
    pub claim_credits_max: u32,
    /// Usual longest handler time (some handlers outlive the lease anyway).
    pub hold_ms_max: u64,
    /// Longest delay of a release.
    pub release_delay_ms_max: u64,
    /// Share of records enqueued with a `not_before`, in percent.
    pub scheduled_percent: u64,
    /// Longest `not_before` delay of a scheduled record.
    pub schedule_delay_ms_max: u64,
    /// `max_deliveries` of the queue: high, so nothing is quarantined unless
    /// something is wrong (dead letters are accounted for anyway).
    pub max_deliveries: u32,
    /// How long the final drain may take.
    pub drain_timeout: Duration,
    /// Print a line per kill on stderr.
    pub progress: bool,
    /// Failpoint mode: one armed point per cycle instead of a plain kill
    /// (then `kills` must equal its length). Empty: plain SIGKILLs.
    pub failpoints: Vec<FailpointArm>,
    /// The `spoold` binary (a failpoint build); `None`: the ordinary one.
    pub spoold_bin: Option<PathBuf>,
    /// More `spoold` flags, after the harness's own (a later flag wins),
    /// on every start: e.g. `--journal-retain-bytes 0`.
    pub spoold_args: Vec<String>,
    /// A second subscription of the queue (from its earliest record, made
    /// before any load), consumed by `consumers` more consumers and held
    /// to the same contract with its own ledger; `None`: the default only.
    pub subscription: Option<String>,
    /// Ordered mode: the queue is ordered (`docs/design/ordered-lanes.md`),
    /// every record has one of [`keys`](Self::keys) routing keys (a key
    /// always to the same partition), the consumers claim under sessions
    /// and drop their connections at random while holding claims, and the
    /// ledger checks each key's order (`order.rs`).
    pub ordered: bool,
    /// Routing keys of ordered mode.
    pub keys: u32,
}

/// One failpoint armed for one cycle: `point=abort@from_hit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointArm {
    /// A name of `spool_broker::failpoint::POINTS`.
    pub point: String,
    /// Fires from this hit on (1-based).
    pub from_hit: u64,
}

impl KillLoopConfig {
    /// Settings for a long run: kills every 0.5–2 s, a 2 s lease.
    pub fn new(kills: u32, seed: u64) -> Self {
        Self {
            kills,
            seed,
            cores: 2,
            partitions: 4,
            priority_bands: 4,
            producers: 2,
            consumers: 3,
            kill_interval_ms_min: 500,
            kill_interval_ms_max: 2_000,
            lease_ms: 2_000,
            witness_lease_ms: 15_000,
            backlog_max: 4_000,
            batch_records_max: 32,
            claim_credits_max: 32,
            hold_ms_max: 300,
            release_delay_ms_max: 1_000,
            scheduled_percent: 15,
            schedule_delay_ms_max: 2_000,
            max_deliveries: 10_000,
            drain_timeout: Duration::from_secs(120),
            progress: false,
            failpoints: Vec::new(),
            spoold_bin: None,
            spoold_args: Vec::new(),
            subscription: None,
            ordered: false,
            keys: 32,
        }
    }

    /// Settings for a quick run in a debug build (the test): kills every
    /// 0.1–0.4 s, a smaller load, shorter delays.
    pub fn quick(kills: u32, seed: u64) -> Self {
        Self {
            kill_interval_ms_min: 100,
            kill_interval_ms_max: 400,
            witness_lease_ms: 8_000,
            backlog_max: 1_000,
            batch_records_max: 16,
            claim_credits_max: 16,
            hold_ms_max: 150,
            release_delay_ms_max: 500,
            schedule_delay_ms_max: 1_000,
            drain_timeout: Duration::from_secs(60),
            ..Self::new(kills, seed)
        }
    }

    /// Checks ranges the loop relies on.
    ///
    /// # Errors
    /// [`KillLoopError::Config`] naming the bad setting.
    pub fn validate(&self) -> Result<(), KillLoopError> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(KillLoopError::Config(what.to_owned()))
            }
        };
        check(self.cores >= 1, "cores must be at least 1")?;
        check(self.partitions >= 1, "partitions must be at least 1")?;
        check(
            (1..=spool_client::spool_wire::limits::PRIORITY_BANDS_MAX)
                .contains(&self.priority_bands),
            "priority_bands out of range",
        )?;
        check(self.producers >= 1 && self.consumers >= 1, "need producers and consumers")?;
        check(self.kill_interval_ms_min <= self.kill_interval_ms_max, "kill interval min > max")?;
        check(self.lease_ms >= 50, "lease_ms below the queue's 50 ms minimum")?;
        check(
            self.witness_lease_ms > self.lease_ms && self.witness_lease_ms <= 60_000,
            "witness_lease_ms must be above lease_ms and at most 60 s",
        )?;
        check(self.batch_records_max >= 1, "batch_records_max must be at least 1")?;
        check(
            (1..=workers::CONSUMER_HANDLERS_MAX as u32).contains(&self.claim_credits_max),
            "claim_credits_max out of range",
        )?;
        check(self.schedule_delay_ms_max >= 50, "schedule_delay_ms_max below 50")?;
        check(
            self.failpoints.is_empty() || self.failpoints.len() == self.kills as usize,
            "failpoint mode needs one failpoint per kill",
        )?;
        check(
            self.failpoints.is_empty() || self.spoold_bin.is_some(),
            "failpoint mode needs a failpoint build of spoold (spoold_bin)",
        )?;
        check(
            self.subscription.as_deref().is_none_or(|name| {
                name != "default"
                    && spool_client::spool_wire::proto::validate_subscription_name(name).is_ok()
            }),
            "subscription must be a valid name other than `default`",
        )?;
        check(!self.ordered || self.keys >= 1, "ordered mode needs at least one key")?;
        // An ordered queue has its default subscription only, and a dead
        // letter would finish a key's message where the ledger cannot see
        // it (the order check would count a false overlap).
        check(
            !self.ordered || self.subscription.is_none(),
            "an ordered queue has no second subscription",
        )?;
        check(
            !self.ordered || self.max_deliveries >= ORDERED_MAX_DELIVERIES_MIN,
            "ordered mode needs max_deliveries of at least 1,000 (no dead letters)",
        )?;
        check(self.backlog_max >= 1, "backlog_max must be at least 1")
    }

    pub(super) fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            priority_bands: self.priority_bands,
            ordered: self.ordered,
            ..test_queue_config(self.partitions, self.lease_ms, self.max_deliveries)
        }
    }
}
