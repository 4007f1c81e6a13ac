//! Named bounds of the replication peer transport (`docs/design/replication.md`
//! §5): the sender's outbox and its timeouts, the receiver's connections and
//! timeouts. The frame's own bounds (`REPLICA_FRAME_BYTES_MAX`,
//! `FRAME_HEADER_BYTES`) are the replica core's, in `replica/limits.rs`.

use std::time::Duration;

/// Bytes of raft messages (encoded size plus their frame header) one sender
/// holds for its peer shard before it drops new ones. Two full frames
/// (2 × 8 MiB): enough to keep a link busy across a reconnect or a slow
/// write, while a peer that is down costs each of its senders at most this
/// much memory. A dropped message is counted; raft-rs resends what a
/// follower did not acknowledge.
pub const PEER_OUTBOX_BYTES_MAX: usize = 16 << 20;

/// Raft messages one sender holds before it drops new ones, whatever their
/// size: heartbeats and votes are a few dozen bytes, and 65,536 of them
/// still bound the outbox's bookkeeping (≈ 1 KiB of `Message` struct
/// each at most) when the byte bound is far away.
pub const PEER_OUTBOX_MESSAGES_MAX: usize = 65_536;

/// How long a sender waits for a TCP connect to its peer shard. Peers are on
/// the cluster's network (sub-millisecond round trips): a second is a
/// connect that will not happen, and the backoff takes over.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one frame's write may take. A full frame (8 MiB) at 1 Gbit/s
/// takes ≈ 70 ms; five seconds means the peer stopped reading (or the
/// network lost it), and the sender reconnects rather than pin its outbox
/// behind a dead socket.
pub const PEER_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// First pause before a sender reconnects after a failed connect or write,
/// doubled at each failure in a row up to [`PEER_RECONNECT_BACKOFF_MAX`] and
/// reset by a successful connect. 50 ms: a peer restarting is back within a
/// few attempts, well inside raft's election timeout.
pub const PEER_RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// Longest pause between reconnect attempts: a peer down for long is tried
/// every two seconds, a handful of failed connects per peer per ten
/// seconds, and found again within two seconds of its return.
pub const PEER_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Peer connections one shard's receiver serves at once; over it a new one
/// is closed at once and counted. A shard receives from one connection per
/// (node, shard) of the cluster: 256 covers 32 nodes of 8 shards, or one
/// reconnect's overlap of half that.
pub const PEER_CONNECTIONS_MAX: usize = 256;

/// How long one frame may take to arrive once its first byte has: a peer
/// that sends a byte at a time cannot hold a connection and its buffer (up
/// to a frame's 8 MiB) forever. Ten seconds is 8 MiB at under 7 Mbit/s.
pub const PEER_FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a peer connection may stay without a frame before the receiver
/// closes it. Raft heartbeats arrive every few hundred milliseconds on a
/// live link; 30 s of silence is a link nobody uses, and its sender
/// reconnects when it has something to say.
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes the receiver reads at a time and the size its read buffer returns
/// to after a larger frame: most frames (heartbeats, small appends) fit in
/// it, and a frame larger than it grows the buffer to that frame's length,
/// never beyond `REPLICA_FRAME_BYTES_MAX`.
pub const PEER_READ_CHUNK_BYTES: usize = 64 << 10;

/// How long a TLS handshake on a peer link may take, on either side: the
/// receiver closes a connection that has not finished its handshake this
/// long after it was accepted (so a peer that connects and says nothing
/// holds a connection slot no longer), and a sender gives up on a
/// handshake this long after its TCP connect and backs off. A handshake is
/// two round trips and a few signatures, milliseconds on the cluster's
/// network; five seconds is a peer that will not finish it.
pub const PEER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS records rustls may hold unsent on one peer connection (its
/// `set_buffer_limit`, the same 64 KiB as its default, set so the bound is
/// ours): a sender's write of a larger frame waits for the socket instead
/// of buffering the frame twice. With rustls' own fixed bounds — 16 KiB of
/// received plaintext and one incoming record (≈ 18 KiB) once connected,
/// up to 64 KiB of incoming handshake messages while handshaking — one TLS
/// peer connection holds at most [`PEER_TLS_CONNECTION_MEMORY_BYTES`] in
/// rustls, on top of the receiver's read buffer.
pub const PEER_TLS_SEND_BUFFER_BYTES: usize = 64 << 10;

/// The most one TLS peer connection holds in rustls' buffers (see
/// [`PEER_TLS_SEND_BUFFER_BYTES`]): 64 KiB to send, 16 KiB received, 64
/// KiB of incoming handshake (18 KiB once connected), and 16 KiB for the
/// session's state and record overheads. A receiver's
/// [`PEER_CONNECTIONS_MAX`] connections hold at most 40 MiB of it; each
/// sender holds one connection's worth.
pub const PEER_TLS_CONNECTION_MEMORY_BYTES: usize = 160 << 10;

/// Pause after a failed `accept` (out of file descriptors, say) before the
/// receiver accepts again, so a persistent failure does not spin the shard.
pub const PEER_ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);

const _: () = assert!(PEER_OUTBOX_BYTES_MAX >= crate::replica::limits::REPLICA_FRAME_BYTES_MAX);
const _: () = assert!(PEER_OUTBOX_MESSAGES_MAX >= 1);
const _: () = assert!(PEER_CONNECTIONS_MAX >= 1);
const _: () = assert!(PEER_READ_CHUNK_BYTES >= crate::replica::limits::FRAME_HEADER_BYTES);
const _: () = assert!(PEER_READ_CHUNK_BYTES <= crate::replica::limits::REPLICA_FRAME_BYTES_MAX);
const _: () = assert!(
    PEER_TLS_SEND_BUFFER_BYTES + (16 << 10) + (64 << 10) + (16 << 10)
        <= PEER_TLS_CONNECTION_MEMORY_BYTES
);
const _: () = assert!(PEER_HANDSHAKE_TIMEOUT.as_nanos() > 0);
const _: () = assert!(
    PEER_RECONNECT_BACKOFF_MIN.as_nanos() > 0
        && PEER_RECONNECT_BACKOFF_MIN.as_nanos() <= PEER_RECONNECT_BACKOFF_MAX.as_nanos()
);
