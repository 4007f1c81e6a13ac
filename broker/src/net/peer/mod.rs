//! The replication peer transport of one shard
//! (`docs/design/replication.md` §5): raft messages to and from the shards
//! of other nodes, batched into replication frames (`replica::wire`).
//!
//! - [`sender`]: [`PeerSender`], one outgoing link from this node to one
//!   peer shard's address — a bounded outbox that [`PeerSender::send`]
//!   fills without waiting (a full outbox drops and counts), and a task
//!   that connects, packs what is queued into as few frames as fit, writes
//!   them pipelined (it never waits for a reply) and reconnects with
//!   exponential backoff when the link breaks.
//! - [`receiver`]: [`PeerReceiver`], the accept loop on a bound listener
//!   and one reading loop per peer connection: each frame's header checked
//!   before its body is read (length bound, sending node among the allowed
//!   ones), then decoded and handed to a sink; a bad frame closes that
//!   connection only, counted by reason.
//! - [`tls`]: [`PeerTls`], mutual TLS on the links: a link started with
//!   one ([`PeerSender::start_tls`], [`PeerReceiver::start_tls`]) runs a
//!   TLS 1.3 handshake (bounded by [`limits::PEER_HANDSHAKE_TIMEOUT`])
//!   before any frame, both certificates verified against the cluster's
//!   CA. A peer certificate names its node by the DNS name `node-<id>`
//!   ([`tls::certificate_node`]): the sender checks that the receiver's
//!   names the node it meant to reach, and the receiver closes a
//!   connection whose frames claim another node than its certificate's
//!   (`identity`). The plain constructors ([`PeerSender::start`],
//!   [`PeerReceiver::start`]) keep plain TCP, where a frame's node id is
//!   taken at its word.
//! - [`limits`]: every bound of all three.
//!
//! Everything runs on the shard's executor (`Rc`, `RefCell`, tasks spawned
//! locally): a shard's peer links are its own, as its client connections
//! are. This module does not know raft beyond its message type: which
//! messages go to which peer, and what a received frame does, are the
//! replica driver's. It does not pick addresses or node ids either (the
//! cluster's configuration does).
//!
//! What TLS does not do here: it does not read the node's configuration
//! (the caller builds the [`PeerTls`], from files with [`PeerTls::load`]),
//! check revocation, reload certificates while running, or tie a
//! certificate to a shard (a node's certificate speaks for all its
//! shards). It bounds rustls' memory per connection
//! ([`limits::PEER_TLS_CONNECTION_MEMORY_BYTES`]), not the receiver's read
//! buffer, which a verified peer may still grow to a whole frame.

pub mod limits;
pub mod receiver;
pub mod sender;
pub mod tls;

use std::net::SocketAddr;

use thiserror::Error;

use crate::replica::wire::FrameError;

pub use receiver::{PeerReceiver, ReceiverLimits, ReceiverStats};
pub use sender::{PeerSender, SenderLimits, SenderStats};
pub use tls::{PeerTls, PeerTlsFiles};

/// What went wrong on a peer link: a sender's refusal or broken connection,
/// or why a receiver closed a connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The outbox is at its bound; the message was dropped (raft resends).
    #[error("peer outbox full ({messages} messages, {bytes} bytes); message dropped")]
    OutboxFull { messages: usize, bytes: usize },
    /// The message fits no frame or cannot be encoded; it was dropped.
    #[error("message refused: {0}")]
    Unsendable(FrameError),
    /// The sender was closed; nothing more is queued.
    #[error("peer sender is closed")]
    Closed,
    #[error("connect to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("connect to {addr} timed out")]
    ConnectTimeout { addr: SocketAddr },
    #[error("write to peer failed: {0}")]
    Write(std::io::Error),
    #[error("write to peer timed out")]
    WriteTimeout,
    /// The other side closed between frames.
    #[error("peer closed the connection")]
    PeerClosed,
    /// The other side closed in the middle of a frame.
    #[error("peer closed mid-frame ({held} of {needed} bytes)")]
    Truncated { held: usize, needed: usize },
    /// A receiver wrote to a link that only carries frames to it.
    #[error("peer sent bytes on a send-only link")]
    UnexpectedBytes,
    #[error("read from peer failed: {0}")]
    Read(std::io::Error),
    #[error("no frame from peer within the idle timeout")]
    Idle,
    #[error("a frame did not arrive completely within the frame timeout")]
    FrameTimeout,
    /// The frame (header or body) failed a check of `replica::wire`.
    #[error("bad replication frame: {0}")]
    Frame(#[from] FrameError),
    /// The frame's sending node is not one this receiver serves.
    #[error("frame from node {from}, not an allowed peer")]
    UnknownNode { from: u64 },
    /// The shard is stopping (or the receiver was closed).
    #[error("stopped")]
    Stopped,
    /// The TLS handshake failed: a certificate refused (no client
    /// certificate, one the CA did not sign, a receiver's naming another
    /// node), or bytes that are not TLS.
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    /// The TLS handshake did not finish within the handshake timeout.
    #[error("no TLS handshake within the handshake timeout")]
    HandshakeTimeout,
    /// A verified certificate that names no node, several, or not the one
    /// the sender meant to reach.
    #[error("peer certificate refused: {reason}")]
    Certificate { reason: String },
    /// A frame from another node than the one the link's certificate names.
    #[error("frame from node {claimed} on a link whose certificate names node {certified}")]
    Identity { claimed: u64, certified: u64 },
    /// The peer TLS settings cannot be used (a file, the certificate, the
    /// key, the CA).
    #[error("peer TLS: {0}")]
    TlsSetup(String),
    /// The listener's address could not be read.
    #[error("listener address: {0}")]
    LocalAddr(std::io::Error),
}

impl PeerError {
    /// Every reason a receiver closes a connection for ([`Self::reason`]),
    /// in the order of [`Self::reason_index`]: the index of
    /// [`ReceiverStats::closed`]. Stable labels.
    pub const REASONS: [&'static str; 13] = [
        "peer_closed",
        "truncated",
        "idle",
        "frame_timeout",
        "read_failed",
        "frame_too_large",
        "bad_frame",
        "unknown_node",
        "stopped",
        "handshake_failed",
        "handshake_timeout",
        "identity",
        "other",
    ];

    /// Where [`Self::reason`] is in [`Self::REASONS`].
    pub fn reason_index(&self) -> usize {
        match self {
            Self::PeerClosed => 0,
            Self::Truncated { .. } => 1,
            Self::Idle => 2,
            Self::FrameTimeout => 3,
            Self::Read(_) => 4,
            Self::Frame(FrameError::Length { .. }) => 5,
            Self::Frame(_) => 6,
            Self::UnknownNode { .. } => 7,
            Self::Stopped => 8,
            Self::Handshake(_) => 9,
            Self::HandshakeTimeout => 10,
            Self::Certificate { .. } | Self::Identity { .. } => 11,
            _ => 12,
        }
    }

    /// A stable label for why a connection ended: one of [`Self::REASONS`]
    /// (a header declaring more than the frame bound is `frame_too_large`,
    /// any other frame check `bad_frame`; a certificate that names no
    /// node, or a frame from another node than the certificate names,
    /// `identity`).
    pub fn reason(&self) -> &'static str {
        Self::REASONS[self.reason_index()]
    }
}
