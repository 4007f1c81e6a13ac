//! The admin port: HTTP/1.1 for operators and their tools — `GET /metrics`
//! (Prometheus/OpenMetrics text), `GET /health/live`, `GET /health/ready`,
//! and the JSON API under `/v1/` ([`api`]: queues, send, claim, ack,
//! extend, release, dead letters, redrive, purge). Every route is in
//! [`api::routes::ROUTES`]; `docs/openapi.json` describes them.
//!
//! It runs on its own thread (`spool-admin`) with a single-threaded tokio
//! runtime and hyper; never on a shard. It holds no broker state and reads
//! none across cores: each scrape or readiness check asks every shard for a
//! [`ShardReport`] through the coordinator
//! ([`CoordinatorHandle::request_reports`]: the coordinator forwards the
//! request over each shard's channel, the shard answers from what it
//! already counts) and waits at most [`ADMIN_REPORT_TIMEOUT`] for the
//! answers. A shard that does not answer in time is reported missing
//! (`spool_shard_reporting 0`, and not ready), never waited on longer.
//!
//! The API reaches the shards as a client would, over their TCP ports
//! (see [`api`]): the admin thread never runs shard code.
//!
//! With authentication on, the API's requests carry
//! `Authorization: Bearer <principal>:<secret>` and are served with that
//! principal's rights ([`api`]). `/metrics` and `/health/*` need no token.
//! With TLS configured (`tls_cert_file`, `tls_key_file`) it speaks HTTPS
//! only, with the shards' certificate ([`tls`]). Without it, bind it to
//! loopback or a private network (default `127.0.0.1:7480`;
//! `admin_listen = "off"` turns it off).
//!
//! Its memory comes from the broker's budget: a pool carved off the top of
//! `memory_bytes` ([`memory`]) that API request bodies take from before
//! they are read and that every answer is charged to until written.

pub mod api;
pub mod health;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use thiserror::Error;

use crate::limits::{
    ADMIN_CONNECTIONS_MAX, ADMIN_HEADER_READ_TIMEOUT, ADMIN_REPORT_POLL, ADMIN_REPORT_TIMEOUT,
    ADMIN_STOP_POLL,
};
use spool_wire::ErrorCode;

use self::api::error::ApiError;
use self::api::routes::{Operation, Unrouted};
use self::memory::AdminMemory;
use crate::net::listener::NetError;
use crate::shard::report::ShardReport;
use crate::shard::CoordinatorHandle;

const TEXT: &str = "text/plain; charset=utf-8";

/// Why the admin port did not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AdminError {
    #[error("admin port: {0}")]
    Bind(#[from] NetError),
    #[error("admin port {addr}: {source}")]
    Listener { addr: SocketAddr, source: std::io::Error },
    #[error("admin thread could not be started: {0}")]
    Spawn(std::io::Error),
}

/// Binds the admin port (before the shards start, so a taken port is a
/// start error, like a shard's: [`node::Node::start`]). A port still in use is retried for
/// `PORT_IN_USE_RETRY_MS`, as the shards' ports are: a SIGKILLed
/// predecessor's listening socket outlives it by milliseconds.
///
/// # Errors
/// [`NetError::PortInUse`] on EADDRINUSE past the retry, [`NetError::Bind`]
/// otherwise.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, AdminError> {
    crate::net::listener::wait_port_free(
        addr,
        std::time::Duration::from_millis(crate::limits::PORT_IN_USE_RETRY_MS),
    )?;
    let listener = std::net::TcpListener::bind(addr).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            NetError::PortInUse { addr }
        } else {
            NetError::Bind { addr, source }
        }
    })?;
    listener.set_nonblocking(true).map_err(|source| AdminError::Listener { addr, source })?;
    Ok(listener)
}

/// The running admin port; its thread ends within [`ADMIN_STOP_POLL`] of
/// the broker's stop flag.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    thread: JoinHandle<()>,
}

impl AdminServer {
    /// Serves `listener` on a new thread until the broker stops.
    ///
    /// # Errors
    /// The listener's address cannot be read, or the thread not spawned.
    /// `shard_listen` is shard 0's listen address: the API's gateway
    /// connects there as a client.
    /// With `tls` the port speaks HTTPS only, and the gateway reaches the
    /// shards over TLS. `memory_bytes` is the admin pool's size
    /// (`BrokerConfig::admin_memory_bytes`).
    pub fn spawn(
        listener: std::net::TcpListener,
        coordinator: CoordinatorHandle,
        shard_listen: SocketAddr,
        auth: crate::auth::AuthPolicy,
        tls: Option<crate::net::tls::TlsServer>,
        memory_bytes: u64,
    ) -> Result<AdminServer, AdminError> {
        let addr = listener.local_addr().map_err(|source| AdminError::Listener {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        let thread = std::thread::Builder::new()
            .name("spool-admin".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "admin port: no runtime; not serving");
                        return;
                    }
                };
                let memory = memory::AdminMemory::new(memory_bytes);
                let mut gateway =
                    api::Gateway::new(shard_listen, coordinator.clone(), auth, memory);
                let acceptor = match &tls {
                    None => None,
                    Some(server) => match tls::gateway_client_tls(server) {
                        Ok(client_tls) => {
                            gateway = gateway.with_shard_tls(client_tls);
                            Some(tokio_rustls::TlsAcceptor::from(server.config()))
                        }
                        Err(error) => {
                            tracing::error!(%error, "admin port: no TLS client for the gateway; not serving");
                            return;
                        }
                    },
                };
                runtime.block_on(serve(listener, coordinator, gateway, acceptor));
            })
            .map_err(AdminError::Spawn)?;
        Ok(AdminServer { addr, thread })
    }

    /// The bound address (the real port when configured with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for the thread to end (after the stop flag is set).
    pub fn join(self) {
        if self.thread.join().is_err() {
            tracing::error!("admin thread panicked");
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    coordinator: CoordinatorHandle,
    gateway: api::Gateway,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let gateway = Arc::new(gateway);
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "admin port: listener unusable; not serving");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_CONNECTIONS_MAX));
    while !coordinator.stop_requested() {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tokio::time::sleep(ADMIN_STOP_POLL) => continue,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, api::caller::PeerIp(peer.ip())),
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%error, "admin port: accept failed");
                tokio::time::sleep(ADMIN_STOP_POLL).await;
                continue;
            }
        };
        // Over the bound the connection is closed at once: the admin port
        // must not hold more than a few sockets whatever its peers do.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let coordinator = coordinator.clone();
        let gateway = Arc::clone(&gateway);
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(peer);
                let coordinator = coordinator.clone();
                let gateway = Arc::clone(&gateway);
                async move {
                    let answer = route(request, &coordinator, &gateway).await;
                    // Every answer is charged until hyper has written it.
                    Ok::<_, Infallible>(gateway.memory().answer(answer).await)
                }
            });
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(ADMIN_HEADER_READ_TIMEOUT);
            // A failed connection (peer gone, bad request) is the peer's
            // business; hyper has answered what it could.
            match tls {
                None => {
                    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                }
                Some(acceptor) => {
                    if let Some(stream) = tls::accept(&acceptor, stream).await {
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            }
            drop(slot);
        });
    }
}

fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn route(
    request: Request<Incoming>,
    coordinator: &CoordinatorHandle,
    gateway: &api::Gateway,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let (operation, queue) = match api::routes::resolve(request.method(), &path) {
        Ok(resolved) => resolved,
        Err(Unrouted::NotFound) => {
            return ApiError::new(ErrorCode::UnknownApi, format!("no such endpoint: {path}"))
                .into_response();
        }
        Err(Unrouted::MethodNotAllowed(allowed)) => {
            let allow = allowed.iter().map(hyper::Method::as_str).collect::<Vec<_>>().join(", ");
            let mut refused = ApiError::new(
                ErrorCode::UnknownApi,
                format!("{} is not served on {path}; allowed: {allow}", request.method()),
            )
            .with_status(StatusCode::METHOD_NOT_ALLOWED)
            .into_response();
            if let Ok(allow) = HeaderValue::from_str(&allow) {
                refused.headers_mut().insert(ALLOW, allow);
            }
            return refused;
        }
    };
    match operation {
        Operation::Live => response(StatusCode::OK, TEXT, "live\n".to_owned()),
        Operation::Ready => ready(coordinator, gateway.memory()).await,
        Operation::Metrics => metrics_page(coordinator, gateway.memory()).await,
        _ => gateway.serve(operation, queue, request).await,
    }
}

/// What the shards answered, and which did not.
pub(crate) struct Gathered {
    pub(crate) reports: Vec<ShardReport>,
    pub(crate) missing: Vec<u16>,
}

/// Asks every shard for its report and waits up to [`ADMIN_REPORT_TIMEOUT`].
pub(crate) async fn gather(coordinator: &CoordinatorHandle) -> Result<Gathered, String> {
    let receiver = coordinator.request_reports().map_err(|error| error.to_string())?;
    let shards = coordinator.shard_count();
    let mut reports: Vec<ShardReport> = Vec::with_capacity(shards);
    let polls = ADMIN_REPORT_TIMEOUT.as_millis() / ADMIN_REPORT_POLL.as_millis().max(1);
    for _ in 0..=polls {
        while let Ok(report) = receiver.try_recv() {
            reports.push(report);
        }
        if reports.len() >= shards {
            break;
        }
        // Polled rather than awaited: the answer comes from a glommio
        // thread, and polling needs no cross-runtime wake-up.
        tokio::time::sleep(ADMIN_REPORT_POLL).await;
    }
    reports.sort_by_key(|report| report.shard);
    let missing = (0..shards)
        .filter_map(|shard| u16::try_from(shard).ok())
        .filter(|shard| !reports.iter().any(|report| report.shard.0 == *shard))
        .collect();
    Ok(Gathered { reports, missing })
}

async fn metrics_page(
    coordinator: &CoordinatorHandle,
    admin_memory: &AdminMemory,
) -> Response<Full<Bytes>> {
    let gathered = match gather(coordinator).await {
        Ok(gathered) => gathered,
        Err(error) => {
            return response(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{error}\n"));
        }
    };
    // statvfs off the runtime's thread: a stalled file system must not
    // hold up /health/live.
    let data_dir = coordinator.data_dir().to_path_buf();
    let disk = match tokio::task::spawn_blocking(move || metrics::disk_space(&data_dir)).await {
        Ok(Ok(disk)) => Some(disk),
        Ok(Err(error)) => {
            tracing::warn!(%error, "statvfs of the data directory failed; no disk figures");
            None
        }
        Err(_) => None,
    };
    let auth = coordinator.auth();
    let admin_memory = admin_memory.stats();
    let health = coordinator.cluster_health();
    match metrics::encode(
        &gathered.reports,
        &gathered.missing,
        auth,
        disk.as_ref(),
        &admin_memory,
        health.as_ref(),
    ) {
        Ok(text) => response(StatusCode::OK, metrics::CONTENT_TYPE, text),
        Err(error) => response(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT,
            format!("metrics could not be encoded: {error}\n"),
        ),
    }
}

async fn ready(
    coordinator: &CoordinatorHandle,
    admin_memory: &AdminMemory,
) -> Response<Full<Bytes>> {
    if coordinator.stop_requested() {
        return response(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not ready\nthe broker is stopping\n".to_owned(),
        );
    }
    let gathered = match gather(coordinator).await {
        Ok(gathered) => gathered,
        Err(error) => {
            return response(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("not ready\n{error}\n"),
            );
        }
    };
    let table = coordinator.catalog_snapshot();
    match health::readiness(
        &table,
        &gathered.reports,
        &gathered.missing,
        coordinator.stop_requested(),
        &admin_memory.stats(),
    ) {
        Ok(summary) => response(StatusCode::OK, TEXT, format!("{summary}\n")),
        Err(reasons) => response(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("not ready\n{}\n", reasons.join("\n")),
        ),
    }
}
