//! A member's snapshots (`docs/design/replication.md` §6): the checkpoint
//! it offers raft-rs, the offers raft-rs waits on as leader, how a
//! transfer ended, and whether an offer would replace its log.

use super::ReplicaDriver;
use crate::io::Storage;

impl<S: Storage> ReplicaDriver<S> {
    /// Tells, once per member, of one raft-rs wanted a snapshot for: it
    /// lacks entries this log let go of (every member held them then, so
    /// it lost its log, or it is new). It is offered the checkpoint when
    /// there is one; until then every member's journal keeps what it
    /// lacks.
    pub(super) fn report_snapshot_asks(&self) {
        let (asks, floor, offered) = {
            let mut inner = self.inner.borrow_mut();
            let asks = inner.replica.take_snapshot_asks();
            (asks, inner.replica.log_floor(), inner.replica.snapshot_at())
        };
        for member in asks {
            if self.snapshot_warned.borrow_mut().insert(member) {
                match offered {
                    Some((index, term)) => tracing::info!(
                        handle = self.part.handle().0,
                        member,
                        first_index = floor + 1,
                        index,
                        term,
                        "a member lacks entries this log let go of (lost its data directory, \
                         or new): it is offered the checkpoint as a snapshot"
                    ),
                    None => tracing::warn!(
                        handle = self.part.handle().0,
                        member,
                        first_index = floor + 1,
                        "a member lacks entries this log let go of (lost its data directory, \
                         or new) and no checkpoint can be offered yet: it waits for one"
                    ),
                }
            }
        }
    }

    /// This member's durable checkpoint at (`index`, `term`) can be
    /// shipped as a snapshot from now on.
    pub fn set_snapshot_at(&self, index: u64, term: u64) {
        self.inner.borrow_mut().replica.set_snapshot_at(index, term);
    }

    /// The members this leader sent a snapshot and waits on, with the
    /// snapshot's index ([`Replica::snapshots_pending`]).
    pub fn snapshots_pending(&self) -> Vec<(u64, u64)> {
        self.inner.borrow().replica.snapshots_pending()
    }

    /// The snapshot this member offers, if any.
    pub fn snapshot_at(&self) -> Option<(u64, u64)> {
        self.inner.borrow().replica.snapshot_at()
    }

    /// Member `to` installed the snapshot it was offered (`finished`), or
    /// its transfer failed (raft-rs offers it again later).
    pub fn report_snapshot(&self, to: u64, finished: bool) {
        if self.stopped() {
            return;
        }
        self.snapshot_warned.borrow_mut().remove(&to);
        self.inner.borrow_mut().replica.report_snapshot(to, finished);
        self.drain();
    }

    /// Whether a snapshot at (`index`, `term`) would replace this member's
    /// log: it is past what the log has committed and the log does not
    /// hold that entry (raft-rs's own test before it restores one; when it
    /// fails, raft-rs answers the offer from the log it has).
    pub fn needs_install(&self, index: u64, term: u64) -> bool {
        index > self.part.committed_index() && self.part.term_at(index) != Some(term)
    }
}
