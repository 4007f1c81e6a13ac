//! The receiving side of a shard's replication links: the accept loop on a
//! bound listener and one reading loop per peer connection.
//!
//! Owns the connections and their bounds: at most
//! [`PEER_CONNECTIONS_MAX`] at once (one over it is closed at once and
//! counted), an idle timeout ([`PEER_IDLE_TIMEOUT`]: no frame for that
//! long closes the connection), a frame timeout ([`PEER_FRAME_TIMEOUT`]: a
//! frame must arrive completely within it of its first byte), and a read
//! buffer that starts at [`PEER_READ_CHUNK_BYTES`], grows to the length of
//! a larger frame once that frame's header is checked, never beyond
//! `REPLICA_FRAME_BYTES_MAX`, and shrinks back after it.
//!
//! Each frame is checked in two steps: its header first
//! (`replica::wire::declared_len`: magic, version, crc, a declared length
//! within the bound; then the sending node, which must be one of the
//! allowed peers), before a byte of its body is read or room for it
//! allocated; then the whole frame (`replica::wire::decode`). A decoded
//! frame goes to the sink. Any failure closes that connection only,
//! counted by reason ([`PeerError::reason`]); the listener keeps serving
//! the others. The receiver never writes to a connection.
//!
//! Started with a [`PeerTls`] ([`PeerReceiver::start_tls`]), a connection
//! first runs the TLS handshake (`tls::accept`), bounded by
//! [`ReceiverLimits::handshake_timeout`] ([`PEER_HANDSHAKE_TIMEOUT`]): no
//! client certificate, one the cluster's CA did not sign, or no handshake
//! in time closes it (`handshake_failed`, `handshake_timeout`); a verified
//! certificate that names no node is `identity`, one naming a node not
//! allowed `unknown_node`. Then every frame's header must be from the
//! node the certificate names, or the connection is closed (`identity`)
//! before the frame's body is read. The handshake writes to the
//! connection; nothing after it does.
//!
//! It does not act on messages (the sink, the replica driver's, does) and
//! does not bind the listener (`net::listener::bind_listener` does, the
//! caller chooses the port).

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncReadExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::Gate;
use glommio::Task;

use super::limits::{
    PEER_ACCEPT_ERROR_BACKOFF, PEER_CONNECTIONS_MAX, PEER_FRAME_TIMEOUT, PEER_HANDSHAKE_TIMEOUT,
    PEER_IDLE_TIMEOUT, PEER_READ_CHUNK_BYTES,
};
use super::tls::{self, PeerTls};
use super::PeerError;
use crate::clock::{instant_now, Instant};
use crate::net::stop::StopSignal;
use crate::replica::limits::FRAME_HEADER_BYTES;
use crate::replica::wire::{declared_len, decode, Frame};

/// Where a frame's header holds the sending node (`replica::wire`).
const HEADER_FROM_AT: usize = 16;

/// The bounds of a receiver; [`Default`] is the `limits.rs` values. Tests
/// shrink them; production keeps the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverLimits {
    pub connections_max: usize,
    pub idle_timeout: Duration,
    pub frame_timeout: Duration,
    /// How long a TLS connection's handshake may take (unused in plain mode).
    pub handshake_timeout: Duration,
}

impl Default for ReceiverLimits {
    fn default() -> ReceiverLimits {
        ReceiverLimits {
            connections_max: PEER_CONNECTIONS_MAX,
            idle_timeout: PEER_IDLE_TIMEOUT,
            frame_timeout: PEER_FRAME_TIMEOUT,
            handshake_timeout: PEER_HANDSHAKE_TIMEOUT,
        }
    }
}

/// A receiver's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Connections taken in to be served.
    pub accepted: u64,
    /// Connections closed at once: over the connection bound.
    pub refused: u64,
    /// `accept` calls that failed.
    pub accept_errors: u64,
    /// Connections being served now.
    pub active: usize,
    /// Served connections that ended, per reason: indexed as
    /// [`PeerError::REASONS`].
    pub closed: [u64; PeerError::REASONS.len()],
    /// Frames decoded and handed to the sink.
    pub frames: u64,
    /// Messages in those frames.
    pub messages: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// The largest read buffer any connection held.
    pub read_buffer_bytes_peak: usize,
}

impl ReceiverStats {
    /// Connections that ended for `reason` (one of [`PeerError::REASONS`];
    /// 0 for any other word).
    pub fn closed_for(&self, reason: &str) -> u64 {
        PeerError::REASONS
            .iter()
            .position(|known| *known == reason)
            .map_or(0, |index| self.closed[index])
    }

    /// Served connections that ended, for any reason.
    pub fn closed_total(&self) -> u64 {
        self.closed.iter().sum()
    }
}

/// What the accept loop and the connections share.
struct Shared {
    allowed: BTreeSet<u64>,
    sink: Rc<dyn Fn(Frame)>,
    limits: ReceiverLimits,
    /// `None`: plain TCP.
    tls: Option<PeerTls>,
    stop: StopSignal,
    gate: Gate,
    stats: Cell<ReceiverStats>,
}

impl Shared {
    fn count(&self, change: impl FnOnce(&mut ReceiverStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }
}

/// A shard's replication receiver. See the module docs.
///
/// Dropping it stops accepting and ends its connections (as
/// [`PeerReceiver::close`] does, without waiting for them).
pub struct PeerReceiver {
    shared: Rc<Shared>,
    addr: SocketAddr,
    task: RefCell<Option<Task<()>>>,
}

impl std::fmt::Debug for PeerReceiver {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PeerReceiver")
            .field("addr", &self.addr)
            .field("stats", &self.shared.stats.get())
            .finish()
    }
}

impl PeerReceiver {
    /// Serves `listener` on the current glommio executor (so this must run
    /// on one): frames from the nodes in `allowed` go to `sink`, in the
    /// order each connection carries them.
    ///
    /// Plain TCP: a frame's sending node is taken at its word.
    ///
    /// # Errors
    /// [`PeerError::LocalAddr`] when the listener's address cannot be read.
    pub fn start(
        listener: TcpListener,
        allowed: impl IntoIterator<Item = u64>,
        sink: Rc<dyn Fn(Frame)>,
        limits: ReceiverLimits,
    ) -> Result<PeerReceiver, PeerError> {
        Self::start_with(listener, allowed, sink, limits, None)
    }

    /// As [`PeerReceiver::start`], over mutual TLS with `tls`: each
    /// connection's peer must present a certificate of the cluster's CA
    /// naming an allowed node, and its frames must all be from that node
    /// (the module docs say how each refusal is counted).
    ///
    /// # Errors
    /// [`PeerError::LocalAddr`] when the listener's address cannot be read.
    pub fn start_tls(
        listener: TcpListener,
        allowed: impl IntoIterator<Item = u64>,
        sink: Rc<dyn Fn(Frame)>,
        limits: ReceiverLimits,
        tls: &PeerTls,
    ) -> Result<PeerReceiver, PeerError> {
        Self::start_with(listener, allowed, sink, limits, Some(tls.clone()))
    }

    fn start_with(
        listener: TcpListener,
        allowed: impl IntoIterator<Item = u64>,
        sink: Rc<dyn Fn(Frame)>,
        limits: ReceiverLimits,
        tls: Option<PeerTls>,
    ) -> Result<PeerReceiver, PeerError> {
        let addr = listener.local_addr().map_err(|error| PeerError::LocalAddr(error.into()))?;
        let shared = Rc::new(Shared {
            allowed: allowed.into_iter().collect(),
            sink,
            limits,
            tls,
            stop: StopSignal::new(),
            gate: Gate::new(),
            stats: Cell::default(),
        });
        let task = glommio::spawn_local(accept_loop(shared.clone(), listener));
        Ok(PeerReceiver { shared, addr, task: RefCell::new(Some(task)) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its counters.
    pub fn stats(&self) -> ReceiverStats {
        self.shared.stats.get()
    }

    /// Stops accepting, ends every connection and waits for all of them.
    /// The listener is dropped; glommio releases its socket (and the port)
    /// once the pending accept's cancellation has gone through its ring, a
    /// reactor turn later, so an immediate rebind of the port in the same
    /// process may need a retry.
    pub async fn close(&self) {
        self.shared.stop.stop();
        let task = self.task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
        // Already closed by an earlier call: nothing left to wait for.
        if self.shared.gate.is_open() {
            let _closed = self.shared.gate.close().await;
        }
    }
}

impl Drop for PeerReceiver {
    fn drop(&mut self) {
        self.shared.stop.stop();
    }
}

/// Keeps [`ReceiverStats::active`] right however a connection's task ends.
struct ActiveGuard(Rc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.count(|stats| stats.active -= 1);
    }
}

async fn accept_loop(shared: Rc<Shared>, listener: TcpListener) {
    loop {
        let accepted = or(async { Some(listener.accept().await) }, async {
            shared.stop.wait().await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(stream)) => stream,
            Some(Err(error)) => {
                shared.count(|stats| stats.accept_errors += 1);
                tracing::warn!(%error, "replication listener: accept failed");
                let paused = or(
                    async {
                        glommio::timer::sleep(PEER_ACCEPT_ERROR_BACKOFF).await;
                        true
                    },
                    async {
                        shared.stop.wait().await;
                        false
                    },
                )
                .await;
                if !paused {
                    break;
                }
                continue;
            }
        };
        if shared.stats.get().active >= shared.limits.connections_max {
            shared.count(|stats| stats.refused += 1);
            tracing::warn!(peer = ?stream.peer_addr().ok(), "replication connection refused: too many");
            drop(stream);
            continue;
        }
        shared.count(|stats| {
            stats.accepted += 1;
            stats.active += 1;
        });
        let guard = ActiveGuard(shared.clone());
        let connection = shared.clone();
        let served = shared.gate.spawn(async move {
            let _guard = guard;
            let peer = stream.peer_addr().ok();
            let end = serve_connection(&connection, stream).await;
            connection.count(|stats| stats.closed[end.reason_index()] += 1);
            match end {
                PeerError::PeerClosed | PeerError::Stopped => {
                    tracing::debug!(?peer, reason = end.reason(), "replication connection ended");
                }
                _ => {
                    tracing::warn!(?peer, reason = end.reason(), error = %end,
                        "replication connection closed");
                }
            }
        });
        match served {
            Ok(task) => drop(task.detach()),
            // The gate closed: the receiver is stopping (the guard went
            // with the unspawned future).
            Err(_) => break,
        }
    }
}

/// Serves one accepted connection, plain or (after its handshake) TLS;
/// returns why it ended.
async fn serve_connection(shared: &Shared, stream: TcpStream) -> PeerError {
    let Some(tls) = &shared.tls else {
        return serve_peer(shared, stream, None).await;
    };
    let handshake_timeout = shared.limits.handshake_timeout;
    match tls::accept(tls, stream, handshake_timeout, &shared.stop).await {
        Ok((_, node)) if !shared.allowed.contains(&node) => PeerError::UnknownNode { from: node },
        Ok((stream, node)) => serve_peer(shared, stream, Some(node)).await,
        Err(error) => error,
    }
}

/// Reads frames from one peer connection until it fails, ends or the
/// receiver stops; returns why it ended. `certified`: the node the
/// connection's certificate names, which every frame must be from.
async fn serve_peer(
    shared: &Shared,
    mut stream: impl AsyncRead + Unpin,
    certified: Option<u64>,
) -> PeerError {
    let mut buffer = vec![0u8; PEER_READ_CHUNK_BYTES];
    shared.count(|stats| {
        stats.read_buffer_bytes_peak = stats.read_buffer_bytes_peak.max(buffer.len());
    });
    let mut filled = 0usize;
    let mut last_frame = instant_now();
    let mut frame_started: Option<Instant> = None;
    loop {
        let (taken, begun) = match take_frames(shared, certified, &mut buffer, &mut filled) {
            Ok(outcome) => outcome,
            Err(error) => return error,
        };
        let needed = begun.unwrap_or(FRAME_HEADER_BYTES);
        let now = instant_now();
        if taken > 0 {
            // The rest (if any) is the next frame's start: its clock starts.
            last_frame = now;
            frame_started = (filled > 0).then_some(now);
        }
        fit_buffer(shared, &mut buffer, filled, needed);
        let deadline = match frame_started {
            Some(started) => started + shared.limits.frame_timeout,
            None => last_frame + shared.limits.idle_timeout,
        };
        let Some(left) = deadline.checked_duration_since(now).filter(|left| !left.is_zero()) else {
            return if frame_started.is_some() { PeerError::FrameTimeout } else { PeerError::Idle };
        };
        let read = or(
            async { Some(stream.read(&mut buffer[filled..]).await) },
            or(
                async {
                    glommio::timer::sleep(left).await;
                    None
                },
                async {
                    shared.stop.wait().await;
                    None
                },
            ),
        )
        .await;
        match read {
            None if shared.stop.is_stopped() => return PeerError::Stopped,
            // The deadline: checked at the top of the loop.
            None => {}
            // A TLS peer that closes without a close_notify (as a sender
            // does) reads as an unexpected end: the same close.
            Some(Ok(0)) if filled == 0 => return PeerError::PeerClosed,
            Some(Err(error)) if error.kind() == ErrorKind::UnexpectedEof && filled == 0 => {
                return PeerError::PeerClosed;
            }
            Some(Ok(0)) => return PeerError::Truncated { held: filled, needed },
            Some(Err(error)) if error.kind() == ErrorKind::UnexpectedEof => {
                return PeerError::Truncated { held: filled, needed };
            }
            Some(Ok(read)) => {
                if filled == 0 {
                    frame_started = Some(instant_now());
                }
                filled += read;
            }
            Some(Err(error)) => return PeerError::Read(error),
        }
    }
}

/// Hands every whole frame at the buffer's front to the sink and moves
/// the rest to the front. Returns how many frames it took, and the length
/// of the frame begun after them once its header is checked (`None` while
/// the header is not whole).
///
/// # Errors
/// The header's or frame's check that failed; an unknown sending node, or
/// one other than `certified`.
fn take_frames(
    shared: &Shared,
    certified: Option<u64>,
    buffer: &mut [u8],
    filled: &mut usize,
) -> Result<(usize, Option<usize>), PeerError> {
    let mut start = 0usize;
    let mut taken = 0usize;
    let outcome = loop {
        let held = &buffer[start..*filled];
        if held.len() < FRAME_HEADER_BYTES {
            break Ok((taken, None));
        }
        let declared = match declared_len(&held[..FRAME_HEADER_BYTES]) {
            Ok(declared) => declared,
            Err(error) => break Err(PeerError::Frame(error)),
        };
        let mut from = [0u8; 8];
        from.copy_from_slice(&held[HEADER_FROM_AT..HEADER_FROM_AT + 8]);
        let from = u64::from_le_bytes(from);
        if let Some(certified) = certified.filter(|certified| *certified != from) {
            break Err(PeerError::Identity { claimed: from, certified });
        }
        if !shared.allowed.contains(&from) {
            break Err(PeerError::UnknownNode { from });
        }
        if held.len() < declared {
            break Ok((taken, Some(declared)));
        }
        let frame = match decode(&held[..declared]) {
            Ok(frame) => frame,
            Err(error) => break Err(PeerError::Frame(error)),
        };
        let messages = frame.messages.len() as u64;
        shared.count(|stats| {
            stats.frames += 1;
            stats.messages += messages;
            stats.bytes += declared as u64;
        });
        (shared.sink)(frame);
        start += declared;
        taken += 1;
    };
    if start > 0 {
        buffer.copy_within(start..*filled, 0);
        *filled -= start;
    }
    outcome
}

/// Sizes the read buffer for a frame of `needed` bytes (at most the frame
/// bound, checked by `declared_len`): grown to it when larger than a read
/// chunk, shrunk back to a chunk once what it holds fits one.
fn fit_buffer(shared: &Shared, buffer: &mut Vec<u8>, filled: usize, needed: usize) {
    let target = needed.max(PEER_READ_CHUNK_BYTES);
    if buffer.len() < target {
        buffer.resize(target, 0);
        let len = buffer.len();
        shared.count(|stats| stats.read_buffer_bytes_peak = stats.read_buffer_bytes_peak.max(len));
    } else if buffer.len() > target && filled <= target {
        buffer.truncate(target);
        buffer.shrink_to(target);
    }
}
