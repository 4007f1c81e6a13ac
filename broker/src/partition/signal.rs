//! A single-threaded "something changed" signal for long-polling claims.
//!
//! Waiters register a waker and are woken all at once on [`Signal::notify`];
//! each then re-checks its own condition (a claim retries its decision, and
//! gives up when its wait deadline has passed). The partition notifies when
//! messages may have become claimable and on every housekeeping tick, so a
//! waiter never needs a timer of its own and this module names no runtime.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Most claims that may long-poll one partition at once; a claim past it
/// returns at once with what it found (possibly nothing), so waiting clients
/// cannot grow memory without bound.
pub const CLAIM_WAITERS_MAX: usize = 4096;

/// Wakes every registered waiter on [`Signal::notify`].
#[derive(Debug, Default)]
pub struct Signal {
    epoch: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    /// Wakes every waiter registered so far.
    pub fn notify(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    /// Number of waiters currently registered.
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len()
    }

    /// Resolves at the next [`Signal::notify`] after this call.
    pub fn wait(&self) -> SignalWait<'_> {
        SignalWait { signal: self, seen: self.epoch.get() }
    }
}

/// Future returned by [`Signal::wait`].
#[derive(Debug)]
pub struct SignalWait<'a> {
    signal: &'a Signal,
    seen: u64,
}

impl Future for SignalWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.epoch.get() != self.seen {
            return Poll::Ready(());
        }
        let mut wakers = self.signal.wakers.borrow_mut();
        if !wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_resolves_only_after_notify() {
        // Goal: a waiter is not released early and is released by notify.
        let signal = Signal::default();
        let mut wait = Box::pin(signal.wait());
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert_eq!(signal.waiters(), 1);
        signal.notify();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert_eq!(signal.waiters(), 0);
    }
}
