//! The producers: one pacing thread each, open loop (module doc of
//! [`crate::load`]); its sends are awaited by [`crate::sends::collect`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use spool_client::{Message, Producer};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};

use super::recorder::Recorder;
use crate::dist::Arrivals;
use crate::harness::error_name;
use crate::sends::{payload, window_slot, Pending, PACER_STOP_CHECK, SUBMIT_ERROR_PAUSE};

/// One producer's pacing thread: message `i` is due at the previous due
/// time plus a gap drawn at the current phase's share of the rate; it is
/// submitted at or after that time and its latency counts from it.
pub(super) struct Pacer {
    pub(super) handle: Handle,
    pub(super) producer: Producer,
    pub(super) queue: String,
    pub(super) recorder: Arc<Recorder>,
    /// Each phase's rate for this producer (msgs/s).
    pub(super) rates: Vec<f64>,
    pub(super) arrivals: Arrivals,
    pub(super) rng: ChaCha8Rng,
    pub(super) permits: Arc<Semaphore>,
    pub(super) msg_bytes: usize,
    pub(super) sends: mpsc::Sender<Pending>,
}

impl Pacer {
    pub(super) fn run(mut self) {
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer
        // slack (default 50 µs) so its sleeps end close to the schedule.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut due_ns = self.recorder.now_ns();
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
            let message = Message::new(payload(due_ns, self.msg_bytes));
            self.recorder.submitted.fetch_add(1, Ordering::Relaxed);
            match self.handle.block_on(self.producer.submit(&self.queue, message)) {
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
