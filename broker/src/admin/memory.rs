//! The admin port's memory: one byte pool ([`AdminMemory`]) carved off the
//! top of `memory_bytes` before the shards' split
//! (`BrokerConfig::admin_memory_bytes`), shared by every task of the admin
//! thread (`Sync`: a `Mutex` around the line of waiters, atomics for the
//! figures; `docs/design/memory-budget.md`).
//!
//! What draws from it:
//! - Each API request (`/v1/...`, the gateway) **takes** its body's bytes
//!   *before* the body is read: the declared `Content-Length` (0 without a
//!   body), or the API's `BODY_BYTES_MAX` for a chunked one. A take waits in
//!   line — first come, first served, nobody passes the first, so a large
//!   take is never starved by small ones behind it — for at most the API's
//!   `MEMORY_WAIT_TIMEOUT` ([`AdminMemory::take_within`]); then the request
//!   is answered 503 `THROTTLED` with the figures ([`MemoryRefused`]) and
//!   counted as a refusal. The grant is held until the request's answer is
//!   built.
//! - Every answer of the port (API answers and refusals, `/metrics`,
//!   `/health/*`) is **charged** once built ([`AdminMemory::answer`]): it
//!   exists already, so it is never refused, and the pool may go over its
//!   size by the answers being written; takes wait while it is over. The
//!   grant rides inside the answer's bytes (`Bytes::from_owner`), so it
//!   returns when the last copy of them is released: when hyper has
//!   written them, or when the connection ends. (hyper drops a response
//!   body as soon as its last chunk is queued, before the socket has taken
//!   it: a grant owned by the body alone would return while the answer is
//!   still held.)
//!
//! A take larger than the pool is served once the pool is empty (none is:
//! the pool's floor holds two largest bodies with their answers). Every
//! grant returns its bytes when dropped, whichever path drops it (answered,
//! refused, peer gone, timed out); a take dropped while it waits leaves the
//! line and wakes the next.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Response;
use thiserror::Error;

use crate::net::memory::PoolStats;

/// The name the admin pool is reported under (`/health/ready`).
pub const ADMIN_POOL: &str = "admin";

/// A take that found no room within its wait: the pool's figures then.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error(
    "no admin memory for this request within {waited_ms} ms: the admin port's pool of \
     {size_bytes} bytes has {used_bytes} in use and its line is ahead; the request's body asks \
     {asked_bytes} (memory_bytes sets the pool)"
)]
pub struct MemoryRefused {
    /// The pool's size.
    pub size_bytes: u64,
    /// Bytes held from it when the wait ended.
    pub used_bytes: u64,
    /// What the request asked for.
    pub asked_bytes: u64,
    /// How long it waited.
    pub waited_ms: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    bytes: u64,
    waker: Waker,
}

#[derive(Debug, Default)]
struct Line {
    used: u64,
    waiters: VecDeque<Waiter>,
    next_ticket: u64,
}

/// The admin thread's byte pool. See the module doc.
#[derive(Debug)]
pub struct AdminMemory {
    size: u64,
    line: Mutex<Line>,
    /// Mirrors of the line's figures, read without the lock.
    used: AtomicU64,
    peak: AtomicU64,
    waits: AtomicU64,
    refusals: AtomicU64,
}

impl AdminMemory {
    /// A pool of `size_bytes`.
    pub fn new(size_bytes: u64) -> Arc<AdminMemory> {
        Arc::new(AdminMemory {
            size: size_bytes,
            line: Mutex::new(Line::default()),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        })
    }

    /// The pool's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The line; a panic elsewhere while it was held leaves it consistent
    /// (every change is one step), so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fits(&self, line: &Line, bytes: u64) -> bool {
        line.used == 0 || line.used.saturating_add(bytes) <= self.size
    }

    fn add(&self, line: &mut Line, bytes: u64) {
        line.used += bytes;
        self.used.store(line.used, Ordering::Relaxed);
        self.peak.fetch_max(line.used, Ordering::Relaxed);
    }

    /// Wakes the first in line if it fits now (memory returned, or the one
    /// ahead of it was served or left).
    fn wake_first(&self, line: &Line) {
        if let Some(first) = line.waiters.front() {
            if self.fits(line, first.bytes) {
                first.waker.wake_by_ref();
            }
        }
    }

    /// Takes `bytes`, waiting in line while they do not fit (or others
    /// wait ahead). Dropping the future before it is ready leaves the line.
    pub fn take(self: &Arc<Self>, bytes: u64) -> Take {
        Take { pool: Arc::clone(self), bytes, ticket: None }
    }

    /// [`Self::take`] for at most `timeout`.
    ///
    /// # Errors
    /// [`MemoryRefused`] (counted as a refusal) when the wait ran out.
    pub async fn take_within(
        self: &Arc<Self>,
        bytes: u64,
        timeout: Duration,
    ) -> Result<Grant, MemoryRefused> {
        match tokio::time::timeout(timeout, self.take(bytes)).await {
            Ok(grant) => Ok(grant),
            Err(_) => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                Err(MemoryRefused {
                    size_bytes: self.size,
                    used_bytes: self.used.load(Ordering::Relaxed),
                    asked_bytes: bytes,
                    waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                })
            }
        }
    }

    /// Charges `bytes` that exist already: never refused, even over the
    /// pool's size (takes then wait until it is back under).
    pub fn charge(self: &Arc<Self>, bytes: u64) -> Grant {
        let mut line = self.lock();
        self.add(&mut line, bytes);
        Grant { pool: Arc::clone(self), bytes }
    }

    /// `body` charged to the pool until its last copy is released.
    pub fn charged(self: &Arc<Self>, body: Bytes) -> Bytes {
        let grant = self.charge(body.len() as u64);
        Bytes::from_owner(Charged { body, _grant: grant })
    }

    /// `response` with its body charged to the pool until hyper has
    /// written it (or dropped it with the connection).
    pub async fn answer(
        self: &Arc<Self>,
        response: Response<Full<Bytes>>,
    ) -> Response<Full<Bytes>> {
        let (parts, body) = response.into_parts();
        // A `Full` body is one chunk, ready at once.
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        Response::from_parts(parts, Full::new(self.charged(bytes)))
    }

    /// The pool's figures.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            size_bytes: self.size,
            used_bytes: self.used.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
        }
    }
}

/// The owner of a charged answer's bytes: the grant returns with them.
struct Charged {
    body: Bytes,
    _grant: Grant,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

/// Bytes held from the pool; given back when dropped.
#[derive(Debug)]
pub struct Grant {
    pool: Arc<AdminMemory>,
    bytes: u64,
}

impl Grant {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let mut line = self.pool.lock();
        line.used -= self.bytes;
        self.pool.used.store(line.used, Ordering::Relaxed);
        self.pool.wake_first(&line);
    }
}

/// A take waiting its turn ([`AdminMemory::take`]).
#[derive(Debug)]
pub struct Take {
    pool: Arc<AdminMemory>,
    bytes: u64,
    /// Its place in line, once it had to wait.
    ticket: Option<u64>,
}

impl Future for Take {
    type Output = Grant;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Grant> {
        let this = self.get_mut();
        let pool = Arc::clone(&this.pool);
        let mut line = pool.lock();
        let Some(ticket) = this.ticket else {
            if line.waiters.is_empty() && pool.fits(&line, this.bytes) {
                pool.add(&mut line, this.bytes);
                return Poll::Ready(Grant { pool: Arc::clone(&pool), bytes: this.bytes });
            }
            let ticket = line.next_ticket;
            line.next_ticket += 1;
            line.waiters.push_back(Waiter {
                ticket,
                bytes: this.bytes,
                waker: context.waker().clone(),
            });
            this.ticket = Some(ticket);
            pool.waits.fetch_add(1, Ordering::Relaxed);
            return Poll::Pending;
        };
        let first = line.waiters.front().is_some_and(|waiter| waiter.ticket == ticket);
        if first && pool.fits(&line, this.bytes) {
            line.waiters.pop_front();
            this.ticket = None;
            pool.add(&mut line, this.bytes);
            pool.wake_first(&line);
            return Poll::Ready(Grant { pool: Arc::clone(&pool), bytes: this.bytes });
        }
        if let Some(waiter) = line.waiters.iter_mut().find(|waiter| waiter.ticket == ticket) {
            waiter.waker.clone_from(context.waker());
        }
        Poll::Pending
    }
}

impl Drop for Take {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else { return };
        let mut line = self.pool.lock();
        let was_first = line.waiters.front().is_some_and(|waiter| waiter.ticket == ticket);
        line.waiters.retain(|waiter| waiter.ticket != ticket);
        if was_first {
            self.pool.wake_first(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    use super::*;

    /// A waker that records it was woken.
    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A take polled by hand, with its own waker.
    struct Pending {
        id: usize,
        take: Take,
        flag: Arc<Flag>,
    }

    impl Pending {
        fn new(id: usize, take: Take) -> Self {
            Self { id, take, flag: Arc::new(Flag::default()) }
        }

        fn poll(&mut self) -> Option<Grant> {
            self.flag.0.store(false, Ordering::SeqCst);
            let waker = Waker::from(Arc::clone(&self.flag));
            match Pin::new(&mut self.take).poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(grant) => Some(grant),
                Poll::Pending => None,
            }
        }

        fn woken(&self) -> bool {
            self.flag.0.load(Ordering::SeqCst)
        }
    }

    // Goal: takes are served in arrival order — a small take that would
    // fit waits behind a large one ahead of it — and each is woken when it
    // can go. Method: a 10-byte pool, hand-polled takes.
    #[test]
    fn takes_are_served_first_come_first_served() {
        let pool = AdminMemory::new(10);
        let held = Pending::new(0, pool.take(6)).poll().expect("room");
        let mut large = Pending::new(1, pool.take(6));
        let mut small = Pending::new(2, pool.take(1));
        assert!(large.poll().is_none(), "6 + 6 > 10");
        assert!(small.poll().is_none(), "fits, but waits behind the large one");
        assert_eq!(pool.stats().waits, 2);
        drop(held);
        assert!(large.woken() && !small.woken(), "the first in line is woken");
        let large_grant = large.poll().expect("the first in line goes");
        assert!(small.woken(), "serving the first wakes the next that fits");
        let small_grant = small.poll().expect("6 + 1 fits");
        assert_eq!(pool.stats().used_bytes, 7);
        drop((large_grant, small_grant));
        let stats = pool.stats();
        assert_eq!((stats.used_bytes, stats.peak_bytes, stats.refusals), (0, 7, 0));
    }

    // Goal: a take dropped while it waits (its request timed out, its peer
    // went away) leaves the line, holds nothing, and lets the one behind
    // it go.
    #[test]
    fn a_dropped_waiting_take_leaves_the_line() {
        let pool = AdminMemory::new(10);
        let held = pool.charge(8);
        let mut first = Pending::new(0, pool.take(5));
        let mut second = Pending::new(1, pool.take(2));
        assert!(first.poll().is_none() && second.poll().is_none());
        drop(first);
        assert!(second.woken(), "the new first fits: woken");
        let grant = second.poll().expect("8 + 2 fits");
        assert!(pool.lock().waiters.is_empty());
        drop((held, grant));
        assert_eq!(pool.stats().used_bytes, 0);
    }

    // Goal: an answer that exists is charged even over the size, and takes
    // (an empty body's too) wait until the pool is back under it; a take
    // larger than the pool goes once it is empty.
    #[test]
    fn charges_go_over_the_size_and_takes_wait_for_it() {
        let pool = AdminMemory::new(10);
        let answer = pool.charge(15);
        assert_eq!(pool.stats().used_bytes, 15);
        let mut empty = Pending::new(0, pool.take(0));
        assert!(empty.poll().is_none(), "over the size: even an empty take waits");
        drop(answer);
        let nothing = empty.poll().expect("back under");
        let mut huge = Pending::new(1, pool.take(25));
        let huge_grant = huge.poll().expect("larger than the pool, but the pool is empty");
        assert_eq!(pool.stats().peak_bytes, 25);
        drop((nothing, huge_grant));
        assert_eq!(pool.stats().used_bytes, 0);
    }

    // Goal: an answer's bytes hold their charge while any copy of them
    // lives (hyper's write queue keeps one after the body is dropped).
    #[test]
    fn a_charged_answer_returns_with_its_last_copy() {
        let pool = AdminMemory::new(100);
        let body = pool.charged(Bytes::from_static(b"{\"queues\": []}"));
        let queued = body.slice(2..);
        drop(body);
        assert_eq!(pool.stats().used_bytes, 14, "a slice still holds the answer");
        drop(queued);
        assert_eq!(pool.stats().used_bytes, 0);
    }

    // Goal: a wait that runs out is refused with the figures and counted,
    // and leaves nothing behind. Time itself is under test: a real 20 ms
    // wait.
    #[test]
    fn a_wait_that_runs_out_is_refused_with_the_figures() {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let pool = AdminMemory::new(10);
        let held = pool.charge(9);
        let refused = runtime
            .block_on(pool.take_within(4, Duration::from_millis(20)))
            .expect_err("9 + 4 > 10 for the whole wait");
        assert_eq!(
            refused,
            MemoryRefused { size_bytes: 10, used_bytes: 9, asked_bytes: 4, waited_ms: 20 }
        );
        assert!(refused.to_string().contains("memory_bytes"), "{refused}");
        assert!(pool.lock().waiters.is_empty(), "the timed-out take left the line");
        let stats = pool.stats();
        assert_eq!((stats.waits, stats.refusals), (1, 1));
        drop(held);
        let grant = runtime.block_on(pool.take_within(4, Duration::from_millis(20)));
        assert_eq!(grant.map(|grant| grant.bytes()), Ok(4));
        assert_eq!(pool.stats().used_bytes, 0);
    }

    proptest::proptest! {
        // Goal: whatever the sequence of takes, charges, drops of grants
        // and of waiting takes, `used` is the sum of the live grants;
        // takes are granted only in arrival order and only when they fit
        // (or the pool is empty); the first in line is never left waiting
        // unwoken while it fits; and everything comes back at the end.
        // Method: hand-polled takes, polled only when their waker fired.
        #[test]
        fn every_grant_returns_in_order(ops in proptest::collection::vec((0u8..5, 0u64..12), 1..200)) {
            let pool = AdminMemory::new(16);
            let mut grants: Vec<Grant> = Vec::new();
            let mut waiting: Vec<Pending> = Vec::new();
            let mut served: Vec<usize> = Vec::new();
            for (id, (op, bytes)) in ops.into_iter().enumerate() {
                let before = pool.stats().used_bytes;
                match op {
                    0 | 1 => {
                        let mut take = Pending::new(id, pool.take(bytes));
                        match take.poll() {
                            Some(grant) => {
                                proptest::prop_assert!(before == 0 || before + bytes <= 16);
                                served.push(id);
                                grants.push(grant);
                            }
                            None => waiting.push(take),
                        }
                    }
                    2 => grants.push(pool.charge(bytes)),
                    3 => if !grants.is_empty() {
                        grants.swap_remove(bytes as usize % grants.len());
                    },
                    _ => if !waiting.is_empty() {
                        waiting.remove(bytes as usize % waiting.len());
                    },
                }
                // Serve every take whose waker fired, as a runtime would.
                while let Some(at) = waiting.iter().position(Pending::woken) {
                    let before = pool.stats().used_bytes;
                    let asked = waiting[at].take.bytes;
                    if let Some(grant) = waiting[at].poll() {
                        proptest::prop_assert!(before == 0 || before + asked <= 16);
                        served.push(waiting.remove(at).id);
                        grants.push(grant);
                    }
                }
                let sum: u64 = grants.iter().map(Grant::bytes).sum();
                proptest::prop_assert_eq!(pool.stats().used_bytes, sum);
                let line = pool.lock();
                proptest::prop_assert_eq!(line.waiters.len(), waiting.len());
                if let Some(first) = line.waiters.front() {
                    proptest::prop_assert!(!pool.fits(&line, first.bytes), "first fits, unwoken");
                }
            }
            let mut waited: Vec<usize> = served.clone();
            waited.sort_unstable();
            proptest::prop_assert_eq!(&served, &waited, "served out of arrival order");
            waiting.clear();
            grants.clear();
            proptest::prop_assert_eq!(pool.stats().used_bytes, 0);
            proptest::prop_assert!(pool.lock().waiters.is_empty());
        }
    }
}
