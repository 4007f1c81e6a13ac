//! The connection loop over real TCP: a glommio server thread runs
//! `serve_connection` with a small test handler; the test thread is a plain
//! blocking client. Every socket read has a timeout so a broken loop fails
//! the test instead of hanging it.

// Test helpers panic on setup failures by design.
#![allow(clippy::unwrap_used)]

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use spool_broker::limits::{ADMISSION_QUANTUM_FRAMES, ADMISSION_ROUND_FRAMES};
use spool_broker::net::echo::{encode_echo_frame, EchoError, EchoHandler, ECHO_ERROR_PREFIX};
use spool_broker::net::{
    serve, serve_connection, Connection, ConnectionEnd, ConnectionLimits, Decoded, FrameHandler,
    ProtocolFault, Rejections, StopSignal,
};

const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a test waits for an event of the server (frames taken, a
/// connection accepted) before it fails.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        frame_bytes_max: 1024,
        in_flight_max: 4,
        waiting_max: 4,
        idle_timeout: Duration::from_secs(20),
        frame_timeout: Duration::from_secs(20),
        write_timeout: Duration::from_secs(5),
        response_bytes_max: 1 << 20,
        io_poll_interval: std::time::Duration::from_millis(1),
        pace_percent: 0,
    }
}

/// Echo frames, but a body `delay:<ms>` waits that long first, a body
/// `wait:<ms>` waits that long or until the connection ends (answering
/// `ended` then), a body `big:<bytes>` is answered with a body of that
/// many bytes, and the handler records how many requests ran at once, how
/// many waits started (for the test thread to see) and the order in which
/// frames were handled, by connection.
struct DelayEcho {
    echo: EchoHandler,
    /// When false the decoder never finds a frame (to reach the loop's own
    /// buffer bound).
    finds_frames: bool,
    running: Cell<usize>,
    running_max: Cell<usize>,
    waits_ended: Cell<usize>,
    waits_started: Arc<AtomicUsize>,
    handled: std::cell::RefCell<Vec<u64>>,
}

impl DelayEcho {
    fn new(frame_bytes_max: usize, finds_frames: bool) -> DelayEcho {
        DelayEcho {
            echo: EchoHandler { frame_bytes_max },
            finds_frames,
            running: Cell::new(0),
            running_max: Cell::new(0),
            waits_ended: Cell::new(0),
            waits_started: Arc::default(),
            handled: std::cell::RefCell::default(),
        }
    }
}

impl FrameHandler for DelayEcho {
    type Frame = Vec<u8>;
    type Response = Vec<u8>;
    type DecodeError = EchoError;

    fn decode(&self, buffer: &[u8]) -> Result<Decoded<Vec<u8>>, EchoError> {
        if !self.finds_frames {
            return Ok(Decoded::Incomplete);
        }
        self.echo.decode(buffer)
    }

    async fn handle(self: Rc<Self>, frame: Vec<u8>, connection: Rc<Connection>) -> Vec<u8> {
        self.handled.borrow_mut().push(connection.id());
        self.running.set(self.running.get() + 1);
        self.running_max.set(self.running_max.get().max(self.running.get()));
        let body = std::str::from_utf8(&frame[4..]).unwrap_or("").to_owned();
        if let Some(ms) = body.strip_prefix("delay:").and_then(|ms| ms.parse().ok()) {
            // Time under test: the request takes this long.
            glommio::timer::sleep(Duration::from_millis(ms)).await;
        }
        let mut frame = frame;
        if let Some(ms) = body.strip_prefix("wait:").and_then(|ms| ms.parse().ok()) {
            self.waits_started.fetch_add(1, Ordering::SeqCst);
            let ended = futures_lite::future::or(
                async {
                    // Time under test: the wait's own deadline.
                    glommio::timer::sleep(Duration::from_millis(ms)).await;
                    false
                },
                async {
                    connection.ended().await;
                    true
                },
            )
            .await;
            if ended {
                self.waits_ended.set(self.waits_ended.get() + 1);
                frame = encode_echo_frame(b"ended");
            }
        }
        if let Some(bytes) = body.strip_prefix("big:").and_then(|bytes| bytes.parse().ok()) {
            frame = encode_echo_frame(&vec![b'x'; bytes]);
        }
        self.running.set(self.running.get() - 1);
        frame
    }

    fn fault_response(&self, fault: ProtocolFault<'_, EchoError>) -> Option<Vec<u8>> {
        self.echo.fault_response(fault)
    }
}

struct ServerOutcome {
    end: String,
    running_max: usize,
    waits_ended: usize,
}

/// Serves one connection on a fresh glommio executor; returns the address
/// and a receiver for how the connection ended.
fn serve_one(limits: ConnectionLimits) -> (SocketAddr, mpsc::Receiver<ServerOutcome>) {
    serve_one_with(limits, true)
}

fn serve_one_with(
    limits: ConnectionLimits,
    finds_frames: bool,
) -> (SocketAddr, mpsc::Receiver<ServerOutcome>) {
    let (addr, ends, _waits_started) = serve_one_observed(limits, finds_frames);
    (addr, ends)
}

/// [`serve_one_with`], and the count of `wait:` requests the handler
/// started, for the test thread to wait on.
fn serve_one_observed(
    limits: ConnectionLimits,
    finds_frames: bool,
) -> (SocketAddr, mpsc::Receiver<ServerOutcome>, Arc<AtomicUsize>) {
    let (addr_tx, addr_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel();
    let waits_started = Arc::new(AtomicUsize::new(0));
    let started = waits_started.clone();
    std::thread::spawn(move || {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async move {
            let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let stream = listener.accept().await.unwrap();
            let mut handler = DelayEcho::new(limits.frame_bytes_max, finds_frames);
            handler.waits_started = started;
            let handler = Rc::new(handler);
            let end = serve_connection(stream, handler.clone(), limits, StopSignal::new()).await;
            let end = match end {
                ConnectionEnd::PeerClosed => "peer_closed".to_owned(),
                ConnectionEnd::Idle => "idle".to_owned(),
                ConnectionEnd::FrameTimeout => "frame_timeout".to_owned(),
                ConnectionEnd::FrameTooLarge => "frame_too_large".to_owned(),
                ConnectionEnd::DecodeError(text) => format!("decode_error: {text}"),
                other => format!("{other:?}"),
            };
            let _ = end_tx.send(ServerOutcome {
                end,
                running_max: handler.running_max.get(),
                waits_ended: handler.waits_ended.get(),
            });
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).expect("server up");
    (addr, end_rx, waits_started)
}

/// Polls `condition` every millisecond until it holds; panics naming
/// `what` after [`EVENT_TIMEOUT`].
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = spool_broker::clock::instant_now() + EVENT_TIMEOUT;
    while !condition() {
        assert!(
            spool_broker::clock::instant_now() < deadline,
            "not within {EVENT_TIMEOUT:?}: {what}"
        );
        // A bounded poll: the condition is read again each time.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Bytes waiting to be read on `socket` (`FIONREAD`).
fn readable_bytes(socket: &impl std::os::fd::AsRawFd) -> usize {
    let mut bytes: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points
    // at a live local; the fd is the socket's own, open while borrowed.
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut bytes) };
    assert_eq!(result, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    usize::try_from(bytes).unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(CLIENT_READ_TIMEOUT)).unwrap();
    stream
}

fn read_frame(stream: &mut TcpStream) -> Vec<u8> {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
    stream.read_exact(&mut body).unwrap();
    body
}

fn assert_eof(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    let read = stream.read(&mut byte).expect("EOF, not a timeout");
    assert_eq!(read, 0, "expected the server to close the connection");
}

// Goal: pipelined requests are handled concurrently and answered as they
// complete. Method: a slow request followed by a fast one in one write; the
// fast response must come first.
#[test]
fn pipelined_requests_complete_out_of_order() {
    let (addr, ends) = serve_one(limits());
    let mut client = connect(addr);
    let mut bytes = encode_echo_frame(b"delay:300");
    bytes.extend_from_slice(&encode_echo_frame(b"fast"));
    client.write_all(&bytes).unwrap();
    assert_eq!(read_frame(&mut client), b"fast");
    assert_eq!(read_frame(&mut client), b"delay:300");
    drop(client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(outcome.end, "peer_closed");
    assert_eq!(outcome.running_max, 2);
}

// Goal: no more than in_flight_max requests run at once, and none is lost
// when the client pipelines far more. Method: 24 delayed requests against
// a limit of 4; count responses and the handler's concurrency peak.
#[test]
fn in_flight_requests_are_bounded() {
    let (addr, ends) = serve_one(limits());
    let mut client = connect(addr);
    let mut bytes = Vec::new();
    for _ in 0..24 {
        bytes.extend_from_slice(&encode_echo_frame(b"delay:20"));
    }
    client.write_all(&bytes).unwrap();
    for _ in 0..24 {
        assert_eq!(read_frame(&mut client), b"delay:20");
    }
    drop(client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(outcome.running_max, 4);
}

// Goal: a malformed frame gets every earlier response, then the handler's
// error response, then a close. Method: a good frame, then a zero-length one.
#[test]
fn decode_error_writes_error_response_then_closes() {
    let (addr, ends) = serve_one(limits());
    let mut client = connect(addr);
    let mut bytes = encode_echo_frame(b"delay:100");
    bytes.extend_from_slice(&0u32.to_le_bytes());
    client.write_all(&bytes).unwrap();
    assert_eq!(read_frame(&mut client), b"delay:100");
    let error = read_frame(&mut client);
    assert!(error.starts_with(ECHO_ERROR_PREFIX), "{}", String::from_utf8_lossy(&error));
    assert_eof(&mut client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(outcome.end.starts_with("decode_error"), "{}", outcome.end);
}

// Goal: a byte-at-a-time peer cannot hold a connection past frame_timeout.
// Method: frame_timeout 300 ms, send one byte of a 5-byte frame every
// 100 ms; the server must send an error and close well before the frame
// could complete.
#[test]
fn slow_loris_is_closed_by_the_frame_timeout() {
    let limits = ConnectionLimits { frame_timeout: Duration::from_millis(300), ..limits() };
    let (addr, ends) = serve_one(limits);
    let mut client = connect(addr);
    let frame = encode_echo_frame(&[b'x'; 60]);
    let mut closed = false;
    for byte in &frame {
        if client.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        // Time under test: a byte every 100 ms against a 300 ms frame timeout.
        std::thread::sleep(Duration::from_millis(100));
        if ends.try_recv().is_ok() {
            closed = true;
            break;
        }
    }
    assert!(closed, "the whole frame trickled in without the server closing");
    let error = read_frame(&mut client);
    assert_eq!(error, [ECHO_ERROR_PREFIX, b"frame timeout"].concat());
    assert_eof(&mut client);
}

// Goal: a connection that sends nothing is closed after idle_timeout, and
// only when nothing is in flight. Method: idle 300 ms; first a request that
// takes 600 ms (must still be answered), then silence.
#[test]
fn idle_connection_is_closed_but_not_while_a_request_runs() {
    let limits = ConnectionLimits { idle_timeout: Duration::from_millis(300), ..limits() };
    let (addr, ends) = serve_one(limits);
    let mut client = connect(addr);
    client.write_all(&encode_echo_frame(b"delay:600")).unwrap();
    assert_eq!(read_frame(&mut client), b"delay:600");
    assert_eof(&mut client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(outcome.end, "idle");
}

// Goal: a codec-announced oversized frame is refused before its bytes
// arrive. Method: an echo header announcing 5000 bytes against a 1024 limit.
#[test]
fn oversized_frame_header_is_refused() {
    let (addr, ends) = serve_one(limits());
    let mut client = connect(addr);
    client.write_all(&5000u32.to_le_bytes()).unwrap();
    let error = read_frame(&mut client);
    assert!(error.starts_with(ECHO_ERROR_PREFIX));
    assert!(String::from_utf8_lossy(&error).contains("exceeds the limit of 1024"));
    assert_eof(&mut client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(outcome.end.starts_with("decode_error"), "{}", outcome.end);
}

// Goal: the loop itself never buffers more than frame_bytes_max, whatever
// the decoder says. Method: a decoder that never finds a frame; send 4 KiB
// against a 1024-byte bound; expect the FrameTooLarge fault and a close.
#[test]
fn read_buffer_is_bounded_by_frame_bytes_max() {
    let (addr, ends) = serve_one_with(limits(), false);
    let mut client = connect(addr);
    // The server may close before taking every byte; that is the point.
    let _ = client.write_all(&[7u8; 4096]);
    let error = read_frame(&mut client);
    assert_eq!(error, [ECHO_ERROR_PREFIX, b"no frame within 1024 bytes"].concat());
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(outcome.end, "frame_too_large");
}

// Goal: a peer that goes away while its requests wait is noticed at once,
// even with every in-flight slot taken and more frames queued behind them:
// its waiting requests end and the connection is released, instead of
// holding its socket until the waits expire. Method: six 60 s waits against
// in_flight_max 4, then, once the server started four of them, drop the
// socket; the server must report the end well inside 60 s, with the four
// running waits ended early.
#[test]
fn peer_close_ends_waiting_requests_while_at_the_in_flight_bound() {
    let (addr, ends, waits_started) = serve_one_observed(limits(), true);
    let mut client = connect(addr);
    let mut bytes = Vec::new();
    for _ in 0..6 {
        bytes.extend_from_slice(&encode_echo_frame(b"wait:60000"));
    }
    client.write_all(&bytes).unwrap();
    wait_until("the server started four waits (its in-flight bound)", || {
        waits_started.load(Ordering::SeqCst) == 4
    });
    drop(client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).expect("connection released early");
    // The ended waits answer a peer that is gone: writing them may fail.
    assert!(
        outcome.end == "peer_closed" || outcome.end.starts_with("WriteFailed"),
        "{}",
        outcome.end
    );
    assert!(outcome.waits_ended >= 4, "waits ended early: {}", outcome.waits_ended);
}

// Goal: a peer that half-closes (sends its last request, then shuts its
// sending side) still gets an answer to every request it sent, and its
// waiting requests answer at once rather than at their deadline. Method:
// two 60 s waits and a fast request, then shutdown(Write); read three
// answers within the client's 10 s read timeout.
#[test]
fn half_closed_peer_gets_every_answer_and_its_waits_end_early() {
    let (addr, ends) = serve_one(limits());
    let mut client = connect(addr);
    let mut bytes = encode_echo_frame(b"wait:60000");
    bytes.extend_from_slice(&encode_echo_frame(b"wait:60000"));
    bytes.extend_from_slice(&encode_echo_frame(b"fast"));
    client.write_all(&bytes).unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answers: Vec<Vec<u8>> = (0..3).map(|_| read_frame(&mut client)).collect();
    answers.sort();
    assert_eq!(answers, vec![b"ended".to_vec(), b"ended".to_vec(), b"fast".to_vec()]);
    assert_eof(&mut client);
    let outcome = ends.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(outcome.end, "peer_closed");
    assert_eq!(outcome.waits_ended, 2);
}

// Goal: one connection with a deep pipeline cannot make another wait behind
// all of it: a connection hands over at most a budget of frames before the
// others get a turn. Method: two connections served on one executor; before
// serving starts, A has 2,000 small frames buffered and B one (the server
// sees every byte of them in its sockets' receive queues); B's frame must
// be handled long before A's last (without the budget it is handled after
// all 2,000).
#[test]
fn a_deep_pipeline_yields_to_another_connection() {
    const PIPELINE: usize = 2_000;
    let limits = ConnectionLimits { in_flight_max: 4_096, frame_bytes_max: 64 * 1024, ..limits() };
    let frame_a = encode_echo_frame(b"a");
    let frame_b = encode_echo_frame(b"b");
    let (bytes_a, bytes_b) = (PIPELINE * frame_a.len(), frame_b.len());
    let (addr_tx, addr_rx) = mpsc::channel();
    let (accepted_tx, accepted_rx) = mpsc::channel();
    let (order_tx, order_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async move {
            let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let first = listener.accept().await.unwrap();
            accepted_tx.send(()).unwrap();
            let second = listener.accept().await.unwrap();
            // Serve only once both peers' bytes are all here.
            let deadline = spool_broker::clock::instant_now() + EVENT_TIMEOUT;
            while readable_bytes(&first) < bytes_a || readable_bytes(&second) < bytes_b {
                assert!(
                    spool_broker::clock::instant_now() < deadline,
                    "the peers' bytes never arrived"
                );
                // A bounded poll: the receive queues are read again each time.
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
            let handler = Rc::new(DelayEcho::new(limits.frame_bytes_max, true));
            let rejections = Rc::new(Rejections::default());
            let scope_a = Rc::new(Connection::new(4, rejections.clone()));
            let scope_b = Rc::new(Connection::new(4, rejections));
            let id_b = scope_b.id();
            let a = glommio::spawn_local(serve(
                first,
                handler.clone(),
                limits,
                StopSignal::new(),
                scope_a,
            ));
            let b = glommio::spawn_local(serve(
                second,
                handler.clone(),
                limits,
                StopSignal::new(),
                scope_b,
            ));
            a.await;
            b.await;
            let handled = handler.handled.borrow().clone();
            let position = handled.iter().position(|id| *id == id_b);
            let _ = order_tx.send((position, handled.len()));
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut a = connect(addr);
    // Accepted in order: connect B only once A is in.
    accepted_rx.recv_timeout(EVENT_TIMEOUT).expect("the server accepted A");
    let mut b = connect(addr);
    let mut pipeline = Vec::new();
    for _ in 0..PIPELINE {
        pipeline.extend_from_slice(&frame_a);
    }
    a.write_all(&pipeline).unwrap();
    b.write_all(&frame_b).unwrap();
    assert_eq!(read_frame(&mut b), b"b");
    for _ in 0..PIPELINE {
        assert_eq!(read_frame(&mut a), b"a");
    }
    drop((a, b));
    let (position, total) = order_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(total, PIPELINE + 1);
    let position = position.expect("B's frame was handled");
    assert!(position < 200, "B's frame was handled after {position} of A's");
}

/// An in-memory connection: reads hand out `input` (then wait forever, or
/// end once `closed`), writes append to `output` but stall while `stalled`.
#[derive(Default)]
struct Pipe {
    input: Vec<u8>,
    read_at: usize,
    closed: bool,
    output: Vec<u8>,
    stalled: bool,
    write_waker: Option<std::task::Waker>,
    read_waker: Option<std::task::Waker>,
}

#[derive(Clone, Default)]
struct PipeEnd(Rc<std::cell::RefCell<Pipe>>);

impl futures_lite::AsyncRead for PipeEnd {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut pipe = self.0.borrow_mut();
        let left = pipe.input.len() - pipe.read_at;
        if left == 0 {
            if pipe.closed {
                return std::task::Poll::Ready(Ok(0));
            }
            pipe.read_waker = Some(cx.waker().clone());
            return std::task::Poll::Pending;
        }
        let count = left.min(out.len());
        let at = pipe.read_at;
        out[..count].copy_from_slice(&pipe.input[at..at + count]);
        pipe.read_at += count;
        std::task::Poll::Ready(Ok(count))
    }
}

impl futures_lite::AsyncWrite for PipeEnd {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut pipe = self.0.borrow_mut();
        if pipe.stalled {
            pipe.write_waker = Some(cx.waker().clone());
            return std::task::Poll::Pending;
        }
        pipe.output.extend_from_slice(bytes);
        std::task::Poll::Ready(Ok(bytes.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Lets every task that can run, run (the pipe never needs the reactor).
async fn settle() {
    for _ in 0..10_000 {
        futures_lite::future::yield_now().await;
    }
}

// Goal: a peer that stops reading cannot make the broker hold more response
// bytes than `response_bytes_max` plus the responses of the requests already
// in flight when it was reached: reading pauses (backpressure, no error), and
// once the peer reads again every request is answered. Method: `serve` over
// an in-memory pipe holding 400 pipelined requests for 64 KiB answers, whose
// writes stall; the in-flight bound (256) is far above what the byte bound
// allows (4 answers), so only the byte bound can stop reading. After every
// runnable task has run, count the requests handled and the peak of queued
// response bytes; then let writes through and read all 400 answers. Without
// the byte bound the loop handles all 400 and queues their 25 MiB.
#[test]
fn a_peer_that_stops_reading_pauses_its_requests_at_the_response_byte_bound() {
    const REQUESTS: usize = 400;
    const ANSWER: usize = 64 * 1024;
    const BOUND: usize = 4 * ANSWER;
    let limits = ConnectionLimits {
        in_flight_max: 256,
        response_bytes_max: BOUND,
        write_timeout: Duration::from_secs(60),
        ..limits()
    };
    let executor =
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().expect("executor");
    executor.run(async move {
        let pipe = PipeEnd::default();
        {
            let mut state = pipe.0.borrow_mut();
            state.stalled = true;
            for _ in 0..REQUESTS {
                state
                    .input
                    .extend_from_slice(&encode_echo_frame(format!("big:{ANSWER}").as_bytes()));
            }
        }
        let handler = Rc::new(DelayEcho::new(limits.frame_bytes_max, true));
        let scope = Rc::new(Connection::new(4, Rc::new(Rejections::default())));
        let served = glommio::spawn_local(serve(
            pipe.clone(),
            handler.clone(),
            limits,
            StopSignal::new(),
            scope.clone(),
        ));
        settle().await;
        let handled = handler.handled.borrow().len();
        let peak = scope.responses_queued_bytes_peak();
        // Reading paused at the bound; what passed it is one dispatch turn
        // (its requests were in flight when the bound was reached).
        let in_flight_at_pause = spool_broker::limits::DISPATCH_BUDGET_FRAMES;
        assert!(
            handled <= BOUND / ANSWER + in_flight_at_pause,
            "{handled} requests handled while the peer read nothing"
        );
        assert!(peak <= BOUND + in_flight_at_pause * (ANSWER + 4), "peak {peak} bytes queued");
        assert!(peak >= BOUND, "the bound was reached: {peak}");
        assert_eq!(pipe.0.borrow().output.len(), 0);

        // The peer reads again: everything is answered, nothing failed.
        {
            let mut state = pipe.0.borrow_mut();
            state.stalled = false;
            state.closed = true;
            if let Some(waker) = state.write_waker.take() {
                waker.wake();
            }
            if let Some(waker) = state.read_waker.take() {
                waker.wake();
            }
        }
        let end = served.await;
        assert!(matches!(end, ConnectionEnd::PeerClosed), "{end:?}");
        assert_eq!(handler.handled.borrow().len(), REQUESTS);
        assert_eq!(pipe.0.borrow().output.len(), REQUESTS * (ANSWER + 4));
        assert_eq!(scope.responses_queued_bytes(), 0);
    });
}

/// What one heavy connection pipelines: more than its in-flight window
/// holds, so it always has a whole frame waiting.
const HEAVY_PIPELINE: usize = 3_000;

// Goal: a light connection's request gets into the shard within one turn of
// each busy connection and behind at most one admission round of their
// work, while heavy connections keep their in-flight windows full (the
// hostile benchmark's cause: a well-behaved request waited behind every
// frame the busy connections had handed over between two polls of the
// executor's I/O). Method: one executor, in-memory connections; 8 heavy
// connections each have 3,000 cheap requests buffered (in-flight bound
// 128); once 2,000 of theirs have been handled a light connection receives
// one request; count the heavy requests handled between that moment and the
// light request. Without fair admission each heavy connection hands over 32
// frames per turn and the light request waits behind several hundred.
#[test]
fn a_light_request_is_admitted_within_one_turn_of_each_heavy_connection() {
    const HEAVY: usize = 8;
    let limits = ConnectionLimits { in_flight_max: 128, frame_bytes_max: 64 * 1024, ..limits() };
    let executor =
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().expect("executor");
    let (position, mark, total) = executor.run(async move {
        let handler = Rc::new(DelayEcho::new(limits.frame_bytes_max, true));
        let rejections = Rc::new(Rejections::default());
        let mut served = Vec::new();
        let mut heavy_pipes = Vec::new();
        for _ in 0..HEAVY {
            let pipe = PipeEnd::default();
            {
                let mut state = pipe.0.borrow_mut();
                state.closed = true;
                for _ in 0..HEAVY_PIPELINE {
                    state.input.extend_from_slice(&encode_echo_frame(b"h"));
                }
            }
            let scope = Rc::new(Connection::new(4, rejections.clone()));
            served.push(glommio::spawn_local(serve(
                pipe.clone(),
                handler.clone(),
                limits,
                StopSignal::new(),
                scope,
            )));
            heavy_pipes.push(pipe);
        }
        let light = PipeEnd::default();
        let light_scope = Rc::new(Connection::new(4, rejections));
        let light_id = light_scope.id();
        served.push(glommio::spawn_local(serve(
            light.clone(),
            handler.clone(),
            limits,
            StopSignal::new(),
            light_scope,
        )));
        while handler.handled.borrow().len() < 2_000 {
            futures_lite::future::yield_now().await;
        }
        let mark = handler.handled.borrow().len();
        {
            let mut state = light.0.borrow_mut();
            state.input.extend_from_slice(&encode_echo_frame(b"light"));
            state.closed = true;
            if let Some(waker) = state.read_waker.take() {
                waker.wake();
            }
        }
        for task in served {
            let end = task.await;
            assert!(matches!(end, ConnectionEnd::PeerClosed), "{end:?}");
        }
        for pipe in &heavy_pipes {
            assert_eq!(pipe.0.borrow().output.len(), HEAVY_PIPELINE * 5, "every request answered");
        }
        let handled = handler.handled.borrow();
        (handled.iter().position(|id| *id == light_id), mark, handled.len())
    });
    assert_eq!(total, HEAVY * HEAVY_PIPELINE + 1);
    let position = position.expect("the light request was handled");
    assert!(position >= mark);
    let heavy_before = position - mark;
    // One round of admissions already handed over, plus one turn of each
    // heavy connection.
    let bound = ADMISSION_ROUND_FRAMES + HEAVY * ADMISSION_QUANTUM_FRAMES;
    assert!(
        heavy_before <= bound,
        "{heavy_before} heavy requests were handled before the light one (bound {bound})"
    );
}
