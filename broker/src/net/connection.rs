//! One client connection: bytes in, frames to a handler, responses out.
//!
//! Owns the per-connection loop and its bounds: a read buffer that never
//! exceeds `frame_bytes_max`, at most `in_flight_max` requests being handled
//! at once (reading pauses at the limit: backpressure, not an error), an idle
//! timeout, a bound on the bytes of responses produced but not yet written
//! (`response_bytes_max`: at the bound reading pauses until the peer has
//! read enough, the same backpressure), a per-frame deadline (a frame must
//! arrive completely within
//! `frame_timeout` of its first byte or of the previous frame, so a peer that
//! sends a byte at a time cannot hold a slot forever), and a write timeout
//! (each response must be written within it, so a peer that stops reading
//! cannot pin responses forever).
//!
//! Responses that are waiting when the writer wakes are written as one burst:
//! small ones are copied into one buffer and go out in one `write`, so a
//! pipelined peer costs one syscall per burst rather than one per response.
//!
//! It does not know the protocol: a [`FrameHandler`] splits frames off the
//! buffer, handles them and says what to send on a protocol fault. Requests
//! are pipelined and handled concurrently, so responses may leave in a
//! different order than requests arrived (the protocol's correlation id pairs
//! them). A decode error writes the handler's fault response after every
//! response already in flight, then closes the connection, and nothing else.

use std::rc::Rc;

use futures_lite::future::or;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite};
use glommio::channels::local_channel;
use glommio::sync::Semaphore;
use glommio::timer::Timer;

use crate::limits::{
    DISPATCH_BUDGET_BYTES, DISPATCH_BUDGET_FRAMES, MEMORY_WAIT_PEER_POLL, READ_CHUNK_BYTES,
};
use crate::net::admission::Admit;
use crate::net::memory::Grant;
use crate::net::pace::PaceDecision;
use crate::net::poll_gate::PollGate;
use crate::net::stop::StopSignal;

pub use super::frame_handler::{Decoded, FrameHandler, ProtocolFault, Refusal};

pub use super::scope::{ClaimRegistration, Connection, ConnectionLimits};

/// Takes a connection out of the admission turn order when its reading
/// loop ends, however it ends.
struct AdmissionSeat(Rc<Connection>);

impl Drop for AdmissionSeat {
    fn drop(&mut self) {
        self.0.admission.leave(self.0.id);
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub enum ConnectionEnd {
    /// The peer closed its side (between frames or mid-frame).
    PeerClosed,
    /// Nothing buffered, nothing in flight, for `idle_timeout`.
    Idle,
    /// The shard is stopping.
    Stopped,
    /// The handler closed it ([`Connection::close`]).
    Closed,
    /// The decoder rejected the bytes.
    DecodeError(String),
    /// The buffer filled with no whole frame.
    FrameTooLarge,
    /// A started frame did not complete in time.
    FrameTimeout,
    /// Reading failed.
    ReadFailed(std::io::Error),
    /// Writing failed or a response was not written within `write_timeout`.
    WriteFailed(std::io::Error),
    /// The TLS handshake failed or timed out, or the client certificate
    /// was refused (`net::tls`).
    Tls(String),
}

impl ConnectionEnd {
    /// Every reason label ([`Self::reason`]), in the order of
    /// [`Self::reason_index`]: the `reason` of
    /// `spool_shard_connections_closed_total`. Stable: dashboards key on
    /// them.
    pub const REASONS: [&'static str; 11] = [
        "peer_closed",
        "idle",
        "stopped",
        "closed",
        "decode_error",
        "frame_too_large",
        "frame_timeout",
        "read_failed",
        "write_failed",
        "slow_reader",
        "tls",
    ];

    /// Where [`Self::reason`] is in [`Self::REASONS`] (a counter array's
    /// index).
    pub fn reason_index(&self) -> usize {
        match self {
            Self::PeerClosed => 0,
            Self::Idle => 1,
            Self::Stopped => 2,
            Self::Closed => 3,
            Self::DecodeError(_) => 4,
            Self::FrameTooLarge => 5,
            Self::FrameTimeout => 6,
            Self::ReadFailed(_) => 7,
            // A response not written within `write_timeout` (the writer's
            // only `TimedOut`): a peer that does not read its answers.
            Self::WriteFailed(error) if error.kind() == std::io::ErrorKind::TimedOut => 9,
            Self::WriteFailed(_) => 8,
            Self::Tls(_) => 10,
        }
    }

    /// A stable label for why the connection ended: one of
    /// [`Self::REASONS`]. A write that timed out is `slow_reader`, any
    /// other failed write `write_failed`.
    pub fn reason(&self) -> &'static str {
        Self::REASONS[self.reason_index()]
    }
}

enum ReadEvent {
    Data(std::io::Result<usize>),
    Idle,
    FrameTimeout,
    Stopped,
    WriterFailed,
    InFlightDrained,
    /// Memory this connection waited for, for its read buffer to grow.
    BufferMemory(Grant),
    /// The socket says the peer is gone while the connection waited for
    /// memory and read nothing ([`super::peer_watch`]).
    PeerGone,
}

/// Serves one connection until it ends; returns after every in-flight
/// request has been handled and its response written (or the writer failed).
pub async fn serve_connection<H, S>(
    stream: S,
    handler: Rc<H>,
    limits: ConnectionLimits,
    stop: StopSignal,
) -> ConnectionEnd
where
    H: FrameHandler,
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let connection = Rc::new(Connection::new(limits.waiting_max, Rc::default()));
    serve(stream, handler, limits, stop, connection).await
}

/// [`serve_connection`] with the caller's [`Connection`] scope (shared
/// rejection counters, an id the caller knows).
pub async fn serve<H, S>(
    stream: S,
    handler: Rc<H>,
    limits: ConnectionLimits,
    stop: StopSignal,
    connection: Rc<Connection>,
) -> ConnectionEnd
where
    H: FrameHandler,
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    assert!(limits.in_flight_max > 0);
    assert!(limits.frame_bytes_max > 0);
    let (reader, writer) = futures_lite::io::split(stream);
    // In-flight tasks hold a permit each, so at most in_flight_max responses
    // plus one fault response are ever queued: `send` never waits.
    let (sender, receiver) = local_channel::new_bounded::<H::Response>(limits.in_flight_max + 1);
    let writer_failed = StopSignal::new();
    let write_error: Rc<std::cell::RefCell<Option<std::io::Error>>> = Rc::default();

    let write_loop = super::writer::write_loop(
        writer,
        receiver,
        writer_failed.clone(),
        write_error.clone(),
        connection.clone(),
        limits,
    );

    let read_loop = async {
        let end = read_loop(
            reader,
            handler,
            limits,
            stop,
            writer_failed.clone(),
            sender,
            connection.clone(),
        )
        .await;
        // Whatever ended reading, waiting requests answer now.
        connection.ended.stop();
        end
    };
    let (end, ()) = futures_lite::future::zip(read_loop, write_loop).await;
    let write_error = write_error.borrow_mut().take();
    match write_error {
        Some(error) => ConnectionEnd::WriteFailed(error),
        None => end,
    }
}

async fn read_loop<H, R>(
    mut reader: R,
    handler: Rc<H>,
    limits: ConnectionLimits,
    stop: StopSignal,
    writer_failed: StopSignal,
    sender: local_channel::LocalSender<H::Response>,
    connection: Rc<Connection>,
) -> ConnectionEnd
where
    H: FrameHandler,
    R: AsyncRead + Unpin,
{
    let sender = Rc::new(sender);
    let _seat = AdmissionSeat(connection.clone());
    let admission = connection.admission.clone();
    let connection_id = connection.id;
    let memory = connection.memory.clone();
    // The read buffer's bytes above its `READ_CHUNK_BYTES` floor, taken
    // from the shard's requests pool before they are allocated.
    let mut buffer_grant: Option<Grant> = None;
    let in_flight = Rc::new(Semaphore::new(limits.in_flight_max as u64));
    let in_flight_max = limits.in_flight_max as u64;
    // `buffer[..filled]` holds unread bytes; the rest of `buffer` is already
    // initialized room for the next read, so reads do not zero it again.
    let mut buffer: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES.min(limits.frame_bytes_max));
    let mut filled = 0usize;
    let mut frame_deadline: Option<Timer> = None;
    // The peer closed its sending side: no more reads, but the whole frames
    // it sent before are still answered.
    let mut peer_closed = false;

    // The fault response goes out after every response already in flight,
    // so the peer sees all answers it was owed before the error and close.
    // Waiting requests are told to answer first, so that takes no longer
    // than the requests themselves.
    let fault = |fault: ProtocolFault<'_, H::DecodeError>| {
        let response = handler.fault_response(fault);
        let sender = sender.clone();
        let in_flight = in_flight.clone();
        let connection = connection.clone();
        connection.ended.stop();
        async move {
            if let Some(response) = response {
                // Never closed, so acquiring every permit only waits.
                let _ = in_flight.acquire(in_flight_max).await;
                in_flight.signal(in_flight_max);
                connection.responses_queued(response.as_ref().len());
                let _ = sender.send(response).await;
            }
        }
    };

    let gate = PollGate::new(limits.io_poll_interval);
    let pace = connection.pace.clone();
    // The intake frame at the front of the buffer: held by the pace since
    // then, or already let go (asked once per frame, so one hold is bounded).
    let mut pace_held_since: Option<std::time::Instant> = None;
    let mut pace_granted = false;
    loop {
        // Reads that find data complete inside this task: a busy
        // connection lets the executor poll now and then.
        gate.pass().await;
        // Hand whole frames in the buffer to their own tasks while a permit
        // is free and this pass's budget lasts.
        let mut consumed = 0;
        let mut blocked = false;
        let mut responses_full = false;
        // The shard's responses pool is spent and this connection holds
        // more than its share of it: no new work from it.
        let mut responses_pool_full = false;
        // The shard's requests pool is over its size: no new frame until
        // frames in flight give memory back.
        let mut requests_pool_full = false;
        let mut budget_spent = false;
        // Frames wait for this connection's admission turn.
        let mut waiting_turn = false;
        // The front frame is intake held by the consumer pace.
        let mut pace_hold = false;
        let mut dispatched_frames = 0usize;
        let mut dispatched_bytes = 0usize;
        while consumed < filled {
            if dispatched_frames >= DISPATCH_BUDGET_FRAMES
                || dispatched_bytes >= DISPATCH_BUDGET_BYTES
            {
                budget_spent = true;
                break;
            }
            if in_flight.available() == 0 {
                blocked = true;
                break;
            }
            if memory.requests.over() {
                blocked = true;
                requests_pool_full = true;
                break;
            }
            if memory.responses.over_share(connection_id) {
                // The shard's connections hold more unwritten responses
                // than its pool and this one more than its share (a slow
                // reader): it hands over nothing until writers drain, the
                // others go on.
                blocked = true;
                responses_pool_full = true;
                break;
            }
            if connection.responses_queued_bytes() >= limits.response_bytes_max {
                // The peer is not reading its answers: hand over no more
                // work until it has (backpressure, not an error).
                blocked = true;
                responses_full = true;
                break;
            }
            if !pace_granted
                && limits.pace_percent > 0
                && !connection.carries_consumer()
                && handler.is_intake(&buffer[consumed..filled])
            {
                let now = crate::clock::instant_now();
                match pace.decide(now, pace_held_since, limits.pace_percent) {
                    PaceDecision::Go => {
                        pace_held_since = None;
                        pace_granted = true;
                    }
                    PaceDecision::Hold => {
                        // Consumers are behind: this producer waits (and
                        // its later frames behind it, in order).
                        pace_held_since.get_or_insert(now);
                        blocked = true;
                        pace_hold = true;
                        break;
                    }
                }
            }
            if admission.ready(connection_id) == Admit::Wait {
                // Other connections have frames waiting too: this one waits
                // for its turn (see `admission`).
                blocked = true;
                waiting_turn = true;
                break;
            }
            let pending = &buffer[consumed..filled];
            match handler.decode(pending) {
                Ok(Decoded::Incomplete) => {
                    if pending.len() >= limits.frame_bytes_max {
                        let frame_bytes_max = limits.frame_bytes_max;
                        fault(ProtocolFault::FrameTooLarge { frame_bytes_max }).await;
                        return ConnectionEnd::FrameTooLarge;
                    }
                    break;
                }
                Ok(Decoded::Frame { frame, len_bytes }) => {
                    assert!(len_bytes > 0, "decoder returned an empty frame");
                    assert!(len_bytes <= pending.len(), "decoder consumed unread bytes");
                    // At in_flight_max requests being handled the frame waits
                    // in the buffer (backpressure). Reading goes on meanwhile,
                    // up to the buffer bound, so a peer's close is seen.
                    let Ok(permit) = in_flight.try_acquire_static_permit(1) else {
                        blocked = true;
                        break;
                    };
                    // The frame's copy, charged to the shard's requests
                    // pool until its request is answered (the pool was
                    // under its size above: exceeded by one frame at most).
                    let frame_memory = memory.requests.charge(connection_id, len_bytes);
                    if let Err(error) = handler.admit(&frame, &connection) {
                        let text = error.to_string();
                        drop(permit);
                        fault(ProtocolFault::Decode(&error)).await;
                        return ConnectionEnd::DecodeError(text);
                    }
                    admission.charge(connection_id, len_bytes);
                    pace_granted = false;
                    consumed += len_bytes;
                    dispatched_frames += 1;
                    dispatched_bytes += len_bytes;
                    frame_deadline = None;
                    let handler = handler.clone();
                    let sender = sender.clone();
                    let connection = connection.clone();
                    glommio::spawn_local(async move {
                        let response = handler.handle(frame, connection.clone()).await;
                        drop(frame_memory);
                        connection.responses_queued(response.as_ref().len());
                        // Fails only if the writer is gone; nothing to tell.
                        let _ = sender.send(response).await;
                        drop(permit);
                    })
                    .detach();
                }
                Err(error) => {
                    let text = error.to_string();
                    fault(ProtocolFault::Decode(&error)).await;
                    return ConnectionEnd::DecodeError(text);
                }
            }
        }
        buffer.copy_within(consumed..filled, 0);
        filled -= consumed;
        if filled == 0 && buffer.capacity() > READ_CHUNK_BYTES {
            // Nothing pending: the memory of a large frame goes back.
            buffer.truncate(READ_CHUNK_BYTES);
            buffer.shrink_to(READ_CHUNK_BYTES);
            buffer_grant = None;
        }
        if !waiting_turn {
            // Nothing this connection can hand over now: its place in the
            // turn order (and its turn) goes to the others.
            admission.pass(connection_id);
        }

        if stop.is_stopped() {
            return ConnectionEnd::Stopped;
        }
        if connection.closing.is_stopped() {
            return ConnectionEnd::Closed;
        }
        if writer_failed.is_stopped() {
            // The real error is reported by serve_connection.
            return ConnectionEnd::PeerClosed;
        }
        if budget_spent {
            // Let the shard's other connections and tasks run before this
            // one hands over more work.
            futures_lite::future::yield_now().await;
            continue;
        }
        if peer_closed && !blocked {
            // Every whole frame it sent is handled; what is left is a
            // partial frame that can never complete.
            return ConnectionEnd::PeerClosed;
        }

        let nothing_in_flight = in_flight.available() == in_flight_max;
        if blocked {
            // Whole frames wait for a permit or for the peer to read its
            // answers, not for the peer to send.
            frame_deadline = None;
        } else if filled > 0 && frame_deadline.is_none() {
            frame_deadline = Some(Timer::new(limits.frame_timeout));
        }
        let start = filled;
        // The length of a frame begun and not whole at the buffer's front.
        // (A length past the bound is refused when the frame is decoded.)
        let buffer_max = limits.frame_bytes_max.max(READ_CHUNK_BYTES);
        let partial_frame = handler
            .frame_len(&buffer[..filled])
            .filter(|&len| len > filled)
            .map(|len| len.min(buffer_max));
        let mut want = READ_CHUNK_BYTES.min(limits.frame_bytes_max - start);
        if let Some(len) = partial_frame {
            // Read within the room for the whole frame (once held).
            want = want.min(len.max(buffer.capacity()) - start);
        }
        let mut can_read = want > 0 && !peer_closed;
        // Growing the buffer past its floor takes memory first; without
        // it the connection reads nothing more until memory returns (a
        // started frame keeps its deadline meanwhile).
        let mut buffer_memory_wait: Option<usize> = None;
        if can_read && buffer.capacity() < start + want {
            // A frame begun takes its whole length from the pool in one
            // grant, so a connection waiting for memory holds none of the
            // pool for a part of its frame (connections holding parts and
            // each waiting for more could hold the pool against each other
            // until their deadlines, their peers' closes unseen); and a
            // connection that holds memory reads, so it sees its peer's
            // close. The buffer itself grows geometrically (few copies of a
            // large frame) within what is granted, up to the frame bound;
            // otherwise (whole frames waiting, no header yet) it is charged
            // at its allocated size.
            let target = (start + want)
                .max(buffer.capacity().saturating_mul(2))
                .min(partial_frame.unwrap_or(buffer_max));
            // The grant covers the whole frame at once; the allocation
            // still grows with the bytes that arrive (a peer that declares
            // 4 MiB and sends 100 bytes makes the broker hold 4 MiB of its
            // pool, not of its resident memory).
            let needed = partial_frame.unwrap_or(target).saturating_sub(READ_CHUNK_BYTES);
            let more = needed.saturating_sub(buffer_grant.as_ref().map_or(0, Grant::bytes));
            let granted = more == 0
                || match buffer_grant.as_mut() {
                    Some(grant) => grant.try_grow(more),
                    None => {
                        buffer_grant = memory.requests.try_take(connection_id, more);
                        buffer_grant.is_some()
                    }
                };
            if granted {
                buffer.reserve_exact(target - buffer.len());
            } else {
                can_read = false;
                buffer_memory_wait = Some(more);
            }
        }
        if can_read && buffer.len() < start + want {
            buffer.resize(start + want, 0);
        }
        // Only whole frames waiting (for permits or memory) can fill the
        // buffer, a partial frame that long is FrameTooLarge above; or the
        // buffer waits for memory to grow.
        assert!(
            can_read || blocked || buffer_memory_wait.is_some(),
            "nothing to read and nothing to wait for"
        );

        // What a peer watch weighs a half-close against: the bytes of the
        // frame being read so far, and its whole length.
        let held = filled;
        let held_frame_len =
            if buffer_memory_wait.is_some() { handler.frame_len(&buffer[..filled]) } else { None };
        let event = {
            let read = async {
                if can_read {
                    ReadEvent::Data(reader.read(&mut buffer[start..start + want]).await)
                } else {
                    std::future::pending().await
                }
            };
            let stopped = async {
                or(stop.wait(), connection.closing.wait()).await;
                ReadEvent::Stopped
            };
            let failed = async {
                writer_failed.wait().await;
                ReadEvent::WriterFailed
            };
            let deadline = async {
                match frame_deadline.as_mut() {
                    Some(timer) => {
                        timer.await;
                        ReadEvent::FrameTimeout
                    }
                    None if pace_hold => {
                        // Wake when a claim earns credit, or at the hold's
                        // bound (the frame then goes anyway).
                        let held_since = pace_held_since.unwrap_or_else(crate::clock::instant_now);
                        let left = crate::net::pace::PaceState::hold_left(
                            crate::clock::instant_now(),
                            held_since,
                        );
                        or(pace.credit(), async {
                            Timer::new(left).await;
                        })
                        .await;
                        ReadEvent::InFlightDrained
                    }
                    None if waiting_turn => {
                        // Wake when this connection holds the turn and the
                        // round has room.
                        admission.turn(connection_id).await;
                        ReadEvent::InFlightDrained
                    }
                    None if requests_pool_full => {
                        memory.requests.below_size().await;
                        ReadEvent::InFlightDrained
                    }
                    None if responses_pool_full => {
                        // The pool back under its size, or this
                        // connection's own writer drained some.
                        let queued = connection.responses_queued_bytes();
                        or(memory.responses.below_size(), connection.responses_below(queued)).await;
                        ReadEvent::InFlightDrained
                    }
                    None if responses_full => {
                        // Wake when the writer has drained below the bound.
                        connection.responses_below(limits.response_bytes_max).await;
                        ReadEvent::InFlightDrained
                    }
                    None if blocked => {
                        // Wake when a permit frees up for the waiting frame.
                        let _ = in_flight.acquire(1).await;
                        in_flight.signal(1);
                        ReadEvent::InFlightDrained
                    }
                    None if nothing_in_flight => {
                        Timer::new(limits.idle_timeout).await;
                        ReadEvent::Idle
                    }
                    None => {
                        // Wake when the last request finishes so the idle
                        // timer starts then, not at the next byte.
                        let _ = in_flight.acquire(in_flight_max).await;
                        in_flight.signal(in_flight_max);
                        ReadEvent::InFlightDrained
                    }
                }
            };
            // Raced with the frame deadline: a started frame waiting for
            // memory to grow its buffer still times out.
            let buffer_memory = async {
                match buffer_memory_wait {
                    Some(bytes) => {
                        ReadEvent::BufferMemory(memory.requests.take(connection_id, bytes).await)
                    }
                    None => std::future::pending().await,
                }
            };
            // While it waits for memory the connection reads nothing: its
            // socket is asked now and then whether the peer is gone, so a
            // dead peer's grant returns before its frame deadline.
            let peer_gone = async {
                match (buffer_memory_wait, connection.peer_watch.get()) {
                    (Some(_), Some(watch)) => loop {
                        Timer::new(MEMORY_WAIT_PEER_POLL).await;
                        if watch.gone(held, held_frame_len) {
                            break ReadEvent::PeerGone;
                        }
                    },
                    _ => std::future::pending().await,
                }
            };
            or(read, or(stopped, or(failed, or(buffer_memory, or(peer_gone, deadline))))).await
        };
        match event {
            ReadEvent::Data(Ok(0)) | ReadEvent::PeerGone => {
                // The peer will send nothing more: its waiting requests
                // answer now, the frames it already sent are still served.
                peer_closed = true;
                connection.ended.stop();
                if !blocked {
                    return ConnectionEnd::PeerClosed;
                }
            }
            ReadEvent::Data(Ok(read_bytes)) => filled = start + read_bytes,
            // A TLS peer that closes without close_notify: a close all the
            // same (its requests end there; TLS never takes a truncation as
            // data).
            ReadEvent::Data(Err(error)) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                return ConnectionEnd::PeerClosed
            }
            ReadEvent::Data(Err(error)) => return ConnectionEnd::ReadFailed(error),
            ReadEvent::Stopped if connection.closing.is_stopped() => return ConnectionEnd::Closed,
            ReadEvent::Stopped => return ConnectionEnd::Stopped,
            ReadEvent::WriterFailed => return ConnectionEnd::PeerClosed,
            ReadEvent::Idle => return ConnectionEnd::Idle,
            ReadEvent::FrameTimeout => {
                fault(ProtocolFault::FrameTimeout).await;
                return ConnectionEnd::FrameTimeout;
            }
            ReadEvent::InFlightDrained => {}
            ReadEvent::BufferMemory(grant) => match buffer_grant.as_mut() {
                Some(held) => held.absorb(grant),
                None => buffer_grant = Some(grant),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::writer::write_burst;
    use super::*;
    use crate::limits::WRITE_COPY_BYTES_MAX;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// An in-memory writer that records each `write` call separately.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bytes: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.0.push(bytes.to_vec());
            Poll::Ready(Ok(bytes.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_burst_of_small_responses_is_one_write_and_large_ones_go_alone() {
        // Goal: responses waiting together cost one write (not one each), in
        // order, and a large one is written from its own buffer. Method: an
        // in-memory writer that records every write call.
        let small = |tag: u8| vec![tag; 100];
        let mut writer = Writes::default();
        let mut coalesced = Vec::new();
        let mut burst: Vec<Vec<u8>> = (1..=10).map(small).collect();
        futures_lite::future::block_on(write_burst(&mut writer, &mut burst, &mut coalesced))
            .unwrap();
        assert_eq!(writer.0.len(), 1, "ten small responses, one write");
        assert_eq!(writer.0[0], burst.concat());

        let large = vec![0xEE; WRITE_COPY_BYTES_MAX + 1];
        let mut writer = Writes::default();
        let mut burst = vec![small(1), large.clone(), small(2), small(3)];
        futures_lite::future::block_on(write_burst(&mut writer, &mut burst, &mut coalesced))
            .unwrap();
        assert_eq!(writer.0, vec![small(1), large, [small(2), small(3)].concat()]);
    }

    #[test]
    fn every_end_has_its_own_stable_reason_and_a_timed_out_write_is_a_slow_reader() {
        // Goal: the counters' labels are distinct, each end maps to the
        // label of its own index, and the writer's write_timeout error (a
        // peer that does not read) is `slow_reader` while any other write
        // failure stays `write_failed`. Method: one end of each kind.
        use std::io::{Error, ErrorKind};
        let timed_out =
            Error::new(ErrorKind::TimedOut, "response not written within write_timeout");
        let ends = [
            (ConnectionEnd::PeerClosed, "peer_closed"),
            (ConnectionEnd::Idle, "idle"),
            (ConnectionEnd::Stopped, "stopped"),
            (ConnectionEnd::Closed, "closed"),
            (ConnectionEnd::DecodeError("bad".into()), "decode_error"),
            (ConnectionEnd::FrameTooLarge, "frame_too_large"),
            (ConnectionEnd::FrameTimeout, "frame_timeout"),
            (ConnectionEnd::ReadFailed(Error::from(ErrorKind::ConnectionReset)), "read_failed"),
            (ConnectionEnd::WriteFailed(Error::from(ErrorKind::BrokenPipe)), "write_failed"),
            (ConnectionEnd::WriteFailed(timed_out), "slow_reader"),
            (ConnectionEnd::Tls("handshake timed out".into()), "tls"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (end, reason) in &ends {
            assert_eq!(end.reason(), *reason, "{end:?}");
            assert_eq!(ConnectionEnd::REASONS[end.reason_index()], *reason);
            assert!(seen.insert(end.reason_index()), "{reason} shares an index");
        }
        assert_eq!(seen.len(), ConnectionEnd::REASONS.len(), "every label is reachable");
        let reset = ConnectionEnd::WriteFailed(Error::from(ErrorKind::ConnectionReset));
        assert_eq!(reset.reason(), "write_failed");
    }

    #[test]
    fn a_connection_cancels_only_its_own_registered_claims_within_its_bound() {
        // Goal: the cancel map is per connection, bounded by waiting_max,
        // and an entry lives exactly as long as its claim. Method: two
        // connection scopes; register, cancel from the wrong and the right
        // scope, fill the bound, drop a registration and register again.
        let first = Connection::new(2, Rc::default());
        let second = Connection::new(2, Rc::default());
        let claim = first.register_claim(5).unwrap();
        assert!(!second.cancel_claim(5), "another connection's id is not found");
        assert!(!claim.cancel().is_cancelled());
        assert!(!first.cancel_claim(6), "unknown id");
        assert!(first.cancel_claim(5));
        assert!(claim.cancel().is_cancelled());
        assert!(!first.cancel_claim(5), "cancelled once");

        let other = first.register_claim(7).unwrap();
        assert_eq!(first.register_claim(8).unwrap_err(), 2, "bound of waiting_max entries");
        assert_eq!(first.claims_in_flight(), 2);
        drop(claim);
        assert_eq!(first.claims_in_flight(), 1, "an answered claim leaves the map");
        let again = first.register_claim(8).unwrap();
        // A decided claim cannot be cancelled; the cancel is refused.
        assert!(other.cancel().decide());
        assert!(!first.cancel_claim(7));
        assert!(!other.cancel().is_cancelled());
        drop((other, again));
        assert_eq!(first.claims_in_flight(), 0);
    }
}
