//! One TCP connection to one broker shard, pipelined.
//!
//! Owns the socket, a writer task, a reader task and the table of pending
//! requests. Any number of callers share a [`Connection`] (it is `Clone`):
//! each request gets a fresh correlation id, is queued for the writer, and
//! waits on its own oneshot; the reader matches every response to its waiter by
//! id, so responses complete in any order (a long-polling Claim never holds up
//! the Ack sent after it). At most [`IN_FLIGHT_REQUESTS_MAX`] requests are
//! outstanding; further callers wait for a slot, which is the backpressure.
//!
//! It does not route (that is [`Client`](crate::Client)), retry, or reconnect:
//! when the socket breaks every pending request fails with
//! [`ClientError::ConnectionClosed`] and the connection stays closed.
//!
//! A broker that keeps the socket open and answers nothing (a hung
//! process) is found by the liveness probe (`liveness`, on by default:
//! [`Liveness`]): while requests are outstanding and nothing at all has
//! arrived for `idle`, the reader sends one Ping; when nothing arrives for
//! `timeout` more, it closes the connection as above. The reader holds the
//! probe's one timer, armed only while requests are outstanding.
//!
//! Frames are read with `FrameDecoder::read_buf`/`advance` straight into the
//! decoder's 8-aligned buffer and each response body is copied once into an
//! 8-aligned [`BatchBytes`], so the rkyv records inside a Claim response can be
//! validated and read in place.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use spool_wire::batch::BatchBytes;
use spool_wire::proto::{
    ApiKey, AuthenticateRequest, CorrelationId, Frame, FrameDecoder, FrameHeader, PingRequest,
    Reply, Request, Response, ENQUEUE_VERSION_KEYS_FULL,
};
use spool_wire::ErrorCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::ClientError;
use crate::limits::{
    CONNECT_TIMEOUT_DEFAULT, IN_FLIGHT_REQUESTS_MAX, REQUEST_TIMEOUT_DEFAULT,
    WRITE_COALESCE_BYTES_MAX, WRITE_QUEUE_FRAMES_MAX,
};
use crate::liveness::{Liveness, Next, Watch};
use crate::versions::request_version;

/// Settings of one connection.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// How long a request may wait for its response (a Claim adds its
    /// long-poll wait on top).
    pub request_timeout: Duration,
    /// How long the TCP connect may take.
    pub connect_timeout: Duration,
    /// Most outstanding requests, `1..=IN_FLIGHT_REQUESTS_MAX`.
    pub in_flight_max: usize,
    /// Sent in an Authenticate handshake before the connection is handed
    /// out (a broker with authentication on refuses anything else first).
    pub credentials: Option<crate::auth::Credentials>,
    /// Speak TLS to the broker (its certificate checked as the config
    /// says); `None`: plain TCP.
    pub tls: Option<crate::tls::TlsConfig>,
    /// The liveness probe ([`Liveness`]): a Ping after `idle` of silence
    /// while requests are outstanding, the connection closed after
    /// `timeout` more. On by default; `None` turns it off (requests then
    /// wait out `request_timeout` on a broker that answers nothing).
    pub liveness: Option<Liveness>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            in_flight_max: IN_FLIGHT_REQUESTS_MAX,
            credentials: None,
            tls: None,
            liveness: Some(Liveness::default()),
        }
    }
}

impl ConnectionConfig {
    fn validate(&self) -> Result<(), ClientError> {
        if self.in_flight_max == 0 || self.in_flight_max > IN_FLIGHT_REQUESTS_MAX {
            return Err(ClientError::Config(format!(
                "in_flight_max {} outside 1..={IN_FLIGHT_REQUESTS_MAX}",
                self.in_flight_max
            )));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ClientError::Config("timeouts must be positive".to_owned()));
        }
        if let Some(liveness) = &self.liveness {
            liveness.validate()?;
        }
        Ok(())
    }
}

/// A successful response's frame, owned: the header and an 8-aligned copy of
/// the body. [`ResponseBytes::response`] decodes it, borrowing from it.
#[derive(Debug)]
pub struct ResponseBytes {
    header: FrameHeader,
    body: BatchBytes,
}

impl ResponseBytes {
    /// The operation answered.
    pub fn api_key(&self) -> ApiKey {
        self.header.api_key
    }

    /// The api version the answer is in (the request's).
    pub fn api_version(&self) -> u16 {
        self.header.api_version
    }

    fn frame(&self) -> Frame<'_> {
        Frame { header: self.header, body: self.body.as_slice() }
    }

    /// Decodes the response.
    ///
    /// # Errors
    /// [`ClientError::Protocol`] when the body does not decode.
    pub fn response(&self) -> Result<Response<'_>, ClientError> {
        match Response::decode(&self.frame()) {
            Ok(reply) => match reply.reply {
                Reply::Ok(response) => Ok(response),
                Reply::Err(error) => {
                    Err(ClientError::from_response(error.code, error.message, error.owner))
                }
            },
            Err(error) => Err(ClientError::Protocol(format!("undecodable response: {error}"))),
        }
    }
}

type Waiter = oneshot::Sender<Result<ResponseBytes, ClientError>>;

struct Pending {
    waiters: HashMap<u64, Waiter>,
    /// When `waiters` last went from empty to not (the liveness clock
    /// starts there); meaningless while it is empty.
    busy_since: Instant,
    /// Why the connection closed; set once, and then no request is accepted.
    closed: Option<String>,
}

struct Shared {
    addr: String,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    slots: Semaphore,
    writes: mpsc::Sender<Vec<u8>>,
    request_timeout: Duration,
    /// Rung when `waiters` goes from empty to not: wakes a reader that
    /// waits with no liveness timer armed.
    busy: Notify,
    /// Rung by [`Shared::close`]: the writer stops and lets the socket go.
    closing: Notify,
    /// The broker answered an Enqueue of
    /// [`ENQUEUE_VERSION_KEYS_FULL`] with `UNSUPPORTED_VERSION` (it
    /// predates that version): later enqueues go one version older.
    enqueue_before_keys_full: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock cannot leave the map half-updated
        // (each operation is one insert or remove), so poisoning is ignored.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A correlation id no request in flight has (never 0).
    fn next_correlation_id(&self) -> u64 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != CorrelationId::CONNECTION.0 {
                break id;
            }
        }
    }

    /// When the outstanding requests began to wait; `None` while none is.
    fn busy_since(&self) -> Option<Instant> {
        let pending = self.lock();
        (!pending.waiters.is_empty()).then_some(pending.busy_since)
    }

    /// Queues the liveness Ping. It has no waiter: its answer, like any
    /// other byte from the broker, only resets the reader's clock. A full
    /// write queue means the writer is stuck behind a broker that reads
    /// nothing; the probe's timeout then runs all the same.
    fn send_probe(&self) {
        let mut frame = Vec::new();
        let id = CorrelationId(self.next_correlation_id());
        match Request::Ping(PingRequest {}).encode(id, &mut frame) {
            Ok(()) => {
                if self.writes.try_send(frame).is_err() {
                    tracing::debug!(addr = %self.addr, "liveness Ping not queued: the write queue is full");
                }
            }
            Err(error) => tracing::warn!(addr = %self.addr, %error, "liveness Ping not encoded"),
        }
    }

    fn closed_error(&self, reason: &str) -> ClientError {
        ClientError::ConnectionClosed { addr: self.addr.clone(), reason: reason.to_owned() }
    }

    /// Marks the connection closed and fails every pending request.
    fn close(&self, reason: String) {
        let waiters = {
            let mut pending = self.lock();
            if pending.closed.is_none() {
                pending.closed = Some(reason.clone());
            }
            std::mem::take(&mut pending.waiters)
        };
        if !waiters.is_empty() {
            tracing::debug!(addr = %self.addr, %reason, count = waiters.len(), "failing pending requests");
        }
        for (_, waiter) in waiters {
            // The caller may have given up already; nothing to do then.
            let _ = waiter.send(Err(self.closed_error(&reason)));
        }
        self.slots.close();
        self.closing.notify_one();
    }

    /// Hands one response frame to its waiter.
    ///
    /// # Errors
    /// A reason to close the connection: a request frame from the broker, or
    /// a connection-level error (correlation id 0).
    fn complete(&self, frame: &Frame<'_>) -> Result<(), String> {
        if !frame.header.is_response {
            return Err("the broker sent a request frame".to_owned());
        }
        if frame.header.correlation_id == CorrelationId::CONNECTION {
            let reason = match Response::decode(frame) {
                Ok(reply) => match reply.reply {
                    Reply::Err(error) => format!("{}: {}", error.code, error.message),
                    Reply::Ok(_) => "success response with correlation id 0".to_owned(),
                },
                Err(error) => format!("undecodable connection error: {error}"),
            };
            return Err(reason);
        }
        let waiter = self.lock().waiters.remove(&frame.header.correlation_id.0);
        let Some(waiter) = waiter else {
            if frame.header.api_key == ApiKey::Ping {
                // The liveness probe's answer: it has done its work by arriving.
                return Ok(());
            }
            // Its caller timed out or went away; the late answer is dropped.
            tracing::debug!(addr = %self.addr, id = frame.header.correlation_id.0, "response for no pending request");
            return Ok(());
        };
        let mut body = BatchBytes::with_capacity(frame.body.len());
        body.extend_from_slice(frame.body);
        let _ = waiter.send(Ok(ResponseBytes { header: frame.header, body }));
        Ok(())
    }
}

/// Removes a request from the pending table when its caller stops waiting
/// (timeout or cancellation), so the table never holds abandoned entries.
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().waiters.remove(&self.id);
    }
}

/// Aborts the reader and writer when the last handle goes away.
struct Tasks {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// A pipelined connection to one shard. Cloning shares it.
///
/// ```no_run
/// # async fn demo() -> Result<(), spool_client::ClientError> {
/// use spool_client::{Connection, ConnectionConfig};
/// use spool_wire::proto::{ListQueuesRequest, Request, Response};
///
/// let connection = Connection::connect("127.0.0.1:7400", ConnectionConfig::default()).await?;
/// let bytes = connection.call(&Request::ListQueues(ListQueuesRequest {})).await?;
/// if let Response::ListQueues(list) = bytes.response()? {
///     println!("{} queues", list.queues.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Connection")
            .field("addr", &self.shared.addr)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`) and starts the reader and writer
    /// tasks on the current tokio runtime.
    ///
    /// # Errors
    /// [`ClientError::Config`] for a bad config; [`ClientError::Io`] if the
    /// connect fails; [`ClientError::Timeout`] if it takes too long.
    pub async fn connect(addr: &str, config: ConnectionConfig) -> Result<Self, ClientError> {
        config.validate()?;
        let stream = tokio::time::timeout(config.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Timeout { timeout_ms: millis(config.connect_timeout) })?
            .map_err(|source| ClientError::Io { addr: addr.to_owned(), source })?;
        stream
            .set_nodelay(true)
            .map_err(|source| ClientError::Io { addr: addr.to_owned(), source })?;
        let (writes, write_queue) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
        let shared = Arc::new(Shared {
            addr: addr.to_owned(),
            pending: Mutex::new(Pending {
                waiters: HashMap::new(),
                busy_since: Instant::now(),
                closed: None,
            }),
            next_id: AtomicU64::new(1),
            slots: Semaphore::new(config.in_flight_max),
            writes,
            request_timeout: config.request_timeout,
            busy: Notify::new(),
            closing: Notify::new(),
            enqueue_before_keys_full: AtomicBool::new(false),
        });
        let liveness = config.liveness;
        let (reader, writer) = match &config.tls {
            None => {
                let (read_half, write_half) = stream.into_split();
                let reader = tokio::spawn(read_loop(Arc::clone(&shared), read_half, liveness));
                let writer = tokio::spawn(write_loop(Arc::clone(&shared), write_queue, write_half));
                (reader, writer)
            }
            Some(tls) => {
                let stream = tls_handshake(addr, tls, stream, config.connect_timeout).await?;
                let (read_half, write_half) = tokio::io::split(stream);
                let reader = tokio::spawn(read_loop(Arc::clone(&shared), read_half, liveness));
                let writer = tokio::spawn(write_loop(Arc::clone(&shared), write_queue, write_half));
                (reader, writer)
            }
        };
        let connection = Self { shared, _tasks: Arc::new(Tasks { reader, writer }) };
        if let Some(credentials) = &config.credentials {
            connection.authenticate(credentials).await?;
        }
        Ok(connection)
    }

    /// The Authenticate handshake.
    async fn authenticate(
        &self,
        credentials: &crate::auth::Credentials,
    ) -> Result<(), ClientError> {
        let request = Request::Authenticate(AuthenticateRequest {
            principal: &credentials.principal,
            secret: &credentials.secret,
        });
        match self.call(&request).await?.response()? {
            Response::Authenticate(_) => Ok(()),
            other => Err(ClientError::Protocol(format!(
                "Authenticate answered with {:?}",
                other.api_key()
            ))),
        }
    }

    /// The peer address this connection was opened to.
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// Whether `other` is this very connection (a clone of it), not
    /// another one to the same address.
    pub fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether the socket closed; a closed connection fails every call.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    /// The configured request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.shared.request_timeout
    }

    /// Requests outstanding right now.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().waiters.len()
    }

    /// Sends `request` and waits for its response, up to the configured
    /// request timeout. It goes as the newest version of its api key,
    /// except a Claim of the default subscription, which goes as Claim v2,
    /// and a DescribeQueue, which goes as v1, so that brokers from before
    /// subscriptions serve them ([`request_version`]).
    ///
    /// # Errors
    /// The broker's error ([`ClientError::Server`], [`ClientError::NotOwner`]),
    /// [`ClientError::Timeout`], [`ClientError::ConnectionClosed`],
    /// [`ClientError::Encode`] for a request the codec refuses, or
    /// [`ClientError::Protocol`] for a response to another operation.
    pub async fn call(&self, request: &Request<'_>) -> Result<ResponseBytes, ClientError> {
        self.call_with_timeout(request, self.shared.request_timeout).await
    }

    /// [`call`](Self::call) with an explicit timeout (which also covers
    /// waiting for an in-flight slot).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn call_with_timeout(
        &self,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<ResponseBytes, ClientError> {
        self.call_observed(request, timeout, |_| {}).await
    }

    /// [`call`](Self::call) as `version` of the request's api key (a
    /// broker's answers to an older client; a client pinned to a version).
    ///
    /// # Errors
    /// As [`call`](Self::call); [`ClientError::Encode`] for a version the
    /// codec does not speak or a field it cannot carry.
    pub async fn call_version(
        &self,
        request: &Request<'_>,
        version: u16,
    ) -> Result<ResponseBytes, ClientError> {
        let timeout = self.shared.request_timeout;
        match tokio::time::timeout(timeout, self.call_inner(request, Some(version), |_| {})).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout { timeout_ms: millis(timeout) }),
        }
    }

    /// [`call_with_timeout`](Self::call_with_timeout) that tells `on_sent`
    /// the request's correlation id once its frame is queued for the socket,
    /// ahead of any request sent after `on_sent` returns (the way to name it
    /// in a later CancelClaim).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn call_observed(
        &self,
        request: &Request<'_>,
        timeout: Duration,
        on_sent: impl FnOnce(CorrelationId),
    ) -> Result<ResponseBytes, ClientError> {
        match tokio::time::timeout(timeout, self.call_inner(request, None, on_sent)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout { timeout_ms: millis(timeout) }),
        }
    }

    /// `version`: the api version to encode (`None`: the one this client
    /// sends the request as, `request_version`: the newest, or Claim v2
    /// for a claim of the default subscription).
    async fn call_inner(
        &self,
        request: &Request<'_>,
        version: Option<u16>,
        on_sent: impl FnOnce(CorrelationId),
    ) -> Result<ResponseBytes, ClientError> {
        let enqueue = matches!(request, Request::Enqueue(_)) && version.is_none();
        if !enqueue {
            return self.call_once(request, version, on_sent).await;
        }
        let shared = &*self.shared;
        if shared.enqueue_before_keys_full.load(Ordering::Relaxed) {
            return self.call_once(request, Some(ENQUEUE_VERSION_KEYS_FULL - 1), on_sent).await;
        }
        // Sent once, and again one version older only if a broker from
        // before ACTIVE_KEYS_FULL refused the version without reading the
        // records (nothing was appended): the same records, so no
        // duplicate either way. `on_sent` hears the first attempt.
        let result = self.call_once(request, Some(ENQUEUE_VERSION_KEYS_FULL), on_sent).await;
        match result {
            Err(error) if error.code() == Some(ErrorCode::UnsupportedVersion) => {
                shared.enqueue_before_keys_full.store(true, Ordering::Relaxed);
                tracing::debug!(addr = %shared.addr, "broker predates Enqueue v3; sending v2");
                self.call_once(request, Some(ENQUEUE_VERSION_KEYS_FULL - 1), |_| {}).await
            }
            result => result,
        }
    }

    /// One request at `version` (`None`: [`request_version`]).
    async fn call_once(
        &self,
        request: &Request<'_>,
        version: Option<u16>,
        on_sent: impl FnOnce(CorrelationId),
    ) -> Result<ResponseBytes, ClientError> {
        let shared = &*self.shared;
        let _slot = match shared.slots.acquire().await {
            Ok(slot) => slot,
            Err(_) => return Err(shared.closed_error(&self.close_reason())),
        };
        let id = shared.next_correlation_id();
        let mut frame = Vec::new();
        let version = version.unwrap_or_else(|| request_version(request));
        request.encode_version(CorrelationId(id), version, &mut frame)?;
        let (waiter, response) = oneshot::channel();
        {
            let mut pending = shared.lock();
            if let Some(reason) = &pending.closed {
                return Err(shared.closed_error(reason));
            }
            assert!(pending.waiters.len() < IN_FLIGHT_REQUESTS_MAX);
            if pending.waiters.is_empty() {
                pending.busy_since = Instant::now();
                shared.busy.notify_one();
            }
            pending.waiters.insert(id, waiter);
        }
        let _guard = PendingGuard { shared, id };
        if shared.writes.send(frame).await.is_err() {
            return Err(shared.closed_error(&self.close_reason()));
        }
        on_sent(CorrelationId(id));
        let bytes = match response.await {
            Ok(result) => result?,
            Err(_) => return Err(shared.closed_error(&self.close_reason())),
        };
        if bytes.header.error_code != ErrorCode::None {
            // Decoding an error frame always yields `Reply::Err` or a codec error.
            return Err(match bytes.response() {
                Err(error) => error,
                Ok(_) => ClientError::Protocol("error header with a success body".to_owned()),
            });
        }
        if bytes.header.api_key != request.api_key() {
            return Err(ClientError::Protocol(format!(
                "response to {:?} answered a {:?} request",
                bytes.header.api_key,
                request.api_key()
            )));
        }
        Ok(bytes)
    }

    fn close_reason(&self) -> String {
        self.shared.lock().closed.clone().unwrap_or_else(|| "closed".to_owned())
    }
}

/// The client side of the TLS handshake, within `timeout`.
async fn tls_handshake(
    addr: &str,
    tls: &crate::tls::TlsConfig,
    stream: TcpStream,
    timeout: Duration,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ClientError> {
    let server_name = tls.server_name_for(addr)?;
    let handshake = tls.connector().connect(server_name, stream);
    match tokio::time::timeout(timeout, handshake).await {
        Err(_) => Err(ClientError::Tls {
            addr: addr.to_owned(),
            reason: format!(
                "no TLS handshake within {} ms; {}",
                millis(timeout),
                crate::tls::PLAIN_PORT_HINT
            ),
        }),
        Ok(Err(error)) => {
            // rustls reports bytes that are not TLS as a corrupt message or
            // a bad record; a plain broker answers a ClientHello with a
            // Spool error frame and closes.
            let hint = if matches!(
                error.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) && !error.to_string().contains("certificate")
            {
                format!("; {}", crate::tls::PLAIN_PORT_HINT)
            } else {
                String::new()
            };
            Err(ClientError::Tls { addr: addr.to_owned(), reason: format!("{error}{hint}") })
        }
        Ok(Ok(stream)) => Ok(stream),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What the reader waits for besides the socket.
enum Wake {
    /// The liveness timer (armed for the instant in `armed`).
    Timer,
    /// A request to become outstanding (no timer while none is).
    Busy,
    /// Nothing: the probe is off.
    Never,
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: Arc<Shared>,
    mut socket: R,
    liveness: Option<Liveness>,
) {
    let mut decoder = FrameDecoder::new();
    // Until the first whole frame: bytes that start a TLS alert mean a plain
    // connection reached a TLS port.
    let mut first_read = true;
    let mut watch = liveness.map(|config| Watch::new(config, Instant::now()));
    // The probe's one timer, and the instant it is armed for: reset only
    // when a deadline comes due earlier than that, so a busy connection
    // arms it about once per `idle`, not once per read; when it fires
    // early the next deadline is asked for again.
    let mut timer = Box::pin(tokio::time::sleep_until(Instant::now()));
    let mut armed: Option<Instant> = None;
    let reason = 'connection: loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    if let Err(reason) = shared.complete(&frame) {
                        break 'connection reason;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    // Unknown keys/versions in a response are skipped by the
                    // decoder; the request they answer times out. Anything
                    // else leaves the stream out of sync.
                    if error.closes_connection() {
                        break 'connection format!("bad frame from broker: {error}");
                    }
                    tracing::warn!(addr = %shared.addr, %error, "skipped a response frame");
                }
            }
        }
        let wake = match watch.as_mut() {
            None => Wake::Never,
            Some(watch) => loop {
                let now = Instant::now();
                match watch.next(shared.busy_since(), now) {
                    Next::Idle => break Wake::Busy,
                    Next::WakeAt(at) => {
                        if armed.is_none_or(|armed| at < armed) {
                            timer.as_mut().reset(at);
                            armed = Some(at);
                        }
                        break Wake::Timer;
                    }
                    Next::Probe => {
                        shared.send_probe();
                        watch.probe_sent(now);
                    }
                    Next::Close(reason) => {
                        tracing::warn!(addr = %shared.addr, %reason, "closing an unresponsive connection");
                        break 'connection reason;
                    }
                }
            },
        };
        let buffer = match decoder.read_buf() {
            Ok(buffer) => buffer,
            Err(error) => break format!("decoder: {error}"),
        };
        let read = tokio::select! {
            // The socket first: bytes already there are heard before a
            // timer that came due meanwhile is believed.
            biased;
            read = socket.read(buffer) => read,
            () = &mut timer, if matches!(wake, Wake::Timer) => {
                armed = None;
                continue 'connection;
            }
            () = shared.busy.notified(), if matches!(wake, Wake::Busy) => continue 'connection,
        };
        match read {
            Ok(0) => break "closed by peer".to_owned(),
            Ok(read_bytes) => {
                if std::mem::take(&mut first_read)
                    && crate::tls::looks_like_tls_alert(&buffer[..read_bytes])
                {
                    break crate::tls::TLS_PORT_HINT.to_owned();
                }
                decoder.advance(read_bytes);
                if let Some(watch) = watch.as_mut() {
                    watch.heard(Instant::now());
                }
            }
            Err(error) => break format!("read failed: {error}"),
        }
    };
    shared.close(reason);
}

async fn write_loop<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    mut queue: mpsc::Receiver<Vec<u8>>,
    mut socket: W,
) {
    let mut buffer = Vec::new();
    loop {
        // Once the connection is closed (by the reader: the peer went, or
        // it answered nothing) the writer stops, even in the middle of a
        // write to a peer that reads nothing, and the socket is let go.
        let frame = tokio::select! {
            biased;
            () = shared.closing.notified() => return,
            frame = queue.recv() => match frame {
                Some(frame) => frame,
                None => return,
            },
        };
        let written = tokio::select! {
            biased;
            () = shared.closing.notified() => return,
            written = write_frames(&mut socket, &mut queue, &mut buffer, frame) => written,
        };
        if let Err(error) = written {
            shared.close(format!("write failed: {error}"));
            return;
        }
    }
}

/// Writes `frame` and whatever else is already queued, coalesced into one
/// write; a frame alone (the common case at low load, and every large
/// Enqueue that fills the budget by itself) is written without a copy.
async fn write_frames<W: AsyncWrite + Unpin>(
    socket: &mut W,
    queue: &mut mpsc::Receiver<Vec<u8>>,
    buffer: &mut Vec<u8>,
    frame: Vec<u8>,
) -> std::io::Result<()> {
    match queue.try_recv() {
        Err(_) => socket.write_all(&frame).await?,
        Ok(next) => {
            buffer.clear();
            buffer.extend_from_slice(&frame);
            buffer.extend_from_slice(&next);
            while buffer.len() < WRITE_COALESCE_BYTES_MAX {
                match queue.try_recv() {
                    Ok(frame) => buffer.extend_from_slice(&frame),
                    Err(_) => break,
                }
            }
            socket.write_all(buffer).await?;
        }
    }
    // TLS keeps what the socket did not take in its own buffer until a
    // flush (a no-op on plain TCP).
    socket.flush().await
}
