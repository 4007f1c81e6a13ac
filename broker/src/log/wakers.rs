//! The broker's one wake-up primitive, single-threaded and runtime-free:
//! [`WakerSet`], a slab of wakers keyed by a [`WakerKey`] handle, where
//! adding, replacing, waking and removing one waiter are O(1) (no scan of
//! the other waiters), and waking everyone is one pass. On it:
//! - [`Notify`]: a broadcast with an epoch, so a waiter created before a
//!   `notify_all` never misses it (the log's background parts, the
//!   journal, a commit's [`crate::log::Ticket`], a claim's cancel);
//! - the partition's register of long-polling claims
//!   (`partition/signal.rs`), which keeps a key per waiting claim and wakes
//!   exactly the ones it picks.
//!
//! A waiter owns its key: the key is freed only when the waiter removes it
//! (its future completes or is dropped), so a key is never reused while
//! anyone still holds it. Plus [`join_all`]. Everything runs on one thread
//! (thread-per-core), so `Cell`/`RefCell` suffice.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A waiter's place in a [`WakerSet`]. Not `Clone`: one owner removes it.
#[derive(Debug, PartialEq, Eq)]
pub struct WakerKey(usize);

#[derive(Debug)]
enum Slot {
    /// Free; the index of the next free slot, if any.
    Free(Option<usize>),
    /// Held by a waiter; its waker once it has polled and until it is woken.
    Held(Option<Waker>),
}

/// A slab of wakers: O(1) insert, set, wake and remove by key.
#[derive(Debug, Default)]
pub struct WakerSet {
    slots: RefCell<Vec<Slot>>,
    /// Head of the free list threaded through `Slot::Free`.
    free: Cell<Option<usize>>,
    held: Cell<usize>,
}

impl WakerSet {
    /// Takes a slot, with no waker yet.
    pub fn insert(&self) -> WakerKey {
        let mut slots = self.slots.borrow_mut();
        self.held.set(self.held.get() + 1);
        match self.free.get() {
            Some(index) => {
                let next = match slots[index] {
                    Slot::Free(next) => next,
                    Slot::Held(_) => unreachable!("free list names a held slot {index}"),
                };
                self.free.set(next);
                slots[index] = Slot::Held(None);
                WakerKey(index)
            }
            None => {
                slots.push(Slot::Held(None));
                WakerKey(slots.len() - 1)
            }
        }
    }

    /// Stores `waker` as the one `key` wakes, unless the stored one already
    /// wakes the same task.
    pub fn set(&self, key: &WakerKey, waker: &Waker) {
        let mut slots = self.slots.borrow_mut();
        match &mut slots[key.0] {
            Slot::Held(Some(stored)) if stored.will_wake(waker) => {}
            Slot::Held(stored) => *stored = Some(waker.clone()),
            Slot::Free(_) => unreachable!("a key outlived its slot"),
        }
    }

    #[cfg(test)]
    /// Wakes `key`'s waker, if it holds one (it then holds none until the
    /// next [`WakerSet::set`]). True if a waker was woken.
    pub fn wake(&self, key: &WakerKey) -> bool {
        match self.take(key) {
            Some(waker) => {
                waker.wake();
                true
            }
            None => false,
        }
    }

    /// Takes `key`'s waker without waking it, for a caller that wakes it
    /// once it has let go of its own borrows.
    pub fn take(&self, key: &WakerKey) -> Option<Waker> {
        match &mut self.slots.borrow_mut()[key.0] {
            Slot::Held(stored) => stored.take(),
            Slot::Free(_) => unreachable!("a key outlived its slot"),
        }
    }

    /// Wakes every stored waker (each at most once; a slot keeps its key).
    /// Returns how many were woken.
    pub fn wake_all(&self) -> usize {
        // One slot at a time, each waker taken under a short borrow and woken
        // outside it (a waker may run code that uses this set), so a wake-up
        // allocates nothing: this runs on every append and every commit.
        // Slots added while waking (past `len`) registered after this call
        // began and are left alone; a slot reused below `len` may get a
        // spurious wake-up, which a future must tolerate anyway.
        let len = self.slots.borrow().len();
        let mut count = 0;
        for index in 0..len {
            let waker = match self.slots.borrow_mut().get_mut(index) {
                Some(Slot::Held(stored)) => stored.take(),
                _ => None,
            };
            if let Some(waker) = waker {
                waker.wake();
                count += 1;
            }
        }
        count
    }

    /// Gives the slot back; its waker (if any) is dropped unwoken.
    pub fn remove(&self, key: WakerKey) {
        let mut slots = self.slots.borrow_mut();
        debug_assert!(matches!(slots[key.0], Slot::Held(_)), "a key removed twice");
        slots[key.0] = Slot::Free(self.free.get());
        self.free.set(Some(key.0));
        self.held.set(self.held.get() - 1);
    }

    #[cfg(test)]
    /// Slots held now.
    pub fn len(&self) -> usize {
        self.held.get()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Wakes every waiter registered before `notify_all`. A waiter created after
/// checking its condition (with no await in between) cannot miss a wake-up:
/// it records the notification epoch at creation.
#[derive(Debug, Default)]
pub struct Notify {
    epoch: Cell<u64>,
    waiters: WakerSet,
}

impl Notify {
    pub fn notify_all(&self) {
        self.epoch.set(self.epoch.get() + 1);
        self.waiters.wake_all();
    }

    /// Resolves at the first `notify_all` after this call.
    pub fn wait(&self) -> NotifyWait<'_> {
        NotifyWait { notify: self, epoch: self.epoch.get(), key: None }
    }

    #[cfg(test)]
    /// Waits that have polled and are not yet resolved or dropped.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }
}

/// Future of [`Notify::wait`]; dropping it gives its slot back.
#[derive(Debug)]
pub struct NotifyWait<'a> {
    notify: &'a Notify,
    epoch: u64,
    key: Option<WakerKey>,
}

impl Future for NotifyWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.notify.epoch.get() != this.epoch {
            if let Some(key) = this.key.take() {
                this.notify.waiters.remove(key);
            }
            return Poll::Ready(());
        }
        let waiters = &this.notify.waiters;
        let key = this.key.get_or_insert_with(|| waiters.insert());
        waiters.set(key, cx.waker());
        Poll::Pending
    }
}

impl Drop for NotifyWait<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.notify.waiters.remove(key);
        }
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Count {
        fn get(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// Polls `future` once with `count`'s waker; true if it is ready.
    fn poll_with<F: Future + Unpin>(future: &mut F, count: &Arc<Count>) -> bool {
        let waker = Waker::from(count.clone());
        Pin::new(future).poll(&mut Context::from_waker(&waker)).is_ready()
    }

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

    #[test]
    fn every_waiter_is_woken_exactly_once_per_notify() {
        // Goal: no waiter is lost and none is woken twice: each of many waiters (one of
        // them polled twice, one that moved to another task) is woken once by one
        // notify_all, through the waker it polled with last, and a second notify_all
        // wakes none of them again. Method: counting wakers, one per waiter.
        let notify = Notify::default();
        let counts: Vec<Arc<Count>> = (0..6).map(|_| Arc::default()).collect();
        let mut waits: Vec<NotifyWait<'_>> = (0..6).map(|_| notify.wait()).collect();
        for (wait, count) in waits.iter_mut().zip(&counts) {
            assert!(!poll_with(wait, count));
        }
        // Polled again with the same waker: still one entry.
        assert!(!poll_with(&mut waits[0], &counts[0]));
        // Polled again by another task: only the newest waker counts.
        let moved = Arc::new(Count::default());
        assert!(!poll_with(&mut waits[1], &moved));
        assert_eq!(notify.waiting(), 6);
        notify.notify_all();
        let woken: Vec<usize> = counts.iter().map(|count| count.get()).collect();
        assert_eq!(woken, [1, 0, 1, 1, 1, 1], "waiter 1 moved to another waker");
        assert_eq!(moved.get(), 1);
        notify.notify_all();
        assert_eq!(counts.iter().map(|count| count.get()).sum::<usize>(), 5, "no second wake");
        assert_eq!(moved.get(), 1, "no second wake");
        for (wait, count) in waits.iter_mut().zip(&counts) {
            assert!(poll_with(wait, count), "every waiter resolves");
        }
        assert_eq!(notify.waiting(), 0, "a resolved wait gives its slot back");
        // A wait created after the notify waits for the next one.
        let mut late = notify.wait();
        let late_count = Arc::new(Count::default());
        assert!(!poll_with(&mut late, &late_count));
        notify.notify_all();
        assert_eq!(late_count.get(), 1);
        assert!(poll_with(&mut late, &late_count));
    }

    #[test]
    fn a_dropped_wait_deregisters_and_its_slot_is_reused() {
        // Goal: cancelling a wait (dropping its future) removes it at once: it is never
        // woken, the set does not grow with cancelled waits, and the slot it freed serves
        // a new waiter without disturbing the others. Method: register three, drop the
        // middle one, register again, notify.
        let notify = Notify::default();
        let counts: Vec<Arc<Count>> = (0..4).map(|_| Arc::default()).collect();
        let mut first = notify.wait();
        let mut middle = notify.wait();
        let mut last = notify.wait();
        assert!(!poll_with(&mut first, &counts[0]));
        assert!(!poll_with(&mut middle, &counts[1]));
        assert!(!poll_with(&mut last, &counts[2]));
        assert_eq!(notify.waiting(), 3);
        drop(middle);
        assert_eq!(notify.waiting(), 2);
        let mut newcomer = notify.wait();
        assert!(!poll_with(&mut newcomer, &counts[3]));
        assert_eq!(notify.waiting(), 3);
        assert_eq!(notify.waiters.slots.borrow().len(), 3, "the freed slot was reused");
        notify.notify_all();
        let woken: Vec<usize> = counts.iter().map(|count| count.get()).collect();
        assert_eq!(woken, [1, 0, 1, 1], "the dropped wait is never woken");
        drop((first, last, newcomer));
        assert_eq!(notify.waiting(), 0);
        // Many cancelled waits leave nothing behind.
        for _ in 0..1000 {
            let mut wait = notify.wait();
            assert!(!poll_with(&mut wait, &counts[0]));
        }
        assert!(notify.waiters.is_empty());
        assert_eq!(notify.waiters.slots.borrow().len(), 3);
    }

    #[test]
    fn a_key_wakes_only_its_own_waker_once() {
        // Goal: waking one key wakes exactly that waiter, once, and a freed key's slot
        // taken by another waiter is not woken through the old key's neighbours. Method:
        // three keys with counting wakers, targeted wakes, remove and reinsert.
        let set = WakerSet::default();
        let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
        let keys: Vec<WakerKey> = (0..3).map(|_| set.insert()).collect();
        assert!(!set.wake(&keys[0]), "no waker stored yet");
        for (key, count) in keys.iter().zip(&counts) {
            set.set(key, &Waker::from(count.clone()));
        }
        assert!(set.wake(&keys[1]));
        assert!(!set.wake(&keys[1]), "a waker is woken once");
        assert_eq!(counts.iter().map(|count| count.get()).collect::<Vec<_>>(), [0, 1, 0]);
        let mut keys = keys.into_iter();
        let (first, second, third) = (keys.next(), keys.next(), keys.next());
        set.remove(second.expect("three keys"));
        let reused = set.insert();
        let reused_count = Arc::new(Count::default());
        set.set(&reused, &Waker::from(reused_count.clone()));
        assert_eq!(set.wake_all(), 3);
        assert_eq!(counts.iter().map(|count| count.get()).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(reused_count.get(), 1);
        assert_eq!(set.wake_all(), 0, "nothing stored after a wake");
        for key in [first, third, Some(reused)].into_iter().flatten() {
            set.remove(key);
        }
        assert!(set.is_empty());
    }
}
