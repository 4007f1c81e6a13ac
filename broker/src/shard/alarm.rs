//! The housekeeping timer's alarm clock: lets a request bring the next tick
//! forward, so an idle shard can sleep until its next deadline.
//!
//! The housekeeping loop [`plan`](Alarm::plan)s when it will tick next (the
//! earliest lease end, scheduled message or expiry its partitions hold,
//! within the idle bound) and sleeps until then or until the alarm rings. A
//! request whose events create an earlier deadline (a claim with a short
//! lease, an enqueue scheduled a few ms ahead, a release with a short delay)
//! calls [`request`](Alarm::request) with that deadline; the alarm rings only
//! if it is earlier than the plan, so the common case — a deadline later than
//! the planned tick — costs one comparison.
//!
//! Single-threaded (one per executor, `Cell`s, one waiter: the housekeeping
//! task); no runtime type, so it is tested without an executor.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::queue::Millis;

/// One executor's alarm (see the module docs).
#[derive(Debug)]
pub struct Alarm {
    planned: Cell<Millis>,
    rung: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Default for Alarm {
    fn default() -> Self {
        // Nothing planned yet: any request rings until the loop plans.
        Self { planned: Cell::new(0), rung: Cell::new(false), waker: RefCell::new(None) }
    }
}

impl Alarm {
    /// The housekeeping loop will tick at `at` (clock of the requests) unless
    /// rung earlier; clears an earlier ring, which the tick about to be
    /// planned has served.
    pub fn plan(&self, at: Millis) {
        self.planned.set(at);
        self.rung.set(false);
    }

    /// The tick currently planned.
    pub fn planned(&self) -> Millis {
        self.planned.get()
    }

    /// Something falls due at `at`: ring if that is before the planned tick.
    pub fn request(&self, at: Millis) {
        if at < self.planned.get() {
            self.planned.set(at);
            self.rung.set(true);
            if let Some(waker) = self.waker.borrow_mut().take() {
                waker.wake();
            }
        }
    }

    /// Resolves once a request rang the alarm since the last plan.
    pub fn rung(&self) -> Rung<'_> {
        Rung { alarm: self }
    }
}

/// Future of [`Alarm::rung`].
#[derive(Debug)]
pub struct Rung<'a> {
    alarm: &'a Alarm,
}

impl Future for Rung<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.alarm.rung.replace(false) {
            return Poll::Ready(());
        }
        *self.alarm.waker.borrow_mut() = Some(context.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    use super::*;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_rung(alarm: &Alarm, count: &Arc<Count>) -> bool {
        let waker = Waker::from(count.clone());
        let mut context = Context::from_waker(&waker);
        let mut rung = alarm.rung();
        Pin::new(&mut rung).poll(&mut context).is_ready()
    }

    #[test]
    fn only_an_earlier_deadline_rings_and_wakes_the_loop() {
        // Goal: a request later than (or at) the planned tick changes nothing, an
        // earlier one wakes the sleeping loop once and moves the plan. Method: plan at
        // 1,000, poll the rung future (pending, waker stored), request 1,000 and 5,000
        // (no wake), then 400 (one wake, ready, plan 400), then 450 (no ring).
        let alarm = Alarm::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        alarm.plan(1_000);
        assert!(!poll_rung(&alarm, &count));
        alarm.request(1_000);
        alarm.request(5_000);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert!(!poll_rung(&alarm, &count));
        alarm.request(400);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(alarm.planned(), 400);
        assert!(poll_rung(&alarm, &count), "the ring is seen once");
        assert!(!poll_rung(&alarm, &count), "and then consumed");
        alarm.request(450);
        assert!(!poll_rung(&alarm, &count), "450 is after the moved plan");
    }

    #[test]
    fn a_new_plan_clears_a_ring_the_tick_served() {
        // Goal: a ring that arrived before the loop ticked does not make the next
        // sleep end at once. Method: ring, then plan again (the loop ticked), poll.
        let alarm = Alarm::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        alarm.plan(100);
        alarm.request(50);
        alarm.plan(10_000);
        assert!(!poll_rung(&alarm, &count));
    }
}
