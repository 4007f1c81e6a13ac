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

/// One logical clock tick of every replica on a shard: elections time out
/// after `REPLICA_ELECTION_TICKS` to twice that (1–2 s), a leader sends
/// heartbeats every `REPLICA_HEARTBEAT_TICKS` (200 ms).
pub const REPLICA_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// Batch bytes one read of a partition's entries by index takes at most
/// (a read-back for a lagging follower, the log read at open); within the
/// journal's `READ_BYTES_MAX`.
pub const REPLICA_FETCH_BYTES_MAX: u64 = 1 << 20;

/// Bytes a term start's stored batch takes at most (batch header,
/// position table, one `TermStarted` record): the room its append waits
/// for (`driver.rs` checks the batch it builds against it).
pub const REPLICA_TERM_START_BYTES_MAX: usize = 256;

/// Entries one read-back of older entries returns at most.
pub const REPLICA_FETCH_ENTRIES_MAX: usize = 4096;

/// Batch bytes one read-back for a lagging follower takes (in reads of
/// [`REPLICA_FETCH_BYTES_MAX`]): several append messages' worth, so a
/// follower far behind is sent that many messages per read instead of
/// one (its catch-up is not one message per pump step).
pub const REPLICA_FETCH_AHEAD_BYTES: u64 = 4 << 20;

/// Runs of read-back entries a partition's leader holds at once (one per
/// lagging follower; the least recently asked goes first).
pub const REPLICA_FETCH_RUNS_MAX: usize = 4;

/// Bytes of read-back entries a partition's leader holds at most, over
/// all its runs.
pub const REPLICA_FETCH_HELD_BYTES_MAX: usize = 8 << 20;

/// Ticks a run of read-back entries is kept without an ask served from it.
pub const REPLICA_FETCH_IDLE_TICKS: u32 = 20;

/// raft-rs contexts kept per pending read-back (asks for the same entries
/// join one read; one answered ask sends as much as raft-rs may).
pub const REPLICA_FETCH_CONTEXTS_MAX: usize = 8;

/// Largest replication frame one shard sends a peer shard (its messages
/// for every group they share, batched per turn). A frame declaring more is
/// refused before it is read.
pub const REPLICA_FRAME_BYTES_MAX: usize = 8 << 20;

/// Most messages in one replication frame.
pub const REPLICA_FRAME_MESSAGES_MAX: usize = 16_384;

/// Largest encoded raft message: an append at its bound, which raft-rs
/// passes by at most one entry (an entry is never split: up to a largest
/// batch), with room for its entries' fields and the message's own.
pub const REPLICA_MESSAGE_BYTES_MAX: usize = REPLICA_APPEND_BYTES_MAX as usize
    + spool_wire::limits::BATCH_BYTES_MAX
    + REPLICA_MESSAGE_OVERHEAD_BYTES;

/// Room for a message's own fields and its entries' (index, term, type)
/// beyond their data: 64 KiB covers 4,096 entries at 16 bytes each.
pub const REPLICA_MESSAGE_OVERHEAD_BYTES: usize = 64 << 10;

/// Bytes of a replication frame's header (`wire.rs`).
pub const FRAME_HEADER_BYTES: usize = 32;
/// Bytes before each message of a frame: its group and length.
pub const MESSAGE_HEADER_BYTES: usize = 12;

const _: () = assert!(
    REPLICA_MESSAGE_BYTES_MAX + FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES
        <= REPLICA_FRAME_BYTES_MAX
);
const _: () = assert!(REPLICA_HEARTBEAT_TICKS >= 1);
const _: () = assert!(REPLICA_ELECTION_TICKS > 2 * REPLICA_HEARTBEAT_TICKS);
const _: () = assert!(REPLICA_INFLIGHT_APPENDS_MAX >= 1);
const _: () = assert!(REPLICA_FETCH_AHEAD_BYTES as usize <= REPLICA_FETCH_HELD_BYTES_MAX);
const _: () = assert!(REPLICA_FETCH_AHEAD_BYTES >= REPLICA_FETCH_BYTES_MAX);

/// Ticks a member whose vote store held no vote at its start (it never
/// voted, or lost its data directory and with it the votes it made)
/// abstains from elections: it neither votes nor campaigns. Longer than
/// twice the longest election timeout (randomized up to twice
/// [`REPLICA_ELECTION_TICKS`]), so every election it may have voted in
/// before is over, won or moved to a later term, when it votes again:
/// it never votes twice in one term. A cluster's first start elects that
/// much later.
pub const REPLICA_VOTE_QUARANTINE_TICKS: u64 = 5 * REPLICA_ELECTION_TICKS as u64;

/// How long a replicated partition's checkpoint waits, once written, for
/// the entries it covers to commit before it is put in place: a leader's
/// state holds entries applied when appended, and a checkpoint of entries
/// a next leader may cancel must never be read back. Past it (a leader cut
/// off), the checkpoint is dropped and a later one is taken.
pub const REPLICA_CHECKPOINT_COMMIT_WAIT_MS: u64 = 10_000;

/// Most bytes of side files (the checkpoint's state and the dedupe
/// generation files it refers to) one snapshot transfer holds in memory,
/// on the leader that serves it and on the member that installs it. A
/// partition whose checkpoint is larger is not offered (the member waits,
/// and is told why in the log).
pub const SNAPSHOT_FILES_BYTES_MAX: usize = 512 << 20;

/// Bytes of a side file one snapshot piece carries.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// Pieces a member pulls ahead of the one it installs (each a side-file
/// chunk or one record batch, at most a largest batch): what keeps a
/// transfer from waiting a round trip and a read per piece.
pub const SNAPSHOT_PULL_WINDOW: usize = 8;

/// How long a member waits for a piece it pulled before it gives the
/// install up (the leader offers the snapshot again later).
pub const SNAPSHOT_PIECE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a leader keeps a transfer no member pulled from before it
/// drops it and tells raft-rs the snapshot failed (raft-rs then probes the
/// member and offers a snapshot again): a member pulls its next piece as
/// soon as one arrives, so silence this long means it died or restarted
/// mid-transfer (what a restarted member waits before it is offered again).
pub const SNAPSHOT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a shard looks for snapshot offers raft-rs waits on, and for
/// transfers idle past [`SNAPSHOT_IDLE_TIMEOUT`].
pub const SNAPSHOT_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Snapshot transfers one shard serves at once, and installs it runs at
/// once: more wait for a later offer.
pub const SNAPSHOT_TRANSFERS_MAX: usize = 2;

const _: () =
    assert!(SNAPSHOT_CHUNK_BYTES + REPLICA_MESSAGE_OVERHEAD_BYTES <= REPLICA_MESSAGE_BYTES_MAX);
