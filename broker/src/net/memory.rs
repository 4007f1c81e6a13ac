//! The memory a shard's connections may hold for requests, as a budget
//! they draw from ([`MemoryPool`]) instead of allocating freely.
//!
//! A connection holds request bytes in two places: its read buffer while a
//! frame arrives (above the [`READ_CHUNK_BYTES`] every connection keeps) and
//! each whole frame handed to the handler until its request is answered.
//! Buffer growth is **taken** from the shard's **requests** pool before it
//! is allocated (waiting in line when the pool is spent: the connection
//! stops reading and TCP pushes back on the sender). A whole frame's copy
//! is **charged** (its bytes are in the buffer already: making it wait in
//! the line behind partial frames could hold every buffer full for ever),
//! and no connection hands a frame over while the pool is over its size,
//! so the pool is exceeded by at most one frame. Responses produced and not
//! yet written are charged to the shard's **responses** pool the same way:
//! while it is over its size, a connection holding more than its share of
//! it ([`MemoryPool::over_share`]: a slow reader) hands over nothing until
//! its writer drains, and the others go on.
//!
//! Fairness: takers wait in arrival order, and while anyone waits a
//! connection may not hold more than its share of the pool (the pool over
//! the connections holding or waiting, never less than one largest frame),
//! so one connection cannot starve the others. A take larger than the pool
//! can never succeed: [`MemoryPool::can_ever_fit`] says so up front (the
//! broker refuses to start with a pool smaller than two largest frames).
//!
//! Single-threaded (one pool per shard thread, like the admission gate);
//! every grant returns its bytes when dropped, whichever path drops it.
//!
//! [`READ_CHUNK_BYTES`]: crate::limits::READ_CHUNK_BYTES

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::task::{Poll, Waker};

/// The name the shard's state share is reported under, beside the pools.
pub const STATE_POOL: &str = "state";

/// A pool's figures, for metrics and `/health/ready`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// The pool's size.
    pub size_bytes: u64,
    /// Bytes held now.
    pub used_bytes: u64,
    /// Most bytes held at once since the shard started.
    pub peak_bytes: u64,
    /// Takes that had to wait for memory.
    pub waits: u64,
    /// Requests refused for memory (the state share: enqueues and creates
    /// that did not fit; the connection pools wait instead and refuse none).
    pub refusals: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    owner: u64,
    bytes: usize,
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct State {
    size: usize,
    /// No owner's share is cut below this (one largest frame and a read).
    share_floor: usize,
    used: usize,
    peak: usize,
    waits: u64,
    held: HashMap<u64, usize>,
    waiters: VecDeque<Waiter>,
    next_ticket: u64,
    /// Woken when `used` falls to the size or below ([`MemoryPool::below_size`]).
    below: Vec<Waker>,
}

impl State {
    fn fits(&self, bytes: usize) -> bool {
        self.used.checked_add(bytes).is_some_and(|total| total <= self.size)
    }

    /// The waiter to serve now: the first in line that fits and keeps to
    /// its share. One that does not fit stops the search (nobody passes a
    /// larger take, so it is never starved); one that fits but is over its
    /// share is passed (it holds enough already; its own requests give
    /// memory back).
    fn eligible(&self) -> Option<u64> {
        if self.waiters.is_empty() {
            return None;
        }
        let mut waiting: HashMap<u64, usize> = HashMap::new();
        for waiter in &self.waiters {
            *waiting.entry(waiter.owner).or_default() += 1;
        }
        let mut owners: Vec<u64> = waiting.keys().copied().collect();
        owners.extend(self.held.keys().copied());
        owners.sort_unstable();
        owners.dedup();
        let share = (self.size / owners.len().max(1)).max(self.share_floor);
        for waiter in &self.waiters {
            if !self.fits(waiter.bytes) {
                return None;
            }
            let others_wait = self.waiters.len() > waiting[&waiter.owner];
            let held = self.held.get(&waiter.owner).copied().unwrap_or(0);
            if !others_wait || held + waiter.bytes <= share {
                return Some(waiter.ticket);
            }
        }
        None
    }

    fn grant(&mut self, owner: u64, bytes: usize) {
        self.used += bytes;
        self.peak = self.peak.max(self.used);
        *self.held.entry(owner).or_default() += bytes;
    }

    fn give_back(&mut self, owner: u64, bytes: usize) {
        self.used -= bytes;
        if let Some(held) = self.held.get_mut(&owner) {
            *held -= bytes;
            if *held == 0 {
                self.held.remove(&owner);
            }
        }
    }

    /// Wakes the waiter to serve now, if any: memory returned, or the line
    /// changed.
    fn wake_eligible(&mut self) {
        let Some(ticket) = self.eligible() else { return };
        let waiter = self.waiters.iter_mut().find(|waiter| waiter.ticket == ticket);
        if let Some(waker) = waiter.and_then(|waiter| waiter.waker.take()) {
            waker.wake();
        }
    }
}

/// A shard's budget for one use (requests, responses), shared by its
/// connections. See the module docs.
#[derive(Debug)]
pub struct MemoryPool {
    name: &'static str,
    state: RefCell<State>,
}

impl MemoryPool {
    /// A pool of `size` bytes; `share_floor`: the least share a connection
    /// keeps while others wait (one largest frame).
    pub fn new(name: &'static str, size: usize, share_floor: usize) -> Rc<MemoryPool> {
        Rc::new(MemoryPool {
            name,
            state: RefCell::new(State { size, share_floor, ..State::default() }),
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether a take of `bytes` can ever succeed (the pool is that large).
    pub fn can_ever_fit(&self, bytes: usize) -> bool {
        bytes <= self.state.borrow().size
    }

    /// Takes `bytes` for `owner` if nobody waits and they fit.
    pub fn try_take(self: &Rc<Self>, owner: u64, bytes: usize) -> Option<Grant> {
        let mut state = self.state.borrow_mut();
        if !state.waiters.is_empty() || !state.fits(bytes) {
            return None;
        }
        state.grant(owner, bytes);
        Some(Grant { pool: Rc::clone(self), owner, bytes })
    }

    /// Takes `bytes` for `owner`, waiting in line for them. `bytes` must
    /// fit the pool ([`Self::can_ever_fit`]); a larger take waits forever.
    pub async fn take(self: &Rc<Self>, owner: u64, bytes: usize) -> Grant {
        if let Some(grant) = self.try_take(owner, bytes) {
            return grant;
        }
        let ticket = {
            let mut state = self.state.borrow_mut();
            state.waits += 1;
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiters.push_back(Waiter { ticket, owner, bytes, waker: None });
            ticket
        };
        // Leaves the line however the wait ends (dropped included).
        let place = Place { pool: self, ticket };
        std::future::poll_fn(|cx| {
            let mut state = self.state.borrow_mut();
            if state.eligible() == Some(ticket) {
                state.waiters.retain(|waiter| waiter.ticket != ticket);
                state.grant(owner, bytes);
                // The next in line may fit too.
                state.wake_eligible();
                return Poll::Ready(());
            }
            if let Some(waiter) = state.waiters.iter_mut().find(|waiter| waiter.ticket == ticket) {
                waiter.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        std::mem::forget(place);
        Grant { pool: Rc::clone(self), owner, bytes }
    }

    /// Counts `bytes` for `owner` whether or not they fit (memory that
    /// already exists, like a produced response); [`Self::over`] then says
    /// the pool is spent.
    pub fn charge(self: &Rc<Self>, owner: u64, bytes: usize) -> Grant {
        self.state.borrow_mut().grant(owner, bytes);
        Grant { pool: Rc::clone(self), owner, bytes }
    }

    /// More is held than the pool's size (only [`Self::charge`] gets there).
    pub fn over(&self) -> bool {
        let state = self.state.borrow();
        state.used > state.size
    }

    /// The pool is over its size and `owner` holds more than its share of
    /// it (the size over the owners holding now): the owner to hold back,
    /// while those holding less go on.
    pub fn over_share(&self, owner: u64) -> bool {
        let state = self.state.borrow();
        if state.used <= state.size {
            return false;
        }
        let held = state.held.get(&owner).copied().unwrap_or(0);
        held > state.size / state.held.len().max(1)
    }

    /// Resolves once no more than the pool's size is held (it does not
    /// wait in the line of takes).
    pub async fn below_size(&self) {
        std::future::poll_fn(|cx| {
            let mut state = self.state.borrow_mut();
            if state.used <= state.size {
                return Poll::Ready(());
            }
            state.below.push(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }

    pub fn stats(&self) -> PoolStats {
        let state = self.state.borrow();
        PoolStats {
            size_bytes: state.size as u64,
            used_bytes: state.used as u64,
            peak_bytes: state.peak as u64,
            waits: state.waits,
            refusals: 0,
        }
    }

    fn give_back(&self, owner: u64, bytes: usize) {
        let mut state = self.state.borrow_mut();
        state.give_back(owner, bytes);
        if state.used <= state.size {
            for waker in state.below.drain(..) {
                waker.wake();
            }
        }
        state.wake_eligible();
    }
}

/// A waiting take's place in line; leaving it (the wait was dropped) lets
/// the next one in.
struct Place<'p> {
    pool: &'p MemoryPool,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut state = self.pool.state.borrow_mut();
        state.waiters.retain(|waiter| waiter.ticket != self.ticket);
        state.wake_eligible();
    }
}

/// Bytes taken from a [`MemoryPool`]; returned when dropped.
#[derive(Debug)]
pub struct Grant {
    pool: Rc<MemoryPool>,
    owner: u64,
    bytes: usize,
}

impl Grant {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds `more` to this grant if the pool lets its owner take them now
    /// (nobody waits, and they fit).
    pub fn try_grow(&mut self, more: usize) -> bool {
        match self.pool.try_take(self.owner, more) {
            Some(extra) => {
                self.bytes += extra.bytes;
                std::mem::forget(extra);
                true
            }
            None => false,
        }
    }

    /// Merges `other` (of the same pool and owner) into this grant.
    pub fn absorb(&mut self, other: Grant) {
        debug_assert!(Rc::ptr_eq(&self.pool, &other.pool) && self.owner == other.owner);
        self.bytes += other.bytes;
        std::mem::forget(other);
    }

    /// Gives back all but `keep` bytes.
    pub fn shrink_to(&mut self, keep: usize) {
        if keep < self.bytes {
            self.pool.give_back(self.owner, self.bytes - keep);
            self.bytes = keep;
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.pool.give_back(self.owner, self.bytes);
        }
    }
}

/// The memory pools of one shard (one per executor thread).
#[derive(Debug)]
pub struct ShardMemory {
    /// Read buffers above their floor and frames being handled.
    pub requests: Rc<MemoryPool>,
    /// Responses produced and not yet written.
    pub responses: Rc<MemoryPool>,
}

thread_local! {
    static SHARD_MEMORY: RefCell<Option<Rc<ShardMemory>>> = const { RefCell::new(None) };
}

impl ShardMemory {
    /// Sets this executor thread's pools (the shard does, once, at start).
    pub fn configure_this_shard(requests_bytes: usize, responses_bytes: usize, share_floor: usize) {
        let memory = Rc::new(ShardMemory {
            requests: MemoryPool::new("requests", requests_bytes, share_floor),
            responses: MemoryPool::new("responses", responses_bytes, share_floor),
        });
        SHARD_MEMORY.with(|slot| *slot.borrow_mut() = Some(memory));
    }

    /// Each pool's name and figures, and a place for the shard's state
    /// share (filled by the shard's hooks, which own it).
    pub fn stats(&self) -> [(&'static str, PoolStats); 3] {
        [
            (self.requests.name(), self.requests.stats()),
            (self.responses.name(), self.responses.stats()),
            (STATE_POOL, PoolStats::default()),
        ]
    }

    /// This executor thread's pools; unbounded ones where no shard set them
    /// (a connection loop run alone, in tests).
    pub fn of_this_shard() -> Rc<ShardMemory> {
        SHARD_MEMORY.with(|slot| {
            Rc::clone(slot.borrow_mut().get_or_insert_with(|| {
                Rc::new(ShardMemory {
                    requests: MemoryPool::new("requests", usize::MAX / 2, 0),
                    responses: MemoryPool::new("responses", usize::MAX / 2, 0),
                })
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    // Goal: a take that fits is granted and counted; its drop gives every
    // byte back; a take beyond the size is refused, not allocated.
    #[test]
    fn grants_are_counted_and_given_back() {
        let pool = MemoryPool::new("requests", 100, 10);
        let a = pool.try_take(1, 60).expect("fits");
        assert_eq!(pool.stats().used_bytes, 60);
        assert!(pool.try_take(2, 50).is_none(), "60 + 50 > 100");
        let b = pool.try_take(2, 40).expect("fits exactly");
        assert_eq!(pool.stats().used_bytes, 100);
        drop(a);
        drop(b);
        assert_eq!(
            pool.stats(),
            PoolStats { size_bytes: 100, used_bytes: 0, peak_bytes: 100, waits: 0, refusals: 0 }
        );
        assert!(!pool.can_ever_fit(101));
    }

    // Goal: a waiting take is served when memory returns, in arrival
    // order, and a newcomer cannot jump the line.
    #[test]
    fn waiters_are_served_in_order_when_memory_returns() {
        let pool = MemoryPool::new("requests", 100, 10);
        let held = pool.try_take(1, 90).expect("fits");
        let mut first = Box::pin(pool.take(2, 50));
        let mut second = Box::pin(pool.take(3, 5));
        assert!(block_on(poll_once(&mut first)).is_none());
        assert!(block_on(poll_once(&mut second)).is_none(), "5 would fit, but 2 waits ahead");
        assert!(pool.try_take(4, 5).is_none(), "a newcomer waits behind the line");
        drop(held);
        let first = block_on(poll_once(&mut first)).expect("memory returned");
        let second = block_on(poll_once(&mut second)).expect("the line moved on");
        assert_eq!((first.bytes(), second.bytes()), (50, 5));
        assert_eq!(pool.stats().waits, 2);
    }

    // Goal: while others wait, a connection over its share (the pool over
    // the owners holding or waiting, at least the floor) is passed by a
    // later one within its share; one that does not fit is never passed.
    #[test]
    fn a_connection_over_its_share_is_passed_while_others_wait() {
        let pool = MemoryPool::new("requests", 100, 10);
        let _hog = pool.try_take(1, 60).expect("alone: the whole pool");
        let mut small = pool.try_take(2, 30).expect("fits");
        let mut greedy = Box::pin(pool.take(1, 15));
        let mut modest = Box::pin(pool.take(3, 5));
        assert!(block_on(poll_once(&mut greedy)).is_none(), "105 > 100");
        assert!(block_on(poll_once(&mut modest)).is_none(), "behind a take that does not fit");
        small.shrink_to(20);
        // Owner 1 fits now (95) but holds 60 of a 33-byte share among
        // owners 1, 2 and 3 while 3 waits: 3 goes first.
        assert!(block_on(poll_once(&mut greedy)).is_none(), "over its share with others waiting");
        let modest = block_on(poll_once(&mut modest)).expect("within its share: passes");
        let greedy = block_on(poll_once(&mut greedy)).expect("alone in line: no share to keep");
        assert_eq!((modest.bytes(), greedy.bytes(), pool.stats().used_bytes), (5, 15, 100));
    }

    // Goal: a dropped wait leaves the line (the next one is served), and a
    // charge past the size makes the pool over until it is given back.
    #[test]
    fn a_dropped_wait_leaves_the_line_and_charges_can_overflow() {
        let pool = MemoryPool::new("responses", 100, 10);
        let held = pool.try_take(1, 100).expect("fits");
        let mut gone = Box::pin(pool.take(2, 10));
        let mut next = Box::pin(pool.take(3, 10));
        assert!(block_on(poll_once(&mut gone)).is_none());
        assert!(block_on(poll_once(&mut next)).is_none());
        drop(gone);
        drop(held);
        assert!(block_on(poll_once(&mut next)).is_some(), "the dropped waiter does not block");
        let charged = pool.charge(4, 150);
        assert!(pool.over());
        let mut below = Box::pin(pool.below_size());
        assert!(block_on(poll_once(&mut below)).is_none());
        drop(charged);
        assert!(block_on(poll_once(&mut below)).is_some());
        assert_eq!(pool.stats().used_bytes, 0);
    }

    // Goal: over its size, only the owners above their share are held
    // back; under it, nobody is.
    #[test]
    fn only_owners_over_their_share_are_held_back() {
        let pool = MemoryPool::new("responses", 100, 10);
        let heavy = pool.charge(1, 90);
        let light = pool.charge(2, 20);
        assert!(pool.over());
        assert!(pool.over_share(1), "90 of a 50-byte share");
        assert!(!pool.over_share(2), "20 of a 50-byte share");
        assert!(!pool.over_share(3), "holds nothing");
        drop(light);
        assert!(!pool.over_share(1), "90 of 100: under the size");
        drop(heavy);
    }

    proptest::proptest! {
        // Goal: whatever the sequence of takes, grows, shrinks and drops
        // across owners, the pool never holds more than its size (without
        // charges), `used` is the sum of the live grants, and everything
        // comes back at the end.
        #[test]
        fn accounting_never_leaks(ops in proptest::collection::vec((0u8..4, 0u64..4, 1usize..60), 1..200)) {
            let pool = MemoryPool::new("requests", 100, 20);
            let mut live: Vec<Grant> = Vec::new();
            for (op, owner, bytes) in ops {
                match op {
                    0 => live.extend(pool.try_take(owner, bytes)),
                    1 => {
                        let at = bytes % live.len().max(1);
                        if let Some(grant) = live.get_mut(at) {
                            grant.try_grow(bytes / 2);
                        }
                    }
                    2 => {
                        let at = bytes % live.len().max(1);
                        if let Some(grant) = live.get_mut(at) {
                            grant.shrink_to(bytes / 3);
                        }
                    }
                    _ => if !live.is_empty() { live.swap_remove(bytes % live.len()); },
                }
                let sum: usize = live.iter().map(Grant::bytes).sum();
                proptest::prop_assert_eq!(pool.stats().used_bytes, sum as u64);
                proptest::prop_assert!(sum <= 100);
            }
            live.clear();
            proptest::prop_assert_eq!(pool.stats().used_bytes, 0);
        }
    }
}
