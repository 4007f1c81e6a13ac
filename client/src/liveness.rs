//! The liveness probe of one connection: when a broker that has requests
//! of ours has sent nothing for a while, ask it something it answers at
//! once (a Ping, api key 8), and close the connection when even that goes
//! unanswered.
//!
//! Why: a hung broker (a stopped process, a frozen host) keeps its sockets
//! open and answers nothing; without a probe every request on it waits out
//! its request timeout (30 s by default) before its caller reroutes, while
//! a cluster has elected another leader within 2 s. The probe turns that
//! into [`Liveness::idle`] + [`Liveness::timeout`] (2 + 5 s by default).
//!
//! The rule, kept by [`Watch`] (pure: time comes in as an argument; the
//! reader task of `connection.rs` performs what it decides):
//!
//! - The clock is the silence: time since the broker last sent anything
//!   (any bytes: a response, an error frame, part of a large frame), or
//!   since the connection last went from no request outstanding to one,
//!   whichever is later. A connection with nothing outstanding is never
//!   probed: an idle connection owes nobody an answer.
//! - After `idle` of silence one Ping is sent (at most one outstanding:
//!   anything heard settles it). After `timeout` more of silence the
//!   connection closes, every request outstanding fails with
//!   `ConnectionClosed`, and callers reroute (the `Client` drops the
//!   queue's cached metadata; the `Producer` resends the same bytes, so
//!   the broker's dedupe absorbs an enqueue that did land).
//!
//! Why it does not misfire on a broker that is merely slow:
//!
//! - Anything received resets the clock, so a broker answering slowly but
//!   steadily never reaches `idle`.
//! - A long-polling Claim is answered only after its wait, but the broker
//!   answers the Ping at once beside it (responses complete in any order;
//!   it touches no partition, disk or other core), so the clock restarts.
//! - The broker reads no more frames from a connection with
//!   `in_flight_per_connection_max` (128) requests being handled, so a Ping
//!   may sit unread behind them; but requests being handled are answered,
//!   and each answer resets the clock. At most half of that bound may be
//!   long-polling Claims (the broker answers `THROTTLED` past
//!   `claim_waiters_per_connection_max`), so the others are requests that
//!   answer within a commit: a connection can go silent for `idle` +
//!   `timeout` behind its own requests only if the broker answers none of
//!   them for that long, which is the hang this probe is for. The same
//!   holds of the broker's other reasons to stop reading a connection for
//!   a while (its memory pools, the consumer pace): they last as long as
//!   requests take to answer.
//!
//! What it does not do: judge a partition. A broker that answers the Ping
//! but cannot commit (a leader cut off from its quorum) keeps the
//! connection; its requests end by their own timeout or `NOT_LEADER`. And
//! it counts from when a request is queued for the socket, so a link so
//! slow that one frame takes longer than `idle` + `timeout` to upload,
//! while the broker has nothing else to answer, needs longer settings or
//! `liveness: None`.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ClientError;
use crate::limits::{
    LIVENESS_DURATION_MAX, LIVENESS_DURATION_MIN, LIVENESS_IDLE, LIVENESS_TIMEOUT,
};

/// The liveness probe's two durations (module doc of `liveness`): after
/// `idle` of silence with requests outstanding one Ping is sent; after
/// `timeout` more the connection is closed as unresponsive. On by default
/// ([`LIVENESS_IDLE`], [`LIVENESS_TIMEOUT`]);
/// [`ConnectionConfig::liveness`](crate::ConnectionConfig::liveness)
/// `None` turns it off.
///
/// ```
/// use std::time::Duration;
/// use spool_client::{ConnectionConfig, Liveness};
///
/// // A broker across a slow link: probe later, wait longer for the answer.
/// let patient = ConnectionConfig {
///     liveness: Some(Liveness { idle: Duration::from_secs(5), timeout: Duration::from_secs(10) }),
///     ..ConnectionConfig::default()
/// };
/// assert!(patient.liveness.is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Silence, with requests outstanding, before one Ping is sent.
    pub idle: Duration,
    /// Further silence after the Ping before the connection is closed.
    pub timeout: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self { idle: LIVENESS_IDLE, timeout: LIVENESS_TIMEOUT }
    }
}

impl Liveness {
    /// Checks both durations against
    /// `LIVENESS_DURATION_MIN..=LIVENESS_DURATION_MAX`.
    ///
    /// # Errors
    /// [`ClientError::Config`] naming the duration out of range.
    pub fn validate(&self) -> Result<(), ClientError> {
        for (name, value) in [("idle", self.idle), ("timeout", self.timeout)] {
            if !(LIVENESS_DURATION_MIN..=LIVENESS_DURATION_MAX).contains(&value) {
                return Err(ClientError::Config(format!(
                    "liveness {name} {value:?} outside \
                     {LIVENESS_DURATION_MIN:?}..={LIVENESS_DURATION_MAX:?}"
                )));
            }
        }
        Ok(())
    }
}

/// What the reader does next about liveness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing outstanding: no timer; wait for a request to be sent.
    Idle,
    /// Ask again at this instant (or when something is heard before).
    WakeAt(Instant),
    /// Send one Ping now, then tell [`Watch::probe_sent`].
    Probe,
    /// Close the connection, for this reason.
    Close(String),
}

/// The probe's state on one connection: owned by its reader task.
#[derive(Debug)]
pub(crate) struct Watch {
    config: Liveness,
    /// When the broker last sent anything (the connect, before it has).
    last_heard: Instant,
    /// When the outstanding Ping was sent; cleared by anything heard.
    probe_sent: Option<Instant>,
}

impl Watch {
    pub(crate) fn new(config: Liveness, now: Instant) -> Self {
        Self { config, last_heard: now, probe_sent: None }
    }

    /// Bytes arrived: the broker is alive, and the Ping (if any) is settled.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
        self.probe_sent = None;
    }

    /// The Ping [`Next::Probe`] asked for is on its way.
    pub(crate) fn probe_sent(&mut self, now: Instant) {
        self.probe_sent = Some(now);
    }

    /// The next step at `now`. `busy_since`: when the connection last went
    /// from no request outstanding to one; `None` while none is.
    pub(crate) fn next(&self, busy_since: Option<Instant>, now: Instant) -> Next {
        let Some(busy_since) = busy_since else { return Next::Idle };
        let quiet_since = self.last_heard.max(busy_since);
        match self.probe_sent {
            Some(sent) => {
                let deadline = sent + self.config.timeout;
                if now < deadline {
                    return Next::WakeAt(deadline);
                }
                Next::Close(format!(
                    "broker sent nothing for {} ms, not even an answer to a Ping sent {} ms ago: \
                     unresponsive (liveness idle {} ms, timeout {} ms)",
                    millis(now - self.last_heard),
                    millis(now - sent),
                    millis(self.config.idle),
                    millis(self.config.timeout),
                ))
            }
            None => {
                let due = quiet_since + self.config.idle;
                if now < due {
                    Next::WakeAt(due)
                } else {
                    Next::Probe
                }
            }
        }
    }
}

fn millis(duration: Duration) -> u128 {
    duration.as_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(2);
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn watch(start: Instant) -> Watch {
        Watch::new(Liveness { idle: IDLE, timeout: TIMEOUT }, start)
    }

    fn secs(at: Instant, seconds: f64) -> Instant {
        at + Duration::from_secs_f64(seconds)
    }

    // Goal: the whole rule, step by step, with time as an argument: no
    // timer while nothing is outstanding (however long the silence); the
    // clock starts at the later of last heard and busy-since; one probe
    // after `idle`; anything heard settles it; silence for `timeout` after
    // the probe closes, naming both silences.
    #[test]
    fn probe_then_close_only_while_busy_and_silent() {
        let start = Instant::now();
        let mut watch = watch(start);
        assert_eq!(watch.next(None, secs(start, 100.0)), Next::Idle);
        // Busy after a long idle: the clock starts at busy-since, not at
        // the last byte heard a hundred seconds ago.
        let busy = secs(start, 100.0);
        assert_eq!(watch.next(Some(busy), secs(start, 101.0)), Next::WakeAt(secs(start, 102.0)));
        assert_eq!(watch.next(Some(busy), secs(start, 102.0)), Next::Probe);
        watch.probe_sent(secs(start, 102.0));
        assert_eq!(watch.next(Some(busy), secs(start, 103.0)), Next::WakeAt(secs(start, 107.0)));
        // An answer (to the Ping or anything else) settles the probe.
        watch.heard(secs(start, 104.0));
        assert_eq!(watch.next(Some(busy), secs(start, 104.5)), Next::WakeAt(secs(start, 106.0)));
        assert_eq!(watch.next(Some(busy), secs(start, 106.0)), Next::Probe);
        watch.probe_sent(secs(start, 106.0));
        // Nothing outstanding any more: no close, whatever the silence.
        assert_eq!(watch.next(None, secs(start, 200.0)), Next::Idle);
        // Outstanding again, the Ping still unanswered past its timeout:
        // the broker has been silent since it, so it closes.
        let Next::Close(reason) = watch.next(Some(secs(start, 200.0)), secs(start, 200.0)) else {
            panic!("an unanswered Ping past its timeout must close");
        };
        assert!(reason.contains("sent nothing for 96000 ms"), "{reason}");
        assert!(reason.contains("Ping sent 94000 ms ago"), "{reason}");
    }

    // Goal: a broker answering steadily never gets a probe; method: bytes
    // heard every 1.5 s for a minute while busy, the decision asked at each.
    #[test]
    fn steady_answers_never_probe() {
        let start = Instant::now();
        let mut watch = watch(start);
        for step in 1..=40 {
            let now = secs(start, 1.5 * f64::from(step));
            assert!(matches!(watch.next(Some(start), now), Next::WakeAt(_)), "step {step}");
            watch.heard(now);
        }
    }

    // Goal: durations are validated at both ends; the default is valid.
    #[test]
    fn durations_are_bounded() {
        assert!(Liveness::default().validate().is_ok());
        let zero = Liveness { idle: Duration::ZERO, ..Liveness::default() };
        assert!(matches!(zero.validate(), Err(ClientError::Config(_))));
        let huge = Liveness { timeout: LIVENESS_DURATION_MAX * 2, ..Liveness::default() };
        assert!(matches!(huge.validate(), Err(ClientError::Config(_))));
    }
}
