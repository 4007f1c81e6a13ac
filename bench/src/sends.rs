//! The send side both client scenarios share (`throughput` and the
//! [`load`](crate::load) engine): the timestamped payload, a pacing thread's
//! wait for a window slot, and the task that awaits the sends a pacer hands
//! over.
//!
//! What it owns: the payload encoding (the first [`TIMESTAMP_BYTES`] carry
//! the send, or intended send, time in ns, little-endian; a consumer reads it
//! back for end-to-end latency) and the plumbing between a pacing thread and
//! the runtime. What it does not do: decide when a message is due (each
//! scenario's pacer does) or count anything (the scenario's recorder does,
//! through the callback it gives [`collect`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use spool_client::spool_wire::proto::Offset;
use spool_client::{ClientError, Delivery, PayloadView, Producer, SendFuture};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::error::Elapsed;

/// Bytes of the send-time prefix every payload carries; the smallest payload.
pub const TIMESTAMP_BYTES: usize = 8;
/// How often a pacing thread blocked on its window re-checks for the stop.
pub(crate) const PACER_STOP_CHECK: Duration = Duration::from_millis(100);
/// Pause after a failed submit so a broken broker is not spun on.
pub(crate) const SUBMIT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// A send a pacer hands to its collector: due time (ns), the send, and the
/// window slot it holds until it resolves.
pub(crate) type Pending = (u64, SendFuture, OwnedSemaphorePermit);
/// A resolved send: due time (ns) and the outcome.
pub(crate) type Sent = (u64, Result<Offset, ClientError>);

/// A payload of `len_bytes` starting with `start_ns` (little endian): the
/// send time every scenario's consumer reads back for end-to-end latency.
pub(crate) fn payload(start_ns: u64, len_bytes: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len_bytes];
    bytes[..TIMESTAMP_BYTES].copy_from_slice(&start_ns.to_le_bytes());
    bytes
}

/// The send time [`payload`] wrote into `delivery`; `None` for a payload too
/// short or not inline.
pub(crate) fn sent_ns(delivery: &Delivery) -> Option<u64> {
    match delivery.payload() {
        PayloadView::Inline(bytes) => bytes
            .get(..TIMESTAMP_BYTES)
            .and_then(|prefix| <[u8; TIMESTAMP_BYTES]>::try_from(prefix).ok())
            .map(u64::from_le_bytes),
        PayloadView::Reference { .. } => None,
    }
}

/// Awaits one send, then frees its window slot.
pub(crate) async fn track(due_ns: u64, send: SendFuture, permit: OwnedSemaphorePermit) -> Sent {
    let result = send.await;
    drop(permit);
    (due_ns, result)
}

/// A window slot for a pacing thread (outside the runtime): a free one at
/// once without entering the runtime (and arming a stop-check timer), else
/// waits on `handle`, re-checking `stopping` every [`PACER_STOP_CHECK`].
/// `None` once `stopping` or the window is closed.
pub(crate) fn window_slot(
    handle: &Handle,
    permits: &Arc<Semaphore>,
    stopping: impl Fn() -> bool,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
        return Some(permit);
    }
    handle.block_on(async {
        loop {
            tokio::select! {
                permit = Arc::clone(permits).acquire_owned() => return permit.ok(),
                () = tokio::time::sleep(PACER_STOP_CHECK) => {
                    if stopping() {
                        return None;
                    }
                }
            }
        }
    })
}

/// Awaits the sends a pacer hands over, calling `sent` as each resolves,
/// until the pacer has closed its channel and every send has resolved.
pub(crate) async fn collect(mut sends: mpsc::Receiver<Pending>, mut sent: impl FnMut(Sent)) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            Some(resolved) = in_flight.next(), if !in_flight.is_empty() => sent(resolved),
            send = sends.recv(), if open => match send {
                Some((due_ns, send, permit)) => in_flight.push(track(due_ns, send, permit)),
                None => open = false,
            },
            else => break,
        }
    }
}

/// Ends a run's sends once its recorder says stop: awaits the tasks that
/// await them (collectors, closed loops) and closes every producer (its last
/// batches go out), all within `timeout`; then joins the pacing threads
/// (each has seen the stop, or its channel closed with its collector).
///
/// # Errors
/// [`Elapsed`] when the sends did not finish within `timeout`.
pub(crate) async fn finish(
    tasks: Vec<JoinHandle<()>>,
    producers: &[Producer],
    pacers: Vec<std::thread::JoinHandle<()>>,
    timeout: Duration,
) -> Result<(), Elapsed> {
    let sends = async {
        for task in tasks {
            let _ = task.await;
        }
        for producer in producers {
            producer.close().await;
        }
    };
    tokio::time::timeout(timeout, sends).await?;
    for pacer in pacers {
        let _ = tokio::task::spawn_blocking(move || pacer.join()).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_prefix_round_trips_through_a_delivery_timestamp() {
        // Goal: the consumer reads back exactly the send time the producer wrote; method: encode, decode.
        let bytes = payload(0x0102_0304_0506_0708, 64);
        assert_eq!(bytes.len(), 64);
        let prefix = <[u8; TIMESTAMP_BYTES]>::try_from(&bytes[..TIMESTAMP_BYTES]).unwrap();
        assert_eq!(u64::from_le_bytes(prefix), 0x0102_0304_0506_0708);
        assert!(bytes[TIMESTAMP_BYTES..].iter().all(|&byte| byte == 0));
    }

    /// A multi-thread runtime, as the scenarios use: only its own workers
    /// drive the timers a pacing thread's `Handle::block_on` waits on.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    #[test]
    fn a_free_window_slot_comes_at_once_and_a_full_window_gives_up_on_stop() {
        // Goal: a pacer never blocks past the stop on a full window, and takes
        // a free slot without waiting; method: a window of one, taken, then
        // asked again with the stop set (it must give up within a re-check),
        // then freed and asked again.
        let runtime = runtime();
        let permits = Arc::new(Semaphore::new(1));
        let held = window_slot(runtime.handle(), &permits, || false);
        assert!(held.is_some());
        let started = spool_broker::clock::instant_now();
        assert!(window_slot(runtime.handle(), &permits, || true).is_none());
        assert!(started.elapsed() >= PACER_STOP_CHECK, "gave up before a re-check");
        drop(held);
        assert!(window_slot(runtime.handle(), &permits, || true).is_some());
    }

    #[test]
    fn finish_awaits_the_send_tasks_and_joins_the_pacers() {
        // Goal: finish returns only after every send task and pacing thread
        // has ended, and says when the tasks outlast the timeout; method: a
        // task and a thread that each set a flag, then a task that never ends.
        let runtime = runtime();
        let task_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pacer_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (task_flag, pacer_flag) = (Arc::clone(&task_done), Arc::clone(&pacer_done));
        let finished = runtime.block_on(async move {
            let task = tokio::spawn(async move {
                task_flag.store(true, std::sync::atomic::Ordering::Release);
            });
            let pacer = std::thread::spawn(move || {
                pacer_flag.store(true, std::sync::atomic::Ordering::Release);
            });
            finish(vec![task], &[], vec![pacer], Duration::from_secs(5)).await
        });
        assert!(finished.is_ok());
        assert!(task_done.load(std::sync::atomic::Ordering::Acquire));
        assert!(pacer_done.load(std::sync::atomic::Ordering::Acquire));
        let stuck = runtime.block_on(async {
            let task = tokio::spawn(std::future::pending::<()>());
            finish(vec![task], &[], Vec::new(), Duration::from_millis(50)).await
        });
        assert!(stuck.is_err());
    }
}
