//! A shard's connection counters: accepted, refused over the limit, live,
//! being refused, failed TLS handshakes, connections ended per reason
//! ([`ConnectionEnd::reason`]), and the rejections per reason. The accept
//! loop (`listener.rs`) and the TLS handshake (`tls.rs`) count into them;
//! the shard's report reads them. Counters only: nothing here accepts,
//! refuses or closes a connection.

use std::cell::Cell;
use std::rc::Rc;

use crate::net::connection::ConnectionEnd;
use crate::net::rejections::Rejections;

/// Connection counters of one shard, readable from its executor.
#[derive(Debug, Default)]
pub struct AcceptStats {
    pub accepted: Cell<u64>,
    pub refused_over_limit: Cell<u64>,
    pub active: Cell<usize>,
    /// TLS handshakes that failed or timed out (`net::tls`).
    pub tls_handshake_failures: Cell<u64>,
    /// Refused connections still being told why.
    pub refusing: Cell<usize>,
    /// Served connections that ended, per reason, indexed like
    /// [`ConnectionEnd::REASONS`].
    pub ended: [Cell<u64>; ConnectionEnd::REASONS.len()],
    /// Every rejection of this shard, per reason (shared with its
    /// connections).
    pub rejections: Rc<Rejections>,
}

impl AcceptStats {
    /// Counts one served connection's end under its reason.
    pub fn count_end(&self, end: &ConnectionEnd) {
        let count = &self.ended[end.reason_index()];
        count.set(count.get() + 1);
    }

    /// Connections ended so far per reason, indexed like
    /// [`ConnectionEnd::REASONS`].
    pub fn ended(&self) -> [u64; ConnectionEnd::REASONS.len()] {
        std::array::from_fn(|index| self.ended[index].get())
    }
}
