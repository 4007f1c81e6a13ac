//! A single-threaded "something changed" signal for long-polling claims, and
//! the register of who is waiting on it.
//!
//! Waiters register a waker and are woken all at once on [`Signal::notify`];
//! each then re-checks its own condition (a claim retries its decision, and
//! gives up when its wait deadline has passed). The partition notifies when
//! messages may have become claimable and on every housekeeping tick, so a
//! waiter never needs a timer of its own and this module names no runtime.
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

/// Most claims that may long-poll one partition at once; a claim past it
/// returns at once with what it found (possibly nothing), so waiting clients
/// cannot grow memory without bound.
pub const CLAIM_WAITERS_MAX: usize = 4096;

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

/// Wakes every registered waiter on [`Signal::notify`].
#[derive(Debug, Default)]
pub struct Signal {
    epoch: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
    next_slot: Cell<u64>,
    /// Live slots (evicted ones included, until their claim returns).
    slots: RefCell<BTreeMap<u64, u64>>,
    /// Slots not evicted, per owner id.
    per_owner: RefCell<BTreeMap<u64, usize>>,
    /// Slots told to give up their wait.
    evicted: RefCell<BTreeSet<u64>>,
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

    /// Number of wakers currently registered.
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len()
    }

    /// Claims holding a slot and not evicted.
    pub fn claims_waiting(&self) -> usize {
        self.slots.borrow().len() - self.evicted.borrow().len()
    }

    /// Resolves at the next [`Signal::notify`] after this call.
    pub fn wait(&self) -> SignalWait<'_> {
        SignalWait { signal: self, seen: self.epoch.get() }
    }

    /// Takes a slot for a claim of `owner` that is about to wait, evicting a
    /// waiter of the heaviest owner when the partition holds `waiters_max`
    /// and that owner holds at least two more than `owner` does.
    ///
    /// # Errors
    /// [`WaitRefused`] when the owner or the partition is at its bound.
    pub fn register<'s, 'o>(
        &'s self,
        owner: WaitOwner<'o>,
        waiters_max: usize,
    ) -> Result<WaiterSlot<'s, 'o>, WaitRefused> {
        if owner.waiting.get() >= owner.waiting_max {
            return Err(WaitRefused::OwnerFull { waiting_max: owner.waiting_max });
        }
        if self.claims_waiting() >= waiters_max {
            let held = self.per_owner.borrow().get(&owner.id).copied().unwrap_or(0);
            let heaviest = self
                .per_owner
                .borrow()
                .iter()
                .max_by_key(|(_, count)| **count)
                .map(|(id, count)| (*id, *count));
            match heaviest {
                Some((victim, count)) if count > held + 1 => self.evict_one(victim),
                _ => return Err(WaitRefused::PartitionFull { waiters_max }),
            }
        }
        let key = self.next_slot.get();
        self.next_slot.set(key + 1);
        self.slots.borrow_mut().insert(key, owner.id);
        *self.per_owner.borrow_mut().entry(owner.id).or_insert(0) += 1;
        owner.waiting.set(owner.waiting.get() + 1);
        Ok(WaiterSlot { signal: self, key, owner })
    }

    /// Tells the newest waiting claim of `victim` to give up, and wakes the
    /// waiters so it sees it.
    fn evict_one(&self, victim: u64) {
        let key = {
            let slots = self.slots.borrow();
            let evicted = self.evicted.borrow();
            slots
                .iter()
                .rev()
                .find(|(key, owner)| **owner == victim && !evicted.contains(key))
                .map(|(key, _)| *key)
        };
        let Some(key) = key else { return };
        self.evicted.borrow_mut().insert(key);
        self.forget_owner_slot(victim);
        self.notify();
    }

    fn forget_owner_slot(&self, owner: u64) {
        let mut per_owner = self.per_owner.borrow_mut();
        if let Some(count) = per_owner.get_mut(&owner) {
            *count -= 1;
            if *count == 0 {
                per_owner.remove(&owner);
            }
        }
    }
}

/// A waiting claim's place on a partition; given back on drop.
#[derive(Debug)]
pub struct WaiterSlot<'s, 'o> {
    signal: &'s Signal,
    key: u64,
    owner: WaitOwner<'o>,
}

impl WaiterSlot<'_, '_> {
    /// The partition took this slot for a lighter owner: stop waiting.
    pub fn evicted(&self) -> bool {
        self.signal.evicted.borrow().contains(&self.key)
    }
}

impl Drop for WaiterSlot<'_, '_> {
    fn drop(&mut self) {
        let signal = self.signal;
        signal.slots.borrow_mut().remove(&self.key);
        if !signal.evicted.borrow_mut().remove(&self.key) {
            signal.forget_owner_slot(self.owner.id);
        }
        self.owner.waiting.set(self.owner.waiting.get() - 1);
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
    waker: RefCell<Option<Waker>>,
}

impl Default for ClaimCancel {
    fn default() -> Self {
        Self { state: Cell::new(CancelState::Open), waker: RefCell::new(None) }
    }
}

impl ClaimCancel {
    /// Withdraws the claim if it has decided nothing yet; true if it did.
    pub fn cancel(&self) -> bool {
        if self.state.get() != CancelState::Open {
            return false;
        }
        self.state.set(CancelState::Cancelled);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
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

    /// Resolves once the claim is cancelled (one waiter: the claim itself).
    pub async fn cancelled(&self) {
        std::future::poll_fn(|cx| {
            if self.is_cancelled() {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
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

    #[test]
    fn slots_count_per_owner_and_are_given_back_on_drop() {
        // Goal: an owner cannot hold more than its own bound, and a dropped
        // slot frees both the owner's and the partition's room at once.
        // Method: register up to the owner bound, one more is refused, drop
        // one, register again.
        let signal = Signal::default();
        let waiting = Cell::new(0);
        let owner = WaitOwner { id: 1, waiting: &waiting, waiting_max: 3 };
        let mut held: Vec<_> = (0..3).map(|_| signal.register(owner, 100).unwrap()).collect();
        assert_eq!(waiting.get(), 3);
        assert_eq!(signal.claims_waiting(), 3);
        assert_eq!(
            signal.register(owner, 100).unwrap_err(),
            WaitRefused::OwnerFull { waiting_max: 3 }
        );
        held.pop();
        assert_eq!(waiting.get(), 2);
        assert_eq!(signal.claims_waiting(), 2);
        held.push(signal.register(owner, 100).unwrap());
        drop(held);
        assert_eq!(waiting.get(), 0);
        assert_eq!(signal.claims_waiting(), 0);
    }

    #[test]
    fn a_full_partition_evicts_the_heaviest_owner_for_a_lighter_one() {
        // Goal: one greedy owner filling the partition cannot lock out another
        // owner: the newcomer takes a slot of the greedy one, which is told to
        // give up; an owner as heavy as everyone else is refused instead.
        // Method: owner 1 fills a partition of 4, owner 2 registers twice.
        let signal = Signal::default();
        let greedy_waiting = Cell::new(0);
        let greedy = WaitOwner { id: 1, waiting: &greedy_waiting, waiting_max: 100 };
        let good_waiting = Cell::new(0);
        let good = WaitOwner { id: 2, waiting: &good_waiting, waiting_max: 100 };
        let greedy_slots: Vec<_> = (0..4).map(|_| signal.register(greedy, 4).unwrap()).collect();
        assert_eq!(
            signal.register(greedy, 4).unwrap_err(),
            WaitRefused::PartitionFull { waiters_max: 4 }
        );
        let first = signal.register(good, 4).unwrap();
        assert!(!first.evicted());
        assert_eq!(greedy_slots.iter().filter(|slot| slot.evicted()).count(), 1);
        assert_eq!(signal.claims_waiting(), 4);
        // Owner 1 now holds 3 live slots, owner 2 holds 1: 3 > 1 + 1.
        let second = signal.register(good, 4).unwrap();
        assert_eq!(greedy_slots.iter().filter(|slot| slot.evicted()).count(), 2);
        // 2 against 2: nobody is heavier by two, so the partition is full.
        assert!(signal.register(good, 4).is_err());
        drop(greedy_slots);
        assert_eq!(greedy_waiting.get(), 0);
        assert_eq!(signal.claims_waiting(), 2);
        drop((first, second));
        assert_eq!(signal.claims_waiting(), 0);
        assert!(signal.per_owner.borrow().is_empty());
    }
}
