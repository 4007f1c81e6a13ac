//! Makes a busy shard look at completed I/O at least every poll interval,
//! and lets the tasks that I/O woke run before the busy connections resume.
//!
//! Owns two thread-local facts per executor: when a connection task last saw
//! the executor poll for I/O, and the connection loops parked until the
//! next poll. It does not schedule anything else.
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
//! work. Once the interval has passed since the last poll they saw, they
//! park in [`after_next_poll`]: every busy connection steps aside, the run
//! queue drains, and the executor polls. Order after the poll matters: glommio
//! wakes timer waiters *before* the tasks whose I/O completed, so when each
//! parked loop had a timer of its own, all of them ran ahead of the log
//! committer whose sync had just finished, and every step of a light
//! request (its read, its commit's write, its sync, its reply) waited
//! behind one turn of every busy connection. Now one marker task per poll
//! holds the only timer: it runs first, steps back [`AFTER_POLL_YIELDS`]
//! times so that the tasks the poll woke, and the tasks they wake in turn
//! (committer → request → reply writer), run, and only then wakes the parked
//! loops, which queue behind them.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::clock::instant_now;

/// The shortest timer glommio arms: it fires at the executor's next poll.
const NEXT_POLL: Duration = Duration::from_micros(1);

/// The gate's interval while a disk write or sync of this shard is in
/// flight: its completion is seen within this long even when busy
/// connections fill the run queue.
const fn disk_busy_interval() -> Duration {
    Duration::from_micros(crate::limits::IO_POLL_INTERVAL_DISK_BUSY_US)
}

/// How many times the marker steps back behind newly woken tasks before it
/// wakes the parked connection loops: the length of wake-up chain that runs
/// ahead of them (an I/O completion wakes a committer, which wakes a
/// request, which wakes its connection's writer, ...).
pub const AFTER_POLL_YIELDS: usize = 8;

/// Connection loops parked until the executor's next poll.
#[derive(Default)]
struct Parked {
    /// The executor these belong to (a thread may run several executors in
    /// turn; a marker of an executor that ended never fires).
    executor: Option<usize>,
    /// Bumped each time the marker releases the parked loops.
    generation: u64,
    /// Whether a marker is on its way for this generation.
    marker: bool,
    wakers: Vec<Waker>,
}

thread_local! {
    /// When a connection task of this executor last came back from a poll.
    static LAST_POLL: Cell<Option<Instant>> = const { Cell::new(None) };
    static PARKED: RefCell<Parked> = RefCell::new(Parked::default());
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
        self.due_at(instant_now(), crate::io::stats::disk_in_flight())
    }

    /// The interval in force: shorter while the shard's disk has work of
    /// ours in flight ([`disk_busy_interval`]).
    fn interval(&self, disk_busy: bool) -> Duration {
        if disk_busy {
            self.interval.min(disk_busy_interval())
        } else {
            self.interval
        }
    }

    fn due_at(&self, now: Instant, disk_busy: bool) -> bool {
        let interval = self.interval(disk_busy);
        LAST_POLL.with(|last| match last.get() {
            Some(at) => now.saturating_duration_since(at) >= interval,
            None => {
                last.set(Some(now));
                false
            }
        })
    }

    /// Returns at once unless the interval has passed; then waits for the
    /// executor's next poll for I/O and for the tasks that poll woke.
    pub async fn pass(&self) {
        if !self.due() {
            return;
        }
        after_next_poll().await;
    }
}

/// Resolves after the executor's next poll for I/O, once the tasks that poll
/// woke (and the ones they woke, [`AFTER_POLL_YIELDS`] deep) have run.
/// Records the poll for [`PollGate`].
pub async fn after_next_poll() {
    after_next_with(|| glommio::timer::Timer::new(NEXT_POLL)).await;
}

/// [`after_next_poll`] with the event that stands for "the executor
/// polled": the first parked caller of a generation makes it, and the
/// marker waits on it. glommio wakes a timer's waiter before any task whose
/// I/O the same poll completed, so a 1 µs timer puts the marker first.
async fn after_next_with<E, F>(next_poll: F)
where
    E: Future + 'static,
    F: FnOnce() -> E,
{
    let executor = glommio::executor().id();
    let (generation, spawn_marker) = PARKED.with(|parked| {
        let mut parked = parked.borrow_mut();
        if parked.executor != Some(executor) {
            *parked = Parked { executor: Some(executor), ..Parked::default() };
        }
        let spawn_marker = !parked.marker;
        parked.marker = true;
        (parked.generation, spawn_marker)
    });
    if spawn_marker {
        glommio::spawn_local(marker(next_poll())).detach();
    }
    Released { generation }.await;
}

/// The one waiter of a poll: see the module documentation.
async fn marker(next_poll: impl Future) {
    next_poll.await;
    for _ in 0..AFTER_POLL_YIELDS {
        futures_lite::future::yield_now().await;
    }
    LAST_POLL.with(|last| last.set(Some(instant_now())));
    let wakers = PARKED.with(|parked| {
        let mut parked = parked.borrow_mut();
        parked.generation = parked.generation.wrapping_add(1);
        parked.marker = false;
        std::mem::take(&mut parked.wakers)
    });
    for waker in wakers {
        waker.wake();
    }
}

/// Ready once the marker of `generation` has released the parked loops.
struct Released {
    generation: u64,
}

impl Future for Released {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        PARKED.with(|parked| {
            let mut parked = parked.borrow_mut();
            if parked.generation != self.generation {
                return Poll::Ready(());
            }
            // Polled again before its release only on a spurious wake: a
            // second copy of the waker costs one more spurious wake.
            parked.wakers.push(cx.waker().clone());
            Poll::Pending
        })
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
            assert!(!gate.due_at(start, false), "the first look starts the clock");
            assert!(!gate.due_at(start + Duration::from_millis(4), false));
            assert!(gate.due_at(start + Duration::from_millis(5), false));
            LAST_POLL.with(|last| last.set(Some(start - Duration::from_millis(10))));
            assert!(gate.due());
            gate.pass().await;
            assert!(!gate.due(), "a poll was just seen");
        });
    }

    // Goal: while a disk write or sync is in flight the gate closes after
    // the short disk-busy interval, not the configured one, and a
    // configured interval shorter than that stays in force. Method: drive
    // `due_at` with chosen instants and either state of the disk.
    #[test]
    fn a_busy_disk_shortens_the_interval() {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async {
            let busy = disk_busy_interval();
            let gate = PollGate::new(Duration::from_millis(5));
            let start = instant_now();
            assert!(!gate.due_at(start, true), "the first look starts the clock");
            assert!(!gate.due_at(start + busy / 2, true));
            assert!(gate.due_at(start + busy, true));
            assert!(!gate.due_at(start + busy, false), "an idle disk: 5 ms");
            let short = PollGate::new(busy / 2);
            assert!(short.due_at(start + busy / 2, true));
            assert!(short.due_at(start + busy / 2, false));
        });
    }

    // Goal: after a poll, the tasks that poll woke (and a short chain of
    // tasks they wake) run before the connection loops parked at the gate
    // resume; with one timer per parked loop, every parked loop was queued
    // ahead of them. Method: the poll is stood for by a channel, so the
    // order of wake-ups is the one glommio makes (the marker's timer first,
    // then the tasks whose I/O completed) without depending on when the
    // executor really polls: three tasks park; the "poll" wakes the marker,
    // then a task waiting for "I/O", which wakes a second task, which wakes
    // a third. The order in which they all ran is recorded.
    #[test]
    fn what_a_poll_woke_runs_before_the_parked_loops() {
        use glommio::channels::local_channel;
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        let order = executor.run(async {
            let order = std::rc::Rc::new(RefCell::new(Vec::<&'static str>::new()));
            let (poll_tx, poll_rx) = local_channel::new_bounded::<()>(1);
            let poll_rx = std::rc::Rc::new(poll_rx);
            let mut tasks = Vec::new();
            for _ in 0..3 {
                let order = order.clone();
                let poll_rx = poll_rx.clone();
                tasks.push(glommio::spawn_local(async move {
                    after_next_with(move || async move { poll_rx.recv().await }).await;
                    order.borrow_mut().push("parked");
                }));
            }
            // The chain: each link is a task woken by the one before (a
            // wake queues it at the back; a spawn would run it at once).
            let (io_tx, io_rx) = local_channel::new_bounded::<()>(1);
            let (second_tx, second_rx) = local_channel::new_bounded::<()>(1);
            let (third_tx, third_rx) = local_channel::new_bounded::<()>(1);
            let link = |name: &'static str, rx: local_channel::LocalReceiver<()>, next| {
                let order = order.clone();
                glommio::spawn_local(async move {
                    rx.recv().await;
                    order.borrow_mut().push(name);
                    if let Some(next) = next {
                        let next: local_channel::LocalSender<()> = next;
                        next.send(()).await.expect("next link waits");
                    }
                })
            };
            let chain = [
                link("woken", io_rx, Some(second_tx)),
                link("chain 2", second_rx, Some(third_tx)),
                link("chain 3", third_rx, None),
            ];
            // Everything parks or waits.
            while PARKED.with(|parked| parked.borrow().wakers.len()) < 3 {
                futures_lite::future::yield_now().await;
            }
            assert!(order.borrow().is_empty());
            poll_tx.send(()).await.expect("marker waits");
            io_tx.send(()).await.expect("chain waits");
            for link in chain {
                link.await;
            }
            for task in tasks {
                task.await;
            }
            let order = order.borrow().clone();
            order
        });
        assert_eq!(order, ["woken", "chain 2", "chain 3", "parked", "parked", "parked"]);
    }
}
