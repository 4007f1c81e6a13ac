//! What the requests of one connection share ([`Connection`]: its id, the
//! signal that trips when it ends, its waiting requests and their bound,
//! its long-poll claims' cancel handles, the shard's admission gate, pace
//! and rejection counters, the bytes of responses not yet written) and the
//! bounds of a connection ([`ConnectionLimits`]). The loop that reads and
//! writes is `connection.rs`/`writer.rs`; this file does no I/O.

use std::rc::Rc;
use std::time::Duration;

use crate::net::admission::Admission;
use crate::net::memory::{Grant, ShardMemory};
use crate::net::pace::Pace;
use crate::net::rejections::Rejections;
use crate::net::stop::StopSignal;
use crate::partition::signal::ClaimCancel;

thread_local! {
    static NEXT_CONNECTION_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What the requests of one connection share: an id distinct on this
/// executor, a signal that trips when the connection's read side ends (the
/// peer closed or reset it, a fault closes it, or the shard stops), the
/// connection's count of waiting requests against its own bound, the
/// cancel handles of its long-poll claims (by correlation id, so a
/// CancelClaim on this connection, and only on this one, can reach them),
/// and the shard's rejection counters.
#[derive(Debug)]
pub struct Connection {
    pub(super) id: u64,
    pub(super) ended: StopSignal,
    /// Requests of this connection waiting now (claim long-polls).
    pub waiting: std::cell::Cell<usize>,
    /// Most requests of this connection that may wait at once; also the
    /// most long-poll claims it may have in flight (cancellable) at once.
    pub waiting_max: usize,
    /// Long-poll claims in flight, by correlation id; at most `waiting_max`.
    pub(super) claims: std::cell::RefCell<std::collections::HashMap<u64, Rc<ClaimCancel>>>,
    pub(super) rejections: Rc<Rejections>,
    /// The shard's admission gate: the turns this connection takes with the
    /// others before it hands a frame over.
    pub(super) admission: Rc<Admission>,
    /// The shard's consumer pace: holds this connection's enqueues while
    /// the shard's consumers are behind.
    pub(super) pace: Rc<Pace>,
    /// This connection has claimed: it carries a consumer, and the pace
    /// never holds its frames (a held enqueue at the front of its buffer
    /// would hold its claims and acks behind it, slowing the very consumer
    /// the pace waits for).
    pub(super) claims_seen: std::cell::Cell<bool>,
    /// Bytes of responses produced and not yet written to the socket.
    pub(super) response_bytes: std::cell::Cell<usize>,
    /// Most `response_bytes` ever held.
    pub(super) response_bytes_peak: std::cell::Cell<usize>,
    /// The reading loop, waiting for `response_bytes` to drop.
    pub(super) response_drained: std::cell::RefCell<Option<std::task::Waker>>,
    /// The shard's memory pools (`memory.rs`): this connection's requests
    /// and responses draw from them.
    pub(super) memory: Rc<ShardMemory>,
    /// What this connection's queued responses are charged to the shard's
    /// responses pool.
    pub(super) response_grant: std::cell::RefCell<Option<Grant>>,
    /// What the handler keeps about this connection (the broker's
    /// authentication session); the connection loop never looks at it.
    pub session: std::cell::RefCell<Option<Rc<dyn std::any::Any>>>,
    /// Trips when the handler asks for the connection to close (a refused
    /// handshake): reading stops, the answers in flight are still written.
    pub(super) closing: StopSignal,
    /// The peer's address, when the accept loop knows it (the failed-login
    /// limiter counts by it).
    pub(super) peer_ip: std::cell::Cell<Option<std::net::IpAddr>>,
    /// The connection's socket, when the accept loop knows it: asked
    /// whether the peer is gone while the connection reads nothing.
    pub(super) peer_watch: std::cell::Cell<Option<super::peer_watch::PeerWatch>>,
}

/// A long-poll claim's entry in its connection's cancel map; removed when
/// the claim answers (dropped).
#[derive(Debug)]
pub struct ClaimRegistration<'c> {
    connection: &'c Connection,
    id: u64,
    cancel: Rc<ClaimCancel>,
}

impl ClaimRegistration<'_> {
    /// The claim's cancel handle, for `Partition::claim_as`.
    pub fn cancel(&self) -> &ClaimCancel {
        &self.cancel
    }
}

impl Drop for ClaimRegistration<'_> {
    fn drop(&mut self) {
        let mut claims = self.connection.claims.borrow_mut();
        // A later claim that reused the id (a client bug) owns the entry now.
        if claims.get(&self.id).is_some_and(|entry| Rc::ptr_eq(entry, &self.cancel)) {
            claims.remove(&self.id);
        }
    }
}

impl Connection {
    /// A connection scope with a fresh id.
    pub fn new(waiting_max: usize, rejections: Rc<Rejections>) -> Connection {
        let id = NEXT_CONNECTION_ID.with(|next| next.replace(next.get() + 1));
        Connection {
            id,
            ended: StopSignal::new(),
            waiting: std::cell::Cell::new(0),
            waiting_max,
            claims: std::cell::RefCell::default(),
            rejections,
            admission: Admission::of_this_shard(),
            pace: Pace::of_this_shard(),
            memory: ShardMemory::of_this_shard(),
            response_grant: std::cell::RefCell::new(None),
            claims_seen: std::cell::Cell::new(false),
            response_bytes: std::cell::Cell::new(0),
            response_bytes_peak: std::cell::Cell::new(0),
            response_drained: std::cell::RefCell::new(None),
            session: std::cell::RefCell::new(None),
            closing: StopSignal::new(),
            peer_ip: std::cell::Cell::new(None),
            peer_watch: std::cell::Cell::new(None),
        }
    }

    /// Records the peer's address (the accept loop, once).
    pub fn set_peer_ip(&self, ip: Option<std::net::IpAddr>) {
        self.peer_ip.set(ip);
    }

    /// The peer's address, if known.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.peer_ip.get()
    }

    /// Lets the connection loop ask the socket whether the peer is gone
    /// while it waits for memory ([`super::peer_watch`]).
    pub fn set_peer_watch(&self, watch: super::peer_watch::PeerWatch) {
        self.peer_watch.set(Some(watch));
    }

    /// Bytes of this connection's responses produced and not yet written.
    pub fn responses_queued_bytes(&self) -> usize {
        self.response_bytes.get()
    }

    /// The most response bytes this connection has held queued at once.
    pub fn responses_queued_bytes_peak(&self) -> usize {
        self.response_bytes_peak.get()
    }

    pub(super) fn responses_queued(&self, bytes: usize) {
        let now = self.response_bytes.get() + bytes;
        self.response_bytes.set(now);
        self.response_bytes_peak.set(self.response_bytes_peak.get().max(now));
        let charge = self.memory.responses.charge(self.id, bytes);
        let mut grant = self.response_grant.borrow_mut();
        match grant.as_mut() {
            Some(held) => held.absorb(charge),
            None => *grant = Some(charge),
        }
    }

    pub(super) fn responses_written(&self, bytes: usize) {
        self.response_bytes.set(self.response_bytes.get().saturating_sub(bytes));
        if let Some(held) = self.response_grant.borrow_mut().as_mut() {
            held.shrink_to(held.bytes().saturating_sub(bytes));
        }
        if let Some(waker) = self.response_drained.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Resolves once fewer than `bound` response bytes are queued.
    pub(super) async fn responses_below(&self, bound: usize) {
        std::future::poll_fn(|cx| {
            if self.response_bytes.get() < bound {
                return std::task::Poll::Ready(());
            }
            *self.response_drained.borrow_mut() = Some(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await;
    }

    /// Makes the long-poll claim with correlation id `id` cancellable by a
    /// CancelClaim on this connection until the registration is dropped.
    /// Call it before the claim's first await, so a cancel sent after the
    /// claim always finds it.
    ///
    /// # Errors
    /// The connection already has `waiting_max` long-poll claims in flight
    /// (returns that bound).
    pub fn register_claim(&self, id: u64) -> Result<ClaimRegistration<'_>, usize> {
        let cancel = Rc::new(ClaimCancel::default());
        {
            let mut claims = self.claims.borrow_mut();
            if claims.len() >= self.waiting_max && !claims.contains_key(&id) {
                return Err(self.waiting_max);
            }
            claims.insert(id, cancel.clone());
        }
        Ok(ClaimRegistration { connection: self, id, cancel })
    }

    /// Withdraws this connection's long-poll claim `id` if it has decided
    /// nothing yet; false when there is no such claim or it already decided.
    pub fn cancel_claim(&self, id: u64) -> bool {
        let cancel = self.claims.borrow().get(&id).cloned();
        cancel.is_some_and(|cancel| cancel.cancel())
    }

    /// Long-poll claims of this connection in flight (cancellable) now.
    pub fn claims_in_flight(&self) -> usize {
        self.claims.borrow().len()
    }

    /// Distinct among the connections of this executor.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Resolves once the connection will read no more requests: its waiting
    /// requests should answer now.
    pub fn ended(&self) -> crate::net::stop::StopWait {
        self.ended.wait()
    }

    pub fn has_ended(&self) -> bool {
        self.ended.is_stopped()
    }

    /// Asks the loop to close the connection: no more requests are read;
    /// the answers of requests already handed over are still written.
    pub fn close(&self) {
        self.closing.stop();
    }

    /// The shard's rejection counters (count and log a refused request).
    pub fn rejections(&self) -> &Rejections {
        &self.rejections
    }

    /// The shard's admission gate (shared by its connections).
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The shard's consumer pace (shared by its connections).
    pub fn pace(&self) -> &Rc<Pace> {
        &self.pace
    }

    /// Records that this connection claimed: from now on it carries a
    /// consumer and the pace lets its enqueues go unheld.
    pub fn note_claim(&self) {
        self.claims_seen.set(true);
    }

    /// Whether this connection ever claimed ([`Self::note_claim`]).
    pub fn carries_consumer(&self) -> bool {
        self.claims_seen.get()
    }
}

/// Bounds of one connection, from the broker config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub frame_bytes_max: usize,
    pub in_flight_max: usize,
    /// Requests that may wait (claim long-polls) at once.
    pub waiting_max: usize,
    pub idle_timeout: Duration,
    pub frame_timeout: Duration,
    pub write_timeout: Duration,
    /// Response bytes produced and not yet written at which reading pauses
    /// ([`crate::limits::RESPONSE_QUEUE_BYTES_MAX`] in the broker).
    pub response_bytes_max: usize,
    /// Longest a connection loop runs before it lets the executor poll for
    /// completed I/O when busy ([`crate::net::poll_gate`]).
    pub io_poll_interval: Duration,
    /// Enqueued messages at most this % of delivered ones while the shard
    /// is paced; 0: never paced ([`crate::net::pace`]).
    pub pace_percent: u32,
}
