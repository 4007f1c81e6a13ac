//! The replica core: one Raft group per partition (raft-rs), as pure code
//! the shard drives (`docs/design/replication.md`).
//!
//! - [`view`]: the partition log as raft-rs's synchronous `Storage` sees
//!   it — terms of the whole log, a window of recent entries, read-backs of
//!   older ones for lagging followers.
//! - [`node`]: [`Replica`], each `Ready` turned into a [`Work`] (send,
//!   apply, truncate, append, persist the vote, then the messages that need
//!   the disk), no I/O.
//! - [`membership`]: a group's membership changes ([`MembershipChange`]:
//!   add a learner, promote it, remove a member), one raft-rs simple change
//!   at a time, and the members a restart folds from its committed log.
//! - [`driver`]: [`ReplicaDriver`], a `Replica` performed on its shard —
//!   the partition's journal view as its log, the shard's vote log as its
//!   term and vote, durability before every promise, truncations and
//!   read-backs in a pump the shard spawns.
//! - [`wire`]: the replication frame one shard sends a peer shard, its
//!   messages for every group they share batched, validated once on read.
//! - `sim` (tests only): a deterministic simulation of replica sets over a
//!   lossy, reordering, partitioning network with crashes that lose what
//!   was not synced, and its checker.
//!
//! Between `log` (the journal offers entry indexes, follower appends,
//! truncation and the committed index; the vote store) and `partition`
//! (the queue state that applies committed entries). The peer transport is
//! `net::peer`; binding drivers to a shard's partitions comes next.

pub mod driver;
pub mod entries;
pub mod error;
pub mod limits;
pub mod membership;
pub mod node;
pub mod snapshot;
pub mod view;
pub mod wire;

#[cfg(test)]
mod sim;

pub use driver::{CommitWatch, Committed, DriverError, DriverStats, Proposed, ReplicaDriver};
pub use membership::MembershipChange;
pub use node::{Members, Recovered, Replica, ReplicaError, Timing, Work};
pub use view::{Fetch, KnownTerms, LogView};
