//! Tiny single-threaded async primitives the log needs without naming a
//! runtime: a broadcast [`Notify`] and [`join_all`]. Everything runs on one
//! thread (thread-per-core), so `Cell`/`RefCell` suffice.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Wakes every waiter registered before `notify_all`. A waiter created after
/// checking its condition (with no await in between) cannot miss a wake-up:
/// it records the notification epoch at creation.
#[derive(Default)]
pub struct Notify {
    epoch: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Notify {
    pub fn notify_all(&self) {
        self.epoch.set(self.epoch.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    /// Resolves at the first `notify_all` after this call.
    pub fn wait(&self) -> NotifyWait<'_> {
        NotifyWait { notify: self, epoch: self.epoch.get() }
    }
}

pub struct NotifyWait<'a> {
    notify: &'a Notify,
    epoch: u64,
}

impl Future for NotifyWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.epoch.get() != self.epoch {
            return Poll::Ready(());
        }
        let mut wakers = self.notify.wakers.borrow_mut();
        if !wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Polls every future until all complete.
pub async fn join_all(futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>) {
    let mut futures: Vec<Option<Pin<Box<dyn Future<Output = ()> + '_>>>> =
        futures.into_iter().map(Some).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for slot in futures.iter_mut() {
            if let Some(future) = slot {
                if future.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;
    use std::rc::Rc;

    #[test]
    fn notify_wakes_waiters_created_before_it() {
        // Goal: a waiter created before notify_all resolves; join_all waits for all.
        let notify = Rc::new(Notify::default());
        let flag = Rc::new(Cell::new(false));
        let waiter = {
            let notify = notify.clone();
            let flag = flag.clone();
            Box::pin(async move {
                notify.wait().await;
                flag.set(true);
            })
        };
        let notifier = {
            let notify = notify.clone();
            Box::pin(async move {
                futures_lite::future::yield_now().await;
                notify.notify_all();
            })
        };
        block_on(join_all(vec![waiter, notifier]));
        assert!(flag.get());
    }
}
