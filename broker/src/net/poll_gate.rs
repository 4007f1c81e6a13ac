//! Makes a busy shard look at completed I/O at least every poll interval.
//!
//! Owns one thread-local fact per executor: when a connection task last saw
//! the executor poll for I/O. It does not schedule anything itself.
//!
//! Why: glommio runs every runnable task before it polls its rings again
//! (or until its preempt timer, 100 ms by default), and socket reads and
//! writes that find data or room complete inside the task (glommio tries the
//! syscall before it queues an operation). A shard saturated by pipelined
//! requests therefore kept its run queue full and saw its finished log
//! writes, syncs and socket polls only every few to 100 ms; each step of a
//! well-behaved client's request waited that long (bench/README.md,
//! `hostile`). Shortening glommio's preempt timer would do the same, but
//! with a 1–5 ms timer glommio 0.9 sometimes parks a starting executor
//! with no wake-up armed (seen as a shard that never starts listening), so
//! the bound is kept here instead.
//!
//! How: the connection loops call [`PollGate::pass`] before each round of
//! work. Once the interval has passed since the last poll they saw, it
//! waits on a 1 µs timer; glommio fires timers only when it polls, so every
//! busy connection steps aside, the run queue drains, the executor polls,
//! and the first connection back records the time.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::clock::instant_now;

/// The shortest timer glommio arms: it fires at the executor's next poll.
const NEXT_POLL: Duration = Duration::from_micros(1);

thread_local! {
    /// When a connection task of this executor last came back from a poll.
    static LAST_POLL: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The gate of one connection loop (copyable; the state is per executor).
#[derive(Debug, Clone, Copy)]
pub struct PollGate {
    interval: Duration,
}

impl PollGate {
    pub fn new(interval: Duration) -> PollGate {
        PollGate { interval }
    }

    /// Whether the executor has run tasks for at least the interval since a
    /// connection last saw it poll. The first call on an executor starts
    /// the clock.
    pub fn due(&self) -> bool {
        self.due_at(instant_now())
    }

    fn due_at(&self, now: Instant) -> bool {
        LAST_POLL.with(|last| match last.get() {
            Some(at) => now.saturating_duration_since(at) >= self.interval,
            None => {
                last.set(Some(now));
                false
            }
        })
    }

    /// Returns at once unless the interval has passed; then waits for the
    /// executor's next poll for I/O.
    pub async fn pass(&self) {
        if !self.due() {
            return;
        }
        glommio::timer::Timer::new(NEXT_POLL).await;
        LAST_POLL.with(|last| last.set(Some(instant_now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the gate is open until the interval has passed since the last
    // poll a connection saw, and open again right after one. Method: drive
    // `due_at` with chosen instants, then pass the gate on a real executor
    // and check that it recorded the poll.
    #[test]
    fn the_gate_closes_after_the_interval_and_opens_after_a_poll() {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async {
            let gate = PollGate::new(Duration::from_millis(5));
            let start = instant_now();
            assert!(!gate.due_at(start), "the first look starts the clock");
            assert!(!gate.due_at(start + Duration::from_millis(4)));
            assert!(gate.due_at(start + Duration::from_millis(5)));
            LAST_POLL.with(|last| last.set(Some(start - Duration::from_millis(10))));
            assert!(gate.due());
            gate.pass().await;
            assert!(!gate.due(), "a poll was just seen");
        });
    }
}
