//! The per-queue configuration of the state machine, validated once.
//!
//! The config decides outcomes in *decisions* (which lease is allowed, when a
//! release becomes ready, when a message is quarantined); the resulting events
//! carry those outcomes explicitly, so replay does not depend on the config
//! except for the number of bands, the fairness weights, the dedupe window
//! and whether the queue has a retention window (a record no subscription
//! has left to deliver stays in the shared index only with one; see
//! `docs/design/queue-semantics.md`). A queue's config does not change
//! after its creation.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::limits::{
    BACKOFF_CAP_MS_MAX, DEDUPE_WINDOW_MS_MAX, LEASE_LIFETIME_MS_MAX, PRIORITY_BANDS_MAX,
    PRIORITY_BANDS_MIN, QUEUE_BYTES_MAX, QUEUE_MESSAGES_MAX, RETENTION_BYTES_MIN, RETENTION_MS_MAX,
    RETENTION_MS_MIN, WEIGHT_MAX,
};
use super::types::Millis;

/// How long a released message waits before it is ready again when the
/// worker gives no `not_before`. `attempt` is the number of claims that have
/// ended without an ack, including the one being released (1 for the first).
/// Serde derives serve the control catalog (`control/catalog.rs`), which
/// persists each queue's config as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backoff {
    /// Ready again immediately.
    None,
    /// `step_ms * attempt`, capped at `max_ms`.
    Linear { step_ms: Millis, max_ms: Millis },
    /// `base_ms * 2^(attempt-1)`, capped at `max_ms`.
    Exponential { base_ms: Millis, max_ms: Millis },
}

impl Backoff {
    /// The delay before attempt `attempt + 1` may be delivered.
    pub fn delay_ms(&self, attempt: u16) -> Millis {
        let attempt = u64::from(attempt.max(1));
        match *self {
            Self::None => 0,
            Self::Linear { step_ms, max_ms } => step_ms.saturating_mul(attempt).min(max_ms),
            Self::Exponential { base_ms, max_ms } => {
                // 2^63 already saturates every millisecond value we accept.
                let shift = (attempt - 1).min(63);
                base_ms.saturating_mul(1u64 << shift).min(max_ms)
            }
        }
    }
}

/// Configuration of one queue. Build with [`QueueConfig::default`] and adjust;
/// [`QueueConfig::validate`] is called by `PartitionState::new`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// One weight per priority band (index 0 = highest priority); the number
    /// of entries is the number of bands. Weighted round-robin shares.
    pub band_weights: Vec<u32>,
    /// Share of the retry class (messages made ready again after a failed
    /// claim), served beside the bands so retries cannot crowd out new work.
    pub retry_weight: u32,
    /// A class head that has been ready this long is served before anything
    /// younger, whatever its weight: low bands never starve.
    pub age_promotion_ms: Millis,
    pub lease_default_ms: Millis,
    pub lease_min_ms: Millis,
    pub lease_max_ms: Millis,
    /// No claim lives longer than this in total, extensions included.
    pub max_lease_lifetime_ms: Millis,
    /// Claims ending without an ack before the message is quarantined.
    pub max_deliveries: u16,
    pub backoff: Backoff,
    /// A message id seen within this window is a duplicate.
    pub dedupe_window_ms: Millis,
    /// Admission limit on the messages the queue holds: every message not
    /// yet acked, expired (without dead-lettering) or purged, in either
    /// lane. Dead letters count, so a queue whose workers keep failing
    /// fills up and answers QUEUE_FULL instead of growing its dead-letter
    /// lane (and the disk it pins) without bound; acking, purging or
    /// draining dead letters makes room again, redriving does not.
    pub max_messages: u64,
    /// Admission limit on the record bytes of the messages the queue holds,
    /// counted like `max_messages` (dead letters included).
    pub max_bytes: u64,
    /// Expired messages go to the dead-letter queue instead of being counted
    /// and dropped from serving state.
    pub dead_letter_on_expiry: bool,
    /// Retention window by time: a record stays in the queue (replayable
    /// by a subscription started at or before it) until this long after
    /// its enqueue, whether or not every subscription finished it, and
    /// leaves then even if one had not (that subscription is told: its
    /// `lost` count and loss reports). 0: no window by time.
    /// `docs/design/subscriptions.md` §5.
    #[serde(default)]
    pub retention_ms: Millis,
    /// Retention window by size: the oldest records leave while the
    /// records kept for replay exceed this many bytes. 0: no window by
    /// size. With neither window a record leaves once every subscription
    /// finished it (acked, expired or purged it): the work-queue default.
    #[serde(default)]
    pub retention_bytes: u64,
    /// Ordered lanes (`docs/design/ordered-lanes.md`): at most one message
    /// per routing key is delivered at a time, in offset order; messages
    /// without a key are unordered. Set at creation, never changed.
    #[serde(default)]
    pub ordered: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            band_weights: vec![8, 4, 2, 1],
            retry_weight: 2,
            age_promotion_ms: 30_000,
            lease_default_ms: 30_000,
            lease_min_ms: 100,
            lease_max_ms: 15 * 60_000,
            max_lease_lifetime_ms: 60 * 60_000,
            max_deliveries: 5,
            backoff: Backoff::Exponential { base_ms: 1_000, max_ms: 5 * 60_000 },
            dedupe_window_ms: 5 * 60_000,
            max_messages: 10_000_000,
            max_bytes: 16 << 30,
            dead_letter_on_expiry: false,
            retention_ms: 0,
            retention_bytes: 0,
            ordered: false,
        }
    }
}

/// What is wrong with a [`QueueConfig`].
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{bands} priority bands; must be {PRIORITY_BANDS_MIN}..={PRIORITY_BANDS_MAX}")]
    BandCount { bands: usize },
    #[error("weight {weight} of {what}; must be 1..={WEIGHT_MAX}")]
    Weight { what: &'static str, weight: u32 },
    #[error("lease bounds min {min_ms} <= default {default_ms} <= max {max_ms} <= lifetime {lifetime_ms} <= {LEASE_LIFETIME_MS_MAX} violated")]
    LeaseBounds { min_ms: Millis, default_ms: Millis, max_ms: Millis, lifetime_ms: Millis },
    #[error("max_deliveries must be at least 1")]
    MaxDeliveries,
    #[error("dedupe window {0} ms exceeds {DEDUPE_WINDOW_MS_MAX} ms")]
    DedupeWindow(Millis),
    #[error("max_messages {0} must be 1..={QUEUE_MESSAGES_MAX}")]
    MaxMessages(u64),
    #[error("max_bytes {0} must be 1..={QUEUE_BYTES_MAX}")]
    MaxBytes(u64),
    #[error("backoff cap {0} ms exceeds {BACKOFF_CAP_MS_MAX} ms")]
    BackoffCap(Millis),
    #[error("retention window {0} ms must be 0 (none) or {RETENTION_MS_MIN}..={RETENTION_MS_MAX}")]
    RetentionMs(Millis),
    #[error("retention window of {bytes} bytes must be 0 (none) or {RETENTION_BYTES_MIN}..=max_bytes ({max_bytes})")]
    RetentionBytes { bytes: u64, max_bytes: u64 },
    #[error("an ordered queue keeps records until acked: it cannot have a retention window (yet)")]
    OrderedWithWindow,
}

impl QueueConfig {
    /// Number of priority bands.
    pub fn bands(&self) -> usize {
        self.band_weights.len()
    }

    /// Whether the queue keeps records for replay by a window (time or
    /// size) rather than until every subscription finished them.
    pub fn has_window(&self) -> bool {
        self.retention_ms > 0 || self.retention_bytes > 0
    }

    /// Checks every field against its bounds.
    ///
    /// # Errors
    /// The first [`ConfigError`] found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bands = self.band_weights.len();
        if !(usize::from(PRIORITY_BANDS_MIN)..=usize::from(PRIORITY_BANDS_MAX)).contains(&bands) {
            return Err(ConfigError::BandCount { bands });
        }
        for &weight in &self.band_weights {
            if !(1..=WEIGHT_MAX).contains(&weight) {
                return Err(ConfigError::Weight { what: "band", weight });
            }
        }
        if !(1..=WEIGHT_MAX).contains(&self.retry_weight) {
            return Err(ConfigError::Weight { what: "retry", weight: self.retry_weight });
        }
        let ordered = 1 <= self.lease_min_ms
            && self.lease_min_ms <= self.lease_default_ms
            && self.lease_default_ms <= self.lease_max_ms
            && self.lease_max_ms <= self.max_lease_lifetime_ms
            && self.max_lease_lifetime_ms <= LEASE_LIFETIME_MS_MAX;
        if !ordered {
            return Err(ConfigError::LeaseBounds {
                min_ms: self.lease_min_ms,
                default_ms: self.lease_default_ms,
                max_ms: self.lease_max_ms,
                lifetime_ms: self.max_lease_lifetime_ms,
            });
        }
        if self.max_deliveries == 0 {
            return Err(ConfigError::MaxDeliveries);
        }
        if self.dedupe_window_ms > DEDUPE_WINDOW_MS_MAX {
            return Err(ConfigError::DedupeWindow(self.dedupe_window_ms));
        }
        if !(1..=QUEUE_MESSAGES_MAX).contains(&self.max_messages) {
            return Err(ConfigError::MaxMessages(self.max_messages));
        }
        if !(1..=QUEUE_BYTES_MAX).contains(&self.max_bytes) {
            return Err(ConfigError::MaxBytes(self.max_bytes));
        }
        let cap = match self.backoff {
            Backoff::None => 0,
            Backoff::Linear { max_ms, .. } | Backoff::Exponential { max_ms, .. } => max_ms,
        };
        if cap > BACKOFF_CAP_MS_MAX {
            return Err(ConfigError::BackoffCap(cap));
        }
        if self.retention_ms != 0
            && !(RETENTION_MS_MIN..=RETENTION_MS_MAX).contains(&self.retention_ms)
        {
            return Err(ConfigError::RetentionMs(self.retention_ms));
        }
        if self.retention_bytes != 0
            && !(RETENTION_BYTES_MIN..=self.max_bytes).contains(&self.retention_bytes)
        {
            return Err(ConfigError::RetentionBytes {
                bytes: self.retention_bytes,
                max_bytes: self.max_bytes,
            });
        }
        if self.ordered && self.has_window() {
            return Err(ConfigError::OrderedWithWindow);
        }
        Ok(())
    }
}
