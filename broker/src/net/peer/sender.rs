//! One outgoing replication link: from this node to one peer shard.
//!
//! Owns the link's bounded outbox, its connection and its task:
//! [`PeerSender::send`] queues a raft message without waiting (over
//! [`PEER_OUTBOX_BYTES_MAX`] or [`PEER_OUTBOX_MESSAGES_MAX`] it drops the
//! message and counts it — raft-rs resends what a follower did not
//! acknowledge); the task that [`PeerSender::start`] spawns on the current
//! executor connects (within [`PEER_CONNECT_TIMEOUT`]), then sleeps until
//! something is queued (a wake from `send`, never a poll), packs the queue
//! into as few frames as `replica::wire::FrameBuilder` allows (a message
//! that does not fit starts the next frame) and writes them one after the
//! other, each within [`PEER_WRITE_TIMEOUT`], without ever waiting for a
//! reply: replies come back over the peer's own link to this node. While
//! idle it watches the socket, so a peer that closes is noticed before the
//! next frame is lost in it.
//!
//! A failed connect or a broken link (write failure or timeout, the peer's
//! close) is counted, and the task reconnects after a pause that starts at
//! [`PEER_RECONNECT_BACKOFF_MIN`], doubles at each failure in a row up to
//! [`PEER_RECONNECT_BACKOFF_MAX`] and is reset by a successful connect. The
//! outbox is kept across reconnects (bounded as always): messages queued
//! before it go out late, which raft handles as any stale message. The
//! messages of a frame whose write failed are lost (counted). The task
//! reconnects whether or not anything is queued, so a link is ready when
//! the next message comes: a link left idle is closed by the receiver after
//! its idle timeout and opened again, one connect per idle timeout.
//!
//! Started with a [`PeerTls`] ([`PeerSender::start_tls`]), each connect
//! is followed by the TLS handshake (`tls::connect`, within
//! [`SenderLimits::handshake_timeout`]): the receiver's certificate must
//! chain to the cluster's CA and name the node the link is for. A
//! handshake that fails or times out, or a certificate naming another
//! node, counts as a failed connect (and in `handshake_failures`) and is
//! retried after the same backoff; nothing is written to that peer.
//!
//! It does not decide what to send where (the replica driver does) and
//! does not read frames (`receiver.rs`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::Task;
use protobuf::Message as _;
use raft::eraftpb::Message;

use super::limits::{
    PEER_CONNECT_TIMEOUT, PEER_HANDSHAKE_TIMEOUT, PEER_OUTBOX_BYTES_MAX, PEER_OUTBOX_MESSAGES_MAX,
    PEER_RECONNECT_BACKOFF_MAX, PEER_RECONNECT_BACKOFF_MIN, PEER_WRITE_TIMEOUT,
};
use super::tls::{self, PeerTls};
use super::PeerError;
use crate::net::stop::StopSignal;
use crate::replica::limits::{
    FRAME_HEADER_BYTES, MESSAGE_HEADER_BYTES, REPLICA_FRAME_BYTES_MAX, REPLICA_FRAME_MESSAGES_MAX,
    REPLICA_MESSAGE_BYTES_MAX,
};
use crate::replica::wire::{FrameBuilder, FrameError, GroupId};

/// The bounds of one link; [`Default`] is the `limits.rs` values. Tests
/// shrink them; production keeps the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderLimits {
    /// Bytes of queued messages (encoded size plus frame header each).
    pub outbox_bytes_max: usize,
    /// Queued messages.
    pub outbox_messages_max: usize,
    pub connect_timeout: Duration,
    pub write_timeout: Duration,
    /// How long a TLS handshake may take after the connect (unused in
    /// plain mode).
    pub handshake_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for SenderLimits {
    fn default() -> SenderLimits {
        SenderLimits {
            outbox_bytes_max: PEER_OUTBOX_BYTES_MAX,
            outbox_messages_max: PEER_OUTBOX_MESSAGES_MAX,
            connect_timeout: PEER_CONNECT_TIMEOUT,
            write_timeout: PEER_WRITE_TIMEOUT,
            handshake_timeout: PEER_HANDSHAKE_TIMEOUT,
            backoff_min: PEER_RECONNECT_BACKOFF_MIN,
            backoff_max: PEER_RECONNECT_BACKOFF_MAX,
        }
    }
}

/// A link's counters, and its outbox now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages taken into the outbox.
    pub messages_queued: u64,
    /// Messages in frames written completely.
    pub messages_sent: u64,
    pub frames_sent: u64,
    pub bytes_sent: u64,
    /// Messages dropped because the outbox was full (or the link closed).
    pub messages_dropped: u64,
    /// Messages refused as unsendable: too large for any frame, not
    /// encodable, or not from this link's node.
    pub messages_refused: u64,
    /// Messages of frames whose write failed.
    pub messages_lost: u64,
    /// Successful connects.
    pub connects: u64,
    /// Failed connects, TLS handshakes included.
    pub connect_failures: u64,
    /// TLS handshakes that failed or timed out, or whose receiver's
    /// certificate named another node (each also a connect failure).
    pub handshake_failures: u64,
    /// Writes that failed or missed the write timeout.
    pub write_failures: u64,
    /// Links the peer closed (or wrote to) while the sender was idle.
    pub links_lost: u64,
    /// Bytes in the outbox now (never above the bound).
    pub outbox_bytes: usize,
    /// Messages in the outbox now.
    pub outbox_messages: usize,
}

struct Queued {
    group: GroupId,
    message: Message,
    /// Encoded size plus the frame's per-message header.
    bytes: usize,
}

/// A one-shot wake-up flag for one waiting task: set by [`Notify::notify`],
/// consumed by the waiter.
#[derive(Default)]
struct Notify {
    pending: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    fn notify(&self) {
        self.pending.set(true);
        let waker = self.waker.borrow_mut().take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn notified(&self) -> Notified<'_> {
        Notified(self)
    }
}

struct Notified<'a>(&'a Notify);

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.pending.replace(false) {
            return Poll::Ready(());
        }
        *self.0.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// What one link shares between its handle and its task.
struct Link {
    from: u64,
    addr: SocketAddr,
    limits: SenderLimits,
    /// `None`: plain TCP; else the TLS and the node the link is for.
    tls: Option<(PeerTls, u64)>,
    outbox: RefCell<VecDeque<Queued>>,
    work: Notify,
    stop: StopSignal,
    stats: Cell<SenderStats>,
}

impl Link {
    fn count(&self, change: impl FnOnce(&mut SenderStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }

    /// Takes the next frame's worth of messages off the outbox's front:
    /// the frame's bytes and how many messages it holds, or `None` when
    /// nothing is queued.
    fn next_frame(&self) -> Option<(Vec<u8>, usize)> {
        let mut outbox = self.outbox.borrow_mut();
        let mut builder = FrameBuilder::new(self.from);
        let mut frame_bytes = FRAME_HEADER_BYTES;
        while let Some(queued) = outbox.front() {
            let predicted_full = frame_bytes + queued.bytes > REPLICA_FRAME_BYTES_MAX
                || builder.len() == REPLICA_FRAME_MESSAGES_MAX;
            if predicted_full && !builder.is_empty() {
                break;
            }
            let pushed = builder.push(queued.group, &queued.message);
            let bytes = queued.bytes;
            match pushed {
                Ok(()) => frame_bytes += bytes,
                // The size taken at `send` said it fits; trust the builder.
                Err(FrameError::Full { .. }) if !builder.is_empty() => break,
                Err(error) => {
                    tracing::warn!(addr = %self.addr, %error, "replication message refused");
                    self.count(|stats| stats.messages_refused += 1);
                }
            }
            outbox.pop_front();
            self.count(|stats| {
                stats.outbox_bytes -= bytes;
                stats.outbox_messages -= 1;
            });
        }
        if builder.is_empty() {
            return None;
        }
        let messages = builder.len();
        Some((builder.finish(), messages))
    }
}

/// One outgoing replication link. See the module docs.
///
/// Dropping it stops its task (as [`PeerSender::close`] does, without
/// waiting for the end).
pub struct PeerSender {
    link: Rc<Link>,
    task: RefCell<Option<Task<()>>>,
}

impl std::fmt::Debug for PeerSender {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PeerSender")
            .field("from", &self.link.from)
            .field("addr", &self.link.addr)
            .field("stats", &self.link.stats.get())
            .finish()
    }
}

impl PeerSender {
    /// The link from node `from` to the peer shard at `addr`, its task
    /// spawned on the current glommio executor (so this must run on one).
    /// It connects at once, and sends whatever is queued. Plain TCP.
    pub fn start(from: u64, addr: SocketAddr, limits: SenderLimits) -> PeerSender {
        Self::start_with(from, addr, limits, None)
    }

    /// As [`PeerSender::start`], over mutual TLS with `tls`, from the node
    /// its certificate names ([`PeerTls::node`]) to node `to`, whose
    /// certificate the receiver at `addr` must present.
    pub fn start_tls(tls: &PeerTls, to: u64, addr: SocketAddr, limits: SenderLimits) -> PeerSender {
        Self::start_with(tls.node(), addr, limits, Some((tls.clone(), to)))
    }

    fn start_with(
        from: u64,
        addr: SocketAddr,
        limits: SenderLimits,
        tls: Option<(PeerTls, u64)>,
    ) -> PeerSender {
        let link = Rc::new(Link {
            from,
            addr,
            limits,
            tls,
            outbox: RefCell::default(),
            work: Notify::default(),
            stop: StopSignal::new(),
            stats: Cell::default(),
        });
        let task = glommio::spawn_local(run(link.clone()));
        PeerSender { link, task: RefCell::new(Some(task)) }
    }

    /// Queues `message` of `group` for the peer; never waits.
    ///
    /// # Errors
    /// The message is dropped (and counted) with [`PeerError::OutboxFull`]
    /// at the outbox's bound, [`PeerError::Closed`] once the link is
    /// closed, [`PeerError::Unsendable`] when it fits no frame or is not from
    /// this link's node (the receiver would close the link for it).
    pub fn send(&self, group: GroupId, message: Message) -> Result<(), PeerError> {
        let link = &*self.link;
        if link.stop.is_stopped() {
            link.count(|stats| stats.messages_dropped += 1);
            return Err(PeerError::Closed);
        }
        if message.from != link.from {
            link.count(|stats| stats.messages_refused += 1);
            return Err(PeerError::Unsendable(FrameError::Impostor {
                at: 0,
                claimed: message.from,
                from: link.from,
            }));
        }
        let encoded = message.compute_size() as usize;
        if encoded > REPLICA_MESSAGE_BYTES_MAX {
            link.count(|stats| stats.messages_refused += 1);
            return Err(PeerError::Unsendable(FrameError::MessageTooLarge { bytes: encoded }));
        }
        let bytes = encoded + MESSAGE_HEADER_BYTES;
        let stats = link.stats.get();
        if stats.outbox_messages >= link.limits.outbox_messages_max
            || stats.outbox_bytes + bytes > link.limits.outbox_bytes_max
        {
            link.count(|stats| stats.messages_dropped += 1);
            return Err(PeerError::OutboxFull {
                messages: stats.outbox_messages,
                bytes: stats.outbox_bytes,
            });
        }
        link.outbox.borrow_mut().push_back(Queued { group, message, bytes });
        link.count(|stats| {
            stats.messages_queued += 1;
            stats.outbox_bytes += bytes;
            stats.outbox_messages += 1;
        });
        link.work.notify();
        Ok(())
    }

    /// The link's counters and its outbox now.
    pub fn stats(&self) -> SenderStats {
        self.link.stats.get()
    }

    /// The peer shard's address.
    pub fn addr(&self) -> SocketAddr {
        self.link.addr
    }

    /// Stops the link and waits for its task to end (promptly: every wait
    /// of the task races the stop). What is still queued is not sent.
    pub async fn close(&self) {
        self.link.stop.stop();
        let task = self.task.borrow_mut().take();
        if let Some(task) = task {
            task.await;
        }
    }
}

impl Drop for PeerSender {
    fn drop(&mut self) {
        self.link.stop.stop();
    }
}

/// `future`'s output, or `None` once `stop` trips.
async fn unless_stopped<T>(stop: &StopSignal, future: impl Future<Output = T>) -> Option<T> {
    or(async { Some(future.await) }, async {
        stop.wait().await;
        None
    })
    .await
}

/// The link's task: connect, pump, back off, until stopped.
async fn run(link: Rc<Link>) {
    let limits = link.limits;
    let mut backoff = limits.backoff_min;
    loop {
        let connect = TcpStream::connect_timeout(link.addr, limits.connect_timeout);
        let Some(connected) = unless_stopped(&link.stop, connect).await else { break };
        match connected {
            Ok(stream) => {
                if let PeerError::Stopped = serve_link(&link, stream, &mut backoff).await {
                    break;
                }
            }
            Err(error) => {
                link.count(|stats| stats.connect_failures += 1);
                let error = std::io::Error::from(error);
                let error = match error.kind() {
                    std::io::ErrorKind::TimedOut => PeerError::ConnectTimeout { addr: link.addr },
                    _ => PeerError::Connect { addr: link.addr, source: error },
                };
                tracing::debug!(%error, backoff_ms = backoff.as_millis() as u64,
                    "replication link: connect failed");
            }
        }
        let pause = glommio::timer::sleep(backoff);
        if unless_stopped(&link.stop, pause).await.is_none() {
            break;
        }
        backoff = (backoff * 2).min(limits.backoff_max);
    }
}

/// Runs one connected link: its TLS handshake if it has TLS, then the
/// pump; returns why it ended.
async fn serve_link(link: &Link, stream: TcpStream, backoff: &mut Duration) -> PeerError {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(addr = %link.addr, %error, "replication link: TCP_NODELAY not set");
    }
    let Some((tls, to)) = &link.tls else {
        return connected_pump(link, stream, backoff).await;
    };
    match tls::connect(tls, *to, stream, link.limits.handshake_timeout, &link.stop).await {
        Ok(stream) => connected_pump(link, stream, backoff).await,
        Err(PeerError::Stopped) => PeerError::Stopped,
        Err(error) => {
            link.count(|stats| {
                stats.connect_failures += 1;
                stats.handshake_failures += 1;
            });
            tracing::warn!(addr = %link.addr, to, %error,
                backoff_ms = backoff.as_millis() as u64, "replication link: TLS handshake failed");
            error
        }
    }
}

/// Counts a connect, pumps the connection until it ends, counts how it
/// ended and returns that.
async fn connected_pump(
    link: &Link,
    stream: impl AsyncRead + AsyncWrite + Unpin,
    backoff: &mut Duration,
) -> PeerError {
    link.count(|stats| stats.connects += 1);
    *backoff = link.limits.backoff_min;
    tracing::debug!(addr = %link.addr, "replication link connected");
    let end = pump(link, stream).await;
    match &end {
        PeerError::Stopped => {}
        PeerError::Write(_) | PeerError::WriteTimeout => {
            link.count(|stats| stats.write_failures += 1);
            tracing::warn!(addr = %link.addr, error = %end, "replication link broke");
        }
        _ => {
            link.count(|stats| stats.links_lost += 1);
            tracing::info!(addr = %link.addr, error = %end, "replication link closed");
        }
    }
    end
}

enum Wake {
    Work,
    Stopped,
    PeerRead(std::io::Result<usize>),
}

/// Writes frames on one connection until it breaks or the link stops;
/// returns why it ended.
async fn pump(link: &Link, stream: impl AsyncRead + AsyncWrite + Unpin) -> PeerError {
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let mut probe = [0u8; 1];
    loop {
        while link.outbox.borrow().is_empty() {
            let wake = or(
                or(
                    async {
                        link.work.notified().await;
                        Wake::Work
                    },
                    async {
                        link.stop.wait().await;
                        Wake::Stopped
                    },
                ),
                async { Wake::PeerRead(reader.read(&mut probe).await) },
            )
            .await;
            match wake {
                Wake::Work => {}
                Wake::Stopped => return PeerError::Stopped,
                Wake::PeerRead(Ok(0)) => return PeerError::PeerClosed,
                Wake::PeerRead(Ok(_)) => return PeerError::UnexpectedBytes,
                Wake::PeerRead(Err(error)) => return PeerError::Read(error),
            }
        }
        while let Some((frame, messages)) = link.next_frame() {
            let write = async {
                match writer.write_all(&frame).await {
                    Ok(()) => Ok(()),
                    Err(error) => Err(PeerError::Write(error)),
                }
            };
            let deadline = async {
                glommio::timer::sleep(link.limits.write_timeout).await;
                Err(PeerError::WriteTimeout)
            };
            let Some(written) = unless_stopped(&link.stop, or(write, deadline)).await else {
                return PeerError::Stopped;
            };
            if let Err(error) = written {
                link.count(|stats| stats.messages_lost += messages as u64);
                return error;
            }
            link.count(|stats| {
                stats.messages_sent += messages as u64;
                stats.frames_sent += 1;
                stats.bytes_sent += frame.len() as u64;
            });
            glommio::yield_if_needed().await;
        }
    }
}
