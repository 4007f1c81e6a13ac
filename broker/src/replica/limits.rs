//! Named bounds of the replica core (`docs/design/replication.md`).

/// Ticks without a leader's message after which a follower campaigns
/// (raft-rs randomizes the timeout in `[this, 2 × this)`).
pub const REPLICA_ELECTION_TICKS: usize = 10;

/// Ticks between a leader's heartbeats.
pub const REPLICA_HEARTBEAT_TICKS: usize = 2;

/// Most entry bytes one append message carries (raft-rs may pass it by one
/// entry: an entry is never split).
pub const REPLICA_APPEND_BYTES_MAX: u64 = 1 << 20;

/// Most append messages in flight to one follower before the leader waits
/// for its answers (pipelining depth).
pub const REPLICA_INFLIGHT_APPENDS_MAX: usize = 256;

/// Entry bytes a replica keeps in memory below its applied index, to serve
/// lagging followers without reading its log; older entries are read back
/// (asynchronously) when a follower needs them. Everything above the
/// applied index is always held.
pub const REPLICA_ENTRY_CACHE_BYTES_MAX: usize = 4 << 20;

/// Entries one read-back of older entries returns at most.
pub const REPLICA_FETCH_ENTRIES_MAX: usize = 4096;

const _: () = assert!(REPLICA_HEARTBEAT_TICKS >= 1);
const _: () = assert!(REPLICA_ELECTION_TICKS > 2 * REPLICA_HEARTBEAT_TICKS);
const _: () = assert!(REPLICA_INFLIGHT_APPENDS_MAX >= 1);
