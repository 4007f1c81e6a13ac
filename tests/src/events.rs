//! Waiting for what a running broker did, instead of sleeping until it
//! has probably done it (`docs/testing.md`, "Ordering by events").
//!
//! A test that needs something to have happened inside the broker before
//! its next step (a claim parked in its long-poll, a connection accepted or
//! closed) polls the figure that shows it on the admin port's `/metrics`
//! until it reads what the step needs, for at most [`EVENT_TIMEOUT`]; then
//! it fails naming what it waited for and the last figure seen (and the
//! broker's log follows: [`Spoold`]'s drop prints it during a panic). A
//! scrape counts only when every shard reported in it, so a shard too busy
//! to answer never reads as "nothing waiting".
//!
//! Each wait comes twice: `async` for tests on a tokio runtime (the scrape
//! runs on the blocking pool, so tasks the test spawned keep running) and
//! `_blocking` for plain `#[test]`s.

use std::time::Duration;

use crate::admin::{http_get, Exposition};
use crate::{now, Spoold};

/// How long a wait for an event may take before the test fails: far more
/// than any of them takes on a loaded 2-core machine (a few ms to a few
/// hundred), far less than nextest's per-test timeout.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between two scrapes of a wait.
const EVENT_POLL: Duration = Duration::from_millis(20);

/// Claims long-polling on a shard now (one partition or partition `ANY`).
pub const CLAIMS_WAITING: &str = "spool_shard_claims_waiting";

/// Client connections open on a shard now.
pub const CONNECTIONS: &str = "spool_shard_connections";

/// One scrape of the admin port at `addr`: `name` summed over the shards,
/// or why the scrape does not count (an error status, a text that does not
/// parse, fewer than `shards` shards reporting).
fn sum_at(addr: &str, shards: u16, name: &str) -> Result<f64, String> {
    let answer = http_get(addr, "/metrics");
    if answer.status != 200 {
        return Err(format!("GET /metrics answered {}: {}", answer.status, answer.body));
    }
    let exposition = Exposition::parse(&answer.body)
        .map_err(|error| format!("the metrics do not parse: {error}"))?;
    let reporting = exposition.sum("spool_shard_reporting");
    if reporting < f64::from(shards) {
        return Err(format!("{reporting} of {shards} shards reported"));
    }
    Ok(exposition.sum(name))
}

/// `name` summed over the shards of `broker` now (one scrape, blocking).
///
/// # Errors
/// Why the scrape does not count: an error status, a text that does not
/// parse, a shard that did not report.
pub fn metric_sum_now(broker: &Spoold, name: &str) -> Result<f64, String> {
    sum_at(&broker.admin_addr(), broker.cores(), name)
}

fn timed_out(what: &str, name: &str, last: &Result<f64, String>) -> ! {
    panic!(
        "waited {EVENT_TIMEOUT:?} for {what}; {name} summed over the shards was last {last:?} \
         (the broker's log follows)"
    )
}

/// Blocks until `name` summed over the shards reads a value for which
/// `wanted` holds, and returns it; panics after [`EVENT_TIMEOUT`] naming
/// `what` (the event, in words) and the last value seen.
pub fn wait_for_metric_blocking(
    broker: &Spoold,
    name: &str,
    what: &str,
    wanted: impl Fn(f64) -> bool,
) -> f64 {
    let started = now();
    loop {
        let last = metric_sum_now(broker, name);
        match last {
            Ok(value) if wanted(value) => return value,
            _ if started.elapsed() >= EVENT_TIMEOUT => timed_out(what, name, &last),
            // A bounded poll: the condition is read again each time.
            _ => std::thread::sleep(EVENT_POLL),
        }
    }
}

/// [`wait_for_metric_blocking`] for a test on a tokio runtime: each
/// scrape runs on the blocking pool and the pause between them is
/// tokio's, so the test's spawned tasks (a claim being sent) go on.
pub async fn wait_for_metric(
    broker: &Spoold,
    name: &str,
    what: &str,
    wanted: impl Fn(f64) -> bool,
) -> f64 {
    let (addr, shards) = (broker.admin_addr(), broker.cores());
    let started = now();
    loop {
        let (addr, owned) = (addr.clone(), name.to_owned());
        let last = tokio::task::spawn_blocking(move || sum_at(&addr, shards, &owned))
            .await
            .unwrap_or_else(|error| Err(format!("the scrape panicked: {error}")));
        match last {
            Ok(value) if wanted(value) => return value,
            _ if started.elapsed() >= EVENT_TIMEOUT => timed_out(what, name, &last),
            // A bounded poll: the condition is read again each time.
            _ => tokio::time::sleep(EVENT_POLL).await,
        }
    }
}

fn claims_wanted(claims: u64) -> (String, impl Fn(f64) -> bool) {
    let what = format!("exactly {claims} claims parked in their long-polls");
    let target = claims as f64;
    (what, move |value: f64| value == target)
}

/// Waits until exactly `claims` claims long-poll on `broker` (summed over
/// its shards: `spool_shard_claims_waiting`), so the next step meets them
/// parked: a message sent now wakes one, a cancel now finds one. `0`
/// waits for every long-poll to have ended (answered, cancelled, its
/// connection gone). Panics after [`EVENT_TIMEOUT`].
pub async fn wait_for_claims_waiting(broker: &Spoold, claims: u64) {
    let (what, wanted) = claims_wanted(claims);
    wait_for_metric(broker, CLAIMS_WAITING, &what, wanted).await;
}

/// [`wait_for_claims_waiting`] for a plain `#[test]`.
pub fn wait_for_claims_waiting_blocking(broker: &Spoold, claims: u64) {
    let (what, wanted) = claims_wanted(claims);
    wait_for_metric_blocking(broker, CLAIMS_WAITING, &what, wanted);
}

/// Waits until exactly `connections` client connections are open on
/// `broker` (summed over its shards: `spool_shard_connections`): the
/// shard accepted the ones a test opened, or closed the ones it dropped.
/// Panics after [`EVENT_TIMEOUT`].
pub fn wait_for_connections_blocking(broker: &Spoold, connections: u64) {
    let what = format!("exactly {connections} client connections open");
    let target = connections as f64;
    wait_for_metric_blocking(broker, CONNECTIONS, &what, |value| value == target);
}
