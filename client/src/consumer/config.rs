//! A [`Consumer`](super::Consumer)'s settings: [`ConsumerConfig`] with its
//! defaults and its checks, the room they add up to (slots plus prefetch)
//! and a claim's share of it, and the observer hooks a config may carry.
//!
//! It must hold settings only: nothing here claims, acks or counts.

use std::sync::Arc;
use std::time::Duration;

use spool_wire::proto::limits::{
    ACK_TOKENS_MAX, CLAIM_BYTES_MAX, CLAIM_WAIT_MS_MAX, LEASE_MS_MAX, SESSION_MEMBER_BYTES_MAX,
    SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};
use spool_wire::proto::WorkerId;

use crate::error::ClientError;
use crate::limits::{
    ACK_LINGER_DEFAULT, CLAIMS_IN_FLIGHT_DEFAULT, CLAIMS_IN_FLIGHT_MAX, CLAIM_BYTES_DEFAULT,
    CLAIM_WAIT_MS_DEFAULT, CONSUMER_ACKS_PENDING_DEFAULT, CONSUMER_ACKS_PENDING_MAX,
    CONSUMER_PREFETCH_MAX, CONSUMER_SLOTS_MAX, LEASE_MS_DEFAULT, SESSION_TIMEOUT_MS_DEFAULT,
};

/// Called once per answered Ack request with its round trip (request sent
/// → broker's answer) and the number of tokens it carried; for latency
/// figures of the ack path (benchmarks, a user's own metrics). It runs on
/// the consumer's ack task: keep it short.
pub type AckObserver = Arc<dyn Fn(Duration, usize) + Send + Sync>;

/// Called once per answered Claim request with its round trip (request
/// sent → broker's answer), the credits it asked for and the deliveries it
/// brought; for figures of the claim path (benchmarks, a user's own
/// metrics). It runs on the claim's task: keep it short.
pub type ClaimObserver = Arc<dyn Fn(Duration, u32, usize) + Send + Sync>;

/// Settings of a [`Consumer`](super::Consumer).
#[derive(Clone)]
pub struct ConsumerConfig {
    /// The queue to consume.
    pub queue: String,
    /// The subscription of the queue consumed, by name; `None` (the
    /// default): the queue's default subscription, claimed as before
    /// subscriptions (see [`ClaimOptions`](crate::ClaimOptions)'s
    /// `subscription`).
    pub subscription: Option<String>,
    /// Execution slots: deliveries handled at once, `1..=CONSUMER_SLOTS_MAX`.
    pub slots: u32,
    /// Lease asked for per claim and per extension.
    pub lease_ms: u32,
    /// Long-poll wait of a claim after an empty sweep, `0..=CLAIM_WAIT_MS_MAX`.
    pub wait_ms: u32,
    /// Record bytes asked for per claim.
    pub max_bytes: u32,
    /// Bound into delivery tokens; random by default.
    pub worker: WorkerId,
    /// How often a running handler's lease is extended; half the lease when
    /// `None`.
    pub extend_interval: Option<Duration>,
    /// Release delay on handler failure (0 = the queue's backoff policy).
    pub release_delay_ms: u32,
    /// Claims outstanding at once, `1..=CLAIMS_IN_FLIGHT_MAX`.
    pub claims_in_flight: u32,
    /// Most tokens in one Ack request, `1..=ACK_TOKENS_MAX`.
    pub ack_batch_max: u32,
    /// How long a completed delivery may wait for company before its Ack is
    /// sent (zero: send with whatever else already completed).
    pub ack_linger: Duration,
    /// Deliveries claimed ahead of a free slot, `0..=CONSUMER_PREFETCH_MAX`.
    pub prefetch: u32,
    /// Completed deliveries whose Ack is not answered yet, at most
    /// `1..=CONSUMER_ACKS_PENDING_MAX`; a handler finishing past it keeps its
    /// slot until an Ack answer makes room.
    pub acks_pending_max: u32,
    /// Sees every answered Ack request ([`AckObserver`]); none by default.
    pub ack_observer: Option<AckObserver>,
    /// Sees every answered Claim request ([`ClaimObserver`]); none by default.
    pub claim_observer: Option<ClaimObserver>,
    /// The timeout of the consumer's session on each shard it claims from
    /// (`docs/design/sessions.md`): its claims there are released at once
    /// when it stops heartbeating for this long or its connection ends.
    /// `SESSION_TIMEOUT_MS_DEFAULT` by default; `None`: no sessions, the
    /// claims live by their leases alone.
    pub session_timeout_ms: Option<u32>,
    /// How often a session heartbeats; a third of its timeout when `None`.
    pub session_heartbeat: Option<Duration>,
    /// The member id the sessions are opened under (a rejoin under the
    /// same id fences the older session); `worker-<worker id>` when `None`.
    pub member: Option<String>,
}

impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("queue", &self.queue)
            .field("subscription", &self.subscription)
            .field("slots", &self.slots)
            .field("lease_ms", &self.lease_ms)
            .field("wait_ms", &self.wait_ms)
            .field("max_bytes", &self.max_bytes)
            .field("worker", &self.worker)
            .field("extend_interval", &self.extend_interval)
            .field("release_delay_ms", &self.release_delay_ms)
            .field("claims_in_flight", &self.claims_in_flight)
            .field("ack_batch_max", &self.ack_batch_max)
            .field("ack_linger", &self.ack_linger)
            .field("prefetch", &self.prefetch)
            .field("acks_pending_max", &self.acks_pending_max)
            .field("ack_observer", &self.ack_observer.as_ref().map(|_| "set"))
            .field("claim_observer", &self.claim_observer.as_ref().map(|_| "set"))
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("session_heartbeat", &self.session_heartbeat)
            .field("member", &self.member)
            .finish()
    }
}

impl ConsumerConfig {
    /// Defaults for `queue` with `slots` execution slots.
    pub fn new(queue: impl Into<String>, slots: u32) -> Self {
        Self {
            queue: queue.into(),
            subscription: None,
            slots,
            lease_ms: LEASE_MS_DEFAULT,
            wait_ms: CLAIM_WAIT_MS_DEFAULT,
            max_bytes: CLAIM_BYTES_DEFAULT,
            worker: WorkerId(rand::random()),
            extend_interval: None,
            release_delay_ms: 0,
            claims_in_flight: CLAIMS_IN_FLIGHT_DEFAULT,
            ack_batch_max: ACK_TOKENS_MAX,
            ack_linger: ACK_LINGER_DEFAULT,
            prefetch: 0,
            acks_pending_max: CONSUMER_ACKS_PENDING_DEFAULT,
            ack_observer: None,
            claim_observer: None,
            session_timeout_ms: Some(SESSION_TIMEOUT_MS_DEFAULT),
            session_heartbeat: None,
            member: None,
        }
    }

    /// Claims without sessions: a dead consumer's claims come back when
    /// their leases run out, as before sessions.
    ///
    /// ```
    /// let config = spool_client::ConsumerConfig::new("jobs", 8).without_session();
    /// assert_eq!(config.session_timeout_ms, None);
    /// ```
    #[must_use]
    pub fn without_session(mut self) -> Self {
        self.session_timeout_ms = None;
        self
    }

    /// Opens sessions with this timeout (see `session_timeout_ms`).
    #[must_use]
    pub fn session_timeout_ms(mut self, timeout_ms: u32) -> Self {
        self.session_timeout_ms = Some(timeout_ms);
        self
    }

    /// The member id sessions are opened under.
    pub(super) fn member_id(&self) -> String {
        self.member.clone().unwrap_or_else(|| format!("worker-{:016x}", self.worker.0))
    }

    /// How often sessions heartbeat.
    pub(super) fn heartbeat_every(&self) -> Duration {
        self.session_heartbeat.unwrap_or_else(|| {
            Duration::from_millis(u64::from(self.session_timeout_ms.unwrap_or(0).div_ceil(3)))
        })
    }

    /// Consumes the subscription named `name` instead of the queue's
    /// default one.
    ///
    /// ```
    /// let config = spool_client::ConsumerConfig::new("jobs", 8).subscription("audit");
    /// assert_eq!(config.subscription.as_deref(), Some("audit"));
    /// ```
    #[must_use]
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.subscription = Some(name.into());
        self
    }

    pub(super) fn validate(&self) -> Result<(), ClientError> {
        spool_wire::proto::validate_queue_name(&self.queue)?;
        if let Some(name) = &self.subscription {
            spool_wire::proto::validate_subscription_name(name)?;
        }
        let check =
            |ok: bool, what: String| if ok { Ok(()) } else { Err(ClientError::Config(what)) };
        check(
            (1..=CONSUMER_SLOTS_MAX).contains(&self.slots),
            format!("slots {} outside 1..={CONSUMER_SLOTS_MAX}", self.slots),
        )?;
        check(
            (1..=LEASE_MS_MAX).contains(&self.lease_ms),
            format!("lease_ms {} outside 1..={LEASE_MS_MAX}", self.lease_ms),
        )?;
        check(
            self.wait_ms <= CLAIM_WAIT_MS_MAX,
            format!("wait_ms {} above {CLAIM_WAIT_MS_MAX}", self.wait_ms),
        )?;
        check(
            (1..=CLAIM_BYTES_MAX).contains(&self.max_bytes),
            format!("max_bytes {} outside 1..={CLAIM_BYTES_MAX}", self.max_bytes),
        )?;
        check(
            (1..=CLAIMS_IN_FLIGHT_MAX).contains(&self.claims_in_flight),
            format!(
                "claims_in_flight {} outside 1..={CLAIMS_IN_FLIGHT_MAX}",
                self.claims_in_flight
            ),
        )?;
        check(
            (1..=ACK_TOKENS_MAX).contains(&self.ack_batch_max),
            format!("ack_batch_max {} outside 1..={ACK_TOKENS_MAX}", self.ack_batch_max),
        )?;
        check(
            self.prefetch <= CONSUMER_PREFETCH_MAX,
            format!("prefetch {} above {CONSUMER_PREFETCH_MAX}", self.prefetch),
        )?;
        check(
            (1..=CONSUMER_ACKS_PENDING_MAX).contains(&self.acks_pending_max),
            format!(
                "acks_pending_max {} outside 1..={CONSUMER_ACKS_PENDING_MAX}",
                self.acks_pending_max
            ),
        )?;
        check(
            self.extend_interval.is_none_or(|interval| !interval.is_zero()),
            "extend_interval must be positive".to_owned(),
        )?;
        if let Some(timeout_ms) = self.session_timeout_ms {
            check(
                (SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&timeout_ms),
                format!(
                    "session_timeout_ms {timeout_ms} outside \
                     {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX}"
                ),
            )?;
            let every = self.heartbeat_every();
            check(
                !every.is_zero() && every < Duration::from_millis(u64::from(timeout_ms)),
                format!("session_heartbeat {every:?} must be positive and below the timeout"),
            )?;
            let member = self.member_id();
            check(
                (1..=SESSION_MEMBER_BYTES_MAX).contains(&member.len()),
                format!(
                    "member id of {} bytes outside 1..={SESSION_MEMBER_BYTES_MAX}",
                    member.len()
                ),
            )?;
        }
        Ok(())
    }

    /// Deliveries held at once: running or waiting for a slot.
    pub(super) fn window(&self) -> u32 {
        self.slots + self.prefetch
    }

    /// Free room a claim waits for while another claim is outstanding.
    pub(super) fn claim_share(&self) -> u32 {
        (self.window() / self.claims_in_flight).max(1)
    }

    pub(super) fn extend_every(&self) -> Duration {
        self.extend_interval
            .unwrap_or_else(|| Duration::from_millis(u64::from(self.lease_ms.div_ceil(2))))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    // Goal: sessions are on by default and their settings are checked by
    // name. Method: the default, then each bound broken once.
    #[test]
    fn session_settings_are_checked() {
        let config = ConsumerConfig::new("jobs", 4);
        assert_eq!(config.session_timeout_ms, Some(SESSION_TIMEOUT_MS_DEFAULT));
        config.validate().unwrap();
        assert_eq!(config.heartbeat_every(), Duration::from_millis(3_334));
        assert!(config.member_id().starts_with("worker-"));
        let short = config.clone().session_timeout_ms(SESSION_TIMEOUT_MS_MIN - 1);
        assert!(short.validate().unwrap_err().to_string().contains("session_timeout_ms"));
        let mut slow = config.clone();
        slow.session_heartbeat = Some(Duration::from_secs(20));
        assert!(slow.validate().unwrap_err().to_string().contains("session_heartbeat"));
        let mut long = config.clone();
        long.member = Some("m".repeat(SESSION_MEMBER_BYTES_MAX + 1));
        assert!(long.validate().unwrap_err().to_string().contains("member id"));
        config.without_session().validate().unwrap();
    }
}
