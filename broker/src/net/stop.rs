//! A single-threaded, one-way stop signal for tasks on one executor.
//!
//! Owns "stop now" fan-out inside a shard: the housekeeping timer trips it
//! when the process is asked to stop, and every accept loop and connection
//! reading loop races its I/O against [`StopSignal::wait`]. Once stopped it
//! stays stopped. Not `Send`: cross-thread stop requests go through an
//! `AtomicBool` that the shard's timer polls (see `shard`), which keeps
//! glommio's wake-up path out of the signal handler.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Inner {
    stopped: Cell<bool>,
    next_key: Cell<u64>,
    // Keyed so a waiter that is dropped before the stop removes its waker:
    // long-lived connections poll `wait` once per read and must not pile up
    // wakers.
    waiters: RefCell<BTreeMap<u64, Waker>>,
}

/// Cloneable handle to one stop flag; all clones see the same flag.
#[derive(Clone, Default)]
pub struct StopSignal {
    inner: Rc<Inner>,
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("StopSignal").field("stopped", &self.is_stopped()).finish()
    }
}

impl StopSignal {
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Trips the signal and wakes every waiter. Idempotent.
    pub fn stop(&self) {
        if self.inner.stopped.replace(true) {
            return;
        }
        let waiters = std::mem::take(&mut *self.inner.waiters.borrow_mut());
        for waker in waiters.into_values() {
            waker.wake();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.get()
    }

    /// Resolves once [`stop`](Self::stop) has been called.
    pub fn wait(&self) -> StopWait {
        StopWait { inner: self.inner.clone(), key: None }
    }

    /// Number of registered waiters (for tests of waker cleanup).
    pub fn waiter_count(&self) -> usize {
        self.inner.waiters.borrow().len()
    }
}

/// Future returned by [`StopSignal::wait`].
pub struct StopWait {
    inner: Rc<Inner>,
    key: Option<u64>,
}

impl Future for StopWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.stopped.get() {
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                let key = self.inner.next_key.get();
                self.inner.next_key.set(key + 1);
                self.key = Some(key);
                key
            }
        };
        self.inner.waiters.borrow_mut().insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for StopWait {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.inner.waiters.borrow_mut().remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future;

    // Goal: waiters resolve after stop, and dropped waiters leave nothing
    // behind. Method: poll waits by hand with a no-op context.
    #[test]
    fn wait_resolves_after_stop_and_dropped_waiters_are_removed() {
        let signal = StopSignal::new();
        let mut first = Box::pin(signal.wait());
        assert!(future::block_on(future::poll_once(&mut first)).is_none());
        {
            let mut second = Box::pin(signal.wait());
            assert!(future::block_on(future::poll_once(&mut second)).is_none());
            assert_eq!(signal.waiter_count(), 2);
        }
        assert_eq!(signal.waiter_count(), 1);
        signal.stop();
        assert!(signal.is_stopped());
        assert_eq!(future::block_on(future::poll_once(&mut first)), Some(()));
        assert_eq!(signal.waiter_count(), 0);
        assert_eq!(future::block_on(future::poll_once(signal.wait())), Some(()));
    }
}
