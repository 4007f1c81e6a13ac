//! The producers: open loop (module doc of [`crate::load`]), multiplexed
//! over at most [`PACER_THREADS_MAX`](super::PACER_THREADS_MAX) pacing
//! threads; a thread's sends are awaited by [`crate::sends::collect`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use spool_client::{Message, Producer};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};

use super::recorder::Recorder;
use crate::dist::Arrivals;
use crate::harness::error_name;
use crate::sends::{
    payload, window_slot, Pending, PACER_STOP_CHECK, SUBMIT_ERROR_PAUSE, TIMESTAMP_BYTES,
};

/// One pacing thread, for one or more producers: message `i` is due at the
/// previous due time plus a gap drawn at the current phase's rate of all of
/// them; it is submitted at or after that time, to the next producer's queue
/// in turn (so each gets its share), and its latency counts from it.
pub(super) struct Pacer {
    pub(super) handle: Handle,
    pub(super) producer: Producer,
    /// The queue of each producer this thread serves, taken in turn.
    pub(super) queues: Vec<String>,
    pub(super) recorder: Arc<Recorder>,
    /// Each phase's rate for this thread's producers together (msgs/s).
    pub(super) rates: Vec<f64>,
    pub(super) arrivals: Arrivals,
    pub(super) rng: ChaCha8Rng,
    pub(super) permits: Arc<Semaphore>,
    pub(super) msg_bytes: usize,
    /// Payloads to pick from at random; empty = zeros.
    pub(super) payloads: Arc<Vec<Vec<u8>>>,
    pub(super) sends: mpsc::Sender<Pending>,
}

impl Pacer {
    pub(super) fn run(mut self) {
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer
        // slack (default 50 µs) so its sleeps end close to the schedule.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut due_ns = self.recorder.now_ns();
        let mut turn = 0usize;
        while !self.recorder.stopping() {
            let phase = self.recorder.phase.load(Ordering::Acquire);
            let rate = self.rates.get(phase).copied().unwrap_or(0.0);
            if rate <= 0.0 {
                // A phase without sends: idle, and restart the schedule when
                // sends resume rather than bursting to catch up.
                std::thread::sleep(PACER_STOP_CHECK);
                due_ns = self.recorder.now_ns();
                continue;
            }
            let now_ns = self.recorder.now_ns();
            if due_ns > now_ns {
                std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
            }
            let recorder = &self.recorder;
            let Some(permit) = window_slot(&self.handle, &self.permits, || recorder.stopping())
            else {
                break;
            };
            let bytes = if self.payloads.is_empty() {
                payload(due_ns, self.msg_bytes)
            } else {
                let pick = self.rng.random_range(0..self.payloads.len());
                stamped(&self.payloads[pick], due_ns)
            };
            let message = Message::new(bytes);
            self.recorder.submitted.fetch_add(1, Ordering::Relaxed);
            let queue = &self.queues[turn % self.queues.len()];
            turn = turn.wrapping_add(1);
            match self.handle.block_on(self.producer.submit(queue, message)) {
                Ok(send) => {
                    if self.sends.blocking_send((due_ns, send, permit)).is_err() {
                        break;
                    }
                }
                Err(error) => {
                    self.recorder.count_error(format!("enqueue.{}", error_name(&error)));
                    std::thread::sleep(SUBMIT_ERROR_PAUSE);
                }
            }
            due_ns += self.arrivals.gap_ns(rate, &mut self.rng);
        }
    }
}

/// `template` with its first [`TIMESTAMP_BYTES`] replaced by `due_ns`, as
/// [`payload`] writes them (the validated pool holds `msg_bytes` ≥ 8).
fn stamped(template: &[u8], due_ns: u64) -> Vec<u8> {
    let mut bytes = template.to_vec();
    if let Some(prefix) = bytes.get_mut(..TIMESTAMP_BYTES) {
        prefix.copy_from_slice(&due_ns.to_le_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_payload_keeps_its_bytes_after_the_send_time() {
        // Goal: a payload from a pool (OMB's file or randomized payloads) is sent as given,
        // but for the send-time prefix the consumer reads back for end-to-end latency.
        let template: Vec<u8> = (0..32).map(|byte| byte as u8 + 1).collect();
        let bytes = stamped(&template, 0x0102_0304_0506_0708);
        assert_eq!(bytes.len(), 32);
        assert_eq!(bytes[..TIMESTAMP_BYTES], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[TIMESTAMP_BYTES..], template[TIMESTAMP_BYTES..]);
    }
}
