//! A single-threaded "messages may be claimable" signal for long-polling
//! claims, and the register of who is waiting on it.
//!
//! Every waiting claim holds a [`WaiterSlot`], and wakes are **targeted**:
//! [`Signal::notify`] wakes the `n` longest-waiting claims that are not
//! already awake (an enqueue of `n` messages wakes `n`), [`Signal::expire`]
//! wakes only the claims whose wait deadline has passed (the housekeeping
//! tick calls it), an eviction wakes only the evicted claim, and
//! [`Signal::notify_all`] (close, redrive) wakes everyone. A claim woken by
//! `notify` holds a *wake*: if it looks and finds nothing it waits again and
//! the wake is spent (it goes to the back of the line, so the next wake
//! goes to someone else); if it leaves instead (it took messages, gave up,
//! was cancelled) the wake passes to the next waiting claim, so messages it
//! did not take are never left behind with everyone asleep. A partition
//! with 4,096 waiting claims therefore does one claim decision per message
//! that arrives, not 4,096, and a tick with nothing due wakes nobody: the
//! cost of a long-poll is paid when it has something to find. This module
//! names no runtime.
//!
//! A claim that goes on waiting first takes a [`WaiterSlot`]: the slot counts
//! against the partition's bound (`CLAIM_WAITERS_MAX`) and against its
//! owner's own bound (the connection it came from), and it is given back the
//! moment the claim returns or is dropped, so a cancelled wait frees its room
//! at once. When the partition is full, a newcomer whose owner holds fewer
//! waiting claims here than the heaviest owner takes one of that owner's
//! slots: the evicted claim is answered at once with what it found (nothing),
//! as if its wait had ended. One client with many connections therefore
//! cannot fill a partition and lock every other consumer out.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::log::wakers::{Notify, WakerKey, WakerSet};

pub use crate::limits::{CLAIM_WAITERS_MAX, TICK_SWEEP_WAKES};

/// Who a waiting claim belongs to (a client connection), with that owner's
/// own bound on claims waiting at once, across every partition of the shard.
#[derive(Debug, Clone, Copy)]
pub struct WaitOwner<'a> {
    /// Distinct per connection on this shard.
    pub id: u64,
    /// Claims of this owner waiting now, on any partition.
    pub waiting: &'a Cell<usize>,
    /// Most claims this owner may have waiting at once.
    pub waiting_max: usize,
}

/// Why a claim may not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitRefused {
    /// The owner already has `waiting_max` claims waiting.
    OwnerFull { waiting_max: usize },
    /// The partition has `CLAIM_WAITERS_MAX` claims waiting and none of them
    /// belongs to an owner holding more than this one.
    PartitionFull { waiters_max: usize },
}

/// One waiting claim's entry.
#[derive(Debug)]
struct Entry {
    owner: u64,
    /// Wait deadline (ms, the partition's clock).
    deadline: u64,
    /// Its place in the signal's [`WakerSet`], held from register to drop.
    waker: WakerKey,
    /// Woken and not yet waiting again: its wait resolves.
    woken: bool,
    /// Woken by [`Signal::notify`]: the wake passes on if it leaves.
    holds_wake: bool,
    /// Told to give up its wait for a lighter owner.
    evicted: bool,
}

/// The register of waiting claims and their targeted wakes. Every choice of
/// whom to wake is a lookup in an ordered index (no scan of the waiters),
/// and the wakers themselves live in one [`WakerSet`].
#[derive(Debug, Default)]
pub struct Signal {
    /// Keys grow: the smallest key has waited longest.
    next_key: Cell<u64>,
    slots: RefCell<BTreeMap<u64, Entry>>,
    /// Keys of the slots not woken, oldest first: whom [`Signal::notify`]
    /// wakes next.
    asleep: RefCell<BTreeSet<u64>>,
    /// (deadline, key) of every slot, for [`Signal::expire`].
    deadlines: RefCell<BTreeSet<(u64, u64)>>,
    /// Keys of the slots not evicted, per owner id (newest last).
    per_owner: RefCell<BTreeMap<u64, BTreeSet<u64>>>,
    evicted: Cell<usize>,
    /// Wakes issued so far (every kind), for tests and diagnostics.
    wakes: Cell<u64>,
    wakers: WakerSet,
}

impl Signal {
    /// Wakes up to `count` of the longest-waiting claims not already awake,
    /// each holding a wake that passes on if it leaves without waiting
    /// again. Call it with the number of messages that became claimable.
    pub fn notify(&self, count: usize) {
        let mut woken = Vec::new();
        {
            let mut asleep = self.asleep.borrow_mut();
            let mut slots = self.slots.borrow_mut();
            for _ in 0..count {
                let Some(key) = asleep.pop_first() else { break };
                if let Some(entry) = slots.get_mut(&key) {
                    entry.woken = true;
                    entry.holds_wake = true;
                    woken.extend(self.wakers.take(&entry.waker));
                }
            }
        }
        self.wake(woken);
    }

    /// Wakes every waiting claim (the partition closes, or a change whose
    /// extent is unknown).
    pub fn notify_all(&self) {
        let mut woken = Vec::new();
        for entry in self.slots.borrow_mut().values_mut() {
            entry.woken = true;
            woken.extend(self.wakers.take(&entry.waker));
        }
        self.asleep.borrow_mut().clear();
        self.wake(woken);
    }

    /// Wakes the claims whose wait deadline is at or before `now`, and no
    /// other.
    pub fn expire(&self, now: u64) {
        let mut woken = Vec::new();
        {
            let deadlines = self.deadlines.borrow();
            let mut asleep = self.asleep.borrow_mut();
            let mut slots = self.slots.borrow_mut();
            for (_, key) in deadlines.range(..=(now, u64::MAX)) {
                if let Some(entry) = slots.get_mut(key) {
                    entry.woken = true;
                    asleep.remove(key);
                    woken.extend(self.wakers.take(&entry.waker));
                }
            }
        }
        self.wake(woken);
    }

    /// Wakes what the caller took, once it let go of its borrows.
    fn wake(&self, wakers: Vec<Waker>) {
        self.wakes.set(self.wakes.get() + wakers.len() as u64);
        for waker in wakers {
            waker.wake();
        }
    }

    /// Wakes issued so far (a waiter that had not yet registered a waker
    /// is not counted).
    pub fn wakes(&self) -> u64 {
        self.wakes.get()
    }

    /// The earliest wait deadline of a claim holding a slot (evicted ones
    /// included until they leave): when [`Signal::expire`] next has
    /// something to end.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.borrow().first().map(|&(deadline, _)| deadline)
    }

    /// Claims holding a slot and not evicted.
    pub fn claims_waiting(&self) -> usize {
        self.slots.borrow().len() - self.evicted.get()
    }

    /// Takes a slot for a claim of `owner` that is about to wait until
    /// `deadline`, evicting a waiter of the heaviest owner when the
    /// partition holds `waiters_max` and that owner holds at least two more
    /// than `owner` does.
    ///
    /// # Errors
    /// [`WaitRefused`] when the owner or the partition is at its bound.
    pub fn register<'s, 'o>(
        &'s self,
        owner: WaitOwner<'o>,
        waiters_max: usize,
        deadline: u64,
    ) -> Result<WaiterSlot<'s, 'o>, WaitRefused> {
        if owner.waiting.get() >= owner.waiting_max {
            return Err(WaitRefused::OwnerFull { waiting_max: owner.waiting_max });
        }
        if self.claims_waiting() >= waiters_max {
            // Only when the partition is full: one pass over its owners.
            let (held, heaviest) = {
                let per_owner = self.per_owner.borrow();
                let held = per_owner.get(&owner.id).map_or(0, BTreeSet::len);
                let heaviest = per_owner
                    .iter()
                    .max_by_key(|(_, keys)| keys.len())
                    .map(|(id, keys)| (*id, keys.len()));
                (held, heaviest)
            };
            match heaviest {
                Some((victim, count)) if count > held + 1 => self.evict_one(victim),
                _ => return Err(WaitRefused::PartitionFull { waiters_max }),
            }
        }
        let key = self.insert(Entry {
            owner: owner.id,
            deadline,
            waker: self.wakers.insert(),
            woken: false,
            holds_wake: false,
            evicted: false,
        });
        owner.waiting.set(owner.waiting.get() + 1);
        Ok(WaiterSlot { signal: self, key: Cell::new(key), owner })
    }

    /// Files `entry` under a new key (the newest) in every index it belongs to.
    fn insert(&self, entry: Entry) -> u64 {
        let key = self.next_key.get();
        self.next_key.set(key + 1);
        self.deadlines.borrow_mut().insert((entry.deadline, key));
        if !entry.woken {
            self.asleep.borrow_mut().insert(key);
        }
        if !entry.evicted {
            self.per_owner.borrow_mut().entry(entry.owner).or_default().insert(key);
        }
        self.slots.borrow_mut().insert(key, entry);
        key
    }

    /// Takes the entry under `key` out of every index.
    fn remove(&self, key: u64) -> Option<Entry> {
        let entry = self.slots.borrow_mut().remove(&key)?;
        self.deadlines.borrow_mut().remove(&(entry.deadline, key));
        self.asleep.borrow_mut().remove(&key);
        if !entry.evicted {
            self.forget_owner_key(entry.owner, key);
        }
        Some(entry)
    }

    /// Tells the newest waiting claim of `victim` to give up, and wakes it
    /// (only it) so it sees it.
    fn evict_one(&self, victim: u64) {
        let newest = self.per_owner.borrow().get(&victim).and_then(|keys| keys.last().copied());
        let Some(key) = newest else { return };
        let waker = {
            let mut slots = self.slots.borrow_mut();
            let Some(entry) = slots.get_mut(&key) else { return };
            entry.evicted = true;
            entry.woken = true;
            self.wakers.take(&entry.waker)
        };
        self.asleep.borrow_mut().remove(&key);
        self.evicted.set(self.evicted.get() + 1);
        self.forget_owner_key(victim, key);
        self.wake(waker.into_iter().collect());
    }

    fn forget_owner_key(&self, owner: u64, key: u64) {
        let mut per_owner = self.per_owner.borrow_mut();
        if let Some(keys) = per_owner.get_mut(&owner) {
            keys.remove(&key);
            if keys.is_empty() {
                per_owner.remove(&owner);
            }
        }
    }
}

/// A waiting claim's place on a partition; given back on drop.
#[derive(Debug)]
pub struct WaiterSlot<'s, 'o> {
    signal: &'s Signal,
    /// Changes when a spent wake sends the claim to the back of the line.
    key: Cell<u64>,
    owner: WaitOwner<'o>,
}

impl WaiterSlot<'_, '_> {
    /// The partition took this slot for a lighter owner: stop waiting.
    pub fn evicted(&self) -> bool {
        self.signal.slots.borrow().get(&self.key.get()).is_some_and(|entry| entry.evicted)
    }

    /// Resolves when this claim is woken: messages may be claimable, its
    /// deadline passed, it was evicted, or the partition closes. Call it
    /// after looking and finding nothing: a wake it held is spent then, and
    /// the claim goes to the back of the line.
    pub fn wait(&self) -> SlotWait<'_> {
        let signal = self.signal;
        let key = self.key.get();
        let spent = signal.slots.borrow().get(&key).is_some_and(|entry| entry.woken);
        if spent {
            if let Some(mut entry) = signal.remove(key) {
                entry.woken = entry.evicted;
                entry.holds_wake = false;
                drop(signal.wakers.take(&entry.waker));
                self.key.set(signal.insert(entry));
            }
        }
        SlotWait { signal, key: &self.key }
    }

    /// [`WaiterSlot::wait`] for a claim that may also give up (`give_up`
    /// resolves: the peer closed, its wait ended) or be withdrawn
    /// (`cancel`). True when it gave up or was withdrawn; false when it was
    /// woken (look again).
    pub async fn wait_or_give_up(
        &self,
        give_up: Pin<&mut impl Future<Output = ()>>,
        cancel: &ClaimCancel,
    ) -> bool {
        let wait = async {
            self.wait().await;
            false
        };
        let gave_up = async {
            futures_lite::future::or(give_up, cancel.cancelled()).await;
            true
        };
        futures_lite::future::or(wait, gave_up).await
    }
}

impl Drop for WaiterSlot<'_, '_> {
    fn drop(&mut self) {
        let signal = self.signal;
        let Some(entry) = signal.remove(self.key.get()) else { return };
        if entry.evicted {
            signal.evicted.set(signal.evicted.get() - 1);
        }
        signal.wakers.remove(entry.waker);
        self.owner.waiting.set(self.owner.waiting.get() - 1);
        if entry.holds_wake {
            // It leaves without waiting again: what it did not take is the
            // next waiter's to look at.
            signal.notify(1);
        }
    }
}

/// Future returned by [`WaiterSlot::wait`].
#[derive(Debug)]
pub struct SlotWait<'a> {
    signal: &'a Signal,
    key: &'a Cell<u64>,
}

impl Future for SlotWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let slots = self.signal.slots.borrow();
        let Some(entry) = slots.get(&self.key.get()) else {
            return Poll::Ready(());
        };
        if entry.woken {
            return Poll::Ready(());
        }
        self.signal.wakers.set(&entry.waker, cx.waker());
        Poll::Pending
    }
}

/// Where a cancellable claim stands, for [`ClaimCancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CancelState {
    /// Nothing decided yet: a cancel still withdraws it.
    Open,
    /// Cancelled before it decided anything: it claims nothing more.
    Cancelled,
    /// It decided deliveries (is appending or answering): too late to cancel.
    Decided,
}

/// The cancel handle of one claim (the protocol's CancelClaim). The claim
/// calls [`ClaimCancel::decide`] the moment it has deliveries to append,
/// before any await, and [`ClaimCancel::is_cancelled`] before each decision;
/// a cancel arriving in between is therefore either before the decision
/// (the claim answers empty, nothing claimed) or after it (the cancel is
/// refused and the claim's answer stands). Single-threaded, runtime-free.
#[derive(Debug)]
pub struct ClaimCancel {
    state: Cell<CancelState>,
    /// Told once, when the claim is cancelled.
    cancelled: Notify,
}

impl Default for ClaimCancel {
    fn default() -> Self {
        Self { state: Cell::new(CancelState::Open), cancelled: Notify::default() }
    }
}

impl ClaimCancel {
    /// Withdraws the claim if it has decided nothing yet; true if it did.
    pub fn cancel(&self) -> bool {
        if self.state.get() != CancelState::Open {
            return false;
        }
        self.state.set(CancelState::Cancelled);
        self.cancelled.notify_all();
        true
    }

    /// Whether [`ClaimCancel::cancel`] withdrew the claim.
    pub fn is_cancelled(&self) -> bool {
        self.state.get() == CancelState::Cancelled
    }

    /// The claim decided deliveries: from now on a cancel is refused.
    /// Returns false (and changes nothing) if it was cancelled already.
    pub fn decide(&self) -> bool {
        if self.state.get() == CancelState::Cancelled {
            return false;
        }
        self.state.set(CancelState::Decided);
        true
    }

    /// Resolves once the claim is cancelled.
    pub async fn cancelled(&self) {
        loop {
            // Created before the check: a cancel after it is not missed.
            let wait = self.cancelled.wait();
            if self.is_cancelled() {
                return;
            }
            wait.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn owner(id: u64, waiting: &Cell<usize>) -> WaitOwner<'_> {
        WaitOwner { id, waiting, waiting_max: 100 }
    }

    /// Polls `slot`'s wait once with its own counting waker; true if ready.
    fn ready(slot: &WaiterSlot<'_, '_>, count: &Arc<Count>) -> bool {
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        Box::pin(slot.wait_again_free()).as_mut().poll(&mut cx).is_ready()
    }

    impl WaiterSlot<'_, '_> {
        /// The wait future without spending a wake (test helper: polls the
        /// state as it is).
        fn wait_again_free(&self) -> SlotWait<'_> {
            SlotWait { signal: self.signal, key: &self.key }
        }
    }

    #[test]
    fn notify_wakes_only_as_many_waiters_as_messages_oldest_first() {
        // Goal: a message arriving at a partition with many waiting claims
        // wakes one of them, the longest waiting, not all (the herd that
        // saturated a shard with 4,096 long-polls). Method: 100 waiters
        // with counting wakers; notify(1), then notify(2).
        let signal = Signal::default();
        let waiting = Cell::new(0);
        let slots: Vec<_> =
            (0..100).map(|_| signal.register(owner(1, &waiting), 1000, 60_000).unwrap()).collect();
        let counts: Vec<Arc<Count>> = (0..100).map(|_| Arc::default()).collect();
        for (slot, count) in slots.iter().zip(&counts) {
            assert!(!ready(slot, count));
        }
        signal.notify(1);
        let woken: Vec<usize> =
            (0..100).filter(|&i| counts[i].0.load(Ordering::Relaxed) > 0).collect();
        assert_eq!(woken, vec![0], "one message, one wake, the oldest waiter");
        assert!(ready(&slots[0], &counts[0]));
        signal.notify(2);
        let woken: Vec<usize> =
            (0..100).filter(|&i| counts[i].0.load(Ordering::Relaxed) > 0).collect();
        assert_eq!(woken, vec![0, 1, 2], "an awake waiter is not woken twice");
        assert_eq!(signal.wakes(), 3);
    }

    #[test]
    fn a_wake_passes_on_when_its_claim_leaves_and_is_spent_when_it_waits_again() {
        // Goal: a woken claim that leaves (it took messages, gave up, was
        // cancelled) hands its wake to the next waiter, so messages are
        // never left with everyone asleep; one that finds nothing and waits
        // again spends it and goes to the back of the line. Method: three
        // waiters; notify(1); the first leaves, then the second waits again;
        // the next notify reaches the third, then the second.
        let signal = Signal::default();
        let waiting = Cell::new(0);
        let first = signal.register(owner(1, &waiting), 10, 60_000).unwrap();
        let second = signal.register(owner(1, &waiting), 10, 60_000).unwrap();
        let third = signal.register(owner(1, &waiting), 10, 60_000).unwrap();
        let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
        for (slot, count) in [&first, &second, &third].into_iter().zip(&counts) {
            assert!(!ready(slot, count));
        }
        signal.notify(1);
        assert!(ready(&first, &counts[0]));
        assert!(!ready(&second, &counts[1]));
        drop(first);
        assert_eq!(counts[1].0.load(Ordering::Relaxed), 1, "the wake passed on");
        assert!(ready(&second, &counts[1]));
        assert!(!ready(&third, &counts[2]));
        // The second found nothing and waits again: the wake is spent.
        let waker = Waker::from(counts[1].clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Box::pin(second.wait()).as_mut().poll(&mut cx).is_pending());
        assert_eq!(counts[2].0.load(Ordering::Relaxed), 0, "a spent wake wakes nobody");
        signal.notify(1);
        assert!(ready(&third, &counts[2]), "the line moved: the third is next");
        assert!(!ready(&second, &counts[1]));
        drop(third);
        assert!(ready(&second, &counts[1]), "and the third's wake passes to the second");
        drop(second);
        assert_eq!(waiting.get(), 0);
        assert_eq!(signal.claims_waiting(), 0);
    }

    #[test]
    fn expire_wakes_only_waiters_past_their_deadline_and_notify_all_wakes_everyone() {
        // Goal: the housekeeping tick ends waits whose deadline passed
        // without waking the others; closing wakes everyone. Method:
        // deadlines 10, 20, 30; expire(20); then notify_all.
        let signal = Signal::default();
        let waiting = Cell::new(0);
        let slots: Vec<_> = [30, 10, 20]
            .iter()
            .map(|&deadline| signal.register(owner(1, &waiting), 10, deadline).unwrap())
            .collect();
        let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::default()).collect();
        for (slot, count) in slots.iter().zip(&counts) {
            assert!(!ready(slot, count));
        }
        signal.expire(5);
        assert_eq!(signal.wakes(), 0);
        signal.expire(20);
        let woken: Vec<bool> = slots.iter().zip(&counts).map(|(s, c)| ready(s, c)).collect();
        assert_eq!(woken, vec![false, true, true]);
        signal.notify_all();
        assert!(slots.iter().zip(&counts).all(|(s, c)| ready(s, c)));
    }

    #[test]
    fn slots_count_per_owner_and_are_given_back_on_drop() {
        // Goal: an owner cannot hold more than its own bound, and a dropped
        // slot frees both the owner's and the partition's room at once.
        // Method: register up to the owner bound, one more is refused, drop
        // one, register again.
        let signal = Signal::default();
        let waiting = Cell::new(0);
        let owner = WaitOwner { id: 1, waiting: &waiting, waiting_max: 3 };
        let mut held: Vec<_> = (0..3).map(|_| signal.register(owner, 100, 0).unwrap()).collect();
        assert_eq!(waiting.get(), 3);
        assert_eq!(signal.claims_waiting(), 3);
        assert_eq!(
            signal.register(owner, 100, 0).unwrap_err(),
            WaitRefused::OwnerFull { waiting_max: 3 }
        );
        held.pop();
        assert_eq!(waiting.get(), 2);
        assert_eq!(signal.claims_waiting(), 2);
        held.push(signal.register(owner, 100, 0).unwrap());
        drop(held);
        assert_eq!(waiting.get(), 0);
        assert_eq!(signal.claims_waiting(), 0);
    }

    #[test]
    fn a_full_partition_evicts_the_heaviest_owner_for_a_lighter_one() {
        // Goal: one greedy owner filling the partition cannot lock out another
        // owner: the newcomer takes a slot of the greedy one, which is told to
        // give up (and woken, alone); an owner as heavy as everyone else is
        // refused instead. Method: owner 1 fills a partition of 4, owner 2
        // registers twice.
        let signal = Signal::default();
        let greedy_waiting = Cell::new(0);
        let greedy = WaitOwner { id: 1, waiting: &greedy_waiting, waiting_max: 100 };
        let good_waiting = Cell::new(0);
        let good = WaitOwner { id: 2, waiting: &good_waiting, waiting_max: 100 };
        let greedy_slots: Vec<_> =
            (0..4).map(|_| signal.register(greedy, 4, 60_000).unwrap()).collect();
        let counts: Vec<Arc<Count>> = (0..4).map(|_| Arc::default()).collect();
        for (slot, count) in greedy_slots.iter().zip(&counts) {
            assert!(!ready(slot, count));
        }
        assert_eq!(
            signal.register(greedy, 4, 60_000).unwrap_err(),
            WaitRefused::PartitionFull { waiters_max: 4 }
        );
        let first = signal.register(good, 4, 60_000).unwrap();
        assert!(!first.evicted());
        assert_eq!(greedy_slots.iter().filter(|slot| slot.evicted()).count(), 1);
        assert_eq!(signal.wakes(), 1, "only the evicted claim is woken");
        assert!(ready(&greedy_slots[3], &counts[3]), "the newest greedy claim");
        assert_eq!(signal.claims_waiting(), 4);
        // Owner 1 now holds 3 live slots, owner 2 holds 1: 3 > 1 + 1.
        let second = signal.register(good, 4, 60_000).unwrap();
        assert_eq!(greedy_slots.iter().filter(|slot| slot.evicted()).count(), 2);
        // 2 against 2: nobody is heavier by two, so the partition is full.
        assert!(signal.register(good, 4, 60_000).is_err());
        drop(greedy_slots);
        assert_eq!(greedy_waiting.get(), 0);
        assert_eq!(signal.claims_waiting(), 2);
        drop((first, second));
        assert_eq!(signal.claims_waiting(), 0);
        assert!(signal.per_owner.borrow().is_empty());
        assert!(signal.wakers.is_empty(), "every dropped slot gave its waker key back");
        assert!(signal.asleep.borrow().is_empty());
    }
}
