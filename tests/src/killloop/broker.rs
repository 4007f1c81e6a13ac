//! The broker across kills: SIGKILL and restart on the same directory and
//! ports (waiting for a killed process's ports to be free), and the
//! failpoint cycle (restart armed, drive it with a bulk load until the
//! point aborts it, then stop it).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
use spool_client::spool_wire::proto::{PartitionId, WorkerId};
use spool_client::{ClaimOptions, Client};

use super::config::FailpointArm;
use super::report::FiredAt;
use super::{now, unix_ms, KillLoopError, BULK_QUEUE};
use crate::{Spoold, FAILPOINTS_ENV, STOP_TIMEOUT};

/// Longest wait for a killed broker's ports to become bindable.
const PORT_FREE_TIMEOUT: Duration = Duration::from_secs(10);

/// Payload of a bulk record: 128 of them fill an 8 MiB test segment.
const BULK_PAYLOAD_BYTES: usize = 64 * 1024;

/// Lease of bulk claims (the bulk queue's lease minimum is 50 ms).
const BULK_LEASE_MS: u32 = 500;

/// Records per bulk enqueue batch.
const BULK_BATCH: u64 = 16;

/// How long an armed broker runs under load before the loop sends SIGTERM
/// (points on the close path fire only then).
const ARMED_LOAD_WAIT: Duration = Duration::from_secs(3);

/// Runs `work` off the async threads (the harness blocks).
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        // The harness panics when a broker does not come up; keep its message.
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Waits until every shard port of `broker` can be bound again (a std
/// listener, SO_REUSEADDR like the broker's own check), up to
/// [`PORT_FREE_TIMEOUT`]; returns whether it had to wait.
///
/// Why: a killed `spoold`'s listening sockets can outlive the reaped process
/// for a moment (its io_uring, which holds them through pending accepts, is
/// torn down asynchronously after exit), and a restart in that window dies
/// with `port_in_use`. A supervisor would restart it again; this loop waits
/// instead of losing the run.
fn wait_ports_free(broker: &Spoold) -> Result<bool, KillLoopError> {
    let started = now();
    let mut waited = false;
    for shard in 0..broker.cores() {
        let addr = broker.shard_addr(shard);
        while std::net::TcpListener::bind(&addr).is_err() {
            waited = true;
            if started.elapsed() >= PORT_FREE_TIMEOUT {
                return Err(KillLoopError::Stuck(format!(
                    "{addr} still bound {PORT_FREE_TIMEOUT:?} after the kill"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(waited)
}

/// Kills (`restart` false) or restarts the broker in `slot` off the async
/// threads.
pub(super) async fn cycle(slot: &mut Option<Spoold>, restart: bool) -> Result<bool, KillLoopError> {
    let mut broker =
        slot.take().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let (broker, waited) = blocking(move || {
        if restart {
            let waited = wait_ports_free(&broker);
            if waited.is_ok() {
                broker.restart();
            }
            (broker, waited)
        } else {
            broker.kill();
            (broker, Ok(false))
        }
    })
    .await;
    *slot = Some(broker);
    waited
}

/// Where an armed broker's exit says the point fired: SIGABRT is the
/// failpoint's abort; anything else means it was not reached.
fn fired(status: Option<ExitStatus>, stage: FiredAt) -> Option<FiredAt> {
    status.and_then(|status| (status.signal() == Some(libc::SIGABRT)).then_some(stage))
}

/// Enqueues large records to [`BULK_QUEUE`] and acks them until `stop`,
/// ignoring failures (the broker is expected to die under it): drives
/// segment rolls, index writes and, at the next checkpoint, retention.
async fn bulk_load(client: Client, stop: Arc<AtomicBool>) {
    let payload = vec![0x42u8; BULK_PAYLOAD_BYTES];
    let mut sequence = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut builder = DataBatchBuilder::new();
        for _ in 0..BULK_BATCH {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&sequence.to_le_bytes());
            id[8..].copy_from_slice(b"bulkload");
            sequence += 1;
            let record = Record {
                message_id: MessageId(id),
                routing_key: Vec::new(),
                headers: Vec::new(),
                payload: Payload::Inline(payload.clone()),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: unix_ms(),
            };
            if builder.push(&record).is_err() {
                break;
            }
        }
        let enqueued = match builder.finish() {
            Ok(batch) => client.enqueue(BULK_QUEUE, PartitionId(0), &batch).await.is_ok(),
            Err(_) => false,
        };
        let options = ClaimOptions {
            worker: WorkerId(0xB01C),
            credits: 64,
            max_bytes: 8 << 20,
            // Short: claims a killed broker never saw acked come back soon
            // and do not pin the retention watermark for long.
            lease_ms: BULK_LEASE_MS,
            wait_ms: 0,
            subscription: None,
        };
        if let Ok(batch) = client.claim(BULK_QUEUE, PartitionId(0), &options).await {
            let tokens: Vec<_> = batch.deliveries.iter().map(|delivery| delivery.token()).collect();
            if !tokens.is_empty() {
                let _ = client.ack(BULK_QUEUE, PartitionId(0), &tokens).await;
            }
        }
        if !enqueued {
            // A retry pause: the bulk writer tries again until stopped.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One failpoint cycle after the kill (see the module doc): restart with
/// `arm` armed, run the load (and the bulk load) until the broker aborts
/// or [`ARMED_LOAD_WAIT`] passes, then SIGTERM and wait for the drain. The
/// broker in `slot` is stopped afterwards, ready for a clean restart.
pub(super) async fn armed_cycle(
    slot: &mut Option<Spoold>,
    arm: &FailpointArm,
    client: &Client,
) -> Result<FiredAt, KillLoopError> {
    let mut broker =
        slot.take().ok_or_else(|| KillLoopError::Stuck("the broker was lost".to_owned()))?;
    let spec = format!("{}=abort@{}", arm.point, arm.from_hit);
    let (mut broker, started) = blocking(move || {
        let free = wait_ports_free(&broker);
        broker.options_mut().set_env(FAILPOINTS_ENV, &spec);
        let started = free.map(|_| broker.try_restart());
        broker.options_mut().remove_env(FAILPOINTS_ENV);
        (broker, started)
    })
    .await;
    let fired_at = match started? {
        Err(failed) => fired(failed.status, FiredAt::Startup),
        Ok(()) => {
            let stop = Arc::new(AtomicBool::new(false));
            let bulk = tokio::spawn(bulk_load(client.clone(), stop.clone()));
            let (returned, exited) = blocking(move || {
                let exited = broker.wait_exit(ARMED_LOAD_WAIT);
                (broker, exited)
            })
            .await;
            broker = returned;
            let mut fired_at = fired(exited, FiredAt::Load);
            if exited.is_none() {
                broker.signal(libc::SIGTERM);
                let (returned, exited) = blocking(move || {
                    let exited = broker.wait_exit(STOP_TIMEOUT);
                    (broker, exited)
                })
                .await;
                broker = returned;
                fired_at = fired(exited, FiredAt::Close);
                if exited.is_none() {
                    broker.kill();
                }
            }
            stop.store(true, Ordering::Release);
            let _ = bulk.await;
            fired_at
        }
    };
    *slot = Some(broker);
    Ok(fired_at.unwrap_or(FiredAt::Missed))
}
